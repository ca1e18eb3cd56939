/*
 * test_cpu.c - the CPU backend through the engine: products of odd shapes for every
 * dtype against independent references (outputs poisoned first), int32 wrap-around,
 * the int32 loop's thread split, option validation (422s), describe, timing fields and
 * the fault hooks.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdatomic.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_gemm.h"
#include "backend.h"
#include "gemm_ref.h"

/* ---- a synchronous helper over the asynchronous engine ------------------ */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int calls;
} waiter;

static void on_done(gemm_job *job)
{
    waiter *w = job->user;
    pthread_mutex_lock(&w->mu);
    w->calls++;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void wait_done(waiter *w)
{
    pthread_mutex_lock(&w->mu);
    while (w->calls == 0) pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
}

static gemm_engine *open_cpu(int threads, int workers, const char *faults)
{
    gemm_engine_config cfg;
    gemm_engine_config_defaults(&cfg);
    snprintf(cfg.backend, sizeof cfg.backend, "cpu");
    cfg.threads = threads;
    cfg.cpu_workers = workers;
    snprintf(cfg.fault_inject, sizeof cfg.fault_inject, "%s", faults ? faults : "");
    gemm_engine_err err;
    gemm_engine *e = gemm_engine_open(&cfg, &err);
    if (!e) fprintf(stderr, "# open: %d: %s\n", err.code, err.message);
    assert_non_null(e);
    return e;
}

typedef struct {
    gemm_job job;
    waiter w;
    size_t m, k, n;
} product;

/* Allocates A, B (filled from seed, or left for the caller when seed == 0) and a poisoned C. */
/* out_half: float16 / bfloat16 operands with C in their dtype (else C is float32). */
static void product_init_out(gemm_engine *e, product *p, gemm_dtype d, int out_half, size_t m, size_t k, size_t n,
                             uint64_t seed);

static void product_init(gemm_engine *e, product *p, gemm_dtype d, size_t m, size_t k, size_t n,
                         uint64_t seed)
{
    product_init_out(e, p, d, 0, m, k, n, seed);
}

static void product_init_out(gemm_engine *e, product *p, gemm_dtype d, int out_half, size_t m, size_t k, size_t n,
                             uint64_t seed)
{
    memset(p, 0, sizeof *p);
    pthread_mutex_init(&p->w.mu, NULL);
    pthread_cond_init(&p->w.cv, NULL);
    size_t es = gemm_dtype_size(d);
    p->m = m, p->k = k, p->n = n;
    p->job.dtype = d;
    p->job.m = m, p->job.k = k, p->job.n = n;
    p->job.a = gemm_engine_host_alloc(e, m * k * es);
    p->job.b = gemm_engine_host_alloc(e, k * n * es);
    p->job.out_half = out_half;
    gemm_dtype cd = gemm_job_c_dtype(&p->job);
    p->job.c = gemm_engine_host_alloc(e, m * n * gemm_dtype_size(cd));
    assert_non_null(p->job.a);
    assert_non_null(p->job.b);
    assert_non_null(p->job.c);
    if (seed) {
        ref_fill(d, p->job.a, m * k, seed);
        ref_fill(d, p->job.b, k * n, seed + 1);
    }
    ref_poison(cd, p->job.c, m * n);
    p->job.done = on_done;
    p->job.user = &p->w;
}

static void product_free(gemm_engine *e, product *p)
{
    gemm_engine_host_free(e, p->job.a);
    gemm_engine_host_free(e, p->job.b);
    gemm_engine_host_free(e, p->job.c);
    pthread_cond_destroy(&p->w.cv);
    pthread_mutex_destroy(&p->w.mu);
}

/* Submits and waits; returns the final state. */
static int product_run(gemm_engine *e, product *p)
{
    gemm_engine_err err;
    int rc = gemm_engine_submit(e, &p->job, &err);
    if (rc != 0) fprintf(stderr, "# submit: %d: %s\n", err.code, err.message);
    assert_int_equal(rc, 0);
    wait_done(&p->w);
    assert_int_equal(p->w.calls, 1);
    return atomic_load(&p->job.state);
}

/* ---- products of odd shapes ---------------------------------------------- */

static const size_t shapes[][3] = {
    {1, 1, 1}, {1, 1, 1000}, {1000, 1, 1}, {1, 1000, 1}, {37, 53, 29}, {5, 1, 7},
    {3, 300, 2}, {130, 300, 517}, {64, 64, 64}, {2, 129, 513},
};

static void check_shapes(gemm_dtype d, int threads)
{
    gemm_engine *e = open_cpu(threads, 1, NULL);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        product p;
        product_init(e, &p, d, shapes[s][0], shapes[s][1], shapes[s][2], 17 + s);
        assert_int_equal(product_run(e, &p), GEMM_JOB_DONE);
        char what[96];
        snprintf(what, sizeof what, "%s %zux%zux%zu", gemm_dtype_name(d), p.m, p.k, p.n);
        assert_int_equal(ref_check(d, p.job.a, p.job.b, p.job.c, p.m, p.k, p.n, what), 0);
        assert_string_equal(p.job.kernel_used, d == GEMM_DTYPE_I32 ? "blocked" : "openblas");
        assert_string_equal(p.job.device, "cpu");
        assert_int_equal(p.job.stream, -1);
        assert_true(p.job.timing.kernel_ms >= 0);
        assert_true(p.job.timing.compute_ms >= p.job.timing.kernel_ms);
        assert_true(p.job.timing.h2d_ms == 0 && p.job.timing.d2h_ms == 0);
        assert_true(p.job.timing.gflops >= 0);
        assert_int_equal(p.job.err.code, GEMM_E_NONE);
        product_free(e, &p);
    }
    gemm_engine_close(e);
}

