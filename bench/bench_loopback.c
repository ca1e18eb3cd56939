/*
 * bench_loopback.c - how fast the raw-binary HTTP path of gemmd moves bytes, with the
 * product made negligible: shapes that are almost all upload (m x k times k x 1) or
 * almost all download (m x 1 times 1 x n), plus the square float32 product for contrast.
 *
 *   build/bench/bench_loopback [--gemmd bin/gemmd | --url http://127.0.0.1:8080]
 *                              [--sizes 1024,2048,4096] [--repeats 7] [--clients 1]
 *
 * --clients C runs C client threads at once, each with its own connection, each sending
 * `repeats` requests; the aggregate GB/s is all payload bytes over the wall time of the
 * whole run. With one client the median request is reported as well.
 * Every answer's size and a sample of its values are checked.
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>

#include "bench_http.h"

enum { MAX_SIZES = 8, MAX_CLIENTS = 16 };

typedef struct {
    const char *name;
    size_t m, k, n;
} shape;

typedef struct {
    const char *url;
    shape sh;
    const float *ab;    /* A then B */
    int repeats;
    double *walls;      /* repeats entries */
    double *srv;        /* Server-Timing total per request */
    double *recv;       /* Server-Timing recv (headers to last body byte) per request */
    int failed;
    pthread_t tid;
} client;

/* C[i][j] = sum_p A[i][p] B[p][j] in double, for one sampled element. */
static double ref_elem(const shape *s, const float *ab, size_t i, size_t j)
{
    const float *A = ab, *B = ab + s->m * s->k;
    double acc = 0;
    for (size_t p = 0; p < s->k; p++) acc += (double)A[i * s->k + p] * (double)B[p * s->n + j];
    return acc;
}

static void *client_main(void *arg)
{
    client *cl = arg;
    struct curl_slist *hdrs = NULL;
    CURL *c = bench_curl(&hdrs);
    answer ans = {{NULL, 0, 0}, -1, -1, -1, 0};
    const shape *s = &cl->sh;
    size_t ab_bytes = (s->m * s->k + s->k * s->n) * sizeof(float);
    size_t c_bytes = s->m * s->n * sizeof(float);
    for (int r = -1; c && r < cl->repeats; r++) {
        double wall = post_matmul(c, cl->url, cl->ab, ab_bytes, s->m, s->k, s->n, &ans);
        if (wall < 0 || ans.status != 200 || ans.body.len != c_bytes) {
            fprintf(stderr, "bench_loopback: %s: status %ld, %zu bytes (expected %zu)\n", s->name,
                    ans.status, ans.body.len, c_bytes);
            cl->failed = 1;
            break;
        }
        if (r == -1) { /* check a sample of the answer */
            for (int t = 0; t < 64; t++) {
                size_t i = (size_t)t * 7919 % s->m, j = (size_t)t * 104729 % s->n;
                double want = ref_elem(s, cl->ab, i, j);
                float got; /* the body is bytes: copy, not a cast (alignment, aliasing) */
                memcpy(&got, ans.body.data + (i * s->n + j) * sizeof got, sizeof got);
                if (!(fabs((double)got - want) <= 1e-5 * (double)s->k + 1e-6)) {
                    fprintf(stderr, "bench_loopback: %s: C[%zu][%zu] = %g, expected %g\n", s->name,
                            i, j, (double)got, want);
                    cl->failed = 1;
                    break;
                }
            }
            if (cl->failed) break;
            continue;
        }
        cl->walls[r] = wall;
        cl->srv[r] = ans.total_ms;
        cl->recv[r] = ans.recv_ms;
    }
    if (!c) cl->failed = 1;
    free(ans.body.data);
    curl_slist_free_all(hdrs);
    if (c) curl_easy_cleanup(c);
    return NULL;
}

