/*
 * k04_mma.cu - tensor cores for float32 inputs through mma.sync (sm_80+): math=tf32 runs
 * mma.m16n8k8 on TF32 operands, math=bf16 runs mma.m16n8k16 on BF16 operands; both
 * accumulate in float32 and write float32.
 *
 * Structure (the same skeleton as k03_simt, one level up):
 *  - Block tile BM x BN, split among warps in WM x WN warp tiles; a warp tile is a grid of
 *    (WM/16) x (WN/8) mma tiles whose accumulators live in registers (4 floats each).
 *  - A and B stay float32 in shared memory, copied by a STAGES-deep cp.async pipeline
 *    (16-byte copies when the row length and pointer allow, 4-byte copies otherwise;
 *    out-of-range elements are zero-filled). Operands are rounded to TF32
 *    (cvt.rna.tf32.f32) or packed to BF16 pairs (cvt.rn.bf16x2.f32) as the fragments are
 *    read, so global memory sees float32 only and the rounding matches cuBLAS's modes.
 *  - The fragment reads are scalar/64-bit shared loads in the mma's own register layout;
 *    the row pads (LDA, LDB) are chosen per math mode so that the 32 lanes of each load
 *    hit 32 different banks (tf32: LDA = 4, LDB = 8 mod 32; bf16: LDA = 8, LDB = 4 mod 32).
 * The store is bounds-checked: any m, n, k >= 1.
 */
#include <stdint.h>

#include <cuda_bf16.h>

#include "gemm_async.cuh"
#include "gemm_kernels.h"

namespace {

enum { MMA_TF32 = 0, MMA_BF16 = 1 };

template <int MATH_, int BM_, int BN_, int BK_, int WM_, int WN_, int ST_, int CONV_ = 0>
struct mma_cfg {
    static constexpr int MATH = MATH_;
    /* CONV: each landed tile is converted once in shared memory (tf32: rounded in place;
     * bf16: packed into a separate bf16 tile read with ldmatrix / ldmatrix.trans) instead
     * of converting every fragment as it is read. */
    static constexpr bool CONV = CONV_ != 0;
    static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_, STAGES = ST_;
    static constexpr int KSTEP = MATH == MMA_TF32 ? 8 : 16;
    static constexpr int WARPS_M = BM / WM, WARPS_N = BN / WN;
    static constexpr int THREADS = WARPS_M * WARPS_N * 32;
    static constexpr int MI = WM / 16, NI = WN / 8;
    static constexpr int LDA = BK + (MATH == MMA_TF32 || CONV ? 4 : 8);
    static constexpr int LDB = BN + (MATH == MMA_TF32 ? 8 : 4);
    /* bf16 tiles of the CONV path, in halves: rows of 16*odd bytes, so the 8 row addresses
     * of one ldmatrix fall in 8 different 16-byte bank groups. */
    static constexpr int LDAH = BK + 8, LDBH = BN + 8;
    static constexpr bool HALF = CONV && MATH == MMA_BF16;
    static constexpr size_t SMEM = (size_t)STAGES * (BM * LDA + BK * LDB) * sizeof(float) +
                                   (HALF ? (size_t)(BM * LDAH + BK * LDBH) * 2 : 0);
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
    static_assert(!HALF || (NI % 2 == 0 && (LDAH * 2) % 32 == 16 && (LDBH * 2) % 32 == 16),
                  "ldmatrix.trans loads B two n-tiles at a time; rows 16 mod 32 bytes");
};

__device__ __forceinline__ uint32_t to_tf32(float x)
{
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}

/* Four 8x4 float32 sub-tiles of shared memory in one instruction (ldmatrix treats each as
 * an 8x8 matrix of 16-bit halves: lane l gets row l/4, 32-bit column l%4 of each), which
 * is exactly the tf32 m16n8k8 A fragment when the four matrices are (rows 0-7 | 8-15) x
 * (k 0-3 | 4-7). */
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void *p)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void *p)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
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

