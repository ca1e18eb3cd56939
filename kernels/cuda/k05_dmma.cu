/*
 * k05_dmma.cu - float64 on the tensor cores: mma.sync m8n8k4 f64 (DMMA, sm_80+) and
 * m16n8k16 (sm_90), exact IEEE float64 (docs/KERNELS.md, "k05_dmma"). Structure as in
 * k04_mma; the store is bounds-checked.
 */
#include "gemm_async.cuh"
#include "gemm_kernels.h"

namespace {

enum { DMMA_884 = 0, DMMA_16816 = 1 };

template <int SHAPE_, int BM_, int BN_, int BK_, int WM_, int WN_, int ST_> struct dmma_cfg {
    static constexpr int SHAPE = SHAPE_;
    static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_, STAGES = ST_;
    static constexpr int MT = SHAPE == DMMA_884 ? 8 : 16;  /* rows of one mma tile */
    static constexpr int KT = SHAPE == DMMA_884 ? 4 : 16;  /* k of one mma */
    static constexpr int WARPS_M = BM / WM, WARPS_N = BN / WN;
    static constexpr int THREADS = WARPS_M * WARPS_N * 32;
    static constexpr int MI = WM / MT, NI = WN / 8;
    static constexpr int ACC = SHAPE == DMMA_884 ? 2 : 4; /* accumulators per lane per tile */
    static constexpr int LDA = BK + 4, LDB = BN + 4;
    static constexpr size_t SMEM = (size_t)STAGES * (BM * LDA + BK * LDB) * sizeof(double);
    /* Blocks per SM the register budget is capped for: the m16n8k16 fragments (8 + 4 per
     * tile pair) need more than 128 registers a lane. */
    static constexpr int MINB = SHAPE == DMMA_16816 ? (THREADS >= 256 ? 1 : 2)
                                                    : (THREADS >= 256 ? (MI * NI > 16 ? 1 : 2) : 4);
    static_assert(BM % WM == 0 && BN % WN == 0, "warp tiles must divide the block tile");
    static_assert(WM % MT == 0 && WN % 8 == 0, "warp tiles are made of whole DMMA tiles");
    static_assert(BK % KT == 0, "BK must be a multiple of the DMMA k");
    static_assert(LDA % 16 == 4 && LDB % 16 == 4, "pads chosen for conflict-free fragments");
    static_assert((BM * BK / 2) % THREADS == 0 && (BK * BN / 2) % THREADS == 0,
                  "tile copies must divide evenly among threads");
    static_assert(STAGES >= 2 && STAGES <= 5, "2 to 5 pipeline stages");
};

__device__ __forceinline__ void dmma(double (&d)[2], double a, double b)
{
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, "
                 "{%0,%1};\n"
                 : "+d"(d[0]), "+d"(d[1])
                 : "d"(a), "d"(b));
}

/* m16n8k16 f64 exists from sm_90 on; the host launches it only there (dmma_cc_ok), so the
 * sm_80 build of those variants, never run, has no instruction to emit. */
__device__ __forceinline__ void dmma16(double (&d)[4], const double (&a)[8], const double (&b)[4])
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7,%8,%9,%10,%11}, {%12,%13,%14,%15}, {%0,%1,%2,%3};\n"
                 : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
                 : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(a[4]), "d"(a[5]),
                   "d"(a[6]), "d"(a[7]), "d"(b[0]), "d"(b[1]), "d"(b[2]), "d"(b[3]));
#else
    (void)d;
    (void)a;
    (void)b;
#endif
}

template <typename Cfg, bool VEC>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MINB)
dmma_kernel(int m, int n, int k, const double *__restrict__ A, const double *__restrict__ B,
            double *__restrict__ C, int tiles_m, int tiles_n)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    double *As = reinterpret_cast<double *>(smem_raw);
    double *Bs = As + Cfg::STAGES * Cfg::BM * Cfg::LDA;

    int bm, bn;
    gemm_async::block_tile<Cfg::BM, Cfg::BN>(tiles_m, tiles_n, bm, bn);

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = (warp / Cfg::WARPS_N) * Cfg::WM, wn = (warp % Cfg::WARPS_N) * Cfg::WN;
    const int g = lane / 4, t = lane % 4;

    double acc[Cfg::MI][Cfg::NI][Cfg::ACC];
