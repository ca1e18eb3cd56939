/*
 * cuda_run.c - one product on a worker's stream in stages, then one unwind that tells an
 * out-of-memory (that product alone) from a broken context (reset on leaving). A product
 * runs the same launch alone, lent, as a panel or coalesced (docs/KERNELS.md, "kernel=auto").
 * A long product runs staged: it waits for each stage and checks for a cancel before the
 * next; a short one enqueues all three back to back.
 */
#include "cuda_engine.h"

#include <stdio.h>
#include <string.h>

#include "gemm_kernels.h"
#include "gemm_scratch.h"

#define STAGED_MIN_FLOP 2.7e11          /* ~5 ms on the fast members of an H100 */
#define STAGED_MIN_FLOP_SLOW 1.7e10     /* naive and tiled: ~10x slower */
#define STAGED_MIN_BYTES (256ull << 20) /* copies of ~5-10 ms */
/* 64³ products kept their p50 at 47.6 us with this poll, while a worker waiting beside a
 * 500 ms kernel used 0.08% of a core (bench/results/h100-2026-11-23-hardening.md) */
#define WAIT_SPIN_MS 0.05
#define PART_ALIGN 256 /* a group's products' steps: a lone product's buffer alignment */

enum { GO, STOP, CUDA_FAILED }; /* a stage's answer; STOP: x->rc, CUDA_FAILED: x->site */

typedef struct {
    cuda_backend *cb;
    cuda_worker *w;
    cuda_dev *d;
    gemm_job *job;
    const gemm_kernel_desc *k;
    gemm_cuda_site site;
    const char *stage;
    int rc, entered, broken, lose;
    unsigned gen, held;  /* the device's generation; other devices held (gemm_cuda_pin) */
    int staged;          /* stage by stage */
    long njob;
    uint64_t nb, total;
    size_t need[3], upload[2], res_bytes;
    size_t one[3], step[3]; /* A, B, C of one product; bytes between products on the device */
    double res_ms, flops;
    void *op[2];         /* device A and B: the worker's buffers or resident copies (C: buf[2]) */
    void *keep;          /* C's resident device copy, until published */
    cudaEvent_t k0, d0;  /* the kernel's and the D2H's start events */
} run_ctx;

static float ev_ms(cudaEvent_t a, cudaEvent_t b, gemm_cuda_site *site)
{
    float ms = 0;
    return GEMM_CUDA_CHECK(site, cudaEventElapsedTime(&ms, a, b)) == cudaSuccess ? ms : 0;
}

static cudaError_t wait_event(cudaEvent_t ev)
{
    double t0 = gemm_now_ms();
    cudaError_t e;
    while ((e = cudaEventQuery(ev)) == cudaErrorNotReady && gemm_now_ms() - t0 < WAIT_SPIN_MS) {
    }
    if (e != cudaErrorNotReady) return e;
    if (cudaPeekAtLastError() == cudaErrorNotReady) /* "not ready" is no error: never keep it */
        cudaGetLastError();
    return cudaEventSynchronize(ev);
}

/* Copies, COPY_CHUNK a cudaMemcpyBatchAsync (as cheap as one copy of a gathered stack:
 * bench/bench_small_path.cu), one by one where the driver declines it (or copy_loop:1). */
enum { COPY_CHUNK = 64 };
typedef struct {
    void *dst[COPY_CHUNK];
    const void *src[COPY_CHUNK];
    size_t size[COPY_CHUNK];
    size_t n;
    enum cudaMemcpyKind kind;
    cudaStream_t s;
    gemm_cuda_site *site;
    cudaError_t err;
    int one_by_one;
} copy_list;

static cudaError_t copies_flush(copy_list *c)
{
    if (c->err != cudaSuccess || c->n == 0) return c->err;
    if (c->n == 1) {
        c->err = GEMM_CUDA_CHECK(c->site, cudaMemcpyAsync(c->dst[0], c->src[0], c->size[0], c->kind, c->s));
    } else {
        struct cudaMemcpyAttributes at;
        memset(&at, 0, sizeof at);
        at.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        size_t first = 0;
        cudaError_t e = c->one_by_one ? cudaErrorNotSupported
                                      : cudaMemcpyBatchAsync(c->dst, c->src, c->size, c->n, &at, &first, 1, c->s);
        if (e == cudaErrorNotSupported || e == cudaErrorInvalidValue) {
            cudaGetLastError(); /* declined, not failed: nothing was queued */
            for (size_t i = 0; i < c->n && c->err == cudaSuccess; i++)
                c->err = GEMM_CUDA_CHECK(c->site, cudaMemcpyAsync(c->dst[i], c->src[i], c->size[i], c->kind, c->s));
        } else {
            c->err = GEMM_CUDA_CHECK(c->site, e);
        }
    }
    c->n = 0;
    return c->err;
}

