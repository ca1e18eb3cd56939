/*
 * engine_cuda.c - the CUDA backend: every chosen device, `streams_per_device` streams on
 * each, one worker thread per stream.
 *
 * Worker i runs on device i % ndev, stream i / ndev, so the first workers to pick up jobs
 * are spread over the devices; the shared queue of the generic engine hands the next job
 * to whichever stream is idle (least-loaded scheduling). A worker owns its stream, its
 * cuBLAS handle, six timing events and its cached device buffers for A, B and C (grown
 * on demand, never above device_mem_limit); a job runs H2D -> kernel -> D2H on that
 * stream, so one job's copies overlap another job's kernel on the same device.
 *
 * The request path makes no CUDA call: what validate() and describe() need (compute
 * capability, whether the wgmma code runs, SMs, memory) is read once per device at open,
 * free memory is sampled by the housekeeping thread (cuda_house.c), and host buffers are
 * page-locked here, on the worker, before their copies (cuda_host.h).
 *
 * Waiting: the events are created with cudaEventBlockingSync, and a worker polls the event
 * it waits for only for wait_spin_us (default 50) before it sleeps in cudaEventSynchronize,
 * so a short product is picked up at once and a long one costs no CPU while it runs.
 *
 * Stages and cancellation: a job checks for a cancel request before its H2D copy. A long
 * product (worth_staging: many flops, many bytes, or the gpu_delay_ms hook) runs stage by
 * stage, waiting for each stage before enqueueing the next, and checks before the kernel
 * and before the D2H copy too; a short one enqueues its three stages back to back (a wait
 * between them would cost more than the stage). Each stage has its own start and end
 * events, so the gap of a stage-by-stage wait is in no stage's time.
 *
 * Faults: an allocation failure fails only its job (507 device_out_of_memory). Any other
 * CUDA error fails its job with 500. When the device's context is broken (a sticky error,
 * e.g. a kernel that trapped) the device is recovered as far as the driver allows: new
 * jobs on it wait, the jobs in flight finish (failing), then the worker that saw the error
 * frees every stream, handle and buffer of the device, calls cudaDeviceReset and makes a
 * new context; the workers rebuild their resources before their next job (the per-device
 * generation number tells a worker that its resources are gone). Current drivers refuse a
 * process whose context faulted any new context on that device (cudaSetDevice keeps
 * failing with cudaErrorDevicesUnavailable; measured on an H100 with driver 580): then the
 * device is marked lost and its jobs fail at once with 503 device_unavailable, so clients
 * move on, instead of jobs hanging. Once every device of the backend is lost, healthy()
 * says 0 and the daemon restarts itself in place (a new process gets new contexts).
 *
 * Test hooks (gemm_engine_config.fault_inject, comma-separated):
 *   oom:N           the Nth device-buffer allocation (counted over the backend) fails
 *   sticky:N        the Nth job launches a trapping kernel before its product
 *   lost:N          the Nth job fails with 500 and its device is marked lost (no CUDA
 *                   fault: the other devices' contexts stay intact), as after a failed reset
 *   gpu_delay_ms:N  every job's kernel stage starts with N ms of device-side waiting (a
 *                   long kernel of known length; such jobs run stage by stage)
 *   copy_loop:1     copies go one call each (cudaMemcpyAsync), the path taken when the
 *                   driver declines a batched copy call
 */
#include "cuda_engine.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemm_kernels.h"

#define STAGED_MIN_FLOP 2.7e11          /* ~5 ms on the fast members of an H100 */
#define STAGED_MIN_FLOP_SLOW 1.7e10     /* naive and tiled: ~10x slower */
#define STAGED_MIN_BYTES (256ull << 20) /* copies of ~5-10 ms */

/* ---- open / workers ------------------------------------------------------ */

static void cuda_close(void *self);

