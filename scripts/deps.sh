#!/usr/bin/env bash
# deps.sh [--check|--list] KIND... - make sure what gemmd needs is installed, by probing for
# it the way the build uses it (headers the compiler finds, libraries the linker finds,
# commands on PATH). KIND: build (the daemon, client and library), cuda (what nvcc needs
# beside the CUDA toolkit: a host C++ compiler), test (make test: build + cmocka, curl,
# NumPy), lint (cppcheck), fuzz (clang with libFuzzer), container (make container-test:
# podman with runc and iptables, mmdebstrap, curl, NumPy). Missing Debian packages are
# installed with apt-get when running as root, otherwise the exact command is printed and
# the script fails. --check never installs: it prints the command and fails (what plain
# `make` does). --list prints every package the kinds need, installed or not.
# Optional packages (test: nginx, for tests/e2e/test_nginx.py) are installed with the
# others as root; otherwise the command is printed and the script still succeeds: the
# tests that need them SKIP, naming the same command.
set -u
check=0 list=0
case "${1:-}" in
--check) check=1; shift ;;
--list) list=1; shift ;;
esac
kinds=" ${*:-build} "
want() { case "$kinds" in *" $1 "*) return 0 ;; esac; return 1; }
kinds_list=" ${*:-build}"
want test && kinds="$kinds build "
cc=${CC:-gcc}
[ "$cc" = cc ] && cc=gcc
missing=()
optional=()

have_header() { printf '#include <stdarg.h>\n#include <stddef.h>\n#include <stdint.h>\n#include <setjmp.h>\n#include <%s>\nint main(void){return 0;}\n' "$1" | "$cc" -x c - -o /dev/null -fsyntax-only 2>/dev/null; }
have_lib() { printf 'int main(void){return 0;}\n' | "$cc" -x c - -o /dev/null "-l$1" 2>/dev/null; }
have_cmd() { command -v "$1" >/dev/null 2>&1; }
if [ $list = 1 ]; then # every probe fails, so each package is named once
    have_header() { return 1; }
    have_lib() { return 1; }
    have_cmd() { return 1; }
fi
have_cc() { [ $list = 1 ] || command -v "$cc" >/dev/null 2>&1; } # can headers be probed?
need_header() { have_header "$1" || missing+=("$2"); }
need_lib() { have_lib "$1" || missing+=("$2"); }
need_cmd() { have_cmd "$1" || missing+=("$2"); }
have_numpy() {
    local py
    for py in python3 /usr/bin/python3; do
        if have_cmd "$py" && "$py" -c 'import numpy' 2>/dev/null; then return 0; fi
    done
    return 1
}

if want build; then
    need_cmd "$cc" gcc
    need_cmd make make
    need_cmd pkg-config pkg-config
fi
if want build && have_cc; then
    need_header microhttpd.h libmicrohttpd-dev
    need_lib microhttpd libmicrohttpd-dev
    need_header cjson/cJSON.h libcjson-dev
    need_lib cjson libcjson-dev
    need_header curl/curl.h libcurl4-openssl-dev
    need_lib curl libcurl4-openssl-dev
    need_header cblas.h libopenblas-dev
    need_lib openblas libopenblas-dev
fi
if want cuda; then
    need_cmd g++ g++ # nvcc compiles the host side of .cu files with it
fi
if want test; then
    if have_cc; then
        need_header cmocka.h libcmocka-dev
        need_lib cmocka libcmocka-dev
        # the BLAS preload tests' programs link -lblas (OpenBLAS's dev package provides it)
        need_lib blas libopenblas-dev
    fi
    need_cmd curl curl
    # The HTTPS tests make a self-signed certificate with it.
    need_cmd openssl openssl
    # The BLAS preload tests run a Fortran program calling DGEMM / SGEMM.
    # Optional: gfortran for the BLAS preload's Fortran test (skipped without it).
    if [ $list = 1 ] || ! have_cmd gfortran; then optional+=(gfortran); fi
    # The end-to-end tests take their float64 reference from NumPy.
    have_numpy || missing+=(python3 python3-numpy)
    # Optional: several daemons behind Debian's nginx (config/nginx/, test_nginx.py).
    if [ $list = 1 ] || ! { have_cmd nginx || [ -x /usr/sbin/nginx ]; }; then optional+=(nginx); fi
fi
if want container; then
    need_cmd podman podman
    # runc: crun, podman's other runtime, fails where cgroups are v1. iptables: published ports.
    need_cmd runc runc
    if [ $list = 1 ] || ! { have_cmd iptables || [ -x /usr/sbin/iptables ]; }; then missing+=(iptables); fi
    need_cmd mmdebstrap mmdebstrap
    need_cmd curl curl
    have_numpy || missing+=(python3 python3-numpy)
fi
if want lint; then
    need_cmd cppcheck cppcheck
fi
if want fuzz; then
    # libFuzzer ships with Debian's clang (libclang-rt / compiler-rt): probe a fuzzer link.
    fuzz_cc=${FUZZ_CC:-clang}
    if [ $list = 1 ] || ! printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' |
        "$fuzz_cc" -x c - -fsanitize=fuzzer,address,undefined -o /dev/null >/dev/null 2>&1; then
        missing+=(clang)
    fi
fi

[ ${#missing[@]} -eq 0 ] && [ ${#optional[@]} -eq 0 ] && exit 0
# unique, in order
pkgs=$(printf '%s\n' "${missing[@]}" | awk 'NF && !seen[$0]++' | tr '\n' ' ')
opt=$(printf '%s\n' "${optional[@]}" | awk 'NF && !seen[$0]++' | tr '\n' ' ')
if [ $list = 1 ]; then echo "$pkgs$opt"; exit 0; fi
can_install=0
[ $check = 0 ] && [ "$(id -u)" = 0 ] && have_cmd apt-get && can_install=1
if [ -n "$opt" ] && [ $can_install = 0 ]; then
    echo "gemmd: optional Debian packages missing (the tests that need them are skipped): $opt" >&2
    echo "    sudo apt-get install -y $opt" >&2
    opt=""
fi
[ -z "$pkgs" ] && [ -z "$opt" ] && exit 0
[ -n "$pkgs" ] && echo "gemmd: missing Debian packages: $pkgs" >&2
if [ $can_install = 1 ]; then
    echo "gemmd: installing them with apt-get: $pkgs$opt"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y --no-install-recommends $pkgs $opt; then
        apt-get update -q && apt-get install -y --no-install-recommends $pkgs $opt || {
            # The optional ones may fail alone; the required ones may not.
            if [ -n "$pkgs" ]; then echo "gemmd: apt-get could not install: $pkgs$opt" >&2; exit 1; fi
            echo "gemmd: apt-get could not install the optional $opt(their tests are skipped)" >&2; }
    fi
    exit 0
fi
echo "gemmd: run this (as root, scripts/deps.sh$kinds_list does it), then try again:" >&2
echo "    sudo apt-get install -y $pkgs" >&2
exit 1
