#!/usr/bin/python3
"""test_recovery.py - the daemon recovers from a lost device by restarting itself in place.

The CPU backend's test hook fault_inject = cpu_lost:N loses the (simulated) device at the
Nth product: that product fails with 500 device_error, later ones with 503
device_unavailable, and the engine reports itself unhealthy, as the CUDA backend does when
a context cannot be rebuilt after a sticky error. A restarted process ignores fault_inject
(GEMMD_RESTARTS > 0), so the hook fires once.

  1. restart_on_device_loss = true (the default): the failing product gets its error, the
     daemon re-execs itself (same pid, same port, a log line), the next products succeed,
     async results kept in memory are gone, and SIGTERM afterwards still exits 0;
  2. restart_on_device_loss = false: /healthz and /readyz answer 503 device_lost and the
     daemon keeps answering (products fail with 503 device_unavailable);
  3. the restart limit: with GEMMD_RESTART_MAX recent restarts inherited, it stays up
     unhealthy instead of restarting.
"""
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import SLOW, Daemon, Tap, compare, random_matrix, reference, run_guarded  # noqa: E402

RECOVER_TIMEOUT = 30 * SLOW


def product(d, rng, n=7):
    a = random_matrix(rng, (n, n + 1), "float64")
    b = random_matrix(rng, (n + 1, n - 1), "float64")
    return d.matmul_json(a, b, dtype="float64"), reference(a, b, "float64"), n + 1


def correct(r, ref, k):
    if r.status != 200:
        return False, repr(r)
    j = r.json() or {}
    return compare(np.array(j.get("c", [])), ref, "float64", k)


def wait_log(d, text, timeout=10 * SLOW):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in d.read_log():
            return True
        time.sleep(0.05)
    return text in d.read_log()


def test_restart(tap, rng):
    with Daemon(tap, config={"fault_inject": "cpu_lost:2"}) as d:
        pid = d.proc.pid
        body = {"a": [[1.0, 2.0]], "b": [[3.0], [4.0]], "dtype": "float64"}
        r = d.curl("POST", "/v1/jobs", data=json.dumps(body).encode(), content_type="application/json")
        tap.eq(r.status, 202, "restart: an async job is accepted before the loss")
        loc = r.header("location", "")
        deadline = time.monotonic() + RECOVER_TIMEOUT
        while time.monotonic() < deadline:
            s = d.curl("GET", loc)
            if s.status != 200 or (s.json() or {}).get("state") in ("done", "failed"):
                break
            time.sleep(0.05)
        tap.eq((s.json() or {}).get("state"), "done", "restart: the async job (product 1) is done")

        r, ref, k = product(d, rng)
        tap.eq(r.status, 500, "restart: product 2 (the device is lost) fails with 500")
        tap.eq(r.error()[0], "device_error", "restart: its error code is device_error")

        statuses = []
        deadline = time.monotonic() + RECOVER_TIMEOUT
        while time.monotonic() < deadline:
            r, ref, k = product(d, rng)
            if r.status == 200:
                break
            statuses.append(r.status)
            time.sleep(0.05)
        good, why = correct(r, ref, k)
        tap.ok(good, "restart: a product after the restart succeeds and is correct", why)
        tap.ok(all(s in (0, 503) for s in statuses),
               "restart: meanwhile only 503 or a refused/closed connection (%d tries)" % len(statuses),
               statuses)
        tap.ok(d.alive() and d.proc.pid == pid, "restart: the same process (pid %d) serves on" % pid)
        # The new process may answer before it writes its start-up line: wait for it (bounded).
        adopted = lambda lg: "restart=1 listen_fd=inherited" in lg and lg.count("url=%s " % d.base) == 2  # noqa: E731
        deadline = time.monotonic() + 10 * SLOW
        log = d.read_log()
        while not adopted(log) and time.monotonic() < deadline:
            time.sleep(0.05)
            log = d.read_log()
        tap.ok("restarting gemmd in place" in log, "restart: an error line says why it restarts")
        tap.ok(adopted(log),
               "restart: the new process adopted the same listening socket (same port)")
        tap.ok("ignoring fault_inject" in log, "restart: the restarted process ignores fault_inject")

        for i in range(3):
            r, ref, k = product(d, rng)
            good, why = correct(r, ref, k)
            tap.ok(good, "restart: product %d after the restart is correct (the hook fired once)" % (i + 1), why)
        tap.eq(d.curl("GET", "/healthz").status, 200, "restart: /healthz answers 200 again")
        tap.eq(d.curl("GET", "/readyz").status, 200, "restart: /readyz answers 200 again")
        r = d.curl("GET", loc)
        tap.eq(r.status, 404, "restart: async job results kept in memory are lost across the restart")
        # leaving the with block: SIGTERM must still exit 0 with no sanitizer report


