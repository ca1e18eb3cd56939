/*
 * cuda_engine.h - the CUDA backend's insides, shared by engine_cuda.c (open, validate,
 * run, describe) and cuda_device.c (device list, per-worker resources, device buffers,
 * the enter/leave protocol and the reset after a sticky error). Not a public interface.
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
#include "engine.h"

#define BUF_ROUND (1u << 20)           /* device buffers grow in whole MiB */
#define RESET_WAIT_MS 1000.0           /* how long a reset device may take to accept a new context */
#define HOST_CACHE_BYTES (1ull << 30)  /* pinned blocks kept for reuse */

typedef struct cuda_worker cuda_worker;

typedef struct {
    int ordinal;                 /* CUDA ordinal (after CUDA_VISIBLE_DEVICES) */
    gemm_device_info info;       /* name, memory, SMs, cc, streams */
    int cc;                      /* major * 10 + minor */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned gen;                /* bumped by each reset; worker resources carry it */
    int resetting;
    int active;                  /* workers inside a job on this device */
    unsigned resets;
    int lost;                    /* reset done but no new context could be made */
    cudaError_t lost_err;
    double busy_since_ms;        /* when active went 0 -> 1 */
    double busy_ms;              /* union of the time some job ran on the device */

    atomic_ullong bytes_h2d, bytes_d2h, mem_used;
} cuda_dev;

struct cuda_worker {
    struct cuda_backend *cb;
    cuda_dev *dev;
    int index, stream_index;
    unsigned gen;                /* dev->gen its resources belong to; 0 = none */
    cudaStream_t stream;
    cublasHandle_t blas;
    cudaEvent_t ev[4];
    void *buf[3];                /* A, B, C on the device */
    size_t cap[3];
};

typedef struct cuda_backend {
    int ndev, streams;
    cuda_dev devs[GEMM_MAX_DEVICES];
    int nworkers;
    cuda_worker *workers;
    uint64_t mem_limit;
    int min_cc;
    long oom_at, sticky_at;      /* fault hooks; 0 = off */
    atomic_long allocs, jobs;
    gemm_cuda_host *host;
    gemm_allocator alloc;
} cuda_backend;

/* cuda_device.c */
int gemm_cuda_parse_devices(cuda_backend *cb, const char *spec, int count, gemm_err *err);
int gemm_cuda_parse_faults(cuda_backend *cb, const char *spec, gemm_err *err);
void gemm_cuda_free_buffers(cuda_worker *w);
void gemm_cuda_destroy_resources(cuda_worker *w);
cudaError_t gemm_cuda_build_resources(cuda_worker *w, unsigned gen, gemm_cuda_site *site);
cudaError_t gemm_cuda_ensure_buffers(cuda_worker *w, const size_t need[3], gemm_cuda_site *site);
unsigned gemm_cuda_dev_enter(cuda_dev *d);
void gemm_cuda_dev_leave(cuda_backend *cb, cuda_dev *d, unsigned gen, int broken);

/* cuda_fault.cu */
cudaError_t gemm_cuda_launch_trap(cudaStream_t stream);

#endif /* GEMM_CUDA_ENGINE_H */
