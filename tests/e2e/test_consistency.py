#!/usr/bin/python3
"""test_consistency.py - one fact said alike by every door, format and client (CPU daemon).

- store=1&return=1: C is kept and sent with 201, and Location and X-Gemm-Matrix name the
  same id in every answer format (JSON, octet-stream, .npy; the JSON's "matrix_id" too);
  the kept matrix is C, and its binary download carries X-Gemm-Matrix.
- X-Gemm-Device says where a product ran, as the JSON answer's "device" does: the same
  value in every format of /v1/matmul, on a job's status once it ran and on its result,
  and on /v2 infer (its parameters.device); answers where no product ran (health, info,
  metrics, a job's 202, resident matrices, v2 metadata, an error before any product) have
  none.
- /v2/models/matmul's "maths" is the union of /v1/info's kernels[].maths, in their order;
  a float32 infer with each mode listed runs, one with a mode left out is refused.
- The server's URL: `gemm -s host:port`, GEMM_SERVER=host:port, http://host:port/ and
  [::1]:port (a daemon on ::1, where the host has IPv6 loopback) reach the daemon, as in
  the Python client; another scheme is a usage error (exit 2) that says what is expected.
- A 2000x2000 float64 product as JSON (a body of about 162 MB, decoded in bounded memory):
  200 and C = A.B with the default max_json_mb (256).
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (REPO, SLOW, Daemon, Tap, curl, load_npy, npy_bytes, raw_answer, run_guarded)  # noqa: E402

GEMM_BIN = os.environ.get("GEMM_BIN", "bin/gemm")
if not os.path.isabs(GEMM_BIN):
    GEMM_BIN = os.path.join(REPO, GEMM_BIN)
RAW = "application/octet-stream"
NPY = "application/x-npy"
MATHS = ["default", "fp32", "tf32", "bf16"]  # gemm_math order


def stored_and_returned(tap, d):
    rng = np.random.default_rng(11)
    a, b = rng.random((5, 4)), rng.random((4, 3))
    ref = a @ b
    answers = {
        "JSON": d.matmul_json(a, b, path="/v1/matmul?store=1&return=1"),
        "octet-stream": d.matmul_raw(a, b, "float64", query="&store=1&return=1"),
        ".npy": d.matmul_npy(npy_bytes(a), npy_bytes(b), path="/v1/matmul?store=1&return=1"),
    }
    for fmt, r in answers.items():
        mid = r.header("x-gemm-matrix") or ""
        if fmt == "JSON":
            j = r.json() or {}
            c, same = np.array(j.get("c")), j.get("matrix_id") == mid
        else:
            c = (np.frombuffer(r.body, "<f8").reshape(5, 3) if len(r.body) == 5 * 3 * 8 else None) \
                if fmt == "octet-stream" else load_npy(r.body)
            same = True
        tap.ok(r.status == 201 and mid and r.header("location") == "/v1/matrices/" + mid and same
               and c is not None and np.allclose(c, ref),
               "store=1&return=1, %s answer: 201, C, Location and X-Gemm-Matrix name the same id" % fmt, r)
        g = d.curl("GET", "/v1/matrices/" + mid, accept=RAW)
        tap.ok(g.status == 200 and g.header("x-gemm-matrix") == mid
               and np.allclose(raw_answer(g, 5, 3, "float64"), ref),
               "the %s answer's kept matrix is C; its download carries X-Gemm-Matrix" % fmt, g)
        d.curl("DELETE", "/v1/matrices/" + mid)


def device_header(tap, d):
    rng = np.random.default_rng(12)
    a, b = rng.random((6, 5)).astype(np.float32), rng.random((5, 4)).astype(np.float32)
    backend = (d.curl("GET", "/v1/info").json() or {}).get("backend")
    rj = d.matmul_json(a, b, dtype="float32")
    dev = (rj.json() or {}).get("device")
    tap.ok(rj.status == 200 and dev and rj.header("x-gemm-device") == dev and (backend != "cpu" or dev == "cpu"),
           "JSON answer: X-Gemm-Device is its \"device\" (cpu on the CPU backend)", rj)
    for fmt, r in (("octet-stream", d.matmul_raw(a, b, "float32")),
                   (".npy", d.matmul_npy(npy_bytes(a), npy_bytes(b)))):
        tap.ok(r.status == 200 and r.header("x-gemm-device") == dev, "%s answer: the same X-Gemm-Device" % fmt, r)

    s = d.matmul_raw(a, b, "float32", path="/v1/jobs")
    jid = (s.json() or {}).get("id", "")
    tap.ok(s.status == 202 and s.header("x-gemm-device") is None, "a job's 202: no X-Gemm-Device (nothing ran)", s)
    st, deadline = None, time.monotonic() + 30 * SLOW
    while time.monotonic() < deadline:
        st = d.curl("GET", "/v1/jobs/" + jid)
        if (st.json() or {}).get("state") == "done":
            break
        time.sleep(0.05)
    tap.ok(st.status == 200 and (st.json() or {}).get("device") == dev and st.header("x-gemm-device") == dev,
           "a done job's status: X-Gemm-Device is its \"device\"", st)
    for accept in (RAW, "application/json"):
        r = d.curl("GET", "/v1/jobs/%s/result" % jid, accept=accept)
        tap.ok(r.status == 200 and r.header("x-gemm-device") == dev,
               "a job's result (%s): the same X-Gemm-Device" % accept, r)
    d.curl("DELETE", "/v1/jobs/" + jid)

    body = {"inputs": [{"name": "A", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]},
                       {"name": "B", "shape": [2, 1], "datatype": "FP32", "data": [3, 4]}]}
    r = d.curl("POST", "/v2/models/matmul/infer", data=json.dumps(body).encode(), content_type="application/json")
    pdev = ((r.json() or {}).get("parameters") or {}).get("device")
    tap.ok(r.status == 200 and pdev == dev and r.header("x-gemm-device") == dev,
           "v2 infer: X-Gemm-Device is its parameters.device", r)

    m = d.curl("POST", "/v1/matrices?rows=6&cols=5&dtype=float32", data=a.tobytes(), content_type=RAW)
    mid = (m.json() or {}).get("id", "")
    none = [("POST /v1/matrices", m)]
    for path in ("/healthz", "/readyz", "/v1/info", "/metrics", "/v1/matrices", "/v1/matrices/" + mid,
                 "/v2/models/matmul", "/no/such/path"):
        none.append(("GET " + path, d.curl("GET", path, accept="*/*")))
    none.append(("a 400 before any product",
                 d.curl("POST", "/v1/matmul", data=b"{", content_type="application/json")))
    none.append(("DELETE /v1/matrices/{id}", d.curl("DELETE", "/v1/matrices/" + mid)))
    bad = ["%s: %d %s" % (what, r.status, r.header("x-gemm-device")) for what, r in none
           if r.status == 0 or r.header("x-gemm-device") is not None]
    tap.ok(not bad, "answers where no product ran carry no X-Gemm-Device", bad)


def v2_maths(tap, d):
    info = d.curl("GET", "/v1/info").json() or {}
    have = set()
    for k in info.get("kernels", []):
        have |= set(k.get("maths", []))
    want = [m for m in MATHS if m in have]
    meta = d.curl("GET", "/v2/models/matmul").json() or {}
    listed = ((meta.get("parameters") or {}).get("maths") or "").split(",")
    tap.eq(listed, want, "v2 model metadata: maths are those of /v1/info's kernels")

    def infer(math):
        body = {"parameters": {"math": math},
                "inputs": [{"name": "A", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]},
                           {"name": "B", "shape": [2, 1], "datatype": "FP32", "data": [3, 4]}]}
        return d.curl("POST", "/v2/models/matmul/infer", data=json.dumps(body).encode())

    runs = {m: infer(m) for m in MATHS}
    wrong = ["%s: %d" % (m, r.status) for m, r in runs.items() if (r.status == 200) != (m in listed)]
    tap.ok(listed and not wrong, "a float32 infer runs with each math listed, and is refused with any other", wrong)


def run_gemm(args, env=None, timeout=60):
    e = {k: v for k, v in os.environ.items() if k not in ("GEMM_SERVER", "GEMM_TOKEN")}
    e.update(env or {})
    p = subprocess.run([GEMM_BIN] + args, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=timeout * SLOW)
    return p.returncode, p.stdout.decode("utf-8", "replace") + p.stderr.decode("utf-8", "replace")


def python_client(url, a, b):
    """C from the Python package (client/python/src) at url, or the exception's text."""
    code = ("import sys, numpy as np, gemmd; a = np.load(sys.argv[2]); b = np.load(sys.argv[3]); "
            "np.save(sys.argv[4], gemmd.Client(sys.argv[1]).matmul(a, b))")
    with tempfile.TemporaryDirectory() as t:
        for name, arr in (("A.npy", a), ("B.npy", b)):
            np.save(os.path.join(t, name), arr)
        env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "client", "python", "src"))
        env.pop("GEMM_SERVER", None)
        files = [os.path.join(t, n) for n in ("A.npy", "B.npy", "C.npy")]
        p = subprocess.run([sys.executable, "-c", code, url] + files,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60 * SLOW)
        return np.load(os.path.join(t, "C.npy")) if p.returncode == 0 else p.stderr.decode()[-800:]


