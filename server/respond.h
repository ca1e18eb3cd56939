/*
 * respond.h - answers: JSON errors, products in JSON / octet-stream / npy, the
 * Server-Timing and X-Gemm-* headers on every answer, and Accept negotiation.
 *
 * Every gemmd_respond_* call queues exactly one response on req's connection (or fails
 * with MHD_NO, which closes it) and records its status for the log and the metrics.
 */
#ifndef GEMMD_RESPOND_H
#define GEMMD_RESPOND_H

#include "json_codec.h"
#include "request.h"

/* The format an Accept header asks for; family when Accept is absent or says * / *;
 * GEMMD_FMT_NONE when nothing acceptable is offered. */
gemmd_format gemmd_negotiate(const char *accept, gemmd_format family);
/* gemmd_negotiate on req's Accept: 0 with *fmt, or -1 with req->err (406 not_acceptable). */
int gemmd_accept(gemmd_request *req, gemmd_format family, gemmd_format *fmt);

/* 422 answer_too_large when C's JSON could pass max_json_bytes (JSON answers are built
 * whole), before it is computed or sent. 0 or -1 with *err. */
int gemmd_check_json_answer(const gemmd_services *srv, uint64_t rows, uint64_t cols, gemm_dtype d, gemm_err *err);
/* The most bytes the JSON answer of a rows x cols C can take (UINT64_MAX on overflow). */
uint64_t gemmd_json_answer_bytes(uint64_t rows, uint64_t cols, gemm_dtype d);
/* The rows of m-row answers, batch of them (0: one): UINT64_MAX when that overflows. */
uint64_t gemmd_answer_rows(uint64_t m, uint64_t batch);
/* JSON answers that may pass this (gemmd_json_answer_bytes) are encoded on an offload
 * thread, not an HTTP thread. */
#define GEMMD_JSON_OFFLOAD_BYTES (1u << 20)

/* Fills the engine's part of *t from a finished job. */
void gemmd_timing_from_job(gemmd_timing *t, const gemm_job_timing *jt);
/* Appends pre then "kernel", "tile", "block", "math" and "device": what ran where. */
void gemmd_ran_fields_json(gemm_buf *b, const char *pre, const char *kernel, int tile, const char *block,
                           const char *math, const char *device);
void gemmd_ran_json(gemm_buf *b, const char *pre, const gemm_job *job);
/* Appends "timing"'s object (recv_ms ... gflops). */
void gemmd_timing_json(gemm_buf *b, const gemmd_timing *t);
/* A synchronous product left the engine: what ran where and its timing go into req's
 * headers. 0 when it is done, else -1 with req->err (503 shutting_down, or the engine's). */
int gemmd_product_outcome(gemmd_request *req, const gemm_job *job);

enum MHD_Result gemmd_respond_error(gemmd_request *req, const gemm_err *err);
/* After gemmd_sync_wait or _status (sync.h): the route's answer when its product is done,
 * 503 shutting_down when shutdown gave up on it, else nothing yet. */
enum MHD_Result gemmd_respond_waited(gemmd_request *req, int sync_state);
enum MHD_Result gemmd_respond_errorf(gemmd_request *req, int status, const char *code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
/* A body in mime (NULL: none), taken over: freed here whatever happens; with a Location
 * header when location is not NULL. */
enum MHD_Result gemmd_respond_buf(gemmd_request *req, int status, const char *mime, gemm_buf *body,
                                  const char *location);
/* Adds the common headers, queues and releases resp (NULL: answers 500 instead). */
enum MHD_Result gemmd_respond_queue(gemmd_request *req, int status, struct MHD_Response *resp);

/* What a product answer says besides C itself. */
typedef struct {
    const gemm_job *job;   /* the product: kernel, device, batch, split (NULL: a matrix as kept) */
    gemm_dtype dtype;      /* C's, without a job */
    const char *job_id;    /* an async job's id, else NULL */
    const char *matrix_id; /* C kept as a resident matrix (store=1), else NULL */
    const gemm_allocator *free_with; /* C is the answer's: freed with it once read (or NULL) */
} gemmd_product_meta;

/* Answers C (rows x cols, or the job's batch of such) in fmt: JSON encoded here (then
 * release(ctx)), raw and npy sent from data without a copy (release(ctx) once MHD is done). */
enum MHD_Result gemmd_respond_product(gemmd_request *req, int status, gemmd_format fmt, const void *data,
                                      uint64_t rows, uint64_t cols, const gemmd_product_meta *meta,
                                      void (*release)(void *ctx), void *ctx);
/* The JSON answer of C into *out, admitted against the budget first (*charge, given back
 * when it is sent); release(ctx) once C is read, also on failure. 0, or -1 with *err.
 * Any thread may call it while req's connection is suspended. */
int gemmd_encode_product_json(gemmd_request *req, const void *data, uint64_t rows, uint64_t cols,
                              const gemmd_product_meta *meta, void (*release)(void *ctx), void *ctx, gemm_buf *out,
                              uint64_t *charge, gemm_err *err);
/* Queues an answer encoded by gemmd_encode_product_json (b and its charge taken over),
 * with X-Gemm-Matrix and Location when matrix_id is not NULL (C kept with store=1). */
enum MHD_Result gemmd_respond_encoded_json(gemmd_request *req, int status, gemm_buf *b, uint64_t charge,
                                           const char *matrix_id);

/* An answer's text of at most est bytes, admitted before it is written: 0 with *b
 * allocated and *outside the bytes charged beyond req's reservation, or -1 (503). */
int gemmd_answer_text_begin(gemmd_request *req, uint64_t est, gemm_buf *b, uint64_t *outside, gemm_err *err);
/* The text is written: shrunk to fit and charged what it holds (*charge); -1 (freed,
 * nothing charged) when it could not be written. */
int gemmd_answer_text_end(gemmd_request *req, gemm_buf *b, uint64_t est, uint64_t outside, uint64_t *charge);
/* Queues head (taken over: freed and its charge given back with the answer) then data
 * (freed with free_with once MHD is done with it) as one answer of mime, with one more
 * header. */
enum MHD_Result gemmd_respond_parts(gemmd_request *req, int status, const char *mime, gemm_buf *head, uint64_t charge,
                                    const void *data, size_t data_len, const gemm_allocator *free_with,
                                    const char *name, const char *value);

#endif
