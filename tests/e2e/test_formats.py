#!/usr/bin/python3
"""test_formats.py - every request format x every dtype x odd shapes x every answer format.

Request formats: JSON nested arrays, JSON {"shape","data"}, raw little-endian binary with
the shapes in the query (curl --data-binary), multipart .npy (curl -F a=@A.npy -F b=@B.npy)
in C order, Fortran order and npy format 2.0. Answer formats by Accept: JSON, octet-stream
(with X-Gemm-Shape / X-Gemm-Dtype) and .npy. Every product is checked against NumPy in
float64 (int32: exact, in int64 wrapped to 32 bits); every answer carries Server-Timing.
"""
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (Daemon, compare, load_npy, np_dtype, npy_bytes, random_matrix,  # noqa: E402
                     reference, run_guarded, server_timing)

DTYPES = ["float32", "float64", "int32"]
SHAPES = [(1, 1, 1), (1, 40, 23), (37, 53, 29), (1, 1000, 1), (6, 1, 5)]
INPUTS = ["json-nested", "json-shape-data", "raw", "npy", "npy-fortran", "npy-v2"]
ANSWERS = {"json": "application/json", "octet": "application/octet-stream",
           "npy": "application/x-npy"}
STAGES = ("queue_ms", "h2d_ms", "kernel_ms", "d2h_ms")
# Consecutive stages of a request (Server-Timing names); they add up to <= total.
SERIAL = ("recv", "decode", "queue", "h2d", "kernel", "d2h", "encode")
ROUND = 0.001  # both print 4 decimals: allow rounding of each term


def serial_sum(st):
    return sum(st.get(n, 0.0) for n in SERIAL)


def send(d, fmt, a, b, dtype, accept):
    if fmt == "json-nested":
        return d.matmul_json(a, b, dtype=dtype, accept=accept)
    if fmt == "json-shape-data":
        body = {"a": {"shape": list(a.shape), "data": a.ravel().tolist()},
                "b": {"shape": list(b.shape), "data": b.ravel().tolist()}, "dtype": dtype}
        return d.curl("POST", "/v1/matmul", data=json.dumps(body).encode(),
                      content_type="application/json", accept=accept)
    if fmt == "raw":
        return d.matmul_raw(a, b, dtype, accept=accept)
    if fmt == "npy":
        return d.matmul_npy(npy_bytes(a), npy_bytes(b), accept=accept)
    if fmt == "npy-fortran":
        return d.matmul_npy(npy_bytes(a, fortran=True), npy_bytes(b, fortran=True), accept=accept)
    if fmt == "npy-v2":
        return d.matmul_npy(npy_bytes(a, version=(2, 0)), npy_bytes(b, version=(2, 0)), accept=accept)
    raise ValueError(fmt)


def parse_shape(text):
    """'37,29', '37x29', '[37, 29]' -> (37, 29); None if unreadable."""
    nums = re.findall(r"\d+", text or "")
    return tuple(int(x) for x in nums) if len(nums) == 2 else None


