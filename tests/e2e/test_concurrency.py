#!/usr/bin/python3
"""test_concurrency.py - 64 concurrent clients with mixed shapes, dtypes and formats all get
right answers; SIGTERM while requests are in flight ends the daemon cleanly (exit 0) and
every client gets either a whole answer or a clean refusal / connection close.
"""
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (STOP_TIMEOUT, Daemon, Tap, compare, load_npy, np_dtype, npy_bytes,  # noqa: E402
                     random_matrix, reference, run_guarded)

CLIENTS = 64
PER_CLIENT = 3
DTYPES = ["float32", "float64", "int32"]


def one_product(d, rng, i):
    """Sends one product in a format chosen by i; returns (ok, detail)."""
    dtype = DTYPES[i % 3]
    m, k, n = (int(x) for x in rng.integers(1, 48, size=3))
    a = random_matrix(rng, (m, k), dtype)
    b = random_matrix(rng, (k, n), dtype)
    ref = reference(a, b, dtype)
    fmt = (i // 3) % 3
    if fmt == 0:
        r = d.matmul_json(a, b, dtype=dtype)
        c = np.array((r.json() or {}).get("c", []), dtype=np.float64 if dtype != "int32" else np.int64) \
            if r.status == 200 else None
    elif fmt == 1:
        r = d.matmul_raw(a, b, dtype)
        c = np.frombuffer(r.body, dtype=np_dtype(dtype)).reshape(m, n) \
            if r.status == 200 and len(r.body) == m * n * np.dtype(np_dtype(dtype)).itemsize else None
    else:
        r = d.matmul_npy(npy_bytes(a), npy_bytes(b), accept="application/x-npy")
        c = load_npy(r.body) if r.status == 200 else None
    if c is None:
        return False, "%s %dx%dx%d fmt %d: %r" % (dtype, m, k, n, fmt, r)
    good, why = compare(c.reshape(m, n) if c.size == m * n else c, ref, dtype, k)
    return good, "" if good else "%s %dx%dx%d fmt %d: %s" % (dtype, m, k, n, fmt, why)


def concurrent_clients(tap, d):
    results = [None] * CLIENTS
    start = threading.Barrier(CLIENTS)

    def client(idx):
        rng = np.random.default_rng(1000 + idx)
        sub = os.path.join(d.tmp.name, "c%d" % idx)
        os.makedirs(sub, exist_ok=True)
        view = _DaemonView(d, sub)
        try:
            start.wait(timeout=60)
        except threading.BrokenBarrierError:
            pass
        out = []
        for j in range(PER_CLIENT):
            out.append(one_product(view, rng, idx * PER_CLIENT + j))
        results[idx] = out

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    bad = []
    for idx, out in enumerate(results):
        if out is None:
            bad.append("client %d did not finish" % idx)
            continue
        bad += [why for good, why in out if not good]
    tap.ok(not bad, "%d concurrent clients x %d mixed products: all right" % (CLIENTS, PER_CLIENT),
           "\n".join(bad[:10]))
    r = d.curl("GET", "/healthz")
    tap.eq(r.status, 200, "daemon healthy after the burst")


class _DaemonView:
    """The daemon's request helpers with a private temp dir (for the .npy files)."""

    def __init__(self, d, tmpdir):
        self._d = d
        self.tmp = type("T", (), {"name": tmpdir})()
        self.base = d.base

    def curl(self, *a, **kw):
        from harness import curl
        return curl(self.base, *a, tmpdir=self.tmp.name, **kw)

    matmul_json = Daemon.matmul_json
    matmul_raw = Daemon.matmul_raw
    matmul_npy = Daemon.matmul_npy


def concurrent_jobs(tap, d):
    """32 clients each submit async jobs, poll them, fetch the result twice (one of them
    while another client may delete its own) and delete them."""
    import json
    n = 32
    results = [None] * n

    def client(idx):
        rng = np.random.default_rng(7000 + idx)
        sub = os.path.join(d.tmp.name, "j%d" % idx)
        os.makedirs(sub, exist_ok=True)
        view = _DaemonView(d, sub)
        out = []
        for j in range(2):
            m, k, nn = (int(x) for x in rng.integers(1, 40, size=3))
            a = random_matrix(rng, (m, k), "float64")
            b = random_matrix(rng, (k, nn), "float64")
            body = json.dumps({"a": a.tolist(), "b": b.tolist()}).encode()
            r = view.curl("POST", "/v1/jobs", data=body, content_type="application/json")
            jid = (r.json() or {}).get("id") if r.status == 202 else None
            if not jid:
                out.append("submit: %r" % r)
                continue
            state = None
            for _ in range(400):
                st = view.curl("GET", "/v1/jobs/" + jid)
                state = (st.json() or {}).get("state")
                if state in ("done", "failed", "cancelled") or st.status != 200:
                    break
                time.sleep(0.02)
            if state != "done":
                out.append("job %s state %r" % (jid, state))
                continue
            for accept in ("application/json", "application/x-npy"):
                r = view.curl("GET", "/v1/jobs/%s/result" % jid, accept=accept)
                if r.status != 200:
                    out.append("result %s: %r" % (jid, r))
                    continue
                c = np.array((r.json() or {}).get("c", [])) if accept == "application/json" else load_npy(r.body)
                good, why = compare(c, reference(a, b, "float64"), "float64", k)
                if not good:
                    out.append("job %s: %s" % (jid, why))
            r = view.curl("DELETE", "/v1/jobs/" + jid)
            if r.status not in (200, 204):
                out.append("delete %s: %r" % (jid, r))
        results[idx] = out

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    bad = []
    for idx, out in enumerate(results):
        bad += ["client %d did not finish" % idx] if out is None else out
    tap.ok(not bad, "%d concurrent clients submit, poll, fetch and delete async jobs: all right" % n,
           "\n".join(bad[:10]))
    _, m = d.metrics()
    kept = sum(v for (name, _l), v in (m or {}).items() if name == "gemmd_jobs")
    tap.ok(m is not None and kept == 0, "no job is kept after all were deleted", kept)


def shutdown_under_load(tap):
    d = Daemon(tap, config={"backend": "cpu", "fault_inject": "cpu_delay_ms:100", "queue_depth": 256,
                            "cpu_workers": 2})
    n = 32
    outcome = [None] * n
    started = threading.Event()
    counter = [0]
    lock = threading.Lock()

    def client(idx):
        rng = np.random.default_rng(5000 + idx)
        sub = os.path.join(d.tmp.name, "s%d" % idx)
        os.makedirs(sub, exist_ok=True)
        view = _DaemonView(d, sub)
        a = random_matrix(rng, (8, 8), "float64")
        b = random_matrix(rng, (8, 8), "float64")
        with lock:
            counter[0] += 1
            if counter[0] == n:
                started.set()
        r = view.matmul_json(a, b, dtype="float64")
        if r.status == 200:
            c = np.array((r.json() or {}).get("c", []))
            good, why = compare(c, reference(a, b, "float64"), "float64", 8)
            outcome[idx] = ("answer", good, why)
        elif r.status == 0:
            outcome[idx] = ("closed", True, r.err.strip())
        else:
            code, msg = r.error()
            outcome[idx] = ("refused", r.status == 503 and bool(code) and bool(msg), repr(r))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    started.wait(timeout=60)
    # let requests reach the engine (queued and running), then stop the daemon
    for _ in range(100):
        _, m = d.metrics()
        if m and sum(v for (name, _l), v in m.items() if name in ("gemmd_queue_depth", "gemmd_jobs_running")) >= 2:
            break
        time.sleep(0.05)
    rc = d.stop()
    for t in threads:
        t.join(timeout=STOP_TIMEOUT + 60)
    tap.ok(rc == 0, "SIGTERM under load: daemon exits 0 within %ds" % STOP_TIMEOUT, "exit code %r" % rc)
    san = d.sanitizer_report()
    tap.ok(not san, "no sanitizer report after shutdown under load", san)
    kinds = {}
    bad = []
    for o in outcome:
        if o is None:
            bad.append("a client never finished")
            continue
        kinds[o[0]] = kinds.get(o[0], 0) + 1
        if not o[1]:
            bad.append("%s: %s" % (o[0], o[2]))
    tap.ok(not bad, "every client got a right answer, a 503 with an error body, or a clean close (%s)"
           % ", ".join("%s %d" % kv for kv in sorted(kinds.items())), "\n".join(bad[:10]))
    if rc != 0 or san:
        d.dump_log()
    d.cleanup()


def vanishing_clients(tap):
    """Clients that close while their product is on the engine, async jobs still running
    and a client stalled mid-upload at SIGTERM: the daemon serves on and exits 0."""
    import json
    import socket
    from harness import raw_request
    d = Daemon(tap, config={"backend": "cpu", "fault_inject": "cpu_delay_ms:300", "queue_depth": 16})
    a = np.ones((4, 4))
    body = json.dumps({"a": a.tolist(), "b": a.tolist()}).encode()
    head = (b"POST /v1/matmul HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    for _ in range(4):
        raw_request(d.port, head, body, close_after_send=True)
    jobs = [d.curl("POST", "/v1/jobs", data=body, content_type="application/json").status for _ in range(2)]
    tap.eq(jobs, [202, 202], "async jobs accepted behind the vanished clients' products")
    r = d.matmul_json(a, a)
    tap.ok(r.status == 200 and (r.json() or {}).get("c") == (a @ a).tolist(),
           "a product queued behind vanished clients is answered", r)
    s = socket.create_connection(("127.0.0.1", d.port), timeout=10)
    s.sendall(b"POST /v1/matmul?m=100&k=100&n=100&dtype=float64 HTTP/1.1\r\nHost: x\r\n"
              b"Content-Type: application/octet-stream\r\nContent-Length: 160000\r\n\r\n" + b"\0" * 1000)
    for _ in range(2):
        raw_request(d.port, head, body, close_after_send=True)
    d.curl("POST", "/v1/jobs", data=body, content_type="application/json")
    rc = d.stop()
    s.close()
    tap.ok(rc == 0, "SIGTERM with vanished clients, running jobs and a stalled upload: exit 0", "exit code %r" % rc)
    san = d.sanitizer_report()
    tap.ok(not san, "no sanitizer report (nothing leaked for the vanished clients)", san)
    if rc != 0 or san:
        d.dump_log()
    d.cleanup()


def main(tap):
    with Daemon(tap, config={"backend": "cpu", "queue_depth": 512, "connection_limit": 512,
                             "per_ip_limit": 256, "http_threads": 4}) as d:
        concurrent_clients(tap, d)
        concurrent_jobs(tap, d)
    shutdown_under_load(tap)
    vanishing_clients(tap)


if __name__ == "__main__":
    run_guarded(Tap(), main)
