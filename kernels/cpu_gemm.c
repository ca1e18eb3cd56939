/*
 * cpu_gemm.c - products computed on the host: OpenBLAS for float32 and float64 (float16 /
 * bfloat16 widened to float32), a cache-blocked loop for int32.
 * The int32 loop: four rows of A share each load of a B panel that stays in L2, uint32_t
 * throughout (wraps mod 2^32 without undefined behaviour).
 */
#if defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#pragma GCC optimize("O3")
#endif
#include "cpu_gemm.h"
#include "gemm_half.h"

#include <cblas.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { KC = 128, NC = 512, MR = 4 };

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define GEMM_MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define GEMM_MULTIVERSION
#endif

/* C[r0..r1) x [j0, j0+nc) += A[r0..r1) x [p0, p0+kc) . B[p0.., j0..] */
GEMM_MULTIVERSION
static void panel(const uint32_t *restrict a, const uint32_t *restrict b, uint32_t *restrict c,
                  size_t r0, size_t r1, size_t k, size_t n, size_t p0, size_t kc, size_t j0,
                  size_t nc)
{
    size_t i = r0;
    for (; i + MR <= r1; i += MR) {
        uint32_t *restrict c0 = c + i * n + j0, *restrict c1 = c0 + n, *restrict c2 = c1 + n,
                 *restrict c3 = c2 + n;
        const uint32_t *a0 = a + i * k + p0, *a1 = a0 + k, *a2 = a1 + k, *a3 = a2 + k;
        for (size_t p = 0; p < kc; p++) {
            const uint32_t x0 = a0[p], x1 = a1[p], x2 = a2[p], x3 = a3[p];
            const uint32_t *restrict bp = b + (p0 + p) * n + j0;
            for (size_t j = 0; j < nc; j++) {
                const uint32_t y = bp[j];
                c0[j] += x0 * y;
                c1[j] += x1 * y;
                c2[j] += x2 * y;
                c3[j] += x3 * y;
            }
        }
    }
    for (; i < r1; i++) {
        uint32_t *restrict c0 = c + i * n + j0;
        const uint32_t *a0 = a + i * k + p0;
        for (size_t p = 0; p < kc; p++) {
            const uint32_t x0 = a0[p];
            const uint32_t *restrict bp = b + (p0 + p) * n + j0;
            for (size_t j = 0; j < nc; j++) c0[j] += x0 * bp[j];
        }
    }
}

typedef struct {
    const uint32_t *a, *b;
    uint32_t *c;
    size_t r0, r1, k, n;
    const _Atomic int *stop; /* NULL: never */
    int stopped;
} rows_task;

static void rows_product(rows_task *t)
{
    /* cppcheck thinks tasks[0] may be unset (nt == 0); nt is >= 1: m == 0 gives work 0
     * and so nt = 1 */
    // cppcheck-suppress uninitvar
    if (t->r1 <= t->r0) return;
    memset(t->c + t->r0 * t->n, 0, (t->r1 - t->r0) * t->n * sizeof(uint32_t));
    for (size_t p0 = 0; p0 < t->k; p0 += KC) {
        if (t->stop && atomic_load_explicit(t->stop, memory_order_relaxed)) {
            t->stopped = 1;
            return;
        }
        size_t kc = t->k - p0 < KC ? t->k - p0 : KC;
        for (size_t j0 = 0; j0 < t->n; j0 += NC) {
            size_t nc = t->n - j0 < NC ? t->n - j0 : NC;
            panel(t->a, t->b, t->c, t->r0, t->r1, t->k, t->n, p0, kc, j0, nc);
        }
    }
}

static void *rows_thread(void *arg)
{
    rows_product(arg);
    return NULL;
}

int gemm_cpu_gemm_i32_stop(const int32_t *a, const int32_t *b, int32_t *c, uint64_t m, uint64_t k,
                           uint64_t n, int threads, const _Atomic int *stop)
{
    /* int32_t and uint32_t may alias each other (C11 6.5p7). */
    const uint32_t *ua = (const uint32_t *)a, *ub = (const uint32_t *)b;
    uint32_t *uc = (uint32_t *)c;
    enum { MAXT = 256 };

    size_t nt = threads > 0 ? (size_t)threads : 1;
    if (nt > MAXT) nt = MAXT;
    size_t groups = ((size_t)m + MR - 1) / MR; /* split rows in whole groups of MR */
    if (nt > groups) nt = groups;
    double work = (double)m * (double)n * (double)k;
    if (work < 262144.0) nt = 1; /* a thread costs more than the product */

    rows_task tasks[MAXT];
    pthread_t tid[MAXT];
    for (size_t t = 0; t < nt; t++) {
        size_t g0 = groups * t / nt, g1 = groups * (t + 1) / nt;
        size_t r0 = g0 * MR, r1 = g1 * MR;
        if (r1 > m) r1 = (size_t)m;
        tasks[t] = (rows_task){ua, ub, uc, r0, r1, (size_t)k, (size_t)n, stop, 0};
    }
    /* Shares 1..nt-1 on threads (here when one cannot start), share 0 here. */
    unsigned char joined[MAXT] = {0};
    for (size_t t = 1; t < nt; t++) {
        if (pthread_create(&tid[t], NULL, rows_thread, &tasks[t]) == 0)
            joined[t] = 1;
        else
            rows_product(&tasks[t]);
    }
    rows_product(&tasks[0]);
    int stopped = tasks[0].stopped;
    for (size_t t = 1; t < nt; t++) {
        if (joined[t]) pthread_join(tid[t], NULL);
        stopped |= tasks[t].stopped;
    }
    return stopped;
}

