/*
 * bench_split.c - one big product run whole or split into row panels of A (engine.c,
 * "Split products"): the wall time of a single product, with nothing else running.
 *
 *   build/bench/bench_split [--backend cuda|cpu] [--sizes 8192,16384] [--dtype float32]
 *                           [--kernel auto] [--math fp32] [--reps 5] [--ways 2]
 *                           [--cpu-workers 2]
 *
 * For each n in --sizes, one n x n x n product (A and B random in [-1, 1)), through the
 * engine interface, in these configurations:
 *   whole     split_ways 1: the product runs on one worker (one stream of one GPU)
 *   one-dev   split_ways --ways on device 0 only (devices = "0"): one GPU as several
 *             engines (its panels on separate streams, their copies and kernels overlapping)
 *   all-dev   split_ways 0 over every device: one panel per GPU (only with 2 or more GPUs)
 * On --backend cpu: whole is one worker with every thread; split is --cpu-workers workers
 * splitting the same threads, --ways panels.
 * Each configuration runs once to warm up (not counted), then --reps times one after the
 * other; printed per configuration: the median and best wall time from submit to done()
 * (ms), the rate 2n^3 / median wall (TFLOP/s), the answer's h2d / kernel / d2h (ms, of the
 * median run; for a split the longest panel's), the panels and their devices, and the
 * speed-up of the median over whole's. Every configuration's result is checked at 256
 * sampled elements against a float64 dot product on the host, and compared byte for byte
 * with whole's (equal or not: said, not required; see docs/API.md "Split products").
 * No timing assertion: a benchmark, its numbers go to bench/results/.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int done_flag;
static double done_ms;

static void on_done(gemm_job *j)
{
    (void)j;
    double t = gemm_now_ms();
    pthread_mutex_lock(&mu);
    done_flag = 1;
    done_ms = t;
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
}

static double run(gemm_engine *e, gemm_job *j)
{
    gemm_engine_err err;
    pthread_mutex_lock(&mu);
    done_flag = 0;
    pthread_mutex_unlock(&mu);
    double t0 = gemm_now_ms();
    if (gemm_engine_submit(e, j, &err) != 0) {
        fprintf(stderr, "submit: %s\n", err.message);
        return -1;
    }
    pthread_mutex_lock(&mu);
    while (!done_flag) pthread_cond_wait(&cv, &mu);
    double t1 = done_ms;
    pthread_mutex_unlock(&mu);
    if (atomic_load(&j->state) != GEMM_JOB_DONE) {
        fprintf(stderr, "product failed: %s\n", j->err.message);
        return -1;
    }
    return t1 - t0;
}

static double get(gemm_dtype d, const void *p, size_t i)
{
    return d == GEMM_DTYPE_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

/* Max relative error at 256 sampled elements against a float64 dot product. */
static double sample_err(const gemm_job *j)
{
    uint64_t s = 12345;
    double worst = 0;
    for (int t = 0; t < 256; t++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        size_t i = (size_t)((s >> 33) % j->m), c = (size_t)((s >> 13) % j->n);
        double ref = 0, mag = 0;
        for (size_t p = 0; p < j->k; p++) {
            double x = get(j->dtype, j->a, i * j->k + p) * get(j->dtype, j->b, p * j->n + c);
            ref += x;
            mag += fabs(x);
        }
        double got = get(j->dtype, j->c, i * j->n + c);
        double err = fabs(got - ref) / (mag > 0 ? mag : 1);
        if (!(err == err)) return INFINITY;
        if (err > worst) worst = err;
    }
    return worst;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    const char *backend, *kernel;
    gemm_dtype dtype;
    gemm_math math;
    int reps, ways, cpu_workers;
} opts;