#pragma unroll
    for (int i = 0; i < Cfg::MI; i++)
#pragma unroll
        for (int j = 0; j < Cfg::NI; j++)
#pragma unroll
            for (int r = 0; r < Cfg::ACC; r++)
                acc[i][j][r] = 0.0;

    /* One k-tile, in shared stage st, for gemm_async::mainloop. */
    gemm_async::mainloop<double, Cfg, VEC>(As, Bs, A, B, m, n, k, bm, bn, [&](const int st) {
        const double *as = As + st * Cfg::BM * Cfg::LDA + (wm + g) * Cfg::LDA + t;
        const double *bs = Bs + st * Cfg::BK * Cfg::LDB + t * Cfg::LDB + wn + g;
        if constexpr (Cfg::SHAPE == DMMA_884) {
#pragma unroll
            for (int kk = 0; kk < Cfg::BK; kk += 4) {
                double bf[Cfg::NI];
#pragma unroll
                for (int j = 0; j < Cfg::NI; j++)
                    bf[j] = bs[kk * Cfg::LDB + j * 8];
#pragma unroll
                for (int i = 0; i < Cfg::MI; i++) {
                    const double af = as[i * 8 * Cfg::LDA + kk];
#pragma unroll
                    for (int j = 0; j < Cfg::NI; j++) {
                        double(&d)[2] = *reinterpret_cast<double(*)[2]>(&acc[i][j][0]);
                        dmma(d, af, bf[j]);
                    }
                }
            }
        } else {
            /* m16n8k16: A element r of a lane is (g + 8*(r%2), t + 4*(r/2)); B element r is
             * (t + 4r, g); accumulators (g, 2t..2t+1) and (g+8, 2t..2t+1). */
#pragma unroll
            for (int kk = 0; kk < Cfg::BK; kk += 16) {
                double bf[Cfg::NI][4];
#pragma unroll
                for (int j = 0; j < Cfg::NI; j++)
#pragma unroll
                    for (int r = 0; r < 4; r++)
                        bf[j][r] = bs[(kk + 4 * r) * Cfg::LDB + j * 8];
#pragma unroll
                for (int i = 0; i < Cfg::MI; i++) {
                    double af[8];
#pragma unroll
                    for (int r = 0; r < 8; r++)
                        af[r] = as[(i * 16 + 8 * (r % 2)) * Cfg::LDA + kk + 4 * (r / 2)];
#pragma unroll
                    for (int j = 0; j < Cfg::NI; j++) {
                        double(&d)[4] = *reinterpret_cast<double(*)[4]>(&acc[i][j][0]);
                        dmma16(d, af, bf[j]);
                    }
                }
            }
        }
    });

    gemm_async::store_acc<Cfg::MT, VEC>(C, acc, m, n, bm + wm, bn + wn, g, t);
}

/* Whether the current device runs the sm_90 DMMA shapes (a host may mix GPU generations). */
bool dmma_cc_ok(void)
{
    return gemm_device_attr<cudaDevAttrComputeCapabilityMajor>(0) >= 9;
}

/* float64 only; the m16n8k16 shape only where the device runs it. */
template <typename Cfg> cudaError_t run_cfg(const gemm_launch *l)
{
    if (l->dtype != GEMM_DTYPE_F64)
        return cudaErrorInvalidValue;
    if (Cfg::SHAPE == DMMA_16816 && !dmma_cc_ok())
        return cudaErrorNotSupported;
    const bool vec = gemm_vec_ok(l->A, l->k, 8, 16) && gemm_vec_ok(l->B, l->n, 8, 16) &&
                     gemm_vec_ok(l->C, l->n, 8, 16);
    return gemm_async::launch_tiles<Cfg, double>(vec ? dmma_kernel<Cfg, true> : dmma_kernel<Cfg, false>, l);
}