/* float16 / bfloat16 operands, C in float32 and in their dtype: odd shapes, a batch with its
 * own Bs and one with a shared B, against a float64 reference of the elements. */
static void check_half(gemm_dtype d)
{
    gemm_engine *e = open_cpu(2, 2, NULL);
    static const size_t half_shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 33, 9}, {64, 64, 64}, {129, 67, 131}, {1, 300, 2}};
    for (int out = 0; out < 2; out++) {
        for (size_t s = 0; s < sizeof half_shapes / sizeof half_shapes[0]; s++) {
            product p;
            product_init_out(e, &p, d, out, half_shapes[s][0], half_shapes[s][1], half_shapes[s][2], 91 + s);
            assert_int_equal(product_run(e, &p), GEMM_JOB_DONE);
            char what[96];
            snprintf(what, sizeof what, "%s %zux%zux%zu out %s", gemm_dtype_name(d), p.m, p.k, p.n,
                     out ? gemm_dtype_name(d) : "float32");
            assert_int_equal(ref_check_out(d, out ? d : GEMM_DTYPE_F32, p.job.a, p.job.b, p.job.c, p.m, p.k, p.n, what),
                             0);
            assert_string_equal(p.job.kernel_used, "openblas");
            assert_string_equal(gemm_math_report_name(d, p.job.math_used), "fp32");
            product_free(e, &p);
        }
        for (int shared = 0; shared < 2; shared++) { /* 4 products of 5x6 . 6x3 */
            const size_t nb = 4, m = 5, k = 6, n = 3, es = 2, esc = out ? 2 : 4;
            product p;
            product_init_out(e, &p, d, out, m, k, n, 0);
            gemm_engine_host_free(e, p.job.a);
            gemm_engine_host_free(e, p.job.b);
            gemm_engine_host_free(e, p.job.c);
            p.job.batch = nb;
            p.job.b_shared = shared;
            p.job.a = gemm_engine_host_alloc(e, nb * m * k * es);
            p.job.b = gemm_engine_host_alloc(e, (shared ? 1 : nb) * k * n * es);
            p.job.c = gemm_engine_host_alloc(e, nb * m * n * esc);
            ref_fill(d, p.job.a, nb * m * k, 7);
            ref_fill(d, p.job.b, (shared ? 1 : nb) * k * n, 8);
            ref_poison(out ? d : GEMM_DTYPE_F32, p.job.c, nb * m * n);
            assert_int_equal(product_run(e, &p), GEMM_JOB_DONE);
            for (size_t i = 0; i < nb; i++) {
                const char *a = (const char *)p.job.a + i * m * k * es;
                const char *b = (const char *)p.job.b + (shared ? 0 : i * k * n * es);
                const char *c = (const char *)p.job.c + i * m * n * esc;
                assert_int_equal(ref_check_out(d, out ? d : GEMM_DTYPE_F32, a, b, c, m, k, n, "half batch"), 0);
            }
            assert_int_equal(p.job.batched, nb);
            product_free(e, &p);
        }
    }
    gemm_engine_close(e);
}

