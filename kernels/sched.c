/*
 * sched.c - the bounded FIFO queue, the worker threads and their device slots,
 * cancellation, counters. One mutex guards the queue; counters are atomics. done() is
 * called without the lock, once per accepted job, and the job is not touched after it.
 *
 * A queued job goes to the least-loaded usable slot with an idle worker (docs/OPERATIONS.md,
 * "CUDA backend"): a worker that finds it takes it only if no such slot is less busy than
 * its own, else it wakes one there.
 */
#include "engine_int.h"

#include <sys/prctl.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* ---- the queue (callers hold mu) ----------------------------------------- */

static int q_remove(gemm_engine *e, gemm_job *job)
{
    gemm_job *prev = NULL;
    for (gemm_job *it = e->head; it; prev = it, it = it->q_next) {
        if (it != job) continue;
        gemm_list_unlink(&e->head, &e->tail, prev, it);
        e->queued--;
        return 1;
    }
    return 0;
}

/* ---- which worker takes a job (callers hold mu) --------------------------- */

int gemm_sched_slot_ok(const gemm_engine *e, int s)
{
    return !e->be->slot_usable || e->be->slot_usable(e->self, s);
}

/* An idle worker is asleep or about to look at the queue: a signal it misses loses nothing. */
static int slot_idle(const gemm_engine *e, int s)
{
    return e->slot_workers[s] > e->slot_busy[s];
}

/* The usable slot with an idle worker (or self, -1: submit) and the fewest busy, self winning
 * a tie, else the lowest; -1: none can take it now. */
int gemm_sched_pick_slot(const gemm_engine *e, int self)
{
    int best = -1, any_usable = 0;
    for (int s = 0; s < e->nslots; s++) {
        if (!gemm_sched_slot_ok(e, s)) continue;
        any_usable = 1;
        if (s != self && !slot_idle(e, s)) continue;
        if (best < 0 || e->slot_busy[s] < e->slot_busy[best] || (s == self && e->slot_busy[s] == e->slot_busy[best]))
            best = s;
    }
    if (best >= 0 || any_usable) return best;
    if (self >= 0) return self;
    for (int s = 0; s < e->nslots; s++)
        if (slot_idle(e, s)) return s;
    return -1;
}

void gemm_sched_kick(gemm_engine *e)
{
    int s = gemm_sched_pick_slot(e, -1);
    if (s >= 0) pthread_cond_signal(&e->slot_cv[s]);
}

void gemm_sched_wake_all(gemm_engine *e)
{
    for (int s = 0; s < e->nslots; s++) pthread_cond_broadcast(&e->slot_cv[s]);
}

/* ---- running and ending jobs ---------------------------------------------- */

gemm_job_state gemm_sched_settle(gemm_engine *e, gemm_job *job, int rc, double t0, const char *what)
{
    job->timing.compute_ms = gemm_now_ms() - t0;
    if (rc == GEMM_RUN_CANCELLED && job->err.code == GEMM_E_NONE) gemm_job_stop_cancelled(job, "a stage boundary");
    if (rc != 0 && rc != GEMM_RUN_CANCELLED && job->err.code == GEMM_E_NONE)
        gemm_engine_err_set(&job->err, GEMM_E_BACKEND, "the %s backend failed to run %s", e->be->name, what);
    return rc == 0 ? GEMM_JOB_DONE : rc == GEMM_RUN_CANCELLED ? GEMM_JOB_CANCELLED : GEMM_JOB_FAILED;
}

void gemm_sched_finish(gemm_engine *e, gemm_job *job, int rc, double t0)
{
    gemm_job_state st = gemm_sched_settle(e, job, rc, t0, "the product");
    atomic_fetch_add(&e->compute_ns, (unsigned long long)(job->timing.compute_ms * 1e6));
    atomic_fetch_add(st == GEMM_JOB_DONE ? &e->completed : st == GEMM_JOB_CANCELLED ? &e->cancelled : &e->failed, 1);
    atomic_store(&job->state, st);
    if (job->done) job->done(job); /* the job may be freed from here on */
}

