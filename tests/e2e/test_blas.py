#!/usr/bin/env python3
"""test_blas.py - lib/libgemm_blas.so preloaded into unmodified BLAS programs, against the
real daemon (CPU backend) on loopback.

Programs (built by `make check-tests` from tests/blas/, linked with -lblas only; the
cases, their reference and the helpers are in blas_cases.py):
  blas_calls    makes the calls a case file describes (cblas_sgemm, cblas_dgemm, sgemm_,
                dgemm_; both orders, N/T/C, padded leading dimensions, alpha, beta)
  blas_threads  cblas_dgemm / cblas_sgemm from 16 threads at once, checked in the program
  blas_fortran  gfortran's DGEMM / SGEMM, checked in the program
and Debian's NumPy (blas_numpy_child.py) for `a @ b`.

Every result is compared with a float64 NumPy reference computed here, outside the preload;
the padding of C must come back untouched and beta = 0 must ignore the NaN/Inf put in C.
GEMM_OFFLOAD_LOG=1 says where each call ran: the test checks it went where it should
(server, host below the threshold, host after a failure) and that each failure reason is
warned about once. Fallback: server down, 500/503 (fault injection, a full queue), 413,
401, timeout; host BLAS variants: netlib's (whose CBLAS calls back into dgemm_), none at
all (built-in loops), this library itself.

Sanitizer run (make test-san): the test programs are instrumented, so ASan's runtime comes
first in them and the preloaded build-san library is checked fully; ASan refuses a
preload that is not first in the initial library list, hence verify_asan_link_order=0.
Python is not instrumented: preloading libasan into it deadlocks in libp11-kit's
constructor (a dependency of libcurl), so the NumPy runs load the build-san library with
libasan as its dependency: UBSan and ASan's stack/global checks work there, heap checks do
not (the interpreter's malloc is glibc's). The C programs cover the same code paths with
heap checks.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Daemon, Tap, free_port, metric, run_guarded  # noqa: E402
from blas_cases import (LOG_RE, LP64, NETLIB, PRELOAD, PROGS, SAN, Case, child_env, flavours, log_lines,  # noqa: E402
                        map_names, numpy_pairs, numpy_wrong, offloadable, random_cases, run, run_calls,
                        run_invalid, sanitizer, start_lines, warnings, write_cases)


# ---------------------------------------------------------------------------- tests

def test_offload(tap, d, rng):
    cases = random_cases(rng, 120)
    env = child_env(d.base, GEMM_OFFLOAD_MIN_FLOPS=0, GEMM_OFFLOAD_MIN_INTENSITY=0)
    err = run_calls(tap, "offload all", cases, env, rng, lambda cs: "server" if offloadable(cs) else "here")
    tap.eq(warnings(err), [], "offload all: no warning")
    st = start_lines(err)
    names = [n for row in flavours() for n in row[:4]]
    libs = {os.path.realpath(x.split(" (")[0]): x.split(" (interposed: ")[-1].rstrip(")").split() for x in st["libs"]}
    hosts = {os.path.realpath(h.rsplit(", found as ", 1)[0]) for h in st["hosts"].values()}
    tap.ok(st["interposes"] == names and len(hosts) == 1 and sorted(libs.get(min(hosts), [])) == sorted(LP64) and
           all(sorted(v) == sorted(LP64) for v in libs.values()),
           "GEMM_OFFLOAD_LOG=1: the start names the %d entry points and the program's BLAS (%s)"
           % (len(names), " ".join(hosts)), err[:1500])
    tap.ok(sorted(st["hosts"]) == sorted(LP64) and all(h.endswith("found as RTLD_NEXT") for h in st["hosts"].values()),
           "GEMM_OFFLOAD_LOG=1: each name's host routine, the program's own BLAS (RTLD_NEXT), is named at its "
           "first call", st["hosts"])
    quick = [lg for lg in log_lines(err) if lg[7] != "server"]
    tap.ok(len(quick) == 24 and all(lg[8].startswith("nothing to multiply") for lg in quick),
           "quick returns and alpha = 0 (NULL A and B) answered by the library itself", quick[:5])

    env = child_env(d.base)
    err = run_calls(tap, "default threshold", cases, env, rng, lambda cs: "host" if offloadable(cs) else "here")
    tap.ok(all(lg[8] == "below threshold" or lg[8].startswith("nothing") for lg in log_lines(err)),
           "default threshold: small products stay on the host as below the threshold",
           [lg for lg in log_lines(err)][:5])

    # operands big enough to be packed and answered on several threads (pack.c)
    big = [Case("cblas_dgemm", "R", "T", "N", 1100, 1030, 1050, (3, 0, 5), 1.5, -0.5),
           Case("cblas_sgemm", "C", "T", "T", 1030, 1100, 1050, (0, 0, 0), 2.0, 0.0),
           Case("dgemm_", "C", "N", "T", 1100, 1030, 1050, (1, 1, 1), 1.0, 1.0),
           Case("cblas_sgemm", "R", "N", "N", 1500, 1400, 700, (0, 9, 2), -1.0, 0.0)]
    env = child_env(d.base, GEMM_OFFLOAD_MIN_FLOPS=0, GEMM_OFFLOAD_MIN_INTENSITY=0)
    run_calls(tap, "large packed layouts", big, env, rng, lambda cs: "server")

    # a threshold in between: the flop count decides
    thr = 2.0 * 64 * 64 * 64
    env = child_env(d.base, GEMM_OFFLOAD_MIN_FLOPS=thr, GEMM_OFFLOAD_MIN_INTENSITY=0)
    run_calls(tap, "GEMM_OFFLOAD_MIN_FLOPS=%g" % thr, cases, env, rng,
              lambda cs: ("server" if 2.0 * cs.m * cs.n * cs.k >= thr else "host") if offloadable(cs) else "here")
    # the intensity floor: flops per byte on the wire
    inten = 10.0
    env = child_env(d.base, GEMM_OFFLOAD_MIN_FLOPS=0, GEMM_OFFLOAD_MIN_INTENSITY=inten)

    def by_intensity(cs):
        size = 4 if cs.f32 else 8
        nbytes = size * (cs.m * cs.k + cs.k * cs.n + cs.m * cs.n)
        if not offloadable(cs):
            return "here"
        return "server" if 2.0 * cs.m * cs.n * cs.k >= inten * nbytes else "host"
    run_calls(tap, "GEMM_OFFLOAD_MIN_INTENSITY=%g" % inten, cases, env, rng, by_intensity)


PRED_RE = re.compile(r"; predicted host (\S+)(?: ms)?, server (\S+)(?: ms)?$")


def test_learn(tap, d, rng):
    """GEMM_OFFLOAD_LEARN=1 (the default): above the floors a product runs where the costs
    learned from earlier products predict it finishes first. The first one per dtype goes to
    the server, the host is measured next (unless even a host at its best would lose), and
    from then on each line's side is the smaller of its two predictions, apart from a
    re-measure of a close loser now and then. Every C is right and the server's counter
    moves once per product the log sends there."""
    cases = [Case("cblas_sgemm", "R", "N", "N", 160, 150, 170, (0, 0, 0), 1.0, 0.0) for _ in range(40)] + \
            [Case("dgemm_", "C", "N", "T", 130, 140, 120, (1, 0, 2), 1.0, 0.5) for _ in range(20)]
    before = metric(d.metrics()[1], "gemmd_requests_total", route="/v1/matmul", code="200")
    env = child_env(d.base, GEMM_OFFLOAD_MIN_FLOPS=0, GEMM_OFFLOAD_MIN_INTENSITY=0, GEMM_OFFLOAD_LEARN=1)
    err = run_calls(tap, "learned side", cases, env, rng, lambda cs: None)
    after = metric(d.metrics()[1], "gemmd_requests_total", route="/v1/matmul", code="200")
    lines = [ln for ln in err.splitlines() if LOG_RE.match(ln)]
    logs = log_lines(err)
    if not tap.eq(len(logs), len(cases), "learned side: one log line per call"):
        return
    bad, seen = [], {}
    for i, (ln, lg) in enumerate(zip(lines, logs)):
        why = lg[8]
        mt = PRED_RE.search(why)
        host = float(mt.group(1)) if mt and mt.group(1) != "?" else None
        server = float(mt.group(2)) if mt and mt.group(2) != "?" else None
        nth = seen[lg[0]] = seen.get(lg[0], 0) + 1
        if nth == 1:
            ok = lg[7] == "server" and "server's speed is not known yet" in why
        elif host is None:
            ok = (lg[7], "host's speed is not known yet" in why or "slower even at its best" in why) in \
                (("host", True), ("server", True))
        elif "re-measuring" in why:
            win, lose = sorted((host, server))
            ok = lose < 1.5 * win and lg[7] == ("host" if host > server else "server")
        else:
            ok = lg[7] == ("server" if server < host else "host") and "predicted faster on the " + lg[7] in why
        if not ok:
            bad.append("call %d: %s" % (i, ln))
    tap.ok(not bad, "learned side: the first call per dtype goes to the server, the host is measured next, "
           "then each call runs on the side predicted faster", "\n".join(bad[:8]))
    sent = sum(1 for lg in logs if lg[7] == "server")
    tap.ok(0 < sent < len(cases) and after - before == sent,
           "learned side: both sides ran (server %d, host %d) and the server counted exactly its %d"
           % (sent, len(cases) - sent, sent), "counter %s -> %s" % (before, after))


def test_invalid(tap, d, rng):
    run_invalid(tap, "invalid arguments", d.base, rng, LP64)


def test_hosts(tap, d, rng):
    """Other host BLAS libraries: netlib's, none, this library itself."""
    cases = random_cases(rng, 40, dims=(1, 3, 17, 40))
    if os.path.exists(NETLIB):
        env = child_env(d.base, GEMM_BLAS_LIB=NETLIB)
        err = run_calls(tap, "GEMM_BLAS_LIB=netlib", cases, env, rng,
                        lambda cs: "host" if offloadable(cs) else "here")
        tap.eq(warnings(err), [], "GEMM_BLAS_LIB=netlib: no warning (its CBLAS calling dgemm_ is no re-entry)")
        env = child_env(d.base, GEMM_BLAS_LIB=NETLIB, GEMM_OFFLOAD_MIN_FLOPS=0, GEMM_OFFLOAD_MIN_INTENSITY=0,
                        GEMM_OFFLOAD_BACKOFF_MS=0)
        run_calls(tap, "GEMM_BLAS_LIB=netlib, offload all", cases, env, rng,
                  lambda cs: "server" if offloadable(cs) else "here")
    else:
        tap.skip("GEMM_BLAS_LIB=netlib", "%s not installed (Debian package libblas3)" % NETLIB)
    for label, lib in (("missing", "/nonexistent/libblas.so.3"), ("itself", PRELOAD)):
        env = child_env(None, GEMM_BLAS_LIB=lib)
        err = run_calls(tap, "GEMM_BLAS_LIB=%s (built-in loops)" % label, cases, env, rng,
                        lambda cs: "host" if offloadable(cs) else "here")
        w = warnings(err)
        tap.ok(len(w) == 2 and any("no host BLAS found" in x for x in w) and any("GEMM_SERVER is not set" in x
                                                                                 for x in w),
               "GEMM_BLAS_LIB=%s: warned once that there is no host BLAS and once that there is no server"
               % label, w)
    # argument errors on the built-in loops: reported with the parameter number
    bad = [Case("dgemm_", "C", "N", "N", 20, 20, 20, (-1, 0, 0), 1.0, 0.0),
           Case("cblas_dgemm", "R", "N", "N", 20, 20, 20, (0, -1, 0), 1.0, 0.0)]
    with tempfile.TemporaryDirectory(prefix="gemm-blas-") as tmp:
        cpath, dpath, opath, _, data = write_cases(tmp, bad, rng)
        rc, _, err = run([os.path.join(PROGS, "blas_calls"), cpath, dpath, opath],
                         child_env(None, GEMM_BLAS_LIB="/nonexistent/libblas.so.3"))
        out = np.fromfile(opath, dtype="<f8") if rc == 0 else None
    tap.ok(rc == 0 and "parameter number  8" in err and "Parameter 11 to routine cblas_dgemm" in err
           and out is not None and np.array_equal(out, data, equal_nan=True),
           "built-in loops: a bad lda is reported as parameter 8 (dgemm_) / 11 (cblas_dgemm), C untouched",
           err[-2000:])


