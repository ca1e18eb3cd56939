/*
 * k04_mma.cu - tensor cores for float32 inputs through mma.sync (sm_80+): math=tf32 runs
 * m16n8k8 on TF32 operands, math=bf16 m16n8k16 on BF16 operands, both with float32
 * accumulators and output; A and B stay float32 in shared memory and are rounded or packed
 * as the fragments are read, so the rounding matches cuBLAS's modes (docs/KERNELS.md,
 * "k04_mma"). The store is bounds-checked: any m, n, k >= 1.
 */
#include <stdint.h>

#include <cuda_bf16.h>

#include "gemm_async.cuh"
#include "gemm_kernels.h"

namespace {

enum { MMA_TF32 = 0, MMA_BF16 = 1 };

template <int MATH_, int BM_, int BN_, int BK_, int WM_, int WN_, int ST_> struct mma_cfg {
    static constexpr int MATH = MATH_;
    static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_, STAGES = ST_;
    static constexpr int KSTEP = MATH == MMA_TF32 ? 8 : 16;
    static constexpr int WARPS_M = BM / WM, WARPS_N = BN / WN;
    static constexpr int THREADS = WARPS_M * WARPS_N * 32;
    static constexpr int MI = WM / 16, NI = WN / 8;
    static constexpr int LDA = BK + (MATH == MMA_TF32 ? 4 : 8);
    static constexpr int LDB = BN + (MATH == MMA_TF32 ? 8 : 4);
    static constexpr size_t SMEM = (size_t)STAGES * (BM * LDA + BK * LDB) * sizeof(float);
    /* Blocks per SM the register budget is capped for (__launch_bounds__). */
    static constexpr int MINB = THREADS >= 256 && BM * BN >= 128 * 256 ? 1 : (THREADS >= 256 ? 2 : 4);
    static_assert(BM % WM == 0 && BN % WN == 0, "warp tiles must divide the block tile");
    static_assert(WM % 16 == 0 && WN % 8 == 0, "warp tiles are made of 16x8 mma tiles");
    static_assert(BK % KSTEP == 0, "BK must be a multiple of the mma k");
    static_assert(BK % 4 == 0 && BN % 4 == 0, "rows are copied in 16-byte vectors");
    static_assert((BM * BK / 4) % THREADS == 0 && (BK * BN / 4) % THREADS == 0,
                  "tile copies must divide evenly among threads");
    static_assert(LDA % 4 == 0 && LDB % 4 == 0, "padded rows stay 16-byte aligned");
    static_assert(STAGES >= 2 && STAGES <= 5, "2 to 5 pipeline stages");
};

__device__ __forceinline__ uint32_t to_tf32(float x)
{
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}

/* Four 8x4 float32 sub-tiles in one ldmatrix (lane l gets row l/4, 32-bit column l%4 of
 * each): the tf32 m16n8k8 A fragment for matrices (rows 0-7 | 8-15) x (k 0-3 | 4-7). */
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void *p)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ __forceinline__ uint32_t tf32_bits(uint32_t x)
{
    return to_tf32(__uint_as_float(x));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); /* .x (low half) = lo */
    return *reinterpret_cast<uint32_t *>(&v);
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2])
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <typename Cfg, bool VEC>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MINB)
mma_kernel(int m, int n, int k, const float *__restrict__ A, const float *__restrict__ B,
           float *__restrict__ C, int tiles_m, int tiles_n)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    float *As = reinterpret_cast<float *>(smem_raw);
    float *Bs = As + Cfg::STAGES * Cfg::BM * Cfg::LDA;

    int bm, bn;
    gemm_async::block_tile<Cfg::BM, Cfg::BN>(tiles_m, tiles_n, bm, bn);

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = (warp / Cfg::WARPS_N) * Cfg::WM, wn = (warp % Cfg::WARPS_N) * Cfg::WN;
    const int g = lane / 4, t = lane % 4;

    float acc[Cfg::MI][Cfg::NI][4] = {};

    /* One k-tile, in shared stage st, for gemm_async::mainloop. */
    gemm_async::mainloop<float, Cfg, VEC>(As, Bs, A, B, m, n, k, bm, bn, [&](const int st) {
        const float *as = As + st * Cfg::BM * Cfg::LDA + (wm + g) * Cfg::LDA;
        const float *bs = Bs + st * Cfg::BK * Cfg::LDB + wn + g;
        /* ldmatrix row address of this lane: row (lane%8) + 8*((lane/8)%2), k 4*(lane/16). */
        const float *as_ld = As + st * Cfg::BM * Cfg::LDA + (wm + (lane % 8) + 8 * ((lane / 8) % 2)) * Cfg::LDA + 4 * (lane / 16);
#pragma unroll
        for (int kk = 0; kk < Cfg::BK; kk += Cfg::KSTEP) {
            /* B fragments for the whole warp tile, then A one mma row at a time (fewer
             * live registers than holding every A fragment). */
            uint32_t bf[Cfg::NI][2];
            if constexpr (Cfg::MATH == MMA_TF32) {
#pragma unroll
                for (int j = 0; j < Cfg::NI; j++) {
                    const float *p = bs + (kk + t) * Cfg::LDB + j * 8;
                    bf[j][0] = to_tf32(p[0]);
                    bf[j][1] = to_tf32(p[4 * Cfg::LDB]);
                }
#pragma unroll
                for (int i = 0; i < Cfg::MI; i++) {
                    uint32_t af[4];
                    ldmatrix_x4(af, as_ld + i * 16 * Cfg::LDA + kk);
#pragma unroll
                    for (int r = 0; r < 4; r++)
                        af[r] = tf32_bits(af[r]);
#pragma unroll
                    for (int j = 0; j < Cfg::NI; j++)
                        mma_tf32(acc[i][j], af, bf[j]);
                }
            } else {
#pragma unroll
                for (int j = 0; j < Cfg::NI; j++) {
                    const float *p = bs + (kk + 2 * t) * Cfg::LDB + j * 8;
                    bf[j][0] = pack_bf16(p[0], p[Cfg::LDB]);
                    bf[j][1] = pack_bf16(p[8 * Cfg::LDB], p[9 * Cfg::LDB]);
                }
#pragma unroll
                for (int i = 0; i < Cfg::MI; i++) {
                    const float *p = as + i * 16 * Cfg::LDA + kk + 2 * t;
                    const float2 x0 = *reinterpret_cast<const float2 *>(p);
                    const float2 x1 = *reinterpret_cast<const float2 *>(p + 8 * Cfg::LDA);
                    const float2 x2 = *reinterpret_cast<const float2 *>(p + 8);
                    const float2 x3 = *reinterpret_cast<const float2 *>(p + 8 * Cfg::LDA + 8);
                    uint32_t af[4];
                    af[0] = pack_bf16(x0.x, x0.y);
                    af[1] = pack_bf16(x1.x, x1.y);
                    af[2] = pack_bf16(x2.x, x2.y);
                    af[3] = pack_bf16(x3.x, x3.y);
#pragma unroll
                    for (int j = 0; j < Cfg::NI; j++)
                        mma_bf16(acc[i][j], af, bf[j]);
                }
            }
        }
    });

    gemm_async::store_acc<16, VEC>(C, acc, m, n, bm + wm, bn + wn, g, t);
}