def decode(r, answer, dtype):
    """The matrix C from an answer in the given format, or (None, why)."""
    ct = (r.header("content-type") or "").split(";")[0].strip()
    if answer != "json":
        # binary answers carry what the JSON body says in headers
        for h in ("x-gemm-kernel", "x-gemm-device", "x-gemm-math"):
            if not r.header(h):
                return None, "no %s header" % h
        if not re.fullmatch(r"\d+", r.header("x-gemm-tile") or ""):
            return None, "X-Gemm-Tile %r" % r.header("x-gemm-tile")
    if answer == "json":
        if ct != "application/json":
            return None, "Content-Type %r" % ct
        j = r.json()
        if not isinstance(j, dict) or "c" not in j:
            return None, "no 'c' in the JSON answer"
        if not isinstance(j.get("tile"), int) or not isinstance(j.get("block"), str):
            return None, "tile %r / block %r in the JSON answer" % (j.get("tile"), j.get("block"))
        if j.get("dtype") != dtype:
            return None, "dtype %r" % j.get("dtype")
        c = np.array(j["c"], dtype=np.float64 if dtype != "int32" else np.int64)
        if c.ndim == 1 and c.size == 0:
            c = c.reshape(0, 0)
        if list(c.shape) != list(j.get("shape", [])):
            return None, "shape field %r but c is %r" % (j.get("shape"), c.shape)
        return c, ""
    if answer == "octet":
        if ct != "application/octet-stream":
            return None, "Content-Type %r" % ct
        shape = parse_shape(r.header("x-gemm-shape"))
        if shape is None:
            return None, "X-Gemm-Shape %r" % r.header("x-gemm-shape")
        if r.header("x-gemm-dtype") != dtype:
            return None, "X-Gemm-Dtype %r" % r.header("x-gemm-dtype")
        want = shape[0] * shape[1] * np.dtype(np_dtype(dtype)).itemsize
        if len(r.body) != want:
            return None, "%d body bytes, want %d" % (len(r.body), want)
        return np.frombuffer(r.body, dtype=np.dtype(np_dtype(dtype)).newbyteorder("<")).reshape(shape), ""
    if answer == "npy":
        if ct != "application/x-npy":
            return None, "Content-Type %r" % ct
        try:
            c = load_npy(r.body)
        except Exception as e:  # noqa: BLE001
            return None, "not a .npy: %s" % e
        if c.dtype != np.dtype(np_dtype(dtype)):
            return None, "npy dtype %s" % c.dtype
        return c, ""
    raise ValueError(answer)


def check_timing(tap, r, answer, name):
    st = server_timing(r)
    tap.ok(st is not None and "total" in st, name + ": Server-Timing with total",
           "Server-Timing: %r" % r.header("server-timing"))
    rate = re.search(r'(?:^|,)\s*kernel;dur=[0-9.]+;desc="([0-9.]+) GFLOP/s"', r.header("server-timing") or "")
    if answer == "json":
        g = ((r.json() or {}).get("timing") or {}).get("gflops", 0)
        tap.ok(abs(float(rate.group(1)) - g) <= 0.05 + 1e-3 * g if rate else g < 0.051,
               name + ": the kernel's GFLOP/s in Server-Timing matches timing.gflops",
               "Server-Timing: %r, gflops %r" % (r.header("server-timing"), g))
    if answer == "json":
        t = (r.json() or {}).get("timing")
        good = isinstance(t, dict) and all(isinstance(t.get(s), (int, float)) for s in STAGES + ("total_ms",))
        if good:
            ms = {n: t.get(n + "_ms", 0.0) for n in SERIAL}
            good = (all(v >= 0 for v in t.values() if isinstance(v, (int, float)))
                    and serial_sum(ms) <= t["total_ms"] + ROUND * len(SERIAL)
                    and ("compute_ms" not in t or
                         ms["h2d"] + ms["kernel"] + ms["d2h"] <= t["compute_ms"] + 3 * ROUND))
        tap.ok(good, name + ": timing stages add up to <= total (and h2d+kernel+d2h <= compute)",
               "timing: %r" % (t,))


def trickle(port, head, body, piece):
    """Sends head + body in pieces of `piece` bytes (TCP_NODELAY, a short pause between
    them) so the server sees the body in many small reads; returns (status, headers, body)."""
    import socket
    import time
    from harness import _split_response
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    raw = b""
    try:
        s.sendall(head)
        for i in range(0, len(body), piece):
            s.sendall(body[i:i + piece])
            time.sleep(0.001)
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            raw += chunk
            st, h, b = _split_response(raw)
            if st and "content-length" in h and len(b) >= int(h["content-length"]):
                break
    finally:
        s.close()
    return _split_response(raw)


