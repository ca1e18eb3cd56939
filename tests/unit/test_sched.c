/*
 * test_sched.c - which worker takes a job (docs/KERNELS.md, "The engine around the kernels"), with a
 * backend of the test's own: workers on several device slots, a run() that records the
 * slot it ran on and holds until the test opens a gate, and slots the test marks lost.
 *
 * Checked here: on an idle engine, jobs spread one per slot before any slot takes a
 * second (least-loaded, not whichever worker wakes first); with every worker busy, the
 * next job goes to the slot that frees a worker; a lost slot's workers take nothing while
 * another slot can run the job (the job waits for it) and the job runs there; with every
 * slot lost the jobs are still taken (the backend answers them) rather than left queued;
 * slot_busy in the stats; many jobs from several threads over slots that are lost and
 * found again, every one done exactly once (no lost wake-up leaves one queued).
 *
 * Deterministic without timing: the test waits on the backend's own counters (jobs that
 * entered run()), never on sleeps.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"

#define MAX_SLOTS 4

/* ---- the test's backend ---------------------------------------------------- */

typedef struct {
    int nslots, per_slot;
    atomic_int lost[MAX_SLOTS];
    pthread_mutex_t mu;
    pthread_cond_t cv;   /* entered / gate changed */
    int gate_open;
    int entered;         /* jobs that entered run() */
    int running[MAX_SLOTS];
    int ran[MAX_SLOTS];  /* jobs run per slot */
} fake;

static fake F;

typedef struct {
    int slot;
} fake_worker;

static void *fake_open(const gemm_engine_config *cfg, gemm_engine_err *err)
{
    (void)cfg, (void)err;
    return &F;
}
static int fake_workers(void *self)
{
    fake *f = self;
    return f->nslots * f->per_slot;
}
static int fake_worker_slot(void *self, int i)
{
    fake *f = self;
    return i % f->nslots;
}
static int fake_slot_usable(void *self, int slot)
{
    fake *f = self;
    return !atomic_load(&f->lost[slot]);
}
static void *fake_worker_init(void *self, int i)
{
    fake_worker *w = calloc(1, sizeof *w);
    assert_non_null(w);
    w->slot = fake_worker_slot(self, i);
    return w;
}
static void fake_worker_fini(void *self, void *worker)
{
    (void)self;
    free(worker);
}
static int fake_run(void *self, void *worker, gemm_job *job)
{
    fake *f = self;
    fake_worker *w = worker;
    snprintf(job->device, sizeof job->device, "slot%d", w->slot);
    job->stream = w->slot;
    pthread_mutex_lock(&f->mu);
    f->entered++;
    f->running[w->slot]++;
    f->ran[w->slot]++;
    pthread_cond_broadcast(&f->cv);
    while (!f->gate_open) pthread_cond_wait(&f->cv, &f->mu);
    f->running[w->slot]--;
    int lost = atomic_load(&f->lost[w->slot]);
    pthread_mutex_unlock(&f->mu);
    if (lost) return gemm_engine_err_set(&job->err, GEMM_E_DEVICE_LOST, "slot %d is lost", w->slot);
    return 0;
}
static void fake_close(void *self)
{
    (void)self;
}

static const gemm_backend fake_backend = {
    .name = "fake",
    .open = fake_open,
    .workers = fake_workers,
    .worker_init = fake_worker_init,
    .worker_fini = fake_worker_fini,
    .run = fake_run,
    .close = fake_close,
    .worker_slot = fake_worker_slot,
    .slot_usable = fake_slot_usable,
};

/* ---- jobs ------------------------------------------------------------------ */

typedef struct {
    gemm_job job;
    float a, b, c;
    atomic_int calls;
} tjob;

static atomic_int done_total;

static void tjob_done(gemm_job *job)
{
    tjob *t = job->user;
    atomic_fetch_add(&t->calls, 1);
    atomic_fetch_add(&done_total, 1);
}

static void tjob_init(tjob *t)
{
    memset(t, 0, sizeof *t);
    t->job.dtype = GEMM_DTYPE_F32;
    t->job.m = t->job.k = t->job.n = 1;
    t->job.a = &t->a, t->job.b = &t->b, t->job.c = &t->c;
    t->job.done = tjob_done;
    t->job.user = t;
    atomic_init(&t->calls, 0);
}

