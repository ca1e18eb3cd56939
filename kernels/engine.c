/*
 * engine.c - the generic engine: backend choice, the bounded FIFO queue, the worker
 * threads, cancellation, queue timing, counters and close.
 *
 * One mutex guards the queue; the result counters are atomics, so a finished job takes
 * the lock once (running--, after its done()). Workers sleep on `work` until a job is
 * queued or close begins. done() is always called with the lock released, exactly once
 * per accepted job, and the engine never touches a job after its done() (the submitter
 * may free it from inside the callback).
 *
 * Cancellation: gemm_engine_cancel() takes a queued job off the queue (done() at once) or
 * flags a running one; the worker checks the flag before it calls the backend, and the
 * backend at each of its stage boundaries (gemm_job_cancel_requested).
 */
#include "engine.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct gemm_engine {
    const gemm_backend *be;
    void *self;

    pthread_mutex_t mu;
    pthread_cond_t work;  /* a job was queued, or close began */
    gemm_job *head, *tail;
    int queued, running, capacity;
    int closing;

    int nworkers;
    pthread_t *threads;
    int nstarted;
    struct worker_arg *args;

    /* counters */
    atomic_ullong completed, failed, cancelled, rejected;
    atomic_ullong compute_ns;   /* sum of compute_ms, in ns */
};

struct worker_arg {
    gemm_engine *e;
    int index;
};

void gemm_engine_config_defaults(gemm_engine_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->backend, sizeof cfg->backend, "auto");
    cfg->threads = 0;
    cfg->cpu_workers = 1;
    cfg->queue_depth = 64;
    snprintf(cfg->devices, sizeof cfg->devices, "all");
    cfg->streams_per_device = 4;
    cfg->device_mem_limit = 0;
    cfg->wait_spin_us = 50;
    cfg->fault_inject[0] = '\0';
}

const char *gemm_job_state_name(gemm_job_state s)
{
    switch (s) {
    case GEMM_JOB_QUEUED: return "queued";
    case GEMM_JOB_RUNNING: return "running";
    case GEMM_JOB_DONE: return "done";
    case GEMM_JOB_FAILED: return "failed";
    case GEMM_JOB_CANCELLED: return "cancelled";
    default: return "invalid";
    }
}

/* ---- the queue (callers hold mu) ----------------------------------------- */

static void q_push(gemm_engine *e, gemm_job *job)
{
    job->q_next = NULL;
    if (e->tail)
        e->tail->q_next = job;
    else
        e->head = job;
    e->tail = job;
    e->queued++;
}

static gemm_job *q_pop(gemm_engine *e)
{
    gemm_job *job = e->head;
    if (!job) return NULL;
    e->head = job->q_next;
    if (!e->head) e->tail = NULL;
    job->q_next = NULL;
    e->queued--;
    return job;
}

/* Unlinks job if it is queued; returns 1 if it was. */
static int q_remove(gemm_engine *e, gemm_job *job)
{
    gemm_job *prev = NULL;
    for (gemm_job *it = e->head; it; prev = it, it = it->q_next) {
        if (it != job) continue;
        if (prev)
            prev->q_next = it->q_next;
        else
            e->head = it->q_next;
        if (e->tail == it) e->tail = prev;
        it->q_next = NULL;
        e->queued--;
        return 1;
    }
    return 0;
}

/* ---- workers ------------------------------------------------------------- */

int gemm_job_stop_cancelled(gemm_job *job, const char *stage)
{
    gemm_err_set(&job->err, 409, "cancelled", "the job was cancelled while running; it stopped before %s",
                 stage);
    return GEMM_RUN_CANCELLED;
}

