/* v2_codec.c - Open Inference Protocol (KServe v2) request headers and output tensors. */
#include "v2_codec.h"

#include <cjson/cJSON.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- datatypes -------------------------------------------------------------- */

int gemm_v2_dtype_from_name(const char *s, gemm_dtype *out)
{
    static const char *const others[] = {"BOOL",  "UINT8", "UINT16", "UINT32", "UINT64", "INT8",
                                         "INT16", "INT64", "FP16",   "BF16",   "BYTES"};
    if (!s) return -2;
    if (strcmp(s, "FP32") == 0) return *out = GEMM_DTYPE_F32, 0;
    if (strcmp(s, "FP64") == 0) return *out = GEMM_DTYPE_F64, 0;
    if (strcmp(s, "INT32") == 0) return *out = GEMM_DTYPE_I32, 0;
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++)
        if (strcmp(s, others[i]) == 0) return -1;
    return -2;
}

const char *gemm_v2_dtype_name(gemm_dtype d)
{
    switch (d) {
    case GEMM_DTYPE_F32: return "FP32";
    case GEMM_DTYPE_F64: return "FP64";
    case GEMM_DTYPE_I32: return "INT32";
    default: return "";
    }
}

/* ---- small helpers ------------------------------------------------------------ */

char *gemm_v2_utf8_dup(const char *s)
{
    size_t len = strlen(s);
    char *out = malloc(len + 1);
    if (!out) return NULL;
    memcpy(out, s, len + 1);
    unsigned char *p = (unsigned char *)out;
    while (*p) {
        size_t n = gemm_utf8_seq(p);
        if (n == 0) {
            *p++ = '?';
            continue;
        }
        p += n;
    }
    return out;
}

/* A printable, bounded copy of a name from the request, for messages. */
static const char *shown(const char *v, char *buf, size_t cap)
{
    size_t i = 0, n = 0;
    for (; v[i] && n + 4 < cap; i++) buf[n++] = (v[i] >= 0x20 && v[i] < 0x7f) ? v[i] : '?';
    if (v[i]) {
        buf[n++] = '.';
        buf[n++] = '.';
        buf[n++] = '.';
    }
    buf[n] = '\0';
    return buf;
}

static const char *type_name(const cJSON *v)
{
    if (!v) return "missing";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsNumber(v)) return "a number";
    return "not a value";
}

static int is_count(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= 9007199254740992.0) || d != floor(d)) return 0;
    *out = (uint64_t)d;
    return 1;
}

static uint64_t array_len(const cJSON *a)
{
    uint64_t n = 0;
    for (const cJSON *e = a->child; e; e = e->next) n++;
    return n;
}

static const char *input_name(int which) { return which == 0 ? "A" : "B"; }

/* ---- request ------------------------------------------------------------------- */

void gemm_v2_request_init(gemm_v2_request *r)
{
    memset(r, 0, sizeof *r);
    r->dtype = GEMM_DTYPE_INVALID;
    r->order[0] = 0;
    r->order[1] = 1;
    gemm_options_init(&r->opt);
}

void gemm_v2_release_json(gemm_v2_request *r)
{
    cJSON_Delete(r->root);
    r->root = NULL;
    r->in[0].data = r->in[1].data = NULL;
}

void gemm_v2_request_free(gemm_v2_request *r)
{
    gemm_v2_release_json(r);
    free(r->id);
    r->id = NULL;
}

/* The request's "parameters": kernel, math, tile (options) and binary_data_output. Other
 * parameters are the business of other models and servers; they are ignored. */
static int request_parameters(const cJSON *root, gemm_v2_request *r, int *binary_default, gemm_err *err)
{
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(root, "parameters");
    *binary_default = 0;
    if (!params) return 0;
    if (!cJSON_IsObject(params))
        return gemm_err_set(err, 400, "bad_parameter", "\"parameters\" is %s; expected an object", type_name(params));
    static const char *const keys[] = {"kernel", "math", "tile"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(params, keys[i]);
        char num[32];
        const char *s;
        if (!v) continue;
        if (cJSON_IsString(v)) {
            s = v->valuestring;
        } else if (i == 2 && cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble <= 1e15 &&
                   v->valuedouble == floor(v->valuedouble)) {
            snprintf(num, sizeof num, "%.0f", v->valuedouble);
            s = num;
        } else {
            return gemm_err_set(err, 400, "bad_parameter", "parameters.%s is %s; expected a string%s", keys[i],
                                type_name(v), i == 2 ? " or a positive integer" : "");
        }
        if (gemm_options_set(&r->opt, keys[i], s, err) < 0) {
            err->status = 400;
            return -1;
        }
    }
    const cJSON *bdo = cJSON_GetObjectItemCaseSensitive(params, "binary_data_output");
    if (bdo) {
        if (!cJSON_IsBool(bdo))
            return gemm_err_set(err, 400, "bad_parameter", "parameters.binary_data_output is %s; expected true or false",
                                type_name(bdo));
        *binary_default = cJSON_IsTrue(bdo);
    }
    return 0;
}

