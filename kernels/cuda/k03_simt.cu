/*
 * k03_simt.cu - the tuned CUDA-core kernel: exact float32, float64 and int32.
 *
 * What it adds over k02_tiled, each for a reason:
 *  - 2D register blocking: a thread computes TM x TN outputs (8 x 8 for float32), so one
 *    k step costs TM + TN shared-memory reads for TM * TN multiply-adds instead of 2 for 1.
 *  - Warp tiling: a warp owns a WM x WN sub-tile; inside it a thread's outputs are 4 x 4
 *    blocks strided by 4 * (threads along that side), so the 32 lanes read 32 consecutive
 *    elements of a shared row: 128-bit loads, one wavefront, no bank conflict.
 *  - A transposed on the way into shared memory (As[k][m]): the k loop reads A along m
 *    with the same 128-bit loads as B. The copy of A is element-wide for that reason; B is
 *    copied 16 bytes at a time when n and the pointer allow it, element-wide otherwise.
 *  - cp.async multi-stage pipeline (STAGES buffers): tile t+STAGES-1 is in flight while
 *    tile t is multiplied; one barrier per tile.
 *  - Block order grouped by GROUP rows of tiles, so blocks running together share
 *    panels of A and B in L2.
 * Edges: out-of-range elements are copied as zeros (cp.async src-size 0) and the store is
 * bounds-checked, so any m, n, k >= 1 works. int32 accumulates in uint32 (wraps).
 *
 * Tile parameters are template arguments, checked by static_asserts; the float32
 * variants below were timed against each other by `bench_kernels --tune` on the H100
 * (docs/KERNELS.md records the sweep and the winner).
 */
#include <stdint.h>

#include "gemm_async.cuh"
#include "gemm_kernels.h"