def test_no_restart(tap, rng):
    with Daemon(tap, config={"fault_inject": "cpu_lost:1"}, flags=["--restart-on-device-loss", "false"]) as d:
        pid = d.proc.pid
        r, _, _ = product(d, rng)
        tap.eq(r.status, 500, "no restart: the product that loses the device fails with 500")
        tap.ok(wait_log(d, "does not restart itself (restart_on_device_loss = false)"),
               "no restart: an error line says the process must be restarted")
        for path in ("/healthz", "/readyz"):
            r = d.curl("GET", path)
            tap.ok(r.status == 503 and r.error()[0] == "device_lost",
                   "no restart: %s answers 503 device_lost" % path, r)
        r = d.curl("GET", "/healthz")
        tap.ok("restarted" in (r.error()[1] or ""), "no restart: /healthz says the process must be restarted", r)
        for i in range(2):
            r, _, _ = product(d, rng)
            tap.ok(r.status == 503 and r.error()[0] == "device_unavailable" and r.header("retry-after"),
                   "no restart: product %d fails with 503 device_unavailable and Retry-After" % (i + 2), r)
        tap.eq(d.curl("GET", "/v1/info").status, 200, "no restart: the daemon keeps answering")
        tap.ok(d.alive() and d.proc.pid == pid and "restarting gemmd in place" not in d.read_log(),
               "no restart: the process did not restart")


def test_limit(tap, rng):
    now = time.monotonic()  # CLOCK_MONOTONIC, the clock the daemon records restarts with
    times = ",".join("%.3f" % (now - 10 * i) for i in range(5))
    with Daemon(tap, config={"fault_inject": "cpu_lost:1"}, env={"GEMMD_RESTART_TIMES": times}) as d:
        r, _, _ = product(d, rng)
        tap.eq(r.status, 500, "limit: the product that loses the device fails with 500")
        tap.ok(wait_log(d, "already restarted 5 times within 600 s"),
               "limit: five restarts within 10 minutes: it stays up unhealthy and says so")
        tap.eq(d.curl("GET", "/healthz").status, 503, "limit: /healthz answers 503")
        tap.eq(d.curl("GET", "/readyz").status, 503, "limit: /readyz answers 503")
        r, _, _ = product(d, rng)
        tap.eq(r.status, 503, "limit: products fail with 503")
        tap.ok("restarting gemmd in place" not in d.read_log(), "limit: the process did not restart")

    old = ",".join("%.3f" % (now - 700 - i) for i in range(5))  # outside the window
    with Daemon(tap, config={"fault_inject": "cpu_lost:1"}, env={"GEMMD_RESTART_TIMES": old}) as d:
        r, _, _ = product(d, rng)
        tap.eq(r.status, 500, "limit: old restarts do not count: the failing product gets 500")
        tap.ok(wait_log(d, "restart=1 listen_fd=inherited", RECOVER_TIMEOUT),
               "limit: restarts older than 10 minutes do not count (it restarts)")


def main(tap):
    rng = np.random.default_rng(20261122)
    test_restart(tap, rng)
    test_no_restart(tap, rng)
    test_limit(tap, rng)


if __name__ == "__main__":
    run_guarded(Tap(), main)
