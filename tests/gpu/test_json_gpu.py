"""test_json_gpu.py - JSON bodies on the CUDA backend, whose matrices come from page-locked
host blocks (the engine's allocator) as the body is decoded.

- every form and dtype place: nested rows and {"shape", "data"} (shape first and last),
  dtype first, last and absent, for float32, float64 and int32, whole and with chunked
  transfer: every C right against NumPy (float64 reference);
- bodies the decoder must refuse as they arrive (a declared shape over max_elements, rows
  over max_dim, a syntax error deep in the body) answer their error and the next product is
  right;
- four 29 MB bodies at once (A 1400x1000 float32, dtype after the matrices): every C right;
  the daemon's peak resident memory is reported (not asserted: the CUDA host-block cache
  keeps freed page-locked blocks, up to its cap, for later products).

Run by tests/run.sh only on a machine with a GPU and a CUDA build.
"""
import json
import os
import sys
import threading

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "e2e"))
from harness import Daemon, Tap, compare, reference, run_guarded  # noqa: E402

CONFIG = {
    "backend": "cuda",
    "host_max_mnk": "0",  # the GPU paths under test (the host path: test_host_gpu.py)
    "streams_per_device": "4",
    "http_threads": "8",
    "max_json_mb": "64",
    "max_dim": "4096",
    "max_elements": "4194304",
}


def rand(rng, shape, dtype):
    if dtype == "int32":
        return rng.integers(-1000, 1000, size=shape, dtype=np.int64).astype(np.int32)
    return rng.uniform(-1, 1, size=shape).astype(dtype)


def matrix_doc(m, form):
    if form == "nested":
        return m.tolist()
    flat = m.reshape(-1).tolist()
    if form == "shape-first":
        return {"shape": list(m.shape), "data": flat}
    return {"data": flat, "shape": list(m.shape)}


def body(a, b, dtype, form, where):
    doc = {}
    if where == "first":
        doc["dtype"] = dtype
    doc["a"] = matrix_doc(a, form)
    doc["b"] = matrix_doc(b, form)
    if where == "last":
        doc["dtype"] = dtype
    return json.dumps(doc).encode()


def answer(r, dtype):
    if r.status != 200:
        return None
    c = (r.json() or {}).get("c")
    return None if c is None else np.array(c, dtype=np.int64 if dtype == "int32" else np.float64)


def vm(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def main(tap):
    rng = np.random.default_rng(7)
    with Daemon(tap, config=CONFIG) as d:
        for dtype in ("float32", "float64", "int32"):
            for form in ("nested", "shape-first", "shape-last"):
                for where in ("first", "last", "absent"):
                    if where == "absent" and dtype != "float64":
                        continue  # no dtype means float64
                    m, k, n = (int(x) for x in rng.integers(1, 300, size=3))
                    a, b = rand(rng, (m, k), dtype), rand(rng, (k, n), dtype)
                    chunked = bool(rng.integers(0, 2))
                    r = d.curl("POST", "/v1/matmul", data=body(a, b, dtype, form, where),
                               content_type="application/json",
                               headers=["Transfer-Encoding: chunked"] if chunked else None)
                    ok, why = compare(answer(r, dtype), reference(a, b, dtype), dtype, k) \
                        if r.status == 200 else (False, repr(r))
                    tap.ok(ok, "%s %dx%dx%d, %s, dtype %s%s: right" % (dtype, m, k, n, form, where,
                                                                    ", chunked" if chunked else ""), why)

        for what, text, status in (
                ("declared shape over max_elements",
                 b'{"a": {"shape": [4096, 4096], "data": [1, 2, 3]}, "b": {"shape": [4096, 1], "data": [1]}}', 413),
                ("rows over max_dim", b'{"a": [' + b"[1]," * 5000 + b'[1]], "b": [[1]]}', 413),
                ("a syntax error 1 MB into the body",
                 b'{"a": [[' + b"1," * 500000 + b'1,]], "b": [[1]]}', 400)):
            r = d.curl("POST", "/v1/matmul", data=text, content_type="application/json")
            tap.ok(r.status == status and r.error()[0], "%s: %d with a JSON error" % (what, status), r)
            a, b = rand(rng, (40, 30), "float32"), rand(rng, (30, 20), "float32")
            r = d.matmul_json(a, b, dtype="float32")
            ok, why = compare(answer(r, "float32"), reference(a, b, "float32"), "float32", 30)
            tap.ok(ok, "after %s the next product is right" % what, why)

        a = rng.uniform(-1, 1, size=(1400, 1000)).astype(np.float32)
        b = rng.uniform(-1, 1, size=(1000, 1)).astype(np.float32)
        big = body(a, b, "float32", "nested", "last")
        ref = reference(a, b, "float32")
        pid = d.proc.pid
        before = vm(pid, "VmRSS")
        out = [None] * 4

        def one(i):
            out[i] = d.curl("POST", "/v1/matmul", data=big, content_type="application/json",
                            headers=["Transfer-Encoding: chunked"] if i % 2 else None, max_time=300)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        good = sum(1 for r in out if compare(answer(r, "float32"), ref, "float32", 1000)[0])
        tap.ok(good == 4, "four %.1f MB bodies at once (two chunked): every C right" % (len(big) / 1e6),
               [repr(r) for r in out if r.status != 200])
        tap.diag("VmRSS before %.1f MB, VmHWM %.1f MB over the whole run" % (before / 1024, vm(pid, "VmHWM") / 1024))


if __name__ == "__main__":
    run_guarded(Tap(), main)
