/*
 * auto.c - kernel=auto: the fastest correct member for a product, by dtype, math mode and
 * shape class, from the measurements committed in bench/results/ (see RESULTS below).
 *
 * The choice is a table lookup, not a run-time probe: a row names, best first, the kernels
 * that won the benchmark for that (dtype, math, shape class) on the device the results
 * were taken on. Rows are tried in order; the first whose dtype, math and class match
 * gives its first candidate the device supports (compute capability). When nothing
 * matches, the answer is "tiled", a member that runs every dtype on every GPU. A small
 * single float32 product with exact math is taken before the table (small_single). No
 * CUDA call: this runs on the request path (the daemon's HTTP threads).
 *
 * Until the wgmma member, cuBLAS led every float shape we measured (square 512-8192, 4095,
 * 4097, 8192x8192x1024, 1024x1024x8192, 8192x1024x8192, 1024x8192x1024, 3000x5000x700).
 * wgmma converts its operands in a pre-pass whose cost grows with (rows + cols) * inner
 * while the product grows with rows * cols * inner, so it wins only where the output is
 * large in both directions (the BIG classes below); and cuBLAS slows down 2.5-3.5x when a
 * dimension is not a multiple of 4 (rows of float32 not 16-byte multiples), which wgmma's
 * padded copies do not (BIG_UNALIGNED).
 */
#include <stddef.h>
#include <string.h>

#include "gemm_kernels.h"

/* RESULTS: bench/results/kernels-h100.md and, for wgmma, bench/results/kernels-wgmma-h100.md
 * (bench_kernels on an NVIDIA H100 80GB HBM3, 2026-11-22; CSVs beside them). Each row lists candidates best first: the first one the
 * device supports is returned, so a GPU older than a member's min_cc gets the next. */

/* Every product is in exactly one of SMALL, LARGE, BIG, BIG_UNALIGNED; ANY matches all. */
typedef enum {
    SHAPE_ANY = 0,
    SHAPE_SMALL, /* fewer 128x128 output tiles than the H100 has SMs (132), or k < 64 */
    SHAPE_LARGE, /* neither small nor big */
    SHAPE_BIG,   /* harmonic mean of rows and cols >= 3072 and inner >= 512 */
    SHAPE_BIG_UNALIGNED, /* big, and rows, cols or inner not a multiple of 16 bytes of
                          * elements (4 float32, 8 float16/bfloat16) */
} shape_class;

#define MAX_CANDIDATES 3

typedef struct {
    gemm_dtype dtype;
    gemm_math math; /* resolved mode; DEFAULT for float64/int32 */
    shape_class shape;
    const char *kernel[MAX_CANDIDATES]; /* best first, NULL-padded */
} auto_row;

static const auto_row ROWS[] = {
    /* float32 exact: cuBLAS led at every measured shape; simt reached 98% of it at 1024^3,
     * 89-94% from 2048 up, square or not (1024x1024x8192 93% with split-k), 91-92% at
     * 4095^3/4097^3 and 69% at 512^3 (bench/results/kernels-h100.md, 2026-11-23). */
    {GEMM_DTYPE_F32, GEMM_MATH_FP32, SHAPE_ANY, {"cublas", "simt", "tiled"}},
    /* float32 on tensor cores. wgmma, bf16: 107-260% of cuBLAS on every BIG shape measured
     * (4096^3, 8192^3, 4095^3, 4097^3, 8192x8192x1024, 3000x5000x700; cuBLAS's "bf16" runs
     * its tf32 kernels), 52-80% where the output is smaller (2048^3, 8192x1024x8192,
     * 1024x8192x1024, 1024^3 and below). wgmma, tf32: 83-93% of cuBLAS on the aligned BIG
     * shapes, 132-185% at 4095^3 and 4097^3, where cuBLAS drops to 117-136 TFLOP/s.
     * Elsewhere cuBLAS led; mma reached 38-63% (tf32) and 43-67% (bf16) of it at >= 1024,
     * 92-95% only at 512^3. */
    {GEMM_DTYPE_F32, GEMM_MATH_TF32, SHAPE_BIG_UNALIGNED, {"wgmma", "cublas", "mma"}},
    {GEMM_DTYPE_F32, GEMM_MATH_BF16, SHAPE_BIG_UNALIGNED, {"wgmma", "cublas", "mma"}},
    {GEMM_DTYPE_F32, GEMM_MATH_BF16, SHAPE_BIG, {"wgmma", "cublas", "mma"}},
    {GEMM_DTYPE_F32, GEMM_MATH_TF32, SHAPE_ANY, {"cublas", "mma", NULL}},
    {GEMM_DTYPE_F32, GEMM_MATH_BF16, SHAPE_ANY, {"cublas", "mma", NULL}},
    /* float64: cuBLAS led; dmma 68-86% of it, far ahead of the CUDA-core kernels. */
    {GEMM_DTYPE_F64, GEMM_MATH_DEFAULT, SHAPE_ANY, {"cublas", "dmma", "simt"}},
    /* int32: cuBLAS has no wrapping int32 GEMM; simt beat tiled at every size
     * (512^3: 9.9 vs 7.0 TOP/s; 4096^3: 29.9 vs 8.9). */
    {GEMM_DTYPE_I32, GEMM_MATH_DEFAULT, SHAPE_ANY, {"simt", "tiled", NULL}},
    /* float16 / bfloat16 operands (half in memory, float32 sums; bench/results/
     * kernels-wgmma-half-h100.md): wgmma reads them in place and reached 92% of cuBLAS
     * at 4096^3 and 99% at 8192^3 (C float32), 57-96% at 1024^3-2048^3 and 72-88% at
     * 8192x8192x1024, 3000x5000x704, 1024x8192x1024: cuBLAS stays first where rows are
     * aligned. At 4095^3 and 4097^3 cuBLAS drops to 135-152 TFLOP/s and wgmma (padded
     * copies) runs 2.0-2.6x faster. */
    {GEMM_DTYPE_F16, GEMM_MATH_DEFAULT, SHAPE_BIG_UNALIGNED, {"wgmma", "cublas", NULL}},
    {GEMM_DTYPE_BF16, GEMM_MATH_DEFAULT, SHAPE_BIG_UNALIGNED, {"wgmma", "cublas", NULL}},
    {GEMM_DTYPE_F16, GEMM_MATH_DEFAULT, SHAPE_ANY, {"cublas", "wgmma", NULL}},
    {GEMM_DTYPE_BF16, GEMM_MATH_DEFAULT, SHAPE_ANY, {"cublas", "wgmma", NULL}},
};