void gemm_sched_finish_one(gemm_engine *e, gemm_job *job, int rc, double t0)
{
    gemm_sched_finish(e, job, rc, t0);
    /* Only now: who waits for running == 0 must not see it during a callback. */
    atomic_fetch_sub(&e->running, 1);
}

int gemm_sched_run(gemm_engine *e, void *worker, gemm_job *job)
{
    return gemm_job_cancel_requested(job) ? gemm_job_stop_cancelled(job, "it started")
                                          : e->be->run(e->self, worker, job);
}

/* ---- workers --------------------------------------------------------------- */

/* Under mu: a mechanism's work for this slot (*from: its row), else NULL for the queue. */
static gemm_job *wait_for_work(gemm_engine *e, worker_arg *wa, const gemm_mech **from)
{
    const int slot = wa->slot;
    gemm_job *work;
    for (;;) {
        if (wa->lent) { /* a submitting thread runs on this worker's state: wait for it */
            if (e->head || e->phead) pthread_cond_signal(&e->slot_cv[slot]); /* pass the wake-up on */
            while (wa->lent) pthread_cond_wait(&wa->back, &e->mu);
            continue;
        }
        for (const gemm_mech *const *m = e->mechs; *m; m++)
            if ((*m)->next && (work = (*m)->next(e, slot))) return *from = *m, work;
        if (e->closing) return NULL;
        if (e->head) {
            int best = gemm_sched_pick_slot(e, slot);
            if (best == slot) return NULL;
            if (best >= 0) pthread_cond_signal(&e->slot_cv[best]); /* it is theirs */
        }
        pthread_cond_wait(&e->slot_cv[slot], &e->mu);
    }
}

static void *worker_main(void *arg)
{
    prctl(PR_SET_NAME, "gemm-worker", 0, 0, 0); /* shows in top -H, ps -L, /proc */
    worker_arg *wa = arg;
    gemm_engine *e = wa->e;
    void *worker = e->be->worker_init ? e->be->worker_init(e->self, wa->index) : NULL;
    pthread_mutex_lock(&e->mu);
    wa->state = worker;
    wa->between = 1;
    e->ninited++;
    pthread_cond_broadcast(&e->inited);
    pthread_mutex_unlock(&e->mu);
    /* Room for a group (and its blocks, for run_parts); without it, products one by one. */
    gemm_job **g = e->group_max > 1 ? calloc((size_t)e->group_max, sizeof *g) : NULL;
    void **parts = g && e->be->run_parts ? calloc(3 * (size_t)e->group_max, sizeof *parts) : NULL;

    const int slot = wa->slot;
    int took = 0; /* this worker counts in slot_busy[slot] */
    for (;;) {
        pthread_mutex_lock(&e->mu);
        if (took) e->slot_busy[slot]--, took = 0;
        wa->between = 1;
        const gemm_mech *from = NULL;
        gemm_job *work = wait_for_work(e, wa, &from);
        wa->between = 0;
        if (work) { /* a mechanism's (split panels) before the queue */
            e->slot_busy[slot]++, took = 1;
            if (e->head) gemm_sched_kick(e); /* the wake-up may have been for the queue */
            pthread_mutex_unlock(&e->mu);
            from->run_next(e, worker, work);
            continue;
        }
        gemm_job *job = e->head;
        if (!job) { /* closing and nothing left */
            pthread_mutex_unlock(&e->mu);
            break;
        }
        q_remove(e, job);
        e->slot_busy[slot]++, took = 1;
        atomic_fetch_add(&e->running, 1);
        double t0 = gemm_now_ms();
        job->timing.queue_ms = t0 - job->t_submit_ms;
        atomic_store(&job->state, GEMM_JOB_RUNNING); /* under the lock: cancel sees it */
        const gemm_mech *const *m = e->mechs; /* the first row that takes it, if any */
        int n = 0;
        while (*m && (n = (*m)->take(e, job, slot, t0, g)) < 2) m++;
        if (e->head) gemm_sched_kick(e);
        pthread_mutex_unlock(&e->mu);
        if (!*m)
            gemm_sched_finish_one(e, job, gemm_sched_run(e, worker, job), t0);
        else if ((*m)->run)
            (*m)->run(e, worker, g, n, t0, parts); /* else its work waits in next() */
    }
    free(parts);
    free(g);
    if (e->be->worker_fini) e->be->worker_fini(e->self, worker);
    return NULL;
}

