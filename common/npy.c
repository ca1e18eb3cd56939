/* npy.c - NumPy .npy headers (format 1.0, 2.0, 3.0) parsed and written; a streaming
 * reader that copies the array straight into an allocator's buffer. */
#include "npy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "npy.c assumes a little-endian host"
#endif

static const unsigned char npy_magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

/* The fixed prefix: magic, version, header length. Returns 1 with the data offset
 * known, 0 when more bytes are needed, -1 on error. */
static int npy_prefix(const unsigned char *p, size_t len, int *major, int *minor, size_t *hlen_at,
                      size_t *hlen, gemm_err *err)
{
    size_t n = len < 6 ? len : 6;
    if (memcmp(p, npy_magic, n) != 0)
        return gemm_err_set(err, 400, "bad_npy", "not a .npy file (it must start with \\x93NUMPY)");
    if (len < 8) return 0;
    *major = p[6];
    *minor = p[7];
    if ((*major != 1 && *major != 2 && *major != 3) || *minor != 0)
        return gemm_err_set(err, 400, "bad_npy", ".npy format version %d.%d is not supported (1.0, 2.0 and 3.0 are)",
                            *major, *minor);
    *hlen_at = *major == 1 ? 10 : 12;
    if (len < *hlen_at) return 0;
    *hlen = 0;
    for (size_t i = *hlen_at; i-- > 8;) *hlen = *hlen << 8 | p[i]; /* little-endian, 2 or 4 bytes */
    if (*hlen > GEMM_NPY_MAX_HEADER)
        return gemm_err_set(err, 400, "bad_npy", "the .npy header is %zu bytes; at most %d are accepted", *hlen,
                            GEMM_NPY_MAX_HEADER);
    return 1;
}

/* ---- the header dictionary: a Python literal such as
 *      {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }             */

typedef struct {
    const char *p, *end;
} cursor;

static void skip_ws(cursor *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

static int eat(cursor *c, char ch)
{
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 1;
    }
    return 0;
}

/* A quoted Python string without escapes (NumPy never writes any in these keys). */
static int read_str(cursor *c, char *out, size_t cap)
{
    skip_ws(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return -1;
    char q = *c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != q) {
        if (*c->p == '\\' || *c->p == '\n') return -1;
        if (n + 1 < cap) out[n++] = *c->p;
        else return -1;
        c->p++;
    }
    if (c->p >= c->end) return -1;
    c->p++;
    out[n] = '\0';
    return 0;
}

/* Skips one Python literal we do not interpret (a structured descr list). */
static int skip_value(cursor *c)
{
    int depth = 0;
    skip_ws(c);
    while (c->p < c->end) {
        char ch = *c->p;
        if (ch == '\'' || ch == '"') {
            char tmp[256];
            if (read_str(c, tmp, sizeof tmp)) return -1;
            if (depth == 0) return 0;
            continue;
        }
        if (ch == '[' || ch == '(' || ch == '{') depth++;
        else if (ch == ']' || ch == ')' || ch == '}') {
            if (depth == 0) return 0;
            if (--depth == 0) {
                c->p++;
                return 0;
            }
        } else if (ch == ',' && depth == 0) {
            return 0;
        }
        c->p++;
    }
    return -1;
}

enum { SHAPE_MAX = 32 };

/* A tuple of non-negative integers: (), (5,), (3, 4), (3,4,); Python 2's 3L too.
 * Returns the number of dimensions, -1 on syntax error, -2 on overflow. */
static int read_shape(cursor *c, uint64_t *dims)
{
    int nd = 0, overflow = 0;
    if (!eat(c, '(')) return -1;
    for (;;) {
        skip_ws(c);
        if (c->p < c->end && *c->p == ')') {
            c->p++;
            break;
        }
        if (c->p >= c->end || *c->p < '0' || *c->p > '9') return -1;
        uint64_t v = 0;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
            unsigned d = (unsigned)(*c->p - '0');
            if (v > (UINT64_MAX - d) / 10) overflow = 1;
            else v = v * 10 + d;
            c->p++;
        }
        if (c->p < c->end && (*c->p == 'L' || *c->p == 'l')) c->p++;
        if (nd >= SHAPE_MAX) return -1;
        dims[nd++] = v;
        if (eat(c, ',')) continue;
        if (eat(c, ')')) break;
        return -1;
    }
    /* A 1-tuple needs its comma in Python, "(5)" is just 5: be lenient, it is still 1-D. */
    return overflow ? -2 : nd;
}

