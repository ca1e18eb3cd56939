/*
 * cpu.c - the CPU backend: float32/float64 through OpenBLAS (row-major cblas_?gemm),
 * int32 through our own cache-blocked loop (cpu_int32.c), `cpu_workers` jobs at once.
 *
 * Threads: `threads` (0 = every online core) is the backend's whole CPU budget; each of
 * the `cpu_workers` workers gets threads / cpu_workers of it (at least one), both for
 * OpenBLAS (openblas_set_num_threads, a process-wide setting) and for the int32 loop.
 * With the default single worker one job gets every core.
 *
 * Test hooks (gemm_engine_config.fault_inject, comma-separated):
 *   cpu_delay_ms:N   every job sleeps N ms before computing (fills the queue predictably;
 *                    a cancel of the job ends the sleep)
 *   cpu_stuck_ms:N   every job spends N ms inside its product without looking at the
 *                    cancel flag, as one long OpenBLAS call does (a product that cannot
 *                    be stopped, whatever the host's speed)
 *   cpu_fail:N       every Nth job run fails with 500 backend_failure
 *   cpu_lost:N       the device is "lost" at the Nth job run: that job fails with 500
 *                    device_error, every later one with 503 device_unavailable, and
 *                    healthy() says 0 from then on (what a CUDA device does when its
 *                    context cannot be rebuilt after a sticky error)
 * The daemon ignores fault_inject in a process it restarted itself (GEMMD_RESTARTS > 0).
 *
 * Cancellation (gemm_engine_cancel of a running job): checked before the product (after the
 * cpu_delay_ms sleep) and, for int32, before every k-slice of the blocked loop; OpenBLAS
 * calls are not interrupted.
 */
#include "cpu_int32.h"
#include "engine.h"
#include "gemm_half.h"

#include <cblas.h>
#include <limits.h>
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
    int delay_ms;      /* fault hook */
    int stuck_ms;      /* fault hook */
    int fail_every;    /* fault hook */
    int lost_at;       /* fault hook */
    atomic_int lost;   /* the simulated device is gone */
    atomic_ullong runs;
    atomic_ullong busy_us; /* time spent computing, for device_busy_seconds */
} cpu_backend;

static int parse_faults(cpu_backend *cb, const char *spec, gemm_err *err)
{
    char buf[sizeof ((gemm_engine_config *)0)->fault_inject];
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ') tok++;
        if (!*tok) continue;
        char *colon = strchr(tok, ':');
        char *end = NULL;
        long v = colon ? strtol(colon + 1, &end, 10) : -1;
        int ok = colon && end && end != colon + 1 && *end == '\0' && v >= 0 && v <= 3600000;
        if (ok && strncmp(tok, "cpu_delay_ms:", 13) == 0) {
            cb->delay_ms = (int)v;
        } else if (ok && strncmp(tok, "cpu_stuck_ms:", 13) == 0) {
            cb->stuck_ms = (int)v;
        } else if (ok && v >= 1 && strncmp(tok, "cpu_fail:", 9) == 0) {
            cb->fail_every = (int)v;
        } else if (ok && v >= 1 && strncmp(tok, "cpu_lost:", 9) == 0) {
            cb->lost_at = (int)v;
        } else {
            return gemm_err_set(err, 400, "bad_config",
                                "fault_inject \"%s\": the CPU backend understands "
                                "cpu_delay_ms:N, cpu_stuck_ms:N, cpu_fail:N and cpu_lost:N (N >= 1)", tok);
        }
    }
    return 0;
}

