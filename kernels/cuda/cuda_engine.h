/*
 * cuda_engine.h - the CUDA backend's insides, shared by its files (docs/KERNELS.md, "The
 * engine around the kernels", says which holds what). Not a public interface.
 */
#ifndef GEMM_CUDA_ENGINE_H
#define GEMM_CUDA_ENGINE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "cuda_check.h"
#include "cuda_host.h"
#include "backend.h"

#define BUF_ROUND (1u << 20)           /* device buffers grow in whole MiB */
#define RESET_WAIT_MS 1000.0           /* how long a reset device may take to accept a new context */
#define HOST_CACHE_BYTES (1ull << 30)  /* pinned blocks kept for reuse */
#define WORKER_EVENTS 6                /* h2d start/end, kernel start/end, d2h start/end */
#define HOUSE_PERIOD_MS 1000           /* the housekeeping thread samples free memory this often */

typedef struct cuda_worker cuda_worker;

typedef struct {
    int ordinal;                 /* CUDA ordinal (after CUDA_VISIBLE_DEVICES) */
    int slot;                    /* index in cuda_backend.devs */
    gemm_device_info info;       /* name, memory, SMs, cc, streams (read at open) */
    char label[GEMM_NAME_LEN];   /* "cuda:N <name>", what a job's device says */

    /* mu: enter/leave; a reset holds it throughout, so the request path never takes it. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned gen;                /* bumped by each reset; worker resources carry it */
    int resetting;
    int active;                  /* threads inside (gemm_cuda_dev_enter*): a reset waits for 0 */
    atomic_int lost;             /* reset done but no new context could be made */
    cudaError_t lost_err;        /* set before lost */

    pthread_mutex_t busy_mu;     /* the busy time */
    int jobs;                    /* jobs inside */
    double busy_since_ms;        /* when jobs went 0 -> 1 */
    double busy_ms;              /* union of the time some job ran on the device */

    atomic_ullong bytes_h2d, bytes_d2h, mem_used;
    atomic_ullong resident_bytes; /* device copies of resident operands (cuda_resident.c) */
    atomic_ullong mem_free, mem_total; /* cudaMemGetInfo, sampled off the request path */
} cuda_dev;

struct cuda_worker {
    struct cuda_backend *cb;
    cuda_dev *dev;
    int index, stream_index;
    int warming;                 /* running its warm-up products: counted nowhere */
    unsigned gen;                /* dev->gen its resources belong to; 0 = none */
    cudaStream_t stream;
    cublasHandle_t blas;
    void *lt;                    /* gemm_lt_create state for the cublas member (NULL: none) */
    void *lt_ws;                 /* its device workspace, also cuBLAS's (GEMM_LT_WORKSPACE_BYTES) */
    cudaEvent_t ev[WORKER_EVENTS]; /* created with cudaEventBlockingSync */
    void *buf[3];                /* A, B, C on the device */
    size_t cap[3];
};

typedef struct cuda_backend {
    int ndev, streams;
    cuda_dev devs[GEMM_MAX_DEVICES];
    int nworkers;
    cuda_worker *workers;
    uint64_t mem_limit;
    int warmup;                  /* workers warm up before their first job (no fault_inject) */
    int min_cc;                  /* oldest device: what every worker can run */
    int wgmma_ok;                /* every device runs wgmma */
    long oom_at, sticky_at, lost_at, delay_ms, copy_loop; /* fault hooks (config/gemmd.conf); 0 = off */
    pthread_mutex_t reset_mu;    /* one device resets at a time (cuda_device.c) */
    atomic_long allocs, jobs;
    gemm_cuda_host *host;
    gemm_allocator alloc;

    /* the housekeeping thread (cuda_house.c) */
    pthread_t house;
    int house_started;
    pthread_mutex_t house_mu;
    pthread_cond_t house_cv;
    int house_stop, house_wake;
    gemm_resident *res_free;     /* released resident handles, freed by the thread (house_mu) */
} cuda_backend;

/* cuda_device.c */
extern const gemm_fault_hook gemm_cuda_faults[];
int gemm_cuda_parse_devices(cuda_backend *cb, const char *spec, int count, gemm_engine_err *err);
void gemm_cuda_destroy_resources(cuda_worker *w);
cudaError_t gemm_cuda_build_resources(cuda_worker *w, unsigned gen, gemm_cuda_site *site);
cudaError_t gemm_cuda_ensure_buffers(cuda_worker *w, const size_t need[3], gemm_cuda_site *site);
/* A job enters the device (waits out a reset) and leaves it; a broken leave resets it
 * (`lose`, the lost:N hook: marks it lost instead of making a new context). */
unsigned gemm_cuda_dev_enter(cuda_dev *d);
void gemm_cuda_dev_leave(cuda_backend *cb, cuda_dev *d, unsigned gen, int broken, int lose);
/* Enter and leave for the housekeeping thread (0: lost, not entered) or a job that copies
 * through this device's host registration (lost_too): no reset meanwhile, not busy time. */
int gemm_cuda_dev_enter_house(cuda_dev *d, int lost_too);
void gemm_cuda_dev_leave_house(cuda_dev *d);
/* gemm_cuda_host_pin for d, entering the device whose registration locks the block (a bit
 * per slot in *held) so that its reset cannot drop it meanwhile; unhold leaves them. */
void gemm_cuda_pin(cuda_backend *cb, cuda_dev *d, void *p, unsigned *held);
void gemm_cuda_unhold(cuda_backend *cb, unsigned held);
/* cudaMemGetInfo of the current device (d's) into d->mem_free / mem_total. */
void gemm_cuda_sample_memory(cuda_dev *d);

/* cuda_house.c: samples free memory, unregisters the blocks the allocator queued. */
int gemm_cuda_house_start(cuda_backend *cb);
void gemm_cuda_house_stop(cuda_backend *cb);
void gemm_cuda_house_wake(void *cb); /* the host allocator's notify hook */

/* cuda_resident.c: get: 1 with *p the device copy (made now if needed, its upload added to
 * *up_*), 0: read the host; keep: a device copy of src on s (NULL: none; an upload from the
 * host is waited for), r's once published. */
int gemm_cuda_resident_get(cuda_backend *cb, cuda_dev *d, unsigned gen, gemm_resident *r, cudaStream_t s,
                           void **p, size_t *up_bytes, double *up_ms);
void *gemm_cuda_resident_keep(const void *src, size_t bytes, cudaStream_t s, enum cudaMemcpyKind kind);
void gemm_cuda_resident_publish(cuda_dev *d, unsigned gen, gemm_resident *r, void *q);
void gemm_cuda_resident_release(void *self, gemm_resident *r);
void gemm_cuda_resident_drain(cuda_backend *cb);

/* cuda_run.c: one job on worker w (the backend's run; also the warm-up's, engine_cuda.c) */
int gemm_cuda_run(void *self, void *worker, gemm_job *job);

/* cuda_fault.cu */
cudaError_t gemm_cuda_launch_trap(cudaStream_t stream);
cudaError_t gemm_cuda_launch_delay(cudaStream_t stream, long ms);

/* k06_wgmma.cu: whether the build's sm_90a code runs on the current device (at open). */
int gemm_wgmma_runnable(void);

#endif /* GEMM_CUDA_ENGINE_H */
