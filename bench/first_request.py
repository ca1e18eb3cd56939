#!/usr/bin/env python3
"""first_request.py - what the first requests after a start cost, with and without warm-up.

    python3 bench/first_request.py [--bin bin/gemmd] [--backend cuda] [--starts 3] [--out FILE.md]

For warmup = false and warmup = true in turn (each --starts times, alternating), starts the
daemon on a free loopback port and measures, with one kept-alive connection:

  start     seconds from exec to the first 200 from /healthz (warm-up happens in there)
  first     the first products, one of each kind, in this order: 64^3 float32, 64^3
            float64, 64^3 int32, 256^3 float32, then a 64^3 float32 again; their latency
            in ms as the client sees it (request written to answer read)
  steady    the median and max of the next 200 64^3 float32 products

Every answer is checked against NumPy (float64 reference; int32 wraps). Prints Markdown.
"""

import argparse
import datetime
import http.client
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

KINDS = [("float32", 64), ("float64", 64), ("int32", 64), ("float32", 256), ("float32", 64)]


sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "e2e"))
from harness import free_port  # noqa: E402  (one way to pick a loopback port, the tests')


def operands(dtype, n, rng):
    if dtype == "int32":
        a = rng.integers(-50, 50, (n, n), dtype=np.int32)
        b = rng.integers(-50, 50, (n, n), dtype=np.int32)
    else:
        a = rng.uniform(-1, 1, (n, n)).astype(dtype)
        b = rng.uniform(-1, 1, (n, n)).astype(dtype)
    return a, b


def product(conn, dtype, n, a, b):
    body = a.tobytes() + b.tobytes()
    t0 = time.perf_counter()
    conn.request("POST", "/v1/matmul?m=%d&k=%d&n=%d&dtype=%s" % (n, n, n, dtype), body,
                 {"Content-Type": "application/octet-stream"})
    r = conn.getresponse()
    data = r.read()
    ms = (time.perf_counter() - t0) * 1e3
    if r.status != 200:
        raise SystemExit("product %s %d: HTTP %d %s" % (dtype, n, r.status, data[:300]))
    c = np.frombuffer(data, dtype=dtype).reshape(n, n)
    if dtype == "int32":
        ref = (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)
        ok = np.array_equal(c, ref)
    else:
        ref = a.astype(np.float64) @ b.astype(np.float64)
        tol = 1e-2 if dtype == "float32" else 1e-9
        ok = np.allclose(c, ref, rtol=tol, atol=tol * n)
    if not ok:
        raise SystemExit("product %s %d: wrong answer" % (dtype, n))
    return ms


def one_start(binary, backend, warm, rng, logdir):
    port = free_port()
    log = open(os.path.join(logdir, "gemmd-%s-%d.log" % ("on" if warm else "off", port)), "w")
    t0 = time.perf_counter()
    p = subprocess.Popen([binary, "--backend", backend, "--port", str(port), "--log-level", "warn",
                          "--warmup", "true" if warm else "false"], stdout=log, stderr=log)
    try:
        up = None
        while time.perf_counter() - t0 < 60:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/healthz")
                if c.getresponse().status == 200:
                    up = time.perf_counter() - t0
                    c.close()
                    break
                c.close()
            except OSError:
                pass
            time.sleep(0.005)
        if up is None:
            raise SystemExit("gemmd did not start (warmup %s)" % warm)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        firsts = []
        for dtype, n in KINDS:
            a, b = operands(dtype, n, rng)
            firsts.append(product(conn, dtype, n, a, b))
        a, b = operands("float32", 64, rng)
        steady = [product(conn, "float32", 64, a, b) for _ in range(200)]
        conn.close()
        return up, firsts, steady
    finally:
        p.terminate()
        p.wait(timeout=30)
        log.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="bin/gemmd")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    rng = np.random.default_rng(7)
    rows = []
    with tempfile.TemporaryDirectory() as logdir:
        for i in range(args.starts):
            for warm in (False, True):
                up, firsts, steady = one_start(args.bin, args.backend, warm, rng, logdir)
                rows.append((warm, i + 1, up, firsts, statistics.median(steady), max(steady)))
    gpu = ""
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip().replace("\n", "; ")
    except (OSError, subprocess.SubprocessError):
        pass
    out = ["# First requests after a start: warm-up off and on", "",
           "- date: %s UTC" % datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
           "- host: %s, %d cores; %s" % (platform.node(), os.cpu_count(), gpu or "no GPU listed"),
           "- command: `python3 bench/first_request.py --bin %s --backend %s --starts %d`"
           % (args.bin, args.backend, args.starts),
           "- latency as the client sees it (one kept-alive connection, raw bodies); every answer "
           "checked against NumPy", "",
           "| warmup | start | to /healthz s | " + " | ".join("%s %d² ms" % k for k in KINDS)
           + " | next 200 (64² f32) median ms | max ms |",
           "| --- | --- | --- | " + " | ".join("---" for _ in KINDS) + " | --- | --- |"]
    for warm, i, up, firsts, med, mx in rows:
        out.append("| %s | %d | %.3f | %s | %.3f | %.3f |" % ("on" if warm else "off", i, up,
                   " | ".join("%.2f" % x for x in firsts), med, mx))
    text = "\n".join(out) + "\n"
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
