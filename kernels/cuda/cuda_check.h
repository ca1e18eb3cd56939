/*
 * cuda_check.h - checking every CUDA and cuBLAS call, with the place it was made.
 *
 *   gemm_cuda_site site = {0};
 *   if (GEMM_CUDA_CHECK(&site, cudaMemcpyAsync(...)) != cudaSuccess) goto fail;
 *
 * The first failure is kept in the site (error, call text, __FILE__, __LINE__) so the
 * job's error message can name it; later failures in the same attempt do not overwrite it.
 * cuBLAS statuses are mapped onto the nearest cudaError_t (allocation failure stays an
 * allocation failure, so it becomes a 507 like any other out-of-memory).
 */
#ifndef GEMM_CUDA_CHECK_H
#define GEMM_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

typedef struct {
    cudaError_t err;     /* first failure, cudaSuccess when none */
    const char *call;    /* the failing call, as written */
    const char *file;
    int line;
} gemm_cuda_site;

static inline cudaError_t gemm_cuda_note(gemm_cuda_site *s, cudaError_t e, const char *call,
                                         const char *file, int line)
{
    if (e != cudaSuccess && s && s->err == cudaSuccess) {
        s->err = e;
        s->call = call;
        s->file = file;
        s->line = line;
    }
    return e;
}

static inline cudaError_t gemm_cublas_note(gemm_cuda_site *s, cublasStatus_t st,
                                           const char *call, const char *file, int line)
{
    if (st == CUBLAS_STATUS_SUCCESS)
        return cudaSuccess;
    cudaError_t e = cudaErrorUnknown;
    if (st == CUBLAS_STATUS_ALLOC_FAILED)
        e = cudaErrorMemoryAllocation;
    else if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_ARCH_MISMATCH)
        e = cudaErrorNotSupported;
    else if (st == CUBLAS_STATUS_INVALID_VALUE)
        e = cudaErrorInvalidValue;
    return gemm_cuda_note(s, e, call, file, line);
}

#define GEMM_CUDA_CHECK(site, call) gemm_cuda_note((site), (call), #call, __FILE__, __LINE__)
#define GEMM_CUBLAS_CHECK(site, call) gemm_cublas_note((site), (call), #call, __FILE__, __LINE__)

#endif /* GEMM_CUDA_CHECK_H */
