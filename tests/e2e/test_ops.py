#!/usr/bin/python3
"""test_ops.py - what an operator sees: /healthz, /readyz, /v1/info, /metrics (parses, and
its counters move after requests), the log format, configuration by file, GEMMD_* and flags
with the precedence visible in /v1/info, --help / --version, and bad configurations
ending the daemon with exit status 2 and a message naming the problem (a value, a control
byte in one, a file it names that cannot serve, a port already taken).
"""
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (GEMMD_BIN, REPO, SLOW, Daemon, Tap, free_port, metric,  # noqa: E402
                     run_guarded)

LOG_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z (error|warn|info|debug)\s+\S")


def find_key(obj, key):
    """First value of key anywhere in a JSON tree (None if absent)."""
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        for v in obj.values():
            f = find_key(v, key)
            if f is not None:
                return f
    elif isinstance(obj, list):
        for v in obj:
            f = find_key(v, key)
            if f is not None:
                return f
    return None


def endpoints(tap, d):
    r = d.curl("GET", "/healthz")
    tap.eq(r.status, 200, "/healthz -> 200")
    r = d.curl("GET", "/readyz")
    tap.eq(r.status, 200, "/readyz -> 200 with an idle engine")
    r = d.curl("HEAD", "/healthz", extra=["-I"])
    tap.ok(r.status in (200, 405), "HEAD /healthz answers", r)

    r = d.curl("GET", "/v1/info")
    j = r.json()
    tap.ok(r.status == 200 and isinstance(j, dict), "/v1/info -> 200 JSON", r)
    j = j or {}
    tap.ok(isinstance(j.get("version"), str) and j["version"], "/v1/info has version", j)
    backend = find_key(j, "backend")
    tap.ok(backend == "cpu", "/v1/info says the backend is cpu", j)
    tap.ok(isinstance(find_key(j, "devices"), list), "/v1/info lists devices", j)
    kernels = find_key(j, "kernels")
    tap.ok(isinstance(kernels, list) and len(kernels) >= 1, "/v1/info lists kernels", j)
    dt = find_key(j, "dtypes")
    tap.ok(isinstance(dt, list) and {"float32", "float64", "int32"} <= set(
        x if isinstance(x, str) else "" for x in dt), "/v1/info lists the dtypes", j)
    lim = j.get("limits")
    tap.ok(isinstance(lim, dict) and all(k in lim for k in ("max_dim", "max_elements")),
           "/v1/info shows limits", j)


def metrics(tap, d):
    r, m0 = d.metrics()
    tap.ok(r.status == 200 and m0 is not None, "/metrics -> 200 and parses", r)
    ct = r.header("content-type") or ""
    tap.ok(ct.startswith("text/plain") and "0.0.4" in ct, "/metrics Content-Type text/plain; version=0.0.4", ct)
    text = r.body.decode()
    for fam in ("gemmd_requests_total", "gemmd_request_duration_seconds", "gemmd_bytes_received_total",
                "gemmd_queue_depth", "gemmd_jobs_running", "gemmd_engine_jobs_total",
                "gemmd_compute_seconds_total", "gemmd_build_info"):
        tap.ok("# TYPE %s " % fam in text and "# HELP %s " % fam in text, "/metrics has HELP and TYPE for " + fam)

    before = metric(m0, "gemmd_requests_total", route="/v1/matmul", code="200")
    count0 = metric(m0, "gemmd_request_duration_seconds_count", route="/v1/matmul")
    eng0 = metric(m0, "gemmd_engine_jobs_total", result="completed")
    bytes0 = metric(m0, "gemmd_bytes_received_total")
    err0 = metric(m0, "gemmd_requests_total", route="/v1/matmul", code="422")
    a = np.ones((4, 5))
    for _ in range(3):
        r = d.matmul_json(a, a.T)
        tap.eq(r.status, 200, "product for the counters")
    d.matmul_json([[1, 2]], [[1, 2]])  # 422 shape_mismatch
    r, m1 = d.metrics()
    tap.ok(m1 is not None, "/metrics still parses", r)
    m1 = m1 or {}
    tap.eq(metric(m1, "gemmd_requests_total", route="/v1/matmul", code="200") - before, 3,
           "requests_total{/v1/matmul,200} moved by 3")
    tap.eq(metric(m1, "gemmd_requests_total", route="/v1/matmul", code="422") - err0, 1,
           "requests_total{/v1/matmul,422} moved by 1")
    tap.eq(metric(m1, "gemmd_request_duration_seconds_count", route="/v1/matmul") - count0, 4,
           "duration histogram count moved by 4")
    inf = metric(m1, "gemmd_request_duration_seconds_bucket", route="/v1/matmul", le="+Inf")
    tap.eq(inf, metric(m1, "gemmd_request_duration_seconds_count", route="/v1/matmul"), "+Inf bucket == count")
    tap.ok(metric(m1, "gemmd_engine_jobs_total", result="completed") - eng0 >= 3, "engine completed moved by >= 3")
    tap.ok(metric(m1, "gemmd_bytes_received_total") > bytes0, "bytes received moved")
    tap.ok(metric(m1, "gemmd_compute_seconds_total") > 0, "compute seconds > 0")
    tap.ok(any(name == "gemmd_build_info" for (name, _l) in m1), "build_info present")
    # buckets cumulative for every route
    bad = []
    routes = {dict(l).get("route") for (name, l) in m1 if name == "gemmd_request_duration_seconds_count"}
    for route in routes:
        bs = sorted(((float(dict(l)["le"]), v) for (name, l), v in m1.items()
                     if name == "gemmd_request_duration_seconds_bucket" and dict(l).get("route") == route))
        if any(bs[i][1] > bs[i + 1][1] for i in range(len(bs) - 1)):
            bad.append(route)
    tap.ok(not bad and routes, "histogram buckets are cumulative for every route", bad)


