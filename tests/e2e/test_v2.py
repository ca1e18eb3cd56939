#!/usr/bin/python3
"""test_v2.py - the Open Inference Protocol (KServe v2) over HTTP, driven by a client that is
not ours: tritonclient[http] from PyPI (installed by scripts/venv.sh into build/venv), plus
raw HTTP checks of the exact wire format (curl and sockets).

tritonclient: health and metadata; infer with JSON tensors, binary tensors and both mixed,
every datatype (FP32, FP64, INT32), odd shapes, C asked for as binary, as JSON and by
default; kernel and math as request parameters; errors (wrong names, shape mismatch,
unsupported datatype, missing input, too large, bad options, backend failure) answered
as {"error": "..."} with the right status; bearer tokens through headers=; concurrent
async_infer and the asyncio client. Raw: the JSON and binary answers byte for byte
(Inference-Header-Content-Length, Content-Type, binary_data_size), inputs listed B first,
nested JSON data, every way a binary body can be inconsistent, limits, 404/405/415. Docs:
docs/V2.md's request, answer, error and binary examples and README's v2 curl block do what
they say; the Python examples of both run (with small matrices) and compute A.B.

Every product is checked against NumPy in float64 (int32: exact, wrapped to 32 bits). When
the venv cannot be made (no network, no python3-venv), the tritonclient checks are
reported as SKIP with the reason and the raw checks still run.
"""
import asyncio
import contextlib
import http.client
import io
import json
import os
import re
import socket
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (REPO, Daemon, compare, metric, random_matrix, raw_request,  # noqa: E402
                     reference, run_guarded)

VENV = os.path.join(REPO, "build", "venv")
VENV_PY = os.path.join(VENV, "bin", "python")
INFER = "/v2/models/matmul/infer"
V2_DTYPES = {"FP32": "float32", "FP64": "float64", "INT32": "int32"}
NP = {"FP32": np.float32, "FP64": np.float64, "INT32": np.int32}


