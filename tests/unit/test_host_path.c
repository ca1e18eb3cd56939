/*
 * test_host_path.c - host_max_mnk: on a backend with a device, a product too small to pay
 * for it (float32 fp32, float64 or int32, kernel auto, batch*m*n*k up to the bound)
 * submitted with gemm_engine_submit_here is computed on the submitting thread by the host,
 * whatever is queued; anything else goes to the backend as before.
 *
 * The backend stands in for a GPU: the CPU backend's code under another name, so the
 * engine treats it as a device backend, with run() marking its answers (device "fake:0")
 * and counting its runs, and a gate that can hold run() (to fill the queue). Every answer
 * is checked against the float64 reference (int32: the wrapped sums, exactly).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "gemm_ref.h"
#include "test_gate.h"
#include "test_job.h"

#define BOUND (64ull * 64 * 64)

static atomic_int fake_runs;

/* run() holds jobs whose m is HOLD_M while the gate is closed. */
enum { HOLD_M = 3 };
static test_gate run_gate = TEST_GATE_OPEN;

static int fake_run(void *self, void *worker, gemm_job *job)
{
    atomic_fetch_add(&fake_runs, 1);
    if (job->m == HOLD_M) test_gate_pass(&run_gate);
    int rc = gemm_backend_cpu.run(self, worker, job);
    snprintf(job->device, sizeof job->device, "fake:0");
    job->stream = 0;
    return rc;
}

static gemm_backend fake;

static gemm_engine *open_fake(uint64_t host_mnk, int queue_depth, const char *faults)
{
    fake = gemm_backend_cpu;
    fake.name = "fake";
    fake.run = fake_run;
    fake.offload = 1; /* stands in for a device: the host path opens beside it */
    atomic_store(&fake_runs, 0);
    gemm_engine_config cfg;
    gemm_engine_config_defaults(&cfg);
    cfg.cpu_workers = 1;
    cfg.threads = 1;
    cfg.queue_depth = queue_depth;
    cfg.host_max_mnk = host_mnk;
    snprintf(cfg.fault_inject, sizeof cfg.fault_inject, "%s", faults ? faults : "");
    gemm_engine_err err;
    gemm_engine *e = gemm_engine_open_backend(&fake, &cfg, &err);
    if (!e) fprintf(stderr, "# open: %s\n", err.message);
    assert_non_null(e);
    return e;
}

/* Ran on the host, on this thread, before submit_here returned, and right. */
static void assert_on_host(test_job *t, int rc, const char *what)
{
    if (rc != 1 || t->calls != 1 || strcmp(t->job.device, "cpu") != 0)
        fprintf(stderr, "# %s: rc %d calls %d device \"%s\" kernel \"%s\" err %s\n", what, rc, t->calls,
                t->job.device, t->job.kernel_used, t->job.err.message);
    assert_int_equal(rc, 1);
    assert_int_equal(t->calls, 1);
    assert_true(pthread_equal(t->done_thread, pthread_self()));
    assert_int_equal(t->state_at_done, GEMM_JOB_DONE);
    assert_string_equal(t->job.device, "cpu");
    assert_string_equal(t->job.kernel_used, t->job.dtype == GEMM_DTYPE_I32 ? "blocked" : "openblas");
    assert_int_equal(t->job.stream, -1);
    assert_true(t->job.timing.queue_ms == 0);
    assert_true(t->job.timing.h2d_ms == 0 && t->job.timing.d2h_ms == 0);
    assert_true(t->job.timing.compute_ms >= t->job.timing.kernel_ms && t->job.timing.kernel_ms >= 0);
    assert_int_equal(t->job.math_used, t->job.dtype == GEMM_DTYPE_F32 ? GEMM_MATH_FP32 : GEMM_MATH_DEFAULT);
    assert_int_equal(test_job_check(t, what), 0);
}

/* Every dtype the host computes, odd shapes up to the bound itself: on the host, right,
 * counted once as run here and on the host; the backend never ran. */
