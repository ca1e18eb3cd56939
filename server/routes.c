/*
 * routes.c - the route table and its matcher (routes.h).
 */
#include "routes.h"

#include <stdio.h>
#include <string.h>

#include "body.h"

/* The body readers (routes.h), one per kind of body. */
static const gemmd_body_reader product = {gemmd_matmul_begin, gemmd_body_open, gemmd_body_feed, gemmd_body_finish,
                                          gemmd_operands_end};
static const gemmd_body_reader job = {gemmd_jobs_begin, gemmd_body_open, gemmd_body_feed, gemmd_body_finish,
                                      gemmd_operands_end};
static const gemmd_body_reader matrix = {gemmd_matrix_begin, gemmd_body_open, gemmd_body_feed, gemmd_body_finish,
                                         gemmd_operands_end};
static const gemmd_body_reader rows = {gemmd_rows_begin, NULL, gemmd_rows_feed, gemmd_rows_finish, gemmd_rows_end};
static const gemmd_body_reader v2 = {gemmd_v2_begin, NULL, gemmd_v2_feed, gemmd_v2_finish, gemmd_v2_end};
#define NO_BODY NULL

const gemmd_route_desc gemmd_routes[] = {
    /* products */
    {"/v1/matmul", GEMMD_POST, GEMMD_STOPS, "/v1/matmul", &product, gemmd_route_matmul, gemmd_route_matmul_answer},
    {"/v1/jobs", GEMMD_POST, GEMMD_STOPS, "/v1/jobs", &job, gemmd_route_jobs_submit, NULL},
    {"/v1/jobs/{id}", GEMMD_GET, 0, "/v1/jobs/{id}", NO_BODY, gemmd_route_job_status, NULL},
    {"/v1/jobs/{id}", GEMMD_DELETE, 0, "DELETE /v1/jobs/{id}", NO_BODY, gemmd_route_job_delete, NULL},
    {"/v1/jobs/{id}/result", GEMMD_GET, 0, "/v1/jobs/{id}/result", NO_BODY, gemmd_route_job_result,
     gemmd_route_matmul_answer},
    /* resident matrices */
    {"/v1/matrices", GEMMD_POST, GEMMD_STOPS, "/v1/matrices", &matrix, gemmd_route_matrix_create, NULL},
    {"/v1/matrices", GEMMD_GET, 0, "GET /v1/matrices", NO_BODY, gemmd_route_matrix_list, NULL},
    {"/v1/matrices/{id}", GEMMD_GET, 0, "/v1/matrices/{id}", NO_BODY, gemmd_route_matrix_get, NULL},
    {"/v1/matrices/{id}", GEMMD_PUT, GEMMD_STOPS, "PUT /v1/matrices/{id}", &rows, gemmd_route_matrix_put, NULL},
    {"/v1/matrices/{id}", GEMMD_DELETE, 0, "DELETE /v1/matrices/{id}", NO_BODY, gemmd_route_matrix_delete, NULL},
    /* operations */
    {"/healthz", GEMMD_GET, GEMMD_OPEN, "/healthz", NO_BODY, gemmd_route_healthz, NULL},
    {"/readyz", GEMMD_GET, GEMMD_OPEN, "/readyz", NO_BODY, gemmd_route_readyz, NULL},
    {"/v1/info", GEMMD_GET, 0, "/v1/info", NO_BODY, gemmd_route_info, NULL},
    {"/metrics", GEMMD_GET, 0, "/metrics", NO_BODY, gemmd_route_metrics, NULL},
    {"/", GEMMD_GET, GEMMD_OPEN, "/", NO_BODY, gemmd_route_status_page, NULL},
    {"/v1/status", GEMMD_GET, 0, "/v1/status", NO_BODY, gemmd_route_status, NULL},
    /* the Open Inference Protocol (KServe v2) */
    {"/v2", GEMMD_GET, GEMMD_V2, "/v2[/models/{model}[/ready]]", NO_BODY, gemmd_v2_server_meta, NULL},
    {"/v2/health/live", GEMMD_GET, GEMMD_V2 | GEMMD_OPEN, "/v2/health/{live,ready}", NO_BODY, gemmd_v2_live, NULL},
    {"/v2/health/ready", GEMMD_GET, GEMMD_V2 | GEMMD_OPEN, "/v2/health/{live,ready}", NO_BODY, gemmd_v2_ready, NULL},
    {"/v2/models/{model}", GEMMD_GET, GEMMD_V2, "/v2[/models/{model}[/ready]]", NO_BODY, gemmd_v2_model_meta, NULL},
    {"/v2/models/{model}/versions/{version}", GEMMD_GET, GEMMD_V2, "/v2[/models/{model}[/ready]]", NO_BODY,
     gemmd_v2_model_meta, NULL},
    {"/v2/models/{model}/ready", GEMMD_GET, GEMMD_V2, "/v2[/models/{model}[/ready]]", NO_BODY, gemmd_v2_ready, NULL},
    {"/v2/models/{model}/versions/{version}/ready", GEMMD_GET, GEMMD_V2, "/v2[/models/{model}[/ready]]", NO_BODY,
     gemmd_v2_ready, NULL},
    {"/v2/models/{model}/infer", GEMMD_POST, GEMMD_V2 | GEMMD_STOPS, "/v2/models/{model}/infer", &v2,
     gemmd_v2_infer, gemmd_v2_answer},
    {"/v2/models/{model}/versions/{version}/infer", GEMMD_POST, GEMMD_V2 | GEMMD_STOPS, "/v2/models/{model}/infer",
     &v2, gemmd_v2_infer, gemmd_v2_answer},
};
const int gemmd_nroutes = (int)(sizeof gemmd_routes / sizeof gemmd_routes[0]);

