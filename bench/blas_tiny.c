/*
 * blas_tiny.c - what libgemm_blas.so adds to a product below the offload threshold: the
 * same tiny products through the preloaded cblas_dgemm / cblas_sgemm / dgemm_ and through
 * the host BLAS's own functions called directly, in one process, interleaved.
 *
 *   LD_PRELOAD=lib/libgemm_blas.so build/bench/blas_tiny [--sizes 2,4,8,16,32] [--batches 15]
 *
 * The host BLAS is the library GEMM_BLAS_LIB names (default libblas.so.3); it is opened
 * here and the preload is told to use the same one, so both sides end in the same code.
 * GEMM_SERVER is unset for the run: the question is the cost of the decision, not of a
 * server. Per size, function and side: the median and the minimum over `batches` batches
 * of the time per call (each batch repeats the call for about 20 ms, the two sides take
 * turns), and the differences in ns. On a busy machine the minimum is the steadier figure:
 * what the preload adds is a fixed amount of work, while other processes only add time.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void (*cblas_s_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                           float *, int);
typedef void (*cblas_d_fn)(int, int, int, int, int, int, double, const double *, int, const double *, int,
                           double, double *, int);
typedef void (*f77_d_fn)(const char *, const char *, const int *, const int *, const int *, const double *,
                         const double *, const int *, const double *, const int *, const double *, double *,
                         const int *);

enum { MAX_BATCHES = 101 };

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
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

static void *need(void *h, const char *name, int preload)
{
    void *f = dlsym(h, name);
    Dl_info di;
    int from_preload = f && dladdr(f, &di) && di.dli_fname && strstr(di.dli_fname, "libgemm_blas");
    if (!f || from_preload != preload) {
        fprintf(stderr, "blas_tiny: %s %s\n", name,
                preload ? "does not come from libgemm_blas.so: run with LD_PRELOAD=lib/libgemm_blas.so"
                        : "not found in the host BLAS");
        exit(2);
    }
    return f;
}

static double *A, *B, *C;
static float *As, *Bs, *Cs;

/* One call of kind k (0 cblas_dgemm, 1 cblas_sgemm, 2 dgemm_) of size n through fn. */
static void call(int k, void *fn, int n)
{
    if (k == 0) ((cblas_d_fn)fn)(101, 111, 111, n, n, n, 1.0, A, n, B, n, 0.0, C, n);
    else if (k == 1) ((cblas_s_fn)fn)(101, 111, 111, n, n, n, 1.0f, As, n, Bs, n, 0.0f, Cs, n);
    else {
        double one = 1, zero = 0;
        ((f77_d_fn)fn)("N", "N", &n, &n, &n, &one, A, &n, B, &n, &zero, C, &n);
    }
}

int main(int argc, char **argv)
{
    const char *sizes = "2,4,8,16,32";
    int batches = 15;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--sizes") && i + 1 < argc) sizes = argv[++i];
        else if (!strcmp(argv[i], "--batches") && i + 1 < argc) batches = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: LD_PRELOAD=lib/libgemm_blas.so blas_tiny [--sizes 2,4,8] [--batches 15]\n");
            return 2;
        }
    }
    if (batches < 1 || batches > MAX_BATCHES) batches = 15;
    const char *lib = getenv("GEMM_BLAS_LIB");
    if (!lib || !*lib) lib = "libblas.so.3";
    setenv("GEMM_BLAS_LIB", lib, 1);
    unsetenv("GEMM_SERVER");
    unsetenv("GEMM_OFFLOAD_LOG");
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "blas_tiny: %s\n", dlerror());
        return 2;
    }
    static const char *const names[3] = {"cblas_dgemm", "cblas_sgemm", "dgemm_"};
    void *ours[3], *host[3];
    for (int k = 0; k < 3; k++) {
        ours[k] = need(RTLD_DEFAULT, names[k], 1);
        host[k] = need(h, names[k], 0);
    }
    A = calloc(64 * 64, 8), B = calloc(64 * 64, 8), C = calloc(64 * 64, 8);
    As = calloc(64 * 64, 4), Bs = calloc(64 * 64, 4), Cs = calloc(64 * 64, 4);
    for (int i = 0; i < 64 * 64; i++) A[i] = B[i] = As[i] = Bs[i] = (float)(i % 7) - 3;
    fprintf(stderr, "blas_tiny: host BLAS %s (the preload's first call prints a warning: no GEMM_SERVER)\n", lib);
    call(0, ours[0], 2); /* the preload's one-time set-up, outside the timing */

    printf("| n | function | host BLAS direct ns/call (median, min) | through libgemm_blas.so ns/call (median, min) | "
           "added ns/call (medians, minima) |\n");
    printf("| --- | --- | --- | --- | --- |\n");
    for (const char *sp = sizes; *sp;) {
        int n = atoi(sp);
        sp = strchr(sp, ',') ? strchr(sp, ',') + 1 : sp + strlen(sp);
        if (n < 1 || n > 64) continue;
        for (int k = 0; k < 3; k++) {
            /* calls per batch: about 20 ms of the host's own */
            long iters = 1000;
            double t0 = now_ns();
            for (long i = 0; i < iters; i++) call(k, host[k], n);
            double per = (now_ns() - t0) / iters;
            iters = (long)(20e6 / (per > 1 ? per : 1));
            if (iters < 100) iters = 100;
            double th[MAX_BATCHES] = {0}, to[MAX_BATCHES] = {0};
            for (int b = 0; b < batches; b++) {
                for (int side = 0; side < 2; side++) {
                    int s = (side + b) % 2; /* alternate which goes first */
                    void *fn = s ? ours[k] : host[k];
                    t0 = now_ns();
                    for (long i = 0; i < iters; i++) call(k, fn, n);
                    (s ? to : th)[b] = (now_ns() - t0) / iters;
                }
            }
            double mh = median(th, batches), mo = median(to, batches); /* sorts th, to */
            printf("| %d | %s | %.1f, %.1f | %.1f, %.1f | %+.1f, %+.1f |\n", n, names[k], mh, th[0], mo, to[0], mo - mh,
                   to[0] - th[0]);
            fflush(stdout);
        }
    }
    free(A), free(B), free(C), free(As), free(Bs), free(Cs);
    dlclose(h);
    return 0;
}
