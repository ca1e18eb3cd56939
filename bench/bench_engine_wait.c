/*
 * bench_engine_wait.c - what a CUDA worker's wait for its product costs: latency and CPU.
 *
 *   build/bench/bench_engine_wait [--n 64] [--products 2000] [--spins 0,20,50,200,1000000]
 *                                 [--long-ms 500] [--long-products 4]
 *
 * For each wait_spin_us in --spins (the engine polls the product's last event this long,
 * then sleeps on it; 1000000 stands for the old behaviour, a worker polling until its
 * product is done), an engine with one stream on device 0:
 *  1. runs --products products of n x n x n float32 (kernel auto) one after another, and
 *     reports the latency from submit to done() (p50, p99, max, in us) and the worker's CPU
 *     time per product (CLOCK_THREAD_CPUTIME_ID, read in done(), which runs on the worker);
 *  2. runs --long-products products whose kernel stage waits --long-ms on the device
 *     (fault_inject gpu_delay_ms) and reports the worker's CPU time as a share of the wall.
 * The first product of each engine is checked against a float64 host product (every
 * element). No timing assertion: a benchmark, its numbers go to bench/results/.
 */
#include <stdio.h>

#ifndef GEMMD_HAVE_CUDA
int main(void)
{
    fprintf(stderr, "bench_engine_wait: this build has no CUDA support (built with CUDA=0)\n");
    return 2;
}
#else
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>

#include "engine.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int done_flag;
static double done_wall_ms, done_cpu_ms;

static double thread_cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void on_done(gemm_job *j)
{
    (void)j;
    double cpu = thread_cpu_ms(), wall = gemm_now_ms();
    pthread_mutex_lock(&mu);
    done_cpu_ms = cpu;
    done_wall_ms = wall;
    done_flag = 1;
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
}

