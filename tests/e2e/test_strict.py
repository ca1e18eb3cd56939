#!/usr/bin/python3
"""test_strict.py - small things done strictly:

- message framing: two Content-Length headers -> 400 bad_length; a Transfer-Encoding other
  than chunked alone (gzip, chunked / xchunked / two headers) -> 501
  unsupported_transfer_encoding, as JSON, then the connection is closed; both
  Transfer-Encoding and Content-Length -> 400. Plain chunked still works. Heads RFC 9112
  says to refuse (whitespace before a colon, a NUL or bare CR in a value, obs-fold, a
  request target with whitespace, over 8 KB or over 64 query parameters) get one answer
  (400, or 414 for the target) and the connection closes; nothing sent after them on it is
  answered.
- a body refused before it is read, sent without Expect: 100-continue, still gets its
  answer (413), not a reset.
- m=0 in a raw query answers 422 empty_matrix naming the zero, not "missing".
- math applies to float32 only: math=fp32/tf32 with float64 or int32 -> 422
  unsupported_math, from the query, a JSON field and a form field; absent or "default"
  stays fine.
- --log-level debug logs request phases, admission decisions and job transitions, with
  job ids cut to 8 digits; info logs none of it.
- Retry-After of job_store_full is the time until the oldest finished job expires.
- connection_memory_kb bounds a request head: one that fits is served, one over it gets
  431 and the daemon keeps serving; a product on a 16 KiB buffer is still right.
"""
import json
import os
import re
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostile  # noqa: E402
import hostile_heads  # noqa: E402
from harness import (SLOW, Daemon, Tap, compare, npy_bytes, random_matrix, raw_request,  # noqa: E402
                     reference, run_guarded, short_id)

BODY = b'{"a":[[1,2]],"b":[[3],[4]],"dtype":"float64"}'


def parse_json(body):
    try:
        return json.loads(body.decode())
    except (ValueError, UnicodeDecodeError):
        return None


def err_code(body):
    j = parse_json(body)
    return j.get("error", {}).get("code") if isinstance(j, dict) else None


def head(lines):
    return ("POST /v1/matmul HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + "".join(
        l + "\r\n" for l in lines) + "\r\n").encode()


def chunked(body):
    return b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"


