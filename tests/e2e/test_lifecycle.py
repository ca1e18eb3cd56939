#!/usr/bin/python3
"""test_lifecycle.py - the life of jobs and of the daemon around them:

- expired async jobs are freed by a timer, with no request arriving (seen in the debug
  log: the expiry line comes with no request in between);
- a status that says done always comes with a fetchable result (many jobs polled);
- DELETE of a job still on the engine: 204 at once, gone for its owner, freed when it ends;
- shutdown with a synchronous product that outlives shutdown_timeout: it is cancelled
  through the engine (and answers 503 itself), or, when it cannot stop (inside one BLAS
  call), its connection is answered 503 while it runs; either way the client gets a JSON
  503 shutting_down, libmicrohttpd is never stopped with a suspended connection (no
  MHD_PANIC, no abort) and the daemon exits 0 once the product has left the engine.

fault_inject = cpu_delay_ms:N holds products on the engine by construction.
"""
import json
import os
import re
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import SLOW, Daemon, Tap, metric, random_matrix, run_guarded, short_id  # noqa: E402


def submit(d, a, b):
    body = {"a": a.tolist(), "b": b.tolist(), "dtype": "float64"}
    r = d.curl("POST", "/v1/jobs", data=json.dumps(body).encode(), content_type="application/json")
    return r, (r.json() or {}).get("id")


def wait_for(pred, limit_s):
    deadline = time.monotonic() + limit_s * SLOW
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    return None


def ttl_timer(tap, rng):
    with Daemon(tap, config={"backend": "cpu", "job_ttl": 1, "log_level": "debug"}) as d:
        a = random_matrix(rng, (40, 30), "float64")
        b = random_matrix(rng, (30, 20), "float64")
        r, jid = submit(d, a, b)
        tap.ok(r.status == 202 and jid, "a job with job_ttl = 1 is accepted", r)
        short = re.escape(short_id(jid))
        fin = wait_for(lambda: re.search(r"job %s finished state=done" % short, d.read_log()), 30)
        tap.ok(fin is not None, "the debug log says it finished", d.read_log()[-1500:])
        # No request from here on: only the timer can free it.
        exp = wait_for(lambda: re.search(r"job %s expired" % short, d.read_log()), 30)
        log = d.read_log()
        tap.ok(exp is not None, "the debug log says it expired, with no request arriving", log[-1500:])
        if fin and exp:
            between = log[log.index(fin.group(0)):log.index(exp.group(0))]
            tap.ok("request start" not in between, "no request came between its end and its expiry", between)
        r = d.curl("GET", "/v1/jobs/" + (jid or "0"))
        tap.ok(r.status == 404, "expired: 404", r)
        _, m = d.metrics()
        tap.ok(m is not None and metric(m, "gemmd_jobs", state="done") == 0, "/metrics keeps no done job", m)


