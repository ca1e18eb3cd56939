/* test_json_stream.c - the streaming JSON request decoder and the number reader.
 *
 * References are independent of the code under test: numbers against strtod/strtof of the
 * same text; matrices against the values the test wrote; chunked decoding against the same
 * body decoded in one piece (same matrices, same error, same byte offsets); memory against
 * a counting allocator. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_codec.h"
#include "json_whole.h"
#include "json_number.h"
#include "json_stream.h"
#include "json_stream_int.h" /* what the decoder holds: s->mem */

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}
static uint64_t below(uint64_t n) { return n ? rnd() % n : 0; }

/* ---- a counting allocator --------------------------------------------------- */

typedef struct {
    long allocs, frees, fail_at; /* fail_at: the index of the allocation that fails (-1: none) */
    size_t now, peak;
} counter;

#define HDR 64
static void *c_alloc(void *ctx, size_t bytes)
{
    counter *c = ctx;
    if (c->fail_at >= 0 && c->allocs == c->fail_at) {
        c->fail_at = -1;
        return NULL;
    }
    unsigned char *p = gemm_allocator_host.alloc(NULL, bytes + HDR);
    if (!p) return NULL;
    memcpy(p, &bytes, sizeof bytes);
    c->allocs++;
    c->now += bytes;
    if (c->now > c->peak) c->peak = c->now;
    return p + HDR;
}

static void c_free(void *ctx, void *p)
{
    counter *c = ctx;
    size_t bytes;
    if (!p) return;
    memcpy(&bytes, (unsigned char *)p - HDR, sizeof bytes);
    c->frees++;
    c->now -= bytes;
    gemm_allocator_host.free(NULL, (unsigned char *)p - HDR);
}

static gemm_allocator counting(counter *c)
{
    memset(c, 0, sizeof *c);
    c->fail_at = -1;
    gemm_allocator a = {c_alloc, c_free, c};
    return a;
}

/* ---- decoding in pieces ------------------------------------------------------- */

typedef struct {
    int rc;
    gemm_err err;
    gemm_options opt;
    gemm_matrix a, b;
    size_t held_after; /* what the decoder still held after finish */
} result;

/* Decodes body in chunks: chunk 0 = one piece, > 0 that size, < 0 random sizes up to -chunk. */
static result decode_chunks(const char *body, size_t len, long chunk, const gemm_limits *lim,
                            const gemm_allocator *al, const gemm_options *query, uint64_t body_max)
{
    result r;
    memset(&r, 0, sizeof r);
    if (query) r.opt = *query;
    else gemm_options_init(&r.opt);
    gemm_json_stream *js = gemm_json_stream_new(lim, al, &r.opt, body_max);
    assert_non_null(js);
    size_t off = 0;
    r.rc = 0;
    while (off < len) {
        size_t n = len - off;
        if (chunk > 0 && (size_t)chunk < n) n = (size_t)chunk;
        if (chunk < 0) {
            size_t c = 1 + below((uint64_t)-chunk);
            if (c < n) n = c;
        }
        if (gemm_json_stream_feed(js, body + off, n, &r.err)) {
            r.rc = -1;
            break;
        }
        off += n;
    }
    if (r.rc == 0) r.rc = gemm_json_stream_finish(js, &r.opt, &r.a, &r.b, &r.err);
    r.held_after = js->mem.now;
    gemm_json_stream_free(js);
    if (r.rc) {
        assert_null(r.a.data);
        assert_null(r.b.data);
        assert_true(r.err.status >= 400 && r.err.code[0] && r.err.message[0]);
    }
    return r;
}

static void free_result(result *r, const gemm_allocator *al)
{
    gemm_free(al, r->a.data);
    gemm_free(al, r->b.data);
    r->a.data = r->b.data = NULL;
}

static size_t mbytes(const gemm_matrix *m)
{
    return (size_t)(m->rows * m->cols * (m->batch ? m->batch : 1)) * gemm_dtype_size(m->dtype);
}

/* Two results are the same: both fail alike, or both give the same bits. */
static void same_result(const result *x, const result *y, const char *body)
{
    if (x->rc != y->rc || (x->rc && (x->err.status != y->err.status || strcmp(x->err.code, y->err.code) ||
                                     strcmp(x->err.message, y->err.message)))) {
        fprintf(stderr, "body: %.300s\n  one: %d %d %s: %s\n  two: %d %d %s: %s\n", body, x->rc, x->err.status,
                x->err.code, x->err.message, y->rc, y->err.status, y->err.code, y->err.message);
        fail();
    }
    if (x->rc) return;
    assert_int_equal(x->a.rows, y->a.rows);
    assert_int_equal(x->a.cols, y->a.cols);
    assert_int_equal(x->b.rows, y->b.rows);
    assert_int_equal(x->b.cols, y->b.cols);
    assert_int_equal(x->a.batch, y->a.batch);
    assert_int_equal(x->b.batch, y->b.batch);
    assert_int_equal(x->a.dtype, y->a.dtype);
    assert_memory_equal(x->a.data, y->a.data, mbytes(&x->a));
    assert_memory_equal(x->b.data, y->b.data, mbytes(&x->b));
    assert_int_equal(x->opt.dtype, y->opt.dtype);
    assert_string_equal(x->opt.kernel, y->opt.kernel);
    assert_int_equal(x->opt.tile, y->opt.tile);
    assert_int_equal(x->opt.math, y->opt.math);
}

/* Every way of cutting body gives what one piece gives: 1-byte chunks, every split into
 * two, and random chunkings. Returns the one-piece result (the caller frees it). */
static result chunk_invariant(const char *body, const gemm_limits *lim)
{
    size_t len = strlen(body);
    result whole = decode_chunks(body, len, 0, lim, &gemm_allocator_host, NULL, len);
    result one = decode_chunks(body, len, 1, lim, &gemm_allocator_host, NULL, len);
    same_result(&whole, &one, body);
    free_result(&one, &gemm_allocator_host);
    for (size_t cut = 1; cut < len && len <= 400; cut++) {
        /* two pieces: the first `cut` bytes, then the rest */
        gemm_options opt;
        gemm_options_init(&opt);
        result two;
        memset(&two, 0, sizeof two);
        two.opt = opt;
        gemm_json_stream *js = gemm_json_stream_new(lim, &gemm_allocator_host, &opt, len);
        two.rc = gemm_json_stream_feed(js, body, cut, &two.err);
        if (two.rc == 0) two.rc = gemm_json_stream_feed(js, body + cut, len - cut, &two.err);
        if (two.rc == 0) two.rc = gemm_json_stream_finish(js, &two.opt, &two.a, &two.b, &two.err);
        gemm_json_stream_free(js);
        same_result(&whole, &two, body);
        free_result(&two, &gemm_allocator_host);
    }
    for (int i = 0; i < 4; i++) {
        result r = decode_chunks(body, len, -7, lim, &gemm_allocator_host, NULL, len);
        same_result(&whole, &r, body);
        free_result(&r, &gemm_allocator_host);
    }
    return whole;
}

static void expect_error(const char *body, int status, const char *code, const char *needle)
{
    result r = chunk_invariant(body, NULL);
    if (r.rc != -1 || r.err.status != status || strcmp(r.err.code, code) || (needle && !strstr(r.err.message, needle))) {
        fprintf(stderr, "body %s\n  got %d %d %s: %s\n  want %d %s with \"%s\"\n", body, r.rc, r.err.status, r.err.code,
                r.err.message, status, code, needle ? needle : "");
        free_result(&r, &gemm_allocator_host);
        fail();
    }
}

/* ---- numbers ------------------------------------------------------------------ */

static void check_number(const char *text)
{
    gemm_decimal d;
    size_t len = strlen(text);
    ptrdiff_t n = gemm_json_scan_number(text, text + len, 1, &d);
    if (n != (ptrdiff_t)len) {
        fprintf(stderr, "scan \"%s\" gave %td\n", text, n);
        fail();
    }
    double got = gemm_decimal_to_f64(&d), want = strtod(text, NULL);
    float gotf = gemm_decimal_to_f32(&d), wantf = strtof(text, NULL);
    if (memcmp(&got, &want, 8) || memcmp(&gotf, &wantf, 4)) {
        fprintf(stderr, "\"%s\": float64 %a want %a, float32 %a want %a\n", text, got, want, (double)gotf,
                (double)wantf);
        fail();
    }
}

static void test_numbers_edge_cases(void **state)
{
    (void)state;
    static const char *const edge[] = {
        "0", "-0", "0.0", "-0.0", "0e0", "0e-999999", "1", "-1", "0.1", "-2.5", "1e22", "1e23", "1e-22", "1e-23",
        "9007199254740991", "9007199254740992", "9007199254740993", "9007199254740995", "18446744073709551615",
        "18446744073709551616", "123456789012345678901234567890", "1.7976931348623157e308",
        "1.7976931348623158e308", "1.7976931348623159e308", "4.9406564584124654e-324", "2.4703282292062327e-324",
        "2.4703282292062328e-324", "2.2250738585072011e-308", "2.2250738585072012e-308",
        "2.2250738585072014e-308", "1e-400", "1e400", "-1e400", "1e999999999999", "1e-999999999999",
        "3.4028234663852886e38", "3.4028235677973366e38", "3.4028235677973367e38", "3.40282357e38",
        "1.17549435e-38", "1.1754942807573643e-38", "1.401298464324817e-45", "7.006492321624085e-46",
        "7.006492321624086e-46", "1.00000005960464477539062500000001", "1.000000059604644775390625",
        "1.0000000596046447753906249999", "16777217", "16777219", "33554434", "33554435", "0.000001",
        "0.00000000000000000000000000001", "100000000000000000000000000001", "1.23456789012345678901e5",
        "7.2057594037927933e16", "0.30000000000000004", "2.9802322387695312e-8", "1E5", "1e+5", "1E-5",
        "99999999999999999999e-20", "0.99999999999999999999", "5e-324", "1.5e-45", "-7e-46", NULL};
    for (int i = 0; edge[i]; i++) check_number(edge[i]);
}

/* Random texts of every kind against strtod/strtof. */
static void test_numbers_random(void **state)
{
    (void)state;
    char buf[128];
    for (long i = 0; i < 400000; i++) {
        uint64_t r = rnd();
        switch (r % 9) {
        case 0: { /* any double, 17 digits */
            double v;
            uint64_t b = rnd();
            memcpy(&v, &b, 8);
            if (!isfinite(v)) continue;
            snprintf(buf, sizeof buf, "%.17g", v);
            break;
        }
        case 1: { /* any float, 9 digits */
            float v;
            uint32_t b = (uint32_t)rnd();
            memcpy(&v, &b, 4);
            if (!isfinite(v)) continue;
            snprintf(buf, sizeof buf, "%.9g", (double)v);
            break;
        }
        case 2: { /* 1 to 19 random digits, random exponent */
            int nd = 1 + (int)below(19), e = (int)below(90) - 45;
            char dig[24];
            for (int k = 0; k < nd; k++) dig[k] = (char)('0' + below(10));
            dig[0] = (char)('1' + below(9));
            dig[nd] = '\0';
            snprintf(buf, sizeof buf, "%s%se%d", (r >> 8) & 1 ? "-" : "", dig, e);
            break;
        }
        case 3: { /* near a float32 midpoint */
            float f;
            uint32_t b = (uint32_t)rnd() & 0x7f7fffffu;
            memcpy(&f, &b, 4);
            double mid = ((double)f + (double)nextafterf(f, INFINITY)) / 2;
            snprintf(buf, sizeof buf, "%.*g", (int)(9 + below(20)), mid);
            break;
        }
        case 4: { /* near a float64 midpoint */
            double f;
            uint64_t b = rnd() & 0x7fefffffffffffffull;
            memcpy(&f, &b, 8);
            long double mid = ((long double)f + (long double)nextafter(f, INFINITY)) / 2;
            snprintf(buf, sizeof buf, "%.*Lg", (int)(16 + below(12)), mid);
            break;
        }
        case 5: /* values in [-1, 1) with 1 to 17 digits */
            snprintf(buf, sizeof buf, "%.*g", (int)(1 + below(17)), (double)(rnd() >> 11) / 9007199254740992.0 * 2 - 1);
            break;
        case 6: { /* integers, also beyond 2^53 and 2^64 */
            unsigned long long u = rnd() >> below(64);
            snprintf(buf, sizeof buf, "%s%llu%s", (r >> 9) & 1 ? "-" : "", u, u && (r >> 10) & 1 ? "000" : "");
            break;
        }
        case 7: { /* 20 to 60 digits with a point somewhere */
            int nd = 20 + (int)below(40);
            char *p = buf;
            if ((r >> 11) & 1) *p++ = '-';
            *p++ = (char)('1' + below(9));
            for (int k = 1; k < nd; k++) {
                if (k == nd / 3) *p++ = '.';
                *p++ = (char)('0' + below(10));
            }
            snprintf(p, 16, "e%d", (int)below(700) - 350);
            break;
        }
        default: { /* subnormal float64 and float32 */
            double v = (double)(rnd() >> 12) * (r & 1 ? 0x1p-1074 : 0x1p-149);
            snprintf(buf, sizeof buf, "%.*g", (int)(1 + below(20)), v);
            break;
        }
        }
        check_number(buf);
    }
}

