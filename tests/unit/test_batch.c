/*
 * test_batch.c - batched jobs on the engine (CPU backend): b products C[i] = A[i].B[i] in
 * one job, with B per product or one B shared by all (broadcast), for every dtype, odd
 * shapes, b = 1 and a large b; each product checked element by element against the
 * float64 / mod-2^32 reference of gemm_ref.h on poisoned outputs; the limits (too many
 * products, sizes that overflow) refused with 413 before any buffer is touched.
 *
 * Dynamic batching (batch_max > 1): queued small products of one key are coalesced into
 * one batched run and each still gets its own right answer (the bits it gets alone),
 * done() and report; products of other shapes, dtypes or kernels, large ones, and ones
 * with a resident operand, are not mixed in; many threads submitting mixed products at
 * once all get their own answers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
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
    gemm_engine_err err;
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

    gemm_engine_err err;
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
    gemm_engine_err err;
    assert_int_equal(gemm_engine_submit(e, &job, &err), -1);
    assert_int_equal(err.code, GEMM_E_TOO_LARGE);
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

/* ---- dynamic batching ------------------------------------------------------ */

typedef struct {
    bjob t;
    int *gate_open;
    pthread_mutex_t *gate_mu;
    pthread_cond_t *gate_cv;
} gjob;

static void gjob_done(gemm_job *job)
{
    gjob *g = job->user;
    /* Read the gate first: once bjob_done() has signalled, the waiter may free g. */
    int *gate = g->gate_open;
    pthread_mutex_t *gmu = g->gate_mu;
    pthread_cond_t *gcv = g->gate_cv;
    bjob_done(job); /* bjob is the first member: job->user works for both */
    if (gate) {
        pthread_mutex_lock(gmu);
        while (!*gate) pthread_cond_wait(gcv, gmu);
        pthread_mutex_unlock(gmu);
    }
}

static void gjob_init(gemm_engine *e, gjob *g, gemm_dtype d, size_t m, size_t k, size_t n, uint64_t seed)
{
    memset(g, 0, sizeof *g);
    pthread_mutex_init(&g->t.mu, NULL);
    pthread_cond_init(&g->t.cv, NULL);
    size_t es = gemm_dtype_size(d);
    gemm_job *j = &g->t.job;
    j->dtype = d;
    j->m = m, j->k = k, j->n = n;
    j->a = gemm_engine_host_alloc(e, m * k * es);
    j->b = gemm_engine_host_alloc(e, k * n * es);
    j->c = gemm_engine_host_alloc(e, m * n * es);
    assert_true(j->a && j->b && j->c);
    ref_fill(d, j->a, m * k, seed);
    ref_fill(d, j->b, k * n, seed + 3);
    ref_poison(d, j->c, m * n);
    j->done = gjob_done;
    j->user = g;
}

static void gjob_wait(gjob *g)
{
    pthread_mutex_lock(&g->t.mu);
    while (g->t.calls < 1) pthread_cond_wait(&g->t.cv, &g->t.mu);
    pthread_mutex_unlock(&g->t.mu);
}

/* With the plain host allocator (the CPU engine's), so it works after close too. */
static void gjob_free(gemm_engine *e, gjob *g)
{
    (void)e;
    gemm_free(&gemm_allocator_host, g->t.job.a);
    gemm_free(&gemm_allocator_host, g->t.job.b);
    gemm_free(&gemm_allocator_host, g->t.job.c);
    pthread_cond_destroy(&g->t.cv);
    pthread_mutex_destroy(&g->t.mu);
}

static size_t gjob_check(gjob *g)
{
    gemm_job *j = &g->t.job;
    return ref_check(j->dtype, j->a, j->b, j->c, j->m, j->k, j->n, "coalesced product");
}

/* Whether g's C is, to the bit, what the same product gives submitted alone (nothing else
 * queued): coalescing must not change how a product is computed. */
