#!/usr/bin/python3
"""test_errors.py - every error path answers with its status, a stable code and a message,
and the daemon keeps serving afterwards.

Each case checks: the HTTP status, that the body is {"error": {"code", "message"}} with a
snake_case code (the one named where the contract fixes it) and a non-empty message, and
that the answer is JSON. At the end /healthz still answers and a good product computes.
"""
import json
import os
import re
import struct
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (Daemon, Tap, npy_bytes, raw_request, reference, run_guarded)  # noqa: E402

CODE_RE = re.compile(r"^[a-z][a-z0-9_]*$")
NO_TIMING = []  # error answers without a Server-Timing header


def expect_error(tap, r, status, name, code=None):
    """r answers status with a JSON error (and the given code when one is named)."""
    got_code, msg = r.error()
    ct = (r.header("content-type") or "").split(";")[0].strip()
    ok = (r.status == status and isinstance(got_code, str) and CODE_RE.match(got_code or "") is not None
          and isinstance(msg, str) and msg.strip() != "" and ct == "application/json"
          and (code is None or got_code == code))
    tap.ok(ok, "%s -> %d%s" % (name, status, (" " + code) if code else ""), r)
    if r.status and r.header("server-timing") is None:
        NO_TIMING.append(name)
    return got_code


def post_json(d, obj_or_text, path="/v1/matmul", **kw):
    data = obj_or_text if isinstance(obj_or_text, (bytes, str)) else json.dumps(obj_or_text)
    if isinstance(data, str):
        data = data.encode()
    return d.curl("POST", path, data=data, content_type="application/json", **kw)


def npy_header_bytes(descr, shape, fortran=False):
    """A hand-made format 1.0 .npy header (for dtypes NumPy would not write as asked)."""
    d = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, fortran, repr(tuple(shape)))
    total = 10 + len(d) + 1
    pad = (64 - total % 64) % 64
    d = d + " " * pad + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(d)) + d.encode("latin-1")


def json_cases(tap, d):
    ok2 = [[1, 2], [3, 4]]
    expect_error(tap, post_json(d, '{"a": [[1,2],[3,4]], "b": [[1],[2]'), 400, "truncated JSON text", "bad_json")
    expect_error(tap, post_json(d, "not json at all"), 400, "malformed JSON", "bad_json")
    expect_error(tap, post_json(d, b""), 400, "empty JSON body")
    expect_error(tap, post_json(d, "[1, 2, 3]"), 400, "JSON body that is not an object")
    expect_error(tap, post_json(d, {"a": [[1, 2], [3]], "b": ok2}), 400, "ragged rows", "bad_matrix")
    expect_error(tap, post_json(d, {"a": [[1, "x"], [3, 4]], "b": ok2}), 400, "non-numeric element", "bad_matrix")
    expect_error(tap, post_json(d, {"a": [[1, None], [3, 4]], "b": ok2}), 400, "null element", "bad_matrix")
    expect_error(tap, post_json(d, {"a": [[1, [2]], [3, 4]], "b": ok2}), 400, "nested too deep", "bad_matrix")
    expect_error(tap, post_json(d, {"b": ok2}), 400, "missing a", "bad_matrix")
    expect_error(tap, post_json(d, {"a": ok2}), 400, "missing b", "bad_matrix")
    expect_error(tap, post_json(d, {"a": {"shape": [2, 2], "data": [1, 2, 3]}, "b": ok2}), 400,
                 "shape/data length mismatch", "bad_matrix")
    expect_error(tap, post_json(d, {"a": [[1.5, 2], [3, 4]], "b": ok2, "dtype": "int32"}), 422,
                 "int32 value not an integer", "bad_value")
    expect_error(tap, post_json(d, {"a": [[3000000000, 2], [3, 4]], "b": ok2, "dtype": "int32"}), 422,
                 "int32 value out of range", "bad_value")
    expect_error(tap, post_json(d, {"a": [[1e300, 2], [3, 4]], "b": ok2, "dtype": "float32"}), 422,
                 "float32 value out of range", "bad_value")
    r = post_json(d, {"a": [], "b": ok2})
    expect_error(tap, r, r.status if r.status in (400, 422) else 422, "empty matrix []")
    r = post_json(d, {"a": [[]], "b": ok2})
    expect_error(tap, r, r.status if r.status in (400, 422) else 422, "empty matrix [[]]")
    expect_error(tap, post_json(d, {"a": [[1, 2, 3]], "b": ok2}), 422, "shape mismatch 1x3 . 2x2", "shape_mismatch")
    r = post_json(d, {"a": [[1, 2, 3]], "b": ok2})
    _, msg = r.error()
    tap.ok(msg is not None and "1x3" in msg and "2x2" in msg, "shape mismatch message names both shapes", r)
    expect_error(tap, post_json(d, {"a": ok2, "b": ok2, "dtype": "complex64"}), 422, "unknown dtype", "bad_option")
    expect_error(tap, post_json(d, b'{"a":' + b"[" * 100000 + b"]" * 100000 + b',"b":[[1]]}'), 400,
                 "JSON nested 100000 deep", "bad_json")
    expect_error(tap, post_json(d, b'{"a":[[1e999]],"b":[[1]]}'), 422, "1e999 overflows float64", "bad_value")
    expect_error(tap, post_json(d, b'{"a":[[NaN]],"b":[[1]]}'), 400, "NaN is not JSON", "bad_json")
    expect_error(tap, post_json(d, b'{"a":[[true]],"b":[[1]]}'), 400, "boolean element", "bad_matrix")
    for shape in ("[-1,1]", "[1e20,1]", "[1.5,1]", "[1,1,1,1]", "[1]", '"2x2"'):
        body = ('{"a":{"shape":%s,"data":[1]},"b":[[2]]}' % shape).encode()
        expect_error(tap, post_json(d, body), 400, "shape %s" % shape, "bad_matrix")