static void copies_add(copy_list *c, void *dst, const void *src, size_t size)
{
    if (size == 0 || c->err != cudaSuccess) return;
    c->dst[c->n] = dst;
    c->src[c->n] = src;
    c->size[c->n] = size;
    if (++c->n == COPY_CHUNK) copies_flush(c);
}

static int stop_with(run_ctx *x, int rc)
{
    x->rc = rc;
    return STOP;
}

/* ---- the stages ------------------------------------------------------------ */

/* The kernel, the sizes (a group's products at PART_ALIGN steps), whether to stage. */
static int plan(run_ctx *x)
{
    gemm_job *job = x->job;
    memcpy(job->device, x->d->label, sizeof job->device);
    job->stream = x->w->stream_index;
    x->k = gemm_kernel_find(job->kernel_used);
    if (!x->k) /* validate() always resolves; this only guards direct misuse */
        return stop_with(x, gemm_engine_err_set(&job->err, GEMM_E_INTERNAL,
                                                "job reached the CUDA worker without a resolved kernel (\"%s\")",
                                                job->kernel_used));
    x->nb = gemm_job_batch(job);
    int ok = gemm_job_bytes(job, x->need); /* 0 for a bad dtype too */
    for (int i = 0; ok && i < 3; i++) {
        const int shared = i == 1 && job->b_shared;
        x->one[i] = x->need[i] / (shared ? 1 : x->nb);
        x->step[i] = shared ? 0 : x->one[i];
        if (job->a_parts) {
            x->step[i] = (x->one[i] + PART_ALIGN - 1) / PART_ALIGN * PART_ALIGN;
            ok = gemm_mul_size(x->step[i], (size_t)x->nb, &x->need[i]);
        }
    }
    if (!ok) return stop_with(x, gemm_engine_err_set(&job->err, GEMM_E_TOO_LARGE, "the product's size overflows"));
    x->total = (uint64_t)x->need[0] + x->need[1] + x->need[2];
    if (x->cb->mem_limit && x->total > x->cb->mem_limit)
        return stop_with(x, gemm_engine_err_set(&job->err, GEMM_E_DEVICE_OOM,
                                                "the product needs %llu bytes of device memory (A %zu, B %zu, C %zu); "
                                                "device_mem_limit allows %llu bytes per stream",
                                                (unsigned long long)x->total, x->need[0], x->need[1], x->need[2],
                                                (unsigned long long)x->cb->mem_limit));
    x->flops = 2.0 * (double)x->nb * (double)job->m * (double)job->n * (double)job->k;
    const int slow = strcmp(x->k->name, "naive") == 0 || strcmp(x->k->name, "tiled") == 0;
    x->staged = x->cb->delay_ms > 0 || x->total >= STAGED_MIN_BYTES ||
                x->flops >= (slow ? STAGED_MIN_FLOP_SLOW : STAGED_MIN_FLOP);
    return GO;
}

/* The worker's buffers; one more try when the failure gave cached buffers back. */
static int buffers(run_ctx *x)
{
    for (int tries = x->w->cap[0] + x->w->cap[1] + x->w->cap[2] > 0 ? 2 : 1; tries > 0; tries--) {
        memset(&x->site, 0, sizeof x->site);
        if (gemm_cuda_ensure_buffers(x->w, x->need, &x->site) == cudaSuccess) return GO;
        if (x->site.err != cudaErrorMemoryAllocation) return CUDA_FAILED;
        cudaGetLastError();
    }
    gemm_cuda_sample_memory(x->d); /* on the worker: a CUDA call is fine here */
    return stop_with(x, gemm_engine_err_set(&x->job->err, GEMM_E_DEVICE_OOM,
                                            "%s is out of memory: the product needs %llu bytes on the device (A %zu, "
                                            "B %zu, C %zu) and %llu of %llu bytes are free",
                                            x->job->device, (unsigned long long)x->total, x->need[0], x->need[1],
                                            x->need[2], (unsigned long long)atomic_load(&x->d->mem_free),
                                            (unsigned long long)atomic_load(&x->d->mem_total)));
}

