"""Async jobs: submit, status, result, cancel, finding a job again by id; and the busy
server: 503 retried after Retry-After, timeouts, a failed job's error."""

import time

import numpy as np
import pytest

import gemmd
from conftest import SLOW, assert_product, daemon, readyz, wait_idle

DELAY_MS = int(1500 * SLOW)  # every product on the busy daemon takes at least this long


def wait_state(job, states, timeout=60.0):
    deadline = time.monotonic() + timeout * SLOW
    while time.monotonic() < deadline:
        st = job.status()
        if st.state in states:
            return st
        time.sleep(0.01)
    raise AssertionError("job %s never reached %s" % (job.id, states))


# ---------------------------------------------------------------- on the plain daemon

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32], ids=lambda d: np.dtype(d).name)
def test_submit_and_result(client, rng, dtype):
    a = (rng.standard_normal((70, 45)) * 100).astype(dtype)
    b = (rng.standard_normal((45, 33)) * 100).astype(dtype)
    job = client.submit(np.asfortranarray(a), b)
    assert isinstance(job, gemmd.Job) and job.id
    c = job.result(timeout=60 * SLOW)
    assert_product(c, a, b, dtype)
    st = job.status()
    assert st.state == "done" and st.finished and st.error is None
    assert st.shape == (70, 33) and st.k == 45 and st.dtype == np.dtype(dtype).name
    assert st.kernel in ("openblas", "blocked") and st.device == "cpu"
    assert st.timing.total_ms > 0 and st.expires_in_s is not None
    assert st.raw["id"] == job.id
    p = job.product()  # may be fetched again until it is forgotten
    assert_product(p.c, a, b, dtype)
    assert p.job_id == job.id and p.kernel == st.kernel
    assert p.timing.kernel_ms > 0 and p.timing.gflops > 0
    assert job.cancel() is True    # forgets it
    assert job.cancel() is False   # already forgotten
    with pytest.raises(gemmd.GemmError) as ei:
        job.status()
    assert ei.value.status == 404 and ei.value.code == "job_not_found"


def test_many_jobs_at_once(client, rng):
    work = [(rng.standard_normal((20 + i, 30)), rng.standard_normal((30, 10 + i))) for i in range(8)]
    jobs = [client.submit(a, b) for a, b in work]
    for job, (a, b) in zip(jobs, work):
        with job:
            assert_product(job.result(timeout=60 * SLOW), a, b, np.float64)
    assert all(j.cancel() is False for j in jobs)  # each forgotten when its block ended


def test_job_found_again_by_id(client, server, rng):
    a, b = rng.standard_normal((12, 8)).astype(np.float32), rng.standard_normal((8, 5)).astype(np.float32)
    job = client.submit(a, b)
    with gemmd.Client(server.base) as other:
        again = other.job(job.id)
        assert again.id == job.id
        out = np.zeros((12, 5), dtype=np.float32)
        c = again.result(timeout=60 * SLOW, out=out)
        assert c is out
        assert_product(c, a, b, np.float32)
        assert again.cancel()
    with pytest.raises(ValueError):
        client.job("")
    with pytest.raises(gemmd.GemmError) as ei:
        client.job("0123456789abcdef0123456789abcdef").result(timeout=5)
    assert ei.value.code == "job_not_found"


def test_wait_returns_the_last_status(client, rng):
    job = client.submit(rng.standard_normal((5, 5)), rng.standard_normal((5, 5)))
    with job:
        st = job.wait(timeout=60 * SLOW)
        assert st.finished and st.state == "done"


# ---------------------------------------------------------------- on a busy daemon

@pytest.fixture(scope="module")
def busy():
    """One worker, one queue slot, every product held DELAY_MS: the queue fills on demand."""
    with daemon(cpu_workers=1, queue_depth=1, fault_inject="cpu_delay_ms:%d" % DELAY_MS) as d:
        yield d


def fill_queue(c):
    """One job running and one queued: the next product gets 503 queue_full (for DELAY_MS)."""
    wait_idle(c.url)
    one = np.ones((4, 4))
    running = c.submit(one, one)
    wait_state(running, ("running",))
    queued = c.submit(one, one)
    assert queued.status().state == "queued"
    return running, queued