def ensure_venv():
    """Re-runs this program under build/venv with tritonclient[http]; returns the reason
    when that cannot be done (the tritonclient checks are then skipped)."""
    if os.environ.get("GEMMD_V2_IN_VENV") == "1":
        try:
            import tritonclient.http  # noqa: F401
            return None
        except ImportError as e:
            return "tritonclient not importable in %s: %s" % (VENV, e)
    try:
        p = subprocess.run([os.path.join(REPO, "scripts", "venv.sh"), VENV, "tritonclient[http]"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as e:
        return "scripts/venv.sh failed: %s" % e
    if p.returncode != 0:
        lines = p.stdout.decode("utf-8", "replace").strip().splitlines()
        return "cannot make %s with tritonclient[http]: %s" % (VENV, lines[-1] if lines else "no output")
    env = dict(os.environ, GEMMD_V2_IN_VENV="1")
    sys.stdout.flush()
    os.execve(VENV_PY, [VENV_PY] + sys.argv, env)
    return "exec failed"  # not reached


# ---------------------------------------------------------------------------- raw helpers

def infer_body(inputs, outputs=None, binary=(), params=None, rid=None, order=("A", "B")):
    """An inference body: inputs {name: (array, datatype)}; names in binary go as binary
    tensor data. Returns (body, header_length or None)."""
    req = {"inputs": []}
    if rid is not None:
        req["id"] = rid
    if params:
        req["parameters"] = params
    tail = b""
    for name in order:
        arr, dt = inputs[name]
        t = {"name": name, "shape": list(arr.shape), "datatype": dt}
        if name in binary:
            raw = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<")).tobytes()
            t["parameters"] = {"binary_data_size": len(raw)}
            tail += raw
        else:
            t["data"] = arr.ravel().tolist()
        req["inputs"].append(t)
    if outputs is not None:
        req["outputs"] = outputs
    head = json.dumps(req).encode()
    if binary:
        return head + tail, len(head)
    return head, None


def post(d, body, header_len=None, headers=(), path=INFER):
    hdrs = list(headers)
    if header_len is not None:
        hdrs.append("Inference-Header-Content-Length: %d" % header_len)
    return d.curl("POST", path, data=body, headers=hdrs)


def is_v2_error(r, status, needle=""):
    """The answer is {"error": "<message>"} (plus gemmd's "code") with that status."""
    j = r.json()
    return (r.status == status and isinstance(j, dict) and isinstance(j.get("error"), str)
            and needle in j["error"] and (r.header("content-type") or "").startswith("application/json"))


def split_binary(r):
    """(header dict, binary bytes) of an answer with Inference-Header-Content-Length."""
    n = int(r.header("inference-header-content-length"))
    return json.loads(r.body[:n].decode()), r.body[n:]


# ---------------------------------------------------------------------------- raw checks

def raw_checks(tap, d):
    rng = np.random.default_rng(20261123)

    r = d.curl("GET", "/v2")
    j = r.json() or {}
    tap.ok(r.status == 200 and j.get("name") == "gemmd" and isinstance(j.get("version"), str)
           and "binary_tensor_data" in j.get("extensions", []), "GET /v2: server metadata", r)
    for path, key in (("/v2/health/live", "live"), ("/v2/health/ready", "ready")):
        r = d.curl("GET", path)
        tap.ok(r.status == 200 and (r.json() or {}).get(key) is True, "GET %s answers 200" % path, r)
    for path in ("/v2/models/matmul", "/v2/models/matmul/versions/1"):
        r = d.curl("GET", path)
        j = r.json() or {}
        ins = {t.get("name"): t for t in j.get("inputs", [])}
        outs = {t.get("name"): t for t in j.get("outputs", [])}
        tap.ok(r.status == 200 and j.get("name") == "matmul" and j.get("versions") == ["1"]
               and set(ins) == {"A", "B"} and set(outs) == {"C"}
               and all(t.get("shape") == [-1, -1] and t.get("datatype") == "FP32"
                       for t in list(ins.values()) + list(outs.values()))
               and j.get("parameters", {}).get("datatypes") == "FP32,FP64,INT32,FP16,BF16",
               "GET %s: model metadata (A, B -> C, [-1,-1], FP32/FP64/INT32/FP16/BF16)" % path, r)
    for path in ("/v2/models/matmul/ready", "/v2/models/matmul/versions/1/ready"):
        r = d.curl("GET", path)
        tap.ok(r.status == 200 and (r.json() or {}).get("ready") is True, "GET %s answers 200" % path, r)

    # JSON in, JSON out: the answer's exact shape
    a = random_matrix(rng, (3, 5), "float32")
    b = random_matrix(rng, (5, 4), "float32")
    body, _ = infer_body({"A": (a, "FP32"), "B": (b, "FP32")}, rid="raw-json-1")
    r = post(d, body)
    j = r.json() or {}
    out = (j.get("outputs") or [{}])[0]
    ok = (r.status == 200 and (r.header("content-type") or "").startswith("application/json")
          and r.header("inference-header-content-length") is None
          and j.get("model_name") == "matmul" and j.get("model_version") == "1" and j.get("id") == "raw-json-1"
          and out.get("name") == "C" and out.get("datatype") == "FP32" and out.get("shape") == [3, 4]
          and isinstance(out.get("data"), list) and len(out["data"]) == 12
          and all(isinstance(x, (int, float)) for x in out["data"]))
    good, why = compare(np.array(out.get("data") or [0]).reshape(-1)[:12].reshape(3, 4) if ok else None,
                        reference(a, b, "float32"), "float32", 5) if ok else (False, "")
    tap.ok(ok and good, "JSON infer: application/json, id echoed, C flat with shape [3,4], right values", r)
    p = j.get("parameters") or {}
    tap.ok(isinstance(p.get("kernel"), str) and p.get("kernel") and p.get("math") == "fp32"
           and all(isinstance(p.get(k), (int, float)) for k in ("queue_ms", "kernel_ms", "total_ms", "gflops"))
           and r.header("server-timing"), "JSON infer: parameters say kernel, math and timing; Server-Timing", r)

    # binary in, binary out, B listed first
    a = random_matrix(rng, (7, 9), "float64")
    b = random_matrix(rng, (9, 2), "float64")
    body, hl = infer_body({"A": (a, "FP64"), "B": (b, "FP64")}, binary=("A", "B"), order=("B", "A"),
                          outputs=[{"name": "C", "parameters": {"binary_data": True}}], rid="bin")
    r = post(d, body, hl)
    ok = r.status == 200 and r.header("inference-header-content-length", "").isdigit()
    if ok:
        head, data = split_binary(r)
        out = head["outputs"][0]
        ok = (r.header("content-type") == "application/octet-stream" and head.get("id") == "bin"
              and out == {"name": "C", "datatype": "FP64", "shape": [7, 2],
                          "parameters": {"binary_data_size": 7 * 2 * 8}}
              and len(data) == 112 and int(r.header("content-length") or -1) == len(r.body))
        good, why = compare(np.frombuffer(data, "<f8").reshape(7, 2), reference(a, b, "float64"), "float64", 9)
        ok = ok and good
    tap.ok(ok, "binary infer (B listed first): octet-stream, Inference-Header-Content-Length, "
               "binary_data_size, C's bytes right", r)

    # binary in (mixed), JSON out; nested JSON data
    a = random_matrix(rng, (4, 3), "int32")
    b = random_matrix(rng, (3, 6), "int32")
    req = {"inputs": [{"name": "A", "shape": [4, 3], "datatype": "INT32", "data": a.tolist()},
                      {"name": "B", "shape": [3, 6], "datatype": "INT32",
                       "parameters": {"binary_data_size": b.nbytes}}]}
    head = json.dumps(req).encode()
    r = post(d, head + b.astype("<i4").tobytes(), len(head))
    j = r.json() or {}
    out = (j.get("outputs") or [{}])[0]
    good, why = compare(np.array(out.get("data", [0])).reshape(out.get("shape", [1])), reference(a, b, "int32"),
                        "int32", 3) if r.status == 200 else (False, "")
    tap.ok(r.status == 200 and "id" not in j and out.get("datatype") == "INT32" and good,
           "nested JSON A + binary B, JSON answer: right, and no id when none was given", (r, why))

    # binary data asked for with binary_data_output and no outputs
    body, _ = infer_body({"A": (np.ones((2, 2), np.float32), "FP32"), "B": (np.ones((2, 2), np.float32), "FP32")},
                         params={"binary_data_output": True})
    r = post(d, body)
    ok = r.status == 200 and r.header("inference-header-content-length") is not None
    if ok:
        head, data = split_binary(r)
        ok = np.array_equal(np.frombuffer(data, "<f4"), np.full(4, 2, np.float32))
    tap.ok(ok, "JSON inputs with binary_data_output: C comes as binary data", r)

    # kernel, math and tile as request parameters
    body, _ = infer_body({"A": (np.ones((2, 3), np.float32), "FP32"), "B": (np.ones((3, 2), np.float32), "FP32")},
                         params={"kernel": "openblas", "math": "fp32"})
    r = post(d, body)
    p = (r.json() or {}).get("parameters", {})
    tap.ok(r.status == 200 and p.get("kernel") == "openblas" and p.get("math") == "fp32"
           and r.header("x-gemm-kernel") == "openblas", "parameters kernel=openblas, math=fp32 are used", r)
    body, _ = infer_body({"A": (np.ones((2, 3), np.float32), "FP32"), "B": (np.ones((3, 2), np.float32), "FP32")},
                         params={"kernel": "no_such_kernel"})
    tap.ok(is_v2_error(post(d, body), 400, "no_such_kernel"), "an unknown kernel is a 400 naming it")

    # inconsistent binary bodies
    a = np.ones((2, 3), np.float32)
    b = np.ones((3, 2), np.float32)
    body, hl = infer_body({"A": (a, "FP32"), "B": (b, "FP32")}, binary=("A", "B"))
    tap.ok(is_v2_error(post(d, body + b"xx", hl), 400, "add up to"), "body longer than header + binary sizes: 400")
    tap.ok(is_v2_error(post(d, body[:-4], hl), 400, "add up to"), "body shorter than header + binary sizes: 400")
    tap.ok(is_v2_error(post(d, body, hl - 5), 400, "JSON"), "Inference-Header-Content-Length too short: 400")
    tap.ok(is_v2_error(post(d, body, len(body) + 10), 400, "larger than the body"),
           "Inference-Header-Content-Length past the body: 400")
    tap.ok(is_v2_error(post(d, body, headers=["Inference-Header-Content-Length: 12x"]), 400, "not a positive number"),
           "Inference-Header-Content-Length not a number: 400")
    tap.ok(is_v2_error(post(d, body), 400, "Inference-Header-Content-Length"),
           "binary_data_size without Inference-Header-Content-Length: 400")
    bad = json.loads(body[:hl])
    bad["inputs"][1]["parameters"]["binary_data_size"] = 20
    head = json.dumps(bad).encode()
    r = post(d, head + body[hl:hl + 24] + b"\0" * 20, len(head))
    tap.ok(is_v2_error(r, 400, "binary_data_size is 20 but shape [3,2] of FP32 needs 24 bytes"),
           "binary_data_size that does not match the shape: 400 naming both", r)
    st, hd, bd, _ = raw_request(d.port, b"POST " + INFER.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                                b"Transfer-Encoding: chunked\r\nInference-Header-Content-Length: %d\r\n\r\n" % hl +
                                b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")
    tap.ok(st == 411 and isinstance((json.loads(bd or b"{}") if bd.startswith(b"{") else {}).get("error"), str),
           "chunked body with binary data: 411 (Content-Length is checked before reading)", (st, bd))
    r = post(d, body, hl, headers=["Content-Encoding: gzip"])
    tap.ok(is_v2_error(r, 415, "Content-Encoding"), "Content-Encoding: gzip is a 415", r)

    # routing errors in the protocol's shape
    tap.ok(is_v2_error(d.curl("GET", "/v2/models/nope"), 404, "unknown model 'nope'"), "unknown model: 404")
    tap.ok(is_v2_error(post(d, body, hl, path="/v2/models/nope/infer"), 404, "nope"), "infer on unknown model: 404")
    tap.ok(is_v2_error(d.curl("GET", "/v2/models/matmul/versions/7/ready"), 404, "no version '7'"),
           "unknown version: 404")
    tap.ok(is_v2_error(d.curl("GET", "/v2/repository/index"), 404, "no route"), "unknown v2 path: 404")
    r = d.curl("GET", INFER)
    tap.ok(is_v2_error(r, 405) and r.header("allow") == "POST", "GET on infer: 405 with Allow: POST", r)
    r = d.curl("POST", "/v2/health/ready", data=b"{}")
    tap.ok(is_v2_error(r, 405) and "GET" in (r.header("allow") or ""), "POST on health: 405", r)
    tap.ok(is_v2_error(post(d, b""), 400, "empty"), "empty body: 400")
    bad = {"inputs": [{"name": "A", "shape": [1, 1], "datatype": "FLOAT", "data": [1]},
                      {"name": "B", "shape": [1, 1], "datatype": "FLOAT", "data": [1]}]}
    tap.ok(is_v2_error(post(d, json.dumps(bad).encode()), 400, "unknown datatype 'FLOAT'"),
           "a datatype the protocol does not know: 400")
    tap.ok(is_v2_error(post(d, b"{\"inputs\": [1,"), 400, "not valid JSON"), "broken JSON: 400")

    # a body that arrives in small pieces: the header and the binary data split anywhere
    a = random_matrix(rng, (3, 4), "float32")
    b = random_matrix(rng, (4, 5), "float32")
    body, hl = infer_body({"A": (a, "FP32"), "B": (b, "FP32")}, binary=("A", "B"),
                          outputs=[{"name": "C", "parameters": {"binary_data": True}}])
    s = socket.create_connection(("127.0.0.1", d.port), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nInference-Header-Content-Length: %d\r\n"
              b"Connection: close\r\n\r\n" % (INFER.encode(), len(body), hl))
    for i in range(0, len(body), 13):
        s.sendall(body[i:i + 13])
        time.sleep(0.003)
    raw = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        raw += chunk
    s.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    hdrs = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:] if b": " in line)
    n = int(hdrs.get(b"Inference-Header-Content-Length", b"0"))
    good, why = compare(np.frombuffer(payload[n:], "<f4").reshape(3, 5), reference(a, b, "float32"), "float32", 4) \
        if head.startswith(b"HTTP/1.1 200") and len(payload) == n + 60 else (False, raw[:300])
    tap.ok(good, "a binary body sent 13 bytes at a time: right", why)

    # http.client, keep-alive: several requests on one connection
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30)
    oks = 0
    for i in range(3):
        a = random_matrix(rng, (5, 5), "float32")
        body, hl = infer_body({"A": (a, "FP32"), "B": (a, "FP32")}, binary=("A", "B"),
                              outputs=[{"name": "C", "parameters": {"binary_data": True}}])
        conn.request("POST", INFER, body=body, headers={"Inference-Header-Content-Length": str(hl)})
        resp = conn.getresponse()
        data = resp.read()
        n = int(resp.getheader("Inference-Header-Content-Length") or 0)
        good, _ = compare(np.frombuffer(data[n:], "<f4").reshape(5, 5), reference(a, a, "float32"), "float32", 5)
        oks += resp.status == 200 and good
    conn.close()
    tap.eq(oks, 3, "three binary infers on one keep-alive connection (http.client)")

    _, m = d.metrics()
    tap.ok(m and metric(m, "gemmd_requests_total", route="/v2/models/{model}/infer", code="200") >= 6
           and metric(m, "gemmd_requests_total", route="/v2/models/{model}/infer", code="400") >= 5
           and metric(m, "gemmd_requests_total", route="/v2/health/{live,ready}", code="200") >= 2,
           "/metrics counts the v2 routes by status")