static int gjob_same_alone(gemm_engine *e, gjob *g)
{
    const gemm_job *j = &g->t.job;
    const size_t es = gemm_dtype_size(j->dtype);
    gjob one;
    gjob_init(e, &one, j->dtype, j->m, j->k, j->n, 0);
    memcpy(one.t.job.a, j->a, j->m * j->k * es);
    memcpy(one.t.job.b, j->b, j->k * j->n * es);
    gemm_engine_err err;
    assert_int_equal(gemm_engine_submit(e, &one.t.job, &err), 0);
    gjob_wait(&one);
    int same = atomic_load(&one.t.job.state) == GEMM_JOB_DONE && one.t.job.batched == 0 &&
               memcmp(one.t.job.c, j->c, j->m * j->n * es) == 0;
    gjob_free(e, &one);
    return same;
}

/* A gate: a tiny product whose done() holds the engine's only worker until the gate is
 * opened, so that what is submitted meanwhile queues up behind it. */
typedef struct {
    gjob job;
    int open;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} gate;

static void gate_hold(gemm_engine *e, gate *g)
{
    g->open = 0;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    gjob_init(e, &g->job, GEMM_DTYPE_F32, 2, 2, 2, 1);
    g->job.gate_open = &g->open, g->job.gate_mu = &g->mu, g->job.gate_cv = &g->cv;
    gemm_engine_err err;
    assert_int_equal(gemm_engine_submit(e, &g->job.t.job, &err), 0);
    while (atomic_load(&g->job.t.job.state) != GEMM_JOB_DONE) sched_yield();
}

