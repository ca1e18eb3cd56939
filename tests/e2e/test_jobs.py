#!/usr/bin/python3
"""test_jobs.py - asynchronous jobs: submit, poll, fetch the result, delete; TTL expiry,
the job store's count and memory caps, 404 for unknown ids, 409 for a result not yet
done, and a full queue answering 503 with Retry-After.

The CPU backend's test hook fault_inject = cpu_delay_ms:N makes every product sleep N ms
first, so "not done yet" and "queue full" are reached by construction, not by timing.
"""
import json
import os
import re
import socket
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (SLOW, Daemon, Tap, compare, load_npy, metric, npy_bytes, random_matrix,  # noqa: E402
                     read_response, reference, run_guarded)

ID_RE = re.compile(r"^/v1/jobs/([0-9A-Za-z_-]+)$")


def submit_json(d, a, b, dtype="float64", **kw):
    body = {"a": np.asarray(a).tolist(), "b": np.asarray(b).tolist(), "dtype": dtype}
    return d.curl("POST", "/v1/jobs", data=json.dumps(body).encode(), content_type="application/json", **kw)


def job_id(tap, r, name):
    """The id from a 202 answer (Location header and body must agree)."""
    loc = r.header("location") or ""
    m = ID_RE.match(loc)
    j = r.json() or {}
    ok = r.status == 202 and m is not None and j.get("id") == (m.group(1) if m else None)
    tap.ok(ok, name + ": 202 with Location /v1/jobs/{id} and the id in the body", r)
    return m.group(1) if m else None


def wait_state(d, jid, states=("done", "failed", "cancelled"), limit_s=30):
    """Polls the status until its state is one of states; returns the last answer."""
    deadline = time.monotonic() + limit_s * SLOW
    r = None
    while time.monotonic() < deadline:
        r = d.curl("GET", "/v1/jobs/" + jid)
        if r.status != 200 or (r.json() or {}).get("state") in states:
            return r
        time.sleep(0.05)
    return r