def test_503_without_retries_is_busy_error(busy):
    c = gemmd.Client(busy.base, retries=0)
    running, queued = fill_queue(c)
    with pytest.raises(gemmd.GemmBusyError) as ei:
        c.matmul(np.ones((3, 3)), np.ones((3, 3)))
    e = ei.value
    assert e.status == 503 and e.code == "queue_full" and e.retries == 0 and e.message
    assert c.ready() is False  # /readyz: the queue is full
    status, j = readyz(busy.base)
    assert status == 503 and j["error"]["code"] == "not_ready"
    with pytest.raises(gemmd.GemmBusyError):
        c.submit(np.ones((3, 3)), np.ones((3, 3)))
    for job in (running, queued):
        job.result(timeout=60 * SLOW)
        job.cancel()
    assert c.ready() is True


def test_503_is_retried_after_retry_after(busy, rng):
    c = gemmd.Client(busy.base, retries=20, timeout=60 * SLOW)
    running, queued = fill_queue(c)
    a, b = rng.standard_normal((6, 7)), rng.standard_normal((7, 8))
    t0 = time.monotonic()
    p = c.product(a, b)  # refused while the queue is full, then accepted
    waited = time.monotonic() - t0
    assert_product(p.c, a, b, np.float64)
    assert p.retries >= 1
    assert waited >= 0.9 * p.retries  # each retry waited the server's Retry-After: 1 (second)
    for job in (running, queued):
        assert job.status().state == "done"
        job.cancel()


def test_cancel_a_queued_job(busy):
    c = gemmd.Client(busy.base)
    running, queued = fill_queue(c)
    assert c.ready() is False
    assert queued.cancel() is True   # cancelled and forgotten: its queue place is free
    assert running.status().state == "running"
    assert c.ready() is True
    with pytest.raises(gemmd.GemmError) as ei:
        queued.result(timeout=10)
    assert ei.value.status == 404 and ei.value.code == "job_not_found"
    assert queued.cancel() is False
    assert_product(running.result(timeout=60 * SLOW), np.ones((4, 4)), np.ones((4, 4)), np.float64)
    assert running.cancel() is True


def test_cancel_a_running_job(busy, rng):
    c = gemmd.Client(busy.base)
    wait_idle(busy.base)
    job = c.submit(np.ones((5, 5)), np.ones((5, 5)))
    wait_state(job, ("running",))
    assert job.cancel() is True  # forgotten at once; the product stops before it computes
    with pytest.raises(gemmd.GemmError) as ei:
        job.status()
    assert ei.value.status == 404 and ei.value.code == "job_not_found"
    wait_idle(busy.base)         # the worker is free again
    a, b = rng.standard_normal((4, 6)), rng.standard_normal((6, 3))
    assert_product(c.matmul(a, b), a, b, np.float64)


def test_result_timeout(busy):
    c = gemmd.Client(busy.base)
    wait_idle(busy.base)
    job = c.submit(np.ones((3, 3)), np.ones((3, 3)))
    with pytest.raises(gemmd.GemmTimeoutError, match="still"):
        job.result(timeout=0.05)
    assert job.result(timeout=60 * SLOW).shape == (3, 3)
    job.cancel()


def test_request_timeout(busy):
    wait_idle(busy.base)
    c = gemmd.Client(busy.base, timeout=0.2)
    with pytest.raises(gemmd.GemmTimeoutError) as ei:
        c.matmul(np.ones((3, 3)), np.ones((3, 3)))  # the answer comes after DELAY_MS
    assert isinstance(ei.value, gemmd.GemmError) and ei.value.status is None
    wait_idle(busy.base)
    c.timeout = 60 * SLOW
    assert_product(c.matmul(np.eye(3), np.eye(3)), np.eye(3), np.eye(3), np.float64)


def test_failed_job_raises_its_error():
    with daemon(fault_inject="cpu_fail:2") as d, gemmd.Client(d.base) as c:
        one = np.ones((2, 2))
        assert_product(c.matmul(one, one), one, one, np.float64)  # the 1st product runs
        job = c.submit(one, one)                                  # the 2nd fails
        st = job.wait(timeout=60 * SLOW)
        assert st.state == "failed" and st.error.status == 500 and st.error.code == "backend_failure"
        with pytest.raises(gemmd.GemmError) as ei:
            job.result()
        assert ei.value.status == 500 and ei.value.code == "backend_failure"
        job.cancel()
        with pytest.raises(gemmd.GemmError) as ei:  # the 4th, synchronous, fails too
            c.matmul(one, one)                       # (the 3rd runs)
            c.matmul(one, one)
        assert ei.value.status == 500 and ei.value.code == "backend_failure"
