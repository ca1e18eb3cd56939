"""hostile.py - hostile clients for the load tests (tests/e2e/test_hostile.py) and the
benchmark that records their figures (bench/hostile_load.py).

Everything runs on loopback. Attackers bind their sockets to their own 127.0.0.x source
addresses (Linux routes all of 127/8 to lo), so per-address limits see several clients.
Many sockets are driven from one thread with selectors, so a thousand connections cost
the test little CPU. Every attack runs until its stop event is set and then closes its
sockets; each keeps counts of what the daemon did to it.

    import hostile
    d = Daemon(tap, config=hostile.BATTERY_CONFIG)
    mon = hostile.Monitor(d.proc.pid); mon.start()
    good = hostile.GoodClient(d.port, "127.0.0.20"); good.start()
    probe = hostile.Probe(d.port, "127.0.0.21"); probe.start()
    atk = hostile.Slowloris(d.port, ["127.0.0.2", ...], per_ip=60); atk.start()
    ... atk.stop(); good.stop(); ...
"""

import io
import json
import os
import random
import selectors
import socket
import ssl
import subprocess
import threading
import time

import numpy as np

# The daemon's configuration under attack (deadlines short so that a run is short).
BATTERY_CONFIG = {
    "backend": "cpu",
    "log_level": "warn",
    "http_threads": 4,
    "connection_limit": 256,
    "per_ip_limit": 64,
    "max_inflight_mb": 512,
    "header_timeout": 2,
    "request_timeout": 20,
    "min_rate_kb": 64,
    "send_timeout": 2,
    "threads": 1,
    "cpu_workers": 1,
    "max_json_mb": 64,
    "admit_wait": 2,  # a request waiting for memory is refused after it, like a slow head
}


def proc_status(pid):
    """{field: kB} of /proc/PID/status for VmSize, VmRSS, VmHWM and the parts of RSS
    (RssAnon, RssFile, RssShmem); {} when the process is gone."""
    out = {}
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmSize", "VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                    out[k] = int(v.split()[0])
    except OSError:
        pass
    return out


def fd_count(pid):
    try:
        return len(os.listdir("/proc/%d/fd" % pid))
    except OSError:
        return -1


def percentile(xs, p):
    if not xs:
        return float("nan")
    s = sorted(xs)
    i = min(len(s) - 1, max(0, int(round(p / 100.0 * (len(s) - 1)))))
    return s[i]


def connect(port, src, timeout=5.0):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as curl: no write waits for an ACK
    s.settimeout(timeout)
    s.bind((src, 0))
    s.connect(("127.0.0.1", port))
    return s


class Worker(threading.Thread):
    """A thread that runs until stop(); exceptions are kept for the report."""

    def __init__(self, name):
        super().__init__(name=name, daemon=True)
        self.halt = threading.Event()
        self.error = None

    def stop(self, wait=30):
        self.halt.set()
        self.join(timeout=wait)

    def run(self):
        try:
            self.body()
        except Exception as e:  # noqa: BLE001 - reported by the caller
            import traceback
            self.error = "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc())


# ---------------------------------------------------------------------------- HTTP on a socket

