#!/usr/bin/python3
"""multigpu_bench.py - products/s of gemmd on one GPU against every GPU of the host, in one
run, for compute-bound products (the scale-out target of docs/OPERATIONS.md).

    bench/multigpu_bench.py [--size 8192] [--conns 8] [--seconds 20] [--out FILE.md]

For each device set (`--devices 0` and `--devices all`), a fresh bin/gemmd on the CUDA
backend (streams_per_device 4, split_min_mnk 0 so that products are never split: this
measures many products at once, not one product cut up) is driven two ways:

  resident  A and B (size x size float32) are uploaded once as resident matrices; each of
            --conns client threads then loops POST /v1/matmul?a=A&b=B&store=1 (no body)
            and DELETE /v1/matrices/{C}: the engine's products/s with nothing on the wire
            (the GPUs' share alone).
  wire      bin/gemm bench -n size -c conns: raw float32 bodies up and C down over
            loopback, every product (the whole service, wire included).

Per run: products/s, the GPUs' busy fraction (from gemmd_device_busy_seconds_total over
the run) and the ratio all/one. math is fp32 (exact IEEE float32) unless --math says
otherwise. One resident answer per run is fetched and compared at 256 sampled elements
with a float64 dot product. No timing assertion: the table goes to bench/results/.
"""
import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "e2e"))
from harness import free_port, parse_metrics  # noqa: E402


def start(gemmd, backend, devices, port, log):
    args = [gemmd, "--backend", backend, "--port", str(port), "--devices", devices,
            "--streams-per-device", "4", "--split-min-mnk", "0", "--max-body-mb", "4096",
            "--max-elements", str(1 << 30), "--queue-depth", "256", "--per-ip-limit", "0",
            "--http-threads", "16", "--log-level", "warn", "--resident-mb", "16384"]
    p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    for _ in range(600):
        try:
            urllib.request.urlopen("http://127.0.0.1:%d/readyz" % port, timeout=1).read()
            return p
        except Exception:  # noqa: BLE001 - not up yet
            if p.poll() is not None:
                sys.exit("gemmd exited: see %s" % log.name)
            time.sleep(0.1)
    p.kill()
    sys.exit("gemmd did not become ready")


def busy_seconds(port):
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10).read().decode()
    m = parse_metrics(text)
    return sum(v for (name, _), v in m.items() if name == "gemmd_device_busy_seconds_total")


def req(conn, method, path, body=None, headers=None):
    conn.request(method, path, body=body, headers=headers or {})
    r = conn.getresponse()
    data = r.read()
    if r.status >= 300:
        raise RuntimeError("%s %s: %d %s" % (method, path, r.status, data[:300]))
    return r, data