static int dtype_error(const char *raw, gemm_err *err)
{
    char descr[64];
    gemm_shown(raw, strlen(raw), descr, sizeof descr);
    char order = descr[0];
    const char *t = (order == '<' || order == '>' || order == '=' || order == '|') ? descr + 1 : descr;
    if (t[0] == 'O')
        return gemm_err_set(err, 415, "unsupported_dtype",
                            "object arrays ('%s') are refused: they hold Python objects, not numbers; "
                            "send float32, float64, int32, float16 or bfloat16 (e.g. a.astype('<f8'))", descr);
    if (order == '>' && (strcmp(t, "f4") == 0 || strcmp(t, "f8") == 0 || strcmp(t, "i4") == 0 || strcmp(t, "f2") == 0))
        return gemm_err_set(err, 415, "unsupported_dtype",
                            "the array is big-endian ('%s'); only little-endian is accepted: "
                            "convert it in NumPy with a.astype('<%s')", descr, t);
    if (order == '>')
        return gemm_err_set(err, 415, "unsupported_dtype",
                            "dtype '%s' (big-endian) is not supported; use float32 ('<f4'), float64 ('<f8'), "
                            "int32 ('<i4'), float16 ('<f2') or bfloat16 ('<V2', as ml_dtypes saves it), "
                            "e.g. a.astype('<f8')", descr);
    if (order == '|' && strcmp(t, "V2") == 0)
        return gemm_err_set(err, 415, "unsupported_dtype",
                            "dtype '%s' is an opaque 2-byte type; bfloat16 is taken as '<V2', the form "
                            "np.save writes for an ml_dtypes.bfloat16 array (a.astype(ml_dtypes.bfloat16)); "
                            "the others are float32 ('<f4'), float64 ('<f8'), int32 ('<i4') and float16 ('<f2')",
                            descr);
    return gemm_err_set(err, 415, "unsupported_dtype",
                        "dtype '%s' is not supported; use float32 ('<f4'), float64 ('<f8'), int32 ('<i4'), "
                        "float16 ('<f2') or bfloat16 ('<V2', as ml_dtypes saves it), e.g. a.astype('<f8')", descr);
}

