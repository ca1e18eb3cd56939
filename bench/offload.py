#!/usr/bin/python3
"""offload.py - does offloading a product pay over a lab's network?

    bench/offload.py [--links loopback,10gbit,1gbit] [--sizes 2048,4096,8192]
                     [--dtypes float32,float64] [--reps 3] [--backend auto]
                     [--streams [--streams-size 4096] [--streams-list 1,2,4]]
                     [--chain [--chain-size 2048]] [--out FILE.md]

The daemon runs in one network namespace and the clients in another, joined by a veth pair
(ip netns, ip link, tc: Debian's iproute2; run as root). tc shapes both directions with netem
(the rate, and 0.05 ms of delay each way: a 0.1 ms round trip) or, where the kernel has no
netem, with tbf (the rate alone; the table says so). Links (--links):
  loopback   no namespaces: daemon and clients on 127.0.0.1 (no root needed)
  veth       the pair, not shaped
  RATE       the pair shaped to RATE (tc's units: 10gbit, 1gbit, 2500mbit, ...)

For each size (n x n x n), dtype and link, four ways, each the median of --reps after one
warm-up, each answer compared with the host's:
  gemm      bin/gemm multiply A.bin B.bin --shape NxN -d DTYPE -o C.bin (raw files): the
            process's wall time
  python    gemmd.Client(url).matmul(a, b) (client/python) in the measuring process
  preload   NumPy's a @ b in a process with LD_PRELOAD=lib/libgemm_blas.so and its defaults
            (the side it learned is faster); GEMM_OFFLOAD_LOG=1 tells where each product ran.
            Its first two products learn the sides' costs (the server, then the host unless
            even a host at its best would lose) and are listed apart; the median is of the
            --reps products after them
  host      NumPy's a @ b on the host's BLAS, no preload (once per size and dtype: the link
            does not matter)
"faster" is server when gemm, python or the preload's products on the server beat the host,
and "chosen" says whether the preload took that side after learning.

--streams also times parallel transfer: bin/gemm multiply --streams N (B uploaded once as a
resident matrix, A sent in N row panels over N connections at once) of a --streams-size
float32 product (the time it prints with --timing: B's upload, the panels and B's delete,
without reading and writing the files), against the bare libmicrohttpd server (build/bench/bare_mhd: no decoding,
no product) receiving the same bytes the same way: B once, then the N panels at once, each
answered with its panel of C.

--chain also times a chain of four products, E = (((A.B).C).D).F in float32 (--chain-size),
two ways over one kept-alive connection: four independent POST /v1/matmul that each send both
operands and take C back (8 matrices up, 4 down), and the same chain on resident matrices
(POST /v1/matrices once, timed apart; then ?a=ID&b=ID&store=1 with no body, the last one
fetched: 0 up, 1 down). Both answers are compared with each other and with NumPy.

Needs bin/gemmd, bin/gemm and lib/libgemm_blas.so (make), build/bench/bare_mhd for --streams
(make bench), and NumPy (Debian's python3-numpy: its a @ b calls libblas.so.3, which the
preload replaces). Without root or iproute2 it says so and measures loopback only.
"""
import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "e2e"))
from harness import free_port  # noqa: E402  (the tests' free loopback port)
BIN = {x: os.path.join(REPO, p) for x, p in (("gemmd", "bin/gemmd"), ("gemm", "bin/gemm"),
                                             ("preload", "lib/libgemm_blas.so"), ("bare", "build/bench/bare_mhd"))}
NS, DEV, ADDR = ("gemmd-srv", "gemmd-cli"), ("gemmd-s", "gemmd-c"), ("10.89.0.1", "10.89.0.2")
RATE = re.compile(r"(\d+(?:\.\d+)?)([kmgt]?)bit$")  # tc's rates: 10gbit, 2500mbit, ...
LEARN = 2  # the preload's first products: the server's cost, then the host's (docs/BLAS.md)
PRELOAD_RUN = """
LEARN = %d
import json, sys, time
import numpy as np
n, dtype, reps, d = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
a = np.fromfile(d + "/A.bin", dtype).reshape(n, n)
b = np.fromfile(d + "/B.bin", dtype).reshape(n, n)
ts = []
for i in range(LEARN + reps):
    t0 = time.perf_counter()
    c = a @ b
    ts.append((time.perf_counter() - t0) * 1e3)
c.tofile(d + "/C-preload.bin")
print(json.dumps(ts))
""" % LEARN


def run(*cmd, check=True):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if check and p.returncode:
        raise RuntimeError("%s: %s" % (" ".join(cmd), p.stderr.strip()))
    return p


