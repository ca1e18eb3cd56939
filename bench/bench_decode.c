/*
 * bench_decode.c - in-process throughput of the request and answer codecs in common/,
 * for float32 n x n operands (no HTTP, no engine):
 *
 *   json decode       gemm_json_decode_request on {"dtype": "float32", "a": .., "b": ..}
 *   npy stream        A.npy and B.npy fed to gemm_npy_reader in 64 KiB chunks
 *   multipart+npy     one multipart/form-data body (parts a and b, each a .npy file) fed to
 *                     gemm_multipart in 64 KiB chunks, each part streamed into its reader
 *   json encode       gemm_json_write_matrix of C (n x n) into a fresh gemm_buf
 *   json encode f64   the same for a float64 C (17 significant digits; matrix MB/s counts
 *                     its 8-byte elements)
 *
 *   build/bench/bench_decode [--sizes 256,1024,2048] [--repeats 7]
 *
 * Values are uniform in [-1, 1) (so JSON carries ~11 significant characters each). Every
 * decoded matrix is compared with its source before timing. Each cell is the median of
 * the repeats. "wire MB/s" is bytes of the request (or answer) body per second; "matrix
 * MB/s" is the bytes of the float32 matrices they carry per second (MB = 10^6 bytes).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_codec.h"
#include "multipart.h"
#include "npy.h"

#define CHUNK (64 * 1024)
#define MAX_SIZES 16
#define MAX_REPEATS 64

static void die(const char *what, const gemm_err *err)
{
    fprintf(stderr, "bench_decode: %s: %s\n", what, err ? err->message : "failed");
    exit(1);
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

static float *random_matrix(size_t n, uint64_t seed)
{
    float *m = malloc(n * n * sizeof *m);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    if (!m) die("malloc", NULL);
    for (size_t i = 0; i < n * n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        m[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
    return m;
}

/* A whole .npy file of an n x n float32 matrix. */
static unsigned char *npy_file(const float *m, size_t n, size_t *len)
{
    unsigned char hdr[128];
    size_t h = gemm_npy_write_header(hdr, sizeof hdr, GEMM_DTYPE_F32, n, n);
    unsigned char *f = malloc(h + n * n * 4);
    if (!h || !f) die("npy header", NULL);
    memcpy(f, hdr, h);
    memcpy(f + h, m, n * n * 4);
    *len = h + n * n * 4;
    return f;
}

static void check(const gemm_matrix *got, const float *want, size_t n, const char *what)
{
    if (got->rows != n || got->cols != n || got->dtype != GEMM_DTYPE_F32 || memcmp(got->data, want, n * n * 4)) {
        fprintf(stderr, "bench_decode: %s decoded the wrong matrix\n", what);
        exit(1);
    }
}

/* ---- npy streamed in chunks ---------------------------------------------- */

static void npy_stream(const unsigned char *f, size_t len, gemm_matrix *out)
{
    gemm_limits lim = {0, 0, 0};
    gemm_err err;
    gemm_npy_reader *r = gemm_npy_reader_new(&lim, &gemm_allocator_host);
    for (size_t off = 0; off < len; off += CHUNK) {
        size_t c = len - off < CHUNK ? len - off : CHUNK;
        if (gemm_npy_reader_feed(r, f + off, c, &err)) die("npy feed", &err);
    }
    if (gemm_npy_reader_finish(r, out, &err)) die("npy finish", &err);
    gemm_npy_reader_free(r);
}

/* ---- multipart whose parts are .npy files ----------------------------------- */

typedef struct {
    gemm_npy_reader *r[2];
    int cur;
    gemm_matrix m[2];
} mp_state;

static int mp_begin(void *u, const char *name, const char *filename, const char *ct, gemm_err *err)
{
    (void)filename, (void)ct;
    mp_state *s = u;
    s->cur = strcmp(name, "a") == 0 ? 0 : strcmp(name, "b") == 0 ? 1 : -1;
    if (s->cur < 0) return gemm_err_set(err, 400, "bad_part", "unexpected part %s", name);
    s->r[s->cur] = gemm_npy_reader_new(NULL, &gemm_allocator_host);
    return s->r[s->cur] ? 0 : -1;
}

static int mp_data(void *u, const void *d, size_t n, gemm_err *err)
{
    mp_state *s = u;
    return gemm_npy_reader_feed(s->r[s->cur], d, n, err);
}