def read_response(s, deadline):
    """Reads one HTTP/1.1 answer with a Content-Length: (status, headers, body), status 0
    when the connection closed or the deadline passed first."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            return 0, {}, b""
        s.settimeout(left)
        try:
            chunk = s.recv(65536)
        except (socket.timeout, ConnectionError, OSError):
            return 0, {}, b""
        if not chunk:
            return 0, {}, b""
        buf += chunk
    head, body = buf.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    try:
        status = int(lines[0].split()[1])
    except (IndexError, ValueError):
        return 0, {}, b""
    hdrs = {}
    for line in lines[1:]:
        k, _, v = line.partition(b":")
        hdrs[k.decode("latin-1").strip().lower()] = v.decode("latin-1").strip()
    n = int(hdrs.get("content-length", "0"))
    while len(body) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            return 0, hdrs, body
        s.settimeout(left)
        try:
            chunk = s.recv(max(65536, n - len(body)))
        except (socket.timeout, ConnectionError, OSError):
            return 0, hdrs, body
        if not chunk:
            return 0, hdrs, body
        body += chunk
    return status, hdrs, body


def request(port, src, method, path, body=b"", ctype=None, accept=None, timeout=10.0, sock=None, tls=None):
    """One request; returns (status, headers, body, sock) with sock kept open for reuse
    when the answer allows keep-alive (None otherwise). status 0: no answer. tls: an
    ssl.SSLContext for HTTPS (tls_client())."""
    deadline = time.monotonic() + timeout
    own = sock is None
    try:
        if own:
            sock = connect(port, src, timeout)
            if tls:
                sock = tls.wrap_socket(sock)
        head = "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n" % (method, path, len(body))
        if ctype:
            head += "Content-Type: %s\r\n" % ctype
        if accept:
            head += "Accept: %s\r\n" % accept
        sock.settimeout(timeout)
        try:
            sock.sendall(head.encode() + b"\r\n" + body)
        except (OSError, ConnectionError):
            pass  # the daemon may have answered early (a refusal) and closed: read it
        st, h, b = read_response(sock, deadline)
    except (OSError, ConnectionError, ValueError):
        st, h, b = 0, {}, b""
    if st == 0 or h.get("connection", "").lower() == "close":
        try:
            sock.close()
        except (OSError, AttributeError):
            pass
        sock = None
    return st, h, b, sock


def npy(arr):
    f = io.BytesIO()
    np.save(f, np.ascontiguousarray(arr))
    return f.getvalue()


def multipart(parts):
    """parts: [(name, bytes)] -> (body, content type)."""
    boundary = "gemmdhostile%08x" % random.getrandbits(32)
    out = b""
    for name, data in parts:
        out += ("--%s\r\nContent-Disposition: form-data; name=\"%s\"; filename=\"%s.npy\"\r\n"
                "Content-Type: application/octet-stream\r\n\r\n" % (boundary, name, name)).encode()
        out += data + b"\r\n"
    out += ("--%s--\r\n" % boundary).encode()
    return out, "multipart/form-data; boundary=" + boundary


# ---------------------------------------------------------------------------- honest clients

NPT = {"float32": np.float32, "float64": np.float64, "int32": np.int32}


def product_case(rng, i, max_dim):
    """The i-th small product of a well-behaved client: float32, float64 and int32 in turn,
    each in JSON, raw and .npy, m, k and n drawn from 1..max_dim. Returns (path, body,
    content type, accept, check): check(answer) says whether the answer's C is right, against
    NumPy in float64 (int32: in int64, wrapped to 32 bits)."""
    dtype = ("float32", "float64", "int32")[i % 3]
    fmt = (i // 3) % 3
    m, k, n = (int(x) for x in rng.integers(1, max_dim + 1, size=3))
    if dtype == "int32":
        a = rng.integers(-1000, 1000, size=(m, k)).astype(np.int32)
        b = rng.integers(-1000, 1000, size=(k, n)).astype(np.int32)
        ref = ((a.astype(np.int64) @ b.astype(np.int64) + 2**31) % 2**32) - 2**31
    else:
        a = rng.uniform(-1, 1, size=(m, k)).astype(NPT[dtype])
        b = rng.uniform(-1, 1, size=(k, n)).astype(NPT[dtype])
        ref = a.astype(np.float64) @ b.astype(np.float64)
    tol = 0 if dtype == "int32" else (1e-5 if dtype == "float32" else 1e-12) * k + 1e-6
    if fmt == 0:
        req = ("/v1/matmul", json.dumps({"a": a.tolist(), "b": b.tolist(), "dtype": dtype}).encode(),
               "application/json", "application/json")
    elif fmt == 1:
        req = ("/v1/matmul?m=%d&k=%d&n=%d&dtype=%s" % (m, k, n, dtype), a.tobytes() + b.tobytes(),
               "application/octet-stream", "application/octet-stream")
    else:
        req = ("/v1/matmul",) + multipart([("a", npy(a)), ("b", npy(b))]) + ("application/x-npy",)

    def check(answer):
        try:
            if fmt == 0:
                c = np.array(json.loads(answer)["c"], dtype=np.float64)
            elif fmt == 1:
                c = np.frombuffer(answer, dtype=NPT[dtype]).reshape(m, n)
            else:
                c = np.load(io.BytesIO(answer), allow_pickle=False)
        except (ValueError, KeyError, TypeError):
            return False
        return c.shape == ref.shape and bool(np.all(np.abs(c.astype(np.float64) - ref) <= tol))
    return req + (check,)


class GoodClient(Worker):
    """A well-behaved client: small products (product_case) one after another on a
    keep-alive connection, each checked. A 503 is retried after its Retry-After and counted."""

    def __init__(self, port, src, seed=1, max_dim=47):
        super().__init__("good-client")
        self.port, self.src = port, src
        self.rng = np.random.default_rng(seed)
        self.max_dim = max_dim
        self.latencies = []   # seconds of answered products (200)
        self.ok = self.wrong = self.refused = self.failed = 0
        self.retried = 0
        self.notes = []

    def one(self, i, sock):
        path, body, ctype, accept, check = product_case(self.rng, i, self.max_dim)
        args = ("POST", path, body, ctype, accept)
        t0 = time.monotonic()
        reused = sock is not None
        st, h, rb, sock = request(self.port, self.src, *args, timeout=30, sock=sock)
        if st == 0 and reused:
            # A kept-alive connection the daemon closed while idle (header_timeout): like
            # curl, send again once on a fresh one.
            self.retried += 1
            st, h, rb, sock = request(self.port, self.src, *args, timeout=30, sock=None)
        dt = time.monotonic() - t0
        if st == 503:
            self.refused += 1
            try:
                wait = float(h.get("retry-after", "1"))
            except ValueError:
                wait = 1.0
            self.halt.wait(min(wait, 5.0))
            return sock
        if st != 200:
            self.failed += 1
            if len(self.notes) < 5:
                self.notes.append("HTTP %d %s" % (st, rb[:200]))
            return sock
        if check(rb):
            self.ok += 1
            self.latencies.append(dt)
        else:
            self.wrong += 1
            if len(self.notes) < 5:
                self.notes.append("wrong answer to %s %s" % (ctype, path))
        return sock

    def body(self):
        sock = None
        i = 0
        while not self.halt.is_set():
            sock = self.one(i, sock)
            i += 1
        if sock:
            sock.close()

    def summary(self):
        lat = self.latencies
        return {"ok": self.ok, "wrong": self.wrong, "refused": self.refused, "failed": self.failed,
                "p50_ms": percentile(lat, 50) * 1e3, "p99_ms": percentile(lat, 99) * 1e3,
                "max_ms": (max(lat) * 1e3) if lat else float("nan"), "latencies": list(lat)}

    def take(self):
        """The summary since the last take(), and a fresh start."""
        out = self.summary()
        self.latencies = []
        self.ok = self.wrong = self.refused = self.failed = 0
        return out


def _probe_main(port, src, every, timeout, path_out, stop_fd, tls, paths):
    """The probe process: one line per probe, "path status seconds"."""
    import select
    ctx = tls_client() if tls else None
    with open(path_out, "a", buffering=1) as out:
        i = 0
        while True:
            path = paths[i % len(paths)]
            t0 = time.monotonic()
            st, _h, b, sock = request(port, src, "GET", path, timeout=timeout, tls=ctx)
            dt = time.monotonic() - t0
            if sock:
                sock.close()
            out.write("%s %d %.6f\n" % (path, st, dt))
            i += 1
            r, _w, _x = select.select([stop_fd], [], [], every)
            if r:
                return


class Probe:
    """/healthz and /readyz every `every` seconds, each on a fresh connection (the worst
    case: it must be accepted while the floods hold connections), from a process of its
    own so that the test's other threads cannot delay it. Latency = connect to the last
    byte of the answer (over TLS with tls=True: the handshake included). A probe that got
    no answer counts as `timeout` seconds."""

    def __init__(self, port, src, every=0.05, timeout=5.0, tls=False, paths=("/healthz", "/readyz")):
        import multiprocessing
        import tempfile
        self.port, self.src, self.every, self.timeout = port, src, every, timeout
        fd, self.path = tempfile.mkstemp(prefix="gemmd-probe-")
        os.close(fd)
        self.offset = 0
        self.rfd, self.wfd = os.pipe()
        ctx = multiprocessing.get_context("fork")
        self.proc = ctx.Process(target=_probe_main, args=(port, src, every, timeout, self.path, self.rfd, tls,
                                                          tuple(paths)), daemon=True)
        self.lat = []
        self.bad = []
        self.bad_all = []
        self.error = None

    def start(self):
        self.proc.start()

    def stop(self, wait=30):
        if self.proc.is_alive():
            os.write(self.wfd, b"x")
            self.proc.join(timeout=wait)
            if self.proc.is_alive():
                self.proc.kill()
        self.collect()
        for fd in (self.rfd, self.wfd):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def collect(self):
        try:
            with open(self.path) as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        cut = data.rfind("\n") + 1
        self.offset += len(data[:cut].encode())
        for line in data[:cut].splitlines():
            path, st, dt = line.split()
            st, dt = int(st), float(dt)
            good = st == 200 or (st == 503 and path == "/readyz")
            self.lat.append(dt if st else self.timeout)
            if not good:
                self.bad.append((path, st, round(dt, 3)))

    def all_latencies(self):
        self.collect()
        return list(self.lat)

    def take(self):
        """(latencies, failed probes) since the last take(), and a fresh start."""
        self.collect()
        out = (self.lat, len(self.bad))
        self.bad_all += self.bad
        self.lat, self.bad = [], []
        return out


class Monitor(Worker):
    """Samples the daemon's VmRSS, VmHWM, VmSize and open fds every `every` seconds."""

    def __init__(self, pid, every=0.1):
        super().__init__("monitor")
        self.pid, self.every = pid, every
        self.rss_kb = []
        self.hwm_kb = 0
        self.max_fds = 0
        self.phase_max = self.phase_vm = 0
        self.parts_at_max = {}  # RssAnon / RssFile / RssShmem when RSS was largest

    def sample(self):
        st = proc_status(self.pid)
        if st:
            self.rss_kb.append(st.get("VmRSS", 0))
            self.hwm_kb = max(self.hwm_kb, st.get("VmHWM", 0))
            if st.get("VmRSS", 0) > max(self.rss_kb[:-1] or [0]):
                self.parts_at_max = {k: st.get(k, 0) for k in ("RssAnon", "RssFile", "RssShmem")}
            self.phase_max = max(self.phase_max, st.get("VmRSS", 0))
            self.phase_vm = max(self.phase_vm, st.get("VmSize", 0))
        self.max_fds = max(self.max_fds, fd_count(self.pid))

    def take(self):
        """(largest RSS since the last take(), VmHWM so far, largest VmSize since the last
        take()) in kB."""
        self.sample()
        out = (self.phase_max, self.hwm_kb, self.phase_vm)
        self.phase_max = self.phase_vm = 0
        return out

    def body(self):
        while not self.halt.is_set():
            self.sample()
            self.halt.wait(self.every)
        self.sample()


