/*
 * k06_wgmma.cu - Hopper tensor cores through wgmma (sm_90a): float32 inputs with math=tf32
 * (m64n256k8) or bf16 (m64n256k16), float16 / bfloat16 inputs as they are (m64n256k16);
 * float32 accumulators, C float32 or, for half inputs, their own type. The design (pre-pass,
 * producer / consumer warpgroups, swizzled tiles) and its measurements: docs/KERNELS.md,
 * "k06_wgmma". The body exists only in the sm_90a build; the fallback body declares a
 * static shared array, by which the launcher tells it apart and refuses.
 */
#include <stdint.h>

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gemm_async.cuh"
#include "gemm_kernels.h"
#include "gemm_scratch.h"

namespace {

enum { WG_TF32 = 0, WG_BF16 = 1, WG_F16 = 2 };
/* Where B comes from: K-major (B^T written by the pre-pass) or MN-major (B as it is in
 * memory, k x n, read through the descriptor's transpose bit: half operands only). */
enum { B_KMAJOR = 0, B_MNMAJOR = 1 };
/* What C is written as: float32, or the half type of the operands. */
enum { OUT_F32 = 0, OUT_HALF = 1 };

constexpr int BM = 128, BN = 256, STAGES = 4;
constexpr int ROW_BYTES = 128; /* one tile row: BK elements */
constexpr int A_TILE_BYTES = BM * ROW_BYTES;
constexpr int B_TILE_BYTES = BN * ROW_BYTES;
constexpr int STAGE_BYTES = A_TILE_BYTES + B_TILE_BYTES;
constexpr int THREADS = 384; /* producer warpgroup + 2 consumer warpgroups */
constexpr int CONSUMER_THREADS = 256;
/* The ring (1024-byte aligned by hand: the swizzle atoms must be), then 2 x STAGES
 * mbarriers. */
constexpr int SMEM_BYTES = STAGES * STAGE_BYTES + 1024 + 2 * STAGES * 8;

template <int MATH> struct wg_traits;
template <> struct wg_traits<WG_TF32> {
    typedef float elem;
    static constexpr int BK = 32;
};
template <> struct wg_traits<WG_BF16> {
    typedef __nv_bfloat16 elem;
    static constexpr int BK = 64;
};
template <> struct wg_traits<WG_F16> {
    typedef __half elem;
    static constexpr int BK = 64;
};
static_assert(wg_traits<WG_TF32>::BK * sizeof(float) == ROW_BYTES &&
                  wg_traits<WG_BF16>::BK * sizeof(__nv_bfloat16) == ROW_BYTES,
              "a tile row is one 128-byte swizzle atom");
static_assert(CONSUMER_THREADS == THREADS - 128, "one producer warpgroup");

/* ------------------------------------------------------------------ pre-pass */

__device__ __forceinline__ float round_to(float x, float *)
{
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return __uint_as_float(r);
}
__device__ __forceinline__ __nv_bfloat16 round_to(float x, __nv_bfloat16 *)
{
    return __float2bfloat16_rn(x);
}

/* Bt[j][kk] = B[kk][j] rounded, for kk < k; zero for k <= kk < kp. 32 x 32 tiles through
 * shared memory (padded a column against bank conflicts), block 32 x 8. */
template <typename T>
__global__ void transpose_b(const float *__restrict__ B, T *__restrict__ Bt, int k, int n, int kp)
{
    __shared__ float tile[32][33];
    const int ntiles = (n + 31) / 32, ktiles = (kp + 31) / 32;
    for (int ty = blockIdx.y; ty < ktiles; ty += gridDim.y) {
        for (int tx = blockIdx.x; tx < ntiles; tx += gridDim.x) {
            const int k0 = ty * 32, n0 = tx * 32;
            for (int r = threadIdx.y; r < 32; r += 8) {
                const int kk = k0 + r, j = n0 + threadIdx.x;
                tile[r][threadIdx.x] = (kk < k && j < n) ? B[(size_t)kk * n + j] : 0.f;
            }
            __syncthreads();
            for (int r = threadIdx.y; r < 32; r += 8) {
                const int j = n0 + r, kk = k0 + threadIdx.x;
                if (j < n && kk < kp)
                    Bt[(size_t)j * kp + kk] = round_to(tile[threadIdx.x][r], (T *)nullptr);
            }
            __syncthreads();
        }
    }
}

/* Ah[r][c] = A[r][c] rounded, for c < k; zero for k <= c < kp. */
template <typename T>
__global__ void convert_a(const float *__restrict__ A, T *__restrict__ Ah, int m, int k, int kp)
{
    for (int r = blockIdx.y; r < m; r += gridDim.y)
        for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < kp; c += gridDim.x * blockDim.x)
            Ah[(size_t)r * kp + c] =
                round_to(c < k ? A[(size_t)r * k + c] : 0.f, (T *)nullptr);
}