def log_format(tap, d):
    lines = [line for line in d.read_log().splitlines() if line.strip()]
    bad = [line for line in lines if not LOG_RE.match(line)]
    tap.ok(lines and not bad, "every log line is 'ISO-8601Z level message' (%d lines)" % len(lines), "\n".join(bad[:5]))


def log_levels(tap):
    with Daemon(tap, config={"backend": "cpu", "log_level": "warn"}) as d:
        d.matmul_json([[1]], [[2]])
        d.curl("GET", "/nope")
        lines = d.read_log().splitlines()
        tap.ok(not any(" info " in line or " debug " in line for line in lines),
               "log_level warn: no info or debug lines", "\n".join(lines[:5]))
    with Daemon(tap, config={"backend": "cpu"}, flags=["--log-level", "debug"]) as d:
        d.matmul_json([[1]], [[2]])
        lines = d.read_log().splitlines()
        bad = [line for line in lines if not LOG_RE.match(line)]
        tap.ok(any(" info " in line for line in lines) and not bad,
               "log_level debug: info lines present, every line well-formed", "\n".join(bad[:5]))


def info_limits(d):
    r = d.curl("GET", "/v1/info")
    lim = (r.json() or {}).get("limits") or {}
    return lim, r


def precedence(tap):
    cfg = {"backend": "cpu", "max_dim": 100, "max_elements": 5000}
    with Daemon(tap, config=cfg, port_in="config") as d:
        lim, r = info_limits(d)
        tap.ok(lim.get("max_dim") == 100 and lim.get("max_elements") == 5000,
               "config file sets max_dim and max_elements (and port)", r)
    with Daemon(tap, config=cfg, env={"GEMMD_MAX_DIM": "200"}, port_in="env") as d:
        lim, r = info_limits(d)
        tap.ok(lim.get("max_dim") == 200 and lim.get("max_elements") == 5000,
               "GEMMD_MAX_DIM overrides the file (and GEMMD_PORT the port)", r)
    with Daemon(tap, config=cfg, env={"GEMMD_MAX_DIM": "200"}, flags=["--max-dim", "300"]) as d:
        lim, r = info_limits(d)
        tap.ok(lim.get("max_dim") == 300 and lim.get("max_elements") == 5000, "--max-dim overrides GEMMD_MAX_DIM", r)
        # and the limit is enforced
        r = d.matmul_json(np.ones((301, 1)), np.ones((1, 1)))
        tap.ok(r.status == 413, "the configured max_dim is enforced", r)
        r = d.matmul_json(np.ones((300, 1)), np.ones((1, 1)))
        tap.ok(r.status == 200, "... and a product at exactly max_dim computes", r)
    with Daemon(tap, config=cfg, flags=["--max-dim=150", "--max-body-mb", "3"]) as d:
        lim, r = info_limits(d)
        tap.ok(lim.get("max_dim") == 150, "--max-dim=VALUE form", r)
        mb = lim.get("max_body_bytes", lim.get("max_body_mb"))
        tap.ok(mb in (3, 3 * 1024 * 1024), "--max-body-mb 3 shows in the limits", r)


