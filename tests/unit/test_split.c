/*
 * test_split.c - split products on the CPU backend (docs/API.md, "Split products"): a single
 * product cut into row panels of A that several workers run, answered as one product.
 *
 * Checked here: 2 and 3 panels, m not divisible by the panel count (rows m/P, the first
 * m%P panels one more), results against an independent float64 / mod-2^32 reference and,
 * for int32, byte for byte against the same product run whole; what is not split (small,
 * batched, a resident A or C, one worker, split_ways 1, split_min_mnk 0); a failing panel
 * (the product fails with its error); cancellation before and after the product was cut;
 * a full queue (panels need no place in it and run ahead of it); close with a split
 * running; done() exactly once everywhere; the counters (the product counted once, and
 * separately as split); many split products from several threads.
 *
 * Queue states are made deterministic without timing: a "gate" job's done() callback
 * blocks its worker until the test opens the gate.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "gemm_half.h"
#include "gemm_ref.h"
#include "test_job.h"

/* ---- helpers ------------------------------------------------------------- */

typedef test_job sjob;

static void sjob_init(sjob *t, gemm_dtype d, size_t m, size_t k, size_t n, uint64_t seed)
{
    test_job_init(t, d, m, k, n, seed);
}

static size_t sjob_check(sjob *t) { return test_job_check(t, "split product"); }

static void nap(void)
{
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
}

static gemm_engine *open_split(int workers, int depth, int ways, uint64_t min_mnk, const char *faults)
{
    gemm_engine_config cfg;
    gemm_engine_config_defaults(&cfg);
    snprintf(cfg.backend, sizeof cfg.backend, "cpu");
    cfg.cpu_workers = workers;
    cfg.threads = workers; /* one BLAS thread per worker: small products, a 2-core box */
    cfg.queue_depth = depth;
    cfg.split_ways = ways;
    cfg.split_min_mnk = min_mnk;
    snprintf(cfg.fault_inject, sizeof cfg.fault_inject, "%s", faults ? faults : "");
    gemm_engine_err err;
    gemm_engine *e = gemm_engine_open(&cfg, &err);
    if (!e) fprintf(stderr, "# open: %s\n", err.message);
    assert_non_null(e);
    return e;
}

static void run_sync(gemm_engine *e, sjob *t)
{
    gemm_engine_err err;
    int rc = gemm_engine_submit(e, &t->job, &err);
    if (rc != 0) fprintf(stderr, "# submit: %s\n", err.message);
    assert_int_equal(rc, 0);
    test_job_wait(t);
    assert_int_equal(test_job_calls(t), 1);
}

static void wait_splits(gemm_engine *e, uint64_t n)
{
    gemm_engine_stats s;
    for (;;) {
        gemm_engine_get_stats(e, &s);
        if (s.split_products >= n) return;
        nap();
    }
}

/* running drops just after a product's done() has returned: wait for it. */
static void wait_idle(gemm_engine *e)
{
    gemm_engine_stats s;
    for (;;) {
        gemm_engine_get_stats(e, &s);
        if (s.running == 0) return;
        nap();
    }
}

static void open_gate(int *flag, pthread_mutex_t *mu, pthread_cond_t *cv)
{
    pthread_mutex_lock(mu);
    *flag = 1;
    pthread_cond_broadcast(cv);
    pthread_mutex_unlock(mu);
}

/* Checks the panels' rows: m/P each, the first m%P one more, in order, covering m. */
static void check_rows(const gemm_job *job, int panels)
{
    assert_int_equal(job->split_panels, panels);
    uint64_t row0 = 0;
    for (int i = 0; i < panels; i++) {
        uint64_t want = job->m / (uint64_t)panels + ((uint64_t)i < job->m % (uint64_t)panels ? 1 : 0);
        assert_int_equal(job->split[i].row0, row0);
        assert_int_equal(job->split[i].rows, want);
        assert_string_equal(job->split[i].device, "cpu");
        assert_int_equal(job->split[i].stream, -1);
        row0 += want;
    }
    assert_int_equal(row0, job->m);
}

