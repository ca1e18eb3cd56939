/*
 * pack.c - operands into the wire's layout (row-major, no padding; a transpose in 16 x 16
 * tiles) and the answer into C in one pass; large matrices split by rows over a few threads
 * (NumPy's `a.T @ b` is common and one core transposes at a fraction of memory bandwidth).
 */
#include "blas_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GB_PACK_THREADS 8
#define GB_PACK_MIN_BYTES (4u << 20)
#define GB_TILE 16

/* ---------------------------------------------------------------- rows over threads */

typedef void (*rows_fn)(void *ctx, int64_t lo, int64_t hi);

typedef struct {
    rows_fn fn;
    void *ctx;
    int64_t lo, hi;
} chunk;

static void *chunk_main(void *arg)
{
    chunk *c = arg;
    c->fn(c->ctx, c->lo, c->hi);
    return NULL;
}

/* fn(ctx, lo, hi) over [0, rows), in pieces of whole tiles, on up to GB_PACK_THREADS
 * threads when the matrix has `bytes` enough to pay for them. */
static void rows_parallel(int64_t rows, double bytes, rows_fn fn, void *ctx)
{
    int nt = (int)(bytes / GB_PACK_MIN_BYTES);
    long procs = sysconf(_SC_NPROCESSORS_ONLN);
    if (nt > GB_PACK_THREADS) nt = GB_PACK_THREADS;
    if (nt > procs) nt = procs < 1 ? 1 : (int)procs;
    if (nt > rows / GB_TILE) nt = (int)(rows / GB_TILE);
    if (nt <= 1) {
        fn(ctx, 0, rows);
        return;
    }
    pthread_t th[GB_PACK_THREADS];
    chunk ch[GB_PACK_THREADS];
    int started[GB_PACK_THREADS] = {0};
    int64_t tiles = (rows + GB_TILE - 1) / GB_TILE;
    for (int t = 0; t < nt; t++) {
        int64_t lo = tiles * t / nt * GB_TILE, hi = tiles * (t + 1) / nt * GB_TILE;
        ch[t] = (chunk){fn, ctx, lo, hi < rows ? hi : rows};
    }
    for (int t = 1; t < nt; t++) started[t] = pthread_create(&th[t], NULL, chunk_main, &ch[t]) == 0;
    fn(ctx, ch[0].lo, ch[0].hi);
    for (int t = 1; t < nt; t++) {
        if (started[t]) pthread_join(th[t], NULL);
        else fn(ctx, ch[t].lo, ch[t].hi);
    }
}

/* ---------------------------------------------------------------- packing */

typedef struct {
    void *dst;
    const void *src;
    int64_t c, ld;  /* dst row length; src row stride */
    size_t esz;
} pack_job;

/* dst rows [lo, hi) = src rows [lo, hi) without their padding */
static void copy_rows(void *ctx, int64_t lo, int64_t hi)
{
    const pack_job *j = ctx;
    for (int64_t i = lo; i < hi; i++)
        memcpy((char *)j->dst + (size_t)(i * j->c) * j->esz, (const char *)j->src + (size_t)(i * j->ld) * j->esz,
               (size_t)j->c * j->esz);
}

/* dst (rows x c, contiguous) = transpose of src (c x rows, row stride ld), dst rows [lo, hi) */
#define GB_TRANSPOSE(NAME, T)                                                                   \
    static void NAME(void *ctx, int64_t lo, int64_t hi)                                         \
    {                                                                                           \
        const pack_job *jb = ctx;                                                               \
        T *dst = jb->dst;                                                                       \
        const T *src = jb->src;                                                                 \
        int64_t c = jb->c, ld = jb->ld;                                                         \
        for (int64_t i0 = lo; i0 < hi; i0 += GB_TILE)                                           \
            for (int64_t j0 = 0; j0 < c; j0 += GB_TILE) {                                       \
                int64_t i1 = i0 + GB_TILE < hi ? i0 + GB_TILE : hi;                             \
                int64_t j1 = j0 + GB_TILE < c ? j0 + GB_TILE : c;                               \
                for (int64_t i = i0; i < i1; i++)                                               \
                    for (int64_t j = j0; j < j1; j++) dst[i * c + j] = src[j * ld + i];         \
            }                                                                                   \
    }