# ---------------------------------------------------------------------------- attacks

class SocketFlood(Worker):
    """Keeps `per_ip` connections open from each source address, sending `send(i, n)`
    bytes every `interval` seconds on each (None: nothing). A connection the daemon closes
    is opened again after `reopen` seconds. Counts: opened, closed by the daemon, answers
    seen (by status)."""

    def __init__(self, name, port, sources, per_ip, interval=1.0, first=b"", drip=None, reopen=0.2,
                 max_open=None):
        super().__init__(name)
        self.port, self.sources, self.per_ip = port, list(sources), per_ip
        self.interval, self.first, self.drip, self.reopen = interval, first, drip, reopen
        self.max_open = max_open
        self.opened = self.closed_by_server = self.connect_failed = 0
        self.statuses = {}
        self.lifetimes = []   # seconds from open to the daemon's close
        self.peak_open = 0

    def body(self):
        sel = selectors.DefaultSelector()
        conns = {}  # sock -> [src, t_open, sent, rx]
        pending = []  # (time, src) to reopen

        def open_one(src):
            try:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((src, 0))
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", self.port))
            except OSError:
                self.connect_failed += 1
                pending.append((time.monotonic() + 1.0, src))
                return
            conns[s] = [src, time.monotonic(), 0, b""]
            sel.register(s, selectors.EVENT_READ)
            self.opened += 1
            if self.first:
                try:
                    s.send(self.first)
                except OSError:
                    pass

        for src in self.sources:
            for _ in range(self.per_ip):
                if self.halt.is_set():
                    break
                open_one(src)
        next_drip = time.monotonic() + self.interval
        while not self.halt.is_set():
            self.peak_open = max(self.peak_open, len(conns))
            for key, _ev in sel.select(timeout=0.05):
                s = key.fileobj
                info = conns.get(s)
                try:
                    data = s.recv(65536)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if data:
                    info[3] += data
                    continue
                # closed by the daemon: note what it said first
                self.closed_by_server += 1
                self.lifetimes.append(time.monotonic() - info[1])
                st = 0
                if info[3].startswith(b"HTTP/1."):
                    try:
                        st = int(info[3].split()[1])
                    except (IndexError, ValueError):
                        st = -1
                self.statuses[st] = self.statuses.get(st, 0) + 1
                sel.unregister(s)
                s.close()
                del conns[s]
                pending.append((time.monotonic() + self.reopen, info[0]))
            now = time.monotonic()
            due = [p for p in pending if p[0] <= now]
            pending[:] = [p for p in pending if p[0] > now]
            for _t, src in due:
                if self.max_open is None or len(conns) < self.max_open:
                    open_one(src)
            if self.drip and now >= next_drip:
                next_drip = now + self.interval
                for s, info in list(conns.items()):
                    b = self.drip(info[2])
                    if b:
                        try:
                            s.send(b)
                            info[2] += 1
                        except OSError:
                            pass
        for s in list(conns):
            sel.unregister(s)
            s.close()
        sel.close()


