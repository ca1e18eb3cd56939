/* v2_codec.c - Open Inference Protocol (KServe v2) request headers and output tensors. */
#include "v2_codec.h"
#include "gemm_half.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_number.h"

/* ---- datatypes -------------------------------------------------------------- */

int gemm_v2_dtype_from_name(const char *s, gemm_dtype *out)
{
    static const char *const others[] = {"BOOL", "UINT8", "UINT16", "UINT32", "UINT64",
                                         "INT8", "INT16", "INT64",  "BYTES"};
    for (int d = 0; s && d < GEMM_DTYPE_COUNT; d++)
        if (strcmp(s, gemm_dtypes[d].v2) == 0) return *out = (gemm_dtype)d, 0; /* caseful */
    for (size_t i = 0; s && i < sizeof others / sizeof others[0]; i++)
        if (strcmp(s, others[i]) == 0) return -1;
    return -2;
}

const char *gemm_v2_dtype_name(gemm_dtype d) { return d >= 0 && d < GEMM_DTYPE_COUNT ? gemm_dtypes[d].v2 : ""; }

/* ---- small helpers ------------------------------------------------------------ */

static const char *type_name(const cJSON *v)
{
    return !v ? "missing"
               : gemm_json_type_name(cJSON_IsString(v)   ? '"'
                                     : cJSON_IsArray(v)  ? '['
                                     : cJSON_IsObject(v) ? '{'
                                     : cJSON_IsBool(v)   ? 't'
                                     : cJSON_IsNull(v)   ? 'n'
                                                         : '0');
}

static int is_count(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v) || !gemm_f64_is_count(v->valuedouble)) return 0;
    *out = (uint64_t)v->valuedouble;
    return 1;
}

static const char *input_name(int which) { return which == 0 ? "A" : "B"; }

/* ---- request ------------------------------------------------------------------- */