static void *cuda_open(const gemm_engine_config *cfg, gemm_err *err)
{
    int count = gemm_cuda_device_count();
    if (count <= 0) {
        gemm_err_set(err, 503, "no_device", "no usable CUDA device (check the driver and "
                     "CUDA_VISIBLE_DEVICES)");
        return NULL;
    }
    cuda_backend *cb = calloc(1, sizeof *cb);
    if (!cb) {
        gemm_err_set(err, 500, "out_of_memory", "cannot allocate the CUDA backend");
        return NULL;
    }
    if (gemm_cuda_parse_devices(cb, cfg->devices, count, err) != 0 ||
        gemm_cuda_parse_faults(cb, cfg->fault_inject, err) != 0) {
        free(cb);
        return NULL;
    }
    cb->streams = cfg->streams_per_device > 0 ? cfg->streams_per_device : 4;
    if (cb->streams > 64)
        cb->streams = 64;
    cb->mem_limit = cfg->device_mem_limit;
    cb->spin_ms = cfg->wait_spin_us > 0 ? cfg->wait_spin_us / 1000.0 : 0;
    cb->zero_copy_mnk = (double)cfg->zero_copy_mnk;
    cb->warmup = cfg->warmup && !cfg->fault_inject[0];
    cb->min_cc = INT_MAX;
    cb->wgmma_ok = 1;
    atomic_init(&cb->allocs, 0);
    atomic_init(&cb->jobs, 0);

    for (int i = 0; i < cb->ndev; i++) {
        cuda_dev *d = &cb->devs[i];
        struct cudaDeviceProp p;
        cudaError_t e = cudaGetDeviceProperties(&p, d->ordinal);
        if (e != cudaSuccess) {
            cudaGetLastError();
            gemm_err_set(err, 503, "no_device", "cannot read the properties of CUDA device %d: %s",
                         d->ordinal, cudaGetErrorString(e));
            for (int j = 0; j < i; j++) {
                pthread_cond_destroy(&cb->devs[j].cv);
                pthread_mutex_destroy(&cb->devs[j].mu);
                pthread_mutex_destroy(&cb->devs[j].busy_mu);
            }
            free(cb);
            return NULL;
        }
        snprintf(d->info.name, sizeof d->info.name, "%.47s", p.name);
        d->info.total_mem = p.totalGlobalMem;
        d->info.sms = p.multiProcessorCount;
        d->info.cc_major = p.major;
        d->info.cc_minor = p.minor;
        d->info.streams = cb->streams;
        d->cc = p.major * 10 + p.minor;
        d->host_ptr = p.canUseHostPointerForRegisteredMem;
        if (d->cc < cb->min_cc)
            cb->min_cc = d->cc;
        d->slot = i;
        snprintf(d->label, sizeof d->label, "cuda:%d %.38s", d->ordinal, d->info.name);
        d->gen = 1;
        pthread_mutex_init(&d->mu, NULL);
        pthread_mutex_init(&d->busy_mu, NULL);
        pthread_cond_init(&d->cv, NULL);
        atomic_init(&d->lost, 0);
        atomic_init(&d->bytes_h2d, 0);
        atomic_init(&d->bytes_d2h, 0);
        atomic_init(&d->resident_bytes, 0);
        atomic_init(&d->mem_used, 0);
        atomic_init(&d->mem_free, 0);
        atomic_init(&d->mem_total, (unsigned long long)p.totalGlobalMem);
        /* What the request path will need, asked here once (this makes the device's
         * context, which its workers would make anyway). */
        if (cudaSetDevice(d->ordinal) == cudaSuccess) {
            d->wgmma = gemm_wgmma_runnable();
            gemm_cuda_sample_memory(d);
        }
        cudaGetLastError();
        if (!d->wgmma)
            cb->wgmma_ok = 0;
        gemm_engine_log(GEMM_LOG_DEBUG, "cuda: device %d: %s, cc %d.%d, %d SMs, %llu MiB (%llu free), wgmma %s",
                        d->ordinal, d->info.name, p.major, p.minor, d->info.sms,
                        (unsigned long long)(p.totalGlobalMem >> 20),
                        (unsigned long long)(atomic_load(&d->mem_free) >> 20),
                        d->wgmma ? "runs" : "not in this build for this device");
    }

    cb->nworkers = cb->ndev * cb->streams;
    cb->workers = calloc((size_t)cb->nworkers, sizeof *cb->workers);
    int ordinals[GEMM_MAX_DEVICES];
    for (int i = 0; i < cb->ndev; i++)
        ordinals[i] = cb->devs[i].ordinal;
    size_t cache = cfg->host_cache_bytes && cfg->host_cache_bytes < HOST_CACHE_BYTES ? cfg->host_cache_bytes
                                                                                      : HOST_CACHE_BYTES;
    cb->host = gemm_cuda_host_open(ordinals, cb->ndev, cache);
    if (!cb->workers || !cb->host) {
        gemm_err_set(err, 500, "out_of_memory", "cannot allocate the CUDA backend's workers");
        cuda_close(cb);
        return NULL;
    }
    cb->alloc = gemm_cuda_host_allocator(cb->host);
    for (int i = 0; i < cb->nworkers; i++) {
        cuda_worker *w = &cb->workers[i];
        w->cb = cb;
        w->index = i;
        w->dev = &cb->devs[i % cb->ndev];     /* interleaved: load spreads over devices */
        w->stream_index = i / cb->ndev;
    }
    if (gemm_cuda_house_start(cb) != 0) {
        gemm_err_set(err, 500, "backend_failure", "cannot start the CUDA backend's housekeeping thread");
        cuda_close(cb);
        return NULL;
    }
    gemm_cuda_host_set_notify(cb->host, gemm_cuda_house_wake, cb);
    return cb;
}

static int cuda_validate(void *self, gemm_job *job, gemm_err *err);
static int cuda_run(void *self, void *worker, gemm_job *job);

/* ---- warm-up -------------------------------------------------------------
 * The first launch of each kernel loads its module (CUDA loads modules lazily) and the
 * first cuBLAS call of a shape family sets cuBLAS up: together 50-100 ms that the first
 * small requests after a start would pay (it showed as the p99 of a one-connection run).
 * Each worker pays it here instead, on its own stream, through the same validate and run
 * as a request: for every dtype, one 64^3, one 256^3 and one 512^3 product with kernel
 * auto, and one batched 64^3 job of 4 (what dynamic batching launches). Host blocks come from the
 * engine's pinned allocator and go back to its cache. Nothing of it is counted: run()
 * leaves the byte counters alone while w->warming, and the engine's job counters never
 * see these products (they are not submitted). */
static void cuda_warm(cuda_backend *cb, cuda_worker *w)
{
    static const gemm_dtype dtypes[] = {GEMM_DTYPE_F32, GEMM_DTYPE_F64, GEMM_DTYPE_I32, GEMM_DTYPE_F16,
                                        GEMM_DTYPE_BF16};
    /* 64^3 and 256^3 alone run on our own members (kernel auto, auto.c), 512^3 and the
     * batched 64^3 through cuBLAS */
    static const struct { uint64_t n, batch; } shapes[] = {{64, 0}, {256, 0}, {512, 0}, {64, 4}};
    double t0 = gemm_now_ms();
    int ran = 0, failed = 0;
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++) {
        for (size_t j = 0; j < sizeof shapes / sizeof shapes[0]; j++) {
            gemm_job job;
            memset(&job, 0, sizeof job);
            job.dtype = dtypes[i];
            job.m = job.k = job.n = shapes[j].n;
            job.batch = shapes[j].batch;
            job.math = GEMM_MATH_DEFAULT;
            atomic_init(&job.state, GEMM_JOB_RUNNING);
            atomic_init(&job.cancel_requested, 0);
            size_t need[3];
            gemm_err err;
            if (!gemm_job_bytes(&job, need) || cuda_validate(cb, &job, &err) != 0)
                continue;
            job.a = cb->alloc.alloc(cb->alloc.ctx, need[0]);
            job.b = cb->alloc.alloc(cb->alloc.ctx, need[1]);
            job.c = cb->alloc.alloc(cb->alloc.ctx, need[2]);
            if (job.a && job.b && job.c) {
                memset(job.a, 0, need[0]);
                memset(job.b, 0, need[1]);
                if (cuda_run(cb, w, &job) == 0) {
                    ran++;
                } else {
                    failed++;
                    gemm_engine_log(GEMM_LOG_WARN, "cuda: worker %d: warm-up product %s %llu^3 "
                                    "(batch %llu) failed: %s", w->index, gemm_dtype_name(job.dtype),
                                    (unsigned long long)job.m, (unsigned long long)job.batch,
                                    job.err.message);
                }
            }
            cb->alloc.free(cb->alloc.ctx, job.a);
            cb->alloc.free(cb->alloc.ctx, job.b);
            cb->alloc.free(cb->alloc.ctx, job.c);
            if (failed)
                return; /* the first real job will meet (and report) the same trouble */
        }
    }
    gemm_engine_log(GEMM_LOG_DEBUG, "cuda: worker %d (%s, stream %d) warmed up: %d products in %.1f ms",
                    w->index, w->dev->label, w->stream_index, ran, gemm_now_ms() - t0);
}