def option_cases(tap, d):
    ok2 = [[1, 2], [3, 4]]
    expect_error(tap, post_json(d, {"a": ok2, "b": ok2, "kernel": "no_such_kernel"}), 422, "unknown kernel")
    expect_error(tap, post_json(d, {"a": ok2, "b": ok2, "math": "fp8"}), 422, "unknown math mode", "bad_option")
    expect_error(tap, post_json(d, {"a": ok2, "b": ok2, "tile": "big"}), 422, "tile not a number")
    expect_error(tap, post_json(d, ok2 and {"a": ok2, "b": ok2}, path="/v1/matmul?kernel=nope"), 422,
                 "unknown kernel in the query")
    expect_error(tap, post_json(d, {"a": ok2, "b": ok2}, path="/v1/matmul?dtype=float8"), 422,
                 "unknown dtype in the query", "bad_option")


def raw_cases(tap, d):
    a = np.ones((2, 3), dtype=np.float32)
    b = np.ones((3, 2), dtype=np.float32)
    body = a.tobytes() + b.tobytes()

    def raw(query, data=body):
        return d.curl("POST", "/v1/matmul" + query, data=data, content_type="application/octet-stream")

    expect_error(tap, raw("?m=2&k=3&n=2&dtype=float32", body[:-4]), 400, "raw body shorter than m,k,n say")
    expect_error(tap, raw("?m=2&k=3&n=2&dtype=float32", body + b"\0" * 4), 400, "raw body longer than m,k,n say")
    expect_error(tap, raw("?k=3&n=2&dtype=float32"), 400, "raw without m")
    expect_error(tap, raw("?m=2&k=x&n=2&dtype=float32"), 400, "raw with a non-numeric k", "bad_dimension")
    expect_error(tap, raw("?m=-2&k=3&n=2&dtype=float32"), 400, "raw with a negative m", "bad_dimension")
    r = raw("?m=0&k=3&n=2&dtype=float32", b"")
    expect_error(tap, r, r.status if r.status in (400, 422) else 422, "raw with m=0 (400 or 422)")
    expect_error(tap, raw("?m=2&k=3&n=2&dtype=uint16"), 422, "raw with an unknown dtype", "bad_option")

    # no Content-Length (chunked upload) for raw: 411
    head = (b"POST /v1/matmul?m=2&k=3&n=2&dtype=float32 HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n"
            b"Connection: close\r\n\r\n")
    chunk = b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
    st, h, bd, raw_ans = raw_request(d.port, head, chunk, read_timeout=10)
    code = _code(bd)
    tap.ok(st == 411 and code, "raw body without Content-Length -> 411", raw_ans[:400])


