/*
 * gemm_types.h - the vocabulary shared by the daemon, the engines and the client: dtypes,
 * math modes, checked sizes, row-major matrices, limits, errors and the allocator.
 */
#ifndef GEMM_TYPES_H
#define GEMM_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- element types ---------------------------------------------------- */

typedef enum {
    GEMM_DTYPE_INVALID = -1,
    GEMM_DTYPE_F32 = 0,
    GEMM_DTYPE_F64 = 1,
    GEMM_DTYPE_I32 = 2,
    GEMM_DTYPE_F16 = 3,  /* IEEE binary16 (1 sign, 5 exponent, 10 fraction bits) */
    GEMM_DTYPE_BF16 = 4, /* bfloat16: the top half of a float32 (8 exponent, 7 fraction bits) */
    GEMM_DTYPE_COUNT = 5
} gemm_dtype;

/* One row per dtype: its names and sizes (indexed by gemm_dtype). */
typedef struct {
    const char *name;    /* canonical: "float32", "float64", "int32", "float16", "bfloat16" */
    const char *v2;      /* the KServe v2 datatype: "FP32", "FP64", "INT32", "FP16", "BF16" */
    const char *npy;     /* the .npy descr: "<f4", "<f8", "<i4", "<f2", "<V2" (npy.h) */
    unsigned size;       /* bytes per element */
    unsigned json_width; /* the widest JSON text of one element and its comma */
} gemm_dtype_info;
extern const gemm_dtype_info gemm_dtypes[GEMM_DTYPE_COUNT];

/* Bytes per element; 0 for GEMM_DTYPE_INVALID. */
size_t gemm_dtype_size(gemm_dtype d);
/* gemm_dtypes[d].json_width: what every bound on a JSON answer's size is built from. */
unsigned gemm_json_elem_width(gemm_dtype d);
/* gemm_dtypes[d].name, "invalid" for GEMM_DTYPE_INVALID. */
const char *gemm_dtype_name(gemm_dtype d);
/* The canonical names, the v2 datatypes and the aliases (f4, float, ...), caseless: 0, or -1. */
int gemm_dtype_from_name(const char *s, gemm_dtype *out);
/* float16, bfloat16: computed in float32, C float32 unless out_dtype asks for their own. */
static inline bool gemm_dtype_is_half(gemm_dtype d) { return d == GEMM_DTYPE_F16 || d == GEMM_DTYPE_BF16; }

/* ---- math modes (float32 only; float64 and int32 are always exact) ----- */

typedef enum {
    GEMM_MATH_DEFAULT = 0, /* whatever the dtype's exact mode is (fp32 for float32) */
    GEMM_MATH_FP32 = 1,    /* exact IEEE float32 multiply-add */
    GEMM_MATH_TF32 = 2,    /* tensor cores, inputs rounded to TF32, FP32 accumulate */
    GEMM_MATH_BF16 = 3,    /* tensor cores, inputs rounded to BF16, FP32 accumulate */
    GEMM_MATH_COUNT = 4
} gemm_math;

const char *gemm_math_name(gemm_math m);
int gemm_math_from_name(const char *s, gemm_math *out);
/* The mode a dtype is computed in: "fp32" for DEFAULT, "exact" for float64 and int32. */
const char *gemm_math_report_name(gemm_dtype d, gemm_math m);

/* ---- checked arithmetic ------------------------------------------------ */

/* a * b, a + b, the bytes of a rows x cols matrix: false on overflow (or a bad dtype). */
bool gemm_mul_size(size_t a, size_t b, size_t *out);
bool gemm_add_size(size_t a, size_t b, size_t *out);
bool gemm_matrix_bytes(uint64_t rows, uint64_t cols, gemm_dtype d, size_t *out);

/* ---- matrices ---------------------------------------------------------- */

typedef struct {
    uint64_t rows, cols;
    gemm_dtype dtype;
    void *data; /* rows*cols elements, row-major; owner documented by the caller */
    uint64_t batch; /* 0: one matrix; b >= 1: a 3-D stack of b rows x cols matrices
                       (b*rows*cols elements; a (1, m, k) array has batch 1) */
} gemm_matrix;

/* Products one batched request may carry (the engine's ceiling for one job too). */
#define GEMM_MAX_BATCH 1000000

/* ---- limits applied to everything that comes from the network ---------- */

