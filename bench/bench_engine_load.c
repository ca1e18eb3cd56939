/*
 * bench_engine_load.c - the engine alone under the load of many clients: products/s of
 * small products with no HTTP in front, so the workers' own ceiling can be told apart
 * from the daemon's.
 *
 *   build/bench/bench_engine_load [--backend cuda] [--n 64] [--clients 64] [--ms 2000]
 *                                 [--streams 4] [--kernel auto] [--batch-max 0]
 *                                 [--worker-spin-us 100] [--wait-spin-us 50]
 *
 * Each of --clients threads keeps one product of n x n x n float32 in flight (as one
 * keep-alive connection does): submit, wait for its done(), submit again. Reported:
 * products/s, the latency from submit to done() (p50, p99, in us), the coalesced launches
 * and the products in them (the engine's counters), and products per launch. Every
 * client's last C is compared with a float64 host product (inputs are multiples of 1/8
 * in [-1, 1], so fp32 sums are exact: the comparison is for equality). No assertion on
 * time: a benchmark, its numbers go to bench/results/.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

struct client {
    pthread_t tid;
    gemm_engine *e;
    gemm_job job;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    long count;
    double *lat; /* latencies, us (up to cap) */
    long cap;
    int failed;
};

static int N = 64;
static atomic_int stop;

