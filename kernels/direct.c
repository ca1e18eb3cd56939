/*
 * direct.c - running where submitted (gemm_engine_submit_here; docs/OPERATIONS.md, "The
 * host path" and "The direct run"). A product the inline backend takes runs here, queued
 * jobs or not, without the engine lock. Any other, when nothing is queued and a worker of
 * its slot is idle, runs here on that worker's borrowed state; the lent worker counts as
 * busy and takes nothing (nor exits) until its state comes back.
 */
#include "engine_int.h"

int gemm_engine_runs_on_host(const gemm_engine *e, const gemm_job *job)
{
    return e && job && e->near && e->near_be->takes(e->near, job);
}

/* The host path: counted in near_active before closing is read, so that close() either
 * refuses it here or waits for it. */
static int run_near(gemm_engine *e, gemm_job *job, gemm_engine_err *err)
{
    atomic_fetch_add(&e->near_active, 1);
    if (atomic_load(&e->closing)) {
        atomic_fetch_sub(&e->near_active, 1);
        atomic_fetch_add(&e->rejected, 1);
        return gemm_engine_err_set(err, GEMM_E_SHUTTING_DOWN, "the server is shutting down; retry elsewhere");
    }
    double t0 = gemm_now_ms();
    job->t_submit_ms = t0; /* queue_ms stays 0 (gemm_sched_check cleared the timing) */
    atomic_fetch_add(&e->running, 1);
    atomic_fetch_add(&e->ran_here, 1);
    atomic_fetch_add(&e->ran_host, 1);
    atomic_store(&job->state, GEMM_JOB_RUNNING);
    int rc = gemm_job_cancel_requested(job) ? gemm_job_stop_cancelled(job, "its product")
                                            : e->near_be->run(e->near, NULL, job);
    gemm_sched_finish_one(e, job, rc, t0);
    atomic_fetch_sub(&e->near_active, 1);
    return 1;
}

/* Under mu: the idle worker of the slot a queued job would go to, when nothing waits (a
 * job run here must not pass one) and job is not split; the lowest index, so that one
 * worker's caches serve a run of requests. */
static worker_arg *lendable(gemm_engine *e, const gemm_job *job)
{
    if (e->head || e->phead || gemm_split_wants(e, job) || (e->be->quick && !e->be->quick(e->self))) return NULL;
    int s = gemm_sched_pick_slot(e, -1);
    if (s < 0 || !gemm_sched_slot_ok(e, s)) return NULL;
    for (int i = 0; i < e->nstarted; i++) {
        worker_arg *w = &e->args[i];
        if (w->slot == s && w->between && !w->lent) return w;
    }
    return NULL;
}

/* Runs job on the lent worker's state, given back only after done() and running-- (so
 * that close, which joins the workers, cannot free the engine under it). */
static void run_lent(gemm_engine *e, worker_arg *w, gemm_job *job)
{
    double t0 = gemm_now_ms();
    job->timing.queue_ms = t0 - job->t_submit_ms;
    gemm_sched_finish(e, job, gemm_sched_run(e, w->state, job), t0);
    pthread_mutex_lock(&e->mu);
    atomic_fetch_sub(&e->running, 1);
    e->slot_busy[w->slot]--;
    w->lent = 0;
    pthread_cond_signal(&w->back);
    if (e->head) gemm_sched_kick(e); /* queued meanwhile: this slot has an idle worker again */
    pthread_mutex_unlock(&e->mu);
}

int gemm_engine_submit_here(gemm_engine *e, gemm_job *job, gemm_engine_err *err)
{
    if (gemm_sched_check(e, job, err) != 0) return -1;
    if (gemm_engine_runs_on_host(e, job)) return run_near(e, job, err);
    if (gemm_sched_admit(e, job, err) != 0) return -1;
    worker_arg *w = lendable(e, job);
    if (!w) {
        gemm_sched_queue(e, job);
        return 0;
    }
    w->lent = 1;
    e->slot_busy[w->slot]++;
    atomic_fetch_add(&e->running, 1);
    atomic_fetch_add(&e->ran_here, 1);
    atomic_store(&job->state, GEMM_JOB_RUNNING); /* under the lock: cancel sees it */
    pthread_mutex_unlock(&e->mu);
    run_lent(e, w, job);
    return 1;
}
