/* options.c - the request options: the table (a row per option) and the one reader of
 * values that every door uses (see options.h). */
#include "options.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define Q GEMM_DOOR_QUERY
#define F GEMM_DOOR_FORM
#define J GEMM_DOOR_JSON
#define V GEMM_DOOR_V2
#define AT(f) offsetof(gemm_options, f)
#define ANY UINT64_MAX

static const gemm_option table[] = {
    {"dtype", GEMM_OPT_DTYPE, Q | F | J, AT(dtype), 0, 0, 422, "bad_option", "float32",
     "the operands' dtype (default: JSON float64, raw float32, .npy the file's)"},
    {"out_dtype", GEMM_OPT_DTYPE, Q | F | J | V, AT(out_dtype), 0, 0, 422, "bad_out_dtype", "float32",
     "C's dtype: float32 (the default) or their own for float16/bfloat16 operands, only their own for others"},
    {"kernel", GEMM_OPT_KERNEL, Q | F | J | V, AT(kernel), 0, 0, 422, "bad_option", "auto",
     "auto, or a kernel GET /v1/info lists"},
    {"tile", GEMM_OPT_UINT, Q | F | J | V, AT(tile), 1, 1024, 422, "bad_option", "16",
     "the tile of a kernel that takes one (GET /v1/info lists each kernel's tiles)"},
    {"math", GEMM_OPT_MATH, Q | F | J | V, AT(math), 0, 0, 422, "bad_option", "fp32",
     "how float32 is computed: fp32, tf32, bf16 (float32 only; default: fp32)"},
    {"panel_of", GEMM_OPT_UINT, Q | F | J | V, AT(panel_of), 1, ANY, 422, "bad_option", "4096",
     "the rows (>= m) of a whole product whose row panel A is: chosen as for them, C's rows equal its"},
    {"m", GEMM_OPT_UINT, Q, AT(m), 0, ANY, 400, "bad_dimension", "2", "raw bodies: the rows of A"},
    {"k", GEMM_OPT_UINT, Q, AT(k), 0, ANY, 400, "bad_dimension", "3", "raw bodies: the columns of A, rows of B"},
    {"n", GEMM_OPT_UINT, Q, AT(n), 0, ANY, 400, "bad_dimension", "2", "raw bodies: the columns of B"},
    {"batch", GEMM_OPT_UINT, Q, AT(batch), 1, ANY, 400, "bad_dimension", "2",
     "raw bodies: products in the body (batch A matrices, then the B matrices)"},
    {"b_shared", GEMM_OPT_FLAG, Q, AT(b_shared), 0, 1, 400, "bad_option", "1",
     "raw bodies with batch: B is one k x n matrix shared by every product"},
    {"a", GEMM_OPT_ID, Q | F, AT(ref[0]), 0, 0, 400, "bad_option", NULL, "A is the resident matrix with this id"},
    {"b", GEMM_OPT_ID, Q | F, AT(ref[1]), 0, 0, 400, "bad_option", NULL, "B is the resident matrix with this id"},
    {"store", GEMM_OPT_FLAG, Q, AT(store), 0, 1, 400, "bad_option", "1",
     "POST /v1/matmul: C becomes a resident matrix (201, its description)"},
    {"return", GEMM_OPT_FLAG, Q, AT(ret), 0, 1, 400, "bad_option", "1", "with store=1: C is sent too"},
    {"rows", GEMM_OPT_UINT, Q, AT(rows), 0, ANY, 400, "bad_dimension", "2",
     "POST /v1/matrices, raw or empty: the rows (or m)"},
    {"cols", GEMM_OPT_UINT, Q, AT(cols), 0, ANY, 400, "bad_dimension", "2",
     "POST /v1/matrices, raw or empty: the columns (or k)"},
    {"empty", GEMM_OPT_FLAG, Q, AT(empty), 0, 1, 400, "bad_option", "1",
     "POST /v1/matrices: made without a body, its rows sent later by PUT"},
    {"row", GEMM_OPT_UINT, Q, AT(row), 0, ANY, 400, "bad_option", "0",
     "PUT of rows of a resident matrix: the index of the first row sent"},
};
#define NOPT ((int)(sizeof table / sizeof table[0]))
_Static_assert(sizeof table / sizeof table[0] <= 64, "given is a 64-bit mask");

int gemm_option_count(void) { return NOPT; }
const gemm_option *gemm_option_at(int i) { return i >= 0 && i < NOPT ? &table[i] : NULL; }

const gemm_option *gemm_option_find(const char *name, size_t len, unsigned door)
{
    for (int i = 0; name && i < NOPT; i++)
        if ((table[i].doors & door) && strlen(table[i].name) == len && memcmp(table[i].name, name, len) == 0)
            return &table[i];
    return NULL;
}

const char *const gemm_option_doors[GEMM_DOOR_COUNT] = {"query", "form", "json", "v2"};
const char *const gemm_option_types[GEMM_OPT_TYPES] = {"dtype", "math", "kernel", "integer", "flag", "id"};

const char *gemm_option_names(unsigned door, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < NOPT && n < cap; i++)
        if (table[i].doors & door) n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", table[i].name);
    return buf;
}

void gemm_options_init(gemm_options *o)
{
    *o = (gemm_options){.dtype = GEMM_DTYPE_INVALID, .out_dtype = GEMM_DTYPE_INVALID, .kernel = "auto"};
}

void gemm_options_door(gemm_options *o) { o->door_given = 0; }

int gemm_options_given(const gemm_options *o, size_t field)
{
    for (int i = 0; i < NOPT; i++)
        if (table[i].field == field) return (o->given >> i) & 1;
    return 0;
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

/* ---- reading a value ---------------------------------------------------------------- */

static const char *control_byte(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) return s + i;
    return NULL;
}