def framing(tap, d):
    n = len(BODY)
    cases = [
        ("two different Content-Length headers", ["Content-Length: %d" % n, "Content-Length: 5"], BODY, 400,
         "bad_length"),
        ("two equal Content-Length headers", ["Content-Length: %d" % n, "Content-Length: %d" % n], BODY, 400,
         "bad_length"),
        ("Transfer-Encoding: gzip, chunked", ["Transfer-Encoding: gzip, chunked"], chunked(BODY), 501,
         "unsupported_transfer_encoding"),
        ("Transfer-Encoding: xchunked", ["Transfer-Encoding: xchunked"], chunked(BODY), 501,
         "unsupported_transfer_encoding"),
        ("two Transfer-Encoding headers", ["Transfer-Encoding: chunked", "Transfer-Encoding: chunked"],
         chunked(BODY), 501, "unsupported_transfer_encoding"),
        ("Transfer-Encoding and Content-Length", ["Transfer-Encoding: chunked", "Content-Length: 5"],
         chunked(BODY), 400, "bad_length"),
    ]
    for name, lines, body, status, code in cases:
        st, h, b, raw = raw_request(d.port, head(lines), body, read_timeout=10 * SLOW)
        tap.ok(st == status and err_code(b) == code and h.get("content-type") == "application/json",
               "%s -> %d %s (JSON)" % (name, status, code), raw[:400])
        tap.ok(h.get("connection", "").lower() == "close", "%s: the connection is closed after it" % name, h)
    # The same on a route without a body: it is judged before routing.
    st, h, b, raw = raw_request(d.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
                                read_timeout=10 * SLOW)
    tap.ok(st == 501 and err_code(b) == "unsupported_transfer_encoding", "GET with Transfer-Encoding: gzip -> 501",
           raw[:400])
    # What still works.
    st, h, b, raw = raw_request(d.port, head(["Transfer-Encoding: chunked", "Connection: close"]), chunked(BODY),
                                read_timeout=10 * SLOW)
    j = parse_json(b) or {}
    tap.ok(st == 200 and j.get("c") == [[11.0]], "Transfer-Encoding: chunked alone is served", raw[:400])
    st, h, b, raw = raw_request(d.port, head(["Content-Length: %d" % n, "Connection: close"]), BODY,
                                read_timeout=10 * SLOW)
    tap.ok(st == 200 and (parse_json(b) or {}).get("c") == [[11.0]], "one Content-Length is served", raw[:400])
    # A head RFC 9112 says to refuse (whitespace before a colon, a NUL or a bare CR in a
    # value, obs-fold, a bad or oversized request target): one answer, then the connection
    # closes, so the request sent after it on the same connection (which a proxy in front
    # may have taken for body bytes) is never answered.
    for name, data, want in hostile_heads.framing_cases():
        statuses, _secs, closed = hostile_heads.exchange(d.port, data, timeout=20 * SLOW)
        tap.ok(len(statuses) == 1 and statuses[0] in want and closed,
               "%s: answered %s once, then the connection is closed" % (name, "/".join(map(str, want))),
               (statuses, closed))
    st, h, b, raw = raw_request(d.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length : 5\r\n\r\n",
                                read_timeout=10 * SLOW)
    tap.ok(st == 400 and err_code(b) == "bad_request" and "token" in b.decode("utf-8", "replace")
           and h.get("connection", "").lower() == "close", "whitespace before a colon: 400 bad_request as JSON",
           raw[:400])
    query = "&".join("p%d=1" % i for i in range(65))
    st, h, b, raw = raw_request(d.port, ("GET /healthz?%s HTTP/1.1\r\nHost: x\r\n\r\n" % query).encode(),
                                read_timeout=10 * SLOW)
    tap.ok(st == 414 and err_code(b) == "uri_too_long" and "64 parameters" in b.decode(),
           "65 query parameters: 414 uri_too_long as JSON", raw[:400])
    r = d.curl("GET", "/healthz?" + "&".join("p%d=1" % i for i in range(64)))
    tap.ok(r.status == 200, "64 query parameters are served", r)


def refused_body_answer(tap):
    """A body refused before it is read (413 here) without Expect: 100-continue: the client
    keeps sending it, and must still get the answer, not a reset (a lingering close reads
    and drops the rest)."""
    with Daemon(tap, config={"backend": "cpu", "max_body_mb": 1}) as d:
        for mb in (2, 8):
            body = b"\0" * (mb << 20)
            head_ = (b"POST /v1/matmul?m=1024&k=1024&n=1024&dtype=float32 HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n" % len(body))
            s = hostile.connect(d.port, "127.0.0.1", 30 * SLOW)
            sent = "all sent"
            try:
                s.sendall(head_ + body)
            except OSError as e:
                sent = "sending failed: %s" % e
            st, h, b = hostile.read_response(s, time.monotonic() + 30 * SLOW)
            s.close()
            tap.ok(sent == "all sent" and st == 413 and err_code(b) == "body_too_large",
                   "a %d MiB body over max_body_mb, sent without Expect: the client sends it all and reads "
                   "413 body_too_large" % mb, (sent, st, b[:200]))
        r = d.curl("GET", "/healthz")
        tap.ok(r.status == 200, "the daemon keeps serving", r)


def zero_dimension(tap, d):
    q = "/v1/matmul?m=0&k=2&n=2&dtype=float32"
    r = d.curl("POST", q, data=b"", content_type="application/octet-stream")
    code, msg = r.error()
    tap.ok(r.status == 422 and code == "empty_matrix" and "m = 0" in (msg or ""),
           "m=0 -> 422 empty_matrix naming m = 0 (not missing_dimension)", r)
    r = d.curl("POST", "/v1/matmul?m=2&k=0&n=0", data=b"", content_type="application/octet-stream")
    code, msg = r.error()
    tap.ok(r.status == 422 and code == "empty_matrix" and "k, n = 0" in (msg or ""), "k=0&n=0 -> both named", r)
    r = d.curl("POST", "/v1/matmul?k=2&n=2", data=b"\0" * 16, content_type="application/octet-stream")
    code, msg = r.error()
    tap.ok(r.status == 400 and code == "missing_dimension" and "missing: m" in (msg or ""),
           "m absent -> 400 missing_dimension naming m", r)
    r = d.curl("POST", "/v1/matmul?m=0&n=2", data=b"", content_type="application/octet-stream")
    code, msg = r.error()
    tap.ok(r.status == 400 and code == "missing_dimension" and "missing: k" in (msg or ""),
           "m=0 and k absent -> the missing one is reported first", r)


