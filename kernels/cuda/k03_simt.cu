/*
 * k03_simt.cu - the tuned CUDA-core kernel: exact float32, float64 and int32. What it adds
 * over k02_tiled, each step with its reason and measurement: docs/KERNELS.md, "k03_simt".
 * Tiles that cross an edge take the checked copy (zero fill) and the store is
 * bounds-checked, so any m, n, k >= 1 works; int32 accumulates in uint32 (wraps).
 */
#include <stdint.h>
#include <string.h>

#include "gemm_async.cuh"
#include "gemm_kernels.h"
#include "gemm_scratch.h"

namespace {

/* Four consecutive elements of shared memory into registers, 16 bytes per load. */
template <typename T> __device__ __forceinline__ void lds4(T (&r)[4], const T *p)
{
    if constexpr (sizeof(T) == 4) {
        uint4 v = *reinterpret_cast<const uint4 *>(p);
        r[0] = __builtin_bit_cast(T, v.x);
        r[1] = __builtin_bit_cast(T, v.y);
        r[2] = __builtin_bit_cast(T, v.z);
        r[3] = __builtin_bit_cast(T, v.w);
    } else {
        const double2 *q = reinterpret_cast<const double2 *>(p);
        double2 v0 = q[0], v1 = q[1];
        r[0] = v0.x;
        r[1] = v0.y;
        r[2] = v1.x;
        r[3] = v1.y;
    }
}

template <typename T, int BM_, int BN_, int BK_, int WM_, int WN_, int TM_, int TN_, int ST_> struct simt_cfg {
    static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_, TM = TM_, TN = TN_;
    static constexpr int STAGES = ST_;
    static constexpr int WARPS_M = BM / WM, WARPS_N = BN / WN;
    static constexpr int THREADS = WARPS_M * WARPS_N * 32;
    static constexpr int LM = WM / TM, LN = WN / TN; /* lanes along m and n */
    static constexpr int APAD = 16 / (int)sizeof(T); /* keeps rows 16-byte aligned */
    static constexpr int LDA = BM + APAD, LDB = BN;
    static constexpr int VB = 16 / (int)sizeof(T); /* elements per 16-byte vector of B */
    static constexpr size_t SMEM = (size_t)STAGES * BK * (LDA + LDB) * sizeof(T);
    /* Blocks per SM the register budget is capped for (__launch_bounds__). */
    static constexpr int MINB =
        TM * TN * (int)sizeof(T) > 256 ? 1 : (THREADS >= 256 || TM * TN * (int)sizeof(T) >= 256 ? 2 : 3);
    static_assert(BM % WM == 0 && BN % WN == 0, "warp tiles must divide the block tile");
    static_assert(WM % TM == 0 && WN % TN == 0, "thread tiles must divide the warp tile");
    static_assert(LM * LN == 32, "a warp tile must hold exactly 32 thread tiles");
    static_assert(TM % 4 == 0 && TN % 4 == 0, "thread tiles are made of 4x4 blocks");
    static_assert(THREADS <= 1024, "too many threads");
    static_assert((BM * BK) % THREADS == 0, "A tile copy must divide evenly among threads");
    static_assert((BK * BN) % THREADS == 0, "B tile copy must divide evenly among threads");
    static_assert((BK * BN / VB) % THREADS == 0, "B vector copy must divide evenly");
    static_assert(STAGES >= 2 && STAGES <= 4, "2 to 4 pipeline stages");
};

/* p + step, computed where it stands: the compiler may not hoist the pointers of every pass
 * out of the k loop, which would hold 2 registers per pass for the whole kernel and spill. */
template <typename T> __device__ __forceinline__ const T *step_ptr(const T *p, size_t step_bytes)
{
    const T *q;
    asm volatile("add.s64 %0, %1, %2;" : "=l"(q) : "l"(p), "l"(step_bytes));
    return q;
}

/* The copy of one k-step's tiles wholly in range: no predicates, no zero fill, addresses as
 * offsets from row pointers that advance a tile per step (docs/KERNELS.md, "k03_simt"). */
template <typename T, typename Cfg, bool VECB> struct fast_loader {
    /* A: BK threads across a k-step, one element each per pass: whole 64-byte rows per pair
     * of warp lanes (four k values a thread, `amap0`, cost 33% excess sectors: KERNELS.md) */
    static constexpr int KQ = Cfg::BK;
    static constexpr int AROWS = Cfg::THREADS / KQ;    /* A rows per pass */
    static constexpr int AH = Cfg::BM / AROWS;         /* passes over A */
    static constexpr int BW = VECB ? Cfg::BN / Cfg::VB : 32; /* threads across a row of B */
    static constexpr int BCOLS = VECB ? 1 : Cfg::BN / 32;    /* copies per row (elements) */
    static constexpr int BROWS = Cfg::THREADS / BW;          /* B rows per pass */
    static constexpr int BH = Cfg::BK / BROWS;               /* passes over B */
    static_assert(Cfg::BK % 4 == 0 && Cfg::THREADS % KQ == 0, "A loader: whole rows of threads");
    static_assert(Cfg::BM % AROWS == 0 && AH >= 1, "A loader: whole passes");
    static_assert(Cfg::THREADS % BW == 0 && Cfg::BK % BROWS == 0 && BH >= 1,
                  "B loader: whole passes");
    static_assert(VECB || Cfg::BN % 32 == 0, "B loader: 32 lanes across a row");

    const T *a;     /* this thread's first A row at the current k-step */
    size_t astep;   /* bytes between this thread's A rows of consecutive passes */
    const T *b;     /* first B row of this thread at the current k-step */
    size_t bstep;   /* bytes between this thread's B rows of consecutive passes */
    int adst, bdst; /* shared-memory offsets within a stage */

    __device__ __forceinline__ fast_loader(const T *A, const T *B, int n, int k, int bm, int bn,
                                           int k0)
    {
        const int t = threadIdx.x;
        a = A + (size_t)(bm + t / KQ) * k + k0 + t % KQ;
        astep = (size_t)AROWS * k * sizeof(T);
        adst = (t % KQ) * Cfg::LDA + t / KQ;
        const int bc = VECB ? (t % BW) * Cfg::VB : t % BW;
        b = B + (size_t)(k0 + t / BW) * n + bn + bc;
        bstep = (size_t)BROWS * n * sizeof(T);
        bdst = (t / BW) * Cfg::LDB + bc;
    }
    /* Copies the tile at the current k-step into (As, Bs) and advances one step. */
    __device__ __forceinline__ void load(T *As, T *Bs)
    {
        const T *src = a;
#pragma unroll
        for (int h = 0; h < AH; h++) {
            gemm_async::cp_async<sizeof(T)>(As + adst + h * AROWS, src, true);
            if (h + 1 < AH)
                src = step_ptr(src, astep);
        }
        a += Cfg::BK;
        src = b;
#pragma unroll
        for (int h = 0; h < BH; h++) {
            if (VECB) {
                gemm_async::cp_async<16>(Bs + bdst + h * BROWS * Cfg::LDB, src, true);
            } else {
#pragma unroll
                for (int c = 0; c < BCOLS; c++)
                    gemm_async::cp_async<sizeof(T)>(Bs + bdst + h * BROWS * Cfg::LDB + c * 32,
                                                    src + c * 32, true);
            }
            if (h + 1 < BH)
                src = step_ptr(src, bstep);
        }
        b = step_ptr(b, (size_t)BH * bstep);
    }
    /* Skips one k-step (the edge loader copied it). */
    __device__ __forceinline__ void skip()
    {
        a += Cfg::BK;
        b = step_ptr(b, (size_t)BH * bstep);
    }
};

/* The general copy, for tiles that cross an edge: every element checked, zeros outside. */
template <typename T, typename Cfg, bool VECB>
__device__ __forceinline__ void load_tile(T *As, T *Bs, const T *__restrict__ A,
                                          const T *__restrict__ B, int m, int n, int k,
                                          int bm, int bn, int k0)
{
    const int tid = threadIdx.x;
    /* A: BM x BK elements, stored transposed As[kk][mm]; consecutive threads walk k. */
#pragma unroll
    for (int s = 0; s < Cfg::BM * Cfg::BK / Cfg::THREADS; s++) {
        const int idx = tid + s * Cfg::THREADS;
        const int kk = idx % Cfg::BK, mm = idx / Cfg::BK;
        const int gr = bm + mm, gc = k0 + kk;
        const bool ok = gr < m && gc < k;
        const T *src = ok ? A + (size_t)gr * k + gc : A;
        gemm_async::cp_async<sizeof(T)>(As + kk * Cfg::LDA + mm, src, ok);
    }
    if (VECB) {
        constexpr int VPR = Cfg::BN / Cfg::VB; /* vectors per row of the tile */
#pragma unroll
        for (int s = 0; s < Cfg::BK * VPR / Cfg::THREADS; s++) {
            const int idx = tid + s * Cfg::THREADS;
            const int kk = idx / VPR, nn = (idx % VPR) * Cfg::VB;
            const int gr = k0 + kk, gc = bn + nn;
            const bool ok = gr < k && gc < n; /* n % VB == 0: a vector is all in or all out */
            const T *src = ok ? B + (size_t)gr * n + gc : B;
            gemm_async::cp_async<16>(Bs + kk * Cfg::LDB + nn, src, ok);
        }
    } else {
#pragma unroll
        for (int s = 0; s < Cfg::BK * Cfg::BN / Cfg::THREADS; s++) {
            const int idx = tid + s * Cfg::THREADS;
            const int kk = idx / Cfg::BN, nn = idx % Cfg::BN;
            const int gr = k0 + kk, gc = bn + nn;
            const bool ok = gr < k && gc < n;
            const T *src = ok ? B + (size_t)gr * n + gc : B;
            gemm_async::cp_async<sizeof(T)>(Bs + kk * Cfg::LDB + nn, src, ok);
        }
    }
}

/* SPLIT: blockIdx.y is a piece of k (split-k). A separate instance, so that the kernel
 * without it keeps its loop exactly (the piece arithmetic cost 3.5% at 4096^3 when shared). */
template <typename T, typename Cfg, bool VECB, bool SPLIT>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MINB)
simt_kernel(int m, int n, int k, const T *__restrict__ A, const T *__restrict__ B,
            T *__restrict__ C, int tiles_m, int tiles_n, int kt_split)
{
    typedef typename gemm_acc<T>::type acc_t;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *As = reinterpret_cast<T *>(smem_raw);
    T *Bs = As + Cfg::STAGES * Cfg::BK * Cfg::LDA;

    int bm, bn;
    gemm_async::block_tile<Cfg::BM, Cfg::BN>(tiles_m, tiles_n, bm, bn);

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = (warp / Cfg::WARPS_N) * Cfg::WM, wn = (warp % Cfg::WARPS_N) * Cfg::WN;
    const int lm = lane / Cfg::LN, ln = lane % Cfg::LN;

    acc_t acc[Cfg::TM][Cfg::TN] = {};

    /* KT k-steps from kt0; tile t is k-step kt0 + t. Split-k: piece blockIdx.y writes its
     * partial product to slice blockIdx.y of C (the scratch). */
    int KT = (k + Cfg::BK - 1) / Cfg::BK, kt0 = 0;
    if constexpr (SPLIT) {
        kt0 = blockIdx.y * kt_split;
        KT = min(KT - kt0, kt_split);
        C += (size_t)blockIdx.y * m * n;
    }
    /* Tiles wholly in range take the fast copy, the rest the checked one (fl skips them). */
    const bool interior = bm + Cfg::BM <= m && bn + Cfg::BN <= n;
    const int kfull = interior ? k / Cfg::BK - kt0 : 0;
    fast_loader<T, Cfg, VECB> fl(A, B, n, k, bm, bn, kt0 * Cfg::BK);
    auto start_tile = [&](int t) {
        T *as = As + (t % Cfg::STAGES) * Cfg::BK * Cfg::LDA;
        T *bs = Bs + (t % Cfg::STAGES) * Cfg::BK * Cfg::LDB;
        if (t < kfull) {
            fl.load(as, bs);
        } else {
            load_tile<T, Cfg, VECB>(as, bs, A, B, m, n, k, bm, bn, (kt0 + t) * Cfg::BK);
            fl.skip();
        }
    };
#pragma unroll
    for (int s = 0; s < Cfg::STAGES - 1; s++) {
        if (s < KT)
            start_tile(s);
        gemm_async::commit();
    }

    for (int kt = 0; kt < KT; kt++) {
        gemm_async::wait_group<Cfg::STAGES - 2>();
        __syncthreads(); /* tile kt visible to all; stage (kt-1) no longer read by anyone */
        if (kt + Cfg::STAGES - 1 < KT)
            start_tile(kt + Cfg::STAGES - 1);
        gemm_async::commit();
        const int st = kt % Cfg::STAGES;
        const T *as = As + st * Cfg::BK * Cfg::LDA + wm + lm * 4;
        const T *bs = Bs + st * Cfg::BK * Cfg::LDB + wn + ln * 4;
#pragma unroll
        for (int kk = 0; kk < Cfg::BK; kk++) {
            T a[Cfg::TM], b[Cfg::TN];
#pragma unroll
            for (int i = 0; i < Cfg::TM / 4; i++)
                lds4<T>(*reinterpret_cast<T(*)[4]>(&a[i * 4]), as + kk * Cfg::LDA + i * Cfg::LM * 4);
#pragma unroll
            for (int j = 0; j < Cfg::TN / 4; j++)
                lds4<T>(*reinterpret_cast<T(*)[4]>(&b[j * 4]), bs + kk * Cfg::LDB + j * Cfg::LN * 4);
#pragma unroll
            for (int i = 0; i < Cfg::TM; i++)
#pragma unroll
                for (int j = 0; j < Cfg::TN; j++)
                    acc[i][j] += (acc_t)a[i] * (acc_t)b[j];
        }
    }
    gemm_async::wait_group<0>(); /* nothing may be in flight when the block exits */

#pragma unroll
    for (int i = 0; i < Cfg::TM; i++) {
        const int row = bm + wm + (i / 4) * Cfg::LM * 4 + lm * 4 + (i % 4);
        if (row >= m)
            continue;
#pragma unroll
        for (int j4 = 0; j4 < Cfg::TN / 4; j4++) {
            const int col = bn + wn + j4 * Cfg::LN * 4 + ln * 4;
            T *dst = C + (size_t)row * n + col;
            if (VECB && col + 3 < n) {
                if constexpr (sizeof(T) == 4) {
                    uint4 v;
                    v.x = __builtin_bit_cast(uint32_t, (T)acc[i][j4 * 4 + 0]);
                    v.y = __builtin_bit_cast(uint32_t, (T)acc[i][j4 * 4 + 1]);
                    v.z = __builtin_bit_cast(uint32_t, (T)acc[i][j4 * 4 + 2]);
                    v.w = __builtin_bit_cast(uint32_t, (T)acc[i][j4 * 4 + 3]);
                    *reinterpret_cast<uint4 *>(dst) = v;
                } else {
                    double2 *d2 = reinterpret_cast<double2 *>(dst);
                    d2[0] = make_double2(acc[i][j4 * 4 + 0], acc[i][j4 * 4 + 1]);
                    d2[1] = make_double2(acc[i][j4 * 4 + 2], acc[i][j4 * 4 + 3]);
                }
            } else {
#pragma unroll
                for (int c = 0; c < 4; c++)
                    if (col + c < n)
                        dst[c] = (T)acc[i][j4 * 4 + c];
            }
        }
    }
}

