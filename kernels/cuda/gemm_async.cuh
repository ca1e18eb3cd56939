/*
 * gemm_async.cuh - what the optimized kernels (k03 onwards) share (docs/KERNELS.md, "Shared
 * pieces"). An out-of-range element is copied with cp.async src-size 0, which fills zeros:
 * edge tiles are padded without a branch.
 */
#ifndef GEMM_ASYNC_CUH
#define GEMM_ASYNC_CUH

#include <stdint.h>

#include "gemm_kernels.h"

namespace gemm_async {

template <int BYTES>
__device__ __forceinline__ void cp_async(void *smem, const void *gmem, bool valid)
{
    static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async copies 4, 8 or 16 bytes");
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    const int src = valid ? BYTES : 0;
    if (BYTES == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
                     "r"(src));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(s), "l"(gmem),
                     "n"(BYTES), "r"(src));
}

__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N> __device__ __forceinline__ void wait_group()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* One ROWS x COLS tile of a row-major nrows x ncols matrix from (r0, c0) into dst (row
 * stride LD), E elements a copy, unrolled UNROLL times (0: fully). */
template <typename T, int THREADS, int ROWS, int COLS, int LD, int E, int UNROLL>
__device__ __forceinline__ void copy_tile(T *dst, const T *__restrict__ src, int nrows, int ncols, int r0, int c0)
{
    constexpr int V = COLS / E; /* copies per tile row */
#pragma unroll(UNROLL ? UNROLL : ROWS * V / THREADS)
    for (int s = 0; s < ROWS * V / THREADS; s++) {
        const int idx = threadIdx.x + s * THREADS;
        const int r = idx / V, c = (idx % V) * E;
        const bool ok = r0 + r < nrows && c0 + c < ncols;
        const T *p = ok ? src + (size_t)(r0 + r) * ncols + (c0 + c) : src;
        cp_async<E * sizeof(T)>(dst + r * LD + c, p, ok);
    }
}

/* Starts the copy of one k-step's tiles of A and B into As and Bs (zero-filled out of
 * range). VEC: 16-byte copies (the caller checked gemm_vec_ok), else one element a copy. */
template <typename T, typename Cfg, bool VEC>
__device__ __forceinline__ void load_tiles(T *As, T *Bs, const T *__restrict__ A, const T *__restrict__ B,
                                           int m, int n, int k, int bm, int bn, int k0)
{
    constexpr int E = VEC ? 16 / sizeof(T) : 1, U = VEC ? 0 : 4;
    copy_tile<T, Cfg::THREADS, Cfg::BM, Cfg::BK, Cfg::LDA, E, U>(As, A, m, k, bm, k0);
    copy_tile<T, Cfg::THREADS, Cfg::BK, Cfg::BN, Cfg::LDB, E, U>(Bs, B, k, n, k0, bn);
}

/* The multi-stage cp.async main loop of k04_mma and k05_dmma: STAGES - 1 k-tiles in flight;
 * step(kt % STAGES) is the kernel's lambda, inlined. A group is committed every iteration,
 * copies or not, so wait_group<STAGES - 2> always means "k-tile kt has landed". */
template <typename T, typename Cfg, bool VEC, typename Step>
__device__ __forceinline__ void mainloop(T *As, T *Bs, const T *__restrict__ A, const T *__restrict__ B,
                                         int m, int n, int k, int bm, int bn, Step &&step)
{
    const int KT = (k + Cfg::BK - 1) / Cfg::BK;
#pragma unroll
    for (int s = 0; s < Cfg::STAGES - 1; s++) {
        if (s < KT)
            load_tiles<T, Cfg, VEC>(As + s * Cfg::BM * Cfg::LDA, Bs + s * Cfg::BK * Cfg::LDB, A, B, m, n,
                                    k, bm, bn, s * Cfg::BK);
        commit();
    }

    for (int kt = 0; kt < KT; kt++) {
        wait_group<Cfg::STAGES - 2>();
        __syncthreads();
        {
            const int nt = kt + Cfg::STAGES - 1;
            if (nt < KT) {
                const int st = nt % Cfg::STAGES;
                load_tiles<T, Cfg, VEC>(As + st * Cfg::BM * Cfg::LDA, Bs + st * Cfg::BK * Cfg::LDB, A, B,
                                        m, n, k, bm, bn, nt * Cfg::BK);
            }
            commit();
        }
        step(kt % Cfg::STAGES);
    }
    wait_group<0>();
}