def resident_run(port, a, b, n, conns, seconds, math):
    c0 = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    ids = []
    for x in (a, b):
        _, data = req(c0, "POST", "/v1/matrices?rows=%d&cols=%d&dtype=float32" % (n, n), x.tobytes(),
                      headers={"Content-Type": "application/octet-stream"})
        ids.append(json.loads(data)["id"])
    path = "/v1/matmul?a=%s&b=%s&store=1&math=%s" % (ids[0], ids[1], math)
    # One product first: warm, and the answer checked.
    _, data = req(c0, "POST", path)
    cid = json.loads(data)["id"]
    _, cbytes = req(c0, "GET", "/v1/matrices/%s" % cid, headers={"Accept": "application/octet-stream"})
    req(c0, "DELETE", "/v1/matrices/%s" % cid)
    c = np.frombuffer(cbytes[-n * n * 4:], dtype=np.float32).reshape(n, n) if len(cbytes) >= n * n * 4 else None
    rng = np.random.default_rng(1)
    rows, cols = rng.integers(0, n, 256), rng.integers(0, n, 256)
    ref = np.array([np.dot(a[i].astype(np.float64), b[:, j].astype(np.float64)) for i, j in zip(rows, cols)])
    err = float(np.max(np.abs(c[rows, cols] - ref)) / max(np.max(np.abs(ref)), 1e-30)) if c is not None else float("inf")

    count = [0] * conns
    stop = time.monotonic() + seconds
    errors = []

    def loop(i):
        cx = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        try:
            while time.monotonic() < stop:
                _, d = req(cx, "POST", path)
                req(cx, "DELETE", "/v1/matrices/%s" % json.loads(d)["id"])
                count[i] += 1
        except Exception as ex:  # noqa: BLE001 - reported
            errors.append(repr(ex))

    b0, t0 = busy_seconds(port), time.monotonic()
    th = [threading.Thread(target=loop, args=(i,)) for i in range(conns)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.monotonic() - t0
    busy = busy_seconds(port) - b0
    c0 = http.client.HTTPConnection("127.0.0.1", port, timeout=600)  # the first one idled out (header_timeout)
    for x in ids:
        req(c0, "DELETE", "/v1/matrices/%s" % x)
    return sum(count) / wall, busy / wall, err, errors


def wire_run(gemm, port, n, conns, reps, math):
    b0, t0 = busy_seconds(port), time.monotonic()
    p = subprocess.run([gemm, "bench", "-s", "http://127.0.0.1:%d" % port, "-n", str(n), "-c", str(conns),
                        "-r", str(reps), "-w", "1", "--math", math], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=1200)
    wall = time.monotonic() - t0
    busy = busy_seconds(port) - b0
    out = p.stdout.decode()
    m = re.search(r"([0-9.]+) requests/s", out) or re.search(r"throughput\D*([0-9.]+)", out)
    return (float(m.group(1)) if m and p.returncode == 0 else float("nan")), busy / wall, out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gemmd", default=os.path.join(REPO, "bin/gemmd"))
    ap.add_argument("--gemm", default=os.path.join(REPO, "bin/gemm"))
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--conns", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--wire-reps", type=int, default=4, help="requests per connection in the wire run")
    ap.add_argument("--math", default="fp32")
    ap.add_argument("--skip-wire", action="store_true")
    ap.add_argument("--backend", default="cuda", help="cpu: a smoke run of this script (devices then mean nothing)")
    ap.add_argument("--out")
    args = ap.parse_args()

    n = args.size
    rng = np.random.default_rng(20261123)
    a = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    b = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    tmp = tempfile.mkdtemp(prefix="gemmd-multigpu-")
    try:
        gpus = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL).stdout.decode().strip().splitlines()
    except OSError:
        gpus = []
    rows = []
    for devices in ("0", "all"):
        port = free_port()
        with open(os.path.join(tmp, "gemmd-%s.log" % devices), "w") as log:
            p = start(args.gemmd, args.backend, devices, port, log)
            try:
                ps, util, err, errors = resident_run(port, a, b, n, args.conns, args.seconds, args.math)
                rows.append((devices, "resident", ps, util, "max rel. err %.1e%s" % (err, "; " + errors[0] if errors else "")))
                print(rows[-1], flush=True)
                if not args.skip_wire:
                    ps, util, out = wire_run(args.gemm, port, n, args.conns, args.wire_reps, args.math)
                    rows.append((devices, "wire", ps, util, "" if ps == ps else out[-300:]))
                    print(rows[-1], flush=True)
            finally:
                p.terminate()
                p.wait(timeout=120)

    lines = ["# gemmd on one GPU and on every GPU: %dx%dx%d float32, math %s, %d connections"
             % (n, n, n, args.math, args.conns), "",
             "- %s; %s; %d cores" % (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                     ", ".join(gpus) or "no GPU listed", os.cpu_count()),
             "- command: bench/multigpu_bench.py --size %d --conns %d --seconds %g --wire-reps %d --math %s"
             % (n, args.conns, args.seconds, args.wire_reps, args.math),
             "- streams_per_device 4, split_min_mnk 0 (never split); busy = sum over the GPUs of "
             "their busy seconds / wall seconds (2.0 = two GPUs always busy)", "",
             "| devices | path | products/s | GPUs busy | vs one GPU | note |", "| --- | --- | ---: | ---: | ---: | --- |"]
    one = {path: ps for dev, path, ps, _, _ in rows if dev == "0"}
    for dev, path, ps, util, note in rows:
        ratio = ps / one[path] if one.get(path) else float("nan")
        lines.append("| %s | %s | %.2f | %.2f | %.2fx | %s |" % (dev, path, ps, util, ratio, note))
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
