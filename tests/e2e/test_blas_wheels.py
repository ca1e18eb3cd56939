#!/usr/bin/env python3
"""test_blas_wheels.py - lib/libgemm_blas.so preloaded into NumPy and SciPy as pip installs
them from PyPI, against the real daemon (CPU backend) on loopback.

The wheels carry their own OpenBLAS, loaded privately with an extension module, under their
own names: NumPy 2.x scipy_cblas_[sd]gemm64_ (64-bit integers), NumPy 1.26 cblas_[sd]gemm64_,
SciPy scipy_[sd]gemm_ (32-bit). Two virtual environments are made under the build directory
with scripts/venv.sh, from wheels only, and kept (a second run only checks them): NumPy 2.x
with SciPy, and NumPy 1.26. One that cannot be made (PyPI unreachable, no wheel for this
Python) is one SKIP with the reason.

In each, under the preload:
  - NumPy's a @ b (C and Fortran order, transposed and strided views, float32 and float64)
    and scipy.linalg.blas.sgemm/dgemm reach the daemon under the wheel's names: its
    gemmd_requests_total for /v1/matmul moves by the products the log says it served, and
    every result matches a float64 reference computed here, without the preload;
  - GEMM_OFFLOAD_LOG=1 names the entry points at start and, at each name's first call, the
    wheel's OpenBLAS as its host;
  - default thresholds: a 32^2 product stays on the host, a 640^2 float64 one goes;
  - blas_calls makes random calls through each wheel flavour's four names with the wheel's
    OpenBLAS loaded RTLD_LOCAL (BLAS_CALLS_LIB) as the host: results, padding, quick
    returns, and argument errors reported by that OpenBLAS exactly as without the preload;
  - the server down: every result right, computed by the wheel's OpenBLAS;
and the preload examples of README.md and docs/BLAS.md run as written with NumPy 2.x.
"""

import glob
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import REPO, Daemon, Tap, free_port, metric, run_guarded  # noqa: E402
from blas_cases import (BUILD, PRELOAD, PROGS, child_env, flavours, log_lines, numpy_pairs,  # noqa: E402
                        numpy_wrong, offloadable, random_cases, run, run_calls, run_invalid, start_lines,
                        warnings)

VENV_SH = os.path.join(REPO, "scripts", "venv.sh")
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "blas_numpy_child.py")

# (label, directory, pip arguments, [(a flavour's first name, its library: a glob under
# site-packages, which of its names the products go through)])
VENVS = [
    ("NumPy 2.x and SciPy wheels", "numpy2", ["numpy>=2,<3", "scipy"],
     [("scipy_cblas_sgemm64_", "numpy.libs/libscipy_openblas64_*.so", "cblas"),  # NumPy's a @ b
      ("scipy_cblas_sgemm", "scipy.libs/libscipy_openblas-*.so", "fortran")]),  # scipy.linalg.blas
    ("NumPy 1.26 wheel", "numpy126", ["numpy==1.26.*"],
     [("cblas_sgemm64_", "numpy.libs/libopenblas64_*.so", "cblas")]),
]


def flavour(first):
    return next(row[:4] for row in flavours() if row[0] == first)


def host_path(line):
    """The library of a start line "NAME: host PATH, found as ...", resolved."""
    return os.path.realpath(line.rsplit(", found as ", 1)[0]) if line else ""


def served(d):
    r, m = d.metrics()
    return metric(m, "gemmd_requests_total", route="/v1/matmul", code="200") if m else -1


def make_venvs(tap):
    """[(label, python, [(four names, library, names the products use)])] of the environments made."""
    out = []
    for label, name, pkgs, libs in VENVS:
        path = os.path.join(BUILD, "blas-wheels", name)
        p = subprocess.run([VENV_SH, path, "--only-binary=:all:"] + pkgs, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=900)
        if p.returncode != 0:
            text = p.stdout.decode("utf-8", "replace").strip().splitlines()
            tap.skip(label, "could not install %s from PyPI into %s: %s" % (
                " ".join(pkgs), os.path.relpath(path, REPO), " / ".join(text[-3:])))
            continue
        site = (glob.glob(os.path.join(path, "lib", "python3*", "site-packages")) + [path])[0]
        found = [(flavour(first), glob.glob(os.path.join(site, pattern)), api) for first, pattern, api in libs]
        missing = [libs[i][1] for i, (_, paths, _) in enumerate(found) if len(paths) != 1]
        if tap.ok(not missing, "%s installed in %s, with their OpenBLAS" % (label, os.path.relpath(path, REPO)),
                  missing):
            out.append((label, os.path.join(path, "bin", "python"),
                        [(names, paths[0], names[:2] if api == "cblas" else names[2:]) for names, paths, api in found]))
    return out


