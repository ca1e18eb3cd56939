/*
 * blas_internal.h - what the files of libgemm_blas.so share (docs/BLAS.md). Not installed.
 * preload.c defines the entry points, host.c finds and runs the host BLAS, offload.c sends
 * a product to the server, pack.c moves operands and C. Every product is described once,
 * in row-major terms (gb_problem): column-major C = op(A)·op(B) is row-major
 * Cᵀ = op(B)ᵀ·op(A)ᵀ on the same memory.
 */
#ifndef GEMM_BLAS_INTERNAL_H
#define GEMM_BLAS_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* One row per BLAS flavour (docs/BLAS.md, "What it does", says whose): CBLAS sgemm, CBLAS
 * dgemm, Fortran sgemm, Fortran dgemm, and the type of its integers. libgemm_blas.map lists
 * the same names (test_blas.py checks). */
#define GB_FLAVOURS(X)                                                                          \
    X(cblas_sgemm, cblas_dgemm, sgemm_, dgemm_, int)                                            \
    X(cblas_sgemm64_, cblas_dgemm64_, sgemm_64_, dgemm_64_, int64_t)                            \
    X(scipy_cblas_sgemm64_, scipy_cblas_dgemm64_, scipy_sgemm_64_, scipy_dgemm_64_, int64_t)    \
    X(scipy_cblas_sgemm, scipy_cblas_dgemm, scipy_sgemm_, scipy_dgemm_, int)

#define GB_ENUM(cs, cd, fs, fd, IT) GB_E_##cs, GB_E_##cd, GB_E_##fs, GB_E_##fd,
typedef enum { GB_FLAVOURS(GB_ENUM) GB_ENTRY_COUNT } gb_entry;
#undef GB_ENUM

/* The routine of the other API in the same flavour (cblas_sgemm <-> sgemm_). */
#define GB_OTHER_API(e) ((gb_entry)((e) ^ 2))

/* CBLAS enumeration values (cblas.h), as plain ints: this library does not include any
 * cblas.h, whose prototypes differ between BLAS vendors. */
enum { GB_ROW_MAJOR = 101, GB_COL_MAJOR = 102 };
enum { GB_NO_TRANS = 111, GB_TRANS = 112, GB_CONJ_TRANS = 113 };

typedef enum { GB_F32 = 0, GB_F64 = 1 } gb_type;

/* One call's arguments, whatever the entry point: values, so that they can be handed on
 * unchanged (to the same name's host routine) or in the other API's form. */
typedef struct {
    gb_entry entry;
    int order, ta, tb;  /* CBLAS: as passed. Fortran: GB_COL_MAJOR and the characters */
    int64_t m, n, k, lda, ldb, ldc;
    double alpha, beta; /* float calls carry their float values exactly */
    const void *a, *b;
    void *c;
} gb_call;

typedef struct {
    const char *name;
    int f77; /* Fortran (arguments by reference), else CBLAS */
    gb_type type;
    void (*call)(void *fn, const gb_call *c); /* calls fn, a routine of this name, with c */
} gb_entry_info;

extern const gb_entry_info gb_entries[GB_ENTRY_COUNT];

/* One operand as the row-major product sees it, rows x cols: stored row-major with row stride
 * ld, or (trans) its transpose stored so. */
typedef struct {
    const void *p;
    int64_t rows, cols, ld;
    int trans;
} gb_operand;

/* C (m x n, row stride ldc) = alpha * P (m x k) · Q (k x n) + beta * C, row-major. */
typedef struct {
    gb_type type;
    int64_t m, n, k;
    gb_operand p, q;
    void *c;
    int64_t ldc;
    double alpha, beta;
    const char *desc; /* the call as its caller made it, for warnings ("dgemm_ 300x200x100") */
    const char *host; /* where it runs when the server cannot take it, for warnings */
} gb_problem;

/* ---- the host BLAS (host.c) ------------------------------------------------------ */

/* Runs the call on the host BLAS (docs/BLAS.md, "The host BLAS"). */
void gb_host_run(const gb_call *call);

/* Where the call's entry runs on the host, for messages ("/usr/lib/.../libblas.so.3"). */
const char *gb_host_name(gb_entry e);

/* Non-zero while this thread is inside the host BLAS (re-entry guard). */
int gb_in_host(void);

/* Argument checks in the reference BLAS order: 0 when valid, else the parameter number
 * xerbla reports. */
int gb_check(const gb_call *c);

/* A transpose argument of the call as 'N' or 'T' (transpose and conjugate transpose alike,
 * the matrices being real), or 0 when it is neither. */
char gb_trans(const gb_call *c, int t);

/* ---- the remote product (offload.c) ---------------------------------------------- */

typedef struct {
    int enabled;             /* GEMM_SERVER set and usable */
    int log;                 /* GEMM_OFFLOAD_LOG */
    double min_flops[2];     /* per gb_type */
    double min_intensity[2]; /* flops per byte on the wire, per gb_type; 0 = no floor */
    int learn;               /* GEMM_OFFLOAD_LEARN: above the floors, the faster side (choose.c) */
} gb_settings;

/* Reads the environment once (thread-safe; later calls return the same object). */
const gb_settings *gb_settings_get(void);

/* GEMM_OFFLOAD_LOG is set (read without the other settings). */
int gb_log_wanted(void);

/* Outcome of one offload attempt. */
typedef struct {
    int ok;          /* C holds the result */
    double ms;       /* server: the whole exchange as the client saw it */
    double kernel_ms; /* the server's kernel stage, -1 when not reported */
    char kernel[48]; /* the kernel the server ran */
    char why[160];   /* not ok: the reason in a few words ("connect_failed", ...) */
    int backoff;     /* not attempted: the server failed recently */
} gb_result;

/* Tries the product on the server; on failure *res says why and the caller recomputes C
 * on the host. */
void gb_offload(const gb_problem *pr, gb_result *res);

/* ---- which side (choose.c) ------------------------------------------------------- */

typedef struct {
    int server;                /* else the host */
    double host_ms, server_ms; /* the predictions (0 where a side is not measured yet) */
    const char *why;
} gb_choice;

/* Where a product of this many flops and bytes on the wire (A, B out, C back) should run. */
gb_choice gb_choose(gb_type t, double flops, double bytes);
/* What a product above the floors took on each side (ms, the whole call). */
void gb_learn_host(gb_type t, double flops, double ms);
void gb_learn_server(gb_type t, double flops, double bytes, double ms, double kernel_ms);

/* ---- packing (pack.c) --------------------------------------------------------------- */

/* Element moves (a transposed one counted twice) to have operand x as a contiguous
 * row-major matrix, or its transpose when want_t. */
double gb_pack_cost(const gb_operand *x, int want_t);

/* The operand (or its transpose, want_t) as contiguous row-major memory: the caller's own, or
 * a copy in *owned (free it) whose size the caller checked; NULL when out of memory. */
const void *gb_pack(const gb_operand *x, int want_t, size_t esz, void **owned);

/* C (m x n, row stride ldc) = alpha·T + beta·C, where T is m x n contiguous, or (trans_t)
 * n x m holding Tᵀ. beta = 0 never reads C. */
void gb_epilogue(gb_type type, void *c, int64_t ldc, const void *t, int64_t m, int64_t n, int trans_t,
                 double alpha, double beta);

/* One warning on stderr per process per key (thread-safe). */
void gb_warn_once(const char *key, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* One line on stderr in a single write (lines of many threads do not mix). */
void gb_write_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
