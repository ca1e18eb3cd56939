#!/usr/bin/env bash
# bench/kernels_gpu.sh OUTDIR - on a GPU machine: build the kernel family, run the GPU
# kernel tests and compute-sanitizer on the optimized members, the tuning sweep and the
# whole benchmark, leaving logs and CSVs in OUTDIR (default bench/out).
#   CUDA_ARCHS=90a bench/kernels_gpu.sh bench/out
set -u
out=${1:-bench/out}
mkdir -p "$out"
archs=${CUDA_ARCHS:-90a}
step() { echo "== $* ($(date -u +%H:%M:%S))"; }

step build
if ! make CUDA_ARCHS="$archs" -j16 build/bench/bench_kernels build/tests/gpu/test_kernels >"$out/build.log" 2>&1; then
    tail -40 "$out/build.log"
    exit 1
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv >"$out/gpu.txt" 2>&1
cat "$out/gpu.txt"

step "tests (small shapes)"
for k in ${KERNELS:-simt mma dmma}; do
    timeout 120 build/tests/gpu/test_kernels --small --kernel "$k"
done >"$out/tests.log" 2>&1
grep -c '^ok' "$out/tests.log" | sed 's/^/ok: /'
grep '^not ok' "$out/tests.log" | head -20

if [ "${TUNE:-1}" = 1 ]; then
    step tune
    timeout ${TUNE_LIMIT:-120} build/bench/bench_kernels --tune --no-main --csv "$out/tune.csv" >"$out/tune.log" 2>&1
    echo "tune exit $?"
fi

step bench
timeout ${BENCH_LIMIT:-180} build/bench/bench_kernels --csv "$out/kernels.csv" ${BENCH_ARGS:-} >"$out/bench.log" 2>&1
echo "bench exit $?"

[ "${SANITIZE:-1}" = 1 ] || { step done; exit 0; }
step "tests (all shapes) and compute-sanitizer"
{
    for k in ${KERNELS:-simt mma dmma}; do
        timeout 60 build/tests/gpu/test_kernels --kernel "$k"
    done
    san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    for k in ${KERNELS:-simt mma dmma}; do
        for tool in memcheck racecheck; do
            timeout 40 "$san" --tool $tool --error-exitcode 3 build/tests/gpu/test_kernels --small --kernel "$k" 2>&1 |
                grep -E '^(not ok|=========.*(SUMMARY|ERROR|Error))' | sed "s/^/$tool $k: /"
            echo "$tool $k exit ${PIPESTATUS[0]}"
        done
    done
} >"$out/sanitize.log" 2>&1
grep -E 'exit|not ok' "$out/sanitize.log"
step done