void gemm_v2_request_init(gemm_v2_request *r)
{
    *r = (gemm_v2_request){.dtype = GEMM_DTYPE_INVALID, .order = {0, 1}};
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

/* The parameter key of params (NULL: none) into *out, when it is given: true or false. */
static int bool_param(const cJSON *params, const char *who, const char *key, int *out, gemm_err *err)
{
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(params, key);
    if (b && !cJSON_IsBool(b))
        return gemm_err_set(err, 400, "bad_parameter", "%sparameters.%s is %s; expected true or false", who, key,
                            type_name(b));
    if (b) *out = cJSON_IsTrue(b);
    return 0;
}

/* The request's "parameters": the options whose door is v2 (options.h; out_dtype takes the
 * datatype names, FP32 ...), and the protocol's binary_data_output. Other parameters are
 * the business of other models and servers; they are ignored. */
static int request_parameters(const cJSON *root, gemm_v2_request *r, int *binary_default, gemm_err *err)
{
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(root, "parameters");
    *binary_default = 0;
    if (!params) return 0;
    if (!cJSON_IsObject(params))
        return gemm_err_set(err, 400, "bad_parameter", "\"parameters\" is %s; expected an object", type_name(params));
    for (const cJSON *p = params->child; p; p = p->next) {
        const gemm_option *d = gemm_option_find(p->string, strlen(p->string), GEMM_DOOR_V2);
        gemm_opt_value v = {.kind = GEMM_VAL_OTHER, .type_name = type_name(p)};
        if (!d) continue;
        if (cJSON_IsString(p))
            v = (gemm_opt_value){.kind = GEMM_VAL_TEXT, .text = p->valuestring, .len = strlen(p->valuestring)};
        else if (cJSON_IsNumber(p)) v = (gemm_opt_value){.kind = GEMM_VAL_NUMBER, .number = p->valuedouble};
        else if (cJSON_IsBool(p)) v = (gemm_opt_value){.kind = GEMM_VAL_BOOL, .boolean = cJSON_IsTrue(p)};
        if (gemm_option_apply(&r->opt, d, &v, err) < 0) {
            err->status = 400; /* the protocol's status for a request that cannot run */
            return -1;
        }
    }
    return bool_param(params, "", "binary_data_output", binary_default, err);
}

/* The "parameters" of tensor t (*p NULL when absent): an object, not naming shared memory. */
static int tensor_params(const cJSON *t, const char *who, const char *instead, const cJSON **p, gemm_err *err)
{
    *p = cJSON_GetObjectItemCaseSensitive(t, "parameters");
    if (*p && !cJSON_IsObject(*p))
        return gemm_err_set(err, 400, "bad_parameter", "%s: parameters is %s; expected an object", who, type_name(*p));
    if (*p && cJSON_GetObjectItemCaseSensitive(*p, "shared_memory_region"))
        return gemm_err_set(err, 400, "unsupported", "%s: shared memory is not supported by this server; %s", who,
                            instead);
    return 0;
}

/* One entry of "inputs": name, datatype, shape, binary_data_size or data. */
static int parse_input(const cJSON *t, size_t pos, int binary_ok, const gemm_v2_input spans[2], gemm_v2_request *r,
                       int seen[2], gemm_dtype dts[2], gemm_err *err)
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
                            gemm_shown(name->valuestring, strlen(name->valuestring), w, sizeof w));
    if (seen[which])
        return gemm_err_set(err, 400, "duplicate_input", "input %s is given twice", input_name(which));
    seen[which] = 1;
    r->order[seen[0] + seen[1] - 1] = which;
    gemm_v2_input *in = &r->in[which];

    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "datatype");
    if (!cJSON_IsString(dt))
        return gemm_err_set(err, 400, "bad_datatype", "input %s: datatype is %s; expected FP32, FP64, INT32, FP16 or BF16",
                            input_name(which), type_name(dt));
    int rc = gemm_v2_dtype_from_name(dt->valuestring, &dts[which]);
    gemm_shown(dt->valuestring, strlen(dt->valuestring), w, sizeof w);
    if (rc != 0)
        return gemm_err_set(err, 400, "bad_datatype",
                            rc == -1 ? "input %s: datatype %s is not supported by model '" GEMM_V2_MODEL
                                       "'; use FP32, FP64, INT32, FP16 or BF16"
                                     : "input %s: unknown datatype '%s'; model '" GEMM_V2_MODEL
                                       "' takes FP32, FP64, INT32, FP16 or BF16",
                            input_name(which), w);

    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(t, "shape");
    if (!cJSON_IsArray(shape))
        return gemm_err_set(err, 400, "bad_shape", "input %s: shape is %s; expected [rows, cols]", input_name(which),
                            type_name(shape));
    int ndim = cJSON_GetArraySize(shape);
    if (ndim != 2)
        return gemm_err_set(err, 400, "bad_shape", "input %s: shape has %d dimensions; model '" GEMM_V2_MODEL
                            "' takes matrices, shape [rows, cols]", input_name(which), ndim);
    if (!is_count(shape->child, &in->rows) || !is_count(shape->child->next, &in->cols))
        return gemm_err_set(err, 400, "bad_shape", "input %s: shape must hold two non-negative integers",
                            input_name(which));

    const cJSON *params;
    if (tensor_params(t, which ? "input B" : "input A", "send the data in the body", &params, err)) return -1;
    const cJSON *bds = cJSON_GetObjectItemCaseSensitive(params, "binary_data_size");
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
    if (!cJSON_IsArray(data) || pos >= 2 || !spans[pos].data)
        return gemm_err_set(err, 400, "bad_data", "input %s: data is %s; expected an array of numbers (row-major)",
                            input_name(which), type_name(data));
    /* The array in the tree is the empty stand-in for the text the first pass measured. */
    gemm_v2_input keep = *in;
    *in = spans[pos];
    in->rows = keep.rows;
    in->cols = keep.cols;
    return 0;
}