static int cuda_workers(void *self)
{
    return ((cuda_backend *)self)->nworkers;
}

static void *cuda_worker_init(void *self, int index)
{
    cuda_backend *cb = self;
    if (index < 0 || index >= cb->nworkers)
        return NULL;
    cuda_worker *w = &cb->workers[index];
    cuda_dev *d = w->dev;
    gemm_cuda_site site = {0};
    pthread_mutex_lock(&d->mu);
    while (d->resetting)
        pthread_cond_wait(&d->cv, &d->mu);
    unsigned gen = d->gen;
    if (cudaSetDevice(d->ordinal) == cudaSuccess && gemm_cuda_build_resources(w, gen, &site) != cudaSuccess)
        gemm_engine_log(GEMM_LOG_WARN, "cuda: worker %d on device %d: %s failed (%s); retried at its "
                        "first job", index, d->ordinal, site.call, cudaGetErrorString(site.err));
    cudaGetLastError();
    pthread_mutex_unlock(&d->mu);
    if (cb->warmup) {
        w->warming = 1;
        cuda_warm(cb, w);
        w->warming = 0;
    }
    return w;
}

static void cuda_worker_fini(void *self, void *worker)
{
    (void)self;
    cuda_worker *w = worker;
    if (!w)
        return;
    cuda_dev *d = w->dev;
    pthread_mutex_lock(&d->mu);
    while (d->resetting)
        pthread_cond_wait(&d->cv, &d->mu);
    if (w->gen != 0) {
        cudaSetDevice(d->ordinal);
        if (w->gen == d->gen)
            gemm_cuda_destroy_resources(w);
        w->gen = 0;
    }
    pthread_mutex_unlock(&d->mu);
}

/* ---- validate: resolve the kernel, tile and math ------------------------ */

/* The product asked for kernel auto (or named none). */
static int kernel_is_auto(const gemm_job *job)
{
    return !job->kernel[0] || strcmp(job->kernel, "auto") == 0;
}

/* On the request path (an HTTP thread): reads only what open cached, no CUDA call. */

static int cuda_validate(void *self, gemm_job *job, gemm_err *err)
{
    cuda_backend *cb = self;
    if (job->m > INT_MAX || job->k > INT_MAX || job->n > INT_MAX)
        return gemm_err_set(err, 413, "too_large",
                            "m=%llu k=%llu n=%llu: the CUDA backend takes dimensions up to %d",
                            (unsigned long long)job->m, (unsigned long long)job->k,
                            (unsigned long long)job->n, INT_MAX);
    if (job->plan_m > INT_MAX)
        return gemm_err_set(err, 422, "bad_option", "panel_of=%llu: the CUDA backend takes up to %d rows",
                            (unsigned long long)job->plan_m, INT_MAX);
    /* A panel of a larger product: chosen as for the whole one. */
    const int plan_rows = (int)gemm_job_plan_rows(job);
    int is_auto = kernel_is_auto(job);
    /* auto: the member the committed measurements pick for this dtype, math and shape
     * (kernels/cuda/auto.c), for the oldest device a worker may run it on. */
    const char *name = is_auto ? gemm_kernel_auto(job->dtype, job->math, plan_rows, (int)job->n,
                                                  (int)job->k, cb->min_cc, cb->wgmma_ok)
                               : job->kernel;
    const gemm_kernel_desc *k = gemm_kernel_find(name);
    if (!k) {
        char list[256] = "";
        size_t off = 0;
        for (int i = 0; gemm_kernel_table[i] && off < sizeof list; i++)
            off += (size_t)snprintf(list + off, sizeof list - off, "%s%s", i ? ", " : "",
                                    gemm_kernel_table[i]->name);
        return gemm_err_set(err, 422, "unknown_kernel",
                            "kernel \"%s\" is not available on the CUDA backend; it has auto, %s",
                            job->kernel, list);
    }
    const char *why = NULL;
    if (!gemm_kernel_supports(k, job->dtype, job->math, job->tile, cb->min_cc, &why)) {
        const char *code = "unsupported";
        if (!(k->dtypes & (1u << job->dtype)))
            code = "unsupported_dtype";
        else if (job->tile && strstr(why, "tile"))
            code = "bad_tile";
        else if (strstr(why, "math"))
            code = "unsupported_math";
        if (strcmp(code, "unsupported_dtype") == 0 && strcmp(k->name, "cublas") != 0) {
            /* name the members that do run it */
            char list[160] = "";
            size_t off = 0;
            for (int i = 0; gemm_kernel_table[i] && off < sizeof list; i++)
                if (gemm_kernel_table[i]->dtypes & (1u << job->dtype))
                    off += (size_t)snprintf(list + off, sizeof list - off, ", %s", gemm_kernel_table[i]->name);
            return gemm_err_set(err, 422, code, "kernel \"%s\" does not compute %s; %s runs on kernel auto%s",
                                k->name, gemm_dtype_name(job->dtype), gemm_dtype_name(job->dtype), list);
        }
        if (strcmp(code, "unsupported_dtype") == 0 && strcmp(k->name, "cublas") == 0)
            return gemm_err_set(err, 422, code,
                                "kernel \"cublas\" does not compute %s: cuBLAS has no %s GEMM "
                                "that wraps like two's complement; use kernel auto, naive or tiled",
                                gemm_dtype_name(job->dtype), gemm_dtype_name(job->dtype));
        if (strcmp(code, "bad_tile") == 0) {
            char tiles[48] = "";
            size_t off = 0;
            for (int i = 0; i < 4 && k->tiles[i] && off < sizeof tiles; i++)
                off += (size_t)snprintf(tiles + off, sizeof tiles - off, "%s%d", i ? ", " : "",
                                        k->tiles[i]);
            if (!k->tiles[0])
                return gemm_err_set(err, 422, code, "kernel \"%s\" takes no tile option (tile=%d)",
                                    k->name, job->tile);
            return gemm_err_set(err, 422, code, "kernel \"%s\" takes tile %s, not %d", k->name,
                                tiles, job->tile);
        }
        return gemm_err_set(err, 422, code, "kernel \"%s\" cannot run %s with math %s, tile %d: %s",
                            k->name, gemm_dtype_name(job->dtype), gemm_math_name(job->math),
                            job->tile, why ? why : "not supported");
    }
    if (strcmp(k->name, "wgmma") == 0 && !cb->wgmma_ok)
        return gemm_err_set(err, 422, "unsupported",
                            "kernel \"wgmma\" cannot run here: this build has no sm_90a code for "
                            "%s (build with CUDA_ARCHS including 90a); use kernel auto, mma or cublas",
                            cb->ndev > 1 ? "every device" : "the device");
    snprintf(job->kernel_used, sizeof job->kernel_used, "%s", k->name);
    /* What the tile resolves to depends on the device buffers too (alignment picks some
     * blocks): run() asks the kernel's plan just before the launch. */
    job->tile_used = job->tile;
    job->block[0] = '\0';
    job->math_used = job->dtype == GEMM_DTYPE_F32
                         ? (job->math == GEMM_MATH_DEFAULT ? GEMM_MATH_FP32 : job->math)
                         : GEMM_MATH_DEFAULT;
    return 0;
}

