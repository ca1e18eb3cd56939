"""Errors: found locally before sending, answered by the server (status, code, message),
no server at all, tokens, TLS, the environment defaults."""

import os
import shutil
import subprocess
import time

import numpy as np
import pytest

import gemmd
from conftest import SLOW, assert_product, daemon


# ---------------------------------------------------------------- local, before sending

@pytest.mark.parametrize("a_shape,b_shape,match", [
    ((2, 3), (4, 2), r"A is 2x3 and B is 4x2: A's columns \(3\) must equal B's rows \(4\)"),
    ((3,), (3, 2), "A must be a 2-D matrix or a 3-D stack"),
    ((2, 3), (2, 3, 2, 1), "B must be a 2-D matrix or a 3-D stack"),
    ((0, 3), (3, 2), "A is 0x3"),
    ((2, 0), (0, 2), "A is 2x0"),
    ((0, 2, 3), (3, 2), "A is 0x2x3"),
    ((2, 3), (4, 3, 2), "A is one 2x3 matrix and B a stack of 4"),
    ((4, 2, 3), (5, 3, 2), "A is a stack of 4 matrices and B a stack of 5"),
    ((4, 2, 3), (4, 2, 2), r"A is 4x2x3 and B is 4x2x2: A's columns \(3\) must equal B's rows \(2\)"),
], ids=["mismatch", "A-1d", "B-4d", "no-rows", "k-0", "no-batch", "2d-with-stack", "batch-counts",
        "batch-k"])
def test_shape_errors_are_raised_locally(unused_url, a_shape, b_shape, match):
    c = gemmd.Client(unused_url)  # nothing listens: a ValueError proves nothing was sent
    with pytest.raises(ValueError, match=match):
        c.matmul(np.ones(a_shape), np.ones(b_shape))
    with pytest.raises(ValueError, match=match):
        c.submit(np.ones(a_shape), np.ones(b_shape))


@pytest.mark.parametrize("kw,exc", [({"tile": 0}, ValueError), ({"tile": -3}, ValueError),
                                    ({"tile": True}, ValueError), ({"kernel": ""}, TypeError),
                                    ({"kernel": 3}, TypeError), ({"math": 1}, TypeError)],
                         ids=["tile-0", "tile-negative", "tile-bool", "kernel-empty", "kernel-int", "math-int"])
def test_bad_options_are_raised_locally(unused_url, kw, exc):
    with pytest.raises(exc):
        gemmd.Client(unused_url).matmul(np.ones((2, 2)), np.ones((2, 2)), **kw)


@pytest.mark.parametrize("url", ["ftp://host", "http://", "http://h:notaport", "http://h:1/?q=1"],
                         ids=["ftp", "no-host", "bad-port", "query"])
def test_bad_urls(url):
    with pytest.raises(ValueError):
        gemmd.Client(url)


# ---------------------------------------------------------------- answered by the server

@pytest.mark.parametrize("kw,status,code", [
    ({"kernel": "no_such_kernel"}, 422, "unknown_kernel"),
    ({"kernel": "openblas", "tile": 7}, 422, "bad_tile"),
    ({"math": "tf32"}, 422, "unsupported_math"),
    ({"math": "fp8"}, 422, "bad_option"),
], ids=["unknown-kernel", "bad-tile", "tf32-float64", "bad-math"])
def test_server_refusals_carry_status_code_message(client, kw, status, code):
    a, b = np.ones((4, 5)), np.ones((5, 3))  # float64: tf32 does not apply
    with pytest.raises(gemmd.GemmError) as ei:
        client.matmul(a, b, **kw)
    e = ei.value
    assert type(e) is gemmd.GemmError
    assert e.status == status
    assert e.code == code
    assert e.message and e.message in str(e) and e.code in str(e)
    # the connection is still good afterwards
    assert_product(client.matmul(a, b), a, b, np.float64)


def test_limits(rng):
    with daemon(max_dim=1000, max_body_mb=1) as d, gemmd.Client(d.base, timeout=60 * SLOW) as c:
        with pytest.raises(gemmd.GemmError) as ei:
            c.matmul(np.ones((2, 1001)), np.ones((1001, 2)))
        assert ei.value.status == 413 and ei.value.code == "too_large"
        # over max_body_mb: answered from the head, while the body is still on its way
        a, b = rng.standard_normal((400, 400)), rng.standard_normal((400, 400))
        with pytest.raises(gemmd.GemmError) as ei:
            c.matmul(a, b)
        assert ei.value.status == 413 and ei.value.code == "body_too_large"
        # far over it (the server stops reading past 64 MiB and closes): the 413 when it
        # could still be read, else a connection error; never a hang
        big = np.ones((4096, 2600))
        with pytest.raises(gemmd.GemmError) as ei:
            c.matmul(big, np.ones((2600, 1)))
        assert (ei.value.status, ei.value.code) == (413, "body_too_large") or \
            isinstance(ei.value, gemmd.GemmConnectionError), repr(ei.value)
        a, b = rng.standard_normal((30, 40)), rng.standard_normal((40, 20))
        assert_product(c.matmul(a, b), a, b, np.float64)