def slowloris(port, sources, per_ip=60):
    """Request heads sent one byte a second, never finished."""
    head = b"POST /v1/matmul?m=4&k=4&n=4 HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
    filler = b"X-Slow: " + b"a" * 10000

    def drip(i):
        return (head + filler)[i:i + 1]
    return SocketFlood("slowloris", port, sources, per_ip, interval=1.0, drip=drip)


def idle_flood(port, sources, per_ip):
    """Connections that send nothing at all."""
    return SocketFlood("idle-flood", port, sources, per_ip, interval=1.0)


def giant_declared(port, sources, per_ip, declared_mb=256, kind="raw"):
    """Heads that declare a body of declared_mb (raw: m x k x n float32 adding up to it;
    npy: a form whose first part's .npy header announces half of it), then 20 bytes of it,
    then nothing."""
    elems = declared_mb * 1024 * 1024 // 4 // 2
    side = int(elems ** 0.5)
    if kind == "raw":
        total = 2 * side * side * 4
        first = ("POST /v1/matmul?m=%d&k=%d&n=%d&dtype=float32 HTTP/1.1\r\nHost: x\r\n"
                 "Content-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n"
                 % (side, side, side, total)).encode() + b"\0" * 20
    else:
        hdr = npy(np.zeros((1, 1), np.float32))
        hdr = hdr[:hdr.index(b"(")] + ("(%d, %d), }" % (side, side)).encode()
        pad = 64 - (len(hdr) + 1) % 64
        hdr = hdr + b" " * pad + b"\n"
        hdr = hdr[:8] + (len(hdr) - 10).to_bytes(2, "little") + hdr[10:]
        boundary = "gemmdgiant"
        part = ("--%s\r\nContent-Disposition: form-data; name=\"a\"; filename=\"a.npy\"\r\n\r\n"
                % boundary).encode() + hdr
        total = declared_mb << 20  # exactly as declared: A's part fits, B's never comes
        first = ("POST /v1/matmul HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=%s\r\n"
                 "Content-Length: %d\r\n\r\n" % (boundary, total)).encode() + part + b"\0" * 20
    return SocketFlood("giant-" + kind, port, sources, per_ip, interval=1.0, first=first)