/* The data array's layout (measured by the first pass) against the (sane) shape. */
static int check_data(const gemm_v2_input *in, int which, gemm_err *err)
{
    /* the first row that is not an array or not of cols values */
    uint64_t bad_len_row = in->row_len != in->cols ? 1 : in->odd_row, bad_len = in->row_len != in->cols ? in->row_len
                                                                                                         : in->odd_len;
    if (in->nested && in->not_row && (!bad_len_row || in->not_row < bad_len_row))
        return gemm_err_set(err, 400, "bad_data", "input %s: data[%llu] is %s; nested data is an array of rows",
                            input_name(which), (unsigned long long)(in->not_row - 1), gemm_json_type_name(in->not_row_type));
    if (in->nested && bad_len_row)
        return gemm_err_set(err, 400, "bad_data", "input %s: data[%llu] has %llu elements but shape [%llu,%llu] "
                            "has rows of %llu", input_name(which), (unsigned long long)(bad_len_row - 1),
                            (unsigned long long)bad_len, (unsigned long long)in->rows, (unsigned long long)in->cols,
                            (unsigned long long)in->cols);
    uint64_t need = in->nested ? in->rows : in->rows * in->cols;
    if (in->count != need)
        return gemm_err_set(err, 400, "bad_data", "input %s: data has %llu %s but shape [%llu,%llu] needs %llu",
                            input_name(which), (unsigned long long)in->count, in->nested ? "rows" : "elements",
                            (unsigned long long)in->rows, (unsigned long long)in->cols, (unsigned long long)need);
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
                                gemm_shown(name->valuestring, strlen(name->valuestring), w, sizeof w));
        if (seen++) return gemm_err_set(err, 400, "bad_request", "output C is asked for twice");
        const cJSON *params;
        if (tensor_params(o, "output C", "C comes in the answer", &params, err)) return -1;
        if (cJSON_GetObjectItemCaseSensitive(params, "classification"))
            return gemm_err_set(err, 400, "unsupported", "output C: classification is not supported by model '"
                                GEMM_V2_MODEL "'");
        if (bool_param(params, "output C: ", "binary_data", &r->binary_output, err)) return -1;
    }
    return 0;
}

/* ---- the first pass -------------------------------------------------------------
 * Walks the whole header once, allocating nothing: checks its syntax, finds the "data"
 * array of each of the first two inputs (the first "data" key of inputs[0] and inputs[1]
 * of the first "inputs" key, keys compared as cJSON decodes them), checks that array
 * strictly (RFC 8259 numbers) and measures it, and counts what cJSON will allocate for
 * everything else. Outside those arrays it is as lenient as cJSON (which parses that part
 * next), so that both agree on where every value ends. */

#define V2_MAX_DEPTH 1000   /* cJSON's nesting limit */
#define V2_ALLOC_SLACK 32   /* a malloc'd block takes at most its size and this much more */

enum { V2_SKIP, V2_ROOT, V2_INPUTS, V2_INPUT, V2_PARAMS, V2_DATA, V2_ROW };

typedef struct {
    const char *s;
    size_t len, p;
    int depth;
    size_t fail_at;          /* where the syntax broke */
    int str_nul;             /* the last string held U+0000 */
    int params_nul;          /* a key or string of "parameters" does (cJSON would cut it there) */
    int seen_inputs, seen_params;
    uint64_t nodes, str_bytes;
    gemm_v2_input span[2];   /* data of inputs[0] and inputs[1] (data NULL: not an array) */
} v2_scan;

static int is_ws(char c) { return (unsigned char)c <= 32; }
static void skip_ws(v2_scan *sc)
{
    while (sc->p < sc->len && is_ws(sc->s[sc->p])) sc->p++;
}
static int bad(v2_scan *sc)
{
    sc->fail_at = sc->p;
    return -1;
}
static int at(const v2_scan *sc, char c) { return sc->p < sc->len && sc->s[sc->p] == c; }

static int hex4(const char *p, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0, h; i < 4; i++, v = v << 4 | (unsigned)h)
        if ((h = gemm_hex_digit(p[i])) < 0) return -1;
    *out = v;
    return 0;
}

/* A string at p: moves past it. key (cap bytes) gets its text as cJSON decodes it, up to a
 * NUL (a C string ends there), or "" when it is longer or not ASCII: only short ASCII keys
 * are looked for. Bad escapes are cJSON's to refuse. */