def read_doc(path):
    with open(os.path.join(REPO, path)) as f:
        return f.read()


def blocks(text, lang):
    return [m.group(1) for m in re.finditer(r"^```%s\n(.*?)^```" % lang, text, re.M | re.S)]


def readme_v2_section():
    text = read_doc("README.md")
    start = text.index("## From tools that speak KServe v2")
    end = text.find("\n## ", start + 3)
    return text[start:end if end > 0 else len(text)]


def doc_checks(tap, d, have_triton):
    v2md = read_doc("docs/V2.md")
    js = blocks(v2md, "json")
    req, ans, err = json.loads(js[0]), json.loads(js[1]), json.loads(js[2])
    r = post(d, json.dumps(req).encode())
    j = r.json() or {}
    tap.ok(r.status == 200 and set(j) == set(ans) and j.get("id") == ans["id"]
           and j["outputs"][0] == ans["outputs"][0] and set(j["parameters"]) == set(ans["parameters"]),
           "V2.md: the request example gets the answer example (C, keys, parameters)", r)
    body, _ = infer_body({"A": (np.ones((2, 3), np.float32), "FP32"), "B": (np.ones((4, 2), np.float32), "FP32")})
    r = post(d, body)
    tap.ok(r.status == 400 and r.json() == err, "V2.md: the error example is what a 2x3 times 4x2 gets", r)

    ex = blocks(v2md, "http")[0]
    hl = int(re.search(r"Inference-Header-Content-Length: (\d+)", ex).group(1))
    cl = int(re.search(r"Content-Length: (\d+)", ex.replace("Inference-Header-Content-Length", "")).group(1))
    text = ex.split("\n\n", 1)[1]
    head = "".join(line.strip() for line in text.split("<16 bytes")[0].splitlines()).encode()
    a = np.arange(4, dtype=np.float32).reshape(2, 2)
    b = np.arange(4, 8, dtype=np.float32).reshape(2, 2)
    ok = len(head) == hl and hl + 32 == cl
    r = post(d, head + a.tobytes() + b.tobytes(), hl)
    if ok and r.status == 200:
        _, data = split_binary(r)
        ok = np.array_equal(np.frombuffer(data, "<f4").reshape(2, 2), a @ b)
    tap.ok(ok and r.status == 200, "V2.md: the binary example's lengths are right and it computes A.B",
           (len(head), hl, cl, r))

    sh = blocks(readme_v2_section(), "sh")
    p = subprocess.run(["bash", "-euo", "pipefail", "-c", sh[0].replace("localhost:8080", "127.0.0.1:%d" % d.port)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60) if sh else None
    want = re.search(r'^# (\{.*"data":\[11\]\}\])', sh[0], re.M) if sh else None
    tap.ok(p is not None and p.returncode == 0 and want is not None and want.group(1) in p.stdout.decode(),
           "README: the v2 curl block runs and answers what its comment shows", p and p.stdout.decode()[-600:])

    for doc, text in (("README", readme_v2_section()), ("V2.md", v2md)):
        name = "%s: the tritonclient example runs (48x48) and computes A.B" % doc
        if not have_triton:
            tap.skip(name, "no tritonclient")
            continue
        code = blocks(text, "python")[0].replace('"gpu-box:8080"', '"127.0.0.1:%d"' % d.port)
        code = code.replace("4096", "48").replace('"cublas"', '"openblas"')
        ns = {}
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(code, "%s example" % doc, "exec"), ns)  # noqa: S102 - our own docs
        good, why = compare(ns["c"], reference(ns["a"], ns["b"], "float32"), "float32", 48)
        tap.ok(good, name, why)


