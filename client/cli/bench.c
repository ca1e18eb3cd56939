/*
 * bench.c - `gemm bench` (docs/CLIENT.md): C threads, each with its own client and C buffer,
 * send the same random product R times, after a first answer was checked.
 */
#include "cli.h"
#include "gemm_half.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const gemm_cli_opts *o;
    gemm_request req;     /* a, b shared; c per thread */
    double *lat_ms;       /* repeat entries each: the client's time, */
    double *server_ms;    /* the Server-Timing total */
    double *kernel_ms;    /* and kernel */
    int failed;
    gemm_client_error err;
    pthread_barrier_t *start; /* after the warm-up, every thread and main meet here */
    pthread_t tid;
} worker;

static void *run_worker(void *arg)
{
    worker *w = arg;
    gemm_client *c = gemm_cli_client(w->o, &gemm_cli_bar, &w->err); /* not enabled: Ctrl-C only */
    gemm_timing t;
    w->failed = !c;
    for (int i = 0; c && !w->failed && i < w->o->warmup && !gemm_cli_interrupted; i++)
        w->failed = gemm_client_multiply(c, &w->req, &t, &w->err) != 0;
    pthread_barrier_wait(w->start);
    for (int j = 0; c && !w->failed && j < w->o->repeat && !gemm_cli_interrupted; j++) {
        double t0 = gemm_now_ms();
        w->failed = gemm_client_multiply(c, &w->req, &t, &w->err) != 0;
        w->lat_ms[j] = gemm_now_ms() - t0;
        w->server_ms[j] = t.total_ms;
        w->kernel_ms[j] = t.kernel_ms;
    }
    gemm_client_free(c);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile p (0 < p <= 100) of a sorted array of n >= 1 (--repeat and
 * --concurrency are >= 1): the rank is from 1 to n. */
static double pct(const double *v, size_t n, double p)
{
    return v[(size_t)ceil(p / 100.0 * (double)n) - 1];
}

static double median_of(double *v, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (v[i] >= 0) v[k++] = v[i];
    if (k == 0) return -1;
    qsort(v, k, sizeof *v, cmp_double);
    return k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void fill_random(void *p, size_t count, gemm_dtype d, uint64_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < count; i++) {
        /* small integers: exact in every dtype, so the check below can be tight */
        int v = (int)(rng_next(&s) % 17) - 8;
        switch (d) {
        case GEMM_DTYPE_F32: ((float *)p)[i] = (float)v; break;
        case GEMM_DTYPE_F64: ((double *)p)[i] = (double)v; break;
        case GEMM_DTYPE_F16:
        case GEMM_DTYPE_BF16: ((uint16_t *)p)[i] = gemm_f64_to_half(d, (double)v); break;
        default: ((int32_t *)p)[i] = v; break;
        }
    }
}

static double elem(const void *p, size_t i, gemm_dtype d)
{
    switch (d) {
    case GEMM_DTYPE_F32: return ((const float *)p)[i];
    case GEMM_DTYPE_F64: return ((const double *)p)[i];
    case GEMM_DTYPE_F16:
    case GEMM_DTYPE_BF16: return gemm_half_to_f32(d, ((const uint16_t *)p)[i]);
    default: return ((const int32_t *)p)[i];
    }
}

/* Checks 256 sampled elements of C against float64 dot products. */
static int verify(const gemm_request *r, const void *c, char *msg, size_t cap)
{
    uint64_t s = 12345;
    for (int t = 0; t < 256; t++) {
        uint64_t i = rng_next(&s) % r->m, j = rng_next(&s) % r->n;
        double ref = 0;
        for (uint64_t q = 0; q < r->k; q++)
            ref += elem(r->a, (size_t)(i * r->k + q), r->dtype) * elem(r->b, (size_t)(q * r->n + j), r->dtype);
        gemm_dtype cd = gemm_request_c_dtype(r);
        double got = elem(c, (size_t)(i * r->n + j), cd);
        /* inputs are integers in [-8, 8], exact in every dtype: every partial sum is exact
         * in float64 and int32; float32 is exact while |sums| < 2^24, which holds for
         * k < 2^24/64; a half C is rounded once (8 or 11 significant bits) */
        double tol = r->dtype == GEMM_DTYPE_F32 && r->math > GEMM_MATH_FP32 ? 1e-2 * fabs(ref) + 1
                     : cd == GEMM_DTYPE_BF16 ? 1e-2 * fabs(ref)
                     : cd == GEMM_DTYPE_F16 ? 1e-3 * fabs(ref)
                                            : 1e-9 * fabs(ref);
        if (fabs(got - ref) > tol) {
            snprintf(msg, cap, "C[%llu][%llu] is %.17g, expected %.17g", (unsigned long long)i,
                     (unsigned long long)j, got, ref);
            return -1;
        }
    }
    return 0;
}

/* The check, the timed requests and their report, once ws and lat (latencies, server totals
 * and kernels, concurrency x repeat of each) are ready. Returns the exit status. */
static int run_bench(const gemm_cli_opts *o, worker *ws, double *lat, double payload)
{
    const gemm_request *req = &ws[0].req;
    int nt = o->concurrency, rep = o->repeat;
    size_t total = (size_t)nt * (size_t)rep;
    /* correctness first: one product, checked */
    gemm_client_error err;
    gemm_client *c = gemm_cli_client(o, &gemm_cli_bar, &err);
    gemm_timing t;
    int r = c ? gemm_client_multiply(c, req, &t, &err) : -1;
    gemm_client_free(c);
    char msg[256];
    if (r != 0) return gemm_cli_interrupted ? GEMM_EXIT_INTERRUPTED : gemm_cli_fail(&err, "bench");
    if (verify(req, req->c, msg, sizeof msg) != 0)
        return gemm_cli_say(GEMM_EXIT_SERVER, "bench: wrong answer from the server (kernel %s): %s", t.kernel, msg);

    pthread_barrier_t barrier;
    if (pthread_barrier_init(&barrier, NULL, (unsigned)nt + 1) != 0)
        return gemm_cli_say(GEMM_EXIT_IO, "bench: cannot make a barrier");
    for (int i = 0; i < nt; i++) {
        ws[i].start = &barrier;
        if (pthread_create(&ws[i].tid, NULL, run_worker, &ws[i]) != 0) {
            fprintf(stderr, "gemm: bench: cannot start thread %d of %d\n", i + 1, nt);
            exit(GEMM_EXIT_IO); /* the others wait at the barrier for ever */
        }
    }
    pthread_barrier_wait(&barrier);
    double t0 = gemm_now_ms();
    for (int i = 0; i < nt; i++) pthread_join(ws[i].tid, NULL);
    double window_s = (gemm_now_ms() - t0) / 1000.0; /* from the end of the warm-up to the last answer */
    pthread_barrier_destroy(&barrier);
    if (gemm_cli_interrupted) return gemm_cli_say(GEMM_EXIT_INTERRUPTED, "bench interrupted");
    for (int i = 0; i < nt; i++)
        if (ws[i].failed) return gemm_cli_fail(&ws[i].err, "bench");
    double sum_lat = 0, *srv = lat + total, *ker = srv + total;
    for (size_t i = 0; i < total; i++) sum_lat += lat[i];
    qsort(lat, total, sizeof *lat, cmp_double);
    double flops = 2.0 * (double)req->m * (double)req->n * (double)req->k;
    double med_srv = median_of(srv, total), med_ker = median_of(ker, total);
    printf("gemm bench: %llux%llux%llu %s, kernel %s, %d thread%s x %d requests (+%d warm-up each), server %s\n",
           (unsigned long long)req->m, (unsigned long long)req->k, (unsigned long long)req->n,
           gemm_dtype_name(req->dtype), req->kernel ? req->kernel : "auto", nt, nt == 1 ? "" : "s", rep, o->warmup,
           o->server);
    printf("  latency ms     min %.3f  median %.3f  p99 %.3f  mean %.3f  max %.3f\n", lat[0],
           pct(lat, total, 50), pct(lat, total, 99), sum_lat / (double)total, lat[total - 1]);
    if (med_srv >= 0)
        printf("  server ms      median total %.3f  median kernel %.3f  (client-side share of the median: %.3f)\n",
               med_srv, med_ker, pct(lat, total, 50) - med_srv);
    printf("  throughput     %.2f requests/s  %.2f GFLOP/s  %.1f MB/s payload (A+B+C = %.1f MB per request)\n",
           (double)total / window_s, flops * (double)total / window_s / 1e9, payload * (double)total / window_s / 1e6,
           payload / 1e6);
    return GEMM_EXIT_OK;
}

int gemm_cli_bench(const gemm_cli_opts *o)
{
    gemm_request req = GEMM_REQUEST_INIT;
    gemm_dtype out_dtype = GEMM_DTYPE_INVALID;
    int rc = gemm_cli_request_opts(o, &req.dtype, &out_dtype, &req);
    if (rc != 0 || (rc = gemm_cli_out_half(out_dtype, &req)) != 0) return rc;
    req.m = o->m ? o->m : o->size;
    req.k = o->k ? o->k : o->size;
    req.n = o->n ? o->n : o->size;
    size_t ab, bb, cb;
    if (!gemm_matrix_bytes(req.m, req.k, req.dtype, &ab) || !gemm_matrix_bytes(req.k, req.n, req.dtype, &bb) ||
        !gemm_matrix_bytes(req.m, req.n, gemm_request_c_dtype(&req), &cb))
        return gemm_cli_say(GEMM_EXIT_USAGE, "the shape is too large");
    int nt = o->concurrency, rep = o->repeat;
    size_t total = (size_t)nt * (size_t)rep;
    void *A = malloc(ab), *B = malloc(bb);
    worker *ws = calloc((size_t)nt, sizeof *ws);
    double *lat = calloc(3 * total, sizeof *lat), *srv = lat ? lat + total : NULL, *ker = lat ? srv + total : NULL;
    req.a = A;
    req.b = B;
    for (int i = 0; ws && i < nt; i++) {
        ws[i] = (worker){.o = o, .req = req, .lat_ms = lat + (size_t)i * rep, .server_ms = srv + (size_t)i * rep,
                         .kernel_ms = ker + (size_t)i * rep};
        if (!(ws[i].req.c = malloc(cb))) break;
    }
    if (!A || !B || !ws || !lat || !ws[nt - 1].req.c) {
        rc = gemm_cli_say(GEMM_EXIT_IO, "out of memory for the matrices");
    } else {
        fill_random(A, ab / gemm_dtype_size(req.dtype), req.dtype, 1);
        fill_random(B, bb / gemm_dtype_size(req.dtype), req.dtype, 2);
        rc = run_bench(o, ws, lat, (double)(ab + bb + cb));
    }
    for (int i = 0; ws && i < nt; i++) free(ws[i].req.c);
    free(ws);
    free(lat);
    free(A);
    free(B);
    return rc;
}