static void test_small_products_on_host(void **st)
{
    (void)st;
    gemm_engine *e = open_fake(BOUND, 64, NULL);
    static const gemm_dtype dtypes[] = {GEMM_DTYPE_F32, GEMM_DTYPE_F64, GEMM_DTYPE_I32};
    static const size_t shapes[][3] = {{1, 1, 1}, {37, 61, 53}, {64, 64, 64}, {1, 4096, 64}, {129, 5, 7}};
    uint64_t n = 0;
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++, n++) {
            test_job t;
            test_job_init(&t, dtypes[d], shapes[s][0], shapes[s][1], shapes[s][2], 100 + n);
            if (s == 1) snprintf(t.job.kernel, sizeof t.job.kernel, "auto");
            if (s == 2 && dtypes[d] == GEMM_DTYPE_F32) t.job.math = GEMM_MATH_FP32;
            assert_true(gemm_engine_runs_on_host(e, &t.job));
            gemm_engine_err err;
            assert_on_host(&t, gemm_engine_submit_here(e, &t.job, &err), "host");
            test_job_free(&t);
        }
    }
    gemm_engine_stats s;
    gemm_engine_get_stats(e, &s);
    assert_int_equal(s.ran_host, n);
    assert_int_equal(s.ran_here, n);
    assert_int_equal(s.completed, n);
    assert_int_equal(s.running, 0);
    assert_int_equal(s.queued, 0);
    assert_int_equal(atomic_load(&fake_runs), 0);
    gemm_engine_close(e);
}

/* A batch (its own B per product, or one B shared by all) within the bound: every product
 * on the host, each right, said to have run as a loop. */
static void test_batch_on_host(void **st)
{
    (void)st;
    gemm_engine *e = open_fake(BOUND, 64, NULL);
    const size_t b = 5, m = 7, k = 9, n = 11;
    for (int shared = 0; shared <= 1; shared++) {
        gemm_dtype d = shared ? GEMM_DTYPE_I32 : GEMM_DTYPE_F32;
        size_t es = gemm_dtype_size(d);
        test_job t;
        test_job_init(&t, d, m, k, n, 7 + (uint64_t)shared);
        gemm_free(&gemm_allocator_host, t.job.a);
        gemm_free(&gemm_allocator_host, t.job.b);
        gemm_free(&gemm_allocator_host, t.job.c);
        size_t nbb = shared ? 1 : b;
        t.job.a = gemm_alloc(&gemm_allocator_host, b * m * k * es);
        t.job.b = gemm_alloc(&gemm_allocator_host, nbb * k * n * es);
        t.job.c = gemm_alloc(&gemm_allocator_host, b * m * n * es);
        assert_true(t.job.a && t.job.b && t.job.c);
        ref_fill(d, t.job.a, b * m * k, 21);
        ref_fill(d, t.job.b, nbb * k * n, 22);
        ref_poison(d, t.job.c, b * m * n);
        t.job.batch = b;
        t.job.b_shared = shared;
        gemm_engine_err err;
        assert_int_equal(gemm_engine_submit_here(e, &t.job, &err), 1);
        assert_string_equal(t.job.device, "cpu");
        assert_int_equal(t.job.batched, b);
        assert_string_equal(t.job.batch_mode, "loop");
        for (size_t i = 0; i < b; i++) {
            const unsigned char *a = (const unsigned char *)t.job.a + i * m * k * es;
            const unsigned char *bb = (const unsigned char *)t.job.b + (shared ? 0 : i * k * n * es);
            const unsigned char *c = (const unsigned char *)t.job.c + i * m * n * es;
            assert_int_equal(ref_check(d, a, bb, c, m, k, n, "batch on host"), 0);
        }
        test_job_free(&t);
    }
    /* a batch whose products together pass the bound goes to the backend */
    test_job t;
    test_job_init(&t, GEMM_DTYPE_F32, 32, 32, 32, 9);
    t.job.batch = 9; /* 9 * 32^3 > 64^3 */
    assert_false(gemm_engine_runs_on_host(e, &t.job));
    test_job_free(&t);
    gemm_engine_close(e);
}

