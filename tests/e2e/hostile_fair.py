"""hostile_fair.py - fairness between clients that are each well-formed, for
tests/e2e/test_hostile.py and test_quotas.py (the checks) and bench/hostile_load.py
--fairness (the figures): each case runs against a harness.Daemon and returns what it saw.

- admission(): big uploads at once from clients that send Expect: 100-continue and honour
  Retry-After (Upload): answered, right, refused after their body was sent, Retry-After;
- abandoned(): bodiless products on resident operands whose clients leave: how soon the
  engine is idle, the daemon's CPU time meanwhile, a good client's product sent then;
- quotas(): token A at its share of everything the daemon keeps, token B served meanwhile;
- declared(): connections declaring huge bodies and sending 20 bytes: VmSize and VmRSS.
"""
import json
import os
import socket
import threading
import time

import numpy as np

import hostile
from harness import metric

OCTET = "application/octet-stream"


class Upload(threading.Thread):
    """One request sent as a careful client sends it: the head with Expect: 100-continue,
    the body only once the server says 100 Continue (expect=False: at once, no Expect), and
    after a 503 the same again once its Retry-After has passed, until another answer or
    `within` seconds. body: byte strings sent one after another (operands shared by several
    uploads). Keeps every try as (status, Retry-After, whether the body had begun to go),
    and the last answer."""

    def __init__(self, port, src, path, body, ctype, accept=OCTET, within=60, expect=True):
        super().__init__(daemon=True)
        self.port, self.src, self.body, self.within, self.expect = port, src, body, within, expect
        self.head = ("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\nAccept: %s\r\nContent-Length: %d\r\n%s\r\n" % (
            path, ctype, accept, sum(map(len, body)), "Expect: 100-continue\r\n" if expect else "")).encode()
        self.tries, self.status, self.answer, self.seconds = [], 0, b"", None

    def run(self):
        t0 = time.monotonic()
        end = t0 + self.within
        while time.monotonic() < end:
            st, h, b, sent = 0, {}, b"", False
            try:
                s = hostile.connect(self.port, self.src, 10)
                s.sendall(self.head)
                st, h, b = hostile.read_response(s, end) if self.expect else (100, {}, b"")
                if st == 100:
                    s.settimeout(max(1.0, end - time.monotonic()))
                    sent = True
                    try:
                        for part in self.body:
                            s.sendall(part)
                    except OSError:
                        pass  # refused on the way: read why
                    st, h, b = hostile.read_response(s, end)
                s.close()
            except OSError:
                pass
            self.tries.append((st, h.get("retry-after"), sent))
            if st != 503:
                break
            time.sleep(min(float(h.get("retry-after") or 1), max(0.0, end - time.monotonic())))
        self.status, self.answer, self.seconds = st, b, time.monotonic() - t0


