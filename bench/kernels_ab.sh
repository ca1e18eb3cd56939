#!/usr/bin/env bash
# bench/kernels_ab.sh - kernel speed before and after a source change, in one session on
# one GPU: builds bench_kernels twice, from this tree ("new") and from this tree with some
# files taken from an older revision ("old"), runs them alternately ROUNDS times and prints,
# per kernel, mode and shape, the median TFLOP/s of each and new/old.
#
#   bench/kernels_ab.sh [-r REV] [-n ROUNDS] [-o OUTDIR] [-f "FILE ..."] [-- BENCH_ARGS]
#
#   -r REV     the revision the old files come from (default: main)
#   -d DIR     take the old files from DIR, a tree exported from an older revision
#              (`git archive REV | tar -x -C DIR`), where no git repository is at hand
#   -f FILES   the files taken from REV (default: the cp.async main loop and its two users,
#              kernels/cuda/gemm_async.cuh kernels/cuda/k04_mma.cu kernels/cuda/k05_dmma.cu)
#   -n ROUNDS  old/new alternations (default 3)
#   -o OUTDIR  logs, CSVs and the summary (default bench/out/ab)
#   BENCH_ARGS passed to both bench_kernels runs (default:
#              --kernels mma,dmma --shapes 1024,4096,8192,4097 --reps 20)
#
# Everything but the named files is the same in both builds (same flags, same CUDA_ARCHS,
# default 90a), so a difference is the change's. Needs git (for REV) and nvcc.
set -u
rev=main
olddir=""
rounds=3
out=bench/out/ab
files="kernels/cuda/gemm_async.cuh kernels/cuda/k04_mma.cu kernels/cuda/k05_dmma.cu"
while [ $# -gt 0 ]; do
    case $1 in
    -r) rev=$2; shift 2 ;;
    -d) olddir=$2; shift 2 ;;
    -n) rounds=$2; shift 2 ;;
    -o) out=$2; shift 2 ;;
    -f) files=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see $0 --help)" >&2; exit 2 ;;
    esac
done
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--kernels mma,dmma --shapes 1024,4096,8192,4097 --reps 20)
archs=${CUDA_ARCHS:-90a}
jobs=${JOBS:-$(nproc)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
root=$(pwd)

if [ -n "$olddir" ]; then
    [ -d "$olddir" ] || { echo "no folder $olddir" >&2; exit 2; }
    rev=$olddir
else
    git rev-parse --verify -q "$rev^{commit}" >/dev/null || { echo "no revision $rev here" >&2; exit 2; }
fi

# The old tree: a copy of this one (sources only) with the named files from REV.
old="$out/old-tree"
rm -rf "$old"
mkdir -p "$old"
tar -C "$root" --exclude=./.base --exclude=./.gpu --exclude=./build --exclude=./build-san --exclude=./bin --exclude=./lib \
    --exclude=./bench/out --exclude=./.git -cf - . | tar -C "$old" -xf -
for f in $files; do
    if [ -n "$olddir" ]; then
        if [ -f "$olddir/$f" ]; then cp "$olddir/$f" "$old/$f"; else rm -f "$old/$f"; fi
    elif git cat-file -e "$rev:$f" 2>/dev/null; then
        git show "$rev:$f" >"$old/$f"
    else
        rm -f "$old/$f" # the file is new since REV
    fi
done
if diff -rq "$root/kernels" "$old/kernels" >/dev/null; then
    echo "note: the named files are the same at $rev as here; old and new are one build" >&2
fi

build() { # DIR LOG
    make -C "$1" CUDA_ARCHS="$archs" -j"$jobs" build/bench/bench_kernels >"$2" 2>&1 ||
        { tail -30 "$2"; echo "build failed in $1 (see $2)" >&2; exit 1; }
}
echo "== build old ($rev: $files) and new ($(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes')), CUDA_ARCHS=$archs"
build "$old" "$out/build-old.log"
build "$root" "$out/build-new.log"
grep -h "spill" "$out"/build-*.log | grep -v " 0 bytes spill" | head -5

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv \
    >"$out/gpu.txt" 2>&1 && cat "$out/gpu.txt"
for i in $(seq 1 "$rounds"); do
    for which in old new; do
        dir=$root
        [ $which = old ] && dir=$old
        echo "== round $i $which: bench_kernels ${args[*]} ($(date -u +%H:%M:%S))"
        "$dir/build/bench/bench_kernels" --csv "$out/$which-$i.csv" "${args[@]}" >"$out/$which-$i.log" 2>&1 ||
            { tail -20 "$out/$which-$i.log"; echo "bench_kernels failed (see $out/$which-$i.log)" >&2; exit 1; }
    done
done

# Median TFLOP/s per (kernel, variant, dtype, math, shape) and build; new / old.
awk -F, '
function median(s,   n, a, i, j, t) {
    n = split(s, a, " ")
    for (i = 2; i <= n; i++) { t = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
FNR == 1 { which = (FILENAME ~ /\/old-[0-9]+\.csv$/) ? "old" : "new"; next }
$10 == "ok" {
    key = $1 ": " $3 (($4 != "" && $4 != "-") ? " [" $4 "]" : "") " " $5 " " $6 " " $7 "x" $8 "x" $9
    if (!(key in seen)) { seen[key] = 1; order[++nk] = key }
    v[key, which] = v[key, which] " " $12
}
END {
    printf "%-60s %10s %10s %8s\n", "kernel mode m x n x k", "old TF/s", "new TF/s", "new/old"
    for (i = 1; i <= nk; i++) {
        k = order[i]
        if (v[k, "old"] == "" || v[k, "new"] == "") continue
        o = median(v[k, "old"]); n = median(v[k, "new"])
        printf "%-60s %10.2f %10.2f %8.3f\n", k, o, n, (o > 0 ? n / o : 0)
    }
}' "$out"/old-*.csv "$out"/new-*.csv | tee "$out/summary.txt"
echo "(medians over $rounds rounds each; logs and CSVs in $out)"
