/*
 * split.c - split products (docs/OPERATIONS.md, "One big product on several engines").
 *
 * The worker that takes a big product cuts it into row panels of A, each with what
 * validate() resolved for the whole, for the workers of their slots to serve before the
 * queue. Whoever finishes the last panel fills in the product's result and calls done().
 */
#include "engine_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A split product: its panels, and what they came to (under the engine's mu). */
struct gemm_split {
    gemm_job *parent;
    double t0;            /* when a worker took the product */
    int panels, left;     /* panels, and those not finished yet */
    int failed;           /* index of the first panel that failed, or -1 */
    int cancelled;        /* index of the first panel that stopped for a cancel, or -1 */
    gemm_job child[];
};

int gemm_split_wants(const gemm_engine *e, const gemm_job *job)
{
    if (e->split_mnk == 0 || job->batch > 1 || job->a_res || job->c_res || job->m < 2) return 0;
    return (double)job->m * (double)job->n * (double)job->k >= (double)e->split_mnk;
}

static gemm_job *split_next(gemm_engine *e, int slot)
{
    gemm_job *prev = NULL;
    for (gemm_job *it = e->phead; it; prev = it, it = it->q_next) {
        if (!e->closing && it->panel_slot != slot) continue;
        gemm_list_unlink(&e->phead, &e->ptail, prev, it);
        return it;
    }
    return NULL;
}

/* Panel i of job: rows row0.. of A and C, with what validate() resolved for the whole. */
static void panel_init(gemm_job *p, const gemm_job *job, uint64_t row0, uint64_t rows, double t0)
{
    const size_t es = gemm_dtype_size(job->dtype), ces = gemm_dtype_size(gemm_job_c_dtype(job));
    gemm_job_derive(p, job, GEMM_JOB_QUEUED);
    p->m = rows;
    p->a = (unsigned char *)job->a + (size_t)(row0 * job->k) * es;
    p->b = job->b;
    p->c = (unsigned char *)job->c + (size_t)(row0 * job->n) * ces; /* C: its own dtype */
    p->plan_m = gemm_job_plan_rows(job); /* every panel chooses as for the whole product */
    p->b_res = job->b_res;               /* the whole B: each device keeps its own copy */
    p->a_block = job->a, p->c_block = job->c;
    memcpy(p->kernel, job->kernel_used, sizeof p->kernel);
    p->t_submit_ms = t0;
}

/* Under mu: cuts job into panels for the usable slots (0: it runs whole). */
static int split_take(gemm_engine *e, gemm_job *job, int slot, double t0, gemm_job **g)
{
    (void)g;
    if (!gemm_split_wants(e, job) || gemm_job_cancel_requested(job)) return 0;
    int usable[GEMM_MAX_DEVICES], nu = 0, first = 0;
    for (int s = 0; s < e->nslots; s++) {
        if (!gemm_sched_slot_ok(e, s)) continue;
        if (s == slot) first = nu;
        usable[nu++] = s;
    }
    if (nu == 0) return 0;
    int ways = e->split_ways > 0 ? e->split_ways : nu;
    if (ways > e->nworkers) ways = e->nworkers;
    if (ways > GEMM_SPLIT_MAX) ways = GEMM_SPLIT_MAX;
    if ((uint64_t)ways > job->m) ways = (int)job->m;
    if (ways < 2) return 0;
    struct gemm_split *sp = calloc(1, sizeof *sp + (size_t)ways * sizeof(gemm_job));
    if (!sp) return 0;
    sp->parent = job;
    sp->t0 = t0;
    sp->panels = sp->left = ways;
    sp->failed = sp->cancelled = -1;
    const uint64_t base = job->m / (uint64_t)ways, extra = job->m % (uint64_t)ways;
    uint64_t row0 = 0;
    for (int i = 0; i < ways; i++) {
        gemm_job *p = &sp->child[i];
        uint64_t rows = base + ((uint64_t)i < extra ? 1 : 0);
        panel_init(p, job, row0, rows, t0);
        p->split_state = sp;
        p->panel_index = i;
        p->panel_slot = usable[(first + i) % nu];
        job->split[i].row0 = row0;
        job->split[i].rows = rows;
        row0 += rows;
        if (e->ptail)
            e->ptail->q_next = p;
        else
            e->phead = p;
        e->ptail = p;
    }
    job->split_state = sp;
    job->split_panels = ways;
    atomic_fetch_add(&e->splits, 1);
    atomic_fetch_add(&e->panels, (unsigned long long)ways);
    gemm_sched_wake_all(e); /* panels are for given slots: wake every worker */
    return ways;
}

