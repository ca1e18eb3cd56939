/* cpu_gemm.h - products computed on the host, for the CPU backend and the host path. */
#ifndef GEMM_CPU_GEMM_H
#define GEMM_CPU_GEMM_H

#include <stdint.h>

#include "backend.h"

/* The int32 product C = A.B (row-major, wrapping) on up to `threads` threads; stops early
 * once *stop is non-zero (NULL: never) and returns 1 then (c incomplete), else 0. */
int gemm_cpu_gemm_i32_stop(const int32_t *a, const int32_t *b, int32_t *c, uint64_t m, uint64_t k,
                           uint64_t n, int threads, const _Atomic int *stop);

/* The kernel that computes dtype d on the host: "blocked" for int32, else "openblas". */
static inline const char *gemm_cpu_kernel(gemm_dtype d)
{
    return d == GEMM_DTYPE_I32 ? "blocked" : "openblas";
}
/* Every product of a job (a cancel stops between them); the int32 loop on `threads`. 0 with
 * the timing filled, or GEMM_RUN_CANCELLED / -1 with job->err set. */
int gemm_cpu_products(gemm_job *job, int threads);
/* Where a product computed here ran: device "cpu", exact math, the dtype's kernel. */
void gemm_cpu_ran_here(gemm_job *job);

#endif /* GEMM_CPU_GEMM_H */
