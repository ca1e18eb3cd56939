/*
 * json_before.h - the JSON codec as it was before the streaming decoder (common/json_codec.c
 * at ad2c3d7): cJSON parses the whole body into a tree, then the shapes are checked and the
 * tree is copied into the matrices; the writer as it was. Kept here, in the benchmark only, so
 * that one run measures before and after on the same machine at the same time.
 */
#ifndef BENCH_JSON_BEFORE_H
#define BENCH_JSON_BEFORE_H

#include <cjson/cJSON.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_codec.h"

/* Makes room for n more bytes plus a terminating NUL; 0 on success. */
static int old_buf_reserve(gemm_buf *b, size_t n)
{
    size_t need;
    if (b->failed) return -1;
    if (!gemm_add_size(b->len, n, &need) || !gemm_add_size(need, 1, &need)) {
        b->failed = 1;
        return -1;
    }
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) {
            cap = need;
            break;
        }
        cap *= 2;
    }
    char *p = realloc(b->data, cap);
    if (!p) {
        b->failed = 1;
        return -1;
    }
    b->data = p;
    b->cap = cap;
    return 0;
}

/* Writes v in decimal at p; returns the length. */
static size_t put_i64(char *p, int64_t v)
{
    char tmp[24];
    size_t n = 0, len = 0;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) p[len++] = '-';
    while (n) p[len++] = tmp[--n];
    return len;
}

/* x * 10^e, by exact powers of ten (each step rounds once). */
static double scale10(double x, int e)
{
    static const double p10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                   1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    while (e > 22) x *= 1e22, e -= 22;
    while (e < -22) x /= 1e22, e += 22;
    return e >= 0 ? x * p10[e] : x / p10[-e];
}

/* Lays out P significant digits dig[0..P) (exponent e: the value is d.ddd x 10^e) the
 * way printf's %.<P>g does: trailing zeros dropped, scientific notation when e < -4 or
 * e >= P. Returns the end of what was written at s. */
static char *put_g_layout(char *s, const char *dig, int P, int e)
{
    int nd = P;
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    if (e < -4 || e >= P) {
        *s++ = dig[0];
        if (nd > 1) {
            *s++ = '.';
            memcpy(s, dig + 1, (size_t)nd - 1);
            s += nd - 1;
        }
        *s++ = 'e';
        *s++ = e < 0 ? '-' : '+';
        int ae = e < 0 ? -e : e;
        if (ae >= 100) *s++ = (char)('0' + ae / 100);
        *s++ = (char)('0' + ae / 10 % 10);
        *s++ = (char)('0' + ae % 10);
    } else if (e >= 0) {
        memcpy(s, dig, (size_t)e + 1);
        s += e + 1;
        if (nd > e + 1) {
            *s++ = '.';
            memcpy(s, dig + e + 1, (size_t)(nd - e - 1));
            s += nd - e - 1;
        }
    } else {
        *s++ = '0';
        *s++ = '.';
        for (int i = 0; i < -e - 1; i++) *s++ = '0';
        memcpy(s, dig, (size_t)nd);
        s += nd;
    }
    return s;
}


/* printf("%.9g") of a float32 value (held exactly in x) without printf: the nine digits
 * are x scaled into [1e8, 1e9) in double arithmetic, whose error (a few units in 1e-16)
 * can only matter when the scaled value is within 1e-5 of a rounding tie; then 0 is
 * returned and the caller uses snprintf. Also 0 for x == 0 and non-finite x. */
