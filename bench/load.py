#!/usr/bin/python3
"""load.py - HTTP servers under a wrk load, in alternating rounds on one host.

    bench/load.py [--servers "bare gemmd=bin/gemmd"] [--loads "64@1 64@64 256@64"] [--rounds 3]
                  [--duration 3] [--warmup 1] [--backend auto] [--dtype float32] [--http-threads N]
                  [--gemmd-flags "..."] [--flags NAME="..."]... [--query kernel=simt] [--make CUDA=0]
                  [--first] [--stages] [--latency] [--syscalls] [--profile] [--out DIR]

One wrk run of one server says little on a shared host: the same binary moves by 10-20% from
one run to the next, and more from one machine to the next. So every server runs once per
round, started fresh, the order reversed every other round; a comparison (a build against its
base, gemmd against the bare server) is made within a round, and the summary gives medians
over the rounds and each server's share of the first one's.

Servers (--servers, NAME=WHAT separated by spaces):
  bare               build/bench/bare_mhd (bench/bare_mhd.c): libmicrohttpd with the daemon's
                     threading and connection buffer, reading each body and answering C's bytes
                     as zeros, no decoding and no engine: the ceiling of the path
  NAME=PATH          a gemmd binary, reading its own tree's config (DIR/config/gemmd.conf for
                     DIR/bin/gemmd; else this tree's)
  NAME=@REV          gemmd built from git revision REV beside this tree (git archive into
                     OUT/tree-REV, make there with --make's arguments), with its own config
  NAME=nginx:K:WHAT  K (1 to 3) daemons of WHAT (PATH or @REV) behind nginx, with the recipe
                     config/nginx/gemmd.conf as shipped but for its addresses
Every daemon runs with --backend, --http-threads (default: half the cores, 4 to 16, as the
daemon's own default; the bare server gets the same), --per-ip-limit 0, a connection limit
above the most connections, --queue-depth 1024, --log-level warn, then --gemmd-flags, then
its own --flags NAME="...".

Loads (--loads): SIZE[*BATCH[s]]@CONNS with SIZE = N or MxKxN: raw bodies (A then B, values
in [-1, 1)) of --dtype, wrk (bench/wrk_post.lua) at CONNS connections. *BATCH sends BATCH
products in one request (?batch=), *BATCHs with one shared B (b_shared=1).

Columns: requests/s (and products/s for a batch); wrk's p50 and p99, corrected for
coordinated omission (a stalled answer adds the answers a constant-rate client would have
waited for meanwhile: the measure of a stall, not the latency of 1% of requests; --latency
gives those); answers of status 400 or above, and socket errors; the host's CPU busy share
(all cores: servers and wrk together); the server's CPU time per request (its processes, all
threads); mean / bound, wrk's mean latency over what CONNS connections allow at its rate
(Little's law): about 1 or below when wrk's figures add up, well above 1 they cannot be right.

Extras:
  --first     in every round: seconds from exec to the first /healthz 200, and the latency of
              the first products on one connection (64³ float32, float64, int32, 256³ float32,
              64³ float32 again): what the start-up warm-up leaves to the first requests
  --stages    after the rounds, per server and load: the daemon's stage times read from every
              answer's Server-Timing, and the answers that ran coalesced
  --latency   after the rounds, per gemmd server and square load: `bin/gemm bench` at the same
              connections, latency per request without correction (min, median, p99)
  --syscalls  after the rounds, at the first load: `perf stat --per-thread`, CPU time, context
              switches and system calls per request by thread kind (root, or
              kernel.perf_event_paranoid <= -1)
  --profile   after the rounds, at the first load: `perf record -g`, the top symbols of the
              HTTP threads (MHD-worker) and the engine workers (gemm-worker)
Logs and bodies go to --out (default bench/out/load). A benchmark: nothing is asserted.
"""
import argparse
import collections
import datetime
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "e2e"))
from harness import free_port  # noqa: E402  (the tests' free loopback port)
LUA = os.path.join(REPO, "bench", "wrk_post.lua")
NPDT = {"float32": "<f4", "float64": "<f8", "int32": "<i4", "float16": "<f2", "bfloat16": "<u2"}
EVENTS = ["task-clock", "context-switches"] + ["syscalls:sys_enter_" + s for s in
                                               ("futex", "epoll_wait", "epoll_ctl", "read", "write", "recvfrom",
                                                "sendmsg")]


