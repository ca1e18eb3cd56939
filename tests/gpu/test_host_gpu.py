"""test_host_gpu.py - host_max_mnk on the CUDA backend: a product too small for the GPU to
pay for its hand-off is computed on the host by the HTTP thread that received it.

- With the default (2^20, about 101^3): float32, float64 and int32 products with kernel auto up
  to the bound (odd shapes, one of exactly the bound (256x64x64), a batch within it, with its own B and with
  a shared B, in JSON and raw) answer with device "cpu" and kernel "openblas" / "blocked",
  no queue time and no copies, and are right (float64 reference; int32 wrapped exactly);
  gemmd_host_runs_total counts each once.
- What must go to the GPU does: a product over the bound, a batch whose products together
  pass it, a kernel named, math tf32, resident operands; and with
  host_max_mnk = 0 the small products too. Each answer names the GPU and is right.
- 64 concurrent clients, small host products and larger GPU ones mixed over every dtype:
  every answer right and its own, each where it belongs, the counter exact.
- SIGTERM under a stream of host products: every answer right or a whole 503; exit 0.

Run by tests/run.sh only on a machine with a GPU and a CUDA build.
"""
import os
import sys
import threading

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "e2e"))
from harness import (Daemon, Tap, compare, metric, raw_answer, reference,  # noqa: E402
                     run_guarded, server_timing, wrapping_matrix)

CONFIG = {"backend": "cuda", "streams_per_device": "4", "http_threads": "8", "per_ip_limit": "0",
          "connection_limit": "512", "queue_depth": "256"}
BOUND = 1 << 20
HOST_KERNEL = {"float32": "openblas", "float64": "openblas", "int32": "blocked"}


def host_runs(d):
    _, m = d.metrics()
    return metric(m or {}, "gemmd_host_runs_total")


def product_raw(d, a, b, dtype, query=""):
    """One raw product; (ok, where, detail): where is "cpu" or "cuda" (X-Gemm-Device)."""
    r = d.matmul_raw(a, b, dtype, accept="application/octet-stream", query=query)
    c = raw_answer(r, a.shape[0], b.shape[1], dtype)
    dev = (r.header("x-gemm-device") or "").split(" ")[0].split(":")[0]
    if c is None:
        return False, dev, "HTTP %d %s" % (r.status, r.body[:200])
    ok, why = compare(c, reference(a, b, dtype), dtype, a.shape[1])
    return ok, dev, "%s kernel %s timing %s %s" % (dev, r.header("x-gemm-kernel"), r.header("server-timing"), why)


def test_small_on_host(tap, d, rng):
    before = host_runs(d)
    n = 0
    for dtype in ("float32", "float64", "int32"):
        for (m, k, nn) in ((1, 1, 1), (37, 61, 53), (64, 64, 64), (256, 64, 64), (1, 4096, 256), (129, 5, 7)):
            a, b = wrapping_matrix(rng, (m, k), dtype), wrapping_matrix(rng, (k, nn), dtype)
            r = d.matmul_raw(a, b, dtype, accept="application/octet-stream")
            c = raw_answer(r, m, nn, dtype)
            ok, why = compare(c, reference(a, b, dtype), dtype, k) if c is not None else (False, "HTTP %d" % r.status)
            kern, dev = r.header("x-gemm-kernel"), r.header("x-gemm-device")
            timing = server_timing(r) or {}
            tap.ok(ok and dev == "cpu" and kern == HOST_KERNEL[dtype] and timing.get("h2d", 1) == 0
                   and timing.get("d2h", 1) == 0 and timing.get("queue", 1) == 0,
                   "%s %dx%dx%d on the host: right, X-Gemm-Device cpu, kernel %s" % (dtype, m, k, nn, kern),
                   "%s %s %s %s" % (dev, kern, timing, why))
            n += 1
    # JSON: the answer's own fields say where it ran
    a, b = wrapping_matrix(rng, (20, 30), "float64"), wrapping_matrix(rng, (30, 10), "float64")
    r = d.matmul_json(a, b, dtype="float64")
    j = r.json() or {}
    t = j.get("timing") or {}
    ok, why = compare(np.array(j.get("c", [])), reference(a, b, "float64"), "float64", 30) if r.status == 200 else (False, r)
    tap.ok(ok and j.get("device") == "cpu" and j.get("kernel") == "openblas" and t.get("h2d_ms", 0) == 0
           and t.get("d2h_ms", 0) == 0 and t.get("queue_ms", 1) < 0.1,
           "JSON float64 20x30x10 on the host: device cpu, kernel openblas, no copies, no queue",
           "%s %s" % (j.get("device"), t))
    n += 1
    # a batch within the bound: its own B per product, and one B for all
    for shared in (False, True):
        bsz, m, k, nn = 6, 20, 33, 17  # 6 * 20 * 33 * 17 < 2^20
        a = wrapping_matrix(rng, (bsz, m, k), "float32")
        b = wrapping_matrix(rng, (k, nn) if shared else (bsz, k, nn), "float32")
        q = "?m=%d&k=%d&n=%d&dtype=float32&batch=%d%s" % (m, k, nn, bsz, "&b_shared=1" if shared else "")
        r = d.curl("POST", "/v1/matmul" + q, data=a.tobytes() + b.tobytes(),
                   content_type="application/octet-stream", accept="application/octet-stream")
        good = r.status == 200 and len(r.body) == bsz * m * nn * 4
        if good:
            c = np.frombuffer(r.body, dtype="<f4").reshape(bsz, m, nn)
            for i in range(bsz):
                ok, why = compare(c[i], reference(a[i], b if shared else b[i], "float32"), "float32", k)
                good = good and ok
        tap.ok(good and r.header("x-gemm-device") == "cpu" and (r.header("x-gemm-batched") or "").startswith("%d loop" % bsz),
               "batch of %d 20x33x17 (%s B) on the host, every product right" % (bsz, "shared" if shared else "own"),
               "HTTP %d device %s batched %s" % (r.status, r.header("x-gemm-device"), r.header("x-gemm-batched")))
        n += 1
    tap.eq(host_runs(d) - before, n, "gemmd_host_runs_total counts each host product once")


