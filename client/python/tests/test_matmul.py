"""Client.matmul / Client.product against the real daemon: every dtype, odd shapes, input
layouts, the dtype rule, out=, timing, threads, reconnecting."""

import threading
import time

import numpy as np
import pytest

import gemmd
from conftest import SLOW, assert_product, daemon

DTYPES = [np.float32, np.float64, np.int32]
SHAPES = [(1, 1, 1), (1, 7, 1), (3, 5, 7), (17, 1, 33), (1, 300, 1), (127, 129, 65), (64, 64, 64),
          (250, 3, 2)]


def random_matrix(rng, shape, dtype):
    if np.dtype(dtype) == np.int32:
        return rng.integers(-1000, 1000, size=shape).astype(np.int32)
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("mkn", SHAPES, ids=lambda s: "%dx%dx%d" % s)
def test_every_dtype_and_odd_shapes(client, rng, dtype, mkn):
    m, k, n = mkn
    a = random_matrix(rng, (m, k), dtype)
    b = random_matrix(rng, (k, n), dtype)
    c = client.matmul(a, b)
    assert_product(c, a, b, dtype)
    assert c.flags.c_contiguous and c.flags.writeable


def test_int32_wraps_in_twos_complement(client):
    a = np.full((2, 3), 2**30, dtype=np.int32)
    b = np.full((3, 2), 7, dtype=np.int32)
    c = client.matmul(a, b)
    want = ((np.int64(2**30) * 7 * 3) + 2**31) % 2**32 - 2**31
    assert c.dtype == np.int32
    assert (c == want).all(), c


def test_float_specials_travel(client):
    a = np.array([[np.inf, 1.0], [np.nan, 0.0]], dtype=np.float64)
    b = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float64)
    c = client.matmul(a, b)
    assert c[0, 0] == np.inf
    assert np.isnan(c[1, 0])


@pytest.mark.parametrize("layout", ["fortran", "strided", "transposed", "negative", "bigendian", "list",
                                    "readonly"])
def test_input_layouts(client, rng, layout):
    base_a = rng.standard_normal((90, 140))
    base_b = rng.standard_normal((140, 60))
    if layout == "fortran":
        a, b = np.asfortranarray(base_a), np.asfortranarray(base_b)
    elif layout == "strided":
        a = rng.standard_normal((180, 420))[::2, ::3]
        b = rng.standard_normal((280, 60))[::2, :]
    elif layout == "transposed":
        a = rng.standard_normal((140, 90)).T
        b = rng.standard_normal((60, 140)).T
    elif layout == "negative":
        a, b = base_a[::-1, ::-1], base_b[:, ::-1]
    elif layout == "bigendian":
        a, b = base_a.astype(">f8"), base_b.astype(">f4")
    elif layout == "list":
        a, b = base_a.tolist(), base_b.tolist()
    else:
        a, b = base_a.copy(), base_b.copy()
        a.flags.writeable = False
        b.flags.writeable = False
    c = client.matmul(a, b)
    assert_product(c, np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), np.float64)


def test_no_copy_of_ready_inputs():
    """A C-contiguous input in the product's dtype goes out from its own buffer."""
    a = np.ones((8, 4), dtype=np.float32)
    b = np.ones((4, 3), dtype=np.float32)
    aw, bw, name = gemmd.prepare(a, b)
    assert name == "float32"
    assert aw is a and bw is b
    f = np.asfortranarray(np.ones((8, 4)))
    fw, _, name = gemmd.prepare(f, np.ones((4, 3)))
    assert name == "float64" and fw.flags.c_contiguous and not np.shares_memory(fw, f)
    # A C-contiguous slice of rows is sent as it is, too.
    big = np.ones((16, 4), dtype=np.float32)
    sw, _, _ = gemmd.prepare(big[4:12], b)
    assert np.shares_memory(sw, big)


