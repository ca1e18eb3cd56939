#!/usr/bin/python3
"""bench_v2.py - the Open Inference Protocol (KServe v2) door against POST /v1/matmul, and
tritonclient's async APIs driving many infers at once.

    bench/bench_v2.py [--gemmd bin/gemmd] [--backend auto] [--url URL --token T]
                      [--sizes 1024,2048,4096] [--reps 7] [--skew] [--no-triton]
                      [--async-size 256] [--concurrency 64] [--requests 2000]
                      [--wheels DIR] [--out FILE]

Starts its own daemon (--gemmd, --backend; http_threads 8, per_ip_limit and queue_depth
raised for 64 clients) on a free loopback port unless --url names one.

(a) v2 binary infer against /v1/matmul raw, float32, n x n x n for each of --sizes (with
    --skew also the transfer-bound n x n x 1, where the request is the payload, and
    n x 1 x n, where the answer is, for the largest n). Both requests come from the same
    client (http.client, one kept-alive connection each, bodies built before the clock
    starts, the whole answer read): v1 as A then B with the shapes in the query, v2 as its
    JSON header, A and B as binary tensor data and C asked for as binary. They alternate
    (v1, v2, v2, v1, ...) so that drift hits both alike. Printed: median and best wall ms of
    each, v2 / v1 (of the medians, and the median of the pairs), the daemon's own total
    (Server-Timing), and tritonclient's infer() (binary in and out: the real client with its
    copies) of the same product. The first answers are checked: v2's C byte for byte v1's,
    v1's against a float64 sample.
(b) tritonclient.http.aio (asyncio) with --concurrency infers in flight, --requests in all,
    of --async-size² float32: infers/s and latency percentiles; and the gevent client's
    async_infer() from --concurrency greenlets: infers/s (its latency holds the 10 ms
    tritonclient sleeps after queueing each request, so none is printed).

tritonclient[http] comes from build/venv (made by scripts/venv.sh from PyPI, or from
--wheels DIR on a host without it); --no-triton leaves it out: (a) without its column, no (b).
Prints Markdown (and writes it to --out).
"""
import argparse
import asyncio
import http.client
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(REPO, "build", "venv")
sys.path.insert(0, os.path.join(REPO, "tests", "e2e"))
import harness  # noqa: E402  (the tests' daemon on a free loopback port)
from hostile import percentile as pct  # noqa: E402


def ensure_tritonclient(wheels):
    try:
        import tritonclient.http.aio  # noqa: F401
        return
    except ImportError:
        pass
    if os.environ.get("GEMMD_BENCH_IN_VENV") == "1":
        sys.exit("bench_v2: tritonclient[http] is not importable in %s" % VENV)
    cmd = [os.path.join(REPO, "scripts", "venv.sh"), VENV]
    cmd += ["--no-index", "--find-links", os.path.abspath(wheels)] if wheels else []
    if subprocess.run(cmd + ["tritonclient[http]"]).returncode != 0:
        sys.exit("bench_v2: could not install tritonclient[http] into %s (without PyPI: --wheels DIR)" % VENV)
    py = os.path.join(VENV, "bin", "python")
    sys.stdout.flush()
    os.execve(py, [py] + sys.argv, dict(os.environ, GEMMD_BENCH_IN_VENV="1"))


def server_total(h):
    for part in (h or "").split(","):
        f = [x.strip() for x in part.split(";")]
        if f[0] == "total":
            return float(next((x[4:] for x in f[1:] if x.startswith("dur=")), "nan"))
    return float("nan")


class Door:
    """One kept-alive http.client connection; send() returns (wall ms, body, response)."""

    def __init__(self, host, port, auth):
        self.c = http.client.HTTPConnection(host, port, timeout=600)
        self.auth = auth

    def send(self, path, body, headers):
        t0 = time.perf_counter()
        self.c.request("POST", path, body=body, headers=dict(headers, **self.auth))
        r = self.c.getresponse()
        data = r.read()
        wall = (time.perf_counter() - t0) * 1000
        if r.status != 200:
            raise RuntimeError("%s: HTTP %d %r" % (path, r.status, data[:300]))
        return wall, data, r