namespace {

template <typename T> struct simt_acc { typedef T type; };
template <> struct simt_acc<int32_t> { typedef uint32_t type; };

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

template <typename T, int BM_, int BN_, int BK_, int WM_, int WN_, int TM_, int TN_, int ST_>
struct simt_cfg {
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
        TM * TN * (int)sizeof(T) > 256 ? 1 : (THREADS >= 256 ? 2 : (TM * TN >= 64 ? 2 : 4));
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

template <typename T, typename Cfg, bool VECB>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MINB)
simt_kernel(int m, int n, int k, const T *__restrict__ A, const T *__restrict__ B,
            T *__restrict__ C, int tiles_m, int tiles_n)
{
    typedef typename simt_acc<T>::type acc_t;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *As = reinterpret_cast<T *>(smem_raw);
    T *Bs = As + Cfg::STAGES * Cfg::BK * Cfg::LDA;

    /* Grouped block order: GROUP tile rows are swept together, column by column. */
    constexpr int GROUP = 8;
    const int pid = blockIdx.x;
    const int per_group = GROUP * tiles_n;
    const int g = pid / per_group;
    const int first_m = g * GROUP;
    const int gsize = min(tiles_m - first_m, GROUP);
    const int tm_idx = first_m + (pid % per_group) % gsize;
    const int tn_idx = (pid % per_group) / gsize;
    const int bm = tm_idx * Cfg::BM, bn = tn_idx * Cfg::BN;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = (warp / Cfg::WARPS_N) * Cfg::WM, wn = (warp % Cfg::WARPS_N) * Cfg::WN;
    const int lm = lane / Cfg::LN, ln = lane % Cfg::LN;

    acc_t acc[Cfg::TM][Cfg::TN];
#pragma unroll
    for (int i = 0; i < Cfg::TM; i++)
#pragma unroll
        for (int j = 0; j < Cfg::TN; j++)
            acc[i][j] = acc_t(0);

    const int KT = (k + Cfg::BK - 1) / Cfg::BK;
#pragma unroll
    for (int s = 0; s < Cfg::STAGES - 1; s++) {
        if (s < KT)
            load_tile<T, Cfg, VECB>(As + s * Cfg::BK * Cfg::LDA, Bs + s * Cfg::BK * Cfg::LDB, A,
                                    B, m, n, k, bm, bn, s * Cfg::BK);
        gemm_async::commit();
    }

    for (int kt = 0; kt < KT; kt++) {
        gemm_async::wait_group<Cfg::STAGES - 2>();
        __syncthreads(); /* tile kt visible to all; stage (kt-1) no longer read by anyone */
        {
            const int nt = kt + Cfg::STAGES - 1;
            if (nt < KT) {
                const int st = nt % Cfg::STAGES;
                load_tile<T, Cfg, VECB>(As + st * Cfg::BK * Cfg::LDA,
                                        Bs + st * Cfg::BK * Cfg::LDB, A, B, m, n, k, bm, bn,
                                        nt * Cfg::BK);
            }
            gemm_async::commit();
        }
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

template <typename T, typename Cfg> cudaError_t run_cfg(const gemm_launch *l)
{
    const long long tm = (l->m + Cfg::BM - 1) / Cfg::BM, tn = (l->n + Cfg::BN - 1) / Cfg::BN;
    if (tm * tn > 0x7fffffffLL || (tn * 8) > 0x7fffffffLL)
        return cudaErrorInvalidConfiguration;
    const bool vecb = gemm_vec_ok(l->B, l->n, (int)sizeof(T), 16) &&
                      gemm_vec_ok(l->C, l->n, (int)sizeof(T), 16);
    void (*kern)(int, int, int, const T *, const T *, T *, int, int) =
        vecb ? simt_kernel<T, Cfg, true> : simt_kernel<T, Cfg, false>;
    if (Cfg::SMEM > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)Cfg::SMEM);
        if (e != cudaSuccess)
            return e;
    }
    kern<<<(unsigned)(tm * tn), Cfg::THREADS, Cfg::SMEM, l->stream>>>(
        l->m, l->n, l->k, (const T *)l->A, (const T *)l->B, (T *)l->C, (int)tm, (int)tn);
    return cudaGetLastError();
}

/* The float32 variants of the tuning sweep (bench_kernels --tune). */
typedef simt_cfg<float, 128, 128, 8, 64, 32, 8, 8, 2> f32_v0;
typedef simt_cfg<float, 128, 128, 16, 64, 32, 8, 8, 2> f32_v1;
typedef simt_cfg<float, 128, 128, 8, 64, 32, 8, 8, 3> f32_v2;
typedef simt_cfg<float, 128, 128, 16, 64, 32, 8, 8, 3> f32_v3;
typedef simt_cfg<float, 128, 256, 8, 64, 64, 8, 16, 2> f32_v4;
typedef simt_cfg<float, 64, 64, 16, 32, 32, 4, 8, 2> f32_v5;
typedef simt_cfg<float, 128, 128, 16, 32, 64, 8, 8, 2> f32_v6;
typedef simt_cfg<float, 128, 128, 8, 32, 64, 8, 8, 2> f32_v7;
typedef simt_cfg<float, 128, 64, 16, 64, 32, 8, 8, 2> f32_v8;
typedef simt_cfg<float, 256, 128, 8, 64, 64, 16, 8, 2> f32_v9;
/* float64: 8x8 doubles would be 128 accumulator registers; 8 x 4 keeps two blocks per SM. */
typedef simt_cfg<double, 128, 64, 8, 64, 16, 8, 4, 2> f64_big;
typedef simt_cfg<double, 64, 64, 8, 32, 32, 4, 8, 2> f64_small;
typedef simt_cfg<int32_t, 128, 128, 8, 64, 32, 8, 8, 2> i32_big;
typedef simt_cfg<int32_t, 64, 64, 16, 32, 32, 4, 8, 2> i32_small;

/* Tuning sweep on the H100 (docs/KERNELS.md): with 16-byte rows 128x128x16 in 3 stages
 * won at 8192 (2 stages at 4096, within 0.3%); element-wise copies (odd n) favour BK = 8. */
#define F32_DEFAULT f32_v3
#define F32_DEFAULT_ODD f32_v0

/* Fewer big tiles than about one wave of the 132 SMs of an H100: use the small tile. */
bool small_problem(const gemm_launch *l, int bm, int bn)
{
    const long long tiles = (long long)((l->m + bm - 1) / bm) * ((l->n + bn - 1) / bn);
    return tiles < 132;
}

cudaError_t simt_launch(const gemm_launch *l)
{
    int tile = l->tile;
    switch (l->dtype) {
    case GEMM_DTYPE_F32:
        if (tile == 0)
            tile = small_problem(l, 128, 128) ? 64 : 128;
        if (tile == 64)
            return run_cfg<float, f32_v5>(l);
        return gemm_vec_ok(l->B, l->n, 4, 16) ? run_cfg<float, F32_DEFAULT>(l)
                                              : run_cfg<float, F32_DEFAULT_ODD>(l);
    case GEMM_DTYPE_F64:
        if (tile == 0)
            tile = small_problem(l, 128, 64) ? 64 : 128;
        return tile == 64 ? run_cfg<double, f64_small>(l) : run_cfg<double, f64_big>(l);
    case GEMM_DTYPE_I32:
        if (tile == 0)
            tile = small_problem(l, 128, 128) ? 64 : 128;
        return tile == 64 ? run_cfg<int32_t, i32_small>(l) : run_cfg<int32_t, i32_big>(l);
    default: return cudaErrorInvalidValue;
    }
}

} // namespace

