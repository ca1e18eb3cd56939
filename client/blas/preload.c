/*
 * preload.c - the entry points of GB_FLAVOURS, made by one macro, all going through one
 * path: to the server when the product is big enough, else to the host BLAS unchanged
 * (docs/BLAS.md, "What it does"). Calls with nothing to multiply are answered here without
 * reading A or B (which may then be NULL).
 */
#include "blas_internal.h"
#include "gemm_types.h"

#include <inttypes.h>
#include <stdio.h>

/* The call as a row-major problem (blas_internal.h): column-major swaps the operands and m, n. */
static void to_problem(gb_problem *pr, const gb_call *c, int ta_t, int tb_t)
{
    int row = c->order == GB_ROW_MAJOR;
    pr->type = gb_entries[c->entry].type;
    pr->m = row ? c->m : c->n;
    pr->n = row ? c->n : c->m;
    pr->k = c->k;
    pr->p = (gb_operand){row ? c->a : c->b, pr->m, c->k, row ? c->lda : c->ldb, row ? ta_t : tb_t};
    pr->q = (gb_operand){row ? c->b : c->a, c->k, pr->n, row ? c->ldb : c->lda, row ? tb_t : ta_t};
    pr->c = c->c;
    pr->ldc = c->ldc;
}

/* C = beta·C on the row-major problem; beta = 0 writes zeros without reading C. */
static void scale_c(const gb_problem *pr)
{
    if (pr->beta == 1) return;
    for (int64_t i = 0; i < pr->m; i++) {
        if (pr->type == GB_F32) {
            float *row = (float *)pr->c + i * pr->ldc, b = (float)pr->beta;
            for (int64_t j = 0; j < pr->n; j++) row[j] = b == 0 ? 0.0f : b * row[j];
        } else {
            double *row = (double *)pr->c + i * pr->ldc, b = pr->beta;
            for (int64_t j = 0; j < pr->n; j++) row[j] = b == 0 ? 0.0 : b * row[j];
        }
    }
}

/* A call's flops and its bytes on the wire (alpha = 1, beta = 0: A and B out, C back). */
static void size_of(gb_type t, const gb_call *c, double *flops, double *bytes)
{
    double esz = t == GB_F32 ? 4 : 8, m = (double)c->m, n = (double)c->n, k = (double)c->k;
    *flops = 2.0 * m * n * k;
    *bytes = esz * (m * k + k * n + m * n);
}

/* Above the floors: the flop count and the flops per byte on the wire. */
static int worth_sending(const gb_settings *s, gb_type t, const gb_call *c)
{
    double flops, bytes;
    size_of(t, c, &flops, &bytes);
    return flops >= s->min_flops[t] && flops >= s->min_intensity[t] * bytes;
}

/* Where a call goes and why (for the log). */
typedef enum { GO_HOST = 0, GO_SERVER, GO_HERE } go;

static void run(const gb_call *call, const gb_settings *s, gb_problem *pr, int valid, char ta_c, char tb_c)
{
    const char *name = gb_entries[call->entry].name;
    double t0 = s->log ? gemm_now_ms() : 0;
    const char *why = NULL;
    char whybuf[200];
    gb_result res = {0};
    go where = GO_HOST;
    double flops = 0, bytes = 0; /* above the floors only */
    gb_choice ch = {.server = 1, .why = "GEMM_OFFLOAD_LEARN=0"};

    if (!valid) {
        why = "invalid arguments";
    } else if (call->m == 0 || call->n == 0) {
        why = "nothing to multiply";
        where = GO_HERE;
    } else if (call->k == 0 || pr->alpha == 0) {
        why = "nothing to multiply: C = beta*C";
        where = GO_HERE;
        scale_c(pr);
    } else if (!s->enabled) {
        why = "no GEMM_SERVER";
    } else if (!worth_sending(s, pr->type, call)) {
        why = "below threshold";
    } else {
        size_of(pr->type, call, &flops, &bytes);
        ch = s->learn ? gb_choose(pr->type, flops, bytes) : ch;
        if (ch.server) {
            char desc[160];
            snprintf(desc, sizeof desc, "%s %" PRId64 "x%" PRId64 "x%" PRId64 " (m x k x n)", name, call->m,
                     call->k, call->n);
            pr->desc = desc;
            pr->host = gb_host_name(call->entry);
            double t1 = gemm_now_ms();
            gb_offload(pr, &res);
            if (res.ok) {
                where = GO_SERVER;
                gb_learn_server(pr->type, flops, bytes, gemm_now_ms() - t1, res.kernel_ms);
            } else {
                snprintf(whybuf, sizeof whybuf, "%s%s", res.backoff ? "" : "fallback: ", res.why);
                why = whybuf;
            }
        } else {
            why = ch.why;
        }
    }
    if (where == GO_HOST) {
        double t1 = gemm_now_ms();
        gb_host_run(call);
        if (flops > 0) gb_learn_host(pr->type, flops, gemm_now_ms() - t1);
    }
    if (!s->log) return;
    double ms = gemm_now_ms() - t0;
    char shape[200];
    snprintf(shape, sizeof shape, "%s %s %c%c m=%" PRId64 " n=%" PRId64 " k=%" PRId64, name,
             call->order == GB_ROW_MAJOR ? "RowMajor" : call->order == GB_COL_MAJOR ? "ColMajor" : "?",
             ta_c ? ta_c : '?', tb_c ? tb_c : '?', call->m, call->n, call->k);
    char guess[96] = "", hs[24] = "?", ss[24] = "?";
    if (ch.host_ms > 0) snprintf(hs, sizeof hs, "%.3f ms", ch.host_ms);
    if (ch.server_ms > 0) snprintf(ss, sizeof ss, "%.3f ms", ch.server_ms);
    if (flops > 0 && s->learn) snprintf(guess, sizeof guess, "; predicted host %s, server %s", hs, ss);
    if (where == GO_SERVER)
        gb_write_line("libgemm_blas: %s -> server %.3f ms (exchange %.3f ms, kernel %s; %s%s)", shape, ms, res.ms,
                      res.kernel[0] ? res.kernel : "?", ch.why, guess);
    else
        gb_write_line("libgemm_blas: %s -> %s %.3f ms (%s%s)", shape, where == GO_HERE ? "here" : "host", ms, why,
                      where == GO_HOST ? guess : "");
}