def numpy_python():
    """A python whose NumPy multiplies through cblas_?gemm of a shared BLAS (Debian's
    python3-numpy does), or None with the reason: NumPy wheels from PyPI carry their own
    OpenBLAS with renamed symbols, which no preload of cblas_dgemm can reach."""
    probe = ("import numpy as np; a = np.ones((64, 64)); b = a @ a; "
             "c = a.astype(np.float32) @ a.astype(np.float32)")
    tried = []
    for py in ("/usr/bin/python3", sys.executable):
        if py in tried or not os.path.exists(py):
            continue
        tried.append(py)
        rc, _, err = run([py, "-c", probe], child_env("http://127.0.0.1:9", GEMM_OFFLOAD_BACKOFF_MS=0))
        lines = log_lines(err)
        if rc == 0 and {lg[0] for lg in lines} >= {"cblas_dgemm", "cblas_sgemm"}:
            return py, ""
    return None, ("no python here has a NumPy that calls cblas_sgemm/cblas_dgemm of a shared BLAS "
                  "(tried %s; Debian's python3-numpy does, NumPy wheels from PyPI carry their own "
                  "OpenBLAS with renamed symbols)" % ", ".join(tried))


def test_numpy(tap, d, rng):
    py, why = numpy_python()
    if not py:
        for name in ("numpy under the preload", "numpy default thresholds", "numpy and fork"):
            tap.skip(name, why)
        return
    if SAN:
        tap.diag("NumPy runs: python is not instrumented; libasan comes in as the preload's "
                 "dependency (UBSan and stack/global checks, no heap checks)")
    data = numpy_pairs(rng)
    with tempfile.TemporaryDirectory(prefix="gemm-blas-") as tmp:
        src, dst = os.path.join(tmp, "in.npz"), os.path.join(tmp, "out.npz")
        np.savez(src, **data)
        child = os.path.join(os.path.dirname(os.path.abspath(__file__)), "blas_numpy_child.py")
        env = child_env(d.base, GEMM_OFFLOAD_MIN_FLOPS=0, GEMM_OFFLOAD_MIN_INTENSITY=0)
        rc, out, err = run([py, child, src, dst], env)
        if not tap.ok(rc == 0, "numpy under the preload runs (%s)" % py, "exit %d\n%s\n%s" % (rc, out, err[-3000:])):
            return
        bad = numpy_wrong(data, dict(np.load(dst)))
        tap.ok(not bad, "numpy a @ b, transposed views, Fortran order, strided views, float32 and "
               "float64: every result right", bad)
        hosts = start_lines(err)["hosts"]
        tap.ok(hosts and all(h.endswith("found as a library loaded privately") for h in hosts.values()),
               "numpy's BLAS, loaded with its extension outside the global scope, is found as the host", hosts)
        logs = log_lines(err)
        served = [lg for lg in logs if lg[7] == "server"]
        tap.ok(any(lg[0] == "cblas_sgemm" for lg in served) and any(lg[0] == "cblas_dgemm" for lg in served),
               "numpy's float32 and float64 products went to the server (%d of %d calls)" % (len(served), len(logs)),
               err[-3000:])
        tap.ok(any(lg[2] != "N" or lg[3] != "N" for lg in served),
               "numpy passed transpose flags for transposed views, and they were offloaded",
               [lg[:4] for lg in served])

        # default thresholds: a tiny product stays on the host, a large float64 one goes
        small = rng.uniform(-1, 1, (32, 32))
        big_a, big_b = rng.uniform(-1, 1, (1536, 1536)), rng.uniform(-1, 1, (1536, 1536))
        np.savez(src, a0=small, b0=small, a1=big_a, b1=big_b)
        prog = "import numpy as np, sys; d = np.load(sys.argv[1]); " \
               "np.savez(sys.argv[2], c0=d['a0'] @ d['b0'], c1=d['a1'] @ d['b1'])"
        rc, out, err = run([py, "-c", prog, src, dst], child_env(d.base))
        logs = log_lines(err)
        ok = rc == 0 and len(logs) == 2 and logs[0][7] == "host" and logs[0][8] == "below threshold" \
            and logs[1][7] == "server"
        if ok:
            res = np.load(dst)
            ok = np.allclose(res["c0"], small @ small, rtol=0, atol=1e-12) and \
                np.allclose(res["c1"], big_a @ big_b, rtol=0, atol=1e-9)
        tap.ok(ok, "default thresholds: numpy 32^2 float64 on the host, 1536^2 float64 on the server, both right",
               "rc %d\n%s" % (rc, err[-2000:]))

        # fork: the child must not use the parent's connections
        np.savez(src, a0=data["a0"], b0=data["b0"])
        rc, out, err = run([py, child, src, dst, "fork"], env)
        ok = rc == 0
        if ok:
            res, kid = np.load(dst), np.load(dst + ".child.npz")
            ref = data["a0"].astype(np.float64) @ data["b0"].astype(np.float64)
            ok = int(res["child_status"]) == 0 and all(
                np.allclose(x, ref, rtol=0, atol=1e-4) for x in (res["c0"], res["c0_after_fork"], kid["c0"]))
        logs = log_lines(err)
        tap.ok(ok and len(logs) == 3 and all(lg[7] == "server" for lg in logs),
               "fork: parent before and after, and the child, each offload and get the right C",
               "rc %d\n%s" % (rc, err[-2000:]))