static int parse_dict(const char *text, size_t len, gemm_npy_header *hdr, gemm_err *err)
{
    cursor c = {text, text + len};
    char key[32], descr[64];
    int have_descr = 0, have_fortran = 0, have_shape = 0, structured = 0, shape_nd = 0, shape_ovf = 0;
    uint64_t dims[SHAPE_MAX];

    if (!eat(&c, '{')) return gemm_err_set(err, 400, "bad_npy", "the .npy header is not a dictionary");
    for (;;) {
        if (eat(&c, '}')) break;
        if (read_str(&c, key, sizeof key) || !eat(&c, ':'))
            return gemm_err_set(err, 400, "bad_npy", "the .npy header dictionary is malformed at byte %zu",
                                (size_t)(c.p - text));
        if (strcmp(key, "descr") == 0 && !have_descr) {
            have_descr = 1;
            skip_ws(&c);
            if (c.p < c.end && *c.p == '[') {
                structured = 1;
                if (skip_value(&c)) return gemm_err_set(err, 400, "bad_npy", "the .npy descr is malformed");
            } else if (read_str(&c, descr, sizeof descr)) {
                return gemm_err_set(err, 400, "bad_npy", "the .npy descr must be a string such as '<f4'");
            }
        } else if (strcmp(key, "fortran_order") == 0 && !have_fortran) {
            have_fortran = 1;
            skip_ws(&c);
            size_t left = (size_t)(c.end - c.p);
            hdr->fortran_order = left >= 4 && memcmp(c.p, "True", 4) == 0;
            if (!hdr->fortran_order && !(left >= 5 && memcmp(c.p, "False", 5) == 0))
                return gemm_err_set(err, 400, "bad_npy", "the .npy fortran_order must be True or False");
            c.p += hdr->fortran_order ? 4 : 5;
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            have_shape = 1;
            shape_nd = read_shape(&c, dims);
            if (shape_nd == -1)
                return gemm_err_set(err, 400, "bad_npy", "the .npy shape must be a tuple of integers such as (3, 4)");
            if (shape_nd == -2) shape_ovf = 1;
        } else {
            char shown[32];
            return gemm_err_set(err, 400, "bad_npy", "the .npy header has an unexpected or repeated key '%s'",
                                gemm_shown(key, strlen(key), shown, sizeof shown));
        }
        if (eat(&c, ',')) continue;
        if (eat(&c, '}')) break;
        return gemm_err_set(err, 400, "bad_npy", "the .npy header dictionary is malformed at byte %zu",
                            (size_t)(c.p - text));
    }
    skip_ws(&c);
    if (c.p != c.end)
        return gemm_err_set(err, 400, "bad_npy", "unexpected bytes after the .npy header dictionary");
    if (!have_descr || !have_fortran || !have_shape)
        return gemm_err_set(err, 400, "bad_npy", "the .npy header lacks '%s'",
                            !have_descr ? "descr" : !have_fortran ? "fortran_order" : "shape");
    if (structured)
        return gemm_err_set(err, 415, "unsupported_dtype",
                            "structured arrays are not supported; send a plain float32 ('<f4'), float64 ('<f8') "
                            "or int32 ('<i4') array");
    for (int d = 0; (descr[0] == '<' || descr[0] == '=') && d < GEMM_DTYPE_COUNT; d++) /* hdr->dtype was invalid */
        if (strcmp(descr + 1, gemm_dtypes[d].npy + 1) == 0) hdr->dtype = (gemm_dtype)d;
    if (hdr->dtype == GEMM_DTYPE_INVALID) return dtype_error(descr, err);
    if (shape_ovf)
        return gemm_err_set(err, 413, "too_large", "the .npy shape has a dimension too large to represent");
    if (shape_nd != 2 && shape_nd != 3)
        return gemm_err_set(err, 422, "bad_shape",
                            "the .npy array is %d-D; it must be 2-D (a matrix) or 3-D (a stack of "
                            "matrices)", shape_nd);
    if (shape_nd == 3 && hdr->fortran_order)
        return gemm_err_set(err, 422, "bad_shape",
                            "3-D .npy arrays must be in C order (fortran_order False); save it "
                            "with numpy.ascontiguousarray");
    hdr->ndim = shape_nd;
    hdr->batch = shape_nd == 3 ? dims[0] : 0;
    hdr->rows = dims[shape_nd - 2];
    hdr->cols = dims[shape_nd - 1];
    return 0;
}

int gemm_npy_parse_header(const void *buf, size_t len, gemm_npy_header *hdr, gemm_err *err)
{
    const unsigned char *p = buf;
    size_t hlen_at = 0, hlen = 0;
    int major = 0, minor = 0;
    int r = npy_prefix(p, len, &major, &minor, &hlen_at, &hlen, err);
    if (r <= 0) return r;
    if (len - hlen_at < hlen) return 0;
    *hdr = (gemm_npy_header){.major = major, .minor = minor, .dtype = GEMM_DTYPE_INVALID, .data_offset = hlen_at + hlen};
    /* 1.0 and 2.0 are latin-1, 3.0 UTF-8: the keys and values we accept are ASCII in
     * both, and any other byte is refused by the parser as it stands. */
    if (parse_dict((const char *)p + hlen_at, hlen, hdr, err)) return -1;
    return 1;
}

