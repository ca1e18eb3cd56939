#!/usr/bin/python3
"""test_nginx.py - three daemons behind Debian's nginx, configured by the recipe
config/nginx/gemmd.conf as shipped (only its ports changed), nginx run by this test on
loopback (no root needed: its own prefix, logs and temp folders under build/).

- products through nginx are right (NumPy), in JSON, raw and .npy, and name their daemon;
- / reaches a daemon's status page, and /status/<instance_id>/ (its v1/status too) that one's;
- a 32 MB upload and a 32 MB answer stream through (nginx stores neither in a file);
- async jobs submitted through nginx are fetched through nginx from the daemon that owns
  them (the id's instance); an id of an unknown instance is a JSON 404 from nginx;
- the load spreads over the three daemons (each one's /metrics counts products);
- one daemon is killed (SIGKILL) while it has products in flight: those fail with a JSON
  error (502), products sent after it died go to the others, no answer is ever wrong, and
  its jobs answer 502 instance_unavailable while the others' jobs are still fetched.

nginx comes from Debian (scripts/deps.sh test installs it as root); without it every
check is skipped, naming the command that installs it.
"""
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (REPO, SLOW, Daemon, Response, Tap, compare, curl, free_port, load_npy,  # noqa: E402
                     metric, npy_bytes, parse_metrics, random_matrix, raw_answer, reference, run_guarded)

RECIPE = os.path.join(REPO, "config", "nginx", "gemmd.conf")
BUILD = os.environ.get("GEMMD_BUILD", "build")
NAMES = ["gemmd-a", "gemmd-b", "gemmd-c"]
RECIPE_PORTS = ["8081", "8082", "8083"]
INSTALL = "sudo apt-get install -y nginx"


def find_nginx():
    for p in (shutil.which("nginx"), "/usr/sbin/nginx"):
        if p and os.access(p, os.X_OK):
            return p
    return None


def ensure_nginx():
    """nginx's path, installing it (scripts/deps.sh test: apt-get as root) when missing."""
    p = find_nginx()
    if p:
        return p
    subprocess.run([os.path.join(REPO, "scripts", "deps.sh"), "test"], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=900)
    return find_nginx()


def generate_config(recipe, ports, listen_port, folder):
    """The recipe with the test's ports, inside a whole nginx.conf of its own; returns
    (path, why) where why names what did not match the recipe."""
    text = recipe
    for name, port in zip(RECIPE_PORTS, ports):
        text, n = re.subn(r"(\bserver 127\.0\.0\.1:)%s\b" % name, r"\g<1>%d" % port, text)
        if n != 2:  # the balanced group and the instance's own group
            return None, "recipe: expected 2 'server 127.0.0.1:%s' lines, found %d" % (name, n)
    text, n = re.subn(r"^(\s*)listen 8080;", r"\1listen 127.0.0.1:%d;" % listen_port, text, flags=re.M)
    if n != 1:
        return None, "recipe: expected one 'listen 8080;', found %d" % n
    for name in NAMES:
        if not re.search(r"^\s*%s\s+\w+;" % re.escape(name), text, re.M):
            return None, "recipe: the instance map has no line for %s" % name
    inc = os.path.join(folder, "gemmd-recipe.conf")
    with open(inc, "w") as f:
        f.write(text)
    temp = os.path.join(folder, "temp")
    os.makedirs(temp, exist_ok=True)
    os.chmod(temp, 0o755)
    main = """# written by tests/e2e/test_nginx.py around config/nginx/gemmd.conf
daemon off;
master_process on;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{ worker_connections 512; }}
http {{
    client_body_temp_path {t}/body;
    proxy_temp_path {t}/proxy;
    fastcgi_temp_path {t}/fastcgi;
    uwsgi_temp_path {t}/uwsgi;
    scgi_temp_path {t}/scgi;
    log_format gemmd '$request_method $request_uri $status $upstream_addr $upstream_status';
    access_log {d}/access.log gemmd;
    include {inc};
}}
""".format(d=folder, t=temp, inc=inc)
    path = os.path.join(folder, "nginx.conf")
    with open(path, "w") as f:
        f.write(main)
    return path, None


