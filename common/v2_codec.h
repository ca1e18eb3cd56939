/*
 * v2_codec.h - bodies of the Open Inference Protocol (KServe v2, REST) for the one model
 * gemmd serves, "matmul": C = A.B. The request, its datatypes, the answer and the errors
 * are docs/V2.md's. Parse the header, allocate A and B, fill the JSON inputs (binary ones
 * come from the bytes after the header, in r.order), free.
 */
#ifndef GEMM_V2_CODEC_H
#define GEMM_V2_CODEC_H

#include "gemm_types.h"
#include "json_codec.h"
#include "options.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GEMM_V2_MODEL "matmul"
#define GEMM_V2_MODEL_VERSION "1"
#define GEMM_V2_ID_MAX 1024 /* bytes of a request id */

/* A dtype from its v2 datatype (caseful): 0; -1 for the protocol's others (BOOL, UINT8, ...),
 * -2 for names that are none. */
int gemm_v2_dtype_from_name(const char *s, gemm_dtype *out);
/* gemm_dtypes[d].v2, "" for an invalid dtype. */
const char *gemm_v2_dtype_name(gemm_dtype d);

typedef struct {
    uint64_t rows, cols;
    int binary;            /* its bytes follow the JSON header */
    size_t binary_bytes;   /* rows * cols * element size when binary */
    /* JSON form: the text of the "data" array, inside the caller's header (never a tree) */
    const char *data;
    size_t data_len;
    int nested;            /* [[row], [row], ...] rather than flat */
    uint64_t count;        /* values in the array (rows when nested) */
    uint64_t row_len;      /* nested: values in row 0 */
    uint64_t odd_row;      /* nested: 1 + the first row whose length is not row_len (0: none) */
    uint64_t odd_len;      /*   and its length */
    uint64_t not_row;      /* nested: 1 + the first value that is not an array (0: none) */
    char not_row_type;     /*   its first character */
} gemm_v2_input;

typedef struct {
    void *root;            /* the parsed header less its tensor data (cJSON); owned */
    char *id;              /* the request's "id" (valid UTF-8, owned), or NULL */
    gemm_dtype dtype;      /* of A and B */
    gemm_v2_input in[2];   /* [0] A, [1] B */
    int order[2];          /* which input (0 A, 1 B) the request lists first and second */
    int binary_output;     /* C is asked for as binary tensor data */
    gemm_options opt;      /* the options of its "parameters" (options.h) */
} gemm_v2_request;

void gemm_v2_request_init(gemm_v2_request *r);
void gemm_v2_request_free(gemm_v2_request *r);

/* Parses and checks a whole request header (len bytes of JSON; it must stay valid until the
 * JSON inputs are filled). The "data" arrays are never parsed into a tree: a first pass that
 * allocates nothing checks the syntax and measures them; cJSON parses the rest. binary_ok:
 * Inference-Header-Content-Length was given. admit (may be NULL) is first asked for a strict
 * upper bound of what the tree will take; nonzero (err set) stops the parse. 0 or -1. */
typedef int (*gemm_v2_admit_fn)(void *user, uint64_t bytes, gemm_err *err);
int gemm_v2_parse_request_admitted(const char *json, size_t len, int binary_ok, const gemm_limits *lim,
                                   gemm_v2_admit_fn admit, void *user, gemm_v2_request *r, gemm_err *err);

/* JSON input `which` (0 A, 1 B) into dst (rows * cols elements of r->dtype), straight from
 * the header's text, each element rounded once (json_number.h). 0, or -1 (400 bad_data). */
int gemm_v2_fill_input(const gemm_v2_request *r, int which, void *dst, gemm_err *err);

/* Frees the tree once the JSON inputs are filled (then the header text may go too). */
void gemm_v2_release_json(gemm_v2_request *r);

/* Appends one output tensor object, its data flat or its binary_data_size. */
void gemm_v2_write_output(gemm_buf *b, const char *name, const gemm_matrix *c, int binary);

/* An upper bound of the bytes of the JSON text of rows x cols elements of d. */
uint64_t gemm_v2_json_bytes_bound(uint64_t rows, uint64_t cols, gemm_dtype d);

#ifdef __cplusplus
}
#endif
#endif