/* ---- run ----------------------------------------------------------------- */

static float ev_ms(cudaEvent_t a, cudaEvent_t b, gemm_cuda_site *site)
{
    float ms = 0;
    if (GEMM_CUDA_CHECK(site, cudaEventElapsedTime(&ms, a, b)) != cudaSuccess)
        return 0;
    return ms;
}

/* Waits for ev: polls it for spin_ms (wait_spin_us: a short product is done by then, and
 * nothing sleeps), then sleeps in cudaEventSynchronize (a blocking-sync event: no CPU while
 * it waits). */
static cudaError_t wait_event(cudaEvent_t ev, double spin_ms)
{
    double t0 = gemm_now_ms();
    cudaError_t e;
    while ((e = cudaEventQuery(ev)) == cudaErrorNotReady && gemm_now_ms() - t0 < spin_ms) {
    }
    if (e != cudaErrorNotReady)
        return e;
    if (cudaPeekAtLastError() == cudaErrorNotReady) /* "not ready" is no error: never keep it */
        cudaGetLastError();
    return cudaEventSynchronize(ev);
}

/* Host <-> device copies queued on a stream in order, COPY_CHUNK at a time through one
 * cudaMemcpyBatchAsync (measured on an H100: a group of 4-11 small products copied part by
 * part in one call costs what one copy of a gathered stack does, and no host gather or
 * scatter is needed; bench/bench_small_path.cu). A single range is one cudaMemcpyAsync. A
 * driver that declines the batch call (not supported, or a range it will not batch) gets
 * the ranges one by one. Everything is checked: the first failure stays in the site. */
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
    int one_by_one; /* the copy_loop:1 hook */
} copy_list;

static void copies_begin(copy_list *c, const cuda_backend *cb, enum cudaMemcpyKind kind, cudaStream_t s,
                         gemm_cuda_site *site)
{
    c->one_by_one = cb->copy_loop;
    c->n = 0;
    c->kind = kind;
    c->s = s;
    c->site = site;
    c->err = cudaSuccess;
}

static cudaError_t copies_flush(copy_list *c)
{
    if (c->err != cudaSuccess || c->n == 0)
        return c->err;
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
    if (size == 0 || c->err != cudaSuccess)
        return;
    c->dst[c->n] = dst;
    c->src[c->n] = src;
    c->size[c->n] = size;
    if (++c->n == COPY_CHUNK)
        copies_flush(c);
}

/* Whether to run the product stage by stage (a host wait between stages, so a cancel can
 * stop it before its kernel or its D2H copy): when the stages are long enough that the wait
 * (tens of microseconds) does not matter. */
static int worth_staging(const cuda_backend *cb, const gemm_kernel_desc *k, const gemm_job *job,
                         uint64_t bytes)
{
    if (cb->delay_ms > 0)
        return 1;
    const double flops = 2.0 * (double)gemm_job_batch(job) * (double)job->m * (double)job->n *
                         (double)job->k;
    const int slow = strcmp(k->name, "naive") == 0 || strcmp(k->name, "tiled") == 0;
    return bytes >= STAGED_MIN_BYTES || flops >= (slow ? STAGED_MIN_FLOP_SLOW : STAGED_MIN_FLOP);
}

/* Whether the device's context is broken (a sticky error): after a failure, a device-wide
 * synchronize and the last-error slot keep failing only then. */
static int context_broken(void)
{
    cudaGetLastError();
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess)
        e = cudaGetLastError();
    return e != cudaSuccess;
}

