#!/usr/bin/env bash
# bench/gpu_session.sh OUTDIR [STEP ...] - the GPU host's measurements, in one go, packed
# into one archive.
#
# Runs the steps named (default: all, in the order below), each with its own time limit
# (seconds: STEP_LIMIT_<step>, defaults below), each writing into OUTDIR/<step>/. A
# summary (what ran, exit status, seconds, the key lines of each report) goes to stdout
# and OUTDIR/summary.md, and everything is packed into OUTDIR/results.tgz, so that a
# remote run that can bring back only a few files still brings all of it. Steps:
#
#   build     make -j all bench check-tests (skipped when bin/gemmd runs and BUILD_SKIP=1)
#   gputests  the whole test suite (tests/run.sh with the CUDA build): GPU test programs
#             included (kernels, engine, batch, coalesce, half, split, multigpu, daemon,
#             resident, v2); GPUTESTS_ONLY (a TEST_ONLY pattern, e.g. '^gpu/') narrows it
#   first     bench/first_request.py: the first products after a start, warm-up off and on
#   ceiling   bench/ceiling.sh: 64², 256², 1024² at 1, 64, 256 connections, against the
#             bare libmicrohttpd server, then the same with GEMMD=$BASE/bin/gemmd (a build of
#             the previous commit, when BASE names one) for before/after
#   latency   bin/gemm bench -n 64 at 1 and 64 connections, per request, uncorrected
#   soak      bench/soak.py --backend cuda, 1,000,000 products (SOAK_N), 8 client processes
#   python    bench/bench_python_client.py --backend cuda at 2048² and 4096²
#   blas      bench/blas_breakeven.sh --backend cuda --offload-sizes 2048,4096
#   v2async   bench/bench_v2.py --backend cuda (tritonclient's async API; needs the wheels
#             in WHEELS, default .whl, installed with pip --no-index into a target folder)
#   half      float16/bfloat16 against float32 end to end at 4096² on one connection
#             (bin/gemm bench), the issue's <= 55% target
#   split     bench/split_bench.sh when present (one product over two engines)
#   multigpu  bench/multigpu_bench.py: products/s on one GPU against every GPU (MG_SIZE,
#             MG_CONNS, MG_SECONDS); on a host with one GPU it measures the same twice
#   batch     bench/batch_bench.sh: one request of 10,000 64² products against 10,000
#             single requests at 64 connections, and dynamic batching off / on
#   streams   bench/streams_bench.py --size 4096: parallel transfer over 1, 2, 4, 8
#             connections, each answer compared byte for byte with the single request's
#   hostile   bench/hostile_load.py --backend cuda (phases HOSTILE_SCALE x their CI length,
#             default 0.4): peak RSS against the budget, probes and a good client
#   fleet     bench/fleet_nginx.sh (nginx and wrk on PATH or under /tmp/deps)
set -u
cd "$(dirname "$0")/.."
out=${1:?usage: bench/gpu_session.sh OUTDIR [STEP ...]}
shift
mkdir -p "$out"
steps=${*:-build gputests first ceiling latency soak python blas v2async half split multigpu batch streams hostile fleet}
export PATH=/tmp/deps/usr/sbin:/tmp/deps/usr/bin:$PATH
JOBS=${JOBS:-$(nproc)}
PY=${PY:-python3}
summary=$out/summary.md
t_all=$SECONDS
echo "# GPU session $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')" >"$summary"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no GPU listed"
  echo "$(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"; } | sed 's/^/- /' >>"$summary"

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

