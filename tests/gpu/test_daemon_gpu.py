"""test_daemon_gpu.py - the real bin/gemmd on the CUDA backend, driven with curl.

- 4096^3 float32 with kernel=tiled and kernel=cublas: within 1e-4 (relative Frobenius)
  of NumPy in float64, stages in Server-Timing no larger than the total, and the kernel
  named in X-Gemm-Kernel; cublas with math=tf32 is reported as such.
- 64 concurrent clients with mixed shapes, dtypes and kernels: every answer right.
- faults: a trapping kernel (fault_inject sticky:2) fails its request with 500; where the
  driver refuses the process a new context after the device reset, the daemon restarts
  itself in place (same pid and port); the next requests (retried on 503 or a closed
  connection, bounded) are right and SIGTERM still exits 0; an injected allocation
  failure and device_mem_limit give 507 device_out_of_memory and the next request is right.

Run by tests/run.sh only on a machine with a GPU and a CUDA build.
"""
import os
import re
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "e2e"))
from harness import SLOW, Daemon, Tap, np_dtype, reference, run_guarded, server_timing, wrapping_matrix  # noqa: E402

RECOVER_TIMEOUT = 120 * SLOW  # a restart re-initialises CUDA: seconds, bounded

BASE_CONFIG = {
    "backend": "cuda",
    "host_max_mnk": "0",  # the GPU paths under test (the host path: test_host_gpu.py)
    "streams_per_device": "4",
    "queue_depth": "256",
    "max_body_mb": "512",
    "max_dim": "65536",
    "max_elements": "67108864",
    "http_threads": "8",
    "connection_limit": "512",
    "per_ip_limit": "0",
}


def rel_err(c, ref):
    c = np.asarray(c, dtype=np.float64)
    den = np.linalg.norm(ref)
    if not np.all(np.isfinite(c)):
        return float("inf")
    return float(np.linalg.norm(c - ref) / (den if den > 0 else 1.0))


def raw(d, a, b, dtype, query=""):
    """POST raw binary, ask for raw binary; returns (response, C or None)."""
    r = d.matmul_raw(a, b, dtype, accept="application/octet-stream", query=query)
    c = None
    if r.status == 200:
        want = a.shape[0] * b.shape[1] * np.dtype(np_dtype(dtype)).itemsize
        if len(r.body) == want:
            c = np.frombuffer(r.body, dtype="<" + np.dtype(np_dtype(dtype)).str[1:]).reshape(a.shape[0], b.shape[1])
    return r, c


def right(c, a, b, dtype, tol):
    if c is None:
        return False, "no result"
    ref = reference(a, b, dtype)
    if dtype == "int32":
        bad = int(np.count_nonzero(c.astype(np.int64) != ref))
        return bad == 0, "%d elements differ" % bad
    e = rel_err(c, ref)
    return e < tol, "rel err %.3g (tol %.0e)" % (e, tol)


def stages_ok(r):
    st = server_timing(r) or {}
    parts = [st.get(k) for k in ("h2d", "kernel", "d2h")]
    if "total" not in st or any(p is None for p in parts):
        return False, st
    return sum(parts) <= st["total"] * 1.0001 + 0.002 and all(p > 0 for p in parts), st


def test_big(tap, d, rng):
    n = 4096
    a = wrapping_matrix(rng, (n, n), "float32")
    b = wrapping_matrix(rng, (n, n), "float32")
    ref = a.astype(np.float64) @ b.astype(np.float64)
    for kernel, math, tol in (("tiled", "", 1e-4), ("cublas", "", 1e-4), ("cublas", "tf32", 5e-3)):
        q = "&kernel=" + kernel + ("&math=" + math if math else "")
        r, c = raw(d, a, b, "float32", query=q)
        e = rel_err(c, ref) if c is not None else float("inf")
        tap.ok(r.status == 200 and e < tol, "4096^3 float32 kernel=%s%s: rel err %.3g < %.0e"
               % (kernel, " math=" + math if math else "", e, tol), r if r.status != 200 else None)
        good, st = stages_ok(r)
        tap.ok(good, "4096^3 kernel=%s: h2d + kernel + d2h <= total in Server-Timing %r" % (kernel, st))
        tap.eq(r.header("x-gemm-kernel"), kernel, "4096^3: X-Gemm-Kernel names %s" % kernel)
        if math:
            tap.eq(r.header("x-gemm-math"), math, "math=%s is reported back" % math)
        dev = r.header("x-gemm-device") or ""
        tap.ok(dev.startswith("cuda:"), "X-Gemm-Device names the GPU (%s)" % dev)


