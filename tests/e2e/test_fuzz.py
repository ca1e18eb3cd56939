#!/usr/bin/python3
"""test_fuzz.py - mutated request bodies (JSON 2-D and batched, raw binary, multipart .npy) and mutated
query strings, from a fixed seed: every answer is a product (200) or a JSON error with a
4xx status (never 5xx, never a dropped connection), the daemon stays up, exits 0 and,
under the sanitizers, reports nothing.

The requests go over http.client on one keep-alive connection at a time (many hundreds of
requests; a curl process each would dominate the run time).
"""
import http.client
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import SLOW, Daemon, Tap, npy_bytes, run_guarded  # noqa: E402

ROUNDS = int(os.environ.get("GEMMD_FUZZ_ROUNDS", "150"))


def mutate(rng, data):
    b = bytearray(data)
    for _ in range(int(rng.integers(1, 4))):
        op = int(rng.integers(0, 6))
        if not b:
            b += bytes([int(rng.integers(0, 256))])
            continue
        i = int(rng.integers(0, len(b)))
        if op == 0:  # flip a byte
            b[i] = int(rng.integers(0, 256))
        elif op == 1:  # truncate
            del b[i:]
        elif op == 2:  # delete a run
            del b[i:i + int(rng.integers(1, 16))]
        elif op == 3:  # duplicate a run
            j = min(len(b), i + int(rng.integers(1, 32)))
            b[i:i] = b[i:j]
        elif op == 4:  # insert an interesting token
            tok = [b"[", b"]", b"{", b"}", b",", b'"', b"-", b"1e400", b"\0", b"\r\n", b"--",
                   b"999999999999999999999", b"'shape': (", b"NaN"][int(rng.integers(0, 14))]
            b[i:i] = tok
        else:  # overwrite with digits
            for k in range(i, min(len(b), i + 4)):
                b[k] = ord("0") + int(rng.integers(0, 10))
    return bytes(b)


def seeds():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(12, dtype=np.float32).reshape(3, 4)
    js = json.dumps({"a": a.tolist(), "b": b.tolist(), "dtype": "float32"}).encode()
    jsd = json.dumps({"a": {"shape": [2, 3], "data": a.ravel().tolist()},
                      "b": {"shape": [3, 4], "data": b.ravel().tolist()}, "dtype": "int32"}).encode()
    a3 = np.arange(24, dtype=np.float32).reshape(4, 2, 3)
    b3 = np.arange(48, dtype=np.float32).reshape(4, 3, 4)
    js3 = json.dumps({"a": a3.tolist(), "b": b.tolist(), "dtype": "float64"}).encode()
    js3d = json.dumps({"dtype": "int32", "a": {"shape": [4, 2, 3], "data": a3.ravel().tolist()},
                       "b": b3.tolist()}).encode()
    raw = a.tobytes() + b.tobytes()
    bnd = b"fuzzboundary"
    mp = (b"--" + bnd + b"\r\nContent-Disposition: form-data; name=\"a\"; filename=\"A.npy\"\r\n"
          b"Content-Type: application/octet-stream\r\n\r\n" + npy_bytes(a) +
          b"\r\n--" + bnd + b"\r\nContent-Disposition: form-data; name=\"b\"; filename=\"B.npy\"\r\n\r\n" +
          npy_bytes(b, fortran=True) + b"\r\n--" + bnd + b"--\r\n")
    return [
        ("json", "/v1/matmul", "application/json", js),
        ("json-data", "/v1/jobs", "application/json", jsd),
        ("raw", "/v1/matmul?m=2&k=3&n=4&dtype=float32", "application/octet-stream", raw),
        ("npy", "/v1/matmul", "multipart/form-data; boundary=fuzzboundary", mp),
        ("json-batch", "/v1/matmul", "application/json", js3),
        ("json-batch-data", "/v1/jobs", "application/json", js3d),
    ]


def send(port, method, path, ctype, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30 * SLOW)
    try:
        c.request(method, path, body=body, headers={"Content-Type": ctype, "Content-Length": str(len(body))})
        r = c.getresponse()
        data = r.read()
        return r.status, dict((k.lower(), v) for k, v in r.getheaders()), data
    except (OSError, http.client.HTTPException) as e:
        return 0, {}, repr(e).encode()
    finally:
        c.close()


def good_answer(status, headers, data):
    if status in (200, 202):
        return True
    if not (400 <= status < 500):
        return False
    try:
        e = json.loads(data.decode())["error"]
        return bool(e["code"]) and bool(e["message"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return False


def main(tap):
    rng = np.random.default_rng(424242)
    with Daemon(tap, config={"backend": "cpu", "max_dim": 4096, "max_elements": 1 << 20, "max_body_mb": 4,
                             "max_json_mb": 1, "max_jobs": 100000, "job_ttl": 1}) as d:
        for name, path, ctype, body in seeds():
            st, h, data = send(d.port, "POST", path, ctype, body)
            tap.ok(st in (200, 202), "unmutated %s seed is accepted" % name, (st, data[:300]))
            bad = []
            for i in range(ROUNDS):
                mbody = mutate(rng, body)
                mpath = path
                if rng.random() < 0.3 and "?" in path:
                    mpath = path.split("?")[0] + "?" + mutate(rng, path.split("?")[1].encode()).decode("latin-1")
                    mpath = "".join(ch if 0x21 <= ord(ch) < 0x7f and ch != "#" else "%%%02X" % ord(ch)
                                    for ch in mpath)
                st, h, data = send(d.port, "POST", mpath, ctype, mbody)
                if not good_answer(st, h, data):
                    bad.append("%s #%d %s: %d %r (body %r)" % (name, i, mpath, st, data[:200], mbody[:120]))
            tap.ok(not bad, "%d mutated %s bodies: each a product or a 4xx JSON error" % (ROUNDS, name),
                   "\n".join(bad[:5]))
            r = d.curl("GET", "/healthz")
            tap.eq(r.status, 200, "daemon healthy after the %s mutations" % name)
        # mutated headers: Content-Type and Content-Length values
        bad = []
        for i in range(ROUNDS // 2):
            ctype = mutate(rng, b"multipart/form-data; boundary=fuzzboundary").decode("latin-1")
            ctype = "".join(ch for ch in ctype if 0x20 <= ord(ch) < 0x7f)
            st, h, data = send(d.port, "POST", "/v1/matmul", ctype, seeds()[3][3])
            if not good_answer(st, h, data):
                bad.append("Content-Type %r: %d %r" % (ctype, st, data[:200]))
        tap.ok(not bad, "%d mutated Content-Types: each a product or a 4xx JSON error" % (ROUNDS // 2),
               "\n".join(bad[:5]))


if __name__ == "__main__":
    run_guarded(Tap(), main)