/* One entry of "inputs": name, datatype, shape, binary_data_size or data. */
static int parse_input(const cJSON *t, size_t pos, int binary_ok, gemm_v2_request *r, int seen[2], gemm_dtype dts[2],
                       gemm_err *err)
{
    char w[48];
    if (!cJSON_IsObject(t))
        return gemm_err_set(err, 400, "bad_request", "inputs[%zu] is %s; expected an object with name, shape, "
                            "datatype and data", pos, type_name(t));
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
    if (!cJSON_IsString(name))
        return gemm_err_set(err, 400, "bad_request", "inputs[%zu].name is %s; expected a string (A or B)", pos,
                            type_name(name));
    int which;
    if (strcmp(name->valuestring, "A") == 0) which = 0;
    else if (strcmp(name->valuestring, "B") == 0) which = 1;
    else
        return gemm_err_set(err, 400, "unknown_input",
                            "unexpected inference input '%s' for model '" GEMM_V2_MODEL "'; it takes inputs A and B",
                            shown(name->valuestring, w, sizeof w));
    if (seen[which])
        return gemm_err_set(err, 400, "duplicate_input", "input %s is given twice", input_name(which));
    seen[which] = 1;
    r->order[seen[0] + seen[1] - 1] = which;
    gemm_v2_input *in = &r->in[which];

    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "datatype");
    if (!cJSON_IsString(dt))
        return gemm_err_set(err, 400, "bad_datatype", "input %s: datatype is %s; expected FP32, FP64 or INT32",
                            input_name(which), type_name(dt));
    int rc = gemm_v2_dtype_from_name(dt->valuestring, &dts[which]);
    if (rc == -1)
        return gemm_err_set(err, 400, "bad_datatype",
                            "input %s: datatype %s is not supported by model '" GEMM_V2_MODEL "'; use FP32, FP64 or INT32",
                            input_name(which), shown(dt->valuestring, w, sizeof w));
    if (rc != 0)
        return gemm_err_set(err, 400, "bad_datatype",
                            "input %s: unknown datatype '%s'; model '" GEMM_V2_MODEL "' takes FP32, FP64 or INT32",
                            input_name(which), shown(dt->valuestring, w, sizeof w));

    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(t, "shape");
    if (!cJSON_IsArray(shape))
        return gemm_err_set(err, 400, "bad_shape", "input %s: shape is %s; expected [rows, cols]", input_name(which),
                            type_name(shape));
    uint64_t ndim = array_len(shape);
    if (ndim != 2)
        return gemm_err_set(err, 400, "bad_shape", "input %s: shape has %llu dimensions; model '" GEMM_V2_MODEL
                            "' takes matrices, shape [rows, cols]", input_name(which), (unsigned long long)ndim);
    if (!is_count(shape->child, &in->rows) || !is_count(shape->child->next, &in->cols))
        return gemm_err_set(err, 400, "bad_shape", "input %s: shape must hold two non-negative integers",
                            input_name(which));

    const cJSON *params = cJSON_GetObjectItemCaseSensitive(t, "parameters");
    const cJSON *bds = NULL;
    if (params) {
        if (!cJSON_IsObject(params))
            return gemm_err_set(err, 400, "bad_parameter", "input %s: parameters is %s; expected an object",
                                input_name(which), type_name(params));
        if (cJSON_GetObjectItemCaseSensitive(params, "shared_memory_region"))
            return gemm_err_set(err, 400, "unsupported", "input %s: shared memory is not supported by this server; "
                                "send the data in the body", input_name(which));
        bds = cJSON_GetObjectItemCaseSensitive(params, "binary_data_size");
    }
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(t, "data");
    if (bds) {
        uint64_t n;
        if (!is_count(bds, &n))
            return gemm_err_set(err, 400, "bad_binary_size",
                                "input %s: binary_data_size is %s; expected a non-negative integer", input_name(which),
                                type_name(bds));
        if (!binary_ok)
            return gemm_err_set(err, 400, "bad_binary_size",
                                "input %s has binary_data_size but the request has no Inference-Header-Content-Length "
                                "header saying where its JSON ends", input_name(which));
        if (data)
            return gemm_err_set(err, 400, "bad_request", "input %s has both \"data\" and binary_data_size",
                                input_name(which));
        in->binary = 1;
        in->binary_bytes = (size_t)n; /* checked against the shape once the sizes are sane */
        return 0;
    }
    if (!data)
        return gemm_err_set(err, 400, "bad_data", "input %s has no \"data\" (nor binary_data_size)", input_name(which));
    if (!cJSON_IsArray(data))
        return gemm_err_set(err, 400, "bad_data", "input %s: data is %s; expected an array of numbers (row-major)",
                            input_name(which), type_name(data));
    in->data = data;
    in->nested = data->child && cJSON_IsArray(data->child);
    return 0;
}

