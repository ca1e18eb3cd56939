#!/usr/bin/env bash
# tests/run.sh - runs every test this machine can run and prints one summary line.
#
# Every test program speaks TAP ("ok N - name", "not ok N - name", "ok N - name # SKIP why"):
# cmocka programs through CMOCKA_MESSAGE_OUTPUT=TAP, the end-to-end and GPU programs by
# themselves. A program that exits non-zero without reporting a failure counts as one.
set -u
BUILD=${BUILD:-build}
BIN=${BIN:-bin}
CUDA=${CUDA:-0}
SAN=${SAN:-0}
export GEMMD_BIN=${GEMMD_BIN:-$BIN/gemmd}
export GEMM_BIN=${GEMM_BIN:-$BIN/gemm}
export GEMMD_BUILD=$BUILD
export GEMMD_LIBDIR=${GEMMD_LIBDIR:-${LIBDIR:-lib}}
logdir=$BUILD/test-logs
mkdir -p "$logdir"

passed=0 failed=0 skipped=0
skips=() failures=()

# Python with NumPy for the end-to-end reference.
PY=""
for py in python3 /usr/bin/python3; do
    if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import numpy' 2>/dev/null; then PY=$py; break; fi
done

if [ "$SAN" = 1 ]; then
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
fi

# TEST_ONLY: an extended regular expression; when set, only the programs whose name
# ("unit/test_engine", "gpu/test_split_gpu", "e2e/test_v2", ...) matches it run, and the
# summary says how many were left out (for a quick run of one area, e.g. on a GPU host).
only_left=0
# run_tap NAME CMD... : runs a TAP-speaking program and adds up its results.
run_tap() {
    local name=$1; shift
    if [ -n "${TEST_ONLY:-}" ] && ! echo "$name" | grep -qE -- "$TEST_ONLY"; then
        only_left=$((only_left + 1))
        return 0
    fi
    local log="$logdir/$(echo "$name" | tr '/ ' '__').log"
    local start=$SECONDS
    # A hung program must not hang the whole run: each gets TEST_TIMEOUT seconds.
    CMOCKA_MESSAGE_OUTPUT=TAP timeout -k 10 "${TEST_TIMEOUT:-900}" "$@" >"$log" 2>&1
    local rc=$?
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        echo "not ok 0 - $name timed out after ${TEST_TIMEOUT:-900} s (killed)" >>"$log"
    fi
    local p f s
    p=$(grep -cE '^ok [0-9]+' "$log" | tr -d ' ')
    s=$(grep -cE '^ok [0-9]+.*# *(SKIP|skip)' "$log" | tr -d ' ')
    f=$(grep -cE '^not ok [0-9]+' "$log" | tr -d ' ')
    p=$((p - s))
    if [ "$rc" != 0 ] && [ "$f" = 0 ]; then
        f=1
        failures+=("$name: exited with status $rc without reporting a failing test (see $log)")
    fi
    if grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$log"; then
        f=$((f + 1))
        failures+=("$name: sanitizer report (see $log)")
    fi
    while IFS= read -r line; do failures+=("$name: $line"); done < <(grep -E '^not ok [0-9]+' "$log")
    while IFS= read -r line; do skips+=("$name: ${line#*# }"); done < <(grep -E '^ok [0-9]+.*# *(SKIP|skip)' "$log")
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    printf '%-34s %4d passed %3d failed %3d skipped  (%ds)\n' "$name" "$p" "$f" "$s" $((SECONDS - start))
}

echo "== unit tests"
for t in "$BUILD"/tests/unit/test_*; do
    [ -x "$t" ] || continue
    run_tap "unit/$(basename "$t")" "$t"
done

echo "== end-to-end tests (real daemon on loopback)"
if [ -z "$PY" ]; then
    skips+=("e2e: no python3 with NumPy found (the reference); run scripts/deps.sh test")
    skipped=$((skipped + 1))
else
    for t in tests/e2e/test_*.py; do
        [ -f "$t" ] || continue
        run_tap "e2e/$(basename "$t" .py)" "$PY" "$t"
    done
fi

echo "== GPU tests"
gpu_count=0
if command -v nvidia-smi >/dev/null 2>&1; then
    gpu_count=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
fi
if [ "$CUDA" != 1 ]; then
    skips+=("GPU tests: built without CUDA (no GPU visible or no nvcc, or CUDA=0; CUDA=1 builds them)")
    skipped=$((skipped + 1))
    echo "SKIPPED: GPU tests (built without CUDA)"
elif [ "$gpu_count" = 0 ]; then
    skips+=("GPU tests: no NVIDIA GPU on this machine (nvidia-smi lists none); they run on a GPU host with 'make test'")
    skipped=$((skipped + 1))
    echo "SKIPPED: GPU tests - no NVIDIA GPU on this machine"
else
    for t in "$BUILD"/tests/gpu/*; do
        [ -x "$t" ] && [ -f "$t" ] || continue
        run_tap "gpu/$(basename "$t")" "$t"
    done
    for t in tests/gpu/test_*.py; do
        [ -f "$t" ] && [ -n "$PY" ] || continue
        run_tap "gpu/$(basename "$t" .py)" "$PY" "$t"
    done
fi

echo
if [ "$only_left" -gt 0 ]; then
    skips+=("$only_left test programs not run: TEST_ONLY='$TEST_ONLY' chose the others")
    skipped=$((skipped + only_left))
fi
if [ ${#skips[@]} -gt 0 ]; then
    echo "skipped:"
    for s in "${skips[@]}"; do echo "  - $s"; done
fi
if [ ${#failures[@]} -gt 0 ]; then
    echo "failed:"
    for s in "${failures[@]}"; do echo "  - $s"; done
    echo "logs: $logdir/"
fi
echo "summary: $passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