static void test_half_f16(void **st) { (void)st; check_half(GEMM_DTYPE_F16); }
static void test_half_bf16(void **st) { (void)st; check_half(GEMM_DTYPE_BF16); }

static void test_shapes_f32(void **st) { (void)st; check_shapes(GEMM_DTYPE_F32, 0); }
static void test_shapes_f64(void **st) { (void)st; check_shapes(GEMM_DTYPE_F64, 0); }
static void test_shapes_i32(void **st) { (void)st; check_shapes(GEMM_DTYPE_I32, 0); }
static void test_shapes_i32_three_threads(void **st) { (void)st; check_shapes(GEMM_DTYPE_I32, 3); }
static void test_shapes_f32_one_thread(void **st) { (void)st; check_shapes(GEMM_DTYPE_F32, 1); }

/* ---- int32 wrap-around ----------------------------------------------------- */

static int32_t run_i32_dot(gemm_engine *e, const int32_t *a, const int32_t *b, size_t k)
{
    product p;
    product_init(e, &p, GEMM_DTYPE_I32, 1, k, 1, 0);
    memcpy(p.job.a, a, k * sizeof *a);
    memcpy(p.job.b, b, k * sizeof *b);
    assert_int_equal(product_run(e, &p), GEMM_JOB_DONE);
    int32_t out = ((int32_t *)p.job.c)[0];
    product_free(e, &p);
    return out;
}

static void test_i32_wraps(void **st)
{
    (void)st;
    gemm_engine *e = open_cpu(0, 1, NULL);
    /* INT32_MAX * 2 = 0xfffffffe = -2 */
    assert_int_equal(run_i32_dot(e, (int32_t[]){INT32_MAX}, (int32_t[]){2}, 1), -2);
    /* INT32_MAX + INT32_MAX = -2 */
    assert_int_equal(run_i32_dot(e, (int32_t[]){INT32_MAX, INT32_MAX}, (int32_t[]){1, 1}, 2), -2);
    /* INT32_MIN * -1 = INT32_MIN */
    assert_int_equal(run_i32_dot(e, (int32_t[]){INT32_MIN}, (int32_t[]){-1}, 1), INT32_MIN);
    /* INT32_MIN * INT32_MIN = 2^62 = 0 mod 2^32 */
    assert_int_equal(run_i32_dot(e, (int32_t[]){INT32_MIN}, (int32_t[]){INT32_MIN}, 1), 0);
    /* 65536 * 65536 = 2^32 = 0; + 3 * -7 = -21 */
    assert_int_equal(run_i32_dot(e, (int32_t[]){65536, 3}, (int32_t[]){65536, -7}, 2), -21);
    /* 46341^2 = 2147488281 = INT32_MAX + 4634 -> INT32_MIN + 4633 */
    assert_int_equal(run_i32_dot(e, (int32_t[]){46341}, (int32_t[]){46341}, 1), INT32_MIN + 4633);
    gemm_engine_close(e);
}

/* Full-range random int32 inputs overflow on nearly every multiply-add. */
static void test_i32_full_range(void **st)
{
    (void)st;
    gemm_engine *e = open_cpu(0, 1, NULL);
    product p;
    product_init(e, &p, GEMM_DTYPE_I32, 19, 300, 23, 0);
    uint64_t s = 99;
    for (size_t i = 0; i < 19 * 300; i++) ((uint32_t *)p.job.a)[i] = (uint32_t)ref_rand(&s);
    for (size_t i = 0; i < 300 * 23; i++) ((uint32_t *)p.job.b)[i] = (uint32_t)ref_rand(&s);
    assert_int_equal(product_run(e, &p), GEMM_JOB_DONE);
    assert_int_equal(ref_check(GEMM_DTYPE_I32, p.job.a, p.job.b, p.job.c, 19, 300, 23, "int32 full range"), 0);
    product_free(e, &p);
    gemm_engine_close(e);
}

