#!/usr/bin/env bash
# bench/blas_offload.sh - the BLAS preload's numbers on this host, as one Markdown report:
#   breakeven  from which n an n^3 product is faster on the server than on this host's BLAS
#              (build/bench/blas_offload breakeven; other links: bench/offload.py);
#   tiny       below the threshold: ns the preload adds per call (blas_offload tiny);
#   offload    above it: the preload against gemm_client_multiply (blas_offload offload);
#   numpy      NumPy from a wheel, `a @ b` at --numpy-sizes in float32 and float64: without
#              the preload (the wheel's OpenBLAS), with it, and gemmd.Client.matmul (the
#              Python client, client/python/src) on the same daemon.
#
#   bench/blas_offload.sh [--server URL] [--backend auto|cpu|cuda] [--parts breakeven,tiny,offload,numpy]
#       [--sizes LIST] [--offload-sizes 256,512,2048,4096] [--repeats N] [--numpy-wheels DIR]
#       [--numpy-sizes 2048,4096,8192] [--out FILE.md]
#
# Without --server it starts bin/gemmd (--backend, default auto: CUDA when there is a GPU)
# on a free loopback port and stops it at the end. The host BLAS is GEMM_BLAS_LIB (default
# libblas.so.3). Needs `make bench` (run when the program is missing) and curl.
# numpy runs without internet: NumPy is installed from the wheel files in --numpy-wheels
# (or $NUMPY_WHEELS) with `pip install --no-index --target` into a temporary directory, for
# $PYTHON (default python3); fetch them where PyPI is reachable, for that Python, e.g.
#   python3 -m pip download --only-binary=:all: --python-version 3.11 \
#       --platform manylinux_2_28_x86_64 -d wheels 'numpy>=2'
# Without a wheel folder the numpy part is left out, saying so. --out also writes the report
# to a file.
set -euo pipefail
cd "$(dirname "$0")/.."

SERVER="" BACKEND=auto PARTS=breakeven,tiny,offload,numpy SIZES="" OSIZES="256,512,2048,4096" REPEATS=7
OUT="" WHEELS=${NUMPY_WHEELS:-} NSIZES=2048,4096,8192 PY=${PYTHON:-python3}
while [ $# -gt 0 ]; do
    case $1 in
    --server) SERVER=$2; shift 2 ;;
    --backend) BACKEND=$2; shift 2 ;;
    --parts) PARTS=$2; shift 2 ;;
    --sizes) SIZES=$2; shift 2 ;;
    --offload-sizes) OSIZES=$2; shift 2 ;;
    --repeats) REPEATS=$2; shift 2 ;;
    --numpy-wheels) WHEELS=$2; shift 2 ;;
    --numpy-sizes) NSIZES=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "blas_offload.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

BUILD=${BUILD:-build}
PROG=$BUILD/bench/blas_offload PRELOAD=$PWD/lib/libgemm_blas.so
for p in "$PROG" bin/gemmd "$PRELOAD"; do
    if [ ! -e "$p" ]; then make -s bench >&2; break; fi
done

tmp=$(mktemp -d /tmp/gemm-blas-bench-XXXXXX)
daemon_pid=""
cleanup() {
    if [ -n "$daemon_pid" ]; then kill "$daemon_pid" 2>/dev/null || true; wait "$daemon_pid" 2>/dev/null || true; fi
    rm -rf "$tmp"
}
trap cleanup EXIT

if [ -z "$SERVER" ]; then
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null ||
           echo $((20000 + RANDOM % 20000)))
    bin/gemmd --backend "$BACKEND" --port "$port" --log-level warn >"$tmp/gemmd.log" 2>&1 &
    daemon_pid=$!
    SERVER="http://127.0.0.1:$port"
    for _ in $(seq 300); do curl -sf "$SERVER/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
    curl -sf "$SERVER/healthz" >/dev/null || { cat "$tmp/gemmd.log" >&2; echo "blas_offload.sh: gemmd did not start" >&2; exit 1; }
