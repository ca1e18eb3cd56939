#!/usr/bin/env bash
# bench/bench_client.sh - what the gemm client costs next to curl sending the same bytes.
#
#   bench/bench_client.sh [--size N] [--repeat R] [--server URL] [--out FILE.md]
#
# Starts bin/gemmd --backend cpu on a free loopback port (unless --server is given), writes
# A and B (N x N float32, random) as raw files and their concatenation, then, R times each
# and interleaved so that drift hits both alike:
#   curl    curl --data-binary @AB.bin ... -o /dev/null        (one process per product)
#   gemm    gemm multiply A.bin B.bin --shape NxN -d float32 -o - --out-format raw >/dev/null
# and once `gemm bench --size N --repeat R` (one process, one kept-alive connection) beside
# curl's own time_total. Prints a Markdown report (device, date, commands, table of medians);
# --out also writes it to a file. Needs bin/gemm, bin/gemmd, curl and python3 with NumPy.
set -euo pipefail
cd "$(dirname "$0")/.."

N=2048 R=15 SERVER="" OUT=""
while [ $# -gt 0 ]; do
    case $1 in
    --size) N=$2; shift 2 ;;
    --repeat) R=$2; shift 2 ;;
    --server) SERVER=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "bench_client.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
PY=/usr/bin/python3
GEMM=bin/gemm GEMMD=bin/gemmd
for f in "$GEMM" "$GEMMD"; do [ -x "$f" ] || { echo "bench_client.sh: $f missing (make)" >&2; exit 2; }; done

tmp=$(mktemp -d /tmp/gemm-bench-XXXXXX)
daemon_pid=""
cleanup() {
    if [ -n "$daemon_pid" ]; then kill "$daemon_pid" 2>/dev/null || true; wait "$daemon_pid" 2>/dev/null || true; fi
    rm -rf "$tmp"
}
trap cleanup EXIT

if [ -z "$SERVER" ]; then
    port=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    "$GEMMD" --backend cpu --port "$port" --log-level warn >"$tmp/gemmd.log" 2>&1 &
    daemon_pid=$!
    SERVER="http://127.0.0.1:$port"
    for _ in $(seq 100); do curl -sf "$SERVER/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
fi

$PY - "$tmp" "$N" <<'EOF'
import sys, numpy as np
d, n = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(1)
a = rng.standard_normal((n, n), dtype=np.float32)
b = rng.standard_normal((n, n), dtype=np.float32)
a.tofile(d + "/A.bin"); b.tofile(d + "/B.bin")
with open(d + "/AB.bin", "wb") as f:
    f.write(a.tobytes()); f.write(b.tobytes())
np.save(d + "/ref_row0.npy", a[:4].astype(np.float64) @ b.astype(np.float64))
EOF

URL="$SERVER/v1/matmul?m=$N&k=$N&n=$N&dtype=float32"
CURL_CMD=(curl -sS --fail -o /dev/null -H "Content-Type: application/octet-stream"
          -H "Accept: application/octet-stream" --data-binary "@$tmp/AB.bin" -w "%{time_total}\n" "$URL")
GEMM_CMD=("$GEMM" --server "$SERVER" multiply "$tmp/A.bin" "$tmp/B.bin" --shape "${N}x${N}" -d float32
          -o - --out-format raw)

# correctness first: the client's answer against NumPy (first rows)
"${GEMM_CMD[@]}" > "$tmp/C.bin"
$PY - "$tmp" "$N" <<'EOF'
import sys, numpy as np
d, n = sys.argv[1], int(sys.argv[2])
c = np.fromfile(d + "/C.bin", dtype=np.float32).reshape(n, n)
ref = np.load(d + "/ref_row0.npy")
err = np.abs(c[:4] - ref).max() / max(1.0, np.abs(ref).max())
if not err < 1e-4:
    sys.exit("gemm's answer differs from NumPy: relative error %g" % err)
EOF