def test_blocks(tap, d, rng):
    """Without a tile, the optimized kernels run the block the shape calls for, and the
    answer names it: at 1024^3 float32 simt has 64 blocks of 128x128 for 132 SMs, so its
    default is the 128x64 block (reached by no tile option: tile 0). A deep product with
    few output tiles runs split-k, and says so in the block."""
    n = 1024
    a = wrapping_matrix(rng, (n, n), "float32")
    b = wrapping_matrix(rng, (n, n), "float32")
    for q, tile, block in (("&kernel=simt", "0", "128x64x16"),
                           ("&kernel=simt&tile=128", "128", "128x128x8"),
                           ("&kernel=simt&tile=64", "64", "64x64x16"),
                           ("&kernel=tiled", "32", "32x32")):
        r, c = raw(d, a, b, "float32", query=q)
        good, why = right(c, a, b, "float32", 1e-5)
        tap.ok(r.status == 200 and good, "1024^3 %s: right (%s)" % (q[1:], why), r if r.status != 200 else None)
        tap.ok(r.header("x-gemm-tile") == tile and r.header("x-gemm-block") == block,
               "1024^3 %s: runs and reports tile %s, block %s" % (q[1:], tile, block),
               "X-Gemm-Tile %r, X-Gemm-Block %r" % (r.header("x-gemm-tile"), r.header("x-gemm-block")))
        rate = re.search(r'kernel;dur=[0-9.]+;desc="([0-9.]+) GFLOP/s"', r.header("server-timing") or "")
        tap.ok(rate is not None and float(rate.group(1)) > 0,
               "1024^3 %s: Server-Timing carries the kernel's GFLOP/s (%s)"
               % (q[1:], rate.group(1) if rate else r.header("server-timing")))
    # Deep and narrow: 4 tiles of 128x128 for 132 SMs, so simt cuts k into 16 pieces
    # (split-k) by default for float32 and int32; an explicit tile runs whole.
    m, k, n = 256, 8192, 256
    for dtype, tol in (("float32", 1e-5), ("int32", 0)):
        a = wrapping_matrix(rng, (m, k), dtype)
        b = wrapping_matrix(rng, (k, n), dtype)
        for q, tile, block in (("&kernel=simt", "0", "128x128x8 split-k 16"),
                               ("&kernel=simt&tile=128", "128", "128x128x8")):
            r, c = raw(d, a, b, dtype, query=q)
            good, why = right(c, a, b, dtype, tol)
            tap.ok(r.status == 200 and good, "%dx%dx%d %s %s: right (%s)" % (m, k, n, dtype, q[1:], why),
                   r if r.status != 200 else None)
            tap.ok(r.header("x-gemm-tile") == tile and r.header("x-gemm-block") == block,
                   "%dx%dx%d %s %s: reports tile %s, block %s" % (m, k, n, dtype, q[1:], tile, block),
                   "X-Gemm-Tile %r, X-Gemm-Block %r" % (r.header("x-gemm-tile"), r.header("x-gemm-block")))


