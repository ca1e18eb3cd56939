/*
 * bench_json.c - JSON request decoding and answer encoding, in process, on one core, before
 * (the whole-body cJSON decoder and the writer as they were: json_before.h) and after (the
 * streaming decoder and the current writer), in the same run.
 *
 *   build/bench/bench_json [--sizes 64,256,1024,2048] [--dtypes float32,float64,int32]
 *                          [--repeats 5] [--chunk 65536]
 *
 * For each n and dtype, A and B are n x n with values uniform in [-1, 1) (float32, float64)
 * or uniform over all of int32, written the way the daemon writes answers (9 significant
 * digits for float32, 17 for float64): a body {"dtype": .., "a": [[..]], "b": [[..]]}.
 *
 *   decode before     old_json_decode_request (cJSON tree, then checks and copies)
 *   decode whole      gemm_json_decode_request: the streaming decoder given the body at once
 *   decode stream     gemm_json_stream fed in --chunk pieces, as the daemon feeds it
 *   decode dtype-last the same, with "dtype" after the matrices (held as float64 meanwhile,
 *                     converted at the end)
 *   encode before     the old gemm_json_write_matrix of A
 *   encode after      gemm_json_write_matrix of A
 *
 * Every decoded matrix is compared bit for bit with its source, every encoded text with
 * the old writer's (the format is unchanged), before timing. Times are the thread's CPU
 * time (CLOCK_THREAD_CPUTIME_ID, page faults included), so MB/s is per core and does not
 * count time the thread waited for a core on a shared machine. Each way runs once checked,
 * then its repeats back to back (its steady state: memory it frees is reused by its next
 * run, as in a daemon serving one request after another); each cell is the median. MB/s is bytes of JSON text per CPU second (MB = 10^6 bytes); "peak KiB" is
 * the most the streaming decoder held from its allocator at once (both operands; the body
 * itself is never held).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "json_before.h"
#include "json_codec.h"
#include "json_stream.h"

#define MAX_SIZES 16
#define MAX_REPEATS 64

static void die(const char *what, const gemm_err *err)
{
    fprintf(stderr, "bench_json: %s: %s\n", what, err ? err->message : "failed");
    exit(1);
}

/* CPU time of this thread, in ms. */
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

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

static void *random_matrix(size_t n, gemm_dtype d)
{
    size_t cnt = n * n;
    void *m = malloc(cnt * gemm_dtype_size(d));
    if (!m) die("malloc", NULL);
    for (size_t i = 0; i < cnt; i++) {
        double u = (double)(next() >> 11) / 9007199254740992.0 * 2.0 - 1.0;
        if (d == GEMM_DTYPE_F32) ((float *)m)[i] = (float)u;
        else if (d == GEMM_DTYPE_F64) ((double *)m)[i] = u;
        else ((int32_t *)m)[i] = (int32_t)(uint32_t)next();
    }
    return m;
}

static void body_of(gemm_buf *b, gemm_dtype d, const gemm_matrix *ma, const gemm_matrix *mb, int dtype_last)
{
    gemm_buf_init(b);
    if (!dtype_last) gemm_buf_printf(b, "{\"dtype\": \"%s\", \"a\": ", gemm_dtype_name(d));
    else gemm_buf_puts(b, "{\"a\": ");
    gemm_json_write_matrix(b, ma);
    gemm_buf_puts(b, ", \"b\": ");
    gemm_json_write_matrix(b, mb);
    if (dtype_last) gemm_buf_printf(b, ", \"dtype\": \"%s\"}", gemm_dtype_name(d));
    else gemm_buf_puts(b, "}");
    if (b->failed) die("body", NULL);
}

static void check(const gemm_matrix *got, const gemm_matrix *want, const char *what)
{
    size_t bytes = want->rows * want->cols * gemm_dtype_size(want->dtype);
    if (got->rows != want->rows || got->cols != want->cols || got->dtype != want->dtype ||
        memcmp(got->data, want->data, bytes)) {
        fprintf(stderr, "bench_json: %s decoded the wrong matrix\n", what);
        exit(1);
    }
}

enum { DEC_BEFORE, DEC_WHOLE, DEC_STREAM, DEC_LAST };

/* One decode of body (len bytes); returns ms; checks the result when asked. */
static double decode_once(int how, const gemm_buf *body, size_t chunk, const gemm_matrix *ma,
                          const gemm_matrix *mb, int verify, size_t *peak)
{
    gemm_options opt;
    gemm_matrix a, b;
    gemm_err err;
    gemm_options_init(&opt);
    double t0 = cpu_ms();
    if (how == DEC_BEFORE) {
        if (old_json_decode_request(body->data, body->len, NULL, &gemm_allocator_host, &opt, &a, &b, &err))
            die("decode before", &err);
    } else if (how == DEC_WHOLE) {
        if (gemm_json_decode_request(body->data, body->len, NULL, &gemm_allocator_host, &opt, &a, &b, &err))
            die("decode whole", &err);
    } else {
        gemm_json_stream *js = gemm_json_stream_new(NULL, &gemm_allocator_host, &opt, body->len);
        if (!js) die("stream", NULL);
        for (size_t off = 0; off < body->len; off += chunk) {
            size_t c = body->len - off < chunk ? body->len - off : chunk;
            if (gemm_json_stream_feed(js, body->data + off, c, &err)) die("decode stream", &err);
        }
        if (gemm_json_stream_finish(js, &opt, &a, &b, &err)) die("decode stream finish", &err);
        if (peak) *peak = gemm_json_stream_peak(js);
        gemm_json_stream_free(js);
    }
    double ms = cpu_ms() - t0;
    if (verify) {
        check(&a, ma, "a");
        check(&b, mb, "b");
    }
    gemm_allocator_host.free(NULL, a.data);
    gemm_allocator_host.free(NULL, b.data);
    return ms;
}

