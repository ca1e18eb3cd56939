/* test_framing.c - the request head's checks (server/framing.h): request targets (whitespace,
 * control characters, length, query parameters), header fields (a name is a token, a value
 * holds no control character but HTAB), and the walk over a head as libmicrohttpd 0.9 leaves
 * it in its read buffer, which finds a NUL inside a value and a folded line. The heads here
 * are laid out as 0.9 lays them out (mhd_like); tests/e2e/test_strict.py sends the same
 * defects to the real library. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "framing.h"

static void test_targets(void **st)
{
    (void)st;
    assert_int_equal(gemmd_framing_target("/v1/matmul?m=2&k=3&n=4&dtype=float32"), GEMMD_TARGET_OK);
    assert_int_equal(gemmd_framing_target("/healthz x"), GEMMD_TARGET_BAD);
    assert_int_equal(gemmd_framing_target("/healthz\t"), GEMMD_TARGET_BAD);
    assert_int_equal(gemmd_framing_target("/a\x7f"), GEMMD_TARGET_BAD);
    char q[GEMMD_TARGET_MAX + 64];
    int n = snprintf(q, sizeof q, "/healthz?p0=1");
    for (int i = 1; i < GEMMD_QUERY_MAX; i++) n += snprintf(q + n, sizeof q - (size_t)n, "&p%d=1", i);
    assert_int_equal(gemmd_framing_target(q), GEMMD_TARGET_OK); /* exactly GEMMD_QUERY_MAX */
    snprintf(q + n, sizeof q - (size_t)n, "&x");
    assert_int_equal(gemmd_framing_target(q), GEMMD_TARGET_PARAMS);
    assert_int_equal(gemmd_framing_target("/a&b&c&d"), GEMMD_TARGET_OK); /* '&' before '?' is path */
    memset(q, 'a', GEMMD_TARGET_MAX);
    q[0] = '/';
    q[GEMMD_TARGET_MAX] = '\0';
    assert_int_equal(gemmd_framing_target(q), GEMMD_TARGET_OK);
    q[GEMMD_TARGET_MAX] = 'a';
    q[GEMMD_TARGET_MAX + 1] = '\0';
    assert_int_equal(gemmd_framing_target(q), GEMMD_TARGET_LONG);
}

static void test_fields(void **st)
{
    (void)st;
    assert_true(gemmd_field_ok("Content-Length", 14, "12", 2));
    assert_true(gemmd_field_ok("X-Odd!#$%&'*+.^_`|~9", 20, "a\tb \x80\xff", 6)); /* HTAB and obs-text */
    assert_true(gemmd_field_ok("X", 1, "", 0));
    assert_false(gemmd_field_ok("Content-Length ", 15, "12", 2)); /* whitespace before the colon */
    assert_false(gemmd_field_ok("Content-Length\t", 15, "12", 2));
    assert_false(gemmd_field_ok("", 0, "x", 1));
    assert_false(gemmd_field_ok("X(a)", 4, "x", 1));
    assert_false(gemmd_field_ok("X", 1, "a\rb", 3));
    assert_false(gemmd_field_ok("X", 1, "a\nb", 3));
    assert_false(gemmd_field_ok("X", 1, "a\x01", 2));
    assert_false(gemmd_field_ok("X", 1, "a\x7f", 2));
    assert_false(gemmd_field_ok("X", 1, "a\0b", 3));
}

/* ---- heads as libmicrohttpd 0.9 leaves them ------------------------------------------- */

typedef struct {
    char buf[512];
    size_t size;
    const char *version;
    int n;
    const char *key[8], *val[8];
} head;

/* Lays raw out as 0.9 does: every line end (CR LF or LF) becomes NUL, the space before the
 * version too, and on a header line the colon; a value starts after the whitespace that
 * follows the colon and, being a C string, ends at the first NUL. A line that begins with a
 * space or a tab (obs-fold) is joined onto the previous field elsewhere in memory by 0.9,
 * so it is listed as no field here. */