/* The CONV step: the tile of stage (as, bs) converted once, by all threads. */
template <typename Cfg>
__device__ __forceinline__ void convert_tile(float *as, float *bs, uint16_t *ah, uint16_t *bh)
{
    constexpr int AV = Cfg::BK / 4, BV = Cfg::BN / 4;
#pragma unroll
    for (int s = 0; s < Cfg::BM * AV / Cfg::THREADS; s++) {
        const int idx = threadIdx.x + s * Cfg::THREADS;
        const int r = idx / AV, c = (idx % AV) * 4;
        float4 *p = reinterpret_cast<float4 *>(as + r * Cfg::LDA + c);
        float4 v = *p;
        if constexpr (Cfg::HALF) {
            *reinterpret_cast<uint2 *>(ah + r * Cfg::LDAH + c) =
                make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
        } else {
            v = make_float4(__uint_as_float(to_tf32(v.x)), __uint_as_float(to_tf32(v.y)),
                            __uint_as_float(to_tf32(v.z)), __uint_as_float(to_tf32(v.w)));
            *p = v;
        }
    }
#pragma unroll
    for (int s = 0; s < Cfg::BK * BV / Cfg::THREADS; s++) {
        const int idx = threadIdx.x + s * Cfg::THREADS;
        const int r = idx / BV, c = (idx % BV) * 4;
        float4 *p = reinterpret_cast<float4 *>(bs + r * Cfg::LDB + c);
        float4 v = *p;
        if constexpr (Cfg::HALF) {
            *reinterpret_cast<uint2 *>(bh + r * Cfg::LDBH + c) =
                make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
        } else {
            v = make_float4(__uint_as_float(to_tf32(v.x)), __uint_as_float(to_tf32(v.y)),
                            __uint_as_float(to_tf32(v.z)), __uint_as_float(to_tf32(v.w)));
            *p = v;
        }
    }
}

template <typename Cfg, bool VEC>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MINB)
mma_kernel(int m, int n, int k, const float *__restrict__ A, const float *__restrict__ B,
           float *__restrict__ C, int tiles_m, int tiles_n)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    float *As = reinterpret_cast<float *>(smem_raw);
    float *Bs = As + Cfg::STAGES * Cfg::BM * Cfg::LDA;
    uint16_t *Ah = reinterpret_cast<uint16_t *>(Bs + Cfg::STAGES * Cfg::BK * Cfg::LDB);
    uint16_t *Bh = Ah + Cfg::BM * Cfg::LDAH;

    constexpr int GROUP = 8;
    const int pid = blockIdx.x;
    const int per_group = GROUP * tiles_n;
    const int first_m = (pid / per_group) * GROUP;
    const int gsize = min(tiles_m - first_m, GROUP);
    const int bm = (first_m + (pid % per_group) % gsize) * Cfg::BM;
    const int bn = ((pid % per_group) / gsize) * Cfg::BN;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = (warp / Cfg::WARPS_N) * Cfg::WM, wn = (warp % Cfg::WARPS_N) * Cfg::WN;
    const int g = lane / 4, t = lane % 4;

    float acc[Cfg::MI][Cfg::NI][4];
#pragma unroll
    for (int i = 0; i < Cfg::MI; i++)
