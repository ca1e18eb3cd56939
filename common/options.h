/*
 * options.h - per-request options, from the query string, JSON fields or form fields.
 */
#ifndef GEMM_OPTIONS_H
#define GEMM_OPTIONS_H

#include "gemm_types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    gemm_dtype dtype;   /* GEMM_DTYPE_INVALID when not given */
    char kernel[48];    /* "auto" by default */
    int tile;           /* 0 = default */
    gemm_math math;     /* GEMM_MATH_DEFAULT by default */
    gemm_dtype out_dtype; /* C's dtype asked for (float16 / bfloat16 operands: float32 or
                             theirs); GEMM_DTYPE_INVALID when not given */
    uint64_t m, k, n;   /* raw binary only: shapes from the query (0 = not given) */
    uint64_t batch;     /* raw binary only: products in the body (0 = not batched) */
    int b_shared;       /* raw binary only: B is one k x n matrix shared by the batch */
    uint64_t panel_of;  /* rows of the whole product these rows of A are a panel of (0 = none) */
} gemm_options;

void gemm_options_init(gemm_options *o);

/* Applies one key=value: dtype, kernel, tile, math, out_dtype, m, k, n, batch, b_shared, panel_of.
 * Unknown keys return 1
 * (ignored by the caller or refused, as it chooses); bad values return -1 with
 * 422 bad_option (or 400 bad_dimension for m/k/n that are not plain decimal integers)
 * and a message naming the key and the accepted values. Returns 0 when applied. */
int gemm_options_set(gemm_options *o, const char *key, const char *value, gemm_err *err);

/* Strict decimal parse of a dimension: digits only, no sign, no overflow, >= 0. */
int gemm_parse_u64(const char *s, uint64_t *out);

#ifdef __cplusplus
}
#endif
#endif
