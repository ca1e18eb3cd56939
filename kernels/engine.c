/*
 * engine.c - the generic engine: backend choice, the bounded FIFO queue, the worker
 * threads, cancellation, queue timing, counters and close.
 *
 * One mutex guards the queue; the result counters and the count of running jobs are
 * atomics, so a finished job takes no lock (running--, after its done()), and a coalesced
 * group of n products does not take it n times. done() is always called with the lock
 * released, exactly once per accepted job, and the engine never touches a job after its
 * done() (the submitter may free it from inside the callback).
 *
 * Which worker takes a job: every worker belongs to a device slot (the backend's
 * worker_slot; one slot for all on the CPU) and sleeps on its slot's condition variable.
 * A queued job goes to the least-loaded usable slot: of the slots that can still run
 * products (slot_usable) and have an idle worker, the one with the fewest workers busy
 * (lowest index on a tie). Submit wakes a worker of that slot; a worker that finds a job
 * queued takes it only if no usable slot with an idle worker is less busy than its own
 * (a tie goes to the worker already awake), else it wakes one there and sleeps. Idle
 * counts workers that are not running anything, asleep or not (one just started, or just
 * finished, looks at the queue before it sleeps), so jobs queued while workers start up
 * spread too. So two products on an idle two-GPU host run one per GPU, not on two streams
 * of one, and the workers of a lost device take no more products while another device can
 * run them (they wait; when no slot is usable at all, any worker takes the job and the
 * backend fails it with its error rather than leaving it queued). Whoever takes a job while more are queued
 * wakes the next worker, so no job waits while a worker of its slot sleeps.
 *
 * Dynamic batching: a worker that takes a small single product also takes the queued
 * products with the same key (dtype, resolved math, kernel, tile, m, k, n), up to
 * group_max, waiting up to group_delay_ms for more; the group runs as ONE batched job on
 * the backend, and each product then gets its own result fields, its own queue_ms and its
 * own done(). A backend with run_parts (CUDA) is handed each product's own blocks and
 * copies them straight to and from its device stacks (one batched copy call each way);
 * for any other the inputs are gathered into one A and one B stack in engine memory and C
 * is scattered back. A product flagged for cancellation before its group starts is stopped
 * as usual; once the group has started it runs to the end with the others.
 *
 * Running where submitted (gemm_engine_submit_here): when nothing is queued and a worker
 * of the slot a job would go to is idle, the submitting thread borrows that worker's
 * backend state (its stream, buffers and library handles) and runs the job itself,
 * instead of queueing it and waking the worker: no hand-off between threads, which is
 * most of a small product's queue time when requests come one at a time. The lent worker
 * counts as busy (slot_busy) and takes nothing until its state comes back; a worker
 * never exits while lent. Everything else is as for a queued job: running, the counters,
 * cancellation (the flag, checked by the backend), done() exactly once (here, on the
 * submitting thread, before submit_here returns).
 *
 * On the host (host_max_mnk, a GPU backend only): a product too small for a device to pay
 * (float32 fp32, float64 or int32, kernel auto, batch*m*n*k up to host_max_mnk) submitted
 * with submit_here is computed by the submitting thread itself (gemm_host_product: OpenBLAS
 * or the int32 loop, one thread), whether or not anything is queued: it takes no queue
 * place, no worker and no lock of the engine. It counts as running, completed or failed
 * like any job; cancellation is checked before it starts. close() stops admitting such
 * runs (the closing flag, read after the run is counted in host_active) and waits for the
 * ones under way before it frees the engine.
 *
 * Cancellation: gemm_engine_cancel() takes a queued job off the queue (done() at once) or
 * flags a running one; the worker checks the flag before it calls the backend, and the
 * backend at each of its stage boundaries (gemm_job_cancel_requested).
 *
 * Split products (split_min_mnk, split_ways): a single product big enough is queued as
 * one job, like any other: it takes one place of the bounded queue and is counted once
 * (completed / failed / cancelled, running). The worker that takes it cuts it into P row
 * panels of A (rows m/P, the first m%P panels one more; each panel has the whole B and
 * writes its rows of C in place), pins the kernel, math and tile that validate() resolved
 * for the whole shape on every panel, and puts the panels on a panel list that workers
 * serve before the queue. Panels never count against the queue's capacity: they belong
 * to a product already admitted, at most GEMM_SPLIT_MAX per product and one product per
 * worker, so a full queue can neither refuse nor deadlock them. Panel i is for device
 * slot i (round robin over the usable slots, starting at the taker's own); a worker takes
 * only its slot's panels, except after close began, when any worker takes any panel so
 * that none is left behind. No worker ever waits for another panel: whichever worker
 * finishes the last one fills in the product's result and calls its done(), once. A panel
 * that fails flags its siblings to stop (at their next stage boundary) and the product
 * fails with that panel's error; a cancel of the product flags every panel; a product
 * whose panels were cancelled (and none failed) ends CANCELLED. Batched jobs are never
 * split, nor products with a resident A or C (their device copies are whole matrices); a
 * resident B is (each panel reads B's copy on its own device). Without memory for the
 * panels the product simply runs whole.
 */
#include "engine.h"

