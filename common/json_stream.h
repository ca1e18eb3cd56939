/*
 * json_stream.h - the JSON request body decoded as it arrives, in bounded memory.
 *
 *   gemm_json_stream *js = gemm_json_stream_new(&limits, alloc, &query_options, content_length);
 *   for each chunk: if (gemm_json_stream_feed(js, chunk, len, &err)) -> stop, answer err
 *   gemm_json_stream_finish(js, &opt, &a, &b, &err);    -> A and B (the caller frees them)
 *   gemm_json_stream_free(js);
 *
 * The body is never held: a small tokenizer walks it byte by byte (chunks may split any
 * token anywhere) and writes each element of "a" and "b" straight into a typed buffer
 * taken from the allocator. Nothing else is allocated but the decoder itself (a few KiB).
 *
 * Buffers (json_store.h). A matrix whose size is known before its elements need room (the
 * {"shape", "data"} form with "shape" first; B in rows after A, whose columns are B's rows,
 * when B's first row fits in the first 512 bytes) gets one buffer of exactly its size, if
 * the rest of the body can still carry that many elements. Otherwise the first 512 bytes
 * of elements stay inside the decoder, then room
 * is added in blocks (each half of what is held), never beyond what the limits (max_dim,
 * max_elements, the other operand's shape) and the body bytes still to come allow; when
 * the matrix is complete its blocks are copied into one exact buffer, each given back as
 * it is copied. Nothing is copied while reading.
 *
 * dtype. A "dtype" in the body may come after the matrices and overrides the query's, so an
 * operand that starts before the body has named its dtype is held as float64 (exactly the
 * value strtod gives) and converted when the body ends; float32 is then rounded from the
 * decimal text, not from the double: the rare element whose double lies exactly halfway
 * between two floats has its correct float32 noted as it is read. int32 follows the
 * float64 value (an integer in range, as before). When the dtype comes first, elements are
 * stored in it directly.
 *
 * Checks as the bytes come: JSON syntax (RFC 8259, strict; nesting at most
 * GEMM_JSON_MAX_DEPTH; numbers at most GEMM_JSON_NUMBER_MAX characters), the shape of each
 * operand against max_dim / max_elements and against the other operand, declared shapes
 * before any allocation. An operand that cannot be valid stops being stored at once (its
 * buffer is given back); reading goes on without storing, so that the error reported is
 * the one the whole body deserves, in this order: syntax (bad_json, with byte, line and
 * column), the body not an object, a key given twice, options (the first bad one in the
 * text), the structure of a then b (bad_matrix), the product's shapes and limits
 * (gemm_check_product), data lengths, memory, then the first bad element of a, then of b
 * (bad_matrix for a non-number, bad_value for a value outside the dtype).
 *
 * Keys: "a", "b" and the options whose door is JSON (options.h) at the top, "shape" and
 * "data" in a matrix object, in any order; other keys are read (and must be valid JSON) and
 * ignored; a key read here given twice in one object is 400 (bad_matrix, or
 * duplicate_option for an option).
 *
 * Batches. An operand of a request may be 3-D, a batch of matrices: nested three deep (known
 * when its first row opens with an array, before an element is stored; every matrix is
 * checked against matrix 0 as it closes) or {"shape": [b, r, c], "data": [..]} (checked with
 * gemm_check_stack before anything is allocated). A (b, m, k) pairs with B (b, k, n) or one
 * (k, n) for all, as NumPy matmul broadcasts a leading batch dimension (gemm_check_batch_pair:
 * a 3-D B with a 2-D A is 422 batch_mismatch); the stacks of A, B and C are checked as for a
 * raw batched request. A 3-D operand that cannot pair with the other (a 2-D or resident A for
 * a 3-D B, more matrices than the other has) stops being stored at once; a 3-D B after a
 * 3-D A gets one buffer of its exact size. A batch with a resident operand is 400
 * bad_option. One matrix on its own (gemm_json_stream_new_matrix) is 2-D.
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
/* Body bytes fed so far. */
uint64_t gemm_json_stream_offset(const gemm_json_stream *s);

#ifdef __cplusplus
}
#endif
#endif
