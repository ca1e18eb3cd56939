#!/usr/bin/env bash
# bench/container_steps.sh [ROOT] - the Dockerfile's steps, run on a GPU host without a
# container engine, to check each command of the image: the build stage's make and the
# config it writes, the runtime stage's files, a non-root user, CMD, a GEMMD_* override as
# `docker run -e` would pass it, and HEALTHCHECK (gemm health --live, run as the image's
# user). ROOT (default /tmp/gemmd-image) stands for the image's /. The apt-get lines are not
# run (they name Ubuntu 24.04 packages; the host has the Debian ones): the build stage's
# list is checked against scripts/deps.sh by tests/e2e/test_docs.py instead. Keep in step
# with the Dockerfile.
set -eu
cd "$(dirname "$0")/.."
root=${1:-/tmp/gemmd-image}
port=8080
step() { echo "== $*"; }
fail() { echo "FAILED: $*"; exit 1; }

step "build stage: make CUDA=1 CUDA_ARCHS=\"${CUDA_ARCHS:-80 90 90a}\" -j$(nproc) build"
make CUDA=1 CUDA_ARCHS="${CUDA_ARCHS:-80 90 90a}" -j"$(nproc)" build >/dev/null
rm -rf "$root" && mkdir -p "$root/src" "$root/usr/local/bin" "$root/etc/gemmd"
step "build stage: the container's config"
sed -e 's/^listen = .*/listen = 0.0.0.0/' config/gemmd.conf >"$root/src/gemmd-container.conf" &&
    grep -q '^listen = 0.0.0.0$' "$root/src/gemmd-container.conf" || fail "sed of the config"
step "runtime stage: COPY"
cp bin/gemmd bin/gemm "$root/usr/local/bin/"
cp "$root/src/gemmd-container.conf" "$root/etc/gemmd/gemmd.conf"
chmod -R a+rX "$root"
step "runtime stage: ldd (the shared libraries the image must provide)"
for prog in gemmd gemm; do
    echo "   $prog:"
    ldd "$root/usr/local/bin/$prog" | awk '{print "     ", $1}' | grep -v -e linux-vdso -e ld-linux
done

runas=()
if [ "$(id -u)" = 0 ]; then
    step "runtime stage: system user gemmd"
    id gemmd >/dev/null 2>&1 || { groupadd --system gemmd && useradd --system --gid gemmd \
        --home-dir /nonexistent --shell /usr/sbin/nologin gemmd; }
    runas=(setpriv --reuid=gemmd --regid=gemmd --clear-groups)
else
    echo "   (not root: runs as $(id -un))"
fi

start() { # env assignments..., then CMD
    env "$@" "${runas[@]}" "$root/usr/local/bin/gemmd" --config "$root/etc/gemmd/gemmd.conf" \
        >"$root/gemmd.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do
        curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && return 0
        kill -0 $pid 2>/dev/null || break
        sleep 0.1
    done
    cat "$root/gemmd.log"
    fail "gemmd did not become ready"
}
stop() { kill $pid; wait $pid || fail "gemmd exited $? on SIGTERM"; pid=; }
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null' EXIT

step "CMD [\"gemmd\", \"--config\", \"/etc/gemmd/gemmd.conf\"]"
start GEMMD_LOG_LEVEL=info
head -3 "$root/gemmd.log" | sed 's/^/    /'
user=$(ps -o user= -p $pid)
echo "   running as: $user"
step "HEALTHCHECK: gemm --timeout 4 --retries 0 health --live (as the image's user)"
env -u GEMM_SERVER "${runas[@]}" "$root/usr/local/bin/gemm" --timeout 4 --retries 0 health --live || fail "healthcheck"
step "docker exec ... gemm info"
env -u GEMM_SERVER "$root/usr/local/bin/gemm" info | head -4 | sed 's/^/    /' || fail "gemm info"
addr=$(hostname -I 2>/dev/null | awk '{print $1}')
if [ -n "$addr" ]; then
    step "listens beyond loopback: curl http://$addr:$port/healthz"
    curl -fsS "http://$addr:$port/healthz" || fail "not reachable on $addr"
    echo
fi
step "a product: 2x2 JSON"
curl -fsS "http://127.0.0.1:$port/v1/matmul" -H 'Content-Type: application/json' \
    -d '{"a":[[1,2],[3,4]],"b":[[5,6],[7,8]]}' | grep -o '"c":\[\[19,22\],\[43,50\]\].*"device":"[^"]*"' ||
    fail "product"
stop

step "docker run -e GEMMD_STREAMS_PER_DEVICE=8: the variable is honoured"
start GEMMD_STREAMS_PER_DEVICE=8
curl -fsS "http://127.0.0.1:$port/v1/info" | grep -o '"streams":[0-9]*' | head -1
curl -fsS "http://127.0.0.1:$port/v1/info" | grep -q '"streams":8' || fail "GEMMD_STREAMS_PER_DEVICE ignored"
stop
step "all steps passed"