#include <sys/prctl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct gemm_engine {
    const gemm_backend *be;
    void *self;

    pthread_mutex_t mu;
    gemm_job *head, *tail;
    int queued, capacity;
    /* Jobs taken and not yet past their done(): raised under mu (with queued lowered, so
     * stats read the two together), lowered without it after done(). */
    atomic_int running;
    atomic_int closing;   /* written under mu; read without it by the host path */

    /* products computed on the host by their submitting threads (host_max_mnk) */
    uint64_t host_mnk;    /* 0: never */
    atomic_int host_active; /* such runs under way: close() waits for none */

    /* dynamic batching (see gemm_engine_config) */
    int group_max;
    double group_delay_ms;
    uint64_t group_mnk;

    /* split products (see the head of this file) */
    uint64_t split_mnk;   /* 0: never */
    int split_ways;       /* 0: one panel per usable slot */
    int nslots;           /* device slots the workers run on (1 without worker_slot) */
    gemm_job *phead, *ptail; /* panels waiting for a worker of their slot */

    /* Least-loaded scheduling (see "Which worker takes a job"): per device slot, its
     * workers' condition variable, how many workers it has and how many run something. */
    pthread_cond_t slot_cv[GEMM_MAX_DEVICES];
    int slot_workers[GEMM_MAX_DEVICES];
    int slot_busy[GEMM_MAX_DEVICES];
    pthread_cond_t grouping; /* a job was queued: for workers waiting to fill a group */
    int group_waiters;
    /* Workers that just finished poll for new work this long before they sleep
     * (worker_spin_us); work_seq changes whenever a job or a panel is queued, or close. */
    long spin_ns;
    atomic_ulong work_seq;

    int nworkers;
    pthread_t *threads;
    int nstarted;
    int nback;            /* args[] whose back condition variable is initialised */
    int ninited;          /* workers past worker_init (under mu) */
    pthread_cond_t inited; /* ninited grew */
    struct worker_arg *args;

    /* counters */
    atomic_ullong completed, failed, cancelled, rejected;
    atomic_ullong ran_here;        /* jobs run by their submitting thread (submit_here) */
    atomic_ullong ran_host;        /* of those, computed on the host (host_max_mnk) */
    atomic_ullong compute_ns;   /* sum of compute_ms, in ns */
    atomic_ullong groups, grouped; /* coalesced launches and the products in them */
    atomic_ullong splits, panels;  /* split products and their panels */
};

struct worker_arg {
    gemm_engine *e;
    int index;
    int slot;
    /* Under mu: the backend's state for this worker once worker_init returned, whether
     * the worker is between jobs (past worker_init and in its wait loop: its state is set
     * and not in use), and whether a submitting thread has borrowed that state
     * (submit_here). */
    void *state;
    int between, lent;
    pthread_cond_t back; /* a lent worker waits here for its state */
};

/* A split product: its panels, and what they came to (under the engine's mu). */
struct gemm_split {
    gemm_job *parent;
    double t0;            /* when a worker took the product */
    int panels, left;     /* panels, and those not finished yet */
    int failed;           /* index of the first panel that failed, or -1 */
    int cancelled;        /* index of the first panel that stopped for a cancel, or -1 */
    gemm_job child[];
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
    cfg->worker_spin_us = 0;
    cfg->fault_inject[0] = '\0';
    cfg->batch_max = 0;
    cfg->batch_max_delay_us = 0;
    cfg->batch_max_mnk = 1ull << 24;
    cfg->zero_copy_mnk = 1ull << 18;
    cfg->host_max_mnk = 0;
    cfg->warmup = 0;
    cfg->split_min_mnk = GEMM_SPLIT_MIN_MNK_DEFAULT;
    cfg->split_ways = 0;
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
    atomic_fetch_add(&e->work_seq, 1);
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

/* ---- which worker takes a job (callers hold mu) --------------------------- */

static int slot_ok(const gemm_engine *e, int s)
{
    return !e->be->slot_usable || e->be->slot_usable(e->self, s);
}

/* A slot has an idle worker: one not running anything, asleep on the slot's condition
 * variable (a signal wakes it) or awake (starting, just finished, polling: it looks at
 * the queue before it sleeps, so a signal it misses loses nothing). */
static int slot_idle(const gemm_engine *e, int s)
{
    return e->slot_workers[s] > e->slot_busy[s];
}

/* The slot whose worker should take the next queued job, seen from a worker of slot
 * `self` that is awake (-1: from submit): the usable slot with an idle worker (or self)
 * and the fewest busy workers, self winning a tie, else the lowest index. -1 when a
 * usable slot exists but none can take the job now (their workers are busy: it waits for
 * one). With no usable slot at all, self or any slot with an idle worker: the backend
 * fails the job rather than it waiting forever. */
static int pick_slot(const gemm_engine *e, int self)
{
    int best = -1, any_usable = 0;
    for (int s = 0; s < e->nslots; s++) {
        if (!slot_ok(e, s)) continue;
        any_usable = 1;
        if (s != self && !slot_idle(e, s)) continue;
        if (best < 0 || e->slot_busy[s] < e->slot_busy[best] ||
            (s == self && e->slot_busy[s] == e->slot_busy[best]))
            best = s;
    }
    if (best >= 0 || any_usable) return best;
    if (self >= 0) return self;
    for (int s = 0; s < e->nslots; s++)
        if (slot_idle(e, s)) return s;
    return -1;
}

/* A job is queued: wake the worker that should take it, if one sleeps. */
static void kick(gemm_engine *e)
{
    int s = pick_slot(e, -1);
    if (s >= 0) pthread_cond_signal(&e->slot_cv[s]);
}

static void wake_all(gemm_engine *e)
{
    atomic_fetch_add(&e->work_seq, 1);
    for (int s = 0; s < e->nslots; s++) pthread_cond_broadcast(&e->slot_cv[s]);
    pthread_cond_broadcast(&e->grouping);
}

/* A worker that has just finished polls (without the lock) for new work for up to
 * spin_ns before it sleeps: at one connection the next request comes within tens of
 * microseconds, and a worker that is still awake takes it without the wake-up of a
 * sleeping thread (tens of microseconds more on a virtual machine). Returns when work_seq
 * moves from seen, or the time is up. */
static void spin_for_work(gemm_engine *e, unsigned long seen)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned i = 0;; i++) {
        if (atomic_load_explicit(&e->work_seq, memory_order_acquire) != seen) return;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
        if ((i & 63) == 0) {
            clock_gettime(CLOCK_MONOTONIC, &t);
            long ns = (long)(t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec);
            if (ns >= e->spin_ns) return;
        }
    }
}

