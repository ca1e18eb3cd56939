#!/usr/bin/env bash
# bench/batch_bench.sh [OUTDIR] - many small products: batched requests and dynamic batching.
#
# Runs bin/gemmd (BACKEND, default auto: CUDA when a GPU is present), raw float32, N x N
# products (N default 64), and prints a Markdown report of three measurements:
#
#  1. One request carrying PRODUCTS products (default 10000) as a batched raw body
#     (?batch=PRODUCTS: A (b, N, N) then B (b, N, N); and again with one shared B,
#     b_shared=1), sent REPS times (default 5) with curl; products/s and payload GB/s
#     (request + answer bytes over curl's total time), best of REPS.
#  2. The same products as single requests: wrk (bench/wrk_post.lua, like ceiling.sh) at
#     CONNS connections (default 64) for DURATION seconds (default 10); products/s = req/s,
#     payload GB/s = req/s x (request + answer bytes); the ratio of 1 to 2.
#  3. Single N x N requests at CONNS connections with dynamic batching off (batch_max 1)
#     and on (batch_max BATCH_MAX, default 32, batch_max_delay_us DELAY_US, default 0):
#     req/s, p50, p99, and how many answers said they ran coalesced (a sample of 200
#     requests sent at CONNS at once after the run, read from X-Gemm-Batched).
#
# Each daemon runs alone (one after the other), with per_ip_limit 0, a connection limit
# above CONNS and queue_depth 4096. Needs wrk (Debian `wrk`), curl and a python3 with
# NumPy (for the bodies).
set -u
cd "$(dirname "$0")/.."
out=${1:-bench/out/batch}
mkdir -p "$out"
n=${N:-64}
products=${PRODUCTS:-10000}
reps=${REPS:-5}
conns=${CONNS:-64}
dur=${DURATION:-10}
threads=${HTTP_THREADS:-4}
backend=${BACKEND:-auto}
bmax=${BATCH_MAX:-32}
delay=${DELAY_US:-0}
# The first python3 with NumPy: PY, then the one on PATH, then the system's.
if [ -z "${PY:-}" ]; then
    for p in python3 /usr/bin/python3; do
        if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import numpy' 2>/dev/null; then PY=$p; break; fi
    done
fi
PY=${PY:-/usr/bin/python3}
WRK=${WRK:-$(command -v wrk || { test -x /tmp/deps/usr/bin/wrk && echo /tmp/deps/usr/bin/wrk; })}
if [ -z "$WRK" ]; then
    echo "batch_bench.sh: wrk not found; install it: sudo apt-get install -y wrk" >&2
    exit 2
fi
[ -x bin/gemmd ] || make -s >/dev/null || exit 1
limit=$((conns + 64))
nproc=$(nproc)

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_up() { for _ in $(seq 200); do curl -fsS "$1/healthz" >/dev/null 2>&1 && return 0; sleep 0.05; done; return 1; }
pid=
start() { # extra gemmd flags...; sets url
    local port
    port=$(free_port)
    bin/gemmd --config config/gemmd.conf --backend "$backend" --port "$port" --http-threads "$threads" \
        --per-ip-limit 0 --connection-limit "$limit" --queue-depth 4096 --log-level warn "$@" \
        >"$out/gemmd.log" 2>&1 &
    pid=$!
    url="http://127.0.0.1:$port"
    wait_up "$url" || { echo "gemmd did not start"; cat "$out/gemmd.log"; exit 1; }
}
stop() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; pid=; }
trap stop EXIT

. bench/wrk_run.sh # to_us, run_wrk

# Bodies: one product, the batch with one B per product, the batch with one shared B.
"$PY" - "$n" "$products" "$out" <<'PY' || exit 1
import sys
import numpy as np
n, b, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rng = np.random.default_rng(7)
r = lambda *s: rng.uniform(-1, 1, size=s).astype("<f4").tobytes()
open(out + "/single.bin", "wb").write(r(n, n) + r(n, n))
a = r(b, n, n)
open(out + "/batch.bin", "wb").write(a + r(b, n, n))
open(out + "/batch-shared.bin", "wb").write(a + r(n, n))
PY
single_in=$(stat -c %s "$out/single.bin")
c_bytes=$((n * n * 4))

start --batch-max 1
curl -fsS "$url/v1/info" >"$out/info.json"
echo "# Many small products: batched requests and dynamic batching (raw float32, ${n}x${n})"
echo
echo "host: $(hostname), $nproc cores; $("$PY" -c 'import json,sys; i=json.load(open(sys.argv[1])); print("backend", i.get("backend"), "-", ", ".join(d.get("name","?") for d in i.get("devices",[])) or "no devices")' "$out/info.json" 2>/dev/null)"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ); commit $(git rev-parse --short HEAD 2>/dev/null); wrk $("$WRK" -v 2>&1 | head -1 | awk '{print $2}')"
echo "command: N=$n PRODUCTS=$products REPS=$reps CONNS=$conns DURATION=$dur HTTP_THREADS=$threads BACKEND=$backend BATCH_MAX=$bmax DELAY_US=$delay bench/batch_bench.sh"
echo

