/*
 * cpu.c - the CPU backend: the products of cpu_gemm.c, `cpu_workers` jobs at once, each
 * with threads / cpu_workers threads (at least one). Its fault hooks: config/gemmd.conf.
 */
#include "cpu_gemm.h"

#include <cblas.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    int threads;       /* total budget */
    int workers;
    int job_threads;   /* per job */
    long delay_ms, stuck_ms, fail_every, lost_at; /* fault hooks (0: off) */
    atomic_int lost;   /* the simulated device is gone */
    atomic_ullong runs;
    atomic_ullong busy_us; /* time spent computing, for device_busy_seconds */
} cpu_backend;

static const gemm_fault_hook cpu_faults[] = {
    {"cpu_delay_ms", offsetof(cpu_backend, delay_ms), 0, 3600000},
    {"cpu_stuck_ms", offsetof(cpu_backend, stuck_ms), 0, 3600000},
    {"cpu_fail", offsetof(cpu_backend, fail_every), 1, 3600000},
    {"cpu_lost", offsetof(cpu_backend, lost_at), 1, 3600000},
    {NULL, 0, 0, 0},
};

#define KEY(f) offsetof(gemm_engine_config, f)
const gemm_key gemm_cpu_keys[] = {
    {"threads", GEMM_KEY_INT, KEY(threads), 0, 0, 4096, "CPU backend: BLAS threads (0 = all cores)"},
    {"cpu_workers", GEMM_KEY_INT, KEY(cpu_workers), 0, 0, 1024, "CPU backend: products run at once (0 = 1)"},
    {NULL, 0, 0, 0, 0, 0, NULL},
};

