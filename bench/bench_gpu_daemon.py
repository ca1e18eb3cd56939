"""bench_gpu_daemon.py - gemmd on the CUDA backend, measured from a client on loopback.

    python3 bench/bench_gpu_daemon.py [--gemmd bin/gemmd] [--sizes 1024,2048,4096]
                                      [--reps 7] [--jobs 16] [--kernel cublas]

Starts the daemon (backend cuda, 4 streams) on a free port and sends raw float32 bodies
(A then B), asking for a raw answer, over one keep-alive connection per client thread:
1. n^2 products one at a time: median wall ms, payload GB/s (A + B + C over the wall time)
   and the share of the wall time per stage from Server-Timing (queue, h2d, kernel, d2h,
   and the rest: HTTP transfer, decoding, encoding).
2. stream overlap: --jobs products of 2048^2, one at a time versus --jobs clients at once.
Every answer's size is checked and a sample of elements compared with float64.
Prints Markdown tables.
"""
import argparse
import http.client
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "e2e"))
from harness import free_port  # noqa: E402  (one way to pick a loopback port, the tests')


def timing(h):
    out = {}
    for part in (h or "").split(","):
        f = [x.strip() for x in part.split(";")]
        for x in f[1:]:
            if x.startswith("dur="):
                out[f[0]] = float(x[4:])
    return out


class Client:
    def __init__(self, port):
        self.c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)

    def mul(self, body, n, kernel):
        t0 = time.perf_counter()
        self.c.request("POST", "/v1/matmul?m=%d&k=%d&n=%d&dtype=float32&kernel=%s" % (n, n, n, kernel), body=body,
                       headers={"Content-Type": "application/octet-stream", "Accept": "application/octet-stream"})
        r = self.c.getresponse()
        data = r.read()
        wall = (time.perf_counter() - t0) * 1000
        if r.status != 200 or len(data) != n * n * 4:
            raise RuntimeError("HTTP %d, %d bytes: %r" % (r.status, len(data), data[:300]))
        return wall, timing(r.getheader("Server-Timing")), data


def check(a, b, data, n):
    c = np.frombuffer(data, dtype="<f4").reshape(n, n)
    rng = np.random.default_rng(1)
    idx = rng.integers(0, n, size=(32, 2))
    worst = 0.0
    for i, j in idx:
        ref = float(a[i].astype(np.float64) @ b[:, j].astype(np.float64))
        scale = float(np.abs(a[i].astype(np.float64)) @ np.abs(b[:, j].astype(np.float64)))
        worst = max(worst, abs(float(c[i, j]) - ref) / scale)
    return worst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gemmd", default=os.path.join(REPO, "bin/gemmd"))
    ap.add_argument("--sizes", default="1024,2048,4096")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--kernel", default="cublas")
    args = ap.parse_args()
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="gemmd-bench-")
    conf = os.path.join(tmp, "gemmd.conf")
    with open(conf, "w") as f:
        f.write("backend = cuda\nstreams_per_device = 4\nqueue_depth = 256\nmax_body_mb = 1024\n"
                "max_dim = 65536\nmax_elements = 268435456\nhttp_threads = 16\nlog_level = warn\n")
    log = open(os.path.join(tmp, "stderr.log"), "wb")
    p = subprocess.Popen([args.gemmd, "--config", conf, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 30
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/healthz")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline or p.poll() is not None:
                sys.exit("gemmd did not start")
            time.sleep(0.1)
        rng = np.random.default_rng(5)
        print("## Through the daemon: raw float32, kernel=%s, one client, keep-alive (median of %d)\n"
              % (args.kernel, args.reps))
        print("| n | wall ms | payload GB/s | queue | h2d | kernel | d2h | rest (HTTP, codecs) | max sampled err |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for n in [int(x) for x in args.sizes.split(",")]:
            a = rng.uniform(-1, 1, (n, n)).astype(np.float32)
            b = rng.uniform(-1, 1, (n, n)).astype(np.float32)
            body = a.tobytes() + b.tobytes()
            cl = Client(port)
            cl.mul(body, n, args.kernel)  # warm-up
            runs = [cl.mul(body, n, args.kernel) for _ in range(args.reps)]
            runs.sort(key=lambda r: r[0])
            wall, st, data = runs[len(runs) // 2]
            err = check(a, b, data, n)
            share = {k: 100 * st.get(k, 0) / wall for k in ("queue", "h2d", "kernel", "d2h")}
            rest = 100 - sum(share.values())
            print("| %d | %.2f | %.2f | %.1f%% | %.1f%% | %.1f%% | %.1f%% | %.1f%% | %.1e |" % (
                n, wall, 3 * n * n * 4 / (wall * 1e6), share["queue"], share["h2d"], share["kernel"], share["d2h"],
                rest, err))
            sys.stdout.flush()

        n = 2048
        a = rng.uniform(-1, 1, (n, n)).astype(np.float32)
        b = rng.uniform(-1, 1, (n, n)).astype(np.float32)
        body = a.tobytes() + b.tobytes()
        print("\n## Stream overlap through the daemon: %d products of 2048^2 float32, kernel=%s\n" % (args.jobs, args.kernel))
        print("| mode | wall ms | products/s | speed-up |")
        print("| --- | --- | --- | --- |")
        clients = [Client(port) for _ in range(args.jobs)]
        for cl in clients:
            cl.mul(body, n, args.kernel)
        t0 = time.perf_counter()
        for cl in clients:
            cl.mul(body, n, args.kernel)
        serial = (time.perf_counter() - t0) * 1000
        errs = []

        def go(cl):
            try:
                _, _, d = cl.mul(body, n, args.kernel)
                errs.append(check(a, b, d, n))
            except Exception as ex:  # noqa: BLE001
                errs.append(repr(ex))
        th = [threading.Thread(target=go, args=(cl,)) for cl in clients]
        t0 = time.perf_counter()
        for t in th:
            t.start()
        for t in th:
            t.join()
        conc = (time.perf_counter() - t0) * 1000
        print("| one at a time | %.1f | %.1f | 1.00x |" % (serial, args.jobs / serial * 1000))
        print("| %d clients at once | %.1f | %.1f | %.2fx |" % (args.jobs, conc, args.jobs / conc * 1000, serial / conc))
        bad = [e for e in errs if not isinstance(e, float) or e > 1e-5]
        print("\nanswers checked: %d, bad: %d %s" % (len(errs), len(bad), bad[:3]))
    finally:
        p.terminate()
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()


if __name__ == "__main__":
    main()
