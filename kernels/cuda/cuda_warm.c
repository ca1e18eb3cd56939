/*
 * cuda_warm.c - the warm-up, run by every worker before its first product (not while
 * fault_inject is set): the first launch of each kernel loads its module and the first
 * cuBLAS call of a shape family sets cuBLAS up, 50-100 ms the first requests would pay
 * (bench/results/h100-2026-11-23-warmup.md). Through the same validate and run as a
 * request: every dtype at 64^3, 256^3 and 512^3 with kernel auto, and a batch of 4 64^3.
 * Counted nowhere (w->warming; the products are not submitted).
 */
#include "cuda_engine.h"

#include <string.h>

void gemm_cuda_warm(cuda_backend *cb, cuda_worker *w)
{
    static const gemm_dtype dtypes[] = {GEMM_DTYPE_F32, GEMM_DTYPE_F64, GEMM_DTYPE_I32, GEMM_DTYPE_F16,
                                        GEMM_DTYPE_BF16};
    /* 64^3 and 256^3 alone run on our own members (kernel auto, auto.c), 512^3 and the
     * batched 64^3 through cuBLAS */
    static const struct { uint64_t n, batch; } shapes[] = {{64, 0}, {256, 0}, {512, 0}, {64, 4}};
    double t0 = gemm_now_ms();
    int ran = 0, failed = 0;
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++) {
        for (size_t j = 0; j < sizeof shapes / sizeof shapes[0]; j++) {
            gemm_job job;
            memset(&job, 0, sizeof job);
            job.dtype = dtypes[i];
            job.m = job.k = job.n = shapes[j].n;
            job.batch = shapes[j].batch;
            job.math = GEMM_MATH_DEFAULT;
            atomic_init(&job.state, GEMM_JOB_RUNNING);
            atomic_init(&job.cancel_requested, 0);
            size_t need[3];
            gemm_engine_err err;
            if (!gemm_job_bytes(&job, need) || gemm_cuda_validate(cb, &job, &err) != 0) continue;
            job.a = cb->alloc.alloc(cb->alloc.ctx, need[0]);
            job.b = cb->alloc.alloc(cb->alloc.ctx, need[1]);
            job.c = cb->alloc.alloc(cb->alloc.ctx, need[2]);
            if (job.a && job.b && job.c) {
                memset(job.a, 0, need[0]);
                memset(job.b, 0, need[1]);
                if (gemm_cuda_run(cb, w, &job) == 0) {
                    ran++;
                } else {
                    failed++;
                    gemm_engine_log(GEMM_LOG_WARN, "cuda: worker %d: warm-up product %s %llu^3 "
                                    "(batch %llu) failed: %s", w->index, gemm_dtype_name(job.dtype),
                                    (unsigned long long)job.m, (unsigned long long)job.batch,
                                    job.err.message);
                }
            }
            cb->alloc.free(cb->alloc.ctx, job.a);
            cb->alloc.free(cb->alloc.ctx, job.b);
            cb->alloc.free(cb->alloc.ctx, job.c);
            if (failed)
                return; /* the first real job will meet (and report) the same trouble */
        }
    }
    gemm_engine_log(GEMM_LOG_DEBUG, "cuda: worker %d (%s, stream %d) warmed up: %d products in %.1f ms",
                    w->index, w->dev->label, w->stream_index, ran, gemm_now_ms() - t0);
}

