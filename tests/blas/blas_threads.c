/*
 * blas_threads.c - a plain BLAS program (linked with -lblas only) that calls cblas_dgemm and
 * cblas_sgemm from many threads at once, each product checked against a float64 loop.
 *
 *     blas_threads [threads=16] [products per thread=12] [seed=1] [max dim=160]
 *
 * Every product has its own shape, order, transposes, leading dimensions with padding,
 * alpha and beta (beta = 0 with NaN in C, which BLAS must ignore); the padding of C must
 * come back untouched. tests/e2e/test_blas.py runs it under LD_PRELOAD=libgemm_blas.so
 * against a real daemon. Prints one line per failing product and a last line
 * "products N bad M"; exits 1 when a product is wrong.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* CBLAS as libblas.so.3 exports it (LP64). */
void cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                 const float *b, int ldb, float beta, float *c, int ldc);
void cblas_dgemm(int order, int ta, int tb, int m, int n, int k, double alpha, const double *a, int lda,
                 const double *b, int ldb, double beta, double *c, int ldc);

enum { ROW = 101, COL = 102, NT = 111, TR = 112, CT = 113 };
#define PAD_VALUE 12345.0

static int nthreads = 16, per_thread = 12, max_dim = 160;
static unsigned long seed = 1;
static pthread_mutex_t out_mu = PTHREAD_MUTEX_INITIALIZER;

static uint64_t next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}
static int pick(uint64_t *s, int n) { return (int)(next(s) % (uint64_t)n); }
static double uni(uint64_t *s) { return (double)(next(s) >> 11) / 9007199254740992.0 * 2 - 1; }

/* Element (i, j) of a matrix stored in `order` with leading dimension ld. */
static size_t at(int order, int i, int j, int ld) { return order == ROW ? (size_t)i * ld + j : (size_t)j * ld + i; }

typedef struct {
    int id, products, bad;
} worker;