class Nginx:
    def __init__(self, exe, conf, folder):
        self.exe, self.conf, self.folder = exe, conf, folder
        self.proc = None

    def args(self, *extra):
        return [self.exe, "-p", self.folder, "-c", self.conf, "-e", os.path.join(self.folder, "error.log")] + \
            list(extra)

    def test_config(self):
        p = subprocess.run(self.args("-t"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)
        return p.returncode, p.stdout.decode("utf-8", "replace")

    def start(self, port):
        self.proc = subprocess.Popen(self.args(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20 * SLOW
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            r = curl("http://127.0.0.1:%d" % port, "GET", "/healthz", max_time=2, tmpdir=self.folder)
            if r.status == 200:
                return True
            time.sleep(0.05)
        return False

    def stop(self):
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # graceful: workers finish, then exit
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        rc, self.proc = self.proc.returncode, None
        return rc

    def log(self, name):
        try:
            with open(os.path.join(self.folder, name), "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""


class Front:
    """Requests to nginx, with the harness's curl (the way users send them)."""

    def __init__(self, port, tmp):
        self.base = "http://127.0.0.1:%d" % port
        self.port = port
        self.tmp = tmp

    def curl(self, method, path, **kw):
        return curl(self.base, method, path, tmpdir=self.tmp, **kw)


def post_raw(port, a, b, dtype, timeout):
    """One raw product on a fresh connection (http.client: light enough for load on two
    cores). Returns a harness Response; status 0 when no HTTP answer came."""
    a = np.ascontiguousarray(a)
    b = np.ascontiguousarray(b)
    path = "/v1/matmul?m=%d&k=%d&n=%d&dtype=%s" % (a.shape[0], a.shape[1], b.shape[1], dtype)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body=a.tobytes() + b.tobytes(),
                     headers={"Content-Type": "application/octet-stream"})
        r = conn.getresponse()
        body = r.read()
        return Response(r.status, {k.lower(): v for k, v in r.getheaders()}, body)
    except (OSError, http.client.HTTPException) as e:
        return Response(0, {}, b"", repr(e))
    finally:
        conn.close()


def json_error(r):
    j = r.json()
    return isinstance(j, dict) and isinstance(j.get("error"), dict) and \
        isinstance(j["error"].get("code"), str) and isinstance(j["error"].get("message"), str)


# ---------------------------------------------------------------------------- checks

def products(tap, front, rng):
    wrong, named = [], set()
    for i in range(9):
        dtype = ["float32", "float64", "int32"][i % 3]
        m, k, n = (int(x) for x in rng.integers(1, 40, size=3))
        a, b = random_matrix(rng, (m, k), dtype), random_matrix(rng, (k, n), dtype)
        ref = reference(a, b, dtype)
        fmt = i // 3
        if fmt == 0:
            body = json.dumps({"a": a.tolist(), "b": b.tolist(), "dtype": dtype}).encode()
            r = front.curl("POST", "/v1/matmul", data=body, content_type="application/json")
            c = np.array((r.json() or {}).get("c", []), dtype=np.float64 if dtype != "int32" else np.int64) \
                if r.status == 200 else None
        elif fmt == 1:
            q = "?m=%d&k=%d&n=%d&dtype=%s" % (m, k, n, dtype)
            r = front.curl("POST", "/v1/matmul" + q, data=a.tobytes() + b.tobytes(),
                           content_type="application/octet-stream")
            c = raw_answer(r, m, n, dtype)
        else:
            pa, pb = os.path.join(front.tmp, "A.npy"), os.path.join(front.tmp, "B.npy")
            with open(pa, "wb") as f:
                f.write(npy_bytes(a))
            with open(pb, "wb") as f:
                f.write(npy_bytes(b))
            r = front.curl("POST", "/v1/matmul", form=["a=@" + pa, "b=@" + pb], accept="application/x-npy")
            c = load_npy(r.body) if r.status == 200 else None
        good = c is not None and compare(c.reshape(m, n) if c.size == m * n else c, ref, dtype, k)[0]
        if not good:
            wrong.append("%s %dx%dx%d format %d: %r" % (dtype, m, k, n, fmt, r))
        named.add(r.header("x-gemm-instance"))
    tap.ok(not wrong, "9 products through nginx (JSON, raw, .npy; three dtypes) equal NumPy's", wrong)
    tap.ok(named <= set(NAMES) and len(named) >= 2,
           "every answer names the daemon that computed it (X-Gemm-Instance), and more than one did", named)


def status_pages(tap, front):
    """/ reaches a daemon's status page; /status/<instance_id>/ is always that daemon's."""
    r = front.curl("GET", "/")
    tap.ok(r.status == 200 and (r.header("content-type") or "").startswith("text/html") and
           b"v1/status" in r.body and r.header("x-gemm-instance") in NAMES,
           "GET / through nginx: a daemon's status page (text/html)", r)
    r = front.curl("GET", "/status/gemmd-b/")
    tap.ok(r.status == 200 and (r.header("content-type") or "").startswith("text/html") and
           r.header("x-gemm-instance") == "gemmd-b", "GET /status/gemmd-b/: gemmd-b's status page", r)
    got = [(front.curl("GET", "/status/gemmd-b/v1/status").json() or {}).get("instance_id") for _ in range(4)]
    tap.ok(got == ["gemmd-b"] * 4, "its v1/status (relative to the page) comes from gemmd-b every time", got)
    r = front.curl("GET", "/status/gemmd-b")
    tap.ok(r.status == 301 and r.header("location") == "/status/gemmd-b/",
           "/status/gemmd-b (no slash) redirects to /status/gemmd-b/", r)
    r = front.curl("GET", "/status/gemmd-z/v1/status")
    tap.ok(r.status == 404 and json_error(r) and not r.header("x-gemm-instance"),
           "/status/<an instance nginx does not know>/: 404 (JSON) from nginx", r)


def big_bodies(tap, front, nginx, rng):
    # A 32 MiB upload: A is 4096x2048 float32.
    a = random_matrix(rng, (4096, 2048), "float32")
    b = random_matrix(rng, (2048, 3), "float32")
    q = "?m=4096&k=2048&n=3&dtype=float32"
    r = front.curl("POST", "/v1/matmul" + q, data=a.tobytes() + b.tobytes(), content_type="application/octet-stream",
                   max_time=120 * SLOW)
    c = raw_answer(r, 4096, 3, "float32")
    tap.ok(c is not None and compare(c, reference(a, b, "float32"), "float32", 2048)[0],
           "a 32 MiB upload streams through nginx and the product is right", r)
    # A 32 MiB answer: C is 2048x4096 float32.
    a = random_matrix(rng, (2048, 2), "float32")
    b = random_matrix(rng, (2, 4096), "float32")
    r = front.curl("POST", "/v1/matmul?m=2048&k=2&n=4096&dtype=float32", data=a.tobytes() + b.tobytes(),
                   content_type="application/octet-stream", max_time=120 * SLOW)
    c = raw_answer(r, 2048, 4096, "float32")
    tap.ok(c is not None and compare(c, reference(a, b, "float32"), "float32", 2)[0],
           "a 32 MiB answer streams back through nginx and is right", r)
    log = nginx.log("error.log")
    buffered = [ln for ln in log.splitlines() if "buffered to a temporary file" in ln]
    temp_files = []
    for root, _, files in os.walk(os.path.join(nginx.folder, "temp")):
        temp_files += [os.path.join(root, f) for f in files]
    tap.ok(not buffered and not temp_files,
           "nginx stored neither body in a file (proxy_request_buffering off, proxy_buffering off)",
           (buffered, temp_files))
    # Above client_max_body_size nginx answers 413 itself, in the daemons' JSON shape,
    # from Content-Length alone (the body is never sent).
    head = ("POST /v1/matmul?m=1&k=1&n=1&dtype=float32 HTTP/1.1\r\nHost: x\r\nContent-Type: "
            "application/octet-stream\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (4096 << 20))
    from harness import raw_request
    st, h, body, _ = raw_request(front.port, head.encode(), read_timeout=10 * SLOW)
    r = Response(st, h, body)
    tap.ok(st == 413 and json_error(r) and r.error()[0] == "too_large",
           "a body declared larger than client_max_body_size gets 413 too_large (JSON) from nginx", r)


def jobs(tap, front, rng):
    """Submits jobs through nginx; returns {instance: [(id, a, b)]}."""
    kept, bad = {}, []
    for i in range(9):
        a, b = random_matrix(rng, (7, 5), "float64"), random_matrix(rng, (5, 4), "float64")
        body = json.dumps({"a": a.tolist(), "b": b.tolist()}).encode()
        r = front.curl("POST", "/v1/jobs", data=body, content_type="application/json")
        jid = (r.json() or {}).get("id", "")
        m = re.match(r"^(gemmd-[abc])-[0-9a-f]{32}$", jid)
        if r.status != 202 or not m or r.header("location") != "/v1/jobs/" + jid or \
                r.header("x-gemm-instance") != m.group(1):
            bad.append(r)
            continue
        kept.setdefault(m.group(1), []).append((jid, a, b))
    tap.ok(not bad, "9 jobs submitted through nginx: 202, ids <instance>-<32 hex> naming the daemon that took them",
           bad)
    tap.ok(len(kept) == 3, "the submits spread over the three daemons", {k: len(v) for k, v in kept.items()})

    wrong = []
    for inst, lst in kept.items():
        for jid, a, b in lst:
            deadline = time.monotonic() + 30 * SLOW
            r = None
            while time.monotonic() < deadline:
                r = front.curl("GET", "/v1/jobs/" + jid)
                if r.status != 200 or (r.json() or {}).get("state") in ("done", "failed", "cancelled"):
                    break
                time.sleep(0.05)
            if r is None or r.status != 200 or (r.json() or {}).get("state") != "done" or \
                    r.header("x-gemm-instance") != inst:
                wrong.append(("status", jid, r))
                continue
            r = front.curl("GET", "/v1/jobs/%s/result" % jid, accept="application/json")
            c = np.array((r.json() or {}).get("c", []), dtype=np.float64) if r.status == 200 else None
            if c is None or r.header("x-gemm-instance") != inst or \
                    not compare(c, reference(a, b, "float64"), "float64", 5)[0]:
                wrong.append(("result", jid, r))
    tap.ok(not wrong, "each job's status and result, fetched through nginx, come from its owner and are right",
           wrong)

    # An id of an instance nginx does not know: its 404, JSON, without a daemon.
    r = front.curl("GET", "/v1/jobs/gemmd-z-0123456789abcdef0123456789abcdef")
    tap.ok(r.status == 404 and json_error(r) and r.error()[0] == "job_not_found" and not r.header("x-gemm-instance"),
           "an id naming an instance nginx does not know: 404 job_not_found (JSON) from nginx", r)
    # A well-formed id of a known instance that does not exist: the owner's own 404.
    r = front.curl("GET", "/v1/jobs/gemmd-b-0123456789abcdef0123456789abcdef/result")
    tap.ok(r.status == 404 and r.error()[0] == "job_not_found" and r.header("x-gemm-instance") == "gemmd-b",
           "an unknown job of a known instance: its owner answers 404 job_not_found", r)
    # DELETE through nginx reaches the owner.
    inst, lst = sorted(kept.items())[0]
    jid = lst.pop()[0]
    r = front.curl("DELETE", "/v1/jobs/" + jid)
    r2 = front.curl("GET", "/v1/jobs/" + jid)
    tap.ok(r.status == 204 and r2.status == 404 and r2.header("x-gemm-instance") == inst,
           "DELETE through nginx reaches the owner (then the job is gone)", (r, r2))
    return kept


def matmul_count(d):
    r, m = d.metrics()
    return metric(m, "gemmd_requests_total", route="/v1/matmul", code="200") if m else -1


def load(port, stop, out, seed, timeout):
    """Sends 48x48 float64 products until stop is set; appends (t0, t1, response, ok)."""
    rng = np.random.default_rng(seed)
    while not stop.is_set():
        a, b = random_matrix(rng, (48, 48), "float64"), random_matrix(rng, (48, 48), "float64")
        t0 = time.monotonic()
        r = post_raw(port, a, b, "float64", timeout)
        t1 = time.monotonic()
        c = raw_answer(r, 48, 48, "float64")
        ok = c is not None and compare(c, reference(a, b, "float64"), "float64", 48)[0]
        out.append((t0, t1, r, ok))


def spread(tap, front, daemons):
    before = [matmul_count(d) for d in daemons]
    stop, out, threads = threading.Event(), [], []
    for i in range(6):
        t = threading.Thread(target=load, args=(front.port, stop, out, 500 + i, 60 * SLOW))
        t.start()
        threads.append(t)
    time.sleep(2.0)
    stop.set()
    for t in threads:
        t.join(timeout=90 * SLOW)
    after = [matmul_count(d) for d in daemons]
    got = [a - b for a, b in zip(after, before)]
    tap.ok(out and all(ok for _, _, _, ok in out), "%d products from 6 clients through nginx, all right" % len(out),
           [r for _, _, r, ok in out if not ok][:5])
    tap.ok(all(g > 0 for g in got) and sum(got) >= len(out),
           "the load spread over the three daemons (their /metrics: %s products)" % got, (before, after))


def kill_one(tap, front, daemons, kept):
    victim = daemons[2]  # gemmd-c, whose products take 300 ms more (fault_inject)
    stop, out, threads = threading.Event(), [], []
    for i in range(6):
        t = threading.Thread(target=load, args=(front.port, stop, out, 900 + i, 60 * SLOW))
        t.start()
        threads.append(t)
    # Kill it while nginx has products in flight on it (its own gauge says so).
    deadline, busy = time.monotonic() + 20 * SLOW, 0
    while time.monotonic() < deadline:
        _, m = victim.metrics()
        busy = metric(m, "gemmd_requests_in_flight") if m else 0
        if busy >= 1:
            break
        time.sleep(0.02)
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(timeout=10)
    t_dead = time.monotonic()
    time.sleep(2.5)
    stop.set()
    for t in threads:
        t.join(timeout=90 * SLOW)
    victim.kill_if_running()
    tap.ok(busy >= 1, "gemmd-c had products in flight when it was killed (gemmd_requests_in_flight %g)" % busy)

    wrong = [r for _, _, r, ok in out if r.status == 200 and not ok]
    unclean = [r for _, _, r, ok in out if r.status != 200 and not (r.status in (502, 503, 504) and json_error(r))]
    failed = [r for _, _, r, ok in out if r.status != 200]
    after = [(r, ok) for t0, _, r, ok in out if t0 > t_dead]
    tap.ok(not wrong, "no wrong answer among %d products around the kill" % len(out), wrong[:5])
    tap.ok(not unclean, "every product that failed got a JSON error with 502/503/504 (%d failed)" % len(failed),
           unclean[:5])
    tap.ok(any(r.status == 502 and r.error()[0] == "upstream_unavailable" for r in failed),
           "the products in flight on the killed daemon failed with 502 upstream_unavailable", failed[:5])
    tap.ok(len(after) >= 6 and all(ok for _, ok in after) and
           not any(r.header("x-gemm-instance") == "gemmd-c" for r, _ in after),
           "all %d products sent after it died were answered right by the other two" % len(after),
           [r for r, ok in after if not ok][:5])

    # Its jobs: a clean 502 from nginx; the others' jobs are still there.
    dead = kept.get("gemmd-c", [])
    live = kept.get("gemmd-a", []) + kept.get("gemmd-b", [])
    if dead:
        r = front.curl("GET", "/v1/jobs/%s/result" % dead[0][0])
        tap.ok(r.status == 502 and json_error(r) and r.error()[0] == "instance_unavailable" and
               "gemmd-c" in r.error()[1], "a job of the dead daemon: 502 instance_unavailable (JSON), naming it", r)
    else:
        tap.ok(False, "a job was kept on gemmd-c to fetch after its death")
    if live:
        jid, a, b = live[0]
        r = front.curl("GET", "/v1/jobs/%s/result" % jid, accept="application/json")
        c = np.array((r.json() or {}).get("c", []), dtype=np.float64) if r.status == 200 else None
        tap.ok(c is not None and compare(c, reference(a, b, "float64"), "float64", 5)[0],
               "a job of a surviving daemon is still fetched right through nginx", r)


def main(tap):
    exe = ensure_nginx()
    names = ["nginx -t on the recipe", "products through nginx", "status pages", "big bodies stream through",
             "jobs routed by id", "load spread", "one daemon killed under load"]
    if not exe:
        for n in names:
            tap.skip(n, "no nginx (Debian package nginx); install it: %s" % INSTALL)
        return
    with open(RECIPE) as f:
        recipe = f.read()
    os.makedirs(os.path.join(REPO, BUILD), exist_ok=True)
    folder = tempfile.mkdtemp(prefix="nginx-test-", dir=os.path.join(REPO, BUILD))
    os.chmod(folder, 0o755)  # nginx's workers may run as another user when the test is root
    listen = free_port()
    daemons = []
    nginx = None
    try:
        for i, name in enumerate(NAMES):
            cfg = {"backend": "cpu", "threads": "1", "instance_id": name, "per_ip_limit": "0",
                   "log_level": "warn"}
            if name == "gemmd-c":
                cfg["fault_inject"] = "cpu_delay_ms:300"
            daemons.append(Daemon(tap, config=cfg))
        conf, why = generate_config(recipe, [d.port for d in daemons], listen, folder)
        if not tap.ok(conf is not None, "the recipe has the three upstream servers, the listen line and the instance map",
                      why):
            return
        nginx = Nginx(exe, conf, folder)
        rc, text = nginx.test_config()
        if not tap.ok(rc == 0, "nginx -t accepts the recipe (nginx %s)" % exe, text):
            return
        if not tap.ok(nginx.start(listen), "nginx starts in the foreground on 127.0.0.1:%d" % listen,
                      nginx.log("error.log")[-3000:]):
            return
        front = Front(listen, folder)
        rng = np.random.default_rng(15)
        products(tap, front, rng)
        status_pages(tap, front)
        big_bodies(tap, front, nginx, rng)
        kept = jobs(tap, front, rng)
        spread(tap, front, daemons)
        kill_one(tap, front, daemons, kept)
        for name, d in zip(NAMES[:2], daemons[:2]):
            d.stop_and_check("%s exits 0 on SIGTERM" % name)
        tap.ok(nginx.stop() == 0, "nginx exits 0 on SIGQUIT", nginx.log("error.log")[-2000:])
        crit = [ln for ln in nginx.log("error.log").splitlines() if "[crit]" in ln or "[alert]" in ln or
                "[emerg]" in ln]
        tap.ok(not crit, "nginx logged no crit/alert/emerg", crit[:5])
    finally:
        if nginx is not None:
            nginx.stop()
        for d in daemons:
            d.kill_if_running()
            d.cleanup()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    run_guarded(Tap(), main)
