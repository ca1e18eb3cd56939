#!/usr/bin/env python3
"""bench_python_client.py - the Python package (gemmd.Client) next to `gemm multiply`.

    /usr/bin/python3 bench/bench_python_client.py [--shapes 2048,4096,4096x64x4096]
        [--repeat R] [--backend cpu|cuda|auto] [--server URL] [--out FILE.md]

Starts bin/gemmd (--backend, default cpu) on a free loopback port unless --server is given,
writes A and B (float32, random) as raw .bin files for each shape (N for NxNxN, or MxKxN),
checks both clients' answers against NumPy once, then R times each, interleaved so that
drift hits all alike:

  gemm        bin/gemm multiply A.bin B.bin --shape MxKxN -d float32 -o - --out-format raw
              --timing >/dev/null   (one process per product: its wall time, and the
              "client request" and "server kernel" it prints)
  python      gemmd.Client.product(a, b) in this process, A and B in memory, one kept-alive
              connection, a new C each time (what `c = client.matmul(a, b)` costs)
  python out= the same with C read into one preallocated array

  gemm bench  bin/gemm bench --m M --k K --n N --repeat 1 --warmup 1: the C client in one
              process on a kept-alive connection; the latency of its timed (second) request

Throughput ratio = median time of gemm / median time of python (>= 0.90 is the target).
Because a CPU-backend product is dominated by its arithmetic at 4096, the report also
gives each client's time beside the kernel (wall - server kernel) and the ratio of those,
and transfer-heavy shapes (MxKxN with a small K or M) can be added to --shapes.
Prints a Markdown report; --out also writes it to a file. Uses the package from
client/python/src (no install needed); needs bin/gemm, bin/gemmd and NumPy.
"""

import argparse
import datetime
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "client", "python", "src"))
import gemmd  # noqa: E402

GEMM = os.path.join(REPO, "bin", "gemm")
GEMMD = os.path.join(REPO, "bin", "gemmd")


def parse_shape(s):
    parts = [int(x) for x in s.lower().split("x")]
    if len(parts) == 1:
        return parts * 3
    if len(parts) == 3 and all(p > 0 for p in parts):
        return parts
    raise argparse.ArgumentTypeError("shape must be N or MxKxN: %r" % s)


sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "e2e"))
from harness import free_port  # noqa: E402  (one way to pick a loopback port, the tests')


def check(c, a, b, who):
    ref = a[:8].astype(np.float64) @ b.astype(np.float64)
    err = np.abs(c[:8] - ref).max() / max(1.0, np.abs(ref).max())
    if not err < 1e-4:
        sys.exit("%s's answer differs from NumPy: relative error %g" % (who, err))


def gemm_once(server, d, m, k, n, out_path=None):
    cmd = [GEMM, "--server", server, "multiply", d + "/A.bin", d + "/B.bin", "--shape", "%dx%dx%d" % (m, k, n),
           "-d", "float32", "-o", "-", "--out-format", "raw", "--timing"]
    t0 = time.perf_counter()
    with open(out_path or os.devnull, "wb") as out:
        p = subprocess.run(cmd, stdout=out, stderr=subprocess.PIPE)
    wall = (time.perf_counter() - t0) * 1e3
    err = p.stderr.decode("utf-8", "replace")
    if p.returncode != 0:
        sys.exit("gemm multiply failed (%d): %s" % (p.returncode, err))

    def field(name):
        mm = re.search(r"^\s*%s\s+([\d.]+) ms" % re.escape(name), err, re.M)
        return float(mm.group(1)) if mm else float("nan")
    return wall, field("client request"), field("server kernel")


