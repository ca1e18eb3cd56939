# shellcheck shell=bash
# bench/loopback.sh - sourced by bench/ceiling.sh, bench/profile_daemon.sh and
# bench/rounds.sh, which start servers on loopback and post raw float32 products to them.

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

# start_gemmd LOG GEMMD PORT THREADS LIMIT [FLAG ...]: the daemon as the ceiling benchmarks
# run it, in the background ($! is its pid): config $GEMMD_CONF (default config/gemmd.conf),
# backend $BACKEND (default auto), THREADS HTTP threads, at most LIMIT connections, no
# per-address limit, a queue deep enough for every connection, warnings only; FLAGs last.
start_gemmd() {
    local log=$1 bin=$2 port=$3 threads=$4 limit=$5
    shift 5
    "$bin" --config "${GEMMD_CONF:-config/gemmd.conf}" --backend "${BACKEND:-auto}" --port "$port" \
        --http-threads "$threads" --per-ip-limit 0 --connection-limit "$limit" --queue-depth 1024 \
        --log-level warn "$@" >"$log" 2>&1 &
}

# start_bare LOG PORT THREADS LIMIT: build/bench/bare_mhd, the ceiling, with the daemon's
# threading and a connection buffer of $CONN_MEMORY_KB (default 64), in the background.
start_bare() {
    build/bench/bare_mhd --port "$2" --threads "$3" --connection-limit "$4" \
        --connection-memory-kb "${CONN_MEMORY_KB:-64}" >"$1" 2>&1 &
}
