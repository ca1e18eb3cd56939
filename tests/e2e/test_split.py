#!/usr/bin/python3
"""test_split.py - split products through the daemon (CPU backend, cpu_workers 3): a
single product with m*n*k >= split_min_mnk runs as split_ways row panels of A on several
workers at once and is answered as one product.

Checked: answers in every format (JSON, raw, .npy, an async job's result, the Open
Inference Protocol) against NumPy float64 (int32: exact, wrapped mod 2^32), with the split
reported (JSON "split": panels, rows m/P with the first m%P one more, devices, streams;
header X-Gemm-Split); products below the threshold, batched requests and split_ways 1 not
split and saying nothing of it; /metrics counting a split product once among the products
and separately as split; a failing panel (fault hook cpu_fail) answering 500 with the
panel's error while the daemon keeps serving; int32 answers equal byte for byte to
those of a daemon that does not split; and the panel_of option (a panel of a larger
product, sent as a request of its own): accepted raw and in JSON, its panels' int32 rows
equal to the whole product's, refused with 422 when it is not a count, is below m or is
given with a batch.
"""
import json
import os
import re
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (SLOW, Daemon, Tap, compare, load_npy, metric, np_dtype, npy_bytes,  # noqa: E402
                     random_matrix, reference, run_guarded)

SPLIT_CFG = {"cpu_workers": "3", "threads": "3", "split_ways": "3", "split_min_mnk": "1000"}


