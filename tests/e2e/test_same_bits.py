#!/usr/bin/python3
"""test_same_bits.py - a product's answer depends on its request and the config, never on
the load.

The same mixed requests (float32, float64, int32, float16 and bfloat16 operands, C in
float32 or in the half dtype; shapes from 1x1x1 to 1024x1024x1024, odd ones among them;
batched requests, one with a shared B) are sent one at a time, so that each runs alone (on
the HTTP thread that received it: direct_run), then all of them several times over by 64
keep-alive connections at once, so that they run queued, coalesced with others of their
kind or direct as the load falls. Raw binary in and out. Every answer of the storm must be
byte-identical to the same request's answer alone and name the same kernel, tile, block and
math (X-Gemm-*); the answers alone are checked against NumPy (float64; int32 exactly), and
must agree between the two daemons.

Daemons: the CPU backend with coalescing on (batch_max 32; some storm answers must say they
ran coalesced) and with the defaults (coalescing off). With GEMMD_TEST_BACKEND=cuda
(tests/gpu/test_same_bits_gpu.py) the CUDA backend with the host path off, so that every
product reaches the GPU, coalescing on (batch_max 32) and off (batch_max 1); a few float32
products with tf32 and bf16 math join the mix there.
"""
import collections
import http.client
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import CURL_MAX_TIME, Daemon, Tap, run_guarded  # noqa: E402

BACKEND = os.environ.get("GEMMD_TEST_BACKEND", "cpu")
CLIENTS = 64
NPT = {"float32": "<f4", "float64": "<f8", "int32": "<i4", "float16": "<f2", "bfloat16": "<u2"}
# Products (the same shape, dtype and options) sent with different data, and how often each
# is sent in the storm: enough of one kind at once to be coalesced.
SMALL = [(1, 1, 1), (3, 5, 7), (17, 33, 9), (64, 64, 64)]
LARGER = [  # (dtype, m, k, n, out in the half dtype)
    ("float32", 1024, 1024, 1024, False), ("float32", 255, 257, 129, False), ("float32", 1, 1024, 1, False),
    ("float64", 101, 99, 103, False), ("float64", 512, 512, 512, False), ("int32", 200, 150, 250, False),
    ("float16", 129, 65, 33, True), ("float16", 1024, 3, 1024, False), ("bfloat16", 257, 31, 255, False),
    ("bfloat16", 64, 64, 64, True),
]
BATCHED = [  # (dtype, batch, m, k, n, B shared)
    ("float32", 3, 5, 7, 3, False), ("float64", 4, 16, 16, 16, True), ("int32", 2, 33, 1, 17, False),
    ("float16", 3, 8, 8, 8, True),
]
SAME = ("X-Gemm-Kernel", "X-Gemm-Tile", "X-Gemm-Block", "X-Gemm-Math")


class Req:
    def __init__(self, rng, dtype, m, k, n, batch=0, shared=False, out=False, math=None):
        self.dtype, self.m, self.k, self.n, self.batch, self.out, self.math = dtype, m, k, n, batch, out, math
        nb = batch or 1
        self.a = operand(rng, dtype, (nb, m, k))
        self.b = operand(rng, dtype, (1 if shared else nb, k, n))
        q = "m=%d&k=%d&n=%d&dtype=%s" % (m, k, n, dtype)
        if batch:
            q += "&batch=%d&b_shared=%d" % (batch, 1 if shared else 0)
        if out:
            q += "&out_dtype=" + dtype
        if math:
            q += "&math=" + math
        self.path = "/v1/matmul?" + q
        self.body = self.a.tobytes() + self.b.tobytes()
        self.name = "%s %s%dx%dx%d%s%s%s" % (dtype, "%dx " % batch if batch else "", m, k, n,
                                             " shared B" if shared else "", " C %s" % dtype if out else "",
                                             " math " + math if math else "")


def operand(rng, dtype, shape):
    """Little-endian elements; int32 in [-1000, 1000), floats in [-1, 1] (bfloat16: the top
    half of a float32's bits)."""
    if dtype == "int32":
        return rng.integers(-1000, 1000, size=shape, dtype=np.int64).astype("<i4")
    x = rng.uniform(-1.0, 1.0, size=shape)
    if dtype == "bfloat16":
        return (x.astype("<f4").view("<u4") >> 16).astype("<u2")
    return x.astype(NPT[dtype])


