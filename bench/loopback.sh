# bench/loopback.sh - sourced by bench/ceiling.sh and bench/profile_daemon.sh, which start
# servers on loopback and post raw float32 products to them.

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Waits up to 10 s for URL/healthz to answer.
wait_up() { for _ in $(seq 200); do curl -fsS "$1/healthz" >/dev/null 2>&1 && return 0; sleep 0.05; done; return 1; }

# float32_body N FILE: the raw body of an N x N by N x N product (A then B, values in
# [-1, 1), the same bytes for the same N).
float32_body() {
    python3 - "$1" "$2" <<'PY'
import array, random, sys
n = int(sys.argv[1])
rnd = random.Random(n)
a = array.array("f", (rnd.uniform(-1, 1) for _ in range(2 * n * n)))
open(sys.argv[2], "wb").write(a.tobytes())
PY
}
