/*
 * json_codec.h - matrices in JSON.
 *
 * Request body:  {"a": A, "b": B, "dtype": "float32", "kernel": "tiled", "tile": 32,
 *                 "math": "fp32"}
 * where a matrix is nested arrays [[1,2],[3,4]] or {"shape": [m,k], "data": [flat]}, and
 * an operand may be a batch of them: [[[..]],[[..]]] or {"shape": [b,m,k], "data": [flat]}.
 * dtype defaults to float64 when absent. int32 values must be integers in range.
 *
 * Answer body (written by the server around gemm_json_write_matrix):
 *   {"c": [[..],[..]], "shape": [m,n], "dtype": "...", "kernel": "...", "timing": {...}}
 */
#ifndef GEMM_JSON_CODEC_H
#define GEMM_JSON_CODEC_H

#include "gemm_types.h"
#include "json_stream.h"
#include "options.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Decodes a whole request body in one piece with the streaming decoder (json_stream.h,
 * which the daemon feeds chunk by chunk). Options present in the body are applied to *opt
 * (over what the query string already set). A and B come from alloc; the caller frees them.
 * Errors: 400 bad_json (syntax, with the position), 400 bad_matrix (ragged rows,
 * non-numeric elements, data length != shape, missing "a"/"b"), 422 bad_value (int32
 * value not an integer or out of range, float out of the dtype's range), 422 bad_option,
 * and those of gemm_check_product(). */
int gemm_json_decode_request(const char *body, size_t len, const gemm_limits *lim,
                             const gemm_allocator *alloc, gemm_options *opt,
                             gemm_matrix *a, gemm_matrix *b, gemm_err *err);

/* The same with operands by reference (gemm_json_refs, json_stream.h). */
int gemm_json_decode_request_refs(const char *body, size_t len, const gemm_limits *lim,
                                  const gemm_allocator *alloc, gemm_options *opt, gemm_matrix *a,
                                  gemm_matrix *b, const gemm_json_refs *refs, gemm_err *err);

/* One matrix on its own (POST /v1/matrices; gemm_json_stream_new_matrix in one piece):
 * [[..],[..]], {"shape": [r,c], "data": [flat]} or {"data": [[..]]}, with an optional "dtype"
 * (default float64). Errors as above and those of gemm_check_matrix(). */
int gemm_json_decode_matrix(const char *body, size_t len, const gemm_limits *lim, const gemm_allocator *alloc,
                            gemm_options *opt, gemm_matrix *m, gemm_err *err);

/* A growable byte buffer for building answers. */
typedef struct {
    char *data;
    size_t len, cap;
    int failed; /* set when an allocation failed; further appends do nothing */
} gemm_buf;

void gemm_buf_init(gemm_buf *b);
void gemm_buf_free(gemm_buf *b);
void gemm_buf_append(gemm_buf *b, const void *p, size_t n);
void gemm_buf_puts(gemm_buf *b, const char *s);
void gemm_buf_printf(gemm_buf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Appends a JSON string literal (quotes and escapes included). */
void gemm_buf_json_string(gemm_buf *b, const char *s);

/* Appends m as nested arrays: float32 with 9 significant digits, float64 with 17 (both
 * round-trip), int32 exactly; NaN and infinities as null (JSON has no literal for them). */
void gemm_json_write_matrix(gemm_buf *out, const gemm_matrix *m);

#ifdef __cplusplus
}
#endif
#endif
