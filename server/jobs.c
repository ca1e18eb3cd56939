/*
 * jobs.c - the asynchronous job store (jobs.h).
 *
 * One mutex guards the list and every entry's private fields. The engine's done()
 * callback takes it too, so the engine (gemm_engine_submit, gemm_engine_cancel, which may
 * call done() on this thread) is always called without it, holding a reference instead.
 */
#include "jobs.h"

#include <sys/prctl.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "budget.h"
#include "engine_err.h"
#include "log.h"
#include "metrics.h"

struct gemmd_jobs {
    pthread_mutex_t mu;
    gemm_engine *engine;
    double ttl_ms;
    uint64_t mem_cap, mem_used;
    int max_jobs, count; /* count: entries alive (listed or still in the engine) */
    /* each client's share (token_share) and what it holds */
    uint64_t share_mem;
    int share_jobs;
    uint64_t client_mem[GEMMD_CLIENTS];
    int client_count[GEMMD_CLIENTS];
    int stopping;
    gemmd_job_entry *head;
    const gemm_allocator *alloc; /* job buffers' allocator (NULL: the engine's) */
    gemmd_budget *budget;        /* a finished result's charge becomes a kept result */
    pthread_t sweeper;
    pthread_cond_t tick;  /* a job finished while the sweeper had nothing to wait for, or stop */
    int sweeper_idle;     /* waiting without a deadline (no finished job listed) */
    int sweeper_stop;

    void (*done_hook)(gemmd_job_entry *j, void *arg); /* test hook */
    void *done_hook_arg;
};

static void free_buffer(gemmd_jobs *s, void *p)
{
    if (s->alloc) gemm_free(s->alloc, p);
    else gemm_engine_host_free(s->engine, p);
}

static void free_buffers(gemmd_jobs *s, gemmd_job_entry *j, int inputs_only)
{
    free_buffer(s, j->job.a);
    free_buffer(s, j->job.b);
    j->job.a = j->job.b = NULL;
    if (!inputs_only) {
        free_buffer(s, j->job.c);
        j->job.c = NULL;
    }
}

/* bytes of j's reservation go back (lock held) */
static void give_back_locked(gemmd_jobs *s, gemmd_job_entry *j, uint64_t bytes)
{
    s->mem_used -= bytes;
    s->client_mem[j->client] -= bytes <= s->client_mem[j->client] ? bytes : s->client_mem[j->client];
    j->reserved -= bytes;
}

/* Drops one reference (lock held); returns 1 when the caller must destroy it. */
static int unref_locked(gemmd_jobs *s, gemmd_job_entry *j)
{
    if (--j->refs > 0) return 0;
    s->count--;
    s->client_count[j->client]--;
    give_back_locked(s, j, j->reserved);
    return 1;
}

static void destroy(gemmd_jobs *s, gemmd_job_entry *j)
{
    free_buffers(s, j, 0);
    free(j);
}

static void unlink_locked(gemmd_jobs *s, gemmd_job_entry *j)
{
    for (gemmd_job_entry **pp = &s->head; *pp; pp = &(*pp)->next) {
        if (*pp == j) {
            *pp = j->next;
            j->next = NULL;
            j->linked = 0;
            return;
        }
    }
}

/* What the job reads as (lock held): its final state once done() has run, before that
 * queued or running, whatever the engine has stored meanwhile. */
static gemm_job_state state_locked(const gemmd_job_entry *j)
{
    if (j->finished) return j->state;
    return atomic_load(&j->job.state) == GEMM_JOB_QUEUED ? GEMM_JOB_QUEUED : GEMM_JOB_RUNNING;
}

static void publish_counts_locked(gemmd_jobs *s)
{
    int counts[5] = {0};
    for (gemmd_job_entry *j = s->head; j; j = j->next) {
        int st = (int)state_locked(j);
        if (st >= 0 && st < 5) counts[st]++;
    }
    gemmd_metrics_jobs_by_state(counts);
}