/* The data array's layout against the (sane) shape. */
static int check_data(const gemm_v2_input *in, int which, gemm_err *err)
{
    const cJSON *data = in->data;
    if (!in->nested) {
        uint64_t n = array_len(data);
        if (n != in->rows * in->cols)
            return gemm_err_set(err, 400, "bad_data", "input %s: data has %llu elements but shape [%llu,%llu] needs %llu",
                                input_name(which), (unsigned long long)n, (unsigned long long)in->rows,
                                (unsigned long long)in->cols, (unsigned long long)(in->rows * in->cols));
        return 0;
    }
    uint64_t i = 0;
    for (const cJSON *row = data->child; row; row = row->next, i++) {
        if (!cJSON_IsArray(row))
            return gemm_err_set(err, 400, "bad_data", "input %s: data[%llu] is %s; nested data is an array of rows",
                                input_name(which), (unsigned long long)i, type_name(row));
        uint64_t n = array_len(row);
        if (n != in->cols)
            return gemm_err_set(err, 400, "bad_data", "input %s: data[%llu] has %llu elements but shape [%llu,%llu] "
                                "has rows of %llu", input_name(which), (unsigned long long)i, (unsigned long long)n,
                                (unsigned long long)in->rows, (unsigned long long)in->cols,
                                (unsigned long long)in->cols);
    }
    if (i != in->rows)
        return gemm_err_set(err, 400, "bad_data", "input %s: data has %llu rows but shape [%llu,%llu] needs %llu",
                            input_name(which), (unsigned long long)i, (unsigned long long)in->rows,
                            (unsigned long long)in->cols, (unsigned long long)in->rows);
    return 0;
}

/* "outputs": only C, as binary or JSON. */
static int parse_outputs(const cJSON *root, int binary_default, gemm_v2_request *r, gemm_err *err)
{
    char w[48];
    const cJSON *outs = cJSON_GetObjectItemCaseSensitive(root, "outputs");
    r->binary_output = binary_default;
    if (!outs) return 0;
    if (!cJSON_IsArray(outs))
        return gemm_err_set(err, 400, "bad_request", "\"outputs\" is %s; expected an array", type_name(outs));
    int seen = 0;
    size_t pos = 0;
    for (const cJSON *o = outs->child; o; o = o->next, pos++) {
        if (!cJSON_IsObject(o))
            return gemm_err_set(err, 400, "bad_request", "outputs[%zu] is %s; expected an object with a name", pos,
                                type_name(o));
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
        if (!cJSON_IsString(name))
            return gemm_err_set(err, 400, "bad_request", "outputs[%zu].name is %s; expected \"C\"", pos,
                                type_name(name));
        if (strcmp(name->valuestring, "C") != 0)
            return gemm_err_set(err, 400, "unknown_output",
                                "unexpected inference output '%s' for model '" GEMM_V2_MODEL "'; its output is C",
                                shown(name->valuestring, w, sizeof w));
        if (seen++) return gemm_err_set(err, 400, "bad_request", "output C is asked for twice");
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(o, "parameters");
        if (!params) continue;
        if (!cJSON_IsObject(params))
            return gemm_err_set(err, 400, "bad_parameter", "output C: parameters is %s; expected an object",
                                type_name(params));
        if (cJSON_GetObjectItemCaseSensitive(params, "shared_memory_region"))
            return gemm_err_set(err, 400, "unsupported",
                                "output C: shared memory is not supported by this server; C comes in the answer");
        if (cJSON_GetObjectItemCaseSensitive(params, "classification"))
            return gemm_err_set(err, 400, "unsupported", "output C: classification is not supported by model '"
                                GEMM_V2_MODEL "'");
        const cJSON *bd = cJSON_GetObjectItemCaseSensitive(params, "binary_data");
        if (bd) {
            if (!cJSON_IsBool(bd))
                return gemm_err_set(err, 400, "bad_parameter",
                                    "output C: parameters.binary_data is %s; expected true or false", type_name(bd));
            r->binary_output = cJSON_IsTrue(bd);
        }
    }
    return 0;
}

