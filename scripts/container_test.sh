#!/usr/bin/env bash
# container_test.sh - build the Dockerfile's image with podman, run it and check it the way
# an operator would (make container-test). No image registry is needed: the Debian base
# images are made here with mmdebstrap (the root file system is cached in
# $BUILD/container/debian-$SUITE.tar; delete it to refresh) and passed as build arguments.
#
# Default: the CPU image (--target cpu). Checks: it builds (--format docker, so HEALTHCHECK
# is kept); /healthz through a published port (the daemon serves beyond the container's
# loopback); a GEMMD_* variable is honoured; a product by curl (a known 2x2) and by the
# host's bin/gemm (against NumPy); `podman healthcheck run`; the daemon runs as a non-root
# user; a mounted config and tokens file (401 without the token, 200 with it, /healthz and
# the health check still open); `podman stop` under load (products in flight answered, the
# rest 503 shutting_down, none cut off, exit status 0); the image size.
#
# CONTAINER_CUDA=1: the GPU image. Its build stage runs on a Debian base plus NVIDIA's CUDA
# wheels from PyPI laid out as in the CUDA devel image (/usr/local/cuda: nvcc, cuBLAS,
# CUDA_ARCHS below), its runtime stage on a Debian base plus the CUDA runtime and cuBLAS
# libraries; with no GPU here the daemon serves from the CPU, and the same checks run
# against it. The build stage's size, time and the SASS it carries are reported.
#
# Where podman cannot run (not installed and not root, no user namespaces, ...) the test
# is skipped, saying why, and exits 0. Failures exit 1. Settings: BUILD, BIN (the host's
# gemm), CONTAINER_SUITE (trixie), CONTAINER_MIRROR, CUDA_ARCHS (CONTAINER_CUDA=1 only).
set -u
cd "$(dirname "$0")/.." || exit 1
BUILD=${BUILD:-build}
BIN=${BIN:-bin}
SUITE=${CONTAINER_SUITE:-trixie}
MIRROR=${CONTAINER_MIRROR:-http://deb.debian.org/debian}
CUDA_MODE=${CONTAINER_CUDA:-0}
CUDA_ARCHS=${CUDA_ARCHS:-80 90 90a}
# The wheels of the CUDA 13.0 Update 1 toolkit (the Dockerfile's CUDA_VERSION 13.0.1).
CUDA_WHEELS="nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-runtime==13.0.88
             nvidia-cuda-cccl==13.0.85 nvidia-cublas==13.0.2.14"
mkdir -p "$BUILD/container" && work=$(cd "$BUILD/container" && pwd) || exit 1
tag=localhost/gemmd-test
base=localhost/gemmd-base:$SUITE
start=$SECONDS
n=0 passed=0 failed=0 skipped=0
containers=()

# ---------------------------------------------------------------- reporting
ok() { # COND DESCRIPTION [DIAGNOSTIC...]: COND is a command's status (0 = pass)
    local cond=$1 desc=$2
    shift 2
    n=$((n + 1))
    if [ "$cond" = 0 ]; then
        passed=$((passed + 1))
        echo "ok $n - $desc"
    else
        failed=$((failed + 1))
        echo "not ok $n - $desc"
        local d
        for d in "$@"; do printf '%s\n' "$d" | tail -25 | sed 's/^/#   /'; done
    fi
}
note() { echo "# $*"; }
skip_all() {
    [ $failed = 0 ] || { note "then: $*"; finish; }
    echo "ok - container test # SKIP $*"
    echo "container-test: SKIPPED: $*"
    exit 0
}
finish() {
    echo "1..$n"
    echo "container-test: $passed passed, $failed failed, $skipped skipped in $((SECONDS - start)) s${summary:+; $summary}"
    [ $failed = 0 ]
    exit $?
}
cleanup() {
    local c
    for c in "${containers[@]}"; do podman rm -f -t 0 "$c" >/dev/null 2>&1; done
    [ -n "${loaders:-}" ] && kill $loaders 2>/dev/null
}
trap cleanup EXIT
mb() { podman image inspect --format '{{.Size}}' "$1" 2>/dev/null | awk '{printf "%.0f MB", $1 / 1e6}'; }

# ---------------------------------------------------------------- what it needs
# podman, runc, iptables, mmdebstrap, curl, NumPy: installed by apt-get as root, else the
# command is printed and the test skipped.
out=$(scripts/deps.sh container 2>&1) || skip_all "$(echo "$out" | grep -v '^gemmd: run this' | tail -2 | tr -s ' \n' ' ')"
PY=
for p in python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null && "$p" -c 'import numpy' 2>/dev/null; then PY=$p; break; fi
done
[ -x "$BIN/gemm" ] || { echo "container-test: $BIN/gemm is missing: run make first" >&2; exit 1; }

# podman's default rlimits may be above what this machine lets a container have (in a
# nested container, without CAP_SYS_RESOURCE): ask for modest ones, at most the current
# ones (the daemon needs a few hundred descriptors and a few dozen threads). runc where it
# is installed (crun needs cgroup v2).
limit() { local cur=$1 cap=$2; [ "$cur" = unlimited ] || [ "$cur" -gt "$cap" ] && cur=$cap; echo "$cur"; }
nofile=$(limit "$(ulimit -Sn)" 10000) nproc=$(limit "$(ulimit -Su)" 1000)
podman_flags=(--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")
command -v runc >/dev/null && run_flags=(--runtime runc) || run_flags=()
info=$(podman info --format '{{.Version.Version}} {{.Host.OCIRuntime.Name}} cgroups {{.Host.CgroupsVersion}}' \
    2>"$work/podman-info.log") || skip_all "podman cannot run here: $(tail -1 "$work/podman-info.log")"
# Without root, podman and mmdebstrap need subordinate ids to map a container's users.
if [ "$(id -u)" != 0 ] && ! grep -qs "^$(id -un):" /etc/subuid; then
    skip_all "not root, and no subordinate ids for $(id -un) in /etc/subuid (rootless podman needs them:" \
        "sudo usermod --add-subuids 100000-165535 --add-subgids 100000-165535 $(id -un)), or run as root"
fi
note "podman $info, $(id -un), Debian $SUITE base, $([ "$CUDA_MODE" = 1 ] && echo "GPU image (CUDA archs $CUDA_ARCHS)" || echo "CPU image")"

# ---------------------------------------------------------------- the Debian base
# A slim Debian as docker.io's debian:SUITE-slim is (no man pages, docs, locales); it
# stands for both debian:SUITE and debian:SUITE-slim.
rootfs=$work/debian-$SUITE.tar
t=$SECONDS
if [ ! -s "$rootfs" ]; then
    curl -sS -o /dev/null --max-time 20 "$MIRROR/dists/$SUITE/Release" ||
        skip_all "the Debian mirror $MIRROR is unreachable (set CONTAINER_MIRROR)"
    mode=auto
    [ "$(id -u)" = 0 ] || mode=unshare
    mmdebstrap --quiet --mode=$mode --variant=minbase --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/locale/*' "$SUITE" "$work/partial-$SUITE.tar" "$MIRROR" >"$work/mmdebstrap.log" 2>&1 &&
        mv "$work/partial-$SUITE.tar" "$rootfs"
    rc=$?
    [ $rc = 0 ] || [ "$(id -u)" = 0 ] || skip_all "mmdebstrap --mode=unshare (not root) could not make the base:" \
        "$(tail -1 "$work/mmdebstrap.log"); run as root"
    (exit $rc)
    ok $? "a Debian $SUITE root file system by mmdebstrap ($(($(stat -c %s "$rootfs" 2>/dev/null || echo 0) / 1000000)) MB, $((SECONDS - t)) s)" \
        "$(tail -20 "$work/mmdebstrap.log")"
    [ -s "$rootfs" ] || finish
fi
if ! podman image exists "$base" || [ "$rootfs" -nt "$work/base.stamp" ]; then
    out=$(podman import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["bash"]' "$rootfs" "$base" 2>&1) && touch "$work/base.stamp"
    ok $? "podman import: the base image $base" "$out"
fi
# Can this machine run a container at all? (user namespaces, cgroups, rlimits, seccomp)
out=$(podman run --rm "${run_flags[@]}" "${podman_flags[@]}" --network none "$base" true 2>&1) ||
    skip_all "podman cannot run a container here: $(echo "$out" | tail -1)"

# ---------------------------------------------------------------- the CUDA bases
cuda_bases() {
    local dir=$work/cuda venv=$work/venv
    mkdir -p "$dir/wheels"
    t=$SECONDS
    # shellcheck disable=SC2086
    out=$({ scripts/venv.sh "$venv" &&
        "$venv/bin/python" -m pip download -q --no-deps -d "$dir/wheels" $CUDA_WHEELS &&
        rm -rf "$dir/devel" && "$venv/bin/python" -m pip install -q --no-deps --no-index --target "$dir/devel" \
            "$dir"/wheels/*.whl; } 2>&1)
    ok $? "the CUDA 13.0 wheels from PyPI ($(du -sm "$dir/wheels" | cut -f1) MB: $(echo $CUDA_WHEELS))" "$out"
    # NVIDIA's images: the toolkit in /usr/local/cuda-13.0 (bin, include, lib64 with the
    # unversioned .so links), /usr/local/cuda pointing at it, its bin on PATH; the runtime
    # image has the libraries only.
    local cu=$dir/devel/nvidia/cu13
    [ -x "$cu/bin/nvcc" ] || finish
    ln -sfn lib "$cu/lib64"
    (cd "$cu/lib" && for f in *.so.*; do ln -sf "$f" "${f%%.so.*}.so"; done)
    rm -rf "$dir/runtime" && mkdir -p "$dir/runtime/lib64" &&
        cp -a "$cu"/lib/libcudart.so* "$cu"/lib/libcublas.so* "$cu"/lib/libcublasLt.so* "$dir/runtime/lib64/"
    cat >"$dir/devel/Containerfile" <<EOF
FROM $base
COPY nvidia/cu13 /usr/local/cuda-13.0
RUN ln -s cuda-13.0 /usr/local/cuda
ENV PATH=/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
EOF
    cat >"$dir/runtime/Containerfile" <<EOF
FROM $base
COPY lib64 /usr/local/cuda-13.0/lib64
RUN ln -s cuda-13.0 /usr/local/cuda && echo /usr/local/cuda/lib64 > /etc/ld.so.conf.d/cuda.conf && ldconfig
EOF
    local kind
    for kind in devel runtime; do
        t=$SECONDS
        out=$(podman build "${run_flags[@]}" "${podman_flags[@]}" --pull=never --network none -t "$tag-cuda:$kind" \
            "$dir/$kind" 2>&1)
        ok $? "the CUDA $kind base $tag-cuda:$kind ($(mb "$tag-cuda:$kind"), $((SECONDS - t)) s)" "$out"
    done
}

# ---------------------------------------------------------------- the image
build() { # TARGET IMAGE BUILD-ARGS...
    local target=$1 image=$2
    shift 2
    t=$SECONDS
    podman build "${run_flags[@]}" "${podman_flags[@]}" --pull=never --network host --format docker \
        --target "$target" -t "$image" "$@" . >"$work/build-$target.log" 2>&1
    ok $? "podman build --target $target -t $image ($((SECONDS - t)) s)" "$(tail -30 "$work/build-$target.log")"
}

if [ "$CUDA_MODE" = 1 ]; then
    cuda_bases
    build gpu-build "$tag:gpu-build" --build-arg CUDA_BUILD_BASE="$tag-cuda:devel" --build-arg CUDA_ARCHS="$CUDA_ARCHS" ||
        finish
    # The SASS and PTX in the daemon the build stage made.
    cid=$(podman create "$tag:gpu-build" true) && containers+=("$cid")
    podman cp "$cid:/src/bin/gemmd" "$work/gemmd-gpu" >/dev/null 2>&1
    # cuobjdump: the host's, else PyPI's (its first CUDA 13 wheel is 13.2; it reads 13.0 output).
    cuobjdump=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
    if [ ! -x "$cuobjdump" ]; then
        cuobjdump=$work/cuda/tools/nvidia/cu13/bin/cuobjdump
        [ -x "$cuobjdump" ] || "$work/venv/bin/python" -m pip install -q --no-deps --target "$work/cuda/tools" \
            nvidia-cuda-cuobjdump==13.2.78 >"$work/cuobjdump.log" 2>&1
    fi
    if [ -x "$cuobjdump" ]; then
        elf=$("$cuobjdump" --list-elf "$work/gemmd-gpu" 2>&1 | grep -o 'sm_[0-9]*a\?' | sort -u | tr '\n' ' ')
        ptx=$("$cuobjdump" --list-ptx "$work/gemmd-gpu" 2>&1 | grep -o 'sm_[0-9]*a\?' | sort -u | tr '\n' ' ')
        want=$(for a in $CUDA_ARCHS; do echo "sm_$a"; done | sort -u | tr '\n' ' ')
        # PTX of the highest plain arch, as the Makefile embeds it (newer GPUs JIT it)
        plain=$(for a in $CUDA_ARCHS; do case $a in *a) ;; *) echo "$a" ;; esac; done | tail -1)
        [ "$elf" = "$want" ] && [ "$ptx" = "sm_$plain " ]
        ok $? "the build stage's gemmd carries SASS for ${want% } and PTX for sm_$plain" "elf: $elf" "ptx: $ptx"
    else
        skipped=$((skipped + 1))
        echo "ok - SASS in the build stage's gemmd # SKIP no cuobjdump ($(tail -1 "$work/cuobjdump.log"))"
    fi
    out=$(podman run --rm "${run_flags[@]}" "${podman_flags[@]}" --network none "$tag:gpu-build" ldd /src/bin/gemmd 2>&1)
    echo "$out" | grep -q 'libcublas.so.13 => /usr/local/cuda' && ! echo "$out" | grep -q 'not found'
    ok $? "the build stage's gemmd links cuBLAS and the CUDA runtime of /usr/local/cuda" "$out"
    summary="build stage $tag:gpu-build $(mb "$tag:gpu-build")"
    build gpu "$tag:gpu" --build-arg CUDA_BUILD_BASE="$tag-cuda:devel" --build-arg CUDA_ARCHS="$CUDA_ARCHS" \
        --build-arg CUDA_RUNTIME_BASE="$tag-cuda:runtime" || finish
    image=$tag:gpu
else
    build cpu "$tag:cpu" --build-arg CPU_BUILD_BASE="$base" --build-arg CPU_RUNTIME_BASE="$base" || finish
    image=$tag:cpu
fi
size=$(mb "$image")
summary="image $image $size${summary:+, $summary}"
hc=$(podman image inspect --format '{{json .Config.Healthcheck}}' "$image" 2>&1)
echo "$hc" | grep -q '"gemm"'
ok $? "the image keeps its HEALTHCHECK (gemm health --live) and is $size" "$hc"

# ---------------------------------------------------------------- running it
run() { # NAME PODMAN-RUN-ARGS...: starts a container, sets $cid and $url
    local name=$1
    shift
    cid=$(podman run -d "${run_flags[@]}" "${podman_flags[@]}" --name "$name-$$" -p 127.0.0.1::8080 "$@" "$image" 2>&1)
    local rc=$?
    containers+=("$name-$$")
    [ $rc = 0 ] || { ok 1 "podman run $name" "$cid"; finish; }
    url=http://$(podman port "$name-$$" 8080/tcp | head -1)
    local i
    for i in $(seq 600); do
        curl -fsS --max-time 2 "$url/healthz" >/dev/null 2>&1 && return 0
        [ "$(podman inspect --format '{{.State.Running}}' "$name-$$" 2>/dev/null)" = true ] || break
        sleep 0.1
    done
    return 1
}
logs() { podman logs "$1-$$" 2>&1; }

t=$SECONDS
run plain -e GEMMD_QUEUE_DEPTH=48
body=$(curl -sS --max-time 5 "$url/healthz" 2>&1)
[ "$body" = '{"status":"ok"}' ]
ok $? "the container serves /healthz on its published port $url ($((SECONDS - t)) s to start)" "$body" "$(logs plain)"
logs plain | grep -q 'listening url=http://0.0.0.0:8080 .*queue=48'
ok $? "it listens on 0.0.0.0:8080 and takes GEMMD_QUEUE_DEPTH=48 from podman run -e" "$(logs plain | head -5)"
body=$(curl -sS --max-time 30 "$url/v1/matmul" -H 'Content-Type: application/json' \
    -d '{"a":[[1,2],[3,4]],"b":[[5,6],[7,8]]}' 2>&1)
echo "$body" | grep -q '^{"c":\[\[19,22\],\[43,50\]\]'
ok $? "curl: [[1,2],[3,4]]·[[5,6],[7,8]] = [[19,22],[43,50]] ($(echo "$body" | grep -o '"device":"[^"]*"'))" "$body"

# The host's client against the container, checked against NumPy (integer-valued float64:
# every sum is exact, so the answer must be equal, not close).
"$PY" - "$work" <<'EOF'
import sys
import numpy as np
r = np.random.default_rng(7)
np.save(sys.argv[1] + "/A.npy", r.integers(-9, 10, (97, 61)).astype(np.float64))
np.save(sys.argv[1] + "/B.npy", r.integers(-9, 10, (61, 83)).astype(np.float64))
n = 1536  # the load of the stop test: about a second a product on one core
np.save(sys.argv[1] + "/LA.npy", r.integers(0, 10, (n, n)).astype(np.float64))
np.save(sys.argv[1] + "/LB.npy", r.integers(0, 10, (n, n)).astype(np.float64))
EOF
same() { "$PY" -c 'import sys, numpy as np; d = sys.argv[1]
c = np.load(sys.argv[2]); ref = np.load(d + "/" + sys.argv[3] + "A.npy") @ np.load(d + "/" + sys.argv[3] + "B.npy")
sys.exit(0 if c.shape == ref.shape and np.array_equal(c, ref) else 1)' "$work" "$@" 2>&1; }
rm -f "$work/C.npy"
out=$("$BIN/gemm" -s "$url" multiply "$work/A.npy" "$work/B.npy" -o "$work/C.npy" 2>&1) && out+=$(same "$work/C.npy" "")
ok $? "the host's $BIN/gemm multiply (97x61 · 61x83 .npy): C equals NumPy's A @ B" "$out"
out=$(podman healthcheck run "plain-$$" 2>&1)
ok $? "podman healthcheck run: healthy (the image's HEALTHCHECK, gemm health --live)" "$out"
user=$(podman top "plain-$$" user huser args 2>&1)
echo "$user" | awk '/gemmd --config/ {found = 1; if ($1 == "root" || $2 == "0") bad = 1} END {exit !(found && !bad)}'
ok $? "the daemon runs as a non-root user ($(echo "$user" | awk '/gemmd --config/ {print $1, "uid", $2}'))" "$user"

# A mounted config (the shipped one with bearer tokens and one BLAS thread) and tokens file
# (readable by the image's uid 65532 only, as one would keep it), and the stop under load.
token=tok-$RANDOM$RANDOM
printf '# the container test\n%s\n' "$token" >"$work/tokens"
chmod 600 "$work/tokens" && { [ "$(id -u)" != 0 ] || { chown 65532:65532 "$work/tokens" && chmod 400 "$work/tokens"; }; } ||
    chmod 644 "$work/tokens"
sed -e 's|^tokens_file = .*|tokens_file = /etc/gemmd/tokens|' -e 's|^threads = .*|threads = 1|' \
    config/gemmd.conf >"$work/gemmd.conf"
t=$SECONDS
run auth --stop-timeout 630 -v "$work/gemmd.conf:/etc/gemmd/gemmd.conf:ro" \
    -v "$work/tokens:/etc/gemmd/tokens:ro"
ok $? "a container with a mounted config and tokens file starts ($((SECONDS - t)) s)" "$(logs auth)"
code=$(curl -sS -o "$work/401.json" -w '%{http_code}' "$url/v1/matmul" -H 'Content-Type: application/json' \
    -d '{"a":[[1]],"b":[[2]]}' 2>&1)
[ "$code" = 401 ] && grep -q '"error"' "$work/401.json"
ok $? "without the token: 401 and a JSON error" "$code $(cat "$work/401.json" 2>/dev/null)"
code=$(curl -sS -o "$work/200.json" -w '%{http_code}' "$url/v1/matmul" -H "Authorization: Bearer $token" \
    -H 'Content-Type: application/json' -d '{"a":[[1,2]],"b":[[3],[4]]}' 2>&1)
[ "$code" = 200 ] && grep -q '^{"c":\[\[11\]\]' "$work/200.json"
ok $? "with the token: 200 and [[1,2]]·[[3],[4]] = [[11]]" "$code $(cat "$work/200.json" 2>/dev/null)"
out=$(podman healthcheck run "auth-$$" 2>&1)
ok $? "the health check needs no token (/healthz stays open): healthy" "$out"

# podman stop under load: three products at once on one worker (one runs, two wait), the
# stop once one is running. The running one is answered, the waiting ones get 503
# shutting_down, no connection is cut, and the daemon exits 0 within --stop-timeout.
loaders=
for i in 1 2 3; do
    (code=$(curl -sS --max-time 600 -o "$work/load$i.out" -w '%{http_code}' -H "Authorization: Bearer $token" \
        -F "a=@$work/LA.npy" -F "b=@$work/LB.npy" "$url/v1/matmul" 2>"$work/load$i.err"); echo "$? $code $(date +%s.%N)" \
        >"$work/load$i.status") &
    loaders+=" $!"
done
running=0
for _ in $(seq 600); do
    curl -sS --max-time 2 -H "Authorization: Bearer $token" "$url/metrics" 2>/dev/null |
        grep -q '^gemmd_jobs_running [1-9]' && { running=1; break; }
    sleep 0.1
done
stop_at=$(date +%s.%N)
t=$SECONDS
out=$(podman stop "auth-$$" 2>&1)
stop_rc=$?
wait $loaders
loaders=
exit_code=$(podman inspect --format '{{.State.ExitCode}}' "auth-$$" 2>&1)
[ $running = 1 ] && [ $stop_rc = 0 ] && [ "$exit_code" = 0 ]
ok $? "podman stop with a product running: the container exits 0 ($((SECONDS - t)) s)" \
    "running seen: $running, podman stop: $stop_rc $out, exit code: $exit_code" "$(logs auth | tail -8)"
answered=0 after=0 bad=()
for i in 1 2 3; do
    read -r rc code end <"$work/load$i.status"
    if [ "$rc" = 0 ] && [ "$code" = 200 ] && same "$work/load$i.out" L >/dev/null; then
        answered=$((answered + 1))
        awk -v a="$end" -v b="$stop_at" 'BEGIN {exit !(a > b)}' && after=$((after + 1))
    elif [ "$rc" = 0 ] && [ "$code" = 503 ] && grep -q '"code":"shutting_down"' "$work/load$i.out"; then
        :
    else
        bad+=("request $i: curl $rc, HTTP $code: $(head -c 300 "$work/load$i.out" 2>/dev/null) $(cat "$work/load$i.err")")
    fi
done
[ ${#bad[@]} = 0 ] && [ $after -ge 1 ]
ok $? "under load: every request answered ($answered right products, $after of them after the stop; the rest 503 shutting_down)" \
    "${bad[@]}"
finish