/* ------------------------------------------------------------------ sm_90a primitives */

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity)
{
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra WAIT;\n"
                 "}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}

/* One box of a 2-D tensor map (inner coordinate x = k, outer y = row) into shared memory,
 * completing `bar` with its byte count. */
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap *map, uint32_t bar, int x,
                                         int y)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
                 : "memory");
}

/* K-major operand, 128-byte swizzle: start address, leading offset (unused with this
 * swizzle, 16 bytes by convention), 1024 bytes between 8-row groups, swizzle mode 1. */
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr)
{
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}

/* MN-major operand (B as it lies), 128-byte swizzle: leading offset one box of 64 columns
 * (box_bytes), 1024 bytes between 8-row groups (docs/KERNELS.md, "k06_wgmma"). */
__device__ __forceinline__ uint64_t smem_desc_mn(uint32_t addr, uint32_t box_bytes)
{
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)(box_bytes >> 4) << 16) |
           ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}

/* Keeps the compiler from moving accumulator reads/writes across the asynchronous MMA. */
__device__ __forceinline__ void fence_acc(float (&d)[128])
{
#pragma unroll
    for (int i = 0; i < 128; i++)
        asm volatile("" : "+f"(d[i])::"memory");
}

#define WG_ACC_OPERANDS                                                                      \
    "{%0, %1, %2, %3, %4, %5, %6, %7,"                                                       \
    "%8, %9, %10, %11, %12, %13, %14, %15,"                                                  \
    "%16, %17, %18, %19, %20, %21, %22, %23,"                                                \
    "%24, %25, %26, %27, %28, %29, %30, %31,"                                                \
    "%32, %33, %34, %35, %36, %37, %38, %39,"                                                \
    "%40, %41, %42, %43, %44, %45, %46, %47,"                                                \
    "%48, %49, %50, %51, %52, %53, %54, %55,"                                                \
    "%56, %57, %58, %59, %60, %61, %62, %63,"                                                \
    "%64, %65, %66, %67, %68, %69, %70, %71,"                                                \
    "%72, %73, %74, %75, %76, %77, %78, %79,"                                                \
    "%80, %81, %82, %83, %84, %85, %86, %87,"                                                \
    "%88, %89, %90, %91, %92, %93, %94, %95,"                                                \
    "%96, %97, %98, %99, %100, %101, %102, %103,"                                            \
    "%104, %105, %106, %107, %108, %109, %110, %111,"                                        \
    "%112, %113, %114, %115, %116, %117, %118, %119,"                                        \
    "%120, %121, %122, %123, %124, %125, %126, %127}"
#define WG_ACC8(i)                                                                           \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]),              \
        "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define WG_ACC128                                                                            \
    WG_ACC8(0), WG_ACC8(8), WG_ACC8(16), WG_ACC8(24), WG_ACC8(32), WG_ACC8(40), WG_ACC8(48), \
        WG_ACC8(56), WG_ACC8(64), WG_ACC8(72), WG_ACC8(80), WG_ACC8(88), WG_ACC8(96),        \
        WG_ACC8(104), WG_ACC8(112), WG_ACC8(120)

/* d (this warpgroup's 64 x 256) += A * B from shared memory, A K-major, B K-major (TRANS_B
 * 0) or MN-major (1, 16-bit types only); scale-d 1 (accumulate), no negation. */
template <int MATH, int TRANS_B>
__device__ __forceinline__ void wgmma_step(float (&d)[128], uint64_t da, uint64_t db);

