#!/usr/bin/env python3
"""v2_vs_v1.py - one product through the two doors, same client, same run: a KServe v2 infer
with binary tensor data (A and B as binary, C asked for as binary) against /v1/matmul with a
raw body, interleaved, median wall time of each and their ratio.

    bench/v2_vs_v1.py --url http://127.0.0.1:8080 [--sizes 1024,2048,4096] [--reps 9]

Both requests go over one kept-alive http.client connection each, from the same bytes in
memory; the answers are read whole. The first answer of each door is checked: v2's C must be
byte-for-byte v1's, and v1's close to a float64 NumPy reference. Prints Markdown.
"""
import argparse
import http.client
import json
import statistics
import sys
import time
import urllib.parse

import numpy as np


def conn_for(url):
    u = urllib.parse.urlsplit(url)
    return http.client.HTTPConnection(u.hostname, u.port or 80, timeout=600)


def post(conn, path, body, headers):
    t0 = time.perf_counter()
    conn.request("POST", path, body=body, headers=headers)
    r = conn.getresponse()
    data = r.read()
    dt = time.perf_counter() - t0
    if r.status != 200:
        sys.exit("POST %s: %d %s" % (path, r.status, data[:300]))
    return dt, data, r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--sizes", default="1024,2048,4096")
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()
    v1, v2 = conn_for(args.url), conn_for(args.url)
    print("| n | /v1/matmul raw median ms | v2 binary infer median ms | v2 / v1 | check |")
    print("| --- | --- | --- | --- | --- |")
    rng = np.random.default_rng(7)
    for n in [int(s) for s in args.sizes.split(",")]:
        a = rng.uniform(-1, 1, (n, n)).astype(np.float32)
        b = rng.uniform(-1, 1, (n, n)).astype(np.float32)
        raw = a.tobytes() + b.tobytes()
        hdr = json.dumps({
            "inputs": [
                {"name": "A", "shape": [n, n], "datatype": "FP32", "parameters": {"binary_data_size": a.nbytes}},
                {"name": "B", "shape": [n, n], "datatype": "FP32", "parameters": {"binary_data_size": b.nbytes}},
            ],
            "outputs": [{"name": "C", "parameters": {"binary_data": True}}],
        }).encode()
        v2body = hdr + raw
        p1 = "/v1/matmul?m=%d&k=%d&n=%d&dtype=float32" % (n, n, n)
        h1 = {"Content-Type": "application/octet-stream", "Accept": "application/octet-stream"}
        h2 = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(hdr))}
        t1, t2 = [], []
        check = "-"
        for i in range(args.reps + 1):
            d1, c1, _ = post(v1, p1, raw, h1)
            d2, body2, r2 = post(v2, "/v2/models/matmul/infer", v2body, h2)
            if i == 0:  # warm-up, and the check
                hl = int(r2.getheader("Inference-Header-Content-Length") or 0)
                c2 = body2[hl:]
                ref = a.astype(np.float64) @ b.astype(np.float64)
                got = np.frombuffer(c1, dtype=np.float32).reshape(n, n)
                err = float(np.max(np.abs(got - ref)) / max(1e-30, float(np.max(np.abs(ref)))))
                same = c1 == c2
                check = "v2 == v1: %s; max rel err %.1e" % ("yes" if same else "NO", err)
                if not same or err > 1e-3:
                    sys.exit("wrong answer at n=%d: %s" % (n, check))
                continue
            t1.append(d1 * 1e3)
            t2.append(d2 * 1e3)
        m1, m2 = statistics.median(t1), statistics.median(t2)
        print("| %d² float32 | %.2f | %.2f | %.3f | %s |" % (n, m1, m2, m2 / m1, check))


if __name__ == "__main__":
    main()
