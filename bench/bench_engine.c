/*
 * bench_engine.c - the engine alone, no HTTP in front: what the workers can do, told apart
 * from what the daemon around them does.
 *
 *   build/bench/bench_engine load  [--backend cuda] [--n 64] [--clients 64] [--ms 2000]
 *                                  [--devices all] [--streams 4] [--dtype float32] [--kernel auto]
 *                                  [--math fp32] [--batch-max 0] [--fault-inject SPEC]
 *   build/bench/bench_engine split [--backend cuda] [--sizes 8192,16384] [--dtype float32]
 *                                  [--kernel auto] [--math fp32] [--reps 5] [--ways 2]
 *                                  [--cpu-workers 2]
 *
 * load: each of --clients threads keeps one n x n x n product in flight, as a keep-alive
 * connection does (submit, wait for done(), submit again) for --ms; A and B are shared,
 * each client has its own C. Printed: products/s and TFLOP/s; the latency from submit to
 * done() (p50, p99, max, us); products per launch (the engine's coalesced counters); the
 * devices' busy time over the wall (CUDA: 2.00 = two GPUs always busy); and this process's
 * CPU time per product and over the wall, which is mostly the workers' waiting.
 * split: one n x n x n product at a time, whole (one worker) and split into row panels of A:
 * on one GPU as --ways engines (its streams), and one panel per GPU when there are two or
 * more (CPU: --cpu-workers workers sharing the threads). Printed: median and best wall from
 * submit to done(), TFLOP/s, the median run's h2d / kernel / d2h (a split: its longest
 * panel's), the panels' devices, the speed-up over whole, and whether C equals whole's
 * byte for byte (said, not required: docs/API.md "Split products").
 * Every result is checked at sampled elements against a float64 dot product. A benchmark:
 * no timing is asserted. bench/gpu_session.sh's engine, split and multigpu steps hold the
 * cases that bench/results/ reports.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "engine.h"

typedef struct {
    const char *backend, *devices, *kernel, *faults, *sizes;
    gemm_dtype dtype;
    gemm_math math;
    int n, clients, ms, streams, batch_max, reps, ways, cpu_workers;
} opts;

typedef struct {
    pthread_t tid;
    gemm_engine *e;
    gemm_job job;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, failed;
    double done_ms;
    long count, cap;
    double *lat; /* us, the first cap products */
} client;

static atomic_int stop;