/* ---- results ------------------------------------------------------------- */

/* P panels for m of every residue mod P, each dtype: correct against the reference, and
 * int32 byte for byte equal to the same product run whole (its loop wraps mod 2^32 in
 * unsigned arithmetic, so the result cannot depend on how rows are grouped). For float32
 * and float64 OpenBLAS may pick another micro-kernel for a panel's edge rows: they are
 * checked against the float64 reference within roundoff. */
static void split_results(int ways)
{
    gemm_engine *es = open_split(ways, 8, ways, 1, NULL);
    gemm_engine *ew = open_split(1, 8, 0, 0, NULL); /* never splits */
    static const gemm_dtype dtypes[] = {GEMM_DTYPE_I32, GEMM_DTYPE_F32, GEMM_DTYPE_F64};
    uint64_t products = 0;
    for (size_t di = 0; di < 3; di++) {
        for (size_t m = (size_t)ways * 5; m < (size_t)ways * 6; m++) { /* every residue mod P */
            sjob s, w;
            sjob_init(&s, dtypes[di], m, 37, 23, 100 + m);
            sjob_init(&w, dtypes[di], m, 37, 23, 100 + m);
            run_sync(es, &s);
            run_sync(ew, &w);
            products++;
            assert_int_equal(s.state_at_done, GEMM_JOB_DONE);
            assert_int_equal(w.state_at_done, GEMM_JOB_DONE);
            check_rows(&s.job, ways);
            assert_int_equal(w.job.split_panels, 0);
            assert_string_equal(s.job.kernel_used, w.job.kernel_used);
            assert_string_equal(s.job.device, "cpu");
            assert_int_equal(sjob_check(&s), 0);
            assert_int_equal(sjob_check(&w), 0);
            if (dtypes[di] == GEMM_DTYPE_I32)
                assert_memory_equal(s.job.c, w.job.c, m * 23 * sizeof(int32_t));
            assert_true(s.job.timing.compute_ms >= s.job.timing.kernel_ms);
            test_job_free(&s), test_job_free(&w);
        }
    }
    gemm_engine_stats st;
    wait_idle(es);
    gemm_engine_get_stats(es, &st);
    assert_int_equal(st.completed, products);
    assert_int_equal(st.failed + st.cancelled, 0);
    assert_int_equal(st.split_products, products);
    assert_int_equal(st.split_panels, products * (uint64_t)ways);
    assert_int_equal(st.running, 0);
    gemm_engine_get_stats(ew, &st);
    assert_int_equal(st.split_products, 0);
    gemm_engine_close(es);
    gemm_engine_close(ew);
}

static void test_two_panels(void **st)
{
    (void)st;
    split_results(2);
}

static void test_three_panels(void **st)
{
    (void)st;
    split_results(3);
}

/* float16 / bfloat16 operands, C in float32 or in their own dtype (out_half): the panels'
 * rows of C are placed by C's dtype, not the operands'. Checked against the same product
 * run whole (both go through float32 OpenBLAS) within the output dtype's rounding. */