/* Enters the device, (re)builds resources after a reset, the buffers, the lost:N hook. */
static int enter(run_ctx *x)
{
    cuda_dev *d = x->d;
    x->gen = gemm_cuda_dev_enter(d);
    x->entered = 1;
    if (atomic_load(&d->lost))
        return stop_with(x, gemm_engine_err_set(&x->job->err, GEMM_E_DEVICE_LOST,
                                                "%s could not be recovered after an earlier device error (%s); restart "
                                                "gemmd or send the product to another server",
                                                x->job->device, cudaGetErrorString(d->lost_err)));
    if (gemm_job_cancel_requested(x->job))
        return stop_with(x, gemm_job_stop_cancelled(x->job, "its host-to-device copy"));
    if (GEMM_CUDA_CHECK(&x->site, cudaSetDevice(d->ordinal)) != cudaSuccess) return CUDA_FAILED;
    if (x->w->gen != x->gen) {
        if (x->w->gen != 0)
            gemm_cuda_destroy_resources(x->w); /* only when built before a reset that skipped it */
        if (gemm_cuda_build_resources(x->w, x->gen, &x->site) != cudaSuccess) return CUDA_FAILED;
    }
    x->stage = "device allocation";
    int st = buffers(x);
    if (st != GO) return st;
    x->njob = atomic_fetch_add(&x->cb->jobs, 1) + 1;
    if (x->cb->lost_at > 0 && x->njob == x->cb->lost_at) {
        /* Test hook: marked lost at once, reset on leaving, as when a reset cannot make a
         * new context. */
        d->lost_err = cudaErrorDevicesUnavailable;
        atomic_store(&d->lost, 1);
        x->broken = x->lose = 1;
        return stop_with(x, gemm_engine_err_set(&x->job->err, GEMM_E_DEVICE,
                                                "%s was lost while running this product (fault_inject lost:%ld)",
                                                x->job->device, x->cb->lost_at));
    }
    return GO;
}

/* Host blocks locked, resident operands from their device copies (making one is H2D). */
static int stage_inputs(run_ctx *x)
{
    gemm_job *job = x->job;
    cuda_dev *d = x->d;
    if (job->a_parts) {
        for (uint64_t i = 0; i < x->nb; i++) {
            gemm_cuda_pin(x->cb, d, job->a_parts[i], &x->held);
            gemm_cuda_pin(x->cb, d, job->b_parts[i], &x->held);
            gemm_cuda_pin(x->cb, d, job->c_parts[i], &x->held);
        }
    } else {
        gemm_cuda_pin(x->cb, d, job->a_block ? job->a_block : job->a, &x->held);
        gemm_cuda_pin(x->cb, d, job->b, &x->held); /* a panel has the whole B */
        gemm_cuda_pin(x->cb, d, job->c_block ? job->c_block : job->c, &x->held);
    }
    gemm_resident *const res[2] = {job->a_res, job->b_res};
    for (int i = 0; i < 2; i++) {
        x->op[i] = x->w->buf[i];
        x->upload[i] = i == 1 && job->b_shared ? x->one[1] : x->one[i] * x->nb;
        if (x->nb <= 1 && res[i] &&
            gemm_cuda_resident_get(x->cb, d, x->gen, res[i], x->w->stream, &x->op[i], &x->res_bytes, &x->res_ms))
            x->upload[i] = 0;
    }
    return GO;
}

/* H2D: ev[0] .. ev[1]; A and B in one call (a group: every product's, into the stacks). */
static int copy_in(run_ctx *x)
{
    gemm_job *job = x->job;
    cudaEvent_t *ev = x->w->ev;
    x->stage = "H2D copy";
    copy_list cp = {.kind = cudaMemcpyHostToDevice, .s = x->w->stream, .site = &x->site,
                    .one_by_one = x->cb->copy_loop != 0};
    if (GEMM_CUDA_CHECK(&x->site, cudaEventRecord(ev[0], x->w->stream)) != cudaSuccess) return CUDA_FAILED;
    if (job->a_parts) {
        for (uint64_t i = 0; i < x->nb; i++) {
            copies_add(&cp, (char *)x->op[0] + i * x->step[0], job->a_parts[i], x->one[0]);
            copies_add(&cp, (char *)x->op[1] + i * x->step[1], job->b_parts[i], x->one[1]);
        }
    } else {
        copies_add(&cp, x->op[0], job->a, x->upload[0]);
        copies_add(&cp, x->op[1], job->b, x->upload[1]);
    }
    if (copies_flush(&cp) != cudaSuccess ||
        GEMM_CUDA_CHECK(&x->site, cudaEventRecord(ev[1], x->w->stream)) != cudaSuccess)
        return CUDA_FAILED;
    return GO;
}