def test_products(tap, d, rng, venv):
    label, py, libs = venv
    names = sorted(n for _, _, used in libs for n in used)
    data = numpy_pairs(rng)
    with tempfile.TemporaryDirectory(prefix="gemm-blas-") as tmp:
        src, dst = os.path.join(tmp, "in.npz"), os.path.join(tmp, "out.npz")
        np.savez(src, **data)
        before = served(d)
        rc, out, err = run([py, CHILD, src, dst], child_env(d.base, GEMM_OFFLOAD_MIN_FLOPS=0,
                                                              GEMM_OFFLOAD_MIN_INTENSITY=0))
        after = served(d)
        if not tap.ok(rc == 0, "%s: the products under the preload run" % label, err[-3000:]):
            return
        res = dict(np.load(dst))
    bad = numpy_wrong(data, res)
    scipy = "g0" in res
    tap.ok(not bad and scipy == (len(libs) > 1), "%s: a @ b in C and Fortran order, transposed and strided views, "
           "float32 and float64%s: every result right" % (label, ", scipy.linalg.blas.sgemm/dgemm" if scipy else ""),
           bad)
    logs = log_lines(err)
    tap.ok(logs and all(lg[7] == "server" for lg in logs) and sorted({lg[0] for lg in logs}) == names,
           "%s: %d products went to the server, through %s" % (label, len(logs), " ".join(names)), err[-3000:])
    tap.ok(after - before == len(logs), "%s: the daemon's gemmd_requests_total for /v1/matmul moved by %d"
           % (label, len(logs)), "before %r after %r" % (before, after))
    st = start_lines(err)
    table = [n for row in flavours() for n in row[:4]]
    wrong = ["%s: %s" % (n, st["hosts"].get(n)) for _, lib, used in libs for n in used
             if host_path(st["hosts"].get(n)) != os.path.realpath(lib) or
             not st["hosts"][n].endswith("found as a library loaded privately")]
    tap.ok(st["interposes"] == table and not wrong,
           "%s: GEMM_OFFLOAD_LOG=1 names the %d entry points at start and each name's host, the wheel's OpenBLAS"
           % (label, len(table)), wrong or err[:2000])
    tap.eq(warnings(err), [], "%s: no warning" % label)


def test_thresholds(tap, d, rng, venv):
    label, py, _ = venv
    small = rng.uniform(-1, 1, (32, 32))
    big_a, big_b = rng.uniform(-1, 1, (640, 640)), rng.uniform(-1, 1, (640, 640))
    with tempfile.TemporaryDirectory(prefix="gemm-blas-") as tmp:
        src, dst = os.path.join(tmp, "in.npz"), os.path.join(tmp, "out.npz")
        np.savez(src, a0=small, b0=small, a1=big_a, b1=big_b)
        prog = "import numpy as np, sys; d = np.load(sys.argv[1]); " \
               "np.savez(sys.argv[2], c0=d['a0'] @ d['b0'], c1=d['a1'] @ d['b1'])"
        rc, out, err = run([py, "-c", prog, src, dst], child_env(d.base))
        logs = log_lines(err)
        ok = rc == 0 and len(logs) == 2 and logs[0][7:] == ("host", "below threshold") and logs[1][7] == "server"
        if ok:
            res = np.load(dst)
            ok = np.allclose(res["c0"], small @ small, rtol=0, atol=1e-12) and \
                np.allclose(res["c1"], big_a @ big_b, rtol=0, atol=1e-9)
    tap.ok(ok, "%s: default thresholds: 32^2 float64 on the host, 640^2 on the server, both right" % label,
           "rc %d\n%s" % (rc, err[-2000:]))