static int scan_string(v2_scan *sc, char *key, size_t cap)
{
    size_t p = sc->p + 1, n = 0;
    int over = 0, cut = 0;
    sc->str_nul = 0;
    while (p < sc->len && sc->s[p] != '"') {
        unsigned cp = (unsigned char)sc->s[p];
        size_t adv = 1;
        if (cp >= 0x80) { /* UTF-8 only (RFC 8259 section 8.1): cJSON does not look */
            unsigned char u[5] = {0};
            memcpy(u, sc->s + p, sc->len - p < 4 ? sc->len - p : 4);
            if ((adv = gemm_utf8_seq(u)) == 0) break;
        } else if (cp == '\\') {
            static const char from[] = "bfnrt\"\\/", to[] = "\b\f\n\r\t\"\\/";
            if (p + 1 >= sc->len) break;
            const char *k = sc->s[p + 1] ? strchr(from, sc->s[p + 1]) : NULL;
            adv = 2;
            cp = k ? (unsigned char)to[k - from] : 0x80; /* 0x80: not a key's character */
            if (sc->s[p + 1] == 'u' && p + 6 <= sc->len && hex4(sc->s + p + 2, &cp) == 0) adv = 6;
        }
        sc->str_nul |= cp == 0;
        if (key && !cut) {
            if (cp == 0) cut = 1;
            else if (cp < 0x80 && n + 1 < cap) key[n++] = (char)cp;
            else over = 1;
        }
        p += adv;
    }
    if (p >= sc->len || sc->s[p] != '"') {
        sc->p = p;
        return bad(sc);
    }
    sc->str_bytes += (p - sc->p) + V2_ALLOC_SLACK;
    sc->p = p + 1;
    if (key) key[over ? 0 : n] = '\0';
    return 0;
}

static int scan_value(v2_scan *sc, int role, int pos);

static int scan_literal(v2_scan *sc, const char *lit)
{
    size_t n = strlen(lit);
    if (sc->len - sc->p < n || memcmp(sc->s + sc->p, lit, n) != 0) return bad(sc);
    sc->p += n;
    return 0;
}

static int is_number_start(char c) { return c == '-' || gemm_num_is_digit(c); }

/* One value inside a data array: a number (strict: RFC 8259, at most GEMM_JSON_NUMBER_MAX
 * characters) or anything else (a bad_data later). */
static int scan_element(v2_scan *sc)
{
    if (sc->p >= sc->len || !is_number_start(sc->s[sc->p])) return scan_value(sc, V2_SKIP, 0);
    gemm_decimal d;
    ptrdiff_t r = gemm_json_scan_number(sc->s + sc->p, sc->s + sc->len, 1, &d);
    if (r <= 0) {
        sc->p += (size_t)(-r) - 1;
        return bad(sc);
    }
    if (r > GEMM_JSON_NUMBER_MAX) return bad(sc);
    sc->p += (size_t)r;
    return 0;
}

/* Opens a container at p: 1 when it closes at once (close), 0 when a value follows (then
 * the caller's loop: after each value, ',' or close), -1. */
static int open_container(v2_scan *sc, char close)
{
    if (++sc->depth > V2_MAX_DEPTH) return bad(sc);
    sc->p++;
    skip_ws(sc);
    if (!at(sc, close)) return 0;
    sc->p++;
    sc->depth--;
    return 1;
}

/* ',' (1: another value follows) or the closing bracket (0); -1 otherwise. */
static int next_or_close(v2_scan *sc, char close)
{
    skip_ws(sc);
    if (at(sc, ',')) {
        sc->p++;
        skip_ws(sc);
        return 1;
    }
    if (at(sc, close)) {
        sc->p++;
        sc->depth--;
        return 0;
    }
    return bad(sc);
}

static int scan_array(v2_scan *sc, int role, uint64_t *n, gemm_v2_input *d);

