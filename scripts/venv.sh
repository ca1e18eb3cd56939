#!/usr/bin/env bash
# venv.sh DIR PKG... - make DIR a Python virtual environment if it is not one yet, then
# `pip install -q PKG...` into it. PKG may be anything pip takes, pip options included
# (`-e client/python`, `--no-build-isolation ./client/python`, `pytest`).
#
# The environment is made from /usr/bin/python3 (VENV_PYTHON overrides) with
# --system-site-packages, so Debian's NumPy is used rather than downloaded. When that
# Python cannot make one (no venv module or no ensurepip), python3-venv is installed with
# apt-get when running as root; otherwise the exact command is printed. Exits non-zero,
# saying why, when the environment cannot be made or a package cannot be installed.
set -u
PY=${VENV_PYTHON:-/usr/bin/python3}
die() { echo "venv.sh: $*" >&2; exit 1; }
[ $# -ge 1 ] && [ -n "$1" ] || { echo "usage: scripts/venv.sh DIR [PKG|pip-option]..." >&2; exit 2; }
dir=$1; shift
[ -x "$PY" ] || die "$PY not found; run: sudo apt-get install -y python3 python3-venv"

# Two test programs may ask for the same environment at once: one makes it at a time.
mkdir -p "$(dirname "$dir")" || die "cannot create $(dirname "$dir")"
if command -v flock >/dev/null 2>&1; then
    exec 9>"$dir.lock" && flock -w 600 9 || die "could not lock $dir.lock"
fi

if [ ! -x "$dir/bin/python" ] || ! "$dir/bin/python" -m pip --version >/dev/null 2>&1; then
    if ! "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            echo "venv.sh: installing python3-venv with apt-get" >&2
            export DEBIAN_FRONTEND=noninteractive
            apt-get install -y --no-install-recommends python3-venv >&2 ||
                { apt-get update -q >&2 && apt-get install -y --no-install-recommends python3-venv >&2; } ||
                die "apt-get could not install python3-venv"
        else
            die "$PY cannot make a virtual environment (no venv module or ensurepip); run: sudo apt-get install -y python3-venv"
        fi
    fi
    "$PY" -m venv --system-site-packages "$dir" >&2 || die "could not create the virtual environment $dir with $PY"
fi

[ $# -eq 0 ] && exit 0
PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 "$dir/bin/python" -m pip install -q "$@" ||
    die "pip could not install into $dir: $*"
