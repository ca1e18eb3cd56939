/*
 * gemm_kernels.h - the CUDA kernel family (docs/KERNELS.md): one signature, one dispatch
 * table. Every member computes C = A * B on device memory, row-major, for any m, n, k >= 1,
 * and enqueues its work on l->stream without synchronizing; int32 wraps.
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
    /* batch_native: product i at A + i*stride_a, B + i*stride_b (0: one B), C + i*stride_c */
    int batch;
    long long stride_a, stride_b, stride_c;
    int out_half;          /* float16 / bfloat16 A and B: C float32 (0) or in their dtype (1) */
    int plan_m;            /* a panel's whole product's rows (0 or m: whole): the launch's plan */
    void *lt;              /* the worker's cublasLt state (cublas member; NULL: cublasGemmEx) */
} gemm_launch;

static inline int gemm_plan_rows(const gemm_launch *l)
{
    return l->plan_m > l->m ? l->plan_m : l->m;
}

/* cublasLt state for the cublas member, one per worker, with an algorithm cache (or NULL). */
void *gemm_lt_create(void *workspace, size_t workspace_bytes);
void gemm_lt_destroy(void *lt);
/* The workspace a worker gives gemm_lt_create (and cuBLAS), in bytes. */
#define GEMM_LT_WORKSPACE_BYTES (32u << 20)

/* One variant of a member's tuning sweep (bench_kernels --tune; docs/KERNELS.md). */
typedef struct {
    const char *name;
    cudaError_t (*launch)(const gemm_launch *l); /* cudaErrorInvalidValue: not l's dtype or math */
    int bm, bn, bk;                              /* its block tile */
} gemm_kernel_variant;

typedef struct {
    const char *name;        /* request name: "naive", "tiled", "cublas", ... */
    const char *description; /* one line: what this step of the lesson changes */
    unsigned dtypes;         /* bit (1u << gemm_dtype) per dtype it runs */
    unsigned maths;          /* bit (1u << gemm_math) per float32 math mode it runs */
    int tiles[4];            /* accepted tile values, 0-terminated; {0} = no tile option */
    int min_cc;              /* lowest compute capability * 10 it needs (e.g. 90 for wgmma) */
    /* Enqueues the product; returns cudaSuccess or the launch error (cudaGetLastError). */
    cudaError_t (*launch)(const gemm_launch *l);
    /* The block tile launch picks for l ("BMxBNxBK"; tiled: "TxT") and the tile option
     * that selects it (0: only the default reaches it). NULL: no block tile (naive, cublas). */
    int (*plan)(const gemm_launch *l, char *out, size_t cap);
    int batch_native;        /* 1: launch computes l->batch products in one call */
    const gemm_kernel_variant *variants; /* the tuning sweep (NULL: none) */
    int nvariants;
} gemm_kernel_desc;

/* All members, in lesson order, NULL-terminated. */
extern const gemm_kernel_desc *const gemm_kernel_table[];
/* By name; NULL when unknown. */
const gemm_kernel_desc *gemm_kernel_find(const char *name);
/* Why desc cannot run (dtype, math, tile, compute capability); NULL when it can. */
const char *gemm_kernel_unsupported(const gemm_kernel_desc *desc, gemm_dtype d, gemm_math m, int tile, int cc);

/* The kernel `auto` resolves to (auto.c) for devices of compute capability cc (major * 10 +
 * minor) that run the wgmma member or not. Never NULL. No CUDA call. */
const char *gemm_kernel_auto(gemm_dtype d, gemm_math m, int rows, int cols, int inner, int batch, int cc,
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
#ifdef __cplusplus
#include <atomic>

/* Attribute A of the current device (SM count, compute capability), asked once per device
 * (the workers of several devices launch at once); fallback when it cannot be read. */
template <cudaDeviceAttr A> static inline int gemm_device_attr(int fallback)
{
    static std::atomic<int> plus1[64]; /* 0: not asked yet */
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
        cudaGetLastError();
        return fallback;
    }
    if ((v = plus1[dev].load(std::memory_order_relaxed)) == 0) {
        if (cudaDeviceGetAttribute(&v, A, dev) != cudaSuccess) {
            cudaGetLastError();
            return fallback;
        }
        plus1[dev].store(++v, std::memory_order_relaxed);
    }
    return v - 1;
}

/* The type a member sums in: int32 in uint32, so that overflow wraps (two's complement). */
template <typename T> struct gemm_acc { typedef T type; };
template <> struct gemm_acc<int32_t> { typedef uint32_t type; };
/* f(T()) for l's element type, float32, float64 or int32 (others: cudaErrorInvalidValue). */
template <typename F> static inline cudaError_t gemm_by_dtype(const gemm_launch *l, F f)
{
    switch (l->dtype) {
    case GEMM_DTYPE_F32: return f(float());
    case GEMM_DTYPE_F64: return f(double());
    case GEMM_DTYPE_I32: return f(int32_t());
    default: return cudaErrorInvalidValue;
    }
}
#endif
#endif /* GEMM_KERNELS_H */
