"""Fixtures for the gemmd package's tests: the real daemon on a free loopback port.

The daemon ($GEMMD_BIN, default bin/gemmd, CPU backend) is started the way the project's
end-to-end tests start it (tests/e2e/harness.py: a temporary config file, --port, bounded
start-up and shutdown), and each one is checked when it stops: exit status 0 on SIGTERM,
no sanitizer report in its log. References come from NumPy (float64), never from gemmd.
"""

import contextlib
import json
import os
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

import gemmd

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(REPO, "tests", "e2e"))
import harness  # noqa: E402  (the project's daemon harness)

SLOW = harness.SLOW  # sanitizer builds run several times slower: deadlines scale with it


class _Checks:
    """Stands in for harness.Tap: collects the daemon's own checks instead of printing TAP."""

    def __init__(self):
        self.daemons = []
        self.failures = []

    def ok(self, cond, name, diag=None):
        if not cond:
            self.failures.append("%s: %s" % (name, diag))
        return bool(cond)

    def skip(self, name, reason):
        pass

    def diag(self, what):
        pass


@contextlib.contextmanager
def daemon(wait=True, **config):
    """The real gemmd with these config keys (backend cpu unless given); yields the
    harness.Daemon (``.base`` is its URL). Fails the test if it does not stop cleanly."""
    if not os.access(harness.GEMMD_BIN, os.X_OK):
        pytest.fail("%s is not built: run make" % harness.GEMMD_BIN)
    checks = _Checks()
    cfg = {"backend": "cpu", "log_level": "warn"}
    cfg.update(config)
    try:
        d = harness.Daemon(checks, config=cfg, wait=wait)
    except Exception:
        for x in checks.daemons:
            x.kill_if_running()
            x.cleanup()
        raise
    try:
        yield d
    finally:
        d.stop_and_check()
        log = d.read_log()
        d.cleanup()
    if checks.failures:
        pytest.fail("\n".join(checks.failures) + "\n--- gemmd log ---\n" + log[-4000:])


def readyz(base):
    """(status, JSON) of GET /readyz, with urllib (independent of the client under test)."""
    try:
        with urllib.request.urlopen(base + "/readyz", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def wait_idle(base, timeout=60.0):
    """Waits until the daemon has nothing queued or running."""
    deadline = time.monotonic() + timeout * SLOW
    while time.monotonic() < deadline:
        _, j = readyz(base)
        if j.get("queued") == 0 and j.get("running") == 0:
            return
        time.sleep(0.02)
    raise AssertionError("the daemon did not become idle within %gs" % (timeout * SLOW))


def reference(a, b, dtype):
    """C = A·B from NumPy: exact int64 wrapped to int32 for int32, float64 otherwise."""
    if np.dtype(dtype) == np.int32:
        return (np.asarray(a, dtype=np.int64) @ np.asarray(b, dtype=np.int64)).astype(np.int32)
    return np.asarray(a, dtype=np.float64) @ np.asarray(b, dtype=np.float64)


def assert_product(c, a, b, dtype):
    """c is A·B in dtype: bit-exact for int32, within float32/float64 rounding otherwise."""
    dtype = np.dtype(dtype)
    assert isinstance(c, np.ndarray)
    assert c.dtype == dtype, "dtype %s, want %s" % (c.dtype, dtype)
    ref = reference(a, b, dtype)
    assert c.shape == ref.shape
    if dtype == np.int32:
        np.testing.assert_array_equal(c, ref)
        return
    k = np.shape(a)[1]
    eps = np.finfo(dtype).eps
    scale = np.abs(np.asarray(a, dtype=np.float64)) @ np.abs(np.asarray(b, dtype=np.float64))
    err = np.abs(c.astype(np.float64) - ref)
    bound = 2 * k * eps * scale + np.finfo(dtype).tiny
    assert np.all(err <= bound), "max error %g over bound at %s" % (
        err.max(), np.unravel_index(np.argmax(err - bound), err.shape))


@pytest.fixture(scope="session")
def server():
    """A plain CPU daemon shared by the tests that need nothing special."""
    with daemon() as d:
        yield d


@pytest.fixture
def client(server, monkeypatch):
    monkeypatch.delenv("GEMM_TOKEN", raising=False)
    with gemmd.Client(server.base, timeout=120 * SLOW) as c:
        yield c


@pytest.fixture(scope="session")
def unused_url():
    """A loopback URL nothing listens on."""
    return "http://127.0.0.1:%d" % harness.free_port()


@pytest.fixture
def rng():
    return np.random.default_rng(20261124)
