#!/usr/bin/python3
"""test_cancel.py - DELETE of a running job stops it in the engine at its next stage boundary.

The CPU backend's test hook fault_inject = cpu_delay_ms:N makes every product sleep N ms before
it computes, and a cancel ends that sleep (the job then stops before its product). With N of
ten minutes, a running job can leave its worker within this test's bounds only if the cancel
reaches it: the job queued behind it starts running, and the engine counts it cancelled.
Without the cancel the worker would stay busy for the whole ten minutes.
"""
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import SLOW, Daemon, Tap, metric, run_guarded  # noqa: E402

ID_RE = re.compile(r"^/v1/jobs/([0-9A-Za-z_-]+)$")


def submit(d):
    body = {"a": [[1.0, 2.0], [3.0, 4.0]], "b": [[5.0], [6.0]], "dtype": "float64"}
    r = d.curl("POST", "/v1/jobs", data=json.dumps(body).encode(), content_type="application/json")
    m = ID_RE.match(r.header("location") or "")
    return r, (m.group(1) if m and r.status == 202 else None)


def state_of(d, jid):
    r = d.curl("GET", "/v1/jobs/" + jid)
    return r, (r.json() or {}).get("state") if r.status == 200 else None


def wait_for(pred, limit_s):
    """Polls pred() until it is true or limit_s (scaled by SLOW) passed; returns its last value."""
    deadline = time.monotonic() + limit_s * SLOW
    v = pred()
    while not v and time.monotonic() < deadline:
        time.sleep(0.05)
        v = pred()
    return v


def cancelled_count(d):
    r, m = d.metrics()
    return metric(m, "gemmd_engine_jobs_total", result="cancelled") if m else -1


def main(tap):
    cfg = {"backend": "cpu", "cpu_workers": 1, "queue_depth": 4, "job_ttl": 600,
           "fault_inject": "cpu_delay_ms:600000"}
    with Daemon(tap, config=cfg) as d:
        r1, j1 = submit(d)
        tap.ok(j1 is not None, "first job accepted (202)", r1)
        tap.ok(j1 and wait_for(lambda: state_of(d, j1)[1] == "running", 30),
               "the first job is running (sleeping before its product)", state_of(d, j1)[0] if j1 else None)
        r2, j2 = submit(d)
        tap.ok(j2 is not None and state_of(d, j2)[1] == "queued", "a second job waits behind it", r2)

        r = d.curl("DELETE", "/v1/jobs/%s" % j1)
        tap.ok(r.status in (200, 204), "DELETE of the running job", r)
        tap.eq(d.curl("GET", "/v1/jobs/%s" % j1).status, 404, "the deleted job is gone at once")
        tap.ok(wait_for(lambda: cancelled_count(d) == 1, 30),
               "the engine stopped it: gemmd_engine_jobs_total{result=\"cancelled\"} = 1 (%s)" % cancelled_count(d))
        tap.ok(j2 and wait_for(lambda: state_of(d, j2)[1] == "running", 30),
               "its worker is free: the second job runs", state_of(d, j2)[0] if j2 else None)

        r = d.curl("DELETE", "/v1/jobs/%s" % j2)
        tap.ok(r.status in (200, 204), "DELETE of the second job while it runs", r)
        tap.ok(wait_for(lambda: cancelled_count(d) == 2, 30), "it is stopped too (cancelled = %s)" % cancelled_count(d))
        r = d.curl("GET", "/readyz")
        tap.ok(r.status == 200 and (r.json() or {}).get("running") == 0, "nothing runs any more", r)
        r, m = d.metrics()
        tap.ok(m is not None and metric(m, "gemmd_engine_jobs_total", result="completed") == 0,
               "no product was computed", r)


if __name__ == "__main__":
    run_guarded(Tap(), main)
