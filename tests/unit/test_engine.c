/*
 * test_engine.c - the generic engine over the CPU backend: defaults, backend choice,
 * submit validation, the bounded queue (503 queue_full, done() not called), cancel of a
 * queued and of a running job (stopped at its next stage boundary), close (queued jobs fail with 503 shutting_down, running
 * ones finish, every done() called once), many submitters on several threads, stats.
 *
 * Queue states are made deterministic without timing: a "gate" job's done() callback
 * blocks the single worker until the test opens the gate, so later jobs stay queued.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "gemm_ref.h"
#include "test_job.h"

/* ---- helpers ------------------------------------------------------------- */

typedef test_job tjob;

static void nap(void)
{
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
}

static void wait_state(tjob *t, int state)
{
    while (atomic_load(&t->job.state) != state) nap();
}


static gemm_engine *open_cpu(int workers, int depth, const char *faults)
{
    gemm_engine_config cfg;
    gemm_engine_config_defaults(&cfg);
    snprintf(cfg.backend, sizeof cfg.backend, "cpu");
    cfg.cpu_workers = workers;
    cfg.queue_depth = depth;
    snprintf(cfg.fault_inject, sizeof cfg.fault_inject, "%s", faults ? faults : "");
    gemm_engine_err err;
    gemm_engine *e = gemm_engine_open(&cfg, &err);
    if (!e) fprintf(stderr, "# open: %s\n", err.message);
    assert_non_null(e);
    return e;
}

/* ---- configuration and open ---------------------------------------------- */

static void test_defaults(void **st)
{
    (void)st;
    gemm_engine_config cfg;
    memset(&cfg, 0x5a, sizeof cfg);
    gemm_engine_config_defaults(&cfg);
    assert_string_equal(cfg.backend, "auto");
    assert_int_equal(cfg.threads, 0);
    assert_int_equal(cfg.cpu_workers, 1);
    assert_int_equal(cfg.queue_depth, 64);
    assert_string_equal(cfg.devices, "all");
    assert_int_equal(cfg.streams_per_device, 4);
    assert_int_equal(cfg.device_mem_limit, 0);
    assert_string_equal(cfg.fault_inject, "");
}

static void test_state_names(void **st)
{
    (void)st;
    assert_string_equal(gemm_job_state_name(GEMM_JOB_QUEUED), "queued");
    assert_string_equal(gemm_job_state_name(GEMM_JOB_RUNNING), "running");
    assert_string_equal(gemm_job_state_name(GEMM_JOB_DONE), "done");
    assert_string_equal(gemm_job_state_name(GEMM_JOB_FAILED), "failed");
    assert_string_equal(gemm_job_state_name(GEMM_JOB_CANCELLED), "cancelled");
    assert_string_equal(gemm_job_state_name((gemm_job_state)42), "invalid");
}

static void test_open_backends(void **st)
{
    (void)st;
    gemm_engine_config cfg;
    gemm_engine_err err;
    gemm_engine_config_defaults(&cfg);
    snprintf(cfg.backend, sizeof cfg.backend, "tpu");
    assert_null(gemm_engine_open(&cfg, &err));
    assert_int_equal(err.code, GEMM_E_BAD_BACKEND);
    assert_non_null(strstr(err.message, "tpu"));

    int have_gpu = 0;
#ifdef GEMMD_HAVE_CUDA
    have_gpu = gemm_cuda_device_count() > 0;
#endif
    gemm_engine_config_defaults(&cfg);
    gemm_engine *e = gemm_engine_open(&cfg, &err); /* auto */
    assert_non_null(e);
    gemm_engine_info info;
    gemm_engine_describe(e, &info);
    assert_string_equal(info.backend, have_gpu ? "cuda" : "cpu");
    gemm_engine_close(e);

    /* cuda: not in a CPU-only build; in a CUDA build on a host without a device, the
     * backend finds none */
    if (!have_gpu) {
        snprintf(cfg.backend, sizeof cfg.backend, "cuda");
        assert_null(gemm_engine_open(&cfg, &err));
#ifdef GEMMD_HAVE_CUDA
        assert_int_equal(err.code, GEMM_E_NO_DEVICE);
#else
        assert_int_equal(err.code, GEMM_E_BAD_BACKEND);
        assert_non_null(strstr(err.message, "it has auto, cpu"));
#endif
        assert_non_null(strstr(err.message, "cuda"));
    }
}