static int mp_end(void *u, gemm_err *err)
{
    mp_state *s = u;
    int rc = gemm_npy_reader_finish(s->r[s->cur], &s->m[s->cur], err);
    gemm_npy_reader_free(s->r[s->cur]);
    s->r[s->cur] = NULL;
    return rc;
}

static void multipart_decode(const char *ct, const unsigned char *body, size_t len, gemm_matrix out[2])
{
    static const gemm_multipart_callbacks cb = {mp_begin, mp_data, mp_end};
    mp_state s;
    gemm_err err;
    memset(&s, 0, sizeof s);
    gemm_multipart *mp = gemm_multipart_new(ct, &cb, &s, &err);
    if (!mp) die("multipart", &err);
    for (size_t off = 0; off < len; off += CHUNK) {
        size_t c = len - off < CHUNK ? len - off : CHUNK;
        if (gemm_multipart_feed(mp, body + off, c, &err)) die("multipart feed", &err);
    }
    if (gemm_multipart_finish(mp, &err)) die("multipart finish", &err);
    gemm_multipart_free(mp);
    out[0] = s.m[0];
    out[1] = s.m[1];
}

static unsigned char *multipart_body(const char *boundary, const unsigned char *fa, size_t la,
                                     const unsigned char *fb, size_t lb, size_t *len)
{
    gemm_buf b;
    gemm_buf_init(&b);
    gemm_buf_printf(&b, "--%s\r\nContent-Disposition: form-data; name=\"a\"; filename=\"A.npy\"\r\n"
                        "Content-Type: application/octet-stream\r\n\r\n", boundary);
    gemm_buf_append(&b, fa, la);
    gemm_buf_printf(&b, "\r\n--%s\r\nContent-Disposition: form-data; name=\"b\"; filename=\"B.npy\"\r\n"
                        "Content-Type: application/octet-stream\r\n\r\n", boundary);
    gemm_buf_append(&b, fb, lb);
    gemm_buf_printf(&b, "\r\n--%s--\r\n", boundary);
    if (b.failed) die("multipart body", NULL);
    *len = b.len;
    return (unsigned char *)b.data;
}

/* ---- main ------------------------------------------------------------------ */

static void row(const char *what, size_t n, size_t wire, size_t matrix, double ms)
{
    printf("| %-15s | %5zu | %10.1f | %9.2f | %9.1f | %10.1f |\n", what, n, wire / 1e6, ms, wire / 1e3 / ms,
           matrix / 1e3 / ms);
}

