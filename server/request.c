/*
 * request.c - the state every request has, and what every body reader asks of it.
 */
#include "request.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

gemmd_request *gemmd_request_new(gemmd_services *svc, struct MHD_Connection *conn, const char *method,
                                 const char *url)
{
    gemmd_request *req = calloc(1, sizeof *req);
    if (!req) return NULL;
    req->svc = svc;
    req->conn = conn;
    req->t_start_ms = gemm_now_ms();
    req->refs = 1; /* the connection's */
    snprintf(req->method, sizeof req->method, "%s", method ? method : "?");
    snprintf(req->path, sizeof req->path, "%s", url ? url : "?");
    /* The path goes into log lines: no control characters or spaces from the network. */
    for (char *p = req->path; *p; p++)
        if ((unsigned char)*p < 0x21 || *p == 0x7f) *p = '?';
    for (char *p = req->method; *p; p++)
        if ((unsigned char)*p < 0x21 || *p == 0x7f) *p = '?';
    gemm_err_clear(&req->err);
    req->resv.budget = svc->budget;
    req->alloc_ctx = (gemmd_budget_alloc_ctx){svc->budget, svc->base_alloc, GEMMD_MEM_INPUT, &req->resv};
    req->alloc = gemmd_budget_allocator(&req->alloc_ctx);
    return req;
}

void gemmd_request_free(gemmd_request *req)
{
    if (req->route && req->route->body) req->route->body->end(req); /* the route's own state */
    if (req->prepared == 1) { /* encoded but never sent: the connection went away */
        gemm_buf_free(&req->prepared_buf);
        gemmd_budget_release(req->svc->budget, GEMMD_MEM_ANSWER, req->prepared_charge);
    }
    /* The reservation goes back last, whole: the buffers it held are freed by now (an
     * answer's, a moment later, with the response). An admitted request ends in the queue
     * even when kept buffers took its whole reservation (gemmd_budget_adopt). */
    gemmd_resv_end(&req->resv);
    if (req->t_admitted > 0)
        gemmd_admit_done(req->svc->admit, &req->ticket, (gemm_now_ms() - req->t_admitted) / 1000.0);
    free(req);
}

const char *gemmd_request_header(gemmd_request *req, const char *name)
{
    return MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, name);
}

int gemmd_media_is(const char *ct, const char *type)
{
    if (!ct) return 0;
    size_t n = strlen(type);
    while (*ct == ' ' || *ct == '\t') ct++;
    if (strncasecmp(ct, type, n) != 0) return 0;
    char c = ct[n];
    return c == '\0' || c == ';' || c == ' ' || c == '\t';
}

int gemmd_request_chunked(gemmd_request *req)
{
    const char *te = gemmd_request_header(req, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    for (const char *p = te; p && *p; p++)
        if (strncasecmp(p, "chunked", 7) == 0) return 1;
    return 0;
}

/* The query door: every argument that is an option (options.h), with the sizes MHD decoded,
 * so that an encoded NUL (%00) inside a key or value is seen. */
struct query_ctx {
    gemm_options *opt;
    gemm_err *err;
    int failed;
};

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

static int query_options(gemmd_request *req, gemm_options *opt, gemm_err *err)
{
    struct query_ctx q = {opt, err, 0};
    MHD_get_connection_values_n(req->conn, MHD_GET_ARGUMENT_KIND, query_arg, &q);
    gemm_options_door(opt); /* the body's door may repeat the query's options */
    return q.failed ? -1 : 0;
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

int gemmd_request_begin_body(gemmd_request *req, gemm_options *opt)
{
    if (gemmd_request_read_length(req) != 0) return -1;
    if (req->has_length && req->content_length > req->limit)
        return gemm_err_set(&req->err, 413, "body_too_large",
                            "the body has %llu bytes; this server takes at most %llu (max_body_mb)",
                            (unsigned long long)req->content_length, (unsigned long long)req->limit);
    return query_options(req, opt, &req->err);
}

void *gemmd_request_alloc(gemmd_request *req, size_t bytes, const char *what)
{
    gemmd_budget_take_refusal();
    void *p = gemm_alloc(&req->alloc, bytes);
    if (p) return p;
    if (gemmd_budget_take_refusal())
        gemmd_budget_refuse(req->svc->budget, bytes, what, &req->err, &req->retry_after_s);
    else
        gemm_err_set(&req->err, 503, "out_of_memory", "cannot allocate %zu bytes for %s now; retry later", bytes, what);
    return NULL;
}