def rel_err(c, ref):
    return float(np.linalg.norm(c.astype(np.float64) - ref) / np.linalg.norm(ref))


# ------------------------------------------------------------------- measuring (clients)

def measure(a):
    """One size, dtype and link: the ways asked for, as a JSON line on stdout."""
    n, dt, d = a.size, a.dtype, a.tmp
    tol = 1e-4 if dt == "float32" else 1e-10
    if not os.path.exists(d + "/A.bin"):
        rng = np.random.default_rng(n)
        for name in ("A", "B"):
            rng.uniform(-1, 1, (n, n)).astype(dt).tofile("%s/%s.bin" % (d, name))
    A, B = (np.fromfile("%s/%s.bin" % (d, x), dt).reshape(n, n) for x in "AB")
    ref = A.astype(np.float64) @ B.astype(np.float64)
    out = {}

    def timed(name, fn):
        ts = []
        for i in range(a.reps + 1):
            t0 = time.perf_counter()
            c = fn()
            ts.append((time.perf_counter() - t0) * 1e3)
            err = rel_err(c, ref) if i == 0 else 0
            if not err <= tol:  # NaN too
                raise RuntimeError("%s: relative error %g" % (name, err))
        out[name] = statistics.median(ts[1:])

    def gemm():
        run(BIN["gemm"], "-s", a.url, "multiply", d + "/A.bin", d + "/B.bin", "--shape", "%dx%d" % (n, n), "-d", dt,
            "-o", d + "/C-gemm.bin", "--no-progress")
        return np.fromfile(d + "/C-gemm.bin", dt).reshape(n, n)

    if "host" in a.ways:
        timed("host", lambda: A @ B)
    if "gemm" in a.ways:
        timed("gemm", gemm)
    if "python" in a.ways:
        sys.path.insert(0, os.path.join(REPO, "client", "python", "src"))
        import gemmd
        client = gemmd.Client(a.url, timeout=3600)
        timed("python", lambda: client.matmul(A, B))
    if "preload" in a.ways:
        env = dict(os.environ, LD_PRELOAD=BIN["preload"], GEMM_SERVER=a.url, GEMM_OFFLOAD_LOG="1")
        for k in ("GEMM_OFFLOAD_MIN_INTENSITY", "GEMM_OFFLOAD_MIN_FLOPS"):
            env.pop(k, None)
        p = subprocess.run([sys.executable, "-c", PRELOAD_RUN, str(n), dt, str(a.reps), d], env=env,
                           capture_output=True, text=True)
        if p.returncode:
            raise RuntimeError("preload: " + p.stderr)
        sides = [ln.split("-> ")[1].split()[0] for ln in p.stderr.splitlines() if "-> " in ln]
        ts = json.loads(p.stdout)
        if len(sides) != len(ts):
            raise RuntimeError("preload: %d log lines for %d products" % (len(sides), len(ts)))
        err = rel_err(np.fromfile(d + "/C-preload.bin", dt).reshape(n, n), ref)
        if not err <= tol:
            raise RuntimeError("preload: relative error %g" % err)
        out["preload"] = statistics.median(ts[LEARN:])
        out["chose"] = "+".join(sorted(set(sides[LEARN:])))
        out["learning"] = ", ".join("%s %.0f" % (w, t) for w, t in zip(sides[:LEARN], ts[:LEARN]))
        on_server = [t for w, t in zip(sides, ts) if w == "server"]
        out["preload_server"] = statistics.median(on_server) if on_server else None
    print(json.dumps(out))


