#!/usr/bin/python3
"""test_ownership.py - with tokens, an async job belongs to the token that made it: any
other token gets 404 job_not_found (the same answer as for an id that never existed, not
403) for the status, the result (GET and HEAD) and DELETE, and cannot cancel it either;
its owner still gets it. Log lines carry a job id's instance and first 8 random digits,
never the whole id.

Token crossing is tried on every job route, for a finished job and for one still on the
engine (fault_inject = cpu_delay_ms holds it there by construction).
"""
import json
import os
import re
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import SLOW, Daemon, Tap, compare, random_matrix, reference, run_guarded, short_id  # noqa: E402

TOKENS = ["owner-token-alpha-1", "other-token-beta-2", "third-token-gamma-3"]


def auth(tok):
    return ["Authorization: Bearer " + tok]


def submit(d, tok, a, b):
    body = {"a": a.tolist(), "b": b.tolist(), "dtype": "float64"}
    r = d.curl("POST", "/v1/jobs", data=json.dumps(body).encode(), content_type="application/json",
               headers=auth(tok))
    return r, (r.json() or {}).get("id")


def wait_done(d, tok, jid, limit_s=30):
    deadline = time.monotonic() + limit_s * SLOW
    r = None
    while time.monotonic() < deadline:
        r = d.curl("GET", "/v1/jobs/" + jid, headers=auth(tok))
        if r.status != 200 or (r.json() or {}).get("state") in ("done", "failed", "cancelled"):
            return r
        time.sleep(0.05)
    return r


def same_as_unknown(tap, r, unknown, name):
    """404 job_not_found, like an id that was never made (status and code)."""
    tap.ok(r.status == 404 and r.error()[0] == "job_not_found" and r.status == unknown.status
           and r.error()[0] == unknown.error()[0], name + ": 404 job_not_found, as for an unknown id", r)


def crossing(tap, d, jid, owner, other, what):
    """Every job route with another token: 404, and nothing changes for the owner."""
    unknown = d.curl("GET", "/v1/jobs/" + "0" * 32, headers=auth(other))
    same_as_unknown(tap, d.curl("GET", "/v1/jobs/" + jid, headers=auth(other)), unknown,
                    "%s: status with another token" % what)
    same_as_unknown(tap, d.curl("GET", "/v1/jobs/%s/result" % jid, headers=auth(other)), unknown,
                    "%s: result with another token" % what)
    r = d.curl("HEAD", "/v1/jobs/%s/result" % jid, headers=auth(other), extra=["-I"])
    tap.ok(r.status == 404, "%s: HEAD result with another token: 404" % what, r)
    same_as_unknown(tap, d.curl("DELETE", "/v1/jobs/" + jid, headers=auth(other)), unknown,
                    "%s: DELETE with another token" % what)
    r = d.curl("GET", "/v1/jobs/" + jid, headers=auth(owner))
    tap.ok(r.status == 200 and (r.json() or {}).get("id") == jid,
           "%s: still there for its owner after the other token's DELETE" % what, r)


