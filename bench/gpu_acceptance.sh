#!/usr/bin/env bash
# bench/gpu_acceptance.sh OUTDIR - on a GPU machine, the checks a release must pass:
# the build as shipped (every CUDA architecture), `make test` with the GPU tests enabled,
# and `make gpu-sanitize` (compute-sanitizer memcheck + racecheck on every kernel).
# Logs go to OUTDIR (default bench/out); a short summary is printed last.
set -u
out=${1:-bench/out}
mkdir -p "$out"
jobs=${JOBS:-$(nproc)}
step() { echo "== $* ($(date -u +%H:%M:%S))"; }
t0=$SECONDS

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader >"$out/gpu.txt" 2>&1
step "build (make -j$jobs)"
if ! make -j"$jobs" >"$out/build.log" 2>&1; then
    tail -30 "$out/build.log"
    exit 1
fi
grep -c 'warning' "$out/build.log" | sed 's/^/compiler warnings: /'
echo "build: $((SECONDS - t0)) s"

step "make test"
t1=$SECONDS
make -j"$jobs" test >"$out/test.log" 2>&1
test_rc=$?
echo "make test: exit $test_rc, $((SECONDS - t1)) s"

step "make gpu-sanitize"
t2=$SECONDS
make gpu-sanitize >"$out/sanitize.log" 2>&1
san_rc=$?
echo "gpu-sanitize: exit $san_rc, $((SECONDS - t2)) s"

step summary
cat "$out/gpu.txt"
sed -n '/^== unit tests/,$p' "$out/test.log" | grep -vE '^ok |^$'
grep -E '^(ok|not ok)' "$out/sanitize.log" | tail -20
[ "$test_rc" = 0 ] && [ "$san_rc" = 0 ]
