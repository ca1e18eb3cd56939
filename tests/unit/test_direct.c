/*
 * test_direct.c - gemm_engine_submit_here: a job runs on the submitting thread, on an idle
 * worker's backend state, only when nothing is queued; a lent worker takes nothing until
 * its state comes back, so no worker state is ever used by two threads at once; done() is
 * called once, before submit_here returns; cancellation, counters and close work as for a
 * queued job.
 *
 * The backend is the CPU one with a worker state of its own (the CPU backend keeps none):
 * each worker's state records who runs on it, and run() fails the test when a state is
 * entered while in use. Every answer is checked against the float64 reference.
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
#include "test_gate.h"
#include "test_job.h"

enum { MAX_WORKERS = 8 };

/* One worker's state, as a backend's stream and buffers would be. */
typedef struct {
    int index;
    atomic_int in_use;
    atomic_int runs;
    pthread_t owner; /* the worker thread itself (set by worker_init) */
} wstate;

static wstate states[MAX_WORKERS];
static atomic_int overlaps;      /* a state entered while in use */
static atomic_int runs_off_owner; /* runs on a thread other than the state's worker */
static atomic_int fini_while_in_use;

/* A gate run() can be held at (for jobs whose m is HOLD_M). */
enum { HOLD_M = 3 };
static test_gate run_gate = TEST_GATE_OPEN;

static void *ws_init(void *self, int index)
{
    (void)self;
    if (index < 0 || index >= MAX_WORKERS) return NULL;
    wstate *w = &states[index];
    w->index = index;
    atomic_store(&w->in_use, 0);
    atomic_store(&w->runs, 0);
    w->owner = pthread_self();
    return w;
}

static void ws_fini(void *self, void *worker)
{
    (void)self;
    wstate *w = worker;
    if (w && atomic_load(&w->in_use)) atomic_fetch_add(&fini_while_in_use, 1);
}

static int ws_run(void *self, void *worker, gemm_job *job)
{
    wstate *w = worker;
    if (!w) return gemm_engine_err_set(&job->err, GEMM_E_BACKEND, "no worker state");
    int expected = 0;
    if (!atomic_compare_exchange_strong(&w->in_use, &expected, 1)) atomic_fetch_add(&overlaps, 1);
    if (!pthread_equal(pthread_self(), w->owner)) atomic_fetch_add(&runs_off_owner, 1);
    atomic_fetch_add(&w->runs, 1);
    if (job->m == HOLD_M) test_gate_pass(&run_gate);
    for (volatile int spin = 0; spin < 200; spin++) {} /* a little time in the state */
    int rc = gemm_backend_cpu.run(self, NULL, job);
    atomic_store(&w->in_use, 0);
    return rc;
}

static gemm_backend backend(void)
{
    gemm_backend be = gemm_backend_cpu;
    be.worker_init = ws_init;
    be.worker_fini = ws_fini;
    be.run = ws_run;
    return be;
}

static gemm_backend the_backend;

static gemm_engine *open_direct(int workers, int batch_max)
{
    the_backend = backend();
    atomic_store(&overlaps, 0);
    atomic_store(&runs_off_owner, 0);
    atomic_store(&fini_while_in_use, 0);
    gemm_engine_config cfg;
    gemm_engine_config_defaults(&cfg);
    snprintf(cfg.backend, sizeof cfg.backend, "cpu");
    cfg.cpu_workers = workers;
    cfg.threads = workers;
    cfg.queue_depth = 256;
    cfg.batch_max = batch_max;
    gemm_engine_err err;
    /* returns once every worker has its state */
    gemm_engine *e = gemm_engine_open_backend(&the_backend, &cfg, &err);
    if (!e) fprintf(stderr, "# open: %s\n", err.message);
    assert_non_null(e);
    return e;
}

static void wait_not_running(gemm_engine *e)
{
    gemm_engine_stats st;
    do { /* a job counts as running until its done() has returned */
        sched_yield();
        gemm_engine_get_stats(e, &st);
    } while (st.running > 0 || st.queued > 0);
}

