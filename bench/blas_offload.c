/*
 * blas_offload.c - what the BLAS preload adds to an offloaded product: the same product
 * through libgemm_blas.so (cblas_sgemm / cblas_dgemm / dgemm_ as a program calls them)
 * and through gemm_client_multiply() of libgemm directly, against the same server, interleaved.
 *
 *   GEMM_SERVER=http://host:8080 LD_PRELOAD=lib/libgemm_blas.so \
 *       build/bench/blas_offload [--sizes 2048,4096] [--repeats 7] [--small-repeats 51]
 *                                [--dtypes float32,float64]
 *
 * Must run with the library preloaded (checked: cblas_sgemm must come from it). Every
 * product offloads (GEMM_OFFLOAD_MIN_FLOPS=0 is set here before the first call). Layouts
 * through the preload:
 *   row NN       cblas_*gemm(RowMajor, NoTrans, NoTrans), alpha 1, beta 0: NumPy's a @ b.
 *                Operands and C go straight from/to the caller's memory.
 *   col NN       dgemm_/sgemm_('N', 'N'), alpha 1, beta 0: a Fortran program. Sent as the
 *                row-major product of the transposes: no copy either.
 *   row TN       A transposed: A is packed (a blocked transpose) before sending.
 *   row NN b=1   beta 1: C comes into a buffer, then C = alpha*T + beta*C in one pass.
 * Per size and dtype it prints the median and minimum wall time of each path over the
 * repeats (each repeat runs the direct call and every layout once, in rotating order; sizes
 * up to 1024 take --small-repeats, where a few microseconds show against the exchange), the
 * ratios of the medians and of the minima to the direct call's (on a busy machine the
 * minimum is the steadier figure), and the largest difference between each
 * layout's C and the direct call's C (0 when the server computed them alike).
 *
 * The wall times include the server's work, which on a shared machine varies more than the
 * preload costs. So the preload's own time is also measured exactly: with GEMM_OFFLOAD_LOG=1
 * (stderr goes to a temporary file) each offloaded call logs its whole time and the time
 * of its HTTP exchange; "own ms" is the median of the difference (checks, packing, the
 * alpha/beta pass, the client pool), and "own / exchange" relates it to the exchange.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gemm.h"

typedef void (*cblas_s_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                           float *, int);
typedef void (*cblas_d_fn)(int, int, int, int, int, int, double, const double *, int, const double *, int,
                           double, double *, int);
typedef void (*f77_s_fn)(const char *, const char *, const int *, const int *, const int *, const float *,
                         const float *, const int *, const float *, const int *, const float *, float *,
                         const int *);
typedef void (*f77_d_fn)(const char *, const char *, const int *, const int *, const int *, const double *,
                         const double *, const int *, const double *, const int *, const double *, double *,
                         const int *);

enum { PATHS = 5, MAX_REPEATS = 101 };
static const char *const path_name[PATHS] = {"gemm_client_multiply", "row NN", "col NN", "row TN", "row NN b=1"};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void *sym(const char *name)
{
    void *f = dlsym(RTLD_DEFAULT, name);
    Dl_info di;
    if (!f || !dladdr(f, &di) || !di.dli_fname || !strstr(di.dli_fname, "libgemm_blas")) {
        fprintf(stderr, "blas_offload: %s does not come from libgemm_blas.so (%s): run with "
                        "LD_PRELOAD=lib/libgemm_blas.so\n", name, f && di.dli_fname ? di.dli_fname : "not found");
        exit(2);
    }
    return f;
}

int main(int argc, char **argv)
{
    const char *sizes = "2048,4096", *dtypes = "float32,float64";
    int repeats = 7, small_repeats = 51;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--sizes") && i + 1 < argc) sizes = argv[++i];
        else if (!strcmp(argv[i], "--dtypes") && i + 1 < argc) dtypes = argv[++i];
        else if (!strcmp(argv[i], "--repeats") && i + 1 < argc) repeats = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--small-repeats") && i + 1 < argc) small_repeats = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: GEMM_SERVER=URL LD_PRELOAD=lib/libgemm_blas.so blas_offload [--sizes 2048,4096] "
                            "[--repeats 7] [--small-repeats 51] [--dtypes float32,float64]\n");
            return 2;
        }
    }
    if (repeats < 1 || repeats > MAX_REPEATS) repeats = 7;
    if (small_repeats < 1 || small_repeats > MAX_REPEATS) small_repeats = 51;
    const int big_repeats = repeats;
    const char *url = getenv("GEMM_SERVER");
    if (!url || !*url) {
        fprintf(stderr, "blas_offload: set GEMM_SERVER\n");
        return 2;
    }
    setenv("GEMM_OFFLOAD_MIN_FLOPS", "0", 1);
    setenv("GEMM_OFFLOAD_MIN_INTENSITY", "0", 1);
    setenv("GEMM_OFFLOAD_LOG", "1", 1);
    /* the preload's log lines go to a file; our own messages to the real stderr */
    char logpath[] = "/tmp/blas_offload-XXXXXX";
    int logfd = mkstemp(logpath);
    int errfd = dup(2);
    FILE *errf = errfd >= 0 ? fdopen(errfd, "w") : NULL;
    if (logfd < 0 || !errf || dup2(logfd, 2) < 0) {
        perror("blas_offload: log file");
        return 2;
    }
    unlink(logpath);
    cblas_s_fn cs = (cblas_s_fn)sym("cblas_sgemm");
    cblas_d_fn cd = (cblas_d_fn)sym("cblas_dgemm");
    f77_s_fn fs = (f77_s_fn)sym("sgemm_");
    f77_d_fn fd = (f77_d_fn)sym("dgemm_");

    gemm_client_options o;
    gemm_client_options_init(&o);
    o.token = getenv("GEMM_TOKEN");
    /* the options the preload's clients have by default */
    o.timeout_ms = 300000, o.connect_timeout_ms = 3000, o.max_retries = 2, o.max_retry_wait_ms = 2000;
    gemm_client_error err;
    gemm_client *cl = gemm_client_new(url, &o, &err);
    if (!cl) {
        fprintf(errf, "blas_offload: %s\n", err.message);
        return 2;
    }
    printf("| n | dtype | path | median ms | min ms | median / gemm_client_multiply's | min / gemm_client_multiply's | "
           "own ms (median) | own / exchange | max abs diff of C |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    int rc = 0;
    for (const char *sp = sizes; *sp;) {
        int n = atoi(sp);
        sp = strchr(sp, ',') ? strchr(sp, ',') + 1 : sp + strlen(sp);
        for (const char *dp = dtypes; *dp;) {
            int dbl = strncmp(dp, "float64", 7) == 0;
            dp = strchr(dp, ',') ? strchr(dp, ',') + 1 : dp + strlen(dp);
            size_t es = dbl ? 8 : 4, nn = (size_t)n * n;
            repeats = n <= 1024 ? small_repeats : big_repeats;
            void *a = malloc(nn * es), *at = malloc(nn * es), *b = malloc(nn * es);
            void *c[PATHS];
            for (int p = 0; p < PATHS; p++) c[p] = calloc(nn, es);
            srand(1);
            for (size_t i = 0; i < nn; i++) {
                double x = rand() / (double)RAND_MAX - 0.5, y = rand() / (double)RAND_MAX - 0.5;
                if (dbl) ((double *)a)[i] = x, ((double *)b)[i] = y;
                else ((float *)a)[i] = (float)x, ((float *)b)[i] = (float)y;
            }
            for (int i = 0; i < n; i++) /* at = A transposed, row-major */
                for (int j = 0; j < n; j++)
                    memcpy((char *)at + ((size_t)j * n + i) * es, (const char *)a + ((size_t)i * n + j) * es, es);
            double t[PATHS][MAX_REPEATS], own[PATHS][MAX_REPEATS], exch[PATHS][MAX_REPEATS];
            int seq[(MAX_REPEATS + 1) * PATHS], nseq = 0; /* path of each logged call, in order */
            if (ftruncate(logfd, 0) != 0 || lseek(logfd, 0, SEEK_SET) != 0) return 2;
            for (int r = -1; r < repeats; r++) { /* r = -1: warm-up (connections, pages) */
                for (int q = 0; q < PATHS; q++) {
                    int p = (q + (r < 0 ? 0 : r)) % PATHS;
                    if (p == 4) memset(c[4], 0, nn * es); /* beta 1 adds to zeros: same C */
                    double t0 = now_ms();
                    int N = n;
                    if (p == 0) {
                        gemm_request rq = GEMM_REQUEST_INIT;
                        rq.dtype = dbl ? GEMM_DTYPE_F64 : GEMM_DTYPE_F32;
                        rq.m = rq.k = rq.n = (uint64_t)n;
                        rq.a = a, rq.b = b, rq.c = c[0];
                        if (gemm_client_multiply(cl, &rq, NULL, &err) != 0) {
                            fprintf(errf, "blas_offload: gemm_client_multiply: %s\n", err.message);
                            return 1;
                        }
                    } else if (p == 2) { /* column-major C = A·B on the same memory: Cᵀ = Bᵀ·Aᵀ */
                        if (dbl) {
                            double one = 1, zero = 0;
                            fd("N", "N", &N, &N, &N, &one, (double *)b, &N, (double *)a, &N, &zero, (double *)c[2], &N);
                        } else {
                            float one = 1, zero = 0;
                            fs("N", "N", &N, &N, &N, &one, (float *)b, &N, (float *)a, &N, &zero, (float *)c[2], &N);
                        }
                    } else {
                        const void *pa = p == 3 ? at : a;
                        int ta = p == 3 ? 112 : 111;
                        double beta = p == 4 ? 1 : 0;
                        if (dbl) cd(101, ta, 111, n, n, n, 1.0, pa, n, (double *)b, n, beta, (double *)c[p], n);
                        else cs(101, ta, 111, n, n, n, 1.0f, pa, n, (float *)b, n, (float)beta, (float *)c[p], n);
                    }
                    if (r >= 0) t[p][r] = now_ms() - t0;
                    if (p != 0) seq[nseq++] = r < 0 ? -p : p;
                }
            }
            /* the log: one "-> server TOTAL ms (exchange X ms" line per preload call */
            int got = 0, nown[PATHS] = {0};
            FILE *lf = fdopen(dup(logfd), "r");
            if (lf) {
                char line[1024];
                rewind(lf);
                while (fgets(line, sizeof line, lf)) {
                    const char *q = strstr(line, "-> server ");
                    double tot, ex;
                    if (!q) {
                        fprintf(errf, "blas_offload: not offloaded: %s", line);
                        rc = 1;
                        got++;
                        continue;
                    }
                    if (sscanf(q, "-> server %lf ms (exchange %lf ms", &tot, &ex) != 2 || got >= nseq) continue;
                    int p = seq[got++];
                    if (p > 0 && nown[p] < MAX_REPEATS) {
                        own[p][nown[p]] = tot - ex;
                        exch[p][nown[p]++] = ex;
                    }
                }
                fclose(lf);
            }
            if (got != nseq) {
                fprintf(errf, "blas_offload: %d log lines for %d preload calls\n", got, nseq);
                rc = 1;
            }
            double direct = 0, direct_min = 0;
            for (int p = 0; p < PATHS; p++) {
                double mn = t[p][0];
                for (int r = 1; r < repeats; r++) mn = t[p][r] < mn ? t[p][r] : mn;
                double med = median(t[p], repeats), diff = 0;
                if (p == 0) direct = med, direct_min = mn;
                for (size_t i = 0; i < nn; i++) {
                    double x = dbl ? ((double *)c[p])[i] : ((float *)c[p])[i];
                    double y = dbl ? ((double *)c[0])[i] : ((float *)c[0])[i];
                    diff = fmax(diff, fabs(x - y));
                    if (isnan(x)) diff = INFINITY;
                }
                if (diff > (dbl ? 1e-9 : 1e-2)) rc = 1; /* not the same product */
                char ownb[64] = "-", relb[64] = "-";
                if (p > 0 && nown[p] > 0) {
                    double ow = median(own[p], nown[p]), ex = median(exch[p], nown[p]);
                    snprintf(ownb, sizeof ownb, "%.3f", ow);
                    snprintf(relb, sizeof relb, "%.2f%%", 100 * ow / ex);
                }
                printf("| %d | %s | %s | %.1f | %.1f | %.3f | %.3f | %s | %s | %.3g |\n", n, dbl ? "float64" : "float32",
                       path_name[p], med, mn, med / direct, mn / direct_min, ownb, relb, diff);
                fflush(stdout);
            }
            free(a), free(at), free(b);
            for (int p = 0; p < PATHS; p++) free(c[p]);
        }
    }
    gemm_client_free(cl);
    return rc;
}
