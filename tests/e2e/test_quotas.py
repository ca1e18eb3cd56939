#!/usr/bin/python3
"""test_quotas.py - every token has a share of what the daemon keeps (token_share): one
token at its quota leaves every other token served.

With two named tokens, token_share 50, resident_mb 4, max_jobs 8 and job_mem_mb 4:
- resident matrices: token A fills its half (2 MiB) and its next upload gets 507
  naming its share (a .npy or JSON one before its body, from its Content-Length), and so does a matrix it asks to be made with empty=1 (no body: the
  store reserves it); token B's uploads still succeed, a product of B's reads them, and
  B's empty=1 matrix is made;
- async jobs (cpu_delay_ms keeps them queued): A keeps 4 of 8 and its 5th gets 503
  job_store_full naming its share, before its body is read (a raw body's shapes are in the
  query); B's jobs are still taken and answered right;
- memory in flight: A's second big upload waits for A's first, not for B's product,
  which is answered while A's first still holds its reservation;
- a matrix made with empty=1 whose rows do not all come within job_ttl is forgotten
  (404), and its memory given back;
- resident matrices count in the memory budget (holder "resident") until deleted;
- without tokens, one address that has submitted more async jobs and uploaded more
  resident matrices than its share of memory in flight (each kept, so its reservation
  went whole into what is kept, then deleted) still gets a product answered: each such
  request ended in the admission queue.
"""
import io
import os
import socket
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import SLOW, Daemon, Tap, metric, parse_metrics, raw_request, run_guarded  # noqa: E402

A, B = "tokenAAAAsecret", "tokenBBBBsecret"


def auth(tok):
    return ["Authorization: Bearer %s" % tok]


def resident_held(d):
    """gemmd_memory_held_bytes{holder="resident"} (None when /metrics does not answer)."""
    r = d.curl("GET", "/metrics", headers=auth(A))
    return metric(parse_metrics(r.body.decode()), "gemmd_memory_held_bytes", holder="resident") \
        if r.status == 200 else None


def upload(d, tok, rows, cols=256):
    data = np.ones((rows, cols), np.float64).tobytes()
    return d.curl("POST", "/v1/matrices?rows=%d&cols=%d&dtype=float64" % (rows, cols), data=data,
                  content_type="application/octet-stream", headers=auth(tok))


def resident(tap, d):
    ids = {A: [], B: []}
    for i in range(4):  # 512 KiB each: A's share of 4 MiB is 2 MiB
        r = upload(d, A, 256)
        tap.ok(r.status == 201, "token A's resident matrix %d of 4 (512 KiB each, its share 2 MiB)" % (i + 1), r)
        ids[A].append((r.json() or {}).get("id", ""))
    r = upload(d, A, 256)
    code, msg = r.error()
    tap.ok(r.status == 507 and code == "insufficient_storage" and "token_share" in (msg or ""),
           "token A's fifth: 507 insufficient_storage naming its share", r)
    npy = io.BytesIO()
    np.save(npy, np.ones((256, 256), np.float64))
    for what, ctype, size in (("a .npy", "application/x-npy", len(npy.getvalue())),
                              ("a JSON", "application/json", 600000)):
        head = ("POST /v1/matrices HTTP/1.1\r\nHost: x\r\n%s\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
                "Expect: 100-continue\r\n\r\n" % (auth(A)[0], ctype, size)).encode()
        st, h, b, raw = raw_request(d.port, head, read_timeout=5 * SLOW)
        tap.ok(st == 507 and b"token_share" in b and raw.startswith(b"HTTP/1.1 507"),
               "and %s upload of it is refused before its body (no 100 Continue)" % what, raw[:300])
    empty = "/v1/matrices?rows=256&cols=256&dtype=float64&empty=1"
    r = d.curl("POST", empty, headers=auth(A))
    tap.ok(r.status == 507 and "token_share" in (r.error()[1] or ""),
           "token A's empty=1 matrix at its share: 507 as well (the store reserves it without a body)", r)
    for i in range(3):
        r = upload(d, B, 256)
        tap.ok(r.status == 201, "token B's resident matrix %d is stored meanwhile" % (i + 1), r)
        ids[B].append((r.json() or {}).get("id", ""))
    bm = np.ones((256, 3), np.float64)
    r = d.curl("POST", "/v1/matmul?a=%s&m=256&k=256&n=3&dtype=float64" % ids[B][0], data=bm.tobytes(),
               content_type="application/octet-stream", accept="application/octet-stream", headers=auth(B))
    c = np.frombuffer(r.body, np.float64) if r.status == 200 else np.zeros(0)
    tap.ok(c.size == 768 and np.all(c == 256.0), "a product of token B reads its matrix", r)
    held = resident_held(d)
    tap.ok(held == 7 * 512 * 1024, "the 7 resident matrices are charged as resident in the memory budget (%s)" % held)
    r = d.curl("POST", empty, headers=auth(B))
    tap.ok(r.status == 201, "token B's empty=1 matrix is made meanwhile", r)
    ids[B].append((r.json() or {}).get("id", ""))
    for tok, lst in ids.items():
        for mid in lst:
            d.curl("DELETE", "/v1/matrices/" + mid, headers=auth(tok))
    held = resident_held(d)
    tap.ok(held == 0, "deleted, none is charged (%s)" % held)


