/*
 * gemm_async.cuh - small device helpers shared by the optimized kernels (k03 onwards):
 * cp.async copies with zero fill, commit/wait, and the checks that decide whether a
 * matrix may be read with 16-byte vectors.
 *
 * cp.async (sm_80+) copies global to shared memory without passing through registers,
 * so the next tile streams in while the current one is multiplied. Its "src-size"
 * operand, when smaller than the copy size, fills the rest with zeros: an out-of-range
 * element is copied with src-size 0 and reads nothing, which is how the edge tiles are
 * padded without a branch around the copy.
 */
#ifndef GEMM_ASYNC_CUH
#define GEMM_ASYNC_CUH

#include <stdint.h>

namespace gemm_async {

template <int BYTES>
__device__ __forceinline__ void cp_async(void *smem, const void *gmem, bool valid)
{
    static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async copies 4, 8 or 16 bytes");
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    const int src = valid ? BYTES : 0;
    if (BYTES == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
                     "r"(src));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(s), "l"(gmem),
                     "n"(BYTES), "r"(src));
}

__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N> __device__ __forceinline__ void wait_group()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

} // namespace gemm_async

/* Whether a row-major matrix with leading dimension ld (elements) can be read as VBYTES-wide
 * vectors: the base is aligned and every row starts on a vector boundary. */
static inline bool gemm_vec_ok(const void *p, long long ld, int elem, int vbytes)
{
    return ((uintptr_t)p % (uintptr_t)vbytes) == 0 && ((ld * elem) % vbytes) == 0;
}

#endif /* GEMM_ASYNC_CUH */