def _code(body):
    try:
        j = json.loads(body.decode())
        c = j["error"]["code"]
        return c if j["error"].get("message") else None
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None


def limit_cases(tap, d):
    """The daemon runs with max_dim 64, max_elements 2000, max_body_mb 1."""
    a = np.ones((65, 2)).tolist()
    expect_error(tap, post_json(d, {"a": a, "b": np.ones((2, 2)).tolist()}), 413, "dimension over max_dim",
                 "too_large")
    a = np.ones((50, 50)).tolist()
    expect_error(tap, post_json(d, {"a": a, "b": np.ones((50, 2)).tolist()}), 413,
                 "element count over max_elements", "too_large")
    expect_error(tap, post_json(d, {"a": np.ones((50, 1)).tolist(), "b": np.ones((1, 50)).tolist()}), 413,
                 "small A and B but C over max_elements", "too_large")
    r = d.curl("POST", "/v1/matmul?m=64&k=64&n=1&dtype=float64", data=b"\0" * (64 * 64 * 8 + 64 * 8),
               content_type="application/octet-stream")
    expect_error(tap, r, 413, "raw A over max_elements", "too_large")
    r = d.curl("POST", "/v1/matmul?m=4294967296&k=1&n=1&dtype=float64", data=b"\0" * 16,
               content_type="application/octet-stream")
    expect_error(tap, r, 413, "raw m far over max_dim", "too_large")
    r = d.curl("POST", "/v1/matmul?m=99999999999999999999999&k=1&n=1&dtype=float64", data=b"\0" * 16,
               content_type="application/octet-stream")
    expect_error(tap, r, 400, "raw m overflowing 64 bits", "bad_dimension")
    arr = np.ones((65, 1), dtype=np.float32)
    r = d.matmul_npy(npy_bytes(arr), npy_bytes(np.ones((1, 1), dtype=np.float32)))
    expect_error(tap, r, 413, "npy shape over max_dim", "too_large")

    # 413 before the body is read: only headers with a huge Content-Length are sent,
    # and the answer must arrive without any body byte.
    for ctype, path in (("application/octet-stream", "/v1/matmul?m=2&k=2&n=2&dtype=float32"),
                        ("application/json", "/v1/matmul"),
                        ("multipart/form-data; boundary=xyz", "/v1/matmul"),
                        ("application/json", "/v1/jobs")):
        head = ("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\nContent-Length: 1099511627776\r\n\r\n"
                % (path, ctype)).encode()
        st, h, bd, raw_ans = raw_request(d.port, head, b"", read_timeout=10)
        tap.ok(st == 413 and _code(bd) is not None, "1 TiB Content-Length (%s %s) -> 413 before any body byte"
               % (ctype.split(";")[0], path.split("?")[0]), raw_ans[:400])
    # with Expect: 100-continue the refusal comes instead of the 100
    r = d.curl("POST", "/v1/matmul?m=2&k=2&n=2&dtype=float32", data=b"\0" * (2 * 1024 * 1024),
               content_type="application/octet-stream", headers=["Expect: 100-continue"])
    expect_error(tap, r, 413, "2 MiB raw body with Expect: 100-continue", "body_too_large")
    # a JSON body over max_json_mb (1 MiB here) is refused from its Content-Length too
    head = (b"POST /v1/matmul HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1048577\r\n\r\n")
    st, h, bd, raw_ans = raw_request(d.port, head, b"", read_timeout=10)
    tap.ok(st == 413 and _code(bd) is not None, "JSON Content-Length just over max_json_mb -> 413", raw_ans[:400])


