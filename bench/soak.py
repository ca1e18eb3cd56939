#!/usr/bin/python3
"""soak.py - a long mixed load against one daemon: does anything leak?

    /usr/bin/python3 bench/soak.py                                  # 1,000,000 products, CPU
    /usr/bin/python3 bench/soak.py -n 200000 --backend cuda --out bench/results/soak-gpu.md

64 clients (4 processes x 16 threads, each on its own keep-alive connection) send small
products in every format (JSON, raw, .npy multipart) and dtype (float32, float64, int32),
synchronous (POST /v1/matmul) and asynchronous (POST /v1/jobs, GET .../result until done,
DELETE). Every answer is checked against a NumPy reference computed in float64 (int32:
int64, wrapped) before the run. Every 10,000 products the daemon's RSS and open fds are
sampled. At the end: wrong answers (must be 0), errors by status, and whether RSS and
the fd count stayed within +-10% of their value at the 100,000th product (or at 10% of
the run when it is shorter).
"""
import argparse
import collections
import datetime
import json
import multiprocessing as mp
import os
import platform
import random
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "e2e"))
import hostile  # noqa: E402
from harness import Daemon, Tap  # noqa: E402

PROCS = 4


def make_cases(seed, count, max_dim):
    """Pre-built requests with their checks (hostile.product_case): the run only sends and checks."""
    rng = np.random.default_rng(seed)
    return [hostile.product_case(rng, i, max_dim) for i in range(count)]


def client_thread(port, src, cases, counter, lock, stats, target, async_every, rng):
    sock = None

    def call(method, path, body=b"", ctype=None, accept=None):
        nonlocal sock
        for attempt in range(2):
            reused = sock is not None
            st, h, b, sock = hostile.request(port, src, method, path, body, ctype, accept, timeout=60, sock=sock)
            if st != 0 or not reused or attempt:  # else a kept-alive connection closed while idle: again, fresh
                return st, h, b

    while True:
        with lock:
            if counter.value >= target:
                break
            counter.value += 1
            i = counter.value
        path, body, ctype, accept, check = cases[rng.randrange(len(cases))]
        if async_every and i % async_every == 0:
            st, h, b = call("POST", path.replace("/v1/matmul", "/v1/jobs"), body, ctype, accept)
            if st != 202:
                stats["err_%d" % st] += 1
                continue
            jid = json.loads(b)["id"]
            for _ in range(2000):
                st, h, b = call("GET", "/v1/jobs/%s/result" % jid, accept=accept)
                if st != 409:
                    break
                time.sleep(0.002)
            call("DELETE", "/v1/jobs/" + jid)
            stats["async"] += 1
        else:
            st, h, b = call("POST", path, body, ctype, accept)
        if st == 200:
            if check(b):
                stats["ok"] += 1
            else:
                stats["wrong"] += 1
        else:
            stats["err_%d" % st] += 1
            if st == 503:
                time.sleep(0.05)
    if sock:
        sock.close()


