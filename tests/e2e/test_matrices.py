#!/usr/bin/python3
"""test_matrices.py - resident matrices (/v1/matrices) and products that name them.

Lifecycle: a matrix is created in every input format (raw with rows/cols/dtype, a bare
.npy body, a one-part form, JSON flat and nested), downloaded in every answer format and
compared with what was sent, listed (most recently used first) and deleted. Products take
A and/or B by id in the query (raw, JSON, multipart), as {"ref": ID} in JSON and as a form
field in multipart; ?store=1 keeps C resident, so a chain of four products runs without C
ever leaving the server, checked against a float64 NumPy reference. Missing, deleted and
other tokens' ids are 404 matrix_not_found; shape and dtype mismatches 422; the resident_mb
budget answers 507 insufficient_storage and frees its bytes on DELETE; /metrics shows the
bytes held.

Filled in parts: a matrix made with empty=1 takes PUTs of row ranges (several at once, over
separate connections), is refused to products and downloads (409 matrix_incomplete) until
its last row is in, then reads back as sent and serves a product; a row written twice, a
range outside the matrix, a body that is not whole rows, a PUT after completion and
another token's PUT are refused; a PUT whose body stops short frees its rows for another.
"""
import threading
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Daemon, Tap, raw_request, compare, load_npy, metric, npy_bytes, random_matrix, reference, run_guarded  # noqa: E402

RAW = "application/octet-stream"
NPY = "application/x-npy"


def create_raw(d, arr, headers=None):
    dt = {"float32": "float32", "float64": "float64", "int32": "int32"}[str(arr.dtype)]
    q = "/v1/matrices?rows=%d&cols=%d&dtype=%s" % (arr.shape[0], arr.shape[1], dt)
    return d.curl("POST", q, data=np.ascontiguousarray(arr).tobytes(), content_type=RAW, headers=headers)


def mid(r):
    return (r.json() or {}).get("id") if r.status == 201 else None


def download(d, id_, accept, headers=None):
    return d.curl("GET", "/v1/matrices/" + id_, accept=accept, headers=headers)


def as_array(r, accept, dtype, shape):
    if accept == RAW:
        return np.frombuffer(r.body, dtype=np.dtype(dtype).newbyteorder("<")).reshape(shape)
    if accept == NPY:
        return load_npy(r.body)
    j = r.json() or {}
    return np.asarray(j.get("data"), dtype=np.float64)


