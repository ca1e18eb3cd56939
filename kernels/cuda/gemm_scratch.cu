/*
 * gemm_scratch.cu - stream-ordered device scratch, one pool per device (gemm_scratch.h).
 */
#include <stdint.h>

#include <mutex>

#include "gemm_scratch.h"

namespace {

constexpr uint64_t SCRATCH_KEEP = 512ull << 20; /* bytes a pool keeps between products */
constexpr int MAX_DEVICES = 64;

std::mutex mu;
cudaMemPool_t pools[MAX_DEVICES];

cudaError_t scratch_pool(int dev, cudaMemPool_t *out)
{
    if (dev < 0 || dev >= MAX_DEVICES) return cudaErrorInvalidDevice;
    std::lock_guard<std::mutex> lock(mu);
    if (!pools[dev]) {
        cudaMemPoolProps props = {};
        props.allocType = cudaMemAllocationTypePinned;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = dev;
        cudaMemPool_t p;
        cudaError_t e = cudaMemPoolCreate(&p, &props);
        if (e != cudaSuccess) return e;
        uint64_t keep = SCRATCH_KEEP;
        e = cudaMemPoolSetAttribute(p, cudaMemPoolAttrReleaseThreshold, &keep);
        if (e != cudaSuccess) {
            cudaMemPoolDestroy(p);
            return e;
        }
        pools[dev] = p;
    }
    *out = pools[dev];
    return cudaSuccess;
}

} // namespace

extern "C" cudaError_t gemm_scratch_alloc(void **p, size_t bytes, cudaStream_t stream)
{
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    cudaMemPool_t pool;
    if (e == cudaSuccess) e = scratch_pool(dev, &pool);
    if (e == cudaSuccess) e = cudaMallocFromPoolAsync(p, bytes, pool, stream);
    return e;
}

extern "C" void gemm_scratch_device_reset(int ordinal)
{
    if (ordinal < 0 || ordinal >= MAX_DEVICES) return;
    std::lock_guard<std::mutex> lock(mu);
    pools[ordinal] = nullptr; /* destroyed with the context: nothing to free */
}
