/*
 * blas_offload.c - the BLAS preload's numbers, in three modes; bench/blas_offload.sh runs
 * them (and NumPy from a wheel) into one report.
 *
 *   LD_PRELOAD=lib/libgemm_blas.so build/bench/blas_offload tiny [--sizes 2,4,8,16,32] [--repeats 15]
 *   GEMM_SERVER=URL LD_PRELOAD=lib/libgemm_blas.so build/bench/blas_offload offload [--sizes 2048,4096]
 *       [--repeats 7] [--small-repeats 51] [--dtypes float32,float64]
 *   GEMM_SERVER=URL build/bench/blas_offload breakeven [--sizes 64,96,...,2048] [--dtypes float32,float64]
 *       [--budget-s 20]
 *
 * The host BLAS is GEMM_BLAS_LIB (default libblas.so.3), opened here; the preloaded
 * functions must come from libgemm_blas.so (checked).
 *
 * tiny: what the preload adds below the threshold. The same products of n x n (cblas_dgemm,
 *   cblas_sgemm, dgemm_, sgemm_) through the preload and through the host BLAS directly,
 *   GEMM_SERVER unset and the preload told to use the same host: per size and function the
 *   median and minimum over --repeats batches (each about 20 ms of calls, the sides taking
 *   turns) of the time per call, and the differences in ns. The minimum is the steadier
 *   figure on a busy machine: the preload's work is fixed, other processes only add time.
 *
 * offload: what the preload adds to an offloaded product. Per size and dtype, interleaved
 *   over --repeats rounds (--small-repeats up to n = 1024), every product offloaded
 *   (GEMM_OFFLOAD_MIN_FLOPS=0, GEMM_OFFLOAD_LEARN=0):
 *     gemm_client_multiply  libgemm directly, with the preload's client options;
 *     row NN       cblas_*gemm(RowMajor, N, N), alpha 1, beta 0: NumPy's a @ b, no copy;
 *     col NN       sgemm_/dgemm_('N', 'N'): a Fortran program, sent as the row-major
 *                  product of the transposes, no copy either;
 *     row TN       A transposed: packed (a blocked transpose) before sending;
 *     row NN b=1   beta 1: C comes into a buffer, then C = alpha*T + beta*C in one pass.
 *   Median and minimum wall time, their ratios to gemm_client_multiply's, the largest
 *   difference of C from its C, and the preload's own time exactly: GEMM_OFFLOAD_LOG=1
 *   logs each call's whole time and its HTTP exchange's (stderr goes to a temporary file);
 *   "own ms" is the median of the difference (checks, packing, the alpha/beta pass, the
 *   client pool) and "own / exchange" relates it to the exchange.
 *
 * breakeven: from which n an n x n x n product is faster on the server than on the host.
 *   Per dtype and n: the host BLAS (cblas_*gemm RowMajor NN, minimum and median) and
 *   gemm_client_multiply over one kept-alive connection to GEMM_SERVER (minimum and median,
 *   with the server's stages from Server-Timing and the bytes on the wire); each server
 *   answer is checked against the host's C. Repeats: as many as fit in --budget-s per
 *   measurement (3 to 21). Then the break-even n (the smallest n from which offloading is
 *   faster at every larger n of the sweep) and its 2n^3 (GEMM_OFFLOAD_MIN_FLOPS). Other links
 *   than this one: bench/offload.py measures them, shaped with tc.
 *
 * Output: Markdown tables on stdout.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gemm.h"
#include "gemm_types.h"

typedef void (*cblas_s_fn)(int, int, int, int, int, int, float, const void *, int, const void *, int, float, void *,
                           int);
typedef void (*cblas_d_fn)(int, int, int, int, int, int, double, const void *, int, const void *, int, double, void *,
                           int);
typedef void (*f77_fn)(const char *, const char *, const int *, const int *, const int *, const void *, const void *,
                       const int *, const void *, const int *, const void *, void *, const int *);

enum { MAX_REP = 101, MAX_SIZES = 32, PATHS = 5 };

static int err_fd = 2; /* stderr, also while offload sends the preload's lines to a file */