def no_smuggling(tap, d):
    """A body refused early must not be read as further requests on the same connection:
    after the 413 the server closes the connection (or discards the body), so the GET
    lines hidden in the body are never answered."""
    hidden = b"GET /v1/nope-hidden HTTP/1.1\r\nHost: x\r\n\r\n" * 40000  # about 1.6 MB > 1 MiB limit
    head = (b"POST /v1/matmul HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
            b"Content-Length: %d\r\n\r\n" % len(hidden))
    import socket
    s = socket.create_connection(("127.0.0.1", d.port), timeout=10)
    raw = b""
    try:
        try:
            s.sendall(head + hidden)
        except (BrokenPipeError, ConnectionResetError):
            pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except (socket.timeout, ConnectionResetError):
                break
            if not chunk:
                break
            raw += chunk
    finally:
        s.close()
    statuses = re.findall(rb"HTTP/1\.[01] (\d{3})", raw)
    tap.ok(statuses[:1] == [b"413"] and b"404" not in statuses and len(statuses) == 1,
           "body of a refused request is never parsed as more requests (statuses %r)" % statuses, raw[:300])


def npy_cases(tap, d):
    good = npy_bytes(np.ones((2, 2), dtype=np.float32))
    be = np.ones((2, 2), dtype=">f4")
    expect_error(tap, d.matmul_npy(npy_bytes(be), good), 415, "big-endian npy", "unsupported_dtype")
    obj = npy_header_bytes("|O", (2, 2)) + b"\0" * 32
    expect_error(tap, d.matmul_npy(obj, good), 415, "object-dtype npy", "unsupported_dtype")
    c64 = npy_bytes(np.ones((2, 2), dtype=np.complex64))
    expect_error(tap, d.matmul_npy(c64, good), 415, "complex64 npy", "unsupported_dtype")
    four = npy_bytes(np.ones((2, 2, 2, 2), dtype=np.float32))
    expect_error(tap, d.matmul_npy(four, good), 422, "4-D npy", "bad_shape")
    one = npy_bytes(np.ones((4,), dtype=np.float32))
    expect_error(tap, d.matmul_npy(one, good), 422, "1-D npy", "bad_shape")
    expect_error(tap, d.matmul_npy(good[:-5], good), 400, "truncated npy data", "truncated")
    expect_error(tap, d.matmul_npy(good[:20], good), 400, "npy cut inside its header")
    expect_error(tap, d.matmul_npy(b"this is not an npy file at all, just some words", good), 400,
                 "garbage instead of npy", "bad_npy")
    expect_error(tap, d.matmul_npy(good + b"\0\0\0\0", good), 400, "npy with trailing bytes", "bad_npy")
    bad_hdr = b"\x93NUMPY\x01\x00" + struct.pack("<H", 22) + b"{'descr': <f4 \x00\x01}\n"
    expect_error(tap, d.matmul_npy(bad_hdr + b"\0" * 16, good), 400, "npy with a malformed header dict", "bad_npy")
    latin = npy_bytes(np.ones((2, 2), dtype=np.float32)).replace(b"'descr'", b"'d\xe9scr'")
    expect_error(tap, d.matmul_npy(latin, good), 400, "npy header key with a non-UTF-8 byte (answer stays UTF-8)",
                 "bad_npy")
    expect_error(tap, d.matmul_npy(npy_bytes(np.ones((0, 5), dtype=np.float32)), good), 422, "npy 0x5",
                 "empty_matrix")
    huge = b"\x93NUMPY\x02\x00" + struct.pack("<I", 0xFFFFFFF0) + b"{'descr'"
    expect_error(tap, d.matmul_npy(huge, good), 400, "npy claiming a 4 GiB header", "bad_npy")
    mixed = npy_bytes(np.ones((2, 2), dtype=np.float64))
    r = d.matmul_npy(good, mixed)
    expect_error(tap, r, r.status if r.status in (400, 415, 422) else 422, "npy a float32, b float64")
    expect_error(tap, d.matmul_npy(npy_bytes(np.ones((2, 3), dtype=np.float32)), good), 422,
                 "npy shape mismatch", "shape_mismatch")


