/*
 * gpu_ref.h - what the GPU test programs share: TAP output, random inputs, poisoned
 * outputs, and an independent reference (OpenBLAS dgemm on float64 copies of the inputs
 * for float32/float64, a mod-2^32 loop in uint32_t for int32) with the error metric
 * ||C - ref||_F / ||ref||_F. Header-only so each test program stays one file.
 */
#ifndef GEMM_GPU_REF_H
#define GEMM_GPU_REF_H

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "gemm_types.h"

/* ---- TAP ---- */
static int tap_n, tap_failed;

static void tap(int ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%sok %d - ", ok ? "" : "not ", ++tap_n);
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    if (!ok)
        tap_failed++;
}

static void tap_skip(const char *why, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("ok %d - ", ++tap_n);
    vprintf(fmt, ap);
    printf(" # SKIP %s\n", why);
    fflush(stdout);
    va_end(ap);
}

static int tap_done(void)
{
    printf("1..%d\n", tap_n);
    return tap_failed ? 1 : 0;
}

/* ---- inputs ---- */
static uint64_t ref_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* Floats uniform in [-1, 1); int32 over the whole range, so products wrap. */
static inline void ref_fill(gemm_dtype d, void *p, size_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 0x1234567ull;
    for (size_t i = 0; i < n; i++) {
        uint64_t r = ref_next(&s);
        double u = (double)(r >> 11) / 9007199254740992.0 * 2.0 - 1.0;
        if (d == GEMM_DTYPE_F32) ((float *)p)[i] = (float)u;
        else if (d == GEMM_DTYPE_F64) ((double *)p)[i] = u;
        else ((uint32_t *)p)[i] = (uint32_t)(r >> 17);
    }
}

/* NaN for floats and 0xFFFFFFFF for int32: every byte 0xFF. */
static void ref_poison(void *p, size_t bytes) { memset(p, 0xFF, bytes); }

/* ---- references ---- */
static inline double *ref_upcast(gemm_dtype d, const void *p, size_t n)
{
    double *out = malloc(n * sizeof *out);
    if (!out) return NULL;
    for (size_t i = 0; i < n; i++)
        out[i] = d == GEMM_DTYPE_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
    return out;
}

/* float64 reference of a float32/float64 product: ref is m x n. */
static inline int ref_gemm_f64(gemm_dtype d, const void *A, const void *B, double *ref, int m, int k, int n)
{
    double *a = ref_upcast(d, A, (size_t)m * k), *b = ref_upcast(d, B, (size_t)k * n);
    if (!a || !b) { free(a); free(b); return -1; }
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0, a, k, b, n, 0.0, ref, n);
    free(a);
    free(b);
    return 0;
}

/* int32 reference: C = A B mod 2^32, i-p-j loop in uint32_t. */
static inline void ref_gemm_i32(const void *A, const void *B, uint32_t *ref, int m, int k, int n)
{
    const uint32_t *a = A, *b = B;
    memset(ref, 0, (size_t)m * n * sizeof *ref);
    for (int i = 0; i < m; i++) {
        uint32_t *c = ref + (size_t)i * n;
        for (int p = 0; p < k; p++) {
            uint32_t av = a[(size_t)i * k + p];
            const uint32_t *br = b + (size_t)p * n;
            for (int j = 0; j < n; j++) c[j] += av * br[j];
        }
    }
}

/* ||C - ref||_F / ||ref||_F; +inf when C has a NaN (an element never written). */
static inline double ref_rel_err(gemm_dtype d, const void *C, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double c = d == GEMM_DTYPE_F32 ? (double)((const float *)C)[i] : ((const double *)C)[i];
        if (c != c) return INFINITY;
        double e = c - ref[i];
        num += e * e;
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Number of int32 elements that differ from the reference. */
static inline size_t ref_mismatches_i32(const void *C, const uint32_t *ref, size_t n)
{
    const uint32_t *c = C;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += c[i] != ref[i];
    return bad;
}

/* ---- products finished: gpu_on_done is a job's done(), counted per program ---- */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n;
} gpu_done_state;

static inline gpu_done_state *gpu_done(void)
{
    static gpu_done_state s = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    return &s;
}

static inline void gpu_on_done(gemm_job *j)
{
    (void)j;
    gpu_done_state *s = gpu_done();
    pthread_mutex_lock(&s->mu);
    s->n++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Waits until n products in all have finished. */
static inline void gpu_wait_done(int n)
{
    gpu_done_state *s = gpu_done();
    pthread_mutex_lock(&s->mu);
    while (s->n < n) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

static inline int gpu_done_count(void)
{
    gpu_done_state *s = gpu_done();
    pthread_mutex_lock(&s->mu);
    int n = s->n;
    pthread_mutex_unlock(&s->mu);
    return n;
}

#endif /* GEMM_GPU_REF_H */