def trickled(tap, d, rng):
    a = random_matrix(rng, (5, 7), "float32")
    b = random_matrix(rng, (7, 3), "float32")
    ref = reference(a, b, "float32")
    bnd = b"trickle-boundary"
    mp = (b"--" + bnd + b"\r\nContent-Disposition: form-data; name=\"a\"; filename=\"A.npy\"\r\n\r\n" +
          npy_bytes(a) + b"\r\n--" + bnd + b"\r\nContent-Disposition: form-data; name=\"b\"; filename=\"B.npy\"\r\n\r\n" +
          npy_bytes(b, fortran=True) + b"\r\n--" + bnd + b"--\r\n")
    js = json.dumps({"a": a.tolist(), "b": b.tolist(), "dtype": "float32"}).encode()
    raw = a.tobytes() + b.tobytes()
    cases = [("multipart", "/v1/matmul", "multipart/form-data; boundary=" + bnd.decode(), mp),
             ("JSON", "/v1/matmul", "application/json", js),
             ("raw", "/v1/matmul?m=5&k=7&n=3&dtype=float32", "application/octet-stream", raw)]
    for name, path, ctype, body in cases:
        for piece in (1, 7):
            if piece == 1 and len(body) > 2000:
                continue
            head = ("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\nAccept: application/x-npy\r\n"
                    "Content-Length: %d\r\nConnection: close\r\n\r\n" % (path, ctype, len(body))).encode()
            st, h, data = trickle(d.port, head, body, piece)
            try:
                c = load_npy(data) if st == 200 else None
            except Exception:  # noqa: BLE001
                c = None
            good, why = compare(c, ref, "float32", 7) if c is not None else (False, "HTTP %d %r" % (st, data[:200]))
            tap.ok(good, "%s body sent in %d-byte pieces is decoded right" % (name, piece), why)


