#!/usr/bin/python3
"""test_direct.py - direct_run: a small product that arrives while the engine is idle runs
on the HTTP thread that received it (on an idle worker's state), instead of being queued
for that worker. Checked through the daemon, the way clients use it:

- one client at a time: every answer right (raw, JSON, .npy; float32, float64, int32),
  and /metrics gemmd_direct_runs_total counts each of them;
- direct_run = false: the same answers, and nothing counted;
- a product larger than batch_max_mnk is always queued;
- 24 concurrent clients: every answer right and its own, and direct plus queued add up
  to the products completed;
- a fault hook that holds every run (cpu_delay_ms): nothing runs direct;
- SIGTERM under a stream of direct products: every answer right or a whole 503, exit 0.

That a product run direct has the bits (and the kernel) it gets queued or coalesced is
tests/e2e/test_same_bits.py's.

The same test runs against the CUDA backend on a GPU host (GEMMD_TEST_BACKEND=cuda).
"""
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (Daemon, Tap, compare, load_npy, npy_bytes, random_matrix,  # noqa: E402
                     raw_answer, reference, run_clients, run_guarded)

BACKEND = os.environ.get("GEMMD_TEST_BACKEND", "cpu")
METRIC = "gemmd_direct_runs_total"


def counter(d, name):
    r, m = d.metrics()
    if m is None:
        return None
    return int(m.get((name, frozenset()), -1))


def completed(d):
    r, m = d.metrics()
    return int(m.get(("gemmd_engine_jobs_total", frozenset({("result", "completed")})), -1))