def jobs(tap, d):
    a = np.full((16, 16), 2.0, np.float32)
    body = a.tobytes() * 2
    q = "/v1/jobs?m=16&k=16&n=16&dtype=float32"
    got = {A: [], B: []}
    for i in range(4):
        r = d.curl("POST", q, data=body, content_type="application/octet-stream", headers=auth(A))
        tap.ok(r.status == 202, "token A's job %d of its 4 (half of max_jobs 8)" % (i + 1), r)
        got[A].append((r.json() or {}).get("id"))
    r = d.curl("POST", q, data=body, content_type="application/octet-stream", headers=auth(A))
    code, msg = r.error()
    tap.ok(r.status == 503 and code == "job_store_full" and "token_share" in (msg or ""),
           "token A's fifth job: 503 job_store_full naming its share", r)
    head = ("POST %s HTTP/1.1\r\nHost: x\r\n%s\r\nContent-Type: application/octet-stream\r\n"
            "Content-Length: %d\r\nExpect: 100-continue\r\n\r\n" % (q, auth(A)[0], len(body))).encode()
    st, h, b, raw = raw_request(d.port, head, read_timeout=5 * SLOW)
    tap.ok(st == 503 and b"job_store_full" in b and raw.startswith(b"HTTP/1.1 503"),
           "and with Expect: 100-continue it is refused before its body (no 100 Continue)", raw[:300])
    for i in range(3):
        r = d.curl("POST", q, data=body, content_type="application/octet-stream", headers=auth(B))
        tap.ok(r.status == 202, "token B's job %d is taken meanwhile" % (i + 1), r)
        got[B].append((r.json() or {}).get("id"))
    jid = got[B][0]
    st = None
    for _ in range(int(200 * SLOW)):
        st = (d.curl("GET", "/v1/jobs/%s" % jid, headers=auth(B)).json() or {}).get("state")
        if st in ("done", "failed", "cancelled"):
            break
        time.sleep(0.1)
    r = d.curl("GET", "/v1/jobs/%s/result" % jid, headers=auth(B), accept="application/octet-stream")
    c = np.frombuffer(r.body, np.float32) if r.status == 200 else np.zeros(0)
    tap.ok(st == "done" and c.size == 256 and np.all(c == 64.0), "token B's job is answered right", (st, r))
    for tok, lst in got.items():
        for jid in lst:
            d.curl("DELETE", "/v1/jobs/%s" % jid, headers=auth(tok))