def basic(tap, d, rng):
    a = random_matrix(rng, (13, 21), "float64")
    b = random_matrix(rng, (21, 8), "float64")
    ref = reference(a, b, "float64")
    r = submit_json(d, a, b)
    jid = job_id(tap, r, "JSON job")
    st = (r.json() or {}).get("state")
    tap.ok(st in ("queued", "running", "done"), "202 body shows the state", r)
    r = wait_state(d, jid)
    j = r.json() or {}
    tap.ok(r.status == 200 and j.get("state") == "done", "status reaches done", r)
    tap.ok(j.get("id") == jid, "status names the job id", r)
    t = j.get("timing")
    tap.ok(isinstance(t, dict) and all(isinstance(t.get(s), (int, float)) for s in
                                       ("queue_ms", "kernel_ms", "total_ms")), "status carries timing", r)
    _, m = d.metrics()
    tap.ok(m is not None and metric(m, "gemmd_jobs", state="done") == 1, "/metrics counts the kept job as done",
           {k: v for k, v in (m or {}).items() if k[0] == "gemmd_jobs"})
    r = d.curl("GET", "/v1/jobs/%s/result" % jid, accept="text/csv")
    tap.ok(r.status == 406 and r.error()[0], "result with an unacceptable Accept -> 406", r)
    r = d.curl("GET", "/v1/jobs/%s/result" % jid)
    jr = r.json() or {}
    good, why = compare(np.array(jr.get("c", [])), ref, "float64", 21) if r.status == 200 else (False, repr(r))
    tap.ok(good, "result of a JSON job is right, as JSON", why)
    tap.ok(r.header("server-timing") is not None, "result carries Server-Timing", r)
    r = d.curl("GET", "/v1/jobs/%s/result" % jid, accept="application/x-npy")
    c = load_npy(r.body) if r.status == 200 else None
    good, why = compare(c, ref, "float64", 21) if c is not None else (False, repr(r))
    tap.ok(good, "the same result fetched again as .npy", why)
    r = d.curl("GET", "/v1/jobs/%s/result" % jid, accept="application/octet-stream")
    tap.ok(r.status == 200 and len(r.body) == 13 * 8 * 8 and r.header("x-gemm-shape") is not None,
           "and as octet-stream with X-Gemm-Shape", r)
    r = d.curl("DELETE", "/v1/jobs/" + jid)
    tap.ok(r.status in (200, 204), "DELETE of a finished job", r)
    r = d.curl("GET", "/v1/jobs/" + jid)
    tap.eq(r.status, 404, "status after DELETE -> 404")
    r = d.curl("GET", "/v1/jobs/%s/result" % jid)
    tap.eq(r.status, 404, "result after DELETE -> 404")
    r = d.curl("DELETE", "/v1/jobs/" + jid)
    tap.eq(r.status, 404, "second DELETE -> 404")

    # raw and npy jobs answer in their own family by default
    for dtype in ("float32", "int32"):
        a = random_matrix(rng, (7, 9), dtype)
        b = random_matrix(rng, (9, 4), dtype)
        q = "?m=7&k=9&n=4&dtype=%s" % dtype
        r = d.curl("POST", "/v1/jobs" + q, data=a.tobytes() + b.tobytes(), content_type="application/octet-stream")
        jid = job_id(tap, r, "raw %s job" % dtype)
        wait_state(d, jid or "x")
        r = d.curl("GET", "/v1/jobs/%s/result" % jid)
        ok = r.status == 200 and (r.header("content-type") or "").startswith("application/octet-stream")
        c = np.frombuffer(r.body, dtype=a.dtype).reshape(7, 4) if ok and len(r.body) == 7 * 4 * 4 else None
        good, why = compare(c, reference(a, b, dtype), dtype, 9) if c is not None else (False, repr(r))
        tap.ok(good, "raw %s job result is right, as octet-stream" % dtype, why)
        d.curl("DELETE", "/v1/jobs/" + (jid or "x"))
    a = random_matrix(rng, (5, 6), "float32")
    b = random_matrix(rng, (6, 3), "float32")
    pa, pb = os.path.join(d.tmp.name, "JA.npy"), os.path.join(d.tmp.name, "JB.npy")
    open(pa, "wb").write(npy_bytes(a))
    open(pb, "wb").write(npy_bytes(b))
    r = d.curl("POST", "/v1/jobs", form=["a=@" + pa, "b=@" + pb])
    jid = job_id(tap, r, "npy job")
    wait_state(d, jid or "x")
    r = d.curl("GET", "/v1/jobs/%s/result" % jid)
    c = load_npy(r.body) if r.status == 200 and (r.header("content-type") or "").startswith("application/x-npy") else None
    good, why = compare(c, reference(a, b, "float32"), "float32", 6) if c is not None else (False, repr(r))
    tap.ok(good, "npy job result is right, as .npy", why)
    d.curl("DELETE", "/v1/jobs/" + (jid or "x"))

    # a failing product: its status says failed, the result answers the error
    r = submit_json(d, [[1, 2, 3]], [[1, 2]])
    tap.ok(r.status == 422 and (r.error()[0] == "shape_mismatch"), "a job with mismatched shapes is refused at submit", r)

    # unknown ids
    for path in ("/v1/jobs/00000000000000000000000000000000", "/v1/jobs/nonsense",
                 "/v1/jobs/00000000000000000000000000000000/result", "/v1/jobs/" + "f" * 300):
        r = d.curl("GET", path)
        code, msg = r.error()
        tap.ok(r.status == 404 and code and msg, "GET %s -> 404 with an error body" % path[:60], r)
    r = d.curl("DELETE", "/v1/jobs/00000000000000000000000000000000")
    tap.eq(r.status, 404, "DELETE of an unknown id -> 404")


def slow_upload(tap, d, rng):
    """A raw job's place is taken before its body is read: the time the body took to come
    counts once in the job's total, which the client's own window from connect to fetch
    encloses (the 0.6 s pause dwarfs any scheduling noise)."""
    a = random_matrix(rng, (16, 8), "float32")
    b = random_matrix(rng, (8, 4), "float32")
    body = a.tobytes() + b.tobytes()
    head = ("POST /v1/jobs?m=16&k=8&n=4&dtype=float32 HTTP/1.1\r\nHost: x\r\n"
            "Content-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n" % len(body)).encode()
    t0 = time.monotonic()
    s = socket.create_connection(("127.0.0.1", d.port), timeout=10)
    try:
        s.sendall(head + body[:100])
        time.sleep(0.6)
        s.sendall(body[100:])
        status, hdrs, _, raw = read_response(s)
    finally:
        s.close()
    m = ID_RE.match(hdrs.get("location", ""))
    tap.ok(status == 202 and m is not None, "a raw job sent slowly is queued", raw[:300])
    jid = m.group(1) if m else "x"
    wait_state(d, jid)
    r = d.curl("GET", "/v1/jobs/%s/result" % jid)
    window_ms = (time.monotonic() - t0) * 1000
    r2 = d.curl("GET", "/v1/jobs/" + jid)
    t = (r2.json() or {}).get("timing") or {}
    total, recv = t.get("total_ms"), t.get("recv_ms")
    tap.ok(r.status == 200 and isinstance(total, (int, float)) and isinstance(recv, (int, float)),
           "the slow job's result and timing", (r, t))
    if isinstance(total, (int, float)) and isinstance(recv, (int, float)):
        tap.ok(recv >= 500 and recv <= total <= window_ms,
               "the job's total counts its upload once: recv %.1f <= total %.1f <= the client's %.1f ms"
               % (recv, total, window_ms), t)
    d.curl("DELETE", "/v1/jobs/" + jid)