def client_proc(idx, port, threads, counter, lock, target, async_every, max_dim, out_q):
    cases = make_cases(1000 + idx, 600, max_dim)
    stats = [collections.Counter() for _ in range(threads)]
    ts = [threading.Thread(target=client_thread,
                           args=(port, "127.0.0.%d" % (60 + idx), cases, counter, lock, stats[t], target,
                                 async_every, random.Random(idx * 100 + t)), daemon=True)
          for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out_q.put(sum(stats, collections.Counter()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=1000000, help="products to run (default 1,000,000)")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--max-seconds", type=float, default=0,
                    help="stop the clients after this long even if fewer products ran (0: no limit); "
                         "the report says how many ran")
    ap.add_argument("--procs", type=int, default=PROCS,
                    help="client processes the clients are spread over (default %d)" % PROCS)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--async-every", type=int, default=5, help="every Nth product is an async job (0: none)")
    ap.add_argument("--max-dim", type=int, default=16)
    ap.add_argument("--every", type=int, default=10000, help="sample RSS and fds every N products")
    ap.add_argument("--bin", help="daemon binary (default bin/gemmd)")
    ap.add_argument("--out", help="Markdown file to write the results to")
    args = ap.parse_args()
    if args.bin:
        import harness
        harness.GEMMD_BIN = os.path.abspath(args.bin)
    tap = Tap()
    cfg = {"backend": args.backend, "log_level": "warn", "queue_depth": 512, "max_jobs": 4096,
           "http_threads": 4, "connection_limit": 512, "per_ip_limit": 128}
    threads = max(1, args.clients // args.procs)
    cmd = "/usr/bin/python3 bench/soak.py " + " ".join(sys.argv[1:])
    with Daemon(tap, config=cfg, check_exit=False) as d:
        pid = d.proc.pid
        ctx = mp.get_context("fork")
        counter = ctx.Value("q", 0, lock=False)
        lock = ctx.Lock()
        out_q = ctx.Queue()
        procs = [ctx.Process(target=client_proc, args=(i, d.port, threads, counter, lock, args.n, args.async_every,
                                                       args.max_dim, out_q)) for i in range(args.procs)]
        t0 = time.monotonic()
        for p in procs:
            p.start()
        samples = []
        next_at = 0
        ran = args.n  # products started; fewer when --max-seconds stops the run
        stopped = False
        while any(p.is_alive() for p in procs):
            if args.max_seconds and not stopped and time.monotonic() - t0 > args.max_seconds:
                with lock:  # no client starts another product from here on
                    ran = counter.value
                    counter.value = max(counter.value, args.n)
                stopped = True
            if not stopped and counter.value >= next_at and next_at < args.n:
                st = hostile.proc_status(pid)
                samples.append((next_at, time.monotonic() - t0, st.get("VmRSS", 0) / 1024.0,
                                hostile.fd_count(pid)))
                print("%9d products  %7.1f s  RSS %7.1f MB  fds %4d" % samples[-1], flush=True)
                next_at += args.every
                continue
            time.sleep(0.02)
        time.sleep(1.0)  # the clients are gone: the daemon at rest
        st = hostile.proc_status(pid)
        idle = (ran, time.monotonic() - t0, st.get("VmRSS", 0) / 1024.0, hostile.fd_count(pid))
        totals = sum((out_q.get(timeout=120) for _ in procs), collections.Counter())
        for p in procs:
            p.join(timeout=60)
        elapsed = time.monotonic() - t0
        alive = d.alive()
        r = d.curl("GET", "/metrics", max_time=10)
        metrics = r.body.decode("utf-8", "replace") if r.status == 200 else ""
        hwm = hostile.proc_status(pid).get("VmHWM", 0) / 1024.0
        rc = d.stop()

    ref_at = 100000 if ran >= 200000 else ran // 10
    ref = [s for s in samples if s[0] >= ref_at]
    base = ref[0] if ref else samples[0]
    rss_dev = max(abs(s[2] - base[2]) / base[2] for s in ref) if ref and base[2] else float("nan")
    fd_dev = max(abs(s[3] - base[3]) / base[3] for s in ref) if ref and base[3] else float("nan")
    wrong = totals.get("wrong", 0)
    errors = {k: v for k, v in totals.items() if k.startswith("err_")}
    flat = rss_dev <= 0.10 and fd_dev <= 0.10
    lines = []
    lines.append("# Soak on the %s backend\n" % args.backend.upper())
    lines.append("Host: %s, %d cores, %s; %s.  "
                 % (platform.node() or "dev", os.cpu_count() or 0, platform.platform(),
                    datetime.date.today().isoformat()))
    lines.append("Command: `%s`  " % cmd)
    lines.append("Daemon: `%s` (built-in defaults otherwise: memory budget, deadlines).\n"
                 % ", ".join("%s=%s" % kv for kv in sorted(cfg.items())))
    lines.append("%d products by %d clients (%d processes x %d threads, keep-alive) in %.0f s (%.0f products/s): "
                 "JSON, raw and .npy; float32, float64 and int32; m, k, n in 1..%d; every %s an async job (submit, "
                 "fetch the result, delete). Answers checked against NumPy (float64; int32 in int64, wrapped).\n"
                 % (ran, threads * args.procs, args.procs, threads, elapsed, ran / elapsed, args.max_dim,
                    ("%dth" % args.async_every) if args.async_every else "-"))
    if stopped:
        lines.append("**Stopped by --max-seconds %g after %d of the %d products asked for.**\n"
                     % (args.max_seconds, ran, args.n))
    lines.append("| result | count |\n|---|---|")
    lines.append("| right answers | %d |" % totals.get("ok", 0))
    lines.append("| **wrong answers** | **%d** |" % wrong)
    lines.append("| of them async jobs | %d |" % totals.get("async", 0))
    for k, v in sorted(errors.items()):
        lines.append("| HTTP %s (not an answer) | %d |" % (k[4:] or "none", v))
    lines.append("")
    lines.append("Daemon alive at the end: %s; exit status on SIGTERM: %s; peak RSS (VmHWM) %.1f MB.\n"
                 % ("yes" if alive else "**no**", rc, hwm))
    lines.append("From the %d-th product on: RSS within %+.1f%% and open fds within %+.1f%% of their value there "
                 "(limit +-10%%): **%s**.\n" % (ref_at, 100 * rss_dev, 100 * fd_dev, "flat" if flat else "NOT flat"))
    lines.append("Sampled while the clients ran (each row: after that many products), and once more a second "
                 "after they all finished and closed their connections (the daemon at rest).\n")
    lines.append("| products | seconds | RSS MB | open fds |\n|---|---|---|---|")
    for s in samples:
        lines.append("| %d | %.0f | %.1f | %d |" % s)
    lines.append("| %d, at rest | %.0f | %.1f | %d |" % idle)
    keep = [ln for ln in metrics.splitlines() if ln.startswith(("gemmd_memory", "gemmd_connections",
                                                                "gemmd_engine_jobs_total"))]
    if keep:
        lines.append("\n/metrics at the end:\n\n```\n" + "\n".join(keep) + "\n```")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    sys.exit(0 if wrong == 0 and flat and alive else 1)


if __name__ == "__main__":
    main()
