#!/usr/bin/python3
"""latency_stages.py - where the time of one small product goes, at one connection.

    /usr/bin/python3 bench/latency_stages.py --url http://127.0.0.1:8080 --size 64 --n 3000 [--kernel simt]

Sends N raw float32 products of SIZE x SIZE one after the other on one kept-alive
connection and prints, as a Markdown table, the median and p99 of the client's own
latency (request written to answer read) and of each stage the daemon reports in its
Server-Timing header (recv, decode, queue, h2d, kernel, d2h, encode, total), plus what is
outside the daemon's total (the client, the socket and the HTTP library's own work before
the first call of the request handler and after the answer is queued). The first 10% of
the requests are a warm-up and not counted.
"""
import argparse
import http.client
import statistics
import time
import urllib.parse

import numpy as np

STAGES = ("recv", "decode", "queue", "h2d", "kernel", "d2h", "encode", "total")


def parse_timing(h):
    out = {}
    for part in (h or "").split(","):
        bits = part.strip().split(";")
        for b in bits[1:]:
            if b.startswith("dur="):
                out[bits[0]] = float(b[4:])
    return out


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q / 100.0 * len(xs)))] if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--kernel", help="kernel to ask for (default: the daemon's auto)")
    args = ap.parse_args()
    u = urllib.parse.urlparse(args.url)
    n = args.size
    rng = np.random.default_rng(1)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    body = a.tobytes() + b.tobytes()
    ref = a.astype(np.float64) @ b.astype(np.float64)
    path = "/v1/matmul?m=%d&k=%d&n=%d&dtype=float32" % (n, n, n)
    if args.kernel:
        path += "&kernel=" + urllib.parse.quote(args.kernel)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80)
    client, stages = [], {s: [] for s in STAGES}
    warm = args.n // 10
    for i in range(args.n + warm):
        t0 = time.perf_counter()
        conn.request("POST", path, body=body, headers={"Content-Type": "application/octet-stream",
                                                       "Accept": "application/octet-stream"})
        r = conn.getresponse()
        data = r.read()
        t1 = time.perf_counter()
        if r.status != 200:
            raise SystemExit("status %d: %s" % (r.status, data[:200]))
        if i == 0:
            c = np.frombuffer(data, np.float32).reshape(n, n)
            err = np.linalg.norm(c - ref) / np.linalg.norm(ref)
            if not err < 1e-5:
                raise SystemExit("wrong answer: relative error %.3g" % err)
        if i < warm:
            continue
        client.append((t1 - t0) * 1e3)
        st = parse_timing(r.getheader("Server-Timing"))
        for s in STAGES:
            if s in st:
                stages[s].append(st[s])
    print("%d products of %d² float32, kernel %s, one connection, %s" % (args.n, n, args.kernel or "auto",
                                                                         args.url))
    print()
    print("| stage | median µs | p99 µs |")
    print("| --- | ---: | ---: |")
    print("| client (request written to answer read) | %.1f | %.1f |" % (statistics.median(client) * 1e3,
                                                                         pct(client, 99) * 1e3))
    for s in STAGES:
        if stages[s]:
            print("| daemon %s | %.1f | %.1f |" % (s, statistics.median(stages[s]) * 1e3, pct(stages[s], 99) * 1e3))
    if stages["total"]:
        outside = [c - t for c, t in zip(client, stages["total"])]
        print("| outside the daemon's total | %.1f | %.1f |" % (statistics.median(outside) * 1e3,
                                                              pct(outside, 99) * 1e3))


if __name__ == "__main__":
    main()