/* The next stage's start: ev[end], or staged ev[end + 1] after a wait and a cancel check. */
static int stage_start(run_ctx *x, int end, cudaEvent_t *start, const char *before)
{
    const cudaEvent_t done = x->w->ev[end], next = x->w->ev[end + 1];
    *start = x->staged ? next : done;
    if (!x->staged) return GO;
    if (GEMM_CUDA_CHECK(&x->site, wait_event(done)) != cudaSuccess) return CUDA_FAILED;
    if (gemm_job_cancel_requested(x->job)) {
        x->job->timing.h2d_ms = ev_ms(x->w->ev[0], x->w->ev[1], &x->site);
        if (end == 3) x->job->timing.kernel_ms = ev_ms(x->k0, x->w->ev[3], &x->site);
        return stop_with(x, gemm_job_stop_cancelled(x->job, before));
    }
    return GEMM_CUDA_CHECK(&x->site, cudaEventRecord(next, x->w->stream)) == cudaSuccess ? GO : CUDA_FAILED;
}

/* The kernel: k0 .. ev[3]; a batch strided (stride_b 0: shared B) or a launch per product. */
static int launch(run_ctx *x)
{
    gemm_job *job = x->job;
    cudaEvent_t *ev = x->w->ev;
    cudaStream_t s = x->w->stream;
    int st = stage_start(x, 1, &x->k0, "its kernel");
    if (st != GO) return st;
    x->stage = "kernel";
    if (x->cb->sticky_at > 0 && x->njob == x->cb->sticky_at &&
        GEMM_CUDA_CHECK(&x->site, gemm_cuda_launch_trap(s)) != cudaSuccess)
        return CUDA_FAILED;
    if (x->cb->delay_ms > 0 && GEMM_CUDA_CHECK(&x->site, gemm_cuda_launch_delay(s, x->cb->delay_ms)) != cudaSuccess)
        return CUDA_FAILED;
    gemm_launch l = {
        .dtype = job->dtype, .math = job->math_used,
        .m = (int)job->m, .n = (int)job->n, .k = (int)job->k,
        .A = x->op[0], .B = x->op[1], .C = x->w->buf[2],
        .tile = job->tile, /* 0: the kernel chooses by shape */
        .stream = s, .cublas = x->w->blas, .lt = x->w->lt,
        .out_half = job->out_half,
        .plan_m = (int)gemm_job_plan_rows(job), /* m when it is whole: the same choice */
    };
    if (x->k->plan) job->tile_used = x->k->plan(&l, job->block, sizeof job->block);
    const int strided = x->nb > 1 && x->k->batch_native && !job->a_parts;
    if (strided) {
        l.batch = (int)x->nb;
        l.stride_a = (long long)(job->m * job->k);
        l.stride_b = job->b_shared ? 0 : (long long)(job->k * job->n);
        l.stride_c = (long long)(job->m * job->n);
        if (GEMM_CUDA_CHECK(&x->site, x->k->launch(&l)) != cudaSuccess) return CUDA_FAILED;
    } else {
        for (uint64_t i = 0; i < x->nb; i++) { /* back to back on the stream */
            l.A = (const char *)x->op[0] + i * x->step[0];
            l.B = (const char *)x->op[1] + i * x->step[1];
            l.C = (char *)x->w->buf[2] + i * x->step[2];
            if (GEMM_CUDA_CHECK(&x->site, x->k->launch(&l)) != cudaSuccess) return CUDA_FAILED;
        }
    }
    if (x->nb > 1) {
        job->batched = x->nb;
        snprintf(job->batch_mode, sizeof job->batch_mode, "%s", strided ? "strided" : "loop");
    }
    if (GEMM_CUDA_CHECK(&x->site, cudaEventRecord(ev[3], s)) != cudaSuccess) return CUDA_FAILED;
    if (x->nb <= 1 && job->c_res) /* C stays on the device for the next product (before the D2H) */
        x->keep = gemm_cuda_resident_keep(x->w->buf[2], x->need[2], s, cudaMemcpyDeviceToDevice);
    return GO;
}

/* D2H: d0 .. ev[5] (d0 = ev[3] when back to back). */
static int copy_out(run_ctx *x)
{
    gemm_job *job = x->job;
    cudaEvent_t *ev = x->w->ev;
    int st = stage_start(x, 3, &x->d0, "its device-to-host copy");
    if (st != GO) return st;
    x->stage = "D2H copy";
    copy_list cp = {.kind = cudaMemcpyDeviceToHost, .s = x->w->stream, .site = &x->site,
                    .one_by_one = x->cb->copy_loop != 0};
    if (job->c_parts) {
        for (uint64_t i = 0; i < x->nb; i++)
            copies_add(&cp, job->c_parts[i], (const char *)x->w->buf[2] + i * x->step[2], x->one[2]);
    } else {
        copies_add(&cp, job->c, x->w->buf[2], x->need[2]);
    }
    if (copies_flush(&cp) != cudaSuccess ||
        GEMM_CUDA_CHECK(&x->site, cudaEventRecord(ev[5], x->w->stream)) != cudaSuccess)
        return CUDA_FAILED;
    return GO;
}