/* Whether path matches pattern segment by segment; {name} takes one non-empty segment,
 * captured into params. */
static int matches(const char *pattern, const char *path, char params[][64], int nparams)
{
    int np = 0;
    const char *p = pattern, *s = path;
    while (*p && *s) {
        if (*p != '/' || *s != '/') return 0;
        p++;
        s++;
        size_t sn = strcspn(s, "/"), pn = strcspn(p, "/");
        if (p[0] == '{') {
            if (sn == 0) return 0;
            if (np < nparams) snprintf(params[np], 64, "%.*s", (int)(sn < 63 ? sn : 63), s);
            np++;
        } else if (pn != sn || strncmp(p, s, sn) != 0) {
            return 0;
        }
        p += pn;
        s += sn;
    }
    return *p == '\0' && *s == '\0';
}

/* A row's methods, in the order Allow lists them (GET implies HEAD). */
static const struct { const char *name; unsigned bit; } methods[] = {
    {"GET", GEMMD_GET}, {"HEAD", GEMMD_GET}, {"POST", GEMMD_POST}, {"PUT", GEMMD_PUT}, {"DELETE", GEMMD_DELETE}};
#define NMETHODS (sizeof methods / sizeof methods[0])

const gemmd_route_desc *gemmd_routes_match(const char *method, const char *path, char params[][64], int nparams,
                                           int *status, char *allow, size_t allow_cap)
{
    unsigned want = 0, known = 0;
    for (size_t i = 0; i < NMETHODS; i++)
        if (strcmp(method, methods[i].name) == 0) want = methods[i].bit;
    for (int i = 0; i < gemmd_nroutes; i++) {
        const gemmd_route_desc *r = &gemmd_routes[i];
        if (!matches(r->pattern, path, params, nparams)) continue;
        if (r->methods & want) return r;
        known |= r->methods;
    }
    *status = known ? 405 : 404;
    if (allow_cap) allow[0] = '\0';
    for (size_t i = 0; known && i < NMETHODS; i++) {
        if (!(known & methods[i].bit)) continue;
        size_t n = strlen(allow);
        snprintf(allow + n, allow_cap - n, "%s%s", n ? ", " : "", methods[i].name);
    }
    return NULL;
}

/* Whether row i is the first with its metric label. */
static int first_label(int i)
{
    for (int j = 0; j < i; j++)
        if (strcmp(gemmd_routes[j].metric, gemmd_routes[i].metric) == 0) return 0;
    return 1;
}

int gemmd_route_slot(const gemmd_route_desc *r)
{
    int slot = 0;
    for (int i = 0; i < gemmd_nroutes; slot += first_label(i), i++)
        if (r && strcmp(gemmd_routes[i].metric, r->metric) == 0) return slot;
    return slot; /* other */
}

int gemmd_routes_labels(const char **labels, int max)
{
    int n = 0;
    for (int i = 0; i < gemmd_nroutes && n < max - 1; i++)
        if (first_label(i)) labels[n++] = gemmd_routes[i].metric;
    labels[n++] = "other";
    return n;
}
