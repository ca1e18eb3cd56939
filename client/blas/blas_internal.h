/*
 * blas_internal.h - what the files of libgemm_blas.so share. Not installed.
 *
 * libgemm_blas.so is an LD_PRELOAD library. It defines cblas_sgemm, cblas_dgemm, sgemm_
 * and dgemm_ (and nothing else: client/blas/libgemm_blas.map hides every other symbol,
 * libgemm's included) and sends products above a threshold to a gemmd server; the rest
 * runs on the host's own BLAS.
 *
 *   preload.c  the four entry points: argument checks, the decision, the log line
 *   host.c     the host BLAS (found by name, dlopen/dlsym), a built-in last resort,
 *              xerbla reporting when there is no host BLAS
 *   offload.c  the remote product: settings from the environment, a pool of libgemm
 *              clients, the layout chosen, failure classes, warnings and back-off
 *   pack.c     operands into the wire's layout, the answer into C (alpha, beta)
 *
 * Every product is described once, in row-major terms, by gb_problem: a column-major
 * call C = op(A)·op(B) is the row-major product Cᵀ = op(B)ᵀ·op(A)ᵀ on the same memory, so
 * both orders (and Fortran) reach one code path without copying anything.
 */
#ifndef GEMM_BLAS_INTERNAL_H
#define GEMM_BLAS_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* CBLAS enumeration values (cblas.h), as plain ints: this library does not include any
 * cblas.h, whose prototypes differ between BLAS vendors. */
enum { GB_ROW_MAJOR = 101, GB_COL_MAJOR = 102 };
enum { GB_NO_TRANS = 111, GB_TRANS = 112, GB_CONJ_TRANS = 113 };

typedef enum { GB_F32 = 0, GB_F64 = 1 } gb_type;

/* Which entry point a call came through (names, log lines, host dispatch). */
typedef enum { GB_CBLAS_SGEMM = 0, GB_CBLAS_DGEMM, GB_SGEMM, GB_DGEMM, GB_ENTRY_COUNT } gb_entry;

const char *gb_entry_name(gb_entry e);

/* One operand as the row-major product sees it: the logical matrix is rows x cols. Its
 * storage is row-major with row stride ld; `trans` says the storage holds the transpose
 * (then storage is cols x rows with stride ld). */
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
    double alpha, beta; /* float calls carry their float values exactly */
    const char *desc;   /* the call as its caller made it, for warnings ("dgemm_ 300x200x100") */
} gb_problem;

/* ---- the host BLAS (host.c) ------------------------------------------------------ */

/* Arguments of a call exactly as they came in, to hand to the host unchanged. */
typedef struct {
    gb_entry entry;
    /* cblas_* */
    int order, ta, tb, m, n, k, lda, ldb, ldc;
    double alpha, beta;
    float alpha_f, beta_f;
    const void *a, *b;
    void *c;
    /* Fortran: the pointers the caller passed */
    const char *fta, *ftb;
    const int *fm, *fn, *fk, *flda, *fldb, *fldc;
    const void *falpha, *fbeta;
} gb_call;

/* Runs the call on the host BLAS (or, when none could be found, on the built-in loops,
 * which report argument errors as xerbla would). Calls made while it runs that come back
 * into this library (a host CBLAS that calls the Fortran routine, interposed) go straight
 * to the host too. */
void gb_host_run(const gb_call *call);

/* Argument checks in the reference BLAS order. gb_check_fortran returns the xerbla
 * INFO (1 transa, 2 transb, 3 m, 4 n, 5 k, 8 lda, 10 ldb, 13 ldc) or 0 when the arguments
 * are valid; gb_check_cblas returns the CBLAS parameter number (1 order, 2 TransA, 3 TransB,
 * 4 M, 5 N, 6 K, 9 lda, 11 ldb, 14 ldc) or 0. */
int gb_check_fortran(char ta, char tb, int m, int n, int k, int lda, int ldb, int ldc);
int gb_check_cblas(int order, int ta, int tb, int m, int n, int k, int lda, int ldb, int ldc);

/* 'N', 'T' (transpose and conjugate transpose alike, the matrices being real) or 0 for a
 * character that is neither. */
char gb_trans_char(char t);

/* What was found, for the log ("libblas.so.3", "built-in loops"). */
const char *gb_host_name(void);

/* Non-zero while this thread is inside the host BLAS (re-entry guard). */
int gb_in_host(void);

/* ---- the remote product (offload.c) ---------------------------------------------- */

typedef struct {
    int enabled;              /* GEMM_SERVER set and usable */
    int log;                  /* GEMM_OFFLOAD_LOG */
    double min_flops[2];      /* per gb_type */
    double min_intensity[2];  /* flops per byte on the wire, per gb_type; 0 = no floor */
} gb_settings;

/* Reads the environment once (thread-safe; later calls return the same object). */
const gb_settings *gb_settings_get(void);

/* Outcome of one offload attempt. */
typedef struct {
    int ok;               /* C holds the result */
    double ms;            /* server: the whole exchange as the client saw it */
    char kernel[48];      /* the kernel the server ran */
    char why[160];        /* not ok: the reason in a few words ("connect_failed", ...) */
    int backoff;          /* not attempted: the server failed recently */
} gb_result;

/* Tries the product on the server; on failure *res says why and C is to be recomputed
 * by the caller on the host (C may have been written when beta == 0). */
void gb_offload(const gb_problem *pr, gb_result *res);

/* ---- packing (pack.c) --------------------------------------------------------------- */

/* Element moves (a transposed one counted twice) to have operand x as a contiguous
 * row-major matrix, or its transpose when want_t. */
double gb_pack_cost(const gb_operand *x, int want_t);

/* The operand (or its transpose, want_t) as contiguous row-major memory: the caller's own
 * when it already is, else a packed copy in *owned (free it). NULL when out of memory.
 * The caller has checked that the size does not overflow. */
const void *gb_pack(const gb_operand *x, int want_t, size_t esz, void **owned);

/* C (m x n, row stride ldc) = alpha·T + beta·C, where T is m x n contiguous, or (trans_t)
 * n x m holding Tᵀ. beta = 0 never reads C. */
void gb_epilogue(gb_type type, void *c, int64_t ldc, const void *t, int64_t m, int64_t n, int trans_t,
                 double alpha, double beta);

/* One warning on stderr per process per key (thread-safe). */
void gb_warn_once(const char *key, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* One line on stderr in a single write (lines of many threads do not mix). */
void gb_write_line(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

#endif