/* C = the sum of the `splits` partial products in W (slices of mn elements), added in
 * slice order: the same answer on every run. int32 adds in uint32 (wraps). */
template <typename T>
__global__ void __launch_bounds__(256) split_sum(const T *__restrict__ W, T *__restrict__ C,
                                                 size_t mn, int splits)
{
    typedef typename gemm_acc<T>::type acc_t;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < mn;
         i += (size_t)gridDim.x * blockDim.x) {
        acc_t s = (acc_t)W[i];
        for (int z = 1; z < splits; z++)
            s += (acc_t)W[(size_t)z * mn + i];
        C[i] = (T)s;
    }
}

/* Partial products larger than this are not worth their traffic: split-k is for products
 * whose C is small next to A and B. */
constexpr size_t SPLIT_SCRATCH_MAX = 256u << 20;

/* The pieces Cfg really cuts k into when asked for `splits` (whole k-steps, none empty,
 * scratch within SPLIT_SCRATCH_MAX; *kt_split: k-steps a piece), for launcher and plan. */
template <typename T, typename Cfg> int split_pieces(const gemm_launch *l, int splits, int *kt_split)
{
    const int KT = (l->k + Cfg::BK - 1) / Cfg::BK;
    if (splits < 1)
        splits = 1;
    if (splits > 65535)
        splits = 65535;
    /* the scratch limit of the whole product a panel is part of: the same pieces */
    const size_t mn = (size_t)gemm_plan_rows(l) * (size_t)l->n;
    while (splits > 1 && (size_t)splits * mn * sizeof(T) > SPLIT_SCRATCH_MAX)
        splits--;
    *kt_split = (KT + splits - 1) / splits;
    return (KT + *kt_split - 1) / *kt_split;
}

