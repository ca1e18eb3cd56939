"""harness.py - shared helpers for the end-to-end tests.

Each test program starts the real daemon ($GEMMD_BIN, default bin/gemmd) on a free
loopback port with a temporary config file, drives it with curl the way users do, and
prints TAP. Only the standard library and NumPy are used (run with /usr/bin/python3).

    from harness import Tap, Daemon
    tap = Tap()
    with Daemon(tap, config={"backend": "cpu"}) as d:
        r = d.curl("GET", "/healthz")
        tap.ok(r.status == 200, "healthz answers 200", r)
    tap.done()

Every wait is bounded: curl always runs with --max-time, start-up and shutdown have
deadlines, and a daemon that does not stop on SIGTERM is killed (and reported).
"""

import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GEMMD_BIN = os.environ.get("GEMMD_BIN", "bin/gemmd")
if not os.path.isabs(GEMMD_BIN):
    GEMMD_BIN = os.path.join(REPO, GEMMD_BIN)

# Sanitizer builds are several times slower: scale the deadlines (not the assertions).
SLOW = 3.0 if ("build-san" in GEMMD_BIN or os.environ.get("SAN") == "1") else 1.0
START_TIMEOUT = 30 * SLOW
STOP_TIMEOUT = 20 * SLOW
CURL_MAX_TIME = 60 * SLOW


# ---------------------------------------------------------------------------- TAP

class Tap:
    """TAP output: ok / not ok / skip, numbered, with the plan printed at the end."""

    def __init__(self):
        self.n = 0
        self.failed = 0
        self.daemons = []  # whose stderr is dumped when a test fails
        self.lock = threading.Lock()
        sys.stdout.reconfigure(line_buffering=True)

    def ok(self, cond, name, diag=None):
        with self.lock:
            self.n += 1
            if cond:
                print("ok %d - %s" % (self.n, name))
            else:
                self.failed += 1
                print("not ok %d - %s" % (self.n, name))
                if diag is not None:
                    self.diag(diag)
        return bool(cond)

    def skip(self, name, reason):
        with self.lock:
            self.n += 1
            print("ok %d - %s # SKIP %s" % (self.n, name, reason))

    def diag(self, what):
        text = what if isinstance(what, str) else repr(what)
        for line in text.splitlines() or [""]:
            print("#   " + line)

    def eq(self, got, want, name):
        return self.ok(got == want, name, "got  %r\nwant %r" % (got, want))

    def done(self):
        if self.failed:
            for d in self.daemons:
                d.dump_log()
        print("1..%d" % self.n)
        if self.failed:
            print("# %d of %d failed" % (self.failed, self.n))
        sys.exit(1 if self.failed else 0)


def run_guarded(tap, main):
    """Runs main(tap); an exception becomes a failing test (with the traceback)."""
    import traceback
    try:
        main(tap)
    except Exception:  # noqa: BLE001 - reported as a test failure
        tap.ok(False, "test program raised", traceback.format_exc())
    finally:
        for d in list(tap.daemons):
            d.kill_if_running()
    tap.done()


# ---------------------------------------------------------------------------- HTTP

