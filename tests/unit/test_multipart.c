/* test_multipart.c - the streaming multipart/form-data parser: boundaries from the
 * Content-Type, preamble and epilogue, part headers, binary bodies full of CR, LF and
 * near-boundaries, every chunking (1 byte, random splits), malformed framing, truncation,
 * callback errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "multipart.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

/* ---- a recorder for the callbacks ----------------------------------------- */

enum { MAXP = 8 };
typedef struct {
    char name[256], filename[256], ctype[256];
    int has_filename, has_ctype, ended;
    unsigned char *body;
    size_t len;
} rec_part;

typedef struct {
    rec_part p[MAXP];
    int n, in_part;
    int fail_begin_at, fail_data_after; /* -1: never */
    int set_err;
} recorder;

static int on_begin(void *user, const char *name, const char *filename, const char *ctype, gemm_err *err)
{
    recorder *r = user;
    assert_false(r->in_part);
    assert_true(r->n < MAXP);
    if (r->fail_begin_at == r->n) {
        if (r->set_err) gemm_err_set(err, 422, "unknown_part", "part '%s' is not a or b", name);
        return -1;
    }
    rec_part *p = &r->p[r->n++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    if (filename) snprintf(p->filename, sizeof p->filename, "%s", filename), p->has_filename = 1;
    if (ctype) snprintf(p->ctype, sizeof p->ctype, "%s", ctype), p->has_ctype = 1;
    r->in_part = 1;
    return 0;
}

static int on_data(void *user, const void *data, size_t len, gemm_err *err)
{
    recorder *r = user;
    assert_true(r->in_part);
    assert_true(len > 0);
    rec_part *p = &r->p[r->n - 1];
    if (r->fail_data_after >= 0 && p->len + len > (size_t)r->fail_data_after) {
        if (r->set_err) gemm_err_set(err, 413, "too_large", "part too large");
        return -1;
    }
    p->body = realloc(p->body, p->len + len);
    assert_non_null(p->body);
    memcpy(p->body + p->len, data, len);
    p->len += len;
    return 0;
}

static int on_end(void *user, gemm_err *err)
{
    (void)err;
    recorder *r = user;
    assert_true(r->in_part);
    r->in_part = 0;
    r->p[r->n - 1].ended = 1;
    return 0;
}

static const gemm_multipart_callbacks callbacks = {on_begin, on_data, on_end};

static void rec_init(recorder *r)
{
    memset(r, 0, sizeof *r);
    r->fail_begin_at = -1;
    r->fail_data_after = -1;
}

static void rec_free(recorder *r)
{
    for (int i = 0; i < r->n; i++) free(r->p[i].body);
}

/* Parses body in chunks (0 = random sizes 1..max); returns feed/finish's result. */
static int parse(const char *ctype, const void *body, size_t len, size_t chunk, recorder *r, gemm_err *err)
{
    gemm_err_clear(err);
    gemm_multipart *mp = gemm_multipart_new(ctype, &callbacks, r, err);
    assert_non_null(mp);
    const unsigned char *p = body;
    size_t off = 0;
    int rc = 0;
    size_t max = 1 + rnd() % 300;
    while (off < len) {
        size_t n = chunk ? chunk : 1 + rnd() % max;
        if (n > len - off) n = len - off;
        rc = gemm_multipart_feed(mp, p + off, n, err);
        if (rc) break;
        off += n;
    }
    if (rc == 0) rc = gemm_multipart_finish(mp, err);
    gemm_multipart_free(mp);
    return rc;
}

/* ---- building bodies ------------------------------------------------------ */

typedef struct {
    const char *headers; /* header lines, each ending in CRLF */
    const void *body;
    size_t len;
} part_spec;

static unsigned char *build(const char *boundary, const char *preamble, const part_spec *parts, int n,
                            const char *epilogue, size_t *out_len)
{
    size_t cap = 1024 + (preamble ? strlen(preamble) : 0) + (epilogue ? strlen(epilogue) : 0);
    for (int i = 0; i < n; i++) cap += strlen(parts[i].headers) + parts[i].len + strlen(boundary) + 16;
    unsigned char *b = malloc(cap);
    size_t o = 0;
#define PUT(p, l) (memcpy(b + o, (p), (l)), o += (l))
#define PUTS(s) PUT((s), strlen(s))
    if (preamble) {
        PUTS(preamble);
        PUTS("\r\n");
    }
    for (int i = 0; i < n; i++) {
        if (i) PUTS("\r\n");
        PUTS("--");
        PUTS(boundary);
        PUTS("\r\n");
        PUTS(parts[i].headers);
        PUTS("\r\n");
        PUT(parts[i].body, parts[i].len);
    }
    PUTS("\r\n--");
    PUTS(boundary);
    PUTS("--");
    if (epilogue) PUTS(epilogue);
#undef PUT
#undef PUTS
    *out_len = o;
    return b;
}

static size_t chunk_sizes[] = {1, 2, 3, 5, 7, 13, 64, 1 << 20, 0, 0, 0, 0, 0, 0};

/* ---- tests ------------------------------------------------------------------ */

static void test_curl_like_body_any_chunking(void **state)
{
    (void)state;
    const char *ct = "multipart/form-data; boundary=------------------------d74496d66958873e";
    const char *bnd = "------------------------d74496d66958873e";
    unsigned char npy[300];
    for (size_t i = 0; i < sizeof npy; i++) npy[i] = (unsigned char)(i * 7 + 13);
    part_spec parts[] = {
        {"Content-Disposition: form-data; name=\"a\"; filename=\"A.npy\"\r\nContent-Type: application/octet-stream\r\n",
         npy, sizeof npy},
        {"Content-Disposition: form-data; name=\"b\"; filename=\"B.npy\"\r\nContent-Type: application/octet-stream\r\n",
         npy + 100, 150},
        {"Content-Disposition: form-data; name=\"kernel\"\r\n", "tiled", 5},
    };
    size_t len;
    unsigned char *body = build(bnd, NULL, parts, 3, "\r\n", &len);
    for (size_t c = 0; c < sizeof chunk_sizes / sizeof chunk_sizes[0]; c++) {
        recorder r;
        gemm_err err;
        rec_init(&r);
        assert_int_equal(parse(ct, body, len, chunk_sizes[c], &r, &err), 0);
        assert_int_equal(r.n, 3);
        assert_string_equal(r.p[0].name, "a");
        assert_string_equal(r.p[0].filename, "A.npy");
        assert_string_equal(r.p[0].ctype, "application/octet-stream");
        assert_int_equal(r.p[0].len, sizeof npy);
        assert_memory_equal(r.p[0].body, npy, sizeof npy);
        assert_string_equal(r.p[1].name, "b");
        assert_int_equal(r.p[1].len, 150);
        assert_memory_equal(r.p[1].body, npy + 100, 150);
        assert_string_equal(r.p[2].name, "kernel");
        assert_false(r.p[2].has_filename);
        assert_false(r.p[2].has_ctype);
        assert_int_equal(r.p[2].len, 5);
        assert_memory_equal(r.p[2].body, "tiled", 5);
        for (int i = 0; i < 3; i++) assert_true(r.p[i].ended);
        rec_free(&r);
    }
    free(body);
}

static void test_boundary_from_content_type(void **state)
{
    (void)state;
    const struct {
        const char *ct, *boundary;
    } ok[] = {
        {"multipart/form-data; boundary=abc", "abc"},
        {"multipart/form-data;boundary=abc", "abc"},
        {"Multipart/Form-Data; BOUNDARY=abc", "abc"},
        {"multipart/form-data; boundary=\"a b:c=d?\"", "a b:c=d?"},
        {"multipart/form-data; charset=utf-8; boundary=\"abc\"; x=y", "abc"},
        {"multipart/form-data; boundary = abc ", "abc"},
        {"multipart/form-data; boundary=0123456789012345678901234567890123456789012345678901234567890123456789",
         "0123456789012345678901234567890123456789012345678901234567890123456789"},
        {"multipart/mixed; boundary='()+_,-./:=?", "'()+_,-./:=?"},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        part_spec part = {"Content-Disposition: form-data; name=\"x\"\r\n", "v", 1};
        size_t len;
        unsigned char *body = build(ok[i].boundary, NULL, &part, 1, NULL, &len);
        recorder r;
        gemm_err err;
        rec_init(&r);
        int rc = parse(ok[i].ct, body, len, 0, &r, &err);
        if (rc) fprintf(stderr, "%s: %s\n", ok[i].ct, err.message);
        assert_int_equal(rc, 0);
        assert_int_equal(r.n, 1);
        assert_memory_equal(r.p[0].body, "v", 1);
        rec_free(&r);
        free(body);
    }
    const char *bad[] = {
        NULL,
        "",
        "application/json",
        "multipart/form-data",
        "multipart/form-data; boundary=",
        "multipart/form-data; boundary=\"\"",
        "multipart/form-data; boundary=\"abc",
        "multipart/form-data; boundary=01234567890123456789012345678901234567890123456789012345678901234567890",
        "multipart/form-data; boundary=ab\x01",
        "multipart/form-data; boundary=\"ab\r\n\"",
        "multipart/form-data; boundary=\"abc \"",
        "multipart/form-data; boundary=ab;c",
        "multipart/form-data; boundary=a[b]",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gemm_err err;
        gemm_err_clear(&err);
        gemm_multipart *mp = gemm_multipart_new(bad[i], &callbacks, NULL, &err);
        if (i == 11) { /* "ab;c": the boundary is "ab", valid */
            assert_non_null(mp);
            gemm_multipart_free(mp);
            continue;
        }
        if (mp) fprintf(stderr, "accepted: %s\n", bad[i]);
        assert_null(mp);
        assert_int_equal(err.status, 400);
        assert_string_equal(err.code, "bad_multipart");
    }
}

static void test_preamble_epilogue_padding(void **state)
{
    (void)state;
    const char *ct = "multipart/form-data; boundary=XyZ";
    const char *bodies[] = {
        /* preamble with near-boundaries, transport padding after a boundary, epilogue with a boundary */
        "This is a preamble.\r\n--XyZ is not it\r\n-XyZ\r\n--XyZ  \t\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n"
        "hello\r\n--XyZ--\r\nepilogue\r\n--XyZ\r\nContent-Disposition: form-data; name=\"zz\"\r\n\r\nignored",
        /* the body starts with the boundary (no CRLF before it) */
        "--XyZ\r\nContent-Disposition: form-data; name=a\r\n\r\nhello\r\n--XyZ--",
        /* preamble that is just a CRLF */
        "\r\n--XyZ\r\ncontent-disposition: FORM-DATA; NAME=\"a\"\r\nX-Other: 1\r\n\r\nhello\r\n--XyZ--\r\n",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        for (size_t c = 0; c < sizeof chunk_sizes / sizeof chunk_sizes[0]; c++) {
            recorder r;
            gemm_err err;
            rec_init(&r);
            int rc = parse(ct, bodies[i], strlen(bodies[i]), chunk_sizes[c], &r, &err);
            if (rc) fprintf(stderr, "body %zu: %s\n", i, err.message);
            assert_int_equal(rc, 0);
            assert_int_equal(r.n, 1);
            assert_string_equal(r.p[0].name, "a");
            assert_int_equal(r.p[0].len, 5);
            assert_memory_equal(r.p[0].body, "hello", 5);
            assert_true(r.p[0].ended);
            rec_free(&r);
        }
    }
}

static void test_empty_and_tricky_bodies(void **state)
{
    (void)state;
    const char *ct = "multipart/form-data; boundary=bb";
    const struct {
        const char *body;
        size_t len;
    } want[] = {
        {"", 0},
        {"\r\n", 2},
        {"\r\n--b", 5},
        {"\r\n--bX", 6},
        {"--bb", 4},
        {"x\r\n-bb\r\n--\r\n--b\r", 17},
        {"\r\r\r\n\n\n", 6},
        {"\r\n--b\r\n--b\r\n--", 14},
        {"\0\0\r\0\n", 5},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        part_spec parts[2] = {{"Content-Disposition: form-data; name=\"p\"\r\n", want[i].body, want[i].len},
                              {"Content-Disposition: form-data; name=\"q\"\r\n", want[i].body, want[i].len}};
        size_t len;
        unsigned char *body = build("bb", NULL, parts, 2, NULL, &len);
        for (size_t c = 0; c < sizeof chunk_sizes / sizeof chunk_sizes[0]; c++) {
            recorder r;
            gemm_err err;
            rec_init(&r);
            int rc = parse(ct, body, len, chunk_sizes[c], &r, &err);
            if (rc) fprintf(stderr, "case %zu: %s\n", i, err.message);
            assert_int_equal(rc, 0);
            assert_int_equal(r.n, 2);
            for (int k = 0; k < 2; k++) {
                assert_int_equal(r.p[k].len, want[i].len);
                if (want[i].len) assert_memory_equal(r.p[k].body, want[i].body, want[i].len);
                assert_true(r.p[k].ended);
            }
            rec_free(&r);
        }
        free(body);
    }
}

/* Random binary bodies, salted with every proper prefix of the delimiter followed by a
 * byte that breaks it, parsed with random chunk sizes: the bytes come back exactly. */
static void test_random_binary_bodies(void **state)
{
    (void)state;
    for (int iter = 0; iter < 300; iter++) {
        char boundary[71];
        size_t blen = 1 + rnd() % 70;
        static const char bch[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ'()+_,-./:=?";
        for (size_t i = 0; i < blen; i++) boundary[i] = bch[rnd() % (sizeof bch - 1)];
        boundary[blen] = '\0';
        char delim[80];
        size_t dlen = (size_t)snprintf(delim, sizeof delim, "\r\n--%s", boundary);
        int nparts = 1 + (int)(rnd() % 4);
        part_spec parts[4];
        unsigned char *bodies[4];
        char names[4][16];
        char headers[4][128];
        for (int p = 0; p < nparts; p++) {
            size_t len = rnd() % 3000;
            unsigned char *b = malloc(len + 1);
            size_t o = 0;
            while (o < len) {
                uint64_t r = rnd();
                if (r % 5 == 0 && len - o > dlen) {
                    size_t m = 1 + rnd() % (dlen - 1); /* a proper prefix ... */
                    memcpy(b + o, delim, m);
                    o += m;
                    unsigned char breaker; /* ... then anything but the next delimiter byte */
                    do breaker = (unsigned char)rnd();
                    while (breaker == (unsigned char)delim[m]);
                    b[o++] = breaker;
                } else if (r % 5 == 1) {
                    b[o++] = (r >> 8) % 2 ? '\r' : '\n';
                } else {
                    b[o++] = (unsigned char)(r >> 16);
                }
            }
            /* the salt may still have formed a whole delimiter by chance: cut it */
            for (size_t i = 0; i + dlen <= len; i++)
                if (memcmp(b + i, delim, dlen) == 0) b[i] = 'X';
            /* a body that ends in a delimiter prefix matters too: keep len as is */
            bodies[p] = b;
            snprintf(names[p], sizeof names[p], "p%d", p);
            snprintf(headers[p], sizeof headers[p],
                     "Content-Disposition: form-data; name=\"%s\"; filename=\"f%d.bin\"\r\n", names[p], p);
            parts[p].headers = headers[p];
            parts[p].body = b;
            parts[p].len = len;
        }
        size_t len;
        unsigned char *body = build(boundary, iter % 3 ? NULL : "preamble", parts, nparts, iter % 2 ? "\r\n" : NULL, &len);
        char ct[128];
        snprintf(ct, sizeof ct, "multipart/form-data; boundary=\"%s\"", boundary);
        recorder r;
        gemm_err err;
        rec_init(&r);
        int rc = parse(ct, body, len, iter % 7 == 0 ? 1 : 0, &r, &err);
        if (rc) fprintf(stderr, "iter %d: %s\n", iter, err.message);
        assert_int_equal(rc, 0);
        assert_int_equal(r.n, nparts);
        for (int p = 0; p < nparts; p++) {
            assert_string_equal(r.p[p].name, names[p]);
            assert_int_equal(r.p[p].len, parts[p].len);
            if (parts[p].len) assert_memory_equal(r.p[p].body, parts[p].body, parts[p].len);
            assert_true(r.p[p].ended);
            free(bodies[p]);
        }
        rec_free(&r);
        free(body);
    }
}

static void expect_error(const char *body, size_t len, int status, const char *code, const char *needle)
{
    for (size_t c = 0; c < sizeof chunk_sizes / sizeof chunk_sizes[0]; c++) {
        recorder r;
        gemm_err err;
        rec_init(&r);
        int rc = parse("multipart/form-data; boundary=B", body, len, chunk_sizes[c], &r, &err);
        rec_free(&r);
        if (rc != -1 || err.status != status || strcmp(err.code, code) != 0 || (needle && !strstr(err.message, needle))) {
            fprintf(stderr, "body \"%.*s\": got %d %d %s: %s; want %d %s \"%s\"\n", (int)len, body, rc, err.status,
                    err.code, err.message, status, code, needle ? needle : "");
            fail();
        }
    }
}
#define EXPECT(lit, status, code, needle) expect_error(lit, sizeof(lit) - 1, status, code, needle)

static void test_malformed(void **state)
{
    (void)state;
    /* framing */
    EXPECT("--B\r\nContent-Disposition: form-data; name=a\r\n\r\nx\r\n--Bx\r\n", 400, "bad_multipart", "unexpected");
    EXPECT("--B\r\nContent-Disposition: form-data; name=a\r\n\r\nx\r\n--B-x", 400, "bad_multipart", NULL);
    EXPECT("--B\r\nContent-Disposition: form-data; name=a\r\n\r\nx\r\n--B \tx", 400, "bad_multipart", NULL);
    EXPECT("--B\r\nContent-Disposition: form-data; name=a\r\n\r\nx\r\n--B\rx", 400, "bad_multipart", "CRLF");
    EXPECT("--B\r\nContent-Disposition: form-data; name=a\r\n\r\nx\r\n--B\nx", 400, "bad_multipart", NULL);
    /* before the first part, a line that only looks like a delimiter is preamble text */
    EXPECT("--B\rContent-Disposition: form-data; name=a\r\n\r\nx\r\n--B--", 400, "bad_multipart", "no parts");
    EXPECT("--B\nContent-Disposition: form-data; name=a\r\n\r\nx\r\n--B--", 400, "bad_multipart", "no parts");
    EXPECT("--Bx\r\n--B-\r\n--B \tz\r\n--B\r\r\n", 400, "truncated", "first boundary");
    EXPECT("--B--", 400, "bad_multipart", "no parts");
    /* part headers */
    EXPECT("--B\r\nContent-Disposition: form-data; name=a\n\nx\r\n--B--", 400, "bad_multipart", "CRLF");
    EXPECT("--B\r\nContent-Disposition form-data\r\n\r\nx\r\n--B--", 400, "bad_multipart", "no name");
    EXPECT("--B\r\n: x\r\n\r\nx\r\n--B--", 400, "bad_multipart", NULL);
    EXPECT("--B\r\nContent-Type: text/plain\r\n\r\nx\r\n--B--", 400, "bad_multipart", "name=");
    EXPECT("--B\r\n\r\nx\r\n--B--", 400, "bad_multipart", "name=");
    EXPECT("--B\r\nContent-Disposition: attachment; name=a\r\n\r\nx\r\n--B--", 400, "bad_multipart", "form-data");
    EXPECT("--B\r\nContent-Disposition: form-data\r\n\r\nx\r\n--B--", 400, "bad_multipart", "name=");
    EXPECT("--B\r\nContent-Disposition: form-data; name=\"a\r\n\r\nx\r\n--B--", 400, "bad_multipart", NULL);
    EXPECT("--B\r\nContent-Disposition: form-data; name=a\r\nContent-Disposition: form-data; name=b\r\n\r\nx\r\n--B--",
           400, "bad_multipart", "two");
    EXPECT("--B\r\nContent-Disposition: form-data;\r\n name=a\r\n\r\nx\r\n--B--", 400, "bad_multipart", "folded");
    EXPECT("--B\r\nContent-Disposition: form-data; name=a\0\r\n\r\nx\r\n--B--", 400, "bad_multipart", "NUL");
    /* headers over 8 KiB */
    size_t big = 9000;
    char *b = malloc(big + 64);
    int o = snprintf(b, 64, "--B\r\nX-Long: ");
    memset(b + o, 'h', big);
    memcpy(b + o + big, "\r\n\r\n", 4);
    expect_error(b, (size_t)o + big + 4, 400, "bad_multipart", "8 KiB");
    /* just under: fine */
    int o2 = snprintf(b, 64, "--B\r\nContent-Disposition: form-data; name=a\r\nX: ");
    size_t fill = 8192 - (size_t)o2 + 5 - 4 - 2;
    memset(b + o2, 'h', fill);
    memcpy(b + o2 + fill, "\r\n\r\nv\r\n--B--", 13);
    recorder r;
    gemm_err err;
    rec_init(&r);
    assert_int_equal(parse("multipart/form-data; boundary=B", b, (size_t)o2 + fill + 13, 0, &r, &err), 0);
    assert_int_equal(r.n, 1);
    rec_free(&r);
    free(b);
}

static void test_truncated(void **state)
{
    (void)state;
    const char full[] = "pre\r\n--B\r\nContent-Disposition: form-data; name=a\r\n\r\nxyz\r\n--B--\r\n";
    /* every strict prefix that stops before the closing "--" is truncated */
    size_t close_at = strstr(full, "--B--") - full + 5;
    for (size_t n = 0; n < close_at; n++) expect_error(full, n, 400, "truncated", "ended before");
    for (size_t n = close_at; n <= sizeof full - 1; n++) {
        recorder r;
        gemm_err err;
        rec_init(&r);
        assert_int_equal(parse("multipart/form-data; boundary=B", full, n, 0, &r, &err), 0);
        assert_int_equal(r.n, 1);
        assert_memory_equal(r.p[0].body, "xyz", 3);
        rec_free(&r);
    }
    /* the message says whether any boundary was seen */
    expect_error("just text", 9, 400, "truncated", "first boundary");
    expect_error("--B\r\nContent-Disposition: form-data; name=a\r\n\r\nxy", 49, 400, "truncated", "closing boundary");
}

static void test_callback_errors(void **state)
{
    (void)state;
    const char body[] = "--B\r\nContent-Disposition: form-data; name=a\r\n\r\n0123456789\r\n--B\r\n"
                        "Content-Disposition: form-data; name=c\r\n\r\nxyz\r\n--B--";
    for (int set_err = 0; set_err <= 1; set_err++) {
        recorder r;
        gemm_err err;
        rec_init(&r);
        r.fail_begin_at = 1;
        r.set_err = set_err;
        gemm_err_clear(&err);
        gemm_multipart *mp = gemm_multipart_new("multipart/form-data; boundary=B", &callbacks, &r, &err);
        assert_int_equal(gemm_multipart_feed(mp, body, sizeof body - 1, &err), -1);
        assert_int_equal(err.status, set_err ? 422 : 400);
        assert_string_equal(err.code, set_err ? "unknown_part" : "bad_multipart");
        /* failed for good: no more callbacks, feed and finish refuse */
        assert_int_equal(gemm_multipart_feed(mp, "x", 1, &err), -1);
        assert_int_equal(gemm_multipart_finish(mp, &err), -1);
        gemm_multipart_free(mp);
        assert_int_equal(r.n, 1);
        assert_true(r.p[0].ended);
        rec_free(&r);

        rec_init(&r);
        r.fail_data_after = 5;
        r.set_err = set_err;
        assert_int_equal(parse("multipart/form-data; boundary=B", body, sizeof body - 1, 3, &r, &err), -1);
        assert_int_equal(err.status, set_err ? 413 : 400);
        assert_int_equal(r.n, 1);
        assert_false(r.p[0].ended);
        rec_free(&r);
    }
    /* callbacks may be left out */
    gemm_multipart_callbacks none = {NULL, NULL, NULL};
    gemm_err err;
    gemm_multipart *mp = gemm_multipart_new("multipart/form-data; boundary=B", &none, NULL, &err);
    assert_int_equal(gemm_multipart_feed(mp, body, sizeof body - 1, &err), 0);
    assert_int_equal(gemm_multipart_finish(mp, &err), 0);
    gemm_multipart_free(mp);
    gemm_multipart_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_curl_like_body_any_chunking),
        cmocka_unit_test(test_boundary_from_content_type),
        cmocka_unit_test(test_preamble_epilogue_padding),
        cmocka_unit_test(test_empty_and_tricky_bodies),
        cmocka_unit_test(test_random_binary_bodies),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_callback_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
