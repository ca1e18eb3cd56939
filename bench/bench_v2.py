#!/usr/bin/python3
"""bench_v2.py - the Open Inference Protocol (KServe v2) door against POST /v1/matmul, and
tritonclient's async APIs driving many concurrent infers.

    bench/bench_v2.py [--gemmd bin/gemmd] [--backend auto] [--url URL --token T]
                      [--sizes 1024,2048,4096] [--reps 7] [--skew]
                      [--async-size 256] [--concurrency 64] [--requests 2000]
                      [--wheels DIR] [--out FILE]

Runs under build/venv (made by scripts/venv.sh with tritonclient[http]; on a host without
PyPI give --wheels DIR, a directory of downloaded wheels). Starts its own daemon (--gemmd,
--backend; http_threads 8, per_ip_limit and queue_depth raised for 64 clients) on a free
loopback port unless --url names one.

(a) v2 binary infer versus /v1/matmul raw, float32, n x n x n for each of --sizes, plus the
    transfer-bound shapes n x n x 1 (the request is the payload) and n x 1 x n (the answer
    is) for the largest n (with --skew). Both requests are sent by the same client
    (http.client, one kept-alive connection, bodies built before the clock starts, the whole
    answer read): v1 as A then B with the shapes in the query, v2 as the JSON header, A and
    B as binary tensor data and C asked for as binary. The two alternate (v1, v2, v2, v1,
    ...) so that drift hits both alike; reported: median wall ms of each, the ratio v2/v1,
    and the server's own total (Server-Timing). A third column times tritonclient's own
    infer() (binary in and out) for the same product, the real client with its copies.
    Every answer is checked (size, and a sample of elements against float64).
(b) tritonclient.http.aio (asyncio) with --concurrency infers in flight, --requests in all,
    of --async-size^2 float32 (binary in and out): infers/s and latency percentiles; and the
    gevent client's async_infer() from --concurrency greenlets: infers/s (its latency holds
    the 10 ms tritonclient sleeps after queueing each request, so none is reported).
Prints Markdown (and writes it to --out).
"""
import argparse
import asyncio
import http.client
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(REPO, "build", "venv")


def ensure_tritonclient(wheels):
    try:
        import tritonclient.http  # noqa: F401
        import tritonclient.http.aio  # noqa: F401
        return
    except ImportError:
        pass
    if os.environ.get("GEMMD_BENCH_IN_VENV") == "1":
        sys.exit("bench_v2: tritonclient[http] is not importable in %s" % VENV)
    args = [os.path.join(REPO, "scripts", "venv.sh"), VENV]
    if wheels:
        args += ["--no-index", "--find-links", os.path.abspath(wheels)]
    args.append("tritonclient[http]")
    if subprocess.run(args).returncode != 0:
        sys.exit("bench_v2: could not install tritonclient[http] into %s (without PyPI: --wheels DIR)" % VENV)
    py = os.path.join(VENV, "bin", "python")
    sys.stdout.flush()
    os.execve(py, [py] + sys.argv, dict(os.environ, GEMMD_BENCH_IN_VENV="1"))


sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "e2e"))
from harness import free_port  # noqa: E402  (one way to pick a loopback port, the tests')


def server_timing(h):
    out = {}
    for part in (h or "").split(","):
        f = [x.strip() for x in part.split(";")]
        for x in f[1:]:
            if x.startswith("dur="):
                out[f[0]] = float(x[4:])
    return out


