/*
 * bench_codec.c - the request and answer codecs of common/ in process, no HTTP and no engine:
 * how many bytes of each format one core decodes or encodes per second.
 *
 *   build/bench/bench_codec [--sizes 256,1024,2048] [--dtypes float32,float64,int32]
 *                           [--repeats 5] [--chunk 65536]
 *
 * For each n and dtype, A and B are n x n (uniform in [-1, 1), int32 over its whole range):
 *   json whole       gemm_json_stream given {"dtype": .., "a": [[..]], "b": [[..]]} at once,
 *                    as written by the daemon's writer (9 significant digits for float32, 17
 *                    for float64)
 *   json stream      gemm_json_stream fed --chunk bytes at a time, as the daemon feeds it
 *                    (peak KiB: the most it held from its allocator, both operands)
 *   json dtype-last  the same with "dtype" after the matrices (held as float64 meanwhile)
 *   npy stream       A.npy and B.npy fed to gemm_npy_reader in --chunk pieces
 *   multipart+npy    one multipart/form-data body, parts a and b (.npy files), fed to
 *                    gemm_multipart in --chunk pieces, each part streamed into its reader
 *   json encode      gemm_json_write_matrix of an n x n answer into a fresh gemm_buf
 * Every decoded matrix is compared bit for bit with its source before timing. Times are the
 * thread's CPU time (CLOCK_THREAD_CPUTIME_ID, page faults included), so a shared machine's
 * waits for a core do not count; each way runs once checked, then --repeats times back to
 * back (memory it frees is reused by its next run, as in a daemon), and the median is
 * printed. body MB/s: bytes of the body (or answer) per CPU second; matrix MB/s: bytes of
 * the matrices it carries (MB = 10^6 bytes). To compare with an older tree, build and run
 * this program there too (bench/load.py --servers NAME=@REV does the same for the daemon).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "json_codec.h"
#include "json_stream.h"
#include "json_stream_int.h" /* the decoder's state: the most it held, s->mem.peak */
#include "multipart.h"
#include "npy.h"

#define MAX_REPEATS 64

typedef struct {
    size_t n, chunk;
    gemm_dtype dtype;
    gemm_matrix a, b;
    gemm_buf json, last;              /* dtype first, dtype last */
    unsigned char *npy[2], *multipart; /* A.npy, B.npy; the form */
    size_t npy_len[2], multipart_len, peak, answer_len;
    char content_type[96];
} ctx;

static void die(const char *what, const gemm_err *err)
{
    fprintf(stderr, "bench_codec: %s: %s\n", what, err ? err->message : "failed");
    exit(1);
}

static double cpu_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static size_t bytes_of(const gemm_matrix *m)
{
    return m->rows * m->cols * gemm_dtype_size(m->dtype);
}

/* Checks (when asked) and frees a decoded operand. */
static void done_with(const ctx *c, gemm_matrix *got, int which, int verify)
{
    const gemm_matrix *want = which ? &c->b : &c->a;
    if (verify && (got->rows != want->rows || got->cols != want->cols || got->dtype != want->dtype ||
                   memcmp(got->data, want->data, bytes_of(want))))
        die("a decoder gave back the wrong matrix", NULL);
    gemm_allocator_host.free(NULL, got->data);
}

static double json_stream_of(ctx *c, const gemm_buf *body, size_t chunk, int verify)
{
    gemm_options opt;
    gemm_matrix a, b;
    gemm_err err;
    gemm_options_init(&opt);
    double t0 = cpu_ms();
    gemm_json_stream *js = gemm_json_stream_new(NULL, &gemm_allocator_host, &opt, body->len);
    if (!js) die("json stream", NULL);
    for (size_t off = 0; off < body->len; off += chunk)
        if (gemm_json_stream_feed(js, body->data + off, body->len - off < chunk ? body->len - off : chunk, &err))
            die("json stream", &err);
    if (gemm_json_stream_finish(js, &opt, &a, &b, &err)) die("json stream finish", &err);
    c->peak = js->mem.peak;
    gemm_json_stream_free(js);
    double ms = cpu_ms() - t0;
    done_with(c, &a, 0, verify), done_with(c, &b, 1, verify);
    return ms;
}

static double json_whole(ctx *c, int verify)
{
    return json_stream_of(c, &c->json, c->json.len, verify);
}

static double json_stream(ctx *c, int verify)
{
    return json_stream_of(c, &c->json, c->chunk, verify);
}

static double json_last(ctx *c, int verify)
{
    return json_stream_of(c, &c->last, c->chunk, verify);
}

static void npy_feed(const ctx *c, gemm_npy_reader *r, const unsigned char *p, size_t len)
{
    gemm_err err;
    for (size_t off = 0; off < len; off += c->chunk)
        if (gemm_npy_reader_feed(r, p + off, len - off < c->chunk ? len - off : c->chunk, &err)) die("npy", &err);
}

