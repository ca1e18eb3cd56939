/*
 * host_counts.h - for the tests that compile kernels/cuda/cuda_host.c in (include it after
 * that file): what the host block cache holds, read from its insides. Blocks in the cache
 * (stashes included), bytes handed out (locked or not), blocks queued for unregistration;
 * any pointer may be NULL.
 */
#ifndef GEMMD_HOST_COUNTS_H
#define GEMMD_HOST_COUNTS_H

static void gemm_cuda_host_counts(gemm_cuda_host *h, size_t *cached_blocks, size_t *bytes_in_use,
                                  size_t *queued_blocks)
{
    pthread_mutex_lock(&h->mu);
    size_t n = (size_t)h->ncached;
    for (int i = 0; i < MAX_STASHES; i++) {
        pthread_mutex_lock(&h->stashes[i].mu);
        n += (size_t)h->stashes[i].n;
        pthread_mutex_unlock(&h->stashes[i].mu);
    }
    if (cached_blocks) *cached_blocks = n;
    if (bytes_in_use) *bytes_in_use = atomic_load(&h->in_use);
    size_t q = 0;
    for (const block_hdr *b = h->queue; b; b = b->qnext) q++;
    if (queued_blocks) *queued_blocks = q;
    pthread_mutex_unlock(&h->mu);
}

#endif