def test_fortran(tap, d):
    prog = os.path.join(PROGS, "blas_fortran")
    if not os.path.exists(prog):
        tap.skip("Fortran DGEMM/SGEMM under the preload",
                 "gfortran not installed when the tests were built (scripts/deps.sh test installs it)")
        return
    env = child_env(d.base, GEMM_OFFLOAD_MIN_FLOPS=0, GEMM_OFFLOAD_MIN_INTENSITY=0)
    rc, out, err = run([prog, "120"], env)
    tap.ok(rc == 0 and "products 36 bad 0" in out,
           "gfortran program: 18 DGEMM and 18 SGEMM calls (N/T/C, lda > m, beta 0 over NaN, beta 1) right",
           out[-3000:] + err[-2000:])
    logs = log_lines(err)
    tap.ok(len(logs) == 36 and all(lg[7] == "server" for lg in logs)
           and {lg[0] for lg in logs} == {"dgemm_", "sgemm_"},
           "gfortran program: every DGEMM and SGEMM went to the server", err[-2000:])
    san = sanitizer(out + err)
    tap.ok(not san, "gfortran program: no sanitizer report", san)


def test_threads(tap, d):
    prog = os.path.join(PROGS, "blas_threads")
    env = child_env(d.base, GEMM_OFFLOAD_MIN_FLOPS=2e5, GEMM_OFFLOAD_MIN_INTENSITY=0)
    rc, out, err = run([prog, "16", "12", "7"], env)
    tap.ok(rc == 0 and "products 192 bad 0" in out,
           "16 threads x 12 products (cblas_dgemm/sgemm) at once, every one right", out[-3000:] + err[-2000:])
    logs = log_lines(err)
    served = sum(1 for lg in logs if lg[7] == "server")
    tap.ok(len(logs) == 192 and served > 0 and all(lg[7] == "server" or lg[8] == "below threshold" for lg in logs),
           "16 threads: %d products offloaded, the others below the threshold, none failed" % served,
           err[-2000:])
    san = sanitizer(out + err)
    tap.ok(not san, "16 threads: no sanitizer report", san)