static double npy_stream(ctx *c, int verify)
{
    gemm_matrix m[2];
    gemm_err err;
    double t0 = cpu_ms();
    for (int i = 0; i < 2; i++) {
        gemm_npy_reader *r = gemm_npy_reader_new(NULL, &gemm_allocator_host);
        if (!r) die("npy", NULL);
        npy_feed(c, r, c->npy[i], c->npy_len[i]);
        if (gemm_npy_reader_finish(r, &m[i], &err)) die("npy finish", &err);
        gemm_npy_reader_free(r);
    }
    double ms = cpu_ms() - t0;
    done_with(c, &m[0], 0, verify), done_with(c, &m[1], 1, verify);
    return ms;
}

typedef struct {
    gemm_npy_reader *r[2];
    int cur;
    gemm_matrix m[2];
} parts;

static int part_begin(void *u, const char *name, const char *filename, const char *ct, gemm_err *err)
{
    (void)filename, (void)ct;
    parts *s = u;
    s->cur = strcmp(name, "b") == 0;
    if (strcmp(name, s->cur ? "b" : "a")) return gemm_err_set(err, 400, "bad_part", "unexpected part %s", name);
    s->r[s->cur] = gemm_npy_reader_new(NULL, &gemm_allocator_host);
    return s->r[s->cur] ? 0 : -1;
}

static int part_data(void *u, const void *d, size_t n, gemm_err *err)
{
    parts *s = u;
    return gemm_npy_reader_feed(s->r[s->cur], d, n, err);
}

static int part_end(void *u, gemm_err *err)
{
    parts *s = u;
    int rc = gemm_npy_reader_finish(s->r[s->cur], &s->m[s->cur], err);
    gemm_npy_reader_free(s->r[s->cur]);
    s->r[s->cur] = NULL;
    return rc;
}

static double multipart(ctx *c, int verify)
{
    static const gemm_multipart_callbacks cb = {part_begin, part_data, part_end};
    parts s;
    gemm_err err;
    memset(&s, 0, sizeof s);
    double t0 = cpu_ms();
    gemm_multipart *mp = gemm_multipart_new(c->content_type, &cb, &s, &err);
    if (!mp) die("multipart", &err);
    for (size_t off = 0; off < c->multipart_len; off += c->chunk)
        if (gemm_multipart_feed(mp, c->multipart + off,
                                c->multipart_len - off < c->chunk ? c->multipart_len - off : c->chunk, &err))
            die("multipart", &err);
    if (gemm_multipart_finish(mp, &err)) die("multipart finish", &err);
    gemm_multipart_free(mp);
    double ms = cpu_ms() - t0;
    done_with(c, &s.m[0], 0, verify), done_with(c, &s.m[1], 1, verify);
    return ms;
}

static double json_encode(ctx *c, int verify)
{
    (void)verify; /* the decoders check the writer's text: it is their input */
    gemm_buf out;
    gemm_buf_init(&out);
    double t0 = cpu_ms();
    gemm_buf_puts(&out, "{\"c\": ");
    gemm_json_write_matrix(&out, &c->a);
    gemm_buf_puts(&out, "}");
    double ms = cpu_ms() - t0;
    if (out.failed) die("json encode", NULL);
    c->answer_len = out.len;
    gemm_buf_free(&out);
    return ms;
}

