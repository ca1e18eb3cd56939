/*
 * cpu_int32.h - the CPU backend's int32 product: C = A.B, row-major, computed in
 * uint32_t so that overflow wraps in two's complement (never signed-overflow UB).
 */
#ifndef GEMM_CPU_INT32_H
#define GEMM_CPU_INT32_H

#include <stdint.h>

/* a: m x k, b: k x n, c: m x n (overwritten). threads <= 0 means 1. Splits the rows over
 * up to `threads` pthreads (fewer for small products); a share whose thread cannot start
 * runs on the calling thread, so c is always complete. Returns 0. */
int gemm_cpu_gemm_i32(const int32_t *a, const int32_t *b, int32_t *c, uint64_t m, uint64_t k,
                      uint64_t n, int threads);

/* The same, stopping early once *stop is non-zero (checked by every thread before each
 * panel of KC columns of A): returns 1 when it stopped (c is then incomplete), else 0. */
int gemm_cpu_gemm_i32_stop(const int32_t *a, const int32_t *b, int32_t *c, uint64_t m, uint64_t k,
                           uint64_t n, int threads, const _Atomic int *stop);

#endif /* GEMM_CPU_INT32_H */