def multipart_cases(tap, d):
    good = npy_bytes(np.ones((2, 2), dtype=np.float32))
    path = os.path.join(d.tmp.name, "G.npy")
    with open(path, "wb") as f:
        f.write(good)
    r = d.curl("POST", "/v1/matmul", form=["a=@" + path])
    expect_error(tap, r, 400, "multipart without part b")
    r = d.curl("POST", "/v1/matmul", form=["a=@" + path, "a=@" + path, "b=@" + path])
    expect_error(tap, r, 400, "multipart with part a twice")
    r = d.curl("POST", "/v1/matmul", form=["a=@" + path, "b=@" + path, "kernel=zzz"])
    expect_error(tap, r, 422, "multipart with a bad kernel field")
    r = d.curl("POST", "/v1/matmul", form=["x=@" + path, "y=@" + path])
    expect_error(tap, r, 400, "multipart with unknown part names only")
    body = b"--xyz--\r\n"
    r = d.curl("POST", "/v1/matmul", data=body, content_type="multipart/form-data; boundary=xyz")
    expect_error(tap, r, 400, "multipart with no parts")
    r = d.curl("POST", "/v1/matmul", data=b"--abc\r\n", content_type="multipart/form-data")
    expect_error(tap, r, 400, "multipart without a boundary", "bad_multipart")
    body = (b"--xyz\r\nContent-Disposition: form-data; name=\"a\"; filename=\"A.npy\"\r\n\r\n" + good +
            b"\r\n--xyz\r\nContent-Disposition: form-data; name=\"b\"; filename=\"B.npy\"\r\n\r\n" + good +
            b"\r\n--xyz--\r\n")
    r = d.curl("POST", "/v1/matmul", data=body, content_type="multipart/form-data; boundary=other")
    expect_error(tap, r, 400, "multipart whose boundary never appears")
    r = d.curl("POST", "/v1/matmul", data=body[:-9], content_type="multipart/form-data; boundary=xyz")
    expect_error(tap, r, 400, "multipart without the closing boundary")
    r = d.curl("POST", "/v1/matmul", data=body, content_type="multipart/form-data; boundary=xyz")
    tap.eq(r.status, 200, "the same multipart body with the right boundary computes")


def http_cases(tap, d):
    ok = json.dumps({"a": [[1]], "b": [[1]]}).encode()
    expect_error(tap, d.curl("POST", "/v1/matmul", data=ok, content_type="text/plain"), 415,
                 "Content-Type text/plain")
    expect_error(tap, d.curl("POST", "/v1/matmul", data=ok, content_type="application/xml"), 415,
                 "Content-Type application/xml")
    expect_error(tap, d.curl("GET", "/nope"), 404, "unknown route /nope")
    expect_error(tap, d.curl("GET", "/v1/matmulx"), 404, "unknown route /v1/matmulx")
    expect_error(tap, d.curl("GET", "/v3/matmul"), 404, "unknown route /v3/matmul")  # /v2/...: test_v2.py
    expect_error(tap, d.curl("GET", "/v1/jobs/../metrics", extra=["--path-as-is"]), 404, "/v1/jobs/../metrics")
    # bytes that are not UTF-8 in what the message quotes: the answer must still be JSON (UTF-8)
    expect_error(tap, d.curl("GET", "/v1/nope%FF%C3"), 404, "unknown route with %FF%C3 in it (answer stays UTF-8)")
    expect_error(tap, d.curl("POST", "/v1/matmul?kernel=%FF%FE", data=b'{"a":[[1]],"b":[[1]]}',
                             content_type="application/json"), 422, "kernel %FF%FE (answer stays UTF-8)")
    expect_error(tap, d.curl("POST", "/v1/matmul", data=ok, extra=["-H", "Content-Type:"]), 415,
                 "no Content-Type")
    for method, path, allow in (("GET", "/v1/matmul", "POST"), ("PUT", "/v1/matmul", "POST"),
                                ("DELETE", "/healthz", "GET"), ("POST", "/v1/info", "GET"),
                                ("POST", "/metrics", "GET"), ("PATCH", "/v1/jobs", "POST"),
                                ("GET", "/v1/jobs", "POST"), ("DELETE", "/v1/jobs/abc/result", "GET")):
        r = d.curl(method, path)
        expect_error(tap, r, 405, "%s %s" % (method, path))
        tap.ok(allow in (r.header("allow") or ""), "%s %s: Allow names %s" % (method, path, allow), r)
    r = post_json(d, {"a": [[1]], "b": [[1]]}, accept="text/html")
    expect_error(tap, r, 406, "Accept text/html")
    r = post_json(d, {"a": [[1]], "b": [[1]]}, accept="image/png, text/plain;q=0.5")
    expect_error(tap, r, 406, "Accept with only unsupported types")
    r = post_json(d, {"a": [[1]], "b": [[1]]}, accept="text/html, application/x-npy;q=0.9")
    tap.ok(r.status == 200 and (r.header("content-type") or "").startswith("application/x-npy"),
           "Accept list with one supported type picks it", r)


