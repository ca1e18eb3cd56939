"""test_v2_gpu.py - the Open Inference Protocol door on the CUDA backend, driven with curl.

- Binary tensor data in and out (the bytes land in the engine's pinned buffers and C is sent
  from its own): 2048^2 float32 with kernel auto, cublas and cublas + math tf32 (reported
  back in the answer's parameters), odd shapes in FP64 and INT32, within tolerance of NumPy
  in float64 (INT32 exact, wrapped).
- JSON tensors in and out on the GPU.
- 16 concurrent binary infers of mixed shapes and datatypes: every answer right.
- The same product through /v1/matmul raw and v2 binary: the same C (same kernel).

Run by tests/run.sh only on a machine with a GPU and a CUDA build.
"""
import json
import os
import sys
import threading

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "e2e"))
from harness import Daemon, Tap, reference, run_guarded, wrapping_matrix  # noqa: E402

CONFIG = {
    "backend": "cuda",
    "host_max_mnk": "0",  # the GPU paths under test (the host path: test_host_gpu.py)
    "streams_per_device": "4",
    "queue_depth": "256",
    "max_body_mb": "512",
    "http_threads": "8",
    "per_ip_limit": "0",
}
V2 = {"float32": "FP32", "float64": "FP64", "int32": "INT32"}
INFER = "/v2/models/matmul/infer"


def rel_err(c, ref):
    c = np.asarray(c, dtype=np.float64)
    if not np.all(np.isfinite(c)):
        return float("inf")
    den = np.linalg.norm(ref)
    return float(np.linalg.norm(c - ref) / (den if den > 0 else 1.0))


def infer_binary(d, a, b, dtype, params=None):
    """v2 binary in and out; returns (response, header dict, C or None)."""
    dt = V2[dtype]
    req = {"inputs": [{"name": "A", "shape": list(a.shape), "datatype": dt, "parameters": {"binary_data_size": a.nbytes}},
                      {"name": "B", "shape": list(b.shape), "datatype": dt, "parameters": {"binary_data_size": b.nbytes}}],
           "outputs": [{"name": "C", "parameters": {"binary_data": True}}]}
    if params:
        req["parameters"] = params
    head = json.dumps(req).encode()
    r = d.curl("POST", INFER, data=head + a.tobytes() + b.tobytes(),
               headers=["Inference-Header-Content-Length: %d" % len(head)])
    if r.status != 200 or not (r.header("inference-header-content-length") or "").isdigit():
        return r, {}, None
    n = int(r.header("inference-header-content-length"))
    hdr = json.loads(r.body[:n])
    data = r.body[n:]
    if len(data) != a.shape[0] * b.shape[1] * a.itemsize:
        return r, hdr, None
    return r, hdr, np.frombuffer(data, a.dtype).reshape(a.shape[0], b.shape[1])


def check(dtype, c, a, b, tol):
    ref = reference(a, b, dtype)
    if c is None:
        return False, "no C"
    if dtype == "int32":
        bad = int(np.count_nonzero(c.astype(np.int64) != ref))
        return bad == 0, "%d elements differ" % bad
    e = rel_err(c, ref)
    return e <= tol, "relative error %.3g (tolerance %.3g)" % (e, tol)


def main(tap):
    rng = np.random.default_rng(1313)
    with Daemon(tap, config=CONFIG) as d:
        n = 2048
        a = wrapping_matrix(rng, (n, n), "float32")
        b = wrapping_matrix(rng, (n, n), "float32")
        for params, tol, math in ((None, 1e-4, "fp32"), ({"kernel": "cublas"}, 1e-4, "fp32"),
                                  ({"kernel": "cublas", "math": "tf32"}, 1e-2, "tf32")):
            r, hdr, c = infer_binary(d, a, b, "float32", params)
            ok, why = check("float32", c, a, b, tol)
            p = hdr.get("parameters", {})
            tap.ok(ok and p.get("math") == math and (not params or p.get("kernel") == params["kernel"])
                   and r.header("content-type") == "application/octet-stream",
                   "v2 binary %d^2 FP32 %s: right, math %s reported" % (n, params or "auto", math), (why, p, r))
        for dtype, (m, k, nn) in (("float64", (333, 517, 129)), ("int32", (257, 131, 263)), ("float32", (1, 4097, 3))):
            a2 = wrapping_matrix(rng, (m, k), dtype)
            b2 = wrapping_matrix(rng, (k, nn), dtype)
            r, hdr, c = infer_binary(d, a2, b2, dtype)
            ok, why = check(dtype, c, a2, b2, 1e-4 if dtype == "float32" else 1e-12)
            tap.ok(ok and hdr.get("outputs", [{}])[0].get("datatype") == V2[dtype],
                   "v2 binary %s %dx%dx%d on the GPU: right" % (V2[dtype], m, k, nn), (why, r))

        # JSON in and out
        a3 = wrapping_matrix(rng, (17, 33), "float64")
        b3 = wrapping_matrix(rng, (33, 9), "float64")
        body = json.dumps({"inputs": [{"name": "A", "shape": [17, 33], "datatype": "FP64", "data": a3.tolist()},
                                      {"name": "B", "shape": [33, 9], "datatype": "FP64", "data": b3.ravel().tolist()}]})
        r = d.curl("POST", INFER, data=body.encode())
        out = ((r.json() or {}).get("outputs") or [{}])[0]
        c = np.array(out.get("data", []), dtype=np.float64).reshape(17, 9) if r.status == 200 else None
        ok, why = check("float64", c, a3, b3, 1e-12)
        tap.ok(ok, "v2 JSON FP64 on the GPU: right", (why, r))

        # the same product through both doors
        a4 = wrapping_matrix(rng, (1024, 768), "float32")
        b4 = wrapping_matrix(rng, (768, 640), "float32")
        r1 = d.matmul_raw(a4, b4, "float32", accept="application/octet-stream", query="&kernel=cublas")
        _, _, c2 = infer_binary(d, a4, b4, "float32", {"kernel": "cublas"})
        c1 = np.frombuffer(r1.body, np.float32).reshape(1024, 640) if r1.status == 200 and len(r1.body) == 1024 * 640 * 4 else None
        tap.ok(c1 is not None and c2 is not None and rel_err(c2, c1.astype(np.float64)) <= 1e-6,
               "/v1/matmul raw and v2 binary give the same C (cublas)", r1)

        # concurrent infers
        results = []
        lock = threading.Lock()

        def worker(i):
            lrng = np.random.default_rng(1000 + i)
            dtype = ("float32", "float64", "int32")[i % 3]
            m, k, nn = 64 + 37 * i, 96 + 11 * i, 32 + 19 * i
            a5 = wrapping_matrix(lrng, (m, k), dtype)
            b5 = wrapping_matrix(lrng, (k, nn), dtype)
            _, _, c = infer_binary(d, a5, b5, dtype)
            ok, why = check(dtype, c, a5, b5, 1e-4 if dtype == "float32" else 1e-12)
            with lock:
                results.append((ok, "%s %dx%dx%d: %s" % (dtype, m, k, nn, why)))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        bad = [w for ok, w in results if not ok]
        tap.ok(len(results) == 16 and not bad, "16 concurrent v2 binary infers on the GPU: all right", bad)


if __name__ == "__main__":
    run_guarded(Tap(), main)