def main(tap):
    rng = np.random.default_rng(20261122)
    with Daemon(tap, config={"backend": "cpu"}) as d:
        for (m, k, n) in SHAPES:
            for dtype in DTYPES:
                a = random_matrix(rng, (m, k), dtype)
                b = random_matrix(rng, (k, n), dtype)
                ref = reference(a, b, dtype)
                octets = {}
                for fmt in INPUTS:
                    bad = []
                    for answer, accept in ANSWERS.items():
                        r = send(d, fmt, a, b, dtype, accept)
                        label = "%dx%dx%d %s %s->%s" % (m, k, n, dtype, fmt, answer)
                        if r.status != 200:
                            bad.append("%s: %r" % (label, r))
                            continue
                        c, why = decode(r, answer, dtype)
                        if c is None:
                            bad.append("%s: %s; %r" % (label, why, r))
                            continue
                        good, why = compare(c, ref, dtype, k)
                        if not good:
                            bad.append("%s: %s" % (label, why))
                        st = server_timing(r)
                        if st is None or "total" not in st:
                            bad.append("%s: no or malformed Server-Timing: %r" % (label, r.header("server-timing")))
                        elif serial_sum(st) > st["total"] + ROUND * len(SERIAL):
                            bad.append("%s: Server-Timing stages exceed total: %r" % (label, st))
                        if answer == "octet":
                            octets[fmt] = r.body
                    tap.ok(not bad, "%dx%dx%d %s from %s: right in json, octet-stream and npy answers"
                           % (m, k, n, dtype, fmt), "\n".join(bad))
                same = len(set(octets.values())) == 1 and len(octets) == len(INPUTS)
                tap.ok(same, "%dx%dx%d %s: every request format gives the same bytes of C" % (m, k, n, dtype),
                       "formats with answers: %s; distinct results: %d" % (sorted(octets), len(set(octets.values()))))

        trickled(tap, d, rng)

        # timing details, once per answer format
        a = random_matrix(rng, (20, 30), "float32")
        b = random_matrix(rng, (30, 10), "float32")
        for answer, accept in ANSWERS.items():
            r = d.matmul_json(a, b, dtype="float32", accept=accept)
            tap.eq(r.status, 200, "timing probe answers 200 (%s)" % answer)
            check_timing(tap, r, answer, "answer %s" % answer)
        r = d.matmul_json(a, b, dtype="float32")
        j = r.json() or {}
        tap.ok(isinstance(j.get("kernel"), str) and j.get("kernel"), "JSON answer names the kernel", r)
        tap.ok(j.get("shape") == [20, 10], "JSON answer has shape [m, n]", r)

        # default answer format follows the request's family
        r = d.matmul_json(a, b, dtype="float32")
        tap.eq((r.header("content-type") or "").split(";")[0], "application/json", "JSON request -> JSON answer")
        r = d.matmul_raw(a, b, "float32")
        tap.eq((r.header("content-type") or "").split(";")[0], "application/octet-stream",
               "raw request -> octet-stream answer")
        r = d.matmul_npy(npy_bytes(a), npy_bytes(b))
        tap.eq((r.header("content-type") or "").split(";")[0], "application/x-npy", "npy request -> npy answer")
        r = d.matmul_json(a, b, dtype="float32", accept="*/*")
        tap.eq(r.status, 200, "Accept */* is fine")

        # npy format 3.0, options as form fields, media type parameters and case
        r = d.matmul_npy(npy_bytes(a, version=(3, 0)), npy_bytes(b, version=(3, 0)))
        c, why = decode(r, "npy", "float32") if r.status == 200 else (None, repr(r))
        good, why = compare(c, reference(a, b, "float32"), "float32", 30) if c is not None else (False, why)
        tap.ok(good, "npy format 3.0 inputs", why)
        pa, pb = os.path.join(d.tmp.name, "FA.npy"), os.path.join(d.tmp.name, "FB.npy")
        open(pa, "wb").write(npy_bytes(a))
        open(pb, "wb").write(npy_bytes(b))
        r = d.curl("POST", "/v1/matmul", form=["a=@" + pa, "b=@" + pb, "kernel=auto"], accept="application/json")
        tap.ok(r.status == 200 and (r.json() or {}).get("shape") == [20, 10], "multipart with a kernel form field", r)
        r = d.curl("POST", "/v1/matmul", data=json.dumps({"a": [[1]], "b": [[2]]}).encode(),
                   content_type="application/json; charset=utf-8", accept="application/json; charset=utf-8")
        tap.ok(r.status == 200 and (r.json() or {}).get("c") == [[2.0]], "media types with parameters", r)
        r = d.curl("POST", "/v1/matmul", data=json.dumps({"a": [[1]], "b": [[2]]}).encode(),
                   content_type="Application/JSON")
        tap.ok(r.status == 200 and (r.json() or {}).get("c") == [[2.0]], "media types are case-insensitive", r)

        # dtype default: float64 when absent (JSON)
        r = d.matmul_json([[1, 2]], [[3], [4]])
        j = r.json() or {}
        tap.ok(r.status == 200 and j.get("dtype") == "float64" and j.get("c") == [[11.0]],
               "JSON without dtype computes float64", r)

        # int32 wrap-around, computed in two's complement
        a = np.array([[2**30, 2**30, 7], [-2**31, -1, 3]], dtype=np.int32)
        b = np.array([[2, -3], [2, 5], [1, 2**31 - 1]], dtype=np.int32)
        ref = reference(a, b, "int32")
        for fmt in ("json-nested", "raw", "npy"):
            for answer, accept in ANSWERS.items():
                r = send(d, fmt, a, b, "int32", accept)
                c, why = decode(r, answer, "int32") if r.status == 200 else (None, repr(r))
                good, why2 = compare(c, ref, "int32", 3) if c is not None else (False, why)
                tap.ok(good, "int32 wraps around in two's complement (%s -> %s)" % (fmt, answer), why2)
        big = rng.integers(-2**31, 2**31, size=(9, 41), dtype=np.int64).astype(np.int32)
        big2 = rng.integers(-2**31, 2**31, size=(41, 8), dtype=np.int64).astype(np.int32)
        r = d.matmul_raw(big, big2, "int32", accept="application/x-npy")
        c, why = decode(r, "npy", "int32") if r.status == 200 else (None, repr(r))
        good, why2 = compare(c, reference(big, big2, "int32"), "int32", 41) if c is not None else (False, why)
        tap.ok(good, "int32 full-range values wrap exactly", why2)

        # a float32 product whose values are integers is exact in float32
        a = rng.integers(-8, 8, size=(33, 65)).astype(np.float32)
        b = rng.integers(-8, 8, size=(65, 17)).astype(np.float32)
        r = d.matmul_raw(a, b, "float32")
        c, why = decode(r, "octet", "float32") if r.status == 200 else (None, repr(r))
        tap.ok(c is not None and np.array_equal(c.astype(np.float64), reference(a, b, "float32")),
               "float32 integer-valued product is exact", why)

        # bodies of many MB arrive in many chunks: raw 4 MiB + 4 MiB, JSON of about 3 MB
        a = random_matrix(rng, (1024, 1024), "float32")
        b = random_matrix(rng, (1024, 1024), "float32")
        r = d.matmul_raw(a, b, "float32")
        c, why = decode(r, "octet", "float32") if r.status == 200 else (None, repr(r))
        good, why = compare(c, reference(a, b, "float32"), "float32", 1024) if c is not None else (False, why)
        tap.ok(good, "raw 1024x1024x1024 float32 (8 MiB body) is right", why)
        a = random_matrix(rng, (300, 250), "float64")
        b = random_matrix(rng, (250, 200), "float64")
        r = d.matmul_json(a, b, dtype="float64", accept="application/x-npy")
        c, why = decode(r, "npy", "float64") if r.status == 200 else (None, repr(r))
        good, why = compare(c, reference(a, b, "float64"), "float64", 250) if c is not None else (False, why)
        tap.ok(good, "JSON 300x250x200 float64 (about 2 MB of text) is right", why)

        # float64 round-trips through JSON exactly (17 significant digits)
        a = rng.standard_normal((3, 4))
        b = rng.standard_normal((4, 2))
        r1 = d.matmul_json(a, b, dtype="float64")
        r2 = d.matmul_raw(a, b, "float64")
        c1, _ = decode(r1, "json", "float64") if r1.status == 200 else (None, "")
        c2, _ = decode(r2, "octet", "float64") if r2.status == 200 else (None, "")
        tap.ok(c1 is not None and c2 is not None and np.array_equal(c1, c2),
               "float64 JSON answer round-trips to the binary answer bit for bit")

    # Binary and .npy answers no larger than send_timeout x min_rate_kb are sent from where
    # they lie; larger ones through a reader that reports progress to the send deadline.
    # With send_timeout 1 and min_rate_kb 4 the edge is 4096 bytes: answers on either side
    # of it, and a large one, come back byte for byte (int32: exact).
    with Daemon(tap, config={"backend": "cpu", "send_timeout": 1, "min_rate_kb": 4}) as d:
        cases = [((32, 5, 32), "octet", "4096 bytes: as it lies"),
                 ((33, 5, 32), "octet", "4224 bytes: through the reader"),
                 ((31, 5, 32), "npy", "header + 3968 bytes = 4096: as it lies"),
                 ((32, 5, 32), "npy", "header + 4096 bytes: through the reader"),
                 ((300, 7, 300), "octet", "360,000 bytes: through the reader"),
                 ((300, 7, 300), "npy", "header + 360,000 bytes: through the reader")]
        for (m, k, n), answer, what in cases:
            a = rng.integers(-2**31, 2**31, size=(m, k), dtype=np.int64).astype(np.int32)
            b = rng.integers(-2**31, 2**31, size=(k, n), dtype=np.int64).astype(np.int32)
            r = d.matmul_raw(a, b, "int32", accept=ANSWERS[answer])
            c, why = decode(r, answer, "int32") if r.status == 200 else (None, repr(r))
            good, why2 = compare(c, reference(a, b, "int32"), "int32", k) if c is not None else (False, why)
            tap.ok(good, "send_timeout 1, min_rate_kb 4: %dx%d int32 %s answer, %s, exact" % (m, n, answer, what),
                   why2)


if __name__ == "__main__":
    from harness import Tap
    run_guarded(Tap(), main)
