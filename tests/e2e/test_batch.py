#!/usr/bin/python3
"""test_batch.py - batched requests: A of shape (b, m, k) with B (b, k, n) or one (k, n)
shared by all (NumPy matmul broadcasting), as raw bodies with ?batch=b[&b_shared=1], as
3-D .npy parts and as JSON (3-D nested arrays or {"shape": [b, m, k], "data": [..]});
answers of shape (b, m, n) in JSON (3-D nested), octet-stream (X-Gemm-Shape b,m,n) and .npy
(3-D), every element checked against NumPy float64 (int32: exact, wrapped), for every
dtype, odd shapes, b = 1 and a large b; the batch is reported (JSON "batched",
X-Gemm-Batched); the asynchronous /v1/jobs route carries batches too; and the limits:
mismatched batches, a 2-D A with a 3-D B, wrong lengths, b_shared without batch, batch 0,
too many products, 4-D and Fortran-order 3-D arrays, and for JSON ragged and empty
batches, stacks over max_elements or the memory budget, resident operands - each a clear
JSON error, after which the daemon still serves.
"""
import json
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


def json_operand(x, form):
    """An operand as JSON: nested arrays, or {"shape", "data"} (shape first or last)."""
    if form == "nested":
        return x.tolist()
    if form == "shape first":
        return {"shape": list(x.shape), "data": x.ravel().tolist()}
    return {"data": x.ravel().tolist(), "shape": list(x.shape)}


def send_json(d, a, b, dtype, accept=None, path="/v1/matmul", forms=("nested", "nested"), **extra):
    doc = {"a": json_operand(a, forms[0]), "b": json_operand(b, forms[1]), "dtype": dtype}
    doc.update(extra)
    return d.curl("POST", path, data=json.dumps(doc).encode(), content_type="application/json", accept=accept)


FORMS = ["nested", "shape first", "shape last"]
# JSON: the raw shapes and a larger b of tiny products
JSON_SHAPES = SHAPES + [(2000, 2, 3, 2)]


