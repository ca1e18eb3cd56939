/*
 * blas_breakeven.c - from which size n an n x n x n product is faster on the gemmd server
 * than on this host's BLAS: measured over loopback, and modelled for slower links.
 *
 *   GEMM_SERVER=http://127.0.0.1:8080 build/bench/blas_breakeven
 *       [--sizes 64,96,128,...] [--dtypes float32,float64] [--links 10GbE=1.25e9:0.1,1GbE=1.25e8:0.2]
 *       [--gpu-tflops F32,F64] [--budget-s 20]
 *
 * For each dtype and n (ascending):
 *   host      the host BLAS (GEMM_BLAS_LIB, default libblas.so.3, opened here) computing
 *             cblas_*gemm(RowMajor, N, N) on n x n operands: minimum (and median) over repeats;
 *   loopback  gemm_client_multiply() to GEMM_SERVER over one kept-alive connection: minimum
 *             (and median) of the whole exchange as the client sees it; its Server-Timing is
 *             kept (server total, the receive stage, the kernel: medians) with the bytes sent
 *             and received;
 *   a link    L = bandwidth B (bytes/s) and round trip R (ms), modelled from that run as
 *                 min(server total - server receive) + (bytes sent + bytes received) / B + R
 *             i.e. the server's own work as measured, the transfers at the link's speed, no
 *             overlap of transfer and work (the receive stage is the loopback transfer, so
 *             it is replaced, not added to);
 *   GPU model (with --gpu-tflops) the same, with the server's kernel time replaced by
 *             2n^3 / (the given TFLOP/s): an assumption for a server measured on a CPU.
 * Repeats: at least 3 and as many as fit in --budget-s seconds per measurement (max 21).
 * The comparison uses minima: on a machine shared with other work (the 2-core development
 * box) other processes only ever add time, to either side; on a quiet host min ~ median.
 * Every server answer is checked against the host's C.
 *
 * Then per dtype and column the break-even n: the smallest n of the sweep from which the
 * offload is faster than the host at that n and every larger one (">max" when it never
 * is), with 2n^3, the GEMM_OFFLOAD_MIN_FLOPS it suggests, and the host's GFLOP/s at the
 * largest n divided by each link's bandwidth: the flops per byte a product needs before
 * its transfer is paid back (GEMM_OFFLOAD_MIN_INTENSITY).
 * Output: Markdown tables on stdout.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gemm.h"

typedef void (*cblas_s_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                           float *, int);
typedef void (*cblas_d_fn)(int, int, int, int, int, int, double, const double *, int, const double *, int,
                           double, double *, int);

enum { MAX_SIZES = 32, MAX_LINKS = 6, MAX_REP = 21 };

typedef struct {
    char name[32];
    double bw, rtt_ms;
} link;

typedef struct {
    int n;
    double host_ms, loop_ms;            /* minima: what the break-even is computed from */
    double host_med, loop_med;          /* medians, for the record */
    double srv_total, srv_recv, srv_kernel, work, work_nk, bytes; /* server stages (medians); work =
                                           total - recv, work_nk = work - kernel (minima) */
    double link_ms[MAX_LINKS], gpu_ms[MAX_LINKS];
} row;

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
    double w[MAX_REP];
    memcpy(w, v, (size_t)n * sizeof *v);
    qsort(w, (size_t)n, sizeof *w, cmp_double);
    return n % 2 ? w[n / 2] : (w[n / 2 - 1] + w[n / 2]) / 2;
}

static double minimum(const double *v, int n)
{
    double m = v[0];
    for (int i = 1; i < n; i++) m = v[i] < m ? v[i] : m;
    return m;
}

static int reps_for(double one_ms, double budget_s)
{
    int r = (int)(budget_s * 1e3 / (one_ms > 0.001 ? one_ms : 0.001));
    return r < 3 ? 3 : r > MAX_REP ? MAX_REP : r;
}