/* Runs Cfg with k cut into `splits` pieces; only SPLIT configurations carry that instance. */
template <typename T, typename Cfg, bool SPLIT = false>
cudaError_t run_cfg(const gemm_launch *l, int splits)
{
    const long long tm = (l->m + Cfg::BM - 1) / Cfg::BM, tn = (l->n + Cfg::BN - 1) / Cfg::BN;
    if (tm * tn > 0x7fffffffLL || (tn * 8) > 0x7fffffffLL)
        return cudaErrorInvalidConfiguration;
    int kt_split;
    splits = split_pieces<T, Cfg>(l, SPLIT ? splits : 1, &kt_split);
    const size_t mn = (size_t)l->m * (size_t)l->n;

    T *out = (T *)l->C;
    cudaError_t e = cudaSuccess;
    if (splits > 1) {
        void *w = nullptr;
        e = gemm_scratch_alloc(&w, (size_t)splits * mn * sizeof(T), l->stream);
        if (e != cudaSuccess)
            return e;
        out = (T *)w;
    }
    /* With split-k the 16-byte stores go to the scratch slices: each starts 16-byte aligned
     * when rows are whole vectors, which gemm_vec_ok asks of n anyway. */
    const bool vecb = gemm_vec_ok(l->B, l->n, (int)sizeof(T), 16) &&
                      gemm_vec_ok(out, l->n, (int)sizeof(T), 16);
    void (*kern)(int, int, int, const T *, const T *, T *, int, int, int) =
        vecb ? simt_kernel<T, Cfg, true, false> : simt_kernel<T, Cfg, false, false>;
    if constexpr (SPLIT) {
        if (splits > 1)
            kern = vecb ? simt_kernel<T, Cfg, true, true> : simt_kernel<T, Cfg, false, true>;
    }
    if (Cfg::SMEM > 48 * 1024)
        e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)Cfg::SMEM);
    if (e == cudaSuccess) {
        kern<<<dim3((unsigned)(tm * tn), (unsigned)splits), Cfg::THREADS, Cfg::SMEM, l->stream>>>(
            l->m, l->n, l->k, (const T *)l->A, (const T *)l->B, out, (int)tm, (int)tn, kt_split);
        e = cudaGetLastError();
    }
    if (splits > 1) {
        if (e == cudaSuccess) {
            const size_t blocks = (mn + 255) / 256;
            split_sum<T><<<(unsigned)(blocks < 8192 ? blocks : 8192), 256, 0, l->stream>>>(
                out, (T *)l->C, mn, splits);
            e = cudaGetLastError();
        }
        const cudaError_t f = cudaFreeAsync(out, l->stream);
        if (e == cudaSuccess)
            e = f;
    }
    return e;
}