/* What a row accepts, for messages. */
static const char *accepted(const gemm_option *d, char *buf, size_t cap)
{
    static const char *const of_type[GEMM_OPT_TYPES] = {
        "float32, float64, int32, float16 or bfloat16", "default, fp32, tf32 or bf16",
        "a kernel name (1 to 47 of a-z, 0-9, _; GET /v1/info lists the kernels)", NULL, "1 or 0 (true or false)",
        "the id of a resident matrix"};
    if (d->type != GEMM_OPT_UINT) return of_type[d->type];
    if (d->max == ANY) snprintf(buf, cap, "a decimal integer (digits only) >= %llu", (unsigned long long)d->min);
    else
        snprintf(buf, cap, "a decimal integer (digits only) from %llu to %llu", (unsigned long long)d->min,
                 (unsigned long long)d->max);
    return buf;
}

/* The value as text: text as it is; a number for an integer or a flag, written out; a
 * boolean for a flag. Else -1 with *err. */
static int as_text(const gemm_option *d, const gemm_opt_value *v, char *num, size_t cap, const char **s, size_t *len,
                   gemm_err *err)
{
    int integer = d->type == GEMM_OPT_UINT || d->type == GEMM_OPT_FLAG;
    if (v->kind == GEMM_VAL_TEXT) {
        *s = v->text ? v->text : "";
        *len = v->text ? v->len : 0;
        return 0;
    }
    if (v->kind == GEMM_VAL_NUMBER && integer) {
        double x = v->number;
        snprintf(num, cap, fabs(x) < 9007199254740992.0 && x == floor(x) ? "%.0f" : "%.17g", x);
    } else if (v->kind == GEMM_VAL_BOOL && d->type == GEMM_OPT_FLAG) {
        snprintf(num, cap, "%s", v->boolean ? "true" : "false");
    } else {
        const char *t = v->kind == GEMM_VAL_NUMBER ? "a number" : v->kind == GEMM_VAL_BOOL ? "a boolean"
                                                                                            : v->type_name;
        return gemm_err_set(err, d->status, d->code, "%s is %s; expected %s", d->name, t ? t : "not a value",
                            d->type == GEMM_OPT_FLAG ? "true, false, 1 or 0"
                            : integer                ? "an integer or a string of its digits"
                                                     : "a string");
    }
    *s = num;
    *len = strlen(num);
    return 0;
}

int gemm_option_apply(gemm_options *o, const gemm_option *d, const gemm_opt_value *v, gemm_err *err)
{
    char num[40], val[GEMM_OPTION_VALUE_MAX + 1], show[48], range[80];
    const char *s;
    size_t len;
    uint64_t bit = 1ull << (d - table);
    if (o->door_given & bit) return gemm_err_set(err, 400, "duplicate_option", "%s is given twice", d->name);
    if (as_text(d, v, num, sizeof num, &s, &len, err)) return -1;
    const char *c = control_byte(s, len);
    if (c)
        return gemm_err_set(err, 400, d->code, "%s '%s' holds a control byte (0x%02x); a value is printable text",
                            d->name, gemm_shown(s, len, show, sizeof show), (unsigned)(unsigned char)*c);
    if (len > GEMM_OPTION_VALUE_MAX) goto bad;
    memcpy(val, s, len);
    val[len] = '\0';
    void *f = (char *)o + d->field;
    switch (d->type) {
    case GEMM_OPT_DTYPE: /* the parsers write only what they accept */
        if (gemm_dtype_from_name(val, (gemm_dtype *)f)) goto bad;
        break;
    case GEMM_OPT_MATH:
        if (gemm_math_from_name(val, (gemm_math *)f)) goto bad;
        break;
    case GEMM_OPT_KERNEL:
        if (len < 1 || len > 47 || strspn(val, "abcdefghijklmnopqrstuvwxyz0123456789_") != len) goto bad;
        memcpy(f, val, len + 1);
        break;
    case GEMM_OPT_UINT: {
        uint64_t x;
        if (gemm_parse_u64(val, &x) || x < d->min || x > d->max) goto bad;
        *(uint64_t *)f = x;
        break;
    }
    case GEMM_OPT_FLAG: {
        static const char *const words[] = {"1", "true", "yes", "on", "0", "false", "no", "off"}; /* 4 yes, 4 no */
        int i = 0;
        while (i < 8 && strcasecmp(val, words[i]) != 0) i++;
        if (i == 8) goto bad;
        *(int *)f = i < 4;
        break;
    }
    default:
        if (!len) goto bad;
        memcpy(f, val, len + 1);
    }
    o->given |= bit;
    o->door_given |= bit;
    return 0;
bad:
    return gemm_err_set(err, d->status, d->code, "%s '%s' is not valid; use %s", d->name,
                        gemm_shown(s, len, show, sizeof show), accepted(d, range, sizeof range));
}

int gemm_options_set(gemm_options *o, unsigned door, const char *key, size_t key_len, const char *value,
                     size_t value_len, gemm_err *err)
{
    char show[48];
    if (!value) value_len = 0;
    if (!key) return 1;
    const gemm_option *d = control_byte(key, key_len) ? NULL : gemm_option_find(key, key_len, door);
    gemm_opt_value v = {.kind = GEMM_VAL_TEXT, .text = value, .len = value_len};
    if (d) return gemm_option_apply(o, d, &v, err);
    if (control_byte(key, key_len) || control_byte(value, value_len))
        return gemm_err_set(err, 400, "bad_option", "the argument '%s' holds a control byte; keys and values are "
                            "printable text", gemm_shown(key, key_len, show, sizeof show));
    return 1;
}
