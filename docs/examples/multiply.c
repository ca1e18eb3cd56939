/*
 * multiply.c - the libgemm example of docs/CLIENT.md: one product on a gemmd server.
 *
 * In the source tree, after `make` (and with a daemon running: `make run`):
 *
 *   cc docs/examples/multiply.c $(PKG_CONFIG_PATH=lib/pkgconfig pkg-config --cflags --libs gemm) \
 *      -Wl,-rpath,$PWD/lib -o multiply
 *   ./multiply http://127.0.0.1:8080
 *
 * Against an installed libgemm (`make install`, PREFIX=/usr/local: Debian's pkg-config
 * and dynamic linker look in /usr/local/lib already), from share/doc/gemmd/examples:
 *
 *   cc multiply.c $(pkg-config --cflags --libs gemm) -o multiply
 *   cc multiply.c $(pkg-config --cflags --libs gemm-static) -o multiply
 *
 * (the second links libgemm.a into the program). Another PREFIX: put PREFIX/lib/pkgconfig
 * in PKG_CONFIG_PATH and add -Wl,-rpath,PREFIX/lib.
 *
 * Multiplies a 3x4 by a 4x2 float64 matrix, prints C and the server's stages, and checks
 * C against a local computation. Exit status 0 when the answer is right.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <gemm.h>

int main(int argc, char **argv)
{
    const char *url = argc > 1 ? argv[1] : getenv("GEMM_SERVER");
    if (!url) url = "http://127.0.0.1:8080";

    enum { M = 3, K = 4, N = 2 };
    double a[M * K], b[K * N], c[M * N];
    for (int i = 0; i < M * K; i++) a[i] = i + 1;       /* row-major */
    for (int i = 0; i < K * N; i++) b[i] = 0.5 * (i - 3);

    gemm_client_options opt;
    gemm_client_options_init(&opt);
    opt.token = getenv("GEMM_TOKEN"); /* NULL: no token */
    opt.timeout_ms = 30000;           /* give up on a request after 30 s */
    opt.max_retries = 5;              /* retry 503 queue_full, honouring Retry-After */

    gemm_client_error err;
    gemm_client *cl = gemm_client_new(url, &opt, &err);
    if (!cl) {
        fprintf(stderr, "gemm_client_new: %s\n", err.message);
        return 1;
    }

    gemm_request req = GEMM_REQUEST_INIT;
    req.dtype = GEMM_DTYPE_F64;
    req.m = M;
    req.k = K;
    req.n = N;
    req.a = a; /* sent as they are: no copy */
    req.b = b;
    req.c = c; /* the answer is written here */

    gemm_timing t;
    if (gemm_client_multiply(cl, &req, &t, &err) != 0) {
        /* kind says what failed: the server (http_status, code, message), the
         * connection, a timeout ... */
        fprintf(stderr, "multiply failed (%s): HTTP %d %s: %s\n", gemm_client_error_kind_name(err.kind),
                err.http_status, err.code, err.message);
        gemm_client_free(cl);
        return 1;
    }
    gemm_client_free(cl);

    int bad = 0;
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            double ref = 0;
            for (int q = 0; q < K; q++) ref += a[i * K + q] * b[q * N + j];
            printf("%8.2f%s", c[i * N + j], j + 1 < N ? " " : "\n");
            if (fabs(c[i * N + j] - ref) > 1e-12 * (1 + fabs(ref))) bad = 1;
        }
    }
    printf("kernel %s: server %.3f ms (queue %.3f, kernel %.3f), request %.3f ms\n", t.kernel, t.total_ms,
           t.queue_ms, t.kernel_ms, t.client_total_ms);
    if (bad) fprintf(stderr, "C differs from the local product\n");
    return bad;
}
