#!/usr/bin/env python3
"""test_smoke.py - the shortest end-to-end path through the real daemon.

Starts bin/gemmd (or $GEMMD_BIN) on a free loopback port with the CPU backend, then:
the JSON example, one raw and one .npy round trip checked against NumPy in float64, an
error answer, and SIGTERM -> exit status 0. Prints TAP.
"""
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GEMMD = os.environ.get("GEMMD_BIN", os.path.join(ROOT, "bin", "gemmd"))
if not os.path.isabs(GEMMD):
    GEMMD = os.path.join(ROOT, GEMMD)

results = []


def report(ok, name, detail=""):
    results.append(ok)
    n = len(results)
    print(("ok %d - %s" if ok else "not ok %d - %s") % (n, name))
    if not ok and detail:
        for line in str(detail).splitlines():
            print("#   " + line)
    sys.stdout.flush()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def curl(url, *args, body=None):
    """Runs curl; returns (status, headers dict (lower-case), body bytes)."""
    with tempfile.NamedTemporaryFile() as hdr, tempfile.NamedTemporaryFile() as out:
        cmd = ["curl", "-sS", "-D", hdr.name, "-o", out.name, *args, url]
        proc = subprocess.run(cmd, input=body, capture_output=True, timeout=60)
        if proc.returncode != 0:
            raise RuntimeError("curl failed: %s" % proc.stderr.decode(errors="replace"))
        lines = open(hdr.name, "rb").read().decode("latin-1").split("\r\n")
        status, headers = 0, {}
        for line in lines:
            if line.startswith("HTTP/"):
                status, headers = int(line.split()[1]), {}
            elif ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        return status, headers, open(out.name, "rb").read()


def wait_ready(base, proc):
    for _ in range(200):
        if proc.poll() is not None:
            return False
        try:
            st, _, _ = curl(base + "/healthz", "--max-time", "1")
            if st == 200:
                return True
        except RuntimeError:
            pass
        time.sleep(0.05)
    return False


def main():
    if not os.path.exists(GEMMD):
        print("1..0 # SKIP %s not built" % GEMMD)
        return 0
    port = free_port()
    base = "http://127.0.0.1:%d" % port
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([GEMMD, "--port", str(port), "--backend", "cpu"], stdout=log, stderr=log)
    print("1..6")
    try:
        ready = wait_ready(base, proc)
        report(ready, "daemon starts and answers /healthz")
        if not ready:
            log.seek(0)
            print("# " + log.read().decode(errors="replace").replace("\n", "\n# "))
            return 1

        # 1. the JSON example
        st, hd, body = curl(base + "/v1/matmul", "-H", "Content-Type: application/json",
                            "--data-binary", '{"a":[[1,2],[3,4]],"b":[[5,6],[7,8]]}')
        try:
            doc = json.loads(body)
            ok = st == 200 and doc["c"] == [[19, 22], [43, 50]] and doc["shape"] == [2, 2] \
                and "total_ms" in doc["timing"] and "server-timing" in hd
        except (ValueError, KeyError) as e:
            ok, doc = False, "%s: %r" % (e, body)
        report(ok, "JSON example answers c = [[19,22],[43,50]]", "status %d %r" % (st, doc))

        # 2. raw float32 round trip
        rng = np.random.default_rng(7)
        m, k, n = 37, 53, 29
        a = rng.integers(-8, 8, size=(m, k)).astype(np.float32)
        b = rng.integers(-8, 8, size=(k, n)).astype(np.float32)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        st, hd, body = curl(base + "/v1/matmul?m=%d&k=%d&n=%d&dtype=float32" % (m, k, n),
                            "-H", "Content-Type: application/octet-stream", "--data-binary", "@-",
                            body=a.tobytes() + b.tobytes())
        ok = st == 200 and len(body) == m * n * 4 and hd.get("x-gemm-shape") == "%d,%d" % (m, n)
        if ok:
            c = np.frombuffer(body, dtype="<f4").reshape(m, n)
            ok = np.allclose(c, ref, rtol=1e-5, atol=1e-4)
        report(ok, "raw float32 37x53 . 53x29 matches NumPy", "status %d headers %r" % (st, hd))

        # 3. npy (multipart) float64 round trip
        a = rng.standard_normal((17, 31))
        b = rng.standard_normal((31, 13))
        with tempfile.TemporaryDirectory() as d:
            pa, pb = os.path.join(d, "A.npy"), os.path.join(d, "B.npy")
            np.save(pa, a)
            np.save(pb, b)
            st, hd, body = curl(base + "/v1/matmul", "-F", "a=@%s" % pa, "-F", "b=@%s" % pb)
        ok = st == 200 and hd.get("content-type", "").startswith("application/x-npy")
        if ok:
            c = np.load(io.BytesIO(body))
            ok = c.shape == (17, 13) and c.dtype == np.float64 and np.allclose(c, a @ b, rtol=1e-12, atol=1e-12)
        report(ok, "npy float64 17x31 . 31x13 matches NumPy", "status %d headers %r body %r" % (st, hd, body[:200]))

        # 4. an error: shapes that do not fit
        st, hd, body = curl(base + "/v1/matmul", "-H", "Content-Type: application/json",
                            "--data-binary", '{"a":[[1,2,3]],"b":[[1,2]]}')
        try:
            err = json.loads(body)["error"]
            ok = st == 422 and err["code"] == "shape_mismatch" and err["message"]
        except (ValueError, KeyError, TypeError):
            ok = False
        report(ok, "mismatched shapes answer 422 shape_mismatch in JSON", "status %d %r" % (st, body))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "timeout"
        report(rc == 0, "SIGTERM stops the daemon with exit status 0", "exit status %r" % rc)
        log.seek(0)
        text = log.read().decode(errors="replace")
        if rc != 0 or "AddressSanitizer" in text or "runtime error" in text:
            print("# daemon log:\n# " + text.replace("\n", "\n# "))
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
