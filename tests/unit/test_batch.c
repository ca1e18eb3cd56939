/*
 * test_batch.c - batched jobs on the engine (CPU backend): b products C[i] = A[i].B[i] in
 * one job, with B per product or one B shared by all (broadcast), for every dtype, odd
 * shapes, b = 1 and a large b; each product checked element by element against the
 * float64 / mod-2^32 reference of gemm_ref.h on poisoned outputs; the limits (too many
 * products, sizes that overflow) refused with 413 before any buffer is touched.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "gemm_ref.h"

typedef struct {
    gemm_job job;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int calls;
} bjob;

static void bjob_done(gemm_job *job)
{
    bjob *t = job->user;
    pthread_mutex_lock(&t->mu);
    t->calls++;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

static gemm_engine *open_cpu(void)
{
    gemm_engine_config cfg;
    gemm_engine_config_defaults(&cfg);
    snprintf(cfg.backend, sizeof cfg.backend, "cpu");
    gemm_err err;
    gemm_engine *e = gemm_engine_open(&cfg, &err);
    if (!e) fprintf(stderr, "# open: %s\n", err.message);
    assert_non_null(e);
    return e;
}

/* Runs one batched job of nb products m x k . k x n and checks every product. */
static void run_batch(gemm_engine *e, gemm_dtype d, size_t nb, size_t m, size_t k, size_t n,
                      int shared, uint64_t seed)
{
    bjob t;
    memset(&t, 0, sizeof t);
    pthread_mutex_init(&t.mu, NULL);
    pthread_cond_init(&t.cv, NULL);
    size_t es = gemm_dtype_size(d), nbb = shared ? 1 : nb;
    t.job.dtype = d;
    t.job.m = m, t.job.k = k, t.job.n = n;
    t.job.batch = nb;
    t.job.b_shared = shared;
    t.job.a = gemm_engine_host_alloc(e, nb * m * k * es);
    t.job.b = gemm_engine_host_alloc(e, nbb * k * n * es);
    t.job.c = gemm_engine_host_alloc(e, nb * m * n * es);
    assert_true(t.job.a && t.job.b && t.job.c);
    ref_fill(d, t.job.a, nb * m * k, seed);
    ref_fill(d, t.job.b, nbb * k * n, seed + 7);
    ref_poison(d, t.job.c, nb * m * n);
    t.job.done = bjob_done;
    t.job.user = &t;

    gemm_err err;
    int rc = gemm_engine_submit(e, &t.job, &err);
    if (rc != 0) fprintf(stderr, "# submit: %s\n", err.message);
    assert_int_equal(rc, 0);
    pthread_mutex_lock(&t.mu);
    while (t.calls < 1) pthread_cond_wait(&t.cv, &t.mu);
    pthread_mutex_unlock(&t.mu);
    assert_int_equal(t.calls, 1);
    assert_int_equal(atomic_load(&t.job.state), GEMM_JOB_DONE);
    if (nb > 1) {
        assert_int_equal(t.job.batched, nb);
        assert_string_equal(t.job.batch_mode, "loop");
    } else {
        assert_int_equal(t.job.batched, 0);
        assert_string_equal(t.job.batch_mode, "");
    }

    size_t bad = 0;
    for (size_t i = 0; i < nb; i++) {
        const char *a = (const char *)t.job.a + i * m * k * es;
        const char *b = (const char *)t.job.b + (shared ? 0 : i * k * n * es);
        const char *c = (const char *)t.job.c + i * m * n * es;
        char what[64];
        snprintf(what, sizeof what, "%s batch %zu product %zu", gemm_dtype_name(d), nb, i);
        bad += ref_check(d, a, b, c, m, k, n, what);
    }
    assert_int_equal(bad, 0);
    gemm_engine_host_free(e, t.job.a);
    gemm_engine_host_free(e, t.job.b);
    gemm_engine_host_free(e, t.job.c);
    pthread_cond_destroy(&t.cv);
    pthread_mutex_destroy(&t.mu);
}

static void check_dtype(gemm_dtype d)
{
    gemm_engine *e = open_cpu();
    static const size_t shapes[][4] = {
        /* nb, m, k, n */
        {1, 5, 7, 3},   {2, 1, 1, 1},   {3, 17, 9, 13}, {5, 33, 31, 29},
        {4, 1, 64, 1},  {7, 64, 1, 65}, {300, 3, 5, 2}, {1000, 2, 2, 2},
    };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int shared = 0; shared <= 1; shared++)
            run_batch(e, d, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], shared,
                      100 + s * 2 + (uint64_t)shared);
    gemm_engine_close(e);
}

static void test_batch_f32(void **st) { (void)st; check_dtype(GEMM_DTYPE_F32); }
static void test_batch_f64(void **st) { (void)st; check_dtype(GEMM_DTYPE_F64); }
static void test_batch_i32(void **st) { (void)st; check_dtype(GEMM_DTYPE_I32); }

static void expect_refused(gemm_engine *e, uint64_t nb, uint64_t m, uint64_t k, uint64_t n,
                           int shared)
{
    static char dummy[64];
    gemm_job job;
    memset(&job, 0, sizeof job);
    job.dtype = GEMM_DTYPE_F64;
    job.m = m, job.k = k, job.n = n;
    job.batch = nb;
    job.b_shared = shared;
    job.a = job.b = job.c = dummy; /* never read: the checks come first */
    job.done = bjob_done;
    gemm_err err;
    assert_int_equal(gemm_engine_submit(e, &job, &err), -1);
    assert_int_equal(err.status, 413);
    assert_string_equal(err.code, "too_large");
}

static void test_batch_limits(void **st)
{
    (void)st;
    gemm_engine *e = open_cpu();
    expect_refused(e, GEMM_MAX_BATCH + 1ull, 1, 1, 1, 0);
    expect_refused(e, UINT64_MAX, 1, 1, 1, 1);
    /* each matrix fits, the batch does not: b * m * k * 8 wraps */
    expect_refused(e, 1000000, 1ull << 21, 1ull << 21, 1, 1);
    /* A fits, a per-product B overflows */
    expect_refused(e, 1000000, 1, 1ull << 24, 1ull << 24, 0);
    /* bytes helper */
    gemm_job j;
    memset(&j, 0, sizeof j);
    j.dtype = GEMM_DTYPE_I32;
    j.m = 2, j.k = 3, j.n = 5, j.batch = 4;
    size_t bytes[3];
    assert_true(gemm_job_bytes(&j, bytes));
    assert_int_equal(bytes[0], 4 * 2 * 3 * 4);
    assert_int_equal(bytes[1], 4 * 3 * 5 * 4);
    assert_int_equal(bytes[2], 4 * 2 * 5 * 4);
    j.b_shared = 1;
    assert_true(gemm_job_bytes(&j, bytes));
    assert_int_equal(bytes[1], 3 * 5 * 4);
    gemm_engine_close(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_f32),
        cmocka_unit_test(test_batch_f64),
        cmocka_unit_test(test_batch_i32),
        cmocka_unit_test(test_batch_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