def lifecycle(tap, d, rng):
    a = random_matrix(rng, (5, 7), "float32")
    tmp = d.tmp.name
    made = {}
    r = create_raw(d, a)
    tap.ok(r.status == 201 and mid(r) and r.header("location") == "/v1/matrices/" + mid(r),
           "create raw: 201 with id and Location", r)
    j = r.json() or {}
    tap.ok(j.get("shape") == [5, 7] and j.get("dtype") == "float32" and j.get("bytes") == 140,
           "create raw: shape, dtype and bytes described", r)
    made["raw"] = (mid(r), a)

    b = random_matrix(rng, (4, 3), "float64")
    r = d.curl("POST", "/v1/matrices", data=npy_bytes(b), content_type=NPY)
    tap.ok(r.status == 201 and (r.json() or {}).get("dtype") == "float64", "create from a bare .npy body", r)
    made["npy"] = (mid(r), b)

    c = random_matrix(rng, (3, 6), "int32")
    p = os.path.join(tmp, "m.npy")
    with open(p, "wb") as f:
        f.write(npy_bytes(c))
    r = d.curl("POST", "/v1/matrices", form=["matrix=@" + p])
    tap.ok(r.status == 201 and (r.json() or {}).get("shape") == [3, 6], "create from a one-part form", r)
    made["form"] = (mid(r), c)

    e = random_matrix(rng, (2, 3), "float64")
    body = {"shape": [2, 3], "data": e.ravel().tolist(), "dtype": "float64"}
    r = d.curl("POST", "/v1/matrices", data=json.dumps(body).encode(), content_type="application/json")
    tap.ok(r.status == 201 and (r.json() or {}).get("shape") == [2, 3], "create from JSON shape/data", r)
    made["json_flat"] = (mid(r), e)

    f_ = random_matrix(rng, (3, 2), "float32")
    r = d.curl("POST", "/v1/matrices", data=json.dumps({"data": f_.tolist(), "dtype": "float32"}).encode(),
               content_type="application/json")
    tap.ok(r.status == 201 and (r.json() or {}).get("dtype") == "float32", "create from JSON nested data", r)
    made["json_nested"] = (mid(r), f_)
    r = d.curl("POST", "/v1/matrices", data=json.dumps(e.tolist()).encode(), content_type="application/json")
    tap.ok(r.status == 201 and (r.json() or {}).get("dtype") == "float64", "create from a bare JSON array", r)
    made["json_bare"] = (mid(r), e)

    for what, (id_, arr) in made.items():
        if not id_:
            tap.ok(False, "%s: no id to download" % what)
            continue
        for accept in (RAW, NPY, "application/json"):
            r = download(d, id_, accept)
            got = as_array(r, accept, arr.dtype, arr.shape) if r.status == 200 else None
            same = got is not None and got.shape == arr.shape and np.array_equal(got.astype(arr.dtype), arr)
            tap.ok(r.status == 200 and same, "%s: download as %s is what was sent" % (what, accept), r)

    r = d.curl("GET", "/v1/matrices")
    lst = (r.json() or {}).get("matrices", [])
    ids = [m.get("id") for m in lst]
    tap.ok(r.status == 200 and set(ids) == {v[0] for v in made.values()} and
           all(m.get("where") == "host" for m in lst), "list: every matrix, with where", r)
    # The last download was of json_bare: it is the most recently used.
    tap.ok(ids and ids[0] == made["json_bare"][0], "list: most recently used first", ids)
    r = download(d, made["raw"][0], RAW)
    ids = [m.get("id") for m in (d.curl("GET", "/v1/matrices").json() or {}).get("matrices", [])]
    tap.ok(ids and ids[0] == made["raw"][0] and ids[-1] != made["raw"][0],
           "list: a download moves a matrix to the front (LRU order)", ids)

    for what, (id_, _) in made.items():
        if what == "raw":
            continue
        r = d.curl("DELETE", "/v1/matrices/" + id_)
        tap.ok(r.status == 204, "%s: DELETE 204" % what, r)
        r = download(d, id_, RAW)
        tap.ok(r.status == 404 and r.error()[0] == "matrix_not_found", "%s: gone after DELETE" % what, r)
    r = d.curl("DELETE", "/v1/matrices/" + made["raw"][0])
    tap.ok(r.status == 204, "raw: DELETE 204", r)
    r = d.curl("DELETE", "/v1/matrices/" + made["raw"][0])
    tap.ok(r.status == 404, "a second DELETE: 404", r)
    r = d.curl("GET", "/v1/matrices/nothex")
    tap.ok(r.status == 404 and r.error()[0] == "matrix_not_found", "a malformed id: 404 matrix_not_found", r)
    r = d.curl("PATCH", "/v1/matrices/" + "0" * 32)
    tap.ok(r.status == 405 and "PUT" in (r.header("allow") or ""), "PATCH on a matrix: 405, Allow names PUT", r)
    r = d.curl("PUT", "/v1/matrices/" + "0" * 32 + "?row=0", data=b"\0" * 8, content_type=RAW)
    tap.ok(r.status == 404 and r.error()[0] == "matrix_not_found", "PUT rows of an unknown matrix: 404", r)

    # bad uploads
    r = d.curl("POST", "/v1/matrices?rows=2&cols=2&dtype=float32", data=b"\0" * 12, content_type=RAW)
    tap.ok(r.status == 400 and r.error()[0] == "length_mismatch", "raw upload of the wrong length: 400", r)
    r = d.curl("POST", "/v1/matrices?dtype=float32", data=b"\0" * 16, content_type=RAW)
    tap.ok(r.status == 400 and r.error()[0] == "missing_dimension", "raw upload without rows/cols: 400", r)
    r = d.curl("POST", "/v1/matrices", data=b"\x93NUMPY garbage", content_type=NPY)
    tap.ok(r.status == 400, "a broken .npy body: 400", r)
    r = d.curl("POST", "/v1/matrices", data=json.dumps({"shape": [2, 2], "data": [1, 2, 3]}).encode(),
               content_type="application/json")
    tap.ok(r.status == 400 and r.error()[0] == "bad_matrix", "JSON data of the wrong length: 400", r)
    r = d.curl("POST", "/v1/matrices", data=npy_bytes(np.zeros((2, 3, 4))), content_type=NPY)
    tap.ok(r.status == 422 and r.error()[0] == "bad_shape", "a 3-D .npy upload: 422 bad_shape", r)
    two = mid(create_raw(d, np.zeros((2, 2), dtype=np.float32)))
    r = d.curl("POST", "/v1/matmul?b=%s&batch=2&m=2&k=2&n=2" % two, data=b"\0" * 32, content_type=RAW)
    tap.ok(r.status == 400 and r.error()[0] == "bad_option", "a batched request naming a resident operand: 400", r)
    d.curl("DELETE", "/v1/matrices/%s" % two)
    r = d.curl("POST", "/v1/matrices", data=b"x", content_type="text/plain")
    tap.ok(r.status == 415, "text/plain upload: 415", r)
    r = d.curl("GET", "/v1/matrices")
    tap.ok((r.json() or {}).get("count") == 0, "no failed upload left a matrix behind", r)


