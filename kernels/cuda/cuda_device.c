/*
 * cuda_device.c - the device list, the fault hooks, each worker's stream, cuBLAS handle,
 * events and device buffers (from the stream-ordered pool: docs/KERNELS.md, "Device memory
 * on the worker path"), and the enter/leave protocol that lets one worker reset a device
 * whose context a sticky error broke while the others wait.
 */
#include "cuda_engine.h"

#include "gemm_kernels.h"
#include "gemm_scratch.h"

#include <stddef.h>
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

int gemm_cuda_parse_devices(cuda_backend *cb, const char *spec, int count, gemm_engine_err *err)
{
    if (!spec[0] || strcmp(spec, "all") == 0) {
        cb->ndev = count < GEMM_MAX_DEVICES ? count : GEMM_MAX_DEVICES;
        for (int i = 0; i < cb->ndev; i++) cb->devs[i].ordinal = i;
        return 0;
    }
    char buf[128];
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
        char *end = NULL;
        long v = strtol(tok, &end, 10);
        if (!end || *end || end == tok || v < 0 || v >= count)
            return gemm_engine_err_set(err, GEMM_E_BAD_CONFIG,
                                       "devices \"%s\": \"%s\" is not a device ordinal; %d device(s) "
                                "are visible (0..%d), or use \"all\"", spec, tok, count, count - 1);
        for (int i = 0; i < cb->ndev; i++)
            if (cb->devs[i].ordinal == (int)v)
                return gemm_engine_err_set(err, GEMM_E_BAD_CONFIG, "devices \"%s\": %ld is listed twice",
                                    spec, v);
        if (cb->ndev == GEMM_MAX_DEVICES)
            return gemm_engine_err_set(err, GEMM_E_BAD_CONFIG, "devices \"%s\": at most %d devices",
                                spec, GEMM_MAX_DEVICES);
        cb->devs[cb->ndev++].ordinal = (int)v;
    }
    if (cb->ndev == 0) return gemm_engine_err_set(err, GEMM_E_BAD_CONFIG, "devices \"%s\" names no device", spec);
    return 0;
}

const gemm_fault_hook gemm_cuda_faults[] = {
    {"oom", offsetof(cuda_backend, oom_at), 1, 1000000000L},
    {"sticky", offsetof(cuda_backend, sticky_at), 1, 1000000000L},
    {"lost", offsetof(cuda_backend, lost_at), 1, 1000000000L},
    {"gpu_delay_ms", offsetof(cuda_backend, delay_ms), 1, 3600000},
    {"copy_loop", offsetof(cuda_backend, copy_loop), 1, 1},
    {NULL, 0, 0, 0},
};

/* ---- worker resources --------------------------------------------------- */

/* Back to the pool after the stream's work (best effort: a reset reclaims it anyway). */
static void buffer_free(cuda_worker *w, int i)
{
    if (w->buf[i]) {
        if (cudaFreeAsync(w->buf[i], w->stream) != cudaSuccess) cudaGetLastError();
        atomic_fetch_sub(&w->dev->mem_used, (unsigned long long)w->cap[i]);
    }
    w->buf[i] = NULL;
    w->cap[i] = 0;
}

static void free_buffers(cuda_worker *w)
{
    for (int i = 0; i < 3; i++) buffer_free(w, i);
}

/* Frees what the worker holds on its device, best effort. Caller has set the device. */
void gemm_cuda_destroy_resources(cuda_worker *w)
{
    free_buffers(w);
    gemm_lt_destroy(w->lt);
    w->lt = NULL;
    if (w->blas) cublasDestroy(w->blas);
    if (w->lt_ws && cudaFreeAsync(w->lt_ws, w->stream) != cudaSuccess) cudaGetLastError();
    w->lt_ws = NULL;
    for (int i = 0; i < WORKER_EVENTS; i++)
        if (w->ev[i]) cudaEventDestroy(w->ev[i]);
    if (w->stream) cudaStreamDestroy(w->stream);
    cudaGetLastError();
    w->blas = NULL;
    w->stream = NULL;
    memset(w->ev, 0, sizeof w->ev);
    w->gen = 0;
}