/* The variants of the tuning sweep (m16n8k16 needs sm_90); which won where: docs/KERNELS.md,
 * "k05_dmma". tile=128 asks for 128x128 (sm_80: 128x64). */
#define DMMA_VARIANT(SHAPE, BM, BN, BK, WM, WN, ST)                                            \
    {#SHAPE " " #BM "x" #BN "x" #BK " warp" #WM "x" #WN " st" #ST,                             \
     run_cfg<dmma_cfg<SHAPE, BM, BN, BK, WM, WN, ST>>, BM, BN, BK}
enum { m8n8k4 = DMMA_884, m16n8k16 = DMMA_16816 };
const gemm_kernel_variant variants[] = {
    DMMA_VARIANT(m8n8k4, 128, 128, 16, 64, 32, 3),   DMMA_VARIANT(m8n8k4, 128, 128, 16, 32, 64, 3),
    DMMA_VARIANT(m8n8k4, 128, 64, 16, 32, 32, 3),    DMMA_VARIANT(m8n8k4, 64, 64, 16, 32, 32, 3),
    DMMA_VARIANT(m16n8k16, 128, 128, 16, 64, 32, 3), DMMA_VARIANT(m16n8k16, 128, 64, 16, 32, 32, 3),
    DMMA_VARIANT(m16n8k16, 64, 64, 16, 32, 32, 3),   DMMA_VARIANT(m16n8k16, 128, 64, 32, 32, 32, 3),
    DMMA_VARIANT(m16n8k16, 64, 128, 16, 32, 64, 3),  DMMA_VARIANT(m16n8k16, 64, 64, 16, 32, 32, 4),
    DMMA_VARIANT(m16n8k16, 64, 64, 32, 32, 32, 3),
};
enum { SM80_128 = 2, SM80_64 = 3, SM90_128 = 4, SM90_ODD = 6, SM90_DEFAULT = 8,
       NVARIANTS = sizeof variants / sizeof variants[0] };

/* The variant l runs (a panel takes its whole product's block, plan_m). */
int dmma_choose(const gemm_launch *l)
{
    if (!dmma_cc_ok())
        return l->tile == 128 ? SM80_128 : SM80_64;
    if (l->tile == 128)
        return SM90_128;
    const bool vec = gemm_vec_ok(l->A, l->k, 8, 16) && gemm_vec_ok(l->B, l->n, 8, 16) && gemm_vec_ok(l->C, l->n, 8, 16);
    const long long tiles = (long long)((gemm_plan_rows(l) + 63) / 64) * ((l->n + 127) / 128);
    return vec && tiles >= 4 * 132 ? SM90_DEFAULT : SM90_ODD;
}

cudaError_t dmma_launch(const gemm_launch *l)
{
    return variants[dmma_choose(l)].launch(l);
}

/* tile=64 (or none) on sm_90 picks 64x128 or 64x64 by shape and alignment: both report 64. */
int dmma_plan(const gemm_launch *l, char *out, size_t cap)
{
    const int v = dmma_choose(l);
    return gemm_block_dims(out, cap, variants[v].bm, variants[v].bn, variants[v].bk,
                           v == SM90_128 || v == SM80_128 ? 128 : 64);
}

} // namespace

extern "C" const gemm_kernel_desc gemm_kernel_dmma = {
    "dmma",
    "float64 on the tensor cores: mma.sync m8n8k4 (DMMA), cp.async multi-stage pipeline",
    (1u << GEMM_DTYPE_F64),
    (1u << GEMM_MATH_FP32),
    {128, 64, 0, 0},
    80,
    dmma_launch,
    dmma_plan,
    0, /* batches: one launch per product */
    variants,
    NVARIANTS,
};