size_t gemm_npy_write_header3(void *buf, size_t cap, gemm_dtype d, uint64_t batch, uint64_t rows,
                              uint64_t cols)
{
    char dict[192], lead[24] = ""; /* lead: the batch axis, "b, " */
    if (d < 0 || d >= GEMM_DTYPE_COUNT) return 0;
    if (batch) snprintf(lead, sizeof lead, "%llu, ", (unsigned long long)batch);
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%s%llu, %llu), }",
                     gemm_dtypes[d].npy, lead, (unsigned long long)rows, (unsigned long long)cols);
    if (n < 0 || (size_t)n >= sizeof dict) return 0;
    /* Like NumPy (>= 1.23): room for the first axis to grow to 21 digits in place. */
    char digits[24];
    int nd = snprintf(digits, sizeof digits, "%llu", (unsigned long long)(batch ? batch : rows));
    size_t hlen = (size_t)n + (size_t)(nd < 21 ? 21 - nd : 0);
    size_t total = 10 + hlen + 1;
    total = (total + 63) / 64 * 64;
    if (total > cap || total - 10 > 65535) return 0;
    unsigned char *p = buf;
    memcpy(p, npy_magic, 6);
    p[6] = 1;
    p[7] = 0;
    p[8] = (unsigned char)((total - 10) & 0xff);
    p[9] = (unsigned char)((total - 10) >> 8);
    memcpy(p + 10, dict, (size_t)n);
    memset(p + 10 + n, ' ', total - 10 - (size_t)n - 1);
    p[total - 1] = '\n';
    return total;
}

/* ---- the streaming reader ------------------------------------------------ */

enum { R_HEADER, R_DATA, R_DONE, R_FAILED };

struct gemm_npy_reader {
    gemm_limits lim; /* zeros: no limits */
    gemm_allocator alloc;
    int state;
    unsigned char *hbuf; /* header bytes so far */
    size_t hlen, hwant;  /* have, and how many we need next */
    size_t hcap;
    gemm_npy_header hdr;
    unsigned char *data;
    size_t bytes, got;
};

gemm_npy_reader *gemm_npy_reader_new(const gemm_limits *lim, const gemm_allocator *alloc)
{
    gemm_npy_reader *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    if (lim) r->lim = *lim;
    r->alloc = alloc ? *alloc : gemm_allocator_host;
    r->state = R_HEADER;
    r->hwant = 8; /* magic and version first: they say how long the length field is */
    return r;
}

/* The reader fails for good; rc (-1) is returned, for `return fail(r, gemm_err_set(...))`. */
static int fail(gemm_npy_reader *r, int rc)
{
    r->state = R_FAILED;
    return rc;
}

/* The whole header is in hbuf: parse it, check the shape, take the data buffer. */
static int header_complete(gemm_npy_reader *r, gemm_err *err)
{
    if (gemm_npy_parse_header(r->hbuf, r->hlen, &r->hdr, err) < 0) return fail(r, -1); /* whole: never 0 */
    if (r->hdr.ndim == 3 ? gemm_check_stack(r->hdr.batch, r->hdr.rows, r->hdr.cols, r->hdr.dtype, &r->lim,
                                        "the .npy array", err)
                     : gemm_check_matrix(r->hdr.rows, r->hdr.cols, r->hdr.dtype, &r->lim, "the .npy array", err))
        return fail(r, -1);
    if (!gemm_matrix_bytes(r->hdr.rows, r->hdr.cols, r->hdr.dtype, &r->bytes) ||
        (r->hdr.batch && !gemm_mul_size(r->bytes, (size_t)r->hdr.batch, &r->bytes)))
        return fail(r, gemm_err_set(err, 413, "too_large", "the .npy array is too large"));
    r->data = gemm_alloc(&r->alloc, r->bytes);
    if (!r->data)
        return fail(r, gemm_err_set(err, 500, "out_of_memory", "could not allocate %zu bytes for the .npy array",
                                    r->bytes));
    free(r->hbuf);
    r->hbuf = NULL;
    r->state = R_DATA;
    return 0;
}