/* Entry i of an array of this role; d: the data array being measured (V2_DATA). */
static int scan_entry(v2_scan *sc, int role, uint64_t i, gemm_v2_input *d)
{
    if (role == V2_ROW) return scan_element(sc);
    if (role != V2_DATA) return scan_value(sc, role == V2_INPUTS ? V2_INPUT : V2_SKIP, i < 2 ? (int)i : 2);
    if (i == 0) d->nested = at(sc, '[');
    if (d->nested && at(sc, '[')) {
        uint64_t n;
        if (scan_array(sc, V2_ROW, &n, NULL)) return -1;
        if (i == 0) d->row_len = n;
        else if (n != d->row_len && !d->odd_row) {
            d->odd_row = i + 1;
            d->odd_len = n;
        }
        return 0;
    }
    if (d->nested && !d->not_row) {
        d->not_row = i + 1;
        d->not_row_type = sc->p < sc->len ? sc->s[sc->p] : 0; /* the text may end here */
    }
    return scan_element(sc);
}

/* An array at p: its entries (each as scan_entry scans it) counted into *n. */
static int scan_array(v2_scan *sc, int role, uint64_t *n, gemm_v2_input *d)
{
    int e = open_container(sc, ']');
    *n = 0;
    if (e) return e < 0 ? -1 : 0;
    for (int more = 1; more; (*n)++) {
        if (scan_entry(sc, role, *n, d)) return -1;
        if ((more = next_or_close(sc, ']')) < 0) return -1;
    }
    return 0;
}

static int scan_object(v2_scan *sc, int role, int pos)
{
    int seen_data = 0, e = open_container(sc, '}');
    if (e) return e < 0 ? -1 : 0;
    for (;;) {
        char key[12];
        if (!at(sc, '"')) return bad(sc);
        if (scan_string(sc, key, sizeof key)) return -1;
        skip_ws(sc);
        if (!at(sc, ':')) return bad(sc);
        sc->p++;
        skip_ws(sc);
        int vrole = V2_SKIP, done = 0;
        sc->params_nul |= role == V2_PARAMS && sc->str_nul;
        if (role == V2_ROOT && !sc->seen_inputs && strcmp(key, "inputs") == 0) {
            sc->seen_inputs = 1;
            vrole = V2_INPUTS;
        } else if (role == V2_ROOT && !sc->seen_params && strcmp(key, "parameters") == 0) {
            sc->seen_params = 1;
            vrole = V2_PARAMS;
        } else if (role == V2_INPUT && !seen_data && strcmp(key, "data") == 0) {
            seen_data = 1;
            if (pos < 2 && at(sc, '[')) { /* measured, its text noted; the tree gets an empty one */
                gemm_v2_input *d = &sc->span[pos];
                memset(d, 0, sizeof *d);
                size_t start = sc->p;
                if (scan_array(sc, V2_DATA, &d->count, d)) return -1;
                d->data = sc->s + start;
                d->data_len = sc->p - start;
                sc->nodes++; /* the stand-in */
                done = 1;
            }
        }
        int string = at(sc, '"');
        if (!done && scan_value(sc, vrole, 0)) return -1;
        sc->params_nul |= role == V2_PARAMS && string && sc->str_nul;
        int k = next_or_close(sc, '}');
        if (k <= 0) return k;
    }
}

static int scan_value(v2_scan *sc, int role, int pos)
{
    if (sc->p >= sc->len) return bad(sc);
    char c = sc->s[sc->p];
    sc->nodes++;
    switch (c) {
    case '{': return scan_object(sc, role, pos);
    case '[': {
        uint64_t n;
        return scan_array(sc, role, &n, NULL);
    }
    case '"': return scan_string(sc, NULL, 0);
    case 't': return scan_literal(sc, "true");
    case 'f': return scan_literal(sc, "false");
    case 'n': return scan_literal(sc, "null");
    default:
        if (!is_number_start(c)) return bad(sc);
        /* as cJSON reads a number: these characters, then strtod decides */
        while (sc->p < sc->len && (gemm_num_is_digit(sc->s[sc->p]) || strchr("+-eE.", sc->s[sc->p]) != NULL) &&
               sc->s[sc->p] != '\0')
            sc->p++;
        return 0;
    }
}

/* ---- the request ----------------------------------------------------------------- */

/* The header from root_at to where the first pass ended, with each data array it measured
 * replaced by [] (skel_len bytes in all), parsed into a tree. NULL with *fail_at where in the
 * request cJSON stopped, or SIZE_MAX when memory ran out. */