int gemm_v2_parse_request(const char *json, size_t len, int binary_ok, const gemm_limits *lim, gemm_v2_request *r,
                          gemm_err *err)
{
    const char *end = NULL;
    if (!json || len == 0)
        return gemm_err_set(err, 400, "bad_json", "the inference request is empty; expected a JSON object with \"inputs\"");
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root) {
        size_t off = (end && end >= json && end <= json + len) ? (size_t)(end - json) : 0;
        return gemm_err_set(err, 400, "bad_json", "the inference request is not valid JSON (at byte %zu)%s", off,
                            binary_ok ? "; is Inference-Header-Content-Length right?" : "");
    }
    r->root = root;
    size_t off = (size_t)(end - json);
    while (off < len && (json[off] == ' ' || json[off] == '\t' || json[off] == '\n' || json[off] == '\r')) off++;
    if (off < len)
        return gemm_err_set(err, 400, "bad_json", "unexpected data after the JSON object at byte %zu%s", off,
                            binary_ok ? "" : " (binary tensor data needs the Inference-Header-Content-Length header)");
    if (!cJSON_IsObject(root))
        return gemm_err_set(err, 400, "bad_json", "the inference request is %s; expected a JSON object",
                            type_name(root));

    const cJSON *id = cJSON_GetObjectItemCaseSensitive(root, "id");
    if (id) {
        if (!cJSON_IsString(id))
            return gemm_err_set(err, 400, "bad_request", "\"id\" is %s; expected a string", type_name(id));
        if (strlen(id->valuestring) > GEMM_V2_ID_MAX)
            return gemm_err_set(err, 400, "bad_request", "\"id\" is longer than %d bytes", GEMM_V2_ID_MAX);
        r->id = gemm_v2_utf8_dup(id->valuestring);
        if (!r->id) return gemm_err_set(err, 503, "out_of_memory", "cannot copy the request id now");
    }
    int binary_default;
    if (request_parameters(root, r, &binary_default, err) != 0) return -1;

    const cJSON *inputs = cJSON_GetObjectItemCaseSensitive(root, "inputs");
    if (!cJSON_IsArray(inputs))
        return gemm_err_set(err, 400, "bad_request",
                            "\"inputs\" is %s; expected an array of the input tensors A and B", type_name(inputs));
    int seen[2] = {0, 0};
    gemm_dtype dts[2] = {GEMM_DTYPE_INVALID, GEMM_DTYPE_INVALID};
    size_t pos = 0;
    for (const cJSON *t = inputs->child; t; t = t->next, pos++)
        if (parse_input(t, pos, binary_ok, r, seen, dts, err) != 0) return -1;
    if (!seen[0] || !seen[1])
        return gemm_err_set(err, 400, "missing_input", "expected 2 inputs (A and B) but got %d; missing %s",
                            seen[0] + seen[1], !seen[0] && !seen[1] ? "A and B" : (!seen[0] ? "A" : "B"));
    if (dts[0] != dts[1])
        return gemm_err_set(err, 400, "dtype_mismatch", "A is %s but B is %s; send both in one datatype",
                            gemm_v2_dtype_name(dts[0]), gemm_v2_dtype_name(dts[1]));
    r->dtype = dts[0];
    if (parse_outputs(root, binary_default, r, err) != 0) return -1;

    if (gemm_check_product(r->in[0].rows, r->in[0].cols, r->in[1].rows, r->in[1].cols, r->dtype, lim, err) != 0)
        return -1;
    for (int i = 0; i < 2; i++) {
        gemm_v2_input *in = &r->in[i];
        if (in->binary) {
            size_t want;
            if (!gemm_matrix_bytes(in->rows, in->cols, r->dtype, &want))
                return gemm_err_set(err, 413, "too_large", "input %s's byte size overflows", input_name(i));
            if (in->binary_bytes != want)
                return gemm_err_set(err, 400, "bad_binary_size",
                                    "input %s: binary_data_size is %llu but shape [%llu,%llu] of %s needs %zu bytes",
                                    input_name(i), (unsigned long long)in->binary_bytes, (unsigned long long)in->rows,
                                    (unsigned long long)in->cols, gemm_v2_dtype_name(r->dtype), want);
        } else if (check_data(in, i, err) != 0) {
            return -1;
        }
    }
    return 0;
}