static int fail_job(gemm_job *job, cuda_worker *w, const gemm_cuda_site *site, const char *stage,
                    int broken)
{
    const char *ename = cudaGetErrorName(site->err);
    const char *estr = cudaGetErrorString(site->err);
    const char *file = site->file ? strrchr(site->file, '/') : NULL;
    file = file ? file + 1 : (site->file ? site->file : "?");
    gemm_engine_log(GEMM_LOG_ERROR, "cuda: %s, stream %d, %s: %s failed at %s:%d: %s (%s)%s", job->device,
                    w->stream_index, stage, site->call ? site->call : "?", file, site->line, estr, ename,
                    broken ? "; resetting the device" : "");
    return gemm_err_set(&job->err, 500, "device_error",
                        "CUDA error on %s during %s: %s (%s at %s:%d)%s", job->device, stage, estr,
                        ename, file, site->line,
                        broken ? "; the device's context is broken and is being reset" : "");
}

static int cuda_run(void *self, void *worker, gemm_job *job)
{
    cuda_backend *cb = self;
    cuda_worker *w = worker;
    if (!w)
        return gemm_err_set(&job->err, 500, "backend_failure", "CUDA worker without a device");
    cuda_dev *d = w->dev;
    gemm_cuda_site site = {0};
    const char *stage = "setup";
    int broken = 0, rc = 0;
    void *keep = NULL; /* C's resident device copy, until published */

    memcpy(job->device, d->label, sizeof job->device);
    job->stream = w->stream_index;

    const gemm_kernel_desc *k = gemm_kernel_find(job->kernel_used);
    if (!k) /* validate() always resolves; this only guards direct misuse */
        return gemm_err_set(&job->err, 500, "internal_error", "job reached the CUDA worker "
                            "without a resolved kernel (\"%s\")", job->kernel_used);
    int zero = 0; /* zero copy: the kernel reads and writes the host blocks */
    if (gemm_job_batch(job) <= 1 && !job->a_parts && !job->plan_m && !job->tile && kernel_is_auto(job) &&
        strcmp(k->name, "cublas") == 0) {
        /* auto, and this product runs alone (not in a group): a small one runs faster on
         * one of ours than through cuBLAS's host call (auto.c) */
        const gemm_kernel_desc *ka = gemm_kernel_auto_alone(job->dtype, job->math_used, (int)job->m,
                                                            (int)job->n, (int)job->k, cb->min_cc);
        if (ka) {
            k = ka;
            snprintf(job->kernel_used, sizeof job->kernel_used, "%s", k->name);
            /* The smallest of them skip the copies too, when nothing else runs on the
             * device: there, three copies and their events cost more than the kernel's own
             * reads of a few KiB over the bus (zero_copy_mnk). Under load the copies stay:
             * they overlap other products' work, while a kernel that waits on the bus holds
             * its SMs (measured on an H100: bench/results/h100-2026-11-27-shards.md). */
            zero = d->host_ptr && !job->a_res && !job->b_res && !job->c_res &&
                   (double)job->m * (double)job->n * (double)job->k <= cb->zero_copy_mnk;
        }
    }

    size_t es = gemm_dtype_size(job->dtype), esc = gemm_dtype_size(gemm_job_c_dtype(job)), need[3];
    const uint64_t nb = gemm_job_batch(job);
    if (!gemm_job_bytes(job, need) || es == 0)
        return gemm_err_set(&job->err, 413, "too_large", "the product's size overflows");
    uint64_t total = (uint64_t)need[0] + need[1] + need[2];
    if (cb->mem_limit && total > cb->mem_limit)
        return gemm_err_set(&job->err, 507, "device_out_of_memory",
                            "the product needs %llu bytes of device memory (A %zu, B %zu, C %zu); "
                            "device_mem_limit allows %llu bytes per stream",
                            (unsigned long long)total, need[0], need[1], need[2],
                            (unsigned long long)cb->mem_limit);
    const int staged = worth_staging(cb, k, job, total);
    if (staged)
        zero = 0;

    int others = 0;
    unsigned gen = gemm_cuda_dev_enter(d, &others);
    if (others > 0)
        zero = 0; /* only on an otherwise idle device (see zero_copy_mnk) */
    if (atomic_load(&d->lost)) {
        gemm_err_set(&job->err, 503, "device_unavailable",
                     "%s could not be recovered after an earlier device error (%s); restart gemmd "
                     "or send the product to another server", job->device,
                     cudaGetErrorString(d->lost_err));
        rc = -1;
        goto out;
    }
    if (gemm_job_cancel_requested(job)) {
        rc = gemm_job_stop_cancelled(job, "its host-to-device copy");
        goto out;
    }
    if (GEMM_CUDA_CHECK(&site, cudaSetDevice(d->ordinal)) != cudaSuccess)
        goto fail;
    if (w->gen != gen) {
        if (w->gen != 0)
            gemm_cuda_destroy_resources(w); /* only when built before a reset that skipped it */
        if (gemm_cuda_build_resources(w, gen, &site) != cudaSuccess)
            goto fail;
    }

    stage = "device allocation";
    size_t held = w->cap[0] + w->cap[1] + w->cap[2];
    if (gemm_cuda_ensure_buffers(w, need, &site) != cudaSuccess) {
        if (site.err == cudaErrorMemoryAllocation) {
            cudaGetLastError();
            /* The failed attempt gave this worker's cached buffers back; when there were
             * any, the memory they held may now be enough: try once more. */
            gemm_cuda_site again = site;
            if (held > 0) {
                memset(&again, 0, sizeof again);
                if (gemm_cuda_ensure_buffers(w, need, &again) == cudaSuccess)
                    goto allocated;
                cudaGetLastError();
            }
            if (again.err == cudaErrorMemoryAllocation) {
                gemm_cuda_sample_memory(d); /* on the worker: a CUDA call is fine here */
                unsigned long long free_b = atomic_load(&d->mem_free), total_b = atomic_load(&d->mem_total);
                gemm_err_set(&job->err, 507, "device_out_of_memory",
                             "%s is out of memory: the product needs %llu bytes on the device "
                             "(A %zu, B %zu, C %zu) and %llu of %llu bytes are free",
                             job->device, (unsigned long long)total, need[0], need[1], need[2],
                             free_b, total_b);
                rc = -1;
                goto out;
            }
            site = again;
        }
        goto fail;
    }
allocated:;
    cudaStream_t s = w->stream;
    cudaEvent_t *ev = w->ev;
    long njob = atomic_fetch_add(&cb->jobs, 1) + 1;
    if (cb->lost_at > 0 && njob == cb->lost_at) {
        /* Test hook: this device is lost as if its reset had failed, its context left
         * intact (a real trap may break every device of the process: see OPERATIONS.md). */
        d->lost_err = cudaErrorDevicesUnavailable;
        atomic_store(&d->lost, 1);
        gemm_engine_log(GEMM_LOG_ERROR, "cuda: device %d (%s) lost (fault_inject lost:%ld); it takes no more "
                        "products (the engine's other devices serve them; with none left they fail with 503 "
                        "device_unavailable) until gemmd is restarted", d->ordinal, d->info.name, cb->lost_at);
        gemm_err_set(&job->err, 500, "device_error", "%s was lost while running this product (fault_inject lost:%ld)",
                     job->device, cb->lost_at);
        rc = -1;
        goto out;
    }

    /* Host blocks are locked here, on the worker, once (cached by the allocator after);
     * a block that cannot be locked is copied from pageable memory. */
    /* A panel of a split product points inside the product's blocks: pin those. */
    /* A coalesced group lists its products' own blocks: pin each. */
    if (job->a_parts) {
        for (uint64_t i = 0; i < nb; i++) {
            gemm_cuda_host_pin(cb->host, job->a_parts[i], d->slot);
            gemm_cuda_host_pin(cb->host, job->b_parts[i], d->slot);
            gemm_cuda_host_pin(cb->host, job->c_parts[i], d->slot);
        }
    } else {
        int pinned = gemm_cuda_host_pin(cb->host, job->a_block ? job->a_block : job->a, d->slot);
        pinned &= gemm_cuda_host_pin(cb->host, job->b_block ? job->b_block : job->b, d->slot);
        pinned &= gemm_cuda_host_pin(cb->host, job->c_block ? job->c_block : job->c, d->slot);
        zero &= pinned; /* pageable memory cannot be read by a kernel */
    }

    /* Resident operands are read from their device copies: no H2D for them (the first
     * product on this device makes the copy; its cost is counted as this job's H2D). Zero
     * copy: the kernel reads and writes the host blocks themselves. */
    void *A = zero ? job->a : w->buf[0], *B = zero ? job->b : w->buf[1], *C = zero ? job->c : w->buf[2];
    size_t upload[2] = {zero ? 0 : need[0], zero ? 0 : need[1]}, res_bytes = 0;
    double res_ms = 0;
    if (nb <= 1 && job->a_res && gemm_cuda_resident_get(cb, d, gen, job->a_res, s, &A, &res_bytes, &res_ms))
        upload[0] = 0;
    if (nb <= 1 && job->b_res && gemm_cuda_resident_get(cb, d, gen, job->b_res, s, &B, &res_bytes, &res_ms))
        upload[1] = 0;

    /* H2D: ev[0] .. ev[1]; A and B in one call (a group: every product's, into the stacks;
     * zero copy: none, ev[1] alone) */
    stage = "H2D copy";
    copy_list cp;
    copies_begin(&cp, cb, cudaMemcpyHostToDevice, s, &site);
    if (!zero && GEMM_CUDA_CHECK(&site, cudaEventRecord(ev[0], s)) != cudaSuccess)
        goto fail;
    if (job->a_parts) {
        const size_t pa = need[0] / nb, pb = need[1] / nb;
        for (uint64_t i = 0; i < nb; i++) {
            copies_add(&cp, (char *)A + i * pa, job->a_parts[i], pa);
            copies_add(&cp, (char *)B + i * pb, job->b_parts[i], pb);
        }
    } else {
        copies_add(&cp, A, job->a, upload[0]);
        copies_add(&cp, B, job->b, upload[1]);
    }
    if (copies_flush(&cp) != cudaSuccess || GEMM_CUDA_CHECK(&site, cudaEventRecord(ev[1], s)) != cudaSuccess)
        goto fail;

    /* kernel: k0 .. ev[3] (k0 = ev[1] when the stages run back to back) */
    cudaEvent_t k0 = ev[1], d0 = ev[3];
    if (staged) {
        if (GEMM_CUDA_CHECK(&site, wait_event(ev[1], cb->spin_ms)) != cudaSuccess)
            goto fail;
        if (gemm_job_cancel_requested(job)) {
            job->timing.h2d_ms = ev_ms(ev[0], ev[1], &site);
            rc = gemm_job_stop_cancelled(job, "its kernel");
            goto out;
        }
        k0 = ev[2];
        if (GEMM_CUDA_CHECK(&site, cudaEventRecord(k0, s)) != cudaSuccess)
            goto fail;
    }
    stage = "kernel";
    if (cb->sticky_at > 0 && njob == cb->sticky_at &&
        GEMM_CUDA_CHECK(&site, gemm_cuda_launch_trap(s)) != cudaSuccess)
        goto fail;
    if (cb->delay_ms > 0 && GEMM_CUDA_CHECK(&site, gemm_cuda_launch_delay(s, cb->delay_ms)) != cudaSuccess)
        goto fail;
    gemm_launch l = {
        .dtype = job->dtype,
        .math = job->math_used,
        .m = (int)job->m, .n = (int)job->n, .k = (int)job->k,
        .A = A, .B = B, .C = C,
        .tile = job->tile, /* 0: the kernel chooses by shape */
        .stream = s,
        .cublas = w->blas,
        .workspace = NULL,
        .workspace_bytes = 0,
        .out_half = job->out_half,
        .plan_m = (int)gemm_job_plan_rows(job), /* m when it is whole: the same choice */
        .lt = w->lt,
    };
    if (k->plan)
        job->tile_used = k->plan(&l, job->block, sizeof job->block);
    if (nb > 1 && k->batch_native) {
        /* One strided-batched call; B's stride 0 broadcasts a shared B. */
        l.batch = (int)nb;
        l.stride_a = (long long)(job->m * job->k);
        l.stride_b = job->b_shared ? 0 : (long long)(job->k * job->n);
        l.stride_c = (long long)(job->m * job->n);
        if (GEMM_CUDA_CHECK(&site, k->launch(&l)) != cudaSuccess)
            goto fail;
    } else {
        /* One launch per product, back to back on the stream (one H2D and one D2H for all). */
        for (uint64_t i = 0; i < nb; i++) {
            /* A and B: the worker's buffers, or a resident operand's device copy (nb == 1) */
            l.A = (const char *)A + i * (size_t)(job->m * job->k) * es;
            l.B = (const char *)B + (job->b_shared ? 0 : i * (size_t)(job->k * job->n) * es);
            l.C = (char *)C + i * (size_t)(job->m * job->n) * esc;
            if (GEMM_CUDA_CHECK(&site, k->launch(&l)) != cudaSuccess)
                goto fail;
        }
    }
    if (nb > 1) {
        job->batched = nb;
        snprintf(job->batch_mode, sizeof job->batch_mode, "%s", k->batch_native ? "strided" : "loop");
    }
    if (GEMM_CUDA_CHECK(&site, cudaEventRecord(ev[3], s)) != cudaSuccess)
        goto fail;
    if (nb <= 1 && job->c_res) /* C stays on the device for the next product (copied before the D2H) */
        keep = gemm_cuda_resident_keep(w->buf[2], need[2], s);

    /* D2H: d0 .. ev[5] (d0 = ev[3] when back to back) */
    if (staged) {
        if (GEMM_CUDA_CHECK(&site, wait_event(ev[3], cb->spin_ms)) != cudaSuccess)
            goto fail;
        if (gemm_job_cancel_requested(job)) {
            job->timing.h2d_ms = ev_ms(ev[0], ev[1], &site);
            job->timing.kernel_ms = ev_ms(k0, ev[3], &site);
            rc = gemm_job_stop_cancelled(job, "its device-to-host copy");
            goto out;
        }
        d0 = ev[4];
        if (GEMM_CUDA_CHECK(&site, cudaEventRecord(d0, s)) != cudaSuccess)
            goto fail;
    }
    stage = "D2H copy";
    copies_begin(&cp, cb, cudaMemcpyDeviceToHost, s, &site);
    if (job->c_parts) {
        const size_t pc = need[2] / nb;
        for (uint64_t i = 0; i < nb; i++)
            copies_add(&cp, job->c_parts[i], (const char *)w->buf[2] + i * pc, pc);
    } else if (!zero) {
        copies_add(&cp, job->c, w->buf[2], need[2]);
    }
    cudaEvent_t last = zero ? ev[3] : ev[5];
    if (copies_flush(&cp) != cudaSuccess ||
        (!zero && GEMM_CUDA_CHECK(&site, cudaEventRecord(ev[5], s)) != cudaSuccess))
        goto fail;

    stage = "synchronize";
    if (GEMM_CUDA_CHECK(&site, wait_event(last, cb->spin_ms)) != cudaSuccess)
        goto fail;

    /* nothing crossed the bus when every operand was already on the device (zero copy:
     * the kernel's own reads and writes are its time) */
    job->timing.h2d_ms = (upload[0] + upload[1] + res_bytes) > 0 ? ev_ms(ev[0], ev[1], &site) + res_ms : 0;
    job->timing.kernel_ms = ev_ms(k0, ev[3], &site);
    job->timing.d2h_ms = zero ? 0 : ev_ms(d0, ev[5], &site);
    job->zero_copy = zero;
    if (site.err != cudaSuccess)
        goto fail;
    if (keep) {
        gemm_cuda_resident_publish(d, gen, job->c_res, keep);
        keep = NULL;
    }
    double flops = 2.0 * (double)nb * (double)job->m * (double)job->n * (double)job->k;
    job->timing.gflops = job->timing.kernel_ms > 0 ? flops / (job->timing.kernel_ms * 1e6) : 0;
    if (!w->warming) {
        /* zero copy: the bytes the kernel read and wrote over the bus count as copied */
        atomic_fetch_add(&d->bytes_h2d, (unsigned long long)(zero ? need[0] + need[1] : upload[0] + upload[1] + res_bytes));
        atomic_fetch_add(&d->bytes_d2h, (unsigned long long)need[2]);
    }
    goto out;

fail:
    if (site.err == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        broken = context_broken();
        if (!broken) {
            gemm_err_set(&job->err, 507, "device_out_of_memory",
                         "%s ran out of memory during %s (%s) for a product of %llu bytes",
                         job->device, stage, site.call ? site.call : "?", (unsigned long long)total);
            rc = -1;
            goto out;
        }
    } else {
        broken = context_broken();
    }
    fail_job(job, w, &site, stage, broken);
    rc = -1;
out:
    if (keep) { /* not published: the product did not finish */
        if (!broken)
            cudaFree(keep);
        cudaGetLastError();
    }
    gemm_cuda_dev_leave(cb, d, gen, broken);
    return rc;
}