static void on_done(gemm_job *j)
{
    struct client *c = j->user;
    pthread_mutex_lock(&c->mu);
    c->done = 1;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void *client_main(void *arg)
{
    struct client *c = arg;
    while (!atomic_load(&stop)) {
        gemm_job *j = &c->job;
        gemm_engine_err err;
        j->err.code = GEMM_E_NONE;
        c->done = 0;
        double t0 = gemm_now_ms();
        if (gemm_engine_submit(c->e, j, &err) != 0) {
            if (err.code == GEMM_E_QUEUE_FULL) continue; /* the queue is full: try again */
            fprintf(stderr, "submit: %s\n", err.message);
            c->failed = 1;
            break;
        }
        pthread_mutex_lock(&c->mu);
        while (!c->done) pthread_cond_wait(&c->cv, &c->mu);
        pthread_mutex_unlock(&c->mu);
        if (atomic_load(&j->state) != GEMM_JOB_DONE) {
            fprintf(stderr, "product failed: %s\n", j->err.message);
            c->failed = 1;
            break;
        }
        if (c->count < c->cap) c->lat[c->count] = (gemm_now_ms() - t0) * 1000.0;
        c->count++;
    }
    return NULL;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int check(const gemm_job *j)
{
    const float *a = j->a, *b = j->b, *c = j->c;
    for (int r = 0; r < N; r++)
        for (int col = 0; col < N; col++) {
            double s = 0;
            for (int p = 0; p < N; p++) s += (double)a[r * N + p] * b[p * N + col];
            if ((double)c[r * N + col] != s) return 0;
        }
    return 1;
}

int main(int argc, char **argv)
{
    int clients = 64, ms = 2000;
    gemm_engine_config cfg;
    gemm_engine_config_defaults(&cfg);
    snprintf(cfg.backend, sizeof cfg.backend, "cuda");
    cfg.queue_depth = 4096;
    char kernel[16] = "auto";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) goto usage;
        if (!strcmp(a, "--backend")) snprintf(cfg.backend, sizeof cfg.backend, "%s", v);
        else if (!strcmp(a, "--n")) N = atoi(v);
        else if (!strcmp(a, "--clients")) clients = atoi(v);
        else if (!strcmp(a, "--ms")) ms = atoi(v);
        else if (!strcmp(a, "--streams")) cfg.streams_per_device = atoi(v);
        else if (!strcmp(a, "--kernel")) snprintf(kernel, sizeof kernel, "%s", v);
        else if (!strcmp(a, "--batch-max")) cfg.batch_max = atoi(v);
        else if (!strcmp(a, "--worker-spin-us")) cfg.worker_spin_us = atoi(v);
        else if (!strcmp(a, "--wait-spin-us")) cfg.wait_spin_us = atoi(v);
        else goto usage;
        i++;
    }
    if (N < 1 || N > 512 || clients < 1 || clients > 1024 || ms < 100) goto usage;

    gemm_engine_err err;
    gemm_engine *e = gemm_engine_open(&cfg, &err);
    if (!e) {
        fprintf(stderr, "open: %s\n", err.message);
        return 2;
    }
    struct client *cl = calloc((size_t)clients, sizeof *cl);
    size_t bytes = (size_t)N * N * sizeof(float);
    for (int i = 0; i < clients; i++) {
        struct client *c = &cl[i];
        c->e = e;
        pthread_mutex_init(&c->mu, NULL);
        pthread_cond_init(&c->cv, NULL);
        c->cap = 1 << 20;
        c->lat = malloc((size_t)c->cap * sizeof *c->lat);
        gemm_job *j = &c->job;
        j->dtype = GEMM_DTYPE_F32;
        j->m = j->k = j->n = (uint64_t)N;
        snprintf(j->kernel, sizeof j->kernel, "%s", kernel);
        j->a = gemm_engine_host_alloc(e, bytes);
        j->b = gemm_engine_host_alloc(e, bytes);
        j->c = gemm_engine_host_alloc(e, bytes);
        if (!c->lat || !j->a || !j->b || !j->c) {
            fprintf(stderr, "out of memory\n");
            return 2;
        }
        for (size_t x = 0; x < (size_t)N * N; x++) {
            ((float *)j->a)[x] = (float)((int)((x * 7 + (size_t)i) % 17) - 8) / 8.0f;
            ((float *)j->b)[x] = (float)((int)((x * 5 + 3 * (size_t)i) % 17) - 8) / 8.0f;
        }
        memset(j->c, 0xFF, bytes); /* poison */
        j->done = on_done;
        j->user = c;
    }
    /* warm-up: every client once, one at a time, and checked */
    int bad = 0;
    for (int i = 0; i < clients && !bad; i++) {
        struct client *c = &cl[i];
        c->cap = 1;
        atomic_store(&stop, 1);
        c->done = 0;
        if (gemm_engine_submit(e, &c->job, &err) != 0) {
            fprintf(stderr, "submit: %s\n", err.message);
            return 2;
        }
        pthread_mutex_lock(&c->mu);
        while (!c->done) pthread_cond_wait(&c->cv, &c->mu);
        pthread_mutex_unlock(&c->mu);
        bad = atomic_load(&c->job.state) != GEMM_JOB_DONE || !check(&c->job);
        memset(c->job.c, 0xFF, bytes);
        c->cap = 1 << 20;
    }
    if (bad) {
        fprintf(stderr, "the warm-up product is wrong or failed\n");
        return 1;
    }
    gemm_engine_stats s0, s1;
    gemm_engine_get_stats(e, &s0);
    atomic_store(&stop, 0);
    double t0 = gemm_now_ms();
    for (int i = 0; i < clients; i++) pthread_create(&cl[i].tid, NULL, client_main, &cl[i]);
    struct timespec d = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&d, NULL);
    atomic_store(&stop, 1);
    long total = 0, nlat = 0;
    for (int i = 0; i < clients; i++) {
        pthread_join(cl[i].tid, NULL);
        total += cl[i].count;
        nlat += cl[i].count < cl[i].cap ? cl[i].count : cl[i].cap;
    }
    double wall = gemm_now_ms() - t0;
    gemm_engine_get_stats(e, &s1);
    double *all = malloc((size_t)(nlat > 0 ? nlat : 1) * sizeof *all);
    long k = 0;
    int wrong = 0, failed = 0;
    for (int i = 0; i < clients; i++) {
        long m = cl[i].count < cl[i].cap ? cl[i].count : cl[i].cap;
        memcpy(all + k, cl[i].lat, (size_t)m * sizeof *all);
        k += m;
        failed |= cl[i].failed;
        if (cl[i].count > 0 && !check(&cl[i].job)) wrong++;
    }
    qsort(all, (size_t)k, sizeof *all, cmp_d);
    unsigned long long launches = (s1.completed - s0.completed) - (s1.coalesced_products - s0.coalesced_products) + (s1.coalesced_launches - s0.coalesced_launches);
    gemm_engine_info info;
    gemm_engine_describe(e, &info);
    printf("%s, %d^3 float32 kernel %s, %d clients, %d streams, batch_max %d: %.0f products/s, p50 %.1f us, "
           "p99 %.1f us, %.2f products/launch (%llu groups of %llu products), %s\n",
           info.backend, N, kernel, clients, cfg.streams_per_device, cfg.batch_max, (double)total / (wall / 1000.0),
           k ? all[k / 2] : 0, k ? all[(size_t)((k - 1) * 0.99)] : 0,
           launches ? (double)(s1.completed - s0.completed) / (double)launches : 0,
           (unsigned long long)(s1.coalesced_launches - s0.coalesced_launches), (unsigned long long)(s1.coalesced_products - s0.coalesced_products),
           failed ? "A PRODUCT FAILED" : wrong ? "C WRONG" : "every C equal to the float64 product");
    for (int i = 0; i < clients; i++) {
        gemm_engine_host_free(e, cl[i].job.a);
        gemm_engine_host_free(e, cl[i].job.b);
        gemm_engine_host_free(e, cl[i].job.c);
        free(cl[i].lat);
    }
    gemm_engine_close(e);
    free(all);
    free(cl);
    return failed || wrong ? 1 : 0;
usage:
    fprintf(stderr, "usage: %s [--backend cuda] [--n 64] [--clients 64] [--ms 2000] [--streams 4] "
            "[--kernel auto] [--batch-max 0] [--worker-spin-us 100] [--wait-spin-us 50]\n", argv[0]);
    return 2;
}