static void test_half_dtypes(void **st)
{
    (void)st;
    gemm_engine *es = open_split(2, 8, 2, 1, NULL), *ew = open_split(1, 8, 1, 1, NULL);
    const size_t m = 13, k = 17, n = 9;
    float fa[13 * 17], fb[17 * 9];
    ref_fill(GEMM_DTYPE_F32, fa, m * k, 81);
    ref_fill(GEMM_DTYPE_F32, fb, k * n, 82);
    static const gemm_dtype ds[] = {GEMM_DTYPE_F16, GEMM_DTYPE_BF16};
    for (int di = 0; di < 2; di++) {
        for (int out_half = 0; out_half < 2; out_half++) {
            sjob s, w;
            sjob *both[2] = {&s, &w};
            size_t ces = out_half ? 2 : 4;
            for (int b = 0; b < 2; b++) {
                sjob *t = both[b];
                sjob_init(t, GEMM_DTYPE_F32, m, k, n, 1); /* buffers big enough; dtype set below */
                t->job.dtype = ds[di];
                t->job.out_half = out_half;
                gemm_f32_to_half_array(ds[di], fa, t->job.a, m * k);
                gemm_f32_to_half_array(ds[di], fb, t->job.b, k * n);
                memset(t->job.c, 0xff, m * n * 4);
            }
            run_sync(es, &s);
            run_sync(ew, &w);
            assert_int_equal(s.state_at_done, GEMM_JOB_DONE);
            assert_int_equal(w.state_at_done, GEMM_JOB_DONE);
            check_rows(&s.job, 2);
            assert_int_equal(w.job.split_panels, 0);
            float cs[13 * 9], cw[13 * 9];
            if (out_half) {
                gemm_half_to_f32_array(ds[di], s.job.c, cs, m * n);
                gemm_half_to_f32_array(ds[di], w.job.c, cw, m * n);
            } else {
                memcpy(cs, s.job.c, m * n * ces);
                memcpy(cw, w.job.c, m * n * ces);
            }
            double eps = !out_half ? 1e-5 : ds[di] == GEMM_DTYPE_F16 ? 2e-3 : 1.6e-2;
            for (size_t i = 0; i < m * n; i++) {
                assert_false(isnan(cs[i]));
                assert_true(fabs((double)cs[i] - (double)cw[i]) <= eps * (fabs((double)cw[i]) + 1.0));
            }
            /* the bytes past C's end (C in float16 takes half the room) are untouched */
            if (out_half) {
                unsigned char *tail = (unsigned char *)s.job.c + m * n * 2;
                for (size_t i = 0; i < m * n * 2; i++) assert_int_equal(tail[i], 0xff);
            }
            test_job_free(&s), test_job_free(&w);
        }
    }
    gemm_engine_close(es);
    gemm_engine_close(ew);
}

/* More panels asked than rows: as many as there are rows; than workers: as many as workers. */
static void test_panel_count_caps(void **st)
{
    (void)st;
    gemm_engine *e = open_split(3, 8, 3, 1, NULL);
    sjob t;
    sjob_init(&t, GEMM_DTYPE_I32, 2, 5, 4, 7); /* two rows, three ways */
    run_sync(e, &t);
    check_rows(&t.job, 2);
    assert_int_equal(sjob_check(&t), 0);
    test_job_free(&t);
    sjob_init(&t, GEMM_DTYPE_F64, 1, 5, 4, 8); /* one row: whole */
    run_sync(e, &t);
    assert_int_equal(t.job.split_panels, 0);
    assert_int_equal(sjob_check(&t), 0);
    test_job_free(&t);
    gemm_engine_close(e);

    e = open_split(2, 8, 5, 1, NULL); /* five ways, two workers */
    sjob_init(&t, GEMM_DTYPE_F32, 9, 5, 4, 9);
    run_sync(e, &t);
    check_rows(&t.job, 2);
    assert_int_equal(sjob_check(&t), 0);
    test_job_free(&t);
    gemm_engine_close(e);
}

/* What is not split: below split_min_mnk, split_min_mnk 0, split_ways 1, one worker, the
 * default split_ways on the CPU (one device), batched jobs, a resident A or C. A resident
 * B is split. */