template <typename Cfg> cudaError_t run_cfg(const gemm_launch *l)
{
    const bool vec = gemm_vec_ok(l->A, l->k, 4, 16) && gemm_vec_ok(l->B, l->n, 4, 16) &&
                     gemm_vec_ok(l->C, l->n, 4, 8);
    return gemm_async::launch_tiles<Cfg, float>(vec ? mma_kernel<Cfg, true> : mma_kernel<Cfg, false>, l);
}

/* A variant in l's math, tf32 or bf16. */
template <int BM, int BN, int BK, int WM, int WN, int ST> cudaError_t run_math(const gemm_launch *l)
{
    if (l->dtype != GEMM_DTYPE_F32 || (l->math != GEMM_MATH_TF32 && l->math != GEMM_MATH_BF16))
        return cudaErrorInvalidValue;
    return l->math == GEMM_MATH_TF32 ? run_cfg<mma_cfg<MMA_TF32, BM, BN, BK, WM, WN, ST>>(l)
                                     : run_cfg<mma_cfg<MMA_BF16, BM, BN, BK, WM, WN, ST>>(l);
}

/* The variants of the tuning sweep, each in tf32 and bf16; which won where and why:
 * docs/KERNELS.md, "k04_mma". */
#define MMA_VARIANT(BM, BN, BK, WM, WN, ST)                                                   \
    {#BM "x" #BN "x" #BK " warp" #WM "x" #WN " st" #ST, run_math<BM, BN, BK, WM, WN, ST>, BM, BN, BK}
const gemm_kernel_variant variants[] = {
    MMA_VARIANT(128, 128, 32, 64, 32, 3), MMA_VARIANT(128, 256, 32, 64, 64, 3), MMA_VARIANT(128, 128, 16, 64, 32, 4),
    MMA_VARIANT(64, 64, 32, 32, 32, 3),   MMA_VARIANT(256, 128, 32, 64, 64, 3),
};
enum { V_TF32 = 1, V_SMALL = 3, V_BF16 = 4, NVARIANTS = sizeof variants / sizeof variants[0] };

/* The variant l runs, and the tile option that selects it (a panel as its whole product). */
const gemm_kernel_variant *mma_pick(const gemm_launch *l, int *tile)
{
    const long long tiles = (long long)((gemm_plan_rows(l) + 127) / 128) * ((l->n + 127) / 128);
    *tile = (l->tile ? l->tile : tiles < 132 ? 64 : 128) == 64 ? 64 : 128;
    return &variants[*tile == 64 ? V_SMALL : l->math == GEMM_MATH_BF16 ? V_BF16 : V_TF32];
}

cudaError_t mma_launch(const gemm_launch *l)
{
    int tile;
    return mma_pick(l, &tile)->launch(l);
}

/* Only after validate(), which gives mma tf32 or bf16 alone. */
int mma_plan(const gemm_launch *l, char *out, size_t cap)
{
    int tile;
    const gemm_kernel_variant *v = mma_pick(l, &tile);
    return gemm_block_dims(out, cap, v->bm, v->bn, v->bk, tile);
}

} // namespace

extern "C" const gemm_kernel_desc gemm_kernel_mma = {
    "mma",
    "tensor cores through mma.sync (tf32 m16n8k8 / bf16 m16n8k16, float32 accumulate), "
    "cp.async multi-stage pipeline",
    (1u << GEMM_DTYPE_F32),
    (1u << GEMM_MATH_TF32) | (1u << GEMM_MATH_BF16),
    {128, 64, 0, 0},
    80,
    mma_launch,
    mma_plan,
    0, /* batches: one launch per product */
    variants,
    NVARIANTS,
};