/* The float32 variants of the tuning sweep (bench_kernels --tune; docs/KERNELS.md): name,
 * split-k pieces, configuration. */
#define SIMT_F32_VARIANTS(X)                                                                  \
    X("128x128x8 warp64x32 thr8x8 st2", 1, simt_cfg<float, 128, 128, 8, 64, 32, 8, 8, 2>)     \
    X("128x128x8 warp64x32 thr8x8 st3", 1, simt_cfg<float, 128, 128, 8, 64, 32, 8, 8, 3>)     \
    X("128x128x8 warp32x64 thr8x8 st2", 1, simt_cfg<float, 128, 128, 8, 32, 64, 8, 8, 2>)     \
    X("128x64x16 warp64x32 thr8x8 st2", 1, simt_cfg<float, 128, 64, 16, 64, 32, 8, 8, 2>)     \
    X("64x64x16 warp32x32 thr4x8 st2", 1, simt_cfg<float, 64, 64, 16, 32, 32, 4, 8, 2>)       \
    X("256x128x8 warp64x64 thr16x8 st3", 1, simt_cfg<float, 256, 128, 8, 64, 64, 16, 8, 3>)   \
    X("128x128x8 warp32x64 thr8x8 st2 split2", 2, simt_cfg<float, 128, 128, 8, 32, 64, 8, 8, 2>) \
    X("128x128x8 warp32x64 thr8x8 st2 split3", 3, simt_cfg<float, 128, 128, 8, 32, 64, 8, 8, 2>) \
    X("128x128x8 warp32x64 thr8x8 st2 split4", 4, simt_cfg<float, 128, 128, 8, 32, 64, 8, 8, 2>) \
    X("128x128x8 warp32x64 thr8x8 st2 split8", 8, simt_cfg<float, 128, 128, 8, 32, 64, 8, 8, 2>) \
    X("128x128x8 warp32x64 thr8x8 st2 split16", 16, simt_cfg<float, 128, 128, 8, 32, 64, 8, 8, 2>) \
    X("128x128x8 warp32x64 thr8x8 st2 split32", 32, simt_cfg<float, 128, 128, 8, 32, 64, 8, 8, 2>) \
    X("128x64x16 warp64x32 thr8x8 st2 split2", 2, simt_cfg<float, 128, 64, 16, 64, 32, 8, 8, 2>) \
    X("128x64x16 warp64x32 thr8x8 st2 split4", 4, simt_cfg<float, 128, 64, 16, 64, 32, 8, 8, 2>)
