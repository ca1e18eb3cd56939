/*
 * cuda_device.c - what the CUDA backend keeps per device and per worker: the device list
 * from the `devices` setting, the fault hooks, each worker's stream, cuBLAS handle, events
 * and cached device buffers, and the protocol that lets one worker reset a device whose
 * context a sticky error broke while the others wait (see engine_cuda.c).
 */
#include "cuda_engine.h"

#include "gemm_kernels.h"
#include "gemm_scratch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- devices ------------------------------------------------------------ */

int gemm_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

int gemm_cuda_parse_devices(cuda_backend *cb, const char *spec, int count, gemm_err *err)
{
    if (!spec[0] || strcmp(spec, "all") == 0) {
        cb->ndev = count < GEMM_MAX_DEVICES ? count : GEMM_MAX_DEVICES;
        for (int i = 0; i < cb->ndev; i++)
            cb->devs[i].ordinal = i;
        return 0;
    }
    char buf[128];
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
        char *end = NULL;
        long v = strtol(tok, &end, 10);
        if (!end || *end || end == tok || v < 0 || v >= count)
            return gemm_err_set(err, 400, "bad_config",
                                "devices \"%s\": \"%s\" is not a device ordinal; %d device(s) "
                                "are visible (0..%d), or use \"all\"", spec, tok, count, count - 1);
        for (int i = 0; i < cb->ndev; i++)
            if (cb->devs[i].ordinal == (int)v)
                return gemm_err_set(err, 400, "bad_config", "devices \"%s\": %ld is listed twice",
                                    spec, v);
        if (cb->ndev == GEMM_MAX_DEVICES)
            return gemm_err_set(err, 400, "bad_config", "devices \"%s\": at most %d devices",
                                spec, GEMM_MAX_DEVICES);
        cb->devs[cb->ndev++].ordinal = (int)v;
    }
    if (cb->ndev == 0)
        return gemm_err_set(err, 400, "bad_config", "devices \"%s\" names no device", spec);
    return 0;
}

int gemm_cuda_parse_faults(cuda_backend *cb, const char *spec, gemm_err *err)
{
    char buf[sizeof ((gemm_engine_config *)0)->fault_inject];
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ')
            tok++;
        if (!*tok)
            continue;
        char *colon = strchr(tok, ':');
        char *end = NULL;
        long v = colon ? strtol(colon + 1, &end, 10) : -1;
        int ok = colon && end && end != colon + 1 && *end == '\0' && v >= 1 && v <= 1000000000L;
        if (ok && strncmp(tok, "oom:", 4) == 0)
            cb->oom_at = v;
        else if (ok && strncmp(tok, "sticky:", 7) == 0)
            cb->sticky_at = v;
        else if (ok && strncmp(tok, "lost:", 5) == 0)
            cb->lost_at = v;
        else if (ok && v <= 3600000 && strncmp(tok, "gpu_delay_ms:", 13) == 0)
            cb->delay_ms = v;
        else if (ok && v == 1 && strcmp(tok, "copy_loop:1") == 0)
            cb->copy_loop = 1;
        else
            return gemm_err_set(err, 400, "bad_config",
                                "fault_inject \"%s\": the CUDA backend understands oom:N, "
                                "sticky:N, lost:N, gpu_delay_ms:N (N >= 1) and copy_loop:1", tok);
    }
    return 0;
}

/* ---- worker resources --------------------------------------------------- */

static void mem_used_add(cuda_dev *d, size_t bytes, int sign)
{
    if (sign > 0)
        atomic_fetch_add(&d->mem_used, (unsigned long long)bytes);
    else
        atomic_fetch_sub(&d->mem_used, (unsigned long long)bytes);
}

void gemm_cuda_free_buffers(cuda_worker *w)
{
    for (int i = 0; i < 3; i++) {
        if (w->buf[i]) {
            if (cudaFree(w->buf[i]) != cudaSuccess)
                cudaGetLastError();
            mem_used_add(w->dev, w->cap[i], -1);
        }
        w->buf[i] = NULL;
        w->cap[i] = 0;
    }
}

/* Frees what the worker holds on its device (best effort: after a sticky error the calls
 * fail, and cudaDeviceReset reclaims everything anyway). Caller has set the device. */
void gemm_cuda_destroy_resources(cuda_worker *w)
{
    gemm_cuda_free_buffers(w);
    gemm_lt_destroy(w->lt);
    w->lt = NULL;
    if (w->blas)
        cublasDestroy(w->blas);
    if (w->lt_ws) {
        if (cudaFree(w->lt_ws) != cudaSuccess)
            cudaGetLastError();
        w->lt_ws = NULL;
    }
    for (int i = 0; i < WORKER_EVENTS; i++)
        if (w->ev[i])
            cudaEventDestroy(w->ev[i]);
    if (w->stream)
        cudaStreamDestroy(w->stream);
    cudaGetLastError();
    w->blas = NULL;
    w->stream = NULL;
    memset(w->ev, 0, sizeof w->ev);
    w->gen = 0;
}