def host_or_here(cs):
    return "host" if offloadable(cs) else "here"


def fallback_cases(rng):
    return random_cases(rng, 24, dims=(5, 17, 40))


def test_server_down(tap, rng):
    url = "http://127.0.0.1:%d" % free_port()
    cases = fallback_cases(rng)
    env = child_env(url, GEMM_OFFLOAD_MIN_FLOPS=0, GEMM_OFFLOAD_MIN_INTENSITY=0, GEMM_OFFLOAD_CONNECT_TIMEOUT_MS=2000)
    err = run_calls(tap, "server down", cases, env, rng, host_or_here)
    whys = [lg[8] for lg in log_lines(err) if lg[7] == "host"]
    tap.ok(whys and whys[0] == "fallback: connect_failed" and all(w == "server failed recently" for w in whys[1:]),
           "server down: the first product fails over, the next ones skip the server during the back-off",
           whys[:5])
    w = warnings(err)
    tap.ok(len(w) == 1 and "connect_failed" in w[0], "server down: one warning", w)

    env = child_env(url, GEMM_OFFLOAD_MIN_FLOPS=0, GEMM_OFFLOAD_MIN_INTENSITY=0, GEMM_OFFLOAD_BACKOFF_MS=0)
    err = run_calls(tap, "server down, no back-off", cases, env, rng, host_or_here)
    whys = [lg[8] for lg in log_lines(err) if lg[7] == "host"]
    tap.ok(whys and all(w == "fallback: connect_failed" for w in whys),
           "server down, no back-off: every product tries the server, then runs on the host", whys[:5])
    w = warnings(err)
    tap.ok(len(w) == 1 and "connect_failed" in w[0], "server down, %d failures: still one warning" % len(whys), w)