def gemm_bench(server, m, k, n, repeat):
    """`gemm bench` (one process, one kept-alive connection, one warm-up request): the
    timed requests' latency min, median, p99 and median server kernel, in ms."""
    cmd = [GEMM, "--server", server, "bench", "--m", str(m), "--k", str(k), "--n", str(n), "--dtype", "float32",
           "--repeat", str(repeat), "--warmup", "1"]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = p.stdout.decode("utf-8", "replace")
    lat = re.search(r"latency ms\s+min ([\d.]+)\s+median ([\d.]+)\s+p99 ([\d.]+)", out)
    kern = re.search(r"median kernel ([\d.]+)", out)
    if p.returncode != 0 or not lat or not kern:
        sys.exit("gemm bench failed (%d): %s" % (p.returncode, out))
    return float(lat.group(1)), float(lat.group(2)), float(lat.group(3)), float(kern.group(1))


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def stats(v):
    return min(v), statistics.median(v), max(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="2048,4096", help="comma list of N or MxKxN (default 2048,4096)")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda", "auto"])
    ap.add_argument("--server", default="")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    shapes = [parse_shape(s) for s in args.shapes.split(",") if s]
    for f in (GEMM, GEMMD):
        if not os.access(f, os.X_OK):
            sys.exit("bench_python_client.py: %s missing (make)" % f)

    load_before = loadavg()
    tmp = tempfile.TemporaryDirectory(prefix="gemm-pybench-")
    proc = None
    server = args.server
    try:
        if not server:
            port = free_port()
            log = open(os.path.join(tmp.name, "gemmd.log"), "wb")
            proc = subprocess.Popen([GEMMD, "--backend", args.backend, "--port", str(port), "--log-level", "warn"],
                                    stdout=log, stderr=subprocess.STDOUT)
            server = "http://127.0.0.1:%d" % port
        client = gemmd.Client(server, timeout=600)
        deadline = time.monotonic() + 60
        while True:
            try:
                client.health()
                break
            except gemmd.GemmConnectionError:
                if time.monotonic() > deadline or (proc and proc.poll() is not None):
                    raise
                time.sleep(0.1)
        info = client.info()
        sections = []
        for (m, k, n) in shapes:
            d = tmp.name
            rng = np.random.default_rng(1)
            a = rng.standard_normal((m, k), dtype=np.float32)
            b = rng.standard_normal((k, n), dtype=np.float32)
            a.tofile(d + "/A.bin")
            b.tofile(d + "/B.bin")
            # correctness first, and a warm-up of each
            gemm_once(server, d, m, k, n, d + "/C.bin")
            check(np.fromfile(d + "/C.bin", dtype=np.float32).reshape(m, n), a, b, "gemm multiply")
            os.unlink(d + "/C.bin")
            p = client.product(a, b)
            check(p.c, a, b, "gemmd.Client")
            kernel_name, device = p.kernel, p.device
            out = np.empty((m, n), dtype=np.float32)
            client.matmul(a, b, out=out)
            del p

            g_wall, g_req, g_kern, py, py_kern, po, po_kern, b_req, b_kern = [], [], [], [], [], [], [], [], []
            for _ in range(args.repeat):
                w, r, kk = gemm_once(server, d, m, k, n)
                g_wall.append(w)
                g_req.append(r)
                g_kern.append(kk)
                t0 = time.perf_counter()
                p = client.product(a, b)
                py.append((time.perf_counter() - t0) * 1e3)
                py_kern.append(p.timing.kernel_ms)
                del p
                t0 = time.perf_counter()
                p = client.product(a, b, out=out)
                po.append((time.perf_counter() - t0) * 1e3)
                po_kern.append(p.timing.kernel_ms)
                del p
                lat = gemm_bench(server, m, k, n, 1)
                b_req.append(lat[1])
                b_kern.append(lat[3])
            sections.append(((m, k, n), kernel_name, device, g_wall, g_req, g_kern, py, py_kern, po, po_kern,
                             b_req, b_kern))
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        tmp.cleanup()

    med = statistics.median
    lines = []
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            mm = re.search(r"model name\s*:\s*(.*)", f.read())
            cpu = mm.group(1).strip() if mm else platform.processor()
    except OSError:
        cpu = platform.processor()
    devs = ", ".join(dv.get("name", "?") for dv in info.get("devices", [])) or "none"
    lines.append("# gemmd.Client (Python) vs `gemm multiply`, float32, %s backend" % info.get("backend"))
    lines.append("")
    lines.append("Host: %d cores (%s), Python %s, NumPy %s. Server: gemmd %s, backend %s, devices: %s; "
                 "client and server on the same host over loopback%s." %
                 (os.cpu_count() or 0, cpu, platform.python_version(),
                  np.__version__, info.get("version"), info.get("backend"), devs,
                  ", sharing its cores" if info.get("backend") == "cpu" else ""))
    lines.append("Date: %s UTC. Load average (1, 5, 15 min) before: %s, after: %s%s." %
                 (datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"), load_before, loadavg(),
                  " (other work shared the machine: compare medians, and distrust a lone run)"
                  if info.get("backend") == "cpu" else ""))
    lines.append("")
    lines.append("Command: `/usr/bin/python3 bench/bench_python_client.py --shapes %s --repeat %d --backend %s` "
                 "(interleaved runs, %d of each; medians compared)" %
                 (args.shapes, args.repeat, args.backend, args.repeat))
    lines.append("")
    lines.append("- gemm: `bin/gemm multiply A.bin B.bin --shape MxKxN -d float32 -o - --out-format raw --timing "
                 "> /dev/null`, one process per product (wall time measured around it; `client request` is "
                 "what it prints for its one HTTP request)")
    lines.append("- python: `client.product(a, b)` (= `client.matmul`) in one process, A and B in memory, one "
                 "kept-alive connection, a new C each time; python out=: C read into one preallocated array")
    lines.append("- gemm bench: `bin/gemm bench --m M --k K --n N --repeat 1 --warmup 1` each round: the C library "
                 "in one process on a kept-alive connection, the latency of its timed request")
    lines.append("")
    summary = []
    for ((m, k, n), kern, dev, g_wall, g_req, g_kern, py, py_kern, po, po_kern, b_req, b_kern) in sections:
        up = (m * k + k * n) * 4 / 1e6
        down = m * n * 4 / 1e6
        lines.append("## %dx%dx%d (A+B up %.1f MB, C down %.1f MB), kernel %s on %s" % (m, k, n, up, down, kern, dev))
        lines.append("")
        lines.append("| one product, ms | min | median | max | median server kernel | median wall - kernel |")
        lines.append("| --- | ---: | ---: | ---: | ---: | ---: |")

        def row(name, v, kv):
            lo, md, hi = stats(v)
            rest = med([x - y for x, y in zip(v, kv)])
            lines.append("| %s | %.1f | %.1f | %.1f | %.1f | %.1f |" % (name, lo, md, hi, med(kv), rest))
            return md, rest
        g_md, g_rest = row("gemm multiply, process wall", g_wall, g_kern)
        gr_md, gr_rest = row("gemm multiply, its HTTP request", g_req, g_kern)
        p_md, p_rest = row("python `matmul`", py, py_kern)
        o_md, o_rest = row("python `matmul(out=)`", po, po_kern)
        b_md, b_rest = row("gemm bench, its timed request", b_req, b_kern)
        lines.append("")
        lines.append("Throughput of python relative to gemm multiply (median gemm / median python): "
                     "**%.3f** (process), %.3f (gemm's request alone); with out=: %.3f / %.3f. "
                     "Time beside the kernel (wall - server kernel), python / gemm process: %.3f, "
                     "python / gemm request: %.3f." %
                     (g_md / p_md, gr_md / p_md, g_md / o_md, gr_md / o_md, p_rest / g_rest, p_rest / gr_rest))
        lines.append("")
        lines.append("In-process on a kept-alive connection on both sides, python `matmul` relative to `gemm bench`'s "
                     "request: throughput %.3f; time beside the kernel %.1f ms vs %.1f ms (ratio %.3f)." %
                     (b_md / p_md, p_rest, b_rest, p_rest / b_rest))
        lines.append("")
        summary.append("| %dx%dx%d | %.1f | %.1f | %.1f | %.1f | %.3f | %.3f | %.3f |" %
                       (m, k, n, g_md, gr_md, b_md, p_md, g_md / p_md, gr_md / p_md, b_md / p_md))
    lines.append("## Summary")
    lines.append("")
    lines.append("| shape | gemm multiply process ms | its request ms | gemm bench request ms | python ms | "
                 "python throughput / gemm process | / its request | / gemm bench |")
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    lines.extend(summary)
    lines.append("")
    lines.append("Target: the Python client reaches >= 0.90 of `gemm multiply`'s throughput.")
    report = "\n".join(lines)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report + "\n")
        print("written to %s" % args.out, file=sys.stderr)


if __name__ == "__main__":
    main()
