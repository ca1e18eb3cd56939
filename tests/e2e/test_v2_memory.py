#!/usr/bin/python3
"""test_v2_memory.py - the Open Inference Protocol's infer route under the memory budget
(max_inflight_mb), as /v1 is.

1. Admission: while one v2 request holds A and B (its header parsed, its binary tensor
   data half sent), /metrics shows them held (reserved at admission); a v2 body that does
   not fit waits for memory and, when none comes within admit_wait, gets 503 over_budget in
   the v2 error shape ({"error": ..., "code": ...}) with a Retry-After, before a byte of it
   is read, JSON and binary alike; one that can never fit gets 413; the daemon keeps
   serving (readiness, a small product, checked against NumPy).
2. Peak memory: JSON tensor data is converted from the header's text, never held as a
   tree. Three big JSON v2 bodies (A 1400x1000 float64 text, about 28 MB each) at once: the
   daemon's peak resident memory (VmHWM, reset before the round) grows by less than twice
   each body plus its matrices (the bound test_json_memory holds /v1 to). A cJSON tree of
   those elements alone took about 80 bytes a number, 112 MB a request.
3. Everything given back: after many v2 requests - right ones (JSON and binary, answers
   JSON and binary), bad elements found after A was allocated, length mismatches, clients
   that close inside the header or inside the tensor data, and a client that does not read
   its binary answer (its header and C shown as answers meanwhile) - nothing is left
   charged against the budget.
4. Shutdown with a v2 product on the engine: its client gets 503 shutting_down in the v2
   shape, the daemon exits 0 (and the sanitizer build finds nothing leaked).

Sanitizer builds skip the peak-memory bound (ASan's quarantine keeps freed memory resident).
"""
import json
import os
import socket
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import SLOW, Daemon, Tap, compare, metric, raw_request, reference, run_guarded  # noqa: E402

INFER = "/v2/models/matmul/infer"
V2 = {"float32": "FP32", "float64": "FP64", "int32": "INT32"}
MIB = 1 << 20


def json_body(a, b, dtype, binary_output=False):
    req = {"inputs": [{"name": "A", "shape": list(a.shape), "datatype": V2[dtype], "data": a.tolist()},
                      {"name": "B", "shape": list(b.shape), "datatype": V2[dtype], "data": b.tolist()}]}
    if binary_output:
        req["outputs"] = [{"name": "C", "parameters": {"binary_data": True}}]
    return json.dumps(req).encode()


def binary_body(a, b, dtype, binary_output=False):
    """(JSON header, binary tail): both inputs as binary tensor data."""
    req = {"inputs": [{"name": n, "shape": list(m.shape), "datatype": V2[dtype],
                       "parameters": {"binary_data_size": m.nbytes}} for n, m in (("A", a), ("B", b))]}
    if binary_output:
        req["outputs"] = [{"name": "C", "parameters": {"binary_data": True}}]
    return json.dumps(req).encode(), a.tobytes() + b.tobytes()


def head(length, header_len=None):
    h = "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % (INFER, length)
    if header_len is not None:
        h += "Inference-Header-Content-Length: %d\r\n" % header_len
    return (h + "\r\n").encode()


def v2_error_of(body):
    try:
        j = json.loads(body.decode())
    except ValueError:
        return None
    return j if isinstance(j, dict) and isinstance(j.get("error"), str) and isinstance(j.get("code"), str) else None