/* ---- workers ------------------------------------------------------------- */

int gemm_job_stop_cancelled(gemm_job *job, const char *stage)
{
    gemm_err_set(&job->err, 409, "cancelled", "the job was cancelled while running; it stopped before %s",
                 stage);
    return GEMM_RUN_CANCELLED;
}

/* Ends a job: compute time, counters, state, done(). The caller then takes mu for
 * running-- (finish_one, or submit_here, which gives its borrowed worker back there). */
static void finish_job(gemm_engine *e, gemm_job *job, int rc, double t0)
{
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
}

/* Ends a job run by a worker: finish_job, then running--. */
static void finish_one(gemm_engine *e, gemm_job *job, int rc, double t0)
{
    finish_job(e, job, rc, t0);
    /* Only now is the job no longer running: a caller that waits for running == 0
     * before freeing what done() touches (the daemon's job store at shutdown) must not
     * see zero while a callback is still in flight. No lock: a coalesced group ends
     * each of its products here, and the submitting threads need mu meanwhile. */
    atomic_fetch_sub(&e->running, 1);
}

/* The backend's run of a job that is RUNNING, unless a cancel came first. */
static int run_job(gemm_engine *e, void *worker, gemm_job *job)
{
    return gemm_job_cancel_requested(job) ? gemm_job_stop_cancelled(job, "it started")
                                          : e->be->run(e->self, worker, job);
}

/* Runs a job taken off the queue (state already RUNNING, t0 = when it was taken). */
static void run_one(gemm_engine *e, void *worker, gemm_job *job, double t0)
{
    finish_one(e, job, run_job(e, worker, job), t0);
}

/* ---- dynamic batching ------------------------------------------------------ */

static int splittable(const gemm_engine *e, const gemm_job *job);

static int groupable(const gemm_engine *e, const gemm_job *job)
{
    if (e->group_max < 2 || job->batch > 1) return 0;
    double mnk = (double)job->m * (double)job->n * (double)job->k;
    return mnk <= (double)e->group_mnk;
}

static int same_group(const gemm_job *a, const gemm_job *b)
{
    return a->dtype == b->dtype && gemm_job_c_dtype(a) == gemm_job_c_dtype(b) && a->math_used == b->math_used &&
           a->tile == b->tile && a->plan_m == b->plan_m &&
           a->m == b->m && a->k == b->k && a->n == b->n && b->batch <= 1 &&
           strcmp(a->kernel_used, b->kernel_used) == 0;
}

/* Moves the queued jobs of job's group into g[*n..] (callers hold mu); marks them running. */
static void take_group(gemm_engine *e, gemm_job **g, int *n, double now)
{
    gemm_job *prev = NULL, *it = e->head;
    while (it && *n < e->group_max) {
        gemm_job *next = it->q_next;
        if (same_group(g[0], it) && !splittable(e, it)) {
            if (prev)
                prev->q_next = next;
            else
                e->head = next;
            if (e->tail == it) e->tail = prev;
            it->q_next = NULL;
            e->queued--;
            atomic_fetch_add(&e->running, 1);
            it->timing.queue_ms = now - it->t_submit_ms;
            atomic_store(&it->state, GEMM_JOB_RUNNING);
            g[(*n)++] = it;
        } else {
            prev = it;
        }
        it = next;
    }
}

static struct timespec deadline_in(double ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long ns = (long long)ts.tv_nsec + (long long)(ms * 1e6);
    ts.tv_sec += (time_t)(ns / 1000000000LL);
    ts.tv_nsec = (long)(ns % 1000000000LL);
    return ts;
}

/* Runs the group g[0..n) (n >= 2, all RUNNING) as one batched job and hands each product
 * the result fields. On a backend with run_parts the job lists the products' own blocks
 * (parts: room for 3 * group_max pointers); otherwise A and B are gathered into stacks
 * here and C scattered back, and the group runs one by one when the stacks cannot be
 * had. */