/* Every entry point comes here. The common case is kept short (it is all a small product
 * pays): no log, valid arguments, something to multiply, not worth sending. */
static void dispatch(const gb_call *c)
{
    const gb_settings *s = gb_settings_get();
    int valid = gb_check(c) == 0;
    /* a call from inside the host BLAS (its CBLAS calling its Fortran routine), or the common case */
    if (gb_in_host() || (!s->log && valid && c->m > 0 && c->n > 0 && c->k > 0 && c->alpha != 0 &&
                         (!s->enabled || !worth_sending(s, gb_entries[c->entry].type, c)))) {
        gb_host_run(c);
        return;
    }
    gb_problem pr = {.alpha = c->alpha, .beta = c->beta};
    char ta = gb_trans(c, c->ta), tb = gb_trans(c, c->tb);
    if (valid) to_problem(&pr, c, ta != 'N', tb != 'N');
    run(c, s, &pr, valid, ta, tb);
}

/* The definitions. CBLAS takes its arguments by value; Fortran by reference, with hidden
 * character lengths after ldc, which are not read. host_<name> calls a routine of that
 * name (the host's) with a call's arguments, converted back to the entry's own types. */
#define GB_CBLAS(name, IT, FT)                                                                          \
    void name(int order, int ta, int tb, IT m, IT n, IT k, FT alpha, const FT *a, IT lda, const FT *b, IT ldb, \
              FT beta, FT *c, IT ldc)                                                                   \
    {                                                                                                   \
        gb_call call = {GB_E_##name, order, ta, tb, m, n, k, lda, ldb, ldc, alpha, beta, a, b, c};      \
        dispatch(&call);                                                                                \
    }                                                                                                   \
    static void host_##name(void *fn, const gb_call *c)                                                 \
    {                                                                                                   \
        ((void (*)(int, int, int, IT, IT, IT, FT, const FT *, IT, const FT *, IT, FT, FT *, IT))fn)(     \
            c->order, c->ta, c->tb, (IT)c->m, (IT)c->n, (IT)c->k, (FT)c->alpha, c->a, (IT)c->lda, c->b, \
            (IT)c->ldb, (FT)c->beta, c->c, (IT)c->ldc);                                                 \
    }

#define GB_F77(name, IT, FT)                                                                            \
    void name(const char *ta, const char *tb, const IT *m, const IT *n, const IT *k, const FT *alpha,  \
              const FT *a, const IT *lda, const FT *b, const IT *ldb, const FT *beta, FT *c, const IT *ldc) \
    {                                                                                                   \
        gb_call call = {GB_E_##name, GB_COL_MAJOR, *ta, *tb, *m, *n, *k, *lda, *ldb, *ldc, *alpha, *beta, \
                        a, b, c};                                                                       \
        dispatch(&call);                                                                                \
    }                                                                                                   \
    static void host_##name(void *fn, const gb_call *c)                                                 \
    {                                                                                                   \
        char ta = (char)c->ta, tb = (char)c->tb;                                                        \
        IT m = (IT)c->m, n = (IT)c->n, k = (IT)c->k, lda = (IT)c->lda, ldb = (IT)c->ldb, ldc = (IT)c->ldc; \
        FT alpha = (FT)c->alpha, beta = (FT)c->beta;                                                    \
        ((void (*)(const char *, const char *, const IT *, const IT *, const IT *, const FT *, const FT *, \
                   const IT *, const FT *, const IT *, const FT *, FT *, const IT *, size_t, size_t))fn)( \
            &ta, &tb, &m, &n, &k, &alpha, c->a, &lda, c->b, &ldb, &beta, c->c, &ldc, 1, 1);              \
    }

#define GB_DEFINE(cs, cd, fs, fd, IT) \
    GB_CBLAS(cs, IT, float) GB_CBLAS(cd, IT, double) GB_F77(fs, IT, float) GB_F77(fd, IT, double)
GB_FLAVOURS(GB_DEFINE)

#define GB_ROWS(cs, cd, fs, fd, IT)                                                \
    {#cs, 0, GB_F32, host_##cs}, {#cd, 0, GB_F64, host_##cd}, {#fs, 1, GB_F32, host_##fs}, \
        {#fd, 1, GB_F64, host_##fd},
const gb_entry_info gb_entries[GB_ENTRY_COUNT] = {GB_FLAVOURS(GB_ROWS)};