def products(tap, d, rng):
    m, k, n = 6, 5, 4
    a = random_matrix(rng, (m, k), "float64")
    b = random_matrix(rng, (k, n), "float64")
    ref = reference(a, b, "float64")
    ida, idb = mid(create_raw(d, a)), mid(create_raw(d, b))
    tap.ok(ida and idb, "A and B uploaded")
    if not (ida and idb):
        return

    def check(r, name, accept=RAW):
        if r.status != 200:
            tap.ok(False, name, r)
            return
        if accept == RAW:
            c = np.frombuffer(r.body, dtype="<f8").reshape(m, n)
        else:
            c = np.asarray((r.json() or {}).get("c"))
        ok, why = compare(c, ref, "float64", k)
        tap.ok(ok, name, why)

    check(d.curl("POST", "/v1/matmul?a=%s&b=%s" % (ida, idb), accept=RAW), "raw: both by reference, no body")
    check(d.curl("POST", "/v1/matmul?a=%s&n=%d" % (ida, n), data=b.tobytes(), content_type=RAW, accept=RAW),
          "raw: A by reference, B in the body")
    check(d.curl("POST", "/v1/matmul?b=%s&m=%d" % (idb, m), data=a.tobytes(), content_type=RAW, accept=RAW),
          "raw: B by reference, A in the body")
    body = {"a": {"ref": ida}, "b": b.tolist()}
    check(d.curl("POST", "/v1/matmul", data=json.dumps(body).encode(), content_type="application/json",
                 accept="application/json"), "JSON: {\"ref\": id} for A", accept="application/json")
    body = {"a": a.tolist()}
    check(d.curl("POST", "/v1/matmul?b=" + idb, data=json.dumps(body).encode(), content_type="application/json",
                 accept="application/json"), "JSON: B named in the query", accept="application/json")
    pa = os.path.join(d.tmp.name, "a.npy")
    with open(pa, "wb") as f:
        f.write(npy_bytes(a))
    check(d.curl("POST", "/v1/matmul", form=["a=@" + pa, "b=" + idb], accept=RAW),
          "multipart: B as a form field holding its id")
    check(d.curl("POST", "/v1/matmul?a=" + ida, form=["b=" + idb], accept=RAW),
          "multipart: A in the query, B as a form field")

    # async jobs take references too (they copy the operands)
    r = d.curl("POST", "/v1/jobs?a=%s&b=%s" % (ida, idb))
    jid = (r.json() or {}).get("id")
    tap.ok(r.status == 202 and jid, "async job with both operands by reference: 202", r)
    if jid:
        import time
        for _ in range(200):
            s = d.curl("GET", "/v1/jobs/" + jid).json() or {}
            if s.get("state") in ("done", "failed", "cancelled"):
                break
            time.sleep(0.05)
        check(d.curl("GET", "/v1/jobs/%s/result" % jid, accept=RAW), "async job result by reference")

    # errors
    r = d.curl("POST", "/v1/matmul?a=%s&b=%s" % ("f" * 32, idb))
    tap.ok(r.status == 404 and r.error()[0] == "matrix_not_found", "unknown id: 404 matrix_not_found", r)
    r = d.curl("POST", "/v1/matmul?a=%s&b=%s" % (idb, idb))
    tap.ok(r.status == 422 and r.error()[0] == "shape_mismatch", "B.B with 5x4 . 5x4: 422 shape_mismatch", r)
    r = d.curl("POST", "/v1/matmul?a=%s&n=%d&dtype=float32" % (ida, n), data=b.astype("<f4").tobytes(),
               content_type=RAW)
    tap.ok(r.status == 422 and r.error()[0] == "dtype_mismatch", "float32 B with a float64 resident A: 422", r)
    r = d.curl("POST", "/v1/matmul", data=json.dumps({"a": {"ref": "nope"}, "b": b.tolist()}).encode(),
               content_type="application/json")
    tap.ok(r.status == 404 and r.error()[0] == "matrix_not_found", "JSON ref to an unknown id: 404", r)
    r = d.curl("POST", "/v1/matmul?a=%s&n=%d" % (ida, n), data=b.tobytes()[:-8], content_type=RAW)
    tap.ok(r.status == 400 and r.error()[0] == "length_mismatch", "raw B of the wrong length: 400", r)

    # a deleted operand
    idt = mid(create_raw(d, a))
    d.curl("DELETE", "/v1/matrices/" + idt)
    r = d.curl("POST", "/v1/matmul?a=%s&b=%s" % (idt, idb))
    tap.ok(r.status == 404 and r.error()[0] == "matrix_not_found", "a deleted operand: 404 matrix_not_found", r)

    # store=1, and store=1&return=1
    r = d.curl("POST", "/v1/matmul?a=%s&b=%s&store=1" % (ida, idb))
    j = r.json() or {}
    tap.ok(r.status == 201 and j.get("shape") == [m, n] and r.header("location") == "/v1/matrices/%s" % j.get("id"),
           "store=1: 201 with C's id and Location, no data", r)
    if j.get("id"):
        check(download(d, j["id"], RAW), "store=1: the stored C downloads right")
    r = d.curl("POST", "/v1/matmul?a=%s&b=%s&store=1&return=1" % (ida, idb), accept=RAW)
    cid = r.header("x-gemm-matrix")
    tap.ok(r.status == 201 and cid and r.header("location") == "/v1/matrices/%s" % cid,
           "store=1&return=1: 201 with X-Gemm-Matrix and Location", r)
    if r.status == 201:
        r.status = 200
        check(r, "store=1&return=1: C in the body")
    r = d.curl("POST", "/v1/matmul?a=%s&b=%s&return=1" % (ida, idb))
    tap.ok(r.status == 400, "return=1 without store=1: 400", r)
    for x in (ida, idb, j.get("id"), cid):
        d.curl("DELETE", "/v1/matrices/" + x)