def test_gpu_ones(tap, d, rng, label, small_too):
    cases = [("float32", (129, 128, 64), ""), ("float64", (128, 128, 128), ""), ("float32", (32, 32, 32), "&kernel=cublas"),
             ("float32", (32, 32, 32), "&kernel=tiled"), ("float32", (48, 40, 24), "&math=tf32")]
    if small_too:
        cases += [("float32", (64, 64, 64), ""), ("float64", (37, 61, 53), ""), ("int32", (16, 9, 5), "")]
    for dtype, (m, k, n), q in cases:
        a, b = wrapping_matrix(rng, (m, k), dtype), wrapping_matrix(rng, (k, n), dtype)
        if "tf32" in q:  # tf32 rounds the operands: compare loosely
            r = d.matmul_raw(a, b, dtype, accept="application/octet-stream", query=q)
            c = raw_answer(r, m, n, dtype)
            err = np.max(np.abs(c - reference(a, b, dtype))) if c is not None else np.inf
            dev = (r.header("x-gemm-device") or "")
            tap.ok(err < 1e-2 * k and dev.startswith("cuda:"), "%s: %s %dx%dx%d%s on the GPU" % (label, dtype, m, k, n, q),
                   "%s err %g" % (dev, err))
            continue
        ok, where, why = product_raw(d, a, b, dtype, q)
        tap.ok(ok and where == "cuda", "%s: %s %dx%dx%d%s on the GPU, right" % (label, dtype, m, k, n, q), why)
    # a batch whose products together pass the bound
    bsz, m, k, n = 33, 32, 32, 32
    a, b = wrapping_matrix(rng, (bsz, m, k), "float32"), wrapping_matrix(rng, (bsz, k, n), "float32")
    r = d.curl("POST", "/v1/matmul?m=%d&k=%d&n=%d&dtype=float32&batch=%d" % (m, k, n, bsz),
               data=a.tobytes() + b.tobytes(), content_type="application/octet-stream",
               accept="application/octet-stream")
    tap.ok(r.status == 200 and (r.header("x-gemm-device") or "").startswith("cuda:"),
           "%s: a batch of 33 x 32^3 (over the bound together) on the GPU" % label, r)