/* The last panel finished (the split state is detached): the product's result, its done(). */
static void split_finish(gemm_engine *e, struct gemm_split *sp)
{
    gemm_job *job = sp->parent;
    int rc = 0;
    if (sp->failed >= 0) {
        rc = -1;
        job->err = sp->child[sp->failed].err;
    } else if (sp->cancelled >= 0) {
        rc = GEMM_RUN_CANCELLED;
        job->err = sp->child[sp->cancelled].err;
    }
    const gemm_job *p0 = &sp->child[0];
    job->tile_used = p0->tile_used;
    memcpy(job->block, p0->block, sizeof job->block);
    job->math_used = p0->math_used;
    memcpy(job->device, p0->device, sizeof job->device);
    job->stream = p0->stream;
    double q = job->timing.queue_ms;
    memset(&job->timing, 0, sizeof job->timing);
    job->timing.queue_ms = q;
    for (int i = 0; i < sp->panels; i++) {
        const gemm_job *p = &sp->child[i];
        if (p->timing.h2d_ms > job->timing.h2d_ms) job->timing.h2d_ms = p->timing.h2d_ms;
        if (p->timing.kernel_ms > job->timing.kernel_ms) job->timing.kernel_ms = p->timing.kernel_ms;
        if (p->timing.d2h_ms > job->timing.d2h_ms) job->timing.d2h_ms = p->timing.d2h_ms;
        job->split[i].stream = p->stream;
        memcpy(job->split[i].device, p->device, sizeof job->split[i].device);
        memcpy(job->split[i].block, p->block, sizeof job->split[i].block);
        job->split[i].kernel_ms = p->timing.kernel_ms;
    }
    double flops = 2.0 * (double)job->m * (double)job->n * (double)job->k;
    job->timing.gflops = job->timing.kernel_ms > 0 ? flops / (job->timing.kernel_ms * 1e6) : 0;
    double t0 = sp->t0;
    free(sp);
    gemm_sched_finish_one(e, job, rc, t0);
}

static void split_cancel(gemm_job *job)
{
    struct gemm_split *sp = job->split_state;
    for (int i = 0; sp && i < sp->panels; i++) atomic_store(&sp->child[i].cancel_requested, 1);
}

static void split_run(gemm_engine *e, void *worker, gemm_job *p)
{
    struct gemm_split *sp = p->split_state;
    double t0 = gemm_now_ms();
    p->timing.queue_ms = t0 - p->t_submit_ms;
    atomic_store(&p->state, GEMM_JOB_RUNNING);
    int rc = gemm_sched_run(e, worker, p);
    char what[48];
    snprintf(what, sizeof what, "panel %d of a split product", p->panel_index);
    atomic_store(&p->state, gemm_sched_settle(e, p, rc, t0, what));

    pthread_mutex_lock(&e->mu);
    if (rc != 0 && rc != GEMM_RUN_CANCELLED && sp->failed < 0) {
        sp->failed = p->panel_index;
        split_cancel(sp->parent); /* the product has failed: the rest stop early */
    } else if (rc == GEMM_RUN_CANCELLED && sp->cancelled < 0) {
        sp->cancelled = p->panel_index;
    }
    int last = --sp->left == 0;
    if (last) sp->parent->split_state = NULL;
    pthread_mutex_unlock(&e->mu);
    if (last) split_finish(e, sp);
}

const gemm_mech gemm_mech_split = {
    .take = split_take, .next = split_next, .run_next = split_run, .cancel = split_cancel};
