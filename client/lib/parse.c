/*
 * parse.c - the helpers of gemm_util.h: parsers of shapes given by people ("512x256"), of
 * the X-Gemm-Shape, Server-Timing and Retry-After headers, and matrices as CSV / TSV text.
 */
#define _GNU_SOURCE /* timegm */
#include "client_internal.h"
#include "gemm_half.h"
#include "gemm_util.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
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

const char *const gemm_stage_names[GEMM_STAGES] = {"recv", "decode", "queue", "h2d",
                                                   "kernel", "d2h", "encode", "total"};
double *gemm_timing_stage(gemm_timing *t, int i)
{
    return (double *[GEMM_STAGES]){&t->recv_ms,   &t->decode_ms, &t->queue_ms,  &t->h2d_ms,
                                   &t->kernel_ms, &t->d2h_ms,    &t->encode_ms, &t->total_ms}[i];
}

void gemm_timing_unset(gemm_timing *t)
{
    memset(t, 0, sizeof *t);
    for (int i = 0; i < GEMM_STAGES; i++) *gemm_timing_stage(t, i) = -1;
    t->client_transfer_ms = -1;
}

int gemm_client_parse_server_timing(const char *s, gemm_timing *t)
{
    int found = 0;
    for (const char *p = s; p && *p; p += strcspn(p, ",")) {
        p += strspn(p, " \t,");
        size_t nlen = strcspn(p, ";, "), len = strcspn(p, ","); /* the name; the entry, up to its ',' */
        double dur = -1;
        for (const char *q = memchr(p, ';', len); q; q = memchr(q, ';', (size_t)(p + len - q))) {
            q += 1 + strspn(q + 1, " ");
            char *end = NULL;
            errno = 0;
            double v = strncasecmp(q, "dur=", 4) == 0 ? strtod(q + 4, &end) : -1;
            if (v >= 0 && end != q + 4 && errno == 0) dur = v;
        }
        for (int i = 0; dur >= 0 && i < GEMM_STAGES; i++)
            if (nlen == strlen(gemm_stage_names[i]) && strncasecmp(p, gemm_stage_names[i], nlen) == 0) {
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
    while (end != s && *end == ' ') end++;
    if (end == s || errno != 0 || *end) { /* not seconds: an HTTP-date, "Sun, 06 Nov 1994 08:49:37 GMT" */
        struct tm tm = {0};
        if (!strptime(s, "%a, %d %b %Y %H:%M:%S GMT", &tm)) return -1;
        v = fmax(0, (double)timegm(&tm) - now_epoch_s);
    } else if (v < 0) {
        return -1;
    }
    return (long)(fmin(v, 86400) * 1000.0 + 0.5);
}

/* ---------------------------------------------------------------- CSV / TSV text */

__attribute__((format(printf, 3, 4))) static int text_err(gemm_text_error *e, int line, const char *fmt, ...)
{
    if (e) {
        e->line = line;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->message, sizeof e->message, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static int blank_or_comment(const char *s, size_t len)
{
    size_t i = 0;
    while (i < len && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r')) i++;
    return i == len || s[i] == '#';
}

static char guess_delim(const char *s, size_t len)
{
    for (const char *d = "\t,;"; *d; d++) /* in this order */
        if (memchr(s, *d, len)) return *d;
    return ' ';
}

/* Parses one value from s (NUL-terminated field, spaces around allowed) into dst[idx]. */
static int parse_value(const char *s, gemm_dtype d, void *dst, size_t idx)
{
    char *end;
    errno = 0;
    if (d == GEMM_DTYPE_I32) {
        long long v = strtoll(s, &end, 10);
        if (end == s || errno) return -1;
        end += strspn(end, " \t");
        if (*end == '.') end += 1 + strspn(end + 1, "0"); /* "3.0": integers written by float formatters */
        if (end[strspn(end, " \t")]) return -1;
        if (v < INT32_MIN || v > INT32_MAX) return -1;
        ((int32_t *)dst)[idx] = (int32_t)v;
        return 0;
    }
    double v = strtod(s, &end);
    if (end == s) return -1;
    if (errno == ERANGE && fabs(v) > 1.0) return -1; /* overflow; underflow to 0 is fine */
    if (end[strspn(end, " \t")]) return -1;
    if (d == GEMM_DTYPE_F32) {
        float f = (float)v;
        if (isfinite(v) && isinf(f)) return -1; /* rounds beyond FLT_MAX */
        ((float *)dst)[idx] = f;
    } else if (gemm_dtype_is_half(d)) {
        uint16_t h = gemm_f64_to_half(d, v); /* one rounding from the float64 strtod read */
        if (isfinite(v) && !isfinite(gemm_half_to_f32(d, h))) return -1; /* beyond the dtype's range */
        ((uint16_t *)dst)[idx] = h;
    } else {
        ((double *)dst)[idx] = v;
    }
    return 0;
}

int gemm_client_text_parse(const char *text, size_t len, char delim, gemm_dtype dtype,
                           uint64_t *rows, uint64_t *cols, void **data, gemm_text_error *e)
{
    if (e) *e = (gemm_text_error){0};
    size_t es = gemm_dtype_size(dtype);
    if (es == 0) return text_err(e, 0, "unknown dtype");
    *data = NULL;
    uint64_t nrows = 0, ncols = 0;
    size_t count = 0, pos = 0;
    gemm_buf vals = {0}, line_buf = {0}; /* the values; the line being read, NUL-terminated */
    int lineno = 0;
    while (pos < len) {
        const char *start = text + pos;
        const char *nl = memchr(start, '\n', len - pos);
        size_t llen = nl ? (size_t)(nl - start) : len - pos;
        pos += llen + (nl ? 1 : 0);
        lineno++;
        if (blank_or_comment(start, llen)) continue;
        if (memchr(start, '\0', llen)) {
            text_err(e, lineno, "a NUL byte: this is not a text file");
            goto fail;
        }
        if (delim == 0) delim = guess_delim(start, llen);
        line_buf.len = 0;
        gemm_buf_append(&line_buf, start, llen);
        if (line_buf.failed) goto nomem;
        char *line = line_buf.data;
        for (size_t i = 0; i < llen; i++)
            if (line[i] == '\r') line[i] = ' ';
        uint64_t ncol = 0;
        char *p = line;
        for (;;) {
            char *field = delim == ' ' ? p + strspn(p, " \t") : p;
            if (delim == ' ' && !*field) break;
            char *sep = field + strcspn(field, delim == ' ' ? " \t" : (const char[]){delim, '\0'});
            int last = *sep == '\0';
            *sep = '\0';
            gemm_buf_append(&vals, "\0\0\0\0\0\0\0", es); /* room for the value */
            if (vals.failed) goto nomem;
            if (parse_value(field, dtype, vals.data, count) != 0) {
                text_err(e, lineno, "value %llu (\"%.40s\") is not a valid %s",
                         (unsigned long long)ncol + 1, field + strspn(field, " \t"), gemm_dtype_name(dtype));
                goto fail;
            }
            count++;
            ncol++;
            if (last) break;
            p = sep + 1;
        }
        if (ncol == 0) continue;
        if (nrows == 0) ncols = ncol;
        else if (ncol != ncols) {
            text_err(e, lineno, "row %llu has %llu values, the rows before have %llu",
                     (unsigned long long)nrows + 1, (unsigned long long)ncol, (unsigned long long)ncols);
            goto fail;
        }
        nrows++;
    }
    gemm_buf_free(&line_buf);
    if (nrows == 0) {
        gemm_buf_free(&vals);
        return text_err(e, 0, "no values (empty matrix)");
    }
    *rows = nrows;
    *cols = ncols;
    *data = vals.data;
    return 0;
nomem:
    text_err(e, lineno, "out of memory");
fail:
    gemm_buf_free(&line_buf);
    gemm_buf_free(&vals);
    return -1;
}

int gemm_client_text_write(FILE *f, char delim, gemm_dtype dtype, uint64_t rows, uint64_t cols,
                           const void *data)
{
    if (delim == 0) delim = ',';
    for (uint64_t i = 0; i < rows; i++) {
        for (uint64_t j = 0; j < cols; j++) {
            size_t idx = (size_t)(i * cols + j);
            int rc;
            switch (dtype) {
            case GEMM_DTYPE_F32: rc = fprintf(f, "%.9g", (double)((const float *)data)[idx]); break;
            case GEMM_DTYPE_F64: rc = fprintf(f, "%.17g", ((const double *)data)[idx]); break;
            case GEMM_DTYPE_I32: rc = fprintf(f, "%d", (int)((const int32_t *)data)[idx]); break;
            case GEMM_DTYPE_F16:
            case GEMM_DTYPE_BF16: /* the element's exact float32 value: it reads back to itself */
                rc = fprintf(f, "%.9g", (double)gemm_half_to_f32(dtype, ((const uint16_t *)data)[idx]));
                break;
            default: errno = EINVAL; return -1;
            }
            if (rc < 0) return -1;
            if (putc(j + 1 < cols ? delim : '\n', f) == EOF) return -1;
        }
    }
    return ferror(f) ? -1 : 0;
}