static void scan_expect(const char *text, int at_eof, ptrdiff_t want)
{
    gemm_decimal d;
    ptrdiff_t got = gemm_json_scan_number(text, text + strlen(text), at_eof, &d);
    if (got != want) {
        fprintf(stderr, "scan \"%s\" (eof %d): %td, want %td\n", text, at_eof, got, want);
        fail();
    }
}

static void test_number_grammar(void **state)
{
    (void)state;
    /* a valid number and where it ends */
    scan_expect("0,", 0, 1);
    scan_expect("-12.5e+3]", 0, 8);
    scan_expect("01", 1, 1);       /* "0" then a stray digit */
    scan_expect("1.5.3", 1, 3);
    scan_expect("1e5e3", 1, 3);
    scan_expect("2E-2 ", 0, 4);
    scan_expect("123456789012345678901234567890,", 0, 30);
    /* not a number: -(1 + offset of the first bad byte) */
    scan_expect("-", 1, -2);
    scan_expect("-a", 1, -2);
    scan_expect("1.", 1, -3);
    scan_expect("1.e5", 1, -3);
    scan_expect("1e", 1, -3);
    scan_expect("1e+", 1, -4);
    scan_expect("1e+x", 1, -4);
    scan_expect(".5", 1, -1);
    scan_expect("+1", 1, -1);
    scan_expect("-.5", 1, -2);
    /* the text ends where the number could go on: more input is needed */
    scan_expect("123", 0, 0);
    scan_expect("-", 0, 0);
    scan_expect("1.", 0, 0);
    scan_expect("1e-", 0, 0);
    scan_expect("12345678901234567890123", 0, 0);
    scan_expect("123", 1, 3);
    /* the decimal read */
    gemm_decimal d;
    const char *t = "-0.00012345e-2";
    assert_int_equal(gemm_json_scan_number(t, t + strlen(t), 1, &d), (ptrdiff_t)strlen(t));
    assert_true(d.neg && !d.trunc && !d.integer);
    assert_int_equal(d.w, 12345);
    assert_int_equal(d.q, -10);
    t = "1234567890123456789012";
    assert_int_equal(gemm_json_scan_number(t, t + strlen(t), 1, &d), 22);
    assert_true(d.trunc && d.integer);
    assert_int_equal(d.w, 1234567890123456789ull);
    assert_int_equal(d.q, 3);
}

/* ---- documents ------------------------------------------------------------------ */

static void ws(gemm_buf *b)
{
    static const char sp[] = " \n\t\r";
    for (uint64_t n = below(4) == 0 ? below(3) : 0; n; n--) gemm_buf_append(b, &sp[below(4)], 1);
}

/* A random JSON value for an unknown key: nesting, escapes, numbers, literals. */
static void junk(gemm_buf *b, int depth)
{
    switch (below(depth > 3 ? 4 : 6)) {
    case 0: gemm_buf_puts(b, "\"t\\u00e9\\n\\\"x\\\\\\/\\ud83d\\ude00\""); break;
    case 1: gemm_buf_printf(b, "%.17g", (double)(int64_t)rnd() / 1e5); break;
    case 2: gemm_buf_puts(b, below(2) ? "true" : "null"); break;
    case 3: gemm_buf_puts(b, "false"); break;
    case 4:
        gemm_buf_puts(b, "[");
        for (uint64_t i = 0, n = below(4); i < n; i++) {
            if (i) gemm_buf_puts(b, ",");
            ws(b);
            junk(b, depth + 1);
            ws(b);
        }
        gemm_buf_puts(b, "]");
        break;
    default:
        gemm_buf_puts(b, "{");
        for (uint64_t i = 0, n = below(4); i < n; i++) {
            if (i) gemm_buf_puts(b, ",");
            gemm_buf_printf(b, "\"%s\":", i % 2 ? "a" : "data"); /* known names, at the wrong depth */
            junk(b, depth + 1);
        }
        gemm_buf_puts(b, "}");
    }
}

/* The text of one element and its value as the reference reads it. */
static void element(gemm_buf *b, gemm_dtype d, void *dst, size_t i)
{
    char t[64];
    uint64_t r = rnd();
    if (d == GEMM_DTYPE_I32) {
        int32_t v = (int32_t)(uint32_t)rnd();
        if (r % 4 == 0) v = (int32_t)below(200) - 100;
        if (r % 16 == 1) snprintf(t, sizeof t, "%d.0", (int)v);
        else if (r % 16 == 2) snprintf(t, sizeof t, "%de0", (int)v);
        else snprintf(t, sizeof t, "%d", (int)v);
        ((int32_t *)dst)[i] = v;
    } else {
        switch (r % 5) {
        case 0: snprintf(t, sizeof t, "%.17g", (double)(rnd() >> 11) / 9007199254740992.0 * 2 - 1); break;
        case 1: snprintf(t, sizeof t, "%.9g", (double)(float)((double)(int64_t)rnd() / 9e18)); break;
        case 2: snprintf(t, sizeof t, "%d", (int)(int32_t)(uint32_t)rnd()); break;
        case 3: { /* near a float32 midpoint: decimal and double round differently to float */
            float f = 1.0f + (float)below(1000) / 1024.0f;
            double mid = ((double)f + (double)nextafterf(f, INFINITY)) / 2;
            snprintf(t, sizeof t, "%.25g", mid + (r & 32 ? 1e-22 : -1e-22));
            break;
        }
        default: snprintf(t, sizeof t, "%.*e", (int)below(20), (double)(int64_t)rnd() * 1e-20); break;
        }
        if (d == GEMM_DTYPE_F32) ((float *)dst)[i] = strtof(t, NULL);
        else ((double *)dst)[i] = strtod(t, NULL);
    }
    gemm_buf_puts(b, t);
}

/* One operand as text, either form, with its reference values in dst (row-major). */
static void matrix_text(gemm_buf *b, gemm_dtype d, uint64_t rows, uint64_t cols, void *dst)
{
    if (below(2)) {
        gemm_buf_puts(b, "[");
        for (uint64_t i = 0; i < rows; i++) {
            if (i) gemm_buf_puts(b, ",");
            ws(b);
            gemm_buf_puts(b, "[");
            for (uint64_t j = 0; j < cols; j++) {
                if (j) gemm_buf_puts(b, ",");
                ws(b);
                element(b, d, dst, (size_t)(i * cols + j));
                ws(b);
            }
            gemm_buf_puts(b, "]");
        }
        gemm_buf_puts(b, "]");
        return;
    }
    int shape_first = (int)below(2), extra = below(3) == 0;
    gemm_buf_puts(b, "{");
    if (shape_first) gemm_buf_printf(b, "\"shape\":[%llu,%llu],", (unsigned long long)rows, (unsigned long long)cols);
    if (extra) {
        gemm_buf_puts(b, "\"note\":");
        junk(b, 0);
        gemm_buf_puts(b, ",");
    }
    gemm_buf_puts(b, "\"data\":[");
    for (uint64_t i = 0; i < rows * cols; i++) {
        if (i) gemm_buf_puts(b, ",");
        ws(b);
        element(b, d, dst, (size_t)i);
    }
    gemm_buf_puts(b, "]");
    if (!shape_first) gemm_buf_printf(b, ",\"shape\":[%llu,%llu]", (unsigned long long)rows, (unsigned long long)cols);
    gemm_buf_puts(b, "}");
}

/* Random valid documents in random layouts, random dtype placement (first, last, absent
 * with the query's, absent), decoded in random chunks against the written values. */
