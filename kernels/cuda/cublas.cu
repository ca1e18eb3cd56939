/*
 * cublas.cu - cuBLAS as the yardstick, behind the same signature as our own kernels.
 *
 * cuBLAS is column-major; our matrices are row-major. A row-major m x n matrix is the
 * column-major n x m transpose, so C = A B is computed as C^T = B^T A^T: a column-major
 * GEMM with dimensions (n, m, k), B first (ld n), then A (ld k), into C (ld n). No copy,
 * no transpose flag.
 *
 * Math modes (float32): fp32 runs CUBLAS_COMPUTE_32F with CUBLAS_DEFAULT_MATH, which is
 * IEEE float32 multiply-add and never TF32 behind the caller's back; tf32 asks for
 * CUBLAS_COMPUTE_32F_FAST_TF32 and bf16 for CUBLAS_COMPUTE_32F_FAST_16BF (inputs rounded
 * on the tensor cores, float32 accumulation and output). float64 runs cublasDgemm.
 *
 * float16 / bfloat16 operands (dtypes, not math modes: they are half in memory) run
 * cublasGemmEx with CUDA_R_16F / CUDA_R_16BF for A and B, CUBLAS_COMPUTE_32F, and C in
 * CUDA_R_32F or the operands' type (l->out_half); batches through cublasGemmStridedBatchedEx.
 *
 * int32 is not offered: cuBLAS has no int32 x int32 -> int32 GEMM that wraps modulo 2^32
 * (its integer GEMM takes int8 inputs), so a request for kernel=cublas with int32 is
 * refused with 422 by the support check; kernel=auto sends int32 to our own kernels.
 */
#include <cublas_v2.h>

#include "gemm_kernels.h"
#include "gemm_log.h"

namespace {

cudaError_t from_cublas(cublasStatus_t s, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return cudaSuccess;
    /* A CUDA error underneath (e.g. a sticky fault) says more than the cuBLAS status. */
    cudaError_t c = cudaGetLastError();
    if (c != cudaSuccess)
        return c;
    gemm_engine_log(GEMM_LOG_WARN, "cuda: %s failed: %s", what, cublasGetStatusString(s));
    if (s == CUBLAS_STATUS_ALLOC_FAILED)
        return cudaErrorMemoryAllocation;
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_ARCH_MISMATCH)
        return cudaErrorNotSupported;
    if (s == CUBLAS_STATUS_INVALID_VALUE)
        return cudaErrorInvalidValue;
    return cudaErrorUnknown;
}

cudaError_t cublas_launch(const gemm_launch *l)
{
    cublasHandle_t h = (cublasHandle_t)l->cublas;
    if (!h)
        return cudaErrorInvalidValue;
    cublasStatus_t s = cublasSetStream(h, l->stream);
    if (s != CUBLAS_STATUS_SUCCESS)
        return from_cublas(s, "cublasSetStream");
    s = cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
    if (s != CUBLAS_STATUS_SUCCESS)
        return from_cublas(s, "cublasSetMathMode");

    const int batch = l->batch > 1 ? l->batch : 1;
    if (l->dtype == GEMM_DTYPE_F64 && batch > 1) {
        /* C^T = B^T A^T in cuBLAS's column-major view, one call for the whole batch. */
        const double one = 1.0, zero = 0.0;
        s = cublasDgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, l->n, l->m, l->k, &one,
                                      (const double *)l->B, l->n, l->stride_b,
                                      (const double *)l->A, l->k, l->stride_a, &zero,
                                      (double *)l->C, l->n, l->stride_c, batch);
        return from_cublas(s, "cublasDgemmStridedBatched");
    }
    if (l->dtype == GEMM_DTYPE_F64) {
        const double one = 1.0, zero = 0.0;
        s = cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, l->n, l->m, l->k, &one,
                        (const double *)l->B, l->n, (const double *)l->A, l->k, &zero,
                        (double *)l->C, l->n);
        return from_cublas(s, "cublasDgemm");
    }
    if (l->dtype == GEMM_DTYPE_F16 || l->dtype == GEMM_DTYPE_BF16) {
        /* Half operands in memory, float32 sums (tensor cores), C in float32 or in the
         * operands' type; the same C^T = B^T A^T as below. */
        const cudaDataType_t ab = l->dtype == GEMM_DTYPE_F16 ? CUDA_R_16F : CUDA_R_16BF;
        const cudaDataType_t ct = l->out_half ? ab : CUDA_R_32F;
        const float one = 1.0f, zero = 0.0f;
        if (batch > 1) {
            s = cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, l->n, l->m, l->k, &one, l->B, ab, l->n,
                                           l->stride_b, l->A, ab, l->k, l->stride_a, &zero, l->C, ct, l->n,
                                           l->stride_c, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            return from_cublas(s, "cublasGemmStridedBatchedEx (half)");
        }
        s = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, l->n, l->m, l->k, &one, l->B, ab, l->n, l->A, ab, l->k,
                         &zero, l->C, ct, l->n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        return from_cublas(s, "cublasGemmEx (half)");
    }
    if (l->dtype != GEMM_DTYPE_F32)
        return cudaErrorNotSupported;

    cublasComputeType_t ct;
    switch (l->math) {
    case GEMM_MATH_DEFAULT:
    case GEMM_MATH_FP32: ct = CUBLAS_COMPUTE_32F; break;
    case GEMM_MATH_TF32: ct = CUBLAS_COMPUTE_32F_FAST_TF32; break;
    case GEMM_MATH_BF16: ct = CUBLAS_COMPUTE_32F_FAST_16BF; break;
    default: return cudaErrorInvalidValue;
    }
    const float one = 1.0f, zero = 0.0f;
    if (batch > 1) {
        s = cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, l->n, l->m, l->k, &one, l->B,
                                       CUDA_R_32F, l->n, l->stride_b, l->A, CUDA_R_32F, l->k,
                                       l->stride_a, &zero, l->C, CUDA_R_32F, l->n, l->stride_c,
                                       batch, ct, CUBLAS_GEMM_DEFAULT);
        return from_cublas(s, "cublasGemmStridedBatchedEx");
    }
    s = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, l->n, l->m, l->k, &one, l->B, CUDA_R_32F,
                     l->n, l->A, CUDA_R_32F, l->k, &zero, l->C, CUDA_R_32F, l->n, ct,
                     CUBLAS_GEMM_DEFAULT);
    return from_cublas(s, "cublasGemmEx");
}

} // namespace

extern "C" const gemm_kernel_desc gemm_kernel_cublas = {
    "cublas",
    "cuBLAS (the production yardstick); float32 fp32/tf32/bf16, float64, float16 and bfloat16, no int32",
    (1u << GEMM_DTYPE_F32) | (1u << GEMM_DTYPE_F64) | (1u << GEMM_DTYPE_F16) | (1u << GEMM_DTYPE_BF16),
    (1u << GEMM_MATH_FP32) | (1u << GEMM_MATH_TF32) | (1u << GEMM_MATH_BF16),
    {0, 0, 0, 0},
    0,
    cublas_launch,
    NULL,
    1,
};