/* The first row and column of the block's BM x BN tile of C: blocks go in groups of 8 tile
 * rows that walk the tile columns together, so blocks running at once share A and B in L2. */
template <int BM, int BN> __device__ __forceinline__ void block_tile(int tiles_m, int tiles_n, int &bm, int &bn)
{
    const int pid = blockIdx.x, per_group = 8 * tiles_n, first_m = (pid / per_group) * 8;
    const int gsize = min(tiles_m - first_m, 8);
    bm = (first_m + (pid % per_group) % gsize) * BM;
    bn = ((pid % per_group) / gsize) * BN;
}

/* The accumulators of a warp's MI x NI mma tiles (MT rows each; the warp tile at row0,
 * col0) to C, bounds-checked: lane (g, t) of tile (i, j) holds (g + 8h, 2t..2t+1) in
 * elements 2h, 2h+1. VEC: C's rows allow pair stores. */
template <int MT, bool VEC, typename T, int MI, int NI, int ACC>
__device__ __forceinline__ void store_acc(T *C, T (&acc)[MI][NI][ACC], int m, int n, int row0, int col0, int g,
                                          int t)
{
#pragma unroll
    for (int i = 0; i < MI; i++) {
#pragma unroll
        for (int h = 0; h < ACC / 2; h++) {
            const int row = row0 + i * MT + g + 8 * h;
            if (row >= m)
                continue;
#pragma unroll
            for (int j = 0; j < NI; j++) {
                const int col = col0 + j * 8 + 2 * t;
                T *dst = C + (size_t)row * n + col;
                const T v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
                if (VEC && col + 1 < n) {
                    if constexpr (sizeof(T) == 4)
                        *reinterpret_cast<float2 *>(dst) = make_float2(v0, v1);
                    else
                        *reinterpret_cast<double2 *>(dst) = make_double2(v0, v1);
                } else {
                    if (col < n)
                        dst[0] = v0;
                    if (col + 1 < n)
                        dst[1] = v1;
                }
            }
        }
    }
}

/* Launches kern with one block of Cfg::THREADS per BM x BN tile of C, Cfg::SMEM shared. */
template <typename Cfg, typename T>
cudaError_t launch_tiles(void (*kern)(int, int, int, const T *, const T *, T *, int, int), const gemm_launch *l)
{
    const long long tm = (l->m + Cfg::BM - 1) / Cfg::BM, tn = (l->n + Cfg::BN - 1) / Cfg::BN;
    if (tm * tn > 0x7fffffffLL || tn * 8 > 0x7fffffffLL)
        return cudaErrorInvalidConfiguration;
    if (Cfg::SMEM > 48 * 1024) {
        const cudaError_t e =
            cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)Cfg::SMEM);
        if (e != cudaSuccess)
            return e;
    }
    kern<<<(unsigned)(tm * tn), Cfg::THREADS, Cfg::SMEM, l->stream>>>(
        l->m, l->n, l->k, (const T *)l->A, (const T *)l->B, (T *)l->C, (int)tm, (int)tn);
    return cudaGetLastError();
}

} // namespace gemm_async

/* Whether a row-major matrix with leading dimension ld (elements) can be read as VBYTES-wide
 * vectors: the base is aligned and every row starts on a vector boundary. */
static inline bool gemm_vec_ok(const void *p, long long ld, int elem, int vbytes)
{
    return ((uintptr_t)p % (uintptr_t)vbytes) == 0 && ((ld * elem) % vbytes) == 0;
}

#endif /* GEMM_ASYNC_CUH */