static void test_not_split(void **st)
{
    (void)st;
    struct {
        int workers, ways;
        uint64_t min_mnk;
    } cfgs[] = {{2, 2, 10 * 6 * 4 + 1}, {2, 2, 0}, {2, 1, 1}, {1, 2, 1}, {2, 0, 1}};
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        gemm_engine *e = open_split(cfgs[i].workers, 8, cfgs[i].ways, cfgs[i].min_mnk, NULL);
        sjob t;
        sjob_init(&t, GEMM_DTYPE_F64, 10, 6, 4, 11);
        run_sync(e, &t);
        assert_int_equal(t.state_at_done, GEMM_JOB_DONE);
        assert_int_equal(t.job.split_panels, 0);
        assert_int_equal(sjob_check(&t), 0);
        gemm_engine_stats s;
        gemm_engine_get_stats(e, &s);
        assert_int_equal(s.split_products, 0);
        test_job_free(&t);
        gemm_engine_close(e);
    }

    /* the threshold is inclusive */
    sjob t;
    gemm_engine *e = open_split(2, 8, 2, 10 * 6 * 4, NULL);
    sjob_init(&t, GEMM_DTYPE_F64, 10, 6, 4, 11);
    run_sync(e, &t);
    check_rows(&t.job, 2);
    test_job_free(&t);

    /* a batch of 3 products, shared B */
    sjob_init(&t, GEMM_DTYPE_I32, 10, 6, 4, 12);
    gemm_free(&gemm_allocator_host, t.job.a);
    gemm_free(&gemm_allocator_host, t.job.c);
    t.job.a = gemm_alloc(&gemm_allocator_host, 3 * 10 * 6 * sizeof(int32_t));
    t.job.c = gemm_alloc(&gemm_allocator_host, 3 * 10 * 4 * sizeof(int32_t));
    ref_fill(GEMM_DTYPE_I32, t.job.a, 3 * 10 * 6, 13);
    t.job.batch = 3;
    t.job.b_shared = 1;
    run_sync(e, &t);
    assert_int_equal(t.state_at_done, GEMM_JOB_DONE);
    assert_int_equal(t.job.split_panels, 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(ref_check(GEMM_DTYPE_I32, (int32_t *)t.job.a + i * 60, t.job.b, (int32_t *)t.job.c + i * 40,
                                   10, 6, 4, "batch"),
                         0);
    test_job_free(&t);

    /* resident operands: A or C whole on a device, never split; B is */
    for (int which = 0; which < 3; which++) {
        sjob_init(&t, GEMM_DTYPE_F32, 10, 6, 4, 14);
        gemm_resident *r = gemm_engine_resident_new(e, which == 0 ? t.job.a : which == 1 ? t.job.b : t.job.c,
                                                    which == 0 ? 240 : which == 1 ? 96 : 160);
        assert_non_null(r);
        if (which == 0) t.job.a_res = r;
        if (which == 1) t.job.b_res = r;
        if (which == 2) t.job.c_res = r;
        run_sync(e, &t);
        assert_int_equal(t.state_at_done, GEMM_JOB_DONE);
        assert_int_equal(t.job.split_panels, which == 1 ? 2 : 0);
        assert_int_equal(sjob_check(&t), 0);
        gemm_engine_resident_free(e, r);
        test_job_free(&t);
    }
    gemm_engine_close(e);
}

/* ---- failure, cancellation, the queue, close ----------------------------- */

/* One panel fails (the second run of the backend): the product fails with that panel's
 * error, once; the counters say one failed product, split. */
static void test_panel_failure(void **st)
{
    (void)st;
    gemm_engine *e = open_split(2, 8, 2, 1, "cpu_fail:2");
    sjob t;
    sjob_init(&t, GEMM_DTYPE_F64, 11, 6, 5, 21);
    run_sync(e, &t);
    assert_int_equal(t.state_at_done, GEMM_JOB_FAILED);
    assert_int_equal(t.job.err.code, GEMM_E_BACKEND);
    assert_non_null(strstr(t.job.err.message, "cpu_fail:2"));
    assert_int_equal(t.job.split_panels, 2);
    gemm_engine_stats s;
    wait_idle(e);
    gemm_engine_get_stats(e, &s);
    assert_int_equal(s.failed, 1);
    assert_int_equal(s.completed, 0);
    assert_int_equal(s.split_products, 1);
    assert_int_equal(s.split_panels, 2);
    assert_int_equal(s.running, 0);
    test_job_free(&t);

    /* The next one fails too: both panels of the first called the backend (the one that
     * failed was the second to start), so this one's are runs 3 and 4. */
    sjob_init(&t, GEMM_DTYPE_I32, 4, 6, 5, 22);
    run_sync(e, &t);
    assert_int_equal(t.state_at_done, GEMM_JOB_FAILED);
    test_job_free(&t);
    gemm_engine_close(e);

    /* a lost device: the panel that meets it fails with device_error */
    e = open_split(3, 8, 3, 1, "cpu_lost:2");
    sjob_init(&t, GEMM_DTYPE_F32, 9, 6, 5, 23);
    run_sync(e, &t);
    assert_int_equal(t.state_at_done, GEMM_JOB_FAILED);
    assert_true(t.job.err.code == GEMM_E_DEVICE || t.job.err.code == GEMM_E_DEVICE_LOST);
    assert_int_equal(test_job_calls(&t), 1);
    test_job_free(&t);
    gemm_engine_close(e);
}

