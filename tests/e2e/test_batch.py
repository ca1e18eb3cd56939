#!/usr/bin/python3
"""test_batch.py - batched requests: A of shape (b, m, k) with B (b, k, n) or one (k, n)
shared by all (NumPy matmul broadcasting), as raw bodies with ?batch=b[&b_shared=1] and as
3-D .npy parts; answers of shape (b, m, n) in JSON (3-D nested), octet-stream (X-Gemm-Shape
b,m,n) and .npy (3-D), every element checked against NumPy float64 (int32: exact, wrapped),
for every dtype, odd shapes, b = 1 and a large b; the batch is reported (JSON "batched",
X-Gemm-Batched); the asynchronous /v1/jobs route carries batches too; and the limits:
mismatched batches, a 2-D A with a 3-D B, wrong lengths, b_shared without batch, batch 0,
too many products, 4-D and Fortran-order 3-D arrays - each a clear JSON error, after
which the daemon still serves.
"""
import os
import re
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (SLOW, Daemon, Tap, compare, load_npy, np_dtype, npy_bytes,  # noqa: E402
                     random_matrix, reference, run_guarded)

DTYPES = ["float32", "float64", "int32"]
# (b, m, k, n): b = 1, odd shapes, a large b of small products
SHAPES = [(1, 5, 7, 3), (3, 1, 1, 1), (4, 17, 9, 13), (2, 33, 1, 31), (500, 4, 6, 3)]
ANSWERS = {"json": "application/json", "octet": "application/octet-stream",
           "npy": "application/x-npy"}


def le(x):
    return np.ascontiguousarray(x).astype("<" + x.dtype.str[1:]).tobytes()


def send_raw(d, a, b, dtype, accept, path="/v1/matmul"):
    bs, m, k = a.shape
    n = b.shape[-1]
    q = "?m=%d&k=%d&n=%d&dtype=%s&batch=%d" % (m, k, n, dtype, bs)
    if b.ndim == 2:
        q += "&b_shared=1"
    return d.curl("POST", path + q, data=le(a) + le(b), content_type="application/octet-stream",
                  accept=accept)


def decode(r, how, dtype):
    """The answer's C as an array, or None (with the reason) when it cannot be read."""
    if r.status != 200:
        return None, "status %d: %s" % (r.status, r.body[:300])
    if how == "json":
        j = r.json() or {}
        return np.array(j.get("c")), j
    if how == "npy":
        return load_npy(r.body), r.header("X-Gemm-Shape")
    shape = tuple(int(x) for x in re.findall(r"\d+", r.header("X-Gemm-Shape") or ""))
    arr = np.frombuffer(r.body, dtype=np.dtype(np_dtype(dtype)).newbyteorder("<"))
    if arr.size != int(np.prod(shape)) if shape else True:
        return None, "X-Gemm-Shape %r does not match %d elements" % (shape, arr.size)
    return arr.reshape(shape), shape


def products(tap, d, rng):
    for dtype in DTYPES:
        for (bs, m, k, n) in SHAPES:
            for shared in (False, True):
                a = random_matrix(rng, (bs, m, k), dtype)
                b = random_matrix(rng, (k, n) if shared else (bs, k, n), dtype)
                ref = reference(a, b, dtype)  # NumPy matmul broadcasting, float64 / int64
                for inp in ("raw", "npy"):
                    for how, accept in ANSWERS.items():
                        if inp == "raw":
                            r = send_raw(d, a, b, dtype, accept)
                        else:
                            r = d.matmul_npy(npy_bytes(a), npy_bytes(b), accept=accept)
                        name = "%s b=%d %dx%dx%d%s %s -> %s" % (dtype, bs, m, k, n,
                                                               " shared B" if shared else "",
                                                               inp, how)
                        c, info = decode(r, how, dtype)
                        if c is None:
                            tap.ok(False, name, info)
                            continue
                        ok, why = compare(c, ref, dtype, k)
                        tap.ok(ok, name + ": every element right, shape (b, m, n)", why or None)
                        if how == "json" and bs == SHAPES[-1][0] and inp == "raw":
                            bt = info.get("batched") or {}
                            tap.ok(info.get("shape") == [bs, m, n] and bt.get("products") == bs
                                   and bt.get("mode") in ("loop", "strided"),
                                   name + ": shape and batched reported", info.get("batched"))
                        if how == "octet" and bs > 1 and inp == "npy":
                            tap.ok((r.header("X-Gemm-Batched") or "").split(" ")[0] == str(bs),
                                   name + ": X-Gemm-Batched names the batch",
                                   r.header("X-Gemm-Batched"))