static void prepare(ctx *c)
{
    uint64_t s = 0x9E3779B97F4A7C15ull + c->n * 31 + (uint64_t)c->dtype;
    gemm_matrix *m[2] = {&c->a, &c->b};
    for (int w = 0; w < 2; w++) {
        *m[w] = (gemm_matrix){c->n, c->n, c->dtype, malloc(c->n * c->n * gemm_dtype_size(c->dtype)), 0};
        if (!m[w]->data) die("malloc", NULL);
        for (size_t i = 0; i < c->n * c->n; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            double u = (double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0;
            if (c->dtype == GEMM_DTYPE_F32) ((float *)m[w]->data)[i] = (float)u;
            else if (c->dtype == GEMM_DTYPE_F64) ((double *)m[w]->data)[i] = u;
            else ((int32_t *)m[w]->data)[i] = (int32_t)(uint32_t)s;
        }
        unsigned char hdr[128];
        size_t h = gemm_npy_write_header3(hdr, sizeof hdr, c->dtype, 0, c->n, c->n), len = h + bytes_of(m[w]);
        if (!h || !(c->npy[w] = malloc(len))) die("npy file", NULL);
        memcpy(c->npy[w], hdr, h);
        memcpy(c->npy[w] + h, m[w]->data, bytes_of(m[w]));
        c->npy_len[w] = len;
    }
    const char *dt = gemm_dtype_name(c->dtype);
    for (int last = 0; last < 2; last++) {
        gemm_buf *b = last ? &c->last : &c->json;
        gemm_buf_init(b);
        if (!last) gemm_buf_printf(b, "{\"dtype\": \"%s\", ", dt);
        gemm_buf_puts(b, last ? "{\"a\": " : "\"a\": ");
        gemm_json_write_matrix(b, &c->a);
        gemm_buf_puts(b, ", \"b\": ");
        gemm_json_write_matrix(b, &c->b);
        if (last) gemm_buf_printf(b, ", \"dtype\": \"%s\"", dt);
        gemm_buf_puts(b, "}");
        if (b->failed) die("json body", NULL);
    }
    const char *bd = "------------------------d74496d66958873e";
    snprintf(c->content_type, sizeof c->content_type, "multipart/form-data; boundary=%s", bd);
    gemm_buf f;
    gemm_buf_init(&f);
    for (int w = 0; w < 2; w++) {
        gemm_buf_printf(&f, "%s--%s\r\nContent-Disposition: form-data; name=\"%c\"; filename=\"%c.npy\"\r\n"
                        "Content-Type: application/octet-stream\r\n\r\n", w ? "\r\n" : "", bd, "ab"[w], "AB"[w]);
        gemm_buf_append(&f, c->npy[w], c->npy_len[w]);
    }
    gemm_buf_printf(&f, "\r\n--%s--\r\n", bd);
    if (f.failed) die("multipart body", NULL);
    c->multipart = (unsigned char *)f.data, c->multipart_len = f.len;
}

static void release(ctx *c)
{
    free(c->a.data), free(c->b.data), free(c->npy[0]), free(c->npy[1]), free(c->multipart);
    gemm_buf_free(&c->json), gemm_buf_free(&c->last);
}

int main(int argc, char **argv)
{
    char sizes[256] = "256,1024,2048", dtypes[256] = "float32,float64,int32";
    int repeats = 5;
    ctx c;
    memset(&c, 0, sizeof c);
    c.chunk = 65536;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[++i] : NULL;
        if (v && !strcmp(a, "--sizes")) snprintf(sizes, sizeof sizes, "%s", v);
        else if (v && !strcmp(a, "--dtypes")) snprintf(dtypes, sizeof dtypes, "%s", v);
        else if (v && !strcmp(a, "--repeats")) repeats = atoi(v);
        else if (v && !strcmp(a, "--chunk")) c.chunk = strtoul(v, NULL, 10);
        else {
            fprintf(stderr, "usage: bench_codec [--sizes 256,1024,2048] [--dtypes float32,float64,int32] "
                            "[--repeats 5] [--chunk 65536]\n");
            return 2;
        }
    }
    if (repeats < 1 || repeats > MAX_REPEATS || c.chunk == 0) die("--repeats is 1 to 64, --chunk at least 1", NULL);
    static const struct {
        const char *name;
        double (*run)(ctx *, int);
    } ways[] = {{"json whole", json_whole}, {"json stream", json_stream}, {"json dtype-last", json_last},
                {"npy stream", npy_stream}, {"multipart+npy", multipart}, {"json encode", json_encode}};
    printf("| way | dtype | n | body MB | median CPU ms | body MB/s | matrix MB/s | peak KiB |\n");
    printf("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    char *s1 = NULL, *s2 = NULL;
    for (char *sz = strtok_r(sizes, ",", &s1); sz; sz = strtok_r(NULL, ",", &s1)) {
        char list[256];
        snprintf(list, sizeof list, "%s", dtypes);
        for (char *dt = strtok_r(list, ",", &s2); dt; dt = strtok_r(NULL, ",", &s2)) {
            c.n = strtoul(sz, NULL, 10);
            if (c.n < 1 || gemm_dtype_from_name(dt, &c.dtype) || gemm_dtype_size(c.dtype) == 2)
                die("--sizes are numbers, --dtypes float32, float64 or int32", NULL);
            prepare(&c);
            size_t mat = bytes_of(&c.a);
            for (size_t w = 0; w < sizeof ways / sizeof ways[0]; w++) {
                double t[MAX_REPEATS];
                c.peak = 0;
                ways[w].run(&c, 1);
                for (int r = 0; r < repeats; r++) t[r] = ways[w].run(&c, 0);
                qsort(t, (size_t)repeats, sizeof t[0], cmp_double);
                double ms = t[repeats / 2];
                size_t body = w < 2 ? c.json.len : w == 2 ? c.last.len : w == 3 ? c.npy_len[0] + c.npy_len[1]
                              : w == 4 ? c.multipart_len : c.answer_len;
                size_t carried = w == 5 ? mat : 2 * mat;
                printf("| %s | %s | %zu | %.2f | %.2f | %.1f | %.1f | ", ways[w].name, dt, c.n, body / 1e6, ms,
                       body / 1e3 / ms, carried / 1e3 / ms);
                if (w == 1) printf("%.0f |\n", c.peak / 1024.0);
                else printf("- |\n");
                fflush(stdout);
            }
            release(&c);
        }
    }
    return 0;
}