GB_TRANSPOSE(transpose_f32, float)
GB_TRANSPOSE(transpose_f64, double)

double gb_pack_cost(const gb_operand *x, int want_t)
{
    double elems = (double)x->rows * (double)x->cols;
    if (x->trans != want_t) return 2 * elems;
    int64_t width = want_t ? x->rows : x->cols; /* row length of the stored matrix */
    return x->ld == width ? 0 : elems;
}

const void *gb_pack(const gb_operand *x, int want_t, size_t esz, void **owned)
{
    *owned = NULL;
    int64_t r = want_t ? x->cols : x->rows, c = want_t ? x->rows : x->cols; /* wanted shape */
    if (x->trans == want_t && x->ld == c) return x->p;
    size_t bytes = (size_t)r * (size_t)c * esz; /* checked by the caller */
    void *buf = malloc(bytes ? bytes : 1);
    if (!buf) return NULL;
    *owned = buf;
    pack_job j = {buf, x->p, c, x->ld, esz};
    if (x->trans == want_t) rows_parallel(r, (double)bytes, copy_rows, &j);
    else rows_parallel(r, (double)bytes, esz == 4 ? transpose_f32 : transpose_f64, &j);
    return buf;
}

/* ---------------------------------------------------------------- the answer into C */

typedef struct {
    void *c;
    const void *t;
    int64_t ldc, m, n;
    int trans_t;
    double alpha, beta;
} epi_job;

/* C rows [lo, hi) = alpha·T + beta·C; T is m x n contiguous, or (trans_t) n x m holding Tᵀ */
#define GB_EPILOGUE(NAME, T)                                                                    \
    static void NAME(void *ctx, int64_t lo, int64_t hi)                                         \
    {                                                                                           \
        const epi_job *e = ctx;                                                                 \
        T *c = e->c;                                                                            \
        const T *t = e->t;                                                                      \
        const T alpha = (T)e->alpha, beta = (T)e->beta;                                         \
        const int64_t m = e->m, n = e->n, ldc = e->ldc;                                         \
        if (!e->trans_t) {                                                                      \
            for (int64_t i = lo; i < hi; i++) {                                                 \
                T *ci = c + i * ldc;                                                            \
                const T *ti = t + i * n;                                                        \
                for (int64_t j = 0; j < n; j++)                                                 \
                    ci[j] = beta == 0 ? alpha * ti[j] : alpha * ti[j] + beta * ci[j];           \
            }                                                                                   \
            return;                                                                             \
        }                                                                                       \
        for (int64_t i0 = lo; i0 < hi; i0 += GB_TILE)                                           \
            for (int64_t j0 = 0; j0 < n; j0 += GB_TILE) {                                       \
                int64_t i1 = i0 + GB_TILE < hi ? i0 + GB_TILE : hi;                             \
                int64_t j1 = j0 + GB_TILE < n ? j0 + GB_TILE : n;                               \
                for (int64_t i = i0; i < i1; i++) {                                             \
                    T *ci = c + i * ldc;                                                        \
                    for (int64_t j = j0; j < j1; j++)                                           \
                        ci[j] = beta == 0 ? alpha * t[j * m + i] : alpha * t[j * m + i] + beta * ci[j]; \
                }                                                                               \
            }                                                                                   \
    }
GB_EPILOGUE(epilogue_f32, float)
GB_EPILOGUE(epilogue_f64, double)

void gb_epilogue(gb_type type, void *c, int64_t ldc, const void *t, int64_t m, int64_t n, int trans_t, double alpha,
                 double beta)
{
    epi_job e = {c, t, ldc, m, n, trans_t, alpha, beta};
    double bytes = (double)m * (double)n * (type == GB_F32 ? 4 : 8);
    rows_parallel(m, bytes, type == GB_F32 ? epilogue_f32 : epilogue_f64, &e);
}
