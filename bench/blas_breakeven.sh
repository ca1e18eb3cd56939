#!/usr/bin/env bash
# bench/blas_breakeven.sh - the BLAS preload's numbers on this host, as one Markdown report:
#   1. the break-even table: from which n an n^3 product is faster on the server than on
#      this host's BLAS, over loopback and over modelled links (build/bench/blas_breakeven);
#   2. below the threshold: ns the preload adds per call (build/bench/blas_tiny);
#   3. above it: the preload against gemm_client_multiply for the same product (build/bench/blas_offload).
#
#   bench/blas_breakeven.sh [--server URL] [--backend auto|cpu|cuda] [--sizes LIST]
#                           [--offload-sizes 256,512,2048,4096] [--repeats N] [--gpu-tflops F32,F64]
#                           [--links NAME=BYTES_PER_S:RTT_MS,...] [--skip-offload] [--out FILE.md]
#
# Without --server it starts bin/gemmd (--backend, default auto: CUDA when there is a GPU)
# on a free loopback port and stops it at the end. The host BLAS is GEMM_BLAS_LIB (default
# libblas.so.3, what Debian's alternatives point at). Needs `make bench` (it runs it when
# the programs are missing) and curl. --out also writes the report to a file.
set -euo pipefail
cd "$(dirname "$0")/.."

SERVER="" BACKEND=auto SIZES="" OSIZES="256,512,2048,4096" REPEATS=7 GPU="" LINKS="" OUT="" SKIP_OFFLOAD=0
while [ $# -gt 0 ]; do
    case $1 in
    --server) SERVER=$2; shift 2 ;;
    --backend) BACKEND=$2; shift 2 ;;
    --sizes) SIZES=$2; shift 2 ;;
    --offload-sizes) OSIZES=$2; shift 2 ;;
    --repeats) REPEATS=$2; shift 2 ;;
    --gpu-tflops) GPU=$2; shift 2 ;;
    --links) LINKS=$2; shift 2 ;;
    --skip-offload) SKIP_OFFLOAD=1; shift ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "blas_breakeven.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

BUILD=${BUILD:-build}
PRELOAD=$PWD/lib/libgemm_blas.so
progs=("$BUILD/bench/blas_breakeven" "$BUILD/bench/blas_tiny" "$BUILD/bench/blas_offload")
for p in "${progs[@]}" bin/gemmd "$PRELOAD"; do
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
    curl -sf "$SERVER/healthz" >/dev/null || { cat "$tmp/gemmd.log" >&2; echo "blas_breakeven.sh: gemmd did not start" >&2; exit 1; }
fi
export GEMM_SERVER=$SERVER

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
    echo "## 1. Break-even (bench/blas_breakeven.sh; build/bench/blas_breakeven)"
    echo
    args=()
    [ -n "$SIZES" ] && args+=(--sizes "$SIZES")
    [ -n "$GPU" ] && args+=(--gpu-tflops "$GPU")
    [ -n "$LINKS" ] && args+=(--links "$LINKS")
    echo "\`GEMM_SERVER=$SERVER $BUILD/bench/blas_breakeven ${args[*]}\`"
    echo
    "$BUILD/bench/blas_breakeven" "${args[@]}"
    echo "## 2. Below the threshold: ns added per call (build/bench/blas_tiny)"
    echo
    echo "\`LD_PRELOAD=lib/libgemm_blas.so $BUILD/bench/blas_tiny --batches 21\`"
    echo
    LD_PRELOAD=$PRELOAD "$BUILD/bench/blas_tiny" --batches 21 2>/dev/null
    echo
    if [ "$SKIP_OFFLOAD" = 0 ]; then
        echo "## 3. Offloaded: the preload against gemm_client_multiply (build/bench/blas_offload)"
        echo
        echo "\`GEMM_SERVER=$SERVER LD_PRELOAD=lib/libgemm_blas.so $BUILD/bench/blas_offload --sizes $OSIZES --repeats $REPEATS\`"
        echo
        LD_PRELOAD=$PRELOAD "$BUILD/bench/blas_offload" --sizes "$OSIZES" --repeats "$REPEATS"
        echo
    fi
}

if [ -n "$OUT" ]; then report | tee "$OUT"; else report; fi