batch_req() { # BODY QUERY -> "seconds bytes_in bytes_out" (best of reps)
    local best="" i t
    for i in $(seq "$reps"); do
        t=$(curl -sS -o "$out/c.bin" -w '%{http_code} %{time_total} %{size_upload} %{size_download}\n' \
            --data-binary @"$1" -H 'Content-Type: application/octet-stream' \
            "$url/v1/matmul?m=$n&k=$n&n=$n&dtype=float32&batch=$products$2")
        case "$t" in 200\ *) ;; *) echo "batched request failed: $t" >&2; echo "0 0 0"; return;; esac
        t=${t#200 }
        if [ -z "$best" ] || awk -v a="${t%% *}" -v b="${best%% *}" 'BEGIN{exit !(a<b)}'; then best=$t; fi
    done
    echo "$best"
}
read -r t1 in1 o1 <<<"$(batch_req "$out/batch.bin" "")"
read -r t2 in2 o2 <<<"$(batch_req "$out/batch-shared.bin" "&b_shared=1")"
read -r rps_s p50_s p99_s bad_s <<<"$(run_wrk "$url/v1/matmul?m=$n&k=$n&n=$n&dtype=float32" "$out/single.bin" "$conns" "$out/wrk-single.txt")"
echo "## One request of $products products vs $products single requests"
echo
echo "| how | products/s | payload GB/s | time | vs single requests |"
echo "| --- | --- | --- | --- | --- |"
awk -v t="$t1" -v i="$in1" -v o="$o1" -v p="$products" -v s="$rps_s" 'BEGIN {
    r = t > 0 ? p / t : 0; printf "| one batched request (B per product) | %.0f | %.2f | %.3f s | %.1fx |\n", r, (t > 0 ? (i + o) / t / 1e9 : 0), t, (s > 0 ? r / s : 0) }'
awk -v t="$t2" -v i="$in2" -v o="$o2" -v p="$products" -v s="$rps_s" 'BEGIN {
    r = t > 0 ? p / t : 0; printf "| one batched request (shared B) | %.0f | %.2f | %.3f s | %.1fx |\n", r, (t > 0 ? (i + o) / t / 1e9 : 0), t, (s > 0 ? r / s : 0) }'
awk -v s="$rps_s" -v i="$single_in" -v o="$c_bytes" -v c="$conns" -v bad="$bad_s" 'BEGIN {
    printf "| single requests, %d connections (wrk; non-200: %s) | %.0f | %.3f | - | 1x |\n", c, bad, s, s * (i + o) / 1e9 }'
echo

coalesced_sample() { # how many of 200 concurrent answers say "coalesced"
    "$PY" - "$url" "$n" "$out/single.bin" "$conns" <<'PY'
import sys, threading, urllib.request
url, n, body, conns = sys.argv[1], int(sys.argv[2]), open(sys.argv[3], "rb").read(), int(sys.argv[4])
hits, lock = [0, 0], threading.Lock()
def client(k):
    for _ in range(k):
        req = urllib.request.Request("%s/v1/matmul?m=%d&k=%d&n=%d&dtype=float32" % (url, n, n, n), data=body,
                                     headers={"Content-Type": "application/octet-stream"})
        with urllib.request.urlopen(req, timeout=60) as r:
            r.read()
            with lock:
                hits[1] += 1
                hits[0] += "coalesced" in (r.headers.get("X-Gemm-Batched") or "")
ts = [threading.Thread(target=client, args=(max(1, 200 // conns),)) for _ in range(conns)]
[t.start() for t in ts]
[t.join() for t in ts]
print("%d/%d" % (hits[0], hits[1]))
PY
}
off_sample=$(coalesced_sample)
stop
start --batch-max "$bmax" --batch-max-delay-us "$delay"
read -r rps_on p50_on p99_on bad_on <<<"$(run_wrk "$url/v1/matmul?m=$n&k=$n&n=$n&dtype=float32" "$out/single.bin" "$conns" "$out/wrk-on.txt")"
on_sample=$(coalesced_sample)
stop

echo "## ${n}x${n} single requests at $conns connections: dynamic batching off vs on"
echo
echo "| dynamic batching | req/s | p50 µs | p99 µs | non-200 | answers coalesced (sample) |"
echo "| --- | --- | --- | --- | --- | --- |"
echo "| off (batch_max 1) | $rps_s | $p50_s | $p99_s | $bad_s | $off_sample |"
echo "| on (batch_max $bmax, delay $delay µs) | $rps_on | $p50_on | $p99_on | $bad_on | $on_sample |"
awk -v a="$rps_s" -v b="$rps_on" 'BEGIN { if (a > 0) printf "\non / off: %.2fx\n", b / a }'