# ---------------------------------------------------------------- no server

def test_unreachable_server(unused_url):
    c = gemmd.Client(unused_url, connect_timeout=5)
    for call in (lambda: c.matmul(np.ones((2, 2)), np.ones((2, 2))), c.health, c.info, c.ready,
                 lambda: c.submit(np.ones((2, 2)), np.ones((2, 2)))):
        with pytest.raises(gemmd.GemmConnectionError) as ei:
            call()
        assert ei.value.status is None and unused_url in str(ei.value)
        assert isinstance(ei.value, gemmd.GemmError)


def test_server_that_goes_away(rng):
    a, b = rng.standard_normal((10, 10)), rng.standard_normal((10, 10))
    with daemon() as d:
        c = gemmd.Client(d.base, connect_timeout=5)
        assert_product(c.matmul(a, b), a, b, np.float64)
        d.stop()
        with pytest.raises(gemmd.GemmConnectionError):
            c.matmul(a, b)


# ---------------------------------------------------------------- tokens

@pytest.fixture(scope="module")
def token_server(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokens") / "tokens"
    path.write_text("# tokens for the tests\nanother-token\ns3cret-token-for-tests\n")
    with daemon(tokens_file=str(path)) as d:
        yield d


def test_401_without_or_with_a_wrong_token(token_server, monkeypatch):
    monkeypatch.delenv("GEMM_TOKEN", raising=False)
    a, b = np.ones((3, 3)), np.ones((3, 3))
    for tok in (None, "wrong"):
        c = gemmd.Client(token_server.base, token=tok)
        with pytest.raises(gemmd.GemmError) as ei:
            c.matmul(a, b)
        assert ei.value.status == 401 and ei.value.code == "unauthorized"
        with pytest.raises(gemmd.GemmError) as ei:
            c.info()
        assert ei.value.status == 401
        assert c.health() == {"status": "ok"}  # /healthz and /readyz need no token
        assert c.ready()


def test_token_argument_and_environment(token_server, monkeypatch, rng):
    a, b = rng.standard_normal((5, 6)), rng.standard_normal((6, 7))
    monkeypatch.delenv("GEMM_TOKEN", raising=False)
    assert_product(gemmd.Client(token_server.base, token="s3cret-token-for-tests").matmul(a, b), a, b,
                   np.float64)
    monkeypatch.setenv("GEMM_TOKEN", "another-token")
    monkeypatch.setenv("GEMM_SERVER", token_server.base)
    c = gemmd.Client()
    assert c.url == token_server.base
    assert_product(c.matmul(a, b), a, b, np.float64)
    job = c.submit(a, b)
    assert_product(job.result(timeout=60 * SLOW), a, b, np.float64)
    # a job belongs to the token that submitted it: another token does not see it
    other = gemmd.Client(token_server.base, token="s3cret-token-for-tests").job(job.id)
    with pytest.raises(gemmd.GemmError) as ei:
        other.status()
    assert ei.value.status == 404 and ei.value.code == "job_not_found"
    assert other.cancel() is False
    assert job.cancel()


def test_default_url_without_environment(monkeypatch):
    monkeypatch.delenv("GEMM_SERVER", raising=False)
    assert gemmd.Client().url == gemmd.DEFAULT_URL == "http://127.0.0.1:8080"
    assert gemmd.Client("localhost:9").url == "http://localhost:9"


# ---------------------------------------------------------------- https

@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    if not shutil.which("openssl"):
        pytest.skip("no openssl command to make a certificate")
    d = tmp_path_factory.mktemp("tls")
    cert, key = str(d / "cert.pem"), str(d / "key.pem")
    g = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                        "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if g.returncode != 0:
        pytest.skip("openssl could not make a certificate: %s" % g.stderr.decode()[-300:])
    with daemon(wait=False, tls_cert=cert, tls_key=key) as dmn:
        url = dmn.base.replace("http://", "https://")
        c = gemmd.Client(url, cafile=cert, connect_timeout=2)
        deadline = time.monotonic() + 30 * SLOW
        while True:
            try:
                c.health()
                break
            except gemmd.GemmConnectionError:
                if time.monotonic() > deadline or not dmn.alive():
                    raise
                time.sleep(0.1)
        c.close()
        yield url, cert


def test_https_with_cafile(tls_server, rng, monkeypatch):
    url, cert = tls_server
    a, b = rng.standard_normal((40, 50)).astype(np.float32), rng.standard_normal((50, 30)).astype(np.float32)
    with gemmd.Client(url, cafile=cert) as c:
        for _ in range(3):  # kept alive over TLS too
            assert_product(c.matmul(a, b), a, b, np.float32)
    monkeypatch.setenv("GEMM_CACERT", cert)
    with gemmd.Client(url) as c:
        assert_product(c.matmul(a, b), a, b, np.float32)


def test_https_refuses_an_unknown_certificate(tls_server, monkeypatch):
    url, _ = tls_server
    monkeypatch.delenv("GEMM_CACERT", raising=False)
    with pytest.raises(gemmd.GemmConnectionError, match="certificate"):
        gemmd.Client(url).health()