/* Unlinks expired entries; those whose last reference went are chained on *dead. */
static void sweep_locked(gemmd_jobs *s, gemmd_job_entry **dead)
{
    double now = gemm_now_ms();
    gemmd_job_entry **pp = &s->head;
    while (*pp) {
        gemmd_job_entry *j = *pp;
        if (j->finished && now - j->t_finished_ms >= s->ttl_ms) {
            *pp = j->next;
            j->next = NULL;
            j->linked = 0;
            LOG_DEBUG("job %.*s expired (job_ttl %.0f s): forgotten", GEMMD_JOB_LOG_ID(j->id),
                      s->ttl_ms / 1000.0);
            if (unref_locked(s, j)) {
                j->next = *dead;
                *dead = j;
            }
            continue;
        }
        pp = &j->next;
    }
}

static void destroy_chain(gemmd_jobs *s, gemmd_job_entry *dead)
{
    while (dead) {
        gemmd_job_entry *n = dead->next;
        destroy(s, dead);
        dead = n;
    }
}

/* When the oldest listed finished job expires (gemm_now_ms clock), or -1 when none. */
static double next_expiry_locked(gemmd_jobs *s)
{
    double next = -1;
    for (gemmd_job_entry *j = s->head; j; j = j->next) {
        if (!j->finished) continue;
        double t = j->t_finished_ms + s->ttl_ms;
        if (next < 0 || t < next) next = t;
    }
    return next;
}

/* Sleeps until the next expiry (or, with nothing finished, until a job finishes) and
 * frees what expired, so a result's memory goes back at its TTL with no request. */
static void *sweeper_main(void *arg)
{
    prctl(PR_SET_NAME, "gemmd-sweeper", 0, 0, 0); /* shows in top -H, ps -L, /proc */
    gemmd_jobs *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->sweeper_stop) {
        gemmd_job_entry *dead = NULL;
        sweep_locked(s, &dead);
        if (dead) {
            publish_counts_locked(s);
            pthread_mutex_unlock(&s->mu);
            destroy_chain(s, dead); /* buffers go back without the lock */
            pthread_mutex_lock(&s->mu);
            continue;
        }
        double next = next_expiry_locked(s);
        if (next < 0) {
            s->sweeper_idle = 1;
            pthread_cond_wait(&s->tick, &s->mu);
            s->sweeper_idle = 0;
            continue;
        }
        /* gemm_now_ms() is CLOCK_MONOTONIC, the clock of the condition variable. */
        double wait_ms = next - gemm_now_ms() + 1.0; /* +1: wake after it, not just before */
        if (wait_ms <= 0) continue;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        int64_t ns = ts.tv_nsec + (int64_t)(wait_ms * 1e6);
        ts.tv_sec += (time_t)(ns / 1000000000);
        ts.tv_nsec = (long)(ns % 1000000000);
        pthread_cond_timedwait(&s->tick, &s->mu, &ts);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

gemmd_jobs *gemmd_jobs_new(gemm_engine *engine, const gemm_allocator *alloc, gemmd_budget *budget, int ttl_s,
                          uint64_t mem_bytes, int max_jobs, int share_pct)
{
    gemmd_jobs *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->tick, &ca);
    pthread_condattr_destroy(&ca);
    s->engine = engine;
    s->alloc = alloc;
    s->budget = budget;
    s->ttl_ms = (ttl_s > 0 ? ttl_s : 0) * 1000.0;
    s->mem_cap = mem_bytes;
    s->max_jobs = max_jobs;
    s->share_mem = mem_bytes / 100 * (uint64_t)share_pct + mem_bytes % 100 * (uint64_t)share_pct / 100;
    s->share_jobs = (int)((int64_t)s->max_jobs * share_pct / 100);
    if (pthread_create(&s->sweeper, NULL, sweeper_main, s) != 0) {
        pthread_cond_destroy(&s->tick);
        pthread_mutex_destroy(&s->mu);
        free(s);
        return NULL;
    }
    return s;
}

void gemmd_jobs_set_done_hook(gemmd_jobs *s, void (*hook)(gemmd_job_entry *j, void *arg), void *arg)
{
    pthread_mutex_lock(&s->mu);
    s->done_hook = hook;
    s->done_hook_arg = arg;
    pthread_mutex_unlock(&s->mu);
}

void gemmd_jobs_free(gemmd_jobs *s)
{
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->sweeper_stop = 1;
    pthread_cond_broadcast(&s->tick);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->sweeper, NULL);
    destroy_chain(s, s->head);
    gemmd_metrics_jobs_by_state((const int[5]){0});
    pthread_cond_destroy(&s->tick);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