typedef struct {
    uint64_t max_dim;      /* largest allowed m, k or n */
    uint64_t max_elements; /* largest allowed element count of A, B or C */
    size_t max_body_bytes; /* largest request body */
} gemm_limits;

/* ---- errors: an HTTP status, a stable snake_case code, a sentence for a person ---- */

typedef struct {
    int status;        /* HTTP status: 400, 404, 411, 413, 415, 422, 500, 503 ... */
    char code[40];     /* e.g. "shape_mismatch", "body_too_large", "queue_full" */
    char message[400]; /* e.g. "A is 3x4 and B is 5x2: A's columns (4) must equal B's rows (5)" */
} gemm_err;

void gemm_err_clear(gemm_err *e);
/* Sets all three (e may be NULL); returns -1, for `return gemm_err_set(...)`. */
int gemm_err_set(gemm_err *e, int status, const char *code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* A printable copy of len bytes from the network for a message: other bytes as '?', cut
 * with "..." to fit cap. Returns buf. */
const char *gemm_shown(const char *s, size_t len, char *buf, size_t cap);

/* The dtype of C for inputs of dtype d and out_dtype out (GEMM_DTYPE_INVALID: not given):
 * 0, or -1 with 422 bad_out_dtype when d does not allow out (only the half types convert). */
int gemm_out_dtype_resolve(gemm_dtype d, gemm_dtype out, gemm_dtype *c, gemm_err *err);

/* Shapes and limits, checked before anything is allocated (statuses and codes: docs/API.md,
 * "Errors"); 0 or -1 with *err. C = A(m x k) . B(kb x n): */
int gemm_check_product(uint64_t m, uint64_t k, uint64_t kb, uint64_t n, gemm_dtype d,
                       const gemm_limits *lim, gemm_err *err);

/* One matrix on its own (a .npy part, a JSON operand), `what` in the message: */
int gemm_check_matrix(uint64_t rows, uint64_t cols, gemm_dtype d, const gemm_limits *lim,
                      const char *what, gemm_err *err);

/* A 3-D stack of 1 to GEMM_MAX_BATCH such matrices: */
int gemm_check_stack(uint64_t batch, uint64_t rows, uint64_t cols, gemm_dtype d,
                     const gemm_limits *lim, const char *what, gemm_err *err);

/* The batches of A and B (0: 2-D) as NumPy matmul pairs them (a 2-D B serves every A): */
int gemm_check_batch_pair(uint64_t a_batch, uint64_t b_batch, gemm_err *err);

/* ---- allocators: decoders take matrix buffers from the one they are given, so that the
 * CUDA engine can hand out pinned memory that the copy engine reads from ---- */

typedef struct {
    void *(*alloc)(void *ctx, size_t bytes); /* NULL on failure; 64-byte aligned */
    void (*free)(void *ctx, void *p);        /* p may be NULL */
    void *ctx;
} gemm_allocator;

/* Plain aligned host memory. */
extern const gemm_allocator gemm_allocator_host;

/* A thread that takes and gives back many small blocks at a high rate (the daemon's HTTP
 * threads) says so once; an allocator may then keep small blocks that this thread took, when
 * they come back from any thread, for this thread alone (the CUDA host cache's stashes),
 * instead of in one pool that every thread locks. */
void gemm_alloc_mark_busy_thread(void);
int gemm_alloc_busy_thread(void);

static inline void *gemm_alloc(const gemm_allocator *a, size_t bytes) { return a->alloc(a->ctx, bytes); }
static inline void gemm_free(const gemm_allocator *a, void *p) { if (p) a->free(a->ctx, p); }

/* CLOCK_MONOTONIC in milliseconds. */
double gemm_now_ms(void);

/* UTF-8 (RFC 3629: no overlong forms, surrogates or code points past U+10FFFF). The lead
 * byte c (>= 0x80): how many bytes follow and the range the next one must fall in; 0, or -1
 * when c cannot begin a character (later ones are 0x80..0xbf). */
int gemm_utf8_lead(unsigned char c, unsigned char *need, unsigned char *lo, unsigned char *hi);
/* Length of the valid UTF-8 sequence at p (1..4), or 0 (it stops at a NUL). */
size_t gemm_utf8_seq(const unsigned char *p);

#ifdef __cplusplus
}
#endif
#endif /* GEMM_TYPES_H */