static void on_done(gemm_job *j)
{
    client *c = j->user;
    double t = gemm_now_ms();
    pthread_mutex_lock(&c->mu);
    c->done = 1;
    c->done_ms = t;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* Submits c's job and waits for it: wall ms from submit to done(), or -1. */
static double run_one(client *c)
{
    gemm_engine_err err;
    c->done = 0;
    double t0 = gemm_now_ms();
    while (gemm_engine_submit(c->e, &c->job, &err) != 0) {
        if (err.code != GEMM_E_QUEUE_FULL) { /* the queue is full: try again */
            fprintf(stderr, "submit: %s\n", err.message);
            return -1;
        }
    }
    pthread_mutex_lock(&c->mu);
    while (!c->done) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    if (atomic_load(&c->job.state) != GEMM_JOB_DONE) {
        fprintf(stderr, "product failed: %s\n", c->job.err.message);
        return -1;
    }
    return c->done_ms - t0;
}

static double get(gemm_dtype d, const void *p, size_t i)
{
    return d == GEMM_DTYPE_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

/* Max error at 64 sampled elements, relative to sum |a_ip b_pj|, against float64. */
static double sample_err(const gemm_job *j)
{
    uint64_t s = 12345;
    double worst = 0;
    for (int t = 0; t < 64; t++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        size_t i = (size_t)((s >> 33) % j->m), c = (size_t)((s >> 13) % j->n);
        double ref = 0, mag = 0;
        for (size_t p = 0; p < j->k; p++) {
            double x = get(j->dtype, j->a, i * j->k + p) * get(j->dtype, j->b, p * j->n + c);
            ref += x, mag += fabs(x);
        }
        double err = fabs(get(j->dtype, j->c, i * j->n + c) - ref) / (mag > 0 ? mag : 1);
        if (!(err <= worst)) worst = err; /* NaN too */
    }
    return worst;
}

static int wrong(const gemm_job *j)
{
    double tol = j->dtype == GEMM_DTYPE_F64 ? 1e-12 : j->math_used > GEMM_MATH_FP32 ? 1e-2 : 1e-5;
    return !(sample_err(j) <= tol);
}

static void fill(gemm_dtype d, void *p, size_t count, uint64_t s)
{
    for (size_t i = 0; i < count; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        double u = (double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0;
        if (d == GEMM_DTYPE_F32) ((float *)p)[i] = (float)u;
        else ((double *)p)[i] = u;
    }
}

static gemm_engine *open_engine(const opts *o, const char *devices, int ways, int workers)
{
    gemm_engine_config cfg;
    gemm_engine_config_defaults(&cfg);
    snprintf(cfg.backend, sizeof cfg.backend, "%s", o->backend);
    snprintf(cfg.devices, sizeof cfg.devices, "%s", devices);
    snprintf(cfg.fault_inject, sizeof cfg.fault_inject, "%s", o->faults);
    cfg.queue_depth = 4096;
    if (o->streams) cfg.streams_per_device = o->streams;
    if (ways) cfg.streams_per_device = ways > 2 ? ways : 2, cfg.split_ways = ways, cfg.split_min_mnk = 1;
    cfg.cpu_workers = workers;
    cfg.batch_max = o->batch_max;
    gemm_engine_err err;
    gemm_engine *e = gemm_engine_open(&cfg, &err);
    if (!e) fprintf(stderr, "bench_engine: backend %s, devices %s: %s\n", o->backend, devices, err.message);
    return e;
}

static void job_init(gemm_job *j, const opts *o, uint64_t n, void *a, void *b, void *c, client *cl)
{
    memset(j, 0, sizeof *j);
    j->dtype = o->dtype;
    j->m = j->k = j->n = n;
    j->math = o->math;
    snprintf(j->kernel, sizeof j->kernel, "%s", o->kernel);
    j->a = a, j->b = b, j->c = c;
    j->done = on_done;
    j->user = cl;
    pthread_mutex_init(&cl->mu, NULL);
    pthread_cond_init(&cl->cv, NULL);
}

static void *client_main(void *arg)
{
    client *c = arg;
    while (!atomic_load(&stop) && !c->failed) {
        double ms = run_one(c);
        if (ms < 0) c->failed = 1;
        else if (c->count < c->cap) c->lat[c->count++] = ms * 1000.0;
        else c->count++;
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double cpu_seconds(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + (double)u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

static int load(const opts *o)
{
    gemm_engine *e = open_engine(o, o->devices, 0, 0);
    if (!e) return 2;
    size_t n = (size_t)o->n, bytes = n * n * gemm_dtype_size(o->dtype);
    void *a = gemm_engine_host_alloc(e, bytes), *b = gemm_engine_host_alloc(e, bytes);
    client *cl = calloc((size_t)o->clients, sizeof *cl);
    if (!a || !b || !cl) return 2;
    fill(o->dtype, a, n * n, 1);
    fill(o->dtype, b, n * n, 2);
    int bad = 0;
    for (int i = 0; i < o->clients && !bad; i++) { /* each once, one at a time, checked */
        void *c = gemm_engine_host_alloc(e, bytes);
        cl[i].e = e, cl[i].cap = 1 << 16;
        cl[i].lat = malloc((size_t)cl[i].cap * sizeof(double));
        if (!c || !cl[i].lat) return 2;
        memset(c, 0xFF, bytes); /* NaN: an unwritten element fails */
        job_init(&cl[i].job, o, n, a, b, c, &cl[i]);
        bad = run_one(&cl[i]) < 0 || wrong(&cl[i].job);
    }
    if (bad) {
        fprintf(stderr, "bench_engine: the first product is wrong or failed\n");
        return 1;
    }
    gemm_engine_stats s0, s1;
    gemm_engine_get_stats(e, &s0);
    double t0 = gemm_now_ms(), cpu0 = cpu_seconds();
    for (int i = 0; i < o->clients; i++) pthread_create(&cl[i].tid, NULL, client_main, &cl[i]);
    struct timespec d = {o->ms / 1000, (long)(o->ms % 1000) * 1000000L};
    nanosleep(&d, NULL);
    atomic_store(&stop, 1);
    long total = 0, k = 0;
    int failed = 0, wrongs = 0;
    for (int i = 0; i < o->clients; i++) {
        pthread_join(cl[i].tid, NULL);
        total += cl[i].count;
    }
    double wall = (gemm_now_ms() - t0) / 1000.0, cpu = cpu_seconds() - cpu0;
    gemm_engine_get_stats(e, &s1);
    double *all = malloc((size_t)o->clients * (size_t)cl[0].cap * sizeof *all), busy = 0;
    for (int i = 0; all && i < o->clients; i++) {
        long m = cl[i].count < cl[i].cap ? cl[i].count : cl[i].cap;
        memcpy(all + k, cl[i].lat, (size_t)m * sizeof *all);
        k += m;
        failed |= cl[i].failed;
        wrongs += cl[i].count > 0 && wrong(&cl[i].job);
    }
    if (!all) return 2;
    qsort(all, (size_t)k, sizeof *all, cmp_double);
    for (int i = 0; i < s1.ndevices; i++) busy += s1.device_busy_seconds[i] - s0.device_busy_seconds[i];
    uint64_t done = s1.completed - s0.completed, groups = s1.coalesced_launches - s0.coalesced_launches,
             grouped = s1.coalesced_products - s0.coalesced_products;
    gemm_engine_info info;
    gemm_engine_describe(e, &info);
    printf("%s (%d device(s) of %s), %zu^3 %s, kernel %s (ran %s), %d clients, batch_max %d: %.1f products/s, "
           "%.2f TFLOP/s; p50 %.1f us, p99 %.1f us, max %.1f us; %.2f products/launch (%llu groups of %llu); "
           "devices busy %.2f; CPU %.1f us/product, %.0f%% of the wall; %s\n",
           info.backend, info.ndevices, o->devices, n, gemm_dtype_name(o->dtype), o->kernel,
           cl[0].job.kernel_used, o->clients, o->batch_max, (double)total / wall,
           2.0 * (double)n * (double)n * (double)n * (double)total / wall / 1e12, k ? all[k / 2] : 0,
           k ? all[(size_t)((double)(k - 1) * 0.99)] : 0, k ? all[k - 1] : 0,
           done > grouped - groups ? (double)done / (double)(done - grouped + groups) : 0, (unsigned long long)groups,
           (unsigned long long)grouped, busy / wall, total ? 1e6 * cpu / (double)total : 0, 100 * cpu / wall,
           failed ? "A PRODUCT FAILED" : wrongs ? "C WRONG" : "every C right at its samples");
    for (int i = 0; i < o->clients; i++) gemm_engine_host_free(e, cl[i].job.c), free(cl[i].lat);
    gemm_engine_host_free(e, a);
    gemm_engine_host_free(e, b);
    gemm_engine_close(e);
    free(all);
    free(cl);
    return failed || wrongs ? 1 : 0;
}

/* One split configuration: prints its row, returns the median wall (ms) or -1; keeps C. */
static double split_config(const opts *o, const char *label, size_t n, const char *devices, int ways, int workers,
                           void **keep, const void *whole_c, double whole_ms)
{
    gemm_engine *e = open_engine(o, devices, ways, workers);
    if (!e) return -1;
    size_t bytes = n * n * gemm_dtype_size(o->dtype);
    client c = {0};
    c.e = e;
    job_init(&c.job, o, n, gemm_engine_host_alloc(e, bytes), gemm_engine_host_alloc(e, bytes),
             gemm_engine_host_alloc(e, bytes), &c);
    gemm_job *j = &c.job;
    double *t = calloc((size_t)o->reps, sizeof *t), *sorted = calloc((size_t)o->reps, sizeof *t), med = -1;
    gemm_job_timing *tm = calloc((size_t)o->reps, sizeof *tm);
    int ok = j->a && j->b && j->c && t && sorted && tm;
    if (ok) fill(o->dtype, j->a, n * n, 42), fill(o->dtype, j->b, n * n, 43);
    ok = ok && run_one(&c) >= 0; /* warm-up: buffers, pinning, cuBLAS */
    for (int r = 0; ok && r < o->reps; r++) {
        t[r] = sorted[r] = run_one(&c);
        tm[r] = j->timing;
        ok = t[r] >= 0;
    }
    if (ok) {
        qsort(sorted, (size_t)o->reps, sizeof *sorted, cmp_double);
        med = sorted[o->reps / 2];
        int mi = 0;
        while (t[mi] != med) mi++;
        char devs[256] = "";
        size_t off = 0;
        for (int p = 0; p < (j->split_panels ? j->split_panels : 1) && off < sizeof devs; p++) {
            const char *dv = j->split_panels ? j->split[p].device : j->device;
            off += (size_t)snprintf(devs + off, sizeof devs - off, "%s%.*s/s%d", p ? "," : "", (int)strcspn(dv, " "),
                                    dv, j->split_panels ? j->split[p].stream : j->stream);
        }
        printf("| %zu | %s | %s | %d | %s | %.1f | %.1f | %.2f | %.2f | %.2f | %.2f | %.2fx | %.1e | %s |\n", n, label,
               j->kernel_used, j->split_panels ? j->split_panels : 1, devs, med, sorted[0],
               2.0 * (double)n * (double)n * (double)n / (med * 1e9), tm[mi].h2d_ms, tm[mi].kernel_ms, tm[mi].d2h_ms,
               whole_ms > 0 ? whole_ms / med : 1.0, sample_err(j),
               whole_c ? (memcmp(j->c, whole_c, bytes) == 0 ? "equal" : "differs") : "-");
        if (keep && (*keep = malloc(bytes))) memcpy(*keep, j->c, bytes);
    }
    free(t), free(sorted), free(tm);
    gemm_engine_host_free(e, j->a);
    gemm_engine_host_free(e, j->b);
    gemm_engine_host_free(e, j->c);
    gemm_engine_close(e);
    return med;
}

static int split(const opts *o)
{
    int cpu = strcmp(o->backend, "cpu") == 0;
    gemm_engine *probe = open_engine(o, "all", 0, 0);
    if (!probe) return 2;
    gemm_engine_info info;
    gemm_engine_describe(probe, &info);
    gemm_engine_close(probe);
    printf("# backend %s, %s, kernel %s, math %s, %d reps after a warm-up, %d way(s) on one device, %d device(s)\n",
           info.backend, gemm_dtype_name(o->dtype), o->kernel, gemm_math_name(o->math), o->reps, o->ways,
           info.ndevices);
    printf("| n | config | kernel | panels | device/stream per panel | median ms | best ms | TFLOP/s | h2d ms "
           "| kernel ms | d2h ms | speed-up (median) | max sampled rel err | C vs whole |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    char list[256];
    snprintf(list, sizeof list, "%s", o->sizes);
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        size_t n = strtoull(tok, NULL, 10);
        void *whole_c = NULL;
        double w = split_config(o, "whole", n, cpu ? "all" : "0", 1, 1, &whole_c, NULL, 0);
        split_config(o, cpu ? "split" : "one-dev", n, cpu ? "all" : "0", o->ways, cpu ? o->cpu_workers : 1, NULL,
                     whole_c, w);
        if (!cpu && info.ndevices >= 2) split_config(o, "all-dev", n, "all", 0, 1, NULL, whole_c, w);
        free(whole_c);
    }
    return 0;
}

int main(int argc, char **argv)
{
    opts o = {"cuda", "all", "auto", "", "8192,16384", GEMM_DTYPE_F32, GEMM_MATH_DEFAULT,
              64, 64, 2000, 0, 0, 5, 2, 2};
    const char *mode = argc > 1 ? argv[1] : "";
    int bad = strcmp(mode, "load") != 0 && strcmp(mode, "split") != 0;
    for (int i = 2; i + 1 < argc && !bad; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--backend")) o.backend = v;
        else if (!strcmp(a, "--devices")) o.devices = v;
        else if (!strcmp(a, "--kernel")) o.kernel = v;
        else if (!strcmp(a, "--fault-inject")) o.faults = v;
        else if (!strcmp(a, "--sizes")) o.sizes = v;
        else if (!strcmp(a, "--dtype")) bad = gemm_dtype_from_name(v, &o.dtype) != 0 || gemm_dtype_size(o.dtype) == 2 ||
                                              o.dtype == GEMM_DTYPE_I32;
        else if (!strcmp(a, "--math")) bad = gemm_math_from_name(v, &o.math) != 0;
        else if (!strcmp(a, "--n")) o.n = atoi(v);
        else if (!strcmp(a, "--clients")) o.clients = atoi(v);
        else if (!strcmp(a, "--ms")) o.ms = atoi(v);
        else if (!strcmp(a, "--streams")) o.streams = atoi(v);
        else if (!strcmp(a, "--batch-max")) o.batch_max = atoi(v);
        else if (!strcmp(a, "--reps")) o.reps = atoi(v);
        else if (!strcmp(a, "--ways")) o.ways = atoi(v);
        else if (!strcmp(a, "--cpu-workers")) o.cpu_workers = atoi(v);
        else bad = 1;
    }
    if (bad || argc % 2 || o.n < 1 || o.n > 65536 || o.clients < 1 || o.clients > 1024 || o.ms < 100 || o.reps < 1 ||
        o.ways < 2) {
        fprintf(stderr, "usage: bench_engine load|split [options] (see the head of bench/bench_engine.c)\n");
        return 2;
    }
    return mode[0] == 'l' ? load(&o) : split(&o);
}