#define WG_STEP(MATH, TRANS_B, SHAPE, ARGS)                                                  \
    template <>                                                                              \
    __device__ __forceinline__ void wgmma_step<MATH, TRANS_B>(float (&d)[128], uint64_t da, uint64_t db) \
    {                                                                                        \
        asm volatile("wgmma.mma_async.sync.aligned." SHAPE " " WG_ACC_OPERANDS ", %128, %129, " ARGS ";\n" \
                     : WG_ACC128                                                              \
                     : "l"(da), "l"(db));                                                     \
    }
WG_STEP(WG_BF16, 0, "m64n256k16.f32.bf16.bf16", "1, 1, 1, 0, 0")
WG_STEP(WG_BF16, 1, "m64n256k16.f32.bf16.bf16", "1, 1, 1, 0, 1")
WG_STEP(WG_F16, 1, "m64n256k16.f32.f16.f16", "1, 1, 1, 0, 1")
WG_STEP(WG_TF32, 0, "m64n256k8.f32.tf32.tf32", "1, 1, 1")

/* Two adjacent elements of a C row: float32, or rounded to the operands' half type. */
template <int MATH, int OUT> struct c_store {
    typedef float elem;
    __device__ static void pair(elem *p, float x, float y) { *reinterpret_cast<float2 *>(p) = make_float2(x, y); }
    __device__ static void one(elem *p, float x) { *p = x; }
};
template <> struct c_store<WG_BF16, OUT_HALF> {
    typedef __nv_bfloat16 elem;
    __device__ static void pair(elem *p, float x, float y)
    {
        *reinterpret_cast<__nv_bfloat162 *>(p) = __floats2bfloat162_rn(x, y);
    }
    __device__ static void one(elem *p, float x) { *p = __float2bfloat16_rn(x); }
};
template <> struct c_store<WG_F16, OUT_HALF> {
    typedef __half elem;
    __device__ static void pair(elem *p, float x, float y) { *reinterpret_cast<__half2 *>(p) = __floats2half2_rn(x, y); }
    __device__ static void one(elem *p, float x) { *p = __float2half_rn(x); }
};

#endif /* sm_90a */

/* ------------------------------------------------------------------ main kernel */

/* MATH: operand type; BMN: B K-major (pre-pass) or MN-major (as in memory); OUT: C float32
 * or half; vec: C's wider stores (main_pass), 0 for single elements. */
