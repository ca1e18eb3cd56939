#!/usr/bin/env bash
# bench/gpu_session.sh OUTDIR [STEP ...] - the GPU host's measurements in one go, packed into
# one archive.
#
# Runs the steps named (default: all, in the order below), each under its own time limit
# (seconds: STEP_LIMIT_<step>, defaults below), each writing into OUTDIR/<step>/. A summary
# (what ran, exit status, seconds, the key lines of each report) goes to stdout and
# OUTDIR/summary.md, and everything is packed into OUTDIR/results.tgz, so that a remote run
# that brings back only a few files still brings all of it. BASE names a tree of an older
# revision built beside this one (e.g. `git worktree add .base REV && make -C .base -j
# all bench`): the steps marked * then measure it too, in the same rounds.
#
#   build     make -j all bench check-tests (skipped when bin/gemmd runs and BUILD_SKIP=1)
#   gputests  the whole test suite with the CUDA build (GPUTESTS_ONLY: a TEST_ONLY pattern)
#   sanitize  make gpu-sanitize: compute-sanitizer memcheck and racecheck on every kernel
#   kernels*  bench_kernels: every member against cuBLAS (KERNELS_ARGS), the tuning sweep when
#             TUNE=1; with BASE, both builds in KERNELS_ROUNDS alternating rounds, new / old
#   load*     bench/load.py: gemmd against the bare libmicrohttpd server (and BASE's gemmd),
#             LOADS (default 64@1 64@64 256@64 1024@64 4096@4), first requests, stage times,
#             uncorrected latency, system calls per request
#   half      bench/load.py at 4096@1 in float32, float16 and bfloat16 (C in float32)
#   batch     bench/load.py: one request of 10,000 64² products against single requests at
#             64 connections, dynamic batching off (batch_max 1) and on (32)
#   engine    build/bench/bench_engine load: 64² products at 64 clients without HTTP, batching
#             off and on; one client on one stream, and the CPU a worker burns beside a 500 ms
#             kernel
#   split     build/bench/bench_engine split: 8192² and 16384² whole and split, fp32 and tf32
#   multigpu  products/s on one GPU against every GPU, 8192² float32 at 8 clients: the engine
#             alone (bench_engine load --devices 0 | all) and through HTTP (bench/load.py)
#   offload   bench/offload.py (root): gemm, Python client, BLAS preload and host BLAS over
#             loopback and namespaced 10 and 1 Gbit/s links, 2048² to 8192², and --streams
#   v2        bench/bench_v2.py: the v2 door against v1, tritonclient's async APIs (from
#             WHEELS, default .whl, when PyPI cannot be reached)
#   codec     build/bench/bench_codec: the JSON, .npy and multipart codecs in process
#   blas      bench/blas_offload.sh --backend cuda --offload-sizes 2048,4096
#   soak      bench/soak.py --backend cuda, 1,000,000 products (SOAK_N), 8 client processes
#   hostile   bench/hostile_load.py --backend cuda --fairness (phases HOSTILE_SCALE x CI length)
#   fleet     bench/load.py: one CPU daemon direct, one and three behind nginx (512²), and
#             nginx in front of the CUDA daemon (4096²)
set -u
cd "$(dirname "$0")/.." || exit 2
out=${1:?usage: bench/gpu_session.sh OUTDIR [STEP ...]}
shift
mkdir -p "$out"
out=$(cd "$out" && pwd)
steps=${*:-build gputests sanitize kernels load half batch engine split multigpu offload v2 codec blas soak hostile fleet}
JOBS=${JOBS:-$(nproc)}
PY=${PY:-/usr/bin/python3}
BASE=${BASE:+$(cd "$BASE" && pwd)}
summary=$out/summary.md
t_all=$SECONDS
echo "# GPU session $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')${BASE:+, base $BASE}" >"$summary"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no GPU listed"
  echo "$(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"; } | sed 's/^/- /' >>"$summary"