/* What the host must not take: a product over the bound, a kernel named, tensor-core math, a
 * tile, a panel, a resident operand, half operands, or plain submit (not here). Each runs
 * on the backend, or is refused by it, as without the host path. */
static void test_others_go_to_the_backend(void **st)
{
    (void)st;
    gemm_engine *e = open_fake(BOUND, 64, NULL);
    void *res_host = gemm_alloc(&gemm_allocator_host, 64 * 64 * 4);
    assert_non_null(res_host);
    gemm_resident *res = gemm_engine_resident_new(e, res_host, 64 * 64 * 4);
    assert_non_null(res);
    enum { OVER, NAMED, TF32, TILE, PANEL, RESIDENT, HALF, QUEUED, NCASES };
    int expect_runs = 0;
    for (int c = 0; c < NCASES; c++) {
        test_job t;
        test_job_init(&t, c == HALF ? GEMM_DTYPE_F16 : GEMM_DTYPE_F32, c == OVER ? 65 : 64, 64, 64, 300 + (uint64_t)c);
        int refused = 0; /* the CPU code under the fake backend refuses tf32 and tiles (422) */
        switch (c) {
        case NAMED: snprintf(t.job.kernel, sizeof t.job.kernel, "openblas"); break;
        case TF32: t.job.math = GEMM_MATH_TF32, refused = 1; break;
        case TILE: t.job.tile = 16, refused = 1; break;
        case PANEL: t.job.plan_m = 128; break;
        case RESIDENT: t.job.b_res = res; memcpy(res_host, t.job.b, 64 * 64 * 4); break;
        default: break;
        }
        /* plain submit never runs here, though submit_here would take it to the host */
        assert_int_equal(gemm_engine_runs_on_host(e, &t.job), c == QUEUED);
        gemm_engine_err err;
        int rc = c == QUEUED ? gemm_engine_submit(e, &t.job, &err) : gemm_engine_submit_here(e, &t.job, &err);
        if (refused) {
            assert_int_equal(rc, -1);
            assert_true(err.code == GEMM_E_UNKNOWN_KERNEL || err.code == GEMM_E_UNSUPPORTED_MATH ||
                        err.code == GEMM_E_BAD_TILE || err.code == GEMM_E_UNSUPPORTED_DTYPE);
            assert_int_equal(t.calls, 0);
        } else {
            assert_true(rc == 0 || rc == 1);
            test_job_wait(&t);
            expect_runs++;
            assert_int_equal(t.state_at_done, GEMM_JOB_DONE);
            assert_string_equal(t.job.device, "fake:0");
            assert_int_equal(test_job_check(&t, "backend"), 0);
        }
        test_job_free(&t);
    }
    gemm_engine_stats s;
    do {
        sched_yield();
        gemm_engine_get_stats(e, &s);
    } while (s.running > 0);
    assert_int_equal(s.ran_host, 0);
    assert_int_equal(atomic_load(&fake_runs), expect_runs);
    gemm_engine_resident_free(e, res);
    gemm_free(&gemm_allocator_host, res_host);
    gemm_engine_close(e);
}

/* host_max_mnk 0, a fault hook set, or the CPU backend itself: no host path. */
static void test_host_path_off(void **st)
{
    (void)st;
    for (int c = 0; c < 3; c++) {
        gemm_engine *e;
        if (c == 2) {
            gemm_engine_config cfg;
            gemm_engine_config_defaults(&cfg);
            snprintf(cfg.backend, sizeof cfg.backend, "cpu");
            cfg.threads = 1;
            cfg.host_max_mnk = BOUND;
            gemm_engine_err err;
            e = gemm_engine_open(&cfg, &err);
            assert_non_null(e);
        } else {
            e = open_fake(c == 0 ? 0 : BOUND, 64, c == 1 ? "cpu_delay_ms:0" : NULL);
        }
        test_job t;
        test_job_init(&t, GEMM_DTYPE_F32, 8, 8, 8, 50 + (uint64_t)c);
        assert_false(gemm_engine_runs_on_host(e, &t.job));
        gemm_engine_err err;
        int rc = gemm_engine_submit_here(e, &t.job, &err);
        assert_true(rc == 0 || rc == 1);
        test_job_wait(&t);
        assert_int_equal(test_job_check(&t, "host path off"), 0);
        gemm_engine_stats s;
        gemm_engine_get_stats(e, &s);
        assert_int_equal(s.ran_host, 0);
        if (c < 2) assert_string_equal(t.job.device, "fake:0");
        test_job_free(&t);
        gemm_engine_close(e);
    }
}