/* The int32 loop directly: every thread count gives the same exact answer, across the
 * k and n block edges (k > 128, n > 512) and with rows that are not a multiple of 4. */
static void test_i32_thread_split(void **st)
{
    (void)st;
    const size_t m = 67, k = 140, n = 600;
    int32_t *a = malloc(m * k * 4), *b = malloc(k * n * 4), *c = malloc(m * n * 4);
    assert_true(a && b && c);
    ref_fill(GEMM_DTYPE_I32, a, m * k, 5);
    ref_fill(GEMM_DTYPE_I32, b, k * n, 6);
    a[0] = INT32_MAX;
    b[0] = INT32_MAX;
    for (int t = 1; t <= 8; t++) {
        ref_poison(GEMM_DTYPE_I32, c, m * n);
        assert_int_equal(gemm_cpu_gemm_i32_stop(a, b, c, m, k, n, t, NULL), 0);
        char what[64];
        snprintf(what, sizeof what, "int32 loop, %d threads", t);
        assert_int_equal(ref_check(GEMM_DTYPE_I32, a, b, c, m, k, n, what), 0);
    }
    free(a);
    free(b);
    free(c);
}

/* The int32 loop's cancel flag: raised before the call, every thread stops before its
 * first k-slice (returns 1, C left as it was zeroed); clear, the answer is whole and
 * right (returns 0). */
static void test_i32_stop_flag(void **st)
{
    (void)st;
    const size_t m = 67, k = 300, n = 40;
    int32_t *a = malloc(m * k * 4), *b = malloc(k * n * 4), *c = malloc(m * n * 4);
    assert_true(a && b && c);
    ref_fill(GEMM_DTYPE_I32, a, m * k, 7);
    ref_fill(GEMM_DTYPE_I32, b, k * n, 8);
    _Atomic int stop = 1;
    for (int t = 1; t <= 4; t++) {
        ref_poison(GEMM_DTYPE_I32, c, m * n);
        assert_int_equal(gemm_cpu_gemm_i32_stop(a, b, c, m, k, n, t, &stop), 1);
        for (size_t i = 0; i < m * n; i++) assert_int_equal(c[i], 0);
    }
    atomic_store(&stop, 0);
    ref_poison(GEMM_DTYPE_I32, c, m * n);
    assert_int_equal(gemm_cpu_gemm_i32_stop(a, b, c, m, k, n, 3, &stop), 0);
    assert_int_equal(ref_check(GEMM_DTYPE_I32, a, b, c, m, k, n, "int32 loop, flag clear"), 0);
    free(a);
    free(b);
    free(c);
}

/* ---- options ------------------------------------------------------------- */

static void expect_reject(gemm_engine *e, gemm_dtype d, const char *kernel, gemm_math math,
                          int tile, gemm_ecode code, const char *needle)
{
    product p;
    product_init(e, &p, d, 2, 3, 4, 1);
    snprintf(p.job.kernel, sizeof p.job.kernel, "%s", kernel);
    p.job.math = math;
    p.job.tile = tile;
    gemm_engine_err err;
    assert_int_equal(gemm_engine_submit(e, &p.job, &err), -1);
    assert_int_equal(err.code, code);
    if (!strstr(err.message, needle)) fprintf(stderr, "# message: %s\n", err.message);
    assert_non_null(strstr(err.message, needle));
    assert_int_equal(p.w.calls, 0); /* done() is not called for a refused job */
    product_free(e, &p);
}