/* Cancel after the product was cut (its panels sleep in cpu_delay_ms, which a cancel ends):
 * every panel stops, the product ends CANCELLED with 409, once. Without the cancel reaching
 * the panels the product would finish (DONE) after the delay. */
static void test_cancel_split(void **st)
{
    (void)st;
    gemm_engine *e = open_split(2, 8, 2, 1, "cpu_delay_ms:60000");
    sjob t;
    sjob_init(&t, GEMM_DTYPE_F64, 12, 6, 5, 31);
    gemm_engine_err err;
    assert_int_equal(gemm_engine_submit(e, &t.job, &err), 0);
    wait_splits(e, 1);
    assert_int_equal(atomic_load(&t.job.state), GEMM_JOB_RUNNING);
    assert_int_equal(gemm_engine_cancel(e, &t.job), 0); /* running: not dequeued */
    test_job_wait(&t);
    assert_int_equal(t.state_at_done, GEMM_JOB_CANCELLED);
    assert_int_equal(t.job.err.code, GEMM_E_CANCELLED);
    gemm_engine_stats s;
    wait_idle(e);
    gemm_engine_get_stats(e, &s);
    assert_int_equal(s.cancelled, 1);
    assert_int_equal(s.completed + s.failed, 0);
    assert_int_equal(test_job_calls(&t), 1);
    /* a cancel of the finished product does nothing */
    assert_int_equal(gemm_engine_cancel(e, &t.job), 0);
    assert_int_equal(test_job_calls(&t), 1);
    test_job_free(&t);
    gemm_engine_close(e);
}

/* Cancel while the product is still queued (both workers held by gate jobs): dequeued at
 * once, never cut. */
static void test_cancel_queued_split(void **st)
{
    (void)st;
    gemm_engine *e = open_split(2, 8, 2, 100, NULL);
    int gate = 0;
    pthread_mutex_t gmu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t gcv = PTHREAD_COND_INITIALIZER;
    sjob g1, g2, t;
    sjob_init(&g1, GEMM_DTYPE_F32, 2, 2, 2, 41); /* small: never split */
    sjob_init(&g2, GEMM_DTYPE_F32, 2, 2, 2, 42);
    g1.gate_open = g2.gate_open = &gate;
    g1.gate_mu = g2.gate_mu = &gmu;
    g1.gate_cv = g2.gate_cv = &gcv;
    sjob_init(&t, GEMM_DTYPE_F64, 12, 6, 5, 43);
    gemm_engine_err err;
    assert_int_equal(gemm_engine_submit(e, &g1.job, &err), 0);
    assert_int_equal(gemm_engine_submit(e, &g2.job, &err), 0);
    test_job_wait(&g1);
    test_job_wait(&g2);
    assert_int_equal(gemm_engine_submit(e, &t.job, &err), 0);
    assert_int_equal(atomic_load(&t.job.state), GEMM_JOB_QUEUED);
    assert_int_equal(gemm_engine_cancel(e, &t.job), 1);
    assert_int_equal(test_job_calls(&t), 1);
    assert_int_equal(t.state_at_done, GEMM_JOB_CANCELLED);
    assert_int_equal(t.job.split_panels, 0);
    open_gate(&gate, &gmu, &gcv);
    gemm_engine_close(e);
    assert_int_equal(test_job_calls(&g1), 1);
    test_job_free(&g1), test_job_free(&g2), test_job_free(&t);
}

