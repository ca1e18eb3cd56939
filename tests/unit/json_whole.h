/* json_whole.h - a whole JSON body through the streaming decoder (json_stream.h) in one
 * piece, for the tests: as the daemon decodes it, fed at once. */
#ifndef TEST_JSON_WHOLE_H
#define TEST_JSON_WHOLE_H

#include "json_stream.h"

/* A request body: options in it over *opt; A and B from alloc (the caller frees them). */
static inline int gemm_json_decode_request(const char *body, size_t len, const gemm_limits *lim,
                                           const gemm_allocator *alloc, gemm_options *opt, gemm_matrix *a,
                                           gemm_matrix *b, gemm_err *err)
{
    gemm_json_stream *js = gemm_json_stream_new(lim, alloc, opt, len);
    if (!js) return gemm_err_set(err, 500, "out_of_memory", "could not allocate the JSON decoder");
    int rc = (len && body) ? gemm_json_stream_feed(js, body, len, err) : 0;
    if (rc == 0) rc = gemm_json_stream_finish(js, opt, a, b, err);
    else a->data = b->data = NULL;
    gemm_json_stream_free(js);
    return rc;
}

/* One matrix on its own (POST /v1/matrices). */
static inline int gemm_json_decode_matrix(const char *body, size_t len, const gemm_limits *lim,
                                          const gemm_allocator *alloc, gemm_options *opt, gemm_matrix *m,
                                          gemm_err *err)
{
    m->data = NULL;
    gemm_json_stream *js = gemm_json_stream_new_matrix(lim, alloc, opt, len);
    if (!js) return gemm_err_set(err, 500, "out_of_memory", "could not allocate the JSON decoder");
    int rc = (len && body) ? gemm_json_stream_feed(js, body, len, err) : 0;
    if (rc == 0) rc = gemm_json_stream_finish_matrix(js, opt, m, err);
    gemm_json_stream_free(js);
    return rc;
}

#endif
