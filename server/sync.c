/*
 * sync.c - the suspend/resume handshake of requests that wait for the engine (sync.h).
 */
#include "sync.h"

#include <pthread.h>
#include <stdlib.h>

#include "request.h"

/* Locks the handshakes are spread over. */
#define SYNC_STRIPES 16

struct sync_stripe {
    pthread_mutex_t mu;
    gemmd_request *pending; /* this stripe's products on the engine */
    /* never read: keeps the stripes' locks on different cache lines */
    // cppcheck-suppress unusedStructMember
    char pad[64];
};

struct gemmd_sync {
    gemm_engine *engine;
    _Atomic int *stopping;
    _Atomic int npending; /* products on the engine, all stripes */
    int direct, few;
    uint64_t small_mnk;
    struct sync_stripe stripe[SYNC_STRIPES];
};

gemmd_sync *gemmd_sync_new(gemm_engine *engine, _Atomic int *stopping, int direct, uint64_t small_mnk, int few)
{
    gemmd_sync *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    *s = (gemmd_sync){.engine = engine, .stopping = stopping, .direct = direct, .few = few, .small_mnk = small_mnk};
    for (int i = 0; i < SYNC_STRIPES; i++) pthread_mutex_init(&s->stripe[i].mu, NULL);
    return s;
}

void gemmd_sync_free(gemmd_sync *s)
{
    if (!s) return;
    for (int i = 0; i < SYNC_STRIPES; i++) pthread_mutex_destroy(&s->stripe[i].mu);
    free(s);
}

/* The stripe whose lock guards req: a multiplicative hash of its address, so that
 * requests allocated side by side spread over the stripes. */
static struct sync_stripe *stripe_of(const gemmd_request *req)
{
    uint64_t h = (uint64_t)(uintptr_t)req * 0x9E3779B97F4A7C15ull;
    return &req->svc->sync->stripe[(h >> 32) % SYNC_STRIPES];
}

/* Takes req's stripe lock; returns it, for the unlock. */
static pthread_mutex_t *lock(const gemmd_request *req)
{
    pthread_mutex_t *mu = &stripe_of(req)->mu;
    pthread_mutex_lock(mu);
    return mu;
}

/* Caller holds req's stripe lock. */
static void pending_unlink(gemmd_request *req)
{
    struct sync_stripe *st = stripe_of(req);
    if (req->pend_prev || st->pending == req) atomic_fetch_sub(&req->svc->sync->npending, 1);
    if (req->pend_prev)
        req->pend_prev->pend_next = req->pend_next;
    else if (st->pending == req)
        st->pending = req->pend_next;
    if (req->pend_next) req->pend_next->pend_prev = req->pend_prev;
    req->pend_next = req->pend_prev = NULL;
}

/* Drops one reference (req's stripe lock held); 1 when the caller must free req after
 * unlocking. */
static int unref_locked(gemmd_request *req) { return --req->refs == 0; }

void gemmd_request_release(gemmd_request *req)
{
    pthread_mutex_t *mu = lock(req);
    int last = unref_locked(req);
    pthread_mutex_unlock(mu);
    if (last) gemmd_request_free(req);
}

void gemmd_request_hold(gemmd_request *req)
{
    pthread_mutex_t *mu = lock(req);
    req->refs++;
    pthread_mutex_unlock(mu);
}

int gemmd_sync_park(gemmd_request *req, int (*ready)(gemmd_request *req))
{
    pthread_mutex_t *mu = lock(req);
    int go_on = ready(req);
    if (!go_on) {
        req->parked = 1;
        MHD_suspend_connection(req->conn);
    }
    pthread_mutex_unlock(mu);
    return go_on;
}

void gemmd_sync_unpark(gemmd_request *req)
{
    pthread_mutex_t *mu = lock(req);
    int resume = req->parked; /* a late wake never resumes what a product suspended */
    req->parked = 0;
    pthread_mutex_unlock(mu);
    if (resume) MHD_resume_connection(req->conn);
}

void gemmd_sync_stop(gemmd_sync *s)
{
    for (int i = 0; i < SYNC_STRIPES; i++) pthread_mutex_lock(&s->stripe[i].mu);
    atomic_store(s->stopping, 1);
    for (int i = SYNC_STRIPES - 1; i >= 0; i--) pthread_mutex_unlock(&s->stripe[i].mu);
}

int gemmd_sync_begin(gemmd_request *req, gemm_job *job)
{
    gemmd_sync *s = req->svc->sync;
    struct sync_stripe *st = stripe_of(req);
    pthread_mutex_lock(&st->mu); /* the lock gemmd_sync_stop holds to set stopping */
    if (atomic_load(s->stopping)) {
        pthread_mutex_unlock(&st->mu);
        return -1;
    }
    req->job = job;
    req->pend_prev = NULL;
    req->pend_next = st->pending;
    if (st->pending) st->pending->pend_prev = req;
    st->pending = req;
    atomic_fetch_add(&s->npending, 1);
    req->refs++; /* the engine's, dropped by done() */
    req->phase = REQ_WAIT;
    pthread_mutex_unlock(&st->mu);
    return 0;
}