def limit_checks(tap):
    """Limits, as for /v1: max_dim, max_json_mb, max_body_mb; and backend failures."""
    with Daemon(tap, config={"backend": "cpu", "max_dim": "300", "max_json_mb": "1", "max_body_mb": "1"}) as d:
        big = np.ones((301, 2), np.float32)
        body, hl = infer_body({"A": (big, "FP32"), "B": (np.ones((2, 2), np.float32), "FP32")}, binary=("A", "B"))
        tap.ok(is_v2_error(post(d, body, hl), 413, "exceeds"), "a dimension over max_dim: 413")
        a = np.ones((300, 300), np.float64)
        body, hl = infer_body({"A": (a, "FP64"), "B": (a, "FP64")}, binary=("A", "B"))
        # Refusals decided from the head: the client asks with Expect: 100-continue, as a
        # client sending a big body should, so the refusal comes before the body is sent
        # (without it, the server closing on unread bytes may reset the connection before
        # the client has read the 413).
        exp = ["Expect: 100-continue"]
        r = post(d, body, hl, headers=exp)
        tap.ok(is_v2_error(r, 413, "max_body_mb"), "a body over max_body_mb: 413 before reading", r)
        a = np.ones((250, 250), np.float64)
        body, hl = infer_body({"A": (a, "FP64"), "B": (a, "FP64")}, binary=("A", "B"))
        r = post(d, body, hl)
        tap.ok(is_v2_error(r, 400, "binary_data"), "C too large for a JSON answer: 400 saying to ask for binary", r)
        body2, hl2 = infer_body({"A": (a, "FP64"), "B": (a, "FP64")}, binary=("A", "B"),
                                outputs=[{"name": "C", "parameters": {"binary_data": True}}])
        r = post(d, body2, hl2)
        ok = r.status == 200
        if ok:
            _, data = split_binary(r)
            ok = np.array_equal(np.frombuffer(data, "<f8").reshape(250, 250), np.full((250, 250), 250.0))
        tap.ok(ok, "the same product asked for as binary: 200 and right", r)
        a = random_matrix(np.random.default_rng(1), (300, 300), "float32")
        body, _ = infer_body({"A": (a, "FP32"), "B": (a, "FP32")})
        r = post(d, body, headers=exp)
        tap.ok(is_v2_error(r, 413, "max_json_mb"), "a JSON body over max_json_mb: 413", r)
        head = b" " * (1024 * 1024 + 1)
        tap.ok(is_v2_error(post(d, head, len(head), headers=exp), 413, "JSON header"),
               "Inference-Header-Content-Length over max_json_mb: 413")
        tap.eq(d.curl("GET", "/v2/health/live").status, 200, "still live after the refusals")
    with Daemon(tap, config={"backend": "cpu", "fault_inject": "cpu_fail:1"}) as d:
        body, _ = infer_body({"A": (np.ones((2, 2), np.float32), "FP32"), "B": (np.ones((2, 2), np.float32), "FP32")})
        r = post(d, body)
        tap.ok(is_v2_error(r, 500) and (r.json() or {}).get("code") == "backend_failure",
               "a failing product: 500 in the protocol's shape", r)
        tap.eq(d.curl("GET", "/v2/health/live").status, 200, "the daemon keeps serving after it")