def measure_streams(a):
    """gemm multiply --streams N against the bare server taking the same bytes, per N."""
    n, d = a.size, a.tmp
    rng = np.random.default_rng(1)
    A = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    B = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    A.tofile(d + "/A.bin")
    B.tofile(d + "/B.bin")
    out, first = {}, None

    def post(path, body, done):
        import http.client
        c = http.client.HTTPConnection(a.bare.split("//")[1], timeout=3600)  # "host:port"
        c.request("POST", path, body, {"Content-Type": "application/octet-stream"})
        r = c.getresponse()
        done.append((r.status, len(r.read())))

    def bare(s):
        rows, done = n // s, []
        post("/v1/matrices?m=1&n=1", memoryview(B), done)
        ts = [threading.Thread(target=post, args=("/v1/matmul?m=%d&n=%d&dtype=float32" % (rows, n),
                                                  memoryview(A[i * rows:(i + 1) * rows]), done)) for i in range(s)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if done[1:] != [(200, rows * n * 4)] * s:
            raise RuntimeError("bare server: %r" % done)

    for s in a.streams_list:
        tg, tb = [], []
        for i in range(a.reps + 1):
            p = run(BIN["gemm"], "-s", a.url, "multiply", d + "/A.bin", d + "/B.bin", "--shape", "%dx%d" % (n, n),
                    "-d", "float32", "-o", d + "/C.bin", "--streams", str(s), "--no-progress", "--timing")
            tg.append(float(re.search(r"client request\s+([\d.]+) ms", p.stderr).group(1)))
            t0 = time.perf_counter()
            bare(s)
            tb.append((time.perf_counter() - t0) * 1e3)
        c = open(d + "/C.bin", "rb").read()
        if first is None:
            first = c
            err = rel_err(np.frombuffer(c, np.float32).reshape(n, n), A.astype(np.float64) @ B.astype(np.float64))
            if not err <= 1e-4:
                raise RuntimeError("gemm --streams 1: relative error %g" % err)
        out[s] = (statistics.median(tg[1:]), statistics.median(tb[1:]), c == first)
    print(json.dumps(out))


def measure_chain(a):
    """Four products in a row: independent requests against resident operands."""
    import http.client
    n = a.size
    c = http.client.HTTPConnection(a.url.split("//")[1], timeout=3600)

    def req(method, path, body=b"", json_answer=True):
        c.request(method, path, body, {"Content-Type": "application/octet-stream"})
        r = c.getresponse()
        data = r.read()
        if r.status >= 300:
            raise RuntimeError("%s %s: %d %s" % (method, path, r.status, data[:300]))
        return json.loads(data) if json_answer else data

    def independent():
        x = mats[0]
        for y in mats[1:]:
            x = np.frombuffer(req("POST", "/v1/matmul?m=%d&k=%d&n=%d&dtype=float32" % (n, n, n),
                                  x.tobytes() + y.tobytes(), False), "<f4").reshape(n, n)
        return x

    def resident():
        cur, made = ids[0], []
        for y in ids[1:]:
            cur = req("POST", "/v1/matmul?a=%s&b=%s&store=1" % (cur, y))["id"]
            made.append(cur)
        x = np.frombuffer(req("GET", "/v1/matrices/" + cur, json_answer=False), "<f4").reshape(n, n)
        for m in made:
            req("DELETE", "/v1/matrices/" + m, json_answer=False)
        return x

    rng = np.random.default_rng(7)  # scaled so that the product of five stays near 1
    mats = [(rng.uniform(-1, 1, (n, n)) / np.sqrt(n / 3.0)).astype("<f4") for _ in range(5)]
    t0 = time.perf_counter()
    ids = [req("POST", "/v1/matrices?rows=%d&cols=%d&dtype=float32" % (n, n), x.tobytes())["id"] for x in mats]
    up = (time.perf_counter() - t0) * 1e3
    ti, tr = [], []
    for _ in range(a.reps + 1):
        t0 = time.perf_counter()
        ci = independent()
        ti.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        cr = resident()
        tr.append((time.perf_counter() - t0) * 1e3)
    for x in ids:
        req("DELETE", "/v1/matrices/" + x, json_answer=False)
    ref = mats[0].astype(np.float64)
    for x in mats[1:]:
        ref = ref @ x.astype(np.float64)
    print(json.dumps([statistics.median(ti[1:]), statistics.median(tr[1:]), up, bool(np.array_equal(ci, cr)),
                      rel_err(cr, ref)]))


# ------------------------------------------------------------------- the links (root)

class Links:
    def __init__(self):
        self.up, self.netem = False, True

    def setup(self):
        self.teardown()
        for ns in NS:
            run("ip", "netns", "add", ns)
        run("ip", "link", "add", DEV[0], "netns", NS[0], "type", "veth", "peer", "name", DEV[1], "netns", NS[1])
        for ns, dev, ip in zip(NS, DEV, ADDR):
            run("ip", "-n", ns, "addr", "add", ip + "/24", "dev", dev)
            run("ip", "-n", ns, "link", "set", dev, "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")
        self.up = True

    def shape(self, rate):
        """Both directions to rate (None: not shaped); says what it did."""
        for ns, dev in zip(NS, DEV):
            run("tc", "-n", ns, "qdisc", "del", "dev", dev, "root", check=False)
            if rate and self.netem:
                p = run("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "netem", "rate", rate, "delay", "50us",
                        "limit", "100000", check=False)
                self.netem = p.returncode == 0
            if rate and not self.netem:  # a bucket of 1 ms at the rate, at least 64 KiB (GSO packets)
                g = RATE.match(rate)
                bits = float(g[1]) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[g[2]]
                run("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst",
                    str(max(65536, int(bits / 8 / 1000))), "latency", "50ms")
        if not rate:
            return "not shaped"
        return "netem %s, 0.05 ms each way" % rate if self.netem else "tbf %s (no netem here: no added delay)" % rate

    def teardown(self):
        for ns in NS:
            run("ip", "netns", "del", ns, check=False)
        self.up = False


def start(cmd, ns, url, log):
    """cmd in namespace ns (None: here), up when url/healthz answers (asked from the clients' side)."""
    p = subprocess.Popen((["ip", "netns", "exec", ns] if ns else []) + cmd, stdout=log, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL)
    probe = (["ip", "netns", "exec", NS[1]] if ns else []) + ["curl", "-fsS", "-o", "/dev/null", url + "/healthz"]
    for _ in range(600):
        if run(*probe, check=False).returncode == 0:
            return p
        if p.poll() is not None:
            break
        time.sleep(0.1)
    p.kill()
    raise RuntimeError("%s did not start; see %s" % (cmd[0], log.name))


def child(ns, mode, **kw):
    cmd = (["ip", "netns", "exec", ns] if ns else []) + [sys.executable, os.path.abspath(__file__), mode]
    for k, v in kw.items():
        cmd += ["--" + k.replace("_", "-"), str(v)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "measuring failed")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    if len(sys.argv) > 1 and sys.argv[1] in ("--measure", "--measure-streams", "--measure-chain"):
        mode = sys.argv.pop(1)
        ap = argparse.ArgumentParser()
        for k in ("url", "bare", "tmp", "dtype", "ways", "streams-list"):
            ap.add_argument("--" + k, default="")
        ap.add_argument("--size", type=int)
        ap.add_argument("--reps", type=int)
        a = ap.parse_args()
        a.streams_list = [int(x) for x in a.streams_list.split(",") if x]
        return {"--measure": measure, "--measure-streams": measure_streams, "--measure-chain": measure_chain}[mode](a)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--links", default="loopback,10gbit,1gbit")
    ap.add_argument("--sizes", default="2048,4096,8192")
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--streams", action="store_true")
    ap.add_argument("--streams-size", type=int, default=4096)
    ap.add_argument("--streams-list", default="1,2,4")
    ap.add_argument("--chain", action="store_true")
    ap.add_argument("--chain-size", type=int, default=2048)
    ap.add_argument("--out")
    a = ap.parse_args()
    for what, path in BIN.items():
        if not os.access(path, os.R_OK) and (what != "bare" or a.streams):
            sys.exit("offload.py: %s is missing (make%s)" % (path, " bench" if what == "bare" else ""))
    links = a.links.split(",")
    for x in links:
        if x not in ("loopback", "veth") and not RATE.match(x):
            sys.exit("offload.py: a link is loopback, veth or a tc rate such as 10gbit, not %r" % x)
    lines = ["# Does offloading pay? %s backend, links %s\n" % (a.backend, ", ".join(links))]
    cpu = [ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")][:1]
    git = run("git", "-C", REPO, "rev-parse", "--short", "HEAD", check=False).stdout.strip() or "?"
    lines.append("- host: %s, %d cores, %s; NumPy %s; date %s; commit %s" % (
        platform.node(), os.cpu_count(), (cpu or ["?"])[0], np.__version__,
        datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"), git))
    lines.append("- command: `bench/offload.py %s`" % " ".join(sys.argv[1:]))
    L = Links()
    if any(x != "loopback" for x in links):
        why = ("needs root" if os.geteuid() else "needs ip and tc (apt-get install iproute2)"
               if not (shutil.which("ip") and shutil.which("tc")) else "")
        try:
            if not why:
                L.setup()
        except RuntimeError as e:
            why = "cannot make network namespaces here (%s)" % e
        if why:
            lines.append("- **namespaced links skipped: %s**" % why)
            links = [x for x in links if x == "loopback"]
    tmp = tempfile.TemporaryDirectory(prefix="gemmd-offload-")
    log = open(os.path.join(tmp.name, "server.log"), "w")
    procs, rows, srows, crows, hosts, where = [], [], [], [], {}, None
    try:
        for link in sorted(links, key=lambda x: x != "loopback"):
            ns = None if link == "loopback" else NS[0]
            if where != ns or not procs:  # servers: one set on loopback, one in the namespace
                for p in procs:
                    p.terminate()
                    p.wait()
                ip, port, bport, where = "127.0.0.1" if ns is None else ADDR[0], free_port(), free_port(), ns
                a.url, a.bare = "http://%s:%d" % (ip, port), "http://%s:%d" % (ip, bport)
                procs = [start([BIN["gemmd"], "--listen", ip, "--port", str(port), "--backend", a.backend,
                                "--log-level", "warn"], ns, a.url, log)]
                if a.streams:
                    procs.append(start([BIN["bare"], "--listen", ip, "--port", str(bport), "--threads", "8"], ns,
                                       a.bare, log))
            how = "loopback, not shaped" if ns is None else L.shape(None if link == "veth" else link)
            lines.append("- link %s: %s" % (link, how))
            cns = NS[1] if ns else None
            for n in (int(x) for x in a.sizes.split(",")):
                for dt in a.dtypes.split(","):
                    d = os.path.join(tmp.name, "%d-%s" % (n, dt))
                    os.makedirs(d, exist_ok=True)
                    ways = "gemm,python,preload" + ("" if (n, dt) in hosts else ",host")
                    r = child(cns, "--measure", url=a.url, tmp=d, size=n, dtype=dt, reps=a.reps, ways=ways)
                    hosts.setdefault((n, dt), r.get("host"))
                    r["host"] = hosts[(n, dt)]
                    server = min(x for x in (r["gemm"], r["python"], r["preload_server"]) if x is not None)
                    faster = "server" if server < r["host"] else "host"
                    rows.append("| %d² | %s | %s | %.1f | %.1f | %.1f %s | %s | %.1f | %s | %s |" % (
                        n, dt, link, r["gemm"], r["python"], r["preload"], r["chose"], r["learning"], r["host"],
                        faster, "yes" if r["chose"] == faster else "no"))
                    print(rows[-1], file=sys.stderr, flush=True)
            if a.streams:
                r = child(cns, "--measure-streams", url=a.url, bare=a.bare, tmp=tmp.name, size=a.streams_size,
                          reps=a.reps, streams_list=a.streams_list)
                for s, (tg, tb, same) in r.items():
                    srows.append("| %s | %s | %.1f | %.1f | %.2f | %s |" % (
                        link, s, tg, tb, tg / tb, "yes" if same else "NO"))
            if a.chain:
                ti, tr, up, same, err = child(cns, "--measure-chain", url=a.url, size=a.chain_size, reps=a.reps)
                crows.append("| %s | %.1f | %.1f | %.2fx | %.1f | %s | %.1e |" % (
                    link, ti, tr, ti / tr, up, "yes" if same else "NO", err))
    finally:
        for p in procs:
            p.terminate()
            p.wait()
        if L.up:
            L.teardown()
        tmp.cleanup()
    lines.append("- ways: gemm = `bin/gemm multiply` of raw files (process wall time), python = `gemmd.Client"
                 ".matmul`, preload = NumPy `a @ b` under LD_PRELOAD=lib/libgemm_blas.so (its defaults: "
                 "the side it learned is faster; the median of the %d products after its first %d, which learn the "
                 "two sides' costs and are listed apart), host = NumPy `a @ b` on the host BLAS; faster = server "
                 "when gemm, python or the preload's products on the server beat the host; median of %d after a "
                 "warm-up, in ms\n" % (a.reps, LEARN, a.reps))
    lines.append("| size | dtype | link | gemm ms | python ms | preload ms, its choice | preload's first %d "
                 "(learning), ms | host ms | faster | chosen |" % LEARN)
    lines.append("| --- | --- | --- | ---: | ---: | ---: | --- | ---: | --- | --- |")
    lines += rows
    if srows:
        lines.append("\n## Parallel transfer, %d² float32: `gemm multiply --streams N` against the bare server "
                     "taking the same bytes (B once, then N panels of A at once); gemm's time is its --timing client "
                     "request\n" % a.streams_size)
        lines.append("| link | N | gemm ms | bare ms | gemm / bare | C equal to N=1's |\n| --- | ---: | ---: | ---: "
                     "| ---: | --- |")
        lines += srows
    if crows:
        lines.append("\n## A chain of four %d² float32 products: independent requests against resident operands\n"
                     % a.chain_size)
        lines.append("| link | independent ms | resident ms | speed-up | uploading the five once, ms | same C "
                     "| rel. error vs NumPy |\n| --- | ---: | ---: | ---: | ---: | --- | ---: |")
        lines += crows
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