template <int MATH, int BMN, int OUT>
__global__ void __launch_bounds__(THREADS, 1)
wgmma_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
             void *__restrict__ Cv, int m, int n, int k, int tiles_m, int tiles_n, int vec)
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BK = wg_traits<MATH>::BK;
    /* MN-major B: BN / 64 boxes of BK rows x 128 bytes per stage. */
    constexpr int B_BOX_BYTES = BK * ROW_BYTES;
    static_assert(!BMN || (BN / 64) * B_BOX_BYTES == B_TILE_BYTES, "MN-major boxes fill the B tile");
    typedef c_store<MATH, OUT> store;
    typename store::elem *C = static_cast<typename store::elem *>(Cv);
    extern __shared__ unsigned char smem_raw[];
    const uint32_t base = ((uint32_t)__cvta_generic_to_shared(smem_raw) + 1023u) & ~1023u;
    const uint32_t bars = base + STAGES * STAGE_BYTES;
    auto tile_a = [&](int s) { return base + (uint32_t)(s * STAGE_BYTES); };
    auto tile_b = [&](int s) { return base + (uint32_t)(s * STAGE_BYTES + A_TILE_BYTES); };
    auto full = [&](int s) { return bars + 8u * s; };
    auto empty = [&](int s) { return bars + 8u * (STAGES + s); };

    int bm, bn;
    gemm_async::block_tile<BM, BN>(tiles_m, tiles_n, bm, bn);

    const int KT = (k + BK - 1) / BK;
    const int wg = threadIdx.x / 128;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(full(s), 1);
            mbar_init(empty(s), CONSUMER_THREADS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        /* Producer. */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (threadIdx.x == 0) {
            for (int kt = 0; kt < KT; kt++) {
                const int s = kt % STAGES;
                mbar_wait(empty(s), ((kt / STAGES) & 1) ^ 1);
                mbar_expect_tx(full(s), STAGE_BYTES);
                tma_load(tile_a(s), &map_a, full(s), kt * BK, bm);
                if (BMN) {
#pragma unroll
                    for (int j = 0; j < BN / 64; j++)
                        tma_load(tile_b(s) + (uint32_t)(j * B_BOX_BYTES), &map_b, full(s), bn + 64 * j, kt * BK);
                } else {
                    tma_load(tile_b(s), &map_b, full(s), kt * BK, bn);
                }
            }
        }
    } else {
        /* Consumers: warpgroup 1 rows 0-63 of the tile, warpgroup 2 rows 64-127. */
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
        const int cw = wg - 1;
        float d[128] = {};
        for (int kt = 0; kt < KT; kt++) {
            const int s = kt % STAGES;
            mbar_wait(full(s), (kt / STAGES) & 1);
            const uint32_t a = tile_a(s) + (uint32_t)(cw * 64 * ROW_BYTES), b = tile_b(s);
            fence_acc(d);
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
            /* Four k-steps of 32 bytes of an A row; for MN-major B the same k-step is 16 (bf16)
             * rows of 128 bytes further into each box. */
#pragma unroll
            for (int kk = 0; kk < ROW_BYTES / 32; kk++)
                wgmma_step<MATH, BMN>(d, smem_desc(a + 32 * kk),
                                      BMN ? smem_desc_mn(b + (uint32_t)(kk * (BK / 4) * ROW_BYTES), B_BOX_BYTES)
                                          : smem_desc(b + 32 * kk));
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            /* The previous stage's MMAs are done: hand its buffers back. */
            asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
            fence_acc(d);
            if (kt > 0)
                mbar_arrive(empty((kt - 1) % STAGES));
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        fence_acc(d);

        /* Fragment layout (per 8 columns j): d[4j], d[4j+1] at row w*16 + l/4, columns
         * 8j + 2(l%4) + {0,1}; d[4j+2], d[4j+3] 8 rows below. */
        const int t = threadIdx.x % 128, w = t / 32, l = t % 32;
        const int row0 = bm + cw * 64 + w * 16 + l / 4;
        if constexpr (OUT == OUT_HALF) {
            /* Half C: shuffled within the quad so that lane q writes columns 4q..4q+3 and
             * each row's 32 bytes are one whole sector instead of two half-written ones. */
            const int q = l % 4, qa = q < 2 ? 2 * q : 2 * q - 4;
            const int src_a = (l & ~3) + qa, src_b = src_a + 1;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int row = row0 + 8 * h;
#pragma unroll
                for (int jj = 0; jj < 16; jj++) {
                    const int j0 = 2 * jj, j1 = j0 + 1;
                    const float a0 = __shfl_sync(0xffffffffu, d[4 * j0 + 2 * h], src_a);
                    const float a1 = __shfl_sync(0xffffffffu, d[4 * j0 + 2 * h + 1], src_a);
                    const float b0 = __shfl_sync(0xffffffffu, d[4 * j0 + 2 * h], src_b);
                    const float b1 = __shfl_sync(0xffffffffu, d[4 * j0 + 2 * h + 1], src_b);
                    const float c0 = __shfl_sync(0xffffffffu, d[4 * j1 + 2 * h], src_a);
                    const float c1 = __shfl_sync(0xffffffffu, d[4 * j1 + 2 * h + 1], src_a);
                    const float e0 = __shfl_sync(0xffffffffu, d[4 * j1 + 2 * h], src_b);
                    const float e1 = __shfl_sync(0xffffffffu, d[4 * j1 + 2 * h + 1], src_b);
                    const float v[4] = {q < 2 ? a0 : c0, q < 2 ? a1 : c1, q < 2 ? b0 : e0, q < 2 ? b1 : e1};
                    if (row >= m)
                        continue;
                    typename store::elem *crow = C + (size_t)row * n;
                    const int col = bn + 16 * jj + 4 * q;
                    if (vec == 2 && col + 3 < n) {
                        store::pair(crow + col, v[0], v[1]);
                        store::pair(crow + col + 2, v[2], v[3]);
                    } else {
#pragma unroll
                        for (int x = 0; x < 4; x++)
                            if (col + x < n)
                                store::one(crow + col + x, v[x]);
                    }
                }
            }
        } else {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int row = row0 + 8 * h;
                if (row >= m)
                    continue;
                typename store::elem *crow = C + (size_t)row * n;
#pragma unroll
                for (int j = 0; j < 32; j++) {
                    const int col = bn + 8 * j + 2 * (l % 4);
                    if (vec && col + 1 < n) {
                        store::pair(crow + col, d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
                    } else {
                        if (col < n)
                            store::one(crow + col, d[4 * j + 2 * h]);
                        if (col + 1 < n)
                            store::one(crow + col + 1, d[4 * j + 2 * h + 1]);
                    }
                }
            }
        }
    }