class Response:
    def __init__(self, status, headers, body, err=""):
        self.status = status      # int; 0 when curl got no HTTP answer
        self.headers = headers    # lower-case name -> last value
        self.body = body          # bytes
        self.err = err            # curl's stderr

    def header(self, name, default=None):
        return self.headers.get(name.lower(), default)

    def json(self):
        try:
            return json.loads(self.body.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            return None

    def error(self):
        """(code, message) of a JSON error answer, or (None, None)."""
        j = self.json()
        if isinstance(j, dict) and isinstance(j.get("error"), dict):
            return j["error"].get("code"), j["error"].get("message")
        return None, None

    def __repr__(self):
        body = self.body[:600]
        try:
            body = body.decode("utf-8")
        except UnicodeDecodeError:
            body = repr(body)
        return "HTTP %s headers=%r body=%s%s" % (self.status, self.headers, body,
                                                 (" curl: " + self.err.strip()) if self.err else "")


def parse_headers(raw):
    """Headers of the last response in a curl -D dump (after any 100 Continue)."""
    blocks = [b for b in raw.replace(b"\r\n", b"\n").split(b"\n\n") if b.strip()]
    if not blocks:
        return {}
    out = {}
    for line in blocks[-1].split(b"\n")[1:]:
        if b":" in line:
            k, v = line.split(b":", 1)
            out[k.decode("latin-1").strip().lower()] = v.decode("latin-1").strip()
    return out


def free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ---------------------------------------------------------------------------- daemon

class Daemon:
    """The real gemmd on a free loopback port.

    config: dict written to a temporary config file (passed with --config);
    flags: extra command-line arguments; env: extra environment variables.
    The port is passed as --port unless port_in is "config" or "env" (tests of
    precedence) or None (the caller's flags/config carry it)."""

    def __init__(self, tap, config=None, flags=None, env=None, port_in="flag", wait=True,
                 check_exit=True):
        self.tap = tap
        self.port = free_port()
        self.base = "http://127.0.0.1:%d" % self.port
        self.tmp = tempfile.TemporaryDirectory(prefix="gemmd-e2e-")
        self.check_exit = check_exit
        cfg = {"backend": "cpu", "log_level": "info"}
        cfg.update(config or {})
        if port_in == "config":
            cfg["port"] = str(self.port)
        self.config_path = os.path.join(self.tmp.name, "gemmd.conf")
        with open(self.config_path, "w") as f:
            f.write("# written by tests/e2e/harness.py\n")
            for k, v in cfg.items():
                f.write("%s = %s\n" % (k, v))
        self.args = [GEMMD_BIN, "--config", self.config_path]
        if port_in == "flag":
            self.args += ["--port", str(self.port)]
        self.args += list(flags or [])
        self.env = dict(os.environ)
        for k in list(self.env):
            if k.startswith("GEMMD_") and k not in ("GEMMD_BIN", "GEMMD_BUILD"):
                del self.env[k]
        if port_in == "env":
            self.env["GEMMD_PORT"] = str(self.port)
        self.env.update(env or {})
        self.log_path = os.path.join(self.tmp.name, "stderr.log")
        self.proc = None
        self.exit_code = None
        self.dumped = False
        self.saved_log = None  # the log, kept once the temp dir is gone
        tap.daemons.append(self)
        self.start(wait)

    def start(self, wait=True):
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.args, cwd=REPO, env=self.env, stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        if wait:
            self.wait_healthy()

    def wait_healthy(self):
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("gemmd exited with %d during start-up:\n%s"
                                   % (self.proc.returncode, self.read_log()))
            r = self.curl("GET", "/healthz", max_time=2)
            if r.status == 200:
                return
            time.sleep(0.05)
        raise RuntimeError("gemmd did not answer /healthz within %ds:\n%s"
                           % (START_TIMEOUT, self.read_log()))

    def read_log(self):
        if self.saved_log is not None:
            return self.saved_log
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def dump_log(self):
        if self.dumped:
            return
        self.dumped = True
        print("# ---- gemmd stderr (%s) ----" % " ".join(self.args[1:]))
        log = self.read_log().splitlines()
        if len(log) > 200:
            print("# ... %d earlier lines left out" % (len(log) - 200))
            log = log[-200:]
        for line in log:
            print("#   " + line)

    def stop(self, timeout=None):
        """SIGTERM, wait (bounded); returns the exit code (None if it had to be killed)."""
        if self.proc is None:
            return self.exit_code
        timeout = STOP_TIMEOUT if timeout is None else timeout
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.exit_code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.exit_code = None
        self.proc = None
        self.log.close()
        return self.exit_code

    def sanitizer_report(self):
        """The first lines of an ASan/LSan/UBSan report in the daemon's log, or ''."""
        log = self.read_log()
        for marker in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"):
            i = log.find(marker)
            if i >= 0:
                return log[max(0, i - 200):i + 3000]
        return ""

    def stop_and_check(self, name="daemon exits 0 on SIGTERM"):
        rc = self.stop()
        ok = self.tap.ok(rc == 0, name, "exit code %r (None: still running after %ds, killed)"
                         % (rc, STOP_TIMEOUT))
        san = self.sanitizer_report()
        ok = self.tap.ok(not san, "no sanitizer report in the daemon's log", san) and ok
        if not ok:
            self.dump_log()
        return ok

    def kill_if_running(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if self.proc is not None:
            self.log.close()
            self.proc = None

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        if et is None and self.check_exit:
            self.stop_and_check()
        else:
            self.kill_if_running()
        self.cleanup()
        return False

    def cleanup(self):
        """Removes the temp dir (config, bodies, log), keeping the log text for dump_log."""
        self.saved_log = self.read_log()
        self.tmp.cleanup()

    # ---- requests

    def curl(self, method, path, data=None, headers=None, form=None, max_time=None,
             extra=None, accept=None, content_type=None):
        return curl(self.base, method, path, data=data, headers=headers, form=form,
                    max_time=max_time, extra=extra, accept=accept, content_type=content_type,
                    tmpdir=self.tmp.name)

    def matmul_json(self, a, b, dtype=None, accept=None, path="/v1/matmul", **extra_fields):
        body = {"a": np.asarray(a).tolist(), "b": np.asarray(b).tolist()}
        if dtype:
            body["dtype"] = dtype
        body.update(extra_fields)
        return self.curl("POST", path, data=json.dumps(body).encode(),
                         content_type="application/json", accept=accept)

    def matmul_raw(self, a, b, dtype, accept=None, path="/v1/matmul", query=""):
        a = np.ascontiguousarray(a, dtype=np_dtype(dtype))
        b = np.ascontiguousarray(b, dtype=np_dtype(dtype))
        q = "?m=%d&k=%d&n=%d&dtype=%s%s" % (a.shape[0], a.shape[1], b.shape[1], dtype, query)
        return self.curl("POST", path + q, data=a.astype("<" + a.dtype.str[1:]).tobytes() +
                         b.astype("<" + b.dtype.str[1:]).tobytes(),
                         content_type="application/octet-stream", accept=accept)

    def matmul_npy(self, a_bytes, b_bytes, accept=None, path="/v1/matmul"):
        # files of its own: clients of one daemon may send at once
        pa = _tmpname(self.tmp.name, "A") + ".npy"
        pb = _tmpname(self.tmp.name, "B") + ".npy"
        with open(pa, "wb") as f:
            f.write(a_bytes)
        with open(pb, "wb") as f:
            f.write(b_bytes)
        try:
            return self.curl("POST", path, form=["a=@" + pa, "b=@" + pb], accept=accept)
        finally:
            os.unlink(pa)
            os.unlink(pb)

    def metrics(self):
        r = self.curl("GET", "/metrics")
        return r, parse_metrics(r.body.decode("utf-8", "replace")) if r.status == 200 else None


_counter = [0]
_counter_lock = threading.Lock()


def _tmpname(tmpdir, stem):
    with _counter_lock:
        _counter[0] += 1
        n = _counter[0]
    return os.path.join(tmpdir, "%s.%d.%d" % (stem, os.getpid(), n))


def curl(base, method, path, data=None, headers=None, form=None, max_time=None, extra=None,
         accept=None, content_type=None, tmpdir=None):
    """One request with the curl command line; returns a Response (status 0: no answer)."""
    tmpdir = tmpdir or tempfile.gettempdir()
    body_path = _tmpname(tmpdir, "body")
    hdr_path = _tmpname(tmpdir, "hdr")
    cmd = ["curl", "-sS", "-g", "-o", body_path, "-D", hdr_path, "-w", "%{http_code}",
           "--max-time", str(max_time or CURL_MAX_TIME), "-X", method,
           "-H", "Expect:"]  # no 100-continue round trip unless a test asks for it
    data_path = None
    if data is not None:
        data_path = _tmpname(tmpdir, "data")
        with open(data_path, "wb") as f:
            f.write(data)
        cmd += ["--data-binary", "@" + data_path]
    for f in form or []:
        cmd += ["-F", f]
    if content_type:
        cmd += ["-H", "Content-Type: " + content_type]
    if accept:
        cmd += ["-H", "Accept: " + accept]
    for h in headers or []:
        cmd += ["-H", h]
    cmd += list(extra or [])
    cmd.append(base + path)
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=(max_time or CURL_MAX_TIME) + 10)
        code = p.stdout.decode().strip()
        status = int(code) if code.isdigit() else 0
        err = p.stderr.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        status, err = 0, "curl did not finish"
    body, hdrs = b"", {}
    try:
        with open(body_path, "rb") as f:
            body = f.read()
    except OSError:
        pass
    try:
        with open(hdr_path, "rb") as f:
            hdrs = parse_headers(f.read())
    except OSError:
        pass
    for pth in (body_path, hdr_path, data_path):
        if pth:
            try:
                os.unlink(pth)
            except OSError:
                pass
    return Response(status, hdrs, body, err)


# ---------------------------------------------------------------------------- raw sockets

def raw_request(port, head, body=b"", read_timeout=10.0, close_after_send=False, shut_wr=False):
    """Sends bytes on a plain socket and reads the answer until the server closes or the
    timeout passes. Returns (status, headers, body, raw) with status 0 when no answer."""
    s = socket.create_connection(("127.0.0.1", port), timeout=read_timeout)
    try:
        s.sendall(head + body)
        if close_after_send:
            return 0, {}, b"", b""
        if shut_wr:
            s.shutdown(socket.SHUT_WR)
        return read_response(s, read_timeout)
    finally:
        s.close()


def read_response(s, read_timeout=10.0):
    """Reads one answer from socket s until its Content-Length is in, the server closes or
    the timeout passes. Returns (status, headers, body, raw) with status 0 when no answer."""
    raw = b""
    deadline = time.monotonic() + read_timeout
    while time.monotonic() < deadline:
        try:
            chunk = s.recv(65536)
        except (socket.timeout, ConnectionResetError):
            break
        if not chunk:
            break
        raw += chunk
        st, h, b = _split_response(raw)
        if st and "content-length" in h and len(b) >= int(h["content-length"]):
            break
    st, h, b = _split_response(raw)
    return st, h, b, raw


def _split_response(raw):
    if b"\r\n\r\n" not in raw:
        return 0, {}, b""
    head, body = raw.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    try:
        status = int(lines[0].split()[1])
    except (IndexError, ValueError):
        return 0, {}, b""
    hdrs = {}
    for line in lines[1:]:
        if b":" in line:
            k, v = line.split(b":", 1)
            hdrs[k.decode("latin-1").strip().lower()] = v.decode("latin-1").strip()
    return status, hdrs, body


# ---------------------------------------------------------------------------- matrices

def np_dtype(name):
    return {"float32": np.float32, "float64": np.float64, "int32": np.int32}[name]


def raw_answer(r, m, n, dtype):
    """C of a raw binary answer (little-endian m x n), or None unless it is a 200 of exactly
    that many bytes."""
    dt = np.dtype(np_dtype(dtype)).newbyteorder("<")
    if r.status != 200 or len(r.body) != m * n * dt.itemsize:
        return None
    return np.frombuffer(r.body, dtype=dt).reshape(m, n)


def npy_bytes(arr, version=None, fortran=False):
    """arr as a .npy file (version (1,0), (2,0) or (3,0); fortran=True stores it F-ordered)."""
    arr = np.asfortranarray(arr) if fortran else np.ascontiguousarray(arr)
    f = io.BytesIO()
    if version is None:
        np.save(f, arr)
    else:
        np.lib.format.write_array(f, arr, version=version)
    return f.getvalue()


def load_npy(data):
    return np.load(io.BytesIO(data), allow_pickle=False)


def run_clients(clients, per, product, seed=0):
    """`clients` threads at once, each sending `per` products one after the other:
    product(rng, i) for i = ci * per + j, rng = np.random.default_rng(seed + ci). Returns
    the results of all of them (client by client, in order) and the exceptions raised (as
    repr; a client that raised stops)."""
    results, errors = [None] * clients, []

    def client(ci):
        rng = np.random.default_rng(seed + ci)
        out = []
        try:
            for j in range(per):
                out.append(product(rng, ci * per + j))
        except Exception as e:  # noqa: BLE001 - reported to the caller
            errors.append(repr(e))
        results[ci] = out

    threads = [threading.Thread(target=client, args=(ci,)) for ci in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [x for out in results if out for x in out], errors


def random_matrix(rng, shape, dtype):
    if dtype == "int32":
        return rng.integers(-1000, 1000, size=shape, dtype=np.int64).astype(np.int32)
    return rng.uniform(-1.0, 1.0, size=shape).astype(np_dtype(dtype))


def wrapping_matrix(rng, shape, dtype):
    """random_matrix, but int32 over its whole range, so that the sums of a product wrap."""
    if dtype == "int32":
        return rng.integers(-2**31, 2**31, size=shape, dtype=np.int64).astype(np.int32)
    return random_matrix(rng, shape, dtype)


def reference(a, b, dtype):
    """C = A.B computed independently in float64 (int32: in int64, then wrapped to 32 bits)."""
    if dtype == "int32":
        c = a.astype(np.int64) @ b.astype(np.int64)
        return ((c + 2**31) % 2**32 - 2**31).astype(np.int64)
    return a.astype(np.float64) @ b.astype(np.float64)


def tolerance(dtype, k):
    """Absolute tolerance per element for inputs in [-1, 1] and inner dimension k."""
    if dtype == "float32":
        return 1e-5 * k + 1e-6
    if dtype == "float64":
        return 1e-12 * k + 1e-14
    return 0


def compare(c, ref, dtype, k):
    """(ok, detail): shapes equal and every element within the dtype's tolerance."""
    c = np.asarray(c)
    if c.shape != ref.shape:
        return False, "shape %r, want %r" % (c.shape, ref.shape)
    if dtype == "int32":
        bad = np.argwhere(c.astype(np.int64) != ref)
    else:
        err = np.abs(c.astype(np.float64) - ref)
        bad = np.argwhere(~(err <= tolerance(dtype, k)))
    if len(bad):
        i = tuple(bad[0])
        return False, "%d elements differ; first at %r: got %r want %r" % (len(bad), i, c[i], ref[i])
    return True, ""


def parse_metrics(text):
    """Prometheus text into {(name, frozenset(labels.items())): value}; raises on a bad line."""
    import re
    out = {}
    line_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
    label_re = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')
    for line in text.splitlines():
        if not line or line.startswith("#"):
            if line.startswith("#") and not (line.startswith("# HELP ") or line.startswith("# TYPE ")):
                raise ValueError("bad comment line: %r" % line)
            continue
        m = line_re.match(line)
        if not m:
            raise ValueError("bad sample line: %r" % line)
        labels = {}
        if m.group(3):
            pos = 0
            s = m.group(3)
            while pos < len(s):
                lm = label_re.match(s, pos)
                if not lm:
                    raise ValueError("bad labels: %r" % line)
                labels[lm.group(1)] = lm.group(2)
                pos = lm.end()
        v = m.group(4)
        out[(m.group(1), frozenset(labels.items()))] = float("inf") if v == "+Inf" else float(v)
    return out


def metric(metrics, name, **labels):
    return metrics.get((name, frozenset(labels.items())), 0.0)


def short_id(jid):
    """A job id as log lines show it: its instance and the first 8 of its 32 random digits
    ("<instance_id>-8c1f02ab"); never the whole id."""
    jid = jid or ""
    return jid[:len(jid) - 32 + 8] if len(jid) >= 32 else jid[:8]


def server_timing(resp):
    """Server-Timing header as {name: dur_ms}; None when absent or malformed."""
    h = resp.header("server-timing")
    if not h:
        return None
    out = {}
    for part in h.split(","):
        fields = [x.strip() for x in part.split(";")]
        name = fields[0]
        dur = None
        for f in fields[1:]:
            if f.startswith("dur="):
                try:
                    dur = float(f[4:])
                except ValueError:
                    return None
        if not name or dur is None:
            return None
        out[name] = dur
    return out