def truncated_body_cases(tap, d):
    """Clients that close early: the daemon drops the request and keeps serving."""
    heads = [
        (b"POST /v1/matmul?m=16&k=16&n=16&dtype=float64 HTTP/1.1\r\nHost: x\r\n"
         b"Content-Type: application/octet-stream\r\nContent-Length: 4096\r\n\r\n", b"\0" * 1000),
        (b"POST /v1/matmul HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
         b"Content-Length: 5000\r\n\r\n", b'{"a": [[1, 2], [3'),
        (b"POST /v1/matmul HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=q\r\n"
         b"Content-Length: 5000\r\n\r\n", b"--q\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n\x93NUMPY"),
        (b"POST /v1/matmul HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
         b"Content-Length: 100\r\n", b""),  # headers not even finished
    ]
    for i, (head, part) in enumerate(heads):
        raw_request(d.port, head, part, close_after_send=True)
        # also half-close and wait: the connection must end (timeout or error), not hang forever
    time.sleep(0.2)
    r = d.curl("GET", "/healthz", max_time=10)
    tap.eq(r.status, 200, "after %d clients closed mid-request, /healthz answers" % len(heads))
    r = post_json(d, {"a": [[1, 2]], "b": [[3], [4]]})
    tap.ok(r.status == 200 and (r.json() or {}).get("c") == [[11.0]],
           "after clients closed mid-request, a product computes", r)


