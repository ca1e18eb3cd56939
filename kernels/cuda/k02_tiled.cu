/*
 * k02_tiled.cu - the classic shared-memory tiling: a block computes a TILE x TILE tile of C
 * (16 or 32, 32 by default), loading one tile of A and one of B per k step, so each element
 * loaded from global memory is reused TILE times. Threads outside A or B load zeros;
 * threads outside C compute but do not store.
 */
#include "gemm_kernels.h"

namespace {

template <typename T, int TILE>
__global__ void tiled_kernel(int m, int n, int k, const T *__restrict__ A,
                             const T *__restrict__ B, T *__restrict__ C)
{
    typedef typename gemm_acc<T>::type acc_t;
    __shared__ T As[TILE][TILE];
    __shared__ T Bs[TILE][TILE + 1]; /* +1: no bank conflicts on the float64 column reads */

    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * TILE + ty;
    const int col = blockIdx.x * TILE + tx;
    acc_t sum = 0;

    for (int t = 0; t < k; t += TILE) {
        const int ac = t + tx, br = t + ty;
        As[ty][tx] = (row < m && ac < k) ? A[(size_t)row * k + ac] : T(0);
        Bs[ty][tx] = (br < k && col < n) ? B[(size_t)br * n + col] : T(0);
        __syncthreads();
#pragma unroll
        for (int p = 0; p < TILE; p++)
            sum += (acc_t)As[ty][p] * (acc_t)Bs[p][tx];
        __syncthreads();
    }
    if (row < m && col < n)
        C[(size_t)row * n + col] = (T)sum;
}

template <typename T, int TILE> cudaError_t run(const gemm_launch *l)
{
    dim3 block(TILE, TILE);
    dim3 grid((unsigned)((l->n + TILE - 1) / TILE), (unsigned)((l->m + TILE - 1) / TILE));
    if (grid.y > 65535u)
        return cudaErrorInvalidConfiguration;
    tiled_kernel<T, TILE><<<grid, block, 0, l->stream>>>(l->m, l->n, l->k, (const T *)l->A,
                                                         (const T *)l->B, (T *)l->C);
    return cudaGetLastError();
}

cudaError_t tiled_launch(const gemm_launch *l)
{
    if (l->tile != 0 && l->tile != 16 && l->tile != 32)
        return cudaErrorInvalidValue;
    return gemm_by_dtype(l, [l](auto t) { return l->tile == 16 ? run<decltype(t), 16>(l) : run<decltype(t), 32>(l); });
}

int tiled_plan(const gemm_launch *l, char *out, size_t cap)
{
    const int t = l->tile == 16 ? 16 : 32;
    return gemm_block_dims(out, cap, t, t, 0, t);
}

} // namespace

extern "C" const gemm_kernel_desc gemm_kernel_tiled = {
    "tiled",
    "shared-memory tiles of A and B (16 or 32), each loaded element reused TILE times",
    (1u << GEMM_DTYPE_F32) | (1u << GEMM_DTYPE_F64) | (1u << GEMM_DTYPE_I32),
    (1u << GEMM_MATH_FP32),
    {32, 16, 0, 0},
    0,
    tiled_launch,
    tiled_plan,
    0, /* batches: one launch per product */
    NULL, 0,
};