/* Submits and waits; returns 0 when the product is DONE. */
static int run(gemm_engine *e, gemm_job *j, double *t_sub)
{
    gemm_engine_err err;
    pthread_mutex_lock(&mu);
    done_flag = 0;
    pthread_mutex_unlock(&mu);
    *t_sub = gemm_now_ms();
    if (gemm_engine_submit(e, j, &err) != 0) {
        fprintf(stderr, "submit: %s\n", err.message);
        return -1;
    }
    pthread_mutex_lock(&mu);
    while (!done_flag) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    if (atomic_load(&j->state) != GEMM_JOB_DONE) {
        fprintf(stderr, "product failed: %s\n", j->err.message);
        return -1;
    }
    return 0;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static gemm_engine *open_engine(int spin_us, const char *faults)
{
    gemm_engine_config cfg;
    gemm_engine_config_defaults(&cfg);
    snprintf(cfg.backend, sizeof cfg.backend, "cuda");
    snprintf(cfg.devices, sizeof cfg.devices, "0");
    cfg.streams_per_device = 1;
    cfg.wait_spin_us = spin_us;
    snprintf(cfg.fault_inject, sizeof cfg.fault_inject, "%s", faults);
    gemm_engine_err err;
    gemm_engine *e = gemm_engine_open(&cfg, &err);
    if (!e) fprintf(stderr, "open: %s\n", err.message);
    return e;
}

/* Every element against a float64 product of the same inputs. */
static int check(const gemm_job *j)
{
    const float *a = j->a, *b = j->b, *c = j->c;
    int n = (int)j->m;
    double worst = 0;
    for (int r = 0; r < n; r++)
        for (int col = 0; col < n; col++) {
            double s = 0, mag = 0;
            for (int p = 0; p < n; p++) {
                s += (double)a[r * n + p] * b[p * n + col];
                mag += fabs((double)a[r * n + p] * b[p * n + col]);
            }
            double err = fabs(c[r * n + col] - s) / (mag > 0 ? mag : 1);
            if (!(err <= worst)) worst = err; /* NaN too */
        }
    return worst < 1e-5;
}

int main(int argc, char **argv)
{
    int n = 64, products = 2000, long_ms = 500, long_products = 4;
    char spins_arg[256] = "0,20,50,200,1000000";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--n") && i + 1 < argc) n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--products") && i + 1 < argc) products = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--spins") && i + 1 < argc) snprintf(spins_arg, sizeof spins_arg, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--long-ms") && i + 1 < argc) long_ms = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--long-products") && i + 1 < argc) long_products = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--n 64] [--products 2000] [--spins 0,20,50,200,1000000] "
                    "[--long-ms 500] [--long-products 4]\n", argv[0]);
            return 2;
        }
    }
    if (n < 1 || products < 10 || long_ms < 1 || long_products < 2) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    struct cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) {
        fprintf(stderr, "no CUDA device\n");
        return 2;
    }
    printf("device 0: %s; %d products of %d^3 float32 one at a time, then %d products with a %d ms kernel\n",
           p.name, products, n, long_products, long_ms);
    printf("%10s %9s %9s %9s %14s %18s\n", "spin_us", "p50_us", "p99_us", "max_us", "cpu_us/product",
           "cpu_%_long_kernel");

    double *lat = malloc((size_t)products * sizeof *lat);
    int failures = 0;
    char *save = NULL;
    for (char *tok = strtok_r(spins_arg, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int spin = atoi(tok);
        gemm_engine *e = open_engine(spin, "");
        if (!e || !lat) return 1;
        gemm_job j;
        memset(&j, 0, sizeof j);
        size_t bytes = (size_t)n * n * sizeof(float);
        j.dtype = GEMM_DTYPE_F32;
        j.m = j.k = j.n = (uint64_t)n;
        j.a = gemm_engine_host_alloc(e, bytes);
        j.b = gemm_engine_host_alloc(e, bytes);
        j.c = gemm_engine_host_alloc(e, bytes);
        j.done = on_done;
        for (size_t i = 0; i < (size_t)n * n; i++) {
            ((float *)j.a)[i] = (float)((i * 7 % 13) - 6) / 8.0f;
            ((float *)j.b)[i] = (float)((i * 5 % 11) - 5) / 8.0f;
        }
        memset(j.c, 0xFF, bytes);
        double t_sub, cpu_prev = 0, cpu_sum = 0;
        int ok = run(e, &j, &t_sub) == 0 && check(&j); /* warm-up, checked */
        if (!ok) {
            fprintf(stderr, "spin %d: the first product is wrong or failed\n", spin);
            failures++;
        }
        cpu_prev = done_cpu_ms;
        for (int i = 0; i < products && ok; i++) {
            if (run(e, &j, &t_sub) != 0) { failures++; ok = 0; break; }
            lat[i] = (done_wall_ms - t_sub) * 1000.0;
            cpu_sum += done_cpu_ms - cpu_prev;
            cpu_prev = done_cpu_ms;
        }
        gemm_engine_host_free(e, j.a);
        gemm_engine_host_free(e, j.b);
        gemm_engine_host_free(e, j.c);
        gemm_engine_close(e);
        if (!ok) continue;
        qsort(lat, (size_t)products, sizeof *lat, cmp_d);

        /* long kernels: CPU over wall between the done() of the first and of the last */
        char faults[64];
        snprintf(faults, sizeof faults, "gpu_delay_ms:%d", long_ms);
        e = open_engine(spin, faults);
        double share = NAN;
        if (e) {
            memset(&j, 0, sizeof j);
            j.dtype = GEMM_DTYPE_F32;
            j.m = j.k = j.n = 64;
            j.a = gemm_engine_host_alloc(e, 64 * 64 * 4);
            j.b = gemm_engine_host_alloc(e, 64 * 64 * 4);
            j.c = gemm_engine_host_alloc(e, 64 * 64 * 4);
            memset(j.a, 0, 64 * 64 * 4);
            memset(j.b, 0, 64 * 64 * 4);
            j.done = on_done;
            double cpu0 = 0, wall0 = 0;
            int lok = 1;
            for (int i = 0; i < long_products && lok; i++) {
                lok = run(e, &j, &t_sub) == 0;
                if (i == 0) {
                    cpu0 = done_cpu_ms;
                    wall0 = done_wall_ms;
                }
            }
            if (lok) share = 100.0 * (done_cpu_ms - cpu0) / (done_wall_ms - wall0);
            else failures++;
            gemm_engine_host_free(e, j.a);
            gemm_engine_host_free(e, j.b);
            gemm_engine_host_free(e, j.c);
            gemm_engine_close(e);
        }
        printf("%10d %9.1f %9.1f %9.1f %14.1f %18.2f\n", spin, lat[products / 2],
               lat[(size_t)((products - 1) * 0.99)], lat[products - 1], 1000.0 * cpu_sum / products, share);
        fflush(stdout);
    }
    free(lat);
    return failures ? 1 : 0;
}
#endif