/* The defaults, from the sweep on the H100 (docs/KERNELS.md, "Defaults"). */
typedef simt_cfg<float, 128, 128, 8, 32, 64, 8, 8, 2> f32_big;
typedef simt_cfg<float, 128, 64, 16, 64, 32, 8, 8, 2> f32_mid;
typedef simt_cfg<float, 64, 64, 16, 32, 32, 4, 8, 2> f32_small;
/* float64: 8x8 doubles would be 128 accumulator registers; 8 x 4 keeps two blocks per SM. */
typedef simt_cfg<double, 128, 64, 8, 64, 16, 8, 4, 2> f64_big;
typedef simt_cfg<double, 64, 64, 8, 32, 32, 4, 8, 2> f64_small;
typedef simt_cfg<int32_t, 128, 128, 8, 64, 32, 8, 8, 2> i32_big;
typedef simt_cfg<int32_t, 64, 64, 16, 32, 32, 4, 8, 2> i32_small;

/* A float32 variant of the tuning sweep: k cut into SPLIT pieces. */
template <int SPLIT, typename Cfg> cudaError_t run_fixed(const gemm_launch *l)
{
    return l->dtype == GEMM_DTYPE_F32 ? run_cfg<float, Cfg, (SPLIT > 1)>(l, SPLIT) : cudaErrorInvalidValue;
}