static void test_random_documents(void **state)
{
    (void)state;
    for (int iter = 0; iter < 600; iter++) {
        gemm_dtype d = (gemm_dtype)below(3);
        int where = (int)below(4); /* 0 first, 1 last, 2 query, 3 none (float64) */
        if (where == 3) d = GEMM_DTYPE_F64;
        uint64_t m = 1 + below(9), k = 1 + below(9), n = 1 + below(9);
        if (iter % 50 == 0) m = 100 + below(200); /* a few that outgrow the inline room */
        size_t es = gemm_dtype_size(d);
        void *ra = calloc((size_t)(m * k), es), *rb = calloc((size_t)(k * n), es);
        gemm_buf b;
        gemm_buf_init(&b);
        ws(&b);
        gemm_buf_puts(&b, "{");
        const char *order[6];
        int no = 0;
        order[no++] = "a";
        order[no++] = "b";
        if (below(2)) order[no++] = "x";
        if (below(2)) order[no++] = "kernel";
        for (int i = no - 1; i > 0; i--) { /* shuffle */
            int j = (int)below((uint64_t)i + 1);
            const char *t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        if (where == 0) {
            gemm_buf_printf(&b, "\"dtype\":\"%s\"", gemm_dtype_name(d));
            if (no) gemm_buf_puts(&b, ",");
        }
        for (int i = 0; i < no; i++) {
            if (i) gemm_buf_puts(&b, ",");
            ws(&b);
            if (order[i][0] == 'a') {
                gemm_buf_puts(&b, "\"a\":");
                ws(&b);
                matrix_text(&b, d, m, k, ra);
            } else if (order[i][0] == 'b') {
                gemm_buf_puts(&b, below(2) ? "\"b\":" : "\"\\u0062\":"); /* an escaped key */
                matrix_text(&b, d, k, n, rb);
            } else if (order[i][0] == 'x') {
                gemm_buf_puts(&b, "\"x\":");
                junk(&b, 0);
            } else {
                gemm_buf_puts(&b, "\"kernel\":\"tiled\"");
            }
            ws(&b);
        }
        if (where == 1) gemm_buf_printf(&b, ",\"dtype\":\"%s\"", gemm_dtype_name(d));
        gemm_buf_puts(&b, "}");
        ws(&b);
        assert_false(b.failed);

        gemm_options q;
        gemm_options_init(&q);
        if (where == 2) q.dtype = d;
        else if (where == 1 && below(2)) q.dtype = (gemm_dtype)((d + 1) % 3); /* overridden by the body */
        long chunk = iter % 3 == 0 ? 1 : iter % 3 == 1 ? 0 : -13;
        result r = decode_chunks(b.data, b.len, chunk, NULL, &gemm_allocator_host, &q, b.len);
        if (r.rc) fprintf(stderr, "%s\n%s\n", r.err.message, b.data);
        assert_int_equal(r.rc, 0);
        assert_int_equal(r.opt.dtype, d);
        assert_int_equal(r.a.dtype, d);
        assert_int_equal(r.a.rows, m);
        assert_int_equal(r.a.cols, k);
        assert_int_equal(r.b.rows, k);
        assert_int_equal(r.b.cols, n);
        if (memcmp(r.a.data, ra, (size_t)(m * k) * es) || memcmp(r.b.data, rb, (size_t)(k * n) * es)) {
            fprintf(stderr, "wrong values (%s, dtype at %d):\n%s\n", gemm_dtype_name(d), where, b.data);
            fail();
        }
        assert_int_equal(r.held_after, 0);
        free_result(&r, &gemm_allocator_host);
        gemm_buf_free(&b);
        free(ra);
        free(rb);
    }
}

/* Small documents, valid and not, give the same answer however they are cut. */
static void test_every_split_point(void **state)
{
    (void)state;
    static const char *const docs[] = {
        "{\"a\": [[1, 2.5], [-3e2, 4]], \"b\": [[1], [0.1]], \"dtype\": \"float32\"}",
        " {\"dtype\":\"int32\",\"a\":{\"shape\":[1,3],\"data\":[1,-2,3]},\"b\":[[1],[2],[3]],\"tile\":16} ",
        "{\"x\":{\"y\":[true,false,null,\"s\\u0041\\n\"]},\"a\":{\"data\":[1.5,2],\"shape\":[2,1]},\"b\":[[7,8]]}",
        "{\"a\":[[1.00000005960464477539062500000001]],\"b\":[[1]],\"dtype\":\"float32\",\"kernel\":\"naive\"}",
        "{\"a\": [[1, 2]], \"b\": [[1], [2]]",         /* truncated */
        "{\"a\": [[1, 2,]], \"b\": [[1], [2]]}",        /* trailing comma */
        "{\"a\": [[1, 2]], \"b\": [[1], [\"x\"]]}",     /* a string element */
        "{\"a\": [[1, 2], [3]], \"b\": [[1], [2]]}",    /* ragged */
        "{\"a\": [[1e999]], \"b\": [[1]]}",              /* beyond float64 */
        "{\"dtype\": \"int32\", \"a\": [[2147483648]], \"b\": [[1]]}",
        "{\"a\": [[1]], \"b\": [[1]], \"dtype\": \"float8\"}",
        "{\"a\": [[1]], \"b\": [[1]]} x",
        "{\"a\": [[1]], \"b\": [[\"\\ud800\"]]}",
        "{\"a\": [[01]], \"b\": [[1]]}",
        "{\"a\": [[-]], \"b\": [[1]]}",
        "{\"a\": [[1.]], \"b\": [[1]]}",
        "{\"a\": [[tru]], \"b\": [[1]]}",
        "{\"a\": [[1]], \"b\": [[1]],\n\"c\": \"tab\there\"}",
        "[[1]]",
        "",
        "12",
        "\"str\"",
        "nul",
    };
    for (size_t i = 0; i < sizeof docs / sizeof docs[0]; i++) {
        result r = chunk_invariant(docs[i], NULL);
        free_result(&r, &gemm_allocator_host);
    }
    /* a few of them, with what they must say */
    result r = chunk_invariant(docs[3], NULL);
    assert_int_equal(r.rc, 0);
    assert_true(((float *)r.a.data)[0] == strtof("1.00000005960464477539062500000001", NULL));
    assert_true(((float *)r.a.data)[0] != (float)strtod("1.00000005960464477539062500000001", NULL));
    free_result(&r, &gemm_allocator_host);
}

/* Bodies made wrong at random (a byte changed, removed or added) answer the same in any
 * chunking: the decoder's state carries across every cut. */
static void test_mutations_are_chunk_invariant(void **state)
{
    (void)state;
    static const char *const base[] = {
        "{\"a\": {\"shape\": [2, 2], \"data\": [1, 2.5e-3, -3, 4]}, \"b\": [[1], [2]], \"dtype\": \"float64\", "
        "\"meta\": {\"k\": [\"v\\u00e9\", null, true]}}",
        "{\"dtype\": \"int32\", \"a\": [[1, 2, 3]], \"b\": {\"data\": [1, 2, 3], \"shape\": [3, 1]}, \"math\": \"fp32\"}",
    };
    static const char pool[] = "{}[]\",:0123456789.eE+-tfnul \\\n\x01";
    char buf[512];
    for (int iter = 0; iter < 3000; iter++) {
        const char *src = base[iter % 2];
        size_t len = strlen(src), pos = (size_t)below(len);
        char c = pool[below(sizeof pool - 1)];
        switch (below(3)) {
        case 0:
            memcpy(buf, src, len + 1);
            buf[pos] = c;
            break;
        case 1:
            memcpy(buf, src, pos);
            memcpy(buf + pos, src + pos + 1, len - pos);
            break;
        default:
            memcpy(buf, src, pos);
            buf[pos] = c;
            memcpy(buf + pos + 1, src + pos, len - pos + 1);
        }
        size_t blen = strlen(buf);
        result whole = decode_chunks(buf, blen, 0, NULL, &gemm_allocator_host, NULL, blen);
        result one = decode_chunks(buf, blen, 1, NULL, &gemm_allocator_host, NULL, blen);
        result rand = decode_chunks(buf, blen, -9, NULL, &gemm_allocator_host, NULL, blen);
        same_result(&whole, &one, buf);
        same_result(&whole, &rand, buf);
        free_result(&whole, &gemm_allocator_host);
        free_result(&one, &gemm_allocator_host);
        free_result(&rand, &gemm_allocator_host);
    }
}

/* ---- errors ------------------------------------------------------------------------ */

static void test_syntax_errors(void **state)
{
    (void)state;
    expect_error("", 400, "bad_json", "empty");
    expect_error(" \n ", 400, "bad_json", "byte 3 (line 2, column 2)");
    expect_error("{\"a\": [[1, 2,]], \"b\": [[1]]}", 400, "bad_json", "byte 13 (line 1, column 14): expected a value");
    expect_error("{\"a\" [[1]]}", 400, "bad_json", "expected ':'");
    expect_error("{\"a\": [[1]] \"b\": [[1]]}", 400, "bad_json", "expected ',' or '}'");
    expect_error("{\"a\": [[1] [2]]}", 400, "bad_json", "expected ',' or ']'");
    expect_error("{a: 1}", 400, "bad_json", "expected a key");
    expect_error("{\"a\": [[1]],}", 400, "bad_json", "expected a key");
    expect_error("{\"a\": [[01]]}", 400, "bad_json", "byte 9");
    expect_error("{\"a\": [[1.]]}", 400, "bad_json", "byte 10 (line 1, column 11): not a valid number");
    expect_error("{\"a\": [[-]]}", 400, "bad_json", "byte 9");
    expect_error("{\"a\": [[+1]]}", 400, "bad_json", "expected a value");
    expect_error("{\"a\": [[.5]]}", 400, "bad_json", "expected a value");
    expect_error("{\"a\": [[1e]]}", 400, "bad_json", "not a valid number");
    expect_error("{\"a\": [[NaN]]}", 400, "bad_json", "byte 8");
    expect_error("{\"a\": [[Infinity]]}", 400, "bad_json", "byte 8");
    expect_error("{\"a\": [[True]]}", 400, "bad_json", "expected a value");
    expect_error("{\"a\": [[trUe]]}", 400, "bad_json", "byte 10");
    expect_error("{\"a\": \"x\ty\"}", 400, "bad_json", "control character");
    expect_error("{\"a\": \"\\x\"}", 400, "bad_json", "invalid escape");
    expect_error("{\"a\": \"\\u12G4\"}", 400, "bad_json", "four hex digits");
    expect_error("{\"a\": \"\\udc00\"}", 400, "bad_json", "lone low surrogate");
    expect_error("{\"a\": \"\\ud800x\"}", 400, "bad_json", "without its low half");
    expect_error("{\"a\": \"\\ud800\\u0041\"}", 400, "bad_json", "without its low half");
    expect_error("{\"a\": \"abc", 400, "bad_json", "inside a string");
    expect_error("{\"a\": [[1]], \"b\": [[1]]} {}", 400, "bad_json", "unexpected data after the JSON value at byte 25");
    expect_error("{\"a\": [[1]], \"b\": [[1]]}\n\n  }", 400, "bad_json", "at byte 28 (line 3, column 3)");
    expect_error("{\"a\": [[1]], \"b\": [[1]]}\v", 400, "bad_json", "after the JSON value");
    expect_error("{\"a\": [[1]],\r\n \"b\": [[1]]\t,\n\n ]", 400, "bad_json", "(line 4, column 2): expected a key");
    /* a NUL: one at the very end is allowed (a C string's terminator counted in), not inside */
    gemm_options opt;
    gemm_matrix a, b;
    gemm_err err;
    gemm_options_init(&opt);
    const char nul_end[] = "{\"a\": [[1]], \"b\": [[1]]} \n";
    assert_int_equal(gemm_json_decode_request(nul_end, sizeof nul_end, NULL, &gemm_allocator_host, &opt, &a, &b, &err), 0);
    gemm_allocator_host.free(NULL, a.data);
    gemm_allocator_host.free(NULL, b.data);
    const char nul_mid[] = "{\"a\": [[1]],\0 \"b\": [[1]]}";
    assert_int_equal(gemm_json_decode_request(nul_mid, sizeof nul_mid - 1, NULL, &gemm_allocator_host, &opt, &a, &b, &err),
                     -1);
    assert_string_equal(err.code, "bad_json");
    assert_non_null(strstr(err.message, "byte 12"));
    const char nul_two[] = "{\"a\": [[1]], \"b\": [[1]]}\0\0";
    assert_int_equal(gemm_json_decode_request(nul_two, sizeof nul_two - 1, NULL, &gemm_allocator_host, &opt, &a, &b, &err),
                     -1);
    assert_non_null(strstr(err.message, "after the JSON value at byte 24"));
}

/* Strings are UTF-8 (RFC 8259 section 8.1): every well-formed character is taken, in keys
 * and values, however the chunks cut it; a byte that cannot stand where it does is refused
 * with its offset: a stray continuation, an overlong form, a surrogate, a code point past
 * U+10FFFF, a character cut short by the closing quote, a byte no character begins with. */
static void test_utf8_strings(void **state)
{
    (void)state;
    static const char *const good[] = {
        "{\"a\": [[1]], \"b\": [[2]], \"note\": \"caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9d\x84\x9e\"}",
        "{\"a\": [[1]], \"b\": [[2]], \"\xc2\x80\xdf\xbf\xe0\xa0\x80\xed\x9f\xbf\xee\x80\x80\": 1}",
        "{\"a\": [[1]], \"b\": [[2]], \"x\": [\"\xf0\x90\x80\x80\", \"\xf4\x8f\xbf\xbf\", \"\xef\xbf\xbd\"]}",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        result r = chunk_invariant(good[i], NULL);
        assert_int_equal(r.rc, 0);
        free_result(&r, &gemm_allocator_host);
    }
    static const struct { const char *body, *at; } bad[] = {
        {"{\"a\": [[1]], \"b\": [[2]], \"n\": \"x\x80\"}", "byte 32"},         /* a stray continuation */
        {"{\"a\": [[1]], \"b\": [[2]], \"n\": \"\xc0\xaf\"}", "byte 31"},     /* overlong '/' */
        {"{\"a\": [[1]], \"b\": [[2]], \"n\": \"\xe0\x80\xaf\"}", "byte 32"}, /* overlong, 3 bytes */
        {"{\"a\": [[1]], \"b\": [[2]], \"n\": \"\xed\xa0\x80\"}", "byte 32"}, /* U+D800 */
        {"{\"a\": [[1]], \"b\": [[2]], \"n\": \"\xf4\x90\x80\x80\"}", "byte 32"}, /* U+110000 */
        {"{\"a\": [[1]], \"b\": [[2]], \"n\": \"\xf5\x80\x80\x80\"}", "byte 31"}, /* F5 begins nothing */
        {"{\"a\": [[1]], \"b\": [[2]], \"n\": \"\xe2\x9c\"}", "byte 33"},     /* cut by the quote */
        {"{\"a\": [[1]], \"b\": [[2]], \"n\xff\": 1}", "byte 27"},             /* in a key */
        {"{\"dtype\": \"float32\xa0\", \"a\": [[1]], \"b\": [[2]]}", "byte 18"}, /* in an option */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) expect_error(bad[i].body, 400, "bad_json", bad[i].at);
    expect_error("{\"a\": [[1]], \"b\": [[2]], \"n\": \"\xc3\xa9\x80\"}", 400, "bad_json", "not UTF-8");
}

static void test_depth_and_length_limits(void **state)
{
    (void)state;
    gemm_buf b;
    /* nesting up to the limit is fine inside an ignored field; one more is not */
    for (int extra = 0; extra <= 1; extra++) {
        int depth = GEMM_JSON_MAX_DEPTH - 1 + extra; /* the top object is one level */
        gemm_buf_init(&b);
        gemm_buf_puts(&b, "{\"x\":");
        for (int i = 0; i < depth; i++) gemm_buf_puts(&b, "[");
        for (int i = 0; i < depth; i++) gemm_buf_puts(&b, "]");
        gemm_buf_puts(&b, ",\"a\":[[2]],\"b\":[[3]]}");
        result r = chunk_invariant(b.data, NULL);
        if (extra) {
            assert_int_equal(r.rc, -1);
            assert_string_equal(r.err.code, "bad_json");
            assert_non_null(strstr(r.err.message, "nested deeper than"));
            assert_non_null(strstr(r.err.message, "byte 68"));
        } else {
            assert_int_equal(r.rc, 0);
            free_result(&r, &gemm_allocator_host);
        }
        gemm_buf_free(&b);
    }
    /* 100000 deep (a hostile body) fails at the limit, without recursion */
    gemm_buf_init(&b);
    gemm_buf_puts(&b, "{\"a\":");
    for (int i = 0; i < 100000; i++) gemm_buf_puts(&b, "[");
    result r = decode_chunks(b.data, b.len, 4096, NULL, &gemm_allocator_host, NULL, 0);
    assert_int_equal(r.rc, -1);
    assert_string_equal(r.err.code, "bad_json");
    gemm_buf_free(&b);
    /* numbers up to GEMM_JSON_NUMBER_MAX characters, not more */
    for (int extra = 0; extra <= 1; extra++) {
        gemm_buf_init(&b);
        gemm_buf_puts(&b, "{\"a\":[[1.");
        for (int i = 0; i < GEMM_JSON_NUMBER_MAX - 2 + extra; i++) gemm_buf_puts(&b, i % 7 ? "0" : "3");
        gemm_buf_puts(&b, "]],\"b\":[[1]]}");
        for (long chunk = 0; chunk <= 100; chunk += 100) {
            r = decode_chunks(b.data, b.len, chunk, NULL, &gemm_allocator_host, NULL, b.len);
            if (extra) {
                assert_int_equal(r.rc, -1);
                assert_non_null(strstr(r.err.message, "a number longer than 1024 characters"));
            } else {
                assert_int_equal(r.rc, 0);
                assert_true(((double *)r.a.data)[0] == strtod(b.data + 7, NULL));
                free_result(&r, &gemm_allocator_host);
            }
        }
        gemm_buf_free(&b);
    }
    /* a long run of number characters: the length decides before a later grammar error,
     * and a grammar error within the first 1025 characters decides before the length,
     * however the text is cut */
    /* exactly 1025 characters that are a number's beginning, then its end: too long, cut
     * anywhere */
    for (int tail = 0; tail < 3; tail++) {
        gemm_buf_init(&b);
        gemm_buf_puts(&b, "{\"a\":[[1");
        for (int i = 1; i < GEMM_JSON_NUMBER_MAX; i++) gemm_buf_puts(&b, "0");
        gemm_buf_puts(&b, tail == 0 ? "e" : tail == 1 ? "." : "5");
        gemm_buf_puts(&b, "]],\"b\":[[1]]}");
        r = chunk_invariant(b.data, NULL);
        assert_int_equal(r.rc, -1);
        assert_non_null(strstr(r.err.message, "byte 7 (line 1, column 8): a number longer than 1024"));
        gemm_buf_free(&b);
    }
    for (int bad_at = 500; bad_at <= 1500; bad_at += 1000) {
        gemm_buf_init(&b);
        gemm_buf_puts(&b, "{\"a\":[[1.");
        for (int i = 0; i < 2000; i++) gemm_buf_puts(&b, i == bad_at ? "." : "5");
        gemm_buf_puts(&b, "]],\"b\":[[1]]}");
        r = chunk_invariant(b.data, NULL);
        assert_int_equal(r.rc, -1);
        if (bad_at < 1000) assert_non_null(strstr(r.err.message, "expected ',' or ']'"));
        else assert_non_null(strstr(r.err.message, "longer than 1024"));
        gemm_buf_free(&b);
    }
}

static void test_semantic_errors_in_order(void **state)
{
    (void)state;
    /* one error each */
    expect_error("[[1]]", 400, "bad_matrix", "the body is an array; expected a JSON object");
    expect_error("\"x\"", 400, "bad_matrix", "the body is a string");
    expect_error("null", 400, "bad_matrix", "the body is null");
    expect_error("{\"b\": [[1]]}", 400, "bad_matrix", "no \"a\" matrix");
    expect_error("{\"a\": [[1]]}", 400, "bad_matrix", "no \"b\" matrix");
    expect_error("{\"a\": true, \"b\": [[1]]}", 400, "bad_matrix", "a is a boolean; expected nested arrays");
    expect_error("{\"a\": [1, 2], \"b\": [[1]]}", 400, "bad_matrix", "a is a 1-D array");
    expect_error("{\"a\": [[1], {}], \"b\": [[1]]}", 400, "bad_matrix", "a[1] is an object, expected an array (a row)");
    expect_error("{\"a\": [[1], 2], \"b\": [[1]]}", 400, "bad_matrix", "a[1] is a number, expected an array (a row)");
    expect_error("{\"a\": [[1, 2], [3, 4, 5]], \"b\": [[1]]}", 400, "bad_matrix", "row 1 of a has 3 elements, row 0 has 2");
    expect_error("{\"a\": {\"data\": [1]}, \"b\": [[1]]}", 400, "bad_matrix", "a.shape must be [rows, cols]");
    expect_error("{\"a\": {\"shape\": [1, 1]}, \"b\": [[1]]}", 400, "bad_matrix", "a.data must be an array of numbers (row-major), not missing");
    expect_error("{\"a\": {\"shape\": [1, 1], \"data\": 5}, \"b\": [[1]]}", 400, "bad_matrix", "not a number");
    expect_error("{\"a\": {\"shape\": [1, 1], \"data\": {}}, \"b\": [[1]]}", 400, "bad_matrix", "not an object");
    expect_error("{\"a\": {\"shape\": [1, [1]], \"data\": [1]}, \"b\": [[1]]}", 400, "bad_matrix", "a.shape");
    expect_error("{\"a\": {\"shape\": [1, 1, 1, 1], \"data\": [1]}, \"b\": [[1]]}", 400, "bad_matrix", "a.shape");
    expect_error("{\"a\": {\"shape\": [1, -1], \"data\": [1]}, \"b\": [[1]]}", 400, "bad_matrix", "a.shape");
    expect_error("{\"a\": {\"shape\": [1, 1.5], \"data\": [1]}, \"b\": [[1]]}", 400, "bad_matrix", "a.shape");
    expect_error("{\"a\": {\"shape\": \"1x1\", \"data\": [1]}, \"b\": [[1]]}", 400, "bad_matrix", "a.shape");
    expect_error("{\"a\": {\"shape\": [2, 1], \"data\": [1]}, \"b\": [[1]]}", 400, "bad_matrix",
                 "a.data has 1 numbers but shape [2,1] needs 2");
    expect_error("{\"a\": {\"shape\": [1, 1], \"data\": [1, 2]}, \"b\": [[1]]}", 400, "bad_matrix",
                 "a.data has 2 numbers but shape [1,1] needs 1");
    expect_error("{\"a\": [[1, 2]], \"b\": [[1]]}", 422, "shape_mismatch", "A is 1x2 and B is 1x1");
    expect_error("{\"a\": [], \"b\": [[1]]}", 422, "empty_matrix", NULL);
    expect_error("{\"a\": [[]], \"b\": [[1]]}", 422, "empty_matrix", NULL);
    expect_error("{\"a\": [[1, null]], \"b\": [[1], [2]]}", 400, "bad_matrix", "a[0][1] is null, expected a number");
    expect_error("{\"a\": [[1, [2]]], \"b\": [[1], [2]]}", 400, "bad_matrix", "a[0][1] is an array, expected a number");
    expect_error("{\"a\": [[1]], \"b\": {\"shape\": [1, 2], \"data\": [1, {\"x\": 1}]}}", 400, "bad_matrix",
                 "b.data[1] is an object, expected a number");
    expect_error("{\"a\": [[1]], \"b\": [[\"1\"]]}", 400, "bad_matrix", "b[0][0] is a string");
    expect_error("{\"dtype\": \"int32\", \"a\": [[1, 2.5]], \"b\": [[1], [2]]}", 422, "bad_value",
                 "a[0][1] = 2.5 is not an int32");
    expect_error("{\"a\": [[1, 2.5]], \"b\": [[1], [2]], \"dtype\": \"int32\"}", 422, "bad_value",
                 "a[0][1] = 2.5 is not an int32");
    expect_error("{\"a\": [[1]], \"b\": [[-2147483649]], \"dtype\": \"int32\"}", 422, "bad_value", "b[0][0]");
    expect_error("{\"a\": [[3.5e38]], \"b\": [[1]], \"dtype\": \"float32\"}", 422, "bad_value", "beyond float32's range");
    expect_error("{\"dtype\": \"float32\", \"a\": [[1]], \"b\": [[-1e39]]}", 422, "bad_value", "b[0][0] = -9.9999999999999994e+38");
    expect_error("{\"a\": [[1]], \"b\": [[1e309]]}", 422, "bad_value", "b[0][0] is beyond float64's range");
    expect_error("{\"a\": [[1]], \"b\": [[1]], \"tile\": true}", 422, "bad_option", "tile is a boolean; expected an integer");
    expect_error("{\"a\": [[1]], \"b\": [[1]], \"kernel\": [1]}", 422, "bad_option", "kernel is an array");
    expect_error("{\"a\": [[1]], \"b\": [[1]], \"math\": {}}", 422, "bad_option", "math is an object");
    expect_error("{\"a\": [[1]], \"b\": [[1]], \"tile\": 2.5}", 422, "bad_option", "tile '2.5' is not valid");
    expect_error("{\"a\": [[1]], \"b\": [[1]], \"dtype\": 32}", 422, "bad_option", "dtype is a number; expected a string");
    expect_error("{\"a\": [[1]], \"b\": [[1]], \"panel_of\": 0}", 422, "bad_option", "panel_of '0'");
    expect_error("{\"a\": [[1]], \"b\": [[1]], \"kernel\": \"auto\\u0000\"}", 400, "bad_option", "control byte");

    /* several errors: the one the whole body deserves, whatever the order in the text */
    expect_error("{\"a\": [[1, \"x\"]], \"b\": [[1]], \"tile\": 0}", 422, "bad_option", "tile"); /* option before elements */
    expect_error("{\"kernel\": \"!\", \"dtype\": \"x\", \"a\": 1}", 422, "bad_option", "kernel"); /* the first option */
    expect_error("{\"b\": [[\"x\"]], \"a\": [[1], [2, 3]]}", 400, "bad_matrix", "row 1 of a"); /* a's structure first */
    expect_error("{\"a\": [[\"x\", 1]], \"b\": [[1]]}", 422, "shape_mismatch", NULL);          /* shapes before elements */
    expect_error("{\"a\": {\"shape\": [1, 2], \"data\": [1]}, \"b\": [[1], [2], [3]]}", 422, "shape_mismatch", NULL);
    expect_error("{\"b\": [[\"x\"]], \"a\": [[true]]}", 400, "bad_matrix", "a[0][0] is a boolean"); /* a before b */
    expect_error("{\"a\": [[1, \"x\", 2.5]], \"b\": [[1], [2], [3]], \"dtype\": \"int32\"}", 400, "bad_matrix",
                 "a[0][1] is a string");                                                       /* first in a wins */
    expect_error("{\"a\": [[1, 2.5, \"x\"]], \"b\": [[1], [2], [3]], \"dtype\": \"int32\"}", 422, "bad_value",
                 "a[0][1] = 2.5");
    expect_error("{\"a\": [[1]], \"b\": [[1]], \"x\": [1, 2,]}", 400, "bad_json", NULL); /* syntax beats everything */
    expect_error("{\"a\": 1, \"b\": [[1]], \"x\": [1 2]}", 400, "bad_json", NULL);

    /* a key the decoder reads, given twice in one object, fails the body */
    expect_error("{\"a\": [[2]], \"b\": [[3]], \"a\": \"ignored\"}", 400, "bad_matrix", "\"a\" is given twice");
    expect_error("{\"a\": {\"ref\": \"X\"}, \"b\": [[3]], \"a\": [[1]]}", 400, "bad_matrix", "\"a\" is given twice");
    expect_error("{\"a\": {\"shape\": [1, 1], \"data\": [4], \"shape\": 7}, \"b\": [[3]]}", 400, "bad_matrix",
                 "a.shape is given twice");
    expect_error("{\"a\": [[2]], \"b\": {\"data\": [], \"shape\": [1, 1], \"data\": [4]}}", 400, "bad_matrix",
                 "b.data is given twice");
    expect_error("{\"a\": [[2]], \"b\": [[3]], \"dtype\": \"int32\", \"dtype\": \"int32\"}", 400, "duplicate_option",
                 "dtype is given twice");
    expect_error("{\"dtype\": \"bad\", \"dtype\": \"int32\", \"a\": [[2]], \"b\": [[3]]}", 422, "bad_option", "dtype 'bad'");
    /* keys it does not read are ignored, twice or not; so are the options of other doors */
    result r = chunk_invariant("{\"a\": [[2]], \"b\": [[3]], \"x\": 1, \"x\": 2, \"m\": 9, \"store\": 1}", NULL);
    assert_int_equal(r.rc, 0);
    assert_true(((double *)r.a.data)[0] == 2);
    free_result(&r, &gemm_allocator_host);
    /* a key with a NUL inside is not "a" */
    expect_error("{\"a\\u0000\": [[2]], \"b\": [[3]]}", 400, "bad_matrix", "no \"a\" matrix");
}

/* ---- limits and memory ------------------------------------------------------------------ */

static void test_declared_shapes_before_allocation(void **state)
{
    (void)state;
    counter c;
    gemm_allocator al = counting(&c);
    gemm_limits lim = {.max_dim = 65536, .max_elements = 1 << 28, .max_body_bytes = 0};
    static const char *const huge[] = {
        "{\"a\": {\"shape\": [65537, 1], \"data\": [1, 2, 3]}, \"b\": [[1]]}",
        "{\"a\": {\"shape\": [65536, 65536], \"data\": [1, 2, 3]}, \"b\": {\"shape\": [65536, 1], \"data\": []}}",
        "{\"a\": {\"shape\": [9007199254740992, 9007199254740992], \"data\": [1]}, "
        "\"b\": {\"shape\": [9007199254740992, 1], \"data\": [1]}}",
        "{\"b\": {\"shape\": [1, 65536], \"data\": [1, 2, 3]}, \"a\": {\"shape\": [65536, 1], \"data\": [1, 2]}}",
    };
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        for (int with_lim = 0; with_lim < 2; with_lim++) {
            c.allocs = c.frees = 0;
            result r = decode_chunks(huge[i], strlen(huge[i]), 5, with_lim ? &lim : NULL, &al, NULL, 0);
            assert_int_equal(r.rc, -1);
            if (with_lim) {
                assert_int_equal(r.err.status, 413);
                assert_string_equal(r.err.code, "too_large");
            }
            /* the few elements that came stayed inside the decoder: no buffer was taken */
            assert_int_equal(c.allocs, 0);
        }
    }
    /* a declared size that the body (Content-Length) cannot fill: buffers follow the bytes */
    const char *big = "{\"dtype\": \"float32\", \"a\": {\"shape\": [16384, 16384], \"data\": [1, 2, 3]}, "
                      "\"b\": {\"shape\": [16384, 1], \"data\": []}}";
    memset(&c, 0, sizeof c);
    c.fail_at = -1;
    result r = decode_chunks(big, strlen(big), 0, &lim, &al, NULL, strlen(big));
    assert_int_equal(r.rc, -1);
    assert_string_equal(r.err.code, "bad_matrix"); /* 3 numbers for 2^28 */
    assert_int_equal(c.peak, 0);
    assert_int_equal(c.now, 0);
}