static void test_submit_validation(void **st)
{
    (void)st;
    gemm_engine *e = open_cpu(1, 4, NULL);
    tjob t;
    gemm_engine_err err;
    test_job_init(&t, GEMM_DTYPE_F32, 2, 2, 2, 1);

    t.job.m = 0;
    assert_int_equal(gemm_engine_submit(e, &t.job, &err), -1);
    assert_int_equal(err.code, GEMM_E_EMPTY);
    t.job.m = 2;

    t.job.dtype = GEMM_DTYPE_INVALID;
    assert_int_equal(gemm_engine_submit(e, &t.job, &err), -1);
    assert_int_equal(err.code, GEMM_E_BAD_DTYPE);
    t.job.dtype = GEMM_DTYPE_F32;

    t.job.done = NULL;
    assert_int_equal(gemm_engine_submit(e, &t.job, &err), -1);
    assert_int_equal(err.code, GEMM_E_INTERNAL);
    t.job.done = test_job_done;

    /* plan_m: the rows of a whole product this one is a panel of; never fewer than m */
    t.job.plan_m = 1;
    assert_int_equal(gemm_engine_submit(e, &t.job, &err), -1);
    assert_int_equal(err.code, GEMM_E_BAD_OPTION);
    assert_non_null(strstr(err.message, "panel_of=1"));
    t.job.plan_m = 8;
    t.job.batch = 2; /* checked before the buffers' sizes */
    assert_int_equal(gemm_engine_submit(e, &t.job, &err), -1);
    assert_int_equal(err.code, GEMM_E_BAD_OPTION);
    assert_non_null(strstr(err.message, "single product"));
    t.job.batch = 0;
    t.job.plan_m = 2; /* = m: accepted, as a whole product */

    assert_int_equal(test_job_calls(&t), 0);
    assert_int_equal(gemm_engine_submit(e, &t.job, &err), 0);
    test_job_wait_for(&t, 1);
    assert_int_equal(t.state_at_done, GEMM_JOB_DONE);
    assert_true(t.job.timing.queue_ms >= 0);
    assert_int_equal(test_job_check(&t, "engine job"), 0);

    gemm_engine_stats s;
    gemm_engine_get_stats(e, &s);
    assert_int_equal(s.completed, 1);
    assert_int_equal(s.rejected, 0); /* option errors are not load shedding */
    assert_int_equal(s.queued, 0);
    gemm_engine_close(e);
    test_job_free(&t);
}

/* ---- the queue: full, cancel, close --------------------------------------- */

static void *closer(void *arg)
{
    gemm_engine_close(arg);
    return NULL;
}