long long tile_count(const gemm_launch *l, int bm, int bn)
{
    return (long long)((l->m + bm - 1) / bm) * ((l->n + bn - 1) / bn);
}

/* Split-k pieces for `tiles` output tiles of the big block (1: none): docs/KERNELS.md,
 * "Split-k rule". */
constexpr int SPLIT_MIN_K = 2048, SPLIT_MIN_DEPTH = 512, SPLIT_MAX = 32;
int split_for(const gemm_launch *l, long long tiles, int sms)
{
    if (l->k < SPLIT_MIN_K)
        return 1;
    const long long slots = 2LL * sms;
    if (tiles < sms) {
        long long s = slots / tiles;
        if (s > l->k / SPLIT_MIN_DEPTH)
            s = l->k / SPLIT_MIN_DEPTH;
        if (s > SPLIT_MAX)
            s = SPLIT_MAX;
        return s >= 2 ? (int)s : 1;
    }
    const long long w1 = (tiles + slots - 1) / slots;    /* waves, whole */
    const long long w2 = (2 * tiles + slots - 1) / slots; /* waves of half-deep blocks */
    return w2 * 100 <= w1 * 2 * 92 ? 2 : 1;
}

/* What simt_launch runs for l, in how many k pieces; simt_plan reports the same choice. */
enum simt_pick { F32_BIG, F32_MID, F32_SMALL, F64_BIG, F64_SMALL, I32_BIG, I32_SMALL, PICK_NONE };
struct simt_choice {
    simt_pick pick;
    int splits;
};

/* Default (tile 0): the big block when it fills the SMs or k pieces of a deep product do,
 * else the small one. float64 does not split (its split instance spilled for odd n). */
simt_choice big_or_small(const gemm_launch *l, int bm, int bn, simt_pick big, simt_pick small,
                         bool may_split)
{
    const int sms = gemm_device_attr<cudaDevAttrMultiProcessorCount>(132); /* an H100 SXM's */
    const int s = may_split ? split_for(l, tile_count(l, bm, bn), sms) : 1;
    if (tile_count(l, bm, bn) >= sms || s > 1)
        return {big, s};
    return {small, 1};
}