/* With the backend's only worker held and the queue full, a plain submit is refused (503
 * queue_full) but a small product still runs on the host: it needs no queue place. */
static void test_runs_while_queue_full(void **st)
{
    (void)st;
    gemm_engine *e = open_fake(BOUND, 2, NULL);
    test_gate_close(&run_gate);
    test_job h, q[2], x, y;
    test_job_init(&h, GEMM_DTYPE_F32, HOLD_M, 4, 5, 1);
    gemm_engine_err err;
    assert_int_equal(gemm_engine_submit(e, &h.job, &err), 0);
    test_gate_wait_held(&run_gate, 1);
    for (int i = 0; i < 2; i++) {
        test_job_init(&q[i], GEMM_DTYPE_F64, 70, 70, 70, 2 + (uint64_t)i); /* over the bound: queued */
        assert_int_equal(gemm_engine_submit_here(e, &q[i].job, &err), 0);
    }
    test_job_init(&x, GEMM_DTYPE_F32, 16, 16, 16, 5);
    assert_int_equal(gemm_engine_submit(e, &x.job, &err), -1);
    assert_int_equal(err.code, GEMM_E_QUEUE_FULL);
    test_job_init(&y, GEMM_DTYPE_I32, 16, 16, 16, 6);
    assert_on_host(&y, gemm_engine_submit_here(e, &y.job, &err), "host while the queue is full");
    test_gate_open(&run_gate);
    test_job_wait(&h);
    for (int i = 0; i < 2; i++) {
        test_job_wait(&q[i]);
        assert_string_equal(q[i].job.device, "fake:0");
        assert_int_equal(test_job_check(&q[i], "queued"), 0);
        test_job_free(&q[i]);
    }
    assert_int_equal(test_job_check(&h, "held"), 0);
    test_job_free(&h);
    test_job_free(&x);
    test_job_free(&y);
    gemm_engine_close(e);
}

/* Many threads at once, small and larger products mixed: every answer right and its own,
 * the small ones on the host, the counters add up. */
enum { NTHREADS = 8, PER_THREAD = 60 };
static gemm_engine *mt_engine;
static atomic_int mt_bad, mt_host;

static void *mt_main(void *arg)
{
    int id = (int)(intptr_t)arg;
    for (int i = 0; i < PER_THREAD; i++) {
        int big = (i % 5) == 4;
        gemm_dtype d = (gemm_dtype[]){GEMM_DTYPE_F32, GEMM_DTYPE_F64, GEMM_DTYPE_I32}[(id + i) % 3];
        size_t m = big ? 80 : 1 + (size_t)((id * 7 + i * 3) % 40), k = big ? 70 : 5 + (size_t)(i % 23),
               n = big ? 60 : 3 + (size_t)(id % 11);
        test_job t;
        test_job_init(&t, d, m, k, n, (uint64_t)(id * 1000 + i));
        gemm_engine_err err;
        int rc = gemm_engine_submit_here(mt_engine, &t.job, &err);
        if (rc < 0) {
            atomic_fetch_add(&mt_bad, 1);
        } else {
            test_job_wait(&t);
            int host = strcmp(t.job.device, "cpu") == 0;
            if (host != !big || t.calls != 1 || t.state_at_done != GEMM_JOB_DONE ||
                test_job_check(&t, "threads") != 0)
                atomic_fetch_add(&mt_bad, 1);
            atomic_fetch_add(&mt_host, host);
        }
        test_job_free(&t);
    }
    return NULL;
}