cudaError_t gemm_cuda_build_resources(cuda_worker *w, unsigned gen, gemm_cuda_site *site)
{
    cudaError_t e = GEMM_CUDA_CHECK(site, cudaStreamCreateWithFlags(&w->stream, cudaStreamNonBlocking));
    /* Blocking-sync events: a worker waiting for its product sleeps instead of spinning a
     * core (it polls only briefly first, see wait_event in engine_cuda.c). */
    for (int i = 0; i < WORKER_EVENTS && e == cudaSuccess; i++)
        e = GEMM_CUDA_CHECK(site, cudaEventCreateWithFlags(&w->ev[i], cudaEventBlockingSync));
    if (e == cudaSuccess)
        e = GEMM_CUBLAS_CHECK(site, cublasCreate(&w->blas));
    if (e == cudaSuccess)
        e = GEMM_CUBLAS_CHECK(site, cublasSetStream(w->blas, w->stream));
    /* One workspace for cuBLAS and cublasLt (the same stream uses it): cuBLAS would
     * otherwise allocate its own. cublasLt picks the algorithm of a panel's whole product
     * (gemm_launch.plan_m); without it (no memory, no cublasLt) cublasGemmEx runs everything. */
    if (e == cudaSuccess) {
        if (cudaMalloc(&w->lt_ws, GEMM_LT_WORKSPACE_BYTES) == cudaSuccess) {
            e = GEMM_CUBLAS_CHECK(site, cublasSetWorkspace(w->blas, w->lt_ws, GEMM_LT_WORKSPACE_BYTES));
            if (e == cudaSuccess) w->lt = gemm_lt_create(w->lt_ws, GEMM_LT_WORKSPACE_BYTES);
        } else {
            w->lt_ws = NULL;
            cudaGetLastError();
        }
    }
    if (e != cudaSuccess) {
        gemm_cuda_destroy_resources(w);
        return e;
    }
    w->gen = gen;
    return cudaSuccess;
}

/* One device-buffer allocation, counted for the oom:N hook. */
static cudaError_t dev_malloc(cuda_worker *w, void **p, size_t bytes, gemm_cuda_site *site)
{
    long n = atomic_fetch_add(&w->cb->allocs, 1) + 1;
    if (w->cb->oom_at > 0 && n == w->cb->oom_at)
        return gemm_cuda_note(site, cudaErrorMemoryAllocation, "cudaMalloc (injected oom)",
                              __FILE__, __LINE__);
    return GEMM_CUDA_CHECK(site, cudaMalloc(p, bytes));
}

static size_t round_cap(size_t need, uint64_t limit)
{
    size_t r = need <= SIZE_MAX - BUF_ROUND ? (need + BUF_ROUND - 1) / BUF_ROUND * BUF_ROUND : need;
    if (limit && r > limit)
        r = need; /* the limit was checked on the exact sizes */
    return r;
}

/* Makes the three buffers at least need[i] bytes; on failure frees them all. Buffers
 * that are big enough are kept; the rest grow to whole MiB, unless the cache would then
 * exceed device_mem_limit, in which case all three are reallocated at their exact sizes. */
cudaError_t gemm_cuda_ensure_buffers(cuda_worker *w, const size_t need[3], gemm_cuda_site *site)
{
    uint64_t limit = w->cb->mem_limit;
    size_t want[3];
    uint64_t sum = 0;
    for (int i = 0; i < 3; i++) {
        want[i] = w->cap[i] >= need[i] ? w->cap[i] : round_cap(need[i], limit);
        sum += want[i];
    }
    if (limit && sum > limit) {
        gemm_cuda_free_buffers(w);
        for (int i = 0; i < 3; i++)
            want[i] = need[i];
    }
    for (int i = 0; i < 3; i++) {
        if (w->buf[i] && w->cap[i] >= need[i])
            continue;
        if (w->buf[i]) {
            if (cudaFree(w->buf[i]) != cudaSuccess)
                cudaGetLastError();
            mem_used_add(w->dev, w->cap[i], -1);
            w->buf[i] = NULL;
            w->cap[i] = 0;
        }
        cudaError_t e = dev_malloc(w, &w->buf[i], want[i], site);
        if (e != cudaSuccess) {
            w->buf[i] = NULL;
            gemm_cuda_free_buffers(w);
            return e;
        }
        w->cap[i] = want[i];
        mem_used_add(w->dev, want[i], +1);
    }
    return cudaSuccess;
}

/* ---- device enter / leave / reset --------------------------------------- */