static size_t put_f32_g9(char *p, double x)
{
    char *s = p, dig[10];
    if (!(x != 0) || !isfinite(x)) return 0;
    if (x < 0) *s++ = '-', x = -x;
    int e = (int)floor(log10(x));
    double y = scale10(x, 8 - e);
    if (y < 1e8) y = scale10(x, 8 - --e);
    else if (y >= 1e9) y = scale10(x, 8 - ++e);
    double fl = floor(y), fr = y - fl;
    if (fabs(fr - 0.5) < 1e-5 || fl < 1e8 - 1 || fl >= 1e9) return 0;
    uint64_t d = (uint64_t)fl + (fr > 0.5);
    if (d >= 1000000000u) d /= 10, e++;
    if (d < 100000000u) return 0;
    for (int i = 8; i >= 0; i--) dig[i] = (char)('0' + d % 10), d /= 10;
    return (size_t)(put_g_layout(s, dig, 9, e) - p);
}

#if defined(LDBL_MANT_DIG) && LDBL_MANT_DIG >= 64
/* printf("%.17g") of a double without printf, the same way with 64-bit long double
 * arithmetic: each scaling step (exact powers of ten up to 1e27) errs by at most 2^-64
 * relative, so the scaled value in [1e16, 1e17) is off by less than 0.006 per step; within
 * 0.01 per step of a rounding tie, 0 is returned and the caller uses snprintf. */
static size_t put_f64_g17(char *p, double v)
{
    static const long double p10[28] = {1e0L,  1e1L,  1e2L,  1e3L,  1e4L,  1e5L,  1e6L,  1e7L,  1e8L,  1e9L,
                                        1e10L, 1e11L, 1e12L, 1e13L, 1e14L, 1e15L, 1e16L, 1e17L, 1e18L, 1e19L,
                                        1e20L, 1e21L, 1e22L, 1e23L, 1e24L, 1e25L, 1e26L, 1e27L};
    char *s = p, dig[17];
    if (!(v != 0) || !isfinite(v)) return 0;
    if (v < 0) *s++ = '-', v = -v;
    int e = (int)floor(log10(v)), steps = 0;
    long double y = 0;
    for (int attempt = 0; attempt < 2; attempt++) {
        long double x = v;
        int k = 16 - e;
        steps = 1;
        while (k > 27) x *= 1e27L, k -= 27, steps++;
        while (k < -27) x /= 1e27L, k += 27, steps++;
        y = k >= 0 ? x * p10[k] : x / p10[-k];
        if (y < 1e16L) e--;
        else if (y >= 1e17L) e++;
        else break;
    }
    long double fl = floorl(y), fr = y - fl;
    if (fl < 1e16L || fl >= 1e17L || fabsl(fr - 0.5L) < 0.01L * steps) return 0;
    uint64_t d = (uint64_t)fl + (fr > 0.5L);
    if (d >= 100000000000000000ull) d /= 10, e++;
    for (int i = 16; i >= 0; i--) dig[i] = (char)('0' + d % 10), d /= 10;
    return (size_t)(put_g_layout(s, dig, 17, e) - p);
}
#else
static size_t put_f64_g17(char *p, double v)
{
    (void)p, (void)v;
    return 0; /* no wide long double: snprintf does it */
}
#endif

/* Writes one element (at most 32 bytes) at p; returns the length. */
static size_t put_double(char *p, double v, int digits)
{
    if (!isfinite(v)) {
        memcpy(p, "null", 4);
        return 4;
    }
    /* Integer-valued and exactly representable: print directly (fast and exact). */
    if (v == v && fabs(v) < 9007199254740992.0 && v == (double)(int64_t)v) {
        if (v == 0 && signbit(v)) {
            memcpy(p, "-0", 2);
            return 2;
        }
        return put_i64(p, (int64_t)v);
    }
    size_t fast = digits == 9 ? put_f32_g9(p, v) : put_f64_g17(p, v);
    if (fast) return fast;
    int n = snprintf(p, 32, "%.*g", digits, v);
    return n > 0 && n < 32 ? (size_t)n : 0;
}

