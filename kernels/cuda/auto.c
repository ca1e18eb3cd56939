/*
 * auto.c - kernel=auto: a table lookup, no CUDA call (docs/KERNELS.md, "kernel=auto", has
 * the numbers behind each row). The first row whose dtype, math and class match gives its
 * first candidate the devices support; nothing matched gives "tiled", which runs everything.
 */
#include <stddef.h>
#include <string.h>

#include "gemm_kernels.h"

/* Every product is in exactly one of SMALL, LARGE, BIG, BIG_UNALIGNED; ANY matches all. */
typedef enum {
    SHAPE_ANY = 0,
    SHAPE_SMALL, /* fewer 128x128 output tiles than the H100 has SMs (132), or k < 64 */
    SHAPE_LARGE, /* neither small nor big */
    SHAPE_BIG,   /* harmonic mean of rows and cols >= 3072 and inner >= 512 */
    SHAPE_BIG_UNALIGNED, /* big, and a dimension not a multiple of 16 bytes of elements */
} shape_class;

#define MAX_CANDIDATES 3

typedef struct {
    gemm_dtype dtype;
    gemm_math math; /* resolved mode; DEFAULT for float64/int32 */
    shape_class shape;
    const char *kernel[MAX_CANDIDATES]; /* best first, NULL-padded */
} auto_row;

static const auto_row ROWS[] = {
    /* float32 exact: cuBLAS led at every measured shape (kernels-h100.md) */
    {GEMM_DTYPE_F32, GEMM_MATH_FP32, SHAPE_ANY, {"cublas", "simt", "tiled"}},
    /* float32 on tensor cores: wgmma bf16 107-260% of cuBLAS on BIG shapes, wgmma tf32
     * 132-185% where cuBLAS's tf32 slows on unaligned rows (kernels-wgmma-h100.md) */
    {GEMM_DTYPE_F32, GEMM_MATH_TF32, SHAPE_BIG_UNALIGNED, {"wgmma", "cublas", "mma"}},
    {GEMM_DTYPE_F32, GEMM_MATH_BF16, SHAPE_BIG_UNALIGNED, {"wgmma", "cublas", "mma"}},
    {GEMM_DTYPE_F32, GEMM_MATH_BF16, SHAPE_BIG, {"wgmma", "cublas", "mma"}},
    {GEMM_DTYPE_F32, GEMM_MATH_TF32, SHAPE_ANY, {"cublas", "mma", NULL}},
    {GEMM_DTYPE_F32, GEMM_MATH_BF16, SHAPE_ANY, {"cublas", "mma", NULL}},
    /* float64: cuBLAS led; dmma 68-86% of it */
    {GEMM_DTYPE_F64, GEMM_MATH_DEFAULT, SHAPE_ANY, {"cublas", "dmma", "simt"}},
    /* int32: cuBLAS has no wrapping int32 GEMM; simt beat tiled at every size */
    {GEMM_DTYPE_I32, GEMM_MATH_DEFAULT, SHAPE_ANY, {"simt", "tiled", NULL}},
    /* float16 / bfloat16: cuBLAS first where rows are aligned; on big unaligned shapes it
     * drops to 135-152 TFLOP/s and wgmma runs 2.0-2.6x faster (kernels-wgmma-half-h100.md) */
    {GEMM_DTYPE_F16, GEMM_MATH_DEFAULT, SHAPE_BIG_UNALIGNED, {"wgmma", "cublas", NULL}},
    {GEMM_DTYPE_BF16, GEMM_MATH_DEFAULT, SHAPE_BIG_UNALIGNED, {"wgmma", "cublas", NULL}},
    {GEMM_DTYPE_F16, GEMM_MATH_DEFAULT, SHAPE_ANY, {"cublas", "wgmma", NULL}},
    {GEMM_DTYPE_BF16, GEMM_MATH_DEFAULT, SHAPE_ANY, {"cublas", "wgmma", NULL}},
};

/* align: elements per 16 bytes (BIG_UNALIGNED: a dimension not a multiple of it). */
static shape_class classify(int rows, int cols, int inner, int align)
{
    const long long tiles = (long long)((rows + 127) / 128) * ((cols + 127) / 128);
    if (tiles < 132 || inner < 64) return SHAPE_SMALL;
    /* Harmonic mean 2*rows*cols/(rows+cols), in double (no overflow). */
    const double harmonic = 2.0 * rows * cols / ((double)rows + cols);
    if (harmonic >= 3072.0 && inner >= 512)
        return (rows % align || cols % align || inner % align) ? SHAPE_BIG_UNALIGNED : SHAPE_BIG;
    return SHAPE_LARGE;
}

/* A small single float32 product with exact math, before the table: cuBLAS's own host call
 * costs more than all its GPU work (h100-2026-11-26-direct.md). */
#define SINGLE_TILED_MNK (64.0 * 64.0 * 64.0)
#define SINGLE_SIMT_MNK (256.0 * 256.0 * 256.0)

static const char *small_single(gemm_dtype d, gemm_math r, int rows, int cols, int inner, int batch, int cc)
{
    if (d != GEMM_DTYPE_F32 || r != GEMM_MATH_FP32 || batch > 1) return NULL;
    const double mnk = (double)rows * (double)cols * (double)inner;
    const char *name = mnk <= SINGLE_TILED_MNK ? "tiled" : mnk <= SINGLE_SIMT_MNK ? "simt" : NULL;
    const gemm_kernel_desc *k = name ? gemm_kernel_find(name) : NULL;
    return k && !gemm_kernel_unsupported(k, d, r, 0, cc) ? name : NULL;
}

const char *gemm_kernel_auto(gemm_dtype d, gemm_math m, int rows, int cols, int inner, int batch, int cc,
                             int wgmma_ok)
{
    const gemm_math r = d != GEMM_DTYPE_F32 ? GEMM_MATH_DEFAULT : m == GEMM_MATH_DEFAULT ? GEMM_MATH_FP32 : m;
    const char *single = small_single(d, r, rows, cols, inner, batch, cc);
    if (single) return single;
    const shape_class sc = classify(rows, cols, inner, gemm_dtype_is_half(d) ? 8 : 4);
    for (size_t i = 0; i < sizeof ROWS / sizeof ROWS[0]; i++) {
        const auto_row *row = &ROWS[i];
        if (row->dtype != d || row->math != r) continue;
        if (row->shape != SHAPE_ANY && row->shape != sc) continue;
        for (int c = 0; c < MAX_CANDIDATES && row->kernel[c]; c++) {
            const gemm_kernel_desc *k = gemm_kernel_find(row->kernel[c]);
            if (k && !gemm_kernel_unsupported(k, d, m, 0, cc) && (wgmma_ok || strcmp(k->name, "wgmma") != 0))
                return row->kernel[c];
        }
    }
    return "tiled";
}
