/*
 * routes_v2.h - the Open Inference Protocol (KServe v2) over HTTP, as a thin adapter over
 * the same body limits, engine and synchronous product path as POST /v1/matmul:
 *
 *   GET  /v2                                   server metadata
 *   GET  /v2/health/live, /v2/health/ready     liveness, readiness (200 or 400)
 *   GET  /v2/models/matmul[/versions/1]        model metadata
 *   GET  /v2/models/matmul[/versions/1]/ready  model readiness
 *   POST /v2/models/matmul[/versions/1]/infer  C = A.B, JSON tensors or binary tensor data
 *
 * http.c hands every path under /v2 here: gemmd_v2_resolve() picks the route,
 * gemmd_v2_start() answers or begins the body, gemmd_v2_body_feed() and
 * gemmd_v2_body_done() read it (binary tensor bytes go straight into the job's inputs),
 * and gemmd_route_matmul_answer() hands the finished product to gemmd_v2_answer(). Every error on these routes is answered
 * by gemmd_v2_respond_error() in the protocol's shape, {"error": "message"}.
 */
#ifndef GEMMD_ROUTES_V2_H
#define GEMMD_ROUTES_V2_H

#include "request.h"

typedef struct gemmd_v2 gemmd_v2;

/* True for "/v2" and every path under "/v2/". */
int gemmd_v2_match(const char *url);
/* Sets req->route (a v2 route; unknown paths too, answered 404 by gemmd_v2_start) and
 * req->allow. Returns 0, 1 when the method is not allowed (405), -1 out of memory. */
int gemmd_v2_resolve(gemmd_request *req, const char *url, const char *method);
/* After auth: answers a metadata or health request, or checks an inference request's
 * headers and limits before its body (phase REQ_BODY on success). */
enum MHD_Result gemmd_v2_start(gemmd_request *req);
void gemmd_v2_body_feed(gemmd_request *req, const char *data, size_t len);
/* The body is complete: submits the product (the connection is suspended) or answers
 * the error. */
enum MHD_Result gemmd_v2_body_done(gemmd_request *req);
/* The finished product's answer (called by gemmd_route_matmul_answer for v2 routes). */
enum MHD_Result gemmd_v2_answer(gemmd_request *req);
/* {"error": message, "code": code} with err's status (422 becomes 400, the protocol's
 * status for a request that cannot be run). */
enum MHD_Result gemmd_v2_respond_error(gemmd_request *req, const gemm_err *err);
void gemmd_v2_free(gemmd_v2 *v);

#endif