/* ---- JSON tensor data ------------------------------------------------------------- */

static int store(const cJSON *e, gemm_dtype d, void *dst, size_t idx, int which, gemm_err *err)
{
    if (!cJSON_IsNumber(e))
        return gemm_err_set(err, 400, "bad_data", "input %s: element %zu is %s; expected a number", input_name(which),
                            idx, type_name(e));
    double v = e->valuedouble;
    switch (d) {
    case GEMM_DTYPE_F32:
        if (!(fabs(v) <= FLT_MAX))
            return gemm_err_set(err, 400, "bad_data", "input %s: element %zu = %.17g is beyond FP32's range",
                                input_name(which), idx, v);
        ((float *)dst)[idx] = (float)v;
        return 0;
    case GEMM_DTYPE_F64:
        if (!isfinite(v))
            return gemm_err_set(err, 400, "bad_data", "input %s: element %zu is beyond FP64's range", input_name(which),
                                idx);
        ((double *)dst)[idx] = v;
        return 0;
    default:
        if (!(v >= -2147483648.0 && v <= 2147483647.0) || v != floor(v))
            return gemm_err_set(err, 400, "bad_data",
                                "input %s: element %zu = %.17g is not an INT32 (integers from -2147483648 to "
                                "2147483647)", input_name(which), idx, v);
        ((int32_t *)dst)[idx] = (int32_t)v;
        return 0;
    }
}

int gemm_v2_fill_input(const gemm_v2_request *r, int which, void *dst, gemm_err *err)
{
    const gemm_v2_input *in = &r->in[which];
    const cJSON *data = in->data;
    if (in->binary || !data)
        return gemm_err_set(err, 500, "internal_error", "input %s has no JSON data to convert", input_name(which));
    size_t idx = 0;
    if (!in->nested) {
        for (const cJSON *e = data->child; e; e = e->next, idx++)
            if (store(e, r->dtype, dst, idx, which, err)) return -1;
        return 0;
    }
    for (const cJSON *row = data->child; row; row = row->next)
        for (const cJSON *e = row->child; e; e = e->next, idx++)
            if (store(e, r->dtype, dst, idx, which, err)) return -1;
    return 0;
}

/* ---- answers ---------------------------------------------------------------------- */

uint64_t gemm_v2_json_bytes_bound(uint64_t rows, uint64_t cols, gemm_dtype d)
{
    /* Widest text of one element and its comma: float64 "-1.2345678901234567e-308,". */
    uint64_t per = d == GEMM_DTYPE_F64 ? 26 : d == GEMM_DTYPE_F32 ? 17 : 12;
    if (rows && cols > UINT64_MAX / rows) return UINT64_MAX;
    uint64_t n = rows * cols;
    return n > (UINT64_MAX - 256) / per ? UINT64_MAX : n * per + 256;
}

void gemm_v2_write_output(gemm_buf *b, const char *name, const gemm_matrix *c, int binary)
{
    gemm_buf_puts(b, "{\"name\":");
    gemm_buf_json_string(b, name);
    gemm_buf_puts(b, ",\"datatype\":");
    gemm_buf_json_string(b, gemm_v2_dtype_name(c->dtype));
    gemm_buf_printf(b, ",\"shape\":[%llu,%llu]", (unsigned long long)c->rows, (unsigned long long)c->cols);
    if (binary) {
        size_t bytes = 0;
        gemm_matrix_bytes(c->rows, c->cols, c->dtype, &bytes);
        gemm_buf_printf(b, ",\"parameters\":{\"binary_data_size\":%zu}}", bytes);
        return;
    }
    gemm_buf_puts(b, ",\"data\":");
    /* Flat, row-major: C's elements are the one row of a 1 x (rows * cols) matrix, whose
     * JSON "[[...]]" loses its outer brackets. */
    size_t start = b->len;
    gemm_matrix flat = {.rows = 1, .cols = c->rows * c->cols, .dtype = c->dtype, .data = c->data};
    gemm_json_write_matrix(b, &flat);
    if (!b->failed && b->len >= start + 4 && b->data[start] == '[' && b->data[start + 1] == '[') {
        memmove(b->data + start, b->data + start + 1, b->len - start - 2);
        b->len -= 2;
        b->data[b->len] = '\0';
    }
    gemm_buf_puts(b, "}");
}
