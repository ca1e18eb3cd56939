/*
 * cpu_gemm.h - products computed on the host (cpu_gemm.c), shared by the CPU backend
 * (cpu.c) and the host path (host.c).
 */
#ifndef GEMM_CPU_GEMM_H
#define GEMM_CPU_GEMM_H

#include <stdint.h>

#include "backend.h"

/* The int32 product C = A.B (m x k times k x n, row-major), in uint32_t so that overflow
 * wraps in two's complement. Splits the rows over up to `threads` pthreads (fewer for small
 * products; a share whose thread cannot start runs here) and stops early once *stop is
 * non-zero (checked by every thread before each panel of KC columns of A; NULL: never):
 * returns 1 when it stopped (c is then incomplete), else 0. */
int gemm_cpu_gemm_i32_stop(const int32_t *a, const int32_t *b, int32_t *c, uint64_t m, uint64_t k,
                           uint64_t n, int threads, const _Atomic int *stop);

/* The kernel that computes dtype d on the host: "blocked" for int32, else "openblas". */
static inline const char *gemm_cpu_kernel(gemm_dtype d)
{
    return d == GEMM_DTYPE_I32 ? "blocked" : "openblas";
}
/* Every product of a job, in a loop a cancel stops between products; the int32 loop on
 * `threads` (OpenBLAS on its process-wide setting). 0 with the timing filled (kernel_ms,
 * GFLOP/s), or GEMM_RUN_CANCELLED / -1 with job->err set. */
int gemm_cpu_products(gemm_job *job, int threads);
/* Where a product computed here says it ran: device "cpu", stream -1, exact math, and the
 * dtype's kernel when none was chosen. */
void gemm_cpu_ran_here(gemm_job *job);

#endif /* GEMM_CPU_GEMM_H */