int gemm_npy_reader_feed(gemm_npy_reader *r, const void *data, size_t len, gemm_err *err)
{
    const unsigned char *p = data;
    if (r->state == R_FAILED)
        return gemm_err_set(err, 400, "bad_npy", "the .npy reader already failed");
    while (len && r->state == R_HEADER) {
        if (r->hcap < r->hwant) {
            /* hwant is at most 12 + GEMM_NPY_MAX_HEADER: npy_prefix checked the length */
            unsigned char *nb = realloc(r->hbuf, r->hwant);
            if (!nb)
                return fail(r, gemm_err_set(err, 500, "out_of_memory", "could not allocate the .npy header buffer"));
            r->hbuf = nb;
            r->hcap = r->hwant;
        }
        size_t take = r->hwant - r->hlen;
        if (take > len) take = len;
        memcpy(r->hbuf + r->hlen, p, take);
        r->hlen += take;
        p += take;
        len -= take;
        int major = 0, minor;
        size_t at = 0, hl = 0;
        int pr = npy_prefix(r->hbuf, r->hlen, &major, &minor, &at, &hl, err);
        if (pr < 0) return fail(r, -1); /* a wrong magic is refused as soon as it shows */
        if (r->hlen < r->hwant) break;
        size_t want = pr == 0 ? (major == 1 ? 10 : 12) : at + hl; /* the length field, or all */
        if (r->hlen < want) r->hwant = want;
        else if (header_complete(r, err)) return -1;
    }
    if (len && r->state == R_DATA) {
        if (len > r->bytes - r->got)
            return fail(r, gemm_err_set(err, 400, "bad_npy",
                                        "the .npy file is longer than its header announces (%llux%llu %s = %zu bytes "
                                        "of data)", (unsigned long long)r->hdr.rows, (unsigned long long)r->hdr.cols,
                                        gemm_dtype_name(r->hdr.dtype), r->bytes));
        memcpy(r->data + r->got, p, len);
        r->got += len;
        len = 0;
    }
    if (len && r->state == R_DONE)
        return gemm_err_set(err, 400, "bad_npy", "data fed after the .npy reader finished");
    return 0;
}

const gemm_npy_header *gemm_npy_reader_header(const gemm_npy_reader *r)
{
    return r && r->hdr.ndim ? &r->hdr : NULL; /* ndim: 2 or 3 once parsed (even if the limits refused it) */
}

/* dst (rows x cols, row-major) = src (cols x rows, row-major), in cache-sized blocks; elements of
 * 2, 4 or 8 bytes (every dtype). */
static void transpose(void *dst, const void *src, size_t rows, size_t cols, size_t es)
{
    enum { B = 32 };
#define BLOCK(T)                                                                                                       \
    for (size_t i = i0; i < i1; i++)                                                                                   \
        for (size_t j = j0; j < j1; j++) ((T *)dst)[i * cols + j] = ((const T *)src)[j * rows + i];
    for (size_t i0 = 0; i0 < rows; i0 += B) {
        size_t i1 = i0 + B < rows ? i0 + B : rows;
        for (size_t j0 = 0; j0 < cols; j0 += B) {
            size_t j1 = j0 + B < cols ? j0 + B : cols;
            if (es == 2) BLOCK(uint16_t) /* float16, bfloat16 */
            else if (es == 4) BLOCK(uint32_t)
            else BLOCK(uint64_t)
        }
    }
#undef BLOCK
}

int gemm_npy_reader_finish(gemm_npy_reader *r, gemm_matrix *out, gemm_err *err)
{
    if (r->state == R_FAILED) return gemm_err_set(err, 400, "bad_npy", "the .npy reader already failed");
    if (r->state == R_DONE) return gemm_err_set(err, 500, "internal", "the .npy reader was already finished");
    if (r->state == R_HEADER)
        return fail(r, gemm_err_set(err, 400, "truncated", "the .npy file ended inside its header (%zu bytes "
                                    "received)", r->hlen));
    if (r->got != r->bytes)
        return fail(r, gemm_err_set(err, 400, "truncated", "the .npy data is truncated: expected %zu bytes, got %zu",
                                    r->bytes, r->got));
    if (r->hdr.fortran_order && r->hdr.rows > 1 && r->hdr.cols > 1) {
        void *tmp = malloc(r->bytes);
        if (!tmp)
            return fail(r, gemm_err_set(err, 500, "out_of_memory", "could not allocate %zu bytes to transpose a "
                                        "Fortran-order array", r->bytes));
        memcpy(tmp, r->data, r->bytes);
        transpose(r->data, tmp, (size_t)r->hdr.rows, (size_t)r->hdr.cols, gemm_dtype_size(r->hdr.dtype));
        free(tmp);
    }
    *out = (gemm_matrix){.rows = r->hdr.rows, .cols = r->hdr.cols, .dtype = r->hdr.dtype, .data = r->data,
                         .batch = r->hdr.batch};
    r->data = NULL;
    r->state = R_DONE;
    return 0;
}

void gemm_npy_reader_free(gemm_npy_reader *r)
{
    if (!r) return;
    gemm_free(&r->alloc, r->data);
    free(r->hbuf);
    free(r);
}
