#!/usr/bin/python3
"""test_status_page.py - the status page in a real browser: headless Chromium (Debian's
chromium) loads GET / from a live CPU daemon with named tokens while products queue up
(cpu_delay_ms, and 320x320 products that keep the CPU busy) and some requests fail, lets the page's script fetch v1/status and draw
(--virtual-time-budget), and the rendered DOM (--dump-dom) must show the device, the queue,
the tokens' names and an error's code. Without a token the page asks for one.

Screenshots (--screenshot --window-size=1280,900) land in $GEMMD_BUILD/status-page.png (with
tokens, load and errors) and status-page-token.png (asking for a token); docs/ keeps a copy
of each (cp build/status-page*.png docs/ to refresh them).

chromium is installed by this test with apt-get when it runs as root; otherwise every
check is skipped, naming the command.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import REPO, SLOW, Daemon, Tap, run_guarded  # noqa: E402

INSTALL = "sudo apt-get install -y chromium"
BUILD = os.environ.get("GEMMD_BUILD", "build")
ALICE = "page-alice-" + os.urandom(8).hex()
BOB = "page-bob-" + os.urandom(8).hex()
THIRD = "page-third-" + os.urandom(8).hex()


def find_chromium():
    for p in (shutil.which("chromium"), shutil.which("chromium-browser"), "/usr/bin/chromium"):
        if p and os.access(p, os.X_OK):
            return p
    return None


def ensure_chromium():
    """chromium's path, installing Debian's package with apt-get when root and missing."""
    p = find_chromium()
    if p or os.geteuid() != 0 or not shutil.which("apt-get"):
        return p
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]
    for pre in ([], [["apt-get", "update", "-q"]]):
        for c in pre + [cmd]:
            subprocess.run(c, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, timeout=1200)
        p = find_chromium()
        if p:
            return p
    return None


def browse(exe, url, profile, *args):
    """Runs headless chromium on url; returns (rc, stdout, stderr)."""
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
           "--user-data-dir=" + profile, "--virtual-time-budget=8000"] + list(args) + [url]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=180 * SLOW)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def section(dom, sid):
    """The text of the element with id sid up to the next section, tags dropped."""
    m = re.search(r'id="%s"(.*?)(<section|</main>)' % sid, dom, re.S)
    text = re.sub(r"<[^>]+>", " ", m.group(1)) if m else ""
    return re.sub(r"\s+", " ", text).strip()


def png_size(path):
    """(width, height) of a PNG file, or None."""
    try:
        with open(path, "rb") as f:
            head = f.read(24)
    except OSError:
        return None
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def load(d, stop):
    """Small products from alice (three at once), 320x320 ones from bob, and a few
    failures, until stop."""
    big = np.random.default_rng(3).uniform(-1, 1, (2, 320, 320)).astype("<f8").tobytes()

    def product(tok, i):
        if tok == BOB:
            d.curl("POST", "/v1/matmul?m=320&k=320&n=320&dtype=float64", data=big,
                   content_type="application/octet-stream", headers=["Authorization: Bearer " + tok],
                   max_time=60 * SLOW)
            return
        body = json.dumps({"a": [[1.0, 2.0, i]], "b": [[3.0], [4.0], [1.0]]}).encode()
        d.curl("POST", "/v1/matmul", data=body, content_type="application/json",
               headers=["Authorization: Bearer " + tok], max_time=60 * SLOW)

    def client(tok, k):
        i = 0
        while not stop.is_set():
            product(tok, i)
            i += 1
            if tok == BOB and k == 0 and i % 3 == 0:  # failures with their codes
                d.curl("POST", "/v1/matmul", data=b'{"a": [[1, 2]], "b": [[1, 2]]}',
                       content_type="application/json", headers=["Authorization: Bearer " + BOB])
                d.curl("GET", "/v1/jobs/0123456789abcdef0123456789abcdef", headers=["Authorization: Bearer " + THIRD])
    threads = [threading.Thread(target=client, args=(tok, k)) for tok, k in ((ALICE, 0), (ALICE, 1), (ALICE, 2),
                                                                             (BOB, 0))]
    for t in threads:
        t.start()
    return threads


def main(tap):
    names = ["page renders the device", "page renders the queue", "page renders the tokens", "page renders the errors",
             "screenshot with tokens", "page asks for a token", "screenshot of the token prompt"]
    exe = ensure_chromium()
    if not exe:
        for n in names:
            tap.skip(n, "no chromium (Debian package chromium); install it: %s" % INSTALL)
        return
    tmp = tempfile.mkdtemp(prefix="gemmd-e2e-page-")
    out = os.path.join(REPO, BUILD)
    os.makedirs(out, exist_ok=True)
    tokens = os.path.join(tmp, "tokens")
    with open(tokens, "w") as f:
        f.write("alice %s\nbob %s\n%s\n" % (ALICE, BOB, THIRD))
    stop = threading.Event()
    threads = []
    cfg = {"backend": "cpu", "tokens_file": tokens, "fault_inject": "cpu_delay_ms:60", "log_level": "warn"}
    try:
        with Daemon(tap, config=cfg) as d:
            threads = load(d, stop)
            # wait (bounded) until products queue up and errors were answered
            deadline, s = time.monotonic() + 60 * SLOW, {}
            while time.monotonic() < deadline:
                s = d.curl("GET", "/v1/status", headers=["Authorization: Bearer " + ALICE]).json() or {}
                if s.get("queue", {}).get("queued", 0) >= 1 and len(s.get("errors", [])) >= 2 and \
                        sum(s.get("rates", {}).get("products", [])) >= 4:
                    break
                time.sleep(0.2)
            tap.ok(s.get("queue", {}).get("queued", 0) >= 1, "products are queued while the page loads",
                   s.get("queue"))

            shot = os.path.join(out, "status-page.png")
            url = "%s/#token=%s" % (d.base, ALICE)
            rc, dom, err = browse(exe, url, os.path.join(tmp, "profile1"), "--dump-dom")
            tap.ok(rc == 0 and "<html" in dom, "chromium loaded the page and dumped its DOM", err[-2000:])
            devs, queue = section(dom, "devices"), section(dom, "queue")
            tokens_text, errors_text = section(dom, "tokens"), section(dom, "errors")
            tap.ok(re.search(r"0: cpu", devs) and "busy" in devs, "page renders the device (its name, busy)", devs)
            tap.ok(re.search(r"queued \d+ of 64", queue) and "would wait" in queue,
                   "page renders the queue (queued of capacity, the wait)", queue)
            tap.ok("alice" in tokens_text and "bob" in tokens_text and "token3" in tokens_text and
                   ALICE not in dom and BOB not in dom, "page renders the tokens by name (never the secrets)",
                   tokens_text)
            tap.ok("shape_mismatch" in errors_text and "job_not_found" in errors_text,
                   "page renders the errors with their codes", errors_text)
            rc, _, err = browse(exe, url, os.path.join(tmp, "profile2"), "--screenshot=" + shot,
                                "--window-size=1280,900", "--hide-scrollbars")
            tap.ok(rc == 0 and png_size(shot) == (1280, 900) and os.path.getsize(shot) > 20000,
                   "screenshot with tokens: %s (1280x900)" % os.path.relpath(shot, REPO), err[-2000:])

            rc, dom, err = browse(exe, d.base + "/", os.path.join(tmp, "profile3"), "--dump-dom")
            tap.ok(rc == 0 and re.search(r'id="auth" class="wide on"', dom) and "needs a token" in dom,
                   "page asks for a token when it has none", err[-2000:])
            shot = os.path.join(out, "status-page-token.png")
            rc, _, err = browse(exe, d.base + "/", os.path.join(tmp, "profile4"), "--screenshot=" + shot,
                                "--window-size=1280,900", "--hide-scrollbars")
            tap.ok(rc == 0 and png_size(shot) == (1280, 900),
                   "screenshot of the token prompt: %s" % os.path.relpath(shot, REPO), err[-2000:])
            stop.set()
            for t in threads:
                t.join(timeout=120 * SLOW)
    finally:
        stop.set()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    run_guarded(Tap(), main)