/* Runs a job taken off the queue (state already RUNNING, t0 = when it was taken). */
static void run_one(gemm_engine *e, void *worker, gemm_job *job, double t0)
{
    int rc = gemm_job_cancel_requested(job) ? gemm_job_stop_cancelled(job, "it started")
                                            : e->be->run(e->self, worker, job);

    double t1 = gemm_now_ms();
    job->timing.compute_ms = t1 - t0;
    if (rc == GEMM_RUN_CANCELLED && job->err.status == 0)
        gemm_job_stop_cancelled(job, "a stage boundary");
    if (rc != 0 && rc != GEMM_RUN_CANCELLED && job->err.status == 0)
        gemm_err_set(&job->err, 500, "backend_failure", "the %s backend failed to run the product",
                     e->be->name);

    atomic_fetch_add(&e->compute_ns, (unsigned long long)(job->timing.compute_ms * 1e6));
    gemm_job_state st = rc == 0 ? GEMM_JOB_DONE : rc == GEMM_RUN_CANCELLED ? GEMM_JOB_CANCELLED
                                                                           : GEMM_JOB_FAILED;
    atomic_fetch_add(st == GEMM_JOB_DONE ? &e->completed
                     : st == GEMM_JOB_CANCELLED ? &e->cancelled : &e->failed, 1);

    atomic_store(&job->state, st);
    if (job->done) job->done(job); /* the job may be freed from here on */

    /* Only now is the job no longer running: a caller that waits for running == 0
     * before freeing what done() touches (the daemon's job store at shutdown) must not
     * see zero while a callback is still in flight. */
    pthread_mutex_lock(&e->mu);
    e->running--;
    pthread_mutex_unlock(&e->mu);
}

static void *worker_main(void *arg)
{
    struct worker_arg *wa = arg;
    gemm_engine *e = wa->e;
    void *worker = e->be->worker_init ? e->be->worker_init(e->self, wa->index) : NULL;

    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->head && !e->closing) pthread_cond_wait(&e->work, &e->mu);
        gemm_job *job = q_pop(e);
        if (!job) { /* closing and nothing left */
            pthread_mutex_unlock(&e->mu);
            break;
        }
        e->running++;
        double t0 = gemm_now_ms();
        job->timing.queue_ms = t0 - job->t_submit_ms;
        atomic_store(&job->state, GEMM_JOB_RUNNING); /* under the lock: cancel sees it */
        pthread_mutex_unlock(&e->mu);
        run_one(e, worker, job, t0);
    }

    if (e->be->worker_fini) e->be->worker_fini(e->self, worker);
    return NULL;
}

/* ---- open / close -------------------------------------------------------- */

static const gemm_backend *pick_backend(const gemm_engine_config *cfg, gemm_err *err)
{
    const char *want = cfg->backend[0] ? cfg->backend : "auto";
    if (strcmp(want, "cpu") == 0) return &gemm_backend_cpu;
    if (strcmp(want, "cuda") == 0) {
#ifdef GEMMD_HAVE_CUDA
        if (gemm_cuda_device_count() > 0) return &gemm_backend_cuda;
        gemm_err_set(err, 503, "no_device",
                     "backend \"cuda\" was asked for but no usable CUDA device was found "
                     "(check the driver, CUDA_VISIBLE_DEVICES and --gpus); use backend auto or cpu");
#else
        gemm_err_set(err, 503, "no_device",
                     "backend \"cuda\" was asked for but this build has no CUDA support "
                     "(built without nvcc); use backend auto or cpu");
#endif
        return NULL;
    }
    if (strcmp(want, "auto") == 0) {
#ifdef GEMMD_HAVE_CUDA
        if (gemm_cuda_device_count() > 0) return &gemm_backend_cuda;
#endif
        return &gemm_backend_cpu;
    }
    gemm_err_set(err, 400, "bad_backend", "unknown backend \"%s\"; use auto, cpu or cuda", want);
    return NULL;
}

static void engine_free(gemm_engine *e)
{
    if (e->self) e->be->close(e->self);
    pthread_cond_destroy(&e->work);
    pthread_mutex_destroy(&e->mu);
    free(e->threads);
    free(e->args);
    free(e);
}