/* On an idle engine: the job runs on this thread, done() has come (once, from here) when
 * submit_here returns, the answer is right, the counters count it once, and the state
 * it ran on was a worker's. */
static void test_runs_here_when_idle(void **st)
{
    (void)st;
    gemm_engine *e = open_direct(2, 0);
    static const gemm_dtype dtypes[] = {GEMM_DTYPE_F32, GEMM_DTYPE_F64, GEMM_DTYPE_I32};
    int n = 0;
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++) {
        for (int r = 0; r < 5; r++, n++) {
            test_job t;
            test_job_init(&t, dtypes[i], 17 + (size_t)r, 9, 13, 40 + (uint64_t)n);
            gemm_engine_err err;
            wait_not_running(e); /* the previous one's worker is back */
            assert_int_equal(gemm_engine_submit_here(e, &t.job, &err), 1);
            assert_int_equal(t.calls, 1); /* before it returned */
            assert_true(pthread_equal(t.done_thread, pthread_self()));
            assert_int_equal(atomic_load(&t.job.state), GEMM_JOB_DONE);
            assert_true(t.job.timing.queue_ms >= 0 && t.job.timing.queue_ms < 1000);
            assert_int_equal(test_job_check(&t, "run here"), 0);
            test_job_free(&t);
        }
    }
    gemm_engine_stats s;
    gemm_engine_get_stats(e, &s);
    assert_int_equal(s.ran_here, n);
    assert_int_equal(s.completed, n);
    assert_int_equal(s.running, 0);
    /* every run was on a worker's state, from this thread, the lowest idle worker first */
    assert_int_equal(atomic_load(&runs_off_owner), n);
    assert_int_equal(atomic_load(&states[0].runs), n);
    assert_int_equal(atomic_load(&overlaps), 0);
    gemm_engine_close(e);
    assert_int_equal(atomic_load(&fini_while_in_use), 0);
}

/* With the only worker busy (held in run()), a job is queued, not run here; and with a job
 * queued, submit_here queues behind it (nothing passes a job that waits). */
static void test_queues_when_busy(void **st)
{
    (void)st;
    gemm_engine *e = open_direct(1, 0);
    test_gate_close(&run_gate);
    test_job h, q1, q2;
    test_job_init(&h, GEMM_DTYPE_F32, HOLD_M, 4, 5, 1);
    test_job_init(&q1, GEMM_DTYPE_F32, 7, 6, 5, 2);
    test_job_init(&q2, GEMM_DTYPE_F64, 9, 3, 4, 3);
    gemm_engine_err err;
    assert_int_equal(gemm_engine_submit(e, &h.job, &err), 0);
    test_gate_wait_held(&run_gate, 1); /* the worker is in run() */
    assert_int_equal(gemm_engine_submit_here(e, &q1.job, &err), 0); /* no idle worker */
    assert_int_equal(gemm_engine_submit_here(e, &q2.job, &err), 0); /* one queued */
    assert_int_equal(q1.calls + q2.calls, 0);
    test_gate_open(&run_gate);
    test_job_wait(&h);
    test_job_wait(&q1);
    test_job_wait(&q2);
    assert_int_equal(test_job_check(&h, "held"), 0);
    assert_int_equal(test_job_check(&q1, "queued 1"), 0);
    assert_int_equal(test_job_check(&q2, "queued 2"), 0);
    wait_not_running(e);
    gemm_engine_stats s;
    gemm_engine_get_stats(e, &s);
    assert_int_equal(s.ran_here, 0);
    assert_int_equal(s.completed, 3);
    assert_int_equal(atomic_load(&runs_off_owner), 0);
    gemm_engine_close(e);
    test_job_free(&h);
    test_job_free(&q1);
    test_job_free(&q2);
}

static void *close_main(void *e)
{
    gemm_engine_close(e);
    return NULL;
}

struct lend_arg {
    gemm_engine *e;
    test_job *t;
    int rc;
};

static void *lend_main(void *p)
{
    struct lend_arg *a = p;
    gemm_engine_err err;
    a->rc = gemm_engine_submit_here(a->e, &a->t->job, &err);
    return NULL;
}