def status_kb(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return None


def reset_peak(pid):
    try:
        with open("/proc/%d/clear_refs" % pid, "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def held(d, holder=None):
    _, m = d.metrics()
    if m is None:
        return None
    if holder is None:
        return metric(m, "gemmd_memory_inflight_bytes")
    return metric(m, "gemmd_memory_held_bytes", holder=holder)


def wait_for(cond, secs):
    end = time.monotonic() + secs
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    return cond()


def budget_settles(d, secs=20):
    """Polls until nothing is charged; returns the memory gauges when it is not."""
    _, m = d.metrics()
    end = time.monotonic() + secs * SLOW
    while time.monotonic() < end:
        _, m = d.metrics()
        if m is not None and metric(m, "gemmd_memory_inflight_bytes") == 0:
            return None
        time.sleep(0.1)
    return {k: v for k, v in (m or {}).items() if k[0].startswith("gemmd_memory")}


def small_product_ok(d, rng):
    a = rng.uniform(-1, 1, (7, 5)).astype(np.float32)
    b = rng.uniform(-1, 1, (5, 3)).astype(np.float32)
    r = d.curl("POST", INFER, data=json_body(a, b, "float32"), content_type="application/json")
    j = r.json() or {}
    try:
        c = np.array(j["outputs"][0]["data"], dtype=np.float64).reshape(7, 3)
    except (KeyError, IndexError, ValueError, TypeError):
        return False, repr(r)
    return compare(c, reference(a, b, "float32"), "float32", 5)


# ------------------------------------------------------------------------------ 1.

def admission(tap, d, rng):
    a = rng.uniform(-1, 1, (2560, 2048)).astype(np.float32)  # 20 MiB
    b = rng.uniform(-1, 1, (2048, 2048)).astype(np.float32)  # 16 MiB
    hdr, tail = binary_body(a, b, "float32")
    s = socket.create_connection(("127.0.0.1", d.port), timeout=30)
    try:
        s.sendall(head(len(hdr) + len(tail), len(hdr)) + hdr + tail[:4 * MIB])
        inputs = wait_for(lambda: (held(d) or 0) >= a.nbytes + b.nbytes, 10 * SLOW)
        tap.ok(inputs, "a v2 request whose tensor data is arriving: its A and B (36 MiB) are held in /metrics "
               "(%s bytes, %s reserved at admission)" % (held(d), held(d, "reserved")))

        for what, length, hl in (("binary", 24 * MIB, 200), ("JSON", 24 * MIB, None)):
            st, h, body, _ = raw_request(d.port, head(length, hl), b"", read_timeout=10 * SLOW)
            e = v2_error_of(body) or {}
            ra = h.get("retry-after", "")
            tap.ok(st == 503 and e.get("code") == "over_budget" and "max_inflight_mb" in e.get("error", "")
                   and ra.isdigit() and int(ra) >= 1,
                   "a %s v2 body of 24 MiB while the first holds most of the 56 MiB: it waits admit_wait, then "
                   "503 over_budget in the v2 shape, Retry-After %s, before its body" % (what, ra), (st, h, body[:300]))
        st, h, body, _ = raw_request(d.port, head(60 * MIB, 200), b"", read_timeout=10 * SLOW)
        e = v2_error_of(body) or {}
        tap.ok(st == 413 and e.get("code") == "too_large",
               "a v2 body larger than the budget lets one request hold: 413 too_large", (st, body[:300]))
        r = d.curl("GET", "/v2/health/ready")
        tap.ok(r.status == 200, "the daemon is ready meanwhile", r)
        ok, why = small_product_ok(d, rng)
        tap.ok(ok, "a small v2 product is answered right meanwhile", why)
    finally:
        s.close()
    left = budget_settles(d)
    tap.ok(left is None, "the client closed inside its tensor data: A and B are given back", left)

    # the whole request, sent: right, and nothing left charged
    hdr, tail = binary_body(a, b, "float32", binary_output=True)
    st, h, body, _ = raw_request(d.port, head(len(hdr) + len(tail), len(hdr)), hdr + tail, read_timeout=120 * SLOW)
    n = int(h.get("inference-header-content-length", "0") or 0)
    c = np.frombuffer(body[n:], dtype=np.float32) if st == 200 else np.zeros(0)
    ok = c.size == 2560 * 2048 and compare(c.reshape(2560, 2048).astype(np.float64), reference(a, b, "float32"),
                                           "float32", 2048)[0]
    tap.ok(ok, "the same 36 MiB of tensor data, sent whole, is answered right (C as binary data)", (st, body[:300]))
    left = budget_settles(d)
    tap.ok(left is None, "after it nothing is left charged", left)


# ------------------------------------------------------------------------------ 2.

def peak_memory(tap):
    M, K, N, CONC = 1400, 1000, 1, 3
    rng = np.random.default_rng(12)
    a = rng.uniform(-1, 1, (M, K))
    b = rng.uniform(-1, 1, (K, N))
    body = json_body(a, b, "float64")
    matrices = (M * K + K * N + M * N) * 8
    ref = reference(a, b, "float64")
    with Daemon(tap, config={"backend": "cpu", "http_threads": CONC + 2, "threads": 1, "max_json_mb": 64}) as d:
        pid = d.proc.pid
        r = d.curl("POST", INFER, data=body, content_type="application/json", max_time=300)
        tap.ok(r.status == 200, "one %.1f MB JSON v2 body is answered" % (len(body) / 1e6), r)
        can_reset = reset_peak(pid)
        base = status_kb(pid, "VmRSS")
        out = [None] * CONC

        def one(i):
            out[i] = d.curl("POST", INFER, data=body, content_type="application/json", max_time=300)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(CONC)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        peak = status_kb(pid, "VmHWM")
        good, why = 0, ""
        for r in out:
            try:
                c = np.array((r.json() or {})["outputs"][0]["data"], dtype=np.float64).reshape(M, N)
            except (KeyError, IndexError, ValueError, TypeError):
                why = why or repr(r)
                continue
            ok, detail = compare(c, ref, "float64", K)
            good += ok
            why = why or detail
        tap.ok(good == CONC, "%d JSON v2 bodies at once, every C right" % CONC, why)
        grew = (peak - base) * 1024 if peak is not None and base is not None else 0
        bound = CONC * (2 * len(body) + matrices)
        tap.diag("body %.1f MB, matrices %.1f MB per request; VmRSS before %.1f MB, VmHWM %.1f MB (+%.1f MB for %d "
                 "at once, %.1f MB each); bound %.1f MB" % (len(body) / 1e6, matrices / 1e6, (base or 0) / 1024,
                                                            (peak or 0) / 1024, grew / 1e6, CONC, grew / CONC / 1e6,
                                                            bound / 1e6))
        name = "peak memory of JSON v2 bodies within 2x body + matrices each"
        if SLOW > 1:
            tap.skip(name, "sanitizer build: ASan's quarantine keeps freed memory resident")
        elif not can_reset or base is None or peak is None:
            tap.skip(name, "cannot reset or read VmHWM of the daemon (/proc/PID/clear_refs)")
        else:
            tap.ok(grew <= bound, "peak memory grew %.1f MB <= %.1f MB (2x body + matrices, x%d)"
                   % (grew / 1e6, bound / 1e6, CONC))
        left = budget_settles(d)
        tap.ok(left is None, "after the big JSON bodies nothing is left charged", left)


# ------------------------------------------------------------------------------ 3.

def many_requests(tap, d, rng):
    a = rng.uniform(-1, 1, (300, 200)).astype(np.float32)
    b = rng.uniform(-1, 1, (200, 100)).astype(np.float32)
    ref = reference(a, b, "float32")
    hdr, tail = binary_body(a, b, "float32", binary_output=True)
    jb = json_body(a, b, "float32")
    bad_elem = json.dumps({"inputs": [
        {"name": "A", "shape": [300, 200], "datatype": "FP32", "data": a.ravel().tolist()[:-1] + ["x"]},
        {"name": "B", "shape": [200, 100], "datatype": "FP32", "data": b.tolist()}]}).encode()
    counts = {"right": 0, "wrong": 0, "bad_data": 0, "length_mismatch": 0}
    for i in range(12):
        r = d.curl("POST", INFER, data=jb, content_type="application/json")
        try:
            c = np.array((r.json() or {})["outputs"][0]["data"], dtype=np.float64).reshape(300, 100)
            counts["right" if compare(c, ref, "float32", 200)[0] else "wrong"] += 1
        except (KeyError, IndexError, ValueError, TypeError):
            counts["wrong"] += 1
        st, h, body, _ = raw_request(d.port, head(len(hdr) + len(tail), len(hdr)), hdr + tail)
        n = int(h.get("inference-header-content-length", "0") or 0)
        c = np.frombuffer(body[n:], dtype=np.float32) if st == 200 else np.zeros(0)
        ok = c.size == 300 * 100 and compare(c.reshape(300, 100).astype(np.float64), ref, "float32", 200)[0]
        counts["right" if ok else "wrong"] += 1
        r = d.curl("POST", INFER, data=bad_elem, content_type="application/json")
        counts["bad_data"] += r.status == 400 and (r.json() or {}).get("code") == "bad_data"
        st, _, body, _ = raw_request(d.port, head(len(hdr) + len(tail) - 4, len(hdr)), hdr + tail[:-4])
        counts["length_mismatch"] += st == 400 and (v2_error_of(body) or {}).get("code") == "length_mismatch"
        # clients that go away: inside the JSON header, inside the tensor data
        raw_request(d.port, head(len(hdr) + len(tail), len(hdr)), hdr[:len(hdr) // 2], close_after_send=True)
        raw_request(d.port, head(len(hdr) + len(tail), len(hdr)), hdr + tail[:len(tail) // 3],
                    close_after_send=True)
        raw_request(d.port, head(len(jb)), jb[:len(jb) // 2], close_after_send=True)
    tap.ok(counts["right"] == 24 and counts["wrong"] == 0, "24 right v2 products, JSON and binary (%r)" % counts)
    tap.ok(counts["bad_data"] == 12, "12 bad elements found after A was allocated: 400 bad_data (%r)" % counts)
    tap.ok(counts["length_mismatch"] == 12, "12 bodies that do not add up: 400 length_mismatch (%r)" % counts)

    # a client that does not read its binary answer: the answer is charged meanwhile
    big_a = rng.uniform(-1, 1, (1500, 64)).astype(np.float32)
    big_b = rng.uniform(-1, 1, (64, 1500)).astype(np.float32)  # C: 9 MB
    hdr2, tail2 = binary_body(big_a, big_b, "float32", binary_output=True)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(30)
    try:
        s.connect(("127.0.0.1", d.port))
        s.sendall(head(len(hdr2) + len(tail2), len(hdr2)) + hdr2 + tail2)
        answers = wait_for(lambda: (held(d) or 0) >= big_a.shape[0] * big_b.shape[1] * 4, 20 * SLOW)
        tap.ok(answers, "a binary v2 answer its client does not read: its C is held in /metrics meanwhile "
               "(%s bytes)" % held(d))
    finally:
        s.close()
    left = budget_settles(d, 30)
    tap.ok(left is None, "after all of them, failing and abandoned ones included, nothing is left charged", left)
    r = d.curl("GET", "/v2/health/live")
    tap.ok(r.status == 200, "the daemon is live after them", r)


# ------------------------------------------------------------------------------ 4.

def shutdown(tap):
    d = Daemon(tap, config={"backend": "cpu", "fault_inject": "cpu_delay_ms:600000", "shutdown_timeout": 1})
    try:
        rng = np.random.default_rng(5)
        a = rng.uniform(-1, 1, (64, 32)).astype(np.float32)
        b = rng.uniform(-1, 1, (32, 16)).astype(np.float32)
        out = []
        t = threading.Thread(target=lambda: out.append(
            d.curl("POST", INFER, data=json_body(a, b, "float32"), content_type="application/json", max_time=60)))
        t.start()
        queued = wait_for(lambda: (held(d) or 0) > 0, 10 * SLOW)
        tap.ok(queued, "a v2 product on the engine holds its inputs in the budget")
        d.stop_and_check("the daemon stops with a v2 product on the engine and exits 0")
        t.join(60)
        r = out[0] if out else None
        tap.ok(r is not None and r.status == 503 and (r.json() or {}).get("code") == "shutting_down"
               and isinstance((r.json() or {}).get("error"), str),
               "its client gets 503 shutting_down in the v2 shape", r)
    finally:
        d.kill_if_running()
        d.cleanup()


def main(tap):
    rng = np.random.default_rng(2)
    with Daemon(tap, config={"backend": "cpu", "max_inflight_mb": 64, "max_json_mb": 64, "http_threads": 8,
                             "threads": 1, "admit_wait": 1}) as d:
        admission(tap, d, rng)
        many_requests(tap, d, rng)
    peak_memory(tap)
    shutdown(tap)


if __name__ == "__main__":
    run_guarded(Tap(), main)