static int one_product(uint64_t *s, int tid, int idx)
{
    int dbl = pick(s, 2);
    int order = pick(s, 2) ? ROW : COL;
    static const int trans[3] = {NT, TR, CT};
    int ta = trans[pick(s, 3)], tb = trans[pick(s, 3)];
    int m = 1 + pick(s, max_dim), n = 1 + pick(s, max_dim), k = 1 + pick(s, max_dim);
    static const double alphas[4] = {1.0, -0.5, 2.0, 0.75};
    static const double betas[4] = {0.0, 1.0, -1.5, 0.5};
    double alpha = alphas[pick(s, 4)], beta = betas[pick(s, 4)];
    /* op(A) is m x k: stored as ar x ac; op(B) is k x n: stored as br x bc */
    int ar = ta == NT ? m : k, ac = ta == NT ? k : m, br = tb == NT ? k : n, bc = tb == NT ? n : k;
    int lda = (order == ROW ? ac : ar) + pick(s, 3);
    int ldb = (order == ROW ? bc : br) + pick(s, 3);
    int ldc = (order == ROW ? n : m) + pick(s, 3);
    size_t na = (size_t)(order == ROW ? ar : ac) * lda, nb = (size_t)(order == ROW ? br : bc) * ldb,
           nc = (size_t)(order == ROW ? m : n) * ldc;
    double *a = malloc(na * sizeof *a), *b = malloc(nb * sizeof *b), *c0 = malloc(nc * sizeof *c0);
    double *ref = malloc((size_t)m * n * sizeof *ref), *bound = malloc((size_t)m * n * sizeof *bound);
    void *cv = malloc(nc * (dbl ? 8 : 4)), *av = malloc(na * (dbl ? 8 : 4)), *bv = malloc(nb * (dbl ? 8 : 4));
    if (!a || !b || !c0 || !ref || !bound || !cv || !av || !bv) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    /* values exactly representable in float32, so both dtypes share one reference */
    for (size_t i = 0; i < na; i++) a[i] = (float)uni(s);
    for (size_t i = 0; i < nb; i++) b[i] = (float)uni(s);
    for (size_t i = 0; i < nc; i++) c0[i] = PAD_VALUE;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) c0[at(order, i, j, ldc)] = beta == 0 ? (pick(s, 2) ? NAN : INFINITY) : (float)uni(s);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double sum = 0, mag = 0;
            for (int l = 0; l < k; l++) {
                double x = ta == NT ? a[at(order, i, l, lda)] : a[at(order, l, i, lda)];
                double y = tb == NT ? b[at(order, l, j, ldb)] : b[at(order, j, l, ldb)];
                sum += x * y;
                mag += fabs(x * y);
            }
            double cij = c0[at(order, i, j, ldc)];
            ref[(size_t)i * n + j] = alpha * sum + (beta == 0 ? 0 : beta * cij);
            bound[(size_t)i * n + j] = fabs(alpha) * mag + (beta == 0 ? 0 : fabs(beta * cij));
        }
    for (size_t i = 0; i < na; i++) dbl ? (((double *)av)[i] = a[i]) : (((float *)av)[i] = (float)a[i]);
    for (size_t i = 0; i < nb; i++) dbl ? (((double *)bv)[i] = b[i]) : (((float *)bv)[i] = (float)b[i]);
    for (size_t i = 0; i < nc; i++) dbl ? (((double *)cv)[i] = c0[i]) : (((float *)cv)[i] = (float)c0[i]);

    if (dbl)
        cblas_dgemm(order, ta, tb, m, n, k, alpha, av, lda, bv, ldb, beta, cv, ldc);
    else
        cblas_sgemm(order, ta, tb, m, n, k, (float)alpha, av, lda, bv, ldb, (float)beta, cv, ldc);

    double eps = dbl ? 2.220446049250313e-16 : 1.1920928955078125e-07;
    int bad = 0;
    char why[200] = "";
    for (int i = 0; i < m && !bad; i++)
        for (int j = 0; j < n && !bad; j++) {
            size_t p = at(order, i, j, ldc);
            double got = dbl ? ((double *)cv)[p] : ((float *)cv)[p];
            double want = ref[(size_t)i * n + j], tol = 4 * (k + 2) * eps * bound[(size_t)i * n + j] + 1e-30;
            if (!(fabs(got - want) <= tol)) {
                bad = 1;
                snprintf(why, sizeof why, "C(%d,%d) = %.17g, want %.17g (tol %.3g)", i, j, got, want, tol);
            }
        }
    for (size_t p = 0; p < nc && !bad; p++) {
        int r = (int)(p / ldc), q = (int)(p % ldc); /* (row, col) for ROW, (col, row) for COL */
        int inside = order == ROW ? (r < m && q < n) : (r < n && q < m);
        double got = dbl ? ((double *)cv)[p] : ((float *)cv)[p];
        if (!inside && got != PAD_VALUE) {
            bad = 1;
            snprintf(why, sizeof why, "padding element %zu of C was overwritten (%.17g)", p, got);
        }
    }
    if (bad) {
        pthread_mutex_lock(&out_mu);
        printf("BAD thread %d product %d: cblas_%cgemm %s %c%c m=%d n=%d k=%d lda=%d ldb=%d ldc=%d alpha=%g "
               "beta=%g: %s\n",
               tid, idx, dbl ? 'd' : 's', order == ROW ? "RowMajor" : "ColMajor", ta == NT ? 'N' : ta == TR ? 'T' : 'C',
               tb == NT ? 'N' : tb == TR ? 'T' : 'C', m, n, k, lda, ldb, ldc, alpha, beta, why);
        pthread_mutex_unlock(&out_mu);
    }
    free(a), free(b), free(c0), free(ref), free(bound), free(av), free(bv), free(cv);
    return bad;
}

static void *run(void *arg)
{
    worker *w = arg;
    uint64_t s = 0x9E3779B97F4A7C15ull ^ (seed * 1000003u + (uint64_t)w->id * 7919u + 1u);
    for (int i = 0; i < 8; i++) next(&s);
    for (int i = 0; i < per_thread; i++) {
        w->bad += one_product(&s, w->id, i);
        w->products++;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc > 1) nthreads = atoi(argv[1]);
    if (argc > 2) per_thread = atoi(argv[2]);
    if (argc > 3) seed = strtoul(argv[3], NULL, 10);
    if (argc > 4) max_dim = atoi(argv[4]);
    if (nthreads < 1 || nthreads > 256 || per_thread < 0 || max_dim < 1) {
        fprintf(stderr, "usage: blas_threads [threads 1..256] [products per thread] [seed] [max dim]\n");
        return 2;
    }
    pthread_t th[256];
    worker w[256];
    memset(w, 0, sizeof w);
    for (int t = 0; t < nthreads; t++) {
        w[t].id = t;
        if (pthread_create(&th[t], NULL, run, &w[t]) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            return 2;
        }
    }
    int products = 0, bad = 0;
    for (int t = 0; t < nthreads; t++) {
        pthread_join(th[t], NULL);
        products += w[t].products;
        bad += w[t].bad;
    }
    printf("products %d bad %d\n", products, bad);
    return bad ? 1 : 0;
}