/* A full queue does not hold a split back: with one worker held by a gate job and the one
 * queue place taken, the split product's panels still run (the free worker runs both,
 * ahead of the queued job), and a further submit is refused with queue_full. Every job
 * sleeps 200 ms first (cpu_delay_ms), so q is submitted while the first panel sleeps and
 * takes the queue's one place; should the machine stall that long, q is run and r takes
 * the place instead, and both outcomes are checked. */
static void test_queue_full(void **st)
{
    (void)st;
    gemm_engine *e = open_split(2, 1, 2, 100, "cpu_delay_ms:200");
    int gate = 0;
    pthread_mutex_t gmu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t gcv = PTHREAD_COND_INITIALIZER;
    sjob g, s, q, r;
    sjob_init(&g, GEMM_DTYPE_F32, 2, 2, 2, 51);
    g.gate_open = &gate, g.gate_mu = &gmu, g.gate_cv = &gcv;
    sjob_init(&s, GEMM_DTYPE_I32, 33, 17, 9, 52);
    sjob_init(&q, GEMM_DTYPE_F32, 2, 2, 2, 53);
    sjob_init(&r, GEMM_DTYPE_F32, 2, 2, 2, 54);
    gemm_engine_err err;
    assert_int_equal(gemm_engine_submit(e, &g.job, &err), 0);
    test_job_wait(&g); /* one worker is held in g's done() */
    assert_int_equal(gemm_engine_submit(e, &s.job, &err), 0);
    wait_splits(e, 1); /* the other worker took s and cut it */
    assert_int_equal(gemm_engine_submit(e, &q.job, &err), 0);
    int rc = gemm_engine_submit(e, &r.job, &err);
    if (rc == 0) { /* q was taken already: r holds the place now */
        test_job_wait(&r);
    } else {
        assert_int_equal(err.code, GEMM_E_QUEUE_FULL);
        assert_int_equal(test_job_calls(&r), 0);
    }
    test_job_wait(&s);
    test_job_wait(&q);
    assert_int_equal(s.state_at_done, GEMM_JOB_DONE);
    check_rows(&s.job, 2);
    assert_int_equal(sjob_check(&s), 0);
    assert_int_equal(q.state_at_done, GEMM_JOB_DONE);
    gemm_engine_stats gs;
    gemm_engine_get_stats(e, &gs);
    assert_int_equal(gs.split_products, 1);
    assert_int_equal(gs.running >= 1, 1); /* g, in its done() */
    open_gate(&gate, &gmu, &gcv);
    gemm_engine_close(e);
    assert_int_equal(test_job_calls(&g), 1);
    assert_int_equal(test_job_calls(&s), 1);
    assert_int_equal(test_job_calls(&q), 1);
    test_job_free(&g), test_job_free(&s), test_job_free(&q), test_job_free(&r);
}

/* The queue is full of split products and every worker is busy with one: all finish (a
 * panel never waits for a queue place or for another panel). */
static void test_queue_full_of_splits(void **st)
{
    (void)st;
    enum { N = 6 };
    gemm_engine *e = open_split(3, N, 3, 1, "cpu_delay_ms:2");
    sjob t[N];
    gemm_engine_err err;
    for (int i = 0; i < N; i++) {
        sjob_init(&t[i], i % 2 ? GEMM_DTYPE_I32 : GEMM_DTYPE_F64, 7 + (size_t)i, 9, 5, 60 + (uint64_t)i);
        assert_int_equal(gemm_engine_submit(e, &t[i].job, &err), 0);
    }
    for (int i = 0; i < N; i++) {
        test_job_wait(&t[i]);
        assert_int_equal(t[i].state_at_done, GEMM_JOB_DONE);
        check_rows(&t[i].job, 3);
        assert_int_equal(sjob_check(&t[i]), 0);
    }
    gemm_engine_stats s;
    gemm_engine_get_stats(e, &s);
    assert_int_equal(s.completed, N);
    assert_int_equal(s.split_products, N);
    assert_int_equal(s.split_panels, 3 * N);
    gemm_engine_close(e);
    for (int i = 0; i < N; i++) {
        assert_int_equal(test_job_calls(&t[i]), 1);
        test_job_free(&t[i]);
    }
}