static void test_queue_full_cancel_close(void **st)
{
    (void)st;
    gemm_engine *e = open_cpu(1, 2, NULL);
    int open_gate = 0;
    pthread_mutex_t gmu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t gcv = PTHREAD_COND_INITIALIZER;
    tjob a, b, c, d, x;
    gemm_engine_err err;
    test_job_init(&a, GEMM_DTYPE_F64, 9, 8, 7, 10);
    test_job_init(&b, GEMM_DTYPE_F32, 3, 4, 5, 20);
    test_job_init(&c, GEMM_DTYPE_I32, 3, 4, 5, 30);
    test_job_init(&d, GEMM_DTYPE_F32, 3, 4, 5, 40);
    test_job_init(&x, GEMM_DTYPE_F32, 3, 4, 5, 50);
    a.gate_open = &open_gate, a.gate_mu = &gmu, a.gate_cv = &gcv;

    /* A runs and its done() holds the only worker. */
    assert_int_equal(gemm_engine_submit(e, &a.job, &err), 0);
    test_job_wait_for(&a, 1);
    assert_int_equal(a.state_at_done, GEMM_JOB_DONE);
    assert_int_equal(test_job_check(&a, "engine job"), 0);
    assert_true(gemm_engine_ready(e));

    /* B and C fill the two places; D is refused without its done(). */
    assert_int_equal(gemm_engine_submit(e, &b.job, &err), 0);
    assert_int_equal(atomic_load(&b.job.state), GEMM_JOB_QUEUED);
    assert_int_equal(gemm_engine_submit(e, &c.job, &err), 0);
    assert_false(gemm_engine_ready(e));
    assert_int_equal(gemm_engine_submit(e, &d.job, &err), -1);
    assert_int_equal(err.code, GEMM_E_QUEUE_FULL);
    assert_int_equal(test_job_calls(&d), 0);

    gemm_engine_stats s;
    gemm_engine_get_stats(e, &s);
    assert_int_equal(s.queued, 2);
    assert_int_equal(s.rejected, 1);
    assert_int_equal(s.completed, 1);
    assert_int_equal(s.running, 1); /* A is running until its done() returns */

    /* Cancelling queued C calls its done() at once with 409 cancelled. */
    assert_int_equal(gemm_engine_cancel(e, &c.job), 1);
    assert_int_equal(test_job_calls(&c), 1);
    assert_int_equal(c.state_at_done, GEMM_JOB_CANCELLED);
    assert_int_equal(c.job.err.code, GEMM_E_CANCELLED);
    assert_true(gemm_engine_ready(e));

    /* Now D fits. */
    assert_int_equal(gemm_engine_submit(e, &d.job, &err), 0);
    gemm_engine_get_stats(e, &s);
    assert_int_equal(s.queued, 2);
    assert_int_equal(s.cancelled, 1);

    /* Close while A's done() still holds the worker: B and D fail with 503. */
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, closer, e), 0);
    test_job_wait_for(&b, 1);
    test_job_wait_for(&d, 1);
    assert_int_equal(b.state_at_done, GEMM_JOB_FAILED);
    assert_int_equal(b.job.err.code, GEMM_E_SHUTTING_DOWN);
    assert_int_equal(d.state_at_done, GEMM_JOB_FAILED);
    assert_int_equal(d.job.err.code, GEMM_E_SHUTTING_DOWN);

    /* The engine still exists (close is joining the worker) but refuses work. */
    assert_false(gemm_engine_ready(e));
    assert_int_equal(gemm_engine_submit(e, &x.job, &err), -1);
    assert_int_equal(err.code, GEMM_E_SHUTTING_DOWN);
    assert_int_equal(test_job_calls(&x), 0);

    pthread_mutex_lock(&gmu);
    open_gate = 1;
    pthread_cond_broadcast(&gcv);
    pthread_mutex_unlock(&gmu);
    pthread_join(th, NULL);

    assert_int_equal(test_job_calls(&a), 1);
    assert_int_equal(test_job_calls(&b), 1);
    assert_int_equal(test_job_calls(&c), 1);
    assert_int_equal(test_job_calls(&d), 1);
    assert_int_equal(test_job_calls(&x), 0);
    test_job_free(&a), test_job_free(&b), test_job_free(&c), test_job_free(&d), test_job_free(&x);
}

/* A job that is running when close begins finishes with its result. */
static void test_close_lets_running_finish(void **st)
{
    (void)st;
    gemm_engine *e = open_cpu(1, 4, "cpu_delay_ms:100");
    tjob a;
    gemm_engine_err err;
    test_job_init(&a, GEMM_DTYPE_I32, 31, 17, 13, 60);
    assert_int_equal(gemm_engine_submit(e, &a.job, &err), 0);
    wait_state(&a, GEMM_JOB_RUNNING);
    gemm_engine_close(e);
    assert_int_equal(test_job_calls(&a), 1);
    assert_int_equal(a.state_at_done, GEMM_JOB_DONE);
    assert_int_equal(test_job_check(&a, "engine job"), 0);
    assert_true(a.job.timing.compute_ms >= a.job.timing.kernel_ms);
    test_job_free(&a);
}