static void *cpu_open(const gemm_engine_config *cfg, gemm_engine_err *err)
{
    cpu_backend *cb = calloc(1, sizeof *cb);
    if (!cb) {
        gemm_engine_err_set(err, GEMM_E_NO_MEMORY, "cannot allocate the CPU backend");
        return NULL;
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    cb->threads = cfg->threads > 0 ? cfg->threads : (int)cores;
    cb->workers = cfg->cpu_workers > 0 ? cfg->cpu_workers : 1;
    cb->job_threads = cb->threads / cb->workers;
    if (cb->job_threads < 1) cb->job_threads = 1;
    if (gemm_faults_parse(&gemm_backend_cpu, cfg->fault_inject, cb, err) != 0) {
        free(cb);
        return NULL;
    }
    openblas_set_num_threads(cb->job_threads);
    return cb;
}

static int cpu_workers(void *self)
{
    return ((cpu_backend *)self)->workers;
}

static int cpu_validate(void *self, gemm_job *job, gemm_engine_err *err)
{
    (void)self;
    const char *want = job->kernel, *use = gemm_cpu_kernel(job->dtype);
    if (want[0] && strcmp(want, "auto") != 0 && strcmp(want, "cpu") != 0) {
        if (strcmp(want, "openblas") != 0 && strcmp(want, "blocked") != 0)
            return gemm_engine_err_set(err, GEMM_E_UNKNOWN_KERNEL,
                                       "kernel \"%s\" is not available on the CPU backend; it has openblas "
                                       "(float32, float64, float16, bfloat16) and blocked (int32), or auto",
                                       want);
        if (strcmp(want, use) != 0)
            return gemm_engine_err_set(err, GEMM_E_UNSUPPORTED_DTYPE,
                                       "kernel \"%s\" does not compute %s; on the CPU backend use openblas for "
                                       "float32/float64/float16/bfloat16 and blocked for int32 (or auto)",
                                       want, gemm_dtype_name(job->dtype));
    }
    if (job->math != GEMM_MATH_DEFAULT && job->math != GEMM_MATH_FP32)
        return gemm_engine_err_set(err, GEMM_E_UNSUPPORTED_MATH,
                                   "math \"%s\" needs tensor cores; the CPU backend computes in exact fp32 only "
                                   "(use math fp32 or default)",
                                   gemm_math_name(job->math));
    if (job->tile != 0)
        return gemm_engine_err_set(err, GEMM_E_BAD_TILE, "kernel \"%s\" takes no tile option (tile=%d)", use,
                                   job->tile);
    snprintf(job->kernel_used, sizeof job->kernel_used, "%s", use);
    job->math_used = job->dtype == GEMM_DTYPE_F32 ? GEMM_MATH_FP32 : GEMM_MATH_DEFAULT;
    return 0;
}

/* The cpu_delay_ms hook: sleeps ms, in slices, ending early once the job is cancelled. */
static void delay_ms(gemm_job *job, long ms)
{
    double end = gemm_now_ms() + (double)ms;
    for (;;) {
        double left = end - gemm_now_ms();
        if (left <= 0 || gemm_job_cancel_requested(job)) return;
        if (left > 5) left = 5;
        struct timespec ts = {0, (long)(left * 1e6)};
        nanosleep(&ts, NULL);
    }
}

/* The hooks that act before a product: 0 to go on, else what run() returns. */
static int hooks(cpu_backend *cb, gemm_job *job, unsigned long long nrun)
{
    if (atomic_load(&cb->lost))
        return gemm_engine_err_set(&job->err, GEMM_E_DEVICE_LOST,
                                   "cpu could not be recovered after an earlier device error (injected by "
                                   "fault_inject cpu_lost:%ld); restart gemmd or send the product to another server",
                                   cb->lost_at);
    if (cb->lost_at > 0 && nrun >= (unsigned long long)cb->lost_at) {
        atomic_store(&cb->lost, 1);
        return gemm_engine_err_set(&job->err, GEMM_E_DEVICE,
                                   "injected loss of the device (fault_inject cpu_lost:%ld, run %llu); the device "
                                   "cannot be used in this process any more",
                                   cb->lost_at, nrun);
    }
    if (cb->delay_ms > 0) delay_ms(job, cb->delay_ms);
    if (gemm_job_cancel_requested(job)) return gemm_job_stop_cancelled(job, "its product");
    if (cb->fail_every > 0 && nrun % (unsigned long long)cb->fail_every == 0)
        return gemm_engine_err_set(&job->err, GEMM_E_BACKEND,
                                   "injected CPU backend failure (fault_inject cpu_fail:%ld, run %llu)",
                                   cb->fail_every, nrun);
    if (cb->stuck_ms > 0) { /* deaf to cancellation, like one long BLAS call */
        struct timespec ts = {cb->stuck_ms / 1000, (cb->stuck_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0) {}
    }
    return 0;
}

static int cpu_run(void *self, void *worker, gemm_job *job)
{
    (void)worker;
    cpu_backend *cb = self;
    gemm_cpu_ran_here(job);
    int rc = hooks(cb, job, atomic_fetch_add(&cb->runs, 1) + 1);
    if (rc != 0) return rc;
    rc = gemm_cpu_products(job, cb->job_threads);
    if (rc == 0) atomic_fetch_add(&cb->busy_us, (unsigned long long)(job->timing.kernel_ms * 1000.0));
    return rc;
}

static uint64_t mem_bytes(int pages_name)
{
    long pages = sysconf(pages_name), psize = sysconf(_SC_PAGESIZE);
    return pages > 0 && psize > 0 ? (uint64_t)pages * (uint64_t)psize : 0;
}

static void cpu_describe(void *self, gemm_engine_info *out)
{
    cpu_backend *cb = self;
    out->ndevices = 1;
    out->devices[0] = (gemm_device_info){.total_mem = mem_bytes(_SC_PHYS_PAGES),
                                         .free_mem = mem_bytes(_SC_AVPHYS_PAGES), .streams = cb->workers};
    snprintf(out->devices[0].name, sizeof out->devices[0].name, "cpu (%d threads)", cb->threads);
    out->nkernels = 2;
    gemm_kernel_info *k = out->kernels;
    k[0] = (gemm_kernel_info){.name = "openblas",
                              .dtypes = (1u << GEMM_DTYPE_F32) | (1u << GEMM_DTYPE_F64) | (1u << GEMM_DTYPE_F16) |
                                        (1u << GEMM_DTYPE_BF16),
                              .maths = (1u << GEMM_MATH_DEFAULT) | (1u << GEMM_MATH_FP32)};
    snprintf(k[0].description, sizeof k[0].description,
             "OpenBLAS cblas_sgemm/cblas_dgemm, row-major, %d threads per job (float16/bfloat16: "
             "widened to float32)", cb->job_threads);
    k[1] = (gemm_kernel_info){.name = "blocked", .dtypes = 1u << GEMM_DTYPE_I32};
    snprintf(k[1].description, sizeof k[1].description,
             "cache-blocked int32 loop, wraps in two's complement, %d threads per job", cb->job_threads);
}

static void cpu_stats(void *self, gemm_engine_stats *out)
{
    cpu_backend *cb = self;
    out->ndevices = 1; /* no copies and no device memory on the CPU */
    out->device_busy_seconds[0] = (double)atomic_load(&cb->busy_us) / 1e6;
    out->device_mem_free[0] = mem_bytes(_SC_AVPHYS_PAGES);
}

static int cpu_healthy(void *self)
{
    return !atomic_load(&((cpu_backend *)self)->lost);
}

/* Not while a hook holds every run (cpu_delay_ms, cpu_stuck_ms). */
static int cpu_quick(void *self)
{
    const cpu_backend *cb = self;
    return cb->delay_ms <= 0 && cb->stuck_ms <= 0;
}

const gemm_backend gemm_backend_cpu = {
    .name = "cpu",
    .open = cpu_open,
    .close = free,
    .workers = cpu_workers,
    .validate = cpu_validate,
    .run = cpu_run,
    .describe = cpu_describe,
    .stats = cpu_stats,
    .healthy = cpu_healthy,
    .quick = cpu_quick,
    /* Coalescing on the CPU only saves a queue hand-off per product and adds a gather and a
     * scatter copy: off unless batch_max asks for it (bench/results/batch-cpu.md). */
    .batch_default = 1,
    .faults = cpu_faults,
};