/* One configuration: returns the median wall (ms), or -1; keeps its C in *keep when asked. */
static double config(const opts *o, const char *label, uint64_t n, const char *devices, int ways, int workers,
                     void **keep, const void *whole_c, double whole_ms)
{
    gemm_engine_config cfg;
    gemm_engine_config_defaults(&cfg);
    snprintf(cfg.backend, sizeof cfg.backend, "%s", o->backend);
    snprintf(cfg.devices, sizeof cfg.devices, "%s", devices);
    cfg.streams_per_device = ways > 2 ? ways : 2;
    cfg.cpu_workers = workers;
    cfg.split_ways = ways;
    cfg.split_min_mnk = 1;
    cfg.warmup = 1;
    gemm_engine_err err;
    gemm_engine *e = gemm_engine_open(&cfg, &err);
    if (!e) {
        fprintf(stderr, "%s: open: %s\n", label, err.message);
        return -1;
    }
    size_t es = gemm_dtype_size(o->dtype), bytes = (size_t)(n * n) * es;
    gemm_job j;
    memset(&j, 0, sizeof j);
    j.dtype = o->dtype;
    j.m = j.k = j.n = n;
    j.math = o->math;
    snprintf(j.kernel, sizeof j.kernel, "%s", o->kernel);
    j.done = on_done;
    j.a = gemm_engine_host_alloc(e, bytes);
    j.b = gemm_engine_host_alloc(e, bytes);
    j.c = gemm_engine_host_alloc(e, bytes);
    if (!j.a || !j.b || !j.c) {
        fprintf(stderr, "%s: cannot allocate 3 x %zu bytes\n", label, bytes);
        gemm_engine_close(e);
        return -1;
    }
    uint64_t s = 42;
    for (size_t i = 0; i < (size_t)(n * n); i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        double u = (double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0;
        if (o->dtype == GEMM_DTYPE_F32) ((float *)j.a)[i] = (float)u;
        else ((double *)j.a)[i] = u;
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        u = (double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0;
        if (o->dtype == GEMM_DTYPE_F32) ((float *)j.b)[i] = (float)u;
        else ((double *)j.b)[i] = u;
    }
    double *t = calloc((size_t)o->reps, sizeof *t);
    gemm_job_timing *tm = calloc((size_t)o->reps, sizeof *tm);
    double med = -1;
    if (t && tm && run(e, &j) >= 0) { /* warm-up: buffers, pinning, cuBLAS */
        int ok = 1;
        for (int r = 0; r < o->reps && ok; r++) {
            t[r] = run(e, &j);
            tm[r] = j.timing;
            ok = t[r] >= 0;
        }
        if (ok) {
            double *sorted = malloc((size_t)o->reps * sizeof *sorted);
            memcpy(sorted, t, (size_t)o->reps * sizeof *sorted);
            qsort(sorted, (size_t)o->reps, sizeof *sorted, cmp_double);
            med = sorted[o->reps / 2];
            int mi = 0;
            for (int r = 0; r < o->reps; r++)
                if (t[r] == med) mi = r;
            char devs[256] = "";
            size_t off = 0;
            for (int p = 0; p < j.split_panels && off < sizeof devs; p++)
                off += (size_t)snprintf(devs + off, sizeof devs - off, "%s%.*s/s%d", p ? "," : "",
                                        (int)strcspn(j.split[p].device, " "), j.split[p].device, j.split[p].stream);
            if (!j.split_panels)
                snprintf(devs, sizeof devs, "%.*s/s%d", (int)strcspn(j.device, " "), j.device, j.stream);
            double err_s = sample_err(&j);
            const char *same = whole_c ? (memcmp(j.c, whole_c, bytes) == 0 ? "equal" : "differs") : "-";
            printf("| %llu | %s | %s | %d | %s | %.1f | %.1f | %.2f | %.2f | %.2f | %.2f | %.2fx | %.1e | %s |\n",
                   (unsigned long long)n, label, j.kernel_used, j.split_panels ? j.split_panels : 1, devs, med,
                   sorted[0], 2.0 * (double)n * (double)n * (double)n / (med * 1e9), tm[mi].h2d_ms, tm[mi].kernel_ms,
                   tm[mi].d2h_ms, whole_ms > 0 ? whole_ms / med : 1.0, err_s, same);
            free(sorted);
        }
    }
    free(t);
    free(tm);
    if (keep && med > 0) {
        *keep = malloc(bytes);
        if (*keep) memcpy(*keep, j.c, bytes);
    }
    gemm_engine_host_free(e, j.a);
    gemm_engine_host_free(e, j.b);
    gemm_engine_host_free(e, j.c);
    gemm_engine_close(e);
    return med;
}

int main(int argc, char **argv)
{
    opts o = {"cuda", "auto", GEMM_DTYPE_F32, GEMM_MATH_DEFAULT, 5, 2, 2};
    const char *sizes = "8192,16384";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--backend") == 0) o.backend = argv[i + 1];
        else if (strcmp(argv[i], "--sizes") == 0) sizes = argv[i + 1];
        else if (strcmp(argv[i], "--kernel") == 0) o.kernel = argv[i + 1];
        else if (strcmp(argv[i], "--reps") == 0) o.reps = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--ways") == 0) o.ways = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--cpu-workers") == 0) o.cpu_workers = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--dtype") == 0)
            o.dtype = strcmp(argv[i + 1], "float64") == 0 ? GEMM_DTYPE_F64 : GEMM_DTYPE_F32;
        else if (strcmp(argv[i], "--math") == 0)
            o.math = strcmp(argv[i + 1], "tf32") == 0 ? GEMM_MATH_TF32
                     : strcmp(argv[i + 1], "bf16") == 0 ? GEMM_MATH_BF16 : GEMM_MATH_DEFAULT;
        else {
            fprintf(stderr, "unknown option %s (see the head of bench/bench_split.c)\n", argv[i]);
            return 2;
        }
    }
    if (o.reps < 1) o.reps = 1;
    if (o.ways < 2) o.ways = 2;
    int cpu = strcmp(o.backend, "cpu") == 0;
    /* How many devices the backend sees: from a probe engine's description. */
    gemm_engine_config pc;
    gemm_engine_config_defaults(&pc);
    snprintf(pc.backend, sizeof pc.backend, "%s", o.backend);
    pc.streams_per_device = 1;
    gemm_engine_err perr;
    gemm_engine *probe = gemm_engine_open(&pc, &perr);
    if (!probe) {
        fprintf(stderr, "bench_split: backend %s: %s (on a host without a GPU try --backend cpu)\n", o.backend,
                perr.message);
        return 2;
    }
    gemm_engine_info info;
    gemm_engine_describe(probe, &info);
    gemm_engine_close(probe);
    int ndev = info.ndevices;
    printf("# bench_split: backend %s, %s, kernel %s, %d reps after one warm-up, %d way(s) on one device, "
           "%d device(s)\n", o.backend, gemm_dtype_name(o.dtype), o.kernel, o.reps, o.ways, ndev);
    printf("| n | config | kernel | panels | device/stream per panel | median ms | best ms | TFLOP/s | h2d ms "
           "| kernel ms | d2h ms | speed-up (median) | max sampled rel err | C vs whole |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    char list[256];
    snprintf(list, sizeof list, "%s", sizes);
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        uint64_t n = strtoull(tok, NULL, 10);
        if (n < 2) continue;
        void *whole_c = NULL;
        double w = config(&o, "whole", n, cpu ? "all" : "0", 1, 1, &whole_c, NULL, 0);
        config(&o, cpu ? "split" : "one-dev", n, cpu ? "all" : "0", o.ways, cpu ? o.cpu_workers : 1, NULL, whole_c, w);
        if (!cpu && ndev >= 2) config(&o, "all-dev", n, "all", 0, 1, NULL, whole_c, w);
        free(whole_c);
    }
    return 0;
}
