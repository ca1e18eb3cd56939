/*
 * body.c - the operands' body readers: raw, JSON and multipart/npy, for a product and for
 * one matrix (body.h).
 */
#include "body.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_stream.h"
#include "log.h"

static const gemm_limits *limits(gemmd_request *req) { return &req->svc->cfg.limits; }

gemmd_operands *gemmd_operands_new(gemmd_request *req)
{
    gemmd_operands *op = calloc(1, sizeof *op);
    if (!op) {
        gemm_err_set(&req->err, 503, "out_of_memory", "cannot allocate the request now; retry later");
        return NULL;
    }
    op->part = -1;
    op->family = GEMMD_FMT_JSON;
    gemm_options_init(&op->opt);
    op->a.dtype = op->b.dtype = GEMM_DTYPE_INVALID;
    req->op = op;
    return op;
}

void gemmd_operands_end(gemmd_request *req)
{
    gemmd_operands *op = req->op;
    if (!op) return;
    const gemm_allocator *al = &req->alloc;
    gemmd_matrices *store = req->svc->matrices;
    gemm_json_stream_free(op->js);
    gemm_multipart_free(op->mp);
    gemm_npy_reader_free(op->rd[0]);
    gemm_npy_reader_free(op->rd[1]);
    gemm_free(al, op->a.data);
    gemm_free(al, op->b.data);
    if (!op->ref[0]) gemm_free(al, op->job.a); /* a resident operand is only borrowed */
    if (!op->ref[1]) gemm_free(al, op->job.b);
    gemm_free(al, op->job.c);
    for (int i = 0; i < 2; i++) gemmd_matrices_put(store, op->ref[i]);
    if (op->reserved) gemmd_matrices_unreserve(store, req->client, op->reserved);
    if (op->entry) gemmd_jobs_put(req->svc->jobs, op->entry); /* reserved, never submitted */
    gemm_engine_resident_free(req->svc->engine, op->c_res);
    free(op);
    req->op = NULL;
}

/* ---- operands by reference ------------------------------------------------ */

/* Takes a reference on the caller's resident matrix id as operand i (0: A, 1: B);
 * 404 matrix_not_found when it is unknown, deleted or another token's. */
static int resolve_ref(gemmd_request *req, int i, const char *id, gemm_err *err)
{
    gemmd_operands *op = req->op;
    if (op->ref[i] || op->have[i])
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
    op->ref[i] = e;
    gemm_matrix *m = i ? &op->b : &op->a;
    *m = (gemm_matrix){e->m.rows, e->m.cols, e->m.dtype, NULL, 0};
    op->have[i] = 1;
    return 0;
}

static int json_ref(void *user, int which, const char *id, gemm_matrix *out, gemm_err *err)
{
    gemmd_request *req = user;
    if (resolve_ref(req, which, id, err) != 0) return -1;
    *out = which ? req->op->b : req->op->a;
    return 0;
}

/* The resident operands the door just read named (a=ID, b=ID): taken, their ids cleared
 * so that a later door's are told apart. 0 or -1. */
static int take_refs(gemmd_request *req, gemm_err *err)
{
    for (int i = 0; i < 2; i++) {
        char *id = req->op->opt.ref[i];
        int rc = id[0] ? resolve_ref(req, i, id, err) : 0;
        id[0] = '\0';
        if (rc != 0) return -1;
    }
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
    gemmd_operands *op = req->op;
    if (!name) return gemm_err_set(err, 400, "bad_multipart", "a form part has no name");
    int one = op->one_matrix, is_a = strcmp(name, "a") == 0;
    int i = one ? (strcmp(name, "matrix") == 0 || is_a ? 0 : -1)
                : (filename && (is_a || strcmp(name, "b") == 0) ? !is_a : -1);
    if (i >= 0) {
        if (op->have[i] || op->rd[i])
            return gemm_err_set(err, 400, "duplicate_part", "%s is given twice (query or form)",
                                one ? "the matrix" : name);
        op->rd[i] = gemm_npy_reader_new(limits(req), &req->alloc);
        if (!op->rd[i]) return gemm_err_set(err, 500, "out_of_memory", "cannot allocate an npy reader");
        op->part = i;
        return 0;
    }
    char names[160];
    if (!gemm_option_find(name, strlen(name), GEMM_DOOR_FORM) || strlen(name) >= sizeof op->part_name)
        return gemm_err_set(err, 400, "unknown_part", "unexpected form part \"%.40s\"; send %s and optionally the "
                            "fields %s", name, one ? "one .npy part named matrix" : "parts a and b (.npy files)",
                            gemm_option_names(GEMM_DOOR_FORM, names, sizeof names));
    snprintf(op->part_name, sizeof op->part_name, "%s", name);
    op->text_len = 0;
    op->part = 2;
    return 0;
}