/* Cancel of a running job: not dequeued (0), flagged, and the worker stops it at its next
 * stage boundary: here the end of the cpu_delay_ms sleep (60 s, which the cancel cuts
 * short), before the product. done() once, CANCELLED, 409 cancelled, C untouched. */
static void test_cancel_running(void **st)
{
    (void)st;
    gemm_engine *e = open_cpu(1, 4, "cpu_delay_ms:60000");
    tjob a;
    gemm_engine_err err;
    test_job_init(&a, GEMM_DTYPE_F32, 8, 8, 8, 70);
    assert_int_equal(gemm_engine_submit(e, &a.job, &err), 0);
    wait_state(&a, GEMM_JOB_RUNNING);
    assert_int_equal(gemm_engine_cancel(e, &a.job), 0);
    assert_int_equal(atomic_load(&a.job.cancel_requested), 1);
    test_job_wait_for(&a, 1);
    assert_int_equal(a.state_at_done, GEMM_JOB_CANCELLED);
    assert_int_equal(a.job.err.code, GEMM_E_CANCELLED);
    assert_non_null(strstr(a.job.err.message, "before its product"));
    for (size_t i = 0; i < 64; i++) assert_true(isnan(((float *)a.job.c)[i])); /* never computed */
    gemm_engine_stats s;
    gemm_engine_get_stats(e, &s);
    assert_int_equal(s.cancelled, 1);
    assert_int_equal(s.completed, 0);
    assert_int_equal(s.failed, 0);

    /* The worker is free again: the next job runs (no cancel) and is right; a cancel of a
     * finished job changes nothing. */
    gemm_engine_close(e);
    e = open_cpu(1, 4, NULL);
    tjob b;
    test_job_init(&b, GEMM_DTYPE_F64, 9, 8, 7, 71);
    assert_int_equal(gemm_engine_submit(e, &b.job, &err), 0);
    test_job_wait_for(&b, 1);
    assert_int_equal(b.state_at_done, GEMM_JOB_DONE);
    assert_int_equal(gemm_engine_cancel(e, &b.job), 0);
    assert_int_equal(atomic_load(&b.job.state), GEMM_JOB_DONE);
    assert_int_equal(test_job_check(&b, "engine job"), 0);
    gemm_engine_close(e);
    assert_int_equal(test_job_calls(&a), 1);
    assert_int_equal(test_job_calls(&b), 1);
    test_job_free(&a);
    test_job_free(&b);
}

/* A cancel of the running job with others queued behind it: it stops, the queued ones run
 * and are right, and each done() is called once. */
static void test_cancel_running_then_queue_runs(void **st)
{
    (void)st;
    gemm_engine *e = open_cpu(1, 4, "cpu_delay_ms:60000");
    tjob a, b;
    gemm_engine_err err;
    test_job_init(&a, GEMM_DTYPE_I32, 17, 9, 5, 72);
    test_job_init(&b, GEMM_DTYPE_I32, 6, 7, 8, 73);
    assert_int_equal(gemm_engine_submit(e, &a.job, &err), 0);
    wait_state(&a, GEMM_JOB_RUNNING);
    assert_int_equal(gemm_engine_submit(e, &b.job, &err), 0);
    assert_int_equal(atomic_load(&b.job.state), GEMM_JOB_QUEUED);
    assert_int_equal(gemm_engine_cancel(e, &a.job), 0);
    test_job_wait_for(&a, 1);
    assert_int_equal(a.state_at_done, GEMM_JOB_CANCELLED);
    /* b now sleeps its 60 s: cancel it too, while it runs. */
    wait_state(&b, GEMM_JOB_RUNNING);
    assert_int_equal(gemm_engine_cancel(e, &b.job), 0);
    test_job_wait_for(&b, 1);
    assert_int_equal(b.state_at_done, GEMM_JOB_CANCELLED);
    /* b counts as running until its done() has returned, which may be just after
     * test_job_wait_for() saw the call: wait for the worker to get there. */
    gemm_engine_stats s;
    for (gemm_engine_get_stats(e, &s); s.running != 0; gemm_engine_get_stats(e, &s)) nap();
    assert_int_equal(s.cancelled, 2);
    assert_int_equal(s.running, 0);
    gemm_engine_close(e);
    assert_int_equal(test_job_calls(&a), 1);
    assert_int_equal(test_job_calls(&b), 1);
    test_job_free(&a);
    test_job_free(&b);
}

