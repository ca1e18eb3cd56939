/*
 * cuda_host.h - page-locked host memory for job inputs and outputs, with a small cache.
 *
 * Blocks are ordinary aligned host memory registered with cudaHostRegister (portable), not
 * cudaHostAlloc: a device reset (the engine's recovery from a sticky error) drops the
 * registrations made in that device's context, and memory from cudaHostAlloc would be
 * freed under the daemon's feet, while registered memory simply stays valid, unpinned.
 * Registering is slow (page-table work), so freed blocks are kept in a small cache and
 * handed out again for requests of a similar size.
 */
#ifndef GEMM_CUDA_HOST_H
#define GEMM_CUDA_HOST_H

#include <stddef.h>

#include "gemm_types.h"

typedef struct gemm_cuda_host gemm_cuda_host;

/* device: the ordinal whose context holds the registrations. max_cached_bytes: cache cap. */
gemm_cuda_host *gemm_cuda_host_open(int device, size_t max_cached_bytes);
/* Frees the cached blocks. Blocks still handed out stay valid until freed through the
 * allocator, which must outlive them. */
void gemm_cuda_host_close(gemm_cuda_host *h);
/* The allocator (ctx = h): 64-byte aligned, NULL on failure. */
gemm_allocator gemm_cuda_host_allocator(gemm_cuda_host *h);
/* Called after the registration device was reset: registrations are gone; drop the cache. */
void gemm_cuda_host_device_reset(gemm_cuda_host *h);
/* Blocks in the cache / bytes in use (registered or not) for stats and tests. */
void gemm_cuda_host_counts(gemm_cuda_host *h, size_t *cached_blocks, size_t *bytes_in_use);

#endif /* GEMM_CUDA_HOST_H */
