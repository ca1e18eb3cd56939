/*
 * json_codec.h - the byte buffer answers are built in, and matrices written as JSON (the
 * server writes {"c": [[..],[..]], "shape": [m,n], "dtype": .., "timing": {..}} around
 * gemm_json_write_matrix). Requests are read by json_stream.h.
 */
#ifndef GEMM_JSON_CODEC_H
#define GEMM_JSON_CODEC_H

#include "gemm_types.h"

#ifdef __cplusplus
extern "C" {
#endif

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