def math_modes(tap, d, rng):
    a64 = random_matrix(rng, (3, 4), "float64")
    b64 = random_matrix(rng, (4, 2), "float64")
    for dtype in ("float64", "int32"):
        a = random_matrix(rng, (3, 4), dtype)
        b = random_matrix(rng, (4, 2), dtype)
        for mode in ("fp32", "tf32"):
            r = d.matmul_json(a, b, dtype=dtype, math=mode)
            tap.ok(r.status == 422 and r.error()[0] == "unsupported_math" and "float32 only" in r.error()[1],
                   "%s with math=%s (JSON field) -> 422 unsupported_math" % (dtype, mode), r)
        r = d.matmul_raw(a, b, dtype, query="&math=fp32")
        tap.ok(r.status == 422 and r.error()[0] == "unsupported_math",
               "%s with ?math=fp32 (raw) -> 422, before the body is read" % dtype, r)
    pa, pb = os.path.join(d.tmp.name, "a.npy"), os.path.join(d.tmp.name, "b.npy")
    with open(pa, "wb") as f:
        f.write(npy_bytes(a64))
    with open(pb, "wb") as f:
        f.write(npy_bytes(b64))
    r = d.curl("POST", "/v1/matmul", form=["a=@" + pa, "b=@" + pb, "math=fp32"])
    tap.ok(r.status == 422 and r.error()[0] == "unsupported_math", "float64 .npy with a math form field -> 422", r)
    r = d.matmul_json(a64, b64, dtype="float64")
    ok, why = compare(np.array((r.json() or {}).get("c", [])), reference(a64, b64, "float64"), "float64", 4) \
        if r.status == 200 else (False, repr(r))
    tap.ok(ok, "float64 without math: served", why)
    r = d.matmul_json(a64, b64, dtype="float64", math="default")
    tap.ok(r.status == 200, "float64 with math=default: served", r)
    a32 = random_matrix(rng, (3, 4), "float32")
    r = d.matmul_json(a32, random_matrix(rng, (4, 2), "float32"), dtype="float32", math="fp32")
    tap.ok(r.status == 200 and (r.json() or {}).get("math") == "fp32", "float32 with math=fp32: served", r)


def debug_log(tap, rng):
    a = random_matrix(rng, (5, 6), "float64")
    b = random_matrix(rng, (6, 7), "float64")
    with Daemon(tap, config={"backend": "cpu", "log_level": "debug"}) as d:
        d.matmul_json(a, b, dtype="float64")
        r = d.curl("POST", "/v1/jobs", data=json.dumps({"a": a.tolist(), "b": b.tolist()}).encode(),
                   content_type="application/json")
        jid = (r.json() or {}).get("id", "")
        deadline = time.monotonic() + 30 * SLOW
        while time.monotonic() < deadline and (d.curl("GET", "/v1/jobs/" + jid).json() or {}).get("state") != "done":
            time.sleep(0.05)
        d.curl("POST", "/v1/matmul?m=1", data=b"x", content_type="application/octet-stream")
        d.curl("DELETE", "/v1/jobs/" + jid)
        log = d.read_log()
        want = [
            ("request start", r" debug request start method=POST path=/v1/matmul"),
            ("body admitted", r" debug request body admitted: application/json length=\d+"),
            ("body decoded", r" debug request body decoded: float64 A 5x6 B 6x7"),
            ("product queued or run", r" debug product (queued|ran on its HTTP thread) float64 5x6x7"),
            ("product done", r" debug product done state=done"),
            ("job queued", r" debug job %s queued float64 5x6x7" % re.escape(short_id(jid))),
            ("job finished", r" debug job %s finished state=done" % re.escape(short_id(jid))),
            ("job deleted", r" debug job %s deleted" % re.escape(short_id(jid))),
            ("admission refused", r" debug request refused before its body: 400 missing_dimension"),
        ]
        for name, pat in want:
            tap.ok(re.search(pat, log), "debug log: %s" % name, log[-2500:])
        tap.ok(jid and jid not in log, "debug log: never the whole job id", log[-2500:])
    with Daemon(tap, config={"backend": "cpu", "log_level": "info"}) as d:
        d.matmul_json(a, b, dtype="float64")
        # The access line is written once the answer has gone out, which may be just after
        # the client has it: wait for it before reading the log.
        deadline = time.monotonic() + 10 * SLOW
        while time.monotonic() < deadline and " info  request method=POST" not in d.read_log():
            time.sleep(0.02)
        log = d.read_log()
        tap.ok(" debug " not in log and " info  request method=POST" in log, "info level: no debug lines", log[-1500:])


