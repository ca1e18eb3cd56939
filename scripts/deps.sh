#!/usr/bin/env bash
# deps.sh build|test - make sure what gemmd needs is installed, by probing for it the way
# the build uses it (headers the compiler finds, libraries the linker finds, commands on
# PATH). Missing pieces are installed with apt-get when running as root, otherwise the
# exact command is printed and the script fails.
set -u
kind=${1:-build}
cc=${CC:-gcc}
[ "$cc" = cc ] && cc=gcc
missing=()

have_header() { printf '#include <stdarg.h>\n#include <stddef.h>\n#include <stdint.h>\n#include <setjmp.h>\n#include <%s>\nint main(void){return 0;}\n' "$1" | "$cc" -x c - -o /dev/null -fsyntax-only 2>/dev/null; }
have_lib() { printf 'int main(void){return 0;}\n' | "$cc" -x c - -o /dev/null "-l$1" 2>/dev/null; }
need_header() { have_header "$1" || missing+=("$2"); }
need_lib() { have_lib "$1" || missing+=("$2"); }
need_cmd() { command -v "$1" >/dev/null 2>&1 || missing+=("$2"); }

command -v "$cc" >/dev/null 2>&1 || missing+=(gcc)
need_cmd make make
need_cmd pkg-config pkg-config
if command -v "$cc" >/dev/null 2>&1; then
    need_header microhttpd.h libmicrohttpd-dev
    need_lib microhttpd libmicrohttpd-dev
    need_header cjson/cJSON.h libcjson-dev
    need_lib cjson libcjson-dev
    need_header curl/curl.h libcurl4-openssl-dev
    need_lib curl libcurl4-openssl-dev
    need_header cblas.h libopenblas-dev
    need_lib openblas libopenblas-dev
fi
if [ "$kind" = test ]; then
    if command -v "$cc" >/dev/null 2>&1; then
        need_header cmocka.h libcmocka-dev
        need_lib cmocka libcmocka-dev
    fi
    need_cmd curl curl
    # The end-to-end tests take their float64 reference from NumPy.
    py_ok=0
    for py in python3 /usr/bin/python3; do
        if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import numpy' 2>/dev/null; then py_ok=1; break; fi
    done
    [ $py_ok = 1 ] || missing+=(python3 python3-numpy)
fi

[ ${#missing[@]} -eq 0 ] && exit 0
# unique, in order
pkgs=$(printf '%s\n' "${missing[@]}" | awk '!seen[$0]++' | tr '\n' ' ')
echo "gemmd: missing Debian packages: $pkgs"
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "gemmd: installing them with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y --no-install-recommends $pkgs; then
        apt-get update -q && apt-get install -y --no-install-recommends $pkgs || {
            echo "gemmd: apt-get could not install: $pkgs" >&2; exit 1; }
    fi
    exit 0
fi
echo "gemmd: run this, then try again:" >&2
echo "    sudo apt-get install -y $pkgs" >&2
exit 1