static void *cpu_open(const gemm_engine_config *cfg, gemm_err *err)
{
    cpu_backend *cb = calloc(1, sizeof *cb);
    if (!cb) {
        gemm_err_set(err, 500, "out_of_memory", "cannot allocate the CPU backend");
        return NULL;
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    cb->threads = cfg->threads > 0 ? cfg->threads : (int)cores;
    cb->workers = cfg->cpu_workers > 0 ? cfg->cpu_workers : 1;
    cb->job_threads = cb->threads / cb->workers;
    if (cb->job_threads < 1) cb->job_threads = 1;
    atomic_init(&cb->runs, 0);
    atomic_init(&cb->busy_us, 0);
    atomic_init(&cb->lost, 0);
    if (parse_faults(cb, cfg->fault_inject, err) != 0) {
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

static const char *default_kernel(gemm_dtype d)
{
    return d == GEMM_DTYPE_I32 ? "blocked" : "openblas";
}

static int cpu_validate(void *self, gemm_job *job, gemm_err *err)
{
    (void)self;
    const char *want = job->kernel;
    const char *use;
    if (!want[0] || strcmp(want, "auto") == 0 || strcmp(want, "cpu") == 0) {
        use = default_kernel(job->dtype);
    } else if (strcmp(want, "openblas") == 0 || strcmp(want, "blocked") == 0) {
        use = want;
        if (strcmp(use, default_kernel(job->dtype)) != 0)
            return gemm_err_set(err, 422, "unsupported_dtype",
                                "kernel \"%s\" does not compute %s; on the CPU backend use "
                                "openblas for float32/float64/float16/bfloat16 and blocked for int32 (or auto)",
                                use, gemm_dtype_name(job->dtype));
    } else {
        return gemm_err_set(err, 422, "unknown_kernel",
                            "kernel \"%s\" is not available on the CPU backend; it has "
                            "openblas (float32, float64, float16, bfloat16) and blocked (int32), or auto",
                            want);
    }

    if (job->math != GEMM_MATH_DEFAULT && job->math != GEMM_MATH_FP32)
        return gemm_err_set(err, 422, "unsupported_math",
                            "math \"%s\" needs tensor cores; the CPU backend computes in exact "
                            "fp32 only (use math fp32 or default)",
                            gemm_math_name(job->math));
    if (job->tile != 0)
        return gemm_err_set(err, 422, "bad_tile",
                            "kernel \"%s\" takes no tile option (tile=%d)", use, job->tile);

    /* cblas takes int dimensions and leading dimensions. */
    if (job->m > INT_MAX || job->k > INT_MAX || job->n > INT_MAX)
        return gemm_err_set(err, 413, "too_large",
                            "m=%llu k=%llu n=%llu: the CPU backend takes dimensions up to %d",
                            (unsigned long long)job->m, (unsigned long long)job->k,
                            (unsigned long long)job->n, INT_MAX);

    snprintf(job->kernel_used, sizeof job->kernel_used, "%s", use);
    job->math_used = job->dtype == GEMM_DTYPE_F32 ? GEMM_MATH_FP32 : GEMM_MATH_DEFAULT;
    job->tile_used = 0;
    return 0;
}

/* The cpu_delay_ms hook: sleeps ms, in slices, ending early once the job is cancelled. */
static void delay_ms(gemm_job *job, int ms)
{
    double end = gemm_now_ms() + ms;
    for (;;) {
        double left = end - gemm_now_ms();
        if (left <= 0 || gemm_job_cancel_requested(job)) return;
        if (left > 5) left = 5;
        struct timespec ts = {0, (long)(left * 1e6)};
        nanosleep(&ts, NULL);
    }
}

/* Timing and GFLOP/s of a job whose products took t0..t1. */
static void kernel_time(gemm_job *job, double t0, double t1)
{
    const uint64_t nb = gemm_job_batch(job);
    job->timing.h2d_ms = 0;
    job->timing.d2h_ms = 0;
    job->timing.kernel_ms = t1 - t0;
    double flops = 2.0 * (double)nb * (double)job->m * (double)job->n * (double)job->k;
    job->timing.gflops = job->timing.kernel_ms > 0 ? flops / (job->timing.kernel_ms * 1e6) : 0;
}

/* kernel_time, and the time counted as the backend's busy time. */
static void note_timing(cpu_backend *cb, gemm_job *job, double t0, double t1)
{
    kernel_time(job, t0, t1);
    atomic_fetch_add(&cb->busy_us, (unsigned long long)(job->timing.kernel_ms * 1000.0));
}

/* Where a product computed on the CPU says it ran: the backend's run and the host path. */
static void ran_on_cpu(gemm_job *job)
{
    snprintf(job->device, sizeof job->device, "cpu");
    job->stream = -1;
    job->tile_used = 0;
    job->math_used = job->dtype == GEMM_DTYPE_F32 ? GEMM_MATH_FP32 : GEMM_MATH_DEFAULT;
    if (!job->kernel_used[0])
        snprintf(job->kernel_used, sizeof job->kernel_used, "%s", default_kernel(job->dtype));
}

/* float16 / bfloat16 operands: A and B widened to float32 (exactly), one cblas_sgemm (float32
 * products and sums), C rounded to the operands' dtype when it is asked for. The float32
 * copies (one product's A and B, and C when it is rounded) are the job's own, freed here.
 * sa, sb, sc: bytes of one product's A, B (0: shared) and C in their dtypes. */
static int run_half(cpu_backend *cb, gemm_job *job, size_t sa, size_t sb, size_t sc)
{
    const int m = (int)job->m, k = (int)job->k, n = (int)job->n;
    const uint64_t nb = gemm_job_batch(job);
    const gemm_dtype d = job->dtype;
    const size_t na = (size_t)job->m * job->k, nbel = (size_t)job->k * job->n, nc = (size_t)job->m * job->n;
    float *fa = malloc(na * sizeof(float)), *fb = malloc(nbel * sizeof(float));
    float *fc = job->out_half ? malloc(nc * sizeof(float)) : NULL;
    if (!fa || !fb || (job->out_half && !fc)) {
        free(fa), free(fb), free(fc);
        return gemm_err_set(&job->err, 503, "out_of_memory",
                            "cannot allocate the float32 copies of a %dx%dx%d %s product now; retry later", m, k,
                            n, gemm_dtype_name(d));
    }
    double t0 = gemm_now_ms();
    for (uint64_t i = 0; i < nb; i++) {
        if (i > 0 && gemm_job_cancel_requested(job)) {
            free(fa), free(fb), free(fc);
            return gemm_job_stop_cancelled(job, "the rest of its batch (between products)");
        }
        const uint16_t *a = (const void *)((const unsigned char *)job->a + i * sa);
        const uint16_t *b = (const void *)((const unsigned char *)job->b + i * sb);
        unsigned char *c = (unsigned char *)job->c + i * sc;
        gemm_half_to_f32_array(d, a, fa, na);
        if (i == 0 || sb) gemm_half_to_f32_array(d, b, fb, nbel);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, fa, k, fb, n, 0.0f,
                    fc ? fc : (float *)(void *)c, n);
        if (fc) gemm_f32_to_half_array(d, fc, (uint16_t *)(void *)c, nc);
    }
    free(fa), free(fb), free(fc);
    if (nb > 1) {
        job->batched = nb;
        snprintf(job->batch_mode, sizeof job->batch_mode, "loop");
    }
    note_timing(cb, job, t0, gemm_now_ms());
    return 0;
}

/* The products of a float32, float64 or int32 job (all of a batch), with threads for the
 * int32 loop (OpenBLAS uses its process-wide setting): 0, or GEMM_RUN_CANCELLED / -1 with
 * job->err set. A batch is a loop of products over the same threads (the cblas of Debian's
 * OpenBLAS has no batched GEMM); a cancel stops it between products. */
static int run_products(gemm_job *job, int threads)
{
    const int m = (int)job->m, k = (int)job->k, n = (int)job->n;
    const uint64_t nb = gemm_job_batch(job);
    const size_t es = gemm_dtype_size(job->dtype);
    const size_t sa = (size_t)job->m * job->k * es, sc = (size_t)job->m * job->n * es,
                 sb = job->b_shared ? 0 : (size_t)job->k * job->n * es;
    for (uint64_t i = 0; i < nb; i++) {
        if (i > 0 && gemm_job_cancel_requested(job))
            return gemm_job_stop_cancelled(job, "the rest of its batch (between products)");
        /* byte offsets, then plain element pointers (void * converts without a cast) */
        const void *a = (const unsigned char *)job->a + i * sa, *b = (const unsigned char *)job->b + i * sb;
        void *c = (unsigned char *)job->c + i * sc;
        switch (job->dtype) {
        case GEMM_DTYPE_F32:
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
            break;
        case GEMM_DTYPE_F64:
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0, a, k, b, n, 0.0, c, n);
            break;
        case GEMM_DTYPE_I32:
            if (gemm_cpu_gemm_i32_stop(a, b, c, job->m, job->k, job->n, threads, &job->cancel_requested))
                return gemm_job_stop_cancelled(job, "the rest of its product (between k-slices)");
            break;
        default:
            return gemm_err_set(&job->err, 422, "bad_dtype", "unsupported dtype");
        }
    }
    if (nb > 1) {
        job->batched = nb;
        snprintf(job->batch_mode, sizeof job->batch_mode, "loop");
    }
    return 0;
}

void gemm_host_threads_one(void)
{
    openblas_set_num_threads(1);
}

int gemm_host_product(gemm_job *job)
{
    if (job->dtype != GEMM_DTYPE_F32 && job->dtype != GEMM_DTYPE_F64 && job->dtype != GEMM_DTYPE_I32)
        return gemm_err_set(&job->err, 422, "bad_dtype", "the host computes float32, float64 and int32 only");
    job->kernel_used[0] = '\0'; /* no validate() chose one: the default for the dtype */
    job->block[0] = '\0';
    ran_on_cpu(job);
    if (gemm_job_cancel_requested(job)) return gemm_job_stop_cancelled(job, "its product");
    double t0 = gemm_now_ms();
    int rc = run_products(job, 1);
    if (rc == 0) kernel_time(job, t0, gemm_now_ms());
    return rc;
}

static int cpu_run(void *self, void *worker, gemm_job *job)
{
    (void)worker;
    cpu_backend *cb = self;
    unsigned long long nrun = atomic_fetch_add(&cb->runs, 1) + 1;

    ran_on_cpu(job);

    if (atomic_load(&cb->lost))
        return gemm_err_set(&job->err, 503, "device_unavailable",
                            "cpu could not be recovered after an earlier device error (injected by "
                            "fault_inject cpu_lost:%d); restart gemmd or send the product to another "
                            "server", cb->lost_at);
    if (cb->lost_at > 0 && nrun >= (unsigned long long)cb->lost_at) {
        atomic_store(&cb->lost, 1);
        return gemm_err_set(&job->err, 500, "device_error",
                            "injected loss of the device (fault_inject cpu_lost:%d, run %llu); the "
                            "device cannot be used in this process any more", cb->lost_at, nrun);
    }
    if (cb->delay_ms > 0) delay_ms(job, cb->delay_ms);
    if (gemm_job_cancel_requested(job)) return gemm_job_stop_cancelled(job, "its product");
    if (cb->fail_every > 0 && nrun % (unsigned long long)cb->fail_every == 0)
        return gemm_err_set(&job->err, 500, "backend_failure",
                            "injected CPU backend failure (fault_inject cpu_fail:%d, run %llu)",
                            cb->fail_every, nrun);
    if (cb->stuck_ms > 0) { /* deaf to cancellation, like one long BLAS call */
        struct timespec ts = {cb->stuck_ms / 1000, (long)(cb->stuck_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0) {}
    }

    if (gemm_dtype_is_half(job->dtype)) {
        const size_t es = gemm_dtype_size(job->dtype), esc = gemm_dtype_size(gemm_job_c_dtype(job));
        const size_t sa = (size_t)job->m * job->k * es, sc = (size_t)job->m * job->n * esc,
                     sb = job->b_shared ? 0 : (size_t)job->k * job->n * es;
        return run_half(cb, job, sa, sb, sc);
    }
    double t0 = gemm_now_ms();
    int rc = run_products(job, cb->job_threads);
    if (rc == 0) note_timing(cb, job, t0, gemm_now_ms());
    return rc;
}

static void cpu_describe(void *self, gemm_engine_info *out)
{
    cpu_backend *cb = self;
    snprintf(out->backend, sizeof out->backend, "cpu");
    out->ndevices = 1;
    gemm_device_info *d = &out->devices[0];
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "cpu (%d threads)", cb->threads);
    long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES),
         psize = sysconf(_SC_PAGESIZE);
    if (pages > 0 && psize > 0) d->total_mem = (uint64_t)pages * (uint64_t)psize;
    if (avail > 0 && psize > 0) d->free_mem = (uint64_t)avail * (uint64_t)psize;
    d->streams = cb->workers;

    out->nkernels = 2;
    gemm_kernel_info *k = &out->kernels[0];
    memset(k, 0, 2 * sizeof *k);
    snprintf(k[0].name, sizeof k[0].name, "openblas");
    snprintf(k[0].description, sizeof k[0].description,
             "OpenBLAS cblas_sgemm/cblas_dgemm, row-major, %d threads per job (float16/bfloat16: "
             "widened to float32)", cb->job_threads);
    k[0].dtypes = (1u << GEMM_DTYPE_F32) | (1u << GEMM_DTYPE_F64) | (1u << GEMM_DTYPE_F16) | (1u << GEMM_DTYPE_BF16);
    k[0].maths = (1u << GEMM_MATH_DEFAULT) | (1u << GEMM_MATH_FP32);
    snprintf(k[1].name, sizeof k[1].name, "blocked");
    snprintf(k[1].description, sizeof k[1].description,
             "cache-blocked int32 loop, wraps in two's complement, %d threads per job",
             cb->job_threads);
    k[1].dtypes = 1u << GEMM_DTYPE_I32;
    k[1].maths = 0;
}

