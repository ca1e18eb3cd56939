#!/usr/bin/python3
"""test_resident_gpu.py - resident matrices on the CUDA backend.

- A chain of four 1024^2 float32 products on resident operands (?a=ID&b=ID&store=1)
  equals NumPy in float64 (relative Frobenius error within 1e-4).
- Device residency: once every operand has been used on the device, running the same
  chain again copies nothing host-to-device: gemmd_device_bytes_copied_total{direction=
  "h2d"} does not move and every product's Server-Timing h2d is 0 (the engine reports
  0 when no byte was copied; the store=1
  intermediates were kept on the device by the product that wrote them), and
  gemmd_resident_bytes{where="device"} counts the device copies.
- DELETE gives the device copies back (the housekeeping thread frees them: polled, bounded).

Run by tests/run.sh only on a machine with a GPU and a CUDA build.
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "e2e"))
from harness import SLOW, Daemon, Tap, metric, run_guarded, server_timing  # noqa: E402

N = 1024


def h2d_total(d):
    _, mt = d.metrics()
    return sum(v for (name, labels), v in (mt or {}).items()
               if name == "gemmd_device_bytes_copied_total" and ("direction", "h2d") in labels)


def dev_resident(d):
    _, mt = d.metrics()
    return sum(v for (name, labels), v in (mt or {}).items()
               if name == "gemmd_resident_bytes" and ("where", "device") in labels)


def main(tap):
    rng = np.random.default_rng(5)
    mats = [(rng.uniform(-1, 1, (N, N)) / np.sqrt(N / 3.0)).astype("<f4") for _ in range(5)]
    ref = mats[0].astype(np.float64)
    for x in mats[1:]:
        ref = ref @ x.astype(np.float64)
    cfg = {"backend": "cuda", "max_body_mb": "256", "resident_mb": "1024", "streams_per_device": "1"}
    with Daemon(tap, config=cfg) as d:
        ids = []
        for x in mats:
            r = d.curl("POST", "/v1/matrices?rows=%d&cols=%d&dtype=float32" % (N, N), data=x.tobytes(),
                       content_type="application/octet-stream")
            ids.append((r.json() or {}).get("id") if r.status == 201 else None)
        tap.ok(all(ids), "five 1024^2 operands uploaded")
        if not all(ids):
            return

        def chain():
            cur, made, h2d = ids[0], [], []
            for x in ids[1:]:
                r = d.curl("POST", "/v1/matmul?a=%s&b=%s&store=1" % (cur, x))
                if r.status != 201:
                    tap.ok(False, "chain product", r)
                    return None, made, h2d
                cur = r.json()["id"]
                made.append(cur)
                h2d.append((server_timing(r) or {}).get("h2d", -1))
            return cur, made, h2d

        last, made, _ = chain()  # the first run copies each original operand once
        r = d.curl("GET", "/v1/matrices/" + (last or "x"), accept="application/octet-stream")
        c = np.frombuffer(r.body, dtype="<f4").reshape(N, N) if r.status == 200 else None
        err = float(np.linalg.norm(c - ref) / np.linalg.norm(ref)) if c is not None else float("inf")
        tap.ok(err < 1e-4, "chain of four on resident operands equals float64 NumPy (rel err %.2e)" % err, r)
        for m in made:
            d.curl("DELETE", "/v1/matrices/" + m)

        before = h2d_total(d)
        last, made, h2d = chain()
        after = h2d_total(d)
        tap.ok(last is not None and after == before,
               "second chain: no host-to-device bytes at all (%d -> %d)" % (before, after))
        tap.ok(h2d and all(t == 0 for t in h2d), "second chain: Server-Timing h2d 0 for every product", h2d)
        held = dev_resident(d)
        tap.ok(held >= 5 * N * N * 4, "device copies counted in gemmd_resident_bytes{where=device}: %d" % held)

        for m in made + ids:
            d.curl("DELETE", "/v1/matrices/" + m)
        deadline = time.monotonic() + 10 * SLOW
        while dev_resident(d) > 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        tap.ok(dev_resident(d) == 0, "DELETE gives every device copy back")
        d.stop_and_check()


if __name__ == "__main__":
    run_guarded(Tap(), main)
