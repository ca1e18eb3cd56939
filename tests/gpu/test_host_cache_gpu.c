/*
 * test_host_cache_gpu.c - the CUDA backend's host block cache (kernels/cuda/cuda_host.c,
 * compiled in) against the real driver: blocks freed last are kept (a big product's blocks
 * after a burst of small ones), pushed-out blocks wait for the housekeeping side (drain),
 * blocks never locked are not cached, a device reset drops the blocks that device locked,
 * and the keep-charge hook is asked and told. tests/unit/test_host_cache.c checks the same
 * logic on a machine without a GPU.
 */
#include <cuda_runtime.h>

#include "cuda_host.c"
#include "gemm_scratch.h"
#include "gpu_ref.h"
#include "../unit/host_counts.h"

/* The pinned-block cache keeps the blocks freed last: after a burst of small products has
 * filled it, a big product's blocks still get cached and reused instead of being
 * registered and unregistered on every product. Blocks pushed out wait in the queue for
 * the housekeeping side (drain); unlocked blocks are never cached; a reset of the device
 * that locked them drops them. */
static void test_host_cache(void)
{
    const int ord0 = 0;
    const size_t cap_bytes = (size_t)4 << 20; /* small, so that 64 KiB blocks fill it */
    gemm_cuda_host *h = gemm_cuda_host_open(&ord0, 1, cap_bytes);
    if (!h || cudaSetDevice(0) != cudaSuccess) { tap(0, "gemm_cuda_host_open"); return; }
    gemm_allocator a = gemm_cuda_host_allocator(h);
    enum { NSMALL = 80 };
    void *small[NSMALL];
    size_t cached = 0, in_use = 0, queued = 0;
    int pinned = 0;
    for (int i = 0; i < NSMALL; i++) {
        small[i] = a.alloc(a.ctx, 64 << 10);
        ref_poison(small[i], 64 << 10); /* written like a request body */
        pinned += gemm_cuda_host_pin(h, small[i], 0) == 0;
    }
    for (int i = 0; i < NSMALL; i++) a.free(a.ctx, small[i]);
    gemm_cuda_host_counts(h, &cached, &in_use, &queued);
    size_t full = cached;
    tap(pinned == NSMALL && full > 0 && full < NSMALL && full * (64 << 10) <= cap_bytes && in_use == 0 &&
        queued == NSMALL - full,
        "host cache: %zu small locked blocks kept of %d freed (the byte cap), %zu queued to unregister", full,
        NSMALL, queued);
    int released = gemm_cuda_host_drain(h, 0);
    gemm_cuda_host_counts(h, NULL, NULL, &queued);
    tap(released == (int)(NSMALL - full) && queued == 0, "host cache: drain unregistered and freed %d", released);

    void *big = a.alloc(a.ctx, 3 << 20);
    gemm_cuda_host_pin(h, big, 0);
    a.free(a.ctx, big);
    gemm_cuda_host_counts(h, &cached, NULL, &queued);
    tap(cached < full && queued > 0 && cached + queued == full + 1,
        "host cache: a big block freed into the full cache is kept, pushing out the oldest small ones "
        "(%zu cached, %zu queued)", cached, queued);
    void *again = a.alloc(a.ctx, 3 << 20);
    size_t after = 0;
    gemm_cuda_host_counts(h, &after, NULL, NULL);
    tap(again == big && after == cached - 1, "host cache: the next big product reuses it (%zu -> %zu cached)",
        cached, after);
    a.free(a.ctx, again);
    gemm_cuda_host_drain(h, 0);

    void *loose = a.alloc(a.ctx, 5 << 20); /* never locked: freed, not cached */
    gemm_cuda_host_counts(h, &cached, NULL, NULL);
    a.free(a.ctx, loose);
    size_t cached2 = 0;
    gemm_cuda_host_counts(h, &cached2, NULL, NULL);
    tap(cached2 == cached, "host cache: a block no worker locked is not cached");

    /* Blocks are whole pages: a locked one-page block serves every later request under a
     * page, whatever its size (products of tiny matrices must not lock new pages each time),
     * and a big cached block is not spent on a tiny request. */
    void *tiny = a.alloc(a.ctx, 100);
    int tiny_pinned = gemm_cuda_host_pin(h, tiny, 0) == 0;
    a.free(a.ctx, tiny);
    void *tiny2 = a.alloc(a.ctx, 1000);
    tap(tiny_pinned && tiny2 == tiny, "host cache: a 1000-byte request reuses the locked block of a 100-byte one");
    void *big2 = a.alloc(a.ctx, 3 << 20);
    gemm_cuda_host_pin(h, big2, 0);
    a.free(a.ctx, big2);
    a.free(a.ctx, tiny2);
    void *tiny3 = a.alloc(a.ctx, 3000);
    tap(tiny3 == tiny, "host cache: a tiny request takes the one-page block, not the 3 MiB one");
    a.free(a.ctx, tiny3);
    /* Locked pages are resident whatever the request used of them: a cached block is taken
     * only when it is at most an eighth (and a page) bigger than a new block would be. */
    void *mid = a.alloc(a.ctx, 2 << 20);
    tap(mid != big2, "host cache: a 2 MiB request does not take the cached 3 MiB block");
    a.free(a.ctx, mid);
    void *near = a.alloc(a.ctx, (3 << 20) - (200 << 10));
    tap(near == big2, "host cache: a request within an eighth of the cached 3 MiB block takes it");
    a.free(a.ctx, near);
    gemm_cuda_host_drain(h, 0);

    /* What the engine does after a sticky error (no engine is open here): reset the device,
     * which drops its registrations, then tell the allocator. */
    gemm_cuda_host_device_lost(h, 0);
    cudaError_t re = cudaDeviceReset();
    gemm_scratch_device_reset(0);
    gemm_cuda_host_device_reset(h, 0);
    gemm_cuda_host_counts(h, &cached, NULL, &queued);
    tap(re == cudaSuccess && cached == 0 && queued == 0, "host cache: a reset of the device drops its blocks");
    gemm_cuda_host_drain(h, 0);
    gemm_cuda_host_close(h);
}