int main(int argc, char **argv)
{
    const char *gemmd = NULL, *url_arg = NULL, *gemmd_args = NULL;
    char sizes_arg[128] = "1024,2048,4096";
    int repeats = 7, port = 18482, nclients = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--gemmd") && v) gemmd = v, i++;
        else if (!strcmp(a, "--gemmd-args") && v) gemmd_args = v, i++;
        else if (!strcmp(a, "--url") && v) url_arg = v, i++;
        else if (!strcmp(a, "--port") && v) port = atoi(v), i++;
        else if (!strcmp(a, "--repeats") && v) repeats = atoi(v), i++;
        else if (!strcmp(a, "--clients") && v) nclients = atoi(v), i++;
        else if (!strcmp(a, "--sizes") && v) snprintf(sizes_arg, sizeof sizes_arg, "%s", v), i++;
        else {
            fprintf(stderr, "usage: bench_loopback [--gemmd PATH [--gemmd-args \"...\"] [--port P] | --url URL]\n"
                            "                      [--sizes 1024,2048,4096] [--repeats N] [--clients C]\n");
            return 2;
        }
    }
    if (repeats < 1 || repeats > 1000 || nclients < 1 || nclients > MAX_CLIENTS || port < 1 ||
        port > 65535) {
        fprintf(stderr, "bench_loopback: bad --repeats, --clients (1..%d) or --port\n", MAX_CLIENTS);
        return 2;
    }
    size_t sizes[MAX_SIZES];
    int nsizes = 0;
    for (char *save = NULL, *t = strtok_r(sizes_arg, ",", &save); t && nsizes < MAX_SIZES;
         t = strtok_r(NULL, ",", &save)) {
        long v = atol(t);
        if (v < 1 || v > 16384) {
            fprintf(stderr, "bench_loopback: size %s out of range 1..16384\n", t);
            return 2;
        }
        sizes[nsizes++] = (size_t)v;
    }

    char url[256];
    pid_t child = -1;
    if (gemmd) {
        snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
        child = start_daemon(gemmd, port, gemmd_args);
    } else {
        snprintf(url, sizeof url, "%s", url_arg ? url_arg : "http://127.0.0.1:8080");
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    if (wait_healthy(url, 30) != 0) {
        fprintf(stderr, "bench_loopback: no daemon answered %s/healthz\n", url);
        if (child > 0) kill(child, SIGTERM), waitpid(child, NULL, 0);
        return 1;
    }

    printf("# float32 raw binary POST /v1/matmul on %s, %d client(s) x %d requests (+1 warm-up each)\n",
           url, nclients, repeats);
    printf("# payload = A + B + C bytes; GB/s = all payload / wall time of the run%s\n",
           nclients == 1 ? "; median = median request" : "");
    printf("| shape | m x k x n | payload MB | median ms | server recv ms | server total ms | GB/s |\n");
    printf("|---|---|---:|---:|---:|---:|---:|\n");

    int rc_all = 0;
    for (int si = 0; si < nsizes; si++) {
        size_t N = sizes[si];
        shape shapes[3] = {
            {"upload", N, N, 1},
            {"download", N, 1, N},
            {"square", N, N, N},
        };
        for (int h = 0; h < 3; h++) {
            shape *s = &shapes[h];
            if (h == 2 && N > 2048) continue; /* compute-bound here; bench_cpu covers it */
            size_t ab_n = s->m * s->k + s->k * s->n;
            double payload = (double)(ab_n + s->m * s->n) * sizeof(float);
            float *ab = malloc(ab_n * sizeof(float));
            client *cls = calloc((size_t)nclients, sizeof *cls);
            if (!ab || !cls) {
                fprintf(stderr, "bench_loopback: out of memory\n");
                return 1;
            }
            bench_fill(ab, ab_n, N + (size_t)h);
            for (int i = 0; i < nclients; i++) {
                cls[i] = (client){url, *s, ab, repeats, calloc((size_t)repeats, sizeof(double)),
                                  calloc((size_t)repeats, sizeof(double)),
                                  calloc((size_t)repeats, sizeof(double)), 0, 0};
                if (!cls[i].walls || !cls[i].srv || !cls[i].recv) return 1;
            }
            double t0 = gemm_now_ms();
            for (int i = 0; i < nclients; i++)
                if (pthread_create(&cls[i].tid, NULL, client_main, &cls[i]) != 0) return 1;
            int failed = 0;
            for (int i = 0; i < nclients; i++) {
                pthread_join(cls[i].tid, NULL);
                failed |= cls[i].failed;
            }
            double t1 = gemm_now_ms();
            /* The run's wall time includes each client's warm-up; take the sum of the timed
             * requests of the slowest client instead when there is one client. */
            double med = NAN, srv = NAN, rcv = NAN, gbs;
            if (nclients == 1 && !failed) {
                double sum = 0;
                for (int r = 0; r < repeats; r++) sum += cls[0].walls[r];
                med = median(cls[0].walls, repeats);
                srv = median(cls[0].srv, repeats);
                rcv = median(cls[0].recv, repeats);
                gbs = payload * repeats / (sum * 1e-3) / 1e9;
            } else {
                gbs = payload * (repeats + 1) * nclients / ((t1 - t0) * 1e-3) / 1e9;
            }
            if (failed) {
                rc_all = 1;
                printf("| %s | %zux%zux%zu | %.1f | failed | - | - | - |\n", s->name, s->m, s->k,
                       s->n, payload / 1e6);
            } else if (nclients == 1) {
                printf("| %s | %zux%zux%zu | %.1f | %.3f | %.3f | %.3f | %.2f |\n", s->name, s->m,
                       s->k, s->n, payload / 1e6, med, rcv, srv, gbs);
            } else {
                printf("| %s | %zux%zux%zu | %.1f | - | - | - | %.2f |\n", s->name, s->m, s->k,
                       s->n, payload / 1e6, gbs);
            }
            fflush(stdout);
            for (int i = 0; i < nclients; i++) free(cls[i].walls), free(cls[i].srv), free(cls[i].recv);
            free(cls);
            free(ab);
        }
    }
    curl_global_cleanup();
    if (child > 0) {
        kill(child, SIGTERM);
        waitpid(child, NULL, 0);
    }
    return rc_all;
}
