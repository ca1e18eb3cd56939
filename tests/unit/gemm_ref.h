/*
 * gemm_ref.h - independent references for the engine tests: deterministic random
 * inputs, a float64 triple loop for float32/float64, and a mod-2^32 loop in 64-bit
 * integers for int32. Header-only (static functions) so each test program stays one file.
 */
#ifndef GEMM_TEST_REF_H
#define GEMM_TEST_REF_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "gemm_types.h"

static inline uint64_t ref_rand(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* The value of a float16 / bfloat16 element, from its fields (not the code under test). */
static inline double ref_half_value(gemm_dtype d, uint16_t h)
{
    int bf = d == GEMM_DTYPE_BF16, mb = bf ? 7 : 10, eb = bf ? 8 : 5, bias = bf ? 127 : 15;
    int s = h >> 15, e = (h >> mb) & ((1 << eb) - 1), m = h & ((1 << mb) - 1);
    double v = e == (1 << eb) - 1 ? (m ? NAN : INFINITY)
             : e == 0             ? ldexp((double)m, 1 - bias - mb)
                                  : ldexp((double)(m + (1 << mb)), e - bias - mb);
    return s ? -v : v;
}

/* A float16 / bfloat16 element near u (|u| < 2): its bits truncated (the reference needs
 * values that are exactly elements, not a particular rounding). */
static inline uint16_t ref_half_near(gemm_dtype d, double u)
{
    float f = (float)u;
    uint32_t x;
    memcpy(&x, &f, 4);
    if (d == GEMM_DTYPE_BF16) return (uint16_t)(x >> 16);
    uint16_t s = (uint16_t)((x >> 16) & 0x8000);
    double a = fabs(u);
    if (a < 0x1p-14) return (uint16_t)(s | (uint16_t)(a * 0x1p24)); /* subnormal */
    int e;
    double fr = frexp(a, &e); /* a = fr * 2^e, fr in [0.5, 1) */
    return (uint16_t)(s | ((uint16_t)(e - 1 + 15) << 10) | ((uint16_t)(fr * 2048.0) & 0x3ff));
}

/* C's dtype when out_half is not asked: float32 for the half types. */
static inline gemm_dtype ref_c_dtype(gemm_dtype d)
{
    return d == GEMM_DTYPE_F16 || d == GEMM_DTYPE_BF16 ? GEMM_DTYPE_F32 : d;
}

/* Fills n elements: floats uniform in [-1, 1); int32 small values in [-50, 50]. */
static inline void ref_fill(gemm_dtype d, void *p, size_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        uint64_t r = ref_rand(&s);
        double u = (double)(r >> 11) / 9007199254740992.0 * 2.0 - 1.0;
        if (d == GEMM_DTYPE_F32) ((float *)p)[i] = (float)u;
        if (d == GEMM_DTYPE_F64) ((double *)p)[i] = u;
        if (d == GEMM_DTYPE_I32) ((int32_t *)p)[i] = (int32_t)(r % 101) - 50;
        if (d == GEMM_DTYPE_F16 || d == GEMM_DTYPE_BF16) ((uint16_t *)p)[i] = ref_half_near(d, u);
    }
}

static inline double ref_get(gemm_dtype d, const void *p, size_t i)
{
    if (d == GEMM_DTYPE_F32) return ((const float *)p)[i];
    if (d == GEMM_DTYPE_F64) return ((const double *)p)[i];
    if (d == GEMM_DTYPE_F16 || d == GEMM_DTYPE_BF16) return ref_half_value(d, ((const uint16_t *)p)[i]);
    return ((const int32_t *)p)[i];
}

/* Poisons an output: NaN for floats, 0x7eadbeef-ish for int32. */
static inline void ref_poison(gemm_dtype d, void *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (d == GEMM_DTYPE_F32) ((float *)p)[i] = NAN;
        if (d == GEMM_DTYPE_F64) ((double *)p)[i] = NAN;
        if (d == GEMM_DTYPE_I32) ((int32_t *)p)[i] = 0x7eadbeef;
        if (d == GEMM_DTYPE_F16 || d == GEMM_DTYPE_BF16) ((uint16_t *)p)[i] = 0x7fff;
    }
}

/* int32 product wrapped mod 2^32, from 64-bit unsigned arithmetic. */
static inline int32_t ref_i32_dot(const int32_t *a, const int32_t *b, size_t i, size_t j, size_t k,
                                  size_t n)
{
    uint64_t acc = 0;
    for (size_t p = 0; p < k; p++)
        acc += (uint64_t)(int64_t)a[i * k + p] * (uint64_t)(int64_t)b[p * n + j];
    uint32_t lo = (uint32_t)acc;
    int32_t out;
    memcpy(&out, &lo, sizeof out);
    return out;
}

/* Compares c (m x n) with the reference of a.b; returns the number of mismatches and
 * prints the first few. Floats: |c - ref| <= tol_rel * sum_p |a_ip b_pj| + tol_abs, where
 * tol_rel is a few units of roundoff times k for the dtype; int32: exact. */
static inline size_t ref_check_out(gemm_dtype d, gemm_dtype cd, const void *a, const void *b, const void *c,
                                   size_t m, size_t k, size_t n, const char *what)
{
    size_t bad = 0;
    int half = d == GEMM_DTYPE_F16 || d == GEMM_DTYPE_BF16;
    /* half operands: float32 products (exact) and sums; C rounded once more when it is half */
    double eps = d == GEMM_DTYPE_F32 || half ? 1.2e-7 : 2.3e-16;
    double u_out = cd == GEMM_DTYPE_F16 ? 0x1p-11 : cd == GEMM_DTYPE_BF16 ? 0x1p-8 : 0;
    double tiny = cd == GEMM_DTYPE_F16 ? 0x1p-25 : 1e-30;
    for (size_t i = 0; i < m; i++) {
        for (size_t j = 0; j < n; j++) {
            int ok;
            double got = ref_get(cd, c, i * n + j), want;
            if (d == GEMM_DTYPE_I32) {
                int32_t w = ref_i32_dot(a, b, i, j, k, n);
                want = w;
                ok = ((const int32_t *)c)[i * n + j] == w;
            } else {
                double s = 0, mag = 0;
                for (size_t p = 0; p < k; p++) {
                    double x = ref_get(d, a, i * k + p) * ref_get(d, b, p * n + j);
                    s += x;
                    mag += fabs(x);
                }
                want = s;
                double tol = 4.0 * eps * (double)k * mag;
                tol += u_out * (fabs(want) + tol) + tiny;
                ok = !isnan(got) && fabs(got - want) <= tol;
            }
            if (!ok && bad++ < 5)
                fprintf(stderr, "# %s: C[%zu][%zu] = %.9g, expected %.9g\n", what, i, j, got, want);
        }
    }
    return bad;
}

static inline size_t ref_check(gemm_dtype d, const void *a, const void *b, const void *c, size_t m, size_t k,
                               size_t n, const char *what)
{
    return ref_check_out(d, ref_c_dtype(d), a, b, c, m, k, n, what);
}

#endif /* GEMM_TEST_REF_H */