simt_choice simt_choose(const gemm_launch *panel)
{
    /* A panel chooses as its whole product does (plan_m): the same block, the same pieces. */
    gemm_launch whole = *panel;
    whole.m = gemm_plan_rows(panel);
    const gemm_launch *l = &whole;
    switch (l->dtype) {
    case GEMM_DTYPE_F32:
        if (l->tile == 128)
            return {F32_BIG, 1};
        if (l->tile == 64)
            return {F32_SMALL, 1};
        {
            const simt_choice c = big_or_small(l, 128, 128, F32_BIG, F32_SMALL, true);
            /* 128x64 tiles while they still give about three quarters of a wave. */
            if (c.pick == F32_SMALL && tile_count(l, 128, 64) >= 96)
                return {F32_MID, 1};
            return c;
        }
    case GEMM_DTYPE_F64:
        if (l->tile)
            return {l->tile == 64 ? F64_SMALL : F64_BIG, 1};
        return big_or_small(l, 128, 64, F64_BIG, F64_SMALL, false);
    case GEMM_DTYPE_I32:
        if (l->tile)
            return {l->tile == 64 ? I32_SMALL : I32_BIG, 1};
        return big_or_small(l, 128, 128, I32_BIG, I32_SMALL, true);
    default: return {PICK_NONE, 1};
    }
}

/* Each pick's launcher, k pieces, block and tile option (0: reached only by default). */
struct simt_run {
    cudaError_t (*run)(const gemm_launch *, int);
    int (*pieces)(const gemm_launch *, int, int *);
    int bm, bn, bk, tile;
};
#define SIMT_RUN(T, CFG, SPLIT, TILE) {run_cfg<T, CFG, SPLIT>, split_pieces<T, CFG>, CFG::BM, CFG::BN, CFG::BK, TILE}
const simt_run runs[] = {
    SIMT_RUN(float, f32_big, true, 128),    SIMT_RUN(float, f32_mid, false, 0),      SIMT_RUN(float, f32_small, false, 64),
    SIMT_RUN(double, f64_big, false, 128),  SIMT_RUN(double, f64_small, false, 64),  SIMT_RUN(int32_t, i32_big, true, 128),
    SIMT_RUN(int32_t, i32_small, false, 64),
};

cudaError_t simt_launch(const gemm_launch *l)
{
    const simt_choice c = simt_choose(l);
    return c.pick == PICK_NONE ? cudaErrorInvalidValue : runs[c.pick].run(l, c.splits);
}

/* The block tile ("BMxBNxBK", then " split-k S" when k is cut into S pieces). */
int simt_plan(const gemm_launch *l, char *out, size_t cap)
{
    const simt_choice c = simt_choose(l);
    if (c.pick == PICK_NONE) /* a dtype validate() never lets through: out stays as it is */
        return 0;
    const simt_run &r = runs[c.pick];
    int tile = gemm_block_dims(out, cap, r.bm, r.bn, r.bk, r.tile), kt_split, pieces;
    if (c.splits > 1 && (pieces = r.pieces(l, c.splits, &kt_split)) > 1) {
        const size_t used = strlen(out);
        if (used < cap)
            snprintf(out + used, cap - used, " split-k %d", pieces);
        tile = 0;
    }
    return tile;
}

#define SIMT_VARIANT(name, split, ...)                                                        \
    {name, run_fixed<split, __VA_ARGS__>, __VA_ARGS__::BM, __VA_ARGS__::BN, __VA_ARGS__::BK},
const gemm_kernel_variant variants[] = {SIMT_F32_VARIANTS(SIMT_VARIANT)};
#undef SIMT_VARIANT

} // namespace

extern "C" const gemm_kernel_desc gemm_kernel_simt = {
    "simt",
    "register-blocked, warp-tiled CUDA-core kernel: 128-bit shared loads, A transposed in "
    "shared memory, cp.async pipeline (exact float32, float64, int32)",
    (1u << GEMM_DTYPE_F32) | (1u << GEMM_DTYPE_F64) | (1u << GEMM_DTYPE_I32),
    (1u << GEMM_MATH_FP32),
    {128, 64, 0, 0},
    80,
    simt_launch,
    simt_plan,
    0, /* batches: one launch per product */
    variants,
    sizeof variants / sizeof variants[0],
};