gemmd_job_entry *gemmd_jobs_reserve(gemmd_jobs *s, int client, size_t input_bytes, size_t result_bytes,
                                    gemm_err *err)
{
    gemmd_job_entry *dead = NULL, *j = NULL;
    size_t bytes = input_bytes + result_bytes;
    if (bytes < input_bytes) bytes = SIZE_MAX;
    int c = (int)((unsigned)client % GEMMD_CLIENTS);
    pthread_mutex_lock(&s->mu);
    sweep_locked(s, &dead);
    if (s->stopping) {
        gemm_err_set(err, 503, "shutting_down", "the server is shutting down; retry elsewhere");
    } else if (s->count >= s->max_jobs) {
        gemm_err_set(err, 503, "job_store_full",
                     "%d jobs are kept already (max_jobs); fetch or DELETE finished jobs, or retry "
                     "once they expire", s->count);
    } else if (bytes > s->mem_cap) {
        gemm_err_set(err, 413, "too_large",
                     "the job needs %zu bytes (inputs %zu, result %zu) but async jobs may hold at most "
                     "%llu together (job_mem_mb); use POST /v1/matmul for it",
                     bytes, input_bytes, result_bytes, (unsigned long long)s->mem_cap);
    } else if (s->mem_used > s->mem_cap - bytes) {
        gemm_err_set(err, 503, "job_store_full",
                     "the job needs %zu bytes (inputs %zu, result %zu) but only %llu of the %llu bytes "
                     "for async jobs (job_mem_mb) are free; fetch or DELETE finished jobs",
                     bytes, input_bytes, result_bytes, (unsigned long long)(s->mem_cap - s->mem_used),
                     (unsigned long long)s->mem_cap);
    } else if (s->client_count[c] &&
               (s->client_count[c] >= s->share_jobs || s->client_mem[c] + bytes > s->share_mem)) {
        gemm_err_set(err, 503, "job_store_full",
                     "this client (token, or address without tokens) keeps %d jobs holding %llu bytes, and "
                     "one more would pass its share (token_share: %d jobs, %llu bytes); fetch or DELETE "
                     "finished jobs, or retry once they expire", s->client_count[c],
                     (unsigned long long)s->client_mem[c], s->share_jobs, (unsigned long long)s->share_mem);
    } else if (!(j = calloc(1, sizeof *j))) {
        gemm_err_set(err, 500, "out_of_memory", "cannot allocate a job");
    } else if (gemmd_instance_new_id(j->id, sizeof j->id) != 0) {
        gemm_err_set(err, 500, "internal_error", "cannot draw a random job id: %s", strerror(errno));
        free(j);
        j = NULL;
    } else {
        j->store = s;
        j->refs = 1; /* the caller's, until submit or abandon */
        j->client = c;
        j->reserved = bytes;
        j->reserved_inputs = input_bytes;
        j->t_created_ms = gemm_now_ms();
        j->job.user = j;
        s->mem_used += bytes;
        s->count++;
        s->client_mem[c] += bytes;
        s->client_count[c]++;
    }
    pthread_mutex_unlock(&s->mu);
    destroy_chain(s, dead);
    return j;
}

/* The engine's completion callback (an engine thread, or the thread cancelling). The
 * state the job reads as and `finished` change together, here, under the lock. */
static void on_done(gemm_job *job)
{
    gemmd_job_entry *j = job->user;
    gemmd_jobs *s = j->store;
    if (s->done_hook) s->done_hook(j, s->done_hook_arg);
    gemmd_usage_product(j->owner, job);
    int st = atomic_load(&job->state);
    if (st != GEMM_JOB_DONE && job->err.code == GEMM_E_NONE)
        gemm_engine_err_set(&job->err, st == GEMM_JOB_CANCELLED ? GEMM_E_CANCELLED : GEMM_E_BACKEND,
                            st == GEMM_JOB_CANCELLED ? "the job was cancelled while it ran" : "the job failed");

    pthread_mutex_lock(&s->mu);
    free_buffers(s, j, st == GEMM_JOB_DONE); /* inputs always; the result unless it is one */
    if (st != GEMM_JOB_DONE) {
        give_back_locked(s, j, j->reserved);
    } else {
        give_back_locked(s, j, j->reserved_inputs); /* the inputs are gone; the result stays */
        gemmd_budget_adopt(s->budget, j->job.c, GEMMD_MEM_RESULT, NULL);
    }
    j->state = (gemm_job_state)st;
    j->reserved_inputs = 0;
    j->finished = 1;
    j->in_engine = 0;
    j->t_finished_ms = gemm_now_ms();
    if (s->sweeper_idle) pthread_cond_signal(&s->tick); /* it now has an expiry to wait for */
    int last = unref_locked(s, j); /* the engine's reference */
    publish_counts_locked(s);
    LOG_DEBUG("job %.*s finished state=%s%s%s ms=%.3f", GEMMD_JOB_LOG_ID(j->id),
              gemm_job_state_name((gemm_job_state)st), st != GEMM_JOB_DONE ? " error=" : "",
              st != GEMM_JOB_DONE ? job->err.message : "", j->t_finished_ms - j->t_created_ms);
    pthread_mutex_unlock(&s->mu);
    if (last) destroy(s, j);
}