def wait_up(url, procs):
    for _ in range(12000):  # 2 minutes
        try:
            return urllib.request.urlopen(url + "/healthz", timeout=2).read() is not None
        except OSError:
            if any(p.poll() is not None for p in procs):
                return False
            time.sleep(0.01)
    return False


def parse_load(text):
    g = re.fullmatch(r"(\d+)(?:x(\d+)x(\d+))?(?:\*(\d+)(s?))?@(\d+)", text)
    if not g:
        sys.exit("load.py: a load is SIZE[*BATCH[s]]@CONNS with SIZE = N or MxKxN, not %r" % text)
    m = int(g[1])
    k, n = (int(g[2]), int(g[3])) if g[2] else (m, m)
    return {"text": text, "m": m, "k": k, "n": n, "batch": int(g[4] or 0), "shared": g[5] == "s",
            "conns": int(g[6])}


def target(a, s, ld):
    """The URL of load ld on server s, and its body's file: A then B (raw, --dtype), made once."""
    q = "m=%d&k=%d&n=%d&dtype=%s" % (ld["m"], ld["k"], ld["n"], a.dtype)
    if ld["batch"]:
        q += "&batch=%d" % ld["batch"] + ("&b_shared=1" if ld["shared"] else "")
    path = os.path.join(a.out, "body-%s-%s.bin" % (ld["text"].split("@")[0], a.dtype))
    if not os.path.exists(path):
        rng = np.random.default_rng(ld["m"] * 7 + ld["k"] * 5 + ld["n"])
        b = max(ld["batch"], 1)
        with open(path, "wb") as f:
            for count in (b * ld["m"] * ld["k"], (1 if ld["shared"] else b) * ld["k"] * ld["n"]):
                x = rng.uniform(-1, 1, count).astype(np.float32)
                if a.dtype == "int32":
                    x = np.floor(x * 8)
                elif a.dtype == "bfloat16":
                    x = x.view("<u4") >> 16
                f.write(x.astype(NPDT[a.dtype]).tobytes())
    return "%s/v1/matmul?%s%s" % (s.url, q, "&" + a.query if a.query else ""), path


