/*
 * request.c - per-request state and the body readers (raw, JSON, multipart/npy).
 */
#include "request.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "json_codec.h"
#include "json_stream.h"

gemmd_request *gemmd_request_new(gemmd_services *svc, struct MHD_Connection *conn, const char *method,
                                 const char *url)
{
    gemmd_request *req = calloc(1, sizeof *req);
    if (!req) return NULL;
    req->svc = svc;
    req->conn = conn;
    req->t_start_ms = gemm_now_ms();
    req->refs = 1; /* the connection's */
    req->part = -1;
    req->family = GEMMD_FMT_JSON;
    snprintf(req->method, sizeof req->method, "%s", method ? method : "?");
    snprintf(req->path, sizeof req->path, "%s", url ? url : "?");
    /* The path goes into log lines: no control characters or spaces from the network. */
    for (char *p = req->path; *p; p++)
        if ((unsigned char)*p < 0x21 || *p == 0x7f) *p = '?';
    for (char *p = req->method; *p; p++)
        if ((unsigned char)*p < 0x21 || *p == 0x7f) *p = '?';
    gemm_options_init(&req->opt);
    gemm_err_clear(&req->err);
    req->a.dtype = req->b.dtype = GEMM_DTYPE_INVALID;
    req->resv.budget = svc->budget;
    req->alloc_ctx = (gemmd_budget_alloc_ctx){svc->budget, svc->base_alloc, GEMMD_MEM_INPUT, &req->resv};
    req->alloc = gemmd_budget_allocator(&req->alloc_ctx);
    return req;
}

static void free_matrix(gemmd_request *req, gemm_matrix *m)
{
    gemm_free(&req->alloc, m->data);
    m->data = NULL;
}

void gemmd_request_free(gemmd_request *req)
{
    if (!req) return;
    gemm_engine *e = req->svc->engine;
    const gemm_allocator *al = &req->alloc;
    gemm_json_stream_free(req->js);
    if (req->cleanup) req->cleanup(req); /* the route's own state (v2: its header buffer) */
    gemm_multipart_free(req->mp);
    gemm_npy_reader_free(req->rd[0]);
    gemm_npy_reader_free(req->rd[1]);
    free_matrix(req, &req->a);
    free_matrix(req, &req->b);
    if (!req->ref[0]) gemm_free(al, req->job.a); /* a resident operand is only borrowed */
    if (!req->ref[1]) gemm_free(al, req->job.b);
    gemm_free(al, req->job.c);
    for (int i = 0; i < 2; i++) gemmd_matrices_put(req->svc->matrices, req->ref[i]);
    if (req->put) { /* rows of a PUT that did not finish are free for another one */
        if (req->put_claimed)
            gemmd_matrices_release_rows(req->svc->matrices, req->put, req->put_row0, req->put_rows, 0);
        gemmd_matrices_put(req->svc->matrices, req->put);
    }
    if (req->reserved) gemmd_matrices_unreserve(req->svc->matrices, req->client, req->reserved);
    gemm_engine_resident_free(e, req->c_res);
    gemmd_budget_release(req->svc->budget, GEMMD_MEM_BODY, req->body_charged);
    if (req->prepared == 1) { /* encoded but never sent: the connection went away */
        gemm_buf_free(&req->prepared_buf);
        gemmd_budget_release(req->svc->budget, GEMMD_MEM_ANSWER, req->prepared_charge);
    }
    /* The reservation goes back last, whole: the buffers it held are freed by now (an
     * answer's, a moment later, with the response). */
    if (gemmd_resv_end(&req->resv) && req->t_admitted > 0)
        gemmd_admit_done(req->svc->admit, &req->ticket, (gemm_now_ms() - req->t_admitted) / 1000.0);
    free(req);
}

const char *gemmd_request_header(gemmd_request *req, const char *name)
{
    return MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, name);
}

/* ---- query options --------------------------------------------------------- */

struct query_ctx {
    gemm_options *opt;
    gemm_err *err;
    int failed;
};

/* With the sizes MHD decoded: an encoded NUL (%00) inside a key or value is seen. */
static enum MHD_Result query_arg(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                                 const char *value, size_t value_size)
{
    (void)kind;
    struct query_ctx *q = cls;
    if (gemm_options_set(q->opt, GEMM_DOOR_QUERY, key, key_size, value, value_size, q->err) >= 0)
        return MHD_YES; /* 1: not an option (ignored) */
    q->failed = 1;
    return MHD_NO;
}

int gemmd_request_query_options(gemmd_request *req, gemm_options *opt, gemm_err *err)
{
    struct query_ctx q = {opt, err, 0};
    MHD_get_connection_values_n(req->conn, MHD_GET_ARGUMENT_KIND, query_arg, &q);
    gemm_options_door(opt); /* the body's door may repeat the query's options */
    return q.failed ? -1 : 0;
}

/* ---- helpers ---------------------------------------------------------------- */

/* Compares the media type (before any ';' parameters) case-insensitively. */
static int media_is(const char *ct, const char *type)
{
    size_t n = strlen(type);
    while (*ct == ' ' || *ct == '\t') ct++;
    if (strncasecmp(ct, type, n) != 0) return 0;
    char c = ct[n];
    return c == '\0' || c == ';' || c == ' ' || c == '\t';
}