def json_products(tap, d, rng):
    i = 0
    for dtype in DTYPES:
        for (bs, m, k, n) in JSON_SHAPES:
            for shared in (False, True):
                a = random_matrix(rng, (bs, m, k), dtype)
                b = random_matrix(rng, (k, n) if shared else (bs, k, n), dtype)
                ref = reference(a, b, dtype)
                for how, accept in ANSWERS.items():
                    forms = (FORMS[i % 3], FORMS[(i // 3) % 3])
                    i += 1
                    r = send_json(d, a, b, dtype, accept, forms=forms)
                    name = "JSON %s b=%d %dx%dx%d%s (%s, %s) -> %s" % (dtype, bs, m, k, n,
                                                                     " shared B" if shared else "",
                                                                     forms[0], forms[1], how)
                    c, info = decode(r, how, dtype)
                    if c is None:
                        tap.ok(False, name, info)
                        continue
                    ok, why = compare(c, ref, dtype, k)
                    tap.ok(ok, name + ": every element right, shape (b, m, n)", why or None)
                    # a batch of one is one product: 3-D, but not reported as batched
                    if how == "json":
                        bt = info.get("batched") or {}
                        tap.ok(info.get("shape") == [bs, m, n] and info.get("dtype") == dtype and
                               (bs == 1 or (bt.get("products") == bs and bt.get("mode") in ("loop", "strided"))),
                               name + ": \"shape\" [b, m, n]" + (" and \"batched\"" if bs > 1 else ""),
                               {"shape": info.get("shape"), "batched": info.get("batched")})
                    elif how == "octet":
                        tap.ok(r.header("X-Gemm-Shape") == "%d,%d,%d" % (bs, m, n) and
                               (bs == 1 or (r.header("X-Gemm-Batched") or "").split(" ")[0] == str(bs)),
                               name + ": X-Gemm-Shape b,m,n" + (" and X-Gemm-Batched" if bs > 1 else ""),
                               (r.header("X-Gemm-Shape"), r.header("X-Gemm-Batched")))
    # int32 products that wrap around (two's complement), as the raw path computes them
    a = rng.integers(-2**31, 2**31, size=(9, 3, 5), dtype=np.int64).astype(np.int32)
    b = rng.integers(-2**31, 2**31, size=(5, 4), dtype=np.int64).astype(np.int32)
    r = send_json(d, a, b, "int32", "application/json")
    c, info = decode(r, "json", "int32")
    ok, why = (False, info) if c is None else compare(c, reference(a, b, "int32"), "int32", 5)
    tap.ok(ok, "JSON int32 batch whose sums overflow: wrapped exactly as NumPy's int64 sums mod 2^32", why or None)
    # a batch of one, and dtype from the query when the body names none
    a = random_matrix(rng, (1, 6, 4), "float32")
    b = random_matrix(rng, (1, 4, 7), "float32")
    doc = {"a": a.tolist(), "b": b.tolist()}
    r = d.curl("POST", "/v1/matmul?dtype=float32", data=json.dumps(doc).encode(), content_type="application/json")
    c, info = decode(r, "json", "float32")
    ok, why = (False, info) if c is None else compare(c, reference(a, b, "float32"), "float32", 4)
    tap.ok(ok and info.get("shape") == [1, 6, 7] and info.get("dtype") == "float32",
           "JSON (1, m, k) with (1, k, n), dtype in the query: C (1, m, n)", why or info)


def json_job(tap, d, rng):
    """A batched JSON body on POST /v1/jobs; its result as JSON (3-D) and as .npy."""
    a = random_matrix(rng, (5, 3, 4), "float64")
    b = random_matrix(rng, (5, 4, 2), "float64")
    r = send_json(d, a, b, "float64", path="/v1/jobs", forms=("shape first", "nested"))
    jid = (r.json() or {}).get("id")
    tap.ok(r.status == 202 and jid, "batched JSON job accepted by /v1/jobs", r)
    if not jid:
        return
    deadline = time.monotonic() + 30 * SLOW
    while time.monotonic() < deadline:
        s = d.curl("GET", "/v1/jobs/" + jid)
        if (s.json() or {}).get("state") in ("done", "failed", "cancelled"):
            break
        time.sleep(0.05)
    ref = reference(a, b, "float64")
    r = d.curl("GET", "/v1/jobs/%s/result" % jid, accept="application/json")
    c, info = decode(r, "json", "float64")
    ok, why = (False, info) if c is None else compare(c, ref, "float64", 4)
    tap.ok(ok and info.get("shape") == [5, 3, 2], "batched JSON job result as JSON, 3-D, every element right",
           why or None)
    r = d.curl("GET", "/v1/jobs/%s/result" % jid, accept="application/x-npy")
    c, info = decode(r, "npy", "float64")
    ok, why = (False, info) if c is None else compare(c, ref, "float64", 4)
    tap.ok(ok, "batched JSON job result as 3-D .npy", why or None)


def json_errors(tap, d, rng):
    """Daemon with max_elements 4000."""
    def post(doc, query=""):
        return d.curl("POST", "/v1/matmul" + query, data=json.dumps(doc).encode(), content_type="application/json")

    expect_error(tap, post({"a": [[[1, 2]], [[3]]], "b": [[1], [2]]}), 400, "bad_matrix", "JSON ragged row in a batch")
    expect_error(tap, post({"a": [[[1], [2]], [[3]]], "b": [[1]]}), 400, "bad_matrix",
                 "JSON batch whose matrices have different row counts")
    expect_error(tap, post({"a": [[[[1]]]], "b": [[1]]}), 400, "bad_matrix", "JSON 4-D array")
    expect_error(tap, post({"a": [[[1]], 2], "b": [[1]]}), 400, "bad_matrix", "JSON batch with a number for a matrix")
    expect_error(tap, post({"a": {"shape": [2, 2, 2], "data": [1, 2, 3]}, "b": [[1], [2]]}), 400, "bad_matrix",
                 "JSON data shorter than its 3-D shape")
    a3 = random_matrix(rng, (3, 4, 5), "float32")
    expect_error(tap, post({"a": a3.tolist(), "b": random_matrix(rng, (4, 5, 2), "float32").tolist()}), 422,
                 "batch_mismatch", "JSON A with 3 matrices, B with 4")
    expect_error(tap, post({"a": random_matrix(rng, (4, 5), "float32").tolist(),
                            "b": random_matrix(rng, (3, 5, 2), "float32").tolist()}),
                 422, "batch_mismatch", "JSON 2-D A with a 3-D B (A is not broadcast)")
    expect_error(tap, post({"a": a3.tolist(), "b": random_matrix(rng, (3, 4, 2), "float32").tolist()}), 422,
                 "shape_mismatch", "JSON 3-D inner dimensions differ")
    expect_error(tap, post({"a": a3.tolist(), "b": random_matrix(rng, (6, 2), "float32").tolist()}), 422,
                 "shape_mismatch", "JSON 3-D A with a shared B of the wrong rows")
    expect_error(tap, post({"a": {"shape": [0, 2, 2], "data": []}, "b": [[1, 2], [3, 4]]}), 422, "bad_batch",
                 "JSON empty batch")
    expect_error(tap, post({"a": [[[]]], "b": [[1]]}), 422, "empty_matrix", "JSON batch of empty matrices")
    # each matrix within max_elements (4000), the stack not: 100 x 20 x 20
    big = np.ones((100, 20, 20), np.float32)
    expect_error(tap, post({"a": big.tolist(), "b": np.ones((20, 1)).tolist()}), 413, "too_large",
                 "JSON stack over max_elements")
    expect_error(tap, post({"a": [[[1]]] * 3, "b": {"shape": [3, 1, 1], "data": [1, 2, 3]},
                            "tile": 0}), 422, "bad_option", "JSON batch with a bad option")
    expect_error(tap, post({"a": {"shape": [1000001, 1, 1], "data": []}, "b": [[1]]}), 413, "too_large",
                 "JSON batch of more products than one request may carry")
    # C's stack counts too: 201 products of 1x2 by one 2x20 make A 402 elements, C 4020
    r = post({"a": np.ones((201, 1, 2)).tolist(), "b": np.ones((2, 20)).tolist()})
    expect_error(tap, r, 413, "too_large", "JSON batch whose C stack is over max_elements")
    tap.ok("C is 201x1x20" in (r.error()[1] or ""), "the message names C's stack", r)
    # resident operands: refused with a batch, in the body or in the query
    r = d.curl("POST", "/v1/matrices", data=json.dumps([[1.0, 2.0], [3.0, 4.0]]).encode(),
               content_type="application/json")
    mid = (r.json() or {}).get("id")
    tap.ok(r.status == 201 and mid, "a resident matrix to name", r)
    if mid:
        expect_error(tap, post({"a": [[[1, 2]], [[3, 4]]], "b": {"ref": mid}}), 400, "bad_option",
                     "JSON 3-D A with {\"ref\": ID} for B")
        expect_error(tap, post({"a": [[[1, 2]], [[3, 4]]]}, "?b=" + mid), 400, "bad_option",
                     "JSON 3-D A with b=ID in the query")
        expect_error(tap, post({"a": {"ref": mid}, "b": {"shape": [2, 2, 2], "data": [1] * 8}}), 400, "bad_option",
                     "JSON {\"ref\": ID} for A with a 3-D B")
    a = random_matrix(rng, (3, 2, 5), "float64")
    b = random_matrix(rng, (3, 5, 4), "float64")
    r = send_json(d, a, b, "float64", "application/json")
    c, info = decode(r, "json", "float64")
    ok, why = (False, info) if c is None else compare(c, reference(a, b, "float64"), "float64", 5)
    tap.ok(ok, "the daemon still serves batched JSON products after the errors", why or None)


def json_budget(tap, d, rng):
    """Daemon with max_inflight_mb 16: a stack the budget cannot hold is refused while it is
    decoded, as a 2-D matrix of that size is."""
    body = b'{"a": {"shape": [3, 1000, 1000], "data": [' + b",".join([b"1"] * 3000000) + b']}, "b": [[1]]}'
    r = d.curl("POST", "/v1/matmul", data=body, content_type="application/json")
    expect_error(tap, r, 503, "over_budget", "JSON 3-D stack of 23 MiB against a 16 MiB budget")
    a = random_matrix(rng, (4, 3, 3), "float32")
    b = random_matrix(rng, (3, 3), "float32")
    r = send_json(d, a, b, "float32", "application/x-npy")
    c, info = decode(r, "npy", "float32")
    ok, why = (False, info) if c is None else compare(c, reference(a, b, "float32"), "float32", 3)
    tap.ok(ok, "the budget is whole again: a batched JSON product after the refusal", why or None)


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
        json_products(tap, d, rng)
        async_job(tap, d, rng)
        json_job(tap, d, rng)
        cli(tap, d, rng)
    with Daemon(tap, config={"backend": "cpu", "max_elements": 4000}) as d:
        errors(tap, d, rng)
        json_errors(tap, d, rng)
    with Daemon(tap, config={"backend": "cpu", "max_inflight_mb": 16}) as d:
        json_budget(tap, d, rng)


if __name__ == "__main__":
    run_guarded(Tap(), main)
