#!/usr/bin/python3
"""test_json_memory.py - large JSON bodies, several at once, in bounded memory.

JSON bodies are decoded as they arrive (common/json_stream.c): the daemon never holds a
body, only the matrices it carries. Four bodies of about 28 MB each (A 1400x1000, B
1000x1) are sent at once, in three rounds: float64 (no dtype: the default), float32 with
"dtype" after the matrices (the elements are held as float64 until the dtype is known),
and float32 again with chunked transfer encoding (no Content-Length). Every answer is
checked against NumPy, and the daemon's peak resident memory (VmHWM in /proc/PID/status,
reset through /proc/PID/clear_refs before each round) must grow by less than what the
issue asks per request: twice its body plus its matrices, summed over the requests in
flight. Before the streaming decoder, four such bodies took the daemon well past a GB
(body + cJSON tree, about 150 MB per request here).

Sanitizer builds run the products but skip the memory bound (ASan keeps freed memory in
quarantine, so resident memory says nothing about the decoder there).
"""
import json
import os
import sys
import threading

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import SLOW, Daemon, Tap, compare, reference, run_guarded  # noqa: E402

M, K, N = 1400, 1000, 1
CONCURRENT = 4


def status_kb(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return None


def reset_peak(pid):
    """Sets VmHWM to the current VmRSS (Linux >= 4.0); False when not allowed."""
    try:
        with open("/proc/%d/clear_refs" % pid, "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def body_of(a, b, dtype_last):
    doc = {"a": a.tolist(), "b": b.tolist()}
    if dtype_last:
        doc["dtype"] = dtype_last
    return json.dumps(doc).encode()


def send_all(d, body, chunked):
    """CONCURRENT copies of body at once; returns their responses."""
    out = [None] * CONCURRENT
    headers = ["Transfer-Encoding: chunked"] if chunked else None

    def one(i):
        out[i] = d.curl("POST", "/v1/matmul", data=body, content_type="application/json", headers=headers,
                        max_time=300)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(CONCURRENT)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def main(tap):
    rng = np.random.default_rng(11)
    a64 = rng.uniform(-1, 1, size=(M, K))
    b64 = rng.uniform(-1, 1, size=(K, N))
    a32, b32 = a64.astype(np.float32), b64.astype(np.float32)
    rounds = [
        ("float64, no dtype", body_of(a64, b64, None), "float64", a64, b64, False),
        ("float32, dtype after the matrices", body_of(a32, b32, "float32"), "float32", a32, b32, False),
        ("float32, chunked upload", body_of(a32, b32, "float32"), "float32", a32, b32, True),
    ]
    with Daemon(tap, config={"backend": "cpu", "http_threads": CONCURRENT + 2, "threads": 1,
                             "max_json_mb": 64}) as d:
        pid = d.proc.pid
        for name, body, dtype, a, b, chunked in rounds:
            ref = reference(a, b, dtype)
            matrices = (M * K + K * N + M * N) * np.dtype(dtype).itemsize
            # warm up with the same body: BLAS buffers, thread stacks and the allocator's
            # arenas are there before the peak is measured
            r = d.curl("POST", "/v1/matmul", data=body, content_type="application/json", max_time=300)
            tap.ok(r.status == 200, "%s: one %.1f MB body decodes" % (name, len(body) / 1e6), r)
            can_reset = reset_peak(pid)
            base = status_kb(pid, "VmRSS")
            answers = send_all(d, body, chunked)
            peak = status_kb(pid, "VmHWM")
            good = 0
            why = ""
            for r in answers:
                if r.status != 200:
                    why = repr(r)
                    continue
                ok, detail = compare(np.array((r.json() or {}).get("c", []), dtype=np.float64), ref, dtype, K)
                good += ok
                why = why or detail
            tap.ok(good == CONCURRENT, "%s: %d bodies at once, every C right" % (name, CONCURRENT), why)
            grew = (peak - base) * 1024
            bound = CONCURRENT * (2 * len(body) + matrices)
            tap.diag("%s: body %.1f MB, matrices %.1f MB per request; VmRSS before %.1f MB, VmHWM %.1f MB "
                     "(+%.1f MB for %d at once, %.1f MB each); bound %.1f MB"
                     % (name, len(body) / 1e6, matrices / 1e6, base / 1024, peak / 1024, grew / 1e6,
                        CONCURRENT, grew / CONCURRENT / 1e6, bound / 1e6))
            if SLOW > 1:
                tap.skip("%s: peak memory within 2x body + matrices per request" % name,
                         "sanitizer build: ASan's quarantine keeps freed memory resident")
            elif not can_reset or base is None or peak is None:
                tap.skip("%s: peak memory within 2x body + matrices per request" % name,
                         "cannot reset or read VmHWM of the daemon (/proc/PID/clear_refs)")
            else:
                tap.ok(grew <= bound, "%s: peak memory grew %.1f MB <= %.1f MB (2x body + matrices, x%d)"
                       % (name, grew / 1e6, bound / 1e6, CONCURRENT))
        r = d.curl("GET", "/healthz")
        tap.ok(r.status == 200, "healthz answers after the large bodies", r)


if __name__ == "__main__":
    run_guarded(Tap(), main)
