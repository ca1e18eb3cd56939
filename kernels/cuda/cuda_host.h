/*
 * cuda_host.h - host memory for job inputs and outputs, page-locked by the workers, with a
 * small cache of locked blocks (docs/OPERATIONS.md, "Memory budget").
 *
 * Blocks are plain host memory registered with cudaHostRegister (portable), not
 * cudaHostAlloc: a device reset drops its context's registrations, and cudaHostAlloc memory
 * would be freed under the daemon's feet. alloc and free make no CUDA call: the worker that
 * first copies through a block registers it, the housekeeping thread unregisters it.
 */
#ifndef GEMM_CUDA_HOST_H
#define GEMM_CUDA_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "gemm_types.h"

typedef struct gemm_cuda_host gemm_cuda_host;

/* ordinals[0..ndev), ndev <= 16: the CUDA ordinal of each device slot. */
gemm_cuda_host *gemm_cuda_host_open(const int *ordinals, int ndev, size_t max_cached_bytes);
/* Unregisters and frees the cached and queued blocks (when no worker or housekeeping
 * thread runs); blocks still handed out must be freed through the allocator later. */
void gemm_cuda_host_close(gemm_cuda_host *h);
/* The allocator (ctx = h): 64-byte aligned, NULL on failure. No CUDA call. */
gemm_allocator gemm_cuda_host_allocator(gemm_cuda_host *h);
/* Called (without the allocator's lock) when a freed block was queued for unregistration. */
void gemm_cuda_host_set_notify(gemm_cuda_host *h, void (*fn)(void *), void *arg);

/* The cache's charge hook (gemm_engine_set_keep_charge); what is cached now is charged. */
void gemm_cuda_host_set_charge(gemm_cuda_host *h, int (*fn)(void *ctx, int64_t delta), void *ctx);
/* Lets every cached block go (to be unregistered later); returns the bytes. */
size_t gemm_cuda_host_trim(gemm_cuda_host *h);

/* Worker side, slot's device current and entered: locks p's block, registering it for slot
 * unless it is. Returns the slot whose registration locks it (another: hold that device and
 * ask again), GEMM_PIN_ELSEWHERE (another worker's, this moment) or GEMM_PIN_PAGEABLE. */
#define GEMM_PIN_PAGEABLE (-1)
#define GEMM_PIN_ELSEWHERE (-2)
int gemm_cuda_host_pin(gemm_cuda_host *h, void *p, int slot);
/* Housekeeping side (as pin): unregisters and frees the queued blocks slot registered. */
int gemm_cuda_host_drain(gemm_cuda_host *h, int slot);
/* Before slot's reset: no block it registered counts as locked from now on. */
void gemm_cuda_host_device_lost(gemm_cuda_host *h, int slot);
/* After slot's reset: its cached and queued blocks are freed. */
void gemm_cuda_host_device_reset(gemm_cuda_host *h, int slot);

#endif /* GEMM_CUDA_HOST_H */