def ttl(tap, d, rng):
    """The daemon runs with job_ttl = 1."""
    r = submit_json(d, [[1.0, 2.0]], [[3.0], [4.0]])
    jid = job_id(tap, r, "job for the TTL test")
    r = wait_state(d, jid or "x")
    j = r.json() or {}
    tap.ok(r.status == 200 and j.get("state") == "done", "job done before its TTL", r)
    # the result stays for about job_ttl seconds after it finished, then it is forgotten
    deadline = time.monotonic() + 15 * SLOW
    gone = None
    while time.monotonic() < deadline:
        r = d.curl("GET", "/v1/jobs/%s/result" % jid)
        if r.status == 404:
            gone = r
            break
        if r.status != 200:
            break
        time.sleep(0.1)
    tap.ok(gone is not None, "after job_ttl the finished job answers 404", r)


def caps(tap, d):
    """The daemon runs with max_jobs = 4 and job_mem_mb = 1."""
    ids = []
    for i in range(4):
        r = submit_json(d, [[1.0]], [[float(i)]])
        ids.append(job_id(tap, r, "small job %d of max_jobs 4" % (i + 1)))
    r = submit_json(d, [[1.0]], [[9.0]])
    code, msg = r.error()
    tap.ok(r.status == 503 and code and msg, "fifth job with max_jobs 4 -> 503", r)
    for jid in ids:
        wait_state(d, jid or "x")
        d.curl("DELETE", "/v1/jobs/" + (jid or "x"))
    r = submit_json(d, [[1.0]], [[9.0]])
    jid = job_id(tap, r, "after deleting them, a job is accepted again")
    wait_state(d, jid or "x")
    d.curl("DELETE", "/v1/jobs/" + (jid or "x"))

    # memory: C of 300 x 300 float64 is 720 KB; two do not fit in 1 MiB
    a = np.ones((300, 1))
    b = np.ones((1, 300))
    raw = a.tobytes() + b.tobytes()
    q = "/v1/jobs?m=300&k=1&n=300&dtype=float64"
    r = d.curl("POST", q, data=raw, content_type="application/octet-stream")
    j1 = job_id(tap, r, "a 720 KB result within job_mem_mb 1")
    r = d.curl("POST", q, data=raw, content_type="application/octet-stream")
    code, msg = r.error()
    tap.ok(r.status == 503 and code and msg, "a second 720 KB result over job_mem_mb 1 -> 503", r)
    wait_state(d, j1 or "x")
    r = d.curl("GET", "/v1/jobs/%s/result" % j1, accept="application/octet-stream")
    tap.ok(r.status == 200 and np.all(np.frombuffer(r.body, dtype=np.float64) == 1.0) and len(r.body) == 720000,
           "the kept 720 KB result is right", r.status)
    d.curl("DELETE", "/v1/jobs/" + (j1 or "x"))
    r = d.curl("POST", q, data=raw, content_type="application/octet-stream")
    j2 = job_id(tap, r, "after DELETE the memory is free again")
    wait_state(d, j2 or "x")
    d.curl("DELETE", "/v1/jobs/" + (j2 or "x"))


