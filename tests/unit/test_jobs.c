/*
 * test_jobs.c - the asynchronous job store over the real CPU engine: ids, results,
 * inputs freed when done, the caps on memory and count, TTL expiry, DELETE of queued and
 * finished jobs, readers keeping a deleted entry alive, failed submits, shutdown, owners,
 * the sweeper thread, the state a job reads as while its done() runs, and many threads at
 * once. Leaks and use-after-free show under `make test-san`.
 *
 * Jobs are held queued without timing: a "gate" job submitted straight to the engine
 * blocks the single worker in its done() until the test opens the gate. A job is held at
 * the critical point of its own completion (the engine has stored its final state, the
 * store has not seen it yet) by the store's done hook, which blocks the same way.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "jobs.c" /* the store under test, and its entries' states (counts below) */

/* Any owner's job; entries kept, by state, and how many and how many bytes in all. */
#define gemmd_jobs_get(s, id) gemmd_jobs_get_owned((s), (id), GEMMD_OWNER_ANY)
#define gemmd_jobs_delete(s, id) gemmd_jobs_delete_owned((s), (id), GEMMD_OWNER_ANY)
#define gemmd_jobs_abandon gemmd_jobs_put /* an entry reserved, not submitted */
static void gemmd_jobs_counts(gemmd_jobs *s, int counts[5], int *kept, uint64_t *bytes)
{
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < 5; i++) counts[i] = 0;
    int n = 0;
    for (gemmd_job_entry *j = s->head; j; j = j->next, n++) counts[state_locked(j)]++;
    if (kept) *kept = n;
    if (bytes) *bytes = s->mem_used;
    pthread_mutex_unlock(&s->mu);
}

/* ---- helpers ------------------------------------------------------------- */

static gemm_engine *open_engine(int queue_depth)
{
    gemm_engine_config cfg;
    gemm_engine_config_defaults(&cfg);
    snprintf(cfg.backend, sizeof cfg.backend, "cpu");
    cfg.cpu_workers = 1;
    cfg.threads = 1;
    cfg.queue_depth = queue_depth;
    gemm_engine_err err;
    gemm_engine *e = gemm_engine_open(&cfg, &err);
    assert_non_null(e);
    return e;
}

typedef struct {
    gemm_job job;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open, entered;
} gate;