fi
export GEMM_SERVER=$SERVER
part() { case ",$PARTS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

# numpy: one process without the preload (NumPy's own BLAS, then the Python client), one
# with it (GEMM_OFFLOAD_LOG=1); each saves its times and a sample of every C, then a table.
numpy_part() {
    echo "## NumPy \`a @ b\` (wheel from $WHEELS): the wheel's BLAS, the preload, the Python client"
    echo
    if [ -z "$WHEELS" ]; then echo "Left out: no wheel folder (--numpy-wheels DIR or NUMPY_WHEELS)."; echo; return; fi
    "$PY" -m pip install -q --no-index --find-links "$WHEELS" --target "$tmp/site" numpy >&2 ||
        { echo "Left out: \`$PY -m pip install --no-index --find-links $WHEELS numpy\` failed."; echo; return; }
    cat >"$tmp/nb.py" <<'EOF'
import json, re, sys, time
import numpy as np
role, d, sizes, reps = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3].split(",")], int(sys.argv[4])
def timed(f):
    f()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        ts.append((time.perf_counter() - t0) * 1e3)
    return sorted(ts)[len(ts) // 2], min(ts)
if role != "table":  # plain (then the client too) or preload: times, and a sample of each C
    res, client = {"numpy": np.__version__}, None
    if role == "plain":
        import gemmd
        client = gemmd.Client()
    for n in sizes:
        for dt in ("float32", "float64"):
            rng = np.random.default_rng(n)
            a, b = rng.random((n, n), dtype=dt) - 0.5, rng.random((n, n), dtype=dt) - 0.5
            res["%d %s" % (n, dt)] = {"numpy": timed(lambda: a @ b)}
            np.save("%s/%s.%d.%s.npy" % (d, role, n, dt), (a @ b)[::61, ::67])
            if client:
                res["%d %s" % (n, dt)]["client"] = timed(lambda: client.matmul(a, b))
                np.save("%s/client.%d.%s.npy" % (d, n, dt), client.matmul(a, b)[::61, ::67])
    json.dump(res, open("%s/%s.json" % (d, role), "w"))
    sys.exit(0)
plain, pre = json.load(open(d + "/plain.json")), json.load(open(d + "/preload.json"))
calls = re.findall(r"^libgemm_blas: (\S+) \S+ \S+ m=\d+ n=\d+ k=\d+ -> (\S+)", open(d + "/preload.log").read(), re.M)
print("NumPy %s; with the preload %d of %d calls ran on the server, through %s.\n" % (
    plain["numpy"], sum(w == "server" for _, w in calls), len(calls),
    " ".join(sorted({c for c, _ in calls})) or "none"))
print("| n | dtype | NumPy, its own BLAS ms (median, min) | NumPy + preload ms | gemmd.Client.matmul ms | "
      "preload / client (medians) | own BLAS / preload | max rel. diff of C: preload, client |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for n in sizes:
    for dt in ("float32", "float64"):
        p, q = plain["%d %s" % (n, dt)], pre["%d %s" % (n, dt)]
        ref = np.load("%s/plain.%d.%s.npy" % (d, n, dt)).astype(np.float64)
        diff = [np.abs(np.load("%s/%s.%d.%s.npy" % (d, r, n, dt)) - ref).max() / np.abs(ref).max()
                for r in ("preload", "client")]
        print("| %d | %s | %.1f, %.1f | %.1f, %.1f | %.1f, %.1f | %.2f | %.2f | %.1e, %.1e |" % (
            n, dt, *p["numpy"], *q["numpy"], *p["client"], q["numpy"][0] / p["client"][0],
            p["numpy"][0] / q["numpy"][0], *diff))
EOF
    local env=(env -u LD_PRELOAD PYTHONPATH="$tmp/site:$PWD/client/python/src")
    echo "\`PYTHONPATH=<the wheel>:client/python/src [LD_PRELOAD=lib/libgemm_blas.so] $PY\`: \`a @ b\` and" \
         "\`gemmd.Client().matmul(a, b)\` at n = $NSIZES, median and minimum of $REPEATS after one untimed"
    echo
    "${env[@]}" "$PY" "$tmp/nb.py" plain "$tmp" "$NSIZES" "$REPEATS" >&2
    "${env[@]}" LD_PRELOAD="$PRELOAD" GEMM_OFFLOAD_LOG=1 "$PY" "$tmp/nb.py" preload "$tmp" "$NSIZES" "$REPEATS" \
        2>"$tmp/preload.log"
    "${env[@]}" "$PY" "$tmp/nb.py" table "$tmp" "$NSIZES" "$REPEATS"
    echo
}

report() {
    echo "# BLAS preload: break-even and overhead"
    echo
    echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "- host: $(uname -n), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')," \
         "load average $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    info=$(curl -sf "$SERVER/v1/info" || true)
    echo "- server: $SERVER, backend $(echo "$info" | grep -o '"backend":"[^"]*"' | head -1 | cut -d'"' -f4)," \
         "devices: $(echo "$info" | sed -n 's/.*"devices":\[\([^]]*\)\].*/\1/p' | grep -o '"name":"[^"]*"' | cut -d'"' -f4 | paste -sd ';' -)"
    echo "- host BLAS: ${GEMM_BLAS_LIB:-libblas.so.3} -> $(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || echo '?')"
    echo
    if part breakeven; then
        local args=()
        [ -n "$SIZES" ] && args+=(--sizes "$SIZES")
        echo "## Break-even"
        echo
        echo "\`GEMM_SERVER=$SERVER $PROG breakeven ${args[*]}\`"
        echo
        "$PROG" breakeven "${args[@]}"
    fi
    if part tiny; then
        echo "## Below the threshold: ns added per call"
        echo
        echo "\`LD_PRELOAD=lib/libgemm_blas.so $PROG tiny --repeats 21\`"
        echo
        LD_PRELOAD=$PRELOAD "$PROG" tiny --repeats 21 2>/dev/null
        echo
    fi
    if part offload; then
        echo "## Offloaded: the preload against gemm_client_multiply"
        echo
        echo "\`GEMM_SERVER=$SERVER LD_PRELOAD=lib/libgemm_blas.so $PROG offload --sizes $OSIZES --repeats $REPEATS\`"
        echo
        LD_PRELOAD=$PRELOAD "$PROG" offload --sizes "$OSIZES" --repeats "$REPEATS"
        echo
    fi
    if part numpy; then numpy_part; fi
}

if [ -n "$OUT" ]; then report | tee "$OUT"; else report; fi
