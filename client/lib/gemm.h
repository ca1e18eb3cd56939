/*
 * gemm.h - libgemm, the C client of the gemmd matrix-multiplication service; docs/CLIENT.md
 * has an example program and every call. A gemm_client is one curl handle with its kept-alive
 * connection: not safe to use from two threads at once. The shared library exports exactly
 * the gemm_client_* functions of this header and gemm_util.h (libgemm.map).
 */
#ifndef GEMM_CLIENT_H
#define GEMM_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "gemm_types.h" /* gemm_dtype, gemm_math */

#ifdef __cplusplus
extern "C" {
#endif

#define GEMM_CLIENT_VERSION "0.1.0"

/* ---- errors ------------------------------------------------------------
 * Every call that can fail returns 0 or -1 and fills a gemm_client_error. */

typedef enum {
    GEMM_CLIENT_OK = 0,
    GEMM_CLIENT_E_SERVER,    /* the server answered with an HTTP error (status, code, message) */
    GEMM_CLIENT_E_CONNECT,   /* could not connect / resolve / transport failure (curl_code) */
    GEMM_CLIENT_E_TIMEOUT,   /* connect or total timeout expired (curl_code) */
    GEMM_CLIENT_E_ABORTED,   /* the progress callback asked to stop */
    GEMM_CLIENT_E_PROTOCOL,  /* the answer did not match the request (shape, length, headers) */
    GEMM_CLIENT_E_ARGUMENT,  /* a bad argument: NULL buffers, zero or overflowing shape */
    GEMM_CLIENT_E_NOMEM      /* out of memory in the client */
} gemm_client_error_kind;

typedef struct {
    gemm_client_error_kind kind;
    int http_status;     /* HTTP status of the last answer, 0 when none arrived */
    int curl_code;       /* CURLcode of a transport failure, 0 otherwise */
    char code[48];       /* the server's error code ("shape_mismatch", ...) or the client's */
    char message[512];   /* the server's message, or the client's / curl's explanation */
    int retries;         /* 503 answers retried before this outcome */
} gemm_client_error;

/* Short name of a kind: "ok", "server", "connect", "timeout", "aborted", "protocol", ... */
const char *gemm_client_error_kind_name(gemm_client_error_kind k);

/* ---- client ------------------------------------------------------------ */

/* Transfer progress (totals 0 when unknown), from the calling thread: non-zero aborts. */
typedef int (*gemm_progress_fn)(void *ctx, uint64_t up_now, uint64_t up_total,
                                uint64_t down_now, uint64_t down_total);

typedef struct {
    const char *token;          /* bearer token (Authorization: Bearer ...), NULL for none */
    long connect_timeout_ms;    /* default 10000 */
    long timeout_ms;            /* whole request, upload to last byte; 0 = no limit (default) */
    int max_retries;            /* retries after 503 queue_full, default 3; 0 disables */
    long max_retry_wait_ms;     /* cap on one Retry-After wait, default 30000 */
    long default_retry_wait_ms; /* wait when a 503 carries no Retry-After, default 1000 */
    gemm_progress_fn progress;  /* optional */
    void *progress_ctx;
    int verbose;                /* non-zero: curl prints the exchange on stderr */
    const char *ca_file;        /* https: PEM bundle to verify the server; NULL = the system's */
} gemm_client_options;

void gemm_client_options_init(gemm_client_options *o);

typedef struct gemm_client gemm_client;

/* url: http://host:port, https://host:port, or host:port for http. The options are copied.
 * Returns NULL with *err set on failure. */
gemm_client *gemm_client_new(const char *url, const gemm_client_options *o, gemm_client_error *err);
void gemm_client_free(gemm_client *c); /* NULL is fine */

/* ---- one product ------------------------------------------------------- */

typedef struct {
    gemm_dtype dtype;     /* float32, float64, int32, float16 or bfloat16 */
    uint64_t m, k, n;     /* A is m x k, B is k x n, C is m x n */
    const void *a;        /* m*k elements, row-major; only read */
    const void *b;        /* k*n elements, row-major; only read */
    void *c;              /* m*n elements, written by gemm_client_multiply / gemm_client_job_fetch */
    const char *kernel;   /* NULL = server default ("auto") */
    gemm_math math;       /* GEMM_MATH_DEFAULT = not sent */
    int tile;             /* 0 = not sent */
    int out_half;         /* float16 / bfloat16: 1 = C in that dtype, 0 = C in float32 */
} gemm_request;

#define GEMM_REQUEST_INIT {GEMM_DTYPE_F32, 0, 0, 0, NULL, NULL, NULL, NULL, GEMM_MATH_DEFAULT, 0, 0}

/* The dtype of C for this request: r->c holds m*n elements of it. */
static inline gemm_dtype gemm_request_c_dtype(const gemm_request *r)
{
    return (r->dtype == GEMM_DTYPE_F16 || r->dtype == GEMM_DTYPE_BF16) && !r->out_half ? GEMM_DTYPE_F32 : r->dtype;
}

/* Durations in milliseconds. Server stages are -1 when the server did not report them. */
typedef struct {
    double recv_ms, decode_ms, queue_ms, h2d_ms, kernel_ms, d2h_ms, encode_ms,
        total_ms;             /* Server-Timing (docs/API.md, "Timing") */
    double client_total_ms;   /* the whole exchange as the client saw it */
    double client_connect_ms; /* time to connect (0 when the connection was reused) */
    double client_first_byte_ms; /* start until the first byte of the answer */
    double client_transfer_ms; /* client_total_ms - total_ms (-1 without total_ms) */
    uint64_t bytes_sent, bytes_received;
    char kernel[48];          /* X-Gemm-Kernel: the kernel that ran ("" if not reported) */
    char math[16];            /* X-Gemm-Math when sent, else "" */
    char device[64];          /* X-Gemm-Device: where it ran ("" if not reported) */
    int retries;              /* 503 answers retried */
} gemm_timing;

/* Synchronous product C = A.B for any dtype. r->c must hold m*n elements. Returns 0, or -1
 * with *err set (C's contents are then unspecified). t may be NULL. */
int gemm_client_multiply(gemm_client *c, const gemm_request *r, gemm_timing *t, gemm_client_error *err);

/* A batch of `batch` products in one request (?batch=): r->a, r->b (or one B for all when
 * b_shared) and r->c hold batch matrices back to back. t describes the whole request. */
int gemm_client_multiply_batch(gemm_client *c, const gemm_request *r, uint64_t batch, int b_shared,
                               gemm_timing *t, gemm_client_error *err);
/* The same product over `streams` connections at once, A in row panels, B uploaded once as
 * a resident matrix (docs/CLIENT.md). streams 0 chooses from the size; 1 is one request. */
int gemm_client_multiply_streams(gemm_client *c, const gemm_request *r, int streams, gemm_timing *t,
                                 gemm_client_error *err);
/* The connections gemm_client_multiply_streams uses for streams = 0. */
int gemm_client_auto_streams(const gemm_request *r);

/* ---- asynchronous jobs ------------------------------------------------- */

typedef enum {
    GEMM_CLIENT_JOB_UNKNOWN = 0,
    GEMM_CLIENT_JOB_QUEUED,
    GEMM_CLIENT_JOB_RUNNING,
    GEMM_CLIENT_JOB_DONE,
    GEMM_CLIENT_JOB_FAILED,
    GEMM_CLIENT_JOB_CANCELLED
} gemm_client_job_state;

const char *gemm_client_job_state_name(gemm_client_job_state s);

typedef struct {
    char id[96];
    gemm_client_job_state state;
    uint64_t m, n;               /* C's shape when known */
    gemm_dtype dtype;
    gemm_timing timing;          /* server stages from the status' "timing" object */
    char error_code[48];         /* for failed jobs */
    char error_message[512];
} gemm_job_info;

/* Queues r (POST /v1/jobs, raw binary); r->c is not used. Writes the job id into id[cap]. */
int gemm_client_job_submit(gemm_client *c, const gemm_request *r, char *id, size_t cap,
                           gemm_client_error *err);
/* GET /v1/jobs/{id}. */
int gemm_client_job_status(gemm_client *c, const char *id, gemm_job_info *info, gemm_client_error *err);
/* Polls (from poll_ms, default 20, doubling up to 500) until the job finished or timeout_ms
 * (0 = none) passed; a failed job returns -1 with its error in *err (kind SERVER). */
int gemm_client_job_wait(gemm_client *c, const char *id, long poll_ms, long timeout_ms,
                         gemm_job_info *info, gemm_client_error *err);
/* GET /v1/jobs/{id}/result as raw binary into c_out: m*n elements of dtype (C's:
 * gemm_request_c_dtype() of the request), checked against the answer. */
int gemm_client_job_fetch(gemm_client *c, const char *id, gemm_dtype dtype, uint64_t m, uint64_t n,
                          void *c_out, gemm_timing *t, gemm_client_error *err);
/* DELETE /v1/jobs/{id}: cancels a queued job or forgets a finished one. */
int gemm_client_job_delete(gemm_client *c, const char *id, gemm_client_error *err);

/* ---- service ----------------------------------------------------------- */

/* GET path ("/v1/info", ...): the body as a string in *body (free() it), the status in
 * *status; only transport errors return -1. */
int gemm_client_get(gemm_client *c, const char *path, char **body, int *status, gemm_client_error *err);

#ifdef __cplusplus
}
#endif
#endif /* GEMM_CLIENT_H */