def done_means_fetchable(tap, rng):
    """Whenever a status says done, the result is there (never 409 job_not_done)."""
    bad = []
    polls = [0]
    with Daemon(tap, config={"backend": "cpu", "cpu_workers": 2, "max_jobs": 4096}) as d:
        a = random_matrix(rng, (320, 320), "float64")  # a few ms each: some polls see it on the engine
        b = random_matrix(rng, (320, 320), "float64")

        def client(n):
            for _ in range(n):
                r, jid = submit(d, a, b)
                if r.status != 202:
                    bad.append(("submit", r))
                    return
                for _ in range(2000):
                    s = d.curl("GET", "/v1/jobs/" + jid)
                    polls[0] += 1
                    st = (s.json() or {}).get("state")
                    if st == "done":
                        res = d.curl("GET", "/v1/jobs/%s/result" % jid, accept="application/octet-stream")
                        if res.status != 200:
                            bad.append(("result after done", res))
                        break
                    if st not in ("queued", "running"):
                        bad.append(("state", s))
                        break
                d.curl("DELETE", "/v1/jobs/" + jid)

        ts = [threading.Thread(target=client, args=(10,)) for _ in range(3)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        tap.ok(not bad, "30 jobs polled (%d polls): every 'done' came with its result" % polls[0], bad[:3])


def delete_running(tap, rng):
    delay = int(2000 * SLOW)
    with Daemon(tap, config={"backend": "cpu", "fault_inject": "cpu_delay_ms:%d" % delay,
                             "log_level": "debug"}) as d:
        a = random_matrix(rng, (8, 8), "float64")
        r, jid = submit(d, a, a)
        tap.ok(r.status == 202 and jid, "a slow job is accepted", r)
        running = wait_for(lambda: (d.curl("GET", "/v1/jobs/" + jid).json() or {}).get("state") == "running", 30)
        tap.ok(running, "it is running")
        r = d.curl("DELETE", "/v1/jobs/" + jid)
        tap.ok(r.status == 204, "DELETE of the running job: 204 at once", r)
        r = d.curl("GET", "/v1/jobs/" + jid)
        tap.ok(r.status == 404, "it is gone for its owner at once", r)
        gone = wait_for(lambda: re.search(r"job %s finished state=(done|cancelled)" % re.escape(short_id(jid)), d.read_log()), 30)
        tap.ok(gone, "the engine lets it go (done() ran)", d.read_log()[-1500:])

        def kept():
            _, m = d.metrics()
            return m is not None and sum(metric(m, "gemmd_jobs", state=s) for s in
                                         ("queued", "running", "done", "failed", "cancelled")) == 0
        tap.ok(wait_for(kept, 30), "and nothing is kept afterwards")
        r = d.curl("GET", "/healthz")
        tap.ok(r.status == 200, "the daemon keeps serving", r)


def shutdown_checks(tap, d, out, t, t0, rc, what):
    t.join(timeout=120)
    r = out.get("r")
    log = d.read_log()
    tap.ok(r is not None and r.status == 503 and r.error()[0] == "shutting_down",
           "%s: its client gets a JSON 503 shutting_down" % what, r)
    tap.ok(rc == 0, "%s: the daemon exits 0 (after %.1f s)" % (what, time.monotonic() - t0), (rc, log[-2000:]))
    tap.ok("Fatal error" not in log and "suspended connections" not in log,
           "%s: libmicrohttpd never met a suspended connection at stop" % what, log[-2000:])
    tap.ok("asked them to stop" in log, "%s: the log says the running product was asked to stop" % what,
           log[-2000:])
    san = d.sanitizer_report()
    tap.ok(not san, "%s: no sanitizer report in the daemon's log" % what, san)
    return r, log


def shutdown_cancels_running(tap, rng):
    """Past shutdown_timeout a running product is cancelled through the engine; the CPU
    backend's delay hook ends at the cancel, so the product answers 503 itself."""
    d = Daemon(tap, config={"backend": "cpu", "fault_inject": "cpu_delay_ms:600000", "shutdown_timeout": 1})
    with d:
        a = random_matrix(rng, (4, 4), "float64")
        out = {}
        t = threading.Thread(target=lambda: out.update(r=d.matmul_json(a, a, dtype="float64")))
        t.start()
        running = wait_for(lambda: (d.curl("GET", "/readyz").json() or {}).get("running") == 1, 30)
        tap.ok(running, "cancel: a synchronous product is running (a ten-minute delay)")
        t0 = time.monotonic()
        rc = d.stop(timeout=60 * SLOW)
        r, _ = shutdown_checks(tap, d, out, t, t0, rc, "cancel")
        tap.ok(r is not None and "cancelled while it ran" in (r.error()[1] or ""),
               "cancel: the product was stopped, not waited for", r)


def shutdown_abandons_running(tap, rng):
    """A product that cannot stop (inside one BLAS call) past shutdown_timeout = 0: its
    connection is resumed and answered 503 while the product still runs; the request is
    freed by the product's done() after libmicrohttpd has stopped. The cpu_stuck_ms hook
    keeps the product inside its run, deaf to the cancel, for 3 s on any host (a real
    2000^3 float64 product ends too soon on a many-core host)."""
    n = 64
    d = Daemon(tap, config={"backend": "cpu", "shutdown_timeout": 0,
                            "fault_inject": "cpu_stuck_ms:%d" % int(3000 * SLOW)})
    with d:
        a = random_matrix(rng, (n, n), "float64")
        out = {}
        t = threading.Thread(target=lambda: out.update(r=d.matmul_raw(a, a, "float64")))
        t.start()
        running = wait_for(lambda: (d.curl("GET", "/readyz").json() or {}).get("running") == 1, 60)
        tap.ok(running, "abandon: a %dx%dx%d float64 product is running" % (n, n, n))
        t0 = time.monotonic()
        rc = d.stop(timeout=120 * SLOW)
        _, log = shutdown_checks(tap, d, out, t, t0, rc, "abandon")
        tap.ok("answered 1 waiting clients with 503" in log,
               "abandon: its connection was answered while the product still ran", log[-2000:])


def main(tap):
    rng = np.random.default_rng(5)
    ttl_timer(tap, rng)
    done_means_fetchable(tap, rng)
    delete_running(tap, rng)
    shutdown_cancels_running(tap, rng)
    shutdown_abandons_running(tap, rng)


if __name__ == "__main__":
    run_guarded(Tap(), main)