static void old_json_write_matrix(gemm_buf *out, const gemm_matrix *m)
{
    size_t es = gemm_dtype_size(m->dtype);
    if (es == 0 || (m->rows && m->cols && !m->data)) {
        out->failed = 1;
        return;
    }
    /* Reserve a good guess once; each element reserves its worst case as it goes. */
    size_t guess;
    if (gemm_mul_size((size_t)m->rows, (size_t)m->cols, &guess) && gemm_mul_size(guess, 12, &guess))
        old_buf_reserve(out, guess);
    gemm_buf_append(out, "[", 1);
    for (uint64_t i = 0; i < m->rows && !out->failed; i++) {
        if (i) gemm_buf_append(out, ",", 1);
        gemm_buf_append(out, "[", 1);
        for (uint64_t j = 0; j < m->cols; j++) {
            if (old_buf_reserve(out, 40)) return;
            char *p = out->data + out->len;
            size_t n = 0;
            if (j) p[n++] = ',';
            size_t idx = (size_t)(i * m->cols + j);
            switch (m->dtype) {
            case GEMM_DTYPE_F32:
                n += put_double(p + n, ((const float *)m->data)[idx], 9);
                break;
            case GEMM_DTYPE_F64:
                n += put_double(p + n, ((const double *)m->data)[idx], 17);
                break;
            default:
                n += put_i64(p + n, ((const int32_t *)m->data)[idx]);
                break;
            }
            out->len += n;
        }
        gemm_buf_append(out, "]", 1);
    }
    gemm_buf_append(out, "]", 1);
}

/* ---- decoding requests ---------------------------------------------------- */

static const char *type_name(const cJSON *v)
{
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsNumber(v)) return "a number";
    return "not a value";
}

/* One operand as found in the body: its shape and where its numbers are. */
typedef struct {
    const char *name;   /* "a" or "b" */
    const cJSON *rows;  /* nested form: the outer array; NULL for the shape/data form */
    const cJSON *data;  /* shape/data form: the flat array */
    uint64_t nrows, ncols;
} operand;

static int is_count(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= 9007199254740992.0) || d != floor(d)) return 0;
    *out = (uint64_t)d;
    return 1;
}

/* Finds the shape of operand `name` and checks its structure (not its elements). */
static int inspect(const cJSON *root, const char *name, operand *op, gemm_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    op->name = name;
    op->rows = op->data = NULL;
    if (!v)
        return gemm_err_set(err, 400, "bad_matrix", "the body has no \"%s\" matrix", name);
    if (cJSON_IsObject(v)) {
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(v, "shape");
        const cJSON *data = cJSON_GetObjectItemCaseSensitive(v, "data");
        if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) != 2 ||
            !is_count(shape->child, &op->nrows) || !is_count(shape->child->next, &op->ncols))
            return gemm_err_set(err, 400, "bad_matrix",
                                "%s.shape must be [rows, cols] with two non-negative integers", name);
        if (!cJSON_IsArray(data))
            return gemm_err_set(err, 400, "bad_matrix", "%s.data must be an array of numbers (row-major), not %s",
                                name, data ? type_name(data) : "missing");
        op->data = data;
        return 0;
    }
    if (!cJSON_IsArray(v))
        return gemm_err_set(err, 400, "bad_matrix",
                            "%s is %s; expected nested arrays [[..],[..]] or {\"shape\": [m,k], \"data\": [..]}",
                            name, type_name(v));
    op->rows = v;
    op->nrows = 0;
    op->ncols = 0;
    uint64_t i = 0;
    for (const cJSON *row = v->child; row; row = row->next, i++) {
        if (!cJSON_IsArray(row)) {
            if (i == 0 && cJSON_IsNumber(row))
                return gemm_err_set(err, 400, "bad_matrix",
                                    "%s is a 1-D array; a matrix is an array of rows, e.g. [[1,2],[3,4]]", name);
            return gemm_err_set(err, 400, "bad_matrix", "%s[%llu] is %s, expected an array (a row)", name,
                                (unsigned long long)i, type_name(row));
        }
        uint64_t n = 0;
        for (const cJSON *e = row->child; e; e = e->next) n++;
        if (i == 0) op->ncols = n;
        else if (n != op->ncols)
            return gemm_err_set(err, 400, "bad_matrix", "row %llu of %s has %llu elements, row 0 has %llu",
                                (unsigned long long)i, name, (unsigned long long)n,
                                (unsigned long long)op->ncols);
    }
    op->nrows = i;
    return 0;
}