step_build() {
    if [ "${BUILD_SKIP:-0}" = 1 ] && bin/gemmd --version >/dev/null 2>&1; then echo "prebuilt: $(bin/gemmd --version)"; return 0; fi
    make -j"$JOBS" all bench check-tests >"$1/build.log" 2>&1; local rc=$?
    grep -c warning "$1/build.log" | sed 's/^/warnings: /'; tail -3 "$1/build.log"; return $rc
}
step_gputests() {
    TEST_ONLY=${GPUTESTS_ONLY:-} BUILD=build BIN=bin CUDA=1 TEST_TIMEOUT=300 tests/run.sh >"$1/test.log" 2>&1; local rc=$?
    grep -E '^(summary|  - |SKIPPED)' "$1/test.log" | tail -30
    cp -r build/test-logs "$1/" 2>/dev/null
    return $rc
}
step_first() { "$PY" bench/first_request.py --backend cuda --starts 3 --out "$1/first-request.md" | grep '^| '; }
step_ceiling() {
    SIZES=${CEIL_SIZES:-64 256 1024} CONNS=${CEIL_CONNS:-1 64 256} DURATION=${CEIL_DURATION:-5} \
        bench/ceiling.sh "$1/now" >"$1/ceiling-now.md" 2>&1
    grep '^| [0-9]' "$1/ceiling-now.md"
    if [ -n "${BASE:-}" ] && [ -x "$BASE/bin/gemmd" ]; then
        GEMMD=$BASE/bin/gemmd GEMMD_CONF=$BASE/config/gemmd.conf SIZES=${CEIL_SIZES:-64 256 1024} \
            CONNS=${CEIL_CONNS:-1 64 256} DURATION=${CEIL_DURATION:-5} bench/ceiling.sh "$1/base" >"$1/ceiling-base.md" 2>&1
        echo "base ($BASE):"; grep '^| [0-9]' "$1/ceiling-base.md"
    fi
}
step_latency() {
    local port pid; port=$(free_port)
    bin/gemmd --backend cuda --port "$port" --log-level warn >"$1/gemmd.log" 2>&1 & pid=$!
    for _ in $(seq 200); do curl -sf "127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.05; done
    bin/gemm bench -s "http://127.0.0.1:$port" -n 64 -c 1 -r 20000 -w 200 >"$1/c1.txt" 2>&1
    bin/gemm bench -s "http://127.0.0.1:$port" -n 64 -c 64 -r 1000 -w 10 >"$1/c64.txt" 2>&1
    kill "$pid"; wait "$pid" 2>/dev/null
    grep -h -E 'gemm bench|latency|throughput' "$1/c1.txt" "$1/c64.txt"
}
step_soak() {
    "$PY" bench/soak.py --backend cuda -n "${SOAK_N:-1000000}" --procs 8 --max-seconds "${SOAK_SECONDS:-400}" \
        --out "$1/soak-gpu.md" >"$1/soak.log" 2>&1; local rc=$?
    grep -E 'products by|wrong answers|Stopped|flat' "$1/soak-gpu.md"; return $rc
}
step_python() {
    "$PY" bench/bench_python_client.py --backend cuda --shapes 2048,4096 --repeat 21 --out "$1/python-client.md" \
        >"$1/python.log" 2>&1; local rc=$?
    grep -iE 'ratio|^\| (2048|4096)' "$1/python-client.md" | head -12; return $rc
}
step_blas() {
    bench/blas_breakeven.sh --backend cuda --offload-sizes 2048,4096 --repeats 7 --out "$1/blas-offload.md" \
        >"$1/blas.log" 2>&1; local rc=$?
    grep -E 'break-even|^\| (loopback|2048|4096) ' "$1/blas-offload.md" | head -20; return $rc
}
step_v2async() {
    local wheels=${WHEELS:-.whl}
    if ! ls "$wheels"/*.whl >/dev/null 2>&1; then echo "no wheels in $wheels: skipped"; return 0; fi
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/v2site "$wheels"/*.whl \
        >"$1/pip.log" 2>&1 || { tail -5 "$1/pip.log"; return 1; }
    PYTHONPATH=/tmp/v2site${PYTHONPATH:+:$PYTHONPATH} "$PY" bench/bench_v2.py --backend cuda >"$1/bench_v2.md" 2>&1; local rc=$?
    grep '^| ' "$1/bench_v2.md" | head -20; return $rc
}
step_half() {
    local port pid; port=$(free_port)
    bin/gemmd --backend cuda --port "$port" --log-level warn --max-body-mb 1024 >"$1/gemmd.log" 2>&1 & pid=$!
    for _ in $(seq 200); do curl -sf "127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.05; done
    for dt in float32 float16 bfloat16; do
        echo "== $dt"; bin/gemm bench -s "http://127.0.0.1:$port" -n 4096 -d "$dt" -c 1 -r 15 -w 2 2>&1
    done >"$1/half.txt"
    kill "$pid"; wait "$pid" 2>/dev/null
    grep -E '^==|latency' "$1/half.txt"
}
step_split() {
    if [ ! -x bench/split_bench.sh ]; then echo "bench/split_bench.sh not in this tree: skipped"; return 0; fi
    bench/split_bench.sh "$1" >"$1/split.md" 2>&1; local rc=$?
    grep '^| ' "$1/split.md" | head -20; return $rc
}
step_multigpu() {
    "$PY" bench/multigpu_bench.py --size "${MG_SIZE:-8192}" --conns "${MG_CONNS:-8}" --seconds "${MG_SECONDS:-20}" \
        --out "$1/multigpu.md" >"$1/multigpu.log" 2>&1; local rc=$?
    grep '^| ' "$1/multigpu.md"; return $rc
}
step_batch() {
    DURATION=${BATCH_DURATION:-5} bench/batch_bench.sh "$1/run" >"$1/batch.md" 2>&1; local rc=$?
    grep -E '^\| |on / off' "$1/batch.md" | head -20; return $rc
}
step_streams() {
    "$PY" bench/streams_bench.py --size 4096 --backend cuda --reps 7 >"$1/streams.md" 2>&1; local rc=$?
    grep '^| ' "$1/streams.md"; return $rc
}
step_hostile() {
    "$PY" bench/hostile_load.py --backend cuda --label gpu --scale "${HOSTILE_SCALE:-0.4}" --settle 1 \
        --out "$1/hostile.md" >"$1/hostile.log" 2>&1; local rc=$?
    grep -E 'peak RSS|^\| (idle|all at once|non-readers)' "$1/hostile.md"; return $rc
}
step_fleet() { bench/fleet_nginx.sh "$1/run" >"$1/fleet.md" 2>&1; local rc=$?; grep '^| ' "$1/fleet.md"; return $rc; }

for s in $steps; do
    if ! declare -F "step_$s" >/dev/null; then echo "unknown step $s" | tee -a "$summary"; continue; fi
    mkdir -p "$out/$s"
    lim_var=STEP_LIMIT_$s
    case $s in build) def=300 ;; gputests) def=600 ;; soak) def=480 ;; ceiling) def=360 ;; fleet) def=240 ;; multigpu) def=300 ;; *) def=180 ;; esac
    lim=${!lim_var:-$def}
    t0=$SECONDS
    # A step runs in its own shell under a time limit; what it printed goes into the summary.
    timeout "$lim" bash -c "$(declare -f free_port "step_$s"); PY=$PY JOBS=$JOBS; step_$s \"\$1\"" _ "$out/$s" \
        >"$out/$s/step.out" 2>&1
    rc=$?
    { echo; echo "## $s: exit $rc, $((SECONDS - t0)) s (limit $lim)"; echo; echo '```'; tail -40 "$out/$s/step.out"; echo '```'; } >>"$summary"
    echo "[$((SECONDS - t_all)) s] $s: exit $rc"
done
tar czf "$out/results.tgz" -C "$out" --exclude results.tgz . 2>/dev/null
cat "$summary"
