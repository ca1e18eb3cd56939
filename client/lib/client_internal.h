/* client_internal.h - what the files of libgemm share: the handle and one HTTP exchange. */
#ifndef GEMM_CLIENT_INTERNAL_H
#define GEMM_CLIENT_INTERNAL_H

#include <cjson/cJSON.h>
#include <curl/curl.h>

#include "gemm.h"
#include "json_codec.h" /* gemm_buf */

struct gemm_client {
    CURL *curl;
    char *base;        /* URL without a trailing '/' */
    char *auth_header; /* "Authorization: Bearer ..." or NULL; o.token points into it */
    char *ca_file;     /* copy of the option or NULL; o.ca_file points to it */
    gemm_client_options o;
    char errbuf[CURL_ERROR_SIZE];
};

typedef enum { GEMM_HTTP_GET, GEMM_HTTP_POST, GEMM_HTTP_DELETE, GEMM_HTTP_PUT } gemm_http_method;

/* One request and its answer: the caller fills the request part (zero is every default). */
typedef struct {
    /* request */
    gemm_client *cl;
    gemm_http_method method;
    const char *path_query;        /* "/v1/matmul?m=..." */
    const unsigned char *part[2];  /* body: part[0] then part[1] (POST, PUT) */
    size_t part_len[2];
    void *dst;                     /* non-NULL: a 2xx answer is C in raw binary, written here */
    size_t dst_len;                /* its exact length */
    uint64_t exp_b, exp_m, exp_n;  /* expected X-Gemm-Shape: b,m,n (exp_b 0: m,n) */
    size_t text_limit;             /* cap on bodies kept as text (errors, JSON); 0: 1 MiB */

    /* upload state */
    int upart;
    size_t uoff;

    /* answer */
    int status;
    struct {
        char shape[64], kernel[48], math[16], device[64], location[256], content_type[96];
        char server_timing[512];
        long retry_after_ms;       /* -1 when absent */
        int have_length;
        uint64_t content_length;
    } h;                           /* the headers of the last status line */
    size_t got;                    /* bytes written into dst */
    gemm_buf text;                 /* other bodies (gemm_buf_free it) */
    int header_checked, protocol_error;
    char protocol_msg[256];
} gemm_xfer;

/* Runs the exchange (with 503 retries): 0 when a complete answer arrived, whatever its
 * status, else -1 with *err set. t (may be NULL) receives the timing. */
int gemm_xfer_run(gemm_xfer *x, gemm_timing *t, gemm_client_error *err);

/* gemm_xfer_run, then a non-2xx answer into *err (kind SERVER) and -1; with json, a 2xx body
 * parsed into *json (NULL when not JSON; cJSON_Delete it). x->text is freed. */
int gemm_xfer_call(gemm_xfer *x, cJSON **json, gemm_timing *t, gemm_client_error *err);

/* Sleeps ms milliseconds, asking the progress callback whether to stop: 0, or -1 (stop). */
int gemm_client_pause(gemm_client *c, long ms);

/* Sets *err; returns -1. */
int gemm_client_err(gemm_client_error *err, gemm_client_error_kind kind, const char *code,
                    const char *fmt, ...) __attribute__((format(printf, 4, 5)));
#define GEMM_ARG_ERR(err, ...) gemm_client_err(err, GEMM_CLIENT_E_ARGUMENT, "bad_argument", __VA_ARGS__)

/* The start of every public call: err may be NULL (a local one is used), and is cleared. */
#define GEMM_ERR_BEGIN(err)                                                                    \
    gemm_client_error err##_local;                                                             \
    if (!err) err = &err##_local;                                                              \
    memset(err, 0, sizeof *err)

/* Non-zero for a non-empty string of [A-Za-z0-9._-] (a kernel name, job or matrix id):
 * it goes into a URL as it is. */
int gemm_url_safe(const char *s);

/* path and r's query ("?m=..&k=..&n=..&dtype=..", options) into buf; -1 (err set) when too long. */
int gemm_request_query(const gemm_request *r, const char *path, char *buf, size_t cap,
                       gemm_client_error *err);

/* The eight server stages of gemm_timing, recv_ms ... total_ms, by index (parse.c). */
enum { GEMM_STAGES = 8 };
extern const char *const gemm_stage_names[GEMM_STAGES]; /* "recv", ..., "total" */
double *gemm_timing_stage(gemm_timing *t, int i);
void gemm_timing_unset(gemm_timing *t); /* every stage and client_transfer_ms -1, the rest 0 */

#endif