unsigned gemm_cuda_dev_enter(cuda_dev *d, int *others)
{
    pthread_mutex_lock(&d->mu);
    while (d->resetting)
        pthread_cond_wait(&d->cv, &d->mu);
    d->active++;
    unsigned gen = d->gen;
    pthread_mutex_unlock(&d->mu);
    pthread_mutex_lock(&d->busy_mu);
    if (others)
        *others = d->jobs;
    if (d->jobs++ == 0)
        d->busy_since_ms = gemm_now_ms();
    pthread_mutex_unlock(&d->busy_mu);
    return gen;
}

int gemm_cuda_dev_enter_house(cuda_dev *d)
{
    pthread_mutex_lock(&d->mu);
    while (d->resetting)
        pthread_cond_wait(&d->cv, &d->mu);
    int ok = !atomic_load(&d->lost);
    if (ok)
        d->active++;
    pthread_mutex_unlock(&d->mu);
    return ok;
}

void gemm_cuda_dev_leave_house(cuda_dev *d)
{
    pthread_mutex_lock(&d->mu);
    d->active--;
    pthread_cond_broadcast(&d->cv); /* a resetter may be waiting for active == 0 */
    pthread_mutex_unlock(&d->mu);
}

void gemm_cuda_sample_memory(cuda_dev *d)
{
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
        atomic_store(&d->mem_free, (unsigned long long)free_b);
        atomic_store(&d->mem_total, (unsigned long long)total_b);
    } else {
        cudaGetLastError();
    }
}

/* Leaves the device; when `broken` (and nobody reset it since gen), resets it first. */
void gemm_cuda_dev_leave(cuda_backend *cb, cuda_dev *d, unsigned gen, int broken)
{
    pthread_mutex_lock(&d->busy_mu);
    if (--d->jobs == 0)
        d->busy_ms += gemm_now_ms() - d->busy_since_ms;
    pthread_mutex_unlock(&d->busy_mu);
    pthread_mutex_lock(&d->mu);
    d->active--;
    if (broken && gen == d->gen) {
        if (d->resetting) {
            pthread_cond_broadcast(&d->cv); /* the resetter may be waiting for us */
            while (d->resetting)
                pthread_cond_wait(&d->cv, &d->mu);
        } else {
            d->resetting = 1;
            while (d->active > 0)
                pthread_cond_wait(&d->cv, &d->mu);
            /* Nobody is inside a job on this device: free everything, reset, start over. */
            cudaSetDevice(d->ordinal);
            for (int i = 0; i < cb->nworkers; i++)
                if (cb->workers[i].dev == d && cb->workers[i].gen != 0)
                    gemm_cuda_destroy_resources(&cb->workers[i]);
            gemm_engine_log(GEMM_LOG_WARN, "cuda: device %d (%s): resetting after a sticky error",
                            d->ordinal, d->info.name);
            cudaError_t e = cudaDeviceReset();
            if (e != cudaSuccess)
                gemm_engine_log(GEMM_LOG_ERROR, "cuda: cudaDeviceReset on device %d failed: %s",
                                d->ordinal, cudaGetErrorString(e));
            cudaGetLastError();
            gemm_cuda_host_device_reset(cb->host, d->slot); /* its host registrations went too */
            gemm_scratch_device_reset(d->ordinal);
            /* A new context can take a moment after the faulted one is torn down: try for
             * up to RESET_WAIT_MS before declaring the device lost. */
            double t0 = gemm_now_ms();
            int tries = 0;
            do {
                tries++;
                e = cudaSetDevice(d->ordinal);
                if (e == cudaSuccess)
                    e = cudaFree(0); /* makes the new primary context */
                if (e == cudaSuccess)
                    break;
                cudaGetLastError();
                struct timespec ts = {0, 200 * 1000000L};
                nanosleep(&ts, NULL);
            } while (gemm_now_ms() - t0 < RESET_WAIT_MS);
            d->gen++;
            d->resets++;
            d->resetting = 0;
            if (e == cudaSuccess) {
                gemm_engine_log(GEMM_LOG_WARN, "cuda: device %d (%s) was reset after a sticky error "
                                "(new context after %d tr%s, %.0f ms); its streams are rebuilt before "
                                "their next job", d->ordinal, d->info.name, tries, tries == 1 ? "y" : "ies",
                                gemm_now_ms() - t0);
            } else {
                d->lost_err = e;
                atomic_store(&d->lost, 1);
                gemm_engine_log(GEMM_LOG_ERROR, "cuda: device %d (%s) could not be recovered in this "
                                "process after a sticky error (%s for %.0f ms after cudaDeviceReset); it "
                                "takes no more products (the engine's other devices serve them; with none "
                                "left they fail with 503 device_unavailable) until gemmd is restarted", d->ordinal,
                                d->info.name, cudaGetErrorString(e), gemm_now_ms() - t0);
            }
        }
    }
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

