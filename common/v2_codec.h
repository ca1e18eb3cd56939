/*
 * v2_codec.h - bodies of the Open Inference Protocol (KServe v2, REST) for the one model
 * gemmd serves, "matmul": inputs A (m x k) and B (k x n), output C = A.B (m x n).
 *
 * The request (a JSON object, then binary tensor data when Inference-Header-Content-Length
 * says where the JSON ends), its datatypes and the answer are docs/V2.md's ("Inference").
 *
 *   gemm_v2_request r;
 *   gemm_v2_request_init(&r);
 *   if (gemm_v2_parse_request_admitted(json, len, 1, &limits, NULL, NULL, &r, &err) == 0) {
 *       ... allocate A and B (sizes are checked), gemm_v2_fill_input(&r, 0, a, &err) for JSON
 *       inputs, binary inputs from the bytes after the JSON, in r.order ...
 *   }
 *   gemm_v2_request_free(&r);
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

/* A dtype from its v2 datatype (gemm_dtypes[].v2, caseful): 0. -1 for the protocol's other
 * datatypes (BOOL, UINT8, ..., BYTES), which this model does not take; -2 for names that are
 * not v2 datatypes at all. */
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

/* Parses and checks a whole inference request header (len bytes of JSON). The "data" arrays
 * of the inputs are never parsed into a tree: a first pass, which allocates nothing, checks
 * the syntax of the whole header, measures each input's array (values, rows) and notes where
 * its text lies; the rest (small in any sane request) is parsed by cJSON. json must stay
 * valid until the JSON inputs are filled. binary_ok: the body carries binary tensor data after
 * the JSON (Inference-Header-Content-Length was given); without it an input with
 * binary_data_size is an error. Before anything is allocated, admit(user, bytes, err) (when
 * not NULL) is called with a strict upper bound of what the tree will take (its text, every
 * node and string, with the allocator's overhead): nonzero (err set, e.g. 503 over the memory
 * budget) stops the parse. Checks: the structure, input and output names (A, B; C),
 * datatypes, shapes ([rows, cols]), the product against lim (gemm_check_product), each
 * binary_data_size and each JSON "data" array's length against its shape. Errors (all 400
 * unless noted): bad_json, bad_request, unknown_input, duplicate_input, missing_input,
 * bad_datatype, dtype_mismatch, bad_shape, bad_data, bad_binary_size, unknown_output,
 * unsupported, bad_parameter, and gemm_check_product's. Returns 0 or -1 with *err set. */
typedef int (*gemm_v2_admit_fn)(void *user, uint64_t bytes, gemm_err *err);
int gemm_v2_parse_request_admitted(const char *json, size_t len, int binary_ok, const gemm_limits *lim,
                                   gemm_v2_admit_fn admit, void *user, gemm_v2_request *r, gemm_err *err);

/* Converts JSON input `which` (0 A, 1 B; not a binary one) into dst, room for rows * cols
 * elements of r->dtype, straight from the header's text (json_number.h: float32 rounded
 * from the decimal text, as strtof does). Errors: 400 bad_data (not a number, int32 not an
 * integer or out of range, beyond the float range), naming the element. 0 or -1. */
int gemm_v2_fill_input(const gemm_v2_request *r, int which, void *dst, gemm_err *err);

/* Frees the parsed JSON once the JSON inputs are filled (in[].data are dropped; the
 * caller may free the header text then). */
void gemm_v2_release_json(gemm_v2_request *r);

/* Appends one output tensor object: {"name": name, "datatype": .., "shape": [rows, cols],
 * then "parameters": {"binary_data_size": N} when binary, else "data": [flat, row-major]}. */
void gemm_v2_write_output(gemm_buf *b, const char *name, const gemm_matrix *c, int binary);

/* Bytes of the JSON text of m's elements could take (an upper bound), for limits. */
uint64_t gemm_v2_json_bytes_bound(uint64_t rows, uint64_t cols, gemm_dtype d);


#ifdef __cplusplus
}
#endif
#endif