now() { date +%s.%N; }
: > "$tmp/curl_wall" ; : > "$tmp/curl_total" ; : > "$tmp/gemm_wall"
for _ in $(seq "$R"); do
    t0=$(now); "${CURL_CMD[@]}" >> "$tmp/curl_total"; t1=$(now)
    echo "$t1 - $t0" | bc -l >> "$tmp/curl_wall"
    t0=$(now); "${GEMM_CMD[@]}" > /dev/null; t1=$(now)
    echo "$t1 - $t0" | bc -l >> "$tmp/gemm_wall"
done
"$GEMM" --server "$SERVER" bench --size "$N" --repeat "$R" --warmup 2 > "$tmp/bench.txt"

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
report=$($PY - "$tmp" "$N" "$R" "$cpu" "$(nproc)" "$SERVER" <<'EOF'
import sys, statistics, re, datetime
d, n, r, cpu, cores, server = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
def col(name):
    return [float(x) * 1000.0 for x in open(d + "/" + name).read().split()]
cw, ct, gw = col("curl_wall"), col("curl_total"), col("gemm_wall")
bench = open(d + "/bench.txt").read()
m = re.search(r"latency ms\s+min ([\d.]+)\s+median ([\d.]+)\s+p99 ([\d.]+)", bench)
bmin, bmed, bp99 = (float(x) for x in m.groups())
med = statistics.median
payload = (3 * n * n * 4) / 1e6
def row(name, v):
    return "| %s | %.1f | %.1f | %.1f |" % (name, min(v), med(v), max(v))
print("# gemm client vs curl, %dx%d float32, CPU backend" % (n, n))
print()
print("Device: this %s-core development machine (%s), CPU backend (OpenBLAS); no GPU. "
      "Client and daemon on the same machine over loopback, so they share the cores." % (cores, cpu))
print("Date: %s UTC. Payload per product: A+B up %.1f MB, C down %.1f MB." %
      (datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"), 2 * n * n * 4 / 1e6, n * n * 4 / 1e6))
print()
print("Command: `bench/bench_client.sh --size %d --repeat %d` (interleaved runs, %d each)" % (n, r, r))
print()
print("- curl: `curl -sS --fail -o /dev/null -H 'Content-Type: application/octet-stream' "
      "-H 'Accept: application/octet-stream' --data-binary @AB.bin '%s/v1/matmul?m=%d&k=%d&n=%d&dtype=float32'`"
      % ("$SERVER", n, n, n))
print("- gemm: `gemm multiply A.bin B.bin --shape %dx%d -d float32 -o - --out-format raw > /dev/null`" % (n, n))
print("- in process: `gemm bench --size %d --repeat %d --warmup 2` (one kept-alive connection)" % (n, r))
print()
print("| one product, ms | min | median | max |")
print("| --- | ---: | ---: | ---: |")
print(row("curl process, wall", cw))
print(row("gemm multiply process, wall", gw))
print(row("curl time_total (transfer only)", ct))
print("| gemm bench per-request latency | %.1f | %.1f | p99 %.1f |" % (bmin, bmed, bp99))
print()
ratio_proc = med(gw) / med(cw)
ratio_req = bmed / med(ct)
print("Median ratio gemm/curl: whole process %.3f (%+.1f%%), per request %.3f (%+.1f%%). "
      "Target: the client adds at most 10%%." % (ratio_proc, 100 * (ratio_proc - 1), ratio_req, 100 * (ratio_req - 1)))
print()
print("Notes: both sides send the same %.1f MB body to the same URL with the same Content-Type and Accept headers. curl "
      "`--data-binary @file` reads the whole file into memory before sending and uploads through "
      "its default 64 KiB buffer; gemm maps A and B and hands curl 1 MiB at a time straight from the "
      "mapping, and writes C from the socket into its output. The machine is shared (other builds "
      "ran meanwhile), hence the spread between min and max: compare medians." % (2 * n * n * 4 / 1e6))
print()
print("`gemm bench` output:")
print()
print("```")
print(bench.rstrip().replace(server, "$SERVER"))
print("```")
EOF
)
echo "$report"
if [ -n "$OUT" ]; then printf '%s\n' "$report" > "$OUT"; echo "written to $OUT" >&2; fi