def async_job(tap, d, rng):
    a = random_matrix(rng, (7, 6, 5), "float64")
    b = random_matrix(rng, (5, 4), "float64")
    r = send_raw(d, a, b, "float64", None, path="/v1/jobs")
    jid = (r.json() or {}).get("id")
    tap.ok(r.status == 202 and jid, "batched raw job accepted by /v1/jobs", r)
    if not jid:
        return
    deadline = time.monotonic() + 30 * SLOW
    while time.monotonic() < deadline:
        s = d.curl("GET", "/v1/jobs/" + jid)
        if (s.json() or {}).get("state") in ("done", "failed", "cancelled"):
            break
        time.sleep(0.05)
    r = d.curl("GET", "/v1/jobs/%s/result" % jid, accept="application/x-npy")
    c, info = decode(r, "npy", "float64")
    ok, why = (False, info) if c is None else compare(c, reference(a, b, "float64"), "float64", 5)
    tap.ok(ok, "batched job result as 3-D .npy, every element right", why or None)
    r = d.curl("GET", "/v1/jobs/%s/result" % jid)
    c, info = decode(r, "octet", "float64")
    ok, why = (False, info) if c is None else compare(c, reference(a, b, "float64"), "float64", 5)
    tap.ok(ok, "batched job result as raw with X-Gemm-Shape b,m,n", why or None)


def expect_error(tap, r, status, code, name):
    got, _ = r.error()
    tap.ok(r.status == status and got == code, "%s: %d %s" % (name, status, code), r)


def errors(tap, d, rng):
    a3 = random_matrix(rng, (3, 4, 5), "float32")
    b4 = random_matrix(rng, (4, 5, 2), "float32")
    expect_error(tap, d.matmul_npy(npy_bytes(a3), npy_bytes(b4)), 422, "batch_mismatch",
                 "A with 3 matrices, B with 4")
    a2 = random_matrix(rng, (4, 5), "float32")
    expect_error(tap, d.matmul_npy(npy_bytes(a2), npy_bytes(random_matrix(rng, (3, 5, 2), "float32"))),
                 422, "batch_mismatch", "2-D A with a 3-D B")
    expect_error(tap, d.matmul_npy(npy_bytes(a3), npy_bytes(random_matrix(rng, (3, 4, 2), "float32"))),
                 422, "shape_mismatch", "3-D inner dimensions differ")
    expect_error(tap, d.matmul_npy(npy_bytes(np.zeros((2, 2, 2, 2), np.float32)), npy_bytes(a2)),
                 422, "bad_shape", "4-D .npy refused")
    expect_error(tap, d.matmul_npy(npy_bytes(a3, fortran=True), npy_bytes(random_matrix(rng, (5, 2), "float32"))),
                 422, "bad_shape", "Fortran-order 3-D .npy refused")
    body = le(a3) + le(random_matrix(rng, (5, 2), "float32"))
    r = d.curl("POST", "/v1/matmul?m=4&k=5&n=2&dtype=float32&batch=3", data=body,
               content_type="application/octet-stream")
    expect_error(tap, r, 400, "length_mismatch", "raw batch with a shared-size B but no b_shared")
    r = d.curl("POST", "/v1/matmul?m=4&k=5&n=2&dtype=float32&b_shared=1", data=body,
               content_type="application/octet-stream")
    expect_error(tap, r, 400, "missing_dimension", "b_shared without batch")
    r = d.curl("POST", "/v1/matmul?m=4&k=5&n=2&dtype=float32&batch=0", data=body,
               content_type="application/octet-stream")
    expect_error(tap, r, 400, "bad_dimension", "batch=0")
    r = d.curl("POST", "/v1/matmul?m=4&k=5&n=2&dtype=float32&batch=2000000&b_shared=1", data=body,
               content_type="application/octet-stream")
    expect_error(tap, r, 413, "too_large", "more products than one request may carry")
    # each matrix within max_elements (1000 here), the stack not: refused before the body
    r = d.curl("POST", "/v1/matmul?m=20&k=20&n=20&dtype=float32&batch=100", data=b"\0" * 16,
               content_type="application/octet-stream")
    expect_error(tap, r, 413, "too_large", "stack over max_elements")
    r = d.curl("POST", "/v1/matmul?m=4&k=5&n=2&dtype=float32&batch=18446744073709551615", data=body,
               content_type="application/octet-stream")
    expect_error(tap, r, 413, "too_large", "batch of 2^64-1")
    a = random_matrix(rng, (2, 3, 4), "int32")
    b = random_matrix(rng, (4, 5), "int32")
    r = send_raw(d, a, b, "int32", "application/x-npy")
    ok, why = (False, r.body[:200]) if r.status != 200 else compare(load_npy(r.body), reference(a, b, "int32"),
                                                                      "int32", 4)
    tap.ok(ok, "the daemon still serves batched products after the errors", why or None)