static struct {
    const char *sizes, *dtypes;
    int repeats, small_repeats;
    double budget_s;
} opt = {NULL, "float32,float64", 0, 51, 20};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median and minimum of v[0..n) (v is left as it was). */
static double median_min(const double *v, int n, double *min)
{
    double w[MAX_REP];
    memcpy(w, v, (size_t)n * sizeof *v);
    qsort(w, (size_t)n, sizeof *w, cmp_double);
    if (min) *min = w[0];
    return n % 2 ? w[n / 2] : (w[n / 2 - 1] + w[n / 2]) / 2;
}

/* The next number of a comma-separated list (*p moves past it); 0 at the end. */
static int next_int(const char **p)
{
    if (!**p) return 0;
    int v = atoi(*p);
    *p = strchr(*p, ',') ? strchr(*p, ',') + 1 : *p + strlen(*p);
    return v > 0 ? v : next_int(p);
}

__attribute__((format(printf, 1, 2), noreturn)) static void die(const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    dprintf(err_fd, "blas_offload: %s\n", msg);
    exit(2);
}

static int count(const char *v)
{
    int r = atoi(v);
    return r < 1 ? 1 : r > MAX_REP ? MAX_REP : r;
}

/* name from the host BLAS (GEMM_BLAS_LIB, default libblas.so.3) or, preload, from libgemm_blas.so. */
static void *sym(const char *name, int preload)
{
    static void *host;
    const char *lib = getenv("GEMM_BLAS_LIB");
    if (!host && !preload && !(host = dlopen(lib && *lib ? lib : "libblas.so.3", RTLD_NOW | RTLD_LOCAL)))
        die("%s", dlerror());
    void *f = dlsym(preload ? RTLD_DEFAULT : host, name);
    Dl_info di;
    int ours = f && dladdr(f, &di) && di.dli_fname && strstr(di.dli_fname, "libgemm_blas");
    if (!f || ours != preload)
        die(preload ? "%s does not come from libgemm_blas.so: run with LD_PRELOAD=lib/libgemm_blas.so"
                    : "%s not found in the host BLAS", name);
    return f;
}

/* C (n x n) = op(A)·B + beta·C through fn, a routine named `name`: CBLAS row-major (A
 * transposed when ta), or Fortran column-major on the transposes (Cᵀ = Bᵀ·Aᵀ, the same memory). */
static void product(const char *name, void *fn, int dbl, int n, int ta, const void *a, const void *b, double beta,
                    void *c)
{
    if (strncmp(name, "cblas_", 6) == 0) {
        if (dbl) ((cblas_d_fn)fn)(101, ta ? 112 : 111, 111, n, n, n, 1.0, a, n, b, n, beta, c, n);
        else ((cblas_s_fn)fn)(101, ta ? 112 : 111, 111, n, n, n, 1.0f, a, n, b, n, (float)beta, c, n);
        return;
    }
    double one = 1, be = beta;
    float onef = 1, bef = (float)beta;
    ((f77_fn)fn)("N", "N", &n, &n, &n, dbl ? (void *)&one : &onef, b, &n, a, &n, dbl ? (void *)&be : &bef, c, &n);
}

static void *random_matrix(size_t nn, int dbl, unsigned seed)
{
    void *p = malloc(nn * (dbl ? 8 : 4));
    if (!p) die("out of memory");
    srand(seed);
    for (size_t i = 0; i < nn; i++) {
        double x = rand() / (double)RAND_MAX - 0.5;
        if (dbl) ((double *)p)[i] = x;
        else ((float *)p)[i] = (float)x;
    }
    return p;
}