# ---------------------------------------------------------------------------- tritonclient

def triton_checks(tap, d, token=None):
    import tritonclient.http as th
    from tritonclient.utils import InferenceServerException

    # tritonclient adds Inference-Header-Content-Length to the headers dict it is given:
    # every call gets a fresh one.
    def hdrs():
        return {"Authorization": "Bearer " + token} if token else None

    c = th.InferenceServerClient("127.0.0.1:%d" % d.port, concurrency=8)
    rng = np.random.default_rng(7)

    tap.ok(c.is_server_live(headers=hdrs()) and c.is_server_ready(headers=hdrs()), "tritonclient: server live and ready")
    tap.ok(c.is_model_ready("matmul", headers=hdrs()) and c.is_model_ready("matmul", "1", headers=hdrs())
           and not c.is_model_ready("nope", headers=hdrs()), "tritonclient: model matmul ready, nope not")
    meta = c.get_server_metadata(headers=hdrs())
    tap.ok(meta.get("name") == "gemmd" and "binary_tensor_data" in meta.get("extensions", []),
           "tritonclient: server metadata", meta)
    mm = c.get_model_metadata("matmul", headers=hdrs())
    tap.ok([t["name"] for t in mm["inputs"]] == ["A", "B"] and [t["name"] for t in mm["outputs"]] == ["C"],
           "tritonclient: model metadata names A, B -> C", mm)

    def infer(a, b, dt, in_mode="binary", out_mode="binary", **kw):
        ia = th.InferInput("A", list(a.shape), dt)
        ib = th.InferInput("B", list(b.shape), dt)
        ia.set_data_from_numpy(a, binary_data=in_mode in ("binary", "mixed"))
        ib.set_data_from_numpy(b, binary_data=in_mode == "binary")
        outs = None if out_mode == "default" else [th.InferRequestedOutput("C", binary_data=out_mode == "binary")]
        return c.infer("matmul", [ia, ib], outputs=outs, headers=hdrs(), **kw)

    shapes = [(1, 1, 1), (37, 53, 29), (1, 100, 1), (64, 1, 17), (3, 130, 5)]
    n = 0
    for dt, name in V2_DTYPES.items():
        for in_mode in ("binary", "json", "mixed"):
            for out_mode in ("binary", "json", "default"):
                m, k, nn = shapes[n % len(shapes)]
                n += 1
                a = random_matrix(rng, (m, k), name)
                b = random_matrix(rng, (k, nn), name)
                rid = "t-%d" % n
                res = infer(a, b, dt, in_mode, out_mode, request_id=rid)
                cc = res.as_numpy("C")
                good, why = compare(cc, reference(a, b, name), name, k)
                resp = res.get_response()
                out = resp["outputs"][0]
                tap.ok(good and cc.dtype == NP[dt] and resp.get("id") == rid
                       and ("parameters" in out) == (out_mode != "json"),
                       "tritonclient %s %dx%dx%d inputs %s, C %s: right" % (dt, m, k, nn, in_mode, out_mode), why)
    for m, k, nn in shapes:
        a = random_matrix(rng, (m, k), "float32")
        b = random_matrix(rng, (k, nn), "float32")
        good, why = compare(infer(a, b, "FP32").as_numpy("C"), reference(a, b, "float32"), "float32", k)
        tap.ok(good, "tritonclient FP32 binary %dx%dx%d" % (m, k, nn), why)

    res = infer(np.ones((4, 4), np.float32), np.ones((4, 4), np.float32), "FP32",
                parameters={"kernel": "openblas", "math": "fp32"})
    p = res.get_response().get("parameters", {})
    tap.ok(p.get("kernel") == "openblas" and p.get("math") == "fp32", "tritonclient parameters= pick kernel and math", p)

    def expect_error(fn, status, needle, name):
        try:
            fn()
        except InferenceServerException as e:
            return tap.ok(e.status() == str(status) and needle in (e.message() or ""), name,
                          "status %r message %r" % (e.status(), e.message()))
        return tap.ok(False, name, "no exception")

    def bad_names():
        ia = th.InferInput("X", [2, 2], "FP32")
        ia.set_data_from_numpy(np.ones((2, 2), np.float32))
        ib = th.InferInput("B", [2, 2], "FP32")
        ib.set_data_from_numpy(np.ones((2, 2), np.float32))
        c.infer("matmul", [ia, ib], headers=hdrs())
    expect_error(bad_names, 400, "unexpected inference input 'X'", "tritonclient: wrong input name is a 400")

    def mismatch():
        infer(np.ones((2, 3), np.float32), np.ones((4, 2), np.float32), "FP32")
    expect_error(mismatch, 400, "A's columns (3) must equal B's rows (4)", "tritonclient: shape mismatch is a 400")

    def uint8():
        infer(np.ones((2, 2), np.uint8), np.ones((2, 2), np.uint8), "UINT8")
    expect_error(uint8, 400, "UINT8 is not supported", "tritonclient: UINT8 is a 400")

    # FP16 operands: C is FP32 by default, FP16 with parameters.out_dtype; against NumPy's
    # float64 product of the float16 inputs (float32 sums; FP16 C adds half an ulp)
    a16 = np.random.default_rng(3).uniform(-1, 1, (9, 17)).astype(np.float16)
    b16 = np.random.default_rng(4).uniform(-1, 1, (17, 5)).astype(np.float16)
    ref16 = a16.astype(np.float64) @ b16.astype(np.float64)
    for mode in ("binary", "json"):
        try:
            c32 = infer(a16, b16, "FP16", in_mode=mode, out_mode=mode).as_numpy("C")
            c16 = infer(a16, b16, "FP16", in_mode=mode, out_mode=mode, parameters={"out_dtype": "FP16"}).as_numpy("C")
        except Exception as e:  # noqa: BLE001
            tap.ok(False, "tritonclient: FP16 (%s)" % mode, repr(e))
            continue
        tap.ok(c32.dtype == np.float32 and (np.abs(c32 - ref16) <= 1e-5 * 17 + 1e-6).all(),
               "tritonclient: FP16 operands (%s), C FP32" % mode, "%s %r" % (c32.dtype, c32[:1]))
        tap.ok(c16.dtype == np.float16 and
               (np.abs(c16.astype(np.float64) - ref16) <= 1e-5 * 17 + 2.0 ** -11 * np.abs(ref16) + 2.0 ** -25).all(),
               "tritonclient: FP16 operands (%s), out_dtype FP16: C FP16" % mode, "%s %r" % (c16.dtype, c16[:1]))

    def missing():
        ia = th.InferInput("A", [2, 2], "FP32")
        ia.set_data_from_numpy(np.ones((2, 2), np.float32))
        c.infer("matmul", [ia], headers=hdrs())
    expect_error(missing, 400, "missing B", "tritonclient: a missing input is a 400")

    def wrong_output():
        ia = th.InferInput("A", [2, 2], "FP32")
        ia.set_data_from_numpy(np.ones((2, 2), np.float32))
        ib = th.InferInput("B", [2, 2], "FP32")
        ib.set_data_from_numpy(np.ones((2, 2), np.float32))
        c.infer("matmul", [ia, ib], outputs=[th.InferRequestedOutput("D")], headers=hdrs())
    expect_error(wrong_output, 400, "unexpected inference output 'D'", "tritonclient: a wrong output name is a 400")

    def bad_math():
        infer(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32), "FP32", parameters={"math": "fp8"})
    expect_error(bad_math, 400, "math", "tritonclient: a bad math parameter is a 400")

    def other_model():
        c.get_model_metadata("nope", headers=hdrs())
    expect_error(other_model, 404, "unknown model 'nope'", "tritonclient: unknown model metadata is a 404")

    def version_two():
        ia = th.InferInput("A", [1, 1], "FP32")
        ia.set_data_from_numpy(np.ones((1, 1), np.float32))
        ib = th.InferInput("B", [1, 1], "FP32")
        ib.set_data_from_numpy(np.ones((1, 1), np.float32))
        c.infer("matmul", [ia, ib], model_version="2", headers=hdrs())
    expect_error(version_two, 404, "no version '2'", "tritonclient: infer on version 2 is a 404")
    res = infer(np.ones((1, 1), np.float32), np.ones((1, 1), np.float32), "FP32", model_version="1")
    tap.ok(res.as_numpy("C").tolist() == [[1.0]], "tritonclient: infer on version 1")

    # many at once: async_infer (gevent greenlets over the client's pool)
    jobs = []
    for i in range(24):
        m, k, nn = 8 + i, 16 + (i * 7) % 23, 5 + i % 4
        a = random_matrix(rng, (m, k), "float32")
        b = random_matrix(rng, (k, nn), "float32")
        ia = th.InferInput("A", [m, k], "FP32")
        ia.set_data_from_numpy(a)
        ib = th.InferInput("B", [k, nn], "FP32")
        ib.set_data_from_numpy(b)
        jobs.append((c.async_infer("matmul", [ia, ib], request_id=str(i), headers=hdrs()), a, b, k, str(i)))
    oks = 0
    for h, a, b, k, rid in jobs:
        res = h.get_result(timeout=120)
        good, _ = compare(res.as_numpy("C"), reference(a, b, "float32"), "float32", k)
        oks += good and res.get_response().get("id") == rid
    tap.eq(oks, len(jobs), "tritonclient async_infer: 24 concurrent products, every one right and its own id")
    c.close()
    aio_checks(tap, d, hdrs, rng)