static int is_chunked(gemmd_request *req)
{
    const char *te = gemmd_request_header(req, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    if (!te) return 0;
    for (const char *p = te; *p; p++)
        if (strncasecmp(p, "chunked", 7) == 0) return 1;
    return 0;
}

static const gemm_limits *limits(gemmd_request *req) { return &req->svc->cfg.limits; }

/* ---- operands by reference ------------------------------------------------ */

/* Takes a reference on the caller's resident matrix id as operand i (0: A, 1: B);
 * 404 matrix_not_found when it is unknown, deleted or another token's. */
static int resolve_ref(gemmd_request *req, int i, const char *id, gemm_err *err)
{
    if (req->ref[i] || req->have[i])
        return gemm_err_set(err, 400, "duplicate_part", "operand %c is given twice", i ? 'b' : 'a');
    gemmd_matrix_entry *e = gemmd_matrices_get(req->svc->matrices, id, req->owner);
    if (!e)
        return gemm_err_set(err, 404, "matrix_not_found",
                            "%c = %.40s: no resident matrix with that id is kept here (never created, deleted, "
                            "or forgotten by a restart); POST /v1/matrices to upload it", i ? 'b' : 'a', id);
    if (!gemmd_matrices_ready(req->svc->matrices, e)) {
        gemmd_matrices_put(req->svc->matrices, e);
        return gemm_err_set(err, 409, "matrix_incomplete",
                            "%c = %.40s: that matrix is still being filled (PUT of its rows); a product can "
                            "read it once every row is written", i ? 'b' : 'a', id);
    }
    req->ref[i] = e;
    gemm_matrix *m = i ? &req->b : &req->a;
    m->rows = e->m.rows;
    m->cols = e->m.cols;
    m->dtype = e->m.dtype;
    m->data = NULL;
    req->have[i] = 1;
    return 0;
}

static int json_ref(void *user, int which, const char *id, gemm_matrix *out, gemm_err *err)
{
    gemmd_request *req = user;
    if (resolve_ref(req, which, id, err) != 0) return -1;
    *out = which ? req->b : req->a;
    return 0;
}

/* The resident operands the door just read named (a=ID, b=ID): taken, their ids cleared
 * so that a later door's are told apart. 0 or -1. */
static int take_refs(gemmd_request *req, gemm_err *err)
{
    for (int i = 0; i < 2; i++) {
        char *id = req->opt.ref[i];
        int rc = id[0] ? resolve_ref(req, i, id, err) : 0;
        id[0] = '\0';
        if (rc != 0) return -1;
    }
    return 0;
}

/* The query's resident operands, store and return. 0 or -1 (req->err). */
static int query_refs(gemmd_request *req)
{
    if (take_refs(req, &req->err) != 0) return -1;
    req->store_c = req->opt.store;
    req->return_c = req->opt.ret;
    if (req->return_c && !req->store_c)
        return gemm_err_set(&req->err, 400, "bad_option", "return=1 goes with store=1 (C is always returned otherwise)");
    return 0;
}

/* ---- multipart callbacks -------------------------------------------------- */

/* A part is a .npy file (a and b with a filename; POST /v1/matrices: matrix, or a) or a
 * text field, which must be an option of the form door. */
static int part_begin(void *user, const char *name, const char *filename, const char *content_type,
                      gemm_err *err)
{
    (void)content_type;
    gemmd_request *req = user;
    if (!name) return gemm_err_set(err, 400, "bad_multipart", "a form part has no name");
    int one = req->body_kind == GEMMD_BODY_MATRIX, is_a = strcmp(name, "a") == 0;
    int i = one ? (strcmp(name, "matrix") == 0 || is_a ? 0 : -1)
                : (filename && (is_a || strcmp(name, "b") == 0) ? !is_a : -1);
    if (i >= 0) {
        if (req->have[i] || req->rd[i])
            return gemm_err_set(err, 400, "duplicate_part", "%s is given twice (query or form)",
                                one ? "the matrix" : name);
        req->rd[i] = gemm_npy_reader_new(limits(req), &req->alloc);
        if (!req->rd[i]) return gemm_err_set(err, 500, "out_of_memory", "cannot allocate an npy reader");
        req->part = i;
        return 0;
    }
    char names[160];
    if (!gemm_option_find(name, strlen(name), GEMM_DOOR_FORM) || strlen(name) >= sizeof req->part_name)
        return gemm_err_set(err, 400, "unknown_part", "unexpected form part \"%.40s\"; send %s and optionally the "
                            "fields %s", name, one ? "one .npy part named matrix" : "parts a and b (.npy files)",
                            gemm_option_names(GEMM_DOOR_FORM, names, sizeof names));
    snprintf(req->part_name, sizeof req->part_name, "%s", name);
    req->text_len = 0;
    req->part = 2;
    return 0;
}

static int part_data(void *user, const void *data, size_t len, gemm_err *err)
{
    gemmd_request *req = user;
    if (req->part == 0 || req->part == 1) return gemm_npy_reader_feed(req->rd[req->part], data, len, err);
    if (req->part != 2) return gemm_err_set(err, 400, "bad_multipart", "form data outside of a part");
    /* a field longer than the buffer is kept cut, text_len one more than the buffer */
    if (req->text_len > sizeof req->text) return 0;
    size_t room = sizeof req->text - req->text_len;
    memcpy(req->text + req->text_len, data, len < room ? len : room);
    req->text_len = len > room ? sizeof req->text + 1 : req->text_len + len;
    return 0;
}

static int part_end(void *user, gemm_err *err)
{
    gemmd_request *req = user;
    int p = req->part;
    req->part = -1;
    if (p == 0 || p == 1) {
        gemm_matrix *m = p == 0 ? &req->a : &req->b;
        /* A Fortran-order array is transposed through a copy of itself: admit it first. */
        const gemm_npy_header *h = gemm_npy_reader_header(req->rd[p]);
        size_t copy = 0;
        uint64_t outside = 0;
        if (h && h->fortran_order && h->rows > 1 && h->cols > 1 &&
            gemm_matrix_bytes(h->rows, h->cols, h->dtype, &copy) &&
            gemm_mul_size(copy, (size_t)(h->batch ? h->batch : 1), &copy) &&
            gemmd_resv_take(&req->resv, req->svc->budget, GEMMD_MEM_BODY, copy, &outside) != 0)
            return gemmd_budget_refuse(req->svc->budget, copy, "transposing a Fortran-order .npy part", err,
                                       &req->retry_after_s);
        int rc = gemm_npy_reader_finish(req->rd[p], m, err);
        gemmd_budget_release(req->svc->budget, GEMMD_MEM_BODY, outside);
        gemm_npy_reader_free(req->rd[p]);
        req->rd[p] = NULL;
        if (rc != 0) return -1;
        req->have[p] = 1;
        return 0;
    }
    if (p != 2) return 0;
    if (req->text_len > sizeof req->text) req->text_len = sizeof req->text; /* cut: too long for any option */
    else /* trim the line ending some clients add */
        while (req->text_len && (req->text[req->text_len - 1] == '\n' || req->text[req->text_len - 1] == '\r'))
            req->text_len--;
    return gemm_options_set(&req->opt, GEMM_DOOR_FORM, req->part_name, strlen(req->part_name), req->text,
                            req->text_len, err) < 0 ? -1 : 0;
}

static const gemm_multipart_callbacks mp_callbacks = {part_begin, part_data, part_end};

/* ---- the memory budget -------------------------------------------------------- */

static gemmd_budget *budget(gemmd_request *req) { return req->svc->budget; }

static int refuse(gemmd_request *req, uint64_t bytes, const char *what)
{
    return gemmd_budget_refuse(budget(req), bytes, what, &req->err, &req->retry_after_s);
}

int gemmd_request_refuse(gemmd_request *req, uint64_t bytes, const char *what)
{
    return refuse(req, bytes, what);
}

/* What a body of unknown shapes will hold: its declared bytes decoded (JSON text is
 * longer than the numbers it holds, .npy about as long), and C, guessed as half of them
 * (A and B of a square product are each as large as C); a chunked body without a length,
 * as much as a guess of GEMMD_CHUNKED_GUESS. Decoded beyond that, a request is charged
 * for the rest as it goes, against whatever room is left. */
#define GEMMD_CHUNKED_GUESS ((uint64_t)16 << 20)
static uint64_t guessed_need(const gemmd_request *req)
{
    uint64_t body = req->has_length ? req->content_length
                                    : req->limit < GEMMD_CHUNKED_GUESS ? req->limit : GEMMD_CHUNKED_GUESS;
    return body + body / 2;
}

/* ---- begin ---------------------------------------------------------------- */

/* m, k and n of a raw body: each must be in the query (400 missing_dimension, naming the
 * missing ones) and at least 1 (422 empty_matrix: a zero is given, not missing). */
static int check_raw_dimensions(gemmd_request *req)
{
    static const char *const names[3] = {"m", "k", "n"};
    static const size_t field[3] = {offsetof(gemm_options, m), offsetof(gemm_options, k), offsetof(gemm_options, n)};
    const gemm_options *o = &req->opt;
    const uint64_t v[3] = {o->m, o->k, o->n};
    char missing[16] = "", zero[16] = "";
    for (int i = 0; i < 3; i++) {
        if (v[i]) continue;
        char *list = gemm_options_given(o, field[i]) ? zero : missing;
        size_t n = strlen(list);
        snprintf(list + n, sizeof missing - n, "%s%s", n ? ", " : "", names[i]);
    }
    if (missing[0])
        return gemm_err_set(&req->err, 400, "missing_dimension",
                            "raw bodies need m, k and n in the query, e.g. "
                            "/v1/matmul?m=2&k=3&n=4&dtype=float32 (missing: %s)", missing);
    if (zero[0])
        return gemm_err_set(&req->err, 422, "empty_matrix",
                            "%s = 0 in the query: m, k and n must each be at least 1 (got m=%llu k=%llu n=%llu)",
                            zero, (unsigned long long)o->m, (unsigned long long)o->k, (unsigned long long)o->n);
    return 0;
}

int gemmd_check_math(const gemm_options *o, gemm_dtype dtype, gemm_err *err)
{
    gemm_dtype c;
    if (gemm_out_dtype_resolve(dtype, o->out_dtype, &c, err) != 0) return -1;
    if (o->math == GEMM_MATH_DEFAULT || dtype == GEMM_DTYPE_F32) return 0;
    if (gemm_dtype_is_half(dtype))
        return gemm_err_set(err, 422, "unsupported_math",
                            "math \"%s\" applies to float32 operands only; %s operands are multiplied exactly "
                            "and summed in float32: leave math out (or send math=default)",
                            gemm_math_name(o->math), gemm_dtype_name(dtype));
    return gemm_err_set(err, 422, "unsupported_math",
                        "math \"%s\" applies to float32 only; %s products are always computed exactly: "
                        "leave math out (or send math=default)", gemm_math_name(o->math), gemm_dtype_name(dtype));
}

gemm_dtype gemmd_request_c_dtype(const gemmd_request *req)
{
    gemm_dtype c = req->a.dtype;
    if (gemm_out_dtype_resolve(req->a.dtype, req->opt.out_dtype, &c, NULL) != 0) c = req->a.dtype;
    return c;
}

/* Resident operands (a=ID / b=ID) fix their dimensions and the dtype; what the query says
 * besides must agree. 0 or -1 (req->err). */
static int apply_ref_shapes(gemmd_request *req)
{
    gemm_options *o = &req->opt;
    for (int i = 0; i < 2; i++) {
        if (!req->ref[i]) continue;
        const gemm_matrix *r = i ? &req->b : &req->a;
        uint64_t *rows = i ? &o->k : &o->m, *cols = i ? &o->n : &o->k;
        if ((*rows && *rows != r->rows) || (*cols && *cols != r->cols))
            return gemm_err_set(&req->err, 422, "shape_mismatch",
                                "%c is a resident %llux%llu matrix but the query%s says %s %llu and %s %llu", i ? 'B' : 'A',
                                (unsigned long long)r->rows, (unsigned long long)r->cols,
                                i && req->ref[0] ? " or A" : "", i ? "k" : "m", (unsigned long long)*rows,
                                i ? "n" : "k", (unsigned long long)*cols);
        *rows = r->rows;
        *cols = r->cols;
        if (o->dtype != GEMM_DTYPE_INVALID && o->dtype != r->dtype)
            return gemm_err_set(&req->err, 422, "dtype_mismatch", "%c is a resident %s matrix but the product is %s",
                                i ? 'B' : 'A', gemm_dtype_name(r->dtype), gemm_dtype_name(o->dtype));
        o->dtype = r->dtype;
    }
    return 0;
}

static int begin_raw(gemmd_request *req)
{
    gemm_err *err = &req->err;
    gemm_options *o = &req->opt;
    if (apply_ref_shapes(req) != 0) return -1;
    if (check_raw_dimensions(req) != 0) return -1;
    if (o->dtype == GEMM_DTYPE_INVALID) o->dtype = GEMM_DTYPE_F32;
    if (gemmd_check_math(o, o->dtype, err) != 0) return -1;
    if (gemm_check_product(o->m, o->k, o->k, o->n, o->dtype, limits(req), err) != 0) return -1;
    if (o->b_shared && !o->batch)
        return gemm_err_set(err, 400, "missing_dimension", "b_shared=1 needs batch=b in the query");
    if (o->batch && (req->ref[0] || req->ref[1]))
        return gemm_err_set(err, 400, "bad_option", "a batched request (batch=b) takes no resident operand (a=ID, b=ID)");
    if (o->batch && gemmd_check_batch(req, o->batch, o->m, o->k, o->n, o->b_shared ? 0 : o->batch) != 0)
        return -1;
    size_t a_bytes = 0, b_bytes = 0, total;
    uint64_t nb = o->batch ? o->batch : 1, nbb = o->b_shared ? 1 : nb;
    if ((!req->ref[0] && (!gemm_matrix_bytes(o->m, o->k, o->dtype, &a_bytes) ||
                          !gemm_mul_size(a_bytes, (size_t)nb, &a_bytes))) ||
        (!req->ref[1] && (!gemm_matrix_bytes(o->k, o->n, o->dtype, &b_bytes) ||
                          !gemm_mul_size(b_bytes, (size_t)nbb, &b_bytes))) ||
        !gemm_add_size(a_bytes, b_bytes, &total))
        return gemm_err_set(err, 413, "too_large", "the matrices' byte sizes overflow");
    if (total && (!req->has_length || is_chunked(req)))
        return gemm_err_set(err, 411, "length_required",
                            "raw bodies need a Content-Length (not chunked): the server checks it "
                            "against m, k, n and dtype before reading");
    uint64_t got = req->has_length ? req->content_length : 0;
    if (got != total && o->batch)
        return gemm_err_set(err, 400, "length_mismatch",
                            "the body has %llu bytes but a batch of %llu products (A %llux%llu, B "
                            "%llux%llu%s) of %s needs %zu bytes",
                            (unsigned long long)got, (unsigned long long)nb,
                            (unsigned long long)o->m, (unsigned long long)o->k, (unsigned long long)o->k,
                            (unsigned long long)o->n, o->b_shared ? ", shared" : "",
                            gemm_dtype_name(o->dtype), total);
    if (got != total)
        return gemm_err_set(err, 400, "length_mismatch",
                            "the body has %llu bytes but %s of %s need %zu bytes%s",
                            (unsigned long long)got,
                            req->ref[0] && req->ref[1] ? "no operands (both are resident)"
                            : req->ref[0] ? "B alone (A is resident)"
                            : req->ref[1] ? "A alone (B is resident)" : "A then B",
                            gemm_dtype_name(o->dtype), total,
                            req->ref[0] || req->ref[1] ? "" : " (A is m x k, B is k x n, from the query)");
    size_t c_bytes = 0, need = 0;
    gemm_dtype cd = o->dtype;
    (void)gemm_out_dtype_resolve(o->dtype, o->out_dtype, &cd, NULL); /* checked above */
    if (!gemm_matrix_bytes(o->m, o->n, cd, &c_bytes) || !gemm_mul_size(c_bytes, (size_t)nb, &c_bytes) ||
        !gemm_add_size(total, c_bytes, &need))
        return gemm_err_set(err, 413, "too_large", "the matrices' byte sizes overflow");
    req->need = need; /* A, B and C; a JSON answer adds its text (gemmd_matmul_begin) */
    req->admit_pending = 1; /* A and B are allocated once admitted (gemmd_body_open) */
    req->a.rows = o->m;
    req->a.cols = o->k;
    req->b.rows = o->k;
    req->b.cols = o->n;
    req->a.dtype = req->b.dtype = o->dtype;
    req->a.batch = o->batch;
    req->b.batch = o->b_shared ? 0 : o->batch;
    req->raw_a_bytes = a_bytes;
    req->raw_total = total;
    return 0;
}

/* The shape of a matrix named in the query of POST /v1/matrices: rows and cols (or m and
 * k), dtype (default float32), checked against the limits, and its byte size. 0, or -1
 * with req->err: 400 missing_dimension when one is absent, 422 empty_matrix when it is 0.
 * what / example: for the message. */
static int matrix_query_shape(gemmd_request *req, const char *what, const char *example, uint64_t *rows,
                              uint64_t *cols, size_t *bytes)
{
    gemm_err *err = &req->err;
    gemm_options *o = &req->opt;
#define HAS(f) gemm_options_given(o, offsetof(gemm_options, f))
    int given = (HAS(rows) || HAS(m)) && (HAS(cols) || HAS(k));
    *rows = HAS(rows) ? o->rows : o->m;
    *cols = HAS(cols) ? o->cols : o->k;
#undef HAS
    if (!given || !*rows || !*cols)
        return gemm_err_set(err, given ? 422 : 400, given ? "empty_matrix" : "missing_dimension",
                            "%s needs rows and cols (each at least 1) in the query, e.g. %s", what, example);
    if (o->dtype == GEMM_DTYPE_INVALID) o->dtype = GEMM_DTYPE_F32;
    if (gemm_check_matrix(*rows, *cols, o->dtype, limits(req), "the matrix", err) != 0) return -1;
    if (!gemm_matrix_bytes(*rows, *cols, o->dtype, bytes))
        return gemm_err_set(err, 413, "too_large", "the matrix's byte size overflows");
    return 0;
}

/* A resident matrix's memory (A's): its bytes reserved in resident_mb now, allocated
 * once the request is admitted (gemmd_body_open). 0, or -1 with req->err. */
static int alloc_matrix(gemmd_request *req, uint64_t rows, uint64_t cols, gemm_dtype dtype, size_t bytes)
{
    if (gemmd_matrices_reserve(req->svc->matrices, req->client, bytes, &req->err) != 0) return -1;
    req->reserved = bytes;
    req->need = bytes;
    req->admit_pending = 1;
    req->a.rows = rows;
    req->a.cols = cols;
    req->a.dtype = dtype;
    return 0;
}

int gemmd_body_open(gemmd_request *req)
{
    if (!req->admit_pending) return 0;
    req->admit_pending = 0;
    size_t a_bytes = req->body_kind == GEMMD_BODY_MATRIX ? req->reserved : req->raw_a_bytes;
    size_t b_bytes = req->body_kind == GEMMD_BODY_MATRIX ? 0 : req->raw_total - req->raw_a_bytes;
    gemmd_budget_take_refusal();
    if (a_bytes) req->a.data = gemm_alloc(&req->alloc, a_bytes);
    if (b_bytes && (!a_bytes || req->a.data)) req->b.data = gemm_alloc(&req->alloc, b_bytes);
    if ((a_bytes && !req->a.data) || (b_bytes && !req->b.data)) {
        if (gemmd_budget_take_refusal()) return refuse(req, a_bytes + b_bytes, "the request's matrices");
        return gemm_err_set(&req->err, 503, "out_of_memory", "cannot allocate %zu bytes now; retry later",
                            a_bytes + b_bytes);
    }
    return 0;
}

/* POST /v1/matrices with a raw body: rows and cols (or m and k) and dtype in the query. */
static int begin_matrix_raw(gemmd_request *req)
{
    gemm_err *err = &req->err;
    gemm_options *o = &req->opt;
    uint64_t rows, cols;
    size_t bytes;
    if (matrix_query_shape(req, "a raw matrix", "/v1/matrices?rows=4&cols=3&dtype=float32", &rows, &cols, &bytes) != 0)
        return -1;
    if (!req->has_length || is_chunked(req))
        return gemm_err_set(err, 411, "length_required", "raw bodies need a Content-Length (not chunked)");
    if (req->content_length != bytes)
        return gemm_err_set(err, 400, "length_mismatch", "the body has %llu bytes but a %llux%llu %s matrix has %zu",
                            (unsigned long long)req->content_length, (unsigned long long)rows,
                            (unsigned long long)cols, gemm_dtype_name(o->dtype), bytes);
    if (alloc_matrix(req, rows, cols, o->dtype, bytes) != 0) return -1;
    req->raw_a_bytes = bytes;
    req->raw_total = bytes;
    return 0;
}

/* POST /v1/matrices?rows=R&cols=C&dtype=T&empty=1, without a body: a matrix whose rows
 * come later, in PUTs of row ranges (begin_matrix_put), over any number of connections. */
static int begin_matrix_empty(gemmd_request *req)
{
    gemm_err *err = &req->err;
    gemm_options *o = &req->opt;
    if ((req->has_length && req->content_length != 0) || is_chunked(req))
        return gemm_err_set(err, 400, "unexpected_body",
                            "empty=1 makes a matrix to be filled by PUT /v1/matrices/{id}?row=R; this request "
                            "takes no body");
    uint64_t rows, cols;
    size_t bytes;
    if (matrix_query_shape(req, "empty=1", "/v1/matrices?rows=4096&cols=4096&dtype=float32&empty=1", &rows, &cols,
                           &bytes) != 0)
        return -1;
    if (alloc_matrix(req, rows, cols, o->dtype, bytes) != 0) return -1;
    req->family = GEMMD_FMT_RAW;
    req->raw_a_bytes = req->raw_total = 0; /* nothing to read */
    req->matrix_empty = 1;
    return 0;
}

/* PUT /v1/matrices/{id}?row=R with raw rows (application/octet-stream): whole rows of a
 * matrix made with empty=1, from row R on, written straight into it. Each row is written
 * once; the rows are claimed before a byte is read, and freed again if the body does not
 * arrive whole. */
static int begin_matrix_put(gemmd_request *req, const char *ct)
{
    gemm_err *err = &req->err;
    if (!ct || !media_is(ct, "application/octet-stream"))
        return gemm_err_set(err, 415, "unsupported_media_type",
                            "PUT /v1/matrices/{id} takes raw rows: Content-Type application/octet-stream, "
                            "row-major little-endian, the first row's index in ?row=R");
    gemmd_matrix_entry *e = req->job_id[0] ? gemmd_matrices_get(req->svc->matrices, req->job_id, req->owner) : NULL;
    if (!e)
        return gemm_err_set(err, 404, "matrix_not_found",
                            "no resident matrix with that id is kept here (never created, deleted, or "
                            "forgotten by a restart)");
    req->put = e;
    uint64_t row0 = req->opt.row;
    if (!gemm_options_given(&req->opt, offsetof(gemm_options, row)))
        return gemm_err_set(err, 400, "missing_dimension", "PUT needs ?row=R: the index of the first row sent");
    if (!req->has_length || is_chunked(req))
        return gemm_err_set(err, 411, "length_required", "raw rows need a Content-Length (not chunked)");
    size_t row_bytes;
    if (!gemm_matrix_bytes(1, e->m.cols, e->m.dtype, &row_bytes) || row_bytes == 0)
        return gemm_err_set(err, 500, "internal_error", "the matrix has no row size");
    if (req->content_length == 0 || req->content_length % row_bytes)
        return gemm_err_set(err, 400, "length_mismatch",
                            "the body has %llu bytes; rows of this %llux%llu %s matrix have %zu bytes each, and a "
                            "PUT sends at least one whole row", (unsigned long long)req->content_length,
                            (unsigned long long)e->m.rows, (unsigned long long)e->m.cols,
                            gemm_dtype_name(e->m.dtype), row_bytes);
    uint64_t rows = req->content_length / row_bytes;
    if (gemmd_matrices_claim_rows(req->svc->matrices, e, row0, rows, err) != 0) return -1;
    req->put_claimed = 1;
    req->put_row0 = row0;
    req->put_rows = rows;
    req->put_dst = (char *)e->m.data + (size_t)row0 * row_bytes;
    req->family = GEMMD_FMT_RAW;
    req->raw_a_bytes = req->raw_total = (size_t)req->content_length;
    return 0;
}

/* POST /v1/matrices: one matrix in any input format. */
static int begin_matrix(gemmd_request *req, const char *ct)
{
    gemm_err *err = &req->err;
    if (req->opt.empty) return begin_matrix_empty(req);
    if (ct && media_is(ct, "application/octet-stream")) {
        req->family = GEMMD_FMT_RAW;
        return begin_matrix_raw(req);
    }
    if (ct && media_is(ct, "application/x-npy")) {
        req->family = GEMMD_FMT_NPY;
        req->rd[0] = gemm_npy_reader_new(limits(req), &req->alloc);
        return req->rd[0] ? 0 : gemm_err_set(err, 500, "out_of_memory", "cannot allocate an npy reader");
    }
    if (ct && media_is(ct, "multipart/form-data")) {
        req->family = GEMMD_FMT_NPY;
        req->mp = gemm_multipart_new(ct, &mp_callbacks, req, err);
        return req->mp ? 0 : -1;
    }
    return gemm_err_set(err, 415, "unsupported_media_type",
                        "Content-Type \"%.60s\" is not supported for a matrix; send application/json, "
                        "application/octet-stream (rows, cols and dtype in the query), application/x-npy "
                        "or multipart/form-data with one .npy part named matrix", ct ? ct : "(none)");
}

int gemmd_request_read_length(gemmd_request *req)
{
    const char *cl = gemmd_request_header(req, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl) {
        if (gemm_parse_u64(cl, &req->content_length) != 0)
            return gemm_err_set(&req->err, 400, "bad_length", "Content-Length \"%.40s\" is not a number", cl);
        req->has_length = 1;
    }
    req->limit = req->svc->cfg.limits.max_body_bytes;
    return 0;
}

static int begin_body(gemmd_request *req);

int gemmd_body_begin(gemmd_request *req)
{
    int rc = begin_body(req);
    req->answer = req->family; /* products answer in the request's family unless Accept says */
    return rc;
}

static int begin_body(gemmd_request *req)
{
    const gemmd_config *cfg = &req->svc->cfg;
    gemm_err *err = &req->err;
    if (gemmd_request_read_length(req) != 0) return -1;
    if (req->has_length && req->content_length > req->limit)
        return gemm_err_set(err, 413, "body_too_large",
                            "the body has %llu bytes; this server takes at most %llu (max_body_mb)",
                            (unsigned long long)req->content_length, (unsigned long long)req->limit);

    if (gemmd_request_query_options(req, &req->opt, err) != 0) return -1;

    const char *ct = gemmd_request_header(req, MHD_HTTP_HEADER_CONTENT_TYPE);
    int is_json = ct && media_is(ct, "application/json");
    if (req->body_kind == GEMMD_BODY_ROWS) return begin_matrix_put(req, ct);
    if (req->body_kind == GEMMD_BODY_MATRIX && !is_json) return begin_matrix(req, ct);
    if (req->body_kind != GEMMD_BODY_MATRIX && query_refs(req) != 0) return -1;
    if (!ct && req->ref[0] && req->ref[1]) { /* both resident: no body at all */
        req->family = GEMMD_FMT_RAW;
        return begin_raw(req);
    }
    if (is_json) {
        req->family = GEMMD_FMT_JSON;
        if (cfg->max_json_bytes < req->limit) req->limit = cfg->max_json_bytes;
        if (req->has_length && req->content_length > req->limit)
            return gemm_err_set(err, 413, "body_too_large",
                                "the JSON body has %llu bytes; JSON bodies may have at most %llu "
                                "(max_json_mb); send large matrices as raw or .npy",
                                (unsigned long long)req->content_length, (unsigned long long)req->limit);
        req->need = guessed_need(req);
        /* Decoded as it arrives: matrices go straight into engine memory, the body is never held. */
        uint64_t body_max = req->has_length ? req->content_length : req->limit;
        const gemm_allocator *al = &req->alloc; /* out of the request's reservation */
        if (req->body_kind == GEMMD_BODY_MATRIX) {
            req->js = gemm_json_stream_new_matrix(limits(req), al, &req->opt, body_max);
        } else {
            req->js = gemm_json_stream_new(limits(req), al, &req->opt, body_max);
            gemm_json_refs refs = {{req->ref[0] != NULL, req->ref[1] != NULL}, json_ref, req};
            if (req->js) gemm_json_stream_set_refs(req->js, &refs, &req->a, &req->b);
        }
        if (!req->js) return gemm_err_set(err, 503, "out_of_memory", "cannot allocate a JSON decoder now; retry later");
        return 0;
    }
    if (ct && media_is(ct, "application/octet-stream")) {
        req->family = GEMMD_FMT_RAW;
        return begin_raw(req);
    }
    if (ct && media_is(ct, "multipart/form-data")) {
        req->family = GEMMD_FMT_NPY;
        req->need = guessed_need(req);
        req->mp = gemm_multipart_new(ct, &mp_callbacks, req, err);
        return req->mp ? 0 : -1;
    }
    return gemm_err_set(err, 415, "unsupported_media_type",
                        "Content-Type \"%.60s\" is not supported; send application/json, "
                        "application/octet-stream (A then B, shapes in the query) or "
                        "multipart/form-data with .npy parts a and b", ct ? ct : "(none)");
}

int gemmd_matrix_begin(gemmd_request *req)
{
    req->body_kind = GEMMD_BODY_MATRIX;
    return gemmd_body_begin(req);
}

int gemmd_rows_begin(gemmd_request *req)
{
    req->body_kind = GEMMD_BODY_ROWS;
    return gemmd_body_begin(req);
}

/* ---- feed / finish ---------------------------------------------------------- */

static void fail(gemmd_request *req) { req->failed = 1; }

void gemmd_body_feed(gemmd_request *req, const char *data, size_t len)
{
    req->bytes_in += len;
    if (req->failed) {
        req->discarded += len;
        return;
    }
    if (req->bytes_in > req->limit) {
        gemm_err_set(&req->err, 413, "body_too_large", "the body is over the limit of %llu bytes%s",
                     (unsigned long long)req->limit,
                     req->family == GEMMD_FMT_JSON ? " for JSON (max_json_mb)" : " (max_body_mb)");
        fail(req);
        return;
    }
    switch (req->family) {
    case GEMMD_FMT_JSON:
        /* a syntax error ends the decoding; the rest of the body is discarded */
        if (!req->js) {
            gemm_err_set(&req->err, 500, "internal_error", "no JSON decoder");
            fail(req);
        } else if (gemm_json_stream_feed(req->js, data, len, &req->err) != 0) {
            fail(req);
        }
        break;
    case GEMMD_FMT_RAW: {
        /* MHD never hands more than Content-Length bytes; guard anyway. */
        if (len > req->raw_total - req->raw_got) {
            gemm_err_set(&req->err, 400, "length_mismatch", "more body bytes than Content-Length");
            fail(req);
            return;
        }
        size_t off = req->raw_got;
        if (req->put_dst) { /* PUT: rows straight into the resident matrix */
            memcpy(req->put_dst + off, data, len);
            req->raw_got = off + len;
            break;
        }
        if (off < req->raw_a_bytes) {
            size_t n = req->raw_a_bytes - off < len ? req->raw_a_bytes - off : len;
            memcpy((char *)req->a.data + off, data, n);
            data += n;
            len -= n;
            off += n;
        }
        if (len) memcpy((char *)req->b.data + (off - req->raw_a_bytes), data, len);
        req->raw_got = off + len;
        break;
    }
    case GEMMD_FMT_NPY:
        if (req->mp ? gemm_multipart_feed(req->mp, data, len, &req->err) != 0
                    : gemm_npy_reader_feed(req->rd[0], data, len, &req->err) != 0) {
            uint64_t refused = gemmd_budget_take_refusal();
            if (refused) refuse(req, refused, "an .npy part");
            fail(req);
        }
        break;
    default:
        break;
    }
}

/* POST /v1/matrices: the single .npy (bare body or one form part). */
static int finish_matrix_npy(gemmd_request *req)
{
    gemm_err *err = &req->err;
    if (req->mp) {
        if (gemm_multipart_finish(req->mp, err) != 0) return -1;
    } else {
        int rc = gemm_npy_reader_finish(req->rd[0], &req->a, err);
        gemm_npy_reader_free(req->rd[0]);
        req->rd[0] = NULL;
        if (rc != 0) return -1;
        req->have[0] = 1;
    }
    if (!req->have[0]) return gemm_err_set(err, 400, "missing_part", "the form needs a .npy part named matrix");
    if (req->a.batch)
        return gemm_err_set(err, 422, "bad_shape",
                            "the .npy array is 3-D (a batch of %llu matrices); a resident matrix is 2-D",
                            (unsigned long long)req->a.batch);
    if (req->opt.dtype != GEMM_DTYPE_INVALID && req->opt.dtype != req->a.dtype)
        return gemm_err_set(err, 422, "dtype_mismatch",
                            "dtype %s was asked for but the .npy file holds %s; convert it or leave dtype out",
                            gemm_dtype_name(req->opt.dtype), gemm_dtype_name(req->a.dtype));
    return 0;
}

static int finish_npy(gemmd_request *req)
{
    gemm_err *err = &req->err;
    if (req->body_kind == GEMMD_BODY_MATRIX) return finish_matrix_npy(req); /* one matrix: no a=ID, b=ID */
    if (gemm_multipart_finish(req->mp, err) != 0 || take_refs(req, err) != 0) return -1;
    if (!req->have[0] || !req->have[1])
        return gemm_err_set(err, 400, "missing_part", "the form needs .npy parts a and b (missing %s)",
                            !req->have[0] && !req->have[1] ? "both" : (!req->have[0] ? "a" : "b"));
    if (req->a.dtype != req->b.dtype)
        return gemm_err_set(err, 422, "dtype_mismatch", "A is %s but B is %s; send both in one dtype",
                            gemm_dtype_name(req->a.dtype), gemm_dtype_name(req->b.dtype));
    if (req->opt.dtype != GEMM_DTYPE_INVALID && req->opt.dtype != req->a.dtype)
        return gemm_err_set(err, 422, "dtype_mismatch",
                            "dtype %s was asked for but the .npy files hold %s; convert them or "
                            "leave dtype out", gemm_dtype_name(req->opt.dtype), gemm_dtype_name(req->a.dtype));
    req->opt.dtype = req->a.dtype;
    if (gemmd_check_math(&req->opt, req->a.dtype, err) != 0) return -1;
    if (gemm_check_product(req->a.rows, req->a.cols, req->b.rows, req->b.cols, req->a.dtype, limits(req), err) != 0)
        return -1;
    if (gemm_check_batch_pair(req->a.batch, req->b.batch, err) != 0) return -1;
    if (req->a.batch &&
        gemmd_check_batch(req, req->a.batch, req->a.rows, req->a.cols, req->b.cols, req->b.batch) != 0)
        return -1;
    return 0;
}

int gemmd_check_batch(gemmd_request *req, uint64_t batch, uint64_t m, uint64_t k, uint64_t n, uint64_t b_batch)
{
    gemm_err *err = &req->err;
    gemm_dtype d = req->opt.dtype == GEMM_DTYPE_INVALID ? GEMM_DTYPE_F32 : req->opt.dtype;
    if (gemm_check_stack(batch, m, k, d, limits(req), "A", err) != 0 ||
        (b_batch && gemm_check_stack(b_batch, k, n, d, limits(req), "B", err) != 0) ||
        gemm_check_stack(batch, m, n, d, limits(req), "C", err) != 0)
        return -1;
    return 0;
}

int gemmd_body_finish(gemmd_request *req)
{
    req->t_body_ms = gemm_now_ms();
    int rc = 0;
    switch (req->family) {
    case GEMMD_FMT_JSON: {
        if (!req->js)
            rc = gemm_err_set(&req->err, 500, "internal_error", "no JSON decoder");
        else if (req->body_kind == GEMMD_BODY_MATRIX)
            rc = gemm_json_stream_finish_matrix(req->js, &req->opt, &req->a, &req->err);
        else
            rc = gemm_json_stream_finish(req->js, &req->opt, &req->a, &req->b, &req->err);
        gemm_json_stream_free(req->js);
        req->js = NULL;
        {
            uint64_t refused = gemmd_budget_take_refusal();
            if (rc != 0 && refused) refuse(req, refused, "the decoded matrices");
        }
        if (rc == 0) {
            req->opt.dtype = req->a.dtype;
            rc = gemmd_check_math(&req->opt, req->a.dtype, &req->err);
        }
        break;
    }
    case GEMMD_FMT_RAW:
        if (req->raw_got != req->raw_total)
            rc = gemm_err_set(&req->err, 400, "truncated", "the body ended after %zu of %zu bytes", req->raw_got,
                              req->raw_total);
        break;
    case GEMMD_FMT_NPY:
        rc = finish_npy(req);
        break;
    default:
        rc = gemm_err_set(&req->err, 500, "internal_error", "no body reader");
    }
    req->t_decoded_ms = gemm_now_ms();
    return rc;
}
