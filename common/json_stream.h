/*
 * json_stream.h - the JSON request body decoded as it arrives, in bounded memory: new, feed
 * each chunk, finish (A and B, the caller's), free. What a body may hold and which of its
 * errors is reported are docs/API.md's ("JSON", "Batched requests"). The body is never held:
 * each element goes straight into a typed buffer (json_store.h); an operand that cannot be
 * valid stops being stored, but reading goes on, so that the error reported is the one the
 * whole body deserves.
 */
#ifndef GEMM_JSON_STREAM_H
#define GEMM_JSON_STREAM_H

#include "gemm_types.h"
#include "options.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GEMM_JSON_MAX_DEPTH 64 /* arrays and objects inside each other */

typedef struct gemm_json_stream gemm_json_stream;

/* lim may be NULL; opt: the query's options, which the body's override; body_max: the most
 * bytes the body can have (0: unknown), which bounds every buffer. NULL without memory. */
gemm_json_stream *gemm_json_stream_new(const gemm_limits *lim, const gemm_allocator *alloc,
                                       const gemm_options *opt, uint64_t body_max);
void gemm_json_stream_free(gemm_json_stream *s);

/* Operands by reference (resident matrices). given[i]: operand i (0 a, 1 b) was named in the
 * query and must not be in the body. An operand written {"ref": "ID"} goes, once the body is
 * read, to resolve(), which fills its shape and dtype (data NULL) or sets *err; without
 * resolve it is refused. A resident operand fixes the dtype. */
typedef struct {
    int given[2];
    int (*resolve)(void *user, int which, const char *id, gemm_matrix *out, gemm_err *err);
    void *user;
} gemm_json_refs;

/* Before the first byte: a and b hold the given operands' shapes and dtypes. finish leaves
 * a given operand as it was and writes a resolved one's shape and dtype (data NULL). */
void gemm_json_stream_set_refs(gemm_json_stream *s, const gemm_json_refs *refs, const gemm_matrix *a,
                               const gemm_matrix *b);

/* A decoder for one matrix on its own (POST /v1/matrices; docs/API.md), checked as
 * gemm_check_matrix checks; *m owns a buffer from the allocator on success. */
gemm_json_stream *gemm_json_stream_new_matrix(const gemm_limits *lim, const gemm_allocator *alloc,
                                              const gemm_options *opt, uint64_t body_max);
int gemm_json_stream_finish_matrix(gemm_json_stream *s, gemm_options *opt, gemm_matrix *m, gemm_err *err);

/* The next len bytes: 0, or -1 with *err when the body cannot become valid JSON (the rest
 * need not be fed). Other problems are finish's to report. */
int gemm_json_stream_feed(gemm_json_stream *s, const char *data, size_t len, gemm_err *err);

/* The body ended: 0 with the options (dtype resolved) and A and B (buffers from the
 * allocator; ->batch for a 3-D one), or -1 with *err, nothing left allocated. */
int gemm_json_stream_finish(gemm_json_stream *s, gemm_options *opt, gemm_matrix *a, gemm_matrix *b,
                            gemm_err *err);

#ifdef __cplusplus
}
#endif
#endif