@pytest.mark.parametrize("da,db,want", [
    (np.float32, np.float32, np.float32),
    (np.float32, np.float64, np.float64),
    (np.int32, np.float32, np.float64),
    (np.int32, np.int32, np.int32),
    (np.float16, np.float32, np.float32),
    (np.int16, np.int32, np.int32),
    (np.uint8, np.float32, np.float32),
], ids=lambda d: np.dtype(d).name)
def test_dtype_promotes_like_numpy(client, rng, da, db, want):
    a = rng.integers(-9, 9, size=(6, 5)).astype(da) if np.dtype(da).kind != "u" else \
        rng.integers(0, 9, size=(6, 5)).astype(da)
    b = rng.integers(-9, 9, size=(5, 4)).astype(db)
    assert np.result_type(a, b) == want  # the rule is NumPy's
    c = client.matmul(a, b)
    assert_product(c, a, b, want)


@pytest.mark.parametrize("da,db", [(np.int64, np.int64), (np.uint16, np.uint16), (np.int8, np.int8),
                                   (np.complex64, np.complex64), (np.bool_, np.bool_),
                                   (np.int32, np.int64)], ids=lambda d: np.dtype(d).name)
def test_dtypes_the_server_lacks_are_refused_locally(unused_url, da, db):
    c = gemmd.Client(unused_url)  # nothing listens: a TypeError proves nothing was sent
    with pytest.raises(TypeError, match="dtype="):
        c.matmul(np.ones((2, 2), dtype=da), np.ones((2, 2), dtype=db))


def test_dtype_argument_converts(client, rng):
    a = rng.integers(-50, 50, size=(9, 11))  # int64: refused without dtype=
    b = rng.integers(-50, 50, size=(11, 4))
    with pytest.raises(TypeError):
        client.matmul(a, b)
    for dt in DTYPES:
        c = client.matmul(a, b, dtype=dt)
        assert_product(c, a.astype(dt), b.astype(dt), dt)
    c = client.matmul(a.tolist(), b.tolist(), dtype="float32")
    assert c.dtype == np.float32


def test_out_receives_c(client, rng):
    a = rng.standard_normal((33, 44)).astype(np.float32)
    b = rng.standard_normal((44, 21)).astype(np.float32)
    out = np.full((33, 21), np.nan, dtype=np.float32)
    c = client.matmul(a, b, out=out)
    assert c is out
    assert_product(out, a, b, np.float32)
    with pytest.raises(ValueError, match="out must be"):
        client.matmul(a, b, out=np.empty((33, 21), dtype=np.float64))
    with pytest.raises(ValueError, match="out must be"):
        client.matmul(a, b, out=np.empty((21, 33), dtype=np.float32).T)


def test_product_reports_kernel_and_timing(client, rng):
    a = rng.standard_normal((256, 300))
    b = rng.standard_normal((300, 200))
    p = client.product(a, b)
    assert_product(p.c, a, b, np.float64)
    assert p.shape == (256, 200) and p.dtype == np.float64
    assert p.kernel == "openblas"
    assert p.device == "cpu"
    assert p.math == "exact"
    assert p.retries == 0 and p.job_id is None
    assert p.instance == client.info()["instance_id"] != ""
    t = p.timing
    assert isinstance(t, gemmd.Timing)
    assert t.total_ms > 0 and t.kernel_ms > 0 and t.recv_ms >= 0
    stages = t.recv_ms + t.decode_ms + t.queue_ms + t.h2d_ms + t.kernel_ms + t.d2h_ms + t.encode_ms
    assert stages <= t.total_ms + 1e-3  # the server's promise: stages never exceed total
    assert t.gflops == pytest.approx(2 * 256 * 300 * 200 / (t.kernel_ms * 1e6))
    assert t.wall_ms is not None and t.wall_ms > 0


