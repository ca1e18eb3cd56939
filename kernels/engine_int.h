/*
 * engine_int.h - the engine's insides, shared by its files (docs/KERNELS.md, "The engine
 * around the kernels", says which holds what). Not a public interface.
 */
#ifndef GEMM_ENGINE_INT_H
#define GEMM_ENGINE_INT_H

#include <string.h>

#include "backend.h"

/* One worker thread; under mu: its backend state, whether it is between jobs, and whether
 * a submitting thread has borrowed the state (direct.c). */
typedef struct worker_arg {
    struct gemm_engine *e;
    int index, slot;
    void *state;
    int between, lent;
    pthread_cond_t back; /* a lent worker waits here for its state */
} worker_arg;

struct gemm_engine {
    const struct gemm_mech *const *mechs; /* offered a job in turn: gemm_mechs, set at open */
    const gemm_backend *be;
    void *self;
    /* the inline backend beside it (host path), or NULL, and its runs under way */
    const gemm_backend *near_be;
    void *near;
    atomic_int near_active;

    pthread_mutex_t mu;
    gemm_job *head, *tail;
    int queued, capacity;
    atomic_int running;   /* jobs taken and not yet past their done() (raised under mu) */
    atomic_int closing;   /* written under mu; read without it by the host path */

    /* coalescing (coalesce.c) */
    int group_max;
    uint64_t group_mnk;

    /* split products (split.c) */
    uint64_t split_mnk;   /* 0: never */
    int split_ways;       /* 0: one panel per usable slot */
    gemm_job *phead, *ptail; /* panels waiting for a worker of their slot */

    /* Per device slot: its workers' condition variable, its workers, the busy ones. */
    int nslots;
    pthread_cond_t slot_cv[GEMM_MAX_DEVICES];
    int slot_workers[GEMM_MAX_DEVICES];
    int slot_busy[GEMM_MAX_DEVICES];

    int nworkers, nstarted, nback;
    int ninited;          /* workers past worker_init (under mu) */
    pthread_cond_t inited;
    pthread_t *threads;
    worker_arg *args;

    atomic_ullong completed, failed, cancelled, rejected;
    atomic_ullong ran_here, ran_host;
    atomic_ullong compute_ns;
    atomic_ullong groups, grouped; /* coalesced launches and the products in them */
    atomic_ullong splits, panels;
};

/* A job of the engine's own (a panel, a group) with job's request and what validate()
 * resolved for it. */
static inline void gemm_job_derive(gemm_job *d, const gemm_job *job, gemm_job_state state)
{
    memset(d, 0, sizeof *d);
    d->dtype = job->dtype;
    d->m = job->m, d->k = job->k, d->n = job->n;
    d->tile = job->tile, d->tile_used = job->tile_used;
    d->math = job->math, d->math_used = job->math_used;
    d->plan_m = job->plan_m;
    d->out_half = job->out_half;
    memcpy(d->kernel, job->kernel, sizeof d->kernel);
    memcpy(d->kernel_used, job->kernel_used, sizeof d->kernel_used);
    d->stream = -1;
    atomic_init(&d->state, state);
    atomic_init(&d->cancel_requested, 0);
}

/* Takes it (after prev, or first when prev is NULL) off the list head .. tail. */
static inline void gemm_list_unlink(gemm_job **head, gemm_job **tail, gemm_job *prev, gemm_job *it)
{
    if (prev)
        prev->q_next = it->q_next;
    else
        *head = it->q_next;
    if (*tail == it) *tail = prev;
    it->q_next = NULL;
}

/* sched.c: the workers; under mu, wake whom a queued job concerns (kick) or everyone, the
 * slot that should take the next queued job (self -1: from submit), whether a slot runs. */
int gemm_sched_start(gemm_engine *e, gemm_engine_err *err);
void gemm_sched_stop(gemm_engine *e);
void gemm_sched_kick(gemm_engine *e);
void gemm_sched_wake_all(gemm_engine *e);
int gemm_sched_pick_slot(const gemm_engine *e, int self);
int gemm_sched_slot_ok(const gemm_engine *e, int slot);
/* Submitting: check; admit validates, then takes mu (kept on success: 0) if the queue has
 * room; queue releases it. 0 or -1. */
int gemm_sched_check(const gemm_engine *e, gemm_job *job, gemm_engine_err *err);
int gemm_sched_admit(gemm_engine *e, gemm_job *job, gemm_engine_err *err);
void gemm_sched_queue(gemm_engine *e, gemm_job *job);
/* Running: run unless cancelled; a run's end (state); the job's end (done()), then running--. */
int gemm_sched_run(gemm_engine *e, void *worker, gemm_job *job);
gemm_job_state gemm_sched_settle(gemm_engine *e, gemm_job *job, int rc, double t0, const char *what);
void gemm_sched_finish(gemm_engine *e, gemm_job *job, int rc, double t0);
void gemm_sched_finish_one(gemm_engine *e, gemm_job *job, int rc, double t0);

/* A mechanism beside the queue (split.c, coalesce.c), offered each job a worker takes in
 * the order of gemm_mechs. Under mu, take() says how many jobs it took (the job, then queued
 * ones into g; under 2: the next row's turn); run() runs them without mu, or (NULL) they
 * wait for workers, whom next() gives them before the queue, to run_next(). */
typedef struct gemm_mech {
    int (*take)(gemm_engine *e, gemm_job *job, int slot, double t0, gemm_job **g);
    void (*run)(gemm_engine *e, void *worker, gemm_job **g, int n, double t0, void **parts);
    gemm_job *(*next)(gemm_engine *e, int slot);
    void (*run_next)(gemm_engine *e, void *worker, gemm_job *job);
    void (*cancel)(gemm_job *job);
} gemm_mech;
extern const gemm_mech gemm_mech_split, gemm_mech_coalesce, *const gemm_mechs[];
int gemm_split_wants(const gemm_engine *e, const gemm_job *job); /* split.c: is job cut into panels? */

#endif /* GEMM_ENGINE_INT_H */
