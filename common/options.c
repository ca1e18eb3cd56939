/* options.c - per-request options (dtype, kernel, tile, math, out_dtype, m/k/n, panel_of) from any source. */
#include "options.h"

#include <stdio.h>
#include <string.h>

#define TILE_MAX 1024

void gemm_options_init(gemm_options *o)
{
    memset(o, 0, sizeof *o);
    o->dtype = GEMM_DTYPE_INVALID;
    o->out_dtype = GEMM_DTYPE_INVALID;
    snprintf(o->kernel, sizeof o->kernel, "auto");
    o->tile = 0;
    o->math = GEMM_MATH_DEFAULT;
}

int gemm_parse_u64(const char *s, uint64_t *out)
{
    uint64_t v = 0;
    if (!s || !*s) return -1;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10) return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

/* A printable, bounded copy of a value for an error message: values come from the
 * network and may be long or hold control bytes. */
static const char *shown(const char *v, char *buf, size_t cap)
{
    size_t i = 0, n = 0;
    for (; v[i] && n + 4 < cap; i++)
        buf[n++] = (v[i] >= 0x20 && v[i] < 0x7f) ? v[i] : '?';
    if (v[i]) {
        buf[n++] = '.';
        buf[n++] = '.';
        buf[n++] = '.';
    }
    buf[n] = '\0';
    return buf;
}

static int valid_kernel_name(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++) {
        char c = s[n];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return 0;
    }
    return n >= 1 && n <= 47;
}

int gemm_options_set(gemm_options *o, const char *key, const char *value, gemm_err *err)
{
    char tmp[48];
    if (!key) return 1;
    if (!value) value = "";

    if (strcmp(key, "dtype") == 0) {
        gemm_dtype d;
        if (gemm_dtype_from_name(value, &d) != 0)
            return gemm_err_set(err, 422, "bad_option",
                                "dtype '%s' is not supported; use float32, float64, int32, float16 or bfloat16",
                                shown(value, tmp, sizeof tmp));
        o->dtype = d;
        return 0;
    }
    if (strcmp(key, "out_dtype") == 0) {
        gemm_dtype d;
        if (gemm_dtype_from_name(value, &d) != 0)
            return gemm_err_set(err, 422, "bad_out_dtype",
                                "out_dtype '%s' is not a dtype; use float32 (the default for float16 and "
                                "bfloat16 operands) or the operands' own dtype",
                                shown(value, tmp, sizeof tmp));
        o->out_dtype = d;
        return 0;
    }
    if (strcmp(key, "kernel") == 0) {
        if (!valid_kernel_name(value))
            return gemm_err_set(err, 422, "bad_option",
                                "kernel '%s' is not a kernel name (1 to 47 of a-z, 0-9, _); "
                                "GET /v1/info lists the kernels", shown(value, tmp, sizeof tmp));
        snprintf(o->kernel, sizeof o->kernel, "%s", value);
        return 0;
    }
    if (strcmp(key, "tile") == 0) {
        uint64_t t;
        if (gemm_parse_u64(value, &t) != 0 || t < 1 || t > TILE_MAX)
            return gemm_err_set(err, 422, "bad_option",
                                "tile '%s' is not valid; use an integer from 1 to %d (e.g. 16 or 32)",
                                shown(value, tmp, sizeof tmp), TILE_MAX);
        o->tile = (int)t;
        return 0;
    }
    if (strcmp(key, "math") == 0) {
        gemm_math m;
        if (gemm_math_from_name(value, &m) != 0)
            return gemm_err_set(err, 422, "bad_option",
                                "math '%s' is not valid; use default, fp32, tf32 or bf16",
                                shown(value, tmp, sizeof tmp));
        o->math = m;
        return 0;
    }
    if (strcmp(key, "batch") == 0) {
        uint64_t v;
        if (gemm_parse_u64(value, &v) != 0 || v < 1)
            return gemm_err_set(err, 400, "bad_dimension",
                                "batch '%s' is not a count of products (a decimal integer >= 1)",
                                shown(value, tmp, sizeof tmp));
        o->batch = v;
        return 0;
    }
    if (strcmp(key, "panel_of") == 0) {
        uint64_t v;
        if (gemm_parse_u64(value, &v) != 0 || v < 1)
            return gemm_err_set(err, 422, "bad_option",
                                "panel_of '%s' is not valid; use the rows of the whole product these rows "
                                "of A are part of (a decimal integer >= m)", shown(value, tmp, sizeof tmp));
        o->panel_of = v;
        return 0;
    }
    if (strcmp(key, "b_shared") == 0) {
        if (strcmp(value, "1") != 0 && strcmp(value, "0") != 0 && strcmp(value, "true") != 0 &&
            strcmp(value, "false") != 0)
            return gemm_err_set(err, 422, "bad_option", "b_shared '%s' is not valid; use 1 or 0",
                                shown(value, tmp, sizeof tmp));
        o->b_shared = value[0] == '1' || value[0] == 't';
        return 0;
    }
    if ((key[0] == 'm' || key[0] == 'k' || key[0] == 'n') && key[1] == '\0') {
        uint64_t v;
        if (gemm_parse_u64(value, &v) != 0)
            return gemm_err_set(err, 400, "bad_dimension",
                                "%s '%s' is not a plain decimal integer (digits only, no sign)",
                                key, shown(value, tmp, sizeof tmp));
        if (key[0] == 'm') o->m = v;
        else if (key[0] == 'k') o->k = v;
        else o->n = v;
        return 0;
    }
    return 1;
}
