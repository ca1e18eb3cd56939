"""test_multigpu_gpu.py - the real bin/gemmd on a host with two GPUs or more (skipped, and
said so, with fewer).

- Least-loaded spreading: products that each hold a stream for a while (fault_inject
  gpu_delay_ms) sent two at a time land one per GPU (X-Gemm-Device), four at a time two
  per GPU, and /metrics shows gemmd_device_running per device while they run. Every
  answer is checked against NumPy in float64.
- Split: a product above split_min_mnk runs as one panel per GPU (X-Gemm-Split names both
  devices) and equals the same product run whole.
- Losing one GPU (fault_inject lost:2, no CUDA fault): its request fails with 500, the
  other GPUs serve every later product in the same process, the lost one takes none,
  /healthz and /readyz answer 200.
- A real trap on one GPU (sticky:2): after a bounded recovery every answer is right; the
  daemon restarts itself in place exactly when every GPU was lost (a trap has been seen to
  break the process's contexts on all GPUs of the host).

Run by tests/run.sh only on a machine with a GPU and a CUDA build.
"""
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "e2e"))
from harness import SLOW, Daemon, Tap, metric, reference, run_guarded  # noqa: E402

BASE_CONFIG = {
    "backend": "cuda",
    "host_max_mnk": "0",  # every product to a GPU
    "streams_per_device": "4",
    "batch_max": "1",          # no coalescing: each request is its own product on its own stream
    "queue_depth": "256",
    "max_body_mb": "512",
    "http_threads": "16",
    "connection_limit": "512",
    "per_ip_limit": "0",
}


def right(c, a, b):
    if c is None:
        return False
    ref = reference(a, b, "float32")
    return float(np.linalg.norm(c - ref) / max(np.linalg.norm(ref), 1e-30)) < 1e-5


def product(d, a, b, query=""):
    r = d.matmul_raw(a, b, "float32", accept="application/octet-stream", query=query)
    c = None
    if r.status == 200 and len(r.body) == a.shape[0] * b.shape[1] * 4:
        c = np.frombuffer(r.body, dtype=np.float32).reshape(a.shape[0], b.shape[1])
    return r, c


def device_of(r):
    return (r.header("x-gemm-device") or "").split(" ")[0]  # "cuda:1 NVIDIA H200" -> "cuda:1"


def at_once(d, pairs, query=""):
    """Sends the products concurrently, each on its own connection; (response, C) each."""
    out = [None] * len(pairs)

    def one(i):
        out[i] = product(d, pairs[i][0], pairs[i][1], query)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(pairs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300 * SLOW)
    return out


def test_spread(tap, ndev):
    rng = np.random.default_rng(515)
    cfg = dict(BASE_CONFIG, fault_inject="gpu_delay_ms:1500")
    with Daemon(tap, config=cfg) as d:
        pairs = [(rng.uniform(-1, 1, (301, 203)).astype(np.float32), rng.uniform(-1, 1, (203, 97)).astype(np.float32))
                 for _ in range(2 * ndev)]
        for rnd in range(3):
            got = at_once(d, pairs[:2])
            devs = [device_of(r) for r, _ in got]
            tap.ok(all(r.status == 200 and right(c, a, b) for (r, c), (a, b) in zip(got, pairs[:2])),
                   "two at once, round %d: both right" % rnd, [r for r, _ in got])
            tap.ok(len(set(devs)) == 2, "two at once, round %d: one per GPU (%s)" % (rnd, devs))

        # Four at once on two GPUs (2 * ndev in general): two per GPU, seen in /metrics while
        # they run (each holds its stream for 1.5 s of device time).
        seen = {}
        result = []
        t = threading.Thread(target=lambda: result.extend(at_once(d, pairs)))
        t.start()
        deadline = time.monotonic() + 20 * SLOW
        while time.monotonic() < deadline:
            _, m = d.metrics()
            m = m or {}
            run = [metric(m, "gemmd_device_running", device=str(i)) or 0 for i in range(ndev)]
            if sum(run) >= len(pairs):
                seen = run
                break
            time.sleep(0.02)
        t.join(timeout=300 * SLOW)
        tap.ok(seen and all(x == 2 for x in seen), "%d at once: gemmd_device_running 2 on every GPU (%s)"
               % (len(pairs), seen))
        per = {}
        for r, _ in result:
            per[device_of(r)] = per.get(device_of(r), 0) + 1
        tap.ok(len(result) == len(pairs) and all(r.status == 200 and right(c, a, b)
                                                  for (r, c), (a, b) in zip(result, pairs)),
               "%d at once: all right" % len(pairs))
        tap.ok(sorted(per.values()) == [2] * ndev, "%d at once: two per GPU (%s)" % (len(pairs), per))


def test_split(tap, ndev):
    rng = np.random.default_rng(616)
    a = rng.uniform(-1, 1, (1025, 700)).astype(np.float32)
    b = rng.uniform(-1, 1, (700, 513)).astype(np.float32)
    with Daemon(tap, config=dict(BASE_CONFIG, split_min_mnk="1000000", split_ways="0")) as d:
        r, c = product(d, a, b, "&kernel=tiled")
        split = r.header("x-gemm-split") or ""
        tap.ok(r.status == 200 and right(c, a, b), "split over %d GPUs: right" % ndev, r)
        tap.ok(all(("cuda:%d" % i) in split for i in range(ndev)), "X-Gemm-Split names every GPU (%s)" % split)
    with Daemon(tap, config=dict(BASE_CONFIG, split_min_mnk="0")) as d:
        r2, c2 = product(d, a, b, "&kernel=tiled")
        tap.ok(r2.status == 200 and not r2.header("x-gemm-split"), "the same product whole", r2)
        same_block = r.header("x-gemm-block") == r2.header("x-gemm-block")
        equal = c is not None and c2 is not None and np.array_equal(c, c2)
        tap.ok(equal or (not same_block and right(c, a, b)),
               "split and whole: equal element for element where the panels ran the whole's block "
               "(blocks %s / %s, equal %s)" % (r.header("x-gemm-block"), r2.header("x-gemm-block"), equal))