int gemmd_jobs_submit(gemmd_jobs *s, gemmd_job_entry *j, gemm_err *err)
{
    j->job.done = on_done; /* job.user is j since gemmd_jobs_reserve */
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        gemm_err_set(err, 503, "shutting_down", "the server is shutting down; retry elsewhere");
        gemmd_jobs_put(s, j);
        return -1;
    }
    /* The engine's reference is taken before it can call done(). The entry is listed
     * only once the engine took it, so no lookup sees a job the engine may still refuse,
     * and the engine (its backend's validation included) is called without the lock. */
    j->refs++;
    j->in_engine = 1;
    pthread_mutex_unlock(&s->mu);
    gemm_engine_err eerr;
    if (gemm_engine_submit(s->engine, &j->job, &eerr) != 0) {
        gemmd_engine_err(&eerr, err);
        LOG_DEBUG("job %.*s refused by the engine: %d %s", GEMMD_JOB_LOG_ID(j->id), err->status, err->code);
        pthread_mutex_lock(&s->mu);
        j->in_engine = 0;
        j->refs--; /* the engine's, never taken: no done() will come */
        pthread_mutex_unlock(&s->mu);
        gemmd_jobs_put(s, j);
        return -1;
    }
    pthread_mutex_lock(&s->mu);
    /* The caller's reference becomes the list's (done() may even have run already). */
    j->linked = 1;
    j->next = s->head;
    s->head = j;
    if (j->finished && s->sweeper_idle) pthread_cond_signal(&s->tick); /* done() ran before the link */
    int cancel = s->stopping && j->in_engine; /* shutdown began meanwhile and missed it */
    if (cancel) j->refs++;
    publish_counts_locked(s);
    LOG_DEBUG("job %.*s queued %s %llux%llux%llu kernel=%s owner=%d", GEMMD_JOB_LOG_ID(j->id),
              gemm_dtype_name(j->job.dtype), (unsigned long long)j->job.m, (unsigned long long)j->job.k,
              (unsigned long long)j->job.n, j->job.kernel, j->owner);
    pthread_mutex_unlock(&s->mu);
    if (cancel) {
        gemm_engine_cancel(s->engine, &j->job);
        gemmd_jobs_put(s, j);
    }
    return 0;
}

gemmd_job_entry *gemmd_jobs_get_owned(gemmd_jobs *s, const char *id, int owner)
{
    gemmd_job_entry *dead = NULL, *found = NULL;
    pthread_mutex_lock(&s->mu);
    sweep_locked(s, &dead);
    for (gemmd_job_entry *j = s->head; j; j = j->next) {
        if (gemmd_instance_id_same(j->id, id)) {
            if (owner == GEMMD_OWNER_ANY || owner == j->owner) {
                j->refs++;
                found = j;
            }
            break;
        }
    }
    publish_counts_locked(s);
    pthread_mutex_unlock(&s->mu);
    destroy_chain(s, dead);
    return found;
}

void gemmd_jobs_put(gemmd_jobs *s, gemmd_job_entry *j)
{
    if (!j) return;
    pthread_mutex_lock(&s->mu);
    int last = unref_locked(s, j);
    pthread_mutex_unlock(&s->mu);
    if (last) destroy(s, j);
}