/* Waits for the last event; timing, C's resident copy published, the byte counters. */
static int finish(run_ctx *x)
{
    gemm_job *job = x->job;
    cudaEvent_t *ev = x->w->ev;
    x->stage = "synchronize";
    if (GEMM_CUDA_CHECK(&x->site, wait_event(ev[5])) != cudaSuccess) return CUDA_FAILED;
    const size_t up = x->upload[0] + x->upload[1] + x->res_bytes;
    job->timing.h2d_ms = up > 0 ? ev_ms(ev[0], ev[1], &x->site) + x->res_ms : 0;
    job->timing.kernel_ms = ev_ms(x->k0, ev[3], &x->site);
    job->timing.d2h_ms = ev_ms(x->d0, ev[5], &x->site);
    if (x->site.err != cudaSuccess) return CUDA_FAILED;
    if (x->keep) {
        gemm_cuda_resident_publish(x->d, x->gen, job->c_res, x->keep);
        x->keep = NULL;
    }
    job->timing.gflops = job->timing.kernel_ms > 0 ? x->flops / (job->timing.kernel_ms * 1e6) : 0;
    if (!x->w->warming) {
        atomic_fetch_add(&x->d->bytes_h2d, (unsigned long long)up);
        atomic_fetch_add(&x->d->bytes_d2h, (unsigned long long)(x->one[2] * x->nb));
    }
    return stop_with(x, 0);
}

/* ---- unwinding ------------------------------------------------------------- */

/* Whether the context is broken (a sticky error: synchronize keeps failing). */
static int context_broken(void)
{
    cudaGetLastError();
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaGetLastError();
    return e != cudaSuccess;
}

/* A CUDA call failed: out of memory with the context intact, or a device error. */
static void cuda_failed(run_ctx *x)
{
    const gemm_cuda_site *site = &x->site;
    gemm_job *job = x->job;
    if (site->err == cudaErrorMemoryAllocation) cudaGetLastError();
    x->broken = context_broken();
    x->rc = -1;
    if (site->err == cudaErrorMemoryAllocation && !x->broken) {
        gemm_engine_err_set(&job->err, GEMM_E_DEVICE_OOM, "%s ran out of memory during %s (%s) for a product of %llu "
                            "bytes", job->device, x->stage, site->call ? site->call : "?",
                            (unsigned long long)x->total);
        return;
    }
    const char *ename = cudaGetErrorName(site->err), *estr = cudaGetErrorString(site->err);
    const char *file = site->file ? strrchr(site->file, '/') : NULL;
    file = file ? file + 1 : (site->file ? site->file : "?");
    gemm_engine_log(GEMM_LOG_ERROR, "cuda: %s, stream %d, %s: %s failed at %s:%d: %s (%s)%s", job->device,
                    x->w->stream_index, x->stage, site->call ? site->call : "?", file, site->line, estr, ename,
                    x->broken ? "; resetting the device" : "");
    gemm_engine_err_set(&job->err, GEMM_E_DEVICE, "CUDA error on %s during %s: %s (%s at %s:%d)%s", job->device,
                        x->stage, estr, ename, file, site->line,
                        x->broken ? "; the device's context is broken and is being reset" : "");
}

static int unwind(run_ctx *x, int st)
{
    if (st == CUDA_FAILED) cuda_failed(x);
    if (x->keep && !x->broken && cudaFreeAsync(x->keep, x->w->stream) != cudaSuccess)
        cudaGetLastError(); /* not published: the product did not finish */
    gemm_cuda_unhold(x->cb, x->held);
    if (x->entered) gemm_cuda_dev_leave(x->cb, x->d, x->gen, x->broken, x->lose);
    return x->rc;
}

int gemm_cuda_run(void *self, void *worker, gemm_job *job)
{
    cuda_worker *w = worker; /* never NULL: worker_init gives every worker its row */
    static int (*const stages[])(run_ctx *) = {plan, enter, stage_inputs, copy_in, launch, copy_out, finish};
    run_ctx x = {.cb = self, .w = w, .d = w->dev, .job = job, .stage = "setup"};
    int st = GO;
    for (size_t i = 0; st == GO && i < sizeof stages / sizeof stages[0]; i++) st = stages[i](&x);
    return unwind(&x, st);
}
