/*
 * cuda_host.h - host memory for job inputs and outputs, page-locked by the workers, with a
 * small cache of locked blocks.
 *
 * Blocks are plain aligned host memory registered with cudaHostRegister (portable), not
 * cudaHostAlloc: a device reset drops the registrations made in its context, and memory
 * from cudaHostAlloc would be freed under the daemon's feet, while registered memory stays
 * valid, unpinned. alloc and free make no CUDA call (they run on HTTP threads): a block is
 * registered by the worker that first copies through it (inside the device's enter/leave),
 * and one not kept for reuse is unregistered later by the housekeeping thread. Registering
 * is slow, so freed registered blocks are kept for requests of a similar size.
 */
#ifndef GEMM_CUDA_HOST_H
#define GEMM_CUDA_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "gemm_types.h"

typedef struct gemm_cuda_host gemm_cuda_host;

/* ordinals[0..ndev), ndev <= 16: the CUDA ordinal of each device slot (the backend's device
 * index). max_cached_bytes: cache cap. */
gemm_cuda_host *gemm_cuda_host_open(const int *ordinals, int ndev, size_t max_cached_bytes);
/* Unregisters and frees the cached and queued blocks (sets the device of each; call it
 * when no worker and no housekeeping thread runs). Blocks still handed out stay valid
 * until freed through the allocator, which must outlive them. */
void gemm_cuda_host_close(gemm_cuda_host *h);
/* The allocator (ctx = h): 64-byte aligned, NULL on failure. No CUDA call. */
gemm_allocator gemm_cuda_host_allocator(gemm_cuda_host *h);
/* Called when a freed block was queued for unregistration (from the freeing thread, without
 * the allocator's lock held): the owner wakes whatever drains the queue. */
void gemm_cuda_host_set_notify(gemm_cuda_host *h, void (*fn)(void *), void *arg);

/* The cache's blocks are resident memory nobody asked for: fn(ctx, +bytes) is asked before
 * a freed block is kept (nonzero: it is let go instead), fn(ctx, -bytes) told when kept
 * bytes leave the cache. Called with one of the allocator's locks held, from several
 * threads at once: fn must be thread-safe and must not call back into the allocator. What
 * is cached when the hook is set is charged to it (let go if that does not fit); NULL stops
 * charging. */
void gemm_cuda_host_set_charge(gemm_cuda_host *h, int (*fn)(void *ctx, int64_t delta), void *ctx);
/* Lets every cached block go (to be unregistered by the housekeeping side); returns the
 * bytes. No CUDA call. */
size_t gemm_cuda_host_trim(gemm_cuda_host *h);

/* Worker side. Locks the block holding p (from this allocator) for copies, registering it
 * in the context of device slot `slot` unless it already is (registrations are portable:
 * one made by any slot serves every device). Call with that device current and inside its
 * enter/leave. Returns the slot whose registration locks the block: `slot` itself, or
 * another (that device's reset drops it, so a job that copies through it holds that device
 * meanwhile; when that reset is under way, hold it and ask again); GEMM_PIN_ELSEWHERE when
 * a registration another worker made at this moment locks it; GEMM_PIN_PAGEABLE when it
 * stays pageable (registration failed: warned once; copies are slower but right). */
#define GEMM_PIN_PAGEABLE (-1)
#define GEMM_PIN_ELSEWHERE (-2)
int gemm_cuda_host_pin(gemm_cuda_host *h, void *p, int slot);
/* Housekeeping side: unregisters and frees the queued blocks that slot registered (same
 * conditions as pin). Returns how many blocks were released. */
int gemm_cuda_host_drain(gemm_cuda_host *h, int slot);
/* Device slot `slot` is about to be reset (or lost): from now on no block it registered
 * counts as locked, for any device (no CUDA call). Call before the reset drops them. */
void gemm_cuda_host_device_lost(gemm_cuda_host *h, int slot);
/* After device slot `slot` was reset: its registrations are gone; its cached and queued
 * blocks are freed (no CUDA call). */
void gemm_cuda_host_device_reset(gemm_cuda_host *h, int slot);

#endif /* GEMM_CUDA_HOST_H */
