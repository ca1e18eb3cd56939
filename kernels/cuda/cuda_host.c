/*
 * cuda_host.c - page-locked host blocks with a small cache (see cuda_host.h).
 *
 * Each block carries a 64-byte header in front of the caller's pointer: its capacity, the
 * registration generation (0 = not registered) and a magic number. The cache is a short
 * list, oldest first; a request takes the smallest cached block that holds it without
 * wasting more than half of it. A freed block goes in at the young end and, when the cache
 * is full, pushes out the oldest: a burst of small products must not leave a cache of
 * small blocks that every later big product misses (each miss registers fresh memory, a
 * few ms for a 1024^2 product's buffers, and unregisters it again).
 */
#include "cuda_host.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#define HDR 64
#define PAGE 4096
#define MAX_CACHED 16
#define MAGIC 0x67656d6d686f7374ull /* "gemmhost" */

typedef struct {
    size_t cap;       /* usable bytes after the header */
    unsigned gen;     /* registration generation; 0 = not registered */
    uint64_t magic;
} block_hdr;

struct gemm_cuda_host {
    int device;
    size_t max_cached;
    pthread_mutex_t mu;
    unsigned gen;     /* bumped by each device reset; starts at 1 */
    void *cache[MAX_CACHED];
    int ncached;
    size_t cached_bytes, in_use;
    int warned;
};

static block_hdr *hdr_of(void *p) { return (block_hdr *)((char *)p - HDR); }

gemm_cuda_host *gemm_cuda_host_open(int device, size_t max_cached_bytes)
{
    gemm_cuda_host *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->device = device;
    h->max_cached = max_cached_bytes;
    h->gen = 1;
    pthread_mutex_init(&h->mu, NULL);
    return h;
}

static void release(gemm_cuda_host *h, void *p, unsigned cur_gen)
{
    block_hdr *b = hdr_of(p);
    if (b->gen != 0 && b->gen == cur_gen) {
        cudaSetDevice(h->device);
        if (cudaHostUnregister(b) != cudaSuccess)
            cudaGetLastError(); /* the registration went with a reset: nothing to undo */
    }
    b->magic = 0;
    free(b);
}

static void drop_cache_locked(gemm_cuda_host *h, void **out, int *nout)
{
    for (int i = 0; i < h->ncached; i++)
        out[(*nout)++] = h->cache[i];
    h->ncached = 0;
    h->cached_bytes = 0;
}

void gemm_cuda_host_close(gemm_cuda_host *h)
{
    if (!h)
        return;
    void *drop[MAX_CACHED];
    int n = 0;
    pthread_mutex_lock(&h->mu);
    drop_cache_locked(h, drop, &n);
    unsigned gen = h->gen;
    pthread_mutex_unlock(&h->mu);
    for (int i = 0; i < n; i++)
        release(h, drop[i], gen);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

void gemm_cuda_host_device_reset(gemm_cuda_host *h)
{
    void *drop[MAX_CACHED];
    int n = 0;
    pthread_mutex_lock(&h->mu);
    h->gen++;
    drop_cache_locked(h, drop, &n);
    pthread_mutex_unlock(&h->mu);
    for (int i = 0; i < n; i++)
        release(h, drop[i], 0); /* registrations are gone: just free */
}

static void *host_alloc(void *ctx, size_t bytes)
{
    gemm_cuda_host *h = ctx;
    if (bytes == 0)
        bytes = 1;
    pthread_mutex_lock(&h->mu);
    int best = -1;
    for (int i = 0; i < h->ncached; i++) {
        size_t cap = hdr_of(h->cache[i])->cap;
        if (cap >= bytes && cap / 2 <= bytes &&
            (best < 0 || cap < hdr_of(h->cache[best])->cap))
            best = i;
    }
    if (best >= 0) {
        void *p = h->cache[best];
        memmove(&h->cache[best], &h->cache[best + 1], (size_t)(h->ncached - best - 1) * sizeof *h->cache);
        h->ncached--;
        h->cached_bytes -= hdr_of(p)->cap;
        h->in_use += hdr_of(p)->cap;
        pthread_mutex_unlock(&h->mu);
        return p;
    }
    unsigned gen = h->gen;
    pthread_mutex_unlock(&h->mu);

    if (bytes > SIZE_MAX - HDR - PAGE)
        return NULL;
    size_t total = (bytes + HDR + PAGE - 1) / PAGE * PAGE;
    block_hdr *b = aligned_alloc(PAGE, total);
    if (!b)
        return NULL;
    b->cap = total - HDR;
    b->magic = MAGIC;
    b->gen = 0;
    cudaSetDevice(h->device);
    cudaError_t e = cudaHostRegister(b, total, cudaHostRegisterPortable);
    if (e == cudaSuccess) {
        b->gen = gen;
    } else {
        cudaGetLastError();
        pthread_mutex_lock(&h->mu);
        int warn = !h->warned;
        h->warned = 1;
        pthread_mutex_unlock(&h->mu);
        if (warn)
            fprintf(stderr, "gemmd cuda: cudaHostRegister of %zu bytes failed (%s); job buffers "
                    "stay pageable and copies will be slower\n", total, cudaGetErrorString(e));
    }
    pthread_mutex_lock(&h->mu);
    h->in_use += b->cap;
    pthread_mutex_unlock(&h->mu);
    return (char *)b + HDR;
}

static void host_free(void *ctx, void *p)
{
    gemm_cuda_host *h = ctx;
    if (!p)
        return;
    block_hdr *b = hdr_of(p);
    if (b->magic != MAGIC) {
        fprintf(stderr, "gemmd cuda: host_free of a pointer this allocator did not give out\n");
        abort();
    }
    void *evict[MAX_CACHED];
    int nevict = 0;
    pthread_mutex_lock(&h->mu);
    h->in_use -= b->cap;
    unsigned gen = h->gen;
    /* Keep registered blocks of the current generation, pushing out the oldest for room. */
    if (b->gen == gen && b->cap <= h->max_cached) {
        while (h->ncached > 0 && (h->ncached == MAX_CACHED || h->cached_bytes + b->cap > h->max_cached)) {
            void *old = h->cache[0];
            memmove(&h->cache[0], &h->cache[1], (size_t)(h->ncached - 1) * sizeof *h->cache);
            h->ncached--;
            h->cached_bytes -= hdr_of(old)->cap;
            evict[nevict++] = old;
        }
        h->cache[h->ncached++] = p;
        h->cached_bytes += b->cap;
        p = NULL;
    }
    pthread_mutex_unlock(&h->mu);
    for (int i = 0; i < nevict; i++)
        release(h, evict[i], gen);
    if (p)
        release(h, p, gen);
}

gemm_allocator gemm_cuda_host_allocator(gemm_cuda_host *h)
{
    gemm_allocator a = {host_alloc, host_free, h};
    return a;
}

void gemm_cuda_host_counts(gemm_cuda_host *h, size_t *cached_blocks, size_t *bytes_in_use)
{
    pthread_mutex_lock(&h->mu);
    if (cached_blocks)
        *cached_blocks = (size_t)h->ncached;
    if (bytes_in_use)
        *bytes_in_use = h->in_use;
    pthread_mutex_unlock(&h->mu);
}
