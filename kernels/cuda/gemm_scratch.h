/*
 * gemm_scratch.h - device memory from one stream-ordered pool per device, which keeps up to
 * 512 MiB between products (the default pool hands its memory back at every
 * synchronization). Allocation and free are ordered on the caller's stream: work enqueued
 * between them may use it, nothing waits on the host. A failure is
 * cudaErrorMemoryAllocation (out of device memory for that product alone).
 */
#ifndef GEMM_SCRATCH_H
#define GEMM_SCRATCH_H

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* *p = bytes of device memory on the current device, usable by work on `stream` after
 * this call; free with gemm_scratch_free on the same stream. */
cudaError_t gemm_scratch_alloc(void **p, size_t bytes, cudaStream_t stream);
cudaError_t gemm_scratch_free(void *p, cudaStream_t stream);
/* After cudaDeviceReset of `ordinal`: its pool went with the context; the next allocation
 * there makes a new one. Call with no work running on that device. */
void gemm_scratch_device_reset(int ordinal);

#ifdef __cplusplus
}
#endif
#endif /* GEMM_SCRATCH_H */