/* Where an element sits, for messages: "a[2][1]" or "b.data[4]". Built only on error. */
static const char *place(char *buf, size_t cap, const char *name, int flat, uint64_t i, uint64_t j)
{
    if (flat) snprintf(buf, cap, "%s.data[%llu]", name, (unsigned long long)j);
    else snprintf(buf, cap, "%s[%llu][%llu]", name, (unsigned long long)i, (unsigned long long)j);
    return buf;
}

/* Converts one JSON value into element idx of dst. Returns 0, or -1 with *err naming
 * the element (row i, column j; or flat index j). */
static int store(const cJSON *e, gemm_dtype d, void *dst, size_t idx, const char *name, int flat, uint64_t i,
                 uint64_t j, gemm_err *err)
{
    char w[96];
    if (!cJSON_IsNumber(e))
        return gemm_err_set(err, 400, "bad_matrix", "%s is %s, expected a number", place(w, sizeof w, name, flat, i, j),
                            type_name(e));
    double v = e->valuedouble;
    switch (d) {
    case GEMM_DTYPE_F32:
        if (!(fabs(v) <= FLT_MAX))
            return gemm_err_set(err, 422, "bad_value", "%s = %.17g is beyond float32's range (+-%.9g)",
                                place(w, sizeof w, name, flat, i, j), v, (double)FLT_MAX);
        ((float *)dst)[idx] = (float)v;
        return 0;
    case GEMM_DTYPE_F64:
        if (!isfinite(v))
            return gemm_err_set(err, 422, "bad_value", "%s is beyond float64's range",
                                place(w, sizeof w, name, flat, i, j));
        ((double *)dst)[idx] = v;
        return 0;
    default:
        if (!(v >= -2147483648.0 && v <= 2147483647.0) || v != floor(v))
            return gemm_err_set(err, 422, "bad_value",
                                "%s = %.17g is not an int32 (integers from -2147483648 to 2147483647)",
                                place(w, sizeof w, name, flat, i, j), v);
        ((int32_t *)dst)[idx] = (int32_t)v;
        return 0;
    }
}

static int fill(const operand *op, gemm_dtype d, const gemm_allocator *alloc, gemm_matrix *out, gemm_err *err)
{
    size_t bytes;
    if (!gemm_matrix_bytes(op->nrows, op->ncols, d, &bytes))
        return gemm_err_set(err, 413, "too_large", "%s is too large", op->name);
    out->rows = op->nrows;
    out->cols = op->ncols;
    out->dtype = d;
    out->data = gemm_alloc(alloc, bytes);
    if (!out->data)
        return gemm_err_set(err, 500, "out_of_memory", "could not allocate %zu bytes for %s", bytes, op->name);
    size_t idx = 0;
    if (op->data) {
        for (const cJSON *e = op->data->child; e; e = e->next, idx++)
            if (store(e, d, out->data, idx, op->name, 1, 0, idx, err)) goto fail;
        return 0;
    }
    uint64_t i = 0;
    for (const cJSON *row = op->rows->child; row; row = row->next, i++) {
        uint64_t j = 0;
        for (const cJSON *e = row->child; e; e = e->next, j++, idx++)
            if (store(e, d, out->data, idx, op->name, 0, i, j, err)) goto fail;
    }
    return 0;
fail:
    gemm_free(alloc, out->data);
    out->data = NULL;
    return -1;
}

