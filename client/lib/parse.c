/*
 * parse.c - small parsers of libgemm: shapes given by people ("512x256"), the
 * X-Gemm-Shape, Server-Timing and Retry-After headers.
 */
#define _GNU_SOURCE /* timegm */
#include "gemm_util.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* Reads a decimal integer >= 1 at *p; advances *p. */
static int read_dim(const char **p, uint64_t *out)
{
    const char *s = *p;
    if (!isdigit((unsigned char)*s)) return -1;
    uint64_t v = 0;
    while (isdigit((unsigned char)*s)) {
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10) return -1;
        v = v * 10 + d;
        s++;
    }
    if (v == 0) return -1;
    *out = v;
    *p = s;
    return 0;
}

int gemm_client_parse_shape(const char *s, uint64_t dims[3])
{
    if (!s) return -1;
    int n = 0;
    const char *p = s;
    for (;;) {
        if (n == 3 || read_dim(&p, &dims[n]) != 0) return -1;
        n++;
        if (*p == '\0') break;
        if (*p != 'x' && *p != 'X' && *p != ',' && *p != '*') return -1;
        p++;
    }
    return n >= 2 ? n : -1;
}

int gemm_client_parse_shape_header(const char *s, uint64_t *rows, uint64_t *cols)
{
    uint64_t v[2];
    int n = 0;
    const char *p = s;
    while (*p && n < 2) {
        if (isdigit((unsigned char)*p)) {
            uint64_t x = 0;
            while (isdigit((unsigned char)*p)) {
                unsigned d = (unsigned)(*p - '0');
                if (x > (UINT64_MAX - d) / 10) return -1;
                x = x * 10 + d;
                p++;
            }
            v[n++] = x;
        } else if (*p == '-') {
            return -1;
        } else {
            p++;
        }
    }
    while (*p) {
        if (isdigit((unsigned char)*p)) return -1; /* a third number */
        p++;
    }
    if (n != 2) return -1;
    *rows = v[0];
    *cols = v[1];
    return 0;
}

int gemm_client_parse_server_timing(const char *s, gemm_timing *t)
{
    int found = 0;
    if (!s) return 0;
    const char *p = s;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',') p++;
        if (!*p) break;
        const char *name = p;
        while (*p && *p != ';' && *p != ',' && *p != ' ') p++;
        size_t nlen = (size_t)(p - name);
        double dur = -1;
        int have = 0;
        /* parameters up to the next ',' */
        while (*p && *p != ',') {
            if (*p == ';') {
                p++;
                while (*p == ' ') p++;
                if (strncasecmp(p, "dur=", 4) == 0) {
                    char *end;
                    errno = 0;
                    double v = strtod(p + 4, &end);
                    if (end != p + 4 && errno == 0 && v >= 0) {
                        dur = v;
                        have = 1;
                    }
                    p = end > p + 4 ? end : p + 4;
                }
                continue; /* p is at the next character to look at (maybe the NUL) */
            }
            p++;
        }
        if (!have) continue;
        double *slot = NULL;
#define NAME(n) (nlen == sizeof(n) - 1 && strncasecmp(name, n, nlen) == 0)
        if (NAME("recv")) slot = &t->recv_ms;
        else if (NAME("decode")) slot = &t->decode_ms;
        else if (NAME("encode")) slot = &t->encode_ms;
        else if (NAME("queue")) slot = &t->queue_ms;
        else if (NAME("h2d")) slot = &t->h2d_ms;
        else if (NAME("kernel")) slot = &t->kernel_ms;
        else if (NAME("d2h")) slot = &t->d2h_ms;
        else if (NAME("total")) slot = &t->total_ms;
#undef NAME
        if (slot) {
            *slot = dur;
            found++;
        }
    }
    return found;
}

long gemm_client_parse_retry_after(const char *s, double now_epoch_s)
{
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end != s && errno == 0) {
        while (*end == ' ') end++;
        if (*end == '\0') {
            if (v < 0) return -1;
            if (v > 86400) v = 86400;
            return (long)(v * 1000.0 + 0.5);
        }
    }
    /* HTTP-date: "Sun, 06 Nov 1994 08:49:37 GMT" */
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    const char *r = strptime(s, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    if (!r) return -1;
    double when = (double)timegm(&tm);
    double d = when - now_epoch_s;
    if (d < 0) d = 0;
    if (d > 86400) d = 86400;
    return (long)(d * 1000.0);
}