class Daemon:
    def __init__(self, gemmd, backend):
        self.port = free_port()
        self.tmp = tempfile.TemporaryDirectory(prefix="gemmd-bench-v2-")
        conf = os.path.join(self.tmp.name, "gemmd.conf")
        with open(conf, "w") as f:
            f.write("backend = %s\nlog_level = warn\nhttp_threads = 8\nper_ip_limit = 512\n"
                    "connection_limit = 1024\nqueue_depth = 1024\nmax_body_mb = 1024\n" % backend)
        self.log = open(os.path.join(self.tmp.name, "log"), "wb")
        self.proc = subprocess.Popen([gemmd, "--config", conf, "--port", str(self.port)], stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                c.request("GET", "/v2/health/ready")
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        sys.exit("bench_v2: the daemon did not start")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


class Raw:
    """Both doors through one kept-alive http.client connection."""

    def __init__(self, host, port, token):
        self.c = http.client.HTTPConnection(host, port, timeout=600)
        self.auth = {"Authorization": "Bearer " + token} if token else {}

    def send(self, path, body, headers):
        t0 = time.perf_counter()
        self.c.request("POST", path, body=body, headers=dict(headers, **self.auth))
        r = self.c.getresponse()
        data = r.read()
        wall = (time.perf_counter() - t0) * 1000
        if r.status != 200:
            raise RuntimeError("%s: HTTP %d %r" % (path, r.status, data[:300]))
        return wall, data, r


def v1_request(a, b):
    m, k = a.shape
    n = b.shape[1]
    path = "/v1/matmul?m=%d&k=%d&n=%d&dtype=float32" % (m, k, n)
    return path, a.tobytes() + b.tobytes(), {"Content-Type": "application/octet-stream",
                                              "Accept": "application/octet-stream"}


def v2_request(a, b):
    head = json.dumps({"inputs": [
        {"name": "A", "shape": list(a.shape), "datatype": "FP32", "parameters": {"binary_data_size": a.nbytes}},
        {"name": "B", "shape": list(b.shape), "datatype": "FP32", "parameters": {"binary_data_size": b.nbytes}}],
        "outputs": [{"name": "C", "parameters": {"binary_data": True}}]}).encode()
    return "/v2/models/matmul/infer", head + a.tobytes() + b.tobytes(), {
        "Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"}


def check(c, a, b, rng):
    """A sample of C's elements against float64."""
    m, n = c.shape
    k = a.shape[1]
    for _ in range(16):
        i, j = rng.integers(m), rng.integers(n)
        want = float(a[i].astype(np.float64) @ b[:, j].astype(np.float64))
        if abs(float(c[i, j]) - want) > 1e-4 * k + 1e-5:
            raise RuntimeError("C[%d,%d] = %r, want %r" % (i, j, c[i, j], want))


def median(xs):
    s = sorted(xs)
    return s[len(s) // 2] if len(s) % 2 else 0.5 * (s[len(s) // 2 - 1] + s[len(s) // 2])


def pct(xs, p):
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100.0 * (len(s) - 1))))]