static double max_diff(const void *x, const void *y, size_t nn, int dbl)
{
    double d = 0;
    for (size_t i = 0; i < nn; i++) {
        double u = dbl ? ((const double *)x)[i] : ((const float *)x)[i];
        double v = dbl ? ((const double *)y)[i] : ((const float *)y)[i];
        d = isnan(u) || isnan(v) ? INFINITY : fmax(d, fabs(u - v));
    }
    return d;
}

static gemm_client *client(void)
{
    const char *url = getenv("GEMM_SERVER");
    if (!url || !*url) die("set GEMM_SERVER");
    gemm_client_options o;
    gemm_client_options_init(&o);
    o.token = getenv("GEMM_TOKEN");
    /* the options the preload's clients have by default */
    o.timeout_ms = 300000, o.connect_timeout_ms = 3000, o.max_retries = 2, o.max_retry_wait_ms = 2000;
    gemm_client_error err;
    gemm_client *cl = gemm_client_new(url, &o, &err);
    if (!cl) die("%s", err.message);
    return cl;
}

static void multiply(gemm_client *cl, int dbl, int n, const void *a, const void *b, void *c, gemm_timing *tm)
{
    gemm_request rq = GEMM_REQUEST_INIT;
    rq.dtype = dbl ? GEMM_DTYPE_F64 : GEMM_DTYPE_F32;
    rq.m = rq.k = rq.n = (uint64_t)n;
    rq.a = a, rq.b = b, rq.c = c;
    gemm_client_error err;
    if (gemm_client_multiply(cl, &rq, tm, &err) != 0) die("gemm_client_multiply: %s", err.message);
}

/* ---------------------------------------------------------------- tiny */

