/*
 * engine_cuda.c - the CUDA backend's row: `streams_per_device` worker threads per device,
 * each owning a stream (worker i on device i % ndev). The request path makes no CUDA call:
 * validate() and describe() read what open read once per device. Faults:
 * docs/OPERATIONS.md, "Faults".
 */
#include "cuda_engine.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemm_kernels.h"

/* ---- open / workers ------------------------------------------------------ */

static void cuda_close(void *self);
static int cuda_validate(void *self, gemm_job *job, gemm_engine_err *err);

static void *cuda_open(const gemm_engine_config *cfg, gemm_engine_err *err)
{
    int count = gemm_cuda_device_count();
    if (count <= 0) {
        gemm_engine_err_set(err, GEMM_E_NO_DEVICE, "backend \"cuda\" was asked for but no usable CUDA device was "
                            "found (check the driver, CUDA_VISIBLE_DEVICES and --gpus); use backend auto or cpu");
        return NULL;
    }
    cuda_backend *cb = calloc(1, sizeof *cb);
    if (!cb) {
        gemm_engine_err_set(err, GEMM_E_NO_MEMORY, "cannot allocate the CUDA backend");
        return NULL;
    }
    if (gemm_cuda_parse_devices(cb, cfg->devices, count, err) != 0 ||
        gemm_faults_parse(&gemm_backend_cuda, cfg->fault_inject, cb, err) != 0) {
        free(cb);
        return NULL;
    }
    pthread_mutex_init(&cb->reset_mu, NULL);
    cb->streams = cfg->streams_per_device > 0 ? cfg->streams_per_device : 4;
    if (cb->streams > 64) cb->streams = 64;
    cb->mem_limit = cfg->device_mem_limit;
    cb->warmup = !cfg->fault_inject[0]; /* the hooks count runs: none of them warm-up products */
    cb->min_cc = INT_MAX;
    cb->wgmma_ok = 1;
    for (int i = 0; i < cb->ndev; i++) {
        pthread_mutex_init(&cb->devs[i].mu, NULL);
        pthread_mutex_init(&cb->devs[i].busy_mu, NULL);
        pthread_cond_init(&cb->devs[i].cv, NULL);
    }

    for (int i = 0; i < cb->ndev; i++) {
        cuda_dev *d = &cb->devs[i];
        struct cudaDeviceProp p;
        cudaError_t e = cudaGetDeviceProperties(&p, d->ordinal);
        if (e != cudaSuccess) {
            cudaGetLastError();
            gemm_engine_err_set(err, GEMM_E_NO_DEVICE, "cannot read the properties of CUDA device %d: %s",
                                d->ordinal, cudaGetErrorString(e));
            cuda_close(cb);
            return NULL;
        }
        d->info = (gemm_device_info){.total_mem = p.totalGlobalMem, .sms = p.multiProcessorCount,
                                     .cc_major = p.major, .cc_minor = p.minor, .streams = cb->streams};
        snprintf(d->info.name, sizeof d->info.name, "%.47s", p.name);
        const int cc = p.major * 10 + p.minor;
        if (cc < cb->min_cc) cb->min_cc = cc;
        d->slot = i;
        snprintf(d->label, sizeof d->label, "cuda:%d %.38s", d->ordinal, d->info.name);
        d->gen = 1;
        atomic_init(&d->mem_total, (unsigned long long)p.totalGlobalMem); /* the rest: calloc's zeros */
        /* What the request path will need, asked once (this makes the device's context). */
        int wgmma = 0; /* the build's sm_90a code runs here */
        if (cudaSetDevice(d->ordinal) == cudaSuccess) {
            wgmma = gemm_wgmma_runnable();
            gemm_cuda_sample_memory(d);
        }
        cudaGetLastError();
        if (!wgmma) cb->wgmma_ok = 0;
        gemm_engine_log(GEMM_LOG_DEBUG, "cuda: device %d: %s, cc %d.%d, %d SMs, %llu MiB (%llu free), wgmma %s",
                        d->ordinal, d->info.name, p.major, p.minor, d->info.sms,
                        (unsigned long long)(p.totalGlobalMem >> 20),
                        (unsigned long long)(atomic_load(&d->mem_free) >> 20),
                        wgmma ? "runs" : "not in this build for this device");
    }

    cb->nworkers = cb->ndev * cb->streams;
    cb->workers = calloc((size_t)cb->nworkers, sizeof *cb->workers);
    int ordinals[GEMM_MAX_DEVICES];
    for (int i = 0; i < cb->ndev; i++) ordinals[i] = cb->devs[i].ordinal;
    size_t cache = cfg->host_cache_bytes && cfg->host_cache_bytes < HOST_CACHE_BYTES ? cfg->host_cache_bytes
                                                                                      : HOST_CACHE_BYTES;
    cb->host = gemm_cuda_host_open(ordinals, cb->ndev, cache);
    if (!cb->workers || !cb->host) {
        gemm_engine_err_set(err, GEMM_E_NO_MEMORY, "cannot allocate the CUDA backend's workers");
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
        gemm_engine_err_set(err, GEMM_E_BACKEND, "cannot start the CUDA backend's housekeeping thread");
        cuda_close(cb);
        return NULL;
    }
    gemm_cuda_host_set_notify(cb->host, gemm_cuda_house_wake, cb);
    return cb;
}