/* Close while a split product runs: its panels finish, its done() is called once. */
static void test_close_with_split_running(void **st)
{
    (void)st;
    gemm_engine *e = open_split(2, 8, 2, 1, "cpu_delay_ms:30");
    sjob t, q;
    sjob_init(&t, GEMM_DTYPE_I32, 13, 8, 6, 71);
    sjob_init(&q, GEMM_DTYPE_I32, 13, 8, 6, 72);
    gemm_engine_err err;
    assert_int_equal(gemm_engine_submit(e, &t.job, &err), 0);
    wait_splits(e, 1);
    assert_int_equal(gemm_engine_submit(e, &q.job, &err), 0); /* queued behind: fails at close */
    gemm_engine_close(e);
    assert_int_equal(test_job_calls(&t), 1);
    assert_int_equal(t.state_at_done, GEMM_JOB_DONE);
    assert_int_equal(sjob_check(&t), 0);
    assert_int_equal(test_job_calls(&q), 1);
    assert_true(q.state_at_done == GEMM_JOB_FAILED || q.state_at_done == GEMM_JOB_DONE);
    test_job_free(&t), test_job_free(&q);
}

/* ---- many submitters ------------------------------------------------------ */

typedef struct {
    gemm_engine *e;
    int seed;
    int bad;
} submitter;

static void *submit_many(void *arg)
{
    submitter *s = arg;
    for (int i = 0; i < 12; i++) {
        sjob *t = malloc(sizeof *t); /* on the heap: a stale use would be caught by ASan */
        if (!t) {
            s->bad++;
            continue;
        }
        gemm_dtype d = (gemm_dtype)((s->seed + i) % 3 == 0 ? GEMM_DTYPE_F32 : (s->seed + i) % 3 == 1 ? GEMM_DTYPE_F64 : GEMM_DTYPE_I32);
        sjob_init(t, d, 3 + (size_t)((s->seed * 7 + i * 5) % 29), 1 + (size_t)(i % 11), 1 + (size_t)((i * 3) % 13),
                  (uint64_t)(s->seed * 100 + i));
        gemm_engine_err err;
        if (gemm_engine_submit(s->e, &t->job, &err) != 0) {
            s->bad++;
        } else {
            test_job_wait(t);
            if (t->state_at_done != GEMM_JOB_DONE || sjob_check(t) != 0 || test_job_calls(t) != 1) s->bad++;
        }
        test_job_free(t);
        free(t);
    }
    return NULL;
}

static void test_many_submitters(void **st)
{
    (void)st;
    gemm_engine *e = open_split(4, 64, 3, 1, NULL);
    submitter s[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        s[i] = (submitter){e, i + 1, 0};
        assert_int_equal(pthread_create(&th[i], NULL, submit_many, &s[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(s[i].bad, 0);
    }
    gemm_engine_stats gs;
    wait_idle(e);
    gemm_engine_get_stats(e, &gs);
    assert_int_equal(gs.completed, 48);
    assert_int_equal(gs.split_products, 48);
    assert_int_equal(gs.split_panels, 48 * 3);
    assert_int_equal(gs.running, 0);
    gemm_engine_close(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_panels),
        cmocka_unit_test(test_three_panels),
        cmocka_unit_test(test_half_dtypes),
        cmocka_unit_test(test_panel_count_caps),
        cmocka_unit_test(test_not_split),
        cmocka_unit_test(test_panel_failure),
        cmocka_unit_test(test_cancel_split),
        cmocka_unit_test(test_cancel_queued_split),
        cmocka_unit_test(test_queue_full),
        cmocka_unit_test(test_queue_full_of_splits),
        cmocka_unit_test(test_close_with_split_running),
        cmocka_unit_test(test_many_submitters),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
