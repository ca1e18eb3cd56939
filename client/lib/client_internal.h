/*
 * client_internal.h - what the files of libgemm share: the client handle and one HTTP
 * exchange (gemm_xfer). Not installed, not part of the API.
 */
#ifndef GEMM_CLIENT_INTERNAL_H
#define GEMM_CLIENT_INTERNAL_H

#include <curl/curl.h>

#include "gemm.h"

struct gemm_client {
    CURL *curl;
    char *base;        /* URL without a trailing '/' */
    char *auth_header; /* "Authorization: Bearer ..." or NULL */
    char *ca_file;     /* copy of o.ca_file or NULL */
    gemm_client_options o;
    char errbuf[CURL_ERROR_SIZE];
};

typedef enum { GEMM_HTTP_GET, GEMM_HTTP_POST, GEMM_HTTP_DELETE, GEMM_HTTP_PUT } gemm_http_method;

/* One request and its answer. The caller fills the "request" part and calls
 * gemm_xfer_run(), which retries 503 answers as the options allow. */
typedef struct {
    /* request */
    gemm_http_method method;
    const char *path_query;        /* "/v1/matmul?m=..." */
    const unsigned char *part[2];  /* body: part[0] then part[1] (POST) */
    size_t part_len[2];
    int want_binary;               /* a 2xx answer is C in raw binary, written into dst */
    void *dst;
    size_t dst_len;                /* exact length expected */
    uint64_t exp_m, exp_n;         /* expected X-Gemm-Shape */
    uint64_t exp_b;                /* batched: expected X-Gemm-Shape b,m,n (0: m,n) */
    size_t text_limit;             /* cap on bodies kept as text (errors, JSON) */

    /* upload state */
    int upart;
    size_t uoff;

    /* answer */
    int status;
    char shape[64], kernel[48], math[16], device[64], location[256], content_type[96];
    char server_timing[512];
    long retry_after_ms;           /* -1 when absent */
    int have_length;
    uint64_t content_length;
    size_t got;                    /* bytes written into dst */
    char *text;                    /* other bodies, NUL-terminated (malloc'ed) */
    size_t text_len, text_cap;
    int header_checked;
    int protocol_error;
    char protocol_msg[256];
    int nomem;
    gemm_client *cl;
} gemm_xfer;

void gemm_xfer_init(gemm_xfer *x, gemm_client *cl, gemm_http_method m, const char *path_query);
void gemm_xfer_free(gemm_xfer *x);

/* Runs the exchange (with 503 retries). Returns 0 when a complete answer arrived, whatever
 * its status; -1 with *err set on transport, timeout, abort or protocol failures. t (may be
 * NULL) receives the client-side timing and the server's stages. */
int gemm_xfer_run(gemm_xfer *x, gemm_timing *t, gemm_client_error *err);

/* Turns a non-2xx answer into *err (kind SERVER, the JSON error's code and message).
 * Always returns -1. */
int gemm_xfer_server_error(const gemm_xfer *x, gemm_client_error *err);

/* Sets *err; returns -1. */
int gemm_client_err(gemm_client_error *err, gemm_client_error_kind kind, const char *code,
                    const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
void gemm_client_err_clear(gemm_client_error *err);

/* Builds "?m=..&k=..&n=..&dtype=..[&kernel=..][&math=..][&tile=..]" for a request into
 * buf. Returns -1 (err set) when the request is invalid. */
int gemm_request_query(const gemm_request *r, const char *path, char *buf, size_t cap,
                       gemm_client_error *err);

#endif