static void mhd_like(head *h, const char *raw, size_t len)
{
    memset(h, 0, sizeof *h);
    memcpy(h->buf, raw, len);
    h->size = len;
    char *p = h->buf, *end = h->buf + len;
    for (int line = 0; p < end; line++) {
        char *e = memchr(p, '\n', (size_t)(end - p));
        assert_non_null(e);
        char *text_end = (e > p && e[-1] == '\r') ? e - 1 : e;
        memset(text_end, 0, (size_t)(e - text_end) + 1);
        if (line == 0) {
            char *sp = text_end;
            while (sp > p && *sp != ' ') sp--;
            *sp = '\0';
            h->version = sp + 1;
        } else if (p < text_end && *p != ' ' && *p != '\t') {
            char *colon = memchr(p, ':', (size_t)(text_end - p));
            assert_non_null(colon);
            *colon = '\0';
            char *v = colon + 1;
            while (*v == ' ' || *v == '\t') v++;
            h->key[h->n] = p;
            h->val[h->n++] = v;
        }
        p = e + 1;
    }
}

static int walk(const char *raw, size_t len)
{
    head h;
    mhd_like(&h, raw, len);
    gemmd_head_walk w;
    gemmd_head_begin(&w, h.buf, h.size, h.version);
    for (int i = 0; i < h.n; i++) gemmd_head_field(&w, h.key[i], strlen(h.key[i]), h.val[i], strlen(h.val[i]));
    return gemmd_head_end(&w);
}

#define WALK(lit) walk(lit, sizeof lit - 1)

static void test_walk_well_formed(void **st)
{
    (void)st;
    assert_int_equal(WALK("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"), 0);
    assert_int_equal(WALK("GET / HTTP/1.0\r\n\r\n"), 0); /* no field at all */
    assert_int_equal(WALK("GET / HTTP/1.1\nHost: x\nAccept: */*\n\n"), 0); /* bare LF */
    assert_int_equal(WALK("GET / HTTP/1.1\r\nHost: x\nX-Empty:\r\nX-Pad: a  \t\r\n\n"), 0);
    assert_int_equal(WALK("POST /v1/matmul?m=1 HTTP/1.1\r\nHost:x\r\nContent-Length:   12\r\n\r\n"), 0);
}

static void test_walk_defects(void **st)
{
    (void)st;
    /* a NUL inside a value: the value ends there, the rest of the line lies unseen */
    assert_int_equal(WALK("GET / HTTP/1.1\r\nHost: x\r\nX-Note: a\0b\r\n\r\n"), -1);
    assert_int_equal(WALK("GET / HTTP/1.1\r\nContent-Length: 0\0 34\r\nHost: x\r\n\r\n"), -1);
    assert_int_equal(WALK("GET / HTTP/1.1\r\nHost: x\0\r\n\r\n"), -1); /* before CR LF: 3 NUL */
    /* obs-fold: the continuation line is bytes between two fields, or after the last */
    assert_int_equal(WALK("GET / HTTP/1.1\r\nX-Note: a\r\n b\r\nHost: x\r\n\r\n"), -1);
    assert_int_equal(WALK("GET / HTTP/1.1\r\nHost: x\r\nX-Note: a\r\n\tb\r\n\r\n"), -1);
    /* a name that moved (0.9 joins a folded line onto the name, in other memory) */
    head h;
    static const char raw[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    mhd_like(&h, raw, sizeof raw - 1);
    static const char moved[] = "Host";
    gemmd_head_walk w;
    gemmd_head_begin(&w, h.buf, h.size, h.version);
    gemmd_head_field(&w, moved, 4, h.val[0], strlen(h.val[0]));
    assert_int_equal(gemmd_head_end(&w), -1);
    /* a version outside the head, a head cut short */
    gemmd_head_begin(&w, h.buf, h.size, moved);
    assert_int_equal(gemmd_head_end(&w), -1);
    gemmd_head_begin(&w, h.buf, h.size - 3, h.version);
    gemmd_head_field(&w, h.key[0], 4, h.val[0], strlen(h.val[0]));
    assert_int_equal(gemmd_head_end(&w), -1);
    /* a NUL right before a bare LF looks like CR LF and is let through: nothing lies unseen */
    assert_int_equal(WALK("GET / HTTP/1.1\r\nHost: x\0\n\r\n"), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_targets),
        cmocka_unit_test(test_fields),
        cmocka_unit_test(test_walk_well_formed),
        cmocka_unit_test(test_walk_defects),
    };
    return cmocka_run_group_tests_name("framing", tests, NULL, NULL);
}
