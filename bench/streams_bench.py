#!/usr/bin/python3
"""streams_bench.py - `gemm multiply` of two size x size float32 .npy files with
--streams 1 (one request) and --streams N (A in row panels over N connections, B uploaded
once as a resident matrix), timed as the command's own `--timing` "client request".

    bench/streams_bench.py --size 2048 --reps 5                   # starts bin/gemmd (cpu)
    bench/streams_bench.py --size 4096 --backend cuda --reps 10   # on a GPU host
    bench/streams_bench.py --url http://127.0.0.1:8080 ...        # a daemon already running

Each count runs after a warm-up; the median of --reps runs is reported, and every output
is compared byte for byte with the single request's. Prints a Markdown table.
"""
import argparse
import filecmp
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "e2e"))
from harness import free_port  # noqa: E402  (one way to pick a loopback port, the tests')


def run(gemm, url, pa, pb, out, streams):
    p = subprocess.run([gemm, "--server", url, "multiply", pa, pb, "-o", out, "--streams", str(streams),
                        "--timing", "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(p.stderr.decode())
    m = re.search(r"client request\s+([0-9.]+) ms", p.stderr.decode())
    return float(m.group(1)) if m else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--streams", default="1,2,4,8")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--url")
    ap.add_argument("--gemmd", default=os.path.join(REPO, "bin", "gemmd"))
    ap.add_argument("--gemm", default=os.path.join(REPO, "bin", "gemm"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="another line of the daemon's config (e.g. connection_memory_kb=256)")
    a = ap.parse_args()
    tmp = tempfile.TemporaryDirectory(prefix="streams-bench-")
    proc, url = None, a.url
    if not url:
        port = free_port()
        cfg = os.path.join(tmp.name, "gemmd.conf")
        with open(cfg, "w") as f:
            f.write("backend = %s\nlog_level = warn\nmax_body_mb = 1024\nmax_dim = 65536\n"
                    "max_elements = 268435456\nresident_mb = 8192\nhttp_threads = 8\n" % a.backend)
            for kv in a.set:
                k, _, v = kv.partition("=")
                f.write("%s = %s\n" % (k.strip(), v.strip()))
        proc = subprocess.Popen([a.gemmd, "--config", cfg, "--port", str(port)], stderr=subprocess.DEVNULL)
        url = "http://127.0.0.1:%d" % port
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/healthz", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
    try:
        info = json.loads(urllib.request.urlopen(url + "/v1/info", timeout=10).read())
        rng = np.random.default_rng(1)
        n = a.size
        pa, pb = os.path.join(tmp.name, "A.npy"), os.path.join(tmp.name, "B.npy")
        np.save(pa, rng.uniform(-1, 1, (n, n)).astype(np.float32))
        np.save(pb, rng.uniform(-1, 1, (n, n)).astype(np.float32))
        ref = os.path.join(tmp.name, "C1.npy")
        run(a.gemm, url, pa, pb, ref, 1)
        rows = []
        for s in [int(x) for x in a.streams.split(",")]:
            out = os.path.join(tmp.name, "C%d.npy" % s)
            run(a.gemm, url, pa, pb, out, s)  # warm-up
            ts = [run(a.gemm, url, pa, pb, out, s) for _ in range(a.reps)]
            rows.append((s, statistics.median(ts), min(ts), filecmp.cmp(out, ref, shallow=False)))
        mb = 3 * n * n * 4 / 1e6
        print("| size | streams | median ms (of %d) | min ms | payload GB/s (median) | same bytes as 1 |" % a.reps)
        print("|---|---|---|---|---|---|")
        for s, med, mn, same in rows:
            print("| %d² | %d | %.1f | %.1f | %.2f | %s |" % (n, s, med, mn, mb / med,
                                                           "yes" if same else "NO"))
        dev = ", ".join(d.get("name", "?") for d in info.get("devices", []))
        print()
        print("- payload: A and B sent, C received: %.0f MB; time is `gemm multiply --timing`'s client request (B upload, the panels and B's delete included; file I/O not)" % mb)
        if a.set:
            print("- daemon config beside the defaults above: %s" % ", ".join(a.set))
        print("- device: %s; backend %s; host %s, %d CPUs" % (dev, info.get("backend"), platform.node(),
                                                            os.cpu_count() or 0))
        return 0 if all(r[3] for r in rows) else 1
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=60)
        tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