def test_server_faults(tap, rng):
    cases = fallback_cases(rng)
    # the device is lost at the first product: 500 device_error, then 503 device_unavailable
    with Daemon(tap, config={"backend": "cpu", "fault_inject": "cpu_lost:1",
                             "restart_on_device_loss": "false"}) as d:
        env = child_env(d.base, GEMM_OFFLOAD_MIN_FLOPS=0, GEMM_OFFLOAD_MIN_INTENSITY=0, GEMM_OFFLOAD_BACKOFF_MS=0,
                        GEMM_OFFLOAD_RETRIES=0)
        err = run_calls(tap, "500/503 from the server", cases, env, rng, host_or_here)
        whys = [lg[8] for lg in log_lines(err) if lg[7] == "host"]
        tap.ok(whys and whys[0] == "fallback: HTTP 500 device_error" and
               all(w == "fallback: HTTP 503 device_unavailable" for w in whys[1:]),
               "500/503: each product tried, refused, recomputed on the host", whys[:4])
        w = warnings(err)
        tap.ok(len(w) == 2 and "device_error" in w[0] and "device_unavailable" in w[1],
               "500/503: one warning per reason", w)

    # a full queue: 503 queue_full to some of 8 concurrent threads
    with Daemon(tap, config={"backend": "cpu", "queue_depth": 1, "fault_inject": "cpu_delay_ms:300"}) as d:
        env = child_env(d.base, GEMM_OFFLOAD_MIN_FLOPS=0, GEMM_OFFLOAD_MIN_INTENSITY=0, GEMM_OFFLOAD_BACKOFF_MS=0,
                        GEMM_OFFLOAD_RETRIES=0)
        rc, out, err = run([os.path.join(PROGS, "blas_threads"), "8", "2", "3", "60"], env)
        logs = log_lines(err)
        full = [lg for lg in logs if "queue_full" in lg[8]]
        tap.ok(rc == 0 and "products 16 bad 0" in out, "queue full: 8 threads' products all right",
               out + err[-2000:])
        tap.ok(len(full) >= 1 and all(lg[7] == "server" or "queue_full" in lg[8] for lg in logs),
               "queue full: %d products refused with 503 queue_full ran on the host, the rest on the server"
               % len(full), err[-2000:])
        w = [x for x in warnings(err) if "queue_full" in x]
        tap.ok(len(w) == 1, "queue full: one warning", warnings(err))

    # 413: a product over max_dim is refused; smaller ones still go (no back-off for 4xx)
    with Daemon(tap, config={"backend": "cpu", "max_dim": 64}) as d:
        cases = [Case("dgemm_", "C", "N", "N", 100, 30, 30, (0, 0, 0), 1.0, 0.0),
                 Case("dgemm_", "C", "N", "N", 50, 30, 30, (0, 0, 0), 1.0, 0.5),
                 Case("cblas_sgemm", "R", "T", "N", 30, 100, 30, (1, 0, 0), 2.0, 0.0),
                 Case("cblas_dgemm", "R", "N", "N", 30, 30, 64, (0, 0, 0), 1.0, 1.0)]
        env = child_env(d.base, GEMM_OFFLOAD_MIN_FLOPS=0, GEMM_OFFLOAD_MIN_INTENSITY=0)
        err = run_calls(tap, "413 from the server", cases, env, rng,
                        lambda cs: "host" if max(cs.m, cs.n, cs.k) > 64 else "server")
        whys = [lg[8] for lg in log_lines(err) if lg[7] == "host"]
        tap.ok(whys == ["fallback: HTTP 413 too_large"] * 2, "413: the too large products fell back", whys)
        w = warnings(err)
        tap.ok(len(w) == 1 and "too_large" in w[0], "413: one warning", w)

    # 401: a wrong token
    with tempfile.TemporaryDirectory(prefix="gemm-blas-") as tmp:
        tokfile = os.path.join(tmp, "tokens")
        with open(tokfile, "w") as f:
            f.write("right-token\n")
        with Daemon(tap, config={"backend": "cpu", "tokens_file": tokfile}) as d:
            cases = fallback_cases(rng)[:8]
            env = child_env(d.base, GEMM_TOKEN="wrong-token", GEMM_OFFLOAD_MIN_FLOPS=0, GEMM_OFFLOAD_MIN_INTENSITY=0,
                            GEMM_OFFLOAD_BACKOFF_MS=0)
            err = run_calls(tap, "401 from the server", cases, env, rng, host_or_here)
            w = warnings(err)
            tap.ok(len(w) == 1 and "401" in w[0] and "unauthorized" in w[0], "401: one warning", w)
            env = child_env(d.base, GEMM_TOKEN="right-token", GEMM_OFFLOAD_MIN_FLOPS=0, GEMM_OFFLOAD_MIN_INTENSITY=0)
            run_calls(tap, "GEMM_TOKEN accepted", cases, env, rng,
                      lambda cs: "server" if offloadable(cs) else "here")

    # timeout: the server takes 3 s, the client waits 300 ms
    with Daemon(tap, config={"backend": "cpu", "fault_inject": "cpu_delay_ms:3000"}) as d:
        cases = [Case("cblas_dgemm", "R", "N", "T", 40, 30, 20, (0, 1, 2), 1.5, 0.0)]
        env = child_env(d.base, GEMM_OFFLOAD_MIN_FLOPS=0, GEMM_OFFLOAD_MIN_INTENSITY=0, GEMM_OFFLOAD_TIMEOUT_MS=300)
        err = run_calls(tap, "server too slow", cases, env, rng, host_or_here)
        whys = [lg[8] for lg in log_lines(err)]
        tap.ok(whys == ["fallback: timeout"], "timeout: the product fell back", whys)
        tap.ok(len(warnings(err)) == 1, "timeout: one warning", warnings(err))