def test_calls(tap, d, rng, venv):
    label, _, libs = venv
    for names, lib, _ in libs:
        extra = {"BLAS_CALLS_LIB": lib, "LD_LIBRARY_PATH": os.path.dirname(lib)}  # its libgfortran
        tag = "%s, %s" % (label, "/".join(names))
        cases = random_cases(rng, 40, dims=(1, 3, 17, 40), entries=names)
        env = child_env(d.base, GEMM_OFFLOAD_MIN_FLOPS=0, GEMM_OFFLOAD_MIN_INTENSITY=0, **extra)
        err = run_calls(tap, tag + ", offload all", cases, env, rng, lambda cs: "server" if offloadable(cs) else "here")
        tap.eq(warnings(err), [], tag + ", offload all: no warning")
        err = run_calls(tap, tag + ", on the host", cases, child_env(d.base, **extra), rng,
                        lambda cs: "host" if offloadable(cs) else "here")
        hosts = start_lines(err)["hosts"]
        tap.ok(sorted(hosts) == sorted(names) and all(host_path(h) == os.path.realpath(lib) for h in hosts.values()),
               tag + ": the host routines are the wheel's, loaded privately", hosts)
        run_invalid(tap, tag + ", invalid arguments", d.base, rng, names, **extra)


def test_server_down(tap, rng, venv):
    label, py, _ = venv
    data = numpy_pairs(rng, shapes=((70, 50, 60),))
    with tempfile.TemporaryDirectory(prefix="gemm-blas-") as tmp:
        src, dst = os.path.join(tmp, "in.npz"), os.path.join(tmp, "out.npz")
        np.savez(src, **data)
        env = child_env("http://127.0.0.1:%d" % free_port(), GEMM_OFFLOAD_MIN_FLOPS=0, GEMM_OFFLOAD_MIN_INTENSITY=0)
        rc, out, err = run([py, CHILD, src, dst], env)
        bad = numpy_wrong(data, dict(np.load(dst))) if rc == 0 else ["exit %d" % rc]
    whys = [lg[8] for lg in log_lines(err)]
    tap.ok(not bad and whys and whys[0] == "fallback: connect_failed" and
           all(w == "server failed recently" for w in whys[1:]),
           "%s, server down: %d products right, computed by the wheel's OpenBLAS" % (label, len(whys)),
           "%s\n%s" % (bad, err[-2000:]))
    w = warnings(err)
    tap.ok(len(w) == 1 and "connect_failed" in w[0], "%s, server down: one warning" % label, w)


def test_doc_examples(tap, d, venv):
    """The `LD_PRELOAD=... python3 -c '...'` lines of README.md and docs/BLAS.md, as written,
    with the environment's python3 first in PATH (as after `pip install numpy`)."""
    label, py, _ = venv
    for doc in ("README.md", "docs/BLAS.md"):
        with open(os.path.join(REPO, doc)) as f:
            text = f.read().replace("\\\n", " ")
        cmds = [ln.strip() for ln in text.splitlines() if "LD_PRELOAD=" in ln and "python3 -c" in ln]
        if not tap.ok(cmds, "%s has a NumPy preload example" % doc):
            continue
        env = child_env(d.base)
        del env["LD_PRELOAD"]  # the command preloads; child_env's sanitizer options stay
        env["PATH"] = os.path.dirname(py) + os.pathsep + env.get("PATH", "")
        cmd = cmds[0].replace("$PWD/lib/libgemm_blas.so", PRELOAD)
        p = subprocess.run(["bash", "-c", cmd], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=600)
        err = p.stderr.decode("utf-8", "replace")
        logs = log_lines(err)
        tap.ok(p.returncode == 0 and logs and all(lg[7] == "server" for lg in logs),
               "%s's example runs as written with %s, its products on the server" % (doc, label),
               "%s\n%s" % (cmd, err[-2000:]))


def main(tap):
    missing = [p for p in (PRELOAD, os.path.join(PROGS, "blas_calls")) if not os.path.exists(p)]
    if not tap.ok(not missing, "preload library and test programs are built", missing):
        return
    venvs = make_venvs(tap)
    if not venvs:
        return
    rng = np.random.default_rng(int(os.environ.get("GEMM_TEST_SEED", "20261127")))
    with Daemon(tap, config={"backend": "cpu"}) as d:
        for venv in venvs:
            test_products(tap, d, rng, venv)
            test_thresholds(tap, d, rng, venv)
            test_calls(tap, d, rng, venv)
        test_doc_examples(tap, d, venvs[0])
    for venv in venvs:
        test_server_down(tap, rng, venv)


if __name__ == "__main__":
    run_guarded(Tap(), main)
