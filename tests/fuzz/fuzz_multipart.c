/* fuzz_multipart.c - libFuzzer target for the streaming multipart parser.
 *
 * The input is "<Content-Type>\n<body>". The body is parsed twice, whole and in chunks
 * whose sizes come from the input; the callbacks record every event (part begins with
 * their names, data bytes, ends) into a digest, and both parses must produce the same
 * events and the same result. The callbacks also check their own order. Built and run
 * by `make fuzz`. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "multipart.h"

typedef struct {
    uint64_t digest;
    size_t bytes;
    int in_part, parts;
} trace;

static void mix(trace *t, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) t->digest = (t->digest ^ b[i]) * 0x100000001b3ull;
}

static int on_begin(void *u, const char *name, const char *filename, const char *ctype, gemm_err *err)
{
    (void)err;
    trace *t = u;
    if (t->in_part || !name) abort();
    t->in_part = 1;
    t->parts++;
    mix(t, "B", 1);
    mix(t, name, strlen(name) + 1);
    if (filename) mix(t, filename, strlen(filename) + 1);
    if (ctype) mix(t, ctype, strlen(ctype) + 1);
    return 0;
}

static int on_data(void *u, const void *d, size_t n, gemm_err *err)
{
    (void)err;
    trace *t = u;
    if (!t->in_part || n == 0) abort();
    mix(t, d, n);
    t->bytes += n;
    return 0;
}

static int on_end(void *u, gemm_err *err)
{
    (void)err;
    trace *t = u;
    if (!t->in_part) abort();
    t->in_part = 0;
    mix(t, "E", 1);
    return 0;
}

static const gemm_multipart_callbacks cb = {on_begin, on_data, on_end};

static int run(const char *ct, const uint8_t *d, size_t n, int chunked, trace *t, gemm_err *err)
{
    memset(t, 0, sizeof *t);
    t->digest = 0xcbf29ce484222325ull;
    gemm_multipart *mp = gemm_multipart_new(ct, &cb, t, err);
    if (!mp) return -2;
    unsigned seed = (unsigned)n;
    size_t off = 0;
    int rc = 0;
    while (off < n) {
        size_t c = n - off;
        if (chunked) {
            seed = seed * 1103515245u + 12345u;
            c = 1 + (seed >> 16) % 23;
            if (c > n - off) c = n - off;
        }
        rc = gemm_multipart_feed(mp, d + off, c, err);
        if (rc) break;
        off += c;
    }
    if (rc == 0) rc = gemm_multipart_finish(mp, err);
    gemm_multipart_free(mp);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nl = memchr(data, '\n', size < 256 ? size : 256);
    if (!nl) return 0;
    char ct[257];
    size_t cl = (size_t)(nl - data);
    memcpy(ct, data, cl);
    ct[cl] = '\0';
    const uint8_t *body = nl + 1;
    size_t blen = size - cl - 1;

    trace t1, t2;
    gemm_err e1, e2;
    gemm_err_clear(&e1);
    gemm_err_clear(&e2);
    int r1 = run(ct, body, blen, 0, &t1, &e1);
    int r2 = run(ct, body, blen, 1, &t2, &e2);
    if (r1 != r2 || t1.parts != t2.parts) abort();
    if (r1 != -2 && (e1.status != e2.status || strcmp(e1.code, e2.code) != 0)) abort();
    if (r1 == -1 && e1.status == 0) abort();
    if (r1 == 0 && (t1.in_part || t1.parts == 0)) abort();
    /* A failed parse may stop at different points; a complete one must agree exactly. */
    if (r1 == 0 && (t1.digest != t2.digest || t1.bytes != t2.bytes)) abort();
    return 0;
}
