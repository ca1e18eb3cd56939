/*
 * gemm_util.h - helpers of libgemm that the `gemm` command uses too (docs/CLIENT.md,
 * "Helpers"): pure functions of their arguments, no network.
 */
#ifndef GEMM_UTIL_H
#define GEMM_UTIL_H

#include <stdint.h>
#include <stdio.h>

#include "gemm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* "MxK" (also "M,K" or "M*K"; 'x' or 'X') -> 2 dims, or "MxKxN" -> 3 dims. Dimensions are
 * plain decimal integers >= 1. Returns the number of dimensions read (2 or 3), or -1. */
int gemm_client_parse_shape(const char *s, uint64_t dims[3]);

/* Two numbers out of an X-Gemm-Shape value ("512x256", "512,256", "[512, 256]"). 0 or -1. */
int gemm_client_parse_shape_header(const char *s, uint64_t *rows, uint64_t *cols);

/* The stages of *t named in a Server-Timing value ("recv;dur=1.2, queue;dur=0.02, ...");
 * the others are left as they are. Returns how many stages were recognised. */
int gemm_client_parse_server_timing(const char *s, gemm_timing *t);

/* Retry-After: delay-seconds ("3", "0.5") -> milliseconds, or an HTTP date relative to
 * now_epoch_s. Returns -1 when it cannot be parsed. */
long gemm_client_parse_retry_after(const char *s, double now_epoch_s);

/* ---- CSV / TSV text matrices: one row a line; delim ',', '\t', ' ' or 0 (guessed from the
 * first line); blank lines and '#' comments skipped; every row as long as the first. */
typedef struct {
    int line;          /* 1-based line of the problem, 0 when none */
    char message[256];
} gemm_text_error;

/* Parses text[0..len) into a malloc'ed row-major buffer of dtype (*data; free() it).
 * Returns 0 or -1 with *e set. */
int gemm_client_text_parse(const char *text, size_t len, char delim, gemm_dtype dtype,
                           uint64_t *rows, uint64_t *cols, void **data, gemm_text_error *e);

/* Writes a rows x cols matrix as text, values that read back exactly. 0, or -1 (errno set). */
int gemm_client_text_write(FILE *f, char delim, gemm_dtype dtype, uint64_t rows, uint64_t cols,
                           const void *data);

#ifdef __cplusplus
}
#endif
#endif
