/*
 * bench_cpu.c - float32 GFLOP/s of OpenBLAS called directly versus the same product
 * through a running gemmd (POST /v1/matmul, raw binary over loopback), and the
 * end-to-end binary throughput of the largest size.
 *
 *   build/bench/bench_cpu [--gemmd bin/gemmd | --url http://127.0.0.1:8080]
 *                         [--sizes 256,512,1024,1536,2048] [--repeats 7] [--port 18481]
 *
 * --gemmd starts that daemon itself (--port P --backend cpu, plus --gemmd-args "...")
 * on 127.0.0.1 and stops it at the end; --url uses one that is already running.
 *
 * Direct calls and daemon requests alternate (never at once), so both see the same
 * background load. For each n (m = k = n) it prints one Markdown table row:
 *   direct    median wall time of cblas_sgemm here, GFLOP/s (output buffer reused, as a
 *             program calling OpenBLAS in a loop would); "fresh C": the same call writing
 *             into a newly allocated buffer each time, as the daemon's output is
 *   kernel    median of the daemon's own kernel time (Server-Timing kernel;dur=), GFLOP/s,
 *             and direct time / kernel time
 *   e2e       median wall time of the whole request as the client sees it (upload A and B,
 *             queue, compute, download C), GFLOP/s, and direct time / e2e time
 *   payload   (bytes of A + B + C) / e2e time, GB/s
 *   xfer      the same bytes over (e2e - the daemon's work once the body had arrived, i.e.
 *             Server-Timing total - recv): the HTTP path alone (upload and download)
 * Every daemon answer is checked against OpenBLAS before the timed repeats.
 */
#define _GNU_SOURCE
#include <cblas.h>
#include <math.h>

#include "bench_http.h"

#define MAX_SIZES 16

static void usage(void)
{
    fprintf(stderr, "usage: bench_cpu [--gemmd PATH [--gemmd-args \"...\"] [--port P] | --url URL]\n"
                    "                 [--sizes 256,512,...] [--repeats N] [--direct-only]\n");
}