def run_cli(args, env=None, timeout=30):
    e = {k: v for k, v in os.environ.items() if not k.startswith("GEMMD_")}
    e.update(env or {})
    p = subprocess.run([GEMMD_BIN] + args, cwd=REPO, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=timeout * SLOW)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def command_line(tap):
    rc, out, err = run_cli(["--help"])
    tap.ok(rc == 0 and "--port" in out and "--max-body-mb" in out and "8080" in out,
           "--help exits 0 and lists options with defaults", "rc %d\n%s%s" % (rc, out[:500], err[:500]))
    keys = ["listen", "port", "http-threads", "connection-limit", "per-ip-limit", "connection-timeout", "backend",
            "threads", "cpu-workers", "queue-depth", "devices", "streams-per-device", "device-mem-limit-mb",
            "fault-inject", "max-dim", "max-elements", "max-body-mb", "max-json-mb", "job-ttl", "job-mem-mb",
            "max-jobs", "tokens-file", "tls-cert", "tls-key", "log-level", "config"]
    missing = [k for k in keys if "--" + k not in out]
    tap.ok(not missing, "--help lists every key", missing)
    rc, out, err = run_cli(["--version"])
    tap.ok(rc == 0 and re.search(r"\d+\.\d+", out), "--version exits 0 and prints a version", out + err)

    tmp = tempfile.mkdtemp(prefix="gemmd-e2e-ops-")
    bad = os.path.join(tmp, "bad.conf")
    with open(bad, "w") as f:
        f.write("# a bad config\nport = 8080\nmax_dim = lots\n")
    cases = [
        (["--config", bad], None, [bad + ":3", "max_dim"], "bad value in the config file"),
        (["--config", os.path.join(tmp, "missing.conf")], None, ["missing.conf"], "missing config file"),
        (["--config", os.devnull, "--port", "70000"], None, ["port", "65535"], "--port out of range"),
        (["--config", os.devnull, "--backend", "quantum"], None, ["backend", "auto, cpu or cuda"], "bad backend"),
        (["--config", os.devnull, "--no-such-option", "1"], None, ["no-such-option"], "unknown option"),
        (["--config", os.devnull, "--port"], None, ["--port", "missing value"], "flag without value"),
        (["--config", os.devnull], {"GEMMD_QUEUE_DEPTH": "-3"}, ["GEMMD_QUEUE_DEPTH"], "bad GEMMD_ variable"),
        ([], {"GEMMD_CONFIG": bad}, [bad + ":3"], "bad file named by GEMMD_CONFIG"),
    ]
    with open(os.path.join(tmp, "unknown.conf"), "w") as f:
        f.write("prot = 9000\n")
    cases.append((["--config", os.path.join(tmp, "unknown.conf")], None, ["unknown.conf:1", "prot"],
                  "unknown key in the config file"))
    # control bytes in a value; files the configuration names that cannot serve; a test hook
    # the backend does not know: all refused before anything listens
    with open(os.path.join(tmp, "nul.conf"), "wb") as f:
        f.write(b"port = 80\0 80\n")
    with open(os.path.join(tmp, "empty.tokens"), "w") as f:
        f.write("# no token here\n")
    with open(os.path.join(tmp, "long.tokens"), "w") as f:
        f.write("t" * 5000 + "\n")
    port = ["--port", str(free_port()), "--backend", "cpu"]
    cases += [
        (["--config", os.path.join(tmp, "nul.conf")], None, ["nul.conf:1", "NUL"], "a NUL inside a config line"),
        (["--config", os.devnull, "--log-level", "info\x1b"], None, ["log_level", "control character"],
         "a control byte in a flag's value"),
        (["--config", os.devnull] + port, {"GEMMD_TLS_PRIORITIES": "NORMAL\t"}, ["GEMMD_TLS_PRIORITIES"],
         "a control byte in a GEMMD_ variable"),
        (["--config", os.devnull, "--tokens-file", tmp] + port, None, ["tokens_file", "directory"],
         "tokens_file naming a directory"),
        (["--config", os.devnull, "--tokens-file", os.path.join(tmp, "empty.tokens")] + port, None,
         ["empty.tokens", "no token"], "an empty tokens file"),
        (["--config", os.devnull, "--tokens-file", os.path.join(tmp, "long.tokens")] + port, None,
         ["long.tokens", "longer than"], "a tokens file with an overlong token"),
        (["--config", os.devnull, "--fault-inject", "cpu_bogus:1"] + port, None, ["fault_inject", "cpu_bogus"],
         "a fault_inject the backend does not know"),
    ]
    for args, env, needles, name in cases:
        rc, out, err = run_cli(args, env=env)
        tap.ok(rc == 2 and all(n in err for n in needles), "%s: exit 2, message names %s" % (name, needles),
               "rc %d stderr: %s" % (rc, err[:600]))
    for p in os.listdir(tmp):
        os.unlink(os.path.join(tmp, p))
    os.rmdir(tmp)

    # the port already taken: a clear error, not a hang
    with Daemon(tap, config={"backend": "cpu"}) as d:
        rc, out, err = run_cli(["--config", os.devnull, "--backend", "cpu", "--port", str(d.port)], timeout=30)
        tap.ok(rc == 2 and "port %d: another process is listening there" % d.port in err,
               "a second daemon on a taken port exits 2 and says the port is taken",
               "rc %d stderr %s" % (rc, err[-400:]))


