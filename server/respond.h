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
 * GEMMD_FMT_NONE when nothing acceptable is offered (406). */
gemmd_format gemmd_negotiate(const char *accept, gemmd_format family);
const char *gemmd_format_mime(gemmd_format f);

/* JSON answers are built whole in memory: a C whose JSON would pass max_json_bytes is
 * refused (422 answer_too_large, naming the binary formats) before it is computed or sent.
 * Returns 0 or -1 with *err set. */
int gemmd_check_json_answer(const gemmd_services *srv, uint64_t rows, uint64_t cols, gemm_dtype d, gemm_err *err);

/* Fills the engine's part of *t from a finished job. */
void gemmd_timing_from_job(gemmd_timing *t, const gemm_job_timing *jt);
/* Appends "timing": {...} members' object (recv_ms ... gflops). */
void gemmd_timing_json(gemm_buf *b, const gemmd_timing *t);

enum MHD_Result gemmd_respond_error(gemmd_request *req, const gemm_err *err);
/* 503 shutting_down for a product shutdown gave up on. */
enum MHD_Result gemmd_respond_abandoned(gemmd_request *req);
enum MHD_Result gemmd_respond_errorf(gemmd_request *req, int status, const char *code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
/* A JSON body (taken over: freed here whatever happens). */
enum MHD_Result gemmd_respond_json(gemmd_request *req, int status, gemm_buf *body);
/* The same with one extra header (e.g. Location). */
enum MHD_Result gemmd_respond_json_header(gemmd_request *req, int status, gemm_buf *body, const char *name,
                                          const char *value);
/* A body in any media type (taken over). */
enum MHD_Result gemmd_respond_buf(gemmd_request *req, int status, const char *mime, gemm_buf *body);
/* Adds the common headers, queues and releases resp (NULL: answers 500 instead). */
enum MHD_Result gemmd_respond_queue(gemmd_request *req, int status, struct MHD_Response *resp);

/* What a product answer says besides C itself. */
typedef struct {
    gemm_dtype dtype;
    const char *kernel;
    int tile;
    const char *block;  /* "BMxBNxBK" or "" */
    const char *math;
    const char *device;
    const char *job_id; /* NULL for synchronous products */
    uint64_t batch;     /* 0: C is rows x cols; b: C is b x rows x cols (a batched request) */
    uint64_t batched;   /* products in the launch it ran in (0: alone) */
    const char *batch_mode; /* how: "strided", "loop", ... ("" or NULL: alone) */
    const char *matrix_id; /* C kept as a resident matrix (store=1), else NULL */
    const gemm_job *split; /* the job, when it ran split into row panels; else NULL */
} gemmd_product_meta;

/* A split product (job->split_panels >= 2): the value of its X-Gemm-Split header,
 * "panels=P; rows=r0,r1,...; devices=cuda:0,cuda:1,..." (each device's label up to its
 * first space) into out ("" when not split), and its JSON member
 * ,"split":{"panels":P,"rows":[...],"devices":[...],"streams":[...],"kernel_ms":[...]}
 * appended to b (nothing when not split). */
void gemmd_split_header(const gemm_job *job, char *out, size_t cap);
void gemmd_split_json(gemm_buf *b, const gemm_job *job);

/* Answers C (rows x cols of meta->dtype at data, or meta->batch such matrices) in fmt. JSON is encoded here and
 * release(ctx) is called before returning; raw and npy bodies are sent from data without
 * a copy, and release(ctx) is called when MHD is done with it. req->timing must hold
 * everything but encode_ms and total_ms. */
enum MHD_Result gemmd_respond_product(gemmd_request *req, int status, gemmd_format fmt, const void *data,
                                      uint64_t rows, uint64_t cols, const gemmd_product_meta *meta,
                                      void (*release)(void *ctx), void *ctx);

/* The most bytes the JSON answer of a rows x cols C can take (UINT64_MAX on overflow). */
uint64_t gemmd_json_answer_bytes(uint64_t rows, uint64_t cols, gemm_dtype d);
/* JSON answers of C too big to encode on an HTTP thread (its JSON may pass 1 MiB): they
 * are encoded on an offload thread while the connection is suspended. */
int gemmd_json_answer_is_big(uint64_t rows, uint64_t cols, gemm_dtype d);
/* The buffer block for a callback answer of total bytes: the answer's size up to 256 KiB
 * (libmicrohttpd allocates and zeroes a block with every such answer). */
size_t gemmd_payload_block(uint64_t total);
/* A callback answer's reader: bytes from pos of head then data (data may be NULL with
 * data_len 0) into buf, at most max; MHD_CONTENT_READER_END_OF_STREAM past the end. */
ssize_t gemmd_read_two_parts(const void *head, size_t head_len, const void *data, size_t data_len, uint64_t pos,
                             char *buf, size_t max);
/* The response for an answer of head then data (either may be empty, not both), for a
 * request on connection cx. An answer whose send deadline does not need to know how much
 * the client has taken (gemmd_conn_needs_progress) is sent from where it lies; a larger
 * one through read(cls, ...), which must report progress, block by block. free_cb(cls) is
 * called when the response goes (not when NULL is returned). */
struct MHD_Response *gemmd_two_part_response(gemmd_conn *cx, const void *head, size_t head_len, const void *data,
                                             size_t data_len, MHD_ContentReaderCallback read,
                                             MHD_ContentReaderFreeCallback free_cb, void *cls);
/* Encodes the JSON answer of C into *out, admitted against the memory budget first
 * (*charge: the bytes charged as an answer, given back when it is sent), and fills the
 * encode and total times of req->timing. release(ctx) is called once C has been read,
 * also on failure. 0, or -1 with *err (503 over_budget with req->retry_after_s, 500).
 * Any thread may call it while req's connection is suspended. */
int gemmd_encode_product_json(gemmd_request *req, const void *data, uint64_t rows, uint64_t cols,
                              const gemmd_product_meta *meta, void (*release)(void *ctx), void *ctx, gemm_buf *out,
                              uint64_t *charge, gemm_err *err);
/* Queues an answer encoded by gemmd_encode_product_json (b and its charge taken over),
 * with X-Gemm-Matrix and Location when matrix_id is not NULL (C kept with store=1). */
enum MHD_Result gemmd_respond_encoded_json(gemmd_request *req, int status, gemm_buf *b, uint64_t charge,
                                           const char *matrix_id);

#endif