def test_kernel_and_tile_options_reach_the_server(client, rng):
    a = rng.integers(-9, 9, size=(40, 30)).astype(np.int32)
    b = rng.integers(-9, 9, size=(30, 20)).astype(np.int32)
    p = client.product(a, b, kernel="blocked")
    assert p.kernel == "blocked"
    assert_product(p.c, a, b, np.int32)
    p = client.product(a.astype(np.float32), b.astype(np.float32), kernel="openblas", math="fp32")
    assert p.kernel == "openblas"
    assert_product(p.c, a, b, np.float32)


def test_threads_share_one_client(client, rng):
    mats = [(rng.standard_normal((50 + i, 40)), rng.standard_normal((40, 30 + i))) for i in range(4)]
    errors = []

    def work(i):
        try:
            for _ in range(5):
                a, b = mats[i]
                assert_product(client.matmul(a, b), a, b, np.float64)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120 * SLOW)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)


def test_reconnects_after_the_server_closed_an_idle_connection(rng):
    with daemon(connection_timeout=1) as d:
        with gemmd.Client(d.base) as c:
            a, b = rng.standard_normal((20, 30)), rng.standard_normal((30, 10))
            assert_product(c.matmul(a, b), a, b, np.float64)
            time.sleep(2.5)  # past connection_timeout: the daemon has closed the connection
            assert_product(c.matmul(a, b), a, b, np.float64)
            assert c.health() == {"status": "ok"}


def test_info_health_ready(client):
    info = client.info()
    assert info["backend"] == "cpu"
    assert set(info["dtypes"]) >= {"float32", "float64", "int32"}
    assert any(k["name"] == "openblas" for k in info["kernels"])
    assert client.health() == {"status": "ok"}
    assert client.ready() is True


def test_client_is_a_context_manager_and_reusable(server, rng):
    a, b = rng.standard_normal((4, 4)), rng.standard_normal((4, 4))
    c = gemmd.Client(server.base)
    with c:
        c.matmul(a, b)
    assert_product(c.matmul(a, b), a, b, np.float64)  # reconnects after close()
    c.close()
    assert "token" not in repr(gemmd.Client(server.base))
    assert "s3cret" not in repr(gemmd.Client(server.base, token="s3cret"))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shared", [False, True], ids=["b-each", "b-shared"])
def test_batches(client, rng, dtype, shared):
    nb, m, k, n = 7, 5, 9, 3
    a = random_matrix(rng, (nb, m, k), dtype)
    b = random_matrix(rng, (k, n) if shared else (nb, k, n), dtype)
    p = client.product(a, b)
    assert p.c.shape == (nb, m, n) and p.c.dtype == dtype
    assert p.batched.startswith("%d " % nb), p.batched
    for i in range(nb):
        assert_product(np.ascontiguousarray(p.c[i]), a[i], b if shared else b[i], dtype)
    assert p.timing.gflops == pytest.approx(2 * nb * m * n * k / (p.timing.kernel_ms * 1e6)) \
        if p.timing.kernel_ms > 0 else True


def test_batch_layouts_out_and_jobs(client, server, rng):
    a = np.asfortranarray(rng.standard_normal((4, 30, 20)))   # copied into row-major
    b = rng.standard_normal((4, 25, 20)).transpose(0, 2, 1)   # a stack of transposes
    out = np.empty((4, 30, 25))
    c = client.matmul(a, b, out=out)
    assert c is out
    for i in range(4):
        assert_product(np.ascontiguousarray(c[i]), a[i], b[i], np.float64)
    with pytest.raises(ValueError, match="out must be"):
        client.matmul(a, b, out=np.empty((30, 25)))
    job = client.submit(a, b[0])
    with job:
        p = job.product(timeout=60 * SLOW)
        assert p.c.shape == (4, 30, 25)
        for i in range(4):
            assert_product(np.ascontiguousarray(p.c[i]), a[i], b[0], np.float64)
        again = gemmd.Client(server.base).job(job.id).result(timeout=60 * SLOW)
        np.testing.assert_array_equal(again, p.c)
    one = client.matmul(a[:1], b[:1])  # a batch of one stays 3-D, as NumPy's matmul does
    assert one.shape == (1, 30, 25)