class BigJson(Worker):
    """`clients` threads posting valid JSON products of about `mb` MiB each, one after
    another. Counts answers by status and the wrong ones."""

    def __init__(self, port, sources, clients=4, mb=8):
        super().__init__("big-json")
        self.port, self.sources, self.clients = port, list(sources), clients
        n = 1
        while (2 * n * n * 11) < mb * 1024 * 1024:
            n += 16
        self.n = n
        rng = np.random.default_rng(42)
        self.a = rng.integers(-9, 9, size=(n, n)).astype(np.float64) / 8.0
        self.body_bytes = json.dumps({"a": self.a.tolist(), "b": self.a.tolist(), "dtype": "float64"}).encode()
        self.ref = self.a @ self.a
        self.statuses = {}
        self.wrong = 0
        self.lock = threading.Lock()

    def client(self, idx):
        src = self.sources[idx % len(self.sources)]
        while not self.halt.is_set():
            st, h, b, sock = request(self.port, src, "POST", "/v1/matmul", self.body_bytes, "application/json",
                                     accept="application/octet-stream", timeout=60)
            if sock:
                sock.close()
            with self.lock:
                self.statuses[st] = self.statuses.get(st, 0) + 1
                if st == 200:
                    c = np.frombuffer(b, dtype=np.float64)
                    if c.size != self.n * self.n or not np.allclose(c.reshape(self.n, self.n), self.ref):
                        self.wrong += 1
            if st == 503:
                try:
                    self.halt.wait(min(float(h.get("retry-after", "1")), 2.0))
                except ValueError:
                    self.halt.wait(1.0)

    def body(self):
        ts = [threading.Thread(target=self.client, args=(i,), daemon=True) for i in range(self.clients)]
        for t in ts:
            t.start()
        self.halt.wait()
        for t in ts:
            t.join(timeout=70)