#else
    /* Not sm_90a: no body. The static array marks this binary for the launcher's check. */
    __shared__ int no_wgmma[1];
    if (m < 0)
        ((volatile int *)no_wgmma)[0] = m;
#endif
}

/* ------------------------------------------------------------------ host side */

typedef CUresult (*encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                    const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                    const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                    CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

encode_tiled_fn get_encode(void)
{
    static const encode_tiled_fn fn = []() -> encode_tiled_fn {
        void *p = nullptr;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                             &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess)
            return nullptr;
        return reinterpret_cast<encode_tiled_fn>(p);
    }();
    return fn;
}

/* Tensor map of a rows x cols matrix (cols contiguous, row pitch ld elements), boxes of
 * box_rows x (128 bytes), 128-byte swizzle, zero fill out of range. */
bool make_map(CUtensorMap *map, encode_tiled_fn enc, CUtensorMapDataType type, int esize,
              const void *ptr, int rows, int cols, size_t ld, int box_rows)
{
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)(ld * esize)};
    const cuuint32_t box[2] = {(cuuint32_t)(ROW_BYTES / esize), (cuuint32_t)box_rows};
    const cuuint32_t estr[2] = {1, 1};
    return enc(map, type, 2, const_cast<void *>(ptr), dims, strides, box, estr,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* cudaSuccess when the current device (cc >= 9.0) runs kern's sm_90a body, else
 * cudaErrorNotSupported (the fallback has a static shared array). */
typedef void (*kernel_fn)(CUtensorMap, CUtensorMap, void *, int, int, int, int, int, int);

cudaError_t has_body(kernel_fn kern)
{
    if (gemm_device_attr<cudaDevAttrComputeCapabilityMajor>(0) < 9)
        return cudaErrorNotSupported;
    cudaFuncAttributes fa;
    const cudaError_t e = cudaFuncGetAttributes(&fa, kern);
    return e != cudaSuccess ? e : fa.sharedSizeBytes != 0 ? cudaErrorNotSupported : cudaSuccess;
}

/* cudaSuccess when kern can run l on the current device: sizes it takes, its body there
 * (has_body), and the driver's tensor-map encoder found (*enc). */
cudaError_t device_ready(kernel_fn kern, const gemm_launch *l, encode_tiled_fn *enc)
{
    if (l->m < 1 || l->n < 1 || l->k < 1)
        return cudaErrorInvalidValue;
    const cudaError_t e = has_body(kern);
    if (e != cudaSuccess)
        return e;
    *enc = get_encode();
    if (!*enc)
        return cudaErrorNotSupported;
    const long long tm = (l->m + BM - 1) / BM, tn = (l->n + BN - 1) / BN;
    return tm * tn > 0x7fffffffLL || tn * 8 > 0x7fffffffLL ? cudaErrorInvalidConfiguration : cudaSuccess;
}

/* An operand as the tensor copies read it: rows x cols elements, row pitch ld, boxes of
 * box_rows rows of 128 bytes. */
struct operand {
    const void *p;
    int rows, cols;
    size_t ld;
    int box_rows;
};

/* The main kernel after whatever came before it (e), then the scratch back to the pool.
 * vec: float32 pairs (n even) or half pairs of pairs (n % 4 == 0), C 8-byte aligned. */
cudaError_t main_pass(cudaError_t e, kernel_fn kern, encode_tiled_fn enc, CUtensorMapDataType type, int esize,
                      const gemm_launch *l, const operand &a, const operand &b, bool half_c, void *scratch)
{
    CUtensorMap map_a, map_b;
    if (e == cudaSuccess && !(make_map(&map_a, enc, type, esize, a.p, a.rows, a.cols, a.ld, a.box_rows) &&
                              make_map(&map_b, enc, type, esize, b.p, b.rows, b.cols, b.ld, b.box_rows)))
        e = cudaErrorInvalidValue;
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES);
    if (e == cudaSuccess) {
        const int n = l->n, c8 = (uintptr_t)l->C % 8 == 0;
        const int vec = half_c ? ((n % 4 == 0) && c8 ? 2 : 0) : (n % 2 == 0) && c8;
        const long long tm = (l->m + BM - 1) / BM, tn = (n + BN - 1) / BN;
        kern<<<(unsigned)(tm * tn), THREADS, SMEM_BYTES, l->stream>>>(map_a, map_b, l->C, l->m, n, l->k, (int)tm,
                                                                     (int)tn, vec);
        e = cudaGetLastError();
    }
    if (scratch) {
        const cudaError_t f = cudaFreeAsync(scratch, l->stream);
        if (e == cudaSuccess)
            e = f;
    }
    return e;
}