static void gate_done(gemm_job *job)
{
    gate *g = job->user;
    pthread_mutex_lock(&g->mu);
    g->entered = 1;
    pthread_cond_broadcast(&g->cv);
    while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

/* Occupies the engine's only worker until gate_open(). */
static void gate_close(gemm_engine *e, gate *g)
{
    memset(g, 0, sizeof *g);
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->job.dtype = GEMM_DTYPE_I32;
    g->job.m = g->job.k = g->job.n = 1;
    /* the CPU engine's memory is plain host memory: freed after the engine closes */
    g->job.a = gemm_alloc(&gemm_allocator_host, 4);
    g->job.b = gemm_alloc(&gemm_allocator_host, 4);
    g->job.c = gemm_alloc(&gemm_allocator_host, 4);
    memset(g->job.a, 0, 4);
    memset(g->job.b, 0, 4);
    snprintf(g->job.kernel, sizeof g->job.kernel, "auto");
    g->job.done = gate_done;
    g->job.user = g;
    gemm_engine_err err;
    assert_int_equal(gemm_engine_submit(e, &g->job, &err), 0);
    pthread_mutex_lock(&g->mu);
    while (!g->entered) pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void gate_open(gemm_engine *e, gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->open = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    /* The gate job's buffers are freed once the engine is done with it (at close). */
    (void)e;
}

static void gate_free(gate *g)
{
    gemm_free(&gemm_allocator_host, g->job.a);
    gemm_free(&gemm_allocator_host, g->job.b);
    gemm_free(&gemm_allocator_host, g->job.c);
}

/* An int32 m x k . k x n job with A[i][j] = i + 2j + seed, B[i][j] = 3i - j + seed. */
static gemmd_job_entry *make_job(gemm_engine *e, gemmd_jobs *s, uint64_t m, uint64_t k, uint64_t n, int seed,
                                 gemm_err *err)
{
    gemmd_job_entry *j = gemmd_jobs_reserve(s, 0, (m * k + k * n) * 4, m * n * 4, err);
    if (!j) return NULL;
    j->job.dtype = GEMM_DTYPE_I32;
    j->job.m = m;
    j->job.k = k;
    j->job.n = n;
    int32_t *a = gemm_engine_host_alloc(e, m * k * 4);
    int32_t *b = gemm_engine_host_alloc(e, k * n * 4);
    j->job.c = gemm_engine_host_alloc(e, m * n * 4);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(j->job.c);
    for (uint64_t i = 0; i < m; i++)
        for (uint64_t q = 0; q < k; q++) a[i * k + q] = (int32_t)(i + 2 * q) + seed;
    for (uint64_t i = 0; i < k; i++)
        for (uint64_t q = 0; q < n; q++) b[i * n + q] = (int32_t)(3 * i) - (int32_t)q + seed;
    j->job.a = a;
    j->job.b = b;
    snprintf(j->job.kernel, sizeof j->job.kernel, "auto");
    return j;
}

static int64_t ref_elem(uint64_t i, uint64_t q, uint64_t k, int seed)
{
    int64_t sum = 0;
    for (uint64_t p = 0; p < k; p++) sum += ((int64_t)i + 2 * (int64_t)p + seed) * (3 * (int64_t)p - (int64_t)q + seed);
    return sum;
}

static void wait_finished(gemmd_jobs *s, gemmd_job_entry *j, gemmd_job_view *v)
{
    for (;;) {
        gemmd_jobs_view(s, j, v);
        if (v->finished) return;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

/* The daemon's order: refuse and cancel, let running work finish, free the store
 * (its buffers go back through the engine), close the engine. */
static void close_all(gemm_engine *e, gemmd_jobs *s)
{
    gemmd_jobs_shutdown(s);
    for (;;) {
        gemm_engine_stats st;
        gemm_engine_get_stats(e, &st);
        if (st.queued == 0 && st.running == 0) break;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    gemmd_jobs_free(s);
    gemm_engine_close(e);
}

/* ---- tests ----------------------------------------------------------------- */

static void test_ids_are_random_hex(void **state)
{
    (void)state;
    gemm_engine *e = open_engine(8);
    gemmd_jobs *s = gemmd_jobs_new(e, NULL, NULL, 600, 1 << 20, 16, 100);
    gemm_err err;
    gemmd_job_entry *j1 = gemmd_jobs_reserve(s, 0, 0, 16, &err);
    gemmd_job_entry *j2 = gemmd_jobs_reserve(s, 0, 0, 16, &err);
    assert_non_null(j1);
    assert_non_null(j2);
    /* no instance_id set in this process: the 32 hex digits alone */
    assert_int_equal(strlen(j1->id), GEMMD_ID_RANDOM_HEX);
    assert_int_equal(strspn(j1->id, "0123456789abcdef"), GEMMD_ID_RANDOM_HEX);
    assert_string_not_equal(j1->id, j2->id);
    /* reserved but not submitted: not listed */
    assert_null(gemmd_jobs_get(s, j1->id));
    gemmd_jobs_abandon(s, j1);
    gemmd_jobs_abandon(s, j2);
    close_all(e, s);
}

static void test_result_and_inputs_freed(void **state)
{
    (void)state;
    gemm_engine *e = open_engine(8);
    gemmd_jobs *s = gemmd_jobs_new(e, NULL, NULL, 600, 1 << 20, 16, 100);
    gemm_err err;
    gemmd_job_entry *j = make_job(e, s, 5, 7, 3, 1, &err);
    assert_non_null(j);
    char id[GEMMD_JOB_ID_LEN + 1];
    strcpy(id, j->id);
    assert_int_equal(gemmd_jobs_submit(s, j, &err), 0);

    gemmd_job_entry *g = gemmd_jobs_get(s, id);
    assert_non_null(g);
    gemmd_job_view v;
    wait_finished(s, g, &v);
    assert_int_equal(v.state, GEMM_JOB_DONE);
    assert_string_equal(v.id, id);
    assert_int_equal(v.m, 5);
    assert_int_equal(v.n, 3);
    assert_null(g->job.a); /* inputs go as soon as the product is done */
    assert_null(g->job.b);
    const int32_t *c = g->job.c;
    assert_non_null(c);
    for (uint64_t i = 0; i < 5; i++)
        for (uint64_t q = 0; q < 3; q++) assert_int_equal(c[i * 3 + q], (int32_t)ref_elem(i, q, 7, 1));
    int counts[5], kept;
    uint64_t bytes;
    gemmd_jobs_counts(s, counts, &kept, &bytes);
    assert_int_equal(kept, 1);
    assert_int_equal(counts[GEMM_JOB_DONE], 1);
    assert_int_equal(bytes, 5 * 3 * 4);
    gemmd_jobs_put(s, g);
    close_all(e, s);
}

static void test_memory_cap(void **state)
{
    (void)state;
    gemm_engine *e = open_engine(8);
    gemmd_jobs *s = gemmd_jobs_new(e, NULL, NULL, 600, 100, 16, 100);
    gemm_err err;
    gemmd_job_entry *j1 = gemmd_jobs_reserve(s, 0, 0, 64, &err);
    assert_non_null(j1);
    assert_null(gemmd_jobs_reserve(s, 0, 0, 64, &err));
    assert_int_equal(err.status, 503);
    assert_string_equal(err.code, "job_store_full");
    assert_null(gemmd_jobs_reserve(s, 0, 0, 101, &err)); /* could never fit */
    assert_int_equal(err.status, 413);
    assert_string_equal(err.code, "too_large");
    gemmd_job_entry *j2 = gemmd_jobs_reserve(s, 0, 0, 36, &err); /* exactly what is left */
    assert_non_null(j2);
    gemmd_jobs_abandon(s, j1);
    j1 = gemmd_jobs_reserve(s, 0, 0, 64, &err); /* given back */
    assert_non_null(j1);
    gemmd_jobs_abandon(s, j1);
    gemmd_jobs_abandon(s, j2);
    close_all(e, s);
}

/* job_mem_mb holds the inputs of queued jobs as well as results: a queued job's A and B
 * are reserved until its product is done, then only C stays. */
static void test_inputs_count_until_done(void **state)
{
    (void)state;
    gemm_engine *e = open_engine(8);
    /* 8x8 int32: A and B 512 bytes together, C 256 */
    gemmd_jobs *s = gemmd_jobs_new(e, NULL, NULL, 600, 1100, 16, 100);
    gate g;
    gate_close(e, &g);
    gemm_err err;
    gemmd_job_entry *j1 = make_job(e, s, 8, 8, 8, 1, &err);
    assert_non_null(j1);
    char id[GEMMD_JOB_ID_LEN + 1];
    strcpy(id, j1->id);
    assert_int_equal(gemmd_jobs_submit(s, j1, &err), 0);
    int counts[5], kept;
    uint64_t bytes;
    gemmd_jobs_counts(s, counts, &kept, &bytes);
    assert_int_equal(counts[GEMM_JOB_QUEUED], 1);
    assert_int_equal(bytes, 768); /* queued: inputs and result */
    /* a second one (768 more) does not fit in 1100 while the first is queued */
    assert_null(gemmd_jobs_reserve(s, 0, 512, 256, &err));
    assert_int_equal(err.status, 503);
    assert_string_equal(err.code, "job_store_full");
    assert_non_null(strstr(err.message, "inputs"));
    /* inputs alone over the cap: 413 */
    assert_null(gemmd_jobs_reserve(s, 0, 1100, 1, &err));
    assert_int_equal(err.status, 413);
    gate_open(e, &g);
    gemmd_job_entry *x = gemmd_jobs_get(s, id);
    assert_non_null(x);
    gemmd_job_view v;
    wait_finished(s, x, &v);
    gemmd_jobs_put(s, x);
    assert_int_equal(v.state, GEMM_JOB_DONE);
    gemmd_jobs_counts(s, counts, &kept, &bytes);
    assert_int_equal(bytes, 256); /* done: the result only */
    gemmd_job_entry *j2 = gemmd_jobs_reserve(s, 0, 512, 256, &err); /* now it fits */
    assert_non_null(j2);
    gemmd_jobs_abandon(s, j2);
    close_all(e, s);
    gate_free(&g);
}

static void test_count_cap_and_delete_frees_room(void **state)
{
    (void)state;
    gemm_engine *e = open_engine(8);
    gemmd_jobs *s = gemmd_jobs_new(e, NULL, NULL, 600, 1 << 20, 2, 100);
    gemm_err err;
    char ids[2][GEMMD_JOB_ID_LEN + 1];
    for (int i = 0; i < 2; i++) {
        gemmd_job_entry *j = make_job(e, s, 2, 2, 2, i, &err);
        assert_non_null(j);
        strcpy(ids[i], j->id);
        assert_int_equal(gemmd_jobs_submit(s, j, &err), 0);
    }
    assert_null(gemmd_jobs_reserve(s, 0, 0, 16, &err));
    assert_string_equal(err.code, "job_store_full");
    /* wait for the first to finish, then forget it */
    gemmd_job_entry *g = gemmd_jobs_get(s, ids[0]);
    gemmd_job_view v;
    wait_finished(s, g, &v);
    gemmd_jobs_put(s, g);
    assert_int_equal(gemmd_jobs_delete(s, ids[0]), 0);
    assert_null(gemmd_jobs_get(s, ids[0]));
    assert_int_equal(gemmd_jobs_delete(s, ids[0]), -1);
    gemmd_job_entry *j = gemmd_jobs_reserve(s, 0, 0, 16, &err);
    assert_non_null(j);
    gemmd_jobs_abandon(s, j);
    close_all(e, s);
}

static void test_delete_queued_job(void **state)
{
    (void)state;
    gemm_engine *e = open_engine(8);
    gemmd_jobs *s = gemmd_jobs_new(e, NULL, NULL, 600, 1 << 20, 16, 100);
    gate g;
    gate_close(e, &g);
    gemm_err err;
    gemmd_job_entry *j = make_job(e, s, 3, 3, 3, 0, &err);
    char id[GEMMD_JOB_ID_LEN + 1];
    strcpy(id, j->id);
    assert_int_equal(gemmd_jobs_submit(s, j, &err), 0);

    gemmd_job_entry *r = gemmd_jobs_get(s, id);
    gemmd_job_view v;
    gemmd_jobs_view(s, r, &v);
    assert_int_equal(v.state, GEMM_JOB_QUEUED);
    assert_false(v.finished);
    int counts[5], kept;
    gemmd_jobs_counts(s, counts, &kept, NULL);
    assert_int_equal(counts[GEMM_JOB_QUEUED], 1);

    assert_int_equal(gemmd_jobs_delete(s, id), 0); /* cancelled: done() ran on this thread */
    gemmd_jobs_view(s, r, &v);                      /* our reference keeps it readable */
    assert_true(v.finished);
    assert_int_equal(v.state, GEMM_JOB_CANCELLED);
    assert_null(r->job.c); /* a cancelled job keeps no result */
    assert_null(gemmd_jobs_get(s, id));
    gemmd_jobs_put(s, r); /* the last reference: freed here */
    gemmd_jobs_counts(s, counts, &kept, NULL);
    assert_int_equal(kept, 0);

    gate_open(e, &g);
    close_all(e, s);
    gate_free(&g);
}

static void test_reader_keeps_deleted_result(void **state)
{
    (void)state;
    gemm_engine *e = open_engine(8);
    gemmd_jobs *s = gemmd_jobs_new(e, NULL, NULL, 600, 1 << 20, 16, 100);
    gemm_err err;
    gemmd_job_entry *j = make_job(e, s, 4, 4, 4, 3, &err);
    char id[GEMMD_JOB_ID_LEN + 1];
    strcpy(id, j->id);
    assert_int_equal(gemmd_jobs_submit(s, j, &err), 0);
    gemmd_job_entry *r = gemmd_jobs_get(s, id);
    gemmd_job_view v;
    wait_finished(s, r, &v);
    assert_int_equal(gemmd_jobs_delete(s, id), 0);
    /* still readable through the reference (ASan would flag a use after free) */
    const int32_t *c = r->job.c;
    assert_int_equal(c[5], (int32_t)ref_elem(1, 1, 4, 3));
    gemmd_jobs_put(s, r);
    close_all(e, s);
}

/* Polls the counts (which never sweep) until nothing is kept, for at most 30 s. */
static int wait_kept_zero(gemmd_jobs *s, uint64_t *bytes)
{
    for (int i = 0; i < 30000; i++) {
        int counts[5], kept;
        gemmd_jobs_counts(s, counts, &kept, bytes);
        if (kept == 0) return 1;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

static void test_ttl_expiry(void **state)
{
    (void)state;
    gemm_engine *e = open_engine(8);
    gemmd_jobs *s = gemmd_jobs_new(e, NULL, NULL, 0, 1 << 20, 16, 100); /* finished jobs expire at once */
    gate g;
    gate_close(e, &g); /* keeps the job queued, so it is surely listed below */
    gemm_err err;
    gemmd_job_entry *j = make_job(e, s, 2, 2, 2, 0, &err);
    char id[GEMMD_JOB_ID_LEN + 1];
    strcpy(id, j->id);
    assert_int_equal(gemmd_jobs_submit(s, j, &err), 0);
    gemmd_job_entry *r = gemmd_jobs_get(s, id);
    assert_non_null(r); /* queued: listed */
    gate_open(e, &g);
    gemmd_job_view v;
    wait_finished(s, r, &v); /* our reference keeps it readable even once swept */
    assert_int_equal(v.state, GEMM_JOB_DONE);
    gemmd_jobs_put(s, r);
    uint64_t bytes = 1;
    assert_true(wait_kept_zero(s, &bytes)); /* the sweeper forgot it: no sweeping call was made */
    assert_int_equal(bytes, 0);
    assert_null(gemmd_jobs_get(s, id));
    close_all(e, s);
    gate_free(&g);
}

/* With a TTL of a second and no call that sweeps (counts and views never do), the
 * sweeper thread alone frees the result once it expires. */
static void test_sweeper_frees_without_calls(void **state)
{
    (void)state;
    gemm_engine *e = open_engine(8);
    gemmd_jobs *s = gemmd_jobs_new(e, NULL, NULL, 1, 1 << 20, 16, 100);
    gemm_err err;
    gemmd_job_entry *j = make_job(e, s, 8, 8, 8, 0, &err);
    assert_non_null(j);
    assert_int_equal(gemmd_jobs_submit(s, j, &err), 0);
    uint64_t bytes = 1;
    assert_true(wait_kept_zero(s, &bytes));
    assert_int_equal(bytes, 0);
    close_all(e, s);
}

/* ---- the done hook: a job held at the critical point of its completion ------------- */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int entered, open;
    int engine_state;  /* the engine's state of the job seen inside the hook */
    int make_cancelled; /* turn the job into one the engine stopped at a stage boundary */
} done_gate;

static void done_gate_init(done_gate *d)
{
    memset(d, 0, sizeof *d);
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
}

static void done_gate_hook(gemmd_job_entry *j, void *arg)
{
    done_gate *d = arg;
    pthread_mutex_lock(&d->mu);
    d->engine_state = atomic_load(&j->job.state);
    if (d->make_cancelled) { /* what an engine that honours cancel_requested stores */
        gemm_engine_err_clear(&j->job.err);
        atomic_store(&j->job.state, GEMM_JOB_CANCELLED);
    }
    d->entered = 1;
    pthread_cond_broadcast(&d->cv);
    while (!d->open) pthread_cond_wait(&d->cv, &d->mu);
    pthread_mutex_unlock(&d->mu);
}

static void done_gate_wait_entered(done_gate *d)
{
    pthread_mutex_lock(&d->mu);
    while (!d->entered) pthread_cond_wait(&d->cv, &d->mu);
    pthread_mutex_unlock(&d->mu);
}

static void done_gate_open(done_gate *d)
{
    pthread_mutex_lock(&d->mu);
    d->open = 1;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

/* Submits one 4x4x4 job whose done() blocks in the hook; returns it with a reference. */
static gemmd_job_entry *held_job(gemm_engine *e, gemmd_jobs *s, done_gate *d)
{
    done_gate_init(d);
    gemmd_jobs_set_done_hook(s, done_gate_hook, d);
    gemm_err err;
    gemmd_job_entry *j = make_job(e, s, 4, 4, 4, 5, &err);
    assert_non_null(j);
    char id[GEMMD_JOB_ID_LEN + 1];
    strcpy(id, j->id);
    assert_int_equal(gemmd_jobs_submit(s, j, &err), 0);
    gemmd_job_entry *r = gemmd_jobs_get(s, id);
    assert_non_null(r); /* listed: its done() cannot have finished yet */
    done_gate_wait_entered(d);
    return r;
}

/* The engine stores DONE before it calls done(); in between, the job must not read done
 * (a client would then get 409 from the result): state and finished change together. */
static void test_state_and_finished_change_together(void **state)
{
    (void)state;
    gemm_engine *e = open_engine(8);
    gemmd_jobs *s = gemmd_jobs_new(e, NULL, NULL, 600, 1 << 20, 16, 100);
    done_gate d;
    gemmd_job_entry *r = held_job(e, s, &d);
    /* Look, then let the worker go before checking: a failed check must not leave it
     * blocked (the program would hang instead of failing). */
    gemmd_job_view held;
    gemmd_jobs_view(s, r, &held);
    int counts[5], kept;
    gemmd_jobs_counts(s, counts, &kept, NULL);
    done_gate_open(&d);
    assert_int_equal(d.engine_state, GEMM_JOB_DONE); /* the engine said done ... */
    assert_false(held.finished);                     /* ... the store had not seen it: */
    assert_int_equal(held.state, GEMM_JOB_RUNNING);  /* it read running, not done */
    assert_int_equal(counts[GEMM_JOB_DONE], 0);
    assert_int_equal(counts[GEMM_JOB_RUNNING], 1);

    gemmd_job_view v;
    wait_finished(s, r, &v);
    assert_true(v.finished);
    assert_int_equal(v.state, GEMM_JOB_DONE);
    const int32_t *c = r->job.c;
    assert_non_null(c);
    assert_int_equal(c[6], (int32_t)ref_elem(1, 2, 4, 5));
    gemmd_jobs_put(s, r);
    close_all(e, s);
}

/* DELETE of a job on a worker asks the engine to cancel it (cancel_requested), unlists it
 * at once, and the entry goes when its done() comes. */
static void test_delete_running_asks_engine(void **state)
{
    (void)state;
    gemm_engine *e = open_engine(8);
    gemmd_jobs *s = gemmd_jobs_new(e, NULL, NULL, 600, 1 << 20, 16, 100);
    done_gate d;
    gemmd_job_entry *r = held_job(e, s, &d);
    char id[GEMMD_JOB_ID_LEN + 1];
    strcpy(id, r->id);
    int deleted = gemmd_jobs_delete(s, id);
    int asked = atomic_load(&r->job.cancel_requested);
    gemmd_job_entry *again = gemmd_jobs_get(s, id);
    done_gate_open(&d);
    assert_int_equal(deleted, 0);
    assert_int_equal(asked, 1);
    assert_null(again);
    gemmd_job_view v;
    wait_finished(s, r, &v);
    gemmd_jobs_put(s, r); /* the last reference */
    uint64_t bytes = 1;
    assert_true(wait_kept_zero(s, &bytes));
    assert_int_equal(bytes, 0);
    close_all(e, s);
}

/* A job the engine stopped while it ran (state CANCELLED after RUNNING) is kept as
 * cancelled with an error, its result memory given back. */
static void test_cancelled_after_running(void **state)
{
    (void)state;
    gemm_engine *e = open_engine(8);
    gemmd_jobs *s = gemmd_jobs_new(e, NULL, NULL, 600, 1 << 20, 16, 100);
    done_gate d;
    done_gate_init(&d);
    d.make_cancelled = 1;
    gemmd_jobs_set_done_hook(s, done_gate_hook, &d);
    gemm_err err;
    gemmd_job_entry *j = make_job(e, s, 4, 4, 4, 5, &err);
    char id[GEMMD_JOB_ID_LEN + 1];
    strcpy(id, j->id);
    assert_int_equal(gemmd_jobs_submit(s, j, &err), 0);
    gemmd_job_entry *r = gemmd_jobs_get(s, id);
    assert_non_null(r);
    done_gate_open(&d);
    gemmd_job_view v;
    wait_finished(s, r, &v);
    assert_int_equal(v.state, GEMM_JOB_CANCELLED);
    assert_int_equal(v.err.status, 409);
    assert_string_equal(v.err.code, "cancelled");
    assert_null(r->job.c);
    assert_null(r->job.a);
    int counts[5], kept;
    uint64_t bytes;
    gemmd_jobs_counts(s, counts, &kept, &bytes);
    assert_int_equal(kept, 1);
    assert_int_equal(counts[GEMM_JOB_CANCELLED], 1);
    assert_int_equal(bytes, 0);
    gemmd_jobs_put(s, r);
    close_all(e, s);
}

/* Shutdown asks the engine to stop a running job too: nobody could fetch its result. */
static void test_shutdown_asks_running_to_stop(void **state)
{
    (void)state;
    gemm_engine *e = open_engine(8);
    gemmd_jobs *s = gemmd_jobs_new(e, NULL, NULL, 600, 1 << 20, 16, 100);
    done_gate d;
    gemmd_job_entry *r = held_job(e, s, &d);
    gemmd_jobs_shutdown(s);
    int asked = atomic_load(&r->job.cancel_requested);
    done_gate_open(&d);
    assert_int_equal(asked, 1);
    gemmd_jobs_put(s, r);
    close_all(e, s);
}

/* Another owner finds nothing (not even that the job exists) and cannot delete it. */
static void test_owner(void **state)
{
    (void)state;
    gemm_engine *e = open_engine(8);
    gemmd_jobs *s = gemmd_jobs_new(e, NULL, NULL, 600, 1 << 20, 16, 100);
    gemm_err err;
    gemmd_job_entry *j = make_job(e, s, 2, 2, 2, 0, &err);
    j->owner = 2;
    char id[GEMMD_JOB_ID_LEN + 1];
    strcpy(id, j->id);
    assert_int_equal(gemmd_jobs_submit(s, j, &err), 0);
    assert_null(gemmd_jobs_get_owned(s, id, 1));
    assert_null(gemmd_jobs_get_owned(s, id, 0));
    assert_int_equal(gemmd_jobs_delete_owned(s, id, 1), -1);
    gemmd_job_entry *r = gemmd_jobs_get_owned(s, id, 2);
    assert_non_null(r); /* still there for its owner */
    gemmd_jobs_put(s, r);
    /* an id that differs in its last digit, or is a prefix, is another id */
    char other[GEMMD_JOB_ID_LEN + 1];
    strcpy(other, id);
    size_t last = strlen(id) - 1;
    other[last] = other[last] == '0' ? '1' : '0';
    assert_null(gemmd_jobs_get_owned(s, other, 2));
    other[last] = '\0';
    assert_null(gemmd_jobs_get_owned(s, other, 2));
    assert_int_equal(gemmd_jobs_delete_owned(s, id, 2), 0);
    close_all(e, s);
}

/* Retry-After for a full store: the TTL while nothing has finished, then the time until
 * the oldest finished job expires. */
static void test_retry_after(void **state)
{
    (void)state;
    gemm_engine *e = open_engine(8);
    gemmd_jobs *s = gemmd_jobs_new(e, NULL, NULL, 600, 1 << 20, 1, 100);
    gate g;
    gate_close(e, &g);
    gemm_err err;
    gemmd_job_entry *j = make_job(e, s, 2, 2, 2, 0, &err);
    char id[GEMMD_JOB_ID_LEN + 1];
    strcpy(id, j->id);
    assert_int_equal(gemmd_jobs_submit(s, j, &err), 0);
    assert_null(gemmd_jobs_reserve(s, 0, 0, 16, &err));
    assert_string_equal(err.code, "job_store_full");
    assert_int_equal(gemmd_jobs_retry_after_s(s), 600); /* queued: nothing can expire before a TTL */
    gate_open(e, &g);
    gemmd_job_entry *r = gemmd_jobs_get(s, id);
    gemmd_job_view v;
    wait_finished(s, r, &v);
    gemmd_jobs_put(s, r);
    int ra = gemmd_jobs_retry_after_s(s);
    assert_true(ra >= 1 && ra <= 600);
    assert_true(ra >= 600 - (int)(v.age_ms / 1000.0) - 60); /* its expiry, not a fixed 1 */
    close_all(e, s);
    gate_free(&g);
}

static void test_submit_failure_frees_entry(void **state)
{
    (void)state;
    gemm_engine *e = open_engine(1);
    gemmd_jobs *s = gemmd_jobs_new(e, NULL, NULL, 600, 1 << 20, 16, 100);
    gate g;
    gate_close(e, &g);
    gemm_err err;
    gemmd_job_entry *j1 = make_job(e, s, 2, 2, 2, 0, &err);
    assert_int_equal(gemmd_jobs_submit(s, j1, &err), 0); /* takes the only queue place */
    gemmd_job_entry *j2 = make_job(e, s, 2, 2, 2, 0, &err);
    assert_int_equal(gemmd_jobs_submit(s, j2, &err), -1);
    assert_int_equal(err.status, 503);
    assert_string_equal(err.code, "queue_full");
    int counts[5], kept;
    uint64_t bytes;
    gemmd_jobs_counts(s, counts, &kept, &bytes);
    assert_int_equal(kept, 1);
    assert_int_equal(bytes, 48); /* the queued one's inputs (32) and result (16) */
    /* a bad kernel is refused before queueing, and freed too */
    gemmd_job_entry *j3 = make_job(e, s, 2, 2, 2, 0, &err);
    snprintf(j3->job.kernel, sizeof j3->job.kernel, "no_such_kernel");
    assert_int_equal(gemmd_jobs_submit(s, j3, &err), -1);
    assert_int_equal(err.status, 422);
    gate_open(e, &g);
    close_all(e, s);
    gate_free(&g);
}

static void test_shutdown_cancels_queued(void **state)
{
    (void)state;
    gemm_engine *e = open_engine(8);
    gemmd_jobs *s = gemmd_jobs_new(e, NULL, NULL, 600, 1 << 20, 16, 100);
    gate g;
    gate_close(e, &g);
    gemm_err err;
    gemmd_job_entry *j = make_job(e, s, 2, 2, 2, 0, &err);
    char id[GEMMD_JOB_ID_LEN + 1];
    strcpy(id, j->id);
    assert_int_equal(gemmd_jobs_submit(s, j, &err), 0);
    gemmd_jobs_shutdown(s);
    gemmd_job_entry *r = gemmd_jobs_get(s, id);
    assert_non_null(r);
    gemmd_job_view v;
    gemmd_jobs_view(s, r, &v);
    assert_true(v.finished);
    assert_int_equal(v.state, GEMM_JOB_CANCELLED);
    gemmd_jobs_put(s, r);
    assert_null(gemmd_jobs_reserve(s, 0, 0, 16, &err));
    assert_string_equal(err.code, "shutting_down");
    gate_open(e, &g);
    close_all(e, s);
    gate_free(&g);
}

/* Many threads submit, read and delete at once. */
typedef struct {
    gemm_engine *e;
    gemmd_jobs *s;
    int seed;
    int ok;
} worker_arg;

static void *worker(void *p)
{
    worker_arg *w = p;
    for (int i = 0; i < 40; i++) {
        gemm_err err;
        gemmd_job_entry *j = make_job(w->e, w->s, 3, 4, 5, w->seed + i, &err);
        if (!j) continue; /* the store may be full for a moment */
        char id[GEMMD_JOB_ID_LEN + 1];
        strcpy(id, j->id);
        if (gemmd_jobs_submit(w->s, j, &err) != 0) continue;
        gemmd_job_entry *r = gemmd_jobs_get(w->s, id);
        if (!r) continue;
        if (i % 3 == 0) {
            gemmd_jobs_delete(w->s, id); /* possibly still queued or running */
        } else {
            gemmd_job_view v;
            wait_finished(w->s, r, &v);
            if (v.state == GEMM_JOB_DONE) {
                const int32_t *c = r->job.c;
                if (c[7] == (int32_t)ref_elem(1, 2, 4, w->seed + i)) w->ok++;
            }
            if (i % 3 == 1) gemmd_jobs_delete(w->s, id);
        }
        gemmd_jobs_put(w->s, r);
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    gemm_engine *e = open_engine(256);
    gemmd_jobs *s = gemmd_jobs_new(e, NULL, NULL, 600, 1 << 20, 1024, 100);
    pthread_t t[4];
    worker_arg w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (worker_arg){e, s, 100 * i, 0};
        pthread_create(&t[i], NULL, worker, &w[i]);
    }
    int ok = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        ok += w[i].ok;
    }
    assert_int_equal(ok, 4 * 26); /* i % 3 != 0: 26 of 40 each */
    close_all(e, s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ids_are_random_hex),
        cmocka_unit_test(test_result_and_inputs_freed),
        cmocka_unit_test(test_memory_cap),
        cmocka_unit_test(test_inputs_count_until_done),
        cmocka_unit_test(test_count_cap_and_delete_frees_room),
        cmocka_unit_test(test_delete_queued_job),
        cmocka_unit_test(test_reader_keeps_deleted_result),
        cmocka_unit_test(test_ttl_expiry),
        cmocka_unit_test(test_sweeper_frees_without_calls),
        cmocka_unit_test(test_state_and_finished_change_together),
        cmocka_unit_test(test_delete_running_asks_engine),
        cmocka_unit_test(test_cancelled_after_running),
        cmocka_unit_test(test_shutdown_asks_running_to_stop),
        cmocka_unit_test(test_owner),
        cmocka_unit_test(test_retry_after),
        cmocka_unit_test(test_submit_failure_frees_entry),
        cmocka_unit_test(test_shutdown_cancels_queued),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