static int part_data(void *user, const void *data, size_t len, gemm_err *err)
{
    gemmd_operands *op = ((gemmd_request *)user)->op;
    if (op->part == 0 || op->part == 1) return gemm_npy_reader_feed(op->rd[op->part], data, len, err);
    if (op->part != 2) return gemm_err_set(err, 400, "bad_multipart", "form data outside of a part");
    /* a field longer than the buffer is kept cut, text_len one more than the buffer */
    if (op->text_len > sizeof op->text) return 0;
    size_t room = sizeof op->text - op->text_len;
    memcpy(op->text + op->text_len, data, len < room ? len : room);
    op->text_len = len > room ? sizeof op->text + 1 : op->text_len + len;
    return 0;
}

/* The .npy of operand p is complete: into op->a or op->b. */
static int npy_done(gemmd_request *req, int p, gemm_err *err)
{
    gemmd_operands *op = req->op;
    /* A Fortran-order array is transposed through a copy of itself: admit it first. */
    const gemm_npy_header *h = gemm_npy_reader_header(op->rd[p]);
    size_t copy = 0;
    uint64_t outside = 0;
    if (h && h->fortran_order && h->rows > 1 && h->cols > 1 && gemm_matrix_bytes(h->rows, h->cols, h->dtype, &copy) &&
        gemm_mul_size(copy, (size_t)(h->batch ? h->batch : 1), &copy) &&
        gemmd_resv_take(&req->resv, req->svc->budget, GEMMD_MEM_BODY, copy, &outside) != 0)
        return gemmd_budget_refuse(req->svc->budget, copy, "transposing a Fortran-order .npy part", err,
                                   &req->retry_after_s);
    int rc = gemm_npy_reader_finish(op->rd[p], p ? &op->b : &op->a, err);
    gemmd_budget_release(req->svc->budget, GEMMD_MEM_BODY, outside);
    gemm_npy_reader_free(op->rd[p]);
    op->rd[p] = NULL;
    if (rc != 0) return -1;
    op->have[p] = 1;
    return 0;
}

static int part_end(void *user, gemm_err *err)
{
    gemmd_operands *op = ((gemmd_request *)user)->op;
    int p = op->part;
    op->part = -1;
    if (p == 0 || p == 1) return npy_done(user, p, err);
    if (p != 2) return 0;
    if (op->text_len > sizeof op->text) op->text_len = sizeof op->text; /* cut: too long for any option */
    else /* trim the line ending some clients add */
        while (op->text_len && (op->text[op->text_len - 1] == '\n' || op->text[op->text_len - 1] == '\r'))
            op->text_len--;
    return gemm_options_set(&op->opt, GEMM_DOOR_FORM, op->part_name, strlen(op->part_name), op->text,
                            op->text_len, err) < 0 ? -1 : 0;
}

static const gemm_multipart_callbacks mp_callbacks = {part_begin, part_data, part_end};

/* ---- begin ---------------------------------------------------------------- */

/* A body of unknown shapes: req->need is what it will hold, pct percent of its declared
 * bytes (chunked: as if 16 MiB), at most what one request may hold (the percentages:
 * docs/OPERATIONS.md, "Memory budget"; beyond them a request is charged as it decodes).
 * A matrix upload's length, an estimate of the matrix's bytes, is also reserved among the
 * resident matrices, so that a client at its share is refused (507) before it sends; it is
 * made exact once decoded (gemmd_route_matrix_create). A body over resident_mb may still
 * hold a smaller matrix: that one is checked after. 0, or -1 with req->err. */