gemm_engine *gemm_engine_open(const gemm_engine_config *cfg, gemm_err *err)
{
    gemm_engine_config defaults;
    if (!cfg) {
        gemm_engine_config_defaults(&defaults);
        cfg = &defaults;
    }
    gemm_err_clear(err);
    const gemm_backend *be = pick_backend(cfg, err);
    if (!be) return NULL;

    gemm_engine *e = calloc(1, sizeof *e);
    if (!e) {
        gemm_err_set(err, 500, "out_of_memory", "cannot allocate the engine");
        return NULL;
    }
    e->be = be;
    e->capacity = cfg->queue_depth > 0 ? cfg->queue_depth : 64;
    atomic_init(&e->completed, 0);
    atomic_init(&e->failed, 0);
    atomic_init(&e->cancelled, 0);
    atomic_init(&e->rejected, 0);
    atomic_init(&e->compute_ns, 0);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->work, NULL);

    e->self = be->open(cfg, err);
    if (!e->self) {
        if (err && err->status == 0)
            gemm_err_set(err, 500, "backend_failure", "the %s backend could not start", be->name);
        engine_free(e);
        return NULL;
    }

    e->nworkers = be->workers(e->self);
    if (e->nworkers < 1) e->nworkers = 1;
    e->threads = calloc((size_t)e->nworkers, sizeof *e->threads);
    e->args = calloc((size_t)e->nworkers, sizeof *e->args);
    if (!e->threads || !e->args) {
        gemm_err_set(err, 500, "out_of_memory", "cannot allocate %d worker threads", e->nworkers);
        engine_free(e);
        return NULL;
    }
    for (int i = 0; i < e->nworkers; i++) {
        e->args[i].e = e;
        e->args[i].index = i;
        int rc = pthread_create(&e->threads[i], NULL, worker_main, &e->args[i]);
        if (rc != 0) {
            gemm_err_set(err, 500, "backend_failure", "cannot start worker thread %d of %d: %s", i,
                         e->nworkers, strerror(rc));
            pthread_mutex_lock(&e->mu);
            e->closing = 1;
            pthread_cond_broadcast(&e->work);
            pthread_mutex_unlock(&e->mu);
            for (int j = 0; j < e->nstarted; j++) pthread_join(e->threads[j], NULL);
            engine_free(e);
            return NULL;
        }
        e->nstarted++;
    }
    return e;
}

void gemm_engine_close(gemm_engine *e)
{
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->closing = 1;
    gemm_job *list = e->head;
    int n = e->queued;
    e->head = e->tail = NULL;
    e->queued = 0;
    atomic_fetch_add(&e->failed, (unsigned long long)n);
    pthread_cond_broadcast(&e->work);
    pthread_mutex_unlock(&e->mu);

    /* Fail what never started; done() without the lock. */
    while (list) {
        gemm_job *job = list;
        list = job->q_next;
        job->q_next = NULL;
        gemm_err_set(&job->err, 503, "shutting_down",
                     "the server is shutting down; the job was not started");
        atomic_store(&job->state, GEMM_JOB_FAILED);
        if (job->done) job->done(job);
    }

    for (int i = 0; i < e->nstarted; i++) pthread_join(e->threads[i], NULL);
    engine_free(e);
}

/* ---- submit / cancel ----------------------------------------------------- */

int gemm_job_bytes(const gemm_job *job, size_t out[3])
{
    uint64_t nb = gemm_job_batch(job), nbb = job->b_shared ? 1 : nb;
    size_t a, b, c;
    if (!gemm_matrix_bytes(job->m, job->k, job->dtype, &a) ||
        !gemm_matrix_bytes(job->k, job->n, job->dtype, &b) ||
        !gemm_matrix_bytes(job->m, job->n, job->dtype, &c) || (uint64_t)(size_t)nb != nb ||
        !gemm_mul_size(a, (size_t)nb, &out[0]) || !gemm_mul_size(b, (size_t)nbb, &out[1]) ||
        !gemm_mul_size(c, (size_t)nb, &out[2]))
        return 0;
    return 1;
}