class NonReader(Worker):
    """`count` connections that each ask for the JSON answer of an n x n float64 product
    (raw body) and never read it. Reconnects when the daemon drops one."""

    def __init__(self, port, sources, count=50, n=1000, fmt="json"):
        super().__init__("non-reader")
        self.port, self.sources, self.count, self.n, self.fmt = port, list(sources), count, n, fmt
        a = np.ones((n, 1), np.float64) / 3.0
        b = np.ones((1, n), np.float64) / 7.0
        body = a.tobytes() + b.tobytes()
        accept = "application/json" if fmt == "json" else "application/octet-stream"
        self.req = ("POST /v1/matmul?m=%d&k=1&n=%d&dtype=float64 HTTP/1.1\r\nHost: x\r\n"
                    "Content-Type: application/octet-stream\r\nAccept: %s\r\n"
                    "Content-Length: %d\r\n\r\n" % (n, n, accept, len(body))).encode() + body
        self.sent = self.dropped = self.answered_503 = 0
        self.lifetimes = []
        self.survivor_ages = []

    def body(self):
        live = []  # (sock, t_open)
        i = 0
        while not self.halt.is_set():
            while len(live) < self.count and not self.halt.is_set():
                src = self.sources[i % len(self.sources)]
                i += 1
                try:
                    s = connect(self.port, src, 5)
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                    s.sendall(self.req)
                    s.setblocking(False)
                    live.append((s, time.monotonic()))
                    self.sent += 1
                except OSError:
                    self.halt.wait(0.2)
                    break
            # look (without reading the answer) whether the daemon dropped any: a socket
            # it reset or closed leaves TCP state ESTABLISHED (1)
            keep = []
            for s, t in live:
                try:
                    state = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]
                except OSError:
                    state = 0
                if state == 1:
                    keep.append((s, t))
                    continue
                try:
                    if s.recv(12, socket.MSG_PEEK) == b"HTTP/1.1 503":
                        self.answered_503 += 1
                except OSError:
                    pass
                self.dropped += 1
                self.lifetimes.append(time.monotonic() - t)
                s.close()
            live = keep
            self.halt.wait(0.2)
        now = time.monotonic()
        self.survivor_ages = [now - t for _s, t in live]  # still held when the attack stopped
        for s, _t in live:
            s.close()