#pragma unroll
        for (int j = 0; j < Cfg::NI; j++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                acc[i][j][r] = 0.f;

    /* One k-tile, in shared stage st (landed, after the barrier): the main loop around it
     * is gemm_async::mainloop. */
    gemm_async::mainloop<float, Cfg, VEC>(As, Bs, A, B, m, n, k, bm, bn, [&](const int st) {
        if constexpr (Cfg::CONV) {
            /* This stage is overwritten only after the next iteration's barrier, and Ah/Bh
             * only after every warp passed that barrier, i.e. finished this tile. */
            convert_tile<Cfg>(As + st * Cfg::BM * Cfg::LDA, Bs + st * Cfg::BK * Cfg::LDB, Ah, Bh);
            __syncthreads();
        }
        if constexpr (Cfg::HALF) {
            /* ldmatrix lane addresses: A rows (lane%8) + 8*((lane/8)%2), k 8*(lane/16);
             * B (transposed) k rows (lane%8) + 8*((lane/8)%2), n 8*(lane/16). */
            const uint16_t *ah = Ah + (wm + (lane % 8) + 8 * ((lane / 8) % 2)) * Cfg::LDAH +
                                 8 * (lane / 16);
            const uint16_t *bh = Bh + ((lane % 8) + 8 * ((lane / 8) % 2)) * Cfg::LDBH + wn +
                                 8 * (lane / 16);
#pragma unroll
            for (int kk = 0; kk < Cfg::BK; kk += 16) {
                uint32_t bf[Cfg::NI][2];
#pragma unroll
                for (int jj = 0; jj < Cfg::NI / 2; jj++) {
                    uint32_t r[4];
                    ldmatrix_x4_trans(r, bh + kk * Cfg::LDBH + jj * 16);
                    bf[2 * jj][0] = r[0];
                    bf[2 * jj][1] = r[1];
                    bf[2 * jj + 1][0] = r[2];
                    bf[2 * jj + 1][1] = r[3];
                }
#pragma unroll
                for (int i = 0; i < Cfg::MI; i++) {
                    uint32_t af[4];
                    ldmatrix_x4(af, ah + i * 16 * Cfg::LDAH + kk);
#pragma unroll
                    for (int j = 0; j < Cfg::NI; j++)
                        mma_bf16(acc[i][j], af, bf[j]);
                }
            }
            return;
        }
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
                    bf[j][0] = Cfg::CONV ? __float_as_uint(p[0]) : to_tf32(p[0]);
                    bf[j][1] = Cfg::CONV ? __float_as_uint(p[4 * Cfg::LDB]) : to_tf32(p[4 * Cfg::LDB]);
                }
#pragma unroll
                for (int i = 0; i < Cfg::MI; i++) {
                    uint32_t af[4];
                    ldmatrix_x4(af, as_ld + i * 16 * Cfg::LDA + kk);
                    if constexpr (!Cfg::CONV) {
#pragma unroll
                        for (int r = 0; r < 4; r++)
                            af[r] = tf32_bits(af[r]);
                    }
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

    /* Accumulator layout: d0,d1 at (g, 2t..2t+1), d2,d3 at (g+8, 2t..2t+1). */
#pragma unroll
    for (int i = 0; i < Cfg::MI; i++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = bm + wm + i * 16 + g + h * 8;
            if (row >= m)
                continue;
#pragma unroll
            for (int j = 0; j < Cfg::NI; j++) {
                const int col = bn + wn + j * 8 + 2 * t;
                float *dst = C + (size_t)row * n + col;
                if (VEC && col + 1 < n) {
                    *reinterpret_cast<float2 *>(dst) =
                        make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
                } else {
                    if (col < n)
                        dst[0] = acc[i][j][2 * h];
                    if (col + 1 < n)
                        dst[1] = acc[i][j][2 * h + 1];
                }
            }
        }
    }
}

template <typename Cfg> cudaError_t run_cfg(const gemm_launch *l)
{
    const long long tm = (l->m + Cfg::BM - 1) / Cfg::BM, tn = (l->n + Cfg::BN - 1) / Cfg::BN;
    if (tm * tn > 0x7fffffffLL || tn * 8 > 0x7fffffffLL)
        return cudaErrorInvalidConfiguration;
    const bool vec = gemm_vec_ok(l->A, l->k, 4, 16) && gemm_vec_ok(l->B, l->n, 4, 16) &&
                     gemm_vec_ok(l->C, l->n, 4, 8);
    void (*kern)(int, int, int, const float *, const float *, float *, int, int) =
        vec ? mma_kernel<Cfg, true> : mma_kernel<Cfg, false>;
    if (Cfg::SMEM > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)Cfg::SMEM);
        if (e != cudaSuccess)
            return e;
    }
    kern<<<(unsigned)(tm * tn), Cfg::THREADS, Cfg::SMEM, l->stream>>>(
        l->m, l->n, l->k, (const float *)l->A, (const float *)l->B, (float *)l->C, (int)tm,
        (int)tn);
    return cudaGetLastError();
}

/* Variants timed by bench_kernels --tune (docs/KERNELS.md). */
typedef mma_cfg<MMA_TF32, 128, 128, 32, 64, 32, 3> tf32_v0;
typedef mma_cfg<MMA_TF32, 128, 256, 32, 64, 64, 3> tf32_v1;
typedef mma_cfg<MMA_TF32, 128, 128, 16, 64, 32, 4> tf32_v2;
typedef mma_cfg<MMA_TF32, 64, 64, 32, 32, 32, 3> tf32_small;
typedef mma_cfg<MMA_TF32, 256, 128, 32, 64, 64, 3> tf32_v4;
typedef mma_cfg<MMA_BF16, 128, 128, 32, 64, 32, 3> bf16_v0;
typedef mma_cfg<MMA_BF16, 128, 256, 32, 64, 64, 3> bf16_v1;
typedef mma_cfg<MMA_BF16, 128, 128, 16, 64, 32, 4> bf16_v2;
typedef mma_cfg<MMA_BF16, 64, 64, 32, 32, 32, 3> bf16_small;
typedef mma_cfg<MMA_BF16, 256, 128, 32, 64, 64, 3> bf16_v4;
typedef mma_cfg<MMA_TF32, 128, 256, 32, 64, 64, 3, 1> tf32_v5; /* converted once per tile */
typedef mma_cfg<MMA_TF32, 256, 128, 32, 64, 64, 3, 1> tf32_v6;
typedef mma_cfg<MMA_BF16, 128, 256, 32, 64, 64, 3, 1> bf16_v5;
typedef mma_cfg<MMA_BF16, 256, 128, 32, 64, 64, 3, 1> bf16_v6;