int gemm_engine_submit(gemm_engine *e, gemm_job *job, gemm_err *err)
{
    gemm_err_clear(err);
    if (!e || !job)
        return gemm_err_set(err, 500, "internal_error", "submit called without an engine or a job");
    if (gemm_dtype_size(job->dtype) == 0)
        return gemm_err_set(err, 422, "bad_dtype", "unsupported dtype; use float32, float64 or int32");
    if (job->m == 0 || job->k == 0 || job->n == 0)
        return gemm_err_set(err, 422, "empty_matrix",
                            "m, k and n must each be at least 1 (got m=%llu k=%llu n=%llu)",
                            (unsigned long long)job->m, (unsigned long long)job->k,
                            (unsigned long long)job->n);
    if (job->batch > GEMM_MAX_BATCH)
        return gemm_err_set(err, 413, "too_large", "a batch of %llu products is more than the "
                            "engine takes in one job (%d)", (unsigned long long)job->batch,
                            GEMM_MAX_BATCH);
    size_t bytes[3];
    if (!gemm_job_bytes(job, bytes))
        return gemm_err_set(err, 413, "too_large",
                            "a batch of %llu products of m=%llu k=%llu n=%llu overflows the "
                            "address space", (unsigned long long)gemm_job_batch(job),
                            (unsigned long long)job->m, (unsigned long long)job->k,
                            (unsigned long long)job->n);
    if (!job->a || !job->b || !job->c || !job->done)
        return gemm_err_set(err, 500, "internal_error",
                            "a job needs its a, b and c buffers and a done callback");

    /* Result fields start clean; validate() may fill kernel_used / math_used / tile_used. */
    gemm_err_clear(&job->err);
    memset(&job->timing, 0, sizeof job->timing);
    job->kernel_used[0] = '\0';
    job->tile_used = 0;
    job->block[0] = '\0';
    job->math_used = GEMM_MATH_DEFAULT;
    job->device[0] = '\0';
    job->stream = -1;
    job->batched = 0;
    job->batch_mode[0] = '\0';
    atomic_store(&job->cancel_requested, 0);
    job->q_next = NULL;

    if (e->be->validate && e->be->validate(e->self, job, err) != 0) {
        if (err && err->status == 0)
            gemm_err_set(err, 422, "unsupported", "the %s backend cannot run this product",
                         e->be->name);
        return -1;
    }

    pthread_mutex_lock(&e->mu);
    if (e->closing) {
        atomic_fetch_add(&e->rejected, 1);
        pthread_mutex_unlock(&e->mu);
        return gemm_err_set(err, 503, "shutting_down", "the server is shutting down; retry elsewhere");
    }
    if (e->queued >= e->capacity) {
        atomic_fetch_add(&e->rejected, 1);
        int cap = e->capacity;
        pthread_mutex_unlock(&e->mu);
        return gemm_err_set(err, 503, "queue_full",
                            "all %d queue places are taken; retry shortly", cap);
    }
    job->t_submit_ms = gemm_now_ms();
    atomic_store(&job->state, GEMM_JOB_QUEUED);
    q_push(e, job);
    pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

int gemm_engine_cancel(gemm_engine *e, gemm_job *job)
{
    if (!e || !job) return 0;
    pthread_mutex_lock(&e->mu);
    int removed = q_remove(e, job);
    if (!removed)
        atomic_store(&job->cancel_requested, 1); /* running: the worker stops it */
    pthread_mutex_unlock(&e->mu);
    if (!removed) return 0;

    atomic_fetch_add(&e->cancelled, 1);
    atomic_store(&job->cancel_requested, 1);
    job->timing.queue_ms = gemm_now_ms() - job->t_submit_ms;
    gemm_err_set(&job->err, 409, "cancelled", "the job was cancelled before it started");
    atomic_store(&job->state, GEMM_JOB_CANCELLED);
    if (job->done) job->done(job);
    return 1;
}

/* ---- memory, description, stats ----------------------------------------- */

const gemm_allocator *gemm_engine_allocator(gemm_engine *e)
{
    const gemm_allocator *a = (e && e->be->allocator) ? e->be->allocator(e->self) : NULL;
    return a ? a : &gemm_allocator_host;
}

void *gemm_engine_host_alloc(gemm_engine *e, size_t bytes)
{
    return gemm_alloc(gemm_engine_allocator(e), bytes);
}

void gemm_engine_host_free(gemm_engine *e, void *p)
{
    gemm_free(gemm_engine_allocator(e), p);
}

void gemm_engine_describe(gemm_engine *e, gemm_engine_info *out)
{
    memset(out, 0, sizeof *out);
    if (!e) return;
    if (e->be->describe) e->be->describe(e->self, out);
    if (!out->backend[0]) snprintf(out->backend, sizeof out->backend, "%s", e->be->name);
    out->workers = e->nworkers;
    out->queue_capacity = e->capacity;
}

void gemm_engine_get_stats(gemm_engine *e, gemm_engine_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!e) return;
    if (e->be->stats) e->be->stats(e->self, out);
    pthread_mutex_lock(&e->mu);
    out->queued = e->queued;
    out->running = e->running;
    pthread_mutex_unlock(&e->mu);
    out->completed = atomic_load(&e->completed);
    out->failed = atomic_load(&e->failed);
    out->cancelled = atomic_load(&e->cancelled);
    out->rejected = atomic_load(&e->rejected);
    out->compute_seconds = (double)atomic_load(&e->compute_ns) / 1e9;
}

int gemm_engine_healthy(gemm_engine *e)
{
    if (!e) return 0;
    return e->be->healthy ? e->be->healthy(e->self) != 0 : 1;
}

int gemm_engine_ready(gemm_engine *e)
{
    if (!e || !gemm_engine_healthy(e)) return 0;
    pthread_mutex_lock(&e->mu);
    int ok = !e->closing && e->queued < e->capacity;
    pthread_mutex_unlock(&e->mu);
    return ok;
}