def part_a(args, host, port, rng, out):
    import tritonclient.http as th

    shapes = [(n, n, n) for n in args.sizes]
    if args.skew:
        big = max(args.sizes)
        shapes += [(big, big, 1), (big, 1, big)]
    raw = Raw(host, port, args.token)
    tc = th.InferenceServerClient("%s:%d" % (host, port), network_timeout=600.0, connection_timeout=600.0)
    hdr = {"Authorization": "Bearer " + args.token} if args.token else None
    out.append("## (a) v2 binary infer vs /v1/matmul raw, float32\n")
    out.append("%d interleaved repetitions each (after one warm-up of each): wall ms of one request on one "
               "kept-alive connection, the same client (http.client) for both doors, median and minimum; "
               "paired = the median over repetitions of v2 / v1 sent back to back; server = Server-Timing "
               "total (median); tritonclient = its own `infer()` (binary in and out) of the same product "
               "(median).\n" % args.reps)
    out.append("| m x k x n | payload MB | v1 raw ms | v2 binary ms | v2 / v1 | v2 / v1 paired | v1 min ms "
               "| v2 min ms | v1 server ms | v2 server ms | tritonclient ms | tritonclient / v1 |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for m, k, n in shapes:
        a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
        b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
        p1, body1, h1 = v1_request(a, b)
        p2, body2, h2 = v2_request(a, b)
        ia = th.InferInput("A", [m, k], "FP32")
        ia.set_data_from_numpy(a)
        ib = th.InferInput("B", [k, n], "FP32")
        ib.set_data_from_numpy(b)
        outs = [th.InferRequestedOutput("C", binary_data=True)]
        walls = {"v1": [], "v2": [], "tc": []}
        srv = {"v1": [], "v2": []}

        def one(which, record=True):
            if which == "tc":
                t0 = time.perf_counter()
                res = tc.infer("matmul", [ia, ib], outputs=outs, headers=dict(hdr) if hdr else None)
                c = res.as_numpy("C")
                wall = (time.perf_counter() - t0) * 1000
                if record:
                    walls["tc"].append(wall)
                    check(c, a, b, rng)
                return
            wall, data, r = raw.send(*((p1, body1, h1) if which == "v1" else (p2, body2, h2)))
            if which == "v1":
                c = np.frombuffer(data, np.float32).reshape(m, n)
            else:
                hl = int(r.getheader("Inference-Header-Content-Length"))
                c = np.frombuffer(data, np.float32, offset=hl).reshape(m, n)
            if record:
                walls[which].append(wall)
                srv[which].append(server_timing(r.getheader("Server-Timing")).get("total", 0.0))
                check(c, a, b, rng)

        for w in ("v1", "v2", "tc"):
            one(w, record=False)
        for rep in range(args.reps):
            order = ("v1", "v2", "tc") if rep % 2 == 0 else ("tc", "v2", "v1")
            for w in order:
                one(w)
        payload = (a.nbytes + b.nbytes + m * n * 4) / 1e6
        v1m, v2m, tcm = median(walls["v1"]), median(walls["v2"]), median(walls["tc"])
        paired = median([y / x for x, y in zip(walls["v1"], walls["v2"])])
        out.append("| %dx%dx%d | %.1f | %.1f | %.1f | %.3f | %.3f | %.1f | %.1f | %.1f | %.1f | %.1f | %.3f |" % (
            m, k, n, payload, v1m, v2m, v2m / v1m, paired, min(walls["v1"]), min(walls["v2"]), median(srv["v1"]),
            median(srv["v2"]), tcm, tcm / v1m))
        print(out[-1], flush=True)
    tc.close()
    out.append("")


def part_b(args, host, port, rng, out):
    import tritonclient.http as th
    import tritonclient.http.aio as aio

    s = args.async_size
    a = rng.uniform(-1, 1, (s, s)).astype(np.float32)
    b = rng.uniform(-1, 1, (s, s)).astype(np.float32)
    hdr = {"Authorization": "Bearer " + args.token} if args.token else None

    def inputs():
        ia = th.InferInput("A", [s, s], "FP32")
        ia.set_data_from_numpy(a)
        ib = th.InferInput("B", [s, s], "FP32")
        ib.set_data_from_numpy(b)
        return [ia, ib]

    ins = inputs()
    outs = [th.InferRequestedOutput("C", binary_data=True)]

    async def run_aio():
        client = aio.InferenceServerClient("%s:%d" % (host, port), conn_limit=args.concurrency + 8,
                                           conn_timeout=600.0)
        lat, errors = [], [0]
        sem = asyncio.Semaphore(args.concurrency)

        async def one(i):
            async with sem:
                t0 = time.perf_counter()
                try:
                    res = await client.infer("matmul", ins, outputs=outs, request_id=str(i),
                                             headers=dict(hdr) if hdr else None)
                    c = res.as_numpy("C")
                    if c.shape != (s, s):
                        raise RuntimeError("shape %r" % (c.shape,))
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
        args.requests, errors, len(lat) / wall, pct(lat, 50), pct(lat, 90), pct(lat, 99), max(lat) if lat else 0))
    print(out[-1], flush=True)

    # async_infer() sleeps 10 ms after queueing each request (tritonclient's own
    # gevent.sleep(0.01)), so one submitting loop caps at ~100/s: --concurrency greenlets
    # submit, each waiting for its own result before the next.
    import gevent

    c = th.InferenceServerClient("%s:%d" % (host, port), concurrency=args.concurrency, network_timeout=600.0)
    errors, done = [0], [0]

    def worker(count):
        for _ in range(count):
            try:
                c.async_infer("matmul", ins, outputs=outs, headers=dict(hdr) if hdr else None).get_result()
                done[0] += 1
            except Exception:  # noqa: BLE001 - counted and reported
                errors[0] += 1

    gevent.joinall([gevent.spawn(worker, 2) for _ in range(args.concurrency)])  # warm-up: connections open
    done[0] = errors[0] = 0
    per = [args.requests // args.concurrency + (i < args.requests % args.concurrency) for i in range(args.concurrency)]
    t0 = time.perf_counter()
    gevent.joinall([gevent.spawn(worker, n) for n in per])
    wall = time.perf_counter() - t0
    c.close()
    errors = errors[0]
    out.append("| tritonclient.http async_infer (gevent, %d greenlets) | %d | %d | %.0f | | | | |" % (
        args.concurrency, args.requests, errors, done[0] / wall))
    print(out[-1], flush=True)
    out.append("")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gemmd", default=os.path.join(REPO, "bin", "gemmd"))
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--url", help="an already running daemon, e.g. http://127.0.0.1:8080")
    ap.add_argument("--token", default=os.environ.get("GEMM_TOKEN", ""))
    ap.add_argument("--sizes", default="1024,2048,4096")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--skew", action="store_true", help="also n x n x 1 and n x 1 x n for the largest n")
    ap.add_argument("--async-size", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--skip-a", action="store_true")
    ap.add_argument("--skip-b", action="store_true")
    ap.add_argument("--wheels", help="install tritonclient from this directory of wheels (no PyPI)")
    ap.add_argument("--out")
    args = ap.parse_args()
    args.sizes = [int(x) for x in args.sizes.split(",") if x]
    ensure_tritonclient(args.wheels)
    from importlib import metadata

    d = None
    if args.url:
        hostport = args.url.split("://", 1)[-1].rstrip("/")
        host, port = hostport.rsplit(":", 1)
        port = int(port)
    else:
        d = Daemon(args.gemmd, args.backend)
        host, port = "127.0.0.1", d.port
    try:
        c = http.client.HTTPConnection(host, port, timeout=30)
        c.request("GET", "/v1/info", headers={"Authorization": "Bearer " + args.token} if args.token else {})
        info = json.loads(c.getresponse().read() or b"{}")
        devs = ", ".join(x.get("name", "") for x in info.get("devices", []))
        out = ["# v2 (Open Inference Protocol) vs /v1/matmul, and tritonclient's async APIs\n",
               "- Date: %s" % time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "- Host: %s, %d CPUs, %s; Python %s, tritonclient %s, NumPy %s" % (
                   platform.node(), os.cpu_count(), platform.platform(), platform.python_version(),
                   metadata.version("tritonclient"), np.__version__),
               "- Daemon: gemmd %s, backend %s, devices: %s" % (info.get("version"), info.get("backend"), devs),
               "- Load average at start: %.2f (1 min)" % os.getloadavg()[0],
               "- Command: `%s`\n" % " ".join([os.path.relpath(sys.argv[0], REPO)] + sys.argv[1:])]
        print("\n".join(out), flush=True)
        rng = np.random.default_rng(2026)
        if not args.skip_a:
            part_a(args, host, port, rng, out)
        if not args.skip_b:
            part_b(args, host, port, rng, out)
    finally:
        if d:
            d.stop()
    out.append("Load average at the end: %.2f (1 min)" % os.getloadavg()[0])
    text = "\n".join(out) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print("\n" + text)


if __name__ == "__main__":
    main()