def inflight(tap, d):
    """Token A's first big upload holds its reservation (its body half sent); its second
    waits for it; token B's product is answered meanwhile."""
    n = 1024  # raw float64 A and B: 16 MiB, C 8 MiB: 24 MiB of the 56 MiB budget
    body = np.ones((n, n), np.float64).tobytes() * 2
    head = ("POST /v1/matmul?m=%d&k=%d&n=%d&dtype=float64 HTTP/1.1\r\nHost: x\r\n%s\r\n"
            "Content-Type: application/octet-stream\r\nAccept: application/octet-stream\r\n"
            "Content-Length: %d\r\n\r\n" % (n, n, n, auth(A)[0], len(body))).encode()
    s = socket.create_connection(("127.0.0.1", d.port), timeout=30)
    s.sendall(head + body[:len(body) // 2])
    time.sleep(0.5 * SLOW)
    second = {}

    def second_upload():
        second["r"] = d.curl("POST", "/v1/matmul?m=%d&k=%d&n=%d&dtype=float64" % (n, n, n), data=body,
                             content_type="application/octet-stream", accept="application/octet-stream",
                             headers=auth(A), max_time=60)

    t = threading.Thread(target=second_upload)
    t.start()
    time.sleep(0.5 * SLOW)
    bm = np.ones((512, 512), np.float64)
    r = d.curl("POST", "/v1/matmul?m=512&k=512&n=512&dtype=float64", data=bm.tobytes() * 2,
               content_type="application/octet-stream", accept="application/octet-stream", headers=auth(B))
    c = np.frombuffer(r.body, np.float64) if r.status == 200 else np.zeros(0)
    tap.ok(c.size == 512 * 512 and np.all(c == 512.0) and "r" not in second,
           "token B's product is answered while token A's second waits for A's first", r)
    s.sendall(body[len(body) // 2:])
    s.settimeout(60)
    data = b""
    while True:
        try:
            chunk = s.recv(1 << 20)
        except socket.timeout:
            break
        if not chunk:
            break
        data += chunk
        if len(data) >= n * n * 8 and b"\r\n\r\n" in data:
            hdr, _, rest = data.partition(b"\r\n\r\n")
            if len(rest) >= n * n * 8:
                break
    s.close()
    tap.ok(data.startswith(b"HTTP/1.1 200"), "token A's first is answered once its body is whole", data[:200])
    t.join(90)
    r2 = second.get("r")
    tap.ok(r2 is not None and r2.status == 200, "token A's second follows", r2)


def unfilled(tap, d):
    r = d.curl("POST", "/v1/matrices?rows=64&cols=64&dtype=float32&empty=1", headers=auth(A))
    mid = (r.json() or {}).get("id", "")
    tap.ok(r.status == 201, "a matrix to be filled by PUTs (empty=1)", r)
    half = np.ones((32, 64), np.float32).tobytes()
    r = d.curl("PUT", "/v1/matrices/%s?row=0" % mid, data=half, content_type="application/octet-stream",
               headers=auth(A))
    tap.ok(r.status in (200, 204), "half of its rows come", r)
    time.sleep(3.5)  # job_ttl 3
    r = d.curl("GET", "/v1/matrices/%s" % mid, headers=auth(A))
    tap.ok(r.status == 404, "not filled within job_ttl: forgotten (404)", r)
    held = resident_held(d)
    tap.ok(held == 0, "and its memory given back (%s)" % held)


def kept_then_product(tap):
    """Jobs and uploads whose buffers outlive them end their admission too."""
    cfg = {"backend": "cpu", "max_inflight_mb": 64, "admit_wait": 2, "cpu_workers": 1, "threads": 1}
    with Daemon(tap, config=cfg) as d:
        n = 1024  # float32: A, B and C 4 MiB each: 12 MiB reserved a job; its share is 28 MiB
        body = np.ones((n, n), np.float32).tobytes() * 2
        ok = 0
        for _ in range(4):
            r = d.curl("POST", "/v1/jobs?m=%d&k=%d&n=%d&dtype=float32" % (n, n, n), data=body,
                       content_type="application/octet-stream")
            jid = (r.json() or {}).get("id", "")
            for _ in range(int(300 * SLOW)):
                if (d.curl("GET", "/v1/jobs/%s" % jid).json() or {}).get("state") in ("done", "failed"):
                    break
                time.sleep(0.1)
            ok += r.status == 202 and d.curl("DELETE", "/v1/jobs/%s" % jid).status == 204
        tap.ok(ok == 4, "4 raw async jobs of 12 MiB each from one address, each done and deleted (48 MiB in all)")
        ok = 0
        for _ in range(4):
            r = d.curl("POST", "/v1/matrices?rows=%d&cols=%d&dtype=float64" % (n, n), data=body,
                       content_type="application/octet-stream")
            ok += r.status == 201 and d.curl("DELETE", "/v1/matrices/" + (r.json() or {}).get("id", "")).status == 204
        tap.ok(ok == 4, "4 raw resident matrices of 8 MiB each from it, each deleted (32 MiB in all)")
        bm = np.ones((512, 512), np.float64)
        r = d.curl("POST", "/v1/matmul?m=512&k=512&n=512&dtype=float64", data=bm.tobytes() * 2,
                   content_type="application/octet-stream", accept="application/octet-stream")
        c = np.frombuffer(r.body, np.float64) if r.status == 200 else np.zeros(0)
        tap.ok(c.size == 512 * 512 and np.all(c == 512.0),
               "then a 6 MiB product from the same address is answered (its admission is not locked out)", r)


def main(tap):
    tmp = tempfile.TemporaryDirectory(prefix="gemmd-quotas-")
    tokfile = os.path.join(tmp.name, "tokens")
    with open(tokfile, "w") as f:
        f.write("alice %s\nbob %s\n" % (A, B))
    cfg = {"backend": "cpu", "tokens_file": tokfile, "token_share": 50, "resident_mb": 4, "max_jobs": 8,
           "job_mem_mb": 4, "max_inflight_mb": 64, "job_ttl": 3, "fault_inject": "cpu_delay_ms:200",
           "cpu_workers": 1, "threads": 1}
    with Daemon(tap, config=cfg) as d:
        resident(tap, d)
        jobs(tap, d)
        inflight(tap, d)
        unfilled(tap, d)
    tmp.cleanup()
    kept_then_product(tap)


if __name__ == "__main__":
    run_guarded(Tap(), main)
