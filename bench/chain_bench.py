#!/usr/bin/python3
"""chain_bench.py - a chain of four products, E = (((A.B).C).D).F, two ways:

  independent  four POST /v1/matmul with raw bodies: each sends both operands and gets C
               back (the previous C is sent again as the next A): 8 matrices up, 4 down.
  resident     the five operands are uploaded once (POST /v1/matrices, timed apart as
               "upload"); the chain is four POST /v1/matmul?a=ID&b=ID&store=1 with no
               body, and the final matrix is fetched once (GET /v1/matrices/{id}):
               0 matrices up, 1 down.

Both run over one keep-alive connection, after a warm-up round; the median of --reps
rounds is reported, and the two answers are compared with each other (identical bytes:
the same products in the same order) and with NumPy in float64.

    bench/chain_bench.py --size 1024 --reps 5                  # starts bin/gemmd (cpu)
    bench/chain_bench.py --size 4096 --backend cuda --reps 10  # on a GPU host
    bench/chain_bench.py --url http://127.0.0.1:8080 ...       # a daemon already running

Prints a Markdown table (what bench/results/resident-*.md hold).
"""
import argparse
import http.client
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "e2e"))
from harness import free_port  # noqa: E402  (one way to pick a loopback port, the tests')


class Conn:
    def __init__(self, url):
        u = urllib.parse.urlparse(url)
        self.c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)

    def req(self, method, path, body=None, headers=None):
        self.c.request(method, path, body=body, headers=headers or {})
        r = self.c.getresponse()
        data = r.read()
        if r.status >= 300:
            raise RuntimeError("%s %s: %d %s" % (method, path, r.status, data[:300]))
        return r, data


def independent(conn, mats, n):
    c = mats[0]
    for x in mats[1:]:
        body = c.tobytes() + x.tobytes()
        _, data = conn.req("POST", "/v1/matmul?m=%d&k=%d&n=%d&dtype=float32" % (n, n, n), body,
                           {"Content-Type": "application/octet-stream", "Accept": "application/octet-stream"})
        c = np.frombuffer(data, dtype="<f4").reshape(n, n)
    return c


def upload(conn, mats, n):
    ids = []
    for x in mats:
        _, data = conn.req("POST", "/v1/matrices?rows=%d&cols=%d&dtype=float32" % (n, n), x.tobytes(),
                           {"Content-Type": "application/octet-stream"})
        ids.append(json.loads(data)["id"])
    return ids


def resident(conn, ids, n):
    cur, made = ids[0], []
    for x in ids[1:]:
        _, data = conn.req("POST", "/v1/matmul?a=%s&b=%s&store=1" % (cur, x), b"", {"Content-Length": "0"})
        cur = json.loads(data)["id"]
        made.append(cur)
    _, data = conn.req("GET", "/v1/matrices/" + cur, headers={"Accept": "application/octet-stream"})
    for m in made:
        conn.req("DELETE", "/v1/matrices/" + m)
    return np.frombuffer(data, dtype="<f4").reshape(n, n)


def timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return (time.perf_counter() - t0) * 1000.0, out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--url", help="a running daemon (else bin/gemmd is started)")
    ap.add_argument("--gemmd", default=os.path.join(REPO, "bin", "gemmd"))
    a = ap.parse_args()
    n = a.size

    proc, tmp = None, None
    url = a.url
    if not url:
        tmp = tempfile.TemporaryDirectory(prefix="chain-bench-")
        port = free_port()
        cfg = os.path.join(tmp.name, "gemmd.conf")
        with open(cfg, "w") as f:
            f.write("backend = %s\nlog_level = warn\nmax_body_mb = 1024\nmax_dim = 65536\n"
                    "max_elements = 268435456\nresident_mb = 8192\n" % a.backend)
        proc = subprocess.Popen([a.gemmd, "--config", cfg, "--port", str(port)], stderr=subprocess.DEVNULL)
        url = "http://127.0.0.1:%d" % port
        for _ in range(300):
            try:
                Conn(url).req("GET", "/healthz")
                break
            except (OSError, RuntimeError):
                time.sleep(0.1)
    try:
        conn = Conn(url)
        _, info = conn.req("GET", "/v1/info")
        info = json.loads(info)
        rng = np.random.default_rng(7)
        # scaled so that the product of five stays near 1 in magnitude
        mats = [(rng.uniform(-1, 1, (n, n)) / np.sqrt(n / 3.0)).astype("<f4") for _ in range(5)]

        t_up, ids = timed(upload, conn, mats, n)
        independent(conn, mats, n)  # warm-up
        resident(conn, ids, n)
        ti, tr = [], []
        for _ in range(a.reps):
            t, c_ind = timed(independent, conn, mats, n)
            ti.append(t)
            t, c_res = timed(resident, conn, ids, n)
            tr.append(t)
        for x in ids:
            conn.req("DELETE", "/v1/matrices/" + x)

        ref = mats[0].astype(np.float64)
        for x in mats[1:]:
            ref = ref @ x.astype(np.float64)
        rel = float(np.linalg.norm(c_res - ref) / np.linalg.norm(ref))
        same = np.array_equal(c_ind, c_res)
        mi, mr = statistics.median(ti), statistics.median(tr)
        mb = n * n * 4 / 1e6
        dev = ", ".join(d.get("name", "?") for d in info.get("devices", [])) or info.get("backend", "?")
        print("| size | way | bytes up / down (MB) | median ms (of %d) | min ms |" % a.reps)
        print("|---|---|---|---|---|")
        print("| %d² | independent requests | %.0f / %.0f | %.1f | %.1f |" % (n, 8 * mb, 4 * mb, mi, min(ti)))
        print("| %d² | resident operands, store=1 chain | 0 / %.0f | %.1f | %.1f |" % (n, mb, mr, min(tr)))
        print()
        print("- speed-up (median): %.2fx" % (mi / mr))
        print("- uploading the five operands once: %.1f ms" % t_up)
        print("- answers identical between the two ways: %s; relative Frobenius error vs NumPy float64: %.2e"
              % ("yes" if same else "NO", rel))
        print("- device: %s; backend %s; host %s, %d CPUs" % (dev, info.get("backend", "?"), platform.node(),
                                                            os.cpu_count() or 0))
        return 0 if rel < 1e-3 else 1
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=60)
        if tmp:
            tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
