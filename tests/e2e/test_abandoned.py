#!/usr/bin/python3
"""test_abandoned.py - work stops when its client leaves.

- 32 bodiless products on resident operands (?a=ID&b=ID, each 2 s of engine time with
  cpu_delay_ms) whose clients close after 0.3 s: the queued ones are taken off the queue
  and the running one stops at its next boundary, so the engine is idle within a few
  seconds (not the 64 s the products would take), and a good client's product waits for
  none of them. /metrics counts the clients that left.
- A client that leaves while its request waits for memory (admission): its place in the
  queue and the memory it would have reserved go to the others at once.
- A client that leaves while its body is arriving: the connection is closed and its
  reservation given back at once, not at the min_rate deadline.
"""
import os
import socket
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import SLOW, Daemon, Tap, metric, run_guarded  # noqa: E402


def engine_busy(d):
    _, m = d.metrics()
    if m is None:
        return None
    return metric(m, "gemmd_queue_depth") + metric(m, "gemmd_jobs_running")


def abandoned_products(tap, d):
    a = np.ones((256, 256), np.float32)
    r = d.curl("POST", "/v1/matrices?rows=256&cols=256&dtype=float32", data=a.tobytes(),
               content_type="application/octet-stream")
    mid = (r.json() or {}).get("id", "")
    tap.ok(r.status == 201, "a resident operand", r)
    head = ("POST /v1/matmul?a=%s&b=%s HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
            "Accept: application/octet-stream\r\n\r\n" % (mid, mid)).encode()
    socks = []
    for _ in range(32):
        s = socket.create_connection(("127.0.0.1", d.port), timeout=10)
        s.sendall(head)
        socks.append(s)
    time.sleep(0.3)
    busy = engine_busy(d)
    tap.ok(busy and busy >= 2, "32 products of 2 s each are on the engine (%s)" % busy)
    t0 = time.monotonic()
    for s in socks:
        s.close()
    idle_after = None
    while time.monotonic() - t0 < 20 * SLOW:
        if engine_busy(d) == 0:
            idle_after = time.monotonic() - t0
            break
        time.sleep(0.05)
    tap.ok(idle_after is not None and idle_after <= 5 * SLOW,
           "their clients gone, the engine is idle after %s s (the products would take 64 s)" %
           ("%.1f" % idle_after if idle_after is not None else "more than 20"))
    t1 = time.monotonic()
    b = np.ones((64, 64), np.float32)
    r = d.curl("POST", "/v1/matmul?m=64&k=64&n=64&dtype=float32", data=b.tobytes() * 2,
               content_type="application/octet-stream", accept="application/octet-stream")
    c = np.frombuffer(r.body, np.float32) if r.status == 200 else np.zeros(0)
    waited = time.monotonic() - t1
    tap.ok(c.size == 4096 and np.all(c == 64.0) and waited <= 5 * SLOW,
           "a good client's 64x64 product is answered in %.1f s (its own 2 s)" % waited, r)
    _, m = d.metrics()
    left = metric(m or {}, "gemmd_clients_left_total")
    tap.ok(left >= 30, "/metrics counts the clients that left a waiting request (%s)" % left)
    d.curl("DELETE", "/v1/matrices/" + mid)


def left_while_waiting(tap, d):
    """The budget holds one 24 MiB product (its body half sent); a second waits for memory
    and its client leaves; a third, sent then, is admitted as soon as the first ends."""
    n = 1024
    body = np.ones((n, n), np.float64).tobytes() * 2
    head = ("POST /v1/matmul?m=%d&k=%d&n=%d&dtype=float64 HTTP/1.1\r\nHost: x\r\n"
            "Content-Type: application/octet-stream\r\nAccept: application/octet-stream\r\n"
            "Content-Length: %d\r\n\r\n" % (n, n, n, len(body))).encode()
    first = socket.create_connection(("127.0.0.1", d.port), timeout=30)
    first.sendall(head + body[:len(body) // 2])
    time.sleep(0.3 * SLOW)
    second = socket.create_connection(("127.0.0.1", d.port), timeout=30)
    second.sendall(head)
    time.sleep(0.5 * SLOW)
    _, m = d.metrics()
    tap.ok(metric(m or {}, "gemmd_admission_waiting") == 1, "the second waits for memory")
    second.close()
    waiting = None
    for _ in range(int(40 * SLOW)):
        _, m = d.metrics()
        waiting = metric(m or {}, "gemmd_admission_waiting")
        if waiting == 0:
            break
        time.sleep(0.05)
    tap.ok(waiting == 0 and metric(m, "gemmd_admission_total", result="cancelled") >= 1,
           "its client gone, it leaves the queue at once (cancelled)")
    first.close()
    held = None
    for _ in range(int(40 * SLOW)):
        _, m = d.metrics()
        held = metric(m or {}, "gemmd_memory_inflight_bytes")
        if held == 0:
            break
        time.sleep(0.05)
    tap.ok(held == 0, "the first's client gone inside its body: its reservation is given back at once (%s)" % held)


def main(tap):
    cfg = {"backend": "cpu", "fault_inject": "cpu_delay_ms:2000", "cpu_workers": 1, "threads": 1,
           "queue_depth": 64, "max_inflight_mb": 32, "token_share": 100}
    with Daemon(tap, config=cfg) as d:
        abandoned_products(tap, d)
        left_while_waiting(tap, d)


if __name__ == "__main__":
    run_guarded(Tap(), main)
