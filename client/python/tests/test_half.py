"""float16 and bfloat16 operands through the package: C in float32 by default and in the
operands' dtype with out_dtype; bfloat16 through ml_dtypes when it is installed, and a clear
TypeError when it is not. References: NumPy float64 products of the half inputs."""

import numpy as np
import pytest

import gemmd

try:
    import ml_dtypes
except ImportError:  # the package works without it; bfloat16 then cannot be represented
    ml_dtypes = None


def check(c, a, b, cdtype, unit):
    ref = a.astype(np.float64) @ b.astype(np.float64)
    k = a.shape[-1]
    tol = 1e-5 * k * np.abs(a.astype(np.float64)).max() * np.abs(b.astype(np.float64)).max() + unit * np.abs(ref) + 1e-6
    assert c.dtype == np.dtype(cdtype)
    assert c.shape == ref.shape
    assert (np.abs(c.astype(np.float64) - ref) <= tol).all()


@pytest.mark.parametrize("mkn", [(1, 1, 1), (5, 17, 3), (33, 64, 9)], ids=lambda s: "%dx%dx%d" % s)
def test_float16(client, rng, mkn):
    m, k, n = mkn
    a = rng.uniform(-1, 1, (m, k)).astype(np.float16)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float16)
    check(client.matmul(a, b), a, b, np.float32, 0)
    check(client.matmul(a, b, out_dtype=np.float16), a, b, np.float16, 2.0 ** -11)
    check(client.matmul(a, b, out_dtype="float32"), a, b, np.float32, 0)
    job = client.submit(a, b, out_dtype="float16")
    check(job.result(timeout=30), a, b, np.float16, 2.0 ** -11)


def test_out_dtype_refused(client):
    a = np.ones((2, 2), np.float16)
    with pytest.raises(ValueError, match="out_dtype float64 is not available for float16"):
        client.matmul(a, a, out_dtype=np.float64)
    with pytest.raises(ValueError, match="not available for float32"):
        client.matmul(a.astype(np.float32), a.astype(np.float32), out_dtype=np.float16)


@pytest.mark.skipif(ml_dtypes is None, reason="ml_dtypes is not installed (bfloat16 needs it)")
def test_bfloat16(client, rng):
    a = rng.uniform(-1, 1, (7, 19)).astype(ml_dtypes.bfloat16)
    b = rng.uniform(-1, 1, (19, 4)).astype(ml_dtypes.bfloat16)
    check(client.matmul(a, b), a, b, np.float32, 0)
    check(client.matmul(a, b, out_dtype=ml_dtypes.bfloat16), a, b, ml_dtypes.bfloat16, 2.0 ** -8)
    assert gemmd.wire_dtype(ml_dtypes.bfloat16) == "bfloat16"


@pytest.mark.skipif(ml_dtypes is not None, reason="ml_dtypes is installed")
def test_bfloat16_without_ml_dtypes(client):
    with pytest.raises(TypeError, match="ml_dtypes"):
        client.matmul(np.ones((2, 2)), np.ones((2, 2)), dtype="bfloat16")