/* A body with many rows, built to a size: its operands as the limits see them. */
static void rows_body(gemm_buf *b, const char *head, uint64_t rows, uint64_t cols, const char *tail)
{
    gemm_buf_init(b);
    gemm_buf_puts(b, head);
    gemm_buf_puts(b, "[");
    for (uint64_t i = 0; i < rows; i++) {
        gemm_buf_puts(b, i ? ",[" : "[");
        for (uint64_t j = 0; j < cols; j++) gemm_buf_printf(b, j ? ",%llu" : "%llu", (unsigned long long)(i + j) % 97);
        gemm_buf_puts(b, "]");
    }
    gemm_buf_puts(b, "]");
    gemm_buf_puts(b, tail);
}

static void test_limits_stop_storing_at_once(void **state)
{
    (void)state;
    counter c;
    gemm_allocator al = counting(&c);
    gemm_limits lim = {.max_dim = 1000, .max_elements = 20000, .max_body_bytes = 0};
    gemm_buf b;
    /* 5000 rows of 8 (40000 elements) against max_elements 20000: storing stops at the
     * limit, the error names the whole shape */
    rows_body(&b, "{\"dtype\": \"int32\", \"a\": ", 5000, 8, ", \"b\": [[1],[2],[3],[4],[5],[6],[7],[8]]}");
    result r = decode_chunks(b.data, b.len, 4096, &lim, &al, NULL, b.len);
    assert_int_equal(r.rc, -1);
    assert_int_equal(r.err.status, 413);
    assert_non_null(strstr(r.err.message, "5000"));
    assert_true(c.peak <= 3 * 20000 * 4); /* never more than the limit allows, grown x2 */
    assert_int_equal(c.now, 0);
    gemm_buf_free(&b);
    /* a row wider than max_dim */
    memset(&c, 0, sizeof c);
    c.fail_at = -1;
    rows_body(&b, "{\"a\": ", 1, 5000, ", \"b\": {\"shape\": [5000, 1], \"data\": []}}");
    r = decode_chunks(b.data, b.len, 0, &lim, &al, NULL, b.len);
    assert_int_equal(r.err.status, 413);
    assert_true(c.peak <= 3 * 1000 * 8);
    assert_int_equal(c.now, 0);
    gemm_buf_free(&b);
    /* B's rows must be A's columns: storing B stops at the first extra row */
    memset(&c, 0, sizeof c);
    c.fail_at = -1;
    rows_body(&b, "{\"a\": [[1, 2]], \"b\": ", 900, 20, "}");
    r = decode_chunks(b.data, b.len, 4096, &lim, &al, NULL, b.len);
    assert_int_equal(r.err.status, 422);
    assert_string_equal(r.err.code, "shape_mismatch");
    assert_non_null(strstr(r.err.message, "B is 900x20"));
    assert_true(c.peak <= 2 * 20 * 8 + 64);
    gemm_buf_free(&b);
}