def fault_pair(seed):
    rng = np.random.default_rng(seed)
    return rng.uniform(-1, 1, (300, 200)).astype(np.float32), rng.uniform(-1, 1, (200, 100)).astype(np.float32)


def first_two(tap, d, a, b, hook):
    """The first product is right; the second, the one the hook hits, gets 500 device_error."""
    r1, c1 = product(d, a, b, "&kernel=tiled")
    tap.ok(r1.status == 200 and right(c1, a, b), "%s: first request right" % hook, r1)
    r2, _ = product(d, a, b, "&kernel=tiled")
    code = (r2.json() or {}).get("error", {}).get("code")
    tap.ok(r2.status == 500 and code == "device_error", "%s: the second request gets 500 device_error" % hook, r2)
    return r2


def test_lose_one(tap, ndev):
    """fault_inject lost:2 marks the second product's GPU lost, as a failed reset would,
    without a CUDA fault: the other GPUs serve everything, in the same process."""
    a, b = fault_pair(717)
    with Daemon(tap, config=dict(BASE_CONFIG, streams_per_device="2", fault_inject="lost:2")) as d:
        pid = d.proc.pid
        r2 = first_two(tap, d, a, b, "lost:2")
        lost_dev = device_of(r2)
        got = at_once(d, [(a, b)] * 16)
        bad = [r for r, c in got if r.status != 200 or not right(c, a, b)]
        devs = sorted({device_of(r) for r, _ in got})
        tap.ok(not bad, "16 at once with %s lost: all right, none 503" % lost_dev, bad[:3])
        tap.ok(lost_dev and lost_dev not in devs and len(devs) == ndev - 1,
               "the lost GPU takes no products (answers from %s, lost %s)" % (devs, lost_dev))
        log = d.read_log()
        tap.ok("restarting gemmd in place" not in log and d.alive() and d.proc.pid == pid,
               "one lost GPU of %d: no in-place restart, the same process serves on" % ndev)
        tap.eq(d.curl("GET", "/healthz").status, 200, "healthz with one GPU lost")
        tap.eq(d.curl("GET", "/readyz").status, 200, "readyz with one GPU lost")
        d.stop_and_check()


def test_trap(tap, ndev):
    """A real trap (fault_inject sticky:2) on one GPU of several. Where the driver keeps the
    other GPUs' contexts, they serve on in the same process; where the trap breaks every
    context of the process (seen on two H200s with driver 580: the next call on the other
    GPU fails with cudaErrorLaunchFailure too), every device is lost and the daemon restarts
    itself in place. Either way: the trapping request gets 500, the others 500 or 503 or a
    closed connection while it recovers (bounded), then every answer is right."""
    a, b = fault_pair(818)
    with Daemon(tap, config=dict(BASE_CONFIG, streams_per_device="2", fault_inject="sticky:2")) as d:
        pid = d.proc.pid
        first_two(tap, d, a, b, "sticky:2")
        deadline = time.monotonic() + 120 * SLOW
        seen = []
        while True:
            r3, c3 = product(d, a, b)
            err = (r3.json() or {}).get("error", {}).get("code") if r3.status != 200 else None
            if r3.status == 200 or time.monotonic() > deadline or \
                    not (r3.status in (0, 503) or (r3.status == 500 and err == "device_error")):
                break
            seen.append(r3.status)
            time.sleep(0.1)
        tap.ok(r3.status == 200 and right(c3, a, b), "after the trap: right after %d tries (%s)" % (len(seen), seen), r3)
        got = at_once(d, [(a, b)] * 16)
        bad = [r for r, c in got if r.status != 200 or not right(c, a, b)]
        tap.ok(not bad, "16 at once after the trap: all right (devices %s)" % sorted({device_of(r) for r, _ in got}),
               bad[:3])
        log = d.read_log()
        lost = log.count("could not be recovered")
        restarted = "restarting gemmd in place" in log
        tap.diag("trap on one GPU of %d: %d device(s) lost, in-place restart %s" % (ndev, lost, restarted))
        tap.ok(d.alive() and d.proc.pid == pid and (restarted == (lost >= ndev)),
               "the same process serves on, restarted in place exactly when every GPU was lost "
               "(%d lost, restart %s)" % (lost, restarted))
        tap.eq(d.curl("GET", "/readyz").status, 200, "readyz after the trap")
        d.stop_and_check()


def main(tap):
    with Daemon(tap, config=dict(BASE_CONFIG)) as d:
        info = d.curl("GET", "/v1/info").json() or {}
        ndev = len(info.get("devices") or [])
    if ndev < 2:
        tap.skip("multi-GPU: spreading, split over GPUs, losing one GPU",
                 "this host has %d CUDA device(s); these need 2 or more" % ndev)
        return
    tap.diag("%d devices: %s" % (ndev, [x.get("name") for x in info.get("devices")]))
    test_spread(tap, ndev)
    test_split(tap, ndev)
    test_lose_one(tap, ndev)
    test_trap(tap, ndev)


if __name__ == "__main__":
    run_guarded(Tap(), main)
