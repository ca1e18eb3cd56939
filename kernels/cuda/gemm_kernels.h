/*
 * gemm_kernels.h - the CUDA kernel family: one signature, one dispatch table.
 *
 * Every member computes C = A * B on device memory, row-major:
 *   A is m x k (leading dimension k), B is k x n (ld n), C is m x n (ld n),
 * for any m, n, k >= 1 (edge tiles by bounds checks or padding), and enqueues its work on
 * l->stream without synchronizing. int32 wraps in two's complement (unsigned arithmetic).
 * float16 / bfloat16 operands run on cublas and wgmma (C float32 or half, see out_half).
 *
 * Each member lives in its own file, kernels/cuda/kNN_<name>.cu, numbered in the order
 * of the lesson, and exports one `const gemm_kernel_desc gemm_kernel_<name>`. The table
 * in registry.c lists them; the engine and the benchmarks look kernels up by name.
 */
#ifndef GEMM_KERNELS_H
#define GEMM_KERNELS_H

#include <cuda_runtime.h>

#include "gemm_types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    gemm_dtype dtype;
    gemm_math math;        /* resolved: FP32/TF32/BF16 for float32; DEFAULT otherwise */
    int m, n, k;           /* each in [1, 2^31); products of two may exceed 2^31: index in size_t */
    const void *A, *B;     /* device pointers */
    void *C;               /* device pointer, m*n elements */
    int tile;              /* 0 = the kernel's default; else one of desc->tiles */
    cudaStream_t stream;
    void *cublas;          /* a cublasHandle_t bound to `stream` (only the cublas member uses it) */
    void *workspace;       /* optional device scratch for the kernel */
    size_t workspace_bytes;
    /* Batched launch (only for members with batch_native): batch products, A, B and C of
     * product i at A + i*stride_a elements (and so on); stride_b 0 = one B for all. */
    int batch;             /* 0 or 1: one product */
    long long stride_a, stride_b, stride_c;
    /* float16 / bfloat16 A and B (only members with those dtype bits run them): C is
     * float32 (0) or in A's dtype (1), sums in float32 either way. */
    int out_half;
} gemm_launch;

typedef struct {
    const char *name;        /* request name: "naive", "tiled", "cublas", ... */
    const char *description; /* one line: what this step of the lesson changes */
    unsigned dtypes;         /* bit (1u << gemm_dtype) per dtype it runs */
    unsigned maths;          /* bit (1u << gemm_math) per float32 math mode it runs */
    int tiles[4];            /* accepted tile values, 0-terminated; {0} = no tile option */
    int min_cc;              /* lowest compute capability * 10 it needs (e.g. 90 for wgmma) */
    /* Enqueues the product; returns cudaSuccess or the launch error (cudaGetLastError). */
    cudaError_t (*launch)(const gemm_launch *l);
    /* The block tile launch picks for l, written "BMxBNxBK" into out (tiled: "TxT"), and
     * the tile option that selects it (0 when only the shape-based default reaches it).
     * Made by the same choice as launch, so the answer reports what ran. NULL for members
     * with no block tile of their own (naive, cublas). */
    int (*plan)(const gemm_launch *l, char *out, size_t cap);
    /* 1 when launch computes l->batch products in one call (cublas: strided-batched);
     * the engine launches the others once per product of a batch. */
    int batch_native;
} gemm_kernel_desc;

/* All members, in lesson order, NULL-terminated. */
extern const gemm_kernel_desc *const gemm_kernel_table[];
/* By name; NULL when unknown. */
const gemm_kernel_desc *gemm_kernel_find(const char *name);
/* Whether desc can run (dtype, math, tile, compute capability); fills *why when not. */
int gemm_kernel_supports(const gemm_kernel_desc *desc, gemm_dtype d, gemm_math m, int tile,
                         int cc, const char **why);

/* The kernel `auto` resolves to for this product, chosen from committed measurements
 * (kernels/cuda/auto.c), for devices of compute capability cc (major * 10 + minor) on
 * which the wgmma member's sm_90a code runs or not (wgmma_ok, from gemm_wgmma_runnable at
 * engine open). Never NULL: falls back to a member that runs everything. No CUDA call. */
const char *gemm_kernel_auto(gemm_dtype d, gemm_math m, int rows, int cols, int inner, int cc,
                             int wgmma_ok);

#ifdef __cplusplus
}
#endif

#include <stdio.h>

/* For the plan functions of the members. */
static inline int gemm_block_dims(char *out, size_t cap, int bm, int bn, int bk, int tile)
{
    if (cap) {
        if (bk > 0)
            snprintf(out, cap, "%dx%dx%d", bm, bn, bk);
        else
            snprintf(out, cap, "%dx%d", bm, bn);
    }
    return tile;
}
static inline int gemm_block_name_none(char *out, size_t cap)
{
    if (cap)
        out[0] = '\0';
    return 0;
}
#ifdef __cplusplus
template <class Cfg> static inline int gemm_block_name(char *out, size_t cap, int tile)
{
    return gemm_block_dims(out, cap, Cfg::BM, Cfg::BN, Cfg::BK, tile);
}
#endif
#endif /* GEMM_KERNELS_H */
