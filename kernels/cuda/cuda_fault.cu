/*
 * cuda_fault.cu - the kernels of the sticky:N and gpu_delay_ms:N test hooks (fault_inject,
 * config/gemmd.conf): one traps, as a real crash would; one waits N ms of device time.
 */
#include <cuda_runtime.h>

namespace {
__global__ void trap_kernel(void) { __trap(); }

__device__ __forceinline__ unsigned long long global_ns(void)
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void delay_kernel(unsigned long long ns)
{
    const unsigned long long t0 = global_ns();
    while (global_ns() - t0 < ns)
        __nanosleep(100000); /* 0.1 ms: the SM stays nearly idle */
}
} // namespace

extern "C" cudaError_t gemm_cuda_launch_trap(cudaStream_t stream)
{
    trap_kernel<<<1, 1, 0, stream>>>();
    return cudaGetLastError();
}

extern "C" cudaError_t gemm_cuda_launch_delay(cudaStream_t stream, long ms)
{
    delay_kernel<<<1, 1, 0, stream>>>((unsigned long long)ms * 1000000ull);
    return cudaGetLastError();
}