/* Tuning sweep entry points (float32 only), used by bench/bench_kernels.cu --tune. */
extern "C" int gemm_simt_variant_count(void) { return 10; }
extern "C" const char *gemm_simt_variant_name(int v)
{
    static const char *const names[] = {
        "128x128x8 warp64x32 thr8x8 st2",  "128x128x16 warp64x32 thr8x8 st2",
        "128x128x8 warp64x32 thr8x8 st3",  "128x128x16 warp64x32 thr8x8 st3",
        "128x256x8 warp64x64 thr8x16 st2", "64x64x16 warp32x32 thr4x8 st2",
        "128x128x16 warp32x64 thr8x8 st2", "128x128x8 warp32x64 thr8x8 st2" ,
        "128x64x16 warp64x32 thr8x8 st2",  "256x128x8 warp64x64 thr16x8 st2",
    };
    return (v >= 0 && v < 10) ? names[v] : "?";
}
extern "C" cudaError_t gemm_simt_variant_launch(int v, const gemm_launch *l)
{
    if (l->dtype != GEMM_DTYPE_F32)
        return cudaErrorInvalidValue;
    switch (v) {
    case 0: return run_cfg<float, f32_v0>(l);
    case 1: return run_cfg<float, f32_v1>(l);
    case 2: return run_cfg<float, f32_v2>(l);
    case 3: return run_cfg<float, f32_v3>(l);
    case 4: return run_cfg<float, f32_v4>(l);
    case 5: return run_cfg<float, f32_v5>(l);
    case 6: return run_cfg<float, f32_v6>(l);
    case 7: return run_cfg<float, f32_v7>(l);
    case 8: return run_cfg<float, f32_v8>(l);
    case 9: return run_cfg<float, f32_v9>(l);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" const gemm_kernel_desc gemm_kernel_simt = {
    "simt",
    "register-blocked, warp-tiled CUDA-core kernel: 128-bit shared loads, A transposed in "
    "shared memory, cp.async pipeline (exact float32, float64, int32)",
    (1u << GEMM_DTYPE_F32) | (1u << GEMM_DTYPE_F64) | (1u << GEMM_DTYPE_I32),
    (1u << GEMM_MATH_FP32),
    {128, 64, 0, 0},
    80,
    simt_launch,
};