def connections(tap):
    """connection_timeout closes idle and stalled connections; per_ip_limit caps one client, with an
    answer."""
    with Daemon(tap, config={"backend": "cpu", "connection_timeout": 1, "per_ip_limit": 3}) as d:
        idle = socket.create_connection(("127.0.0.1", d.port), timeout=15 * SLOW)
        stalled = socket.create_connection(("127.0.0.1", d.port), timeout=15 * SLOW)
        stalled.sendall(b"POST /v1/matmul?m=2&k=2&n=2&dtype=float32 HTTP/1.1\r\nHost: x\r\n"
                        b"Content-Type: application/octet-stream\r\nContent-Length: 32\r\n\r\n" + b"\0" * 10)
        for sock, what in ((idle, "an idle connection"), (stalled, "a connection stalled mid-body")):
            try:
                data = sock.recv(4096)
                closed = True
                while data:
                    data = sock.recv(4096)
            except ConnectionResetError:
                closed = True
            except socket.timeout:
                closed = False
            tap.ok(closed, "%s is closed after connection_timeout" % what)
            sock.close()
        r = d.curl("GET", "/healthz")
        tap.eq(r.status, 200, "the daemon serves after closing timed-out connections")

        held = []
        for _ in range(3):
            s = socket.create_connection(("127.0.0.1", d.port), timeout=10 * SLOW)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # headers not finished
            held.append(s)
        time.sleep(0.2)
        r = d.curl("GET", "/healthz", max_time=5)
        tap.ok(r.status == 503 and r.error()[0] == "too_many_connections_from_address" and r.error()[1]
               and r.header("connection", "").lower() == "close" and r.header("retry-after"),
               "a 4th connection from one address with per_ip_limit 3 gets 503 too_many_connections_from_address "
               "(JSON, Retry-After, Connection: close)", r)
        for s in held:
            s.close()
        ok = False
        for _ in range(50):
            r = d.curl("GET", "/healthz", max_time=5)
            if r.status == 200:
                ok = True
                break
            time.sleep(0.1)
        tap.ok(ok, "once they close, the client is served again", r)

    try:
        probe = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        probe.bind(("::1", 0))
        probe.close()
        have_v6 = True
    except OSError:
        have_v6 = False
    if have_v6:
        with Daemon(tap, config={"backend": "cpu", "listen": "::1"}, wait=False) as d:
            d.base = "http://[::1]:%d" % d.port
            d.wait_healthy()
            r = d.matmul_json([[1, 2]], [[3], [4]])
            tap.ok(r.status == 200 and (r.json() or {}).get("c") == [[11.0]], "listen = ::1 serves over IPv6", r)
    else:
        tap.skip("listen = ::1 serves over IPv6", "no IPv6 loopback on this machine")

    with Daemon(tap, config={"backend": "cpu", "listen": "0.0.0.0"}) as d:
        tap.ok(any(" warn " in line and "tokens_file" in line for line in d.read_log().splitlines()),
               "listening beyond loopback without tokens_file logs a warning", d.read_log()[-1000:])


def main(tap):
    with Daemon(tap, config={"backend": "cpu"}) as d:
        endpoints(tap, d)
        metrics(tap, d)
        log_format(tap, d)
    log_levels(tap)
    precedence(tap)
    connections(tap)
    command_line(tap)


if __name__ == "__main__":
    run_guarded(Tap(), main)