int gemm_sched_start(gemm_engine *e, gemm_engine_err *err)
{
    e->nworkers = e->be->workers(e->self);
    if (e->nworkers < 1) e->nworkers = 1;
    e->threads = calloc((size_t)e->nworkers, sizeof *e->threads);
    e->args = calloc((size_t)e->nworkers, sizeof *e->args);
    if (!e->threads || !e->args)
        return gemm_engine_err_set(err, GEMM_E_NO_MEMORY, "cannot allocate %d worker threads", e->nworkers);
    e->nslots = 1;
    for (; e->nback < e->nworkers; e->nback++) pthread_cond_init(&e->args[e->nback].back, NULL);
    for (int i = 0; i < e->nworkers; i++) {
        int slot = e->be->worker_slot ? e->be->worker_slot(e->self, i) : 0;
        if (slot < 0 || slot >= GEMM_MAX_DEVICES) slot = 0;
        e->args[i].e = e;
        e->args[i].index = i;
        e->args[i].slot = slot;
        e->slot_workers[slot]++;
        if (slot + 1 > e->nslots) e->nslots = slot + 1;
    }
    /* Splitting needs two panels at least (and products it would take stay groupable). */
    int most = e->split_ways > 0 ? e->split_ways : e->nslots;
    if ((most > e->nworkers ? e->nworkers : most) < 2) e->split_mnk = 0;
    for (int i = 0; i < e->nworkers; i++) {
        int rc = pthread_create(&e->threads[i], NULL, worker_main, &e->args[i]);
        if (rc != 0) {
            gemm_engine_err_set(err, GEMM_E_BACKEND, "cannot start worker thread %d of %d: %s", i, e->nworkers,
                                strerror(rc));
            gemm_sched_stop(e);
            return -1;
        }
        e->nstarted++;
    }
    return 0;
}

void gemm_sched_stop(gemm_engine *e)
{
    pthread_mutex_lock(&e->mu);
    e->closing = 1;
    gemm_job *list = e->head;
    atomic_fetch_add(&e->failed, (unsigned long long)e->queued);
    e->head = e->tail = NULL;
    e->queued = 0;
    gemm_sched_wake_all(e);
    pthread_mutex_unlock(&e->mu);
    while (list) { /* fail what never started; done() without the lock */
        gemm_job *job = list;
        list = job->q_next;
        job->q_next = NULL;
        gemm_engine_err_set(&job->err, GEMM_E_SHUTTING_DOWN, "the server is shutting down; the job was not started");
        atomic_store(&job->state, GEMM_JOB_FAILED);
        if (job->done) job->done(job);
    }
    for (int i = 0; i < e->nstarted; i++) pthread_join(e->threads[i], NULL);
}

/* ---- submit / cancel ------------------------------------------------------- */