int main(int argc, char **argv)
{
    size_t sizes[MAX_SIZES] = {256, 1024, 2048};
    int nsizes = 3, repeats = 7;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
            nsizes = 0;
            for (char *p = strtok(argv[++i], ","); p && nsizes < MAX_SIZES; p = strtok(NULL, ","))
                sizes[nsizes++] = strtoul(p, NULL, 10);
        } else if (strcmp(argv[i], "--repeats") == 0 && i + 1 < argc) {
            repeats = atoi(argv[++i]);
            if (repeats < 1) repeats = 1;
            if (repeats > MAX_REPEATS) repeats = MAX_REPEATS;
        } else {
            fprintf(stderr, "usage: bench_decode [--sizes 256,1024,2048] [--repeats 7]\n");
            return 2;
        }
    }

    printf("| codec           |     n |  body (MB) | median ms | wire MB/s | matrix MB/s |\n");
    printf("| --------------- | ----: | ---------: | --------: | --------: | ----------: |\n");
    for (int si = 0; si < nsizes; si++) {
        size_t n = sizes[si], mbytes = n * n * 4;
        float *A = random_matrix(n, 1), *B = random_matrix(n, 2);
        gemm_matrix ma = {n, n, GEMM_DTYPE_F32, A, 0}, mb = {n, n, GEMM_DTYPE_F32, B, 0};
        double t[MAX_REPEATS];
        gemm_err err;

        /* JSON decode */
        gemm_buf body;
        gemm_buf_init(&body);
        gemm_buf_puts(&body, "{\"dtype\": \"float32\", \"a\": ");
        gemm_json_write_matrix(&body, &ma);
        gemm_buf_puts(&body, ", \"b\": ");
        gemm_json_write_matrix(&body, &mb);
        gemm_buf_puts(&body, "}");
        if (body.failed) die("json body", NULL);
        for (int r = 0; r <= repeats; r++) {
            gemm_options opt;
            gemm_matrix a, b;
            gemm_options_init(&opt);
            double t0 = gemm_now_ms();
            if (gemm_json_decode_request(body.data, body.len, NULL, &gemm_allocator_host, &opt, &a, &b, &err))
                die("json decode", &err);
            double t1 = gemm_now_ms();
            if (r == 0) {
                check(&a, A, n, "json a");
                check(&b, B, n, "json b");
            } else {
                t[r - 1] = t1 - t0;
            }
            gemm_allocator_host.free(NULL, a.data);
            gemm_allocator_host.free(NULL, b.data);
        }
        row("json decode", n, body.len, 2 * mbytes, median(t, repeats));
        gemm_buf_free(&body);

        /* npy streamed */
        size_t la, lb;
        unsigned char *fa = npy_file(A, n, &la), *fb = npy_file(B, n, &lb);
        for (int r = 0; r <= repeats; r++) {
            gemm_matrix a, b;
            double t0 = gemm_now_ms();
            npy_stream(fa, la, &a);
            npy_stream(fb, lb, &b);
            double t1 = gemm_now_ms();
            if (r == 0) {
                check(&a, A, n, "npy a");
                check(&b, B, n, "npy b");
            } else {
                t[r - 1] = t1 - t0;
            }
            gemm_allocator_host.free(NULL, a.data);
            gemm_allocator_host.free(NULL, b.data);
        }
        row("npy stream", n, la + lb, 2 * mbytes, median(t, repeats));

        /* multipart + npy */
        const char *boundary = "------------------------d74496d66958873e";
        char ct[128];
        snprintf(ct, sizeof ct, "multipart/form-data; boundary=%s", boundary);
        size_t lm;
        unsigned char *mpb = multipart_body(boundary, fa, la, fb, lb, &lm);
        for (int r = 0; r <= repeats; r++) {
            gemm_matrix m[2];
            double t0 = gemm_now_ms();
            multipart_decode(ct, mpb, lm, m);
            double t1 = gemm_now_ms();
            if (r == 0) {
                check(&m[0], A, n, "multipart a");
                check(&m[1], B, n, "multipart b");
            } else {
                t[r - 1] = t1 - t0;
            }
            gemm_allocator_host.free(NULL, m[0].data);
            gemm_allocator_host.free(NULL, m[1].data);
        }
        row("multipart+npy", n, lm, 2 * mbytes, median(t, repeats));
        free(mpb);
        free(fa);
        free(fb);

        /* JSON encode of C (A stands in for it: same shape and kind of values) */
        size_t out_len = 0;
        for (int r = 0; r <= repeats; r++) {
            gemm_buf out;
            gemm_buf_init(&out);
            double t0 = gemm_now_ms();
            gemm_buf_puts(&out, "{\"c\": ");
            gemm_json_write_matrix(&out, &ma);
            gemm_buf_puts(&out, "}");
            double t1 = gemm_now_ms();
            if (out.failed) die("json encode", NULL);
            out_len = out.len;
            if (r > 0) t[r - 1] = t1 - t0;
            gemm_buf_free(&out);
        }
        row("json encode", n, out_len, mbytes, median(t, repeats));

        /* the same answer in float64 (17 significant digits) */
        double *C64 = malloc(n * n * sizeof *C64);
        if (!C64) die("malloc", NULL);
        for (size_t i = 0; i < n * n; i++) C64[i] = (double)A[i] * (1.0 + 1.0 / 3.0);
        gemm_matrix mc64 = {n, n, GEMM_DTYPE_F64, C64, 0};
        for (int r = 0; r <= repeats; r++) {
            gemm_buf out;
            gemm_buf_init(&out);
            double t0 = gemm_now_ms();
            gemm_buf_puts(&out, "{\"c\": ");
            gemm_json_write_matrix(&out, &mc64);
            gemm_buf_puts(&out, "}");
            double t1 = gemm_now_ms();
            if (out.failed) die("json encode", NULL);
            out_len = out.len;
            if (r > 0) t[r - 1] = t1 - t0;
            gemm_buf_free(&out);
        }
        row("json encode f64", n, out_len, 2 * mbytes, median(t, repeats));
        free(C64);
        free(A);
        free(B);
        fflush(stdout);
    }
    return 0;
}