/* While the only worker's state is lent (the job held in run() on another thread), a job
 * submitted the usual way waits in the queue: the worker does not take it on the same
 * state. It runs once the state is back. A cancel of the lent job is seen as for any
 * running job. Close waits for a lent worker. */
static void test_lent_worker_takes_nothing(void **st)
{
    (void)st;
    gemm_engine *e = open_direct(1, 0);
    test_gate_close(&run_gate);
    test_job h, q;
    test_job_init(&h, GEMM_DTYPE_F32, HOLD_M, 4, 5, 11);
    test_job_init(&q, GEMM_DTYPE_F32, 6, 7, 8, 12);
    struct lend_arg a = {e, &h, -2};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, lend_main, &a), 0);
    test_gate_wait_held(&run_gate, 1); /* running on the lent state */
    gemm_engine_stats s;
    gemm_engine_get_stats(e, &s);
    assert_int_equal(s.running, 1);
    assert_int_equal(s.slot_busy[0], 1);
    gemm_engine_err err;
    assert_int_equal(gemm_engine_submit(e, &q.job, &err), 0);
    for (int i = 0; i < 2000; i++) sched_yield(); /* time for a worker that should not take it */
    gemm_engine_get_stats(e, &s);
    assert_int_equal(s.queued, 1);
    assert_int_equal(q.calls, 0);
    assert_int_equal(gemm_engine_cancel(e, &h.job), 0); /* running: flagged, not dequeued */
    assert_true(gemm_job_cancel_requested(&h.job));
    test_gate_open(&run_gate);
    pthread_join(th, NULL);
    assert_int_equal(a.rc, 1);
    assert_int_equal(h.calls, 1);
    assert_int_equal(atomic_load(&h.job.state), GEMM_JOB_CANCELLED); /* the backend saw the flag */
    test_job_wait(&q);
    assert_int_equal(atomic_load(&q.job.state), GEMM_JOB_DONE);
    assert_int_equal(test_job_check(&q, "after the lend"), 0);
    assert_int_equal(atomic_load(&overlaps), 0);
    assert_int_equal(atomic_load(&runs_off_owner), 1);
    wait_not_running(e);

    /* close while lent: the worker does not exit (nor free its state) under the lender */
    test_gate_close(&run_gate);
    test_job h2;
    test_job_init(&h2, GEMM_DTYPE_F32, HOLD_M, 2, 2, 13);
    struct lend_arg a2 = {e, &h2, -2};
    assert_int_equal(pthread_create(&th, NULL, lend_main, &a2), 0);
    test_gate_wait_held(&run_gate, 1);
    pthread_t closer;
    assert_int_equal(pthread_create(&closer, NULL, close_main, e), 0);
    for (int i = 0; i < 2000; i++) sched_yield();
    test_gate_open(&run_gate);
    pthread_join(th, NULL);
    pthread_join(closer, NULL);
    assert_int_equal(a2.rc, 1);
    assert_int_equal(h2.calls, 1);
    assert_int_equal(atomic_load(&h2.job.state), GEMM_JOB_DONE);
    assert_int_equal(atomic_load(&fini_while_in_use), 0);
    test_job_free(&h);
    test_job_free(&q);
    test_job_free(&h2);
}

/* After close began, submit_here refuses like submit (503 shutting_down, no done()). */
static void test_refused_after_close(void **st)
{
    (void)st;
    gemm_engine *e = open_direct(1, 0);
    test_gate_close(&run_gate);
    test_job h, late;
    test_job_init(&h, GEMM_DTYPE_F32, HOLD_M, 2, 2, 21);
    test_job_init(&late, GEMM_DTYPE_F32, 2, 2, 2, 22);
    gemm_engine_err err;
    assert_int_equal(gemm_engine_submit(e, &h.job, &err), 0);
    test_gate_wait_held(&run_gate, 1);
    pthread_t closer;
    assert_int_equal(pthread_create(&closer, NULL, close_main, e), 0);
    /* close has begun once a submit is refused */
    test_job probe;
    test_job_init(&probe, GEMM_DTYPE_F32, 2, 2, 2, 23);
    int rc;
    while ((rc = gemm_engine_submit(e, &probe.job, &err)) == 0) {
        test_job_wait(&probe); /* not yet closing: it ran (or will); try again */
        probe.calls = 0;
        sched_yield();
    }
    assert_int_equal(gemm_engine_submit_here(e, &late.job, &err), -1);
    assert_int_equal(err.code, GEMM_E_SHUTTING_DOWN);
    assert_int_equal(late.calls, 0);
    test_gate_open(&run_gate);
    pthread_join(closer, NULL);
    assert_int_equal(h.calls, 1);
    test_job_free(&h);
    test_job_free(&late);
    test_job_free(&probe);
}