static gemm_engine *open_fake(int nslots, int per_slot)
{
    pthread_mutex_lock(&F.mu);
    F.nslots = nslots, F.per_slot = per_slot;
    F.gate_open = 0;
    F.entered = 0;
    memset(F.running, 0, sizeof F.running);
    memset(F.ran, 0, sizeof F.ran);
    pthread_mutex_unlock(&F.mu);
    for (int i = 0; i < MAX_SLOTS; i++) atomic_store(&F.lost[i], 0);
    atomic_store(&done_total, 0);
    gemm_engine_config cfg;
    gemm_engine_config_defaults(&cfg);
    cfg.queue_depth = 4096;
    cfg.batch_max = 1;
    gemm_engine_err err;
    gemm_engine *e = gemm_engine_open_backend(&fake_backend, &cfg, &err);
    assert_non_null(e);
    return e;
}

static void wait_entered(int n)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 30;
    pthread_mutex_lock(&F.mu);
    while (F.entered < n)
        if (pthread_cond_timedwait(&F.cv, &F.mu, &until) != 0) break;
    int got = F.entered;
    pthread_mutex_unlock(&F.mu);
    assert_int_equal(got, n);
}

static void open_gate(void)
{
    pthread_mutex_lock(&F.mu);
    F.gate_open = 1;
    pthread_cond_broadcast(&F.cv);
    pthread_mutex_unlock(&F.mu);
}

static void wait_done(int n)
{
    for (int i = 0; i < 30000 && atomic_load(&done_total) < n; i++) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(atomic_load(&done_total), n);
}

static void submit_ok(gemm_engine *e, tjob *t)
{
    gemm_engine_err err;
    assert_int_equal(gemm_engine_submit(e, &t->job, &err), 0);
}

/* ---- tests ----------------------------------------------------------------- */

/* Two slots of four workers each, idle: four jobs run two per slot, never three on one. */
static void test_spread_over_idle_slots(void **state)
{
    (void)state;
    gemm_engine *e = open_fake(2, 4);
    tjob t[4];
    for (int i = 0; i < 4; i++) {
        tjob_init(&t[i]);
        submit_ok(e, &t[i]);
        wait_entered(i + 1); /* one at a time: each sees the load the previous left */
    }
    pthread_mutex_lock(&F.mu);
    assert_int_equal(F.running[0], 2);
    assert_int_equal(F.running[1], 2);
    pthread_mutex_unlock(&F.mu);
    gemm_engine_stats st;
    gemm_engine_get_stats(e, &st);
    assert_int_equal(st.nslots, 2);
    assert_int_equal(st.slot_busy[0], 2);
    assert_int_equal(st.slot_busy[1], 2);
    open_gate();
    wait_done(4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(atomic_load(&t[i].calls), 1);
        assert_int_equal(atomic_load(&t[i].job.state), GEMM_JOB_DONE);
    }
    gemm_engine_close(e);
}

/* Three slots, jobs submitted in a burst (no waiting between them): still one per slot. */
static void test_burst_spreads(void **state)
{
    (void)state;
    gemm_engine *e = open_fake(3, 2);
    tjob t[3];
    for (int i = 0; i < 3; i++) {
        tjob_init(&t[i]);
        submit_ok(e, &t[i]);
    }
    wait_entered(3);
    pthread_mutex_lock(&F.mu);
    for (int s = 0; s < 3; s++) assert_int_equal(F.running[s], 1);
    pthread_mutex_unlock(&F.mu);
    open_gate();
    wait_done(3);
    gemm_engine_close(e);
}

/* Slot 1 lost: its workers take nothing; a third job waits for slot 0 rather than
 * failing on slot 1, and runs there once slot 0 frees a worker. */
static void test_lost_slot_takes_nothing(void **state)
{
    (void)state;
    gemm_engine *e = open_fake(2, 2);
    atomic_store(&F.lost[1], 1);
    tjob t[3];
    for (int i = 0; i < 3; i++) {
        tjob_init(&t[i]);
        submit_ok(e, &t[i]);
    }
    wait_entered(2);
    gemm_engine_stats st;
    gemm_engine_get_stats(e, &st);
    assert_int_equal(st.queued, 1); /* the third waits: slot 0's two workers are busy */
    pthread_mutex_lock(&F.mu);
    assert_int_equal(F.running[0], 2);
    assert_int_equal(F.ran[1], 0);
    pthread_mutex_unlock(&F.mu);
    open_gate();
    wait_done(3);
    pthread_mutex_lock(&F.mu);
    assert_int_equal(F.ran[0], 3);
    assert_int_equal(F.ran[1], 0);
    pthread_mutex_unlock(&F.mu);
    for (int i = 0; i < 3; i++) assert_int_equal(atomic_load(&t[i].job.state), GEMM_JOB_DONE);
    gemm_engine_close(e);
}

