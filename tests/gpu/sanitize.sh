#!/usr/bin/env bash
# tests/gpu/sanitize.sh - compute-sanitizer memcheck and racecheck on every kernel of the
# table (make gpu-sanitize). Each member runs the small shapes of the kernel test program
# (every dtype, tile and math mode it offers) under each tool; any reported error, or a
# failing test, fails the script. Prints TAP.
set -u
BUILD=${BUILD:-build}
prog=$BUILD/tests/gpu/test_kernels
logdir=$BUILD/test-logs/sanitize
mkdir -p "$logdir"

san=$(command -v compute-sanitizer || true)
[ -z "$san" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ] && san=/usr/local/cuda/bin/compute-sanitizer
n=0 failed=0
if [ -z "$san" ] || [ ! -x "$prog" ]; then
    why="$prog not built (make check-tests)"
    [ -z "$san" ] && why="compute-sanitizer not found"
    echo "ok 1 - compute-sanitizer # SKIP $why"
    echo "1..1"
    exit 0
fi
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    echo "ok 1 - compute-sanitizer # SKIP no NVIDIA GPU on this machine"
    echo "1..1"
    exit 0
fi

kernels=${SANITIZE_KERNELS:-$("$prog" --list)} # a few by name: SANITIZE_KERNELS="dmma wgmma"
if [ -z "$kernels" ]; then
    echo "not ok 1 - the kernel table is empty"
    echo "1..1"
    exit 1
fi

for k in $kernels; do
    for tool in memcheck racecheck; do
        n=$((n + 1))
        log="$logdir/$k-$tool.log"
        extra=()
        [ "$tool" = memcheck ] && extra=(--leak-check full)
        "$san" --tool "$tool" "${extra[@]}" --error-exitcode 3 "$prog" --small --kernel "$k" >"$log" 2>&1
        rc=$?
        errs=$(grep -E '^========= (ERROR SUMMARY|RACECHECK SUMMARY):' "$log" | tail -1)
        if [ "$rc" = 0 ] && ! grep -q '^not ok' "$log"; then
            echo "ok $n - $tool $k (${errs:-no summary})"
        else
            failed=$((failed + 1))
            echo "not ok $n - $tool $k: exit $rc, ${errs:-see log} ($log)"
            grep -E '^=========' "$log" | head -20 | sed 's/^/# /'
        fi
    done
done
echo "1..$n"
[ "$failed" = 0 ]