def test_resident_a(tap, d, rng):
    a, b = wrapping_matrix(rng, (32, 32), "float32"), wrapping_matrix(rng, (32, 32), "float32")
    ids = []
    for x in (a, b):
        r = d.curl("POST", "/v1/matrices?rows=32&cols=32&dtype=float32", data=x.tobytes(),
                   content_type="application/octet-stream")
        ids.append((r.json() or {}).get("id") if r.status == 201 else None)
    if not all(ids):
        tap.ok(False, "store resident A and B", r)
        return
    r = d.curl("POST", "/v1/matmul?a=%s&b=%s" % tuple(ids), accept="application/octet-stream")
    c = raw_answer(r, 32, 32, "float32")
    ok, why = compare(c, reference(a, b, "float32"), "float32", 32) if c is not None else (False, r)
    tap.ok(ok and (r.header("x-gemm-device") or "").startswith("cuda:"),
           "a product of resident matrices goes to the GPU (their copies live there), right", why)
    for i in ids:
        d.curl("DELETE", "/v1/matrices/" + i)


def test_mixed_clients(tap, d):
    shapes = [(64, 64, 64), (37, 61, 53), (1, 1, 1), (200, 100, 150), (513, 129, 257), (8, 300, 9)]
    dtypes = ["float32", "float64", "int32"]
    results = [None] * 64
    before = host_runs(d)

    def client(i):
        rng = np.random.default_rng(5000 + i)
        out = []
        for j in range(6):
            m, k, n = shapes[(i + j) % len(shapes)]
            dtype = dtypes[(i + 2 * j) % 3]
            a, b = wrapping_matrix(rng, (m, k), dtype), wrapping_matrix(rng, (k, n), dtype)
            try:
                ok, where, why = product_raw(d, a, b, dtype)
            except Exception as ex:  # noqa: BLE001 - reported below
                ok, where, why = False, "", repr(ex)
            want = "cpu" if m * k * n <= BOUND else "cuda"
            out.append((ok and where == want, where == "cpu", "client %d %s %dx%dx%d: %s (want %s)" % (i, dtype, m, k, n, why, want)))
        results[i] = out

    threads = [threading.Thread(target=client, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    flat = [x for out in results if out for x in out]
    bad = [x[2] for x in flat if not x[0]]
    tap.ok(len(flat) == 64 * 6 and not bad, "64 concurrent clients, host and GPU products mixed: every answer right, each where it belongs",
           "\n".join(bad[:10]))
    tap.eq(host_runs(d) - before, sum(1 for x in flat if x[1]), "gemmd_host_runs_total counts the host ones")


def test_sigterm(tap, rng):
    a, b = wrapping_matrix(rng, (48, 48), "float32"), wrapping_matrix(rng, (48, 48), "float32")
    ref = reference(a, b, "float32")
    stop = threading.Event()
    tallies = {"right": 0, "503": 0, "bad": []}
    lock = threading.Lock()
    with Daemon(tap, config=CONFIG) as d:
        def client():
            while not stop.is_set():
                try:
                    r = d.matmul_raw(a, b, "float32", accept="application/octet-stream")
                except Exception:  # noqa: BLE001 - the daemon went away: that ends the stream
                    return
                c = raw_answer(r, 48, 48, "float32")
                with lock:
                    if c is not None and compare(c, ref, "float32", 48)[0]:
                        tallies["right"] += 1
                    elif r.status == 503 and (r.json() or {}).get("error"):
                        tallies["503"] += 1
                    elif r.status == 0:  # refused or reset after the daemon closed its socket
                        stop.set()
                    else:
                        tallies["bad"].append("HTTP %d %r" % (r.status, r.body[:120]))
        threads = [threading.Thread(target=client) for _ in range(8)]
        for t in threads:
            t.start()
        threading.Event().wait(1.0)
        d.stop_and_check("SIGTERM under a stream of host products: exit 0")
        stop.set()
        for t in threads:
            t.join(timeout=60)
    tap.ok(tallies["right"] > 0 and not tallies["bad"],
           "every answer around SIGTERM right (%d) or a whole 503 (%d)" % (tallies["right"], tallies["503"]),
           "\n".join(tallies["bad"][:5]))


def main(tap):
    rng = np.random.default_rng(20261127)
    with Daemon(tap, config=CONFIG) as d:
        test_small_on_host(tap, d, rng)
        test_gpu_ones(tap, d, rng, "host_max_mnk default", False)
        test_resident_a(tap, d, rng)
        test_mixed_clients(tap, d)
    with Daemon(tap, config=dict(CONFIG, host_max_mnk="0")) as d:
        test_gpu_ones(tap, d, rng, "host_max_mnk 0", True)
        tap.eq(host_runs(d), 0, "host_max_mnk 0: nothing on the host")
    test_sigterm(tap, rng)


if __name__ == "__main__":
    run_guarded(Tap(), main)
