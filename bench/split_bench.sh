#!/usr/bin/env bash
# bench/split_bench.sh [OUTDIR] - one big product whole or split into row panels of A, on the
# GPU host (bench/bench_split.c; bench/gpu_session.sh runs it as its "split" step).
#
# float32 8192^3 and 16384^3 (SPLIT_SIZES), kernel auto (SPLIT_KERNEL), exact fp32 and then
# tf32 (SPLIT_MATHS), SPLIT_REPS runs after a warm-up: whole on one GPU, split in two on one
# GPU (two of its streams as two engines), and split one panel per GPU when the host has
# two or more. The tables go to stdout (and OUTDIR/bench_split-<math>.md when OUTDIR is
# given); copy them into bench/results/ with the device, date and this command.
set -eu
cd "$(dirname "$0")/.."
out=${1:-}
BIN=${BENCH_SPLIT:-build/bench/bench_split}
[ -x "$BIN" ] || make -j"$(nproc)" bench >/dev/null
[ -n "$out" ] && mkdir -p "$out"
for math in ${SPLIT_MATHS:-fp32 tf32}; do
    echo "## float32, math $math ($(date -u +%Y-%m-%dT%H:%MZ), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | tr -s ' ' | paste -sd';' -))"
    echo "command: $BIN --sizes ${SPLIT_SIZES:-8192,16384} --kernel ${SPLIT_KERNEL:-auto} --math $math --reps ${SPLIT_REPS:-5} --ways 2"
    "$BIN" --sizes "${SPLIT_SIZES:-8192,16384}" --kernel "${SPLIT_KERNEL:-auto}" --math "$math" \
        --reps "${SPLIT_REPS:-5}" --ways 2 | if [ -n "$out" ]; then tee "$out/bench_split-$math.md"; else cat; fi
    echo
done