/* float32 operands: the pre-pass, then the main kernel (B K-major). */
template <int MATH> cudaError_t run(const gemm_launch *l)
{
    typedef typename wg_traits<MATH>::elem T;
    const int esize = (int)sizeof(T);
    const int m = l->m, n = l->n, k = l->k;
    const kernel_fn kern = wgmma_kernel<MATH, B_KMAJOR, OUT_F32>;
    encode_tiled_fn enc = nullptr;
    cudaError_t e = device_ready(kern, l, &enc);
    if (e != cudaSuccess)
        return e;

    /* Scratch: B^T always; A for bf16, or for tf32 when A's rows are not 16-byte aligned. */
    const int per16 = 16 / esize;
    const long long kp = ((long long)k + per16 - 1) / per16 * per16;
    if (kp > 0x7fffffffLL)
        return cudaErrorInvalidValue;
    const bool copy_a = MATH == WG_BF16 || (k % 4) != 0 || ((uintptr_t)l->A % 16) != 0;
    const size_t bt_bytes = ((size_t)n * (size_t)kp * esize + 255) / 256 * 256;
    void *scratch = nullptr;
    e = gemm_scratch_alloc(&scratch, bt_bytes + (copy_a ? (size_t)m * (size_t)kp * esize : 0), l->stream);
    if (e != cudaSuccess)
        return e;
    T *Bt = static_cast<T *>(scratch);
    T *Ah = copy_a ? reinterpret_cast<T *>(static_cast<unsigned char *>(scratch) + bt_bytes) : nullptr;
    {
        const long long gx = (n + 31) / 32, gy = (kp + 31) / 32;
        dim3 grid((unsigned)(gx < 65535 * 32 ? gx : 65535 * 32), (unsigned)(gy < 65535 ? gy : 65535));
        transpose_b<T><<<grid, dim3(32, 8), 0, l->stream>>>((const float *)l->B, Bt, k, n, (int)kp);
    }
    if (copy_a) {
        const long long gx = (kp + 255) / 256;
        dim3 grid((unsigned)(gx < 64 ? gx : 64), (unsigned)(m < 65535 ? m : 65535));
        convert_a<T><<<grid, 256, 0, l->stream>>>((const float *)l->A, Ah, m, k, (int)kp);
    }
    const CUtensorMapDataType type =
        MATH == WG_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
    return main_pass(cudaSuccess, kern, enc, type, esize, l,
                     {copy_a ? (const void *)Ah : l->A, m, k, copy_a ? (size_t)kp : (size_t)k, BM},
                     {Bt, n, k, (size_t)kp, BN}, false, scratch);
}

/* Half operands: A K-major and B MN-major as they lie, unless rows are not whole 16 bytes
 * or the start is unaligned: then copied first into padded scratch (padding never read). */
