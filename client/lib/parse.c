/*
 * parse.c - small parsers of libgemm: shapes given by people ("512x256"), the
 * X-Gemm-Shape, Server-Timing and Retry-After headers.
 */
#define _GNU_SOURCE /* timegm */
#include "client_internal.h"
#include "gemm_util.h"

#include <ctype.h>
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* Reads a decimal integer at *p, advancing *p: 0, or -1 when there is none or it overflows. */
static int read_u64(const char **p, uint64_t *out)
{
    const char *s = *p;
    uint64_t v = 0;
    if (!isdigit((unsigned char)*s)) return -1;
    for (; isdigit((unsigned char)*s); s++) {
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10) return -1;
        v = v * 10 + d;
    }
    *out = v;
    *p = s;
    return 0;
}

int gemm_client_parse_shape(const char *s, uint64_t dims[3])
{
    int n = 0;
    for (const char *p = s; p;) {
        if (n == 3 || read_u64(&p, &dims[n]) != 0 || dims[n++] == 0) return -1;
        if (*p == '\0') return n >= 2 ? n : -1;
        if (!strchr("xX,*", *p++)) return -1;
    }
    return -1;
}

int gemm_client_parse_shape_header(const char *s, uint64_t *rows, uint64_t *cols)
{
    uint64_t v[2];
    int n = 0;
    for (const char *p = s; *p;) {
        if (isdigit((unsigned char)*p)) {
            if (n == 2 || read_u64(&p, &v[n++]) != 0) return -1; /* a third number, or too large */
        } else if (*p++ == '-' && n < 2) {
            return -1;
        }
    }
    if (n != 2) return -1;
    *rows = v[0];
    *cols = v[1];
    return 0;
}

const char *const gemm_stage_names[GEMM_STAGES] = {"recv", "decode", "queue", "h2d", "kernel", "d2h", "encode", "total"};
static const size_t stage_offsets[GEMM_STAGES] = {
    offsetof(gemm_timing, recv_ms), offsetof(gemm_timing, decode_ms), offsetof(gemm_timing, queue_ms),
    offsetof(gemm_timing, h2d_ms),  offsetof(gemm_timing, kernel_ms), offsetof(gemm_timing, d2h_ms),
    offsetof(gemm_timing, encode_ms), offsetof(gemm_timing, total_ms)};

double *gemm_timing_stage(gemm_timing *t, int i) { return (double *)((char *)t + stage_offsets[i]); }

void gemm_timing_unset(gemm_timing *t)
{
    memset(t, 0, sizeof *t);
    for (int i = 0; i < GEMM_STAGES; i++) *gemm_timing_stage(t, i) = -1;
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
        /* parameters up to the next ',' */
        while (*p && *p != ',') {
            if (*p == ';') {
                p++;
                while (*p == ' ') p++;
                if (strncasecmp(p, "dur=", 4) == 0) {
                    char *end;
                    errno = 0;
                    double v = strtod(p + 4, &end);
                    if (end != p + 4 && errno == 0 && v >= 0) dur = v;
                    p = end > p + 4 ? end : p + 4;
                }
                continue; /* p is at the next character to look at (maybe the NUL) */
            }
            p++;
        }
        for (int i = 0; dur >= 0 && i < GEMM_STAGES; i++)
            if (nlen == strlen(gemm_stage_names[i]) && strncasecmp(name, gemm_stage_names[i], nlen) == 0) {
                *gemm_timing_stage(t, i) = dur;
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
