/*
 * cuda_fault.cu - the fault the engine's tests inject on purpose: a kernel that traps,
 * which leaves the device's context in a sticky error state exactly as a real crash in a
 * kernel would (every later call on that device fails until cudaDeviceReset).
 * Used only when gemm_engine_config.fault_inject asks for "sticky:N".
 */
#include <cuda_runtime.h>

namespace {
__global__ void trap_kernel(void) { __trap(); }
} // namespace

extern "C" cudaError_t gemm_cuda_launch_trap(cudaStream_t stream)
{
    trap_kernel<<<1, 1, 0, stream>>>();
    return cudaGetLastError();
}