static void test_rejects(void **st)
{
    (void)st;
    gemm_engine *e = open_cpu(0, 1, NULL);
    expect_reject(e, GEMM_DTYPE_F32, "tiled", GEMM_MATH_DEFAULT, 0, GEMM_E_UNKNOWN_KERNEL, "openblas");
    expect_reject(e, GEMM_DTYPE_F32, "cublas", GEMM_MATH_DEFAULT, 0, GEMM_E_UNKNOWN_KERNEL, "blocked");
    expect_reject(e, GEMM_DTYPE_I32, "naive", GEMM_MATH_DEFAULT, 0, GEMM_E_UNKNOWN_KERNEL, "\"naive\"");
    expect_reject(e, GEMM_DTYPE_F32, "auto", GEMM_MATH_TF32, 0, GEMM_E_UNSUPPORTED_MATH, "exact fp32");
    expect_reject(e, GEMM_DTYPE_F32, "", GEMM_MATH_BF16, 0, GEMM_E_UNSUPPORTED_MATH, "bf16");
    expect_reject(e, GEMM_DTYPE_I32, "openblas", GEMM_MATH_DEFAULT, 0, GEMM_E_UNSUPPORTED_DTYPE, "int32");
    expect_reject(e, GEMM_DTYPE_F64, "blocked", GEMM_MATH_DEFAULT, 0, GEMM_E_UNSUPPORTED_DTYPE, "float64");
    expect_reject(e, GEMM_DTYPE_F32, "auto", GEMM_MATH_DEFAULT, 16, GEMM_E_BAD_TILE, "tile");
    gemm_engine_close(e);
}

