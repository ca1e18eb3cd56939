/*
 * cuda_house.c - the housekeeping thread: the CUDA calls that serve the request path but
 * must not run on it, each device entered as a job enters it (cuda_engine.h).
 */
#include "cuda_engine.h"

#include <sys/prctl.h>
#include <errno.h>
#include <time.h>

static void visit(cuda_backend *cb, int sample)
{
    for (int i = 0; i < cb->ndev; i++) {
        cuda_dev *d = &cb->devs[i];
        if (!gemm_cuda_dev_enter_house(d, 0))
            continue; /* lost: nothing to sample, its registrations are gone */
        if (cudaSetDevice(d->ordinal) == cudaSuccess) {
            if (sample) gemm_cuda_sample_memory(d);
            gemm_cuda_host_drain(cb->host, d->slot);
        }
        cudaGetLastError();
        gemm_cuda_dev_leave_house(d);
    }
}

static void *house_main(void *arg)
{
    prctl(PR_SET_NAME, "gemm-house", 0, 0, 0); /* shows in top -H, ps -L, /proc */
    cuda_backend *cb = arg;
    double next = gemm_now_ms() + HOUSE_PERIOD_MS;
    pthread_mutex_lock(&cb->house_mu);
    while (!cb->house_stop) {
        double now = gemm_now_ms();
        if (!cb->house_wake && now < next) {
            struct timespec until;
            clock_gettime(CLOCK_MONOTONIC, &until);
            long long ns = (long long)((next - now) * 1e6) + until.tv_nsec;
            until.tv_sec += (time_t)(ns / 1000000000LL);
            until.tv_nsec = (long)(ns % 1000000000LL);
            int rc = pthread_cond_timedwait(&cb->house_cv, &cb->house_mu, &until);
            if (rc != 0 && rc != ETIMEDOUT && rc != EINTR) break;
            continue;
        }
        int sample = now >= next;
        if (sample) next = now + HOUSE_PERIOD_MS;
        cb->house_wake = 0;
        pthread_mutex_unlock(&cb->house_mu);
        visit(cb, sample);
        gemm_cuda_resident_drain(cb);
        pthread_mutex_lock(&cb->house_mu);
    }
    pthread_mutex_unlock(&cb->house_mu);
    return NULL;
}

void gemm_cuda_house_wake(void *arg)
{
    cuda_backend *cb = arg;
    pthread_mutex_lock(&cb->house_mu);
    cb->house_wake = 1;
    pthread_cond_signal(&cb->house_cv);
    pthread_mutex_unlock(&cb->house_mu);
}

int gemm_cuda_house_start(cuda_backend *cb)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&cb->house_cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&cb->house_mu, NULL);
    int rc = pthread_create(&cb->house, NULL, house_main, cb);
    if (rc != 0) {
        pthread_cond_destroy(&cb->house_cv);
        pthread_mutex_destroy(&cb->house_mu);
        return -1;
    }
    cb->house_started = 1;
    return 0;
}

void gemm_cuda_house_stop(cuda_backend *cb)
{
    if (!cb->house_started) return;
    pthread_mutex_lock(&cb->house_mu);
    cb->house_stop = 1;
    pthread_cond_signal(&cb->house_cv);
    pthread_mutex_unlock(&cb->house_mu);
    pthread_join(cb->house, NULL);
    pthread_cond_destroy(&cb->house_cv);
    pthread_mutex_destroy(&cb->house_mu);
    cb->house_started = 0;
}