template <int MATH> cudaError_t run_half(const gemm_launch *l)
{
    const int esize = 2;
    const int m = l->m, n = l->n, k = l->k;
    const kernel_fn kern = l->out_half ? wgmma_kernel<MATH, B_MNMAJOR, OUT_HALF>
                                       : wgmma_kernel<MATH, B_MNMAJOR, OUT_F32>;
    encode_tiled_fn enc = nullptr;
    cudaError_t e = device_ready(kern, l, &enc);
    if (e != cudaSuccess)
        return e;
    const bool a_direct = k % 8 == 0 && (uintptr_t)l->A % 16 == 0;
    const bool b_direct = n % 8 == 0 && (uintptr_t)l->B % 16 == 0;
    const size_t lda = a_direct ? (size_t)k : ((size_t)k + 7) / 8 * 8;
    const size_t ldb = b_direct ? (size_t)n : ((size_t)n + 7) / 8 * 8;
    const size_t a_bytes = a_direct ? 0 : ((size_t)m * lda * esize + 255) / 256 * 256;
    const size_t b_bytes = b_direct ? 0 : (size_t)k * ldb * esize;
    void *scratch = nullptr;
    if (a_bytes + b_bytes && (e = gemm_scratch_alloc(&scratch, a_bytes + b_bytes, l->stream)) != cudaSuccess)
        return e;
    const void *A = l->A, *B = l->B;
    if (!a_direct) {
        A = scratch;
        e = cudaMemcpy2DAsync(scratch, lda * esize, l->A, (size_t)k * esize, (size_t)k * esize, (size_t)m,
                              cudaMemcpyDeviceToDevice, l->stream);
    }
    if (e == cudaSuccess && !b_direct) {
        void *bp = static_cast<unsigned char *>(scratch) + a_bytes;
        B = bp;
        e = cudaMemcpy2DAsync(bp, ldb * esize, l->B, (size_t)n * esize, (size_t)n * esize, (size_t)k,
                              cudaMemcpyDeviceToDevice, l->stream);
    }
    const CUtensorMapDataType type =
        MATH == WG_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    return main_pass(e, kern, enc, type, esize, l, {A, m, k, lda, BM}, {B, k, n, ldb, wg_traits<MATH>::BK},
                     l->out_half != 0, scratch);
}

cudaError_t wgmma_launch(const gemm_launch *l)
{
    if (l->tile != 0)
        return cudaErrorInvalidValue;
    if (l->dtype == GEMM_DTYPE_BF16)
        return run_half<WG_BF16>(l);
    if (l->dtype == GEMM_DTYPE_F16)
        return run_half<WG_F16>(l);
    if (l->dtype != GEMM_DTYPE_F32)
        return cudaErrorInvalidValue;
    switch (l->math) {
    case GEMM_MATH_TF32: return run<WG_TF32>(l);
    case GEMM_MATH_BF16: return run<WG_BF16>(l);
    default: return cudaErrorInvalidValue;
    }
}

int wgmma_plan(const gemm_launch *l, char *out, size_t cap)
{
    const int bk = (l->dtype == GEMM_DTYPE_F32 && l->math != GEMM_MATH_BF16) ? wg_traits<WG_TF32>::BK
                                                                             : wg_traits<WG_BF16>::BK;
    return gemm_block_dims(out, cap, BM, BN, bk, 0);
}

} // namespace

/* cc >= 9.0 and the sm_90a bodies present (cuda_engine.h: asked once per device at open). */
extern "C" int gemm_wgmma_runnable(void)
{
    const int ok = has_body(wgmma_kernel<WG_BF16, B_KMAJOR, OUT_F32>) == cudaSuccess &&
                   has_body(wgmma_kernel<WG_TF32, B_KMAJOR, OUT_F32>) == cudaSuccess &&
                   has_body(wgmma_kernel<WG_BF16, B_MNMAJOR, OUT_HALF>) == cudaSuccess &&
                   has_body(wgmma_kernel<WG_F16, B_MNMAJOR, OUT_F32>) == cudaSuccess;
    if (!ok)
        cudaGetLastError();
    return ok;
}

extern "C" const gemm_kernel_desc gemm_kernel_wgmma = {
    "wgmma",
    "Hopper wgmma (tf32 m64n256k8 / bf16, f16 m64n256k16) fed by tensor copies into a 4-stage "
    "mbarrier ring, producer/consumer warpgroups; float32 operands pre-converted to K-major, "
    "float16/bfloat16 operands read as they lie",
    (1u << GEMM_DTYPE_F32) | (1u << GEMM_DTYPE_F16) | (1u << GEMM_DTYPE_BF16),
    (1u << GEMM_MATH_TF32) | (1u << GEMM_MATH_BF16),
    {0, 0, 0, 0},
    90,
    wgmma_launch,
    wgmma_plan,
    0, /* batches: one launch per product */
    NULL, 0,
};
