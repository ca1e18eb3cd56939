/*
 * host.c - the host path (docs/OPERATIONS.md, "The host path"): a backend row with no
 * workers that computes on the submitting thread a product too small for a device to pay
 * for its trip, with OpenBLAS (one thread for the process) or the int32 loop.
 */
#include "cpu_gemm.h"

#include <cblas.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t max_mnk;
} host_path;

const gemm_key gemm_host_keys[] = {
    {"host_max_mnk", GEMM_KEY_U64, offsetof(gemm_engine_config, host_max_mnk), 0, 0, (long long)GEMM_HOST_MAX_MNK,
     "GPU backend: a float32 (fp32), float64 or int32 product with kernel auto and batch*m*n*k up to this is "
     "computed by the HTTP thread that received it, on the host (OpenBLAS or the int32 loop, one thread), where "
     "the GPU cannot pay for its hand-off; its answer says device cpu (0 = every product to the GPU)"},
    {NULL, 0, 0, 0, 0, 0, NULL},
};

static void *host_open(const gemm_engine_config *cfg, gemm_engine_err *err)
{
    (void)err;
    if (!cfg->host_max_mnk || cfg->fault_inject[0]) return NULL; /* off */
    host_path *h = malloc(sizeof *h);
    if (!h) return NULL; /* the products go to the device, as with the path off */
    h->max_mnk = cfg->host_max_mnk > GEMM_HOST_MAX_MNK ? GEMM_HOST_MAX_MNK : cfg->host_max_mnk;
    openblas_set_num_threads(1);
    return h;
}

static int host_takes(void *self, const gemm_job *job)
{
    const host_path *h = self;
    if (job->dtype != GEMM_DTYPE_F32 && job->dtype != GEMM_DTYPE_F64 && job->dtype != GEMM_DTYPE_I32) return 0;
    if (job->kernel[0] && strcmp(job->kernel, "auto") != 0) return 0; /* a kernel asked for by name */
    if (job->math != GEMM_MATH_DEFAULT && job->math != GEMM_MATH_FP32) return 0; /* tensor cores */
    if (job->tile || job->plan_m || job->a_res || job->b_res || job->c_res) return 0;
    if (job->m == 0 || job->k == 0 || job->n == 0) return 0;
    return (double)job->m * (double)job->n * (double)job->k * (double)gemm_job_batch(job) <= (double)h->max_mnk;
}

static int host_run(void *self, void *worker, gemm_job *job)
{
    (void)self, (void)worker;
    gemm_cpu_ran_here(job); /* no validate() chose a kernel: the dtype's */
    return gemm_cpu_products(job, 1);
}

const gemm_backend gemm_backend_host = {
    .name = "host",
    .open = host_open,
    .close = free,
    .run = host_run,
    .takes = host_takes,
};