def retry_after(tap, rng):
    ttl = 300
    with Daemon(tap, config={"backend": "cpu", "max_jobs": 1, "job_ttl": ttl}) as d:
        a = random_matrix(rng, (3, 3), "float64")
        body = json.dumps({"a": a.tolist(), "b": a.tolist()}).encode()
        r = d.curl("POST", "/v1/jobs", data=body, content_type="application/json")
        jid = (r.json() or {}).get("id", "")
        t_sub = time.monotonic()
        deadline = time.monotonic() + 30 * SLOW
        while time.monotonic() < deadline and (d.curl("GET", "/v1/jobs/" + jid).json() or {}).get("state") != "done":
            time.sleep(0.05)
        r = d.curl("POST", "/v1/jobs", data=body, content_type="application/json")
        elapsed = time.monotonic() - t_sub
        ra = r.header("retry-after") or ""
        tap.ok(r.status == 503 and r.error()[0] == "job_store_full", "a full store: 503 job_store_full", r)
        tap.ok(ra.isdigit() and ttl - elapsed - 2 <= int(ra) <= ttl,
               "Retry-After is the time until the finished job expires (%s s of job_ttl %d)" % (ra, ttl), r)


def connection_memory(tap, rng):
    with Daemon(tap, config={"backend": "cpu", "connection_memory_kb": "16"}) as d:
        fits = d.curl("GET", "/healthz", headers=["X-Pad: " + "p" * 4000])
        tap.eq(fits.status, 200, "connection_memory_kb 16: a 4 KB header is served")
        big = d.curl("GET", "/healthz", headers=["X-Pad: " + "p" * 40000])
        tap.eq(big.status, 431, "connection_memory_kb 16: a 40 KB header gets 431")
        a, b = random_matrix(rng, (130, 70), "float32"), random_matrix(rng, (70, 90), "float32")
        r = d.matmul_raw(a, b, "float32", accept="application/octet-stream")
        c = np.frombuffer(r.body, dtype=np.float32).reshape(130, 90) if r.status == 200 else None
        ok, why = compare(c, reference(a, b, "float32"), "float32", 70) if c is not None else (False, r.status)
        tap.ok(ok, "connection_memory_kb 16: a raw product is right (%s)" % why, r)
    with Daemon(tap, config={"backend": "cpu"}) as d:
        r = d.curl("GET", "/healthz", headers=["X-Pad: " + "p" * 40000])
        tap.eq(r.status, 200, "default connection_memory_kb (64): a 40 KB header is served")


def main(tap):
    rng = np.random.default_rng(12)
    with Daemon(tap, config={"backend": "cpu"}) as d:
        framing(tap, d)
        zero_dimension(tap, d)
        math_modes(tap, d, rng)
        r = d.curl("GET", "/healthz")
        tap.ok(r.status == 200, "the daemon keeps serving", r)
    refused_body_answer(tap)
    debug_log(tap, rng)
    retry_after(tap, rng)
    connection_memory(tap, rng)


if __name__ == "__main__":
    run_guarded(Tap(), main)