static void test_kernel_names_resolve(void **st)
{
    (void)st;
    gemm_engine *e = open_cpu(0, 1, NULL);
    static const struct { gemm_dtype d; const char *ask, *used; gemm_math math; } cases[] = {
        {GEMM_DTYPE_F32, "", "openblas", GEMM_MATH_DEFAULT},
        {GEMM_DTYPE_F32, "auto", "openblas", GEMM_MATH_FP32},
        {GEMM_DTYPE_F64, "cpu", "openblas", GEMM_MATH_DEFAULT},
        {GEMM_DTYPE_F64, "openblas", "openblas", GEMM_MATH_DEFAULT},
        {GEMM_DTYPE_I32, "auto", "blocked", GEMM_MATH_DEFAULT},
        {GEMM_DTYPE_I32, "blocked", "blocked", GEMM_MATH_DEFAULT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        product p;
        product_init(e, &p, cases[i].d, 3, 4, 5, 40 + i);
        snprintf(p.job.kernel, sizeof p.job.kernel, "%s", cases[i].ask);
        p.job.math = cases[i].math;
        assert_int_equal(product_run(e, &p), GEMM_JOB_DONE);
        assert_string_equal(p.job.kernel_used, cases[i].used);
        assert_int_equal(p.job.math_used,
                         cases[i].d == GEMM_DTYPE_F32 ? GEMM_MATH_FP32 : GEMM_MATH_DEFAULT);
        assert_int_equal(ref_check(cases[i].d, p.job.a, p.job.b, p.job.c, 3, 4, 5, cases[i].ask), 0);
        product_free(e, &p);
    }
    gemm_engine_close(e);
}

/* ---- describe, stats, faults --------------------------------------------- */

static void test_describe(void **st)
{
    (void)st;
    gemm_engine *e = open_cpu(2, 1, NULL);
    gemm_engine_info info;
    gemm_engine_describe(e, &info);
    assert_string_equal(info.backend, "cpu");
    assert_int_equal(info.workers, 1);
    assert_int_equal(info.queue_capacity, 64);
    assert_int_equal(info.ndevices, 1);
    assert_non_null(strstr(info.devices[0].name, "cpu"));
    assert_int_equal(info.nkernels, 2);
    assert_string_equal(info.kernels[0].name, "openblas");
    assert_int_equal(info.kernels[0].dtypes, (1u << GEMM_DTYPE_F32) | (1u << GEMM_DTYPE_F64) | (1u << GEMM_DTYPE_F16) |
                                                  (1u << GEMM_DTYPE_BF16));
    assert_true(info.kernels[0].maths & (1u << GEMM_MATH_FP32));
    assert_false(info.kernels[0].maths & (1u << GEMM_MATH_TF32));
    assert_string_equal(info.kernels[1].name, "blocked");
    assert_int_equal(info.kernels[1].dtypes, 1u << GEMM_DTYPE_I32);
    assert_int_equal(info.kernels[0].tiles[0], 0);
    assert_true(gemm_engine_allocator(e) == &gemm_allocator_host);
    gemm_engine_close(e);
}

static void test_fault_fail(void **st)
{
    (void)st;
    gemm_engine *e = open_cpu(0, 1, "cpu_fail:2");
    for (int i = 1; i <= 4; i++) {
        product p;
        product_init(e, &p, GEMM_DTYPE_F64, 4, 4, 4, 70 + i);
        int state = product_run(e, &p);
        if (i % 2 == 0) {
            assert_int_equal(state, GEMM_JOB_FAILED);
            assert_int_equal(p.job.err.code, GEMM_E_BACKEND);
        } else {
            assert_int_equal(state, GEMM_JOB_DONE);
            assert_int_equal(ref_check(GEMM_DTYPE_F64, p.job.a, p.job.b, p.job.c, 4, 4, 4, "f64"), 0);
        }
        product_free(e, &p);
    }
    gemm_engine_stats stats;
    gemm_engine_get_stats(e, &stats);
    assert_int_equal(stats.completed, 2);
    assert_int_equal(stats.failed, 2);
    assert_int_equal(stats.ndevices, 1);
    /* free memory: the host's available RAM, and no more than it has */
    gemm_engine_info info;
    gemm_engine_describe(e, &info);
    assert_true(stats.device_mem_free[0] > 0);
    assert_true(stats.device_mem_free[0] <= info.devices[0].total_mem);
    gemm_engine_close(e);
}

static void test_fault_spec_rejected(void **st)
{
    (void)st;
    static const char *bad[] = {"oom:3", "cpu_delay_ms", "cpu_delay_ms:x", "cpu_fail:0", "cpu_delay_ms:-1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gemm_engine_config cfg;
        gemm_engine_config_defaults(&cfg);
        snprintf(cfg.backend, sizeof cfg.backend, "cpu");
        snprintf(cfg.fault_inject, sizeof cfg.fault_inject, "%s", bad[i]);
        gemm_engine_err err;
        gemm_engine *e = gemm_engine_open(&cfg, &err);
        assert_null(e);
        assert_int_equal(err.code, GEMM_E_BAD_CONFIG);
        assert_non_null(strstr(err.message, "cpu_delay_ms:N"));
    }
    gemm_engine *e = open_cpu(0, 1, "cpu_delay_ms:1, cpu_fail:1000");
    gemm_engine_close(e);
}

/* Every fault hook a backend of this build takes is documented in config/gemmd.conf (its
 * fault_inject comment, "name:N") and accepted at its smallest value. */
static void test_fault_hooks_documented(void **st)
{
    (void)st;
    FILE *f = fopen("config/gemmd.conf", "r");
    if (!f) skip();
    static char text[64 << 10];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    const char *list = strstr(text, "# Test hooks (empty = off)");
    assert_non_null(list);
    for (const gemm_backend *const *b = gemm_backends; *b; b++) {
        for (const gemm_fault_hook *h = (*b)->faults; h && h->name; h++) {
            char doc[64], spec[64];
            snprintf(doc, sizeof doc, " %s:%s ", h->name, h->min == h->max ? "1" : "N");
            if (!strstr(list, doc)) fail_msg("gemmd.conf does not document %s's hook \"%s\"", (*b)->name, doc);
            if (*b != &gemm_backend_cpu) continue;
            snprintf(spec, sizeof spec, "%s:%ld", h->name, h->min);
            gemm_engine *e = open_cpu(1, 1, spec);
            gemm_engine_close(e);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shapes_f32), cmocka_unit_test(test_half_f16), cmocka_unit_test(test_half_bf16),
        cmocka_unit_test(test_shapes_f64),
        cmocka_unit_test(test_shapes_i32),
        cmocka_unit_test(test_shapes_i32_three_threads),
        cmocka_unit_test(test_shapes_f32_one_thread),
        cmocka_unit_test(test_i32_wraps),
        cmocka_unit_test(test_i32_full_range),
        cmocka_unit_test(test_i32_thread_split),
        cmocka_unit_test(test_i32_stop_flag),
        cmocka_unit_test(test_rejects),
        cmocka_unit_test(test_kernel_names_resolve),
        cmocka_unit_test(test_describe),
        cmocka_unit_test(test_fault_fail),
        cmocka_unit_test(test_fault_spec_rejected),
        cmocka_unit_test(test_fault_hooks_documented),
    };
    return cmocka_run_group_tests_name("cpu", tests, NULL, NULL);
}