def one(d, rng, i, shape=None):
    """Sends product i (format and dtype by i); returns (ok, name, detail)."""
    dtype = ("float32", "float64", "int32")[i % 3]
    fmt = ("raw", "json", "npy")[(i // 3) % 3]
    m, k, n = shape or ((5, 7, 3), (17, 9, 13), (64, 64, 64), (1, 33, 2))[i % 4]
    a = random_matrix(rng, (m, k), dtype)
    b = random_matrix(rng, (k, n), dtype)
    name = "product %d: %s %dx%dx%d via %s" % (i, dtype, m, k, n, fmt)
    if fmt == "raw":
        r = d.matmul_raw(a, b, dtype)
        c = raw_answer(r, m, n, dtype)
    elif fmt == "json":
        r = d.matmul_json(a, b, dtype=dtype)
        c = np.array((r.json() or {}).get("c")) if r.status == 200 else None
    else:
        r = d.matmul_npy(npy_bytes(a), npy_bytes(b), accept="application/x-npy")
        c = load_npy(r.body) if r.status == 200 else None
    if c is None:
        return False, name, "status %d: %s" % (r.status, r.body[:200])
    ok, detail = compare(c, reference(a, b, dtype), dtype, k)
    return ok, name, detail


def sequential(tap, d, label, n, expect_direct):
    rng = np.random.default_rng(7)
    before = counter(d, METRIC)
    tap.ok(before is not None and before >= 0, "%s: /metrics has %s" % (label, METRIC), before)
    bad = []
    for i in range(n):
        ok, name, detail = one(d, rng, i)
        if not ok:
            bad.append((name, detail))
    tap.ok(not bad, "%s: %d products one at a time, every answer right" % (label, n), bad[:3])
    after = counter(d, METRIC)
    want = before + (n if expect_direct else 0)
    tap.ok(after == want, "%s: %s went from %d to %d (want %d)" % (label, METRIC, before, after, want),
           (before, after))


def concurrent(tap, d, label, clients, per):
    c0, k0 = completed(d), counter(d, METRIC)
    flat, errors = run_clients(clients, per, lambda rng, i: one(d, rng, i), seed=500)
    tap.ok(not errors, "%s: no client raised" % label, errors[:3])
    bad = [x for x in flat if not x[0]]
    tap.ok(len(flat) == clients * per and not bad,
           "%s: %d concurrent clients x %d products, every answer right and its own" % (label, clients, per),
           bad[:3])
    ran, done = counter(d, METRIC) - k0, completed(d) - c0
    tap.ok(done == clients * per and 0 <= ran <= done,
           "%s: %d products completed, %d of them direct" % (label, done, ran), (done, ran))


def main(tap):
    base = {"backend": BACKEND, "host_max_mnk": "0"}  # on CUDA: the GPU's direct run, not the host
    with Daemon(tap, config=base) as d:
        sequential(tap, d, "direct_run on (default)", 24, True)
        concurrent(tap, d, "direct_run on", 24, 4)
    with Daemon(tap, config=dict(base, direct_run="false")) as d:
        sequential(tap, d, "direct_run = false", 12, False)
    # Larger than batch_max_mnk (here 4096 = 16^3): always queued.
    with Daemon(tap, config=dict(base, batch_max_mnk="4096")) as d:
        rng = np.random.default_rng(3)
        k0 = counter(d, METRIC)
        res = [one(d, rng, i, shape=(17, 16, 16)) for i in range(6)]
        tap.ok(all(x[0] for x in res), "17x16x16 (over batch_max_mnk): answers right", [x for x in res if not x[0]][:2])
        tap.ok(counter(d, METRIC) == k0, "a product over batch_max_mnk never runs direct", (k0, counter(d, METRIC)))
        ok, name, detail = one(d, rng, 0, shape=(16, 16, 16))
        tap.ok(ok and counter(d, METRIC) == k0 + 1, "one of exactly batch_max_mnk does", (ok, detail))
    # A hook that holds every run (cpu_delay_ms) makes products long by design: they are
    # queued, never run on an HTTP thread (the backend is not "quick").
    if BACKEND == "cpu":
        with Daemon(tap, config=dict(base, fault_inject="cpu_delay_ms:5")) as d:
            rng = np.random.default_rng(9)
            res = [one(d, rng, i) for i in range(6)]
            tap.ok(all(x[0] for x in res), "cpu_delay_ms: answers right", [x for x in res if not x[0]][:2])
            tap.ok(counter(d, METRIC) == 0, "cpu_delay_ms: nothing ran direct", counter(d, METRIC))
    # SIGTERM while one client keeps sending products one after the other (each run direct):
    # every answer it got is right or a whole 503, and the daemon exits 0.
    with Daemon(tap, config=base) as d:
        got, stop = [], threading.Event()

        def client():
            rng = np.random.default_rng(13)
            while not stop.is_set():
                a = random_matrix(rng, (96, 96), "float64")
                b = random_matrix(rng, (96, 96), "float64")
                try:
                    r = d.matmul_raw(a, b, "float64")
                except Exception as e:  # noqa: BLE001 - the daemon going away
                    got.append(("raised", repr(e)))
                    break
                if r.status == 200:
                    c = np.frombuffer(r.body, dtype="<f8").reshape(96, 96)
                    got.append(("200",) + compare(c, reference(a, b, "float64"), "float64", 96))
                else:
                    got.append((str(r.status), r.error()[0] if r.status == 503 else r.body[:200]))
                    if r.status != 503 or not d.alive():
                        break

        t = threading.Thread(target=client)
        t.start()
        deadline = time.time() + 30
        while time.time() < deadline and sum(1 for x in got if x[0] == "200") < 20:
            time.sleep(0.01)
        ran = counter(d, METRIC)
        rc = d.stop()
        stop.set()
        t.join(30)
        ok200 = [x for x in got if x[0] == "200"]
        bad = [x for x in got if (x[0] == "200" and not x[1]) or x[0] not in ("200", "503", "raised", "0")]
        tap.ok(len(ok200) >= 20 and ran >= 20, "SIGTERM under a stream of direct products: %d answered, "
               "%d ran direct before it" % (len(ok200), ran), (len(ok200), ran))
        tap.ok(not bad, "... every answer right or a whole 503", bad[:3])
        tap.ok(rc == 0, "... and the daemon exits 0", rc)

if __name__ == "__main__":
    run_guarded(Tap(), main)