def requests_for(a, b):
    m, k = a.shape
    n = b.shape[1]
    head = json.dumps({"inputs": [
        {"name": "A", "shape": [m, k], "datatype": "FP32", "parameters": {"binary_data_size": a.nbytes}},
        {"name": "B", "shape": [k, n], "datatype": "FP32", "parameters": {"binary_data_size": b.nbytes}}],
        "outputs": [{"name": "C", "parameters": {"binary_data": True}}]}).encode()
    v1 = ("/v1/matmul?m=%d&k=%d&n=%d&dtype=float32" % (m, k, n), a.tobytes() + b.tobytes(),
          {"Content-Type": "application/octet-stream", "Accept": "application/octet-stream"})
    v2 = ("/v2/models/matmul/infer", head + a.tobytes() + b.tobytes(),
          {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"})
    return v1, v2


def check(c, a, b, rng):
    """16 sampled elements of C against float64."""
    for _ in range(16):
        i, j = rng.integers(c.shape[0]), rng.integers(c.shape[1])
        want = float(a[i].astype(np.float64) @ b[:, j].astype(np.float64))
        if abs(float(c[i, j]) - want) > 1e-4 * a.shape[1] + 1e-5:
            raise RuntimeError("C[%d,%d] = %r, want %r" % (i, j, c[i, j], want))


def part_a(args, host, port, rng, out):
    tc = None
    if args.triton:
        import tritonclient.http as th
        tc = th.InferenceServerClient("%s:%d" % (host, port), network_timeout=600.0, connection_timeout=600.0)
    shapes = [(n, n, n) for n in args.sizes]
    if args.skew:
        shapes += [(max(args.sizes), max(args.sizes), 1), (max(args.sizes), 1, max(args.sizes))]
    doors = {"v1": Door(host, port, args.auth), "v2": Door(host, port, args.auth)}
    out.append("## (a) v2 binary infer vs /v1/matmul raw, float32\n")
    out.append("%d repetitions of each, interleaved, after one warm-up: wall ms of one request, median and best; "
               "paired: the median over repetitions of v2 / v1 sent back to back; server: Server-Timing total; "
               "tritonclient: its own infer() (binary in and out).\n" % args.reps)
    out.append("| m x k x n | payload MB | v1 raw ms | v2 binary ms | v2 / v1 | v2 / v1 paired | v1 best ms "
               "| v2 best ms | v1 server ms | v2 server ms | tritonclient ms | tritonclient / v1 |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for m, k, n in shapes:
        a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
        b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
        reqs = dict(zip(("v1", "v2"), requests_for(a, b)))
        walls, srv = {"v1": [], "v2": [], "tc": []}, {"v1": [], "v2": []}
        if tc:
            ins = [th.InferInput("A", [m, k], "FP32"), th.InferInput("B", [k, n], "FP32")]
            ins[0].set_data_from_numpy(a)
            ins[1].set_data_from_numpy(b)
            outs = [th.InferRequestedOutput("C", binary_data=True)]
        first = {}
        for rep in range(args.reps + 1):
            for w in ("v1", "v2", "tc") if rep % 2 else ("tc", "v2", "v1"):
                if w == "tc":
                    if tc:
                        t0 = time.perf_counter()
                        c = tc.infer("matmul", ins, outputs=outs, headers=dict(args.auth)).as_numpy("C")
                        walls["tc"].append((time.perf_counter() - t0) * 1000)
                        check(c, a, b, rng)
                    continue
                wall, data, r = doors[w].send(*reqs[w])
                c = data[int(r.getheader("Inference-Header-Content-Length") or 0) if w == "v2" else 0:]
                if rep == 0:
                    first[w] = c
                    continue
                walls[w].append(wall)
                srv[w].append(server_total(r.getheader("Server-Timing")))
        if first["v1"] != first["v2"]:
            raise RuntimeError("%dx%dx%d: v2's C differs from v1's" % (m, k, n))
        check(np.frombuffer(first["v1"], np.float32).reshape(m, n), a, b, rng)
        med = statistics.median
        v1m, v2m = med(walls["v1"]), med(walls["v2"])
        tcm = med(walls["tc"][1:]) if len(walls["tc"]) > 1 else float("nan")
        out.append("| %dx%dx%d | %.1f | %.1f | %.1f | %.3f | %.3f | %.1f | %.1f | %.1f | %.1f | %s | %s |" % (
            m, k, n, (a.nbytes + b.nbytes + m * n * 4) / 1e6, v1m, v2m, v2m / v1m,
            med([y / x for x, y in zip(walls["v1"], walls["v2"])]), min(walls["v1"]), min(walls["v2"]),
            med(srv["v1"]), med(srv["v2"]), "%.1f" % tcm if tc else "-", "%.3f" % (tcm / v1m) if tc else "-"))
        print(out[-1], flush=True)
    if tc:
        tc.close()
    out.append("")


def part_b(args, host, port, rng, out):
    import gevent
    import tritonclient.http as th
    import tritonclient.http.aio as aio

    s = args.async_size
    a = rng.uniform(-1, 1, (s, s)).astype(np.float32)
    b = rng.uniform(-1, 1, (s, s)).astype(np.float32)
    ins = [th.InferInput("A", [s, s], "FP32"), th.InferInput("B", [s, s], "FP32")]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(b)
    outs = [th.InferRequestedOutput("C", binary_data=True)]

    async def run_aio():
        client = aio.InferenceServerClient("%s:%d" % (host, port), conn_limit=args.concurrency + 8, conn_timeout=600.0)
        lat, errors, sem = [], [0], asyncio.Semaphore(args.concurrency)

        async def one(i):
            async with sem:
                t0 = time.perf_counter()
                try:
                    r = await client.infer("matmul", ins, outputs=outs, headers=dict(args.auth))
                    c = r.as_numpy("C")
                    lat.append((time.perf_counter() - t0) * 1000)
                    if i % 97 == 0:
                        check(c, a, b, rng)
                except Exception as e:  # noqa: BLE001 - counted and reported
                    errors[0] += 1
                    if errors[0] == 1:
                        print("first error: %r" % e, file=sys.stderr)

        await asyncio.gather(*(one(i) for i in range(min(args.concurrency * 2, args.requests))))  # warm-up
        lat.clear()
        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(args.requests)))
        wall = time.perf_counter() - t0
        await client.close()
        return wall, lat, errors[0]

    wall, lat, errors = asyncio.run(run_aio())
    out.append("## (b) tritonclient async APIs, %d in flight, %dx%d float32 (binary in and out)\n"
               % (args.concurrency, s, s))
    out.append("| client | requests | errors | infers/s | p50 ms | p90 ms | p99 ms | max ms |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    out.append("| tritonclient.http.aio (asyncio) | %d | %d | %.0f | %.2f | %.2f | %.2f | %.2f |" % (
        args.requests, errors, len(lat) / wall, pct(lat, 50), pct(lat, 90), pct(lat, 99), max(lat, default=0)))
    print(out[-1], flush=True)
    # async_infer() sleeps 10 ms after queueing each request (tritonclient's own gevent.sleep(0.01)), so one
    # submitting loop caps at ~100/s: --concurrency greenlets submit, each waiting for its result first.
    c = th.InferenceServerClient("%s:%d" % (host, port), concurrency=args.concurrency, network_timeout=600.0)
    count = [0, 0]  # done, errors

    def worker(k):
        for _ in range(k):
            try:
                c.async_infer("matmul", ins, outputs=outs, headers=dict(args.auth)).get_result()
                count[0] += 1
            except Exception:  # noqa: BLE001 - counted and reported
                count[1] += 1

    gevent.joinall([gevent.spawn(worker, 2) for _ in range(args.concurrency)])  # warm-up: connections open
    count[:] = [0, 0]
    per = [args.requests // args.concurrency + (i < args.requests % args.concurrency) for i in range(args.concurrency)]
    t0 = time.perf_counter()
    gevent.joinall([gevent.spawn(worker, k) for k in per])
    wall = time.perf_counter() - t0
    c.close()
    out.append("| tritonclient.http async_infer (gevent, %d greenlets) | %d | %d | %.0f | | | | |" % (
        args.concurrency, args.requests, count[1], count[0] / wall))
    print(out[-1], flush=True)
    out.append("")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gemmd", default=os.path.join(REPO, "bin", "gemmd"))
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--url", help="an already running daemon, e.g. http://127.0.0.1:8080")
    ap.add_argument("--token", default=os.environ.get("GEMM_TOKEN", ""))
    ap.add_argument("--sizes", default="1024,2048,4096")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--skew", action="store_true", help="also n x n x 1 and n x 1 x n for the largest n")
    ap.add_argument("--no-triton", dest="triton", action="store_false", help="no tritonclient: (a) only")
    ap.add_argument("--async-size", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--wheels", help="install tritonclient from this directory of wheels (no PyPI)")
    ap.add_argument("--out")
    args = ap.parse_args()
    args.sizes = [int(x) for x in args.sizes.split(",") if x]
    args.auth = {"Authorization": "Bearer " + args.token} if args.token else {}
    if args.triton:
        ensure_tritonclient(args.wheels)
    proc = None
    if args.url:
        host, port = args.url.split("://", 1)[-1].rstrip("/").rsplit(":", 1)
        port = int(port)
    else:
        harness.GEMMD_BIN = args.gemmd
        proc = harness.Daemon(harness.Tap(), check_exit=False, config={
            "backend": args.backend, "log_level": "warn", "http_threads": 8, "per_ip_limit": 512,
            "connection_limit": 1024, "queue_depth": 1024, "max_body_mb": 1024})
        host, port = "127.0.0.1", proc.port
    try:
        c = http.client.HTTPConnection(host, port, timeout=30)
        c.request("GET", "/v1/info", headers=args.auth)
        info = json.loads(c.getresponse().read() or b"{}")
        if args.triton:
            from importlib import metadata
        out = ["# v2 (Open Inference Protocol) vs /v1/matmul%s\n" % (", and tritonclient's async APIs"
                                                                     if args.triton else ""),
               "- Date: %s" % time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "- Host: %s, %d CPUs, %s; Python %s, NumPy %s%s" % (
                   platform.node(), os.cpu_count(), platform.platform(), platform.python_version(), np.__version__,
                   ", tritonclient " + metadata.version("tritonclient") if args.triton else ""),
               "- Daemon: gemmd %s, backend %s, devices: %s" % (info.get("version"), info.get("backend"), ", ".join(
                   x.get("name", "") for x in info.get("devices", []))),
               "- Load average at the start: %.2f (1 min)" % os.getloadavg()[0],
               "- Command: `%s`\n" % " ".join(["bench/bench_v2.py"] + sys.argv[1:])]
        print("\n".join(out), flush=True)
        rng = np.random.default_rng(2026)
        part_a(args, host, port, rng, out)
        if args.triton:
            part_b(args, host, port, rng, out)
    finally:
        if proc:
            proc.stop(30)
    out.append("Load average at the end: %.2f (1 min)" % os.getloadavg()[0])
    text = "\n".join(out) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print("\n" + text)


if __name__ == "__main__":
    main()