/* ---- many submitters --------------------------------------------------------- */

enum { SUBMITTERS = 4, JOBS_EACH = 40 };

typedef struct {
    gemm_engine *e;
    int index;
    tjob jobs[JOBS_EACH];
    int full_retries;
} submitter;

static void *submit_many(void *arg)
{
    submitter *s = arg;
    for (int i = 0; i < JOBS_EACH; i++) {
        gemm_dtype d = (gemm_dtype)((s->index + i) % GEMM_DTYPE_COUNT);
        size_t m = 1 + (size_t)(i * 7 + s->index) % 23, k = 1 + (size_t)(i * 5) % 31,
               n = 1 + (size_t)(i * 3 + s->index * 11) % 19;
        test_job_init(&s->jobs[i], d, m, k, n, (uint64_t)(1000 * s->index + i));
        gemm_engine_err err;
        while (gemm_engine_submit(s->e, &s->jobs[i].job, &err) != 0) {
            if (err.code != GEMM_E_QUEUE_FULL) return "unexpected submit error";
            s->full_retries++;
            sched_yield();
        }
    }
    return NULL;
}

static void test_many_submitters(void **st)
{
    (void)st;
    gemm_engine *e = open_cpu(2, 3, NULL);
    static submitter subs[SUBMITTERS];
    pthread_t th[SUBMITTERS];
    for (int i = 0; i < SUBMITTERS; i++) {
        memset(&subs[i], 0, sizeof subs[i]);
        subs[i].e = e;
        subs[i].index = i;
        assert_int_equal(pthread_create(&th[i], NULL, submit_many, &subs[i]), 0);
    }
    uint64_t retries = 0;
    for (int i = 0; i < SUBMITTERS; i++) {
        void *ret;
        pthread_join(th[i], &ret);
        assert_null(ret);
        retries += (uint64_t)subs[i].full_retries;
    }
    for (int i = 0; i < SUBMITTERS; i++)
        for (int j = 0; j < JOBS_EACH; j++) test_job_wait_for(&subs[i].jobs[j], 1);

    /* A job counts as running until its done() has returned: wait for the workers to
     * get there after the last callback. */
    gemm_engine_stats s;
    for (gemm_engine_get_stats(e, &s); s.running != 0; gemm_engine_get_stats(e, &s)) nap();
    assert_int_equal(s.completed, SUBMITTERS * JOBS_EACH);
    assert_int_equal(s.failed, 0);
    assert_int_equal(s.rejected, retries);
    assert_int_equal(s.queued, 0);
    assert_int_equal(s.running, 0);
    assert_true(s.compute_seconds >= 0);
    gemm_engine_close(e);

    for (int i = 0; i < SUBMITTERS; i++) {
        for (int j = 0; j < JOBS_EACH; j++) {
            tjob *t = &subs[i].jobs[j];
            assert_int_equal(t->calls, 1);
            assert_int_equal(t->state_at_done, GEMM_JOB_DONE);
            assert_int_equal(test_job_check(t, "engine job"), 0);
            test_job_free(t);
        }
    }
}

/* done() may free the job: the engine must not touch it afterwards (ASan checks). */
static void free_in_done(gemm_job *job)
{
    int *count = job->user;
    gemm_free(&gemm_allocator_host, job->a);
    gemm_free(&gemm_allocator_host, job->b);
    gemm_free(&gemm_allocator_host, job->c);
    free(job);
    __atomic_add_fetch(count, 1, __ATOMIC_SEQ_CST);
}