/* ---- describe / stats / close ------------------------------------------- */

/* From what open read and the housekeeping thread sampled: no CUDA call (the daemon calls
 * this from HTTP threads, for /v1/info and /metrics). */
static void cuda_describe(void *self, gemm_engine_info *out)
{
    cuda_backend *cb = self;
    snprintf(out->backend, sizeof out->backend, "cuda");
    out->ndevices = cb->ndev;
    for (int i = 0; i < cb->ndev; i++) {
        cuda_dev *d = &cb->devs[i];
        out->devices[i] = d->info;
        out->devices[i].free_mem = atomic_load(&d->mem_free);
        unsigned long long total = atomic_load(&d->mem_total);
        if (total)
            out->devices[i].total_mem = total;
    }
    int n = 0;
    for (int i = 0; gemm_kernel_table[i] && n < GEMM_MAX_KERNELS; i++) {
        const gemm_kernel_desc *k = gemm_kernel_table[i];
        if (k->min_cc > cb->min_cc || (strcmp(k->name, "wgmma") == 0 && !cb->wgmma_ok))
            continue;
        gemm_kernel_info *ki = &out->kernels[n++];
        memset(ki, 0, sizeof *ki);
        snprintf(ki->name, sizeof ki->name, "%s", k->name);
        snprintf(ki->description, sizeof ki->description, "%s", k->description);
        ki->dtypes = k->dtypes;
        ki->maths = k->maths | (1u << GEMM_MATH_DEFAULT);
        memcpy(ki->tiles, k->tiles, sizeof ki->tiles);
    }
    out->nkernels = n;
}