def main(tap):
    rng = np.random.default_rng(11)
    tmp = tempfile.TemporaryDirectory(prefix="gemmd-e2e-own-")
    tokfile = os.path.join(tmp.name, "tokens")
    with open(tokfile, "w") as f:
        f.write("# three clients\n%s\n%s\n%s\n%s\n" % (TOKENS[0], TOKENS[1], TOKENS[2], TOKENS[0]))
    a = random_matrix(rng, (9, 7), "float64")
    b = random_matrix(rng, (7, 5), "float64")
    ref = reference(a, b, "float64")
    ids = []

    with Daemon(tap, config={"backend": "cpu", "tokens_file": tokfile}) as d:
        own, other, third = TOKENS
        # ---- a finished job
        r, jid = submit(d, own, a, b)
        tap.ok(r.status == 202 and jid, "the owner's job is accepted", r)
        ids.append(jid)
        r = wait_done(d, own, jid)
        tap.ok(r.status == 200 and (r.json() or {}).get("state") == "done", "the owner sees it done", r)
        crossing(tap, d, jid, own, other, "finished job")
        crossing(tap, d, jid, own, third, "finished job, a third token")
        r = d.curl("GET", "/v1/jobs/%s/result" % jid, headers=auth(own))
        good, why = compare(np.array((r.json() or {}).get("c", [])), ref, "float64", 7) if r.status == 200 \
            else (False, repr(r))
        tap.ok(good, "the owner gets the right result", why)
        r = d.curl("GET", "/v1/jobs/" + jid)
        tap.ok(r.status == 401, "no token at all: 401 (before any lookup)", r)

        # ---- the other token's own job is its own, and invisible to the first
        r, jid2 = submit(d, other, b.T.copy(), a.T.copy())
        tap.ok(r.status == 202 and jid2, "the other token makes its own job", r)
        ids.append(jid2)
        wait_done(d, other, jid2)
        crossing(tap, d, jid2, other, own, "the other token's job")
        r = d.curl("DELETE", "/v1/jobs/" + jid2, headers=auth(other))
        tap.ok(r.status == 204, "its owner deletes it: 204", r)
        r = d.curl("GET", "/v1/jobs/" + jid2, headers=auth(other))
        tap.ok(r.status == 404, "deleted: 404 for its owner too", r)
        for odd in ("/v1/jobs//" + jid, "/v1/jobs/%s/x/%s" % (jid, jid), "/v1/other/" + jid):
            r = d.curl("GET", odd, headers=auth(own))
            tap.ok(r.status == 404, "an odd path quoting the id: 404 (%s)" % odd.replace(jid, "{id}"), r)
        r = d.curl("DELETE", "/v1/jobs/" + jid, headers=auth(own))
        tap.ok(r.status == 204, "the first job deleted by its owner", r)

    # ---- a job still on the engine cannot be cancelled by another token
    with Daemon(tap, config={"backend": "cpu", "tokens_file": tokfile,
                             "fault_inject": "cpu_delay_ms:%d" % int(1500 * SLOW)}) as d:
        own, other, _ = TOKENS
        r, jid = submit(d, own, a, b)
        tap.ok(r.status == 202 and jid, "a slow job is accepted", r)
        ids.append(jid)
        r = d.curl("GET", "/v1/jobs/" + jid, headers=auth(own))
        st = (r.json() or {}).get("state")
        tap.ok(r.status == 200 and st in ("queued", "running"), "it is still on the engine", r)
        crossing(tap, d, jid, own, other, "job on the engine")
        r = wait_done(d, own, jid)
        tap.ok(r.status == 200 and (r.json() or {}).get("state") == "done",
               "the other token's DELETE did not cancel it: it ends done", r)
        r = d.curl("GET", "/v1/jobs/%s/result" % jid, headers=auth(own), accept="application/x-npy")
        tap.ok(r.status == 200, "and its owner fetches the result", r)

    # ---- log lines: a short prefix, never a whole id
    for dm in tap.daemons:
        log = dm.read_log()
        whole = [i for i in ids if i and i in log]
        tap.ok(not whole, "no log line carries a whole job id", "\n".join(
            line for line in log.splitlines() if any(i in line for i in whole))[:2000])
        long_hex = re.findall(r"[0-9a-f]{32}", log)
        tap.ok(not long_hex, "no 32-digit hex string in the log at all", long_hex[:5])
    log = tap.daemons[0].read_log()
    tap.ok(("job=%s " % short_id(ids[0])) in log, "access log lines name the job by its instance and first 8 digits",
           log[-1500:])
    tap.ok("path=/v1/jobs/{id}/result" in log, "the access log shows the route, not the id", log[-1500:])
    tmp.cleanup()


if __name__ == "__main__":
    run_guarded(Tap(), main)
