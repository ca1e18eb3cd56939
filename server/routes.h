/*
 * routes.h - the handlers behind each route. Each answers exactly once (or suspends
 * the connection until the engine's done() resumes it).
 */
#ifndef GEMMD_ROUTES_H
#define GEMMD_ROUTES_H

#include "request.h"

/* routes_jobs.c: products. Called once the body is decoded into req->a, req->b. */
enum MHD_Result gemmd_route_matmul(gemmd_request *req);
/* Called when the resumed connection comes back (after done(), or abandoned by shutdown). */
enum MHD_Result gemmd_route_matmul_resumed(gemmd_request *req);
enum MHD_Result gemmd_route_matmul_answer(gemmd_request *req);
enum MHD_Result gemmd_route_jobs_submit(gemmd_request *req);
enum MHD_Result gemmd_route_job_status(gemmd_request *req);
enum MHD_Result gemmd_route_job_result(gemmd_request *req);
enum MHD_Result gemmd_route_job_delete(gemmd_request *req);


/* routes_matrices.c: /v1/matrices. create is called once the body is decoded into req->a. */
enum MHD_Result gemmd_route_matrix_create(gemmd_request *req);
enum MHD_Result gemmd_route_matrix_list(gemmd_request *req);
enum MHD_Result gemmd_route_matrix_get(gemmd_request *req);
enum MHD_Result gemmd_route_matrix_delete(gemmd_request *req);
/* PUT /v1/matrices/{id}?row=R: called once the rows are written into the matrix. */
enum MHD_Result gemmd_route_matrix_put(gemmd_request *req);

/* routes_info.c */
enum MHD_Result gemmd_route_healthz(gemmd_request *req);
enum MHD_Result gemmd_route_readyz(gemmd_request *req);
enum MHD_Result gemmd_route_info(gemmd_request *req);
enum MHD_Result gemmd_route_metrics(gemmd_request *req);

#endif
