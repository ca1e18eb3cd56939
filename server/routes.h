/*
 * routes.h - the route table: every route is one row (method, path pattern, auth, body
 * reader, handler, metric label), read by the HTTP layer, by /metrics for its labels and
 * by the tests that check docs/openapi.yaml. A new route is a row and a handler.
 *
 * A request is resolved from method and path before its body is read (404, 405 with
 * Allow). A body reader then runs begin (after auth: its state, headers and query), open
 * (once admitted: the allocations begin planned), feed (each chunk), finish, and end
 * (frees its state); then handler(req) answers, or suspends the connection (sync.h) until
 * answer(req) answers the finished product.
 */
#ifndef GEMMD_ROUTES_H
#define GEMMD_ROUTES_H

#include <microhttpd.h>
#include <stddef.h>

#include "gemm_types.h"

typedef struct gemmd_request gemmd_request;

/* Methods a row takes (GET implies HEAD). */
enum { GEMMD_GET = 1, GEMMD_POST = 2, GEMMD_PUT = 4, GEMMD_DELETE = 8 };
/* Row flags. */
enum {
    GEMMD_OPEN = 1,   /* answered without a token (health checks) */
    GEMMD_V2 = 2,     /* the Open Inference Protocol's routes: errors in its shape */
    GEMMD_STOPS = 4,  /* refused with 503 once shutdown has begun (new work) */
};

typedef enum MHD_Result (*gemmd_handler)(gemmd_request *req);

typedef struct gemmd_body_reader {
    int (*begin)(gemmd_request *req);
    int (*open)(gemmd_request *req);
    void (*feed)(gemmd_request *req, const char *data, size_t len);
    int (*finish)(gemmd_request *req);
    void (*end)(gemmd_request *req);
} gemmd_body_reader;

typedef struct gemmd_route_desc {
    const char *pattern;  /* "/v1/jobs/{id}/result": literal segments and {name} for one
                             segment of the path, captured in req->param[] in order */
    unsigned methods;
    unsigned flags;
    const char *metric;   /* the route label in /metrics (rows may share one) */
    const gemmd_body_reader *body; /* NULL: no body */
    gemmd_handler handler;
    gemmd_handler answer;
} gemmd_route_desc;

extern const gemmd_route_desc gemmd_routes[];
extern const int gemmd_nroutes;

/* The row for method and path, or NULL: then *status is 404 (no such path) or 405 (the
 * path is known; *allow lists the methods that take it, "GET, HEAD, POST"). Path
 * parameters go into params[0..nparams) (each at most cap bytes, cut to fit). */
const gemmd_route_desc *gemmd_routes_match(const char *method, const char *path, char params[][64], int nparams,
                                           int *status, char *allow, size_t allow_cap);

/* Metric labels: slot i of n (rows that share a label share a slot; the last slot is
 * "other": requests that matched no row). gemmd_route_slot: a row's slot (NULL: other). */
int gemmd_routes_labels(const char **labels, int max);
int gemmd_route_slot(const gemmd_route_desc *r);

/* ---- the handlers (routes_*.c) --------------------------------------------------- */

/* routes_jobs.c: products and the /v1/jobs family. */
int gemmd_matmul_begin(gemmd_request *req); /* gemmd_body_begin and Accept (406) */
int gemmd_jobs_begin(gemmd_request *req);   /* gemmd_body_begin and, for a raw body, its job's place */
enum MHD_Result gemmd_route_matmul(gemmd_request *req);
enum MHD_Result gemmd_route_matmul_answer(gemmd_request *req);
enum MHD_Result gemmd_route_jobs_submit(gemmd_request *req);
enum MHD_Result gemmd_route_job_status(gemmd_request *req);
enum MHD_Result gemmd_route_job_result(gemmd_request *req);
enum MHD_Result gemmd_route_job_delete(gemmd_request *req);

/* routes_matrices.c: /v1/matrices. */
enum MHD_Result gemmd_route_matrix_create(gemmd_request *req);
enum MHD_Result gemmd_route_matrix_list(gemmd_request *req);
enum MHD_Result gemmd_route_matrix_get(gemmd_request *req);
enum MHD_Result gemmd_route_matrix_delete(gemmd_request *req);
enum MHD_Result gemmd_route_matrix_put(gemmd_request *req);
int gemmd_rows_begin(gemmd_request *req); /* PUT's body reader */
void gemmd_rows_feed(gemmd_request *req, const char *data, size_t len);
int gemmd_rows_finish(gemmd_request *req);
void gemmd_rows_end(gemmd_request *req);

/* routes_info.c: operations and the status page; 0 when the engine takes work, else -1
 * with *err (503 shutting_down, device_lost or not_ready) */
int gemmd_not_ready(gemmd_request *req, gemm_err *err);
enum MHD_Result gemmd_route_healthz(gemmd_request *req);
enum MHD_Result gemmd_route_readyz(gemmd_request *req);
enum MHD_Result gemmd_route_info(gemmd_request *req);
enum MHD_Result gemmd_route_metrics(gemmd_request *req);
enum MHD_Result gemmd_route_status_page(gemmd_request *req);
enum MHD_Result gemmd_route_status(gemmd_request *req);

/* routes_v2.c: the Open Inference Protocol (KServe v2), model "matmul". */
enum MHD_Result gemmd_v2_server_meta(gemmd_request *req);
enum MHD_Result gemmd_v2_live(gemmd_request *req);
enum MHD_Result gemmd_v2_ready(gemmd_request *req); /* /v2/health/ready and a model's /ready */
enum MHD_Result gemmd_v2_model_meta(gemmd_request *req);
int gemmd_v2_begin(gemmd_request *req);
void gemmd_v2_feed(gemmd_request *req, const char *data, size_t len);
int gemmd_v2_finish(gemmd_request *req);
void gemmd_v2_end(gemmd_request *req);
enum MHD_Result gemmd_v2_infer(gemmd_request *req);
enum MHD_Result gemmd_v2_answer(gemmd_request *req);
/* The 404 of a path under /v2 that no row has, in the protocol's shape. */
enum MHD_Result gemmd_v2_not_found(gemmd_request *req, const char *path);

#endif