def rows_for(m, p):
    return [m // p + (1 if i < m % p else 0) for i in range(p)]


def check_split(tap, name, r, m, panels, js=None):
    """The answer reports the split: header always, the JSON member when js is given."""
    want_rows = rows_for(m, panels)
    hdr = r.header("X-Gemm-Split") or ""
    want_hdr = "panels=%d; rows=%s; devices=%s" % (panels, ",".join(map(str, want_rows)),
                                                   ",".join(["cpu"] * panels))
    tap.eq(hdr, want_hdr, name + ": X-Gemm-Split")
    if js is not None:
        s = js.get("split") or {}
        ok = (s.get("panels") == panels and s.get("rows") == want_rows and s.get("devices") == ["cpu"] * panels
              and s.get("streams") == [-1] * panels and isinstance(s.get("kernel_ms"), list)
              and len(s["kernel_ms"]) == panels)
        tap.ok(ok, name + ": JSON split {panels, rows, devices, streams, kernel_ms}", s)


def check_not_split(tap, name, r, js=None):
    tap.ok(r.header("X-Gemm-Split") is None, name + ": no X-Gemm-Split", r.header("X-Gemm-Split"))
    if js is not None:
        tap.ok("split" not in js, name + ": no JSON split", js.get("split"))


def raw_c(r, dtype, m, n):
    dt = np.dtype(np_dtype(dtype)).newbyteorder("<")
    if r.status != 200 or len(r.body) != m * n * dt.itemsize:
        return None
    return np.frombuffer(r.body, dtype=dt).reshape(m, n)


def formats(tap, d, rng):
    # JSON, every dtype, m of every residue mod 3
    for dtype, (m, k, n) in (("float64", (31, 17, 9)), ("float32", (32, 40, 11)), ("int32", (33, 19, 7))):
        a = random_matrix(rng, (m, k), dtype)
        b = random_matrix(rng, (k, n), dtype)
        r = d.matmul_json(a, b, dtype=dtype)
        js = r.json() or {}
        name = "JSON %s %dx%dx%d" % (dtype, m, k, n)
        ok, why = compare(np.array(js.get("c")), reference(a, b, dtype), dtype, k) if r.status == 200 else (False, r)
        tap.ok(ok, name + ": C matches NumPy", why)
        check_split(tap, name, r, m, 3, js)
        tap.ok(js.get("device") == "cpu" and js.get("kernel") in ("openblas", "blocked"),
               name + ": kernel and device as for one product", (js.get("kernel"), js.get("device")))
        t = js.get("timing") or {}
        tap.ok(t.get("compute_ms", -1) >= t.get("kernel_ms", 0) >= 0 and t.get("total_ms", 0) >= t.get("compute_ms", 0),
               name + ": timing is the product's (kernel <= compute <= total)", t)

    # raw float32 and int32
    for dtype, (m, k, n) in (("float32", (50, 64, 33)), ("int32", (47, 31, 29))):
        a = random_matrix(rng, (m, k), dtype)
        b = random_matrix(rng, (k, n), dtype)
        r = d.matmul_raw(a, b, dtype)
        c = raw_c(r, dtype, m, n)
        name = "raw %s %dx%dx%d" % (dtype, m, k, n)
        ok, why = compare(c, reference(a, b, dtype), dtype, k) if c is not None else (False, r)
        tap.ok(ok, name + ": C matches NumPy", why)
        check_split(tap, name, r, m, 3)

    # .npy
    a = random_matrix(rng, (20, 30), "float64")
    b = random_matrix(rng, (30, 10), "float64")
    r = d.matmul_npy(npy_bytes(a), npy_bytes(b))
    c = load_npy(r.body) if r.status == 200 else None
    ok, why = compare(c, reference(a, b, "float64"), "float64", 30) if c is not None else (False, r)
    tap.ok(ok, ".npy float64 20x30x10: C matches NumPy", why)
    check_split(tap, ".npy float64 20x30x10", r, 20, 3)

    # an async job: the result carries the split
    a = random_matrix(rng, (25, 16), "float64")
    b = random_matrix(rng, (16, 12), "float64")
    body = {"a": a.tolist(), "b": b.tolist(), "dtype": "float64"}
    r = d.curl("POST", "/v1/jobs", data=json.dumps(body).encode(), content_type="application/json")
    jid = (r.json() or {}).get("id")
    tap.ok(r.status == 202 and jid, "async job accepted", r)
    if jid:
        deadline = time.monotonic() + 30 * SLOW
        while time.monotonic() < deadline:
            s = d.curl("GET", "/v1/jobs/" + jid)
            if (s.json() or {}).get("state") in ("done", "failed", "cancelled"):
                break
            time.sleep(0.05)
        r = d.curl("GET", "/v1/jobs/%s/result" % jid)
        js = r.json() or {}
        ok, why = compare(np.array(js.get("c")), reference(a, b, "float64"), "float64", 16) \
            if r.status == 200 else (False, r)
        tap.ok(ok, "async job result: C matches NumPy", why)
        check_split(tap, "async job result", r, 25, 3, js)

    # the Open Inference Protocol: parameters carry the split
    a = random_matrix(rng, (14, 9), "float32")
    b = random_matrix(rng, (9, 13), "float32")
    body = {"inputs": [{"name": "A", "shape": [14, 9], "datatype": "FP32", "data": a.ravel().tolist()},
                       {"name": "B", "shape": [9, 13], "datatype": "FP32", "data": b.ravel().tolist()}]}
    r = d.curl("POST", "/v2/models/matmul/infer", data=json.dumps(body).encode(), content_type="application/json")
    js = r.json() or {}
    outs = js.get("outputs") or [{}]
    c = np.array(outs[0].get("data") or [], dtype=np.float64)
    ok, why = compare(c.reshape(14, 13) if c.size == 14 * 13 else c, reference(a, b, "float32"), "float32", 9) \
        if r.status == 200 else (False, r)
    tap.ok(ok, "v2 infer float32 14x9x13: C matches NumPy", why)
    check_split(tap, "v2 infer", r, 14, 3)
    p = js.get("parameters") or {}
    tap.ok(p.get("split_panels") == 3 and p.get("split_rows") == "5,5,4" and p.get("split_devices") == "cpu,cpu,cpu"
           and all(isinstance(v, (str, int, float, bool)) for v in p.values()),
           "v2 infer: parameters split_panels, split_rows, split_devices (scalars, as the protocol has them)", p)


def not_split(tap, d, rng):
    # below split_min_mnk (10*10*9 = 900 < 1000)
    a = random_matrix(rng, (10, 10), "float64")
    b = random_matrix(rng, (10, 9), "float64")
    r = d.matmul_json(a, b, dtype="float64")
    js = r.json() or {}
    ok, why = compare(np.array(js.get("c")), reference(a, b, "float64"), "float64", 10) if r.status == 200 else (False, r)
    tap.ok(ok, "below split_min_mnk: C matches NumPy", why)
    check_not_split(tap, "below split_min_mnk", r, js)
    # a batched request is never split
    a = random_matrix(rng, (2, 30, 20), "float32")
    b = random_matrix(rng, (20, 30), "float32")
    bs = a.astype("<f4").tobytes() + b.astype("<f4").tobytes()
    r = d.curl("POST", "/v1/matmul?m=30&k=20&n=30&dtype=float32&batch=2&b_shared=1", data=bs,
               content_type="application/octet-stream", accept="application/x-npy")
    c = load_npy(r.body) if r.status == 200 else None
    ok = c is not None and all(compare(c[i], reference(a[i], b, "float32"), "float32", 20)[0] for i in range(2))
    tap.ok(ok, "batched request: every C matches NumPy", r)
    check_not_split(tap, "batched request", r)


def counters(tap, d, before):
    _, m = d.metrics()
    if not tap.ok(m is not None, "/metrics answers"):
        return
    splits = metric(m, "gemmd_split_products_total")
    panels = metric(m, "gemmd_split_panels_total")
    done = metric(m, "gemmd_engine_jobs_total", result="completed")
    # formats() made 8 split products, not_split() 2 whole ones
    tap.eq(splits - before[0], 8, "/metrics: gemmd_split_products_total counts the split products")
    tap.eq(panels - before[1], 24, "/metrics: gemmd_split_panels_total counts their panels")
    tap.eq(done - before[2], 10, "/metrics: each product counted once among the completed")


def main(tap):
    rng = np.random.default_rng(15)
    with Daemon(tap, config=SPLIT_CFG) as d:
        _, m0 = d.metrics()
        before = (metric(m0, "gemmd_split_products_total"), metric(m0, "gemmd_split_panels_total"),
                  metric(m0, "gemmd_engine_jobs_total", result="completed")) if m0 else (0, 0, 0)
        formats(tap, d, rng)
        not_split(tap, d, rng)
        counters(tap, d, before)
        r = d.curl("GET", "/metrics")
        text = r.body.decode("utf-8", "replace")
        tap.ok(re.search(r"^# HELP gemmd_split_products_total ", text, re.M) is not None,
               "/metrics documents gemmd_split_products_total")

    # int32 byte for byte against a daemon that runs the product whole
    a = random_matrix(rng, (61, 45), "int32") * 50000  # products wrap
    b = random_matrix(rng, (45, 37), "int32") * 50000
    answers = []
    for cfg in (SPLIT_CFG, dict(SPLIT_CFG, split_ways="1")):
        with Daemon(tap, config=cfg) as d:
            r = d.matmul_raw(a, b, "int32")
            answers.append((r.status, r.body, r.header("X-Gemm-Split")))
    (s1, b1, h1), (s2, b2, h2) = answers
    tap.ok(s1 == 200 and s2 == 200 and h1 and h2 is None, "int32: split (3 panels) and whole (split_ways 1)",
           (s1, s2, h1, h2))
    tap.ok(b1 == b2 and len(b1) == 61 * 37 * 4, "int32: the split answer equals the whole one byte for byte")
    c = raw_c(type("R", (), {"status": s1, "body": b1})(), "int32", 61, 37)
    ok, why = compare(c, reference(a, b, "int32"), "int32", 45) if c is not None else (False, "no C")
    tap.ok(ok, "int32 (wrapping): C matches NumPy mod 2^32", why)

    # a failing panel: the product fails with the panel's error; the daemon keeps serving
    with Daemon(tap, config=dict(SPLIT_CFG, split_ways="2", fault_inject="cpu_fail:2")) as d:
        a = random_matrix(rng, (12, 20), "float64")
        b = random_matrix(rng, (20, 8), "float64")
        r = d.matmul_json(a, b, dtype="float64")
        err = ((r.json() or {}).get("error") or {})
        tap.ok(r.status == 500 and err.get("code") == "backend_failure" and "cpu_fail:2" in err.get("message", ""),
               "a failing panel: 500 backend_failure naming the fault", r)
        r = d.matmul_json(a[:3], b, dtype="float64")  # 3*20*8 = 480 < 1000: whole, run 3
        js = r.json() or {}
        ok, why = compare(np.array(js.get("c")), reference(a[:3], b, "float64"), "float64", 20) \
            if r.status == 200 else (False, r)
        tap.ok(ok, "after a failed split the daemon still answers right", why)
        _, m = d.metrics()
        tap.ok(m is not None and metric(m, "gemmd_engine_jobs_total", result="failed") == 1
               and metric(m, "gemmd_split_products_total") == 1,
               "/metrics: the failed split product counted once, as failed and as split")

    panel_of(tap, rng)


def panel_of(tap, rng):
    """panel_of=M: rows of A that are a panel of an M-row product (what libgemm's parallel
    requests send). The CPU backend computes them as any product (OpenBLAS chooses per
    call); the option is checked in every format."""
    with Daemon(tap) as d:
        a = random_matrix(rng, (40, 33), "int32") * 50000
        b = random_matrix(rng, (33, 21), "int32") * 50000
        whole = d.matmul_raw(a, b, "int32")
        rows = []
        for lo, hi in ((0, 14), (14, 27), (27, 40)):
            r = d.matmul_raw(a[lo:hi], b, "int32", query="&panel_of=40")
            rows.append(r.body if r.status == 200 else None)
        tap.ok(whole.status == 200 and None not in rows and b"".join(rows) == whole.body,
               "panel_of (raw): three int32 panels equal the whole product byte for byte")
        af = random_matrix(rng, (9, 7), "float64")
        bf = random_matrix(rng, (7, 5), "float64")
        r = d.matmul_json(af[3:6], bf, dtype="float64", panel_of=9)
        js = r.json() or {}
        ok, why = compare(np.array(js.get("c")), reference(af[3:6], bf, "float64"), "float64", 7) \
            if r.status == 200 else (False, r)
        tap.ok(ok, "panel_of (JSON field): C matches NumPy", why)
        for q, code, what in (("&panel_of=abc", "bad_option", "not a number"),
                              ("&panel_of=0", "bad_option", "zero"),
                              ("&panel_of=2", "bad_option", "fewer rows than A has")):
            r = d.matmul_raw(af[:3], bf, "float64", query=q)
            err = ((r.json() or {}).get("error") or {})
            tap.ok(r.status == 422 and err.get("code") == code and "panel_of" in err.get("message", ""),
                   "panel_of %s: 422 %s" % (what, code), r)
        bs = af[:4].astype("<f8").tobytes() + bf.astype("<f8").tobytes()
        r = d.curl("POST", "/v1/matmul?m=2&k=7&n=5&dtype=float64&batch=2&b_shared=1&panel_of=8", data=bs,
                   content_type="application/octet-stream")
        err = ((r.json() or {}).get("error") or {})
        tap.ok(r.status == 422 and err.get("code") == "bad_option" and "batch" in err.get("message", ""),
               "panel_of on a batched request: 422 bad_option", r)
        r = d.matmul_raw(af, bf, "float64")
        tap.ok(r.status == 200, "the daemon still answers after the refusals", r)


if __name__ == "__main__":
    run_guarded(Tap(), main)
