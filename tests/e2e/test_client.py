#!/usr/bin/env python3
"""test_client.py - the `gemm` command and libgemm against the real daemon (CPU backend).

Every format (.npy incl. fortran_order, raw binary, CSV/TSV/text) and dtype round trip,
checked against NumPy float64 (int32: mod 2^32); server errors surface with their message;
connection refused, timeouts, 503 retries, Ctrl-C and tokens behave as documented; the
library example in docs/examples compiles and runs; `gemm bench`, `info`, `health`.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import REPO, SLOW, Daemon, Tap, free_port, run_guarded  # noqa: E402

GEMM_BIN = os.environ.get("GEMM_BIN", "bin/gemm")
if not os.path.isabs(GEMM_BIN):
    GEMM_BIN = os.path.join(REPO, GEMM_BIN)
BUILD = os.environ.get("GEMMD_BUILD", "build")
RUN_TIMEOUT = 120 * SLOW

NP = {"float32": np.float32, "float64": np.float64, "int32": np.int32}


def gemm(args, env=None, timeout=None, server=None):
    """Runs the gemm command; returns (exit code, stdout bytes, stderr text)."""
    e = dict(os.environ)
    for k in ("GEMM_SERVER", "GEMM_TOKEN"):
        e.pop(k, None)
    e.update(env or {})
    cmd = [GEMM_BIN] + (["--server", server] if server else []) + list(args)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e,
                       timeout=timeout or RUN_TIMEOUT)
    return p.returncode, p.stdout, p.stderr.decode("utf-8", "replace")


def rand(shape, dtype, rng):
    if dtype == "int32":
        return rng.integers(-50, 50, size=shape).astype(np.int32)
    return (rng.standard_normal(shape)).astype(NP[dtype])


def reference(a, b, dtype):
    if dtype == "int32":
        c = (a.astype(np.int64) @ b.astype(np.int64)) & 0xFFFFFFFF
        return c.astype(np.uint32).view(np.int32)
    return a.astype(np.float64) @ b.astype(np.float64)


def close_enough(got, a, b, dtype):
    ref = reference(a, b, dtype)
    if got is None or got.shape != ref.shape:
        return False, "shape %r, want %r" % (None if got is None else got.shape, ref.shape)
    if dtype == "int32":
        ok = np.array_equal(got.astype(np.int32), ref)
        return ok, "" if ok else "int32 values differ"
    k = a.shape[1]
    # error bound of a length-k dot product: k * eps * sum |a||b|
    bound = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    eps = np.finfo(NP[dtype]).eps
    tol = 2 * k * eps * bound + 1e-300
    err = np.abs(got.astype(np.float64) - ref)
    ok = bool(np.all(err <= tol))
    return ok, "" if ok else "max error %g (tol %g)" % (err.max(), tol.max())


def write_input(path, m, fmt, dtype):
    if fmt == "npy":
        np.save(path, m)
    elif fmt == "npyF":
        np.save(path, np.asfortranarray(m))
    elif fmt == "raw":
        np.ascontiguousarray(m).astype("<" + np.dtype(NP[dtype]).str[1:]).tofile(path)
    else:
        delim = {"csv": ",", "tsv": "\t", "txt": " "}[fmt]
        f = "%d" if dtype == "int32" else "%.17g"
        np.savetxt(path, m, fmt=f, delimiter=delim)


def read_output(path, fmt, dtype, shape):
    if fmt == "npy":
        return np.load(path)
    if fmt == "raw":
        return np.fromfile(path, dtype="<" + np.dtype(NP[dtype]).str[1:]).reshape(shape)
    delim = {"csv": ",", "tsv": "\t", "txt": None}[fmt]
    return np.loadtxt(path, delimiter=delim, dtype=np.float64 if dtype != "int32" else np.int64,
                      ndmin=2).astype(NP[dtype])


EXT = {"npy": ".npy", "npyF": ".npy", "raw": ".bin", "csv": ".csv", "tsv": ".tsv", "txt": ".txt"}


def leftovers(folder):
    return [f for f in os.listdir(folder) if ".part" in f]


def wait_idle(d):
    """Waits (bounded) until the daemon has nothing queued or running."""
    deadline = time.monotonic() + 30 * SLOW
    while time.monotonic() < deadline:
        r = d.curl("GET", "/readyz")
        j = r.json() or {}
        if r.status == 200 and j.get("running") == 0 and j.get("queued") == 0:
            return
        time.sleep(0.1)


def main(tap):
    if not os.path.exists(GEMM_BIN):
        tap.ok(False, "gemm binary exists at %s (make bin/gemm)" % GEMM_BIN)
        return
    rng = np.random.default_rng(7)
    tmp = tempfile.TemporaryDirectory(prefix="gemm-client-")
    T = tmp.name

    # ------------------------------------------------------------ usage (no server needed)
    for sub in ("", "multiply", "bench", "info", "health"):
        rc, out, err = gemm(([sub] if sub else []) + ["--help"])
        tap.ok(rc == 0 and b"usage: gemm" in out and b"Exit status" in out,
               "gemm %s--help prints usage and exits 0" % (sub + " " if sub else ""), (rc, out[:200], err))
    rc, out, err = gemm(["help", "bench"])
    tap.ok(rc == 0 and b"gemm bench" in out, "gemm help bench", (rc, err))
    rc, _, err = gemm([])
    tap.eq(rc, 2, "no command: exit 2")
    rc, _, err = gemm(["frobnicate"])
    tap.ok(rc == 2 and "unknown command" in err, "unknown command: exit 2 with a message", err)
    rc, _, err = gemm(["multiply", "a.npy"])
    tap.ok(rc == 2 and "two inputs" in err, "multiply with one input: exit 2", err)
    rc, _, err = gemm(["bench", "--repeat", "zero"])
    tap.ok(rc == 2 and "--repeat" in err, "bad --repeat value: exit 2", err)
    rc, _, err = gemm(["info", "--bogus"])
    tap.ok(rc == 2 and "unknown option" in err, "unknown option: exit 2", err)

    # ------------------------------------------------------------ connection refused
    dead = "http://127.0.0.1:%d" % free_port()
    a = rand((3, 4), "float64", rng)
    b = rand((4, 2), "float64", rng)
    np.save(os.path.join(T, "a.npy"), a)
    np.save(os.path.join(T, "b.npy"), b)
    rc, _, err = gemm(["multiply", os.path.join(T, "a.npy"), os.path.join(T, "b.npy"),
                       "-o", os.path.join(T, "never.npy")], server=dead)
    tap.ok(rc == 3 and "cannot reach" in err, "connection refused: exit 3 with a message", (rc, err))
    tap.ok(not os.path.exists(os.path.join(T, "never.npy")) and not leftovers(T),
           "connection refused: no output file, no partial file")
    rc, _, err = gemm(["health"], server=dead)
    tap.eq(rc, 3, "health against nothing: exit 3")

    # ------------------------------------------------------------ a silent server: timeout
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(8)
    held = []
    stop = threading.Event()

    def accept_and_hold():
        lsock.settimeout(0.2)
        while not stop.is_set():
            try:
                c, _ = lsock.accept()
                held.append(c)  # read nothing, answer nothing
            except OSError:
                pass

    th = threading.Thread(target=accept_and_hold, daemon=True)
    th.start()
    silent = "http://127.0.0.1:%d" % lsock.getsockname()[1]
    rc, _, err = gemm(["multiply", os.path.join(T, "a.npy"), os.path.join(T, "b.npy"), "-o",
                       os.path.join(T, "never.npy"), "--timeout", "0.5"], server=silent)
    tap.ok(rc == 3 and "timed out" in err, "a server that never answers: --timeout gives exit 3", (rc, err))
    tap.ok(not os.path.exists(os.path.join(T, "never.npy")) and not leftovers(T),
           "timeout: no output file, no partial file")
    stop.set()
    th.join(5)
    for c in held:
        c.close()
    lsock.close()

    with Daemon(tap, config={"backend": "cpu"}) as d:
        S = d.base
        # ------------------------------------------------------------ every format x dtype
        shapes = [(5, 7, 3), (1, 1, 1), (1, 9, 1), (37, 53, 29)]
        for dtype in ("float32", "float64", "int32"):
            for fa, fb, fc in (("npy", "npy", "npy"), ("raw", "raw", "raw"), ("csv", "csv", "csv"),
                               ("tsv", "tsv", "tsv"), ("txt", "txt", "txt"), ("npyF", "npy", "csv"),
                               ("npy", "csv", "raw"), ("csv", "npyF", "npy")):
                for (m, k, n) in shapes if (fa, fb) == ("npy", "npy") else shapes[2:]:
                    A = rand((m, k), dtype, rng)
                    B = rand((k, n), dtype, rng)
                    pa = os.path.join(T, "A%s" % EXT[fa])
                    pb = os.path.join(T, "B%s" % EXT[fb])
                    pc = os.path.join(T, "C%s" % EXT[fc])
                    write_input(pa, A, fa, dtype)
                    write_input(pb, B, fb, dtype)
                    if os.path.exists(pc):
                        os.unlink(pc)
                    args = ["multiply", pa, pb, "-o", pc]
                    if "raw" in (fa, fb) or fa in ("csv", "tsv", "txt") or fb in ("csv", "tsv", "txt"):
                        args += ["--dtype", dtype]
                    if fa == "raw":
                        args += ["--shape", "%dx%d" % (m, k)]
                    rc, _, err = gemm(args, server=S)
                    name = "%s: %s . %s -> %s, %dx%dx%d" % (dtype, fa, fb, fc, m, k, n)
                    if not tap.ok(rc == 0, name + ": exit 0", err):
                        continue
                    got = read_output(pc, fc, dtype, (m, n))
                    ok, why = close_enough(got, A, B, dtype)
                    tap.ok(ok, name + ": C matches NumPy", why)
        tap.ok(not leftovers(T), "no partial files left after successful runs")

        # raw B with an explicit MxKxN shape, output to standard output as CSV
        A = rand((4, 6), "float64", rng)
        B = rand((6, 3), "float64", rng)
        A.tofile(os.path.join(T, "A.bin"))
        B.tofile(os.path.join(T, "B.bin"))
        rc, out, err = gemm(["multiply", os.path.join(T, "A.bin"), os.path.join(T, "B.bin"),
                             "--shape", "4x6x3", "--dtype", "float64"], server=S)
        got = np.loadtxt(out.decode().splitlines(), delimiter=",", ndmin=2) if rc == 0 else None
        ok, why = close_enough(got, A, B, "float64")
        tap.ok(rc == 0 and ok, "raw MxKxN inputs, C printed as CSV on stdout", (rc, err, why))

        # int32 wraps modulo 2^32 like the server's contract
        A = np.full((2, 3), 2**30, dtype=np.int32)
        B = np.full((3, 2), 3, dtype=np.int32)
        np.save(os.path.join(T, "wa.npy"), A)
        np.save(os.path.join(T, "wb.npy"), B)
        rc, _, err = gemm(["multiply", os.path.join(T, "wa.npy"), os.path.join(T, "wb.npy"), "-o",
                           os.path.join(T, "wc.npy")], server=S)
        ok, why = close_enough(np.load(os.path.join(T, "wc.npy")) if rc == 0 else None, A, B, "int32")
        tap.ok(rc == 0 and ok, "int32 products wrap modulo 2^32", (err, why))

        # --async: queue, wait, fetch
        for dtype in ("float32", "int32"):
            A = rand((33, 17), dtype, rng)
            B = rand((17, 9), dtype, rng)
            np.save(os.path.join(T, "qa.npy"), A)
            np.save(os.path.join(T, "qb.npy"), B)
            rc, _, err = gemm(["multiply", os.path.join(T, "qa.npy"), os.path.join(T, "qb.npy"),
                               "-o", os.path.join(T, "qc.npy"), "--async", "--timing"], server=S)
            ok, why = close_enough(np.load(os.path.join(T, "qc.npy")) if rc == 0 else None, A, B, dtype)
            tap.ok(rc == 0 and ok, "--async %s round trip" % dtype, (err, why))
            tap.ok("server total" in err and "kernel" in err, "--timing prints the server's stages", err)
            # The client's time of a job covers submit, polls and fetch: it encloses the
            # server's total (both from the same run's own report, no clock assumption).
            st = re.search(r"server total\s+([\d.]+) ms", err)
            cj = re.search(r"client job\s+([\d.]+) ms", err)
            tap.ok(st and cj and float(cj.group(1)) >= float(st.group(1)),
                   "--async --timing: the client's job time is not smaller than the server's total", err)

        # ------------------------------------------------------------ server errors
        rc, _, err = gemm(["multiply", os.path.join(T, "a.npy"), os.path.join(T, "b.npy"), "-o",
                           os.path.join(T, "e.npy"), "--kernel", "nosuch"], server=S)
        tap.ok(rc == 1 and "unknown_kernel" in err and "nosuch" in err,
               "unknown kernel: exit 1 with the server's code and message", (rc, err))
        tap.ok(not os.path.exists(os.path.join(T, "e.npy")) and not leftovers(T),
               "server error: no output file, no partial file")
        rc, _, err = gemm(["multiply", os.path.join(T, "a.npy"), os.path.join(T, "b.npy"), "-o",
                           os.path.join(T, "e.npy"), "--async", "--kernel", "nosuch"], server=S)
        tap.ok(rc == 1 and "nosuch" in err, "--async with a bad kernel: exit 1 with the server's message",
               (rc, err))
        A32 = rand((3, 4), "float64", rng)
        np.save(os.path.join(T, "m1.npy"), A32)
        np.save(os.path.join(T, "m2.npy"), rand((5, 2), "float64", rng))
        rc, _, err = gemm(["multiply", os.path.join(T, "m1.npy"), os.path.join(T, "m2.npy"), "-o",
                           os.path.join(T, "e.npy")], server=S)
        tap.ok(rc == 4 and "must equal" in err, "shape mismatch found before sending: exit 4", (rc, err))

        # ------------------------------------------------------------ local errors
        rc, _, err = gemm(["multiply", os.path.join(T, "missing.npy"), os.path.join(T, "b.npy")], server=S)
        tap.ok(rc == 4 and "missing.npy" in err, "missing input: exit 4 naming the file", (rc, err))
        with open(os.path.join(T, "junk.npy"), "wb") as f:
            f.write(b"this is not numpy at all, not even close" * 4)
        rc, _, err = gemm(["multiply", os.path.join(T, "junk.npy"), os.path.join(T, "b.npy")], server=S)
        tap.ok(rc == 4 and "junk.npy" in err, "malformed .npy: exit 4", (rc, err))
        full = os.path.join(T, "trunc.npy")
        np.save(full, rand((10, 10), "float64", rng))
        with open(full, "r+b") as f:
            f.truncate(os.path.getsize(full) - 8)
        rc, _, err = gemm(["multiply", full, full], server=S)
        tap.ok(rc == 4 and "truncated" in err, "truncated .npy: exit 4", (rc, err))
        with open(os.path.join(T, "bad.csv"), "w") as f:
            f.write("1,2,3\n4,5\n")
        rc, _, err = gemm(["multiply", os.path.join(T, "bad.csv"), os.path.join(T, "bad.csv")], server=S)
        tap.ok(rc == 4 and "bad.csv:2" in err, "ragged CSV: exit 4 naming file and line", (rc, err))
        with open(os.path.join(T, "word.csv"), "w") as f:
            f.write("1,2\nthree,4\n")
        rc, _, err = gemm(["multiply", os.path.join(T, "word.csv"), os.path.join(T, "word.csv")], server=S)
        tap.ok(rc == 4 and "word.csv:2" in err and "three" in err, "non-numeric CSV value: exit 4", (rc, err))
        rc, _, err = gemm(["multiply", os.path.join(T, "A.bin"), os.path.join(T, "B.bin")], server=S)
        tap.ok(rc == 2 and "--dtype" in err, "raw input without --dtype: exit 2", (rc, err))
        rc, _, err = gemm(["multiply", os.path.join(T, "A.bin"), os.path.join(T, "B.bin"), "-d", "float64"],
                          server=S)
        tap.ok(rc == 2 and "--shape" in err, "raw input without --shape: exit 2", (rc, err))
        rc, _, err = gemm(["multiply", os.path.join(T, "A.bin"), os.path.join(T, "B.bin"), "-d", "float64",
                           "--shape", "5x5"], server=S)
        tap.ok(rc == 4 and "A.bin" in err, "raw size that does not fit --shape: exit 4", (rc, err))
        rc, _, err = gemm(["multiply", os.path.join(T, "a.npy"), os.path.join(T, "b.npy"), "-d", "int32"],
                          server=S)
        tap.ok(rc == 4 and "float64" in err, ".npy dtype differing from --dtype: exit 4", (rc, err))
        rc, _, err = gemm(["multiply", os.path.join(T, "a.npy"), os.path.join(T, "b.npy"), "-o",
                           os.path.join(T, "c.xyz")], server=S)
        tap.ok(rc == 2 and "--format" in err, "unknown output extension: exit 2", (rc, err))
        rc, _, err = gemm(["multiply", os.path.join(T, "a.npy"), os.path.join(T, "b.npy"), "-o",
                           os.path.join(T, "no", "such", "dir", "c.npy")], server=S)
        tap.ok(rc == 4, "output in a missing folder: exit 4", (rc, err))

        # ------------------------------------------------------------ environment, info, health
        rc, _, err = gemm(["multiply", os.path.join(T, "a.npy"), os.path.join(T, "b.npy"), "-o",
                           os.path.join(T, "env.npy")], env={"GEMM_SERVER": S})
        tap.ok(rc == 0 and os.path.exists(os.path.join(T, "env.npy")), "GEMM_SERVER picks the server", err)
        info = d.curl("GET", "/v1/info").json() or {}
        rc, out, err = gemm(["info", "--json"], server=S)
        try:
            got = json.loads(out.decode())
        except ValueError:
            got = None
        same = got is not None and {k: v for k, v in got.items() if k != "devices"} == \
            {k: v for k, v in info.items() if k != "devices"}
        tap.ok(rc == 0 and same, "gemm info --json prints the server's /v1/info JSON", (rc, out[:300], err))
        rc, out, err = gemm(["info"], server=S)
        text = out.decode()
        lines = text.splitlines()
        scalars = [k for k, v in info.items() if isinstance(v, (str, int, float)) and not isinstance(v, bool)]
        missing = [k for k in scalars if "%s: %s" % (k, info[k]) not in lines]
        kernels = [kk["name"] for kk in info.get("kernels", [])]
        tap.ok(rc == 0 and scalars and not missing, "gemm info prints each top-level value as 'key: value'",
               (rc, missing, text[:400], err))
        tap.ok(all("  - name: %s" % k in lines for k in kernels) and "kernels:" in lines and "limits:" in lines
               and "dtypes: %s" % ", ".join(info.get("dtypes", [])) in lines,
               "gemm info: kernels as '- name:' items under 'kernels:', lists on one line, limits nested", text)
        # braces only as a route's path parameter ("/v1/jobs/{id}"), never JSON's
        tap.ok(not re.search(r'[{}"\t]', re.sub(r"/\{\w+\}", "/", text))
               and all((len(ln) - len(ln.lstrip(" "))) % 2 == 0 for ln in lines)
               and any(ln.startswith("  max_dim: ") for ln in lines),
               "gemm info is pretty: no JSON braces, quotes or tabs; nested keys indented by 2", text[:400])
        rc, out, err = gemm(["health"], server=S)
        tap.ok(rc == 0 and b"healthz" in out and b"readyz" in out, "gemm health: both probes, exit 0", (rc, out, err))
        rc, out, err = gemm(["health", "--live"], server=S)
        tap.ok(rc == 0 and b"healthz" in out and b"readyz" not in out, "gemm health --live: /healthz only, exit 0",
               (rc, out, err))

        # ------------------------------------------------------------ bench
        rc, out, err = gemm(["bench", "--size", "48", "--repeat", "3", "--concurrency", "2"], server=S)
        text = out.decode()
        tap.ok(rc == 0 and "median" in text and "p99" in text and "GFLOP/s" in text and "MB/s" in text
               and "requests/s" in text, "gemm bench prints latency and throughput", (rc, text, err))
        rc, out, err = gemm(["bench", "--m", "7", "--k", "300", "--n", "5", "--dtype", "int32", "--repeat", "2"],
                            server=S)
        tap.ok(rc == 0 and "7x300x5 int32" in out.decode(), "gemm bench with a rectangular int32 shape", (rc, out, err))
        for dt, extra in (("float16", []), ("bfloat16", []), ("float16", ["--out-dtype", "float16"]),
                          ("bfloat16", ["--out-dtype", "bfloat16"])):
            rc, out, err = gemm(["bench", "--m", "9", "--k", "130", "--n", "7", "--dtype", dt, "--repeat", "2"] + extra,
                                server=S)
            tap.ok(rc == 0 and ("9x130x7 %s" % dt) in out.decode() and "median" in out.decode(),
                   "gemm bench with %s operands%s (its first answer checked)" % (dt, " and C in " + dt if extra else ""),
                   (rc, out, err))
        rc, out, err = gemm(["bench", "--size", "8", "--dtype", "float32", "--out-dtype", "float16"], server=S)
        tap.ok(rc == 2 and "--out-dtype" in err, "gemm bench refuses a half C of float32 operands", (rc, err))

        # ------------------------------------------------------------ progress bar over 64 MB
        big = 4200  # 4200^2 float32 = 70.6 MB per matrix
        A = np.ones((big, big), dtype=np.float32)
        np.save(os.path.join(T, "bigA.npy"), A)
        B = np.ones((big, 2), dtype=np.float32)
        np.save(os.path.join(T, "bigB.npy"), B)
        rc, _, err = gemm(["multiply", os.path.join(T, "bigA.npy"), os.path.join(T, "bigB.npy"), "-o",
                           os.path.join(T, "bigC.npy"), "--progress"], server=S)
        got = np.load(os.path.join(T, "bigC.npy")) if rc == 0 else None
        tap.ok(rc == 0 and got is not None and np.all(got == big), "a 70 MB upload round trip", (rc, err[-300:]))
        # A fast host may have sent all 70 MB before the first draw: the bar then shows the
        # answer being received instead. Either way a bar must have been drawn.
        tap.ok(("sending" in err or "receiving" in err) and "%" in err and "MB" in err,
               "--progress draws a bar for a transfer over 64 MB", err[-300:])
        rc, _, err = gemm(["multiply", os.path.join(T, "a.npy"), os.path.join(T, "b.npy"), "-o",
                           os.path.join(T, "small.npy"), "--progress"], server=S)
        tap.ok(rc == 0 and "sending" not in err and "receiving" not in err, "no bar for small transfers", err)
        for f in ("bigA.npy", "bigB.npy", "bigC.npy"):
            os.unlink(os.path.join(T, f))

        # ------------------------------------------------------------ the library example
        example = os.path.join(REPO, BUILD, "examples", "multiply")
        if not os.path.exists(example):
            src = os.path.join(REPO, "docs", "examples", "multiply.c")
            libdir = os.path.join(REPO, os.environ.get("GEMMD_LIBDIR", "lib"))
            pc = os.path.join(libdir, "pkgconfig")
            flags = subprocess.run(["pkg-config", "--cflags", "--libs", "gemm"], env=dict(os.environ, PKG_CONFIG_PATH=pc),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            example = os.path.join(T, "multiply-example")
            cp = subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", src, "-o", example]
                                + flags.stdout.decode().split() + ["-Wl,-rpath," + libdir],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            tap.ok(cp.returncode == 0, "docs/examples/multiply.c compiles with pkg-config gemm", cp.stderr.decode())
        if os.path.exists(example):
            p = subprocess.run([example, S], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=RUN_TIMEOUT)
            tap.ok(p.returncode == 0 and b"kernel" in p.stdout, "the library example runs and checks its answer",
                   (p.returncode, p.stdout, p.stderr))

    # ------------------------------------------------------------ slow daemon: timeout, Ctrl-C, 503
    with Daemon(tap, config={"backend": "cpu", "fault_inject": "cpu_delay_ms:2500", "queue_depth": "1",
                             "cpu_workers": "1"}) as d:
        S = d.base
        pa, pb = os.path.join(T, "a.npy"), os.path.join(T, "b.npy")
        rc, _, err = gemm(["multiply", pa, pb, "-o", os.path.join(T, "slow.npy"), "--timeout", "0.3"], server=S)
        tap.ok(rc == 3 and "timed out" in err, "--timeout shorter than the product: exit 3", (rc, err))
        tap.ok(not os.path.exists(os.path.join(T, "slow.npy")) and not leftovers(T),
               "timeout against the daemon: no output, no partial file")

        # Ctrl-C while the product runs: exit 130, nothing written
        p = subprocess.Popen([GEMM_BIN, "--server", S, "multiply", pa, pb, "-o", os.path.join(T, "int.npy")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(0.5)
        p.send_signal(signal.SIGINT)
        try:
            _, e = p.communicate(timeout=30 * SLOW)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            p.kill()
            _, e = p.communicate()
            rc = None
        tap.ok(rc == 130, "Ctrl-C during a product: exit 130", (rc, e))
        tap.ok(not os.path.exists(os.path.join(T, "int.npy")) and not leftovers(T),
               "Ctrl-C: the partial output is removed")

        # Ctrl-C while an --async job waits: exit 130, the job is cancelled on the server
        wait_idle(d)  # the products interrupted above still run on the server
        p = subprocess.Popen([GEMM_BIN, "--server", S, "-v", "multiply", pa, pb, "--async", "-o",
                              os.path.join(T, "aint.npy")], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(0.7)
        p.send_signal(signal.SIGINT)
        try:
            _, e = p.communicate(timeout=30 * SLOW)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            p.kill()
            _, e = p.communicate()
            rc = None
        e = e.decode("utf-8", "replace")
        tap.ok(rc == 130 and "cancelled" in e, "Ctrl-C during --async: exit 130, job cancelled", (rc, e))
        jid = None
        for line in e.splitlines():
            if line.startswith("gemm: job ") and line.endswith(" queued"):
                jid = line.split()[2]
        if jid:
            r = d.curl("GET", "/v1/jobs/" + jid)
            state = (r.json() or {}).get("state")
            tap.ok(r.status == 404 or state == "cancelled", "the cancelled job is gone from the server", r)
        else:
            tap.ok(False, "the cancelled job is gone from the server", "no job id in: " + e)
        tap.ok(not os.path.exists(os.path.join(T, "aint.npy")) and not leftovers(T),
               "Ctrl-C during --async: no output")

        # fill the queue: one job running, one queued (queue_depth 1) -> 503 queue_full
        def job():
            return d.matmul_raw(np.ones((2, 2)), np.ones((2, 2)), "float64", path="/v1/jobs")
        wait_idle(d)
        r1, r2 = job(), job()
        probe = d.matmul_raw(np.ones((2, 2)), np.ones((2, 2)), "float64")
        if not (r1.status == 202 and r2.status == 202 and probe.status == 503):
            tap.skip("503 without retries: exit 1 with queue_full", "could not fill the queue (%s %s %s)"
                     % (r1.status, r2.status, probe.status))
            tap.skip("503 retried after Retry-After until served", "queue not full")
        else:
            rc, _, err = gemm(["multiply", pa, pb, "-o", os.path.join(T, "q0.npy"), "--retries", "0"], server=S)
            tap.ok(rc == 1 and "503" in err and "queue_full" in err,
                   "503 without retries: exit 1 with queue_full", (rc, err))
            rc, _, err = gemm(["multiply", pa, pb, "-o", os.path.join(T, "q1.npy"), "--retries", "20",
                               "--timing"], server=S)
            got = np.load(os.path.join(T, "q1.npy")) if rc == 0 else None
            ok, why = close_enough(got, a, b, "float64")
            tap.ok(rc == 0 and ok and "503 retries" in err,
                   "503 retried after Retry-After until served", (rc, err, why))

    # ------------------------------------------------------------ tokens
    tokfile = os.path.join(T, "tokens")
    with open(tokfile, "w") as f:
        f.write("s3cret-token-for-tests\n")
    with Daemon(tap, config={"backend": "cpu", "tokens_file": tokfile}) as d:
        S = d.base
        pa, pb = os.path.join(T, "a.npy"), os.path.join(T, "b.npy")
        rc, _, err = gemm(["multiply", pa, pb, "-o", os.path.join(T, "t.npy")], server=S)
        tap.ok(rc == 1 and "401" in err, "no token: exit 1 with 401", (rc, err))
        rc, _, err = gemm(["multiply", pa, pb, "-o", os.path.join(T, "t.npy"), "--token", "wrong"], server=S)
        tap.ok(rc == 1 and "401" in err, "a wrong token: exit 1 with 401", (rc, err))
        rc, _, err = gemm(["multiply", pa, pb, "-o", os.path.join(T, "t.npy"), "--token", "s3cret-token-for-tests"],
                          server=S)
        tap.ok(rc == 0, "--token: served", err)
        rc, _, err = gemm(["multiply", pa, pb, "-o", os.path.join(T, "t2.npy")], server=S,
                          env={"GEMM_TOKEN": "s3cret-token-for-tests"})
        tap.ok(rc == 0, "GEMM_TOKEN: served", err)

    # ------------------------------------------------------------ https with a self-signed certificate
    import shutil
    if not shutil.which("openssl"):
        tap.skip("https with --cacert", "no openssl command to make a certificate")
    else:
        cert, key = os.path.join(T, "cert.pem"), os.path.join(T, "key.pem")
        g = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                            "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if g.returncode != 0:
            tap.skip("https with --cacert", "openssl could not make a certificate")
        else:
            d = Daemon(tap, config={"backend": "cpu", "tls_cert": cert, "tls_key": key}, wait=False)
            with d:
                S = d.base.replace("http://", "https://")
                deadline = time.monotonic() + 30 * SLOW
                while time.monotonic() < deadline:
                    rc, _, _ = gemm(["health", "--cacert", cert], server=S)
                    if rc == 0 or not d.alive():
                        break
                    time.sleep(0.1)
                pa, pb = os.path.join(T, "a.npy"), os.path.join(T, "b.npy")
                rc, _, err = gemm(["multiply", pa, pb, "-o", os.path.join(T, "tls.npy"), "--cacert", cert], server=S)
                ok, why = close_enough(np.load(os.path.join(T, "tls.npy")) if rc == 0 else None, a, b, "float64")
                tap.ok(rc == 0 and ok, "https with --cacert: served", (rc, err, why))
                rc, _, err = gemm(["multiply", pa, pb, "-o", os.path.join(T, "tls2.npy")], server=S)
                tap.ok(rc == 3 and "certificate" in err, "https without the certificate: exit 3, says why", (rc, err))
    tmp.cleanup()


if __name__ == "__main__":
    run_guarded(Tap(), main)
