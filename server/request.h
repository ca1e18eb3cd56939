/*
 * request.h - what routes work with: the daemon's services (gemmd_services), and the state
 * every HTTP request has, from the first call of the access handler to MHD's
 * NOTIFY_COMPLETED.
 */
#ifndef GEMMD_REQUEST_H
#define GEMMD_REQUEST_H

#include <microhttpd.h>
#include <stdatomic.h>
#include <stdint.h>

#include "admit.h"
#include "budget.h"
#include "config.h"
#include "conns.h"
#include "engine.h"
#include "gemm_types.h"
#include "jobs.h"
#include "matrices.h"
#include "metrics.h"
#include "options.h"
#include "routes.h"
#include "sync.h"

/* X-Gemm-Split: "panels=P; rows=...; devices=..." for up to GEMM_SPLIT_MAX panels */
#define GEMMD_SPLIT_HDR_LEN (32 + GEMM_SPLIT_MAX * (21 + GEMM_NAME_LEN))

/* Answer formats; a request's family is the format of its own body. */
typedef enum { GEMMD_FMT_JSON = 0, GEMMD_FMT_RAW = 1, GEMMD_FMT_NPY = 2, GEMMD_FMT_NONE = 3 } gemmd_format;

typedef struct gemmd_auth gemmd_auth;
typedef struct gemmd_request gemmd_request;
typedef struct gemmd_operands gemmd_operands; /* body.h */
typedef struct gemmd_rows gemmd_rows;         /* routes_matrices.c */
typedef struct gemmd_v2 gemmd_v2;             /* routes_v2.c */

/* The daemon's services, owned by http.c, read-only after start except through their own
 * calls (each store and the budget have their own locks). */
typedef struct gemmd_services {
    gemmd_config cfg;
    gemm_engine *engine;
    gemm_engine_info info;     /* described once at start */
    gemmd_jobs *jobs;
    gemmd_matrices *matrices;
    gemmd_auth *auth;          /* NULL: no tokens configured */
    gemmd_budget *budget;      /* max_inflight_mb: every buffer is charged against it */
    gemm_allocator alloc;      /* charged engine memory (kind inputs), for what no request
                                  holds; a request allocates through its own (req->alloc) */
    gemm_allocator base_alloc; /* the engine's allocator, which the charging ones wrap */
    gemmd_admit *admit;
    struct gemmd_offload *offload; /* threads that encode big JSON answers */
    gemmd_sync *sync;          /* the requests waiting for the engine */
    gemmd_conns *conns;        /* connection limits and deadlines */
    _Atomic int stopping;      /* shutdown has begun: no new products */
    _Atomic int inflight;      /* requests between their first call and NOTIFY_COMPLETED */
} gemmd_services;

/* Times of one product, in ms; the stages are consecutive, so they add up to <= total. */
typedef struct {
    double recv_ms, decode_ms, queue_ms, h2d_ms, kernel_ms, d2h_ms, compute_ms, encode_ms;
    double total_ms, gflops;
    double total_base_ms;      /* time before this request (a job's own total) */
    int have_compute;
} gemmd_timing;

typedef enum { REQ_START = 0, REQ_DEFER, REQ_ADMIT, REQ_BODY, REQ_WAIT, REQ_DONE } gemmd_req_phase;

struct gemmd_request {
    gemmd_services *svc;
    struct MHD_Connection *conn;
    char method[12];
    char path[160];
    const gemmd_route_desc *route; /* NULL: none matched */
    char param[2][64];         /* the path's {parameters}, in order (routes.h) */
    char job_id[GEMMD_JOB_ID_LEN + 8]; /* a valid job or matrix id from the path, else "" */
    int owner;                 /* gemmd_auth_identify() + 1 with tokens, else 0 (jobs.h) */
    int retry_after_s;         /* Retry-After of a 503 answer (0: the default, 1) */
    gemmd_req_phase phase;
    double t_start_ms, t_body_ms, t_decoded_ms;
    uint64_t bytes_in, bytes_out;
    int status;                /* the answer's status once queued (0: none) */
    gemmd_conn *cx;            /* the connection's deadlines (NULL: none) */
    int close_conn;            /* answer with Connection: close */
    char allow[40];            /* Allow header of a 405 */
    gemm_err err;

    /* the body as HTTP frames it: its length and limit; after an error (failed) the rest is
     * read and dropped (discarded) */
    int has_length, failed, limit_json;
    uint64_t content_length, limit, discarded;

    /* memory: reserved at admission, before the body (admit.h); what the request allocates
     * and charges comes out of the reservation, through alloc */
    int client;                /* who, for fairness and shares: a token or an address */
    uint64_t need;             /* bytes to reserve, set by the body reader's begin() */
    gemmd_resv resv;
    gemmd_budget_alloc_ctx alloc_ctx;
    gemm_allocator alloc;
    gemmd_admit_ticket ticket;
    double t_admitted;
    int deferred;              /* started at the end of a request without a body */

    /* waiting for the engine or for admission; the fields below are under its stripe lock
     * (sync.c) */
    gemm_job *job;             /* the product on the engine (gemmd_sync_begin) */
    int refs;                  /* the connection's (until NOTIFY_COMPLETED), the engine's
                                  (submit until done()), and short holds; freed at 0 */
    int suspended, job_done;
    int parked;                /* suspended while it waits for admission */
    int gone;                  /* its client left while it waited for admission */
    int abandoned;             /* shutdown gave up waiting: answer 503, the engine keeps req */
    gemmd_request *pend_next, *pend_prev, *hold_next;

    /* an answer encoded on an offload thread (the connection suspended meanwhile) */
    int prepared;              /* 1: prepared_buf is the answer; -1: prepared_err is */
    gemm_buf prepared_buf;
    uint64_t prepared_charge;  /* its charge against the budget */
    gemm_err prepared_err;
    gemmd_job_entry *offload_entry; /* the kept job whose result is being encoded */

    /* answer */
    gemmd_timing timing;
    char hdr_kernel[GEMM_NAME_LEN];
    char hdr_device[GEMM_NAME_LEN];
    char hdr_split[GEMMD_SPLIT_HDR_LEN]; /* X-Gemm-Split of a split product, else "" */

    /* the route's own state, made by its body reader's begin(), freed by end() (routes.h) */
    gemmd_operands *op;
    gemmd_rows *rows;
    gemmd_v2 *v2;
};

gemmd_request *gemmd_request_new(gemmd_services *svc, struct MHD_Connection *conn, const char *method,
                                 const char *url);
void gemmd_request_free(gemmd_request *req);

/* Content-Length into content_length / has_length (400 bad_length when it is not a number)
 * and limit = max_body_mb: 0, or -1 with req->err. */
int gemmd_request_read_length(gemmd_request *req);
/* What every body reader checks first: gemmd_request_read_length, the length against the
 * limit (413 body_too_large), and the query's options into *opt. 0 or -1 (req->err). */
int gemmd_request_begin_body(gemmd_request *req, gemm_options *opt);
/* bytes from req's charging allocator; NULL with req->err set (503 over_budget naming what,
 * or 503 out_of_memory). */
void *gemmd_request_alloc(gemmd_request *req, size_t bytes, const char *what);
const char *gemmd_request_header(gemmd_request *req, const char *name);
/* Whether the Content-Type ct is of media type (parameters after ';' aside). */
int gemmd_media_is(const char *ct, const char *type);
/* Whether the body comes chunked (Transfer-Encoding). */
int gemmd_request_chunked(gemmd_request *req);

#endif