static double encode_once(int before, const gemm_matrix *m, gemm_buf *keep)
{
    gemm_buf out;
    gemm_buf_init(&out);
    double t0 = cpu_ms();
    if (before) old_json_write_matrix(&out, m);
    else gemm_json_write_matrix(&out, m);
    double ms = cpu_ms() - t0;
    if (out.failed) die("encode", NULL);
    if (keep) *keep = out;
    else gemm_buf_free(&out);
    return ms;
}

static void print_row(const char *what, const char *dt, size_t n, size_t bytes, double before, double after,
                size_t peak)
{
    printf("| %-17s | %-7s | %4zu | %9.2f | %10.2f | %9.2f | %10.1f | %9.1f | %6.2fx |", what, dt, n, bytes / 1e6,
           before, after, bytes / 1e3 / before, bytes / 1e3 / after, before / after);
    if (peak) printf(" %9.0f |\n", peak / 1024.0);
    else printf("           |\n");
}

int main(int argc, char **argv)
{
    size_t sizes[MAX_SIZES] = {64, 256, 1024, 2048};
    int nsizes = 4, repeats = 5;
    size_t chunk = 65536;
    int use[3] = {1, 1, 1};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
            nsizes = 0;
            for (char *p = strtok(argv[++i], ","); p && nsizes < MAX_SIZES; p = strtok(NULL, ","))
                sizes[nsizes++] = strtoul(p, NULL, 10);
        } else if (strcmp(argv[i], "--dtypes") == 0 && i + 1 < argc) {
            use[0] = use[1] = use[2] = 0;
            for (char *p = strtok(argv[++i], ","); p; p = strtok(NULL, ",")) {
                gemm_dtype d;
                if (gemm_dtype_from_name(p, &d) == 0 && (int)d < 3) use[d] = 1; /* the JSON codecs it compares */
            }
        } else if (strcmp(argv[i], "--repeats") == 0 && i + 1 < argc) {
            repeats = atoi(argv[++i]);
            if (repeats < 1) repeats = 1;
            if (repeats > MAX_REPEATS) repeats = MAX_REPEATS;
        } else if (strcmp(argv[i], "--chunk") == 0 && i + 1 < argc) {
            chunk = strtoul(argv[++i], NULL, 10);
            if (chunk == 0) chunk = 1;
        } else {
            fprintf(stderr, "usage: bench_json [--sizes 64,256,1024,2048] [--dtypes float32,float64,int32] "
                            "[--repeats 5] [--chunk 65536]\n");
            return 2;
        }
    }

    printf("| what              | dtype   |    n | text (MB) | before ms | after ms | before MB/s | after MB/s | "
           "speedup | peak KiB |\n");
    printf("| ----------------- | ------- | ---: | --------: | ---------: | --------: | ---------: | --------: | "
           "------: | -------: |\n");
    for (int si = 0; si < nsizes; si++) {
        for (int di = 0; di < 3; di++) {
            if (!use[di]) continue;
            gemm_dtype d = (gemm_dtype)di;
            const char *dt = gemm_dtype_name(d);
            size_t n = sizes[si];
            gemm_matrix ma = {n, n, d, random_matrix(n, d), 0}, mb = {n, n, d, random_matrix(n, d), 0};
            gemm_buf body, last;
            body_of(&body, d, &ma, &mb, 0);
            body_of(&last, d, &ma, &mb, 1);
            double t[4][MAX_REPEATS];
            size_t peak = 0;
            /* each way in its steady state: one checked run (which also brings the memory it
             * reuses into the process), then its repeats back to back */
            for (int how = DEC_BEFORE; how <= DEC_LAST; how++) {
                decode_once(how, how == DEC_LAST ? &last : &body, chunk, &ma, &mb, 1, NULL);
                for (int r = 0; r < repeats; r++)
                    t[how][r] = decode_once(how, how == DEC_LAST ? &last : &body, chunk, &ma, &mb, 0,
                                            how == DEC_STREAM ? &peak : NULL);
            }
            double before = median(t[DEC_BEFORE], repeats);
            print_row("decode whole", dt, n, body.len, before, median(t[DEC_WHOLE], repeats), 0);
            print_row("decode stream", dt, n, body.len, before, median(t[DEC_STREAM], repeats), peak);
            print_row("decode dtype-last", dt, n, last.len, before, median(t[DEC_LAST], repeats), 0);

            gemm_buf e0, e1;
            encode_once(1, &ma, &e0);
            encode_once(0, &ma, &e1);
            if (e0.len != e1.len || memcmp(e0.data, e1.data, e0.len)) die("the writer's text changed", NULL);
            for (int r = 0; r < repeats; r++) t[0][r] = encode_once(1, &ma, NULL);
            for (int r = 0; r < repeats; r++) t[1][r] = encode_once(0, &ma, NULL);
            print_row("encode", dt, n, e1.len, median(t[0], repeats), median(t[1], repeats), 0);
            gemm_buf_free(&e0);
            gemm_buf_free(&e1);
            gemm_buf_free(&body);
            gemm_buf_free(&last);
            free(ma.data);
            free(mb.data);
            fflush(stdout);
        }
    }
    return 0;
}
