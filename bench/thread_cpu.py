#!/usr/bin/python3
"""thread_cpu.py - where a running daemon's CPU time goes, by thread, under a wrk load.

    bench/thread_cpu.py --pid PID --url 'http://127.0.0.1:8080/v1/matmul?m=64&k=64&n=64&dtype=float32' \\
                        --body body.bin --conns 1,64 --duration 4

For each connection count: reads every thread's user and system time from
/proc/PID/task/*/stat, runs wrk (Debian's `wrk`, bench/wrk_post.lua: raw POSTs of --body)
for --duration seconds, reads them again, and prints a Markdown table of CPU time by thread
name (threads are named: gemm-worker, gemm-house, gemmd-watchdog, gemmd-sweeper,
gemmd-encoder; libmicrohttpd's own, and the rest by their process name) in milliseconds
and in microseconds per answered request. A benchmark: no assertion.
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICK = os.sysconf("SC_CLK_TCK")


def snapshot(pid):
    out = collections.Counter()
    base = "/proc/%d/task" % pid
    for tid in os.listdir(base):
        try:
            with open("%s/%s/stat" % (base, tid)) as f:
                s = f.read()
        except OSError:
            continue
        comm = s[s.index("(") + 1:s.rindex(")")]
        fields = s[s.rindex(")") + 2:].split()
        out[comm] += int(fields[11]) + int(fields[12])  # utime, stime (ticks)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--url", required=True)
    ap.add_argument("--body", required=True)
    ap.add_argument("--conns", default="1,64")
    ap.add_argument("--duration", type=int, default=4)
    ap.add_argument("--wrk", default=shutil.which("wrk") or "/tmp/deps/usr/bin/wrk")
    a = ap.parse_args()
    env = dict(os.environ, WRK_BODY=a.body)
    print("| conns | requests | req/s | thread | CPU ms | CPU µs / request |")
    print("| ---: | ---: | ---: | --- | ---: | ---: |")
    for c in [int(x) for x in a.conns.split(",")]:
        t0 = snapshot(a.pid)
        p = subprocess.run([a.wrk, "-t", "1" if c < 4 else "2", "-c", str(c), "-d", "%ds" % a.duration,
                            "-s", os.path.join(REPO, "bench", "wrk_post.lua"), a.url],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        t1 = snapshot(a.pid)
        text = p.stdout.decode()
        m = re.search(r"(\d+) requests in", text)
        n = int(m.group(1)) if m else 0
        rps = re.search(r"Requests/sec:\s+([\d.]+)", text)
        total = 0
        for comm in sorted(t1, key=lambda k: -(t1[k] - t0.get(k, 0))):
            ms = (t1[comm] - t0.get(comm, 0)) * 1000.0 / TICK
            total += ms
            if ms > 0:
                print("| %d | %d | %s | %s | %.0f | %.1f |" % (c, n, rps.group(1) if rps else "-", comm, ms,
                                                             1000.0 * ms / n if n else 0))
        print("| %d | %d | %s | all | %.0f | %.1f |" % (c, n, rps.group(1) if rps else "-", total,
                                                       1000.0 * total / n if n else 0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