cudaError_t gemm_cuda_build_resources(cuda_worker *w, unsigned gen, gemm_cuda_site *site)
{
    cudaError_t e = GEMM_CUDA_CHECK(site, cudaStreamCreateWithFlags(&w->stream, cudaStreamNonBlocking));
    /* blocking-sync events: a waiting worker sleeps (after a short poll: cuda_run.c) */
    for (int i = 0; i < WORKER_EVENTS && e == cudaSuccess; i++)
        e = GEMM_CUDA_CHECK(site, cudaEventCreateWithFlags(&w->ev[i], cudaEventBlockingSync));
    if (e == cudaSuccess) e = GEMM_CUBLAS_CHECK(site, cublasCreate(&w->blas));
    if (e == cudaSuccess) e = GEMM_CUBLAS_CHECK(site, cublasSetStream(w->blas, w->stream));
    /* One workspace for cuBLAS and cublasLt (one stream); without it cublasGemmEx runs all. */
    if (e == cudaSuccess) {
        if (gemm_scratch_alloc(&w->lt_ws, GEMM_LT_WORKSPACE_BYTES, w->stream) == cudaSuccess) {
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
        return gemm_cuda_note(site, cudaErrorMemoryAllocation, "gemm_scratch_alloc (injected oom)",
                              __FILE__, __LINE__);
    return GEMM_CUDA_CHECK(site, gemm_scratch_alloc(p, bytes, w->stream));
}

static size_t round_cap(size_t need, uint64_t limit)
{
    size_t r = need <= SIZE_MAX - BUF_ROUND ? (need + BUF_ROUND - 1) / BUF_ROUND * BUF_ROUND : need;
    if (limit && r > limit)
        r = need; /* the limit was checked on the exact sizes */
    return r;
}

/* Buffers of at least need[i] bytes (failure: none), whole MiB unless past device_mem_limit. */
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
        free_buffers(w);
        for (int i = 0; i < 3; i++) want[i] = need[i];
    }
    for (int i = 0; i < 3; i++) {
        if (w->buf[i] && w->cap[i] >= need[i]) continue;
        buffer_free(w, i);
        cudaError_t e = dev_malloc(w, &w->buf[i], want[i], site);
        if (e != cudaSuccess) {
            w->buf[i] = NULL;
            free_buffers(w);
            return e;
        }
        w->cap[i] = want[i];
        atomic_fetch_add(&w->dev->mem_used, (unsigned long long)want[i]);
    }
    return cudaSuccess;
}

/* ---- device enter / leave / reset --------------------------------------- */

int gemm_cuda_dev_enter_house(cuda_dev *d, int lost_too)
{
    pthread_mutex_lock(&d->mu);
    while (d->resetting) pthread_cond_wait(&d->cv, &d->mu);
    int ok = lost_too || !atomic_load(&d->lost);
    if (ok) d->active++;
    pthread_mutex_unlock(&d->mu);
    return ok;
}

unsigned gemm_cuda_dev_enter(cuda_dev *d)
{
    gemm_cuda_dev_enter_house(d, 1); /* inside: no reset runs meanwhile, so d->gen is stable */
    pthread_mutex_lock(&d->busy_mu);
    if (d->jobs++ == 0) d->busy_since_ms = gemm_now_ms();
    pthread_mutex_unlock(&d->busy_mu);
    return d->gen;
}

void gemm_cuda_dev_leave_house(cuda_dev *d)
{
    pthread_mutex_lock(&d->mu);
    d->active--;
    pthread_cond_broadcast(&d->cv); /* a resetter may be waiting for active == 0 */
    pthread_mutex_unlock(&d->mu);
}

void gemm_cuda_pin(cuda_backend *cb, cuda_dev *d, void *p, unsigned *held)
{
    for (int tries = 0; tries < 3; tries++) {
        int s = gemm_cuda_host_pin(cb->host, p, d->slot);
        if (s < 0 || s == d->slot || (*held & (1u << s))) return;
        /* Hold the device whose registration it is, then look again (a reset meanwhile). */
        gemm_cuda_dev_enter_house(&cb->devs[s], 1);
        *held |= 1u << s;
    }
}