def values(arr, dtype):
    """An operand or an answer's elements as float64 (int32 as int64)."""
    if dtype == "int32":
        return arr.astype(np.int64)
    if dtype == "bfloat16":
        return (arr.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return arr.astype(np.float64)


def right(req, body):
    """(ok, detail): the answer's bytes against NumPy's product of the same operands."""
    cdt = req.dtype if req.out or req.dtype in ("float32", "float64", "int32") else "float32"
    nb = req.batch or 1
    want = nb * req.m * req.n * np.dtype(NPT[cdt]).itemsize
    if len(body) != want:
        return False, "%d bytes, want %d" % (len(body), want)
    c = values(np.frombuffer(body, dtype=NPT[cdt]).reshape(nb, req.m, req.n), cdt)
    ref = np.matmul(values(req.a, req.dtype), values(req.b, req.dtype))
    if req.dtype == "int32":
        bad = c != (ref + 2**31) % 2**32 - 2**31
    else:
        k = req.k
        tol = {"float64": 1e-12 * k, "tf32": 2.0**-9 * k, "bf16": 2.0**-7 * k}.get(req.math or req.dtype,
                                                                                   1e-5 * k + 1e-6)
        if req.out:  # C rounded to the half dtype: half a unit in its last place more
            tol = tol + np.abs(ref) * (2.0**-11 if req.dtype == "float16" else 2.0**-8) + 2.0**-25
        bad = ~(np.abs(c - ref) <= tol)
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        return False, "%d elements wrong; first at %r: %r, want %r" % (int(bad.sum()), i, c[i], ref[i])
    return True, ""


def requests():
    rng = np.random.default_rng(20261127)
    reqs, reps = [], []
    dtypes = ["float32", "float64", "int32", "float16", "bfloat16"]
    for dt in dtypes:
        for m, k, n in SMALL:
            for _ in range(4):  # four products of one kind, each sent four times
                reqs.append(Req(rng, dt, m, k, n))
                reps.append(4)
    for dt, m, k, n, out in LARGER:
        reqs.append(Req(rng, dt, m, k, n, out=out))
        reps.append(2)
    for dt, nb, m, k, n, shared in BATCHED:
        reqs.append(Req(rng, dt, m, k, n, batch=nb, shared=shared))
        reps.append(3)
    if BACKEND == "cuda":
        for math in ("tf32", "bf16"):
            for _ in range(4):
                reqs.append(Req(rng, "float32", 64, 96, 32, math=math))
                reps.append(4)
    return reqs, reps


def send(conn, req):
    """One request on a kept-alive connection, retried while the daemon answers 503 (a full
    queue or memory budget: it says when to come back). Returns (status, body, headers)."""
    for attempt in range(50):
        conn.request("POST", req.path, body=req.body, headers={
            "Content-Type": "application/octet-stream", "Accept": "application/octet-stream"})
        r = conn.getresponse()
        body = r.read()
        hdrs = {h: r.getheader(h) for h in SAME + ("X-Gemm-Batched", "X-Gemm-Device")}
        if r.status != 503 or attempt == 49:
            return r.status, body, hdrs
        time.sleep(min(float(r.getheader("Retry-After") or 1), 1.0) / 10)
    return 0, b"", {}


def alone(d, reqs):
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=CURL_MAX_TIME)
    try:
        return [send(conn, r) for r in reqs]
    finally:
        conn.close()


def storm(d, reqs, reps):
    """Every request reps[i] times from CLIENTS connections at once; the copies of one kind
    queued next to each other, so that they arrive together. Returns [(i, answer)], errors."""
    kinds = collections.OrderedDict()
    for i, r in enumerate(reqs):
        kinds.setdefault(r.path, []).extend([i] * reps[i])  # the path names the kind
    order = list(kinds.values())
    np.random.default_rng(5).shuffle(order)
    todo = collections.deque(i for group in order for i in group)
    lock, got, errors = threading.Lock(), [], []

    def client():
        conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=CURL_MAX_TIME)
        try:
            while True:
                with lock:
                    if not todo:
                        return
                    i = todo.popleft()
                ans = send(conn, reqs[i])
                with lock:
                    got.append((i, ans))
        except Exception as e:  # noqa: BLE001 - reported
            with lock:
                errors.append(repr(e))
        finally:
            conn.close()

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got, errors


def check(tap, d, label, reqs, reps, must_coalesce):
    first = alone(d, reqs)
    bad = [(r.name, s, right(r, b)[1] if s == 200 else b[:200]) for r, (s, b, h) in zip(reqs, first)
           if s != 200 or not right(r, b)[0]]
    tap.ok(not bad, "%s: %d products one at a time, every answer right" % (label, len(reqs)), bad[:3])
    got, errors = storm(d, reqs, reps)
    tap.ok(not errors and len(got) == sum(reps), "%s: %d answers from %d connections at once, no client failed"
           % (label, len(got), CLIENTS), errors[:3])
    differ, coalesced = [], 0
    for i, (s, body, hdrs) in got:
        s0, body0, hdrs0 = first[i]
        launch, launch0 = [hdrs.get(h) for h in SAME], [hdrs0.get(h) for h in SAME]
        if s != 200 or body != body0 or launch != launch0:
            differ.append((reqs[i].name, s, "bytes differ" if body != body0 else "", launch, launch0,
                           hdrs.get("X-Gemm-Batched")))
        coalesced += "coalesced" in (hdrs.get("X-Gemm-Batched") or "")
    tap.ok(not differ, "%s: every answer under load has the bytes, kernel, tile, block and math of the same "
           "request alone" % label, differ[:3])
    tap.diag("%s: %d of %d answers under load ran coalesced" % (label, coalesced, len(got)))
    if must_coalesce:
        tap.ok(coalesced > 0, "%s: some of them ran coalesced" % label, coalesced)
    return first


def main(tap):
    reqs, reps = requests()
    base = {"backend": BACKEND, "queue_depth": "1024", "per_ip_limit": "0", "connection_limit": "1024"}
    if BACKEND == "cuda":
        base["host_max_mnk"] = "0"  # every product to the GPU
        configs = [("cuda, coalescing on (batch_max 32)", {"batch_max": "32"}, True),
                   ("cuda, coalescing off (batch_max 1)", {"batch_max": "1"}, False)]
    else:
        configs = [("cpu, coalescing on (batch_max 32)", {"batch_max": "32"}, True),
                   ("cpu, the defaults (coalescing off)", {}, False)]
    answers = []
    for label, extra, coalesce in configs:
        with Daemon(tap, config=dict(base, **extra)) as d:
            answers.append(check(tap, d, label, reqs, reps, coalesce))
    differ = [r.name for r, x, y in zip(reqs, answers[0], answers[1])
              if x[1] != y[1] or [x[2].get(h) for h in SAME] != [y[2].get(h) for h in SAME]]
    tap.ok(not differ, "the answers alone are the same with coalescing on and off", differ[:5])


if __name__ == "__main__":
    run_guarded(Tap(), main)