void gemm_cpu_ran_here(gemm_job *job)
{
    snprintf(job->device, sizeof job->device, "cpu");
    job->stream = -1;
    job->tile_used = 0;
    job->math_used = job->dtype == GEMM_DTYPE_F32 ? GEMM_MATH_FP32 : GEMM_MATH_DEFAULT;
    if (!job->kernel_used[0]) snprintf(job->kernel_used, sizeof job->kernel_used, "%s", gemm_cpu_kernel(job->dtype));
}

int gemm_cpu_products(gemm_job *job, int threads)
{
    const int m = (int)job->m, k = (int)job->k, n = (int)job->n;
    const uint64_t nb = gemm_job_batch(job);
    const gemm_dtype d = job->dtype;
    const size_t es = gemm_dtype_size(d), na = (size_t)job->m * job->k, nbel = (size_t)job->k * job->n,
                 nc = (size_t)job->m * job->n;
    const size_t sa = na * es, sb = job->b_shared ? 0 : nbel * es, sc = nc * gemm_dtype_size(gemm_job_c_dtype(job));
    /* float16 / bfloat16: widened to float32 (exactly), C rounded back when asked for */
    float *fa = NULL, *fb = NULL, *fc = NULL;
    int rc = 0;
    const double t0 = gemm_now_ms();
    if (gemm_dtype_is_half(d)) {
        fa = malloc(na * sizeof(float)), fb = malloc(nbel * sizeof(float));
        fc = job->out_half ? malloc(nc * sizeof(float)) : NULL;
        if (!fa || !fb || (job->out_half && !fc))
            rc = gemm_engine_err_set(&job->err, GEMM_E_NO_MEMORY,
                                     "cannot allocate the float32 copies of a %dx%dx%d %s product now; retry later",
                                     m, k, n, gemm_dtype_name(d));
    }
    for (uint64_t i = 0; i < nb && rc == 0; i++) {
        if (i > 0 && gemm_job_cancel_requested(job)) {
            rc = gemm_job_stop_cancelled(job, "the rest of its batch (between products)");
            break;
        }
        /* byte offsets, then plain element pointers (void * converts without a cast) */
        const void *a = (const unsigned char *)job->a + i * sa, *b = (const unsigned char *)job->b + i * sb;
        void *c = (unsigned char *)job->c + i * sc;
        switch (d) {
        case GEMM_DTYPE_F32:
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
            break;
        case GEMM_DTYPE_F64:
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0, a, k, b, n, 0.0, c, n);
            break;
        case GEMM_DTYPE_I32:
            if (gemm_cpu_gemm_i32_stop(a, b, c, job->m, job->k, job->n, threads, &job->cancel_requested))
                rc = gemm_job_stop_cancelled(job, "the rest of its product (between k-slices)");
            break;
        case GEMM_DTYPE_F16:
        case GEMM_DTYPE_BF16:
            gemm_half_to_f32_array(d, a, fa, na);
            if (i == 0 || sb) gemm_half_to_f32_array(d, b, fb, nbel);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, fa, k, fb, n, 0.0f, fc ? fc : c, n);
            if (fc) gemm_f32_to_half_array(d, fc, c, nc);
            break;
        default:
            rc = gemm_engine_err_set(&job->err, GEMM_E_BAD_DTYPE, "unsupported dtype");
        }
    }
    free(fa), free(fb), free(fc);
    if (rc != 0) return rc;
    if (nb > 1) {
        job->batched = nb;
        snprintf(job->batch_mode, sizeof job->batch_mode, "loop");
    }
    job->timing.kernel_ms = gemm_now_ms() - t0;
    double flops = 2.0 * (double)nb * (double)job->m * (double)job->n * (double)job->k;
    job->timing.gflops = job->timing.kernel_ms > 0 ? flops / (job->timing.kernel_ms * 1e6) : 0;
    return 0;
}
