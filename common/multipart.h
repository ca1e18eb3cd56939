/*
 * multipart.h - a streaming multipart/form-data parser (RFC 7578) for bodies that can
 * be hundreds of MB: parts are delivered to callbacks as they arrive, never buffered.
 */
#ifndef GEMM_MULTIPART_H
#define GEMM_MULTIPART_H

#include "gemm_types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    /* A part begins: name and filename from Content-Disposition (filename may be NULL),
     * content_type may be NULL. Return 0 to go on, -1 (with *err set) to stop. */
    int (*part_begin)(void *user, const char *name, const char *filename,
                      const char *content_type, gemm_err *err);
    /* Bytes of the current part's body, in order, any chunk size. */
    int (*part_data)(void *user, const void *data, size_t len, gemm_err *err);
    /* The current part ended. */
    int (*part_end)(void *user, gemm_err *err);
} gemm_multipart_callbacks;

typedef struct gemm_multipart gemm_multipart;

/* content_type is the request's Content-Type header; the boundary is taken from it
 * (quoted or not). NULL with 400 bad_multipart when it has none or it is invalid. */
gemm_multipart *gemm_multipart_new(const char *content_type, const gemm_multipart_callbacks *cb,
                                   void *user, gemm_err *err);
/* Feeds body bytes; 0 or -1 (400 bad_multipart for malformed framing or part headers
 * over 8 KiB, or a callback's error). */
int gemm_multipart_feed(gemm_multipart *mp, const void *data, size_t len, gemm_err *err);
/* The body ended: -1 with 400 truncated unless the closing boundary was seen. */
int gemm_multipart_finish(gemm_multipart *mp, gemm_err *err);
void gemm_multipart_free(gemm_multipart *mp);

#ifdef __cplusplus
}
#endif
#endif