def run_all(tap):
    with Daemon(tap, config={"backend": "cpu", "max_dim": 64, "max_elements": 2000, "max_body_mb": 1,
                             "max_json_mb": 1}) as d:
        json_cases(tap, d)
        option_cases(tap, d)
        raw_cases(tap, d)
        limit_cases(tap, d)
        no_smuggling(tap, d)
        npy_cases(tap, d)
        multipart_cases(tap, d)
        http_cases(tap, d)
        truncated_body_cases(tap, d)
        tap.ok(not NO_TIMING, "every error answer carries Server-Timing", NO_TIMING)
        # still alive and right
        r = d.curl("GET", "/healthz")
        tap.eq(r.status, 200, "after every error, /healthz still answers 200")
        rng = np.random.default_rng(7)
        a = rng.standard_normal((5, 7))
        b = rng.standard_normal((7, 3))
        r = d.matmul_json(a, b, dtype="float64")
        c = (r.json() or {}).get("c")
        tap.ok(r.status == 200 and c is not None and np.allclose(c, reference(a, b, "float64"), atol=1e-12),
               "after every error, a good product still computes", r)

    # backend failures (the CPU backend's cpu_fail:2 hook fails every second product):
    # 500 with a JSON error, and the daemon keeps serving
    with Daemon(tap, config={"backend": "cpu", "fault_inject": "cpu_fail:2", "cpu_workers": 1}) as d:
        outcomes = []
        for i in range(4):
            r = d.matmul_json([[1.0, 2.0]], [[3.0], [4.0]])
            outcomes.append(r.status)
            if r.status == 500:
                expect_error(tap, r, 500, "injected backend failure (product %d)" % (i + 1), "backend_failure")
            else:
                tap.ok(r.status == 200 and (r.json() or {}).get("c") == [[11.0]],
                       "product %d between injected failures computes" % (i + 1), r)
        tap.eq(outcomes, [200, 500, 200, 500], "every second product fails, the others compute")
        tap.eq(d.curl("GET", "/healthz").status, 200, "after backend failures /healthz answers 200")

    # bearer tokens
    tmp_tokens = os.path.join(os.environ.get("TMPDIR", "/tmp"), "gemmd-e2e-tokens-%d" % os.getpid())
    with open(tmp_tokens, "w") as f:
        f.write("# tokens for the e2e test\nsecret-token-one\n\nsecret-token-two\n")
    try:
        with Daemon(tap, config={"backend": "cpu", "tokens_file": tmp_tokens}) as d:
            ok = json.dumps({"a": [[2]], "b": [[3]]}).encode()
            r = d.curl("POST", "/v1/matmul", data=ok, content_type="application/json")
            expect_error(tap, r, 401, "no token")
            tap.ok((r.header("www-authenticate") or "").lower().startswith("bearer"),
                   "401 carries WWW-Authenticate: Bearer", r)
            r = d.curl("POST", "/v1/matmul", data=ok, content_type="application/json",
                       headers=["Authorization: Bearer wrong"])
            expect_error(tap, r, 401, "wrong token")
            r = d.curl("POST", "/v1/matmul", data=ok, content_type="application/json",
                       headers=["Authorization: Bearer secret-token-on"])
            expect_error(tap, r, 401, "token prefix")
            r = d.curl("POST", "/v1/matmul", data=ok, content_type="application/json",
                       headers=["Authorization: Basic c2VjcmV0LXRva2VuLW9uZQ=="])
            expect_error(tap, r, 401, "Basic instead of Bearer")
            for tok in ("secret-token-one", "secret-token-two"):
                r = d.curl("POST", "/v1/matmul", data=ok, content_type="application/json",
                           headers=["Authorization: Bearer " + tok])
                tap.ok(r.status == 200 and (r.json() or {}).get("c") == [[6.0]], "valid token %s computes" % tok, r)
            r = d.curl("GET", "/v1/info")
            expect_error(tap, r, 401, "/v1/info without a token")
            # 401 comes before the body is read
            head = (b"POST /v1/matmul HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 1000000000\r\n\r\n")
            st, h, bd, raw_ans = raw_request(d.port, head, b"", read_timeout=10)
            tap.ok(st == 401, "no token with a huge body -> 401 before the body is read", raw_ans[:300])
            r = d.curl("GET", "/healthz")
            tap.eq(r.status, 200, "/healthz needs no token (liveness probes)")
            r = d.curl("GET", "/readyz")
            tap.eq(r.status, 200, "/readyz needs no token (readiness probes)")
            r = d.curl("GET", "/metrics")
            expect_error(tap, r, 401, "/metrics without a token")
            r = d.curl("GET", "/metrics", headers=["Authorization: Bearer secret-token-two"])
            tap.eq(r.status, 200, "/metrics with a token")
            r = d.curl("POST", "/v1/matmul", data=ok, content_type="application/json",
                       headers=["Authorization: Bearer # tokens for the e2e test"])
            expect_error(tap, r, 401, "a comment line of the tokens file is not a token")
            r = d.curl("POST", "/v1/matmul", data=ok, content_type="application/json",
                       headers=["Authorization: Bearer "])
            expect_error(tap, r, 401, "an empty bearer token")
    finally:
        os.unlink(tmp_tokens)


if __name__ == "__main__":
    run_guarded(Tap(), run_all)