def server_urls(tap, d):
    hp = "127.0.0.1:%d" % d.port
    for args, env, what in ((["-s", hp, "health"], None, "gemm -s host:port"),
                            (["health"], {"GEMM_SERVER": hp}, "GEMM_SERVER=host:port"),
                            (["-s", "localhost:%d" % d.port, "health"], None, "gemm -s localhost:port"),
                            (["--server", "http://%s/" % hp, "health"], None, "gemm --server http://host:port/")):
        rc, out = run_gemm(args, env)
        tap.ok(rc == 0 and "ok" in out, "%s reaches the daemon" % what, (rc, out))
    with tempfile.TemporaryDirectory() as t:
        rng = np.random.default_rng(13)
        a, b = rng.random((7, 3)), rng.random((3, 2))
        np.save(os.path.join(t, "A.npy"), a)
        np.save(os.path.join(t, "B.npy"), b)
        out_path = os.path.join(t, "C.npy")
        rc, out = run_gemm(["-s", hp, "multiply", os.path.join(t, "A.npy"), os.path.join(t, "B.npy"), "-o", out_path])
        tap.ok(rc == 0 and np.allclose(np.load(out_path), a @ b), "gemm -s host:port multiply: C is A.B", (rc, out))
    rc, out = run_gemm(["-s", "ftp://" + hp, "health"])
    tap.ok(rc == 2 and "host:port" in out, "another scheme: a usage error (2) saying what is expected", (rc, out))

    # [v6]:port, against a daemon listening on ::1
    d6 = Daemon(tap, config={"backend": "cpu", "listen": "::1"}, wait=False)
    try:
        up, deadline = False, time.monotonic() + 30 * SLOW
        while time.monotonic() < deadline and d6.alive() and not up:
            up = curl("http://[::1]:%d" % d6.port, "GET", "/healthz", max_time=2).status == 200
            time.sleep(0.05)
        if not up:
            for what in ("gemm -s [::1]:port", "the Python client with [::1]:port"):
                tap.skip(what, "no daemon on ::1 (no IPv6 loopback here?): %s" % d6.read_log()[-300:])
            return
        url6 = "[::1]:%d" % d6.port
        rc, out = run_gemm(["-s", url6, "health"])
        tap.ok(rc == 0 and "ok" in out, "gemm -s [::1]:port reaches a daemon on ::1", (rc, out))
        a, b = np.arange(6.0).reshape(2, 3), np.arange(3.0).reshape(3, 1)
        c = python_client(url6, a, b)
        tap.ok(isinstance(c, np.ndarray) and np.allclose(c, a @ b), "the Python client takes [::1]:port alike", c)
    finally:
        d6.stop()
        d6.cleanup()


def big_json(tap):
    """2000x2000 float64 as JSON: the body is about 162 MB."""
    rng = np.random.default_rng(14)
    a, b = rng.random((2000, 2000)), rng.random((2000, 2000))
    body = json.dumps({"a": a.tolist(), "b": b.tolist()}).encode()
    with Daemon(tap, config={"backend": "cpu"}) as d:
        r = d.curl("POST", "/v1/matmul", data=body, content_type="application/json", max_time=300 * SLOW)
        del body
        c = np.array((r.json() or {}).get("c")) if r.status == 200 else None
        tap.ok(c is not None and c.shape == (2000, 2000) and np.allclose(c, a @ b, rtol=1e-12, atol=1e-9),
               "a 2000x2000 float64 JSON product (162 MB body, the default max_json_mb): 200 and C = A.B",
               (r.status, r.body[:300]))


def main(tap):
    with Daemon(tap, config={"backend": "cpu"}) as d:
        stored_and_returned(tap, d)
        device_header(tap, d)
        v2_maths(tap, d)
        server_urls(tap, d)
    big_json(tap)


if __name__ == "__main__":
    run_guarded(Tap(), main)