def cli(tap, d, rng):
    """gemm multiply with 3-D .npy (through libgemm's gemm_client_multiply_batch)."""
    gemm_bin = os.environ.get("GEMM_BIN", "bin/gemm")
    if not os.path.isabs(gemm_bin):
        gemm_bin = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                gemm_bin)
    t = d.tmp.name
    for dtype in DTYPES:
        for shared in (False, True):
            a = random_matrix(rng, (6, 7, 5), dtype)
            b = random_matrix(rng, (5, 3) if shared else (6, 5, 3), dtype)
            pa, pb, pc = (os.path.join(t, x) for x in ("cA.npy", "cB.npy", "cC.npy"))
            open(pa, "wb").write(npy_bytes(a))
            open(pb, "wb").write(npy_bytes(b))
            p = subprocess.run([gemm_bin, "--server", d.base, "multiply", pa, pb, "-o", pc],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60 * SLOW)
            if p.returncode != 0:
                tap.ok(False, "gemm multiply 3-D %s%s" % (dtype, " shared B" if shared else ""), p.stderr)
                continue
            ok, why = compare(np.load(pc), reference(a, b, dtype), dtype, 5)
            tap.ok(ok, "gemm multiply 3-D .npy %s%s: C (6, 7, 3) right" % (dtype, " shared B" if shared else ""),
                   why or None)
    open(pb, "wb").write(npy_bytes(random_matrix(rng, (4, 5, 3), "float64")))
    open(pa, "wb").write(npy_bytes(random_matrix(rng, (6, 7, 5), "float64")))
    p = subprocess.run([gemm_bin, "--server", d.base, "multiply", pa, pb, "-o", pc],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60 * SLOW)
    tap.ok(p.returncode != 0 and b"as many" in p.stderr, "gemm multiply refuses 6 As with 4 Bs", p.stderr)
    open(pb, "wb").write(npy_bytes(random_matrix(rng, (5, 3), "float64")))
    p = subprocess.run([gemm_bin, "--server", d.base, "multiply", pa, pb, "-o", os.path.join(t, "c.csv")],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60 * SLOW)
    tap.ok(p.returncode != 0 and b"not text" in p.stderr, "gemm multiply writes a batch only as .npy or raw",
           p.stderr)


def main(tap):
    rng = np.random.default_rng(20261123)
    with Daemon(tap, config={"backend": "cpu"}) as d:
        products(tap, d, rng)
        async_job(tap, d, rng)
        cli(tap, d, rng)
    with Daemon(tap, config={"backend": "cpu", "max_elements": 4000}) as d:
        errors(tap, d, rng)


if __name__ == "__main__":
    run_guarded(Tap(), main)