/* Smallest n from which every larger n in the sweep has offload < host; -1: never. */
static int breakeven(const row *rows, int nr, int col, int gpu)
{
    int be = -1;
    for (int i = nr - 1; i >= 0; i--) {
        double off = col < 0 ? rows[i].loop_ms : gpu ? rows[i].gpu_ms[col] : rows[i].link_ms[col];
        if (off < rows[i].host_ms) be = rows[i].n;
        else break;
    }
    return be;
}

int main(int argc, char **argv)
{
    const char *sizes = "64,96,128,192,256,384,512,768,1024,1536,2048", *dtypes = "float32,float64";
    const char *links_s = "10GbE=1.25e9:0.1,1GbE=1.25e8:0.2";
    double gpu_tf[2] = {0, 0}, budget = 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--sizes") && i + 1 < argc) sizes = argv[++i];
        else if (!strcmp(argv[i], "--dtypes") && i + 1 < argc) dtypes = argv[++i];
        else if (!strcmp(argv[i], "--links") && i + 1 < argc) links_s = argv[++i];
        else if (!strcmp(argv[i], "--budget-s") && i + 1 < argc) budget = atof(argv[++i]);
        else if (!strcmp(argv[i], "--gpu-tflops") && i + 1 < argc) {
            if (sscanf(argv[++i], "%lf,%lf", &gpu_tf[0], &gpu_tf[1]) != 2) gpu_tf[0] = gpu_tf[1] = 0;
        } else {
            fprintf(stderr, "usage: GEMM_SERVER=URL blas_breakeven [--sizes 64,128,...] [--dtypes float32,float64] "
                            "[--links NAME=BYTES_PER_S:RTT_MS,...] [--gpu-tflops F32,F64] [--budget-s 20]\n");
            return 2;
        }
    }
    link links[MAX_LINKS];
    memset(links, 0, sizeof links);
    int nl = 0;
    for (const char *p = links_s; *p && nl < MAX_LINKS;) {
        const char *e = strchr(p, ',');
        char one[96];
        snprintf(one, sizeof one, "%.*s", (int)(e ? e - p : (long)strlen(p)), p);
        char *eq = strchr(one, '='), *co = eq ? strchr(eq, ':') : NULL;
        if (eq) {
            *eq = '\0';
            snprintf(links[nl].name, sizeof links[nl].name, "%.31s", one);
            links[nl].bw = atof(eq + 1);
            links[nl].rtt_ms = co ? atof(co + 1) : 0;
            if (links[nl].bw > 0) nl++;
        }
        p = e ? e + 1 : p + strlen(p);
    }
    const char *url = getenv("GEMM_SERVER");
    if (!url || !*url) {
        fprintf(stderr, "blas_breakeven: set GEMM_SERVER\n");
        return 2;
    }
    const char *lib = getenv("GEMM_BLAS_LIB");
    if (!lib || !*lib) lib = "libblas.so.3";
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    cblas_s_fn hs = h ? (cblas_s_fn)dlsym(h, "cblas_sgemm") : NULL;
    cblas_d_fn hd = h ? (cblas_d_fn)dlsym(h, "cblas_dgemm") : NULL;
    if (!hs || !hd) {
        fprintf(stderr, "blas_breakeven: no cblas_sgemm/cblas_dgemm in %s\n", lib);
        return 2;
    }
    gemm_client_options o;
    gemm_client_options_init(&o);
    o.token = getenv("GEMM_TOKEN");
    gemm_client_error err;
    gemm_client *cl = gemm_client_new(url, &o, &err);
    if (!cl) {
        fprintf(stderr, "blas_breakeven: %s\n", err.message);
        return 2;
    }
    Dl_info di;
    printf("host BLAS: %s (%s); server: %s\n\n", lib, dladdr((void *)hd, &di) && di.dli_fname ? di.dli_fname : "?",
           url);

    int rc = 0;
    for (const char *dp = dtypes; *dp;) {
        int dbl = strncmp(dp, "float64", 7) == 0;
        dp = strchr(dp, ',') ? strchr(dp, ',') + 1 : dp + strlen(dp);
        size_t es = dbl ? 8 : 4;
        row rows[MAX_SIZES];
        memset(rows, 0, sizeof rows);
        int nr = 0;
        printf("### %s\n\n| n | host ms, min (median) | loopback ms, min (median) | server total ms | server recv ms | "
               "server kernel ms | MB on the wire |", dbl ? "float64" : "float32");
        for (int l = 0; l < nl; l++) printf(" %s ms |", links[l].name);
        for (int l = 0; l < nl && gpu_tf[dbl] > 0; l++) printf(" %s, GPU model ms |", links[l].name);
        printf("\n| --- | --- | --- | --- | --- | --- | --- |");
        for (int l = 0; l < nl * (gpu_tf[dbl] > 0 ? 2 : 1); l++) printf(" --- |");
        printf("\n");
        fflush(stdout);
        for (const char *sp = sizes; *sp && nr < MAX_SIZES;) {
            int n = atoi(sp);
            sp = strchr(sp, ',') ? strchr(sp, ',') + 1 : sp + strlen(sp);
            if (n < 1) continue;
            size_t nn = (size_t)n * n;
            void *a = malloc(nn * es), *b = malloc(nn * es), *ch = malloc(nn * es), *cs = malloc(nn * es);
            if (!a || !b || !ch || !cs) {
                fprintf(stderr, "blas_breakeven: out of memory at n=%d\n", n);
                return 1;
            }
            srand((unsigned)n);
            for (size_t i = 0; i < nn; i++) {
                double x = rand() / (double)RAND_MAX - 0.5, y = rand() / (double)RAND_MAX - 0.5;
                if (dbl) ((double *)a)[i] = x, ((double *)b)[i] = y;
                else ((float *)a)[i] = (float)x, ((float *)b)[i] = (float)y;
            }
            row *r = &rows[nr++];
            memset(r, 0, sizeof *r);
            r->n = n;
            /* host */
            double th[MAX_REP];
            double t0 = now_ms();
            if (dbl) hd(101, 111, 111, n, n, n, 1.0, (double *)a, n, (double *)b, n, 0.0, (double *)ch, n);
            else hs(101, 111, 111, n, n, n, 1.0f, (float *)a, n, (float *)b, n, 0.0f, (float *)ch, n);
            int reps = reps_for(now_ms() - t0, budget);
            for (int i = 0; i < reps; i++) {
                t0 = now_ms();
                if (dbl) hd(101, 111, 111, n, n, n, 1.0, (double *)a, n, (double *)b, n, 0.0, (double *)ch, n);
                else hs(101, 111, 111, n, n, n, 1.0f, (float *)a, n, (float *)b, n, 0.0f, (float *)ch, n);
                th[i] = now_ms() - t0;
            }
            r->host_ms = minimum(th, reps);
            r->host_med = median(th, reps);
            /* loopback */
            gemm_request rq = GEMM_REQUEST_INIT;
            rq.dtype = dbl ? GEMM_DTYPE_F64 : GEMM_DTYPE_F32;
            rq.m = rq.k = rq.n = (uint64_t)n;
            rq.a = a, rq.b = b, rq.c = cs;
            double tl[MAX_REP], tt[MAX_REP], tr[MAX_REP], tk[MAX_REP], tw[MAX_REP], tw2[MAX_REP];
            gemm_timing tm;
            t0 = now_ms();
            if (gemm_client_multiply(cl, &rq, &tm, &err) != 0) {
                fprintf(stderr, "blas_breakeven: n=%d: %s\n", n, err.message);
                return 1;
            }
            reps = reps_for(now_ms() - t0, budget);
            for (int i = 0; i < reps; i++) {
                t0 = now_ms();
                if (gemm_client_multiply(cl, &rq, &tm, &err) != 0) {
                    fprintf(stderr, "blas_breakeven: n=%d: %s\n", n, err.message);
                    return 1;
                }
                tl[i] = now_ms() - t0;
                tt[i] = tm.total_ms;
                tr[i] = tm.recv_ms > 0 ? tm.recv_ms : 0;
                tk[i] = tm.kernel_ms > 0 ? tm.kernel_ms : 0;
                tw[i] = tt[i] - tr[i];
                tw2[i] = tw[i] - tk[i];
            }
            r->loop_ms = minimum(tl, reps);
            r->loop_med = median(tl, reps);
            r->work = minimum(tw, reps);
            r->work_nk = minimum(tw2, reps);
            r->srv_total = median(tt, reps);
            r->srv_recv = median(tr, reps);
            r->srv_kernel = median(tk, reps);
            r->bytes = (double)tm.bytes_sent + (double)tm.bytes_received;
            double diff = 0, mag = 0;
            for (size_t i = 0; i < nn; i++) {
                double x = dbl ? ((double *)cs)[i] : ((float *)cs)[i], y = dbl ? ((double *)ch)[i] : ((float *)ch)[i];
                diff = fmax(diff, fabs(x - y));
                mag = fmax(mag, fabs(y));
                if (isnan(x)) diff = INFINITY;
            }
            if (!(diff <= (dbl ? 1e-10 : 1e-3) * (mag + 1))) {
                fprintf(stderr, "blas_breakeven: n=%d: the server's C differs from the host's by %g\n", n, diff);
                rc = 1;
            }
            for (int l = 0; l < nl; l++) {
                double wire = r->bytes / links[l].bw * 1e3 + links[l].rtt_ms;
                r->link_ms[l] = r->work + wire;
                if (gpu_tf[dbl] > 0)
                    r->gpu_ms[l] = r->work_nk + 2.0 * n * (double)n * n / (gpu_tf[dbl] * 1e12) * 1e3 + wire;
            }
            printf("| %d | %.3f (%.3f) | %.3f (%.3f) | %.3f | %.3f | %.3f | %.2f |", n, r->host_ms, r->host_med,
                   r->loop_ms, r->loop_med, r->srv_total, r->srv_recv, r->srv_kernel, r->bytes / 1e6);
            for (int l = 0; l < nl; l++) printf(" %.3f |", r->link_ms[l]);
            for (int l = 0; l < nl && gpu_tf[dbl] > 0; l++) printf(" %.3f |", r->gpu_ms[l]);
            printf("\n");
            fflush(stdout);
            free(a), free(b), free(ch), free(cs);
        }
        if (nr == 0) continue;
        /* summary */
        double flops_max = 2.0 * rows[nr - 1].n * (double)rows[nr - 1].n * rows[nr - 1].n;
        double host_gfs = flops_max / (rows[nr - 1].host_ms * 1e6);
        printf("\nhost BLAS at n=%d: %.1f GFLOP/s\n\n| offload over | break-even n | 2n^3 (GEMM_OFFLOAD_MIN_FLOPS) | "
               "host GFLOP/s / link bandwidth (flops per byte) |\n| --- | --- | --- | --- |\n",
               rows[nr - 1].n, host_gfs);
        for (int col = -1; col < nl * (gpu_tf[dbl] > 0 ? 2 : 1); col++) {
            int gpu = col >= nl;
            int l = gpu ? col - nl : col;
            int be = breakeven(rows, nr, l, gpu);
            char name[96];
            if (col < 0) snprintf(name, sizeof name, "loopback (measured)");
            else snprintf(name, sizeof name, "%s (modelled%s)", links[l].name, gpu ? ", GPU kernel model" : "");
            char ben[32], fl[32], in[32];
            if (be < 0) snprintf(ben, sizeof ben, "> %d", rows[nr - 1].n), snprintf(fl, sizeof fl, "-");
            else snprintf(ben, sizeof ben, "%d", be), snprintf(fl, sizeof fl, "%.2g", 2.0 * be * (double)be * be);
            if (col < 0) snprintf(in, sizeof in, "-");
            else snprintf(in, sizeof in, "%.0f", host_gfs * 1e9 / links[l].bw);
            printf("| %s | %s | %s | %s |\n", name, ben, fl, in);
        }
        printf("\n");
        if (gpu_tf[dbl] > 0)
            printf("GPU kernel model: %.1f TFLOP/s for %s (an assumption, not a measurement); H2D/D2H copies not "
                   "modelled.\n\n", gpu_tf[dbl], dbl ? "float64" : "float32");
        fflush(stdout);
    }
    gemm_client_free(cl);
    dlclose(h);
    return rc;
}
