#!/usr/bin/python3
"""test_streams.py - `gemm multiply --streams N` (libgemm's gemm_client_multiply_streams):
A cut into row panels sent over N connections at once, B uploaded once as a resident
matrix and deleted afterwards.

- For float32, float64 and int32, and for N = 2, 3, 4, 16 (more panels than rows
  included), the output matches NumPy in float64. For int32 (exact arithmetic) it is byte
  for byte the file a single request (--streams 1) writes. For float32/float64 the CPU
  backend runs OpenBLAS, whose code path for a row can depend on how many rows the product
  has (on AMD Zen builds it does): equal bytes are not promised there (docs/CLIENT.md), and
  the test does not ask for them.
- The daemon's access log shows B made once (empty), its rows PUT in N shares over the
  panels' connections, N products, and B deleted; no resident matrix is left behind (the
  listing is empty).
- With tokens the panels carry the token too (the resident B is the caller's).
- A server error (a shape the server refuses) fails the command with the server's error
  and still leaves no matrix behind.
"""
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import REPO, SLOW, Daemon, Tap, compare, npy_bytes, random_matrix, reference, run_guarded  # noqa: E402

GEMM_BIN = os.environ.get("GEMM_BIN", "bin/gemm")
if not os.path.isabs(GEMM_BIN):
    GEMM_BIN = os.path.join(REPO, GEMM_BIN)


def gemm(args, server, token=None):
    e = {k: v for k, v in os.environ.items() if k not in ("GEMM_SERVER", "GEMM_TOKEN")}
    cmd = [GEMM_BIN, "--server", server] + (["--token", token] if token else []) + list(args)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e, timeout=120 * SLOW)
    return p.returncode, p.stderr.decode("utf-8", "replace")


def write(path, arr):
    with open(path, "wb") as f:
        f.write(npy_bytes(arr))


def read(path):
    with open(path, "rb") as f:
        return f.read()


def count(log, needle):
    return sum(1 for line in log.splitlines() if needle in line)


def main(tap):
    rng = np.random.default_rng(3)
    tmp = tempfile.TemporaryDirectory(prefix="gemm-streams-")
    T = tmp.name
    with Daemon(tap, config={"backend": "cpu"}) as d:
        for dtype in ("float32", "float64", "int32"):
            a = random_matrix(rng, (37, 29), dtype)
            b = random_matrix(rng, (29, 23), dtype)
            pa, pb = os.path.join(T, "a.npy"), os.path.join(T, "b.npy")
            write(pa, a)
            write(pb, b)
            one = os.path.join(T, "one.npy")
            rc, err = gemm(["multiply", pa, pb, "-o", one, "--streams", "1"], d.base)
            tap.ok(rc == 0, "%s: --streams 1 works" % dtype, err)
            ok, why = compare(np.load(one), reference(a, b, dtype), dtype, 29)
            tap.ok(ok, "%s: the single request matches NumPy" % dtype, why)
            for n in (2, 3, 4, 16):
                before = d.read_log()
                out = os.path.join(T, "s%d.npy" % n)
                rc, err = gemm(["multiply", pa, pb, "-o", out, "--streams", str(n)], d.base)
                if dtype == "int32":
                    tap.ok(rc == 0 and read(out) == read(one),
                           "%s: --streams %d writes the same bytes as one request" % (dtype, n), err)
                else:
                    ok, why = compare(np.load(out), reference(a, b, dtype), dtype, 29) if rc == 0 else (False, err)
                    tap.ok(ok, "%s: --streams %d matches NumPy" % (dtype, n), why)
                want = min(n, 37)

                def logged(log):
                    return (count(log, "method=POST path=/v1/matrices ") == 1 and
                            count(log, "method=PUT path=/v1/matrices/{id}") == min(want, 29) and
                            count(log, "method=POST path=/v1/matmul ") == want and
                            count(log, "method=DELETE path=/v1/matrices/{id}") == 1)

                # A request's access-log line is written once its answer has been sent, so
                # the client can be done a moment before the last lines are: wait for them
                # (up to 10 s) rather than read the log once.
                deadline = time.monotonic() + 10
                log = d.read_log()[len(before):]
                while not logged(log) and time.monotonic() < deadline:
                    time.sleep(0.02)
                    log = d.read_log()[len(before):]
                tap.ok(logged(log),
                       "%s: --streams %d: B made once and filled in %d shares, %d panels, B deleted"
                       % (dtype, n, min(want, 29), want), log[-800:])
        r = d.curl("GET", "/v1/matrices")
        tap.ok((r.json() or {}).get("count") == 0, "no resident matrix is left behind", r)

        # a product the server refuses: the error comes back, B is still deleted
        a = random_matrix(rng, (8, 5), "float64")
        b = random_matrix(rng, (5, 3), "float64")
        write(os.path.join(T, "ea.npy"), a)
        write(os.path.join(T, "eb.npy"), b)
        rc, err = gemm(["multiply", os.path.join(T, "ea.npy"), os.path.join(T, "eb.npy"), "-o",
                        os.path.join(T, "e.npy"), "--streams", "2", "--kernel", "no_such_kernel"], d.base)
        tap.ok(rc != 0 and "kernel" in err, "a refused product fails with the server's error", err)
        r = d.curl("GET", "/v1/matrices")
        tap.ok((r.json() or {}).get("count") == 0, "and leaves no resident matrix", r)
        rc, err = gemm(["multiply", os.path.join(T, "ea.npy"), os.path.join(T, "eb.npy"), "--streams", "0"], d.base)
        tap.ok(rc != 0 and "streams" in err, "--streams 0 is a usage error", err)
        d.stop_and_check()

    tokfile = os.path.join(T, "tokens")
    with open(tokfile, "w") as f:
        f.write("streams-token-1\n")
    with Daemon(tap, config={"backend": "cpu", "tokens_file": tokfile}) as d:
        a = random_matrix(rng, (20, 10), "float64")
        b = random_matrix(rng, (10, 6), "float64")
        write(os.path.join(T, "ta.npy"), a)
        write(os.path.join(T, "tb.npy"), b)
        out = os.path.join(T, "t.npy")
        rc, err = gemm(["multiply", os.path.join(T, "ta.npy"), os.path.join(T, "tb.npy"), "-o", out,
                        "--streams", "4"], d.base, token="streams-token-1")
        ok, why = compare(np.load(out), reference(a, b, "float64"), "float64", 10) if rc == 0 else (False, err)
        tap.ok(ok, "with a token: --streams 4 is right", why)
        d.stop_and_check()


if __name__ == "__main__":
    run_guarded(Tap(), main)