static void test_done_may_free(void **st)
{
    (void)st;
    gemm_engine *e = open_cpu(1, 64, "cpu_delay_ms:1");
    int count = 0, accepted = 0;
    for (int i = 0; i < 20; i++) {
        gemm_job *job = calloc(1, sizeof *job);
        assert_non_null(job);
        job->dtype = GEMM_DTYPE_F32;
        job->m = job->k = job->n = 4;
        job->a = gemm_engine_host_alloc(e, 64);
        job->b = gemm_engine_host_alloc(e, 64);
        job->c = gemm_engine_host_alloc(e, 64);
        ref_fill(GEMM_DTYPE_F32, job->a, 16, 3);
        ref_fill(GEMM_DTYPE_F32, job->b, 16, 4);
        job->done = free_in_done;
        job->user = &count;
        gemm_engine_err err;
        assert_int_equal(gemm_engine_submit(e, job, &err), 0);
        accepted++; /* job may already be freed: not touched again */
    }
    gemm_engine_close(e); /* some ran, the rest fail on close; every done() frees */
    assert_int_equal(__atomic_load_n(&count, __ATOMIC_SEQ_CST), accepted);
}

/* cpu_lost:2: job 1 runs, job 2 loses the device (500 device_error), job 3 gets 503
 * device_unavailable; healthy and ready turn 0 at job 2 and stay 0. */
static void test_healthy_lost(void **st)
{
    (void)st;
    assert_int_equal(gemm_engine_healthy(NULL), 0);
    gemm_engine *e = open_cpu(1, 4, "cpu_lost:2");
    assert_int_equal(gemm_engine_healthy(e), 1);
    assert_int_equal(gemm_engine_ready(e), 1);
    tjob t[3];
    gemm_engine_err err;
    for (int i = 0; i < 3; i++) {
        test_job_init(&t[i], GEMM_DTYPE_F64, 9, 7, 5, 80 + (uint64_t)i);
        assert_int_equal(gemm_engine_submit(e, &t[i].job, &err), 0);
        test_job_wait_for(&t[i], 1);
        if (i == 0) assert_int_equal(gemm_engine_healthy(e), 1);
    }
    assert_int_equal(t[0].state_at_done, GEMM_JOB_DONE);
    assert_int_equal(test_job_check(&t[0], "engine job"), 0);
    assert_int_equal(t[1].state_at_done, GEMM_JOB_FAILED);
    assert_int_equal(t[1].job.err.code, GEMM_E_DEVICE);
    assert_int_equal(t[2].state_at_done, GEMM_JOB_FAILED);
    assert_int_equal(t[2].job.err.code, GEMM_E_DEVICE_LOST);
    assert_int_equal(gemm_engine_healthy(e), 0);
    assert_int_equal(gemm_engine_ready(e), 0);
    gemm_engine_close(e);
    for (int i = 0; i < 3; i++) test_job_free(&t[i]);

    /* cpu_lost:0 is refused like the other hooks' bad values; no hook: always healthy. */
    gemm_engine_config cfg;
    gemm_engine_config_defaults(&cfg);
    snprintf(cfg.backend, sizeof cfg.backend, "cpu");
    snprintf(cfg.fault_inject, sizeof cfg.fault_inject, "cpu_lost:0");
    assert_null(gemm_engine_open(&cfg, &err));
    assert_int_equal(err.code, GEMM_E_BAD_CONFIG);
    e = open_cpu(1, 4, NULL);
    assert_int_equal(gemm_engine_healthy(e), 1);
    gemm_engine_close(e);
}

/* ---- configuration keys ---------------------------------------------------- */

static int fake_offload_quick(void *self) { (void)self; return 1; }

/* Each key is in one section; a CPU engine uses the engine's and the CPU backend's keys, not
 * the CUDA backend's nor the host path's; a backend that offloads has the host path's too. */