static cJSON *parse_rest(const v2_scan *sc, size_t root_at, size_t skel_len, size_t *fail_at)
{
    const gemm_v2_input *sp = sc->span; /* inputs[0]'s, inputs[1]'s: in the order they come */
    char *skel = malloc(skel_len + 1);
    *fail_at = SIZE_MAX;
    if (!skel) return NULL;
    const char *from = sc->s + root_at;
    size_t k = 0;
    for (int i = 0; i < 3; i++) {
        const char *to = i < 2 ? sp[i].data : sc->s + sc->p;
        if (!to) continue;
        memcpy(skel + k, from, (size_t)(to - from));
        k += (size_t)(to - from);
        if (i == 2) break;
        memcpy(skel + k, "[]", 2);
        k += 2;
        from = to + sp[i].data_len;
    }
    skel[k] = '\0';
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(skel, k, &end, 0);
    if (!root) { /* where that is in the request: past the stand-ins before it */
        size_t in_skel = end && end >= skel && end <= skel + k ? (size_t)(end - skel) : 0, removed = 0;
        *fail_at = root_at + in_skel;
        for (int i = 0; i < 2; i++) {
            if (!sp[i].data) continue;
            if (in_skel < (size_t)(sp[i].data - sc->s) - root_at - removed + 2) break; /* before its [] ends */
            *fail_at += sp[i].data_len - 2;
            removed += sp[i].data_len - 2;
        }
    }
    free(skel);
    return root;
}

static int not_json(gemm_err *err, size_t off, int binary_ok)
{
    return gemm_err_set(err, 400, "bad_json", "the inference request is not valid JSON (at byte %zu)%s", off,
                        binary_ok ? "; is Inference-Header-Content-Length right?" : "");
}