def cpu_ticks(pids):
    """utime + stime of these processes and their descendants (every thread), in seconds."""
    stats = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/stat" % p) as f:
                s = f.read()
        except (OSError, ValueError):
            continue
        fields = s[s.rindex(")") + 2:].split()
        stats[int(p)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    keep, total = set(pids), 0
    for _ in range(3):  # children, grandchildren
        keep |= {p for p, (pp, _) in stats.items() if pp in keep}
    for p in keep:
        total += stats.get(p, (0, 0))[1]
    return total / os.sysconf("SC_CLK_TCK")


def host_busy():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return v[0] + v[1] + v[2] + v[5] + v[6] + v[7], v[3] + v[4]


def rate(x):
    return "%.0f" % x if x >= 100 else "%.3g" % x


def to_us(v):
    g = re.fullmatch(r"([\d.]+)(us|ms|s|m)?", v or "")
    return float(g[1]) * {"us": 1, "ms": 1e3, "s": 1e6, "m": 6e7}.get(g[2], 1) if g else float("nan")


class Server:
    def __init__(self, spec, a):
        self.name, _, what = spec.partition("=")
        what = what or self.name
        self.a, self.k, self.procs = a, 0, []
        if what.startswith("nginx:"):
            k, _, what = what[6:].partition(":")
            self.k = int(k)
            if not 1 <= self.k <= 3:
                sys.exit("load.py: nginx:K takes 1 to 3 daemons (the recipe's upstreams)")
        self.bare = what == "bare"
        self.path = os.path.join(REPO, "build/bench/bare_mhd") if self.bare else self.resolve(what)
        if not os.access(self.path, os.X_OK):
            sys.exit("load.py: %s is not built (make bench, or make)" % self.path)
        tree = os.path.dirname(os.path.dirname(os.path.abspath(self.path)))
        self.conf = os.path.join(tree, "config", "gemmd.conf")
        if not os.path.exists(self.conf):
            self.conf = os.path.join(REPO, "config", "gemmd.conf")
        self.flags = shlex.split(a.gemmd_flags) + shlex.split(a.flags.get(self.name, ""))

    def resolve(self, what):
        if not what.startswith("@"):
            return os.path.abspath(what)
        rev = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", what[1:]], capture_output=True,
                             text=True).stdout.strip() or sys.exit("load.py: no revision %s here" % what[1:])
        tree = os.path.join(self.a.out, "tree-" + rev)
        if not os.access(os.path.join(tree, "bin", "gemmd"), os.X_OK):
            os.makedirs(tree, exist_ok=True)
            subprocess.run("git -C %s archive %s | tar -x -C %s" % (REPO, rev, tree), shell=True, check=True)
            log = open(os.path.join(self.a.out, "build-%s.log" % rev), "w")
            print("building %s in %s ..." % (rev, tree), file=sys.stderr)
            subprocess.run(["make", "-C", tree, "-j%d" % os.cpu_count()] + shlex.split(self.a.make) + ["build"],
                           stdout=log, stderr=subprocess.STDOUT, check=True)
        return os.path.join(tree, "bin", "gemmd")

    def daemon(self, port, log, extra=()):
        a = self.a
        if self.bare:
            cmd = [self.path, "--port", str(port), "--threads", str(a.http_threads), "--connection-limit",
                   str(a.limit), "--connection-memory-kb", str(a.connection_memory_kb)]
        else:
            cmd = [self.path, "--config", self.conf, "--backend", a.backend, "--port", str(port), "--http-threads",
                   str(a.http_threads), "--per-ip-limit", "0", "--connection-limit", str(a.limit), "--queue-depth",
                   "1024", "--log-level", "warn", "--connection-memory-kb", str(a.connection_memory_kb)]
            cmd += list(extra) + self.flags
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))

    def start(self):
        log = open(os.path.join(self.a.out, "server-%s.log" % self.name), "w")
        ports = [free_port() for _ in range(max(self.k, 1))]
        t0 = time.monotonic()
        for i, p in enumerate(ports):
            self.daemon(p, log, ["--instance-id", "gemmd-" + "abc"[i]] if self.k else [])
        self.url = "http://127.0.0.1:%d" % ports[0]
        if self.k:
            self.url = "http://127.0.0.1:%d" % self.nginx(ports, log)
        if not wait_up(self.url, self.procs):
            self.stop()
            sys.exit("load.py: %s did not start; see %s" % (self.name, log.name))
        self.up_s = time.monotonic() - t0

    def nginx(self, ports, log):
        d, listen = os.path.join(self.a.out, "nginx-" + self.name), free_port()
        os.makedirs(os.path.join(d, "temp"), exist_ok=True)
        text = open(os.path.join(REPO, "config", "nginx", "gemmd.conf")).read()
        for i, name in enumerate(("8081", "8082", "8083")):
            if i < len(ports):
                text = re.sub(r"\bserver 127\.0\.0\.1:%s\b" % name, "server 127.0.0.1:%d" % ports[i], text)
            else:  # fewer daemons: out of the balanced group (its own group stays)
                text = re.sub(r"^\s*server 127\.0\.0\.1:%s max_fails[^\n]*\n" % name, "", text, flags=re.M)
        text = re.sub(r"^(\s*)listen 8080;", r"\g<1>listen 127.0.0.1:%d;" % listen, text, flags=re.M)
        open(os.path.join(d, "recipe.conf"), "w").write(text)
        temps = " ".join("%s_temp_path %s/temp/%s;" % (t, d, t)
                         for t in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        open(os.path.join(d, "nginx.conf"), "w").write(
            "daemon off;\nworker_processes 4;\npid %s/nginx.pid;\nerror_log %s/error.log warn;\n"
            "events { worker_connections 4096; }\nhttp { %s access_log off; include %s/recipe.conf; }\n"
            % (d, d, temps, d))
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        self.procs.append(subprocess.Popen([nginx, "-p", d, "-c", d + "/nginx.conf", "-e", d + "/error.log"],
                                           stdout=log, stderr=subprocess.STDOUT))
        return listen

    def stop(self):
        for p in reversed(self.procs):
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []

    def pids(self):
        return [p.pid for p in self.procs]


def wrk(a, url, body, conns, secs, log, stages=False):
    env = dict(os.environ, WRK_BODY=body, WRK_STAGES="1" if stages else "0")
    cmd = [a.wrk, "-t", str(min(conns, 8, os.cpu_count())), "-c", str(conns), "-d", "%ds" % secs,
           "--timeout", "%ds" % a.wrk_timeout, "--latency", "-s", LUA, url]
    text = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
    with open(log, "w") as f:
        f.write(text)

    def grab(pattern, default="0"):
        g = re.search(pattern, text, re.M)
        return g.group(1) if g else default
    sock = sum(int(x) for x in re.findall(r"(?:connect|read|write|timeout) (\d+)", grab(r"^\s*Socket errors:(.*)$",
                                                                                        "")))
    return {"rps": float(grab(r"^Requests/sec:\s+([\d.]+)")), "p50": to_us(grab(r"^\s+50%\s+(\S+)", "")),
            "p99": to_us(grab(r"^\s+99%\s+(\S+)", "")), "mean": to_us(grab(r"^\s+Latency\s+(\S+)", "")),
            "non200": int(grab(r"^non200: (\d+)")), "sock": sock, "text": text}


def measure(a, s, ld, rnd):
    url, body = target(a, s, ld)
    if a.warmup > 0:
        wrk(a, url, body, ld["conns"], a.warmup, os.path.join(a.out, "warmup.log"))
    b0, i0, c0 = *host_busy(), cpu_ticks(s.pids())
    r = wrk(a, url, body, ld["conns"], a.duration, os.path.join(a.out, "wrk-%s-%s-%d.log" % (s.name, ld["text"], rnd)))
    b1, i1, c1 = *host_busy(), cpu_ticks(s.pids())
    r["busy"] = 100.0 * (b1 - b0) / max(1, b1 - b0 + i1 - i0)
    reqs = r["rps"] * a.duration
    r["cpu_us"] = 1e6 * (c1 - c0) / reqs if reqs else float("nan")
    r["little"] = r["mean"] * r["rps"] / (ld["conns"] * 1e6) if r["rps"] else float("nan")
    r["pps"] = r["rps"] * max(ld["batch"], 1)
    return r


def first_products(url):
    """Latency (ms) of the first products on one kept-alive connection, each checked."""
    import http.client
    c = http.client.HTTPConnection(url.split("//")[1], timeout=120)  # "host:port"
    out, rng = [], np.random.default_rng(3)
    for dtype, n in (("float32", 64), ("float64", 64), ("int32", 64), ("float32", 256), ("float32", 64)):
        a, b = (rng.integers(-8, 8, (n, n)).astype(NPDT[dtype]) for _ in range(2))
        t0 = time.perf_counter()
        c.request("POST", "/v1/matmul?m=%d&k=%d&n=%d&dtype=%s" % (n, n, n, dtype), a.tobytes() + b.tobytes(),
                  {"Content-Type": "application/octet-stream"})
        r = c.getresponse()
        data = r.read()
        out.append((time.perf_counter() - t0) * 1e3)
        got = np.frombuffer(data, NPDT[dtype]).reshape(n, n) if r.status == 200 else None
        if got is None or not np.array_equal(got, a.astype(np.int64) @ b.astype(np.int64)):
            out[-1] = "wrong (%d)" % r.status
    return out


def gemm_bench(a, s, ld):
    total = 320 if ld["m"] ** 3 >= 1 << 30 else 1280
    r = max(3, total // ld["conns"])
    cmd = [os.path.join(REPO, "bin", "gemm"), "-s", s.url, "bench", "--m", str(ld["m"]), "--k", str(ld["k"]),
           "--n", str(ld["n"]), "--dtype", a.dtype, "-c", str(ld["conns"]), "-r", str(r), "-w", "2"]
    text = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
    lat = re.search(r"latency ms.*?min ([\d.]+).*?median ([\d.]+).*?p99 ([\d.]+)", text, re.S)
    rps = re.search(r"([\d.]+) requests/s", text)
    if not lat:
        return "| %s | %s | failed: %s |" % (s.name, ld["text"], text.strip().splitlines()[-1:])
    return "| %s | %s | %d | %s | %s | %s | %s |" % (s.name, ld["text"], r * ld["conns"], *lat.groups(),
                                                     rps.group(1) if rps else "-")


def perf_pass(a, s, ld, how):
    """perf stat or perf record on the server while wrk runs at the first load."""
    url, body = target(a, s, ld)
    pids = ",".join(str(p) for p in s.pids())
    out = os.path.join(a.out, "perf-%s.%s" % (s.name, "csv" if how == "stat" else "data"))
    cmd = ([a.perf, "stat", "-e", ",".join(EVENTS), "--per-thread", "-x,", "-o", out] if how == "stat" else
           [a.perf, "record", "-g", "-F", "2999", "-o", out])
    w = subprocess.Popen([a.wrk, "-t", str(min(ld["conns"], 8)), "-c", str(ld["conns"]), "-d", "%ds" % (a.duration + 2),
                          "-s", LUA, url], env=dict(os.environ, WRK_BODY=body), stdout=subprocess.PIPE, text=True)
    time.sleep(1)
    subprocess.run(cmd + ["-p", pids, "--", "sleep", str(a.duration)], capture_output=True)
    rps = float((re.search(r"Requests/sec:\s+([\d.]+)", w.communicate()[0]) or [0, 0])[1])
    if how == "record":
        for kind in ("MHD-worker", "gemm-worker"):
            rep = subprocess.run([a.perf, "report", "-i", out, "--children", "--comm", kind, "--sort", "dso,symbol",
                                  "-g", "none"], capture_output=True, text=True).stdout
            top = [ln for ln in rep.splitlines() if "%" in ln and not ln.startswith("#")][:a.top]
            print("\n%s, %s at %.0f req/s: share of its samples (with what each calls)\n\n```\n%s\n```"
                  % (s.name, kind, rps, "\n".join(top)))
        return
    per = collections.defaultdict(float)
    for line in open(out):
        f = line.split(",")
        if len(f) > 3 and not line.startswith("#") and re.match(r"[\d.]+$", f[1]):
            per[(re.sub(r"-\d+$", "", f[0]), f[3])] += float(f[1])
    reqs = rps * a.duration
    for kind in sorted({k for k, _ in per}):
        vals = [per[(kind, e)] / reqs if reqs else 0 for e in EVENTS]
        vals[0] *= 1000  # task-clock: ms -> µs
        if any(v >= 0.005 for v in vals):
            print("| %s | %s | %s |" % (s.name, kind, " | ".join("%.2f" % v for v in vals)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", default="bare gemmd=bin/gemmd")
    ap.add_argument("--loads", default="64@1 64@64 256@64")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=3, help="seconds a measured run")
    ap.add_argument("--warmup", type=int, default=1, help="seconds of the same load before it, not counted")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--dtype", default="float32", choices=sorted(NPDT))
    ap.add_argument("--http-threads", type=int, default=min(16, max(4, (os.cpu_count() or 1) // 2)))
    ap.add_argument("--connection-memory-kb", type=int, default=64)
    ap.add_argument("--gemmd-flags", default="", help="flags for every gemmd")
    ap.add_argument("--flags", action="append", default=[], metavar="NAME=FLAGS", help="flags for one server")
    ap.add_argument("--query", default="", help="more of the query string, e.g. kernel=simt")
    ap.add_argument("--make", default="", help="make arguments for @REV builds, e.g. CUDA=0")
    ap.add_argument("--wrk", default=os.environ.get("WRK") or shutil.which("wrk"))
    ap.add_argument("--wrk-timeout", type=int, default=30)
    ap.add_argument("--perf", default=shutil.which("perf"))
    ap.add_argument("--top", type=int, default=30, help="--profile: symbols shown per thread kind")
    for x in ("first", "stages", "latency", "syscalls", "profile"):
        ap.add_argument("--" + x, action="store_true")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "out", "load"))
    a = ap.parse_args()
    if not a.wrk:
        sys.exit("load.py: wrk not found; install it: apt-get install -y wrk")
    a.flags = dict(f.split("=", 1) for f in a.flags)
    a.out = os.path.abspath(a.out)
    os.makedirs(a.out, exist_ok=True)
    loads = [parse_load(x) for x in a.loads.split()]
    a.limit = max(ld["conns"] for ld in loads) + 64
    servers = [Server(s, a) for s in a.servers.split()]
    cpu = re.search(r"model name\s*:\s*(.*)", open("/proc/cpuinfo").read())
    git = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print("# load: %s\n" % " ".join(s.name for s in servers))
    print("- host: %s, %d cores, %s" % (platform.node(), os.cpu_count(), cpu.group(1) if cpu else "?"))
    print("- date: %s; commit %s; %s" % (datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
                                         git.stdout.strip() or "?",
                                         subprocess.run([a.wrk, "-v"], capture_output=True, text=True).stdout.split(
                                             "[")[0].strip()))
    for s in servers:
        path, conf = (os.path.relpath(p, REPO) if p.startswith(REPO + os.sep) else p for p in (s.path, s.conf))
        print("- %s: %s%s" % (s.name, path, "" if s.bare else " (%s%s%s)" % (
            conf, ", flags " + " ".join(s.flags) if s.flags else "", ", %d behind nginx" % s.k if s.k else "")))
    print("- command: bench/load.py " + " ".join(shlex.quote(x) for x in sys.argv[1:]))
    print("\n| round | server | load | req/s | products/s | p50 µs | p99 µs | non-200 | host CPU busy "
          "| server CPU µs/req | mean / bound |")
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    res, firsts = collections.defaultdict(list), []
    try:
        for rnd in range(1, a.rounds + 1):
            for s in (servers if rnd % 2 else servers[::-1]):
                s.start()
                if a.first and not s.bare:
                    firsts.append((rnd, s.name, s.up_s, first_products(s.url)))
                for ld in loads:
                    r = measure(a, s, ld, rnd)
                    res[(s.name, ld["text"])].append(r)
                    print("| %d | %s | %s | %s | %s | %.0f | %.0f | %d%s | %.0f%% | %.1f | %.2f |" % (
                        rnd, s.name, ld["text"], rate(r["rps"]), rate(r["pps"]) if ld["batch"] else "-", r["p50"],
                        r["p99"], r["non200"], " (+%d socket)" % r["sock"] if r["sock"] else "", r["busy"],
                        r["cpu_us"], r["little"]), flush=True)
                s.stop()
        med = statistics.median
        print("\n## medians over %d rounds\n\n| load | server | req/s | products/s | p50 µs | p99 µs "
              "| vs %s |\n| --- | --- | ---: | ---: | ---: | ---: | ---: |" % (a.rounds, servers[0].name))
        for ld in loads:
            base = med(r["rps"] for r in res[(servers[0].name, ld["text"])])
            for s in servers:
                rs = res[(s.name, ld["text"])]
                rps = med(r["rps"] for r in rs)
                print("| %s | %s | %s | %s | %.0f | %.0f | %.1f%% |" % (
                    ld["text"], s.name, rate(rps), rate(med(r["pps"] for r in rs)), med(r["p50"] for r in rs),
                    med(r["p99"] for r in rs), 100 * rps / base if base else float("nan")))
        if firsts:
            print("\n## start and first products (ms, one connection)\n\n| round | server | start s | 64³ f32 "
                  "| 64³ f64 | 64³ i32 | 256³ f32 | 64³ f32 again |\n| ---: | --- | ---: | ---: | ---: | ---: "
                  "| ---: | ---: |")
            for rnd, name, up, ms in firsts:
                print("| %d | %s | %.2f | %s |" % (rnd, name, up, " | ".join(
                    "%.2f" % x if isinstance(x, float) else x for x in ms)))
        extras(a, servers, loads)
    finally:
        for s in servers:
            s.stop()


def extras(a, servers, loads):
    if a.stages:
        for s in (s for s in servers if not s.bare):
            s.start()
            for ld in loads:
                r = wrk(a, *target(a, s, ld), ld["conns"], a.duration, os.path.join(a.out, "stages.log"), stages=True)
                table = [ln for ln in r["text"].splitlines() if ln.startswith(("|", "stages:"))]
                print("\n## %s at %s: the daemon's stages (%.0f req/s while reading every answer)\n\n%s"
                      % (s.name, ld["text"], r["rps"], "\n".join(table)))
            s.stop()
    if a.latency:
        print("\n## per request, uncorrected (`bin/gemm bench`)\n\n| server | load | requests | min ms "
              "| median ms | p99 ms | req/s |\n| --- | --- | ---: | ---: | ---: | ---: | ---: |")
        for s in servers:
            if not s.bare:
                s.start()
                for ld in loads:
                    if not ld["batch"]:
                        print(gemm_bench(a, s, ld), flush=True)
                s.stop()
    for how, on in (("stat", a.syscalls), ("record", a.profile)):
        if not on:
            continue
        probe = subprocess.run([a.perf or "perf", "stat", "-e", EVENTS[2], "-o", "/dev/null", "--", "true"],
                               capture_output=True) if a.perf else None
        if not probe or probe.returncode:
            print("\nperf %s skipped: no perf, or no access to its events here (root, or "
                  "kernel.perf_event_paranoid <= -1)" % how)
            continue
        if how == "stat":
            names = ["CPU µs"] + [e.replace("syscalls:sys_enter_", "") for e in EVENTS[1:]]
            print("\n## per request at %s (%d s window): CPU µs, context switches, system calls\n\n"
                  "| server | thread kind | %s |\n| --- | --- |%s"
                  % (loads[0]["text"], a.duration, " | ".join(names), " ---: |" * len(EVENTS)))
        for s in servers:
            s.start()
            perf_pass(a, s, loads[0], how)
            s.stop()


if __name__ == "__main__":
    main()