/* align: elements per 16 bytes of a row (4 for 4-byte types, 8 for the half types): a
 * big shape with a dimension not a multiple of it is BIG_UNALIGNED. */
static shape_class classify(int rows, int cols, int inner, int align)
{
    const long long tiles = (long long)((rows + 127) / 128) * ((cols + 127) / 128);
    if (tiles < 132 || inner < 64)
        return SHAPE_SMALL;
    /* Harmonic mean 2*rows*cols/(rows+cols), in double (no overflow). */
    const double harmonic = 2.0 * rows * cols / ((double)rows + cols);
    if (harmonic >= 3072.0 && inner >= 512)
        return (rows % align || cols % align || inner % align) ? SHAPE_BIG_UNALIGNED : SHAPE_BIG;
    return SHAPE_LARGE;
}

/* A single float32 product with exact math, small: cuBLAS's own host call (descriptors,
 * the algorithm choice, the math mode) costs more than all its GPU work, and our members
 * launch in a few microseconds. Measured in the daemon on an H100 (Server-Timing's kernel
 * stage, one connection, median; bench/results/h100-2026-11-26-direct.md): 64^3 tiled 13.2
 * us, simt 15.1, cuBLAS 27.9; 128^3 simt 16.2, tiled 17.9, cuBLAS 24.2; 256^3 simt 18.4,
 * cuBLAS 26.7. A batched request keeps cuBLAS's strided-batched call (one call for all of
 * them). The choice is by the request alone, so a product runs the same member whether it
 * runs alone or coalesced with others (cuda_run.c). */
#define SINGLE_TILED_MNK (64.0 * 64.0 * 64.0)
#define SINGLE_SIMT_MNK (256.0 * 256.0 * 256.0)

static const char *small_single(gemm_dtype d, gemm_math r, int rows, int cols, int inner, int batch, int cc)
{
    if (d != GEMM_DTYPE_F32 || r != GEMM_MATH_FP32 || batch > 1)
        return NULL;
    const double mnk = (double)rows * (double)cols * (double)inner;
    const char *name = mnk <= SINGLE_TILED_MNK ? "tiled" : mnk <= SINGLE_SIMT_MNK ? "simt" : NULL;
    const gemm_kernel_desc *k = name ? gemm_kernel_find(name) : NULL;
    return k && gemm_kernel_supports(k, d, r, 0, cc, NULL) ? name : NULL;
}

/* Candidates whose code may be missing from this build: the caller says (the engine asked
 * each device once, at open). */
static int runnable(const char *name, int wgmma_ok)
{
    return strcmp(name, "wgmma") != 0 || wgmma_ok;
}

const char *gemm_kernel_auto(gemm_dtype d, gemm_math m, int rows, int cols, int inner, int batch, int cc,
                             int wgmma_ok)
{
    gemm_math r;
    if (d == GEMM_DTYPE_F32)
        r = (m == GEMM_MATH_DEFAULT) ? GEMM_MATH_FP32 : m;
    else
        r = GEMM_MATH_DEFAULT;
    const char *single = small_single(d, r, rows, cols, inner, batch, cc);
    if (single)
        return single;
    const shape_class sc = classify(rows, cols, inner, gemm_dtype_is_half(d) ? 8 : 4);
    for (size_t i = 0; i < sizeof ROWS / sizeof ROWS[0]; i++) {
        const auto_row *row = &ROWS[i];
        if (row->dtype != d || row->math != r)
            continue;
        if (row->shape != SHAPE_ANY && row->shape != sc)
            continue;
        for (int c = 0; c < MAX_CANDIDATES && row->kernel[c]; c++) {
            const gemm_kernel_desc *k = gemm_kernel_find(row->kernel[c]);
            if (k && gemm_kernel_supports(k, d, m, 0, cc, NULL) && runnable(row->kernel[c], wgmma_ok))
                return row->kernel[c];
        }
    }
    return "tiled";
}