def chain(tap, d, rng):
    """D = ((A.B).C).E, each product by reference with store=1, against float64 NumPy."""
    size = 48
    mats = [random_matrix(rng, (size, size), "float64") for _ in range(5)]
    ids = [mid(create_raw(d, x)) for x in mats]
    tap.ok(all(ids), "five 48x48 operands uploaded")
    if not all(ids):
        return
    cur = ids[0]
    for i in range(1, 5):
        r = d.curl("POST", "/v1/matmul?a=%s&b=%s&store=1" % (cur, ids[i]))
        cur = mid(r)
        if not cur:
            tap.ok(False, "chain step %d" % i, r)
            return
    r = download(d, cur, NPY)
    ref = mats[0].astype(np.float64)
    for x in mats[1:]:
        ref = ref @ x
    got = load_npy(r.body) if r.status == 200 else None
    ok, why = compare(got, ref, "float64", size * 4) if got is not None else (False, "no answer")
    tap.ok(ok, "a chain of four stored products equals the float64 reference", why)
    lst = (d.curl("GET", "/v1/matrices").json() or {})
    tap.ok(lst.get("count") == 9, "the chain kept 5 operands and 4 intermediates", lst.get("count"))
    for m in lst.get("matrices", []):
        d.curl("DELETE", "/v1/matrices/" + m["id"])