def admission(d, count, mb, kind="raw", sources=1, within=60.0, expect=True):
    """`count` uploads of about `mb` MiB at once from `sources` addresses (127.0.0.100 on),
    each an Upload. raw: A (mb MiB of float64, 2048 columns, shared) with a B of 16 columns
    of each its own; json: one body of mb MiB (A and B of float64 eighths) for all. Returns
    {answered right, wrong, failed: {status: n}, refused after the body, first-try
    successes, most Retry-After seconds, tries, seconds p50 and max}."""
    rng = np.random.default_rng(7)
    if kind == "raw":
        a = rng.integers(-8, 8, size=(mb * 2**20 // (8 * 2048), 2048)).astype(np.float64)
        bs = [rng.integers(-8, 8, size=(2048, 16)).astype(np.float64) for _ in range(count)]
        path = "/v1/matmul?m=%d&k=2048&n=16&dtype=float64" % a.shape[0]
        ups = [Upload(d.port, "127.0.0.%d" % (100 + i % sources), path, [a.tobytes(), b.tobytes()],
                      OCTET, within=within, expect=expect) for i, b in enumerate(bs)]
        refs = [a @ b for b in bs]
    else:
        n = int((mb * 2**20 / 13.4) ** 0.5)  # "-0.625, " and the like: 6.7 bytes a value
        a = rng.integers(-8, 8, size=(n, n)).astype(np.float64) / 8
        body = json.dumps({"a": a.tolist(), "b": a.tolist(), "dtype": "float64"}).encode()
        ups = [Upload(d.port, "127.0.0.%d" % (100 + i % sources), "/v1/matmul", [body], "application/json",
                      within=within, expect=expect) for i in range(count)]
        refs = [a @ a] * count
    for u in ups:
        u.start()
    for u in ups:
        u.join(within + 30)
    out = {"mb": sum(map(len, ups[0].body)) / 2**20, "right": 0, "wrong": 0, "failed": {}, "first_try": 0,
           "after_body": sum(1 for u in ups for st, _r, sent in u.tries if sent and st == 503),
           "retry_after": max([float(r) for u in ups for _s, r, _b in u.tries if r] or [0]),
           "tries": sum(len(u.tries) for u in ups), "seconds": sorted(u.seconds or within for u in ups)}
    for u, ref in zip(ups, refs):
        if u.status != 200:
            out["failed"][u.status] = out["failed"].get(u.status, 0) + 1
            continue
        c = np.frombuffer(u.answer, np.float64)
        good = c.size == ref.size and np.array_equal(c.reshape(ref.shape), ref)
        out["right" if good else "wrong"] += 1
        out["first_try"] += good and len(u.tries) == 1
    return out


def cpu_seconds(pid):
    """utime + stime of a process (all its threads), in seconds."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def engine_state(d):
    """(queued + running products, clients that left (None: not counted)) from /metrics."""
    _, m = d.metrics()
    if m is None:
        return None, None
    return metric(m, "gemmd_queue_depth") + metric(m, "gemmd_jobs_running"), m.get(("gemmd_clients_left_total",
                                                                                   frozenset()))


def abandoned(d, count=32, n=4096, after=0.3, watch=240.0):
    """`count` bodiless n^3 float32 products on resident A and B whose clients close after
    `after` s; as they close, a good client's 64^2 product. Returns {busy before the close,
    seconds from the close until the engine is idle (None: not within `watch`), the
    daemon's CPU seconds from the close to idle and over the 10 s after it, clients that
    left, the good product's seconds and whether it is right}."""
    rng = np.random.default_rng(3)
    ids = []
    for _ in "AB":
        r = d.curl("POST", "/v1/matrices?rows=%d&cols=%d&dtype=float32" % (n, n),
                   data=rng.uniform(-1, 1, (n, n)).astype(np.float32).tobytes(), content_type=OCTET)
        ids.append((r.json() or {}).get("id", ""))
    head = ("POST /v1/matmul?a=%s&b=%s HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
            "Accept: application/octet-stream\r\n\r\n" % tuple(ids)).encode()
    socks = [socket.create_connection(("127.0.0.1", d.port), timeout=10) for _ in range(count)]
    for s in socks:
        s.sendall(head)
    time.sleep(after)
    busy, _ = engine_state(d)
    cpu0, t0 = cpu_seconds(d.proc.pid), time.monotonic()
    for s in socks:
        s.close()
    ga, gb = (rng.uniform(-1, 1, (64, 64)).astype(np.float32) for _ in "ab")
    good = {}

    def good_client():
        st, _h, b, sock = hostile.request(d.port, "127.0.0.20", "POST", "/v1/matmul?m=64&k=64&n=64&dtype=float32",
                                          ga.tobytes() + gb.tobytes(), OCTET, timeout=watch)
        good.update(seconds=time.monotonic() - t0, status=st)
        c = np.frombuffer(b, np.float32) if st == 200 else np.zeros(0)
        good["right"] = c.size == 4096 and np.allclose(c.reshape(64, 64), ga.astype(np.float64) @ gb, atol=1e-4)
        if sock:
            sock.close()

    gt = threading.Thread(target=good_client, daemon=True)
    gt.start()
    out = {"busy": busy, "idle_after": None, "cpu_to_idle": None, "cpu_10s": None}
    while time.monotonic() - t0 < watch and (out["idle_after"] is None or out["cpu_10s"] is None):
        now = time.monotonic() - t0
        if out["cpu_10s"] is None and now >= 10:
            out["cpu_10s"] = cpu_seconds(d.proc.pid) - cpu0
        if out["idle_after"] is None and engine_state(d)[0] == 0:
            out["idle_after"], out["cpu_to_idle"] = now, cpu_seconds(d.proc.pid) - cpu0
        time.sleep(0.1)
    gt.join(watch)
    out["left"] = engine_state(d)[1]
    out.update(good_seconds=good.get("seconds"), good_status=good.get("status"), good_right=good.get("right", False))
    for mid in ids:
        d.curl("DELETE", "/v1/matrices/" + mid)
    return out


def quotas(d, tokens, mat=1024, within=2.0):
    """Token A (tokens[0]) takes its share of what the daemon keeps: resident matrices of
    mat x mat float64, made with empty=1 (no body: the store reserves them) and uploaded in
    turn until one is refused, then one of the other kind; async jobs until one is refused
    (their results kept); uploads of 64 MiB sent with Expect: 100-continue whose bodies stop
    half way, until one is not let in within `within` s. Then, while all of that is held,
    token B once each: an upload, an empty=1 matrix filled by a PUT, a product of the two,
    a job and its result, a raw product. Returns {"A": [(what, taken, how the next one was
    answered)], "B": [(what, status, seconds, right)]}."""
    auth = ["Authorization: Bearer %s" % t for t in tokens]
    rng = np.random.default_rng(5)
    m = rng.integers(-8, 8, size=(mat, mat)).astype(np.float64)
    q = "/v1/matrices?rows=%d&cols=%d&dtype=float64" % (mat, mat)

    def make(who, empty):
        return d.curl("POST", q + "&empty=1" if empty else q, data=None if empty else m.tobytes(), headers=[auth[who]],
                      content_type=None if empty else OCTET)

    def refusal(r):
        return "%d %s" % (r.status, r.error()[0] or "")

    res = {"A": [], "B": []}
    taken, r = [0, 0], None
    for i in range(256):
        r = make(0, i % 2)
        if r.status != 201:
            break
        taken[i % 2] += 1
    other = make(0, 1 - i % 2)
    res["A"].append(("resident matrices of %d MiB (uploaded + empty=1)" % (m.nbytes >> 20), "%d + %d" % tuple(taken),
                     "%s; the other kind: %s" % (refusal(r), refusal(other))))
    jb = rng.integers(-8, 8, size=(256, 256)).astype(np.float64)
    jq = "/v1/jobs?m=256&k=256&n=256&dtype=float64"
    for n in range(256):
        r = d.curl("POST", jq, data=jb.tobytes() * 2, content_type=OCTET, headers=[auth[0]])
        if r.status != 202:
            break
    res["A"].append(("async jobs (256^3 float64, results kept)", str(n), refusal(r)))
    big = bytes(8 * (4096 * 2048 + 2048 * 16))
    head = ("POST /v1/matmul?m=4096&k=2048&n=16&dtype=float64 HTTP/1.1\r\nHost: x\r\n%s\r\nContent-Type: %s\r\n"
            "Content-Length: %d\r\nExpect: 100-continue\r\n\r\n" % (auth[0], OCTET, len(big))).encode()
    held, st = [], 0
    for _ in range(16):
        s = hostile.connect(d.port, "127.0.0.1", 10)
        s.sendall(head)
        st, _h, _b = hostile.read_response(s, time.monotonic() + within)
        held.append(s)
        if st != 100:
            break
        s.sendall(big[:len(big) // 2])
    res["A"].append(("64 MiB uploads in flight (half sent)", str(len(held) - 1),
                     "%s" % st if st else "waits for memory (no 100 Continue within %g s)" % within))

    def timed(what, method, path, data=None, check=None, ctype=OCTET, accept=None):
        t0 = time.monotonic()
        r = d.curl(method, path, data=data, content_type=ctype if data else None, headers=[auth[1]], accept=accept)
        dt = time.monotonic() - t0
        right = check(r) if check and r.status < 300 else None
        res["B"].append((what, r.status if r.status < 300 else refusal(r), dt, right))
        return r

    def product_of(ref, shape):
        return lambda r: np.array_equal(np.frombuffer(r.body, np.float64).reshape(shape), ref)

    ida = (timed("upload a resident matrix", "POST", q, m.tobytes()).json() or {}).get("id", "")
    idb = (timed("make an empty=1 matrix", "POST", q + "&empty=1", ctype=None).json() or {}).get("id", "")
    timed("fill it with a PUT", "PUT", "/v1/matrices/%s?row=0" % idb, m.tobytes())
    timed("a product of the two (bodiless)", "POST", "/v1/matmul?a=%s&b=%s" % (ida, idb), accept=OCTET,
          check=product_of(m @ m, m.shape))
    jid = (timed("submit a job", "POST", jq, jb.tobytes() * 2).json() or {}).get("id", "")
    for _ in range(300):
        if (d.curl("GET", "/v1/jobs/" + jid, headers=[auth[1]]).json() or {}).get("state") in ("done", "failed"):
            break
        time.sleep(0.1)
    timed("its result", "GET", "/v1/jobs/%s/result" % jid, check=product_of(jb @ jb, jb.shape), accept=OCTET)
    timed("a raw product of 512^3", "POST", "/v1/matmul?m=512&k=512&n=512&dtype=float64", m[:512, :512].tobytes() * 2,
          check=product_of(m[:512, :512] @ m[:512, :512], (512, 512)), accept=OCTET)
    for s in held:
        s.close()
    return res


def declared(d, conns=200, declared_mb=2048, secs=10.0):
    """`conns` connections (half raw, half .npy forms, from 10 addresses) each declaring a
    body of declared_mb MiB and sending 20 bytes of it, opened again when the daemon closes
    them, for `secs` s. Returns {VmSize and VmRSS (MB) before and the largest during, the
    floods (hostile.SocketFlood)}."""
    pid = d.proc.pid
    before = hostile.proc_status(pid)
    mon = hostile.Monitor(pid)
    mon.start()
    floods = [hostile.giant_declared(d.port, ["127.0.0.%d" % (30 + 5 * j + i) for i in range(5)], conns // 10,
                                     declared_mb, kind) for j, kind in enumerate(("raw", "npy"))]
    for w in floods:
        w.start()
    time.sleep(secs)
    for w in floods:
        w.stop(wait=60)
    rss, _hwm, vm = mon.take()
    mon.stop()
    return {"vm_before": before.get("VmSize", 0) / 1024, "rss_before": before.get("VmRSS", 0) / 1024,
            "vm_max": vm / 1024, "rss_max": rss / 1024, "floods": floods}
