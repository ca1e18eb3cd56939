/*
 * routes_matrices.c - /v1/matrices: upload a resident matrix (whole, or empty and then
 * filled by PUTs of its rows), list, download, delete. The store (matrices.c) keeps them;
 * products name them by id (body.c).
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "body.h"
#include "log.h"
#include "respond.h"
#include "routes.h"

static enum MHD_Result no_such_matrix(gemmd_request *req)
{
    return gemmd_respond_errorf(req, 404, "matrix_not_found",
                                "no resident matrix %.40s is kept here: it never existed, was deleted, or was "
                                "forgotten by a restart", req->job_id);
}

/* A matrix's description, and with Location (201, created) or without (200). */
static enum MHD_Result describe(gemmd_request *req, int status, gemmd_matrix_entry *e)
{
    char loc[GEMMD_JOB_ID_LEN + 24];
    snprintf(loc, sizeof loc, "/v1/matrices/%s", e->id);
    gemm_buf b = {0};
    gemmd_matrices_describe_json(req->svc->matrices, e, &b);
    gemm_buf_puts(&b, "\n");
    return gemmd_respond_buf(req, status, "application/json", &b, status == 201 ? loc : NULL);
}

/* POST /v1/matrices: the body is decoded into op->a (engine memory). */
enum MHD_Result gemmd_route_matrix_create(gemmd_request *req)
{
    gemmd_services *srv = req->svc;
    gemmd_operands *op = req->op;
    size_t bytes; /* raw bodies reserved exactly before reading; the others an estimate (body.c) */
    if (!gemm_matrix_bytes(op->a.rows, op->a.cols, op->a.dtype, &bytes))
        return gemmd_respond_errorf(req, 413, "too_large", "the matrix's byte size overflows");
    if (op->reserved != bytes) {
        if (op->reserved) gemmd_matrices_unreserve(srv->matrices, req->client, op->reserved);
        op->reserved = 0;
        if (gemmd_matrices_reserve(srv->matrices, req->client, bytes, &req->err) != 0)
            return gemmd_respond_error(req, &req->err);
        op->reserved = bytes;
    }
    gemmd_budget_adopt(srv->budget, op->a.data, GEMMD_MEM_RESIDENT, &req->resv); /* it outlives the request */
    gemmd_matrix_entry *e = gemmd_matrices_add(srv->matrices, &op->a, NULL, req->owner, req->client, (int)op->family,
                                               op->matrix_empty, &req->err);
    if (!e) return gemmd_respond_error(req, &req->err);
    op->reserved = 0;
    snprintf(req->job_id, sizeof req->job_id, "%s", e->id); /* the access log shows its prefix */
    LOG_DEBUG("matrix %.*s stored: %llux%llu %s", GEMMD_JOB_LOG_ID(e->id), (unsigned long long)e->m.rows,
              (unsigned long long)e->m.cols, gemm_dtype_name(e->m.dtype));
    enum MHD_Result rc = describe(req, 201, e);
    gemmd_matrices_put(srv->matrices, e);
    return rc;
}

enum MHD_Result gemmd_route_matrix_list(gemmd_request *req)
{
    gemm_buf b = {0};
    gemmd_matrices_list_json(req->svc->matrices, req->owner, &b);
    return gemmd_respond_buf(req, 200, "application/json", &b, NULL);
}

enum MHD_Result gemmd_route_matrix_get(gemmd_request *req)
{
    gemmd_services *srv = req->svc;
    gemmd_matrix_entry *e = gemmd_matrices_get(srv->matrices, req->job_id, req->owner);
    if (!e) return no_such_matrix(req);
    gemmd_format fmt = GEMMD_FMT_NONE;
    int rc = -1;
    if (!gemmd_matrices_ready(srv->matrices, e))
        gemm_err_set(&req->err, 409, "matrix_incomplete", "the matrix is still being filled (PUT of its rows); it "
                     "can be read once every row is written");
    else if ((rc = gemmd_accept(req, (gemmd_format)e->family, &fmt)) == 0 && fmt == GEMMD_FMT_JSON)
        rc = gemmd_check_json_answer(srv, e->m.rows, e->m.cols, e->m.dtype, &req->err);
    if (rc != 0) {
        gemmd_matrices_put(srv->matrices, e);
        return gemmd_respond_error(req, &req->err);
    }
    if (fmt == GEMMD_FMT_JSON) { /* the same shape POST takes back: {"id", "shape", "dtype", "data": [[..]]} */
        gemm_buf b = {0};
        gemm_buf_printf(&b, "{\"id\":\"%s\",\"shape\":[%llu,%llu],\"dtype\":\"%s\",\"data\":", e->id,
                        (unsigned long long)e->m.rows, (unsigned long long)e->m.cols, gemm_dtype_name(e->m.dtype));
        gemm_json_write_matrix(&b, &e->m);
        gemm_buf_puts(&b, "}\n");
        gemmd_matrices_put(srv->matrices, e);
        return gemmd_respond_buf(req, 200, "application/json", &b, NULL);
    }
    gemmd_product_meta meta = {.dtype = e->m.dtype, .matrix_id = e->id};
    /* The entry (and its data) lives until the answer is sent: the reference goes with it. */
    return gemmd_respond_product(req, 200, fmt, e->m.data, e->m.rows, e->m.cols, &meta, gemmd_matrix_release, e);
}