struct mix_arg {
    gemm_engine *e;
    int id;
    size_t bad, here, queued, wrong_calls;
};

/* Each thread: 60 products of its own shapes and dtypes, each submitted here or the usual
 * way, one at a time, answers checked. */
static void *mix_main(void *p)
{
    struct mix_arg *a = p;
    static const gemm_dtype dtypes[] = {GEMM_DTYPE_F32, GEMM_DTYPE_F64, GEMM_DTYPE_I32};
    for (int i = 0; i < 60; i++) {
        test_job t;
        gemm_dtype d = dtypes[(a->id + i) % 3];
        size_t m = 1 + (size_t)((a->id * 7 + i) % 13), k = 1 + (size_t)(i % 9), n = 1 + (size_t)(a->id % 11);
        test_job_init(&t, d, m == HOLD_M ? m + 1 : m, k, n, (uint64_t)(a->id * 1000 + i));
        gemm_engine_err err;
        int rc = (i + a->id) % 3 ? gemm_engine_submit_here(a->e, &t.job, &err) : gemm_engine_submit(a->e, &t.job, &err);
        if (rc < 0) {
            fprintf(stderr, "# submit: %s\n", err.message);
            a->bad++;
        } else {
            if (rc == 1) {
                a->here++;
                if (t.calls != 1) a->wrong_calls++;
            } else {
                a->queued++;
            }
            test_job_wait(&t);
            if (t.calls != 1 || atomic_load(&t.job.state) != GEMM_JOB_DONE) a->wrong_calls++;
            a->bad += test_job_check(&t, "mixed");
        }
        test_job_free(&t);
    }
    return NULL;
}

/* Many threads submitting here and the usual way at once, with dynamic batching on: every
 * answer right and its own, done() once each, no worker state ever used by two threads,
 * the counters add up. */
static void test_many_threads(void **st)
{
    (void)st;
    gemm_engine *e = open_direct(3, 8);
    enum { T = 12 };
    pthread_t th[T];
    struct mix_arg a[T];
    for (int i = 0; i < T; i++) {
        a[i] = (struct mix_arg){e, i, 0, 0, 0, 0};
        assert_int_equal(pthread_create(&th[i], NULL, mix_main, &a[i]), 0);
    }
    size_t bad = 0, here = 0, queued = 0, wrong = 0;
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        bad += a[i].bad, here += a[i].here, queued += a[i].queued, wrong += a[i].wrong_calls;
    }
    fprintf(stderr, "# %zu ran where submitted, %zu queued\n", here, queued);
    assert_int_equal(bad, 0);
    assert_int_equal(wrong, 0);
    assert_int_equal(here + queued, T * 60);
    assert_true(here > 0);
    wait_not_running(e);
    gemm_engine_stats s;
    gemm_engine_get_stats(e, &s);
    assert_int_equal(s.completed, T * 60);
    assert_int_equal(s.ran_here, here);
    assert_int_equal(atomic_load(&overlaps), 0);
    gemm_engine_close(e);
    assert_int_equal(atomic_load(&fini_while_in_use), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runs_here_when_idle),
        cmocka_unit_test(test_queues_when_busy),
        cmocka_unit_test(test_lent_worker_takes_nothing),
        cmocka_unit_test(test_refused_after_close),
        cmocka_unit_test(test_many_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