def test_concurrent(tap, d):
    shapes = [(1, 1, 1), (37, 53, 29), (128, 64, 96), (300, 200, 500), (513, 129, 257), (1000, 1, 1000)]
    dtypes = ["float32", "float64", "int32"]
    kernels = ["auto", "naive", "tiled", "cublas"]
    results = [None] * 64

    def client(i):
        rng = np.random.default_rng(1000 + i)
        m, k, n = shapes[i % len(shapes)]
        dtype = dtypes[i % 3]
        kernel = kernels[(i // 3) % 4]
        if dtype == "int32" and kernel == "cublas":
            kernel = "tiled"
        a, b = wrapping_matrix(rng, (m, k), dtype), wrapping_matrix(rng, (k, n), dtype)
        try:
            r, c = raw(d, a, b, dtype, query="&kernel=" + kernel)
            ok, why = right(c, a, b, dtype, 1e-12 if dtype == "float64" else 1e-5)
            results[i] = (r.status == 200 and ok, "%s %s %dx%dx%d: HTTP %d %s" % (kernel, dtype, m, k, n, r.status, why))
        except Exception as ex:  # noqa: BLE001 - reported below
            results[i] = (False, "client %d raised %r" % (i, ex))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    bad = [r[1] for r in results if r is None or not r[0]]
    tap.ok(not bad, "64 concurrent clients, mixed shapes/dtypes/kernels: all right", "\n".join(bad[:10]))

    rng = np.random.default_rng(7)
    a, b = wrapping_matrix(rng, (8, 8), "int32"), wrapping_matrix(rng, (8, 8), "int32")
    r, _ = raw(d, a, b, "int32", query="&kernel=cublas")
    code = (r.json() or {}).get("error", {}).get("code") if r.status != 200 else None
    tap.ok(r.status == 422 and code == "unsupported_dtype", "int32 with kernel=cublas is refused with 422 (%s)" % code, r)


def test_faults(tap):
    rng = np.random.default_rng(99)
    a, b = wrapping_matrix(rng, (300, 200), "float32"), wrapping_matrix(rng, (200, 100), "float32")
    # One device: a trap on a host with several GPUs can break the process's contexts on
    # all of them (seen on two H200s, driver 580); that case is test_multigpu_gpu.py's.
    cfg = dict(BASE_CONFIG, streams_per_device="2", fault_inject="sticky:2", devices="0")
    with Daemon(tap, config=cfg) as d:
        r1, c1 = raw(d, a, b, "float32", query="&kernel=tiled")
        tap.ok(r1.status == 200 and right(c1, a, b, "float32", 1e-5)[0], "sticky: first request right", r1)
        r2, _ = raw(d, a, b, "float32", query="&kernel=tiled")
        code = (r2.json() or {}).get("error", {}).get("code")
        tap.ok(r2.status == 500 and code == "device_error", "sticky: the trapping request gets 500 device_error", r2)
        # The trap poisons the process's CUDA context. The engine resets the device; where the
        # driver gives no new context to this process (as on the H100 with driver 580), the
        # device is marked lost, the engine turns unhealthy and the daemon restarts itself in
        # place (same pid, same port). Meanwhile products get 503 or a closed connection;
        # afterwards they are right. Never a hang, never a wrong answer.
        pid = d.proc.pid
        for kernel in ("cublas", "tiled", "naive"):
            seen = []
            deadline = time.monotonic() + RECOVER_TIMEOUT
            while True:
                r3, c3 = raw(d, a, b, "float32", query="&kernel=" + kernel)
                if r3.status == 200 or time.monotonic() > deadline or r3.status not in (0, 503):
                    break
                seen.append(r3.status)
                time.sleep(0.1)
            ok, why = right(c3, a, b, "float32", 1e-5) if r3.status == 200 else (False, "HTTP %d" % r3.status)
            tap.ok(ok and all(s in (0, 503) for s in seen),
                   "after the sticky error, kernel=%s: right after %d tries answered 503 or "
                   "refused (%s)" % (kernel, len(seen), why), r3)
        log = d.read_log()
        restarted = "restarting gemmd in place" in log and "restart=1 listen_fd=inherited" in log
        reset = "was reset after a sticky error" in log
        tap.ok(restarted or reset, "sticky: recovered by an in-place restart (%s) or an in-process reset (%s)"
               % (restarted, reset))
        tap.ok(d.alive() and d.proc.pid == pid, "sticky: the same process serves on (pid %d)" % pid)
        r4 = d.curl("GET", "/healthz")
        tap.eq(r4.status, 200, "healthz after recovery")
        tap.eq(d.curl("GET", "/readyz").status, 200, "readyz after recovery")

    cfg = dict(BASE_CONFIG, streams_per_device="1", fault_inject="oom:1")
    with Daemon(tap, config=cfg) as d:
        r1, _ = raw(d, a, b, "float32", query="&kernel=cublas")
        code = (r1.json() or {}).get("error", {}).get("code")
        tap.ok(r1.status == 507 and code == "device_out_of_memory", "oom:1: the first product gets 507 device_out_of_memory", r1)
        r2, c2 = raw(d, a, b, "float32", query="&kernel=cublas")
        tap.ok(r2.status == 200 and right(c2, a, b, "float32", 1e-5)[0], "oom:1: the next product is right", r2)

    cfg = dict(BASE_CONFIG, device_mem_limit_mb="4")
    with Daemon(tap, config=cfg) as d:
        big_a, big_b = wrapping_matrix(rng, (1024, 1024), "float32"), wrapping_matrix(rng, (1024, 1024), "float32")
        r1, _ = raw(d, big_a, big_b, "float32")
        err = (r1.json() or {}).get("error", {})
        tap.ok(r1.status == 507 and err.get("code") == "device_out_of_memory" and "bytes" in (err.get("message") or ""),
               "over device_mem_limit: 507 naming the bytes (%s)" % err.get("message"), r1)
        r2, c2 = raw(d, a, b, "float32")
        tap.ok(r2.status == 200 and right(c2, a, b, "float32", 1e-5)[0], "under the limit: right", r2)


def main(tap):
    rng = np.random.default_rng(20261122)
    with Daemon(tap, config=BASE_CONFIG) as d:
        info = d.curl("GET", "/v1/info")
        body = info.body.decode("utf-8", "replace")
        tap.ok(info.status == 200 and "cuda" in body and "cublas" in body and "tiled" in body,
               "/v1/info lists the CUDA backend and its kernels", info)
        test_big(tap, d, rng)
        test_blocks(tap, d, rng)
        test_concurrent(tap, d)
    test_faults(tap)


if __name__ == "__main__":
    run_guarded(Tap(), main)