static void cpu_stats(void *self, gemm_engine_stats *out)
{
    cpu_backend *cb = self;
    out->ndevices = 1; /* no copies and no device memory on the CPU */
    out->device_busy_seconds[0] = (double)atomic_load(&cb->busy_us) / 1e6;
    long avail = sysconf(_SC_AVPHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    if (avail > 0 && psize > 0) out->device_mem_free[0] = (uint64_t)avail * (uint64_t)psize;
}

static const gemm_allocator *cpu_allocator(void *self)
{
    (void)self;
    return &gemm_allocator_host;
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

static void cpu_close(void *self)
{
    free(self);
}

const gemm_backend gemm_backend_cpu = {
    .name = "cpu",
    .open = cpu_open,
    .workers = cpu_workers,
    .worker_init = NULL,
    .worker_fini = NULL,
    .validate = cpu_validate,
    .run = cpu_run,
    .describe = cpu_describe,
    .stats = cpu_stats,
    .allocator = cpu_allocator,
    .close = cpu_close,
    .healthy = cpu_healthy,
    .quick = cpu_quick,
    /* Coalescing on the CPU only saves a queue hand-off per product and adds a gather and a
     * scatter copy: off unless batch_max asks for it (bench/batch_bench.sh measures it). */
    .batch_default = 1,
};