static void test_many_threads(void **st)
{
    (void)st;
    mt_engine = open_fake(BOUND, 256, NULL);
    atomic_store(&mt_bad, 0);
    atomic_store(&mt_host, 0);
    pthread_t th[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) assert_int_equal(pthread_create(&th[i], NULL, mt_main, (void *)(intptr_t)i), 0);
    for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
    assert_int_equal(atomic_load(&mt_bad), 0);
    gemm_engine_stats s;
    do {
        sched_yield();
        gemm_engine_get_stats(mt_engine, &s);
    } while (s.running > 0);
    const int total = NTHREADS * PER_THREAD, big = NTHREADS * (PER_THREAD / 5);
    assert_int_equal(atomic_load(&mt_host), total - big);
    assert_int_equal(s.ran_host, total - big);
    assert_int_equal(s.completed, total);
    assert_int_equal(atomic_load(&fake_runs), big);
    gemm_engine_close(mt_engine);
}

/* close() waits for a host run under way (here held in its done()), and refuses a new one
 * meanwhile with 503 shutting_down. */
static gemm_engine *cl_engine;
static atomic_int cl_closed;

static void *closer(void *arg)
{
    (void)arg;
    gemm_engine_close(cl_engine);
    atomic_store(&cl_closed, 1);
    return NULL;
}

static void *host_submitter(void *arg)
{
    test_job *t = arg;
    gemm_engine_err err;
    int rc = gemm_engine_submit_here(cl_engine, &t->job, &err);
    return (void *)(intptr_t)rc;
}

static void test_close_waits_for_host_runs(void **st)
{
    (void)st;
    cl_engine = open_fake(BOUND, 64, NULL);
    atomic_store(&cl_closed, 0);
    static int open = 0; /* read by done() on the submitting thread */
    open = 0;
    pthread_mutex_t gmu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t gcv = PTHREAD_COND_INITIALIZER;
    test_job t;
    test_job_init(&t, GEMM_DTYPE_F32, 20, 20, 20, 77);
    t.gate_open = &open, t.gate_mu = &gmu, t.gate_cv = &gcv; /* done() blocks until open */
    pthread_t sub, cl;
    assert_int_equal(pthread_create(&sub, NULL, host_submitter, &t), 0);
    test_job_wait(&t); /* done() entered: the host run is under way */
    assert_int_equal(pthread_create(&cl, NULL, closer, NULL), 0);
    while (gemm_engine_ready(cl_engine)) sched_yield(); /* close has begun */
    struct timespec ts = {0, 50 * 1000000L};
    nanosleep(&ts, NULL);
    assert_int_equal(atomic_load(&cl_closed), 0); /* and waits for the run under way */
    test_job u;
    test_job_init(&u, GEMM_DTYPE_F32, 8, 8, 8, 78);
    gemm_engine_err err;
    assert_int_equal(gemm_engine_submit_here(cl_engine, &u.job, &err), -1);
    assert_int_equal(err.code, GEMM_E_SHUTTING_DOWN);
    assert_int_equal(u.calls, 0);
    pthread_mutex_lock(&gmu);
    open = 1;
    pthread_cond_broadcast(&gcv);
    pthread_mutex_unlock(&gmu);
    void *rc;
    pthread_join(sub, &rc);
    assert_int_equal((int)(intptr_t)rc, 1);
    pthread_join(cl, NULL);
    assert_int_equal(atomic_load(&cl_closed), 1);
    assert_int_equal(test_job_check(&t, "host run at close"), 0);
    test_job_free(&t);
    test_job_free(&u);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_products_on_host),
        cmocka_unit_test(test_batch_on_host),
        cmocka_unit_test(test_others_go_to_the_backend),
        cmocka_unit_test(test_host_path_off),
        cmocka_unit_test(test_runs_while_queue_full),
        cmocka_unit_test(test_many_threads),
        cmocka_unit_test(test_close_waits_for_host_runs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
