/*
 * gemm_scratch.h - device memory from one stream-ordered pool per device (docs/KERNELS.md,
 * "Device memory on the worker path"); a failure is cudaErrorMemoryAllocation.
 */
#ifndef GEMM_SCRATCH_H
#define GEMM_SCRATCH_H

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* On the current device, for work on `stream` after this call; cudaFreeAsync on the same
 * stream gives it back. */
cudaError_t gemm_scratch_alloc(void **p, size_t bytes, cudaStream_t stream);
/* After cudaDeviceReset of `ordinal` (nothing running there): its pool went with it. */
void gemm_scratch_device_reset(int ordinal);

#ifdef __cplusplus
}
#endif
#endif /* GEMM_SCRATCH_H */