static void run_group(gemm_engine *e, void *worker, gemm_job **g, int n, double t0, void **parts)
{
    /* Products whose cancel came before the group started stop here. */
    int live = 0;
    for (int i = 0; i < n; i++) {
        if (gemm_job_cancel_requested(g[i]))
            finish_one(e, g[i], gemm_job_stop_cancelled(g[i], "it started"), t0);
        else
            g[live++] = g[i];
    }
    if (live == 0) return;
    if (live == 1) {
        run_one(e, worker, g[0], t0);
        return;
    }
    n = live;

    gemm_job *first = g[0];
    size_t one[3];
    gemm_job big;
    memset(&big, 0, sizeof big);
    big.dtype = first->dtype;
    big.m = first->m, big.k = first->k, big.n = first->n;
    big.batch = (uint64_t)n;
    big.tile = first->tile;
    big.math = first->math;
    big.out_half = first->out_half;
    snprintf(big.kernel, sizeof big.kernel, "%s", first->kernel);
    /* validate() ran for every product of the group and resolved the same kernel. */
    memcpy(big.kernel_used, first->kernel_used, sizeof big.kernel_used);
    big.math_used = first->math_used;
    big.tile_used = first->tile_used;
    big.stream = -1;
    atomic_init(&big.cancel_requested, 0);
    atomic_init(&big.state, GEMM_JOB_RUNNING);
    size_t stack[3];
    int ok = gemm_job_bytes(first, one) && gemm_job_bytes(&big, stack);
    const int by_parts = ok && e->be->run_parts && parts;
    if (by_parts) {
        for (int i = 0; i < n; i++) {
            parts[i] = g[i]->a;
            parts[n + i] = g[i]->b;
            parts[2 * n + i] = g[i]->c;
        }
        big.a_parts = parts;
        big.b_parts = parts + n;
        big.c_parts = parts + 2 * n;
    } else if (ok) {
        big.a = gemm_engine_host_alloc(e, stack[0]);
        big.b = gemm_engine_host_alloc(e, stack[1]);
        big.c = gemm_engine_host_alloc(e, stack[2]);
        ok = big.a && big.b && big.c;
    }
    if (!ok) {
        gemm_engine_host_free(e, big.a);
        gemm_engine_host_free(e, big.b);
        gemm_engine_host_free(e, big.c);
        for (int i = 0; i < n; i++) run_one(e, worker, g[i], i == 0 ? t0 : gemm_now_ms());
        return;
    }
    for (int i = 0; i < n && !by_parts; i++) {
        memcpy((char *)big.a + (size_t)i * one[0], g[i]->a, one[0]);
        memcpy((char *)big.b + (size_t)i * one[1], g[i]->b, one[1]);
    }
    int rc = e->be->run(e->self, worker, &big);
    if (rc != 0 && big.err.status == 507) {
        /* The group does not fit (device_mem_limit, a full device) where each product may:
         * run them one by one, as if never grouped. */
        gemm_engine_host_free(e, big.a);
        gemm_engine_host_free(e, big.b);
        gemm_engine_host_free(e, big.c);
        for (int i = 0; i < n; i++) run_one(e, worker, g[i], i == 0 ? t0 : gemm_now_ms());
        return;
    }
    if (rc == GEMM_RUN_CANCELLED) rc = -1; /* nobody can cancel the synthetic job */
    atomic_fetch_add(&e->groups, 1);
    atomic_fetch_add(&e->grouped, (unsigned long long)n);
    if (rc != 0 && big.err.status == 0)
        gemm_err_set(&big.err, 500, "backend_failure", "the %s backend failed to run a batch of %d products",
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
    gemm_engine_host_free(e, big.a);
    gemm_engine_host_free(e, big.b);
    gemm_engine_host_free(e, big.c);
    for (int i = 0; i < n; i++) finish_one(e, g[i], rc, t0);
}

/* ---- split products -------------------------------------------------------- */

static int splittable(const gemm_engine *e, const gemm_job *job)
{
    if (e->split_mnk == 0 || job->batch > 1 || job->a_res || job->c_res || job->m < 2) return 0;
    double mnk = (double)job->m * (double)job->n * (double)job->k;
    return mnk >= (double)e->split_mnk;
}

/* Callers hold mu: the first panel for slot (any panel once close began), unlinked. */
static gemm_job *take_panel(gemm_engine *e, int slot)
{
    gemm_job *prev = NULL;
    for (gemm_job *it = e->phead; it; prev = it, it = it->q_next) {
        if (!e->closing && it->panel_slot != slot) continue;
        if (prev)
            prev->q_next = it->q_next;
        else
            e->phead = it->q_next;
        if (e->ptail == it) e->ptail = prev;
        it->q_next = NULL;
        return it;
    }
    return NULL;
}

/* Callers hold mu; job is RUNNING, taken by a worker on slot `slot` at t0. Cuts it into
 * panels and queues them on the panel list; returns the number of panels, or 0 when the
 * product runs whole (fewer than two usable engines, or no memory for the panels). */
static int split_start(gemm_engine *e, gemm_job *job, int slot, double t0)
{
    int usable[GEMM_MAX_DEVICES], nu = 0, first = 0;
    for (int s = 0; s < e->nslots; s++) {
        if (e->be->slot_usable && !e->be->slot_usable(e->self, s)) continue;
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
    const size_t es = gemm_dtype_size(job->dtype), ces = gemm_dtype_size(gemm_job_c_dtype(job));
    const uint64_t base = job->m / (uint64_t)ways, extra = job->m % (uint64_t)ways;
    uint64_t row0 = 0;
    for (int i = 0; i < ways; i++) {
        gemm_job *p = &sp->child[i];
        uint64_t rows = base + ((uint64_t)i < extra ? 1 : 0);
        p->dtype = job->dtype;
        p->m = rows, p->k = job->k, p->n = job->n;
        p->a = (unsigned char *)job->a + (size_t)(row0 * job->k) * es;
        p->b = job->b;
        p->c = (unsigned char *)job->c + (size_t)(row0 * job->n) * ces; /* C: its own dtype */
        p->out_half = job->out_half;
        /* Every panel chooses as for the whole product (or the one it is itself a panel of). */
        p->plan_m = gemm_job_plan_rows(job);
        p->b_res = job->b_res; /* the whole B: each device keeps its own copy */
        p->a_block = job->a, p->b_block = job->b, p->c_block = job->c;
        /* What validate() resolved for the whole product, on every panel. */
        snprintf(p->kernel, sizeof p->kernel, "%s", job->kernel_used);
        memcpy(p->kernel_used, job->kernel_used, sizeof p->kernel_used);
        p->tile = job->tile;
        p->tile_used = job->tile_used;
        p->math = job->math;
        p->math_used = job->math_used;
        p->stream = -1;
        p->t_submit_ms = t0;
        atomic_init(&p->state, GEMM_JOB_QUEUED);
        atomic_init(&p->cancel_requested, 0);
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
    wake_all(e); /* panels are for given slots: wake every worker */
    return ways;
}

/* The last panel of a split finished: the product's result from its panels, then its
 * done(). The split state is already detached from the product (cancel no longer sees it). */
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
    finish_one(e, job, rc, t0);
}

/* Runs one panel (taken off the panel list) and, when it is the split's last, ends the
 * product. */
static void run_panel(gemm_engine *e, void *worker, gemm_job *p)
{
    struct gemm_split *sp = p->split_state;
    double t0 = gemm_now_ms();
    p->timing.queue_ms = t0 - p->t_submit_ms;
    atomic_store(&p->state, GEMM_JOB_RUNNING);
    int rc = gemm_job_cancel_requested(p) ? gemm_job_stop_cancelled(p, "it started")
                                          : e->be->run(e->self, worker, p);
    p->timing.compute_ms = gemm_now_ms() - t0;
    if (rc == GEMM_RUN_CANCELLED && p->err.status == 0) gemm_job_stop_cancelled(p, "a stage boundary");
    if (rc != 0 && rc != GEMM_RUN_CANCELLED && p->err.status == 0)
        gemm_err_set(&p->err, 500, "backend_failure", "the %s backend failed to run panel %d of a split product",
                     e->be->name, p->panel_index);
    atomic_store(&p->state, rc == 0 ? GEMM_JOB_DONE : rc == GEMM_RUN_CANCELLED ? GEMM_JOB_CANCELLED
                                                                               : GEMM_JOB_FAILED);

    pthread_mutex_lock(&e->mu);
    if (rc != 0 && rc != GEMM_RUN_CANCELLED && sp->failed < 0) {
        sp->failed = p->panel_index;
        for (int i = 0; i < sp->panels; i++) /* the product has failed: the rest stop early */
            atomic_store(&sp->child[i].cancel_requested, 1);
    } else if (rc == GEMM_RUN_CANCELLED && sp->cancelled < 0) {
        sp->cancelled = p->panel_index;
    }
    int last = --sp->left == 0;
    if (last) sp->parent->split_state = NULL;
    pthread_mutex_unlock(&e->mu);
    if (last) split_finish(e, sp);
}

static void *worker_main(void *arg)
{
    prctl(PR_SET_NAME, "gemm-worker", 0, 0, 0); /* shows in top -H, ps -L, /proc */
    struct worker_arg *wa = arg;
    gemm_engine *e = wa->e;
    void *worker = e->be->worker_init ? e->be->worker_init(e->self, wa->index) : NULL;
    pthread_mutex_lock(&e->mu);
    wa->state = worker;
    wa->between = 1; /* not using its state until it takes a job */
    e->ninited++;
    pthread_cond_broadcast(&e->inited);
    pthread_mutex_unlock(&e->mu);
    /* Room for a group (and its blocks, for a backend that copies them itself); without
     * it this worker runs products one by one. */
    gemm_job **g = e->group_max > 1 ? calloc((size_t)e->group_max, sizeof *g) : NULL;
    void **parts = g && e->be->run_parts ? calloc(3 * (size_t)e->group_max, sizeof *parts) : NULL;

    const int slot = wa->slot;
    int took = 0; /* this worker counts in slot_busy[slot] */
    for (;;) {
        pthread_mutex_lock(&e->mu);
        int may_spin = took && e->spin_ns > 0;
        if (took) e->slot_busy[slot]--, took = 0;
        wa->between = 1;
        gemm_job *panel = NULL;
        for (;;) {
            if (wa->lent) { /* a submitting thread runs on this worker's state: wait for it */
                /* a wake-up for the queue may have come here: pass it to another worker */
                if (e->head || e->phead) pthread_cond_signal(&e->slot_cv[slot]);
                while (wa->lent) pthread_cond_wait(&wa->back, &e->mu);
                continue;
            }
            if ((panel = take_panel(e, slot)) || e->closing) break;
            if (e->head) {
                int best = pick_slot(e, slot);
                if (best == slot) break;
                if (best >= 0) pthread_cond_signal(&e->slot_cv[best]); /* it is theirs */
            }
            if (may_spin) { /* once, right after a job: poll before sleeping */
                may_spin = 0;
                unsigned long seen = atomic_load(&e->work_seq);
                pthread_mutex_unlock(&e->mu);
                spin_for_work(e, seen);
                pthread_mutex_lock(&e->mu);
                continue;
            }
            pthread_cond_wait(&e->slot_cv[slot], &e->mu);
        }
        wa->between = 0;
        if (panel) { /* panels of products already running come first */
            e->slot_busy[slot]++, took = 1;
            if (e->head) kick(e); /* the wake-up may have been for the queue */
            pthread_mutex_unlock(&e->mu);
            run_panel(e, worker, panel);
            continue;
        }
        gemm_job *job = q_pop(e);
        if (!job) { /* closing and nothing left */
            pthread_mutex_unlock(&e->mu);
            break;
        }
        e->slot_busy[slot]++, took = 1;
        atomic_fetch_add(&e->running, 1);
        double t0 = gemm_now_ms();
        job->timing.queue_ms = t0 - job->t_submit_ms;
        atomic_store(&job->state, GEMM_JOB_RUNNING); /* under the lock: cancel sees it */
        if (splittable(e, job) && !gemm_job_cancel_requested(job) && split_start(e, job, slot, t0) > 0) {
            pthread_mutex_unlock(&e->mu);
            continue; /* this worker takes a panel like any other */
        }
        if (!g || !groupable(e, job)) {
            if (e->head) kick(e);
            pthread_mutex_unlock(&e->mu);
            run_one(e, worker, job, t0);
            continue;
        }
        g[0] = job;
        int n = 1;
        take_group(e, g, &n, t0);
        if (n < e->group_max && e->group_delay_ms > 0) {
            struct timespec until = deadline_in(e->group_delay_ms);
            /* Others queued meanwhile that are not of this group are for other workers. */
            if (e->head) kick(e);
            while (n < e->group_max && !e->closing) {
                e->group_waiters++;
                int rc = pthread_cond_timedwait(&e->grouping, &e->mu, &until);
                e->group_waiters--;
                if (rc != 0) break;
                take_group(e, g, &n, gemm_now_ms());
            }
            take_group(e, g, &n, gemm_now_ms());
        }
        if (e->head) kick(e);
        pthread_mutex_unlock(&e->mu);
        if (n == 1)
            run_one(e, worker, job, t0);
        else
            run_group(e, worker, g, n, t0, parts);
    }
    free(parts);
    free(g);

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
    for (int i = 0; i < GEMM_MAX_DEVICES; i++) pthread_cond_destroy(&e->slot_cv[i]);
    pthread_cond_destroy(&e->grouping);
    pthread_cond_destroy(&e->inited);
    for (int i = 0; i < e->nback; i++) pthread_cond_destroy(&e->args[i].back);
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
    return gemm_engine_open_backend(be, cfg, err);
}

gemm_engine *gemm_engine_open_backend(const gemm_backend *be, const gemm_engine_config *cfg, gemm_err *err)
{
    gemm_engine_config defaults;
    if (!cfg) {
        gemm_engine_config_defaults(&defaults);
        cfg = &defaults;
    }
    gemm_err_clear(err);
    if (!be || !be->open || !be->workers || !be->run || !be->close) {
        gemm_err_set(err, 500, "internal_error", "a backend needs open, workers, run and close");
        return NULL;
    }

    gemm_engine *e = calloc(1, sizeof *e);
    if (!e) {
        gemm_err_set(err, 500, "out_of_memory", "cannot allocate the engine");
        return NULL;
    }
    e->be = be;
    e->capacity = cfg->queue_depth > 0 ? cfg->queue_depth : 64;
    e->group_max = cfg->batch_max >= 1 ? cfg->batch_max : be->batch_default > 0 ? be->batch_default : 1;
    if (e->group_max > GEMM_COALESCE_MAX) e->group_max = GEMM_COALESCE_MAX;
    e->group_delay_ms = cfg->batch_max_delay_us > 0 ? cfg->batch_max_delay_us / 1000.0 : 0;
    e->group_mnk = cfg->batch_max_mnk ? cfg->batch_max_mnk : 1ull << 24;
    e->split_mnk = cfg->split_min_mnk; /* off below when it could never split */
    e->split_ways = cfg->split_ways > GEMM_SPLIT_MAX ? GEMM_SPLIT_MAX : cfg->split_ways > 0 ? cfg->split_ways : 0;
    atomic_init(&e->work_seq, 0);
    atomic_init(&e->running, 0);
    e->spin_ns = cfg->worker_spin_us > 0 ? (long)cfg->worker_spin_us * 1000L : 0;
    atomic_init(&e->splits, 0);
    atomic_init(&e->panels, 0);
    atomic_init(&e->completed, 0);
    atomic_init(&e->failed, 0);
    atomic_init(&e->cancelled, 0);
    atomic_init(&e->rejected, 0);
    atomic_init(&e->compute_ns, 0);
    atomic_init(&e->groups, 0);
    atomic_init(&e->grouped, 0);
    atomic_init(&e->ran_here, 0);
    atomic_init(&e->ran_host, 0);
    atomic_init(&e->host_active, 0);
    atomic_init(&e->closing, 0);
    /* the host path is for a backend with a device to spare; never under fault hooks */
    if (be != &gemm_backend_cpu && !cfg->fault_inject[0])
        e->host_mnk = cfg->host_max_mnk > GEMM_HOST_MAX_MNK ? GEMM_HOST_MAX_MNK : cfg->host_max_mnk;
    pthread_mutex_init(&e->mu, NULL);
    for (int i = 0; i < GEMM_MAX_DEVICES; i++) pthread_cond_init(&e->slot_cv[i], NULL);
    pthread_cond_init(&e->grouping, NULL);
    pthread_cond_init(&e->inited, NULL);

    if (e->host_mnk) gemm_host_threads_one();
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
    e->nslots = 1;
    for (; e->nback < e->nworkers; e->nback++) pthread_cond_init(&e->args[e->nback].back, NULL);
    for (int i = 0; i < e->nworkers; i++) {
        int slot = e->be->worker_slot ? e->be->worker_slot(e->self, i) : 0;
        if (slot < 0 || slot >= GEMM_MAX_DEVICES) slot = 0;
        e->args[i].slot = slot;
        e->slot_workers[slot]++;
        if (slot + 1 > e->nslots) e->nslots = slot + 1;
    }
    /* Splitting needs two panels at least: with one worker, split_ways 1, or one device
     * and split_ways 0 it is off (and products it would have taken stay groupable). */
    int most = e->split_ways > 0 ? e->split_ways : e->nslots;
    if (most > e->nworkers) most = e->nworkers;
    if (most < 2) e->split_mnk = 0;
    for (int i = 0; i < e->nworkers; i++) {
        e->args[i].e = e;
        e->args[i].index = i;
        int rc = pthread_create(&e->threads[i], NULL, worker_main, &e->args[i]);
        if (rc != 0) {
            gemm_err_set(err, 500, "backend_failure", "cannot start worker thread %d of %d: %s", i,
                         e->nworkers, strerror(rc));
            pthread_mutex_lock(&e->mu);
            e->closing = 1;
            wake_all(e);
            pthread_mutex_unlock(&e->mu);
            for (int j = 0; j < e->nstarted; j++) pthread_join(e->threads[j], NULL);
            engine_free(e);
            return NULL;
        }
        e->nstarted++;
    }
    /* With warm-up, open returns once every worker is set up and warm: a daemon that
     * listens after open never lets its first requests pay for it. */
    if (cfg->warmup) {
        pthread_mutex_lock(&e->mu);
        while (e->ninited < e->nworkers) pthread_cond_wait(&e->inited, &e->mu);
        pthread_mutex_unlock(&e->mu);
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
    wake_all(e);
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
    /* Host runs that counted themselves before they saw closing end on their own thread;
     * each is one small product. */
    while (atomic_load(&e->host_active) > 0) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    engine_free(e);
}

/* ---- submit / cancel ----------------------------------------------------- */

int gemm_job_bytes(const gemm_job *job, size_t out[3])
{
    uint64_t nb = gemm_job_batch(job), nbb = job->b_shared ? 1 : nb;
    size_t a, b, c;
    if (!gemm_matrix_bytes(job->m, job->k, job->dtype, &a) ||
        !gemm_matrix_bytes(job->k, job->n, job->dtype, &b) ||
        !gemm_matrix_bytes(job->m, job->n, gemm_job_c_dtype(job), &c) || (uint64_t)(size_t)nb != nb ||
        !gemm_mul_size(a, (size_t)nb, &out[0]) || !gemm_mul_size(b, (size_t)nbb, &out[1]) ||
        !gemm_mul_size(c, (size_t)nb, &out[2]))
        return 0;
    return 1;
}

/* The idle worker whose state submit_here may borrow for job: only when nothing is
 * queued (a job run here must not pass one that waits) and the job would not be split,
 * one of the slot a queued job would go to, between jobs and past its set-up; the lowest
 * index, so that one worker's state (its pinned blocks, its caches) serves a run of
 * requests. NULL: queue it. Callers hold mu. */
static struct worker_arg *lendable(gemm_engine *e, const gemm_job *job)
{
    if (e->head || e->phead || splittable(e, job) || (e->be->quick && !e->be->quick(e->self))) return NULL;
    int s = pick_slot(e, -1);
    if (s < 0 || !slot_ok(e, s)) return NULL;
    for (int i = 0; i < e->nstarted; i++) {
        struct worker_arg *w = &e->args[i];
        if (w->slot == s && w->between && !w->lent) return w;
    }
    return NULL;
}

/* Runs job on the submitting thread, on the lent worker's state (see the head of this
 * file); gives the worker back only after done() and running--, so that close (which
 * joins the workers, and a lent one waits for its state) cannot free the engine under it. */
static void run_here(gemm_engine *e, struct worker_arg *w, gemm_job *job)
{
    double t0 = gemm_now_ms();
    job->timing.queue_ms = t0 - job->t_submit_ms;
    finish_job(e, job, run_job(e, w->state, job), t0);
    pthread_mutex_lock(&e->mu);
    atomic_fetch_sub(&e->running, 1);
    e->slot_busy[w->slot]--;
    w->lent = 0;
    pthread_cond_signal(&w->back);
    if (e->head) kick(e); /* queued meanwhile: this slot has an idle worker again */
    pthread_mutex_unlock(&e->mu);
}

int gemm_engine_runs_on_host(const gemm_engine *e, const gemm_job *job)
{
    if (!e || !e->host_mnk || !job) return 0;
    if (job->dtype != GEMM_DTYPE_F32 && job->dtype != GEMM_DTYPE_F64 && job->dtype != GEMM_DTYPE_I32)
        return 0;
    if (job->kernel[0] && strcmp(job->kernel, "auto") != 0) return 0; /* a kernel asked for by name */
    if (job->math != GEMM_MATH_DEFAULT && job->math != GEMM_MATH_FP32) return 0; /* tensor cores */
    if (job->tile || job->plan_m || job->a_res || job->b_res || job->c_res) return 0;
    if (job->m == 0 || job->k == 0 || job->n == 0) return 0;
    double mnk = (double)job->m * (double)job->n * (double)job->k * (double)gemm_job_batch(job);
    return mnk <= (double)e->host_mnk;
}

/* The host path (see the head of this file): counted in host_active before closing is
 * read, so that close() either refuses it here or waits for it. 1: ran (done() called). */
static int run_on_host(gemm_engine *e, gemm_job *job, gemm_err *err)
{
    atomic_fetch_add(&e->host_active, 1);
    if (atomic_load(&e->closing)) {
        atomic_fetch_sub(&e->host_active, 1);
        atomic_fetch_add(&e->rejected, 1);
        return gemm_err_set(err, 503, "shutting_down", "the server is shutting down; retry elsewhere");
    }
    double t0 = gemm_now_ms();
    job->t_submit_ms = t0;
    job->timing.queue_ms = 0;
    atomic_fetch_add(&e->running, 1);
    atomic_fetch_add(&e->ran_here, 1);
    atomic_fetch_add(&e->ran_host, 1);
    atomic_store(&job->state, GEMM_JOB_RUNNING);
    finish_one(e, job, gemm_host_product(job), t0);
    atomic_fetch_sub(&e->host_active, 1);
    return 1;
}

static int submit(gemm_engine *e, gemm_job *job, int here, gemm_err *err)
{
    gemm_err_clear(err);
    if (!e || !job)
        return gemm_err_set(err, 500, "internal_error", "submit called without an engine or a job");
    if (gemm_dtype_size(job->dtype) == 0)
        return gemm_err_set(err, 422, "bad_dtype", "unsupported dtype; use float32, float64, int32, float16 or bfloat16");
    if (job->m == 0 || job->k == 0 || job->n == 0)
        return gemm_err_set(err, 422, "empty_matrix",
                            "m, k and n must each be at least 1 (got m=%llu k=%llu n=%llu)",
                            (unsigned long long)job->m, (unsigned long long)job->k,
                            (unsigned long long)job->n);
    if (job->batch > GEMM_MAX_BATCH)
        return gemm_err_set(err, 413, "too_large", "a batch of %llu products is more than the "
                            "engine takes in one job (%d)", (unsigned long long)job->batch,
                            GEMM_MAX_BATCH);
    if (job->plan_m && job->plan_m < job->m)
        return gemm_err_set(err, 422, "bad_option",
                            "panel_of=%llu is fewer rows than this product's A has (m=%llu): a panel "
                            "is part of a product at least as tall",
                            (unsigned long long)job->plan_m, (unsigned long long)job->m);
    if (job->plan_m && job->batch > 1)
        return gemm_err_set(err, 422, "bad_option", "panel_of is for a single product, not a batch");
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
    job->zero_copy = 0;
    job->split_panels = 0;
    memset(job->split, 0, sizeof job->split);
    atomic_store(&job->cancel_requested, 0);
    job->q_next = NULL;
    job->split_state = NULL;
    job->panel_index = job->panel_slot = 0;
    job->a_block = job->b_block = job->c_block = NULL;

    if (here && gemm_engine_runs_on_host(e, job)) return run_on_host(e, job, err);
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
    struct worker_arg *w = here ? lendable(e, job) : NULL;
    if (w) {
        w->lent = 1;
        e->slot_busy[w->slot]++;
        atomic_fetch_add(&e->running, 1);
        atomic_fetch_add(&e->ran_here, 1);
        atomic_store(&job->state, GEMM_JOB_RUNNING); /* under the lock: cancel sees it */
        pthread_mutex_unlock(&e->mu);
        run_here(e, w, job);
        return 1;
    }
    atomic_store(&job->state, GEMM_JOB_QUEUED);
    q_push(e, job);
    if (e->group_waiters) pthread_cond_broadcast(&e->grouping);
    kick(e);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

int gemm_engine_submit(gemm_engine *e, gemm_job *job, gemm_err *err)
{
    return submit(e, job, 0, err);
}

int gemm_engine_submit_here(gemm_engine *e, gemm_job *job, gemm_err *err)
{
    return submit(e, job, 1, err);
}

int gemm_engine_cancel(gemm_engine *e, gemm_job *job)
{
    if (!e || !job) return 0;
    pthread_mutex_lock(&e->mu);
    int removed = q_remove(e, job);
    if (!removed) {
        atomic_store(&job->cancel_requested, 1); /* running: the worker stops it */
        struct gemm_split *sp = job->split_state; /* split: every panel stops */
        for (int i = 0; sp && i < sp->panels; i++) atomic_store(&sp->child[i].cancel_requested, 1);
    }
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

void gemm_engine_set_keep_charge(gemm_engine *e, gemm_keep_charge_fn fn, void *ctx)
{
    if (e && e->be->set_keep_charge)
        e->be->set_keep_charge(e->self, fn, ctx);
}

uint64_t gemm_engine_trim_kept(gemm_engine *e)
{
    return (e && e->be->trim_kept) ? e->be->trim_kept(e->self) : 0;
}

void *gemm_engine_host_alloc(gemm_engine *e, size_t bytes)
{
    return gemm_alloc(gemm_engine_allocator(e), bytes);
}

void gemm_engine_host_free(gemm_engine *e, void *p)
{
    gemm_free(gemm_engine_allocator(e), p);
}

gemm_resident *gemm_engine_resident_new(gemm_engine *e, const void *host, size_t bytes)
{
    (void)e;
    gemm_resident *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->host = host;
    r->bytes = bytes;
    pthread_mutex_init(&r->mu, NULL);
    return r;
}

void gemm_engine_resident_free(gemm_engine *e, gemm_resident *r)
{
    if (!r) return;
    if (e && e->be->resident_free) {
        e->be->resident_free(e->self, r);
        return;
    }
    pthread_mutex_destroy(&r->mu);
    free(r);
}

uint64_t gemm_engine_small_mnk(const gemm_engine *e) { return e->group_mnk; }

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
    out->running = atomic_load(&e->running);
    out->nslots = e->nslots;
    for (int s = 0; s < e->nslots; s++) out->slot_busy[s] = e->slot_busy[s];
    pthread_mutex_unlock(&e->mu);
    out->completed = atomic_load(&e->completed);
    out->failed = atomic_load(&e->failed);
    out->cancelled = atomic_load(&e->cancelled);
    out->rejected = atomic_load(&e->rejected);
    out->compute_seconds = (double)atomic_load(&e->compute_ns) / 1e9;
    out->coalesced_launches = atomic_load(&e->groups);
    out->coalesced_products = atomic_load(&e->grouped);
    out->ran_here = atomic_load(&e->ran_here);
    out->ran_host = atomic_load(&e->ran_host);
    out->split_products = atomic_load(&e->splits);
    out->split_panels = atomic_load(&e->panels);
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