def put_rows(d, id_, row0, arr, headers=None):
    return d.curl("PUT", "/v1/matrices/%s?row=%d" % (id_, row0), data=np.ascontiguousarray(arr).tobytes(),
                  content_type=RAW, headers=headers)


def filled_in_parts(tap, d, rng):
    b = random_matrix(rng, (37, 11), "float32")
    r = d.curl("POST", "/v1/matrices?rows=37&cols=11&dtype=float32&empty=1")
    j = r.json() or {}
    tap.ok(r.status == 201 and j.get("state") == "filling" and j.get("rows_filled") == 0 and j.get("bytes") == 37 * 44,
           "empty=1: 201, state filling, no rows yet", r)
    id_ = mid(r)
    a = random_matrix(rng, (5, 37), "float32")
    r = d.curl("POST", "/v1/matmul?m=5&k=37&n=11&dtype=float32&b=%s" % id_, data=a.tobytes(), content_type=RAW)
    tap.ok(r.status == 409 and r.error()[0] == "matrix_incomplete", "a product on a filling matrix: 409", r)
    r = download(d, id_, RAW)
    tap.ok(r.status == 409 and r.error()[0] == "matrix_incomplete", "a download of a filling matrix: 409", r)
    r = put_rows(d, id_, 30, b[30:37])
    j = r.json() or {}
    tap.ok(r.status == 200 and j.get("rows_filled") == 7 and j.get("state") == "filling", "PUT rows 30..37: 200", r)
    r = put_rows(d, id_, 29, b[29:31])
    tap.ok(r.status == 409 and r.error()[0] == "rows_taken", "PUT over a written row: 409 rows_taken", r)
    r = put_rows(d, id_, 35, b[0:4])
    tap.ok(r.status == 422 and r.error()[0] == "bad_rows", "PUT past the last row: 422 bad_rows", r)
    r = d.curl("PUT", "/v1/matrices/%s?row=0" % id_, data=b"\0" * 45, content_type=RAW)
    tap.ok(r.status == 400 and r.error()[0] == "length_mismatch", "a body that is not whole rows: 400", r)
    r = d.curl("PUT", "/v1/matrices/%s" % id_, data=b"\0" * 44, content_type=RAW)
    tap.ok(r.status == 400 and r.error()[0] == "missing_dimension", "PUT without ?row: 400", r)
    r = d.curl("PUT", "/v1/matrices/%s?row=0" % id_, data=b"{}", content_type="application/json")
    tap.ok(r.status == 415, "PUT of JSON: 415", r)
    # a body that stops short: its rows are free again afterwards
    st, _, body, _ = raw_request(d.port, ("PUT /v1/matrices/%s?row=0 HTTP/1.1\r\nHost: x\r\n"
                                          "Content-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n"
                                          % (id_, 10 * 44)).encode(), body=b"\0" * 100, close_after_send=True)
    # the rest in parallel, one PUT per connection, rows 0..30 in 5 shares. The short PUT
    # holds rows 0..10 until the server sees its connection go: at once when the close is
    # noticed, else when the body's deadline (header_timeout 1 s here, min_rate_kb) ends it
    res = [None] * 5

    def share(i):
        for _ in range(160):
            res[i] = put_rows(d, id_, i * 6, b[i * 6:(i + 1) * 6])
            if res[i].status != 409:
                return
            threading.Event().wait(0.05)
    ts = [threading.Thread(target=share, args=(i,)) for i in range(5)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    tap.ok(all(x is not None and x.status == 200 for x in res), "five PUTs at once (a short one's rows freed)",
           [x.status if x else None for x in res])
    r = d.curl("GET", "/v1/matrices")
    m = [x for x in (r.json() or {}).get("matrices", []) if x.get("id") == id_]
    tap.ok(m and m[0].get("state") == "ready" and m[0].get("rows_filled") == 37, "every row in: state ready", m)
    r = download(d, id_, RAW)
    got = np.frombuffer(r.body, dtype="<f4").reshape(37, 11) if r.status == 200 else None
    tap.ok(got is not None and np.array_equal(got, b), "the matrix reads back as sent, row for row", r)
    r = d.curl("POST", "/v1/matmul?m=5&k=37&n=11&dtype=float32&b=%s" % id_, data=a.tobytes(), content_type=RAW,
               accept=RAW)
    c = np.frombuffer(r.body, dtype="<f4").reshape(5, 11) if r.status == 200 else None
    ok, why = compare(c, reference(a, b, "float32"), "float32", 37) if c is not None else (False, r)
    tap.ok(ok, "a product with the filled matrix as B", why)
    r = put_rows(d, id_, 0, b[0:1])
    tap.ok(r.status == 409 and r.error()[0] == "matrix_complete", "PUT after the last row: 409 matrix_complete", r)
    r = d.curl("POST", "/v1/matrices?rows=2&cols=2&dtype=float32&empty=1", data=b"\0" * 16, content_type=RAW)
    tap.ok(r.status == 400 and r.error()[0] == "unexpected_body", "empty=1 with a body: 400", r)
    r = d.curl("POST", "/v1/matrices?cols=2&empty=1")
    tap.ok(r.status == 400 and r.error()[0] == "missing_dimension", "empty=1 without rows: 400", r)
    r = d.curl("POST", "/v1/matrices?rows=2&cols=2&empty=maybe")
    tap.ok(r.status == 400 and r.error()[0] == "bad_option", "empty=maybe: 400, as store= and return=", r)
    d.curl("DELETE", "/v1/matrices/" + id_)
    # deleted while filling: later PUTs find nothing
    r = d.curl("POST", "/v1/matrices?rows=4&cols=4&dtype=float64&empty=1")
    id2 = mid(r)
    r = d.curl("DELETE", "/v1/matrices/%s" % id2)
    r2 = put_rows(d, id2, 0, np.zeros((4, 4)))
    tap.ok(r.status == 204 and r2.status == 404, "DELETE of a filling matrix; a later PUT: 404", r2)


def budget(tap, rng):
    # resident_mb = 1: 1 MiB; a 256x256 float64 matrix is 512 KiB.
    # token_share 100: the store's own cap, whoever fills it (test_quotas.py checks shares)
    with Daemon(tap, config={"backend": "cpu", "resident_mb": "1", "token_share": 100}) as d:
        a = random_matrix(rng, (256, 256), "float64")
        r1 = create_raw(d, a)
        r2 = create_raw(d, a)
        tap.ok(r1.status == 201 and r2.status == 201, "two 512 KiB matrices fit in 1 MiB", r2)
        r3 = create_raw(d, a)
        tap.ok(r3.status == 507 and r3.error()[0] == "insufficient_storage", "a third: 507 insufficient_storage", r3)
        r = d.curl("POST", "/v1/matrices", data=npy_bytes(a), content_type=NPY)
        tap.ok(r.status == 507, "the same as .npy: 507 too", r)
        r = d.curl("POST", "/v1/matmul?a=%s&b=%s&store=1" % (mid(r1), mid(r2)))
        tap.ok(r.status == 507, "store=1 with no room for C: 507 before computing", r)
        r = d.curl("POST", "/v1/matmul?a=%s&b=%s" % (mid(r1), mid(r2)), accept=RAW)
        tap.ok(r.status == 200, "a product that stores nothing still runs", r)
        # answered from the headers alone (the body is never read): send only those
        st, _, body, _ = raw_request(d.port, ("POST /v1/matrices?rows=512&cols=512&dtype=float64 HTTP/1.1\r\n"
                                             "Host: x\r\nContent-Type: application/octet-stream\r\n"
                                             "Content-Length: %d\r\n\r\n" % (512 * 512 * 8)).encode())
        tap.ok(st == 413, "a matrix larger than the whole budget: 413 before its body", body[:200])
        _, mt = d.metrics()
        tap.ok(mt and metric(mt, "gemmd_resident_bytes", where="host") == 2 * 512 * 1024 and
               metric(mt, "gemmd_resident_matrices") == 2, "/metrics: resident bytes and count", mt and
               metric(mt, "gemmd_resident_bytes", where="host"))
        d.curl("DELETE", "/v1/matrices/" + mid(r1))
        r = create_raw(d, a)
        tap.ok(r.status == 201, "after a DELETE the budget has room again", r)
        _, mt = d.metrics()
        tap.ok(mt and metric(mt, "gemmd_resident_bytes", where="host") == 2 * 512 * 1024,
               "/metrics: bytes back after DELETE and a new upload")
        d.stop_and_check()


def ownership(tap, rng):
    tmp = tempfile.TemporaryDirectory(prefix="gemmd-e2e-mat-")
    tokfile = os.path.join(tmp.name, "tokens")
    with open(tokfile, "w") as f:
        f.write("token-one-aaaa\ntoken-two-bbbb\n")
    one, two = ["Authorization: Bearer token-one-aaaa"], ["Authorization: Bearer token-two-bbbb"]
    with Daemon(tap, config={"backend": "cpu", "tokens_file": tokfile}) as d:
        a = random_matrix(rng, (3, 3), "float32")
        r = create_raw(d, a, headers=one)
        id1 = mid(r)
        tap.ok(id1, "token one uploads a matrix", r)
        r = create_raw(d, a)
        tap.ok(r.status == 401, "no token: 401", r)
        r = download(d, id1, RAW, headers=two)
        tap.ok(r.status == 404 and r.error()[0] == "matrix_not_found", "token two: GET 404", r)
        r = d.curl("DELETE", "/v1/matrices/" + id1, headers=two)
        tap.ok(r.status == 404, "token two: DELETE 404", r)
        r = d.curl("POST", "/v1/matmul?a=%s&b=%s" % (id1, id1), headers=two)
        tap.ok(r.status == 404 and r.error()[0] == "matrix_not_found", "token two: product by reference 404", r)
        r = d.curl("GET", "/v1/matrices", headers=two)
        tap.ok((r.json() or {}).get("count") == 0, "token two's listing is empty", r)
        r = d.curl("POST", "/v1/matrices?rows=2&cols=3&dtype=float32&empty=1", headers=one)
        r2 = put_rows(d, mid(r), 0, np.zeros((2, 3), np.float32), headers=two)
        tap.ok(r.status == 201 and r2.status == 404, "token two: PUT rows into token one's matrix 404", r2)
        d.curl("DELETE", "/v1/matrices/" + str(mid(r)), headers=one)
        r = d.curl("GET", "/v1/matrices", headers=one)
        tap.ok((r.json() or {}).get("count") == 1, "token one's listing has it", r)
        r = d.curl("POST", "/v1/matmul?a=%s&b=%s" % (id1, id1), headers=one, accept=RAW)
        c = np.frombuffer(r.body, dtype="<f4").reshape(3, 3) if r.status == 200 else None
        ok, why = compare(c, reference(a, a, "float32"), "float32", 3) if c is not None else (False, r)
        tap.ok(ok, "token one: A.A by reference", why)
        log = d.read_log()
        tap.ok(id1 not in log, "the log never holds a whole matrix id")
        d.stop_and_check()


def main(tap):
    rng = np.random.default_rng(14)
    with Daemon(tap, config={"backend": "cpu"}) as d:
        lifecycle(tap, d, rng)
        products(tap, d, rng)
        chain(tap, d, rng)
        d.stop_and_check()
    with Daemon(tap, config={"backend": "cpu", "header_timeout": "1"}) as d:
        filled_in_parts(tap, d, rng)
        d.stop_and_check()
    budget(tap, rng)
    ownership(tap, rng)


if __name__ == "__main__":
    run_guarded(Tap(), main)