void gemm_cuda_unhold(cuda_backend *cb, unsigned held)
{
    for (int s = 0; held; s++, held >>= 1)
        if (held & 1u) gemm_cuda_dev_leave_house(&cb->devs[s]);
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

/* With d->mu held, resetting set and nobody inside: frees the workers' resources, resets
 * the device and (unless `lose`) makes a new context within RESET_WAIT_MS, else marks it lost. */
static void reset_locked(cuda_backend *cb, cuda_dev *d, int lose)
{
    gemm_cuda_host_device_lost(cb->host, d->slot);
    cudaSetDevice(d->ordinal);
    for (int i = 0; i < cb->nworkers; i++)
        if (cb->workers[i].dev == d && cb->workers[i].gen != 0) gemm_cuda_destroy_resources(&cb->workers[i]);
    gemm_engine_log(GEMM_LOG_WARN, "cuda: device %d (%s): resetting after %s", d->ordinal, d->info.name,
                    lose ? "its injected loss (fault_inject lost)" : "a sticky error");
    cudaError_t e = cudaDeviceReset();
    if (e != cudaSuccess)
        gemm_engine_log(GEMM_LOG_ERROR, "cuda: cudaDeviceReset on device %d failed: %s", d->ordinal,
                        cudaGetErrorString(e));
    cudaGetLastError();
    gemm_cuda_host_device_reset(cb->host, d->slot); /* its cached blocks went with the registrations */
    gemm_scratch_device_reset(d->ordinal);
    double t0 = gemm_now_ms();
    int tries = 0;
    e = lose ? cudaErrorDevicesUnavailable : cudaSuccess;
    while (!lose) { /* a new context can take a moment after the faulted one is torn down */
        tries++;
        e = cudaSetDevice(d->ordinal);
        if (e == cudaSuccess)
            e = cudaFree(0); /* makes the new primary context */
        if (e == cudaSuccess || gemm_now_ms() - t0 >= RESET_WAIT_MS) break;
        cudaGetLastError();
        struct timespec ts = {0, 200 * 1000000L};
        nanosleep(&ts, NULL);
    }
    d->gen++;
    if (e == cudaSuccess) {
        gemm_engine_log(GEMM_LOG_WARN, "cuda: device %d (%s) was reset after a sticky error (new context after "
                        "%d tr%s, %.0f ms); its streams are rebuilt before their next job", d->ordinal, d->info.name,
                        tries, tries == 1 ? "y" : "ies", gemm_now_ms() - t0);
        return;
    }
    d->lost_err = e;
    atomic_store(&d->lost, 1);
    gemm_engine_log(GEMM_LOG_ERROR, "cuda: device %d (%s) could not be recovered in this process (%s); it takes "
                    "no more products (the engine's other devices serve them; with none left they fail with 503 "
                    "device_unavailable) until gemmd is restarted", d->ordinal, d->info.name,
                    lose ? "fault_inject lost" : cudaGetErrorString(e));
}

/* Leaves the device, resetting it when `broken` (and not reset since gen). One device resets
 * at a time: two resets each waiting for the other's jobs would never end. */
void gemm_cuda_dev_leave(cuda_backend *cb, cuda_dev *d, unsigned gen, int broken, int lose)
{
    pthread_mutex_lock(&d->busy_mu);
    if (--d->jobs == 0) d->busy_ms += gemm_now_ms() - d->busy_since_ms;
    pthread_mutex_unlock(&d->busy_mu);
    gemm_cuda_dev_leave_house(d);
    if (!broken) return;
    pthread_mutex_lock(&cb->reset_mu);
    pthread_mutex_lock(&d->mu);
    if (gen == d->gen) {
        d->resetting = 1;
        while (d->active > 0) pthread_cond_wait(&d->cv, &d->mu);
        reset_locked(cb, d, lose);
        d->resetting = 0;
        pthread_cond_broadcast(&d->cv);
    }
    pthread_mutex_unlock(&d->mu);
    pthread_mutex_unlock(&cb->reset_mu);
}