static int cuda_workers(void *self)
{
    return ((cuda_backend *)self)->nworkers;
}

/* A worker's warm-up (docs/OPERATIONS.md, "CUDA backend") through validate and run as a
 * request, counted nowhere: 64^3 and 256^3 reach our own members, the rest cuBLAS. */
static void cuda_warm(cuda_backend *cb, cuda_worker *w)
{
    static const gemm_dtype dtypes[] = {GEMM_DTYPE_F32, GEMM_DTYPE_F64, GEMM_DTYPE_I32, GEMM_DTYPE_F16,
                                        GEMM_DTYPE_BF16};
    static const struct { uint64_t n, batch; } shapes[] = {{64, 0}, {256, 0}, {512, 0}, {64, 4}};
    double t0 = gemm_now_ms();
    int ran = 0;
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++) {
        for (size_t j = 0; j < sizeof shapes / sizeof shapes[0]; j++) {
            gemm_job job = {.dtype = dtypes[i], .m = shapes[j].n, .k = shapes[j].n, .n = shapes[j].n,
                            .batch = shapes[j].batch, .math = GEMM_MATH_DEFAULT, .state = GEMM_JOB_RUNNING};
            size_t need[3];
            gemm_engine_err err;
            if (!gemm_job_bytes(&job, need) || cuda_validate(cb, &job, &err) != 0) continue;
            void **buf[3] = {&job.a, &job.b, &job.c};
            for (int b = 0; b < 3; b++) *buf[b] = cb->alloc.alloc(cb->alloc.ctx, need[b]);
            int rc = 0;
            if (job.a && job.b && job.c) {
                memset(job.a, 0, need[0]);
                memset(job.b, 0, need[1]);
                ran += (rc = gemm_cuda_run(cb, w, &job)) == 0;
            }
            for (int b = 0; b < 3; b++) cb->alloc.free(cb->alloc.ctx, *buf[b]);
            if (rc != 0) { /* the first real job will meet (and report) the same trouble */
                gemm_engine_log(GEMM_LOG_WARN, "cuda: worker %d: warm-up product %s %llu^3 (batch %llu) failed: %s",
                                w->index, gemm_dtype_name(job.dtype), (unsigned long long)job.m,
                                (unsigned long long)job.batch, job.err.message);
                return;
            }
        }
    }
    gemm_engine_log(GEMM_LOG_DEBUG, "cuda: worker %d (%s, stream %d) warmed up: %d products in %.1f ms",
                    w->index, w->dev->label, w->stream_index, ran, gemm_now_ms() - t0);
}

static void *cuda_worker_init(void *self, int index)
{
    cuda_backend *cb = self;
    cuda_worker *w = &cb->workers[index]; /* index < nworkers: the engine asked workers() */
    cuda_dev *d = w->dev;
    gemm_cuda_site site = {0};
    pthread_mutex_lock(&d->mu);
    while (d->resetting) pthread_cond_wait(&d->cv, &d->mu);
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
    cuda_worker *w = worker; /* worker_init's row, never NULL */
    cuda_dev *d = w->dev;
    pthread_mutex_lock(&d->mu);
    while (d->resetting) pthread_cond_wait(&d->cv, &d->mu);
    if (w->gen != 0) {
        cudaSetDevice(d->ordinal);
        if (w->gen == d->gen) gemm_cuda_destroy_resources(w);
        w->gen = 0;
    }
    pthread_mutex_unlock(&d->mu);
}

/* ---- validate: resolve the kernel, tile and math ------------------------ */

/* ", a, b, ..." for the members that run one of `dtypes` (bits of gemm_dtype). */
static const char *member_names(char *list, size_t cap, unsigned dtypes)
{
    size_t off = 0;
    list[0] = '\0';
    for (int i = 0; gemm_kernel_table[i] && off < cap; i++)
        if (gemm_kernel_table[i]->dtypes & dtypes)
            off += (size_t)snprintf(list + off, cap - off, ", %s", gemm_kernel_table[i]->name);
    return list;
}