static void test_key_sections(void **st)
{
    (void)st;
    int seen = 0;
    for (const gemm_key_section *s = gemm_engine_keys; s->owner; s++)
        for (const gemm_key *k = s->keys; k->name; k++, seen++)
            for (const gemm_key_section *t = gemm_engine_keys; t->owner; t++)
                for (const gemm_key *l = t->keys; l->name; l++)
                    if (l != k && strcmp(l->name, k->name) == 0) fail_msg("key %s is in two sections", k->name);
    assert_true(seen >= 13);
    gemm_engine *e = open_cpu(1, 4, NULL);
    assert_true(gemm_engine_key_applies(e, "engine"));
    assert_true(gemm_engine_key_applies(e, "cpu"));
    assert_false(gemm_engine_key_applies(e, "cuda"));
    assert_false(gemm_engine_key_applies(e, "host"));
    gemm_engine_close(e);
    gemm_backend be = gemm_backend_cpu;
    be.name = "device";
    be.offload = 1;
    be.quick = fake_offload_quick;
    gemm_engine_err err;
    e = gemm_engine_open_backend(&be, NULL, &err);
    assert_non_null(e);
    assert_true(gemm_engine_key_applies(e, "host"));
    assert_true(gemm_engine_key_applies(e, "device"));
    assert_false(gemm_engine_key_applies(e, "cpu"));
    gemm_engine_close(e);
}

/* ---- the logging hook ------------------------------------------------------ */

typedef struct {
    int calls;
    gemm_log_level level;
    char msg[256];
} log_seen;

static void log_hook(void *user, gemm_log_level level, const char *msg)
{
    log_seen *s = user;
    s->calls++;
    s->level = level;
    snprintf(s->msg, sizeof s->msg, "%s", msg);
}

/* With a hook, every message goes to it with its level (debug included); without one, to
 * stderr as "gemmd engine <level>: <msg>", one line each, debug dropped. */
static void test_log_hook(void **st)
{
    (void)st;
    log_seen seen = {0};
    gemm_engine_set_log(log_hook, &seen);
    gemm_engine_log(GEMM_LOG_WARN, "device %d: %s", 3, "reset");
    assert_int_equal(seen.calls, 1);
    assert_int_equal(seen.level, GEMM_LOG_WARN);
    assert_string_equal(seen.msg, "device 3: reset");
    gemm_engine_log(GEMM_LOG_DEBUG, "detail %s", "x");
    assert_int_equal(seen.calls, 2);
    assert_int_equal(seen.level, GEMM_LOG_DEBUG);
    gemm_engine_set_log(NULL, NULL);

    char path[] = "/tmp/gemm_log_testXXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    fflush(stderr);
    int saved = dup(2);
    assert_true(saved >= 0);
    assert_int_equal(dup2(fd, 2), 2);
    gemm_engine_log(GEMM_LOG_ERROR, "cuda: %s failed", "cudaMalloc");
    gemm_engine_log(GEMM_LOG_DEBUG, "not shown");
    gemm_engine_log(GEMM_LOG_INFO, "second line");
    dup2(saved, 2);
    close(saved);
    char buf[512] = "";
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    close(fd);
    unlink(path);
    assert_true(n > 0);
    buf[n] = '\0';
    assert_string_equal(buf, "gemmd engine error: cuda: cudaMalloc failed\ngemmd engine info: second line\n");
    assert_int_equal(seen.calls, 2); /* the hook is gone */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_state_names),
        cmocka_unit_test(test_open_backends),
        cmocka_unit_test(test_submit_validation),
        cmocka_unit_test(test_queue_full_cancel_close),
        cmocka_unit_test(test_close_lets_running_finish),
        cmocka_unit_test(test_cancel_running),
        cmocka_unit_test(test_cancel_running_then_queue_runs),
        cmocka_unit_test(test_many_submitters),
        cmocka_unit_test(test_done_may_free),
        cmocka_unit_test(test_healthy_lost),
        cmocka_unit_test(test_key_sections),
        cmocka_unit_test(test_log_hook),
    };
    return cmocka_run_group_tests_name("engine", tests, NULL, NULL);
}