static int tiny(void)
{
    static const char *const names[4] = {"cblas_dgemm", "cblas_sgemm", "dgemm_", "sgemm_"};
    const char *lib = getenv("GEMM_BLAS_LIB");
    setenv("GEMM_BLAS_LIB", lib && *lib ? lib : "libblas.so.3", 1);
    unsetenv("GEMM_SERVER");
    unsetenv("GEMM_OFFLOAD_LOG");
    int batches = opt.repeats ? opt.repeats : 15;
    void *ab[2][2] = {{random_matrix(64 * 64, 0, 1), random_matrix(64 * 64, 0, 2)},
                      {random_matrix(64 * 64, 1, 1), random_matrix(64 * 64, 1, 2)}};
    void *c = calloc(64 * 64, 8);
    product(names[0], sym(names[0], 1), 1, 2, 0, ab[1][0], ab[1][1], 0, c); /* the preload's set-up, untimed */
    printf("| n | function | host BLAS direct ns/call (median, min) | through libgemm_blas.so ns/call (median, min) | "
           "added ns/call (medians, minima) |\n| --- | --- | --- | --- | --- |\n");
    for (const char *sp = opt.sizes ? opt.sizes : "2,4,8,16,32"; *sp;) {
        int n = next_int(&sp);
        if (n < 1 || n > 64) continue;
        for (int k = 0; k < 4; k++) {
            int dbl = strstr(names[k], "dgemm") != NULL;
            void *fn[2] = {sym(names[k], 0), sym(names[k], 1)};
            double t[2][MAX_REP], t0 = gemm_now_ms();
            long iters = 1000;
            for (long i = 0; i < iters; i++) product(names[k], fn[0], dbl, n, 0, ab[dbl][0], ab[dbl][1], 0, c);
            double per = (gemm_now_ms() - t0) * 1e6 / iters;
            iters = per * 100 > 20e6 ? 100 : (long)(20e6 / (per > 1 ? per : 1)); /* about 20 ms a batch */
            for (int r = 0; r < batches; r++)
                for (int side = 0; side < 2; side++) {
                    int s = (side + r) % 2; /* alternate which goes first */
                    t0 = gemm_now_ms();
                    for (long i = 0; i < iters; i++) product(names[k], fn[s], dbl, n, 0, ab[dbl][0], ab[dbl][1], 0, c);
                    t[s][r] = (gemm_now_ms() - t0) * 1e6 / iters;
                }
            double hmin, omin, h = median_min(t[0], batches, &hmin), o = median_min(t[1], batches, &omin);
            printf("| %d | %s | %.1f, %.1f | %.1f, %.1f | %+.1f, %+.1f |\n", n, names[k], h, hmin, o, omin, o - h,
                   omin - hmin);
            fflush(stdout);
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- offload */

static const char *const path_name[PATHS] = {"gemm_client_multiply", "row NN", "col NN", "row TN", "row NN b=1"};

/* The log's "-> server TOTAL ms (exchange X ms" lines, in call order: own[i] = TOTAL - X. */
static int read_log(int fd, double *own, double *exch, int max)
{
    FILE *f = fdopen(dup(fd), "r");
    char line[1024];
    int n = 0;
    if (!f) die("cannot read the log");
    rewind(f);
    while (fgets(line, sizeof line, f) && n < max) {
        const char *q = strstr(line, " -> ");
        if (!q) continue; /* the name of a host routine */
        if (sscanf(q, " -> server %lf ms (exchange %lf ms", &own[n], &exch[n]) != 2) {
            dprintf(err_fd, "blas_offload: not offloaded: %s", line);
            own[n] = exch[n] = NAN;
        }
        own[n] -= exch[n], n++;
    }
    fclose(f);
    return n;
}

static int offload(void)
{
    setenv("GEMM_OFFLOAD_MIN_FLOPS", "0", 1);
    setenv("GEMM_OFFLOAD_MIN_INTENSITY", "0", 1);
    setenv("GEMM_OFFLOAD_LEARN", "0", 1);
    setenv("GEMM_OFFLOAD_LOG", "1", 1);
    char logpath[] = "/tmp/blas_offload-XXXXXX";
    int logfd = mkstemp(logpath); /* the preload's lines to a file, ours to stderr */
    if (logfd < 0 || (err_fd = dup(2)) < 0 || dup2(logfd, 2) < 0) die("cannot redirect stderr");
    unlink(logpath);
    gemm_client *cl = client();
    printf("| n | dtype | path | median ms | min ms | median / gemm_client_multiply's | min / gemm_client_multiply's | "
           "own ms (median) | own / exchange | max abs diff of C |\n"
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    int rc = 0;
    for (const char *sp = opt.sizes ? opt.sizes : "2048,4096"; *sp;) {
        int n = next_int(&sp), reps = n <= 1024 ? opt.small_repeats : opt.repeats ? opt.repeats : 7;
        for (const char *dp = opt.dtypes; n && *dp; dp = strchr(dp, ',') ? strchr(dp, ',') + 1 : dp + strlen(dp)) {
            int dbl = strncmp(dp, "float64", 7) == 0;
            size_t es = dbl ? 8 : 4, nn = (size_t)n * n;
            void *a = random_matrix(nn, dbl, 1), *b = random_matrix(nn, dbl, 2), *at = malloc(nn * es), *c[PATHS];
            for (int p = 0; p < PATHS; p++) c[p] = calloc(nn, es);
            for (int i = 0; i < n; i++)
                for (int j = 0; j < n; j++)
                    memcpy((char *)at + ((size_t)j * n + i) * es, (const char *)a + ((size_t)i * n + j) * es, es);
            const char *cb = dbl ? "cblas_dgemm" : "cblas_sgemm", *fo = dbl ? "dgemm_" : "sgemm_";
            void *fcb = sym(cb, 1), *ffo = sym(fo, 1);
            double t[PATHS][MAX_REP], own[(MAX_REP + 1) * PATHS], exch[(MAX_REP + 1) * PATHS];
            int seq[(MAX_REP + 1) * PATHS], nseq = 0; /* path of each preload call, in order */
            if (ftruncate(logfd, 0) != 0 || lseek(logfd, 0, SEEK_SET) != 0) die("log file");
            for (int r = -1; r < reps; r++) /* r = -1: warm-up (connections, pages) */
                for (int q = 0; q < PATHS; q++) {
                    int p = (q + (r < 0 ? 0 : r)) % PATHS;
                    if (p == 4) memset(c[4], 0, nn * es); /* beta 1 adds to zeros: the same C */
                    double t0 = gemm_now_ms();
                    if (p == 0) multiply(cl, dbl, n, a, b, c[0], NULL);
                    else if (p == 2) product(fo, ffo, dbl, n, 0, a, b, 0, c[p]);
                    else product(cb, fcb, dbl, n, p == 3, p == 3 ? at : a, b, p == 4, c[p]);
                    if (r >= 0) t[p][r] = gemm_now_ms() - t0;
                    if (p) seq[nseq++] = r < 0 ? -p : p;
                }
            int got = read_log(logfd, own, exch, nseq);
            if (got != nseq) dprintf(err_fd, "blas_offload: %d log lines for %d preload calls\n", got, nseq), rc = 1;
            double direct = 0, direct_min = 0;
            for (int p = 0; p < PATHS; p++) {
                double mn, med = median_min(t[p], reps, &mn), diff = max_diff(c[p], c[0], nn, dbl);
                double po[MAX_REP], pe[MAX_REP];
                int np = 0;
                for (int i = 0; i < got; i++)
                    if (seq[i] == p && !isnan(own[i])) po[np] = own[i], pe[np++] = exch[i];
                if (p == 0) direct = med, direct_min = mn;
                if (diff > (dbl ? 1e-9 : 1e-2)) rc = 1; /* not the same product */
                char ownb[32] = "-", relb[32] = "-";
                if (np) {
                    double ow = median_min(po, np, NULL);
                    snprintf(ownb, sizeof ownb, "%.3f", ow);
                    snprintf(relb, sizeof relb, "%.2f%%", 100 * ow / median_min(pe, np, NULL));
                }
                printf("| %d | %s | %s | %.1f | %.1f | %.3f | %.3f | %s | %s | %.3g |\n", n,
                       dbl ? "float64" : "float32", path_name[p], med, mn, med / direct, mn / direct_min, ownb, relb,
                       diff);
                fflush(stdout);
            }
            free(a), free(b), free(at);
            for (int p = 0; p < PATHS; p++) free(c[p]);
        }
    }
    gemm_client_free(cl);
    dup2(err_fd, 2);
    return rc;
}

/* ---------------------------------------------------------------- breakeven */

typedef struct {
    int n;
    double host, loop; /* minima */
} row;

/* As many as fit in --budget-s, 3 to 21. */
static int reps_for(double one_ms)
{
    double r = opt.budget_s * 1e3 / fmax(one_ms, 0.001);
    return r < 3 ? 3 : r > 21 ? 21 : (int)r;
}

static int breakeven(void)
{
    gemm_client *cl = client();
    int rc = 0;
    for (const char *dp = opt.dtypes; *dp; dp = strchr(dp, ',') ? strchr(dp, ',') + 1 : dp + strlen(dp)) {
        int dbl = strncmp(dp, "float64", 7) == 0, nr = 0;
        void *host = sym(dbl ? "cblas_dgemm" : "cblas_sgemm", 0);
        row rows[MAX_SIZES];
        printf("### %s\n\n| n | host ms, min (median) | server ms, min (median) | server total ms | server recv ms | "
               "server kernel ms | MB on the wire |\n| --- | --- | --- | --- | --- | --- | --- |\n",
               dbl ? "float64" : "float32");
        for (const char *sp = opt.sizes ? opt.sizes : "64,96,128,192,256,384,512,768,1024,1536,2048";
             *sp && nr < MAX_SIZES;) {
            int n = next_int(&sp);
            if (!n) break;
            size_t nn = (size_t)n * n;
            void *a = random_matrix(nn, dbl, (unsigned)n), *b = random_matrix(nn, dbl, (unsigned)n + 1);
            void *ch = calloc(nn, dbl ? 8 : 4), *cs = calloc(nn, dbl ? 8 : 4);
            row *r = &rows[nr++];
            double th[MAX_REP] = {0}, tl[MAX_REP] = {0}, tt[MAX_REP] = {0}, tr[MAX_REP] = {0}, tk[MAX_REP] = {0};
            double t0 = gemm_now_ms(), hmed, lmed;
            product("cblas_", host, dbl, n, 0, a, b, 0, ch);
            int reps = reps_for(gemm_now_ms() - t0);
            for (int i = 0; i < reps; i++) {
                t0 = gemm_now_ms();
                product("cblas_", host, dbl, n, 0, a, b, 0, ch);
                th[i] = gemm_now_ms() - t0;
            }
            hmed = median_min(th, reps, &r->host);
            gemm_timing tm;
            t0 = gemm_now_ms();
            multiply(cl, dbl, n, a, b, cs, &tm);
            reps = reps_for(gemm_now_ms() - t0);
            for (int i = 0; i < reps; i++) {
                t0 = gemm_now_ms();
                multiply(cl, dbl, n, a, b, cs, &tm);
                tl[i] = gemm_now_ms() - t0, tt[i] = tm.total_ms, tr[i] = fmax(tm.recv_ms, 0), tk[i] = fmax(tm.kernel_ms, 0);
            }
            lmed = median_min(tl, reps, &r->loop);
            r->n = n;
            double diff = max_diff(cs, ch, nn, dbl), mag = 0;
            for (size_t i = 0; i < nn; i++) mag = fmax(mag, fabs(dbl ? ((double *)ch)[i] : ((float *)ch)[i]));
            if (!(diff <= (dbl ? 1e-10 : 1e-3) * (mag + 1)))
                dprintf(err_fd, "blas_offload: n=%d: the server's C differs from the host's by %g\n", n, diff), rc = 1;
            printf("| %d | %.3f (%.3f) | %.3f (%.3f) | %.3f | %.3f | %.3f | %.2f |\n", n, r->host, hmed, r->loop, lmed,
                   median_min(tt, reps, NULL), median_min(tr, reps, NULL), median_min(tk, reps, NULL),
                   ((double)tm.bytes_sent + (double)tm.bytes_received) / 1e6);
            fflush(stdout);
            free(a), free(b), free(ch), free(cs);
        }
        if (!nr) continue;
        int big = rows[nr - 1].n, be = -1; /* the smallest n from which every larger n offloads faster */
        for (int i = nr - 1; i >= 0 && rows[i].loop < rows[i].host; i--) be = rows[i].n;
        printf("\nhost BLAS at n=%d: %.1f GFLOP/s; ", big, 2.0 * big * big * big / (rows[nr - 1].host * 1e6));
        if (be < 0) printf("break-even n > %d\n\n", big);
        else printf("break-even n = %d, 2n^3 = %.2g (GEMM_OFFLOAD_MIN_FLOPS)\n\n", be, 2.0 * be * (double)be * be);
        fflush(stdout);
    }
    gemm_client_free(cl);
    return rc;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 && argc % 2 == 0 ? argv[1] : "";
    for (int i = 2; i + 1 < argc && *mode; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--sizes")) opt.sizes = v;
        else if (!strcmp(k, "--dtypes")) opt.dtypes = v;
        else if (!strcmp(k, "--repeats")) opt.repeats = count(v);
        else if (!strcmp(k, "--small-repeats")) opt.small_repeats = count(v);
        else if (!strcmp(k, "--budget-s")) opt.budget_s = atof(v);
        else mode = "";
    }
    if (!strcmp(mode, "tiny")) return tiny();
    if (!strcmp(mode, "offload")) return offload();
    if (!strcmp(mode, "breakeven")) return breakeven();
    fprintf(stderr, "usage: blas_offload tiny|offload|breakeven [--sizes N,N,...] [--dtypes float32,float64] "
                    "[--repeats R] [--small-repeats R] [--budget-s S] (see the comment at the top of "
                    "bench/blas_offload.c)\n");
    return 2;
}