/* Peak memory: exact buffers when the size is known first; geometric growth otherwise,
 * within 3x of the matrix while it grows and exact at the end; never the body. */
static void test_peak_memory(void **state)
{
    (void)state;
    static const char *const dts[] = {"float32", "float64", "int32"};
    counter c;
    gemm_allocator al = counting(&c);
    const uint64_t n = 300;
    gemm_buf b;
    /* shape first, dtype first: one buffer of the exact size per operand */
    gemm_buf_init(&b);
    gemm_buf_printf(&b, "{\"dtype\": \"float32\", \"a\": {\"shape\": [%llu, %llu], \"data\": [", (unsigned long long)n,
                    (unsigned long long)n);
    for (uint64_t i = 0; i < n * n; i++) gemm_buf_printf(&b, i ? ",%.9g" : "%.9g", (double)(float)(i * 0.37));
    gemm_buf_printf(&b, "]}, \"b\": {\"shape\": [%llu, 1], \"data\": [", (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++) gemm_buf_puts(&b, i ? ",1" : "1");
    gemm_buf_puts(&b, "]}}");
    result r = decode_chunks(b.data, b.len, 1000, NULL, &al, NULL, b.len);
    assert_int_equal(r.rc, 0);
    assert_int_equal(c.peak, (n * n + n) * 4);
    assert_int_equal(c.allocs, 2);
    assert_int_equal(r.held_after, 0);
    free_result(&r, &al);
    assert_int_equal(c.now, 0);
    gemm_buf_free(&b);

    /* nested rows of random floats and ints written as the daemon writes them (9 or 17
     * digits), dtype first or last: within the bound the daemon promises, exactly the
     * matrices left at the end */
    for (int di = 0; di < 3; di++) {
        for (int last = 0; last < 2; last++) {
            gemm_dtype d = (gemm_dtype)di;
            size_t es = gemm_dtype_size(d);
            void *src = malloc(4000 * 3 * es);
            for (size_t i = 0; i < 4000 * 3; i++) {
                double u = (double)(rnd() >> 11) / 9007199254740992.0 * 2 - 1;
                if (d == GEMM_DTYPE_F32) ((float *)src)[i] = (float)u;
                else if (d == GEMM_DTYPE_F64) ((double *)src)[i] = u;
                else ((int32_t *)src)[i] = (int32_t)(uint32_t)rnd();
            }
            gemm_matrix ma = {.rows = 4000, .cols = 3, .dtype = d, .data = src, .batch = 0};
            gemm_buf_init(&b);
            if (!last) gemm_buf_printf(&b, "{\"dtype\": \"%s\", ", gemm_dtype_name(d));
            gemm_buf_puts(&b, last ? "{\"a\": " : "\"a\": ");
            gemm_json_write_matrix(&b, &ma);
            gemm_buf_puts(&b, ", \"b\": [[1],[2],[3]]");
            if (last) gemm_buf_printf(&b, ", \"dtype\": \"%s\"", gemm_dtype_name(d));
            gemm_buf_puts(&b, "}");
            for (long chunk = 0; chunk <= 1000; chunk += 1000) {
                memset(&c, 0, sizeof c);
                c.fail_at = -1;
                r = decode_chunks(b.data, b.len, chunk, NULL, &al, NULL, chunk ? 0 : b.len);
                assert_int_equal(r.rc, 0);
                assert_memory_equal(r.a.data, src, 4000 * 3 * es);
                size_t final = mbytes(&r.a) + mbytes(&r.b);
                assert_int_equal(c.now, final); /* exactly the matrices are left */
                assert_true(c.peak <= 2 * b.len + final);
                free_result(&r, &al);
            }
            gemm_buf_free(&b);
            free(src);
        }
    }

    /* 8000 one- and two-digit numbers, dtype last: held as float64 while reading, so the
     * body can be smaller than that; the stores never hold more than the elements plus a
     * third of them unused and one 16 KiB block, and the result while assembling */
    for (int di = 0; di < 3; di++) {
        memset(&c, 0, sizeof c);
        c.fail_at = -1;
        char tail[64];
        snprintf(tail, sizeof tail, ", \"b\": [[1],[2]], \"dtype\": \"%s\"}", dts[di]);
        rows_body(&b, "{\"a\": ", 4000, 2, tail);
        r = decode_chunks(b.data, b.len, 512, NULL, &al, NULL, 0);
        assert_int_equal(r.rc, 0);
        size_t final = mbytes(&r.a) + mbytes(&r.b);
        assert_int_equal(c.now, final);
        assert_true(c.peak <= 8000 * 8 * 4 / 3 + 16384 + final);
        free_result(&r, &al);
        gemm_buf_free(&b);
    }
}

/* Every allocation failing in turn: an error (503 out_of_memory), nothing left behind. */
static void test_allocation_failures(void **state)
{
    (void)state;
    gemm_buf b;
    rows_body(&b, "{\"a\": ", 3000, 3, ", \"b\": {\"data\": [1,2,3], \"shape\": [3, 1]}, \"dtype\": \"float32\"}");
    counter c;
    gemm_allocator al = counting(&c);
    result r = decode_chunks(b.data, b.len, 0, NULL, &al, NULL, b.len);
    assert_int_equal(r.rc, 0);
    long total = c.allocs;
    free_result(&r, &al);
    assert_true(total >= 3);
    for (long k = 0; k < total; k++) {
        memset(&c, 0, sizeof c);
        c.fail_at = k;
        r = decode_chunks(b.data, b.len, 333, NULL, &al, NULL, b.len);
        assert_int_equal(r.rc, -1);
        assert_int_equal(r.err.status, 503);
        assert_string_equal(r.err.code, "out_of_memory");
        assert_int_equal(c.now, 0);
        assert_int_equal(c.allocs, c.frees);
    }
    gemm_buf_free(&b);
}

/* The decoder's own numbers for the daemon: bytes held while reading, and the most held. */
static void test_held_and_offset(void **state)
{
    (void)state;
    counter c;
    gemm_allocator al = counting(&c);
    gemm_buf b;
    rows_body(&b, "{\"dtype\": \"float64\", \"a\": ", 2000, 4, ", \"b\": [[1],[2],[3],[4]]}");
    gemm_options opt;
    gemm_options_init(&opt);
    gemm_json_stream *js = gemm_json_stream_new(NULL, &al, &opt, b.len);
    size_t half = b.len / 2;
    gemm_err err;
    assert_int_equal(gemm_json_stream_feed(js, b.data, half, &err), 0);
    assert_int_equal(js->mem.now, c.now);
    assert_true(js->mem.now > 0);
    assert_int_equal(gemm_json_stream_feed(js, b.data + half, b.len - half, &err), 0);
    gemm_matrix a, bb;
    assert_int_equal(gemm_json_stream_finish(js, &opt, &a, &bb, &err), 0);
    assert_int_equal(js->mem.now, 0);
    assert_int_equal(js->mem.peak, c.peak);
    gemm_json_stream_free(js);
    assert_int_equal(c.now, mbytes(&a) + mbytes(&bb));
    gemm_free(&al, a.data);
    gemm_free(&al, bb.data);
    /* a decoder freed in the middle gives everything back */
    js = gemm_json_stream_new(NULL, &al, &opt, 0);
    assert_int_equal(gemm_json_stream_feed(js, b.data, half, &err), 0);
    gemm_json_stream_free(js);
    assert_int_equal(c.now, 0);
    gemm_buf_free(&b);
}

/* ---- operands by reference, one matrix on its own ------------------------------------ */

typedef struct {
    int calls, which[4];
    char ids[4][64];
} resolver;

/* Knows "F32" (2x2 float32) and "F64" (3x1 float64); anything else is 404. */
static int resolve(void *user, int which, const char *id, gemm_matrix *out, gemm_err *err)
{
    resolver *r = user;
    if (r->calls < 4) {
        r->which[r->calls] = which;
        snprintf(r->ids[r->calls], sizeof r->ids[0], "%s", id);
    }
    r->calls++;
    memset(out, 0, sizeof *out);
    if (strcmp(id, "F32") == 0) {
        out->rows = out->cols = 2;
        out->dtype = GEMM_DTYPE_F32;
        return 0;
    }
    if (strcmp(id, "F64") == 0) {
        out->rows = 3;
        out->cols = 1;
        out->dtype = GEMM_DTYPE_F64;
        return 0;
    }
    return gemm_err_set(err, 404, "matrix_not_found", "no resident matrix %s", id);
}

/* body decoded with references, in pieces of chunk bytes (0: whole); a_given/b_given: the
 * shapes of operands named in the query (NULL: not named). */
static result decode_refs(const char *body, long chunk, resolver *rv, const gemm_matrix *a_given,
                          const gemm_matrix *b_given)
{
    result r;
    memset(&r, 0, sizeof r);
    gemm_options_init(&r.opt);
    if (a_given) r.a = *a_given;
    if (b_given) r.b = *b_given;
    gemm_json_refs refs = {{a_given != NULL, b_given != NULL}, resolve, rv};
    gemm_json_stream *js = gemm_json_stream_new(NULL, &gemm_allocator_host, &r.opt, 0);
    gemm_json_stream_set_refs(js, &refs, &r.a, &r.b);
    size_t len = strlen(body);
    for (size_t off = 0; off < len && r.rc == 0; off += chunk ? (size_t)chunk : len)
        r.rc = gemm_json_stream_feed(js, body + off, chunk && (size_t)chunk < len - off ? (size_t)chunk : len - off,
                                     &r.err);
    if (r.rc == 0) r.rc = gemm_json_stream_finish(js, &r.opt, &r.a, &r.b, &r.err);
    gemm_json_stream_free(js);
    return r;
}

static void expect_refs(const char *body, const gemm_matrix *ag, const gemm_matrix *bg, int status, const char *code,
                        const char *needle, int resolves)
{
    for (long chunk = 0; chunk <= 1; chunk++) {
        resolver rv = {0};
        result r = decode_refs(body, chunk, &rv, ag, bg);
        if (r.rc != -1 || r.err.status != status || strcmp(r.err.code, code) || (needle && !strstr(r.err.message, needle)) ||
            rv.calls != resolves) {
            fprintf(stderr, "body %s\n  got %d %d %s: %s (%d resolves)\n  want %d %s with \"%s\" (%d)\n", body, r.rc,
                    r.err.status, r.err.code, r.err.message, rv.calls, status, code, needle ? needle : "", resolves);
            fail();
        }
    }
}

static void test_operands_by_reference(void **state)
{
    (void)state;
    gemm_matrix named = {.rows = 2, .cols = 3, .dtype = GEMM_DTYPE_F32, .data = NULL, .batch = 0};
    for (long chunk = 0; chunk <= 1; chunk++) {
        /* A named in the query: B alone in the body, stored at once in A's dtype */
        resolver rv = {0};
        result r = decode_refs("{\"b\": [[0.1], [2], [3e0]]}", chunk, &rv, &named, NULL);
        assert_int_equal(r.rc, 0);
        assert_int_equal(rv.calls, 0);
        assert_null(r.a.data);
        assert_int_equal(r.a.rows, 2);
        assert_int_equal(r.a.cols, 3);
        assert_int_equal(r.opt.dtype, GEMM_DTYPE_F32);
        assert_int_equal(r.b.dtype, GEMM_DTYPE_F32);
        assert_int_equal(r.b.rows, 3);
        assert_true(((float *)r.b.data)[0] == 0.1f);
        free_result(&r, &gemm_allocator_host);

        /* {"ref": ID} for A, resolved once the body is read; the rest of its object does not count */
        memset(&rv, 0, sizeof rv);
        r = decode_refs("{\"a\": {\"data\": [\"x\"], \"shape\": \"no\", \"ref\": \"F64\", \"data\": {}}, "
                        "\"b\": {\"shape\": [1, 2], \"data\": [1, 2]}}",
                        chunk, &rv, NULL, NULL);
        assert_int_equal(r.rc, 0);
        assert_int_equal(rv.calls, 1);
        assert_int_equal(rv.which[0], 0);
        assert_string_equal(rv.ids[0], "F64");
        assert_null(r.a.data);
        assert_int_equal(r.a.rows, 3);
        assert_int_equal(r.a.cols, 1);
        assert_int_equal(r.opt.dtype, GEMM_DTYPE_F64); /* the resident operand's */
        assert_true(((double *)r.b.data)[1] == 2);
        free_result(&r, &gemm_allocator_host);

        /* both by reference: no elements at all */
        memset(&rv, 0, sizeof rv);
        r = decode_refs("{\"b\": {\"ref\": \"F32\"}, \"a\": {\"ref\": \"F32\"}}", chunk, &rv, NULL, NULL);
        assert_int_equal(r.rc, 0);
        assert_int_equal(rv.calls, 2);
        assert_int_equal(rv.which[0], 0); /* a first, as a request is read */
        assert_int_equal(r.opt.dtype, GEMM_DTYPE_F32);
        assert_null(r.a.data);
        assert_null(r.b.data);
    }
    expect_refs("{\"a\": [[1, 2, 3], [4, 5, 6]], \"b\": [[1]]}", &named, NULL, 400, "bad_matrix",
                "a is named in the query (a=ID) and given in the body too; send it once", 0);
    expect_refs("{\"a\": {\"ref\": \"nope\"}, \"b\": [[1]]}", NULL, NULL, 404, "matrix_not_found", "nope", 1);
    expect_refs("{\"a\": {\"ref\": 7}, \"b\": [[1]]}", NULL, NULL, 400, "bad_matrix",
                "a.ref is a number; expected a matrix id (a string)", 0);
    expect_refs("{\"a\": {\"ref\": [\"F32\"]}, \"b\": [[1]]}", NULL, NULL, 400, "bad_matrix", "a.ref is an array", 0);
    /* a's structure before b's reference: b is not even looked up */
    expect_refs("{\"b\": {\"ref\": \"nope\"}, \"a\": [[1], [2, 3]]}", NULL, NULL, 400, "bad_matrix", "row 1 of a", 0);
    /* a's reference before b's structure */
    expect_refs("{\"b\": [[1], [2, 3]], \"a\": {\"ref\": \"nope\"}}", NULL, NULL, 404, "matrix_not_found", NULL, 1);
    /* options before references */
    expect_refs("{\"a\": {\"ref\": \"F32\"}, \"b\": [[1]], \"tile\": 0}", NULL, NULL, 422, "bad_option", "tile", 0);
    /* a resident operand fixes the dtype */
    expect_refs("{\"a\": {\"ref\": \"F32\"}, \"b\": [[1, 2], [3, 4]], \"dtype\": \"float64\"}", NULL, NULL, 422,
                "dtype_mismatch", "a is a resident float32 matrix but the product is float64", 1);
    expect_refs("{\"a\": {\"ref\": \"F64\"}, \"b\": {\"ref\": \"F32\"}}", NULL, NULL, 422, "dtype_mismatch",
                "b is a resident float32 matrix but the product is float64", 2);
    expect_refs("{\"a\": {\"ref\": \"F32\"}, \"b\": [[1, 2, 3]]}", NULL, NULL, 422, "shape_mismatch",
                "A is 2x2 and B is 1x3", 1);
    /* without a resolver (gemm_json_decode_request) a reference is not taken */
    expect_error("{\"a\": {\"ref\": \"F32\"}, \"b\": [[1]]}", 400, "bad_matrix",
                 "a.ref: references to resident matrices are not taken here");
}

static result decode_one(const char *body, long chunk)
{
    result r;
    memset(&r, 0, sizeof r);
    gemm_options_init(&r.opt);
    gemm_json_stream *js = gemm_json_stream_new_matrix(NULL, &gemm_allocator_host, &r.opt, 0);
    size_t len = strlen(body);
    for (size_t off = 0; off < len && r.rc == 0; off += chunk ? (size_t)chunk : len)
        r.rc = gemm_json_stream_feed(js, body + off, chunk && (size_t)chunk < len - off ? (size_t)chunk : len - off,
                                     &r.err);
    if (r.rc == 0) r.rc = gemm_json_stream_finish_matrix(js, &r.opt, &r.a, &r.err);
    assert_int_equal(js->mem.now, 0);
    gemm_json_stream_free(js);
    return r;
}

static void expect_one(const char *body, int status, const char *code, const char *needle)
{
    for (long chunk = 0; chunk <= 1; chunk++) {
        result r = decode_one(body, chunk);
        if (r.rc != -1 || r.err.status != status || strcmp(r.err.code, code) || (needle && !strstr(r.err.message, needle))) {
            fprintf(stderr, "body %s\n  got %d %d %s: %s\n  want %d %s with \"%s\"\n", body, r.rc, r.err.status, r.err.code,
                    r.err.message, status, code, needle ? needle : "");
            fail();
        }
        assert_null(r.a.data);
    }
}

static void test_one_matrix(void **state)
{
    (void)state;
    for (long chunk = 0; chunk <= 1; chunk++) {
        result r = decode_one(" [[1, 2.5], [3, 4]] ", chunk);
        assert_int_equal(r.rc, 0);
        assert_int_equal(r.a.rows, 2);
        assert_int_equal(r.a.dtype, GEMM_DTYPE_F64);
        assert_true(((double *)r.a.data)[1] == 2.5);
        free_result(&r, &gemm_allocator_host);
        r = decode_one("{\"data\": [1, 2, 3, 4, 5, 6], \"dtype\": \"float32\", \"shape\": [2, 3]}", chunk);
        assert_int_equal(r.rc, 0);
        assert_int_equal(r.a.rows, 2);
        assert_int_equal(r.a.cols, 3);
        assert_int_equal(r.a.dtype, GEMM_DTYPE_F32);
        assert_true(((float *)r.a.data)[5] == 6);
        free_result(&r, &gemm_allocator_host);
        r = decode_one("{\"kernel\": \"naive\", \"data\": [[1, 2], [3, -4]], \"dtype\": \"int32\", \"note\": [1]}", chunk);
        assert_int_equal(r.rc, 0);
        assert_int_equal(r.a.rows, 2);
        assert_int_equal(r.a.cols, 2);
        assert_int_equal(r.a.dtype, GEMM_DTYPE_I32);
        assert_int_equal(((int32_t *)r.a.data)[3], -4);
        assert_string_equal(r.opt.kernel, "naive");
        free_result(&r, &gemm_allocator_host);
    }
    expect_one("", 400, "bad_json", "expected a matrix");
    expect_one("42", 400, "bad_matrix", "the body is a number; expected [[..],[..]] or {\"shape\": [r,c], \"data\": [..]}");
    expect_one("[[1, 2], [3]]", 400, "bad_matrix", "row 1 of matrix has 1 elements, row 0 has 2");
    expect_one("[1, 2]", 400, "bad_matrix", "matrix is a 1-D array");
    expect_one("{\"data\": [1, 2, 3]}", 400, "bad_matrix", "matrix is a 1-D array");
    expect_one("{\"data\": []}", 422, "empty_matrix", NULL);
    expect_one("[]", 422, "empty_matrix", NULL);
    expect_one("{\"data\": 5}", 400, "bad_matrix", "matrix.shape must be");
    expect_one("{\"shape\": [2, 2]}", 400, "bad_matrix", "matrix.data must be an array of numbers (row-major), not missing");
    expect_one("{\"shape\": [2, 2], \"data\": [1, 2, 3]}", 400, "bad_matrix", "matrix.data has 3 numbers but shape [2,2] needs 4");
    expect_one("{\"data\": [[1, 2]], \"shape\": [1, 2]}", 400, "bad_matrix", "matrix.data has 1 numbers but shape [1,2] needs 2");
    expect_one("{\"data\": [[1, 2]], \"shape\": [1, 1]}", 400, "bad_matrix", "matrix.data[0] is an array, expected a number");
    expect_one("{\"data\": [[1, \"x\"]]}", 400, "bad_matrix", "matrix[0][1] is a string, expected a number");
    expect_one("{\"shape\": [1, 2], \"data\": [1, null]}", 400, "bad_matrix", "matrix.data[1] is null");
    expect_one("{\"data\": [[1]], \"dtype\": \"float8\"}", 422, "bad_option", "float8");
    expect_one("{\"data\": [[1e39]], \"dtype\": \"float32\"}", 422, "bad_value", "matrix[0][0]");
    expect_one("{\"ref\": \"F32\"}", 400, "bad_matrix", "matrix.shape must be"); /* not taken for an upload */
    expect_one("[[1]] [[2]]", 400, "bad_json", "after the JSON value");
    /* limits: gemm_check_matrix's, for "the matrix" */
    gemm_limits lim = {.max_dim = 4, .max_elements = 8, .max_body_bytes = 0};
    gemm_options opt;
    gemm_matrix m;
    gemm_err err;
    gemm_options_init(&opt);
    const char *wide = "[[1, 2, 3, 4, 5]]";
    assert_int_equal(gemm_json_decode_matrix(wide, strlen(wide), &lim, &gemm_allocator_host, &opt, &m, &err), -1);
    assert_int_equal(err.status, 413);
    assert_non_null(strstr(err.message, "the matrix"));
    const char *ok = "{\"shape\": [2, 4], \"data\": [1, 2, 3, 4, 5, 6, 7, 8]}";
    assert_int_equal(gemm_json_decode_matrix(ok, strlen(ok), &lim, &gemm_allocator_host, &opt, &m, &err), 0);
    assert_true(((double *)m.data)[7] == 8);
    gemm_allocator_host.free(NULL, m.data);
}

/* ---- batched (3-D) operands -------------------------------------------------------------- */

/* A stack of batch rows x cols matrices as text: nested three deep, or {"shape": [b, r, c],
 * "data": [flat]} with the shape first or last; its reference values in dst (row-major, the
 * matrices one after the other). */
static void stack_text(gemm_buf *b, gemm_dtype d, uint64_t batch, uint64_t rows, uint64_t cols, void *dst)
{
    if (below(2)) {
        gemm_buf_puts(b, "[");
        for (uint64_t s = 0; s < batch; s++) {
            gemm_buf_puts(b, s ? ",[" : "[");
            ws(b);
            for (uint64_t i = 0; i < rows; i++) {
                gemm_buf_puts(b, i ? ",[" : "[");
                for (uint64_t j = 0; j < cols; j++) {
                    if (j) gemm_buf_puts(b, ",");
                    ws(b);
                    element(b, d, dst, (size_t)((s * rows + i) * cols + j));
                }
                gemm_buf_puts(b, "]");
            }
            gemm_buf_puts(b, "]");
        }
        gemm_buf_puts(b, "]");
        return;
    }
    int shape_first = (int)below(2);
    gemm_buf_puts(b, "{");
    if (shape_first)
        gemm_buf_printf(b, "\"shape\":[%llu,%llu,%llu],", (unsigned long long)batch, (unsigned long long)rows,
                        (unsigned long long)cols);
    gemm_buf_puts(b, "\"data\":[");
    for (uint64_t i = 0; i < batch * rows * cols; i++) {
        if (i) gemm_buf_puts(b, ",");
        ws(b);
        element(b, d, dst, (size_t)i);
    }
    gemm_buf_puts(b, "]");
    if (!shape_first)
        gemm_buf_printf(b, ",\"shape\":[%llu,%llu,%llu]", (unsigned long long)batch, (unsigned long long)rows,
                        (unsigned long long)cols);
    gemm_buf_puts(b, "}");
}

/* Random batched requests - A (b, m, k) with B (b, k, n) or one (k, n), either form each,
 * the dtype first, last, in the query or absent, in random chunks - give the values written,
 * with the batch in gemm_matrix.batch (0 for a shared 2-D B). */
static void test_batched_documents(void **state)
{
    (void)state;
    for (int iter = 0; iter < 400; iter++) {
        gemm_dtype d = (gemm_dtype)below(3);
        int where = (int)below(4); /* 0 first, 1 last, 2 query, 3 none (float64) */
        if (where == 3) d = GEMM_DTYPE_F64;
        uint64_t bs = 1 + below(5), m = 1 + below(6), k = 1 + below(6), n = 1 + below(6);
        if (iter % 40 == 0) bs = 150 + below(100); /* a large batch: outgrows the inline room */
        int shared = (int)below(2), b_first = below(4) == 0;
        uint64_t nb = shared ? 1 : bs;
        size_t es = gemm_dtype_size(d);
        void *ra = calloc((size_t)(bs * m * k), es), *rb = calloc((size_t)(nb * k * n), es);
        gemm_buf b;
        gemm_buf_init(&b);
        gemm_buf_puts(&b, "{");
        if (where == 0) gemm_buf_printf(&b, "\"dtype\":\"%s\",", gemm_dtype_name(d));
        for (int i = 0; i < 2; i++) {
            if (i) gemm_buf_puts(&b, ",");
            ws(&b);
            if ((i == 0) != b_first) {
                gemm_buf_puts(&b, "\"a\":");
                stack_text(&b, d, bs, m, k, ra);
            } else {
                gemm_buf_puts(&b, "\"b\":");
                if (shared) matrix_text(&b, d, k, n, rb);
                else stack_text(&b, d, bs, k, n, rb);
            }
        }
        if (where == 1) gemm_buf_printf(&b, ",\"dtype\":\"%s\"", gemm_dtype_name(d));
        gemm_buf_puts(&b, "}");
        assert_false(b.failed);

        gemm_options q;
        gemm_options_init(&q);
        if (where == 2) q.dtype = d;
        long chunk = iter % 3 == 0 ? 1 : iter % 3 == 1 ? 0 : -17;
        result r = decode_chunks(b.data, b.len, chunk, NULL, &gemm_allocator_host, &q, b.len);
        if (r.rc) fprintf(stderr, "%s\n%.400s\n", r.err.message, b.data);
        assert_int_equal(r.rc, 0);
        assert_int_equal(r.a.dtype, d);
        assert_int_equal(r.b.dtype, d);
        assert_int_equal(r.a.batch, bs);
        assert_int_equal(r.a.rows, m);
        assert_int_equal(r.a.cols, k);
        assert_int_equal(r.b.batch, shared ? 0 : bs);
        assert_int_equal(r.b.rows, k);
        assert_int_equal(r.b.cols, n);
        if (memcmp(r.a.data, ra, (size_t)(bs * m * k) * es) || memcmp(r.b.data, rb, (size_t)(nb * k * n) * es)) {
            fprintf(stderr, "wrong values (%s, dtype at %d):\n%.400s\n", gemm_dtype_name(d), where, b.data);
            fail();
        }
        assert_int_equal(r.held_after, 0);
        free_result(&r, &gemm_allocator_host);
        gemm_buf_free(&b);
        free(ra);
        free(rb);
    }
    /* small ones, cut every way */
    static const char *const docs[] = {
        "{\"a\": [[[1, 2]], [[3, 4]]], \"b\": [[1], [2]]}",
        "{\"b\": [[[1]], [[2]]], \"a\": {\"shape\": [2, 1, 1], \"data\": [3, 4]}, \"dtype\": \"int32\"}",
        "{\"a\": {\"data\": [1, 2, 3], \"shape\": [3, 1, 1]}, \"b\": {\"shape\": [3, 1, 2], \"data\": [1,2,3,4,5,6]}}",
        "{\"a\": [[[1, 2]], [[3]]], \"b\": [[1], [2]]}",
        "{\"a\": [[[1]], [[2], [3]]], \"b\": [[1]]}",
        "{\"a\": [[[[1]]]], \"b\": [[1]]}",
        "{\"a\": [[[1]], [[2]]], \"b\": [[[1]], [[2]], [[3]]]}",
        "{\"a\": [[1]], \"b\": [[[1]]]}",
        "{\"a\": [[[1]], [[\"x\"]]], \"b\": [[1]], \"dtype\": \"float32\"}",
    };
    for (size_t i = 0; i < sizeof docs / sizeof docs[0]; i++) {
        result r = chunk_invariant(docs[i], NULL);
        free_result(&r, &gemm_allocator_host);
    }
    result r = chunk_invariant(docs[0], NULL);
    assert_int_equal(r.rc, 0);
    assert_int_equal(r.a.batch, 2);
    assert_int_equal(r.a.rows, 1);
    assert_int_equal(r.a.cols, 2);
    assert_int_equal(r.b.batch, 0);
    assert_true(((double *)r.a.data)[3] == 4);
    free_result(&r, &gemm_allocator_host);
    /* a (1, m, k) array is a batch of one */
    r = chunk_invariant("{\"a\": [[[1, 2], [3, 4]]], \"b\": [[[5], [6]]]}", NULL);
    assert_int_equal(r.rc, 0);
    assert_int_equal(r.a.batch, 1);
    assert_int_equal(r.a.rows, 2);
    assert_int_equal(r.b.batch, 1);
    assert_int_equal(r.b.rows, 2);
    free_result(&r, &gemm_allocator_host);
}

static void test_batched_errors(void **state)
{
    (void)state;
    /* structure: ragged rows, matrices of different sizes, wrong nesting */
    expect_error("{\"a\": [[[1, 2]], [[3]]], \"b\": [[1], [2]]}", 400, "bad_matrix",
                 "row 0 of a[1] has 1 elements, row 0 of a[0] has 2");
    expect_error("{\"a\": [[[1, 2], [3, 4]], [[5, 6], [7]]], \"b\": [[1], [2]]}", 400, "bad_matrix",
                 "row 1 of a[1] has 1 elements");
    expect_error("{\"a\": [[[1]], [[2], [3]]], \"b\": [[1]]}", 400, "bad_matrix", "a[1] has 2 rows, a[0] has 1");
    expect_error("{\"a\": [[[1]], 2], \"b\": [[1]]}", 400, "bad_matrix", "a[1] is a number; a is 3-D");
    expect_error("{\"a\": [[[1]], {}], \"b\": [[1]]}", 400, "bad_matrix", "a[1] is an object; a is 3-D");
    expect_error("{\"a\": [[[1]], [3]], \"b\": [[1]]}", 400, "bad_matrix", "a[1][0] is a number, expected an array (a row)");
    expect_error("{\"a\": [[[1]], [{}]], \"b\": [[1]]}", 400, "bad_matrix", "a[1][0] is an object, expected an array");
    expect_error("{\"a\": [[[[1]]]], \"b\": [[1]]}", 400, "bad_matrix",
                 "a[0][0][0] is an array, expected a number (an operand has at most three dimensions");
    expect_error("{\"a\": [[1], [[2]]], \"b\": [[1]]}", 400, "bad_matrix", "a[1][0] is an array, expected a number");
    expect_error("{\"a\": {\"shape\": [1, 1, 1, 1], \"data\": [1]}, \"b\": [[1]]}", 400, "bad_matrix",
                 "a.shape must be [rows, cols] or [batch, rows, cols]");
    expect_error("{\"a\": {\"shape\": [2, 1, 1], \"data\": [1]}, \"b\": [[1]]}", 400, "bad_matrix",
                 "a.data has 1 numbers but shape [2,1,1] needs 2");
    expect_error("{\"a\": {\"data\": [1, 2, 3], \"shape\": [2, 1, 1]}, \"b\": [[1]]}", 400, "bad_matrix",
                 "a.data has 3 numbers but shape [2,1,1] needs 2");
    /* the product: batches as NumPy matmul broadcasts them, inner dimensions, empty ones */
    expect_error("{\"a\": [[[1]], [[2]]], \"b\": [[[1]], [[2]], [[3]]]}", 422, "batch_mismatch",
                 "A holds 2 matrices and B 3");
    expect_error("{\"b\": {\"shape\": [3, 1, 1], \"data\": [1, 2, 3]}, \"a\": [[[1]], [[2]]]}", 422, "batch_mismatch",
                 "A holds 2 matrices and B 3");
    expect_error("{\"a\": [[1]], \"b\": [[[1]]]}", 422, "batch_mismatch", "B is 3-D (1 matrices) but A is 2-D");
    expect_error("{\"b\": [[[1]], [[2]]], \"a\": [[1]]}", 422, "batch_mismatch", "B is 3-D (2 matrices) but A is 2-D");
    expect_error("{\"a\": [[[1, 2]]], \"b\": [[[1]]]}", 422, "shape_mismatch", "A is 1x2 and B is 1x1");
    expect_error("{\"a\": [[[1, 2]], [[3, 4]]], \"b\": [[1], [2], [3]]}", 422, "shape_mismatch", "A is 1x2 and B is 3x1");
    expect_error("{\"a\": {\"shape\": [0, 1, 1], \"data\": []}, \"b\": [[1]]}", 422, "bad_batch", "A has a batch of 0");
    expect_error("{\"a\": [[[1]]], \"b\": {\"shape\": [0, 1, 1], \"data\": []}}", 422, "bad_batch", "B has a batch of 0");
    expect_error("{\"a\": [[[]]], \"b\": [[1]]}", 422, "empty_matrix", NULL);
    expect_error("{\"a\": {\"shape\": [2, 0, 1], \"data\": []}, \"b\": [[1]]}", 422, "empty_matrix", NULL);
    expect_error("{\"a\": {\"shape\": [1000001, 1, 1], \"data\": []}, \"b\": [[1]]}", 413, "too_large",
                 "one request carries at most 1000000");
    /* elements, named by their place */
    expect_error("{\"a\": [[[1]], [[\"x\"]]], \"b\": [[1]]}", 400, "bad_matrix", "a[1][0][0] is a string, expected a number");
    expect_error("{\"dtype\": \"int32\", \"a\": [[[1, 2]], [[3, 4.5]]], \"b\": [[1], [2]]}", 422, "bad_value",
                 "a[1][0][1] = 4.5 is not an int32");
    expect_error("{\"a\": [[[1, 2]], [[3, 4.5]]], \"b\": [[1], [2]], \"dtype\": \"int32\"}", 422, "bad_value",
                 "a[1][0][1] = 4.5 is not an int32");
    expect_error("{\"a\": [[[1], [2]], [[3], [1e39]]], \"b\": [[1]], \"dtype\": \"float32\"}", 422, "bad_value",
                 "a[1][1][0] = 9.9999999999999994e+38 is beyond float32's range");
    expect_error("{\"a\": [[[1]]], \"b\": {\"shape\": [1, 1, 2], \"data\": [1, null]}}", 400, "bad_matrix",
                 "b.data[1] is null");
    /* which error wins: structure before the batch, the batch before elements */
    expect_error("{\"a\": [[[1]], [[2], [3]]], \"b\": [[[1]]]}", 400, "bad_matrix", "a[1] has 2 rows");
    expect_error("{\"a\": [[[\"x\"]], [[2]]], \"b\": [[[1]]]}", 422, "batch_mismatch", NULL);
    /* one matrix on its own (a resident matrix) is 2-D */
    expect_one("[[[1]]]", 400, "bad_matrix", "matrix[0][0] is an array, expected a number");
    expect_one("{\"shape\": [1, 1, 1], \"data\": [1]}", 400, "bad_matrix", "matrix.shape must be [rows, cols] with two");
    /* a batched request takes no resident operand, named in the body or in the query */
    expect_refs("{\"a\": [[[1, 2], [3, 4]]], \"b\": {\"ref\": \"F32\"}}", NULL, NULL, 400, "bad_option",
                "a is 3-D (a batch of 1 matrices) and b is a resident matrix; a batched request takes no resident", 1);
    expect_refs("{\"a\": {\"ref\": \"F32\"}, \"b\": {\"shape\": [4, 2, 2], \"data\": []}}", NULL, NULL, 400, "bad_option",
                "b is 3-D (a batch of 4 matrices)", 1);
    gemm_matrix named = {.rows = 2, .cols = 3, .dtype = GEMM_DTYPE_F64, .data = NULL, .batch = 0};
    expect_refs("{\"a\": [[[1, 2]], [[3, 4]]]}", NULL, &named, 400, "bad_option", "a batched request takes no resident", 0);
    expect_refs("{\"a\": [[[1, 2]]], \"b\": {\"ref\": \"nope\"}}", NULL, NULL, 404, "matrix_not_found", NULL, 1);
}

/* Limits and memory of 3-D operands: declared stacks checked before anything is allocated,
 * storing stopped at the first element that makes the operand invalid, exact buffers when
 * the size is known, nothing held at the end but the matrices. */
static void test_batched_limits(void **state)
{
    (void)state;
    counter c;
    gemm_allocator al = counting(&c);
    gemm_limits lim = {.max_dim = 1000, .max_elements = 20000, .max_body_bytes = 0};
    static const char *const huge[] = {
        "{\"a\": {\"shape\": [1000, 1000, 1000], \"data\": [1, 2, 3]}, \"b\": {\"shape\": [1000, 1], \"data\": []}}",
        "{\"a\": {\"shape\": [1000001, 1, 1], \"data\": [1, 2, 3]}, \"b\": [[1]]}",
        "{\"a\": {\"shape\": [1000000, 9007199254740992, 9007199254740992], \"data\": [1]}, "
        "\"b\": {\"shape\": [9007199254740992, 1], \"data\": [1]}}",
        "{\"a\": [[[1]]], \"b\": {\"shape\": [1, 1, 1001], \"data\": [1, 2, 3]}}",
    };
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        for (int with_lim = 0; with_lim < 2; with_lim++) {
            if (!with_lim && i == 3) continue; /* within the limits when there are none */
            c.allocs = c.frees = 0;
            result r = decode_chunks(huge[i], strlen(huge[i]), 5, with_lim ? &lim : NULL, &al, NULL, 0);
            assert_int_equal(r.rc, -1);
            if (with_lim || i == 1 || i == 2) { /* without limits, 8 GB for i = 0 would be fine */
                assert_int_equal(r.err.status, 413);
                assert_string_equal(r.err.code, "too_large");
            }
            assert_int_equal(c.allocs, 0);
        }
    }
    gemm_buf b;
    /* 5000 matrices of 2x4 int32 (40000 elements) against max_elements 20000 */
    gemm_buf_init(&b);
    gemm_buf_puts(&b, "{\"dtype\": \"int32\", \"a\": [");
    for (int s = 0; s < 5000; s++) gemm_buf_printf(&b, "%s[[%d,1,2,3],[4,5,6,7]]", s ? "," : "", s % 97);
    gemm_buf_puts(&b, "], \"b\": [[1],[2],[3],[4]]}");
    memset(&c, 0, sizeof c);
    c.fail_at = -1;
    result r = decode_chunks(b.data, b.len, 4096, &lim, &al, NULL, b.len);
    assert_int_equal(r.rc, -1);
    assert_int_equal(r.err.status, 413);
    assert_non_null(strstr(r.err.message, "A is 5000x2x4"));
    assert_true(c.peak <= 3 * 20000 * 4);
    assert_int_equal(c.now, 0);
    gemm_buf_free(&b);
    /* B with more matrices than A: storing B stops at the first one too many */
    gemm_buf_init(&b);
    gemm_buf_puts(&b, "{\"a\": [[[1, 2]], [[3, 4]]], \"b\": [");
    for (int s = 0; s < 900; s++) gemm_buf_printf(&b, "%s[[1,2,3,4,5,6,7,8,9,10],[1,2,3,4,5,6,7,8,9,10]]", s ? "," : "");
    gemm_buf_puts(&b, "]}");
    memset(&c, 0, sizeof c);
    c.fail_at = -1;
    r = decode_chunks(b.data, b.len, 4096, &lim, &al, NULL, b.len);
    assert_string_equal(r.err.code, "batch_mismatch");
    assert_non_null(strstr(r.err.message, "A holds 2 matrices and B 900"));
    assert_true(c.peak <= 2 * 2 * 10 * 8 + 2 * 2 * 8 + 64); /* B: exactly two matrices' room, at most */
    assert_int_equal(c.now, 0);
    gemm_buf_free(&b);
    /* a 3-D B with a 2-D A is never stored; nor a 3-D operand with a resident other */
    gemm_buf_init(&b);
    gemm_buf_puts(&b, "{\"a\": [[1, 2]], \"b\": [");
    for (int s = 0; s < 900; s++) gemm_buf_printf(&b, "%s[[1,2,3,4,5,6,7,8,9,10],[1,2,3,4,5,6,7,8,9,10]]", s ? "," : "");
    gemm_buf_puts(&b, "]}");
    memset(&c, 0, sizeof c);
    c.fail_at = -1;
    r = decode_chunks(b.data, b.len, 4096, &lim, &al, NULL, b.len);
    assert_string_equal(r.err.code, "batch_mismatch");
    assert_true(c.peak <= 2 * 8);
    assert_int_equal(c.now, 0);
    gemm_buf_free(&b);

    /* exact buffers: a declared stack first, and B (3-D) after A (3-D), whose size A fixes */
    const uint64_t bs = 40, m = 7, k = 9, n = 11;
    gemm_buf_init(&b);
    gemm_buf_printf(&b, "{\"dtype\": \"float32\", \"a\": {\"shape\": [%llu, %llu, %llu], \"data\": [", (unsigned long long)bs,
                    (unsigned long long)m, (unsigned long long)k);
    for (uint64_t i = 0; i < bs * m * k; i++) gemm_buf_printf(&b, i ? ",%llu" : "%llu", (unsigned long long)(i % 89));
    gemm_buf_puts(&b, "]}, \"b\": [");
    for (uint64_t s = 0; s < bs; s++) {
        gemm_buf_puts(&b, s ? ",[" : "[");
        for (uint64_t i = 0; i < k; i++) {
            gemm_buf_puts(&b, i ? ",[" : "[");
            for (uint64_t j = 0; j < n; j++) gemm_buf_printf(&b, j ? ",%llu" : "%llu", (unsigned long long)((s + i + j) % 7));
            gemm_buf_puts(&b, "]");
        }
        gemm_buf_puts(&b, "]");
    }
    gemm_buf_puts(&b, "]}");
    for (long chunk = 0; chunk <= 999; chunk += 999) {
        memset(&c, 0, sizeof c);
        c.fail_at = -1;
        r = decode_chunks(b.data, b.len, chunk, NULL, &al, NULL, b.len);
        assert_int_equal(r.rc, 0);
        assert_int_equal(r.a.batch, bs);
        assert_int_equal(r.b.batch, bs);
        assert_int_equal(c.peak, (bs * m * k + bs * k * n) * 4); /* nothing but the two stacks, ever */
        assert_int_equal(c.allocs, 2);
        assert_true(((float *)r.b.data)[(bs - 1) * k * n + k * n - 1] == (float)((bs - 1 + k - 1 + n - 1) % 7));
        assert_int_equal(r.held_after, 0);
        free_result(&r, &al);
        assert_int_equal(c.now, 0);
    }
    gemm_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_numbers_edge_cases),
        cmocka_unit_test(test_numbers_random),
        cmocka_unit_test(test_number_grammar),
        cmocka_unit_test(test_random_documents),
        cmocka_unit_test(test_every_split_point),
        cmocka_unit_test(test_mutations_are_chunk_invariant),
        cmocka_unit_test(test_syntax_errors),
        cmocka_unit_test(test_utf8_strings),
        cmocka_unit_test(test_depth_and_length_limits),
        cmocka_unit_test(test_semantic_errors_in_order),
        cmocka_unit_test(test_declared_shapes_before_allocation),
        cmocka_unit_test(test_limits_stop_storing_at_once),
        cmocka_unit_test(test_peak_memory),
        cmocka_unit_test(test_allocation_failures),
        cmocka_unit_test(test_held_and_offset),
        cmocka_unit_test(test_operands_by_reference),
        cmocka_unit_test(test_one_matrix),
        cmocka_unit_test(test_batched_documents),
        cmocka_unit_test(test_batched_errors),
        cmocka_unit_test(test_batched_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
