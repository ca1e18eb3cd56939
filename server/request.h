/*
 * request.h - what routes work with: the daemon's services (gemmd_services), the calls of
 * the HTTP layer (http.c, whose server struct no other file sees), and the state of one
 * HTTP request, with the body readers that turn a request body into A, B and options.
 *
 * A request lives from the first call of the access handler to MHD's
 * NOTIFY_COMPLETED callback (gemmd_request_free). Bodies are read as they arrive:
 *   raw     straight into A and B, allocated from the engine once Content-Length and
 *           the shapes in the query are checked;
 *   json    decoded as it arrives (json_stream.h): elements straight into engine memory,
 *           the body itself never held (at most max_json_bytes of it);
 *   npy     multipart parts streamed into npy readers that allocate from the engine.
 */
#ifndef GEMMD_REQUEST_H
#define GEMMD_REQUEST_H

#include <microhttpd.h>
#include <pthread.h>
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
#include "routes.h"
#include "sync.h"
#include "multipart.h"
#include "npy.h"

/* X-Gemm-Split: "panels=P; rows=...; devices=..." for up to GEMM_SPLIT_MAX panels */
#define GEMMD_SPLIT_HDR_LEN (32 + GEMM_SPLIT_MAX * (21 + GEMM_NAME_LEN))
#include "options.h"

/* Answer formats; a request's family is the format of its own body. */
typedef enum { GEMMD_FMT_JSON = 0, GEMMD_FMT_RAW = 1, GEMMD_FMT_NPY = 2, GEMMD_FMT_NONE = 3 } gemmd_format;

typedef struct gemmd_auth gemmd_auth;
typedef struct gemmd_request gemmd_request;
typedef struct gemmd_v2 gemmd_v2;

/* What the routes work with: the daemon's services, owned by http.c, read-only after start
 * except through their own calls (each store and the budget have their own locks). */