int gemm_sched_check(const gemm_engine *e, gemm_job *job, gemm_engine_err *err)
{
    gemm_engine_err_clear(err);
    if (!e || !job) return gemm_engine_err_set(err, GEMM_E_INTERNAL, "submit called without an engine or a job");
    if (gemm_dtype_size(job->dtype) == 0)
        return gemm_engine_err_set(err, GEMM_E_BAD_DTYPE,
                                   "unsupported dtype; use float32, float64, int32, float16 or bfloat16");
    if (job->m == 0 || job->k == 0 || job->n == 0)
        return gemm_engine_err_set(err, GEMM_E_EMPTY, "m, k and n must each be at least 1 (got m=%llu k=%llu n=%llu)",
                                   (unsigned long long)job->m, (unsigned long long)job->k, (unsigned long long)job->n);
    if (job->batch > GEMM_MAX_BATCH)
        return gemm_engine_err_set(err, GEMM_E_TOO_LARGE,
                                   "a batch of %llu products is more than the engine takes in one job (%d)",
                                   (unsigned long long)job->batch, GEMM_MAX_BATCH);
    if (job->plan_m && job->plan_m < job->m)
        return gemm_engine_err_set(err, GEMM_E_BAD_OPTION,
                                   "panel_of=%llu is fewer rows than this product's A has (m=%llu): a panel is part "
                                   "of a product at least as tall",
                                   (unsigned long long)job->plan_m, (unsigned long long)job->m);
    if (job->plan_m && job->batch > 1)
        return gemm_engine_err_set(err, GEMM_E_BAD_OPTION, "panel_of is for a single product, not a batch");
    size_t bytes[3];
    if (!gemm_job_bytes(job, bytes))
        return gemm_engine_err_set(err, GEMM_E_TOO_LARGE,
                                   "a batch of %llu products of m=%llu k=%llu n=%llu overflows the address space",
                                   (unsigned long long)gemm_job_batch(job), (unsigned long long)job->m,
                                   (unsigned long long)job->k, (unsigned long long)job->n);
    if (!job->a || !job->b || !job->c || !job->done)
        return gemm_engine_err_set(err, GEMM_E_INTERNAL, "a job needs its a, b and c buffers and a done callback");
    if (job->m > INT_MAX || job->k > INT_MAX || job->n > INT_MAX) /* cblas's and the launches' int */
        return gemm_engine_err_set(err, GEMM_E_TOO_LARGE, "m=%llu k=%llu n=%llu: the %s backend takes dimensions up "
                                   "to %d", (unsigned long long)job->m, (unsigned long long)job->k,
                                   (unsigned long long)job->n, e->be->name, INT_MAX);
    /* Results and engine-private fields (from err on) start clean. */
    memset(&job->err, 0, sizeof *job - offsetof(gemm_job, err));
    atomic_store(&job->cancel_requested, 0);
    job->stream = -1;
    return 0;
}

int gemm_sched_admit(gemm_engine *e, gemm_job *job, gemm_engine_err *err)
{
    if (e->be->validate && e->be->validate(e->self, job, err) != 0) {
        if (err && err->code == GEMM_E_NONE)
            gemm_engine_err_set(err, GEMM_E_UNSUPPORTED, "the %s backend cannot run this product", e->be->name);
        return -1;
    }
    pthread_mutex_lock(&e->mu);
    if (e->closing || e->queued >= e->capacity) {
        atomic_fetch_add(&e->rejected, 1);
        int rc = e->closing ? gemm_engine_err_set(err, GEMM_E_SHUTTING_DOWN, "the server is shutting down; retry elsewhere")
                            : gemm_engine_err_set(err, GEMM_E_QUEUE_FULL, "all %d queue places are taken; retry shortly",
                                                  e->capacity);
        pthread_mutex_unlock(&e->mu);
        return rc;
    }
    job->t_submit_ms = gemm_now_ms();
    return 0;
}

void gemm_sched_queue(gemm_engine *e, gemm_job *job)
{
    atomic_store(&job->state, GEMM_JOB_QUEUED);
    job->q_next = NULL;
    if (e->tail)
        e->tail->q_next = job;
    else
        e->head = job;
    e->tail = job;
    e->queued++;
    gemm_sched_kick(e);
    pthread_mutex_unlock(&e->mu);
}

int gemm_engine_submit(gemm_engine *e, gemm_job *job, gemm_engine_err *err)
{
    if (gemm_sched_check(e, job, err) != 0 || gemm_sched_admit(e, job, err) != 0) return -1;
    gemm_sched_queue(e, job);
    return 0;
}

int gemm_engine_cancel(gemm_engine *e, gemm_job *job)
{
    if (!e || !job) return 0;
    pthread_mutex_lock(&e->mu);
    atomic_store(&job->cancel_requested, 1); /* running: the worker stops it */
    int removed = q_remove(e, job);
    for (const gemm_mech *const *m = e->mechs; *m && !removed; m++)
        if ((*m)->cancel) (*m)->cancel(job);
    pthread_mutex_unlock(&e->mu);
    if (!removed) return 0;
    atomic_fetch_add(&e->cancelled, 1);
    job->timing.queue_ms = gemm_now_ms() - job->t_submit_ms;
    gemm_engine_err_set(&job->err, GEMM_E_CANCELLED, "the job was cancelled before it started");
    atomic_store(&job->state, GEMM_JOB_CANCELLED);
    if (job->done) job->done(job);
    return 1;
}