static void gate_open(gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->open = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* After the engine is closed. */
static void gate_free(gemm_engine *e, gate *g)
{
    gjob_free(e, &g->job);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
}

static gemm_engine *open_grouping(int workers, int batch_max, uint64_t mnk)
{
    gemm_engine_config cfg;
    gemm_engine_config_defaults(&cfg);
    assert_int_equal(cfg.batch_max, 0);
    assert_int_equal(cfg.batch_max_mnk, 1ull << 24);
    snprintf(cfg.backend, sizeof cfg.backend, "cpu");
    cfg.cpu_workers = workers;
    cfg.queue_depth = 1024;
    cfg.batch_max = batch_max;
    cfg.batch_max_mnk = mnk;
    gemm_engine_err err;
    gemm_engine *e = gemm_engine_open(&cfg, &err);
    if (!e) fprintf(stderr, "# open: %s\n", err.message);
    assert_non_null(e);
    assert_int_equal(gemm_engine_small_mnk(e), mnk); /* what the daemon's direct run reads */
    return e;
}

/* A gate job holds the only worker; 6 products of one shape, 2 of another shape, 1 of
 * another dtype, 1 large and 1 already batched queue up; once the gate opens the 6 (and the
 * 2) run coalesced, the rest alone, every answer is right, and each C is to the bit what
 * the same product gives when it runs alone. */
static void test_coalesce_groups(void **st)
{
    (void)st;
    gemm_engine *e = open_grouping(1, 4, 20 * 20 * 20);
    gate gt;
    gate_hold(e, &gt);
    gemm_engine_err err;

    enum { N = 11 };
    gjob j[N];
    gjob_init(e, &j[0], GEMM_DTYPE_F32, 7, 5, 3, 10);
    gjob_init(e, &j[1], GEMM_DTYPE_F32, 9, 4, 11, 20); /* other shape */
    for (int i = 2; i < 7; i++) gjob_init(e, &j[i], GEMM_DTYPE_F32, 7, 5, 3, 10 * (uint64_t)i);
    gjob_init(e, &j[7], GEMM_DTYPE_F64, 7, 5, 3, 80);  /* other dtype */
    gjob_init(e, &j[8], GEMM_DTYPE_F32, 9, 4, 11, 90); /* other shape, second of its group */
    gjob_init(e, &j[9], GEMM_DTYPE_F32, 30, 30, 30, 100); /* large: never coalesced */
    gjob_init(e, &j[10], GEMM_DTYPE_F32, 30, 30, 30, 110);
    for (int i = 0; i < N; i++) assert_int_equal(gemm_engine_submit(e, &j[i].t.job, &err), 0);

    gate_open(&gt);
    for (int i = 0; i < N; i++) gjob_wait(&j[i]);

    /* 7x5x3 float32: 6 products, batch_max 4 -> a group of 4 then one of 2 */
    int in4 = 0, in2 = 0;
    for (int i = 0; i < N; i++) {
        gemm_job *x = &j[i].t.job;
        assert_int_equal(j[i].t.calls, 1);
        assert_int_equal(atomic_load(&x->state), GEMM_JOB_DONE);
        assert_int_equal(gjob_check(&j[i]), 0);
        int same = x->dtype == GEMM_DTYPE_F32 && x->m == 7;
        if (same) {
            in4 += x->batched == 4;
            in2 += x->batched == 2;
            assert_string_equal(x->batch_mode, "coalesced loop");
        } else if (i == 1 || i == 8) {
            assert_int_equal(x->batched, 2);
        } else {
            assert_int_equal(x->batched, 0); /* alone: another dtype, or too large */
            assert_string_equal(x->batch_mode, "");
        }
        assert_true(x->timing.queue_ms >= 0);
        assert_string_equal(x->kernel_used, x->dtype == GEMM_DTYPE_I32 ? "blocked" : "openblas");
    }
    assert_int_equal(in4, 4);
    assert_int_equal(in2, 2);
    gemm_engine_stats stt;
    gemm_engine_get_stats(e, &stt);
    assert_int_equal(stt.coalesced_launches, 3); /* 4 + 2 of one shape, 2 of another */
    assert_int_equal(stt.coalesced_products, 8);
    for (int i = 0; i < N; i++) assert_true(gjob_same_alone(e, &j[i]));
    gemm_engine_close(e);
    for (int i = 0; i < N; i++) gjob_free(e, &j[i]);
    gate_free(e, &gt);
}

/* A backend with run_parts: the CPU backend's, handed a coalesced group as lists of the
 * products' own blocks. It runs each product from its own blocks (so a list that named the
 * wrong block, or one out of order, gives a wrong answer) and counts the groups it saw and
 * whether the engine left the stacks out (a, b and c NULL). */
static atomic_int parts_groups, parts_products, parts_with_stacks;

static int parts_run(void *self, void *worker, gemm_job *job)
{
    if (!job->a_parts) return gemm_backend_cpu.run(self, worker, job);
    atomic_fetch_add(&parts_groups, 1);
    if (job->a || job->b || job->c || !job->b_parts || !job->c_parts) atomic_fetch_add(&parts_with_stacks, 1);
    uint64_t nb = gemm_job_batch(job);
    for (uint64_t i = 0; i < nb; i++) {
        gemm_job one;
        memset(&one, 0, sizeof one);
        one.dtype = job->dtype;
        one.m = job->m, one.k = job->k, one.n = job->n;
        one.a = job->a_parts[i], one.b = job->b_parts[i], one.c = job->c_parts[i];
        memcpy(one.kernel_used, job->kernel_used, sizeof one.kernel_used);
        one.math_used = job->math_used;
        atomic_init(&one.cancel_requested, 0);
        int rc = gemm_backend_cpu.run(self, worker, &one);
        if (rc != 0) {
            job->err = one.err;
            return rc;
        }
        memcpy(job->kernel_used, one.kernel_used, sizeof job->kernel_used);
        memcpy(job->device, one.device, sizeof job->device);
        job->stream = one.stream;
        atomic_fetch_add(&parts_products, 1);
    }
    job->batched = nb;
    snprintf(job->batch_mode, sizeof job->batch_mode, "loop");
    return 0;
}

/* The engine hands a run_parts backend each group as its products' own blocks (no stacks,
 * no gather, no scatter): 6 float32 products of one shape (batch_max 4: groups of 4 and
 * 2), 3 float64 of another and 2 int32 of a third queue behind a gate; every answer is
 * right, each in its own C, and each group reached the backend as lists. */
static void test_coalesce_parts(void **st)
{
    (void)st;
    gemm_backend be = gemm_backend_cpu;
    be.run = parts_run;
    be.run_parts = 1;
    gemm_engine_config cfg;
    gemm_engine_config_defaults(&cfg);
    snprintf(cfg.backend, sizeof cfg.backend, "cpu");
    cfg.cpu_workers = 1;
    cfg.queue_depth = 64;
    cfg.batch_max = 4;
    gemm_engine_err err;
    gemm_engine *e = gemm_engine_open_backend(&be, &cfg, &err);
    assert_non_null(e);
    atomic_store(&parts_groups, 0);
    atomic_store(&parts_products, 0);
    atomic_store(&parts_with_stacks, 0);

    gate gt;
    gate_hold(e, &gt);

    enum { N = 11 };
    gjob j[N];
    for (int i = 0; i < 6; i++) gjob_init(e, &j[i], GEMM_DTYPE_F32, 7, 5, 3, 10 + 7 * (uint64_t)i);
    for (int i = 6; i < 9; i++) gjob_init(e, &j[i], GEMM_DTYPE_F64, 9, 4, 11, 100 + 7 * (uint64_t)i);
    for (int i = 9; i < N; i++) gjob_init(e, &j[i], GEMM_DTYPE_I32, 5, 13, 6, 200 + 7 * (uint64_t)i);
    for (int i = 0; i < N; i++) assert_int_equal(gemm_engine_submit(e, &j[i].t.job, &err), 0);
    gate_open(&gt);
    for (int i = 0; i < N; i++) gjob_wait(&j[i]);

    int in4 = 0, in2 = 0, in3 = 0;
    for (int i = 0; i < N; i++) {
        gemm_job *x = &j[i].t.job;
        assert_int_equal(j[i].t.calls, 1);
        assert_int_equal(atomic_load(&x->state), GEMM_JOB_DONE);
        assert_int_equal(gjob_check(&j[i]), 0);
        assert_string_equal(x->batch_mode, "coalesced loop");
        in4 += x->batched == 4, in2 += x->batched == 2, in3 += x->batched == 3;
    }
    assert_int_equal(in4, 4);     /* float32: 4 + 2 */
    assert_int_equal(in2, 2 + 2); /* and the two int32 */
    assert_int_equal(in3, 3);     /* float64 */
    assert_int_equal(atomic_load(&parts_groups), 4);
    assert_int_equal(atomic_load(&parts_products), N);
    assert_int_equal(atomic_load(&parts_with_stacks), 0);
    gemm_engine_close(e);
    for (int i = 0; i < N; i++) gjob_free(e, &j[i]);
    gate_free(e, &gt);
}

/* Products with a resident operand are never coalesced: a group's stacks have no place for
 * a resident A or B (read from its device copy) nor for a C to keep on the device, and a
 * group once ran them as plain operands, uploading A again and keeping no copy of C. Five
 * products of one shape queue behind a gate, A resident in two, C kept in one; the run()
 * of a run_parts backend sees each of those alone with its handles, the two plain ones as
 * one group, and every answer is right. */
static atomic_int res_runs_alone, res_runs_grouped;

static int res_run(void *self, void *worker, gemm_job *job)
{
    if (job->a_res || job->c_res) {
        if (job->batch > 1 || job->a_parts || (job->a_res && job->a_res->host != job->a) ||
            (job->c_res && job->c_res->host != job->c))
            return gemm_engine_err_set(&job->err, GEMM_E_INTERNAL, "a resident operand lost its handle");
        atomic_fetch_add(&res_runs_alone, 1);
    } else if (job->a_parts) {
        atomic_fetch_add(&res_runs_grouped, 1);
    }
    return parts_run(self, worker, job);
}

static void test_coalesce_not_resident(void **st)
{
    (void)st;
    gemm_backend be = gemm_backend_cpu;
    be.run = res_run;
    be.run_parts = 1;
    gemm_engine_config cfg;
    gemm_engine_config_defaults(&cfg);
    cfg.cpu_workers = 1;
    cfg.batch_max = 8;
    gemm_engine_err err;
    gemm_engine *e = gemm_engine_open_backend(&be, &cfg, &err);
    assert_non_null(e);
    atomic_store(&res_runs_alone, 0);
    atomic_store(&res_runs_grouped, 0);
    gate gt;
    gate_hold(e, &gt);
    enum { N = 5 };
    gjob j[N];
    gemm_resident *res[N] = {0};
    for (int i = 0; i < N; i++) gjob_init(e, &j[i], GEMM_DTYPE_F32, 6, 5, 4, 300 + 7 * (uint64_t)i);
    for (int i = 0; i < 2; i++) j[i].t.job.a_res = res[i] = gemm_engine_resident_new(e, j[i].t.job.a, 6 * 5 * 4);
    j[2].t.job.c_res = res[2] = gemm_engine_resident_new(e, j[2].t.job.c, 6 * 4 * 4);
    for (int i = 0; i < N; i++) assert_int_equal(gemm_engine_submit(e, &j[i].t.job, &err), 0);
    gate_open(&gt);
    for (int i = 0; i < N; i++) gjob_wait(&j[i]);
    for (int i = 0; i < N; i++) {
        assert_int_equal(atomic_load(&j[i].t.job.state), GEMM_JOB_DONE);
        assert_int_equal(gjob_check(&j[i]), 0);
        assert_int_equal(j[i].t.job.batched, i < 3 ? 0 : 2);
    }
    assert_int_equal(atomic_load(&res_runs_alone), 3);
    assert_int_equal(atomic_load(&res_runs_grouped), 1);
    gemm_engine_stats stt;
    gemm_engine_get_stats(e, &stt);
    assert_int_equal(stt.coalesced_products, 2);
    gemm_engine_close(e);
    for (int i = 0; i < N; i++) {
        gemm_engine_resident_free(NULL, res[i]);
        gjob_free(e, &j[i]);
    }
    gate_free(e, &gt);
}

/* batch_max 1 turns coalescing off: queued products of one shape run one by one. */
static void test_coalesce_off(void **st)
{
    (void)st;
    gemm_engine *e = open_grouping(1, 1, 1ull << 24);
    gate gt;
    gate_hold(e, &gt);
    gjob j[4];
    gemm_engine_err err;
    for (int i = 0; i < 4; i++) {
        gjob_init(e, &j[i], GEMM_DTYPE_I32, 5, 6, 7, 5 + (uint64_t)i);
        assert_int_equal(gemm_engine_submit(e, &j[i].t.job, &err), 0);
    }
    gate_open(&gt);
    for (int i = 0; i < 4; i++) {
        gjob_wait(&j[i]);
        assert_int_equal(gjob_check(&j[i]), 0);
        assert_int_equal(j[i].t.job.batched, 0);
    }
    gemm_engine_close(e);
    for (int i = 0; i < 4; i++) gjob_free(e, &j[i]);
    gate_free(e, &gt);
}

/* A product cancelled while queued leaves its group; the others still run coalesced. */
static void test_coalesce_cancel(void **st)
{
    (void)st;
    gemm_engine *e = open_grouping(1, 8, 1ull << 24);
    gate gt;
    gate_hold(e, &gt);
    gjob j[3];
    gemm_engine_err err;
    for (int i = 0; i < 3; i++) {
        gjob_init(e, &j[i], GEMM_DTYPE_F64, 6, 6, 6, 40 + (uint64_t)i);
        assert_int_equal(gemm_engine_submit(e, &j[i].t.job, &err), 0);
    }
    assert_int_equal(gemm_engine_cancel(e, &j[1].t.job), 1);
    gate_open(&gt);
    for (int i = 0; i < 3; i++) gjob_wait(&j[i]);
    assert_int_equal(atomic_load(&j[1].t.job.state), GEMM_JOB_CANCELLED);
    for (int i = 0; i < 3; i += 2) {
        assert_int_equal(atomic_load(&j[i].t.job.state), GEMM_JOB_DONE);
        assert_int_equal(gjob_check(&j[i]), 0);
        assert_int_equal(j[i].t.job.batched, 2);
    }
    gemm_engine_close(e);
    for (int i = 0; i < 3; i++) gjob_free(e, &j[i]);
    gate_free(e, &gt);
}

/* 16 threads submit 40 products each of mixed dtypes and shapes (a few shapes, so groups
 * form) to 2 workers that wait 200 us for more of a group: every product right. */
typedef struct {
    gemm_engine *e;
    int id;
    size_t bad, coalesced;
} stress_arg;

static void *stress_main(void *p)
{
    stress_arg *s = p;
    enum { PER = 40, INFLIGHT = 8 };
    static const size_t shapes[][3] = {{8, 8, 8}, {3, 17, 5}, {16, 1, 16}, {40, 40, 40}};
    gjob *j = calloc(INFLIGHT, sizeof *j);
    for (int round = 0; round < PER / INFLIGHT; round++) {
        for (int i = 0; i < INFLIGHT; i++) {
            int x = s->id * 7 + round * 3 + i;
            const size_t *sh = shapes[x % 4];
            gemm_dtype d = (gemm_dtype)(x % 3);
            gjob_init(s->e, &j[i], d, sh[0], sh[1], sh[2], (uint64_t)(s->id * 1000 + round * 10 + i));
            gemm_engine_err err;
            while (gemm_engine_submit(s->e, &j[i].t.job, &err) != 0) sched_yield(); /* queue full */
        }
        for (int i = 0; i < INFLIGHT; i++) {
            gjob_wait(&j[i]);
            if (atomic_load(&j[i].t.job.state) != GEMM_JOB_DONE || j[i].t.calls != 1) s->bad++;
            else s->bad += gjob_check(&j[i]);
            s->coalesced += j[i].t.job.batched > 1;
            gjob_free(s->e, &j[i]);
        }
    }
    free(j);
    return NULL;
}

static void test_coalesce_many_threads(void **st)
{
    (void)st;
    gemm_engine *e = open_grouping(2, 16, 32 * 32 * 32);
    enum { T = 16 };
    pthread_t th[T];
    stress_arg a[T];
    for (int i = 0; i < T; i++) {
        a[i] = (stress_arg){e, i, 0, 0};
        assert_int_equal(pthread_create(&th[i], NULL, stress_main, &a[i]), 0);
    }
    size_t bad = 0, coalesced = 0;
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        bad += a[i].bad;
        coalesced += a[i].coalesced;
    }
    fprintf(stderr, "# %zu of %d products ran coalesced\n", coalesced, T * 40);
    assert_int_equal(bad, 0);
    gemm_engine_stats stt;
    do { /* a job counts as running until its done() has returned */
        sched_yield();
        gemm_engine_get_stats(e, &stt);
    } while (stt.running > 0);
    assert_int_equal(stt.completed, T * 40);
    assert_int_equal(stt.queued, 0);
    gemm_engine_close(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_f32),
        cmocka_unit_test(test_batch_f64),
        cmocka_unit_test(test_batch_i32),
        cmocka_unit_test(test_batch_limits),
        cmocka_unit_test(test_coalesce_groups),
        cmocka_unit_test(test_coalesce_off),
        cmocka_unit_test(test_coalesce_parts),
        cmocka_unit_test(test_coalesce_not_resident),
        cmocka_unit_test(test_coalesce_cancel),
        cmocka_unit_test(test_coalesce_many_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