static int guess_need(gemmd_request *req, unsigned pct)
{
    uint64_t guess = (uint64_t)16 << 20, most = gemmd_budget_max_single(req->svc->budget);
    uint64_t body = req->has_length ? req->content_length : req->limit < guess ? req->limit : guess;
    uint64_t need = body / 100 * pct + body % 100 * pct / 100;
    req->need = need < most ? need : most;
    if (!req->op->one_matrix || !req->has_length || !req->content_length) return 0;
    if (gemmd_matrices_reserve(req->svc->matrices, req->client, req->content_length, &req->err) == 0)
        req->op->reserved = req->content_length;
    else if (req->err.status != 413) return -1;
    else gemm_err_clear(&req->err);
    return 0;
}

/* m, k and n of a raw body: each must be in the query (400 missing_dimension, naming the
 * missing ones) and at least 1 (422 empty_matrix: a zero is given, not missing). */
static int check_raw_dimensions(gemmd_request *req)
{
    static const char *const names[3] = {"m", "k", "n"};
    static const size_t field[3] = {offsetof(gemm_options, m), offsetof(gemm_options, k), offsetof(gemm_options, n)};
    const gemm_options *o = &req->op->opt;
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

gemm_dtype gemmd_c_dtype(const gemmd_operands *op)
{
    gemm_dtype c = op->a.dtype; /* kept when out_dtype does not apply (checked before) */
    (void)gemm_out_dtype_resolve(op->a.dtype, op->opt.out_dtype, &c, NULL);
    return c;
}

/* A batched product within the limits: A (batch x m x k), B (b_batch x k x n, or one k x n
 * when b_batch is 0) and C (batch x m x n). 0 or -1 with req->err. */
static int check_batch(gemmd_request *req, uint64_t batch, uint64_t m, uint64_t k, uint64_t n, uint64_t b_batch)
{
    gemm_err *err = &req->err;
    gemm_dtype d = req->op->opt.dtype == GEMM_DTYPE_INVALID ? GEMM_DTYPE_F32 : req->op->opt.dtype;
    if (gemm_check_stack(batch, m, k, d, limits(req), "A", err) != 0 ||
        (b_batch && gemm_check_stack(b_batch, k, n, d, limits(req), "B", err) != 0) ||
        gemm_check_stack(batch, m, n, d, limits(req), "C", err) != 0)
        return -1;
    return 0;
}

/* Resident operands (a=ID / b=ID) fix their dimensions and the dtype; what the query says
 * besides must agree. 0 or -1 (req->err). */
static int apply_ref_shapes(gemmd_request *req)
{
    gemmd_operands *op = req->op;
    gemm_options *o = &op->opt;
    for (int i = 0; i < 2; i++) {
        if (!op->ref[i]) continue;
        const gemm_matrix *r = i ? &op->b : &op->a;
        uint64_t *rows = i ? &o->k : &o->m, *cols = i ? &o->n : &o->k;
        if ((*rows && *rows != r->rows) || (*cols && *cols != r->cols))
            return gemm_err_set(&req->err, 422, "shape_mismatch",
                                "%c is a resident %llux%llu matrix but the query%s says %s %llu and %s %llu", i ? 'B' : 'A',
                                (unsigned long long)r->rows, (unsigned long long)r->cols,
                                i && op->ref[0] ? " or A" : "", i ? "k" : "m", (unsigned long long)*rows,
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

/* A raw product: A then B (less the resident ones), shapes in the query. */
static int begin_raw(gemmd_request *req)
{
    gemmd_operands *op = req->op;
    gemm_err *err = &req->err;
    gemm_options *o = &op->opt;
    if (apply_ref_shapes(req) != 0 || check_raw_dimensions(req) != 0) return -1;
    if (o->dtype == GEMM_DTYPE_INVALID) o->dtype = GEMM_DTYPE_F32;
    if (gemmd_check_math(o, o->dtype, err) != 0 ||
        gemm_check_product(o->m, o->k, o->k, o->n, o->dtype, limits(req), err) != 0)
        return -1;
    if (o->b_shared && !o->batch)
        return gemm_err_set(err, 400, "missing_dimension", "b_shared=1 needs batch=b in the query");
    if (o->batch && (op->ref[0] || op->ref[1]))
        return gemm_err_set(err, 400, "bad_option", "a batched request (batch=b) takes no resident operand (a=ID, b=ID)");
    if (o->batch && check_batch(req, o->batch, o->m, o->k, o->n, o->b_shared ? 0 : o->batch) != 0) return -1;
    size_t a_bytes = 0, b_bytes = 0, c_bytes = 0, total, need;
    uint64_t nb = o->batch ? o->batch : 1, nbb = o->b_shared ? 1 : nb;
    gemm_dtype cd = o->dtype;
    (void)gemm_out_dtype_resolve(o->dtype, o->out_dtype, &cd, NULL); /* checked above */
    if ((!op->ref[0] && (!gemm_matrix_bytes(o->m, o->k, o->dtype, &a_bytes) ||
                         !gemm_mul_size(a_bytes, (size_t)nb, &a_bytes))) ||
        (!op->ref[1] && (!gemm_matrix_bytes(o->k, o->n, o->dtype, &b_bytes) ||
                         !gemm_mul_size(b_bytes, (size_t)nbb, &b_bytes))) ||
        !gemm_add_size(a_bytes, b_bytes, &total) || !gemm_matrix_bytes(o->m, o->n, cd, &c_bytes) ||
        !gemm_mul_size(c_bytes, (size_t)nb, &c_bytes) || !gemm_add_size(total, c_bytes, &need))
        return gemm_err_set(err, 413, "too_large", "the matrices' byte sizes overflow");
    if (total && (!req->has_length || gemmd_request_chunked(req)))
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
                            op->ref[0] && op->ref[1] ? "no operands (both are resident)"
                            : op->ref[0] ? "B alone (A is resident)"
                            : op->ref[1] ? "A alone (B is resident)" : "A then B",
                            gemm_dtype_name(o->dtype), total,
                            op->ref[0] || op->ref[1] ? "" : " (A is m x k, B is k x n, from the query)");
    req->need = need; /* A, B and C; a JSON answer adds its text (gemmd_matmul_begin) */
    op->admit_pending = 1; /* A and B are allocated once admitted (gemmd_body_open) */
    op->a = (gemm_matrix){o->m, o->k, o->dtype, op->a.data, o->batch};
    op->b = (gemm_matrix){o->k, o->n, o->dtype, op->b.data, o->b_shared ? 0 : o->batch};
    op->raw_a_bytes = a_bytes;
    op->raw_total = total;
    return 0;
}

/* The shape of a matrix named in the query of POST /v1/matrices: rows and cols (or m and
 * k), dtype (default float32), checked, and its byte size. 0, or -1 with req->err. */
static int matrix_query_shape(gemmd_request *req, const char *what, const char *example, size_t *bytes)
{
    gemm_err *err = &req->err;
    gemm_options *o = &req->op->opt;
    gemm_matrix *a = &req->op->a;
#define HAS(f) gemm_options_given(o, offsetof(gemm_options, f))
    int given = (HAS(rows) || HAS(m)) && (HAS(cols) || HAS(k));
    a->rows = HAS(rows) ? o->rows : o->m;
    a->cols = HAS(cols) ? o->cols : o->k;
#undef HAS
    if (!given || !a->rows || !a->cols)
        return gemm_err_set(err, given ? 422 : 400, given ? "empty_matrix" : "missing_dimension",
                            "%s needs rows and cols (each at least 1) in the query, e.g. %s", what, example);
    if (o->dtype == GEMM_DTYPE_INVALID) o->dtype = GEMM_DTYPE_F32;
    a->dtype = o->dtype;
    if (gemm_check_matrix(a->rows, a->cols, o->dtype, limits(req), "the matrix", err) != 0) return -1;
    if (!gemm_matrix_bytes(a->rows, a->cols, o->dtype, bytes))
        return gemm_err_set(err, 413, "too_large", "the matrix's byte size overflows");
    return 0;
}

/* A resident matrix's memory (A's): its bytes reserved in resident_mb now, allocated
 * once the request is admitted (gemmd_body_open). 0, or -1 with req->err. */
static int reserve_matrix(gemmd_request *req, size_t bytes)
{
    if (gemmd_matrices_reserve(req->svc->matrices, req->client, bytes, &req->err) != 0) return -1;
    req->op->reserved = bytes;
    req->need = bytes;
    req->op->admit_pending = 1;
    return 0;
}

/* POST /v1/matrices with a raw body: rows and cols (or m and k) and dtype in the query. */
static int begin_matrix_raw(gemmd_request *req)
{
    gemmd_operands *op = req->op;
    size_t bytes;
    if (matrix_query_shape(req, "a raw matrix", "/v1/matrices?rows=4&cols=3&dtype=float32", &bytes) != 0)
        return -1;
    if (!req->has_length || gemmd_request_chunked(req))
        return gemm_err_set(&req->err, 411, "length_required", "raw bodies need a Content-Length (not chunked)");
    if (req->content_length != bytes)
        return gemm_err_set(&req->err, 400, "length_mismatch",
                            "the body has %llu bytes but a %llux%llu %s matrix has %zu",
                            (unsigned long long)req->content_length, (unsigned long long)op->a.rows,
                            (unsigned long long)op->a.cols, gemm_dtype_name(op->opt.dtype), bytes);
    if (reserve_matrix(req, bytes) != 0) return -1;
    op->raw_a_bytes = op->raw_total = bytes;
    return 0;
}

/* POST /v1/matrices?rows=R&cols=C&dtype=T&empty=1, without a body: a matrix whose rows
 * come later, in PUTs of row ranges (routes_matrices.c), over any number of connections. */
static int begin_matrix_empty(gemmd_request *req)
{
    if ((req->has_length && req->content_length != 0) || gemmd_request_chunked(req))
        return gemm_err_set(&req->err, 400, "unexpected_body",
                            "empty=1 makes a matrix to be filled by PUT /v1/matrices/{id}?row=R; this request "
                            "takes no body");
    size_t bytes;
    if (matrix_query_shape(req, "empty=1", "/v1/matrices?rows=4096&cols=4096&dtype=float32&empty=1", &bytes) != 0 ||
        reserve_matrix(req, bytes) != 0)
        return -1;
    req->op->family = GEMMD_FMT_RAW;
    req->op->matrix_empty = 1; /* nothing to read */
    return 0;
}

static int begin(gemmd_request *req, int one_matrix)
{
    gemmd_operands *op = gemmd_operands_new(req);
    if (!op) return -1;
    op->one_matrix = one_matrix;
    gemm_err *err = &req->err;
    if (gemmd_request_begin_body(req, &op->opt) != 0) return -1;
    const char *ct = gemmd_request_header(req, MHD_HTTP_HEADER_CONTENT_TYPE);
    int is_json = gemmd_media_is(ct, "application/json");
    if (one_matrix && !is_json) {
        if (op->opt.empty) return begin_matrix_empty(req);
        if (gemmd_media_is(ct, "application/x-npy")) {
            op->family = GEMMD_FMT_NPY;
            op->rd[0] = gemm_npy_reader_new(limits(req), &req->alloc);
            if (!op->rd[0]) return gemm_err_set(err, 500, "out_of_memory", "cannot allocate an npy reader");
            return guess_need(req, 100);
        }
    } else if (!one_matrix) { /* the query's resident operands, store and return */
        if (take_refs(req, err) != 0) return -1;
        op->store_c = op->opt.store;
        op->return_c = op->opt.ret;
        if (op->return_c && !op->store_c)
            return gemm_err_set(err, 400, "bad_option", "return=1 goes with store=1 (C is always returned otherwise)");
        if (!ct && op->ref[0] && op->ref[1]) { /* both resident: no body at all */
            op->family = GEMMD_FMT_RAW;
            return begin_raw(req);
        }
    }
    if (is_json) {
        const gemmd_config *cfg = &req->svc->cfg;
        if (cfg->max_json_bytes < req->limit) req->limit = cfg->max_json_bytes;
        req->limit_json = 1;
        if (req->has_length && req->content_length > req->limit)
            return gemm_err_set(err, 413, "body_too_large",
                                "the JSON body has %llu bytes; JSON bodies may have at most %llu "
                                "(max_json_mb); send large matrices as raw or .npy",
                                (unsigned long long)req->content_length, (unsigned long long)req->limit);
        if (guess_need(req, one_matrix ? 200 : 250) != 0) return -1;
        /* Decoded as it arrives: matrices go straight into engine memory (out of the
         * request's reservation), the body is never held. */
        uint64_t body_max = req->has_length ? req->content_length : req->limit;
        if (one_matrix) {
            op->js = gemm_json_stream_new_matrix(limits(req), &req->alloc, &op->opt, body_max);
        } else {
            op->js = gemm_json_stream_new(limits(req), &req->alloc, &op->opt, body_max);
            gemm_json_refs refs = {{op->ref[0] != NULL, op->ref[1] != NULL}, json_ref, req};
            if (op->js) gemm_json_stream_set_refs(op->js, &refs, &op->a, &op->b);
        }
        if (!op->js) return gemm_err_set(err, 503, "out_of_memory", "cannot allocate a JSON decoder now; retry later");
        return 0;
    }
    if (gemmd_media_is(ct, "application/octet-stream")) {
        op->family = GEMMD_FMT_RAW;
        return one_matrix ? begin_matrix_raw(req) : begin_raw(req);
    }
    if (gemmd_media_is(ct, "multipart/form-data")) {
        op->family = GEMMD_FMT_NPY;
        if (guess_need(req, one_matrix ? 100 : 150) != 0) return -1;
        op->mp = gemm_multipart_new(ct, &mp_callbacks, req, err);
        return op->mp ? 0 : -1;
    }
    return gemm_err_set(err, 415, "unsupported_media_type", "Content-Type \"%.60s\" is not supported%s",
                        ct ? ct : "(none)",
                        one_matrix ? " for a matrix; send application/json, application/octet-stream (rows, cols "
                                     "and dtype in the query), application/x-npy or multipart/form-data with one "
                                     ".npy part named matrix"
                                   : "; send application/json, application/octet-stream (A then B, shapes in the "
                                     "query) or multipart/form-data with .npy parts a and b");
}

int gemmd_body_begin(gemmd_request *req)
{
    int rc = begin(req, 0);
    if (req->op) req->op->answer = req->op->family; /* unless Accept says (gemmd_matmul_begin) */
    return rc;
}

int gemmd_matrix_begin(gemmd_request *req) { return begin(req, 1); }

int gemmd_body_open(gemmd_request *req)
{
    gemmd_operands *op = req->op;
    if (!op->admit_pending) return 0;
    op->admit_pending = 0;
    size_t a_bytes = op->one_matrix ? op->reserved : op->raw_a_bytes;
    size_t b_bytes = op->one_matrix ? 0 : op->raw_total - op->raw_a_bytes;
    const char *what = "the request's matrices";
    if (a_bytes && !(op->a.data = gemmd_request_alloc(req, a_bytes, what))) return -1;
    if (b_bytes && !(op->b.data = gemmd_request_alloc(req, b_bytes, what))) return -1;
    return 0;
}

/* ---- feed / finish ---------------------------------------------------------- */

void gemmd_body_feed(gemmd_request *req, const char *data, size_t len)
{
    gemmd_operands *op = req->op;
    int rc = 0;
    if (op->family == GEMMD_FMT_JSON) {
        rc = gemm_json_stream_feed(op->js, data, len, &req->err); /* an error ends the decoding */
    } else if (op->family == GEMMD_FMT_RAW) {
        if (len > op->raw_total - op->raw_got) { /* MHD never hands more than Content-Length; guard anyway */
            rc = gemm_err_set(&req->err, 400, "length_mismatch", "more body bytes than Content-Length");
        } else {
            size_t off = op->raw_got, n = off < op->raw_a_bytes ? op->raw_a_bytes - off : 0;
            if (n > len) n = len;
            if (n) memcpy((char *)op->a.data + off, data, n);
            if (len > n) memcpy((char *)op->b.data + (off + n - op->raw_a_bytes), data + n, len - n);
            op->raw_got = off + len;
        }
    } else if (op->mp ? gemm_multipart_feed(op->mp, data, len, &req->err) != 0
                      : gemm_npy_reader_feed(op->rd[0], data, len, &req->err) != 0) {
        uint64_t refused = gemmd_budget_take_refusal();
        if (refused) gemmd_budget_refuse(req->svc->budget, refused, "an .npy part", &req->err, &req->retry_after_s);
        rc = -1;
    }
    if (rc != 0) req->failed = 1;
}

/* Multipart or bare .npy: the parts checked against each other and the limits. */
static int finish_npy(gemmd_request *req)
{
    gemmd_operands *op = req->op;
    gemm_err *err = &req->err;
    int one = op->one_matrix;
    if (one) { /* the single .npy (bare body or one form part); no a=ID, b=ID */
        if (op->mp ? gemm_multipart_finish(op->mp, err) != 0 : npy_done(req, 0, err) != 0) return -1;
        if (!op->have[0]) return gemm_err_set(err, 400, "missing_part", "the form needs a .npy part named matrix");
        if (op->a.batch)
            return gemm_err_set(err, 422, "bad_shape",
                                "the .npy array is 3-D (a batch of %llu matrices); a resident matrix is 2-D",
                                (unsigned long long)op->a.batch);
    } else {
        if (gemm_multipart_finish(op->mp, err) != 0 || take_refs(req, err) != 0) return -1;
        if (!op->have[0] || !op->have[1])
            return gemm_err_set(err, 400, "missing_part", "the form needs .npy parts a and b (missing %s)",
                                !op->have[0] && !op->have[1] ? "both" : (!op->have[0] ? "a" : "b"));
        if (op->a.dtype != op->b.dtype)
            return gemm_err_set(err, 422, "dtype_mismatch", "A is %s but B is %s; send both in one dtype",
                                gemm_dtype_name(op->a.dtype), gemm_dtype_name(op->b.dtype));
    }
    if (op->opt.dtype != GEMM_DTYPE_INVALID && op->opt.dtype != op->a.dtype)
        return gemm_err_set(err, 422, "dtype_mismatch", "dtype %s was asked for but the .npy %s %s; convert %s or "
                            "leave dtype out", gemm_dtype_name(op->opt.dtype), one ? "file holds" : "files hold",
                            gemm_dtype_name(op->a.dtype), one ? "it" : "them");
    if (one) return 0;
    op->opt.dtype = op->a.dtype;
    if (gemmd_check_math(&op->opt, op->a.dtype, err) != 0 ||
        gemm_check_product(op->a.rows, op->a.cols, op->b.rows, op->b.cols, op->a.dtype, limits(req), err) != 0 ||
        gemm_check_batch_pair(op->a.batch, op->b.batch, err) != 0)
        return -1;
    if (op->a.batch && check_batch(req, op->a.batch, op->a.rows, op->a.cols, op->b.cols, op->b.batch) != 0)
        return -1;
    return 0;
}

int gemmd_body_finish(gemmd_request *req)
{
    gemmd_operands *op = req->op;
    req->t_body_ms = gemm_now_ms();
    int rc = 0;
    if (op->family == GEMMD_FMT_JSON) {
        rc = op->one_matrix ? gemm_json_stream_finish_matrix(op->js, &op->opt, &op->a, &req->err)
                            : gemm_json_stream_finish(op->js, &op->opt, &op->a, &op->b, &req->err);
        gemm_json_stream_free(op->js);
        op->js = NULL;
        uint64_t refused = gemmd_budget_take_refusal();
        if (rc != 0 && refused)
            gemmd_budget_refuse(req->svc->budget, refused, "the decoded matrices", &req->err, &req->retry_after_s);
        if (rc == 0) {
            op->opt.dtype = op->a.dtype;
            rc = gemmd_check_math(&op->opt, op->a.dtype, &req->err);
        }
    } else if (op->family == GEMMD_FMT_RAW) {
        if (op->raw_got != op->raw_total)
            rc = gemm_err_set(&req->err, 400, "truncated", "the body ended after %zu of %zu bytes", op->raw_got,
                              op->raw_total);
    } else {
        rc = finish_npy(req);
    }
    req->t_decoded_ms = gemm_now_ms();
    if (rc == 0) gemmd_body_decoded(req);
    return rc;
}

void gemmd_body_decoded(gemmd_request *req)
{
    const gemmd_operands *op = req->op;
    LOG_DEBUG("request body decoded: %s A %llux%llu B %llux%llu bytes=%llu recv_ms=%.3f decode_ms=%.3f",
              gemm_dtype_name(op->a.dtype), (unsigned long long)op->a.rows, (unsigned long long)op->a.cols,
              (unsigned long long)op->b.rows, (unsigned long long)op->b.cols, (unsigned long long)req->bytes_in,
              req->t_body_ms - req->t_start_ms, req->t_decoded_ms - req->t_body_ms);
}