/* Every slot lost: jobs are still taken and answered (with the backend's error), not
 * left in the queue forever. */
static void test_all_lost_still_answers(void **state)
{
    (void)state;
    gemm_engine *e = open_fake(2, 1);
    atomic_store(&F.lost[0], 1);
    atomic_store(&F.lost[1], 1);
    open_gate();
    tjob t[5];
    for (int i = 0; i < 5; i++) {
        tjob_init(&t[i]);
        submit_ok(e, &t[i]);
    }
    wait_done(5);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(atomic_load(&t[i].job.state), GEMM_JOB_FAILED);
        assert_int_equal(t[i].job.err.code, GEMM_E_DEVICE_LOST);
    }
    gemm_engine_close(e);
}

/* All workers busy: the next job goes to whichever slot frees a worker first. */
static void test_next_job_to_freed_slot(void **state)
{
    (void)state;
    gemm_engine *e = open_fake(2, 1);
    tjob t[3];
    for (int i = 0; i < 2; i++) {
        tjob_init(&t[i]);
        submit_ok(e, &t[i]);
    }
    wait_entered(2);
    tjob_init(&t[2]);
    submit_ok(e, &t[2]);
    gemm_engine_stats st;
    gemm_engine_get_stats(e, &st);
    assert_int_equal(st.queued, 1);
    open_gate();
    wait_done(3);
    pthread_mutex_lock(&F.mu);
    assert_int_equal(F.ran[0] + F.ran[1], 3);
    pthread_mutex_unlock(&F.mu);
    gemm_engine_close(e);
}

/* Many jobs from several threads while slots are lost and found again: every job is
 * done exactly once and none is left queued. */
#define STRESS_THREADS 4
#define STRESS_JOBS 3000

static gemm_engine *stress_engine;

static void *stress_submitter(void *arg)
{
    tjob *t = arg;
    for (int i = 0; i < STRESS_JOBS; i++) {
        tjob_init(&t[i]);
        gemm_engine_err err;
        while (gemm_engine_submit(stress_engine, &t[i].job, &err) != 0) {
            assert_int_equal(err.code, GEMM_E_QUEUE_FULL); /* try again */
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
    }
    return NULL;
}

static void test_stress_no_lost_wakeup(void **state)
{
    (void)state;
    stress_engine = open_fake(3, 2);
    open_gate();
    tjob *t = calloc((size_t)STRESS_THREADS * STRESS_JOBS, sizeof *t);
    assert_non_null(t);
    pthread_t th[STRESS_THREADS];
    for (int i = 0; i < STRESS_THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, stress_submitter, t + (size_t)i * STRESS_JOBS), 0);
    /* Slots come and go while the jobs flow (one always usable at the end). */
    for (int r = 0; r < 200; r++) {
        atomic_store(&F.lost[r % 3], r % 2);
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
    for (int s = 0; s < 3; s++) atomic_store(&F.lost[s], 0);
    /* A lost slot coming back wakes nobody by itself: the next submit or finish does. */
    for (int i = 0; i < STRESS_THREADS; i++) pthread_join(th[i], NULL);
    tjob last;
    tjob_init(&last);
    submit_ok(stress_engine, &last);
    wait_done(STRESS_THREADS * STRESS_JOBS + 1);
    for (size_t i = 0; i < (size_t)STRESS_THREADS * STRESS_JOBS; i++) assert_int_equal(atomic_load(&t[i].calls), 1);
    gemm_engine_stats st;
    gemm_engine_get_stats(stress_engine, &st);
    assert_int_equal(st.queued, 0);
    assert_int_equal(st.completed + st.failed, (uint64_t)STRESS_THREADS * STRESS_JOBS + 1);
    gemm_engine_close(stress_engine);
    free(t);
}

int main(void)
{
    pthread_mutex_init(&F.mu, NULL);
    pthread_cond_init(&F.cv, NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spread_over_idle_slots),
        cmocka_unit_test(test_burst_spreads),
        cmocka_unit_test(test_lost_slot_takes_nothing),
        cmocka_unit_test(test_all_lost_still_answers),
        cmocka_unit_test(test_next_job_to_freed_slot),
        cmocka_unit_test(test_stress_no_lost_wakeup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