# the table of medians over the rounds from bench/load.py's reports
medians() { local f; for f in "$@"; do sed -n '/^## medians/,/^## [^m]/p' "$f" | grep '^|'; done; }
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
step_sanitize() { make gpu-sanitize >"$1/sanitize.log" 2>&1; local rc=$?; grep -E '^(ok|not ok)' "$1/sanitize.log" | tail -20; return $rc; }
step_kernels() {
    local args r rc=0 old
    read -ra args <<<"${KERNELS_ARGS:-}"
    if [ "${TUNE:-0}" = 1 ]; then build/bench/bench_kernels --tune --no-main --csv "$1/tune.csv" >"$1/tune.log" 2>&1
        "$PY" bench/kernels_report.py --tune "$1/tune.csv"; fi
    for r in $(seq "${KERNELS_ROUNDS:-1}"); do
        build/bench/bench_kernels --csv "$1/new-$r.csv" "${args[@]}" >"$1/new-$r.log" 2>&1 || rc=1
        [ -z "$BASE" ] || "$BASE/build/bench/bench_kernels" --csv "$1/old-$r.csv" "${args[@]}" >"$1/old-$r.log" 2>&1 || rc=1
    done
    "$PY" bench/kernels_report.py "$1/new-1.csv"
    if [ -n "$BASE" ]; then old=$(printf '%s,' "$1"/old-*.csv); "$PY" bench/kernels_report.py --base "${old%,}" "$1"/new-*.csv; fi
    return $rc
}
step_load() {
    "$PY" bench/load.py --out "$1/run" --servers "bare new=bin/gemmd${BASE:+ base=$BASE/bin/gemmd}" \
        --loads "${LOADS:-64@1 64@64 256@64 1024@64 4096@4}" --rounds "${ROUNDS:-3}" --first --stages --latency \
        --syscalls >"$1/load.md" 2>&1; local rc=$?
    medians "$1/load.md"; return $rc
}
step_half() {
    local dt rc=0
    for dt in float32 float16 bfloat16; do
        "$PY" bench/load.py --out "$1/run" --servers gemmd=bin/gemmd --loads 4096@1 --dtype $dt --rounds 1 --latency \
            >"$1/$dt.md" 2>&1 || rc=1
        echo "$dt: $(grep '^| gemmd | 4096@1 |' "$1/$dt.md")"
    done
    return $rc
}
step_batch() {
    "$PY" bench/load.py --out "$1/run" --servers "off=bin/gemmd on=bin/gemmd" --flags "off=--batch-max 1" \
        --flags "on=--batch-max 32" --loads "64*10000@1 64*10000s@1 64@64" --stages >"$1/batch.md" 2>&1; local rc=$?
    medians "$1/batch.md"; grep '^stages:' "$1/batch.md"; return $rc
}
step_engine() {
    local e=build/bench/bench_engine s
    for s in 1 32; do $e load --n 64 --clients 64 --batch-max $s; done
    $e load --n 64 --clients 1 --streams 1 --devices 0
    $e load --n 64 --clients 1 --streams 1 --ms 3000 --devices 0 --fault-inject gpu_delay_ms:500
}
step_split() { local m; for m in fp32 tf32; do build/bench/bench_engine split --sizes 8192,16384 --math $m --reps 5; done; }
step_multigpu() {
    build/bench/bench_engine load --n 8192 --clients 8 --ms 10000 --devices 0
    build/bench/bench_engine load --n 8192 --clients 8 --ms 10000 --devices all
    "$PY" bench/load.py --out "$1/run" --servers "one=bin/gemmd all=bin/gemmd" --flags "one=--devices 0" \
        --gemmd-flags "--split-min-mnk 0" --loads 8192@8 --rounds 2 --duration 10 --warmup 2 >"$1/wire.md" 2>&1
    medians "$1/wire.md"
}
step_offload() {
    "$PY" bench/offload.py --sizes 2048,4096,8192 --reps 2 --streams --out "$1/offload.md" >"$1/offload.log" 2>&1
    local rc=$?; grep -E '^\| [0-9]|^- link|skipped' "$1/offload.md"; return $rc
}
step_v2() {
    local wheels=${WHEELS:-.whl}
    ls "$wheels"/*.whl >/dev/null 2>&1 || wheels=
    "$PY" bench/bench_v2.py --backend cuda --reps 5 ${wheels:+--wheels "$wheels"} --out "$1/v2.md" >"$1/v2.log" 2>&1
    local rc=$?; grep '^| ' "$1/v2.md" | head -20; return $rc
}
step_codec() { build/bench/bench_codec --sizes 256,1024,2048 --repeats 5; }
step_blas() {
    bench/blas_offload.sh --backend cuda --offload-sizes 2048,4096 --repeats 7 --out "$1/blas-offload.md" \
        >"$1/blas.log" 2>&1; local rc=$?
    grep -E 'break-even|^\| (2048|4096) ' "$1/blas-offload.md" | head -20; return $rc
}
step_soak() {
    "$PY" bench/soak.py --backend cuda -n "${SOAK_N:-1000000}" --procs 8 --max-seconds "${SOAK_SECONDS:-400}" \
        --out "$1/soak-gpu.md" >"$1/soak.log" 2>&1; local rc=$?
    grep -E 'products by|wrong answers|Stopped|flat' "$1/soak-gpu.md"; return $rc
}
step_hostile() {
    "$PY" bench/hostile_load.py --backend cuda --fairness --label gpu --scale "${HOSTILE_SCALE:-0.4}" --settle 1 \
        --out "$1/hostile.md" >"$1/hostile.log" 2>&1; local rc=$?
    grep -E 'peak RSS|^\| (idle|all at once|non-readers)' "$1/hostile.md"; return $rc
}
step_fleet() {
    local t=$(( ($(nproc) - 4) / 3 )) rc=0
    [ "$t" -ge 1 ] || t=1
    "$PY" bench/load.py --out "$1/cpu" --backend cpu --servers "one=bin/gemmd nginx1=nginx:1:bin/gemmd \
nginx3=nginx:3:bin/gemmd wide=bin/gemmd" --gemmd-flags "--threads $t --cpu-workers 1" --flags "wide=--threads $((t * 3))" \
        --loads 512@24 --rounds 2 --duration 10 >"$1/cpu.md" 2>&1 || rc=1
    "$PY" bench/load.py --out "$1/cuda" --backend cuda --servers "direct=bin/gemmd nginx=nginx:1:bin/gemmd" \
        --loads 4096@8 --rounds 2 --duration 10 >"$1/cuda.md" 2>&1 || rc=1
    medians "$1/cpu.md" "$1/cuda.md"; return $rc
}

for s in $steps; do
    if ! declare -F "step_$s" >/dev/null; then echo "unknown step $s" | tee -a "$summary"; continue; fi
    mkdir -p "$out/$s"
    lim_var=STEP_LIMIT_$s
    case $s in build|gputests|offload) def=600 ;; soak|load) def=480 ;; kernels|multigpu|fleet|batch) def=300 ;; *) def=180 ;; esac
    lim=${!lim_var:-$def}
    t0=$SECONDS
    timeout "$lim" bash -c "$(declare -f medians "step_$s"); PY=$PY JOBS=$JOBS BASE=$BASE; step_$s \"\$1\"" _ "$out/$s" \
        >"$out/$s/step.out" 2>&1
    rc=$?
    { echo; echo "## $s: exit $rc, $((SECONDS - t0)) s (limit $lim)"; echo; echo '```'; tail -40 "$out/$s/step.out"; echo '```'; } >>"$summary"
    echo "[$((SECONDS - t_all)) s] $s: exit $rc"
done
tar czf "$out/results.tgz" -C "$out" --exclude results.tgz . 2>/dev/null
cat "$summary"