/* Applies "dtype", "kernel", "tile", "math" when present in the body. */
static int body_options(const cJSON *root, gemm_options *opt, gemm_err *err)
{
    static const char *const keys[] = {"dtype", "kernel", "tile", "math"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, keys[i]);
        char num[32];
        const char *s;
        if (!v) continue;
        if (cJSON_IsString(v)) {
            s = v->valuestring;
        } else if (cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble <= 1e15 &&
                   v->valuedouble == floor(v->valuedouble)) {
            snprintf(num, sizeof num, "%.0f", v->valuedouble);
            s = num;
        } else {
            return gemm_err_set(err, 422, "bad_option", "\"%s\" is %s; expected a string%s", keys[i], type_name(v),
                                strcmp(keys[i], "tile") == 0 ? " or a positive integer" : "");
        }
        if (gemm_options_set(opt, GEMM_DOOR_JSON, keys[i], strlen(keys[i]), s, strlen(s), err) < 0) return -1;
    }
    return 0;
}

static void where_in_text(const char *body, size_t len, size_t off, size_t *line, size_t *col)
{
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < off && i < len; i++) {
        if (body[i] == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

static int old_json_decode_request(const char *body, size_t len, const gemm_limits *lim,
                             const gemm_allocator *alloc, gemm_options *opt,
                             gemm_matrix *a, gemm_matrix *b, gemm_err *err)
{
    const char *end = NULL;
    size_t line, col;
    a->data = b->data = NULL;
    if (!body || len == 0)
        return gemm_err_set(err, 400, "bad_json", "the body is empty; expected a JSON object with \"a\" and \"b\"");
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!root) {
        size_t off = (end && end >= body && end <= body + len) ? (size_t)(end - body) : 0;
        where_in_text(body, len, off, &line, &col);
        return gemm_err_set(err, 400, "bad_json", "invalid JSON at byte %zu (line %zu, column %zu)", off, line,
                            col);
    }
    size_t off = (size_t)(end - body);
    while (off < len && (body[off] == ' ' || body[off] == '\t' || body[off] == '\n' || body[off] == '\r'))
        off++;
    if (off < len && !(body[off] == '\0' && off + 1 == len)) {
        where_in_text(body, len, off, &line, &col);
        cJSON_Delete(root);
        return gemm_err_set(err, 400, "bad_json",
                            "unexpected data after the JSON value at byte %zu (line %zu, column %zu)", off, line, col);
    }

    int rc = -1;
    operand oa, ob;
    if (!cJSON_IsObject(root)) {
        gemm_err_set(err, 400, "bad_matrix",
                     "the body is %s; expected a JSON object {\"a\": [[..]], \"b\": [[..]]}", type_name(root));
        goto out;
    }
    if (body_options(root, opt, err)) goto out;
    if (opt->dtype == GEMM_DTYPE_INVALID) opt->dtype = GEMM_DTYPE_F64;
    if (inspect(root, "a", &oa, err) || inspect(root, "b", &ob, err)) goto out;
    if (gemm_check_product(oa.nrows, oa.ncols, ob.nrows, ob.ncols, opt->dtype, lim, err)) goto out;
    /* The flat form's length is checked only now that the shape is known to be sane. */
    const operand *ops[2] = {&oa, &ob};
    for (int i = 0; i < 2; i++) {
        if (!ops[i]->data) continue;
        uint64_t cnt = 0, need = ops[i]->nrows * ops[i]->ncols;
        for (const cJSON *e = ops[i]->data->child; e; e = e->next) cnt++;
        if (cnt != need) {
            gemm_err_set(err, 400, "bad_matrix", "%s.data has %llu numbers but shape [%llu,%llu] needs %llu",
                         ops[i]->name, (unsigned long long)cnt, (unsigned long long)ops[i]->nrows,
                         (unsigned long long)ops[i]->ncols, (unsigned long long)need);
            goto out;
        }
    }
    if (fill(&oa, opt->dtype, alloc, a, err)) goto out;
    if (fill(&ob, opt->dtype, alloc, b, err)) {
        gemm_free(alloc, a->data);
        a->data = NULL;
        goto out;
    }
    rc = 0;
out:
    cJSON_Delete(root);
    return rc;
}

#endif
