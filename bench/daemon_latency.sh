#!/usr/bin/env bash
# bench/daemon_latency.sh [OUTDIR] - requests/s and latency percentiles through the daemon
# for small and medium products, at several client concurrencies, with the `gemm` client.
#
# Starts bin/gemmd (BACKEND, default auto: CUDA when a GPU is present) on a free loopback
# port, then for each size in SIZES (default "64 256 1024") and concurrency in CONC
# (default "1 8 64") runs `bin/gemm bench -n SIZE -c C -r R` (float32, raw binary in and
# out, kernel auto; the first answer is checked against float64 by the client). R is
# chosen so every cell sends a few hundred requests (fewer for the big sizes).
#
# On the CUDA backend it also asks for one 1024^3 float32 product from simt with the tile
# left to the kernel and with tile=128, and prints the block and GFLOP/s that each answer
# reports (X-Gemm-Block, Server-Timing): the daemon runs the block the shape calls for.
#
# Prints Markdown; the raw client output goes to OUTDIR (default bench/out/latency).
set -u
cd "$(dirname "$0")/.."
out=${1:-bench/out/latency}
mkdir -p "$out"
sizes=${SIZES:-64 256 1024}
concs=${CONC:-1 8 64}
backend=${BACKEND:-auto}

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
url=http://127.0.0.1:$port
bin/gemmd --config config/gemmd.conf --backend "$backend" --port "$port" --queue-depth 512 \
    --per-ip-limit 0 --log-level warn >"$out/gemmd.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
for _ in $(seq 100); do
    curl -fsS "$url/readyz" >/dev/null 2>&1 && break
    sleep 0.1
done
if ! curl -fsS "$url/v1/info" >"$out/info.json"; then
    echo "gemmd did not start:"; cat "$out/gemmd.log"; exit 1
fi
python3 - "$out/info.json" <<'EOF'
import json, sys
i = json.load(open(sys.argv[1]))
devs = ", ".join(d.get("name", "?") for d in i.get("devices", [])) or "-"
print("- backend: %s; devices: %s" % (i.get("backend"), devs))
EOF
echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); host: $(nproc) CPU cores"
echo
echo "| n | clients | requests | min ms | median ms | p99 ms | requests/s | payload MB/s |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
rc=0
for n in $sizes; do
    for c in $concs; do
        total=$((n >= 1024 ? 320 : 1280))
        r=$((total / c))
        [ "$r" -lt 3 ] && r=3
        log="$out/n${n}-c${c}.txt"
        if ! bin/gemm bench -s "$url" -n "$n" -c "$c" -r "$r" -w 2 >"$log" 2>&1; then
            echo "| $n | $c | failed: $(tail -1 "$log") |"
            rc=1
            continue
        fi
        python3 - "$log" "$n" "$c" "$((c * r))" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
def after(label):   # "min 0.121"
    m = re.search(r"latency ms.*?\b" + label + r" ([0-9.]+)", text)
    return m.group(1) if m else "?"
def before(label):  # "5335.20 requests/s"
    m = re.search(r"([0-9.]+) " + label, text)
    return m.group(1) if m else "?"
print("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
    sys.argv[2], sys.argv[3], sys.argv[4], after("min"), after("median"), after("p99"),
    before("requests/s"), before("MB/s")))
EOF
    done
done

if grep -q '"backend": *"cuda"' "$out/info.json"; then
    python3 -c '
import numpy as np, sys
rng = np.random.default_rng(7)
open(sys.argv[1], "wb").write(rng.standard_normal(2 * 1024 * 1024, dtype=np.float32).tobytes())
' "$out/ab.bin"
    echo
    echo "| 1024^3 float32, kernel=simt | tile | block | kernel GFLOP/s (last of 5) |"
    echo "| --- | --- | --- | --- |"
    for q in "" "&tile=128"; do
        for _ in 1 2 3 4 5; do
            curl -fsS -D "$out/h.txt" -o /dev/null -H 'Content-Type: application/octet-stream' \
                --data-binary @"$out/ab.bin" "$url/v1/matmul?m=1024&k=1024&n=1024&dtype=float32&kernel=simt$q" || rc=1
        done
        tile=$(grep -i '^x-gemm-tile:' "$out/h.txt" | tr -d '\r' | awk '{print $2}')
        block=$(grep -i '^x-gemm-block:' "$out/h.txt" | tr -d '\r' | awk '{print $2}')
        rate=$(grep -i '^server-timing:' "$out/h.txt" | sed -n 's/.*kernel;dur=[0-9.]*;desc="\([0-9.]*\) GFLOP\/s".*/\1/p')
        echo "| ${q:-(no tile)} | $tile | $block | $rate |"
    done
fi
exit $rc