/* device_busy_seconds: the time at least one job was inside the device (union of the jobs'
 * intervals, so never more than wall time however many streams overlap); device_mem_used:
 * the cached device buffers of all its streams (cuBLAS's own workspace not counted);
 * device_mem_free: the last sample of the housekeeping thread (at most ~1 s old). */
static void cuda_stats(void *self, gemm_engine_stats *out)
{
    cuda_backend *cb = self;
    out->ndevices = cb->ndev;
    for (int i = 0; i < cb->ndev; i++) {
        cuda_dev *d = &cb->devs[i];
        pthread_mutex_lock(&d->busy_mu);
        double busy = d->busy_ms + (d->jobs > 0 ? gemm_now_ms() - d->busy_since_ms : 0);
        pthread_mutex_unlock(&d->busy_mu);
        out->device_busy_seconds[i] = busy / 1000.0;
        out->bytes_h2d[i] = atomic_load(&d->bytes_h2d);
        out->bytes_d2h[i] = atomic_load(&d->bytes_d2h);
        out->device_mem_used[i] = atomic_load(&d->mem_used);
        out->device_mem_free[i] = atomic_load(&d->mem_free);
        out->resident_bytes[i] = atomic_load(&d->resident_bytes);
    }
}

static const gemm_allocator *cuda_allocator(void *self)
{
    return &((cuda_backend *)self)->alloc;
}

