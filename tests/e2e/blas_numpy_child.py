"""blas_numpy_child.py - an ordinary NumPy program that tests/e2e/test_blas.py and
test_blas_wheels.py run under LD_PRELOAD=libgemm_blas.so (Debian's python3-numpy calls
cblas_sgemm / cblas_dgemm of libblas.so.3 for `a @ b`, NumPy's wheels their own OpenBLAS
under other names). Not a test by itself: it only multiplies and saves.

    python3 blas_numpy_child.py IN.npz OUT.npz [fork]

IN holds pairs a<i>, b<i> (float32 or float64). For each pair it stores in OUT:
  c<i>   a @ b                       (C-ordered operands)
  t<i>   (b.T @ a.T).T               (transposed views: the BLAS gets transpose flags)
  f<i>   asfortranarray(a) @ asfortranarray(b)
  s<i>   a[::2] @ b[:, ::2] on the matching rows of b (strided views)
and, when SciPy can be imported, through scipy.linalg.blas ([sd]gemm by the dtype):
  g<i>   gemm(1, a, b)
  h<i>   gemm(2, a.T, b, trans_a=1) on a's transpose, a Fortran-ordered view
With "fork": after the first product the process forks; the child computes c0 again
into OUT.child.npz and both go on, so a forked child offloads on its own connections.
"""

import os
import sys

import numpy as np

try:
    import scipy.linalg.blas as blas
except ImportError:
    blas = None


def products(data, out):
    i = 0
    while "a%d" % i in data:
        a, b = data["a%d" % i], data["b%d" % i]
        out["c%d" % i] = a @ b
        out["t%d" % i] = (b.T @ a.T).T
        out["f%d" % i] = np.asfortranarray(a) @ np.asfortranarray(b)
        k2 = b.shape[0] // 2 * 2
        out["s%d" % i] = a[::2, :k2:2] @ b[:k2:2, ::2]
        if blas is not None:
            gemm = blas.sgemm if a.dtype == np.float32 else blas.dgemm
            out["g%d" % i] = gemm(1.0, a, b)
            out["h%d" % i] = gemm(2.0, a.T, b, trans_a=1)
        i += 1


def main():
    src, dst = sys.argv[1], sys.argv[2]
    data = dict(np.load(src))
    out = {}
    if len(sys.argv) > 3 and sys.argv[3] == "fork":
        out["c0"] = data["a0"] @ data["b0"]
        pid = os.fork()
        if pid == 0:
            child = {"c0": data["a0"] @ data["b0"]}
            np.savez(dst + ".child.npz", **child)
            os._exit(0)
        out["c0_after_fork"] = data["a0"] @ data["b0"]
        _, status = os.waitpid(pid, 0)
        out["child_status"] = np.array(status)
    else:
        products(data, out)
    np.savez(dst, **out)


if __name__ == "__main__":
    main()