void gemmd_jobs_view(gemmd_jobs *s, gemmd_job_entry *j, gemmd_job_view *v)
{
    memset(v, 0, sizeof *v);
    pthread_mutex_lock(&s->mu);
    double now = gemm_now_ms();
    memcpy(v->id, j->id, sizeof v->id);
    v->state = state_locked(j);
    v->finished = j->finished;
    v->recv_ms = j->recv_ms;
    v->decode_ms = j->decode_ms;
    v->age_ms = now - j->t_created_ms;
    v->dtype = j->job.dtype;
    v->c_dtype = gemm_job_c_dtype(&j->job);
    v->m = j->job.m;
    v->k = j->job.k;
    v->n = j->job.n;
    if (j->finished) {
        gemmd_engine_err(&j->job.err, &v->err);
        v->timing = j->job.timing;
        v->total_ms = j->t_finished_ms - j->t_start_ms;
        double left = (j->t_finished_ms + s->ttl_ms - now) / 1000.0;
        v->expires_in_s = left > 0 ? left : 0;
        memcpy(v->kernel, j->job.kernel_used, sizeof v->kernel);
        v->tile = j->job.tile_used;
        memcpy(v->block, j->job.block, sizeof v->block);
        v->math = j->job.math_used;
        memcpy(v->device, j->job.device, sizeof v->device);
    } else {
        v->total_ms = now - j->t_start_ms;
        memcpy(v->kernel, j->job.kernel, sizeof v->kernel);
        v->tile = j->job.tile;
        v->math = j->job.math;
    }
    pthread_mutex_unlock(&s->mu);
}

int gemmd_jobs_delete_owned(gemmd_jobs *s, const char *id, int owner)
{
    gemmd_job_entry *j = gemmd_jobs_get_owned(s, id, owner); /* our reference keeps it alive below */
    if (!j) return -1;
    pthread_mutex_lock(&s->mu);
    int was_linked = j->linked;
    int cancel = j->in_engine;
    if (was_linked) {
        unlink_locked(s, j);
        unref_locked(s, j); /* the list's; ours is still held, so never the last */
    }
    publish_counts_locked(s);
    LOG_DEBUG("job %.*s deleted (%s)", GEMMD_JOB_LOG_ID(j->id),
              cancel ? "on the engine: cancel asked, freed when it ends" : "finished: freed");
    pthread_mutex_unlock(&s->mu);
    /* Queued: done() runs here with CANCELLED. Running: the engine stops it at its next
     * stage boundary and done() frees it. */
    if (cancel) gemm_engine_cancel(s->engine, &j->job);
    gemmd_jobs_put(s, j);
    return was_linked ? 0 : -1;
}

void gemmd_jobs_sweep(gemmd_jobs *s)
{
    gemmd_job_entry *dead = NULL;
    pthread_mutex_lock(&s->mu);
    sweep_locked(s, &dead);
    publish_counts_locked(s);
    pthread_mutex_unlock(&s->mu);
    destroy_chain(s, dead);
}

void gemmd_jobs_shutdown(gemmd_jobs *s)
{
    gemmd_job_entry *held = NULL;
    int k = 0;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    for (gemmd_job_entry *j = s->head; j; j = j->next)
        if (j->in_engine) {
            j->refs++;
            j->held_next = held;
            held = j;
        }
    pthread_mutex_unlock(&s->mu);
    /* Queued ones end here (done() runs on this thread); running ones are asked to stop:
     * their results could not be fetched once the daemon is gone. */
    for (gemmd_job_entry *j = held, *next; j; j = next, k++) {
        next = j->held_next;
        gemm_engine_cancel(s->engine, &j->job);
        gemmd_jobs_put(s, j);
    }
    if (k) LOG_DEBUG("jobs: shutdown cancelled %d jobs on the engine", k);
}

int gemmd_jobs_retry_after_s(gemmd_jobs *s)
{
    pthread_mutex_lock(&s->mu);
    double next = next_expiry_locked(s);
    double left_ms = next < 0 ? s->ttl_ms : next - gemm_now_ms();
    /* Full by memory rather than count: a job on the engine gives its inputs back when
     * its product ends, long before any result expires. */
    if (s->count < s->max_jobs)
        for (gemmd_job_entry *j = s->head; j; j = j->next)
            if (j->in_engine && j->reserved_inputs) left_ms = 1000.0;
    pthread_mutex_unlock(&s->mu);
    double secs = ceil(left_ms / 1000.0); /* at most job_ttl (config.c: 30 days) */
    return secs < 1 ? 1 : (int)secs;
}