/* The keep-charge hook: kept blocks are charged while cached, refused ones are let go,
 * reuse and trim give the charge back. */
typedef struct {
    int64_t charged, limit;
} charge_acct;

static int acct_charge(void *ctx, int64_t delta)
{
    charge_acct *a = ctx;
    if (delta > 0 && a->charged + delta > a->limit) return -1;
    a->charged += delta;
    return 0;
}

static void test_host_cache_charge(void)
{
    const int ord0 = 0;
    gemm_cuda_host *h = gemm_cuda_host_open(&ord0, 1, (size_t)64 << 20);
    if (!h || cudaSetDevice(0) != cudaSuccess) { tap(0, "gemm_cuda_host_open"); return; }
    gemm_allocator a = gemm_cuda_host_allocator(h);
    charge_acct acct = {0, (int64_t)3 << 20};
    gemm_cuda_host_set_charge(h, acct_charge, &acct);
    void *p1 = a.alloc(a.ctx, 2 << 20), *p2 = a.alloc(a.ctx, 2 << 20);
    gemm_cuda_host_pin(h, p1, 0);
    gemm_cuda_host_pin(h, p2, 0);
    a.free(a.ctx, p1);
    a.free(a.ctx, p2);
    size_t cached = 0, queued = 0;
    gemm_cuda_host_counts(h, &cached, NULL, &queued);
    tap(cached == 1 && queued == 1 && acct.charged > (2 << 20) && acct.charged <= (3 << 20),
        "host cache charge: one 2 MiB block kept and charged (%lld bytes), the one over the account let go",
        (long long)acct.charged);
    void *p3 = a.alloc(a.ctx, 2 << 20);
    tap(p3 == p1 && acct.charged == 0, "host cache charge: a reused block is no longer charged");
    gemm_cuda_host_pin(h, p3, 0);
    a.free(a.ctx, p3);
    size_t trimmed = gemm_cuda_host_trim(h);
    gemm_cuda_host_counts(h, &cached, NULL, &queued);
    tap(trimmed > (2 << 20) && cached == 0 && queued == 2 && acct.charged == 0,
        "host cache charge: trim lets %zu bytes go, uncharged, queued to unregister", trimmed);
    gemm_cuda_host_drain(h, 0);
    gemm_cuda_host_set_charge(h, NULL, NULL);
    gemm_cuda_host_close(h);
}

int main(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        tap_skip("no CUDA device", "host block cache");
        return tap_done();
    }
    test_host_cache();
    test_host_cache_charge();
    return tap_done();
}