/* The member k cannot run job (why): the error that says what to ask for instead. */
static int refuse(const gemm_kernel_desc *k, const gemm_job *job, const char *why, gemm_engine_err *err)
{
    const char *dt = gemm_dtype_name(job->dtype);
    if (!why) why = "not supported";
    char list[256] = "";
    size_t off = 0;
    if (!(k->dtypes & (1u << job->dtype))) {
        if (strcmp(k->name, "cublas") == 0)
            return gemm_engine_err_set(err, GEMM_E_UNSUPPORTED_DTYPE,
                                       "kernel \"cublas\" does not compute %s: cuBLAS has no %s GEMM that wraps like "
                                       "two's complement; use kernel auto, naive or tiled", dt, dt);
        return gemm_engine_err_set(err, GEMM_E_UNSUPPORTED_DTYPE, "kernel \"%s\" does not compute %s; %s runs on "
                                   "kernel auto%s", k->name, dt, dt, member_names(list, sizeof list, 1u << job->dtype));
    }
    if (job->tile && strstr(why, "tile")) {
        if (!k->tiles[0])
            return gemm_engine_err_set(err, GEMM_E_BAD_TILE, "kernel \"%s\" takes no tile option (tile=%d)", k->name,
                                       job->tile);
        for (int i = 0; i < 4 && k->tiles[i] && off < sizeof list; i++)
            off += (size_t)snprintf(list + off, sizeof list - off, "%s%d", i ? ", " : "", k->tiles[i]);
        return gemm_engine_err_set(err, GEMM_E_BAD_TILE, "kernel \"%s\" takes tile %s, not %d", k->name, list,
                                   job->tile);
    }
    return gemm_engine_err_set(err, strstr(why, "math") ? GEMM_E_UNSUPPORTED_MATH : GEMM_E_UNSUPPORTED,
                               "kernel \"%s\" cannot run %s with math %s, tile %d: %s", k->name, dt,
                               gemm_math_name(job->math), job->tile, why);
}

/* On the request path (an HTTP thread): reads only what open cached, no CUDA call. */
static int cuda_validate(void *self, gemm_job *job, gemm_engine_err *err)
{
    cuda_backend *cb = self;
    if (job->plan_m > INT_MAX) /* m, k and n: gemm_sched_check */
        return gemm_engine_err_set(err, GEMM_E_BAD_OPTION, "panel_of=%llu: the CUDA backend takes up to %d rows",
                                   (unsigned long long)job->plan_m, INT_MAX);
    /* auto (auto.c), for the oldest device, a panel as its whole product. */
    const char *name = !job->kernel[0] || strcmp(job->kernel, "auto") == 0
                           ? gemm_kernel_auto(job->dtype, job->math, (int)gemm_job_plan_rows(job), (int)job->n,
                                              (int)job->k, (int)gemm_job_batch(job), cb->min_cc, cb->wgmma_ok)
                           : job->kernel;
    const gemm_kernel_desc *k = gemm_kernel_find(name);
    if (!k) {
        char list[256];
        return gemm_engine_err_set(err, GEMM_E_UNKNOWN_KERNEL, "kernel \"%s\" is not available on the CUDA backend; "
                                   "it has auto%s", job->kernel, member_names(list, sizeof list, ~0u));
    }
    const char *why = gemm_kernel_unsupported(k, job->dtype, job->math, job->tile, cb->min_cc);
    if (why) return refuse(k, job, why, err);
    if (strcmp(k->name, "wgmma") == 0 && !cb->wgmma_ok)
        return gemm_engine_err_set(err, GEMM_E_UNSUPPORTED,
                                   "kernel \"wgmma\" cannot run here: this build has no sm_90a code for %s (build "
                                   "with CUDA_ARCHS including 90a); use kernel auto, mma or cublas",
                                   cb->ndev > 1 ? "every device" : "the device");
    snprintf(job->kernel_used, sizeof job->kernel_used, "%s", k->name);
    /* The block depends on the device buffers' alignment too: the launch asks plan(). */
    job->tile_used = job->tile;
    job->math_used = job->dtype == GEMM_DTYPE_F32 ? (job->math == GEMM_MATH_DEFAULT ? GEMM_MATH_FP32 : job->math)
                                                  : GEMM_MATH_DEFAULT;
    return 0;
}

/* ---- describe / stats / close ------------------------------------------- */

