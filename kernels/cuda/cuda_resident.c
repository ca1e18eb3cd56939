/*
 * cuda_resident.c - device copies of resident operands (gemm_resident): uploaded on first
 * use on a device under the handle's lock (so two streams never upload it twice); C's copy
 * device-to-device, published once its product has finished.
 */
#include "cuda_engine.h"
#include "gemm_scratch.h"

#include <stdlib.h>

int gemm_cuda_resident_get(cuda_backend *cb, cuda_dev *d, unsigned gen, gemm_resident *r, cudaStream_t s,
                           void **p, size_t *up_bytes, double *up_ms)
{
    int ok = 0, slot = d->slot;
    pthread_mutex_lock(&r->mu);
    if (r->dev[slot] && r->gen[slot] == gen) {
        *p = r->dev[slot];
        ok = 1;
        goto out;
    }
    if (r->dev[slot]) {
        r->dev[slot] = NULL;
        atomic_fetch_sub(&d->resident_bytes, (unsigned long long)r->bytes);
        gemm_engine_log(GEMM_LOG_WARN, "%s was reset since a resident matrix was copied there: its device copy "
                        "is gone; copying it again from host memory", d->label);
    }
    unsigned held = 0; /* another device whose registration the copy goes through */
    gemm_cuda_pin(cb, d, (void *)r->host, &held);
    double t0 = gemm_now_ms();
    void *q = gemm_cuda_resident_keep(r->host, r->bytes, s, cudaMemcpyHostToDevice);
    gemm_cuda_unhold(cb, held);
    if (!q) goto out; /* short of device memory, or the copy failed: the product reads the host copy */
    *up_ms += gemm_now_ms() - t0;
    *up_bytes += r->bytes;
    r->dev[slot] = q;
    r->gen[slot] = gen;
    atomic_fetch_add(&d->resident_bytes, (unsigned long long)r->bytes);
    *p = q;
    ok = 1;
out:
    pthread_mutex_unlock(&r->mu);
    return ok;
}

void *gemm_cuda_resident_keep(const void *src, size_t bytes, cudaStream_t s, enum cudaMemcpyKind kind)
{
    void *q = NULL;
    if (gemm_scratch_alloc(&q, bytes, s) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    if (cudaMemcpyAsync(q, src, bytes, kind, s) != cudaSuccess ||
        (kind == cudaMemcpyHostToDevice && cudaStreamSynchronize(s) != cudaSuccess)) {
        cudaGetLastError();
        cudaFreeAsync(q, s);
        cudaGetLastError();
        return NULL;
    }
    return q;
}

void gemm_cuda_resident_publish(cuda_dev *d, unsigned gen, gemm_resident *r, void *q)
{
    pthread_mutex_lock(&r->mu);
    void *old = r->dev[d->slot];
    unsigned old_gen = r->gen[d->slot];
    r->dev[d->slot] = q;
    r->gen[d->slot] = gen;
    pthread_mutex_unlock(&r->mu);
    atomic_fetch_add(&d->resident_bytes, (unsigned long long)r->bytes);
    if (old) { /* C is written once; guard anyway */
        if (old_gen == gen && cudaFreeAsync(old, NULL) != cudaSuccess) cudaGetLastError();
        atomic_fetch_sub(&d->resident_bytes, (unsigned long long)r->bytes);
    }
}

void gemm_cuda_resident_release(void *self, gemm_resident *r)
{
    cuda_backend *cb = self;
    pthread_mutex_lock(&cb->house_mu);
    r->free_next = cb->res_free;
    cb->res_free = r;
    cb->house_wake = 1;
    pthread_cond_signal(&cb->house_cv);
    pthread_mutex_unlock(&cb->house_mu);
}

void gemm_cuda_resident_drain(cuda_backend *cb)
{
    pthread_mutex_lock(&cb->house_mu);
    gemm_resident *list = cb->res_free;
    cb->res_free = NULL;
    pthread_mutex_unlock(&cb->house_mu);
    while (list) {
        gemm_resident *r = list;
        list = r->free_next;
        for (int i = 0; i < cb->ndev; i++) {
            if (!r->dev[i]) continue;
            cuda_dev *d = &cb->devs[i];
            if (gemm_cuda_dev_enter_house(d, 0)) {
                /* entered: no reset runs now, so d->gen is stable */
                /* its products have all finished: no stream uses it any more */
                if (d->gen == r->gen[i] && cudaSetDevice(d->ordinal) == cudaSuccess) cudaFreeAsync(r->dev[i], NULL);
                cudaGetLastError();
                gemm_cuda_dev_leave_house(d);
            }
            atomic_fetch_sub(&d->resident_bytes, (unsigned long long)r->bytes);
        }
        pthread_mutex_destroy(&r->mu);
        free(r);
    }
}
