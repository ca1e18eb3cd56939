/*
 * coalesce.c - dynamic batching: a worker that takes a small single product also takes the
 * products queued then with the same key, up to group_max (it waits for none), runs them as
 * one batched job (run_parts: from their own blocks; else gathered into stacks), and gives
 * each its own results and done(). A cancel stops a product only before its group starts;
 * products with a resident operand never join a group.
 */
#include "engine_int.h"

#include <stdio.h>
#include <string.h>

static int no_resident(const gemm_job *job)
{
    return !job->a_res && !job->b_res && !job->c_res;
}

static int same_group(const gemm_job *a, const gemm_job *b)
{
    return a->dtype == b->dtype && gemm_job_c_dtype(a) == gemm_job_c_dtype(b) && a->math_used == b->math_used &&
           a->tile == b->tile && a->plan_m == b->plan_m && a->m == b->m && a->k == b->k && a->n == b->n &&
           b->batch <= 1 && no_resident(b) && strcmp(a->kernel_used, b->kernel_used) == 0;
}

/* Under mu: job and the queued jobs of its group into g, running (0: job is no group's). */
static int coalesce_take(gemm_engine *e, gemm_job *job, int slot, double t0, gemm_job **g)
{
    (void)slot;
    if (!g || job->batch > 1 || !no_resident(job) ||
        (double)job->m * (double)job->n * (double)job->k > (double)e->group_mnk)
        return 0;
    int n = 0;
    g[n++] = job;
    gemm_job *prev = NULL, *it = e->head;
    while (it && n < e->group_max) {
        gemm_job *next = it->q_next;
        if (same_group(job, it) && !gemm_split_wants(e, it)) {
            gemm_list_unlink(&e->head, &e->tail, prev, it);
            e->queued--;
            atomic_fetch_add(&e->running, 1);
            it->timing.queue_ms = t0 - it->t_submit_ms;
            atomic_store(&it->state, GEMM_JOB_RUNNING);
            g[n++] = it;
        } else {
            prev = it;
        }
        it = next;
    }
    return n;
}

static void free_stacks(gemm_engine *e, gemm_job *big)
{
    gemm_engine_host_free(e, big->a);
    gemm_engine_host_free(e, big->b);
    gemm_engine_host_free(e, big->c);
}

/* Each product of the group, as if never grouped. */
static void run_each(gemm_engine *e, void *worker, gemm_job **g, int n, double t0)
{
    for (int i = 0; i < n; i++)
        gemm_sched_finish_one(e, g[i], gemm_sched_run(e, worker, g[i]), i == 0 ? t0 : gemm_now_ms());
}

static void coalesce_run(gemm_engine *e, void *worker, gemm_job **g, int n, double t0, void **parts)
{
    int live = 0; /* products whose cancel came before the group started stop here */
    for (int i = 0; i < n; i++) {
        if (gemm_job_cancel_requested(g[i]))
            gemm_sched_finish_one(e, g[i], gemm_job_stop_cancelled(g[i], "it started"), t0);
        else
            g[live++] = g[i];
    }
    if (live < 2) {
        run_each(e, worker, g, live, t0);
        return;
    }
    n = live;
    gemm_job big; /* the group as one batched job; validate() resolved the same for each */
    gemm_job_derive(&big, g[0], GEMM_JOB_RUNNING);
    big.batch = (uint64_t)n;
    size_t one[3], stack[3];
    int ok = gemm_job_bytes(g[0], one) && gemm_job_bytes(&big, stack);
    const int by_parts = ok && e->be->run_parts && parts;
    if (by_parts) {
        for (int i = 0; i < n; i++) parts[i] = g[i]->a, parts[n + i] = g[i]->b, parts[2 * n + i] = g[i]->c;
        big.a_parts = parts, big.b_parts = parts + n, big.c_parts = parts + 2 * n;
    } else if (ok) {
        big.a = gemm_engine_host_alloc(e, stack[0]);
        big.b = gemm_engine_host_alloc(e, stack[1]);
        big.c = gemm_engine_host_alloc(e, stack[2]);
        ok = big.a && big.b && big.c;
        for (int i = 0; i < n && ok; i++) {
            memcpy((char *)big.a + (size_t)i * one[0], g[i]->a, one[0]);
            memcpy((char *)big.b + (size_t)i * one[1], g[i]->b, one[1]);
        }
    }
    int rc = ok ? e->be->run(e->self, worker, &big) : -1;
    if (!ok || (rc != 0 && big.err.code == GEMM_E_DEVICE_OOM)) {
        /* No stacks, or the group does not fit where each product may: one by one. */
        free_stacks(e, &big);
        run_each(e, worker, g, n, t0);
        return;
    }
    if (rc == GEMM_RUN_CANCELLED) rc = -1; /* nobody can cancel the group's own job */
    atomic_fetch_add(&e->groups, 1);
    atomic_fetch_add(&e->grouped, (unsigned long long)n);
    if (rc != 0 && big.err.code == GEMM_E_NONE)
        gemm_engine_err_set(&big.err, GEMM_E_BACKEND, "the %s backend failed to run a batch of %d products",
                            e->be->name, n);
    for (int i = 0; i < n; i++) {
        gemm_job *job = g[i];
        if (rc == 0 && !by_parts) memcpy(job->c, (const char *)big.c + (size_t)i * one[2], one[2]);
        job->err = big.err;
        double q = job->timing.queue_ms;
        job->timing = big.timing;
        job->timing.queue_ms = q;
        memcpy(job->kernel_used, big.kernel_used, sizeof job->kernel_used);
        job->tile_used = big.tile_used;
        memcpy(job->block, big.block, sizeof job->block);
        job->math_used = big.math_used;
        memcpy(job->device, big.device, sizeof job->device);
        job->stream = big.stream;
        job->batched = (uint64_t)n;
        snprintf(job->batch_mode, sizeof job->batch_mode, "coalesced %.16s", big.batch_mode);
    }
    free_stacks(e, &big);
    for (int i = 0; i < n; i++) gemm_sched_finish_one(e, g[i], rc, t0);
}

const gemm_mech gemm_mech_coalesce = {.take = coalesce_take, .run = coalesce_run};