/* Tuning sweep on the H100 (docs/KERNELS.md): 64x64 warp tiles won in both modes;
 * tf32 prefers the 128x256 block, bf16 the 256x128 one. Converting each tile once in
 * shared memory (the "conv" variants) lost 20-25%: the extra pass and barrier per tile
 * stall the single resident block. */
#define TF32_DEFAULT tf32_v1
#define BF16_DEFAULT bf16_v4

/* The tile option for l: 64x64 blocks when 128x128 ones would not fill the SMs once. */
int mma_tile(const gemm_launch *l)
{
    if (l->tile)
        return l->tile;
    /* a panel takes its whole product's tile (plan_m) */
    const long long tiles = (long long)((gemm_plan_rows(l) + 127) / 128) * ((l->n + 127) / 128);
    return tiles < 132 ? 64 : 128;
}

cudaError_t mma_launch(const gemm_launch *l)
{
    if (l->dtype != GEMM_DTYPE_F32)
        return cudaErrorInvalidValue;
    const int tile = mma_tile(l);
    switch (l->math) {
    case GEMM_MATH_TF32:
        return tile == 64 ? run_cfg<tf32_small>(l) : run_cfg<TF32_DEFAULT>(l);
    case GEMM_MATH_BF16:
        return tile == 64 ? run_cfg<bf16_small>(l) : run_cfg<BF16_DEFAULT>(l);
    default: return cudaErrorInvalidValue;
    }
}

int mma_plan(const gemm_launch *l, char *out, size_t cap)
{
    const int tile = mma_tile(l);
    switch (l->math) {
    case GEMM_MATH_TF32:
        return tile == 64 ? gemm_block_name<tf32_small>(out, cap, 64)
                          : gemm_block_name<TF32_DEFAULT>(out, cap, 128);
    case GEMM_MATH_BF16:
        return tile == 64 ? gemm_block_name<bf16_small>(out, cap, 64)
                          : gemm_block_name<BF16_DEFAULT>(out, cap, 128);
    default: return gemm_block_name_none(out, cap);
    }
}

} // namespace

extern "C" int gemm_mma_variant_count(void) { return 7; }
extern "C" const char *gemm_mma_variant_name(int v)
{
    static const char *const names[] = {
        "128x128x32 warp64x32 st3", "128x256x32 warp64x64 st3", "128x128x16 warp64x32 st4",
        "64x64x32 warp32x32 st3", "256x128x32 warp64x64 st3",
        "128x256x32 warp64x64 st3 conv", "256x128x32 warp64x64 st3 conv"};
    return (v >= 0 && v < 7) ? names[v] : "?";
}
extern "C" cudaError_t gemm_mma_variant_launch(int v, const gemm_launch *l)
{
    if (l->dtype != GEMM_DTYPE_F32)
        return cudaErrorInvalidValue;
    const bool tf = l->math == GEMM_MATH_TF32;
    if (!tf && l->math != GEMM_MATH_BF16)
        return cudaErrorInvalidValue;
    switch (v) {
    case 0: return tf ? run_cfg<tf32_v0>(l) : run_cfg<bf16_v0>(l);
    case 1: return tf ? run_cfg<tf32_v1>(l) : run_cfg<bf16_v1>(l);
    case 2: return tf ? run_cfg<tf32_v2>(l) : run_cfg<bf16_v2>(l);
    case 3: return tf ? run_cfg<tf32_small>(l) : run_cfg<bf16_small>(l);
    case 4: return tf ? run_cfg<tf32_v4>(l) : run_cfg<bf16_v4>(l);
    case 5: return tf ? run_cfg<tf32_v5>(l) : run_cfg<bf16_v5>(l);
    case 6: return tf ? run_cfg<tf32_v6>(l) : run_cfg<bf16_v6>(l);
    default: return cudaErrorInvalidValue;
    }
}

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
};