def slow_engine(tap, d):
    """The daemon runs with cpu_delay_ms:1500, queue_depth 1, one CPU worker."""
    a = [[1.0, 2.0], [3.0, 4.0]]
    r = submit_json(d, a, a)
    j1 = job_id(tap, r, "first slow job")
    r = d.curl("GET", "/v1/jobs/%s/result" % j1)
    code, msg = r.error()
    tap.ok(r.status == 409 and code and msg, "result of a job not done yet -> 409", r)
    r = d.curl("GET", "/v1/jobs/" + j1)
    tap.ok(r.status == 200 and (r.json() or {}).get("state") in ("queued", "running"),
           "its status says queued or running", r)

    # fill the queue: one job runs, one waits; the next is refused with Retry-After
    accepted, refused = [j1], None
    for _ in range(4):
        r = submit_json(d, a, a)
        if r.status == 202:
            accepted.append(job_id(tap, r, "slow job accepted while the queue has room"))
            continue
        refused = r
        break
    code, msg = refused.error() if refused else (None, None)
    tap.ok(refused is not None and refused.status == 503 and code == "queue_full" and msg,
           "queue full -> 503 queue_full (after %d accepted)" % len(accepted), refused)
    ra = refused.header("retry-after") if refused else None
    tap.ok(ra is not None and ra.isdigit() and int(ra) >= 1, "503 carries Retry-After in seconds", refused)
    tap.ok(len(accepted) <= 3, "queue_depth 1 admits at most 1 running + 1 queued (+1 being picked up)",
           accepted)
    r = d.matmul_json(a, a)
    tap.ok(r.status == 503 and r.error()[0] == "queue_full" and r.header("retry-after"),
           "a synchronous product also gets 503 queue_full while the queue is full", r)
    r = d.curl("GET", "/readyz")
    tap.eq(r.status, 503, "/readyz says not ready while the queue is full")
    r = d.curl("GET", "/healthz")
    tap.eq(r.status, 200, "/healthz stays 200 while the queue is full")

    # cancel the last accepted (queued) job
    last = accepted[-1]
    r = d.curl("DELETE", "/v1/jobs/" + last)
    tap.ok(r.status in (200, 202, 204), "DELETE of a queued or running job", r)
    r = d.curl("GET", "/v1/jobs/%s/result" % last)
    tap.ok(r.status in (404, 409, 410), "a deleted job's result is not served", r)

    r = wait_state(d, j1, limit_s=30)
    tap.ok(r is not None and (r.json() or {}).get("state") == "done", "the first slow job finishes", r)
    r = d.curl("GET", "/v1/jobs/%s/result" % j1)
    tap.ok(r.status == 200 and (r.json() or {}).get("c") == [[7.0, 10.0], [15.0, 22.0]],
           "its result is right", r)
    # DELETE while running: the job is forgotten at once and freed when the engine is done
    r = submit_json(d, a, a)
    jr = job_id(tap, r, "job to delete while it runs") if r.status == 202 else None
    if jr:
        r = wait_state(d, jr, states=("running", "done"), limit_s=30)
        tap.ok((r.json() or {}).get("state") == "running", "it is running", r)
        r = d.curl("DELETE", "/v1/jobs/" + jr)
        tap.ok(r.status in (200, 202, 204), "DELETE of a running job", r)
        r = d.curl("GET", "/v1/jobs/" + jr)
        tap.eq(r.status, 404, "a deleted running job is gone at once")
    else:
        tap.ok(False, "job to delete while it runs: accepted", r)
    # leave the others in flight: SIGTERM must still end the daemon cleanly (checked on exit)


def failing(tap, d):
    """The daemon runs with cpu_fail:1: every product fails in the backend."""
    r = submit_json(d, [[1.0]], [[2.0]])
    jid = job_id(tap, r, "job that will fail")
    r = wait_state(d, jid or "x")
    j = r.json() or {}
    err = j.get("error") or {}
    tap.ok(r.status == 200 and j.get("state") == "failed" and err.get("code") == "backend_failure"
           and err.get("message"), "status of a failed job: state failed with the error", r)
    r = d.curl("GET", "/v1/jobs/%s/result" % jid)
    code, msg = r.error()
    tap.ok(r.status == 500 and code == "backend_failure" and msg, "result of a failed job answers its error (500)", r)
    r = d.curl("DELETE", "/v1/jobs/" + (jid or "x"))
    tap.ok(r.status in (200, 204), "a failed job can be deleted", r)


def main(tap):
    rng = np.random.default_rng(99)
    with Daemon(tap, config={"backend": "cpu", "job_ttl": 600}) as d:
        basic(tap, d, rng)
        slow_upload(tap, d, rng)
    with Daemon(tap, config={"backend": "cpu", "job_ttl": 1}) as d:
        ttl(tap, d, rng)
    # token_share 100: the store's own caps, whoever fills them (test_quotas.py checks shares)
    with Daemon(tap, config={"backend": "cpu", "max_jobs": 4, "job_mem_mb": 1, "token_share": 100}) as d:
        caps(tap, d)
    with Daemon(tap, config={"backend": "cpu", "queue_depth": 1, "cpu_workers": 1,
                             "fault_inject": "cpu_delay_ms:1500"}) as d:
        slow_engine(tap, d)
    with Daemon(tap, config={"backend": "cpu", "fault_inject": "cpu_fail:1"}) as d:
        failing(tap, d)


if __name__ == "__main__":
    run_guarded(Tap(), main)