enum MHD_Result gemmd_route_matrix_delete(gemmd_request *req)
{
    if (gemmd_matrices_delete(req->svc->matrices, req->job_id, req->owner) != 0) return no_such_matrix(req);
    gemm_buf b = {0};
    return gemmd_respond_buf(req, 204, NULL, &b, NULL);
}

/* ---- PUT /v1/matrices/{id}?row=R: raw rows of a matrix made with empty=1 ------------ */

/* Whole rows from row R on, written straight into the matrix. Each row is written once:
 * the rows are claimed before a byte is read, and freed again if the body does not
 * arrive whole. */
struct gemmd_rows {
    gemmd_matrix_entry *e;     /* the matrix (a reference held) */
    char *dst;                 /* where its rows go (inside e's host copy) */
    uint64_t row0, rows;       /* the rows claimed */
    int claimed;
    size_t total, got;
};

int gemmd_rows_begin(gemmd_request *req)
{
    gemm_err *err = &req->err;
    gemmd_rows *w = calloc(1, sizeof *w);
    if (!w) return gemm_err_set(err, 503, "out_of_memory", "cannot allocate the request now; retry later");
    req->rows = w;
    gemm_options opt;
    gemm_options_init(&opt);
    if (gemmd_request_begin_body(req, &opt) != 0) return -1;
    if (!gemmd_media_is(gemmd_request_header(req, MHD_HTTP_HEADER_CONTENT_TYPE), "application/octet-stream"))
        return gemm_err_set(err, 415, "unsupported_media_type",
                            "PUT /v1/matrices/{id} takes raw rows: Content-Type application/octet-stream, "
                            "row-major little-endian, the first row's index in ?row=R");
    gemmd_matrix_entry *e = req->job_id[0] ? gemmd_matrices_get(req->svc->matrices, req->job_id, req->owner) : NULL;
    if (!(w->e = e))
        return gemm_err_set(err, 404, "matrix_not_found",
                            "no resident matrix with that id is kept here (never created, deleted, or "
                            "forgotten by a restart)");
    if (!gemm_options_given(&opt, offsetof(gemm_options, row)))
        return gemm_err_set(err, 400, "missing_dimension", "PUT needs ?row=R: the index of the first row sent");
    if (!req->has_length || gemmd_request_chunked(req))
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
    w->row0 = opt.row;
    w->rows = req->content_length / row_bytes;
    if (gemmd_matrices_claim_rows(req->svc->matrices, e, w->row0, w->rows, err) != 0) return -1;
    w->claimed = 1;
    w->dst = (char *)e->m.data + (size_t)w->row0 * row_bytes;
    w->total = (size_t)req->content_length;
    return 0;
}

void gemmd_rows_feed(gemmd_request *req, const char *data, size_t len)
{
    gemmd_rows *w = req->rows;
    if (len > w->total - w->got) { /* MHD never hands more than Content-Length; guard anyway */
        gemm_err_set(&req->err, 400, "length_mismatch", "more body bytes than Content-Length");
        req->failed = 1;
        return;
    }
    memcpy(w->dst + w->got, data, len);
    w->got += len;
}

int gemmd_rows_finish(gemmd_request *req)
{
    req->t_body_ms = req->t_decoded_ms = gemm_now_ms();
    gemmd_rows *w = req->rows;
    if (w->got == w->total) return 0;
    return gemm_err_set(&req->err, 400, "truncated", "the body ended after %zu of %zu bytes", w->got, w->total);
}

void gemmd_rows_end(gemmd_request *req)
{
    gemmd_rows *w = req->rows;
    if (!w) return;
    if (w->claimed) /* rows of a PUT that did not finish are free for another one */
        gemmd_matrices_release_rows(req->svc->matrices, w->e, w->row0, w->rows, 0);
    gemmd_matrices_put(req->svc->matrices, w->e);
    free(w);
    req->rows = NULL;
}

enum MHD_Result gemmd_route_matrix_put(gemmd_request *req)
{
    gemmd_rows *w = req->rows;
    gemmd_matrix_entry *e = w->e;
    uint64_t filled = gemmd_matrices_release_rows(req->svc->matrices, e, w->row0, w->rows, 1);
    w->claimed = 0;
    snprintf(req->job_id, sizeof req->job_id, "%s", e->id);
    LOG_DEBUG("matrix %.*s: rows %llu..%llu written, %llu of %llu filled", GEMMD_JOB_LOG_ID(e->id),
              (unsigned long long)w->row0, (unsigned long long)(w->row0 + w->rows), (unsigned long long)filled,
              (unsigned long long)e->m.rows);
    return describe(req, 200, e);
}