def test_exports(tap):
    """The names of the table (blas_internal.h), of the version script and of the library's
    dynamic symbols are one list: libgemm, the codecs and libcurl's users stay the program's."""
    names = sorted(n for row in flavours() for n in row[:4])
    tap.ok(len(names) >= 16 and names == map_names(),
           "libgemm_blas.map exports exactly the %d names of the table GB_FLAVOURS" % len(names),
           "table %s\nmap %s" % (names, map_names()))
    if not shutil.which("nm"):
        tap.skip("libgemm_blas.so exports", "nm (binutils) not found")
        return
    out = subprocess.run(["nm", "-D", "--defined-only", PRELOAD], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE).stdout.decode()
    got = sorted(ln.split()[2] for ln in out.splitlines() if len(ln.split()) >= 3 and ln.split()[1] != "A")
    tap.eq(got, names, "libgemm_blas.so defines exactly the names of the table")


def test_unknown_names(tap):
    """A BLAS library whose gemm entry points have names the table lacks is named at exit,
    once, with those names; kernels named like gemm (acme_sgemm_nn) are not entry points."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if not cc:
        tap.skip("unknown gemm names are warned about", "no C compiler")
        return
    with tempfile.TemporaryDirectory(prefix="gemm-blas-") as tmp:
        src, lib = os.path.join(tmp, "acme.c"), os.path.join(tmp, "libacme_blas.so")
        with open(src, "w") as f:
            f.write("void acme_sgemm_64(void) {}\nvoid acme_cblas_dgemm_64(void) {}\nvoid acme_sgemm_nn(void) {}\n"
                    "void sgemm_(void) {}\n")
        if subprocess.run([cc, "-shared", "-fPIC", "-o", lib, src]).returncode != 0:
            tap.ok(False, "unknown gemm names: the test library builds")
            return
        prog = "import ctypes, sys; ctypes.CDLL(sys.argv[1]); print('loaded')"
        rc, out, err = run([sys.executable, "-c", prog, lib], child_env(None))
    w = [x for x in warnings(err) if "libacme_blas.so" in x]
    named = w[0].split(" defines ")[1].split(":")[0].split() if len(w) == 1 and " defines " in w[0] else []
    tap.ok(rc == 0 and sorted(named) == ["acme_cblas_dgemm_64", "acme_sgemm_64"] and "never offloaded" in w[0],
           "a library with gemm entry points under names not in the table: warned once, with those names", err[-2000:])


def main(tap):
    missing = [p for p in (PRELOAD, os.path.join(PROGS, "blas_calls"), os.path.join(PROGS, "blas_threads"))
               if not os.path.exists(p)]
    if not tap.ok(not missing, "preload library and test programs are built", missing):
        return
    test_exports(tap)
    test_unknown_names(tap)
    rng = np.random.default_rng(int(os.environ.get("GEMM_TEST_SEED", "20261123")))
    with Daemon(tap, config={"backend": "cpu"}) as d:
        test_offload(tap, d, rng)
        test_learn(tap, d, rng)
        test_invalid(tap, d, rng)
        test_hosts(tap, d, rng)
        test_numpy(tap, d, rng)
        test_fortran(tap, d)
        test_threads(tap, d)
    test_server_down(tap, rng)
    test_server_faults(tap, rng)


if __name__ == "__main__":
    run_guarded(Tap(), main)