def chunked_json_prefix(kb):
    """The first `kb` KiB of a JSON product's body, in chunks (a never-ending A)."""
    row = b"[" + b",".join(b"0.%03d" % (i % 1000) for i in range(256)) + b"]"
    body = b'{"a":[' + b",".join([row] * max(1, kb * 1024 // (len(row) + 1)))
    out, step = b"", 16384
    for i in range(0, len(body), step):
        piece = body[i:i + step]
        out += b"%x\r\n" % len(piece) + piece + b"\r\n"
    return out


class ChunkedStall(Worker):
    """`count` connections that each post a JSON product with Transfer-Encoding: chunked,
    send `kb` KiB of it (spread over about `spread` seconds, all connections in turn, so
    that the daemon decodes it as it comes rather than in one burst) and then nothing: what
    the daemon decoded of each stays held until the connection goes. One the daemon drops
    is opened again. At stop all of them close, which is when the daemon gives everything
    back."""

    def __init__(self, port, sources, count=100, kb=1024, spread=3.0):
        super().__init__("chunked-stall")
        self.port, self.sources, self.count, self.spread = port, list(sources), count, spread
        self.first = (b"POST /v1/matmul HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Transfer-Encoding: chunked\r\n\r\n") + chunked_json_prefix(kb)
        self.sent = self.dropped = 0
        self.held_peak = 0

    def body(self):
        live = {}  # socket -> bytes of self.first sent
        i = 0
        step = 65536
        pause = self.spread / max(1, len(self.first) // step)
        while not self.halt.is_set():
            while len(live) < self.count and not self.halt.is_set():
                try:
                    s = connect(self.port, self.sources[i % len(self.sources)], 10)
                except OSError:
                    self.halt.wait(0.2)
                    break
                live[s] = 0
                self.sent += 1
                i += 1
            self.held_peak = max(self.held_peak, len(live))
            for s, off in list(live.items()):
                try:
                    state = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]
                    if state == 1 and off < len(self.first):
                        # never blocks: a request waiting for memory is not read (its client
                        # sees TCP's back-pressure), and must not hold up the others
                        live[s] = off + s.send(self.first[off:off + step], socket.MSG_DONTWAIT)
                except BlockingIOError:
                    state = 1
                except OSError:
                    state = 0
                if state != 1:
                    self.dropped += 1
                    s.close()
                    del live[s]
            self.halt.wait(pause)
        for s in live:
            s.close()


# ---------------------------------------------------------------------------- TLS

def make_cert(directory):
    """A self-signed certificate and key for 127.0.0.1, made with the openssl command:
    (cert path, key path), or (None, why) when it cannot be made."""
    cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    try:
        g = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out",
                            cert, "-days", "2", "-subj", "/CN=127.0.0.1"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
    except OSError as e:
        return None, "no openssl command: %s" % e
    if g.returncode != 0:
        return None, "openssl could not make a certificate: %s" % g.stderr.decode()[-300:]
    return cert, key


def tls_client():
    """A client context that takes any certificate (the tests' own, self-signed)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


# A TLS record header announcing a 512-byte handshake message, of which nothing follows: a
# handshake that has begun and stalls.
STALLED_HELLO = b"\x16\x03\x01\x02\x00"


def tls_pending(port, sources, per_ip, first=STALLED_HELLO, reopen=0.05):
    """Connections to an HTTPS port that begin a handshake and never finish it; reopened
    as soon as the daemon closes them."""
    return SocketFlood("tls-pending", port, sources, per_ip, interval=1.0, first=first, reopen=reopen)