/* Healthy while at least one of its devices can still run products. */
static int cuda_healthy(void *self)
{
    cuda_backend *cb = self;
    int usable = 0;
    for (int i = 0; i < cb->ndev && !usable; i++)
        usable = !atomic_load(&cb->devs[i].lost);
    return usable;
}

/* Split products: worker i is on device slot i % ndev; a lost device takes no panel. */
static int cuda_worker_slot(void *self, int worker_index)
{
    cuda_backend *cb = self;
    if (worker_index < 0 || worker_index >= cb->nworkers)
        return 0;
    return cb->workers[worker_index].dev->slot;
}

static int cuda_slot_usable(void *self, int slot)
{
    cuda_backend *cb = self;
    return slot >= 0 && slot < cb->ndev && !atomic_load(&cb->devs[slot].lost);
}

/* Not while a hook holds runs (gpu_delay_ms) or breaks the device (sticky, lost): the
 * recovery of a device belongs on a worker, not on an HTTP thread. */
static int cuda_quick(void *self)
{
    const cuda_backend *cb = self;
    return cb->delay_ms <= 0 && cb->sticky_at <= 0 && cb->lost_at <= 0;
}

static void cuda_close(void *self)
{
    cuda_backend *cb = self;
    if (!cb)
        return;
    /* Workers have been joined and have freed their resources in worker_fini. */
    if (cb->host)
        gemm_cuda_host_set_notify(cb->host, NULL, NULL);
    gemm_cuda_house_stop(cb);
    gemm_cuda_resident_drain(cb); /* handles released since its last round */
    if (cb->workers)
        for (int i = 0; i < cb->nworkers; i++)
            if (cb->workers[i].gen != 0) {
                cudaSetDevice(cb->workers[i].dev->ordinal);
                gemm_cuda_destroy_resources(&cb->workers[i]);
            }
    gemm_cuda_host_close(cb->host);
    for (int i = 0; i < cb->ndev; i++) {
        pthread_cond_destroy(&cb->devs[i].cv);
        pthread_mutex_destroy(&cb->devs[i].mu);
        pthread_mutex_destroy(&cb->devs[i].busy_mu);
    }
    free(cb->workers);
    free(cb);
}

static void cuda_set_keep_charge(void *self, gemm_keep_charge_fn fn, void *ctx)
{
    cuda_backend *cb = self;
    gemm_cuda_host_set_charge(cb->host, fn, ctx);
}

static uint64_t cuda_trim_kept(void *self)
{
    cuda_backend *cb = self;
    return gemm_cuda_host_trim(cb->host);
}

const gemm_backend gemm_backend_cuda = {
    .name = "cuda",
    .open = cuda_open,
    .workers = cuda_workers,
    .worker_init = cuda_worker_init,
    .worker_fini = cuda_worker_fini,
    .validate = cuda_validate,
    .run = cuda_run,
    .describe = cuda_describe,
    .stats = cuda_stats,
    .allocator = cuda_allocator,
    .close = cuda_close,
    .healthy = cuda_healthy,
    .batch_default = 32, /* one launch and one copy call each way for up to 32 small products */
    .run_parts = 1,      /* a group's products are copied from and to their own blocks */
    .resident_free = gemm_cuda_resident_release,
    .worker_slot = cuda_worker_slot,
    .slot_usable = cuda_slot_usable,
    .set_keep_charge = cuda_set_keep_charge,
    .trim_kept = cuda_trim_kept,
    .quick = cuda_quick,
};