int main(int argc, char **argv)
{
    const char *gemmd = NULL, *url_arg = NULL, *gemmd_args = NULL;
    char sizes_arg[128] = "256,512,1024,1536,2048";
    int repeats = 7, port = 18481, direct_only = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--gemmd") && v) gemmd = v, i++;
        else if (!strcmp(a, "--gemmd-args") && v) gemmd_args = v, i++;
        else if (!strcmp(a, "--url") && v) url_arg = v, i++;
        else if (!strcmp(a, "--port") && v) port = atoi(v), i++;
        else if (!strcmp(a, "--repeats") && v) repeats = atoi(v), i++;
        else if (!strcmp(a, "--sizes") && v) snprintf(sizes_arg, sizeof sizes_arg, "%s", v), i++;
        else if (!strcmp(a, "--direct-only")) direct_only = 1;
        else {
            usage();
            return 2;
        }
    }
    if (repeats < 1 || repeats > 1000 || port < 1 || port > 65535) {
        usage();
        return 2;
    }
    size_t sizes[MAX_SIZES];
    int nsizes = 0;
    for (char *save = NULL, *t = strtok_r(sizes_arg, ",", &save); t && nsizes < MAX_SIZES;
         t = strtok_r(NULL, ",", &save)) {
        long v = atol(t);
        if (v < 1 || v > 16384) {
            usage();
            return 2;
        }
        sizes[nsizes++] = (size_t)v;
    }

    /* OpenBLAS worker threads spin for ~0.1 s after each call by default; ours would take
     * a core from the daemon during its request. They read this once, at load: re-exec. */
    if (!getenv("OPENBLAS_THREAD_TIMEOUT")) {
        setenv("OPENBLAS_THREAD_TIMEOUT", "4", 1);
        execv("/proc/self/exe", argv);
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    openblas_set_num_threads((int)(cores > 0 ? cores : 1));

    char url[256];
    snprintf(url, sizeof url, "%s", url_arg ? url_arg : "");
    pid_t child = -1;
    if (!direct_only) {
        if (gemmd) {
            snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
            child = start_daemon(gemmd, port, gemmd_args);
        } else if (!url_arg) {
            snprintf(url, sizeof url, "http://127.0.0.1:8080");
        }
        curl_global_init(CURL_GLOBAL_DEFAULT);
        if (wait_healthy(url, 30) != 0) {
            fprintf(stderr, "bench_cpu: no daemon answered %s/healthz\n", url);
            if (child > 0) kill(child, SIGTERM), waitpid(child, NULL, 0);
            return 1;
        }
    }

    struct curl_slist *hdrs = NULL;
    CURL *c = direct_only ? NULL : bench_curl(&hdrs);

    int rc_all = 0;
    double dir[MAX_SIZES], dirf[MAX_SIZES];
    double *t_dir = calloc((size_t)repeats, sizeof *t_dir);
    double *t_ker = calloc((size_t)repeats, sizeof *t_ker);
    double *t_srv = calloc((size_t)repeats, sizeof *t_srv);
    double *t_dirf = calloc((size_t)repeats, sizeof *t_dirf);
    double *t_e2e = calloc((size_t)repeats, sizeof *t_e2e);
    if (!t_dir || !t_ker || !t_srv || !t_e2e || !t_dirf) return 1;

    /* Per size: one untimed direct call (the reference) and one untimed, checked daemon
     * request, then `repeats` rounds of {direct call, daemon request, pause}. Alternating
     * puts both under the same background load; the pause lets the daemon's OpenBLAS
     * threads stop spinning before the next direct call (ours stop at once: see main). */
    double ker[MAX_SIZES], srv[MAX_SIZES], e2e[MAX_SIZES];
    answer ans = {{NULL, 0, 0}, -1, -1, -1, 0};
    struct timespec pause = {0, 200000000};
    for (int s = 0; s < nsizes; s++) {
        size_t n = sizes[s], nn = n * n;
        ker[s] = srv[s] = e2e[s] = NAN;
        float *ab = malloc(2 * nn * sizeof(float)), *cref = malloc(nn * sizeof(float));
        if (!ab || !cref) {
            fprintf(stderr, "bench_cpu: out of memory at n=%zu\n", n);
            return 1;
        }
        bench_fill(ab, 2 * nn, n);
        int bad = 0;
        for (int r = -1; r < repeats && !bad; r++) {
            double t0 = gemm_now_ms();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)n, (int)n, 1.0f, ab,
                        (int)n, ab + nn, (int)n, 0.0f, cref, (int)n);
            double t1 = gemm_now_ms();
            if (r >= 0) t_dir[r] = t1 - t0;
            /* the same call into a freshly allocated output, as the daemon's is */
            float *fresh = gemm_alloc(&gemm_allocator_host, nn * sizeof(float));
            if (!fresh) return 1;
            t0 = gemm_now_ms();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)n, (int)n, 1.0f, ab,
                        (int)n, ab + nn, (int)n, 0.0f, fresh, (int)n);
            t1 = gemm_now_ms();
            gemm_free(&gemm_allocator_host, fresh);
            if (r >= 0) t_dirf[r] = t1 - t0;
            if (!c) continue;

            double wall = post_matmul(c, url, ab, 2 * nn * sizeof(float), n, n, n, &ans);
            if (wall < 0 || ans.status != 200 || ans.body.len != nn * sizeof(float)) {
                fprintf(stderr, "bench_cpu: n=%zu: status %ld, %zu bytes (expected %zu)%s%.*s\n", n,
                        ans.status, ans.body.len, nn * sizeof(float), ans.body.len < 1024 ? ": " : "",
                        ans.body.len < 1024 ? (int)ans.body.len : 0,
                        ans.body.data ? ans.body.data : "");
                bad = 1;
                break;
            }
            nanosleep(&pause, NULL);
            if (r == -1) { /* correctness before speed */
                double worst = 0;
                for (size_t i = 0; i < nn; i++) {
                    float got; /* the body is bytes: copy, not a cast (alignment, aliasing) */
                    memcpy(&got, ans.body.data + i * sizeof got, sizeof got);
                    double d = fabs((double)got - (double)cref[i]);
                    if (!(d <= worst)) worst = d;
                }
                /* the same float32 product in possibly different summation orders: a few
                 * ulps of sum|a||b| <= n */
                if (!(worst <= 1e-5 * (double)n)) {
                    fprintf(stderr, "bench_cpu: n=%zu: daemon answer differs by %g\n", n, worst);
                    bad = 1;
                }
                continue;
            }
            if (ans.kernel_ms < 0 || ans.total_ms < 0) {
                fprintf(stderr, "bench_cpu: n=%zu: no kernel;dur / total;dur in Server-Timing\n", n);
                bad = 1;
            }
            t_ker[r] = ans.kernel_ms;
            /* the daemon's work after the body arrived: decode, queue, compute, encode */
            t_srv[r] = ans.total_ms - (ans.recv_ms > 0 ? ans.recv_ms : 0);
            t_e2e[r] = wall;
        }
        dir[s] = median(t_dir, repeats);
        dirf[s] = median(t_dirf, repeats);
        if (bad) {
            rc_all = 1;
        } else if (c) {
            ker[s] = median(t_ker, repeats);
            srv[s] = median(t_srv, repeats);
            e2e[s] = median(t_e2e, repeats);
        }
        free(ab);
        free(cref);
    }

    double load[3] = {0, 0, 0};
    if (getloadavg(load, 3) < 0) load[0] = load[1] = load[2] = -1;
    printf("# float32 C = A.B, n x n x n, median of %d repeats after one warm-up (checked)\n", repeats);
    printf("# load average at the end: %.2f %.2f %.2f (%ld cores)\n", load[0], load[1], load[2], cores);
    printf("# direct: cblas_sgemm in this process, %ld threads; daemon: %s\n", cores,
           c ? url : "(not measured)");
    printf("# kernel: the daemon's Server-Timing kernel;dur; e2e: client wall time of the request;\n"
           "# payload: (A + B + C bytes) / e2e; xfer: payload / (e2e - (Server-Timing total - recv))\n");
    printf("| n | direct ms | direct GFLOP/s | direct, fresh C ms | kernel ms | kernel GFLOP/s | kernel vs direct "
           "| e2e ms | e2e GFLOP/s | e2e vs direct | payload GB/s | xfer GB/s |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int s = 0; s < nsizes; s++) {
        size_t n = sizes[s];
        double flops = 2.0 * (double)n * (double)n * (double)n;
        double payload = 3.0 * (double)n * (double)n * sizeof(float);
        printf("| %zu | %.3f | %.1f | %.3f |", n, dir[s], flops / dir[s] / 1e6, dirf[s]);
        if (isnan(e2e[s])) {
            printf(" - | - | - | - | - | - | - | - |\n");
            continue;
        }
        printf(" %.3f | %.1f | %.1f%% | %.3f | %.1f | %.1f%% | %.2f | %.2f |\n", ker[s],
               flops / ker[s] / 1e6, 100.0 * dir[s] / ker[s], e2e[s], flops / e2e[s] / 1e6,
               100.0 * dir[s] / e2e[s], payload / (e2e[s] * 1e-3) / 1e9,
               e2e[s] > srv[s] ? payload / ((e2e[s] - srv[s]) * 1e-3) / 1e9 : NAN);
    }

    free(t_srv);
    free(t_dirf);
    free(t_dir), free(t_ker), free(t_e2e);
    free(ans.body.data);
    if (c) {
        curl_slist_free_all(hdrs);
        curl_easy_cleanup(c);
        curl_global_cleanup();
    }
    if (child > 0) {
        kill(child, SIGTERM);
        waitpid(child, NULL, 0);
    }
    return rc_all;
}