int gemm_v2_parse_request_admitted(const char *json, size_t len, int binary_ok, const gemm_limits *lim,
                                   gemm_v2_admit_fn admit, void *user, gemm_v2_request *r, gemm_err *err)
{
    if (!json || len == 0)
        return gemm_err_set(err, 400, "bad_json", "the inference request is empty; expected a JSON object with \"inputs\"");
    v2_scan sc = {.s = json, .len = len};
    if (len >= 3 && memcmp(json, "\xef\xbb\xbf", 3) == 0) sc.p = 3; /* a byte order mark, as cJSON */
    skip_ws(&sc);
    size_t root_at = sc.p;
    if (scan_value(&sc, V2_ROOT, 0) != 0) return not_json(err, sc.fail_at, binary_ok);
    size_t off = sc.p;
    while (off < len && (json[off] == ' ' || json[off] == '\t' || json[off] == '\n' || json[off] == '\r')) off++;
    if (off < len)
        return gemm_err_set(err, 400, "bad_json", "unexpected data after the JSON object at byte %zu%s", off,
                            binary_ok ? "" : " (binary tensor data needs the Inference-Header-Content-Length header)");
    if (sc.params_nul) /* a C string ends there: "kernel\u0000x" must not read as kernel */
        return gemm_err_set(err, 400, "bad_parameter", "a key or value of \"parameters\" holds U+0000 (NUL)");

    /* The rest: the header with each data array replaced by [], parsed into a tree. */
    size_t cut = 0;
    for (int i = 0; i < 2; i++)
        if (sc.span[i].data) cut += sc.span[i].data_len - 2;
    size_t skel_len = sc.p - root_at - cut;
    uint64_t bound = (uint64_t)skel_len + 1 + V2_ALLOC_SLACK + sc.nodes * (sizeof(cJSON) + V2_ALLOC_SLACK) +
                     sc.str_bytes + GEMM_V2_ID_MAX + 2 * V2_ALLOC_SLACK;
    if (admit && admit(user, bound, err) != 0) return -1;
    size_t fail_at;
    cJSON *root = parse_rest(&sc, root_at, skel_len, &fail_at);
    if (!root && fail_at == SIZE_MAX) return gemm_err_set(err, 503, "out_of_memory", "cannot parse the inference request now");
    if (!root) return not_json(err, fail_at, binary_ok);
    r->root = root;
    if (!cJSON_IsObject(root))
        return gemm_err_set(err, 400, "bad_json", "the inference request is %s; expected a JSON object",
                            type_name(root));

    const cJSON *id = cJSON_GetObjectItemCaseSensitive(root, "id");
    if (id) {
        if (!cJSON_IsString(id))
            return gemm_err_set(err, 400, "bad_request", "\"id\" is %s; expected a string", type_name(id));
        if (strlen(id->valuestring) > GEMM_V2_ID_MAX)
            return gemm_err_set(err, 400, "bad_request", "\"id\" is longer than %d bytes", GEMM_V2_ID_MAX);
        r->id = strdup(id->valuestring);
        if (!r->id) return gemm_err_set(err, 503, "out_of_memory", "cannot copy the request id now");
        for (unsigned char *p = (unsigned char *)r->id; *p;) { /* bytes that are not valid UTF-8 become '?' */
            size_t n = gemm_utf8_seq(p);
            if (n) p += n;
            else *p++ = '?';
        }
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
        if (parse_input(t, pos, binary_ok, sc.span, r, seen, dts, err) != 0) return -1;
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

/* The number at *p (checked by the first pass) into element idx, at dst. */
static int store(const char **p, const char *end, gemm_dtype dt, void *dst, size_t idx, int which, gemm_err *err)
{
    if (!is_number_start(**p))
        return gemm_err_set(err, 400, "bad_data", "input %s: element %zu is %s; expected a number", input_name(which),
                            idx, gemm_json_type_name(**p));
    gemm_decimal d;
    ptrdiff_t n = gemm_json_scan_number(*p, end, 1, &d);
    if (n <= 0) return gemm_err_set(err, 400, "bad_data", "input %s: element %zu is not a number", input_name(which), idx);
    *p += n;
    if (gemm_decimal_store(&d, dt, dst) == 0) return 0; /* float16 and bfloat16: one rounding, as on /v1 */
    if (dt == GEMM_DTYPE_F64)
        return gemm_err_set(err, 400, "bad_data", "input %s: element %zu is beyond FP64's range", input_name(which), idx);
    if (dt == GEMM_DTYPE_I32)
        return gemm_err_set(err, 400, "bad_data",
                            "input %s: element %zu = %.17g is not an INT32 (integers from -2147483648 to 2147483647)",
                            input_name(which), idx, gemm_decimal_to_f64(&d));
    return gemm_err_set(err, 400, "bad_data", "input %s: element %zu = %.17g is beyond %s's range", input_name(which),
                        idx, gemm_decimal_to_f64(&d), gemm_v2_dtype_name(dt));
}

int gemm_v2_fill_input(const gemm_v2_request *r, int which, void *dst, gemm_err *err)
{
    const gemm_v2_input *in = &r->in[which];
    if (in->binary || !in->data)
        return gemm_err_set(err, 500, "internal_error", "input %s has no JSON data to convert", input_name(which));
    /* The layout was checked against the shape: the values inside the outer brackets, with
     * the brackets of the rows when nested. */
    const char *p = in->data + 1, *end = in->data + in->data_len - 1;
    size_t idx = 0, total = (size_t)(in->rows * in->cols), es = gemm_dtype_size(r->dtype);
    int row = 0; /* inside a row */
    while (p < end) {
        if (is_ws(*p) || *p == ',') p++;
        else if (in->nested && *p == (row ? ']' : '[')) p++, row = !row;
        else if (idx >= total)
            return gemm_err_set(err, 500, "internal_error", "input %s: more data than checked", input_name(which));
        else if (store(&p, end, r->dtype, (char *)dst + idx * es, idx, which, err)) return -1;
        else idx++;
    }
    if (idx != total)
        return gemm_err_set(err, 500, "internal_error", "input %s: %zu values where %zu were checked", input_name(which),
                            idx, total);
    return 0;
}

/* ---- answers ---------------------------------------------------------------------- */

uint64_t gemm_v2_json_bytes_bound(uint64_t rows, uint64_t cols, gemm_dtype d)
{
    uint64_t per = gemm_json_elem_width(d);
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
