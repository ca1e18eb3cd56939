/*
 * routes_matrices.c - /v1/matrices: upload a resident matrix, list, download, delete.
 * The store (matrices.c) keeps them; products name them by id (routes_jobs.c).
 */
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "respond.h"
#include "routes.h"

static enum MHD_Result no_such_matrix(gemmd_request *req)
{
    return gemmd_respond_errorf(req, 404, "matrix_not_found",
                                "no resident matrix %.40s is kept here: it never existed, was deleted, or was "
                                "forgotten by a restart", req->job_id);
}

/* POST /v1/matrices: the body is decoded into req->a (engine memory). */
enum MHD_Result gemmd_route_matrix_create(gemmd_request *req)
{
    gemmd_services *srv = req->svc;
    gemm_err err;
    gemm_err_clear(&err);
    if (!req->reserved) { /* raw bodies reserved before reading; the others now */
        size_t bytes;
        if (!gemm_matrix_bytes(req->a.rows, req->a.cols, req->a.dtype, &bytes))
            return gemmd_respond_errorf(req, 413, "too_large", "the matrix's byte size overflows");
        if (gemmd_matrices_reserve(srv->matrices, req->client, bytes, &err) != 0)
            return gemmd_respond_error(req, &err);
        req->reserved = bytes;
    }
    char id[GEMMD_JOB_ID_LEN + 1];
    gemmd_budget_adopt(srv->budget, req->a.data, GEMMD_MEM_RESIDENT, &req->resv); /* it outlives the request */
    if ((req->matrix_empty
             ? gemmd_matrices_add_empty(srv->matrices, &req->a, req->owner, req->client, (int)req->family, id, &err)
             : gemmd_matrices_add(srv->matrices, &req->a, NULL, req->owner, req->client, (int)req->family, id, &err)) != 0)
        return gemmd_respond_error(req, &err);
    req->reserved = 0;
    snprintf(req->job_id, sizeof req->job_id, "%s", id); /* the access log shows its prefix */
    gemmd_matrix_entry *e = gemmd_matrices_get(srv->matrices, id, GEMMD_OWNER_ANY);
    if (!e) return gemmd_respond_errorf(req, 410, "matrix_gone", "the matrix was deleted before the answer");
    gemm_buf b;
    gemm_buf_init(&b);
    gemmd_matrices_describe_json(srv->matrices, e, &b);
    gemm_buf_puts(&b, "\n");
    gemmd_matrices_put(srv->matrices, e);
    char loc[GEMMD_JOB_ID_LEN + 24];
    snprintf(loc, sizeof loc, "/v1/matrices/%s", id);
    LOG_DEBUG("matrix %.*s stored: %llux%llu %s", GEMMD_JOB_LOG_ID(id), (unsigned long long)req->a.rows,
              (unsigned long long)req->a.cols, gemm_dtype_name(req->a.dtype));
    return gemmd_respond_json_header(req, 201, &b, MHD_HTTP_HEADER_LOCATION, loc);
}

enum MHD_Result gemmd_route_matrix_list(gemmd_request *req)
{
    gemm_buf b;
    gemm_buf_init(&b);
    gemmd_matrices_list_json(req->svc->matrices, req->owner, &b);
    return gemmd_respond_json(req, 200, &b);
}

static void release_matrix(void *ctx)
{
    gemmd_matrix_entry *e = ctx;
    gemmd_matrices_put(e->store, e);
}

enum MHD_Result gemmd_route_matrix_get(gemmd_request *req)
{
    gemmd_services *srv = req->svc;
    gemmd_matrix_entry *e = gemmd_matrices_get(srv->matrices, req->job_id, req->owner);
    if (!e) return no_such_matrix(req);
    if (!gemmd_matrices_ready(srv->matrices, e)) {
        gemmd_matrices_put(srv->matrices, e);
        return gemmd_respond_errorf(req, 409, "matrix_incomplete",
                                    "the matrix is still being filled (PUT of its rows); it can be read once "
                                    "every row is written");
    }
    gemmd_format fmt = gemmd_negotiate(gemmd_request_header(req, MHD_HTTP_HEADER_ACCEPT), (gemmd_format)e->family);
    if (fmt == GEMMD_FMT_NONE) {
        gemmd_matrices_put(srv->matrices, e);
        return gemmd_respond_errorf(req, 406, "not_acceptable",
                                    "Accept offers nothing this server answers: use application/json, "
                                    "application/octet-stream or application/x-npy");
    }
    gemm_err err;
    if (fmt == GEMMD_FMT_JSON) {
        if (gemmd_check_json_answer(srv, e->m.rows, e->m.cols, e->m.dtype, &err) != 0) {
            gemmd_matrices_put(srv->matrices, e);
            return gemmd_respond_error(req, &err);
        }
        /* The same shape POST takes back: {"id", "shape", "dtype", "data": [[..]]} */
        gemm_buf b;
        gemm_buf_init(&b);
        gemm_buf_printf(&b, "{\"id\":\"%s\",\"shape\":[%llu,%llu],\"dtype\":", e->id, (unsigned long long)e->m.rows,
                        (unsigned long long)e->m.cols);
        gemm_buf_json_string(&b, gemm_dtype_name(e->m.dtype));
        gemm_buf_puts(&b, ",\"data\":");
        gemm_json_write_matrix(&b, &e->m);
        gemm_buf_puts(&b, "}\n");
        gemmd_matrices_put(srv->matrices, e);
        return gemmd_respond_json(req, 200, &b);
    }
    gemmd_product_meta meta = {0};
    meta.dtype = e->m.dtype;
    meta.matrix_id = e->id;
    /* The entry (and its data) lives until the answer is sent: the reference goes with it. */
    return gemmd_respond_product(req, 200, fmt, e->m.data, e->m.rows, e->m.cols, &meta, release_matrix, e);
}

enum MHD_Result gemmd_route_matrix_delete(gemmd_request *req)
{
    if (gemmd_matrices_delete(req->svc->matrices, req->job_id, req->owner) != 0) return no_such_matrix(req);
    gemm_buf b;
    gemm_buf_init(&b);
    return gemmd_respond_buf(req, 204, NULL, &b);
}

enum MHD_Result gemmd_route_matrix_put(gemmd_request *req)
{
    gemmd_services *srv = req->svc;
    gemmd_matrix_entry *e = req->put;
    uint64_t filled = gemmd_matrices_release_rows(srv->matrices, e, req->put_row0, req->put_rows, 1);
    req->put_claimed = 0;
    snprintf(req->job_id, sizeof req->job_id, "%s", e->id);
    LOG_DEBUG("matrix %.*s: rows %llu..%llu written, %llu of %llu filled", GEMMD_JOB_LOG_ID(e->id),
              (unsigned long long)req->put_row0, (unsigned long long)(req->put_row0 + req->put_rows),
              (unsigned long long)filled, (unsigned long long)e->m.rows);
    gemm_buf b;
    gemm_buf_init(&b);
    gemmd_matrices_describe_json(srv->matrices, e, &b);
    gemm_buf_puts(&b, "\n");
    return gemmd_respond_json(req, 200, &b);
}
