/*
 * k01_naive.cu - the starting point: one thread per element of C, walking a row of A and a
 * column of B straight from global memory, any shape and dtype. threadIdx.x runs along a
 * row of C, so a warp reads B and writes C coalesced and reads one element of A.
 */
#include "gemm_kernels.h"

namespace {

template <typename T>
__global__ void naive_kernel(int m, int n, int k, const T *__restrict__ A,
                             const T *__restrict__ B, T *__restrict__ C)
{
    typedef typename gemm_acc<T>::type acc_t;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    if (row >= m || col >= n)
        return;
    const T *a = A + (size_t)row * k;
    acc_t sum = 0;
    for (int p = 0; p < k; p++)
        sum += (acc_t)a[p] * (acc_t)B[(size_t)p * n + col];
    C[(size_t)row * n + col] = (T)sum;
}

template <typename T> cudaError_t run(const gemm_launch *l)
{
    dim3 block(32, 8);
    dim3 grid((unsigned)((l->n + 31) / 32), (unsigned)((l->m + 7) / 8));
    if (grid.y > 65535u)
        return cudaErrorInvalidConfiguration;
    naive_kernel<T><<<grid, block, 0, l->stream>>>(l->m, l->n, l->k, (const T *)l->A,
                                                   (const T *)l->B, (T *)l->C);
    return cudaGetLastError();
}

cudaError_t naive_launch(const gemm_launch *l)
{
    return gemm_by_dtype(l, [l](auto t) { return run<decltype(t)>(l); });
}

} // namespace

extern "C" const gemm_kernel_desc gemm_kernel_naive = {
    "naive",
    "one thread per element of C, operands read straight from global memory",
    (1u << GEMM_DTYPE_F32) | (1u << GEMM_DTYPE_F64) | (1u << GEMM_DTYPE_I32),
    (1u << GEMM_MATH_FP32),
    {0, 0, 0, 0},
    0,
    naive_launch,
    NULL,
    0, /* batches: one launch per product */
    NULL, 0,
};