def aio_checks(tap, d, hdrs, rng):
    import tritonclient.http.aio as aio
    import tritonclient.http as th

    async def run():
        client = aio.InferenceServerClient("127.0.0.1:%d" % d.port)
        try:
            cases = []
            for i in range(16):
                dt = list(V2_DTYPES)[i % 3]
                name = V2_DTYPES[dt]
                a = random_matrix(rng, (6 + i, 11), name)
                b = random_matrix(rng, (11, 3 + i % 5), name)
                ia = th.InferInput("A", list(a.shape), dt)
                ia.set_data_from_numpy(a, binary_data=i % 2 == 0)
                ib = th.InferInput("B", list(b.shape), dt)
                ib.set_data_from_numpy(b)
                cases.append((client.infer("matmul", [ia, ib], headers=hdrs()), a, b, name))
            results = await asyncio.gather(*(cs[0] for cs in cases))
            return sum(compare(r.as_numpy("C"), reference(a, b, name), name, 11)[0]
                       for r, (_, a, b, name) in zip(results, cases))
        finally:
            await client.close()

    tap.eq(asyncio.run(run()), 16, "tritonclient.http.aio: 16 concurrent infers of every datatype, all right")


def token_checks(tap):
    import tritonclient.http as th
    from tritonclient.utils import InferenceServerException

    tokfile = os.path.join(os.environ.get("TMPDIR", "/tmp"), "gemmd-v2-tokens-%d" % os.getpid())
    with open(tokfile, "w") as f:
        f.write("v2-secret-token\n")
    try:
        with Daemon(tap, config={"backend": "cpu", "tokens_file": tokfile}) as d:
            c = th.InferenceServerClient("127.0.0.1:%d" % d.port)
            tap.ok(c.is_server_live() and c.is_server_ready(), "tokens: health needs no token (probes)")
            for what, hdr in (("no token", None), ("a wrong token", {"Authorization": "Bearer nope"})):
                try:
                    c.get_server_metadata(headers=hdr)
                    tap.ok(False, "tokens: metadata with %s is refused" % what)
                except InferenceServerException as e:
                    tap.ok(e.status() == "401" and "Bearer" in e.message(), "tokens: metadata with %s is a 401" % what,
                           e.message())
            r = d.curl("POST", INFER, data=b"{}")
            tap.ok(is_v2_error(r, 401) and (r.header("www-authenticate") or "").startswith("Bearer"),
                   "tokens: infer without a token is a 401 with WWW-Authenticate", r)
            triton_checks(tap, d, token="v2-secret-token")
            c.close()
    finally:
        os.unlink(tokfile)


def main(tap):
    why = ensure_venv()
    with Daemon(tap, config={"backend": "cpu"}) as d:
        raw_checks(tap, d)
        doc_checks(tap, d, not why)
        if why:
            tap.skip("tritonclient[http] checks (health, metadata, every datatype, errors, async)", why)
        else:
            triton_checks(tap, d)
    limit_checks(tap)
    if why:
        tap.skip("tritonclient[http] with bearer tokens", why)
    else:
        token_checks(tap)


if __name__ == "__main__":
    from harness import Tap
    run_guarded(Tap(), main)