/* From what open read and the housekeeping thread sampled: no CUDA call. */
static void cuda_describe(void *self, gemm_engine_info *out)
{
    cuda_backend *cb = self;
    out->ndevices = cb->ndev;
    for (int i = 0; i < cb->ndev; i++) {
        cuda_dev *d = &cb->devs[i];
        out->devices[i] = d->info;
        out->devices[i].free_mem = atomic_load(&d->mem_free);
        out->devices[i].total_mem = atomic_load(&d->mem_total); /* set at open, then sampled */
    }
    int n = 0;
    for (int i = 0; gemm_kernel_table[i] && n < GEMM_MAX_KERNELS; i++) {
        const gemm_kernel_desc *k = gemm_kernel_table[i];
        if (k->min_cc > cb->min_cc || (strcmp(k->name, "wgmma") == 0 && !cb->wgmma_ok)) continue;
        gemm_kernel_info *ki = &out->kernels[n++];
        *ki = (gemm_kernel_info){.dtypes = k->dtypes, .maths = k->maths | (1u << GEMM_MATH_DEFAULT)};
        snprintf(ki->name, sizeof ki->name, "%s", k->name);
        snprintf(ki->description, sizeof ki->description, "%s", k->description);
        memcpy(ki->tiles, k->tiles, sizeof ki->tiles);
    }
    out->nkernels = n;
}

/* busy: the union of the jobs' time inside; mem_used: the streams' cached buffers. */
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

static int cuda_healthy(void *self)
{
    cuda_backend *cb = self;
    int usable = 0;
    for (int i = 0; i < cb->ndev && !usable; i++) usable = !atomic_load(&cb->devs[i].lost);
    return usable;
}

/* Split products: worker i is on device slot i % ndev; a lost device takes no panel. */
static int cuda_worker_slot(void *self, int worker_index)
{
    return ((cuda_backend *)self)->workers[worker_index].dev->slot; /* as worker_init's index */
}

static int cuda_slot_usable(void *self, int slot)
{
    cuda_backend *cb = self;
    return slot >= 0 && slot < cb->ndev && !atomic_load(&cb->devs[slot].lost);
}

/* Not while a hook holds runs or breaks the device: a recovery belongs on a worker. */
static int cuda_quick(void *self)
{
    const cuda_backend *cb = self;
    return cb->delay_ms <= 0 && cb->sticky_at <= 0 && cb->lost_at <= 0;
}

static void cuda_close(void *self)
{
    cuda_backend *cb = self;
    if (!cb) return;
    /* Workers have been joined and have freed their resources in worker_fini (which runs
     * on every worker thread that ran worker_init; the others built none). */
    if (cb->host) gemm_cuda_host_set_notify(cb->host, NULL, NULL);
    gemm_cuda_house_stop(cb);
    gemm_cuda_resident_drain(cb); /* handles released since its last round */
    gemm_cuda_host_close(cb->host);
    for (int i = 0; i < cb->ndev; i++) {
        pthread_cond_destroy(&cb->devs[i].cv);
        pthread_mutex_destroy(&cb->devs[i].mu);
        pthread_mutex_destroy(&cb->devs[i].busy_mu);
    }
    pthread_mutex_destroy(&cb->reset_mu);
    free(cb->workers);
    free(cb);
}

static void cuda_set_keep_charge(void *self, gemm_keep_charge_fn fn, void *ctx)
{
    gemm_cuda_host_set_charge(((cuda_backend *)self)->host, fn, ctx);
}

static uint64_t cuda_trim_kept(void *self)
{
    return gemm_cuda_host_trim(((cuda_backend *)self)->host);
}

const gemm_backend gemm_backend_cuda = {
    .name = "cuda",
    .present = gemm_cuda_device_count,
    .open = cuda_open,
    .close = cuda_close,
    .workers = cuda_workers,
    .worker_init = cuda_worker_init,
    .worker_fini = cuda_worker_fini,
    .validate = cuda_validate,
    .run = gemm_cuda_run,
    .describe = cuda_describe,
    .stats = cuda_stats,
    .allocator = cuda_allocator,
    .healthy = cuda_healthy,
    .batch_default = 32, /* one launch and one copy call each way for up to 32 small products */
    .run_parts = 1,      /* a group's products are copied from and to their own blocks */
    .resident_free = gemm_cuda_resident_release,
    .worker_slot = cuda_worker_slot,
    .slot_usable = cuda_slot_usable,
    .set_keep_charge = cuda_set_keep_charge,
    .trim_kept = cuda_trim_kept,
    .quick = cuda_quick,
    .offload = 1, /* the host path runs beside it */
    .faults = gemm_cuda_faults,
};
