/*
 * cuda_check.h - CUDA and cuBLAS calls checked with the place they were made: the site keeps
 * the first failure for the job's message; cuBLAS statuses map onto the nearest cudaError_t.
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
