/*
 * json_stream.h - the JSON request body decoded as it arrives, in bounded memory.
 *
 *   gemm_json_stream *js = gemm_json_stream_new(&limits, alloc, &query_options, content_length);
 *   for each chunk: if (gemm_json_stream_feed(js, chunk, len, &err)) -> stop, answer err
 *   gemm_json_stream_finish(js, &opt, &a, &b, &err);    -> A and B (the caller frees them)
 *   gemm_json_stream_free(js);
 *
 * What a body may hold, how its matrices are stored as they come and which of its errors is
 * reported are docs/API.md's ("JSON", "Batched requests"). The body is never held: a
 * tokenizer walks it byte by byte (chunks may cut any token anywhere) and writes each element
 * straight into a typed buffer from the allocator (json_store.h). Shapes are checked against
 * the limits and the other operand as they come; an operand that cannot be valid stops being
 * stored, but reading goes on, so that the error reported is the one the whole body deserves.
 * An operand that starts before the body names its dtype is held as float64 and converted at
 * the end, each element still rounded once, from its text (json_store.h).
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

/* lim may be NULL (no limits but overflow); opt holds the options so far (the query's), which
 * the body's fields override; body_max is the most bytes the body can have (its
 * Content-Length, else the JSON size limit; 0: unknown): buffers never outgrow what that
 * many bytes can still carry. NULL when the decoder itself cannot be allocated. */
gemm_json_stream *gemm_json_stream_new(const gemm_limits *lim, const gemm_allocator *alloc,
                                       const gemm_options *opt, uint64_t body_max);
void gemm_json_stream_free(gemm_json_stream *s);

/* Operands by reference (resident matrices). given[i]: operand i (0: a, 1: b) is known
 * already (named in the query) and must not be in the body (400 bad_matrix); its shape and
 * dtype are in *a / *b. An operand written {"ref": "ID"} is passed, once the whole body is
 * read, to resolve(), which fills its shape and dtype (data NULL) or fails with *err set
 * (e.g. 404 matrix_not_found); without resolve such an operand is 400 bad_matrix. A
 * resident operand fixes the dtype (422 dtype_mismatch when "dtype", the query or the
 * other operand says otherwise). */
typedef struct {
    int given[2];
    int (*resolve)(void *user, int which, const char *id, gemm_matrix *out, gemm_err *err);
    void *user;
} gemm_json_refs;

/* Sets the operands by reference of this body (before the first byte is fed); a and b
 * hold the shapes and dtypes of the given ones. On success gemm_json_stream_finish leaves
 * a given operand's matrix as it was and writes a resolved one's shape and dtype (data
 * NULL); the caller reads the data from where it keeps resident matrices. */
void gemm_json_stream_set_refs(gemm_json_stream *s, const gemm_json_refs *refs, const gemm_matrix *a,
                               const gemm_matrix *b);

/* A decoder for one matrix on its own (POST /v1/matrices): [[..],[..]], {"shape": [r,c],
 * "data": [flat]} or {"data": [[..]]}, with "dtype" (default float64) and the other options
 * as fields of the object. The same checks and memory as a request's operand; the limits
 * are those of gemm_check_matrix ("the matrix"). Finish with gemm_json_stream_finish_matrix
 * (*m owns a buffer from the allocator on success). */
gemm_json_stream *gemm_json_stream_new_matrix(const gemm_limits *lim, const gemm_allocator *alloc,
                                              const gemm_options *opt, uint64_t body_max);
int gemm_json_stream_finish_matrix(gemm_json_stream *s, gemm_options *opt, gemm_matrix *m, gemm_err *err);

/* The next len bytes of the body. Returns 0, or -1 with *err set when the body cannot
 * become valid JSON (bad_json): the rest need not be fed. Other problems are reported by
 * gemm_json_stream_finish, once the whole body was read. */
int gemm_json_stream_feed(gemm_json_stream *s, const char *data, size_t len, gemm_err *err);

/* The body ended. On success *opt holds the options (dtype resolved: the body's, else the
 * query's, else float64) and *a, *b own buffers from the allocator (the caller frees them);
 * a 3-D operand has its batch in ->batch (rows and cols are each matrix's), a 2-D one 0.
 * On error -1 with *err set, nothing allocated is left, *a and *b have data NULL. */
int gemm_json_stream_finish(gemm_json_stream *s, gemm_options *opt, gemm_matrix *a, gemm_matrix *b,
                            gemm_err *err);

/* Bytes the decoder holds from the allocator now, and the most it has held at once. */
size_t gemm_json_stream_held(const gemm_json_stream *s);
size_t gemm_json_stream_peak(const gemm_json_stream *s);

#ifdef __cplusplus
}
#endif
#endif