typedef struct gemmd_services {
    gemmd_config cfg;
    gemm_engine *engine;
    gemm_engine_info info;     /* described once at start */
    gemmd_jobs *jobs;
    gemmd_matrices *matrices;  /* resident matrices (matrices.h) */
    gemmd_auth *auth;          /* NULL: no tokens configured */
    gemmd_budget *budget;      /* max_inflight_mb: every buffer is charged against it */
    gemm_allocator alloc;      /* charged engine memory (kind inputs), for what no request
                                  holds; a request allocates through its own (req->alloc) */
    gemm_allocator base_alloc; /* the engine's allocator, which the charging ones wrap */
    gemmd_admit *admit;        /* the admission queue (admit.h) */
    struct gemmd_offload *offload; /* threads that encode big JSON answers */
    gemmd_sync *sync;          /* the requests waiting for the engine (sync.h) */
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

/* What a body holds: the operands of a product, one matrix (POST /v1/matrices), or rows
 * of a resident matrix (PUT /v1/matrices/{id}). */
typedef enum { GEMMD_BODY_PRODUCT = 0, GEMMD_BODY_MATRIX, GEMMD_BODY_ROWS } gemmd_body_kind;

struct gemmd_request {
    gemmd_services *svc;       /* the services (the server's own) */
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

    /* memory: reserved at admission, before the body (admit.h); what the request allocates
     * and charges comes out of the reservation, through alloc */
    int client;                /* who, for fairness and shares: a token or an address (admit.h) */
    uint64_t need;             /* bytes to reserve, set by the route's begin() */
    gemmd_resv resv;
    gemmd_budget_alloc_ctx alloc_ctx;
    gemm_allocator alloc;
    gemmd_admit_ticket ticket;
    double t_admitted;
    int holds_ticket;          /* waiting in the queue: the queue holds a reference */
    int admit_pending;         /* allocations planned by begin(), made once admitted */
    int deferred;              /* started at the end of a request without a body */

    /* body reading */
    gemmd_body_kind body_kind;
    gemmd_format family;
    gemmd_format answer;       /* negotiated from Accept */
    gemm_options opt;
    int failed;                /* err holds why; the rest of the body is discarded */
    gemm_err err;
    uint64_t discarded;
    int has_length;
    uint64_t content_length;
    uint64_t limit;            /* body bytes allowed for this request */
    uint64_t body_charged;     /* bytes of the body charged outside its reservation */
    struct gemm_json_stream *js; /* JSON bodies: the decoder (gemm_json_stream_held: its bytes) */
    char *json;                /* the v2 route's JSON header (routes_v2.c), its json_cap bytes
                                  charged in body_charged */
    size_t json_len, json_cap;
    size_t raw_a_bytes, raw_total, raw_got;
    gemm_multipart *mp;
    gemm_npy_reader *rd[2];
    int part;                  /* current part: 0 a, 1 b, 2 text option, -1 none */
    char part_name[16];
    char text[128];
    size_t text_len;
    int have[2];
    gemm_matrix a, b;          /* decoded inputs (engine memory) until handed to a job */
    gemmd_matrix_entry *ref[2];/* A / B named by id (a reference held until the request is
                                  freed); a / b then hold their shape and dtype, data NULL */
    int store_c, return_c;     /* ?store=1: C becomes a resident matrix; &return=1: and is sent */
    size_t reserved;           /* bytes reserved in the matrix store, until added or freed */
    int matrix_empty;          /* POST /v1/matrices?empty=1: created to be filled by PUTs */
    gemmd_matrix_entry *put;   /* PUT /v1/matrices/{id}: the matrix (a reference held) */
    char *put_dst;             /* where its rows go (inside put's host copy) */
    uint64_t put_row0, put_rows; /* the rows claimed, released when the request ends */
    int put_claimed;
    gemm_resident *c_res;      /* store=1: C's engine handle, until the store takes it */

    /* synchronous product; the fields below are under its stripe lock (sync.c) */
    gemm_job job;
    int refs;                  /* the connection's (until NOTIFY_COMPLETED), the engine's
                                  (submit until done()), and short holds; freed at 0 */
    int suspended, job_done;
    int parked;                /* suspended while it waits for admission (sync.h) */
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

    gemmd_v2 *v2;              /* Open Inference Protocol routes (routes_v2.c), else NULL */
    void (*cleanup)(gemmd_request *req); /* frees the route's own state (NULL: none) */
};

gemmd_request *gemmd_request_new(gemmd_services *svc, struct MHD_Connection *conn, const char *method,
                                 const char *url);
void gemmd_request_free(gemmd_request *req);

/* Content-Length into req->content_length / has_length (400 bad_length when it is not a
 * number) and req->limit = max_body_mb: 0, or -1 with req->err. */
int gemmd_request_read_length(gemmd_request *req);
/* Looks at the headers and the query before a byte of the body is read: media type,
 * Content-Length against the limits, raw shapes, options. Returns 0, or -1 with
 * req->err set (the caller answers at once). */
int gemmd_body_begin(gemmd_request *req);
/* gemmd_body_begin for POST /v1/matrices and PUT /v1/matrices/{id}. */
int gemmd_matrix_begin(gemmd_request *req);
int gemmd_rows_begin(gemmd_request *req);
/* One chunk of body; on error req->failed is set and the rest is discarded. */
void gemmd_body_feed(gemmd_request *req, const char *data, size_t len);
/* The body is complete: finishes decoding into req->a, req->b. 0 or -1 (req->err). */
int gemmd_body_finish(gemmd_request *req);

/* Once the request is admitted (its need reserved): the allocations begin() planned (A
 * and B of a raw body, a resident matrix). 0, or -1 with req->err. */
int gemmd_body_open(gemmd_request *req);
/* 503 over_budget for bytes the budget refused (req->err, req->retry_after_s). Returns -1. */
int gemmd_request_refuse(gemmd_request *req, uint64_t bytes, const char *what);

/* Checks a batched product before anything is allocated: A (batch x m x k), B (b_batch x
 * k x n, or one k x n when b_batch is 0) and C (batch x m x n) within the limits. 0 or -1
 * with req->err set. */
int gemmd_check_batch(gemmd_request *req, uint64_t batch, uint64_t m, uint64_t k, uint64_t n, uint64_t b_batch);

/* 1 when operand i (0: A, 1: B) is a resident matrix named by id. */
static inline int gemmd_request_is_ref(const gemmd_request *req, int i) { return req->ref[i] != NULL; }

/* The query door: applies every argument that is an option (options.h), with the sizes MHD
 * decoded (an encoded NUL is refused). 0 or -1 with *err set. */
int gemmd_request_query_options(gemmd_request *req, gemm_options *opt, gemm_err *err);
/* 422 unsupported_math when a math mode is asked for a product that is not float32
 * (math selects how float32 is computed; float64 and int32 are always exact), and 422
 * bad_out_dtype when out_dtype is not one the operands' dtype allows (float16 / bfloat16:
 * float32 or theirs; others: only theirs). 0 or -1. */
int gemmd_check_math(const gemm_options *o, gemm_dtype dtype, gemm_err *err);
/* The dtype of the product's C (after the body: A's dtype and opt.out_dtype, checked). */
gemm_dtype gemmd_request_c_dtype(const gemmd_request *req);
/* A header's value or NULL. */
const char *gemmd_request_header(gemmd_request *req, const char *name);

#endif