void gemmd_sync_refused(gemmd_request *req)
{
    pthread_mutex_t *mu = lock(req);
    pending_unlink(req);
    req->refs--; /* never the last: the connection's is held */
    req->phase = REQ_BODY;
    pthread_mutex_unlock(mu);
}

/* Where the handshake stands (req's stripe lock held). */
static int state_locked(const gemmd_request *req)
{
    return req->job_done ? GEMMD_SYNC_DONE : req->abandoned ? GEMMD_SYNC_ABANDONED : GEMMD_SYNC_SUSPENDED;
}

int gemmd_sync_direct(const gemmd_request *req)
{
    const gemmd_sync *s = req->svc->sync;
    const gemm_job *job = req->job;
    if (gemm_engine_runs_on_host(s->engine, job)) return 1;
    double mnk = (double)job->m * (double)job->n * (double)job->k * (double)gemm_job_batch(job);
    /* req counts among the pending: gemmd_sync_begin listed it */
    return s->direct && mnk <= (double)s->small_mnk && atomic_load(&s->npending) <= s->few + 1;
}

int gemmd_sync_wait(gemmd_request *req)
{
    /* Shutdown began while it was being submitted: cancel it now (done() may run here).
     * req cannot go away meanwhile: this connection holds it and is ours until we return. */
    if (atomic_load(req->svc->sync->stopping)) gemm_engine_cancel(req->svc->engine, req->job);
    pthread_mutex_t *mu = lock(req);
    int r = state_locked(req);
    if (r == GEMMD_SYNC_SUSPENDED) {
        req->suspended = 1;
        MHD_suspend_connection(req->conn);
    }
    pthread_mutex_unlock(mu);
    return r;
}

int gemmd_sync_status(gemmd_request *req)
{
    pthread_mutex_t *mu = lock(req);
    int r = state_locked(req);
    pthread_mutex_unlock(mu);
    return r;
}

void gemmd_sync_done(gemmd_request *req, int (*offload)(gemmd_request *req))
{
    pthread_mutex_t *mu = lock(req);
    pending_unlink(req);
    /* an offloaded answer resumes the connection and drops the engine's reference itself */
    int offloaded = offload && !req->abandoned && offload(req) == 0;
    pthread_mutex_unlock(mu);
    if (!offloaded) gemmd_sync_resume(req, 1);
}

void gemmd_sync_resume(gemmd_request *req, int engine_ref)
{
    struct MHD_Connection *conn = req->conn;
    pthread_mutex_t *mu = lock(req);
    req->job_done = 1;
    int resume = req->suspended;
    req->suspended = 0;
    int last = engine_ref && unref_locked(req); /* a product's: done() handed it over */
    pthread_mutex_unlock(mu);
    /* From here on req may be answered and freed by an HTTP thread (unless last): only
     * conn is used. A suspended connection stays open until resumed here, and MHD is
     * never stopped while one is suspended. */
    if (resume) MHD_resume_connection(conn);
    if (last) gemmd_request_free(req);
}

int gemmd_sync_suspend_for(gemmd_request *req, int (*start)(gemmd_request *req))
{
    pthread_mutex_t *mu = lock(req);
    int rc = start(req) == 0 ? 0 : -1;
    if (rc == 0) {
        req->phase = REQ_WAIT;
        req->suspended = 1;
        MHD_suspend_connection(req->conn);
    }
    pthread_mutex_unlock(mu);
    return rc;
}

int gemmd_sync_cancel_pending(gemmd_sync *s, int running_too)
{
    int n = 0;
    gemmd_request *held = NULL; /* the products to cancel, each with a hold taken */
    for (int i = 0; i < SYNC_STRIPES; i++) {
        struct sync_stripe *st = &s->stripe[i];
        pthread_mutex_lock(&st->mu);
        for (gemmd_request *r = st->pending; r; r = r->pend_next) {
            if (!running_too && atomic_load(&r->job->state) != GEMM_JOB_QUEUED) continue;
            r->refs++;
            r->hold_next = held;
            held = r;
            n++;
        }
        pthread_mutex_unlock(&st->mu);
    }
    while (held) {
        gemmd_request *next = held->hold_next;
        /* Queued: done() runs right here (503 shutting_down). Running: asked to stop at
         * its next stage boundary. No lock is held: done() takes its stripe lock. */
        gemm_engine_cancel(s->engine, held->job);
        gemmd_request_release(held);
        held = next;
    }
    return n;
}

int gemmd_sync_abandon_pending(gemmd_sync *s)
{
    int n = 0;
    gemmd_request *resume = NULL;
    for (int i = 0; i < SYNC_STRIPES; i++) {
        struct sync_stripe *st = &s->stripe[i];
        pthread_mutex_lock(&st->mu);
        for (gemmd_request *r = st->pending; r; r = r->pend_next) {
            r->abandoned = 1; /* one being submitted right now answers 503 instead of suspending */
            if (!r->suspended) continue;
            r->suspended = 0; /* done() will not resume it: we do */
            r->hold_next = resume;
            resume = r;
            n++;
        }
        pthread_mutex_unlock(&st->mu);
    }
    /* Each stays suspended (and so alive: its connection holds it) until resumed here. */
    while (resume) {
        gemmd_request *next = resume->hold_next;
        MHD_resume_connection(resume->conn);
        resume = next;
    }
    return n;
}
