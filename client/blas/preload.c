/*
 * preload.c - the four symbols libgemm_blas.so defines: cblas_sgemm, cblas_dgemm, sgemm_,
 * dgemm_ (LP64: 32-bit integers, as in libblas.so.3).
 *
 * Each call goes one of two ways:
 *   - to the server, when GEMM_SERVER is set, the arguments are valid, there is something
 *     to multiply (m, n, k > 0 and alpha != 0) and the product is big enough: at least
 *     GEMM_OFFLOAD_MIN_FLOPS floating-point operations (2·m·n·k) and at least
 *     GEMM_OFFLOAD_MIN_INTENSITY of them per byte on the wire;
 *   - to the host BLAS, unchanged, otherwise - and whenever the server cannot take it.
 * Every call with bad arguments and every small product behaves exactly as the host BLAS
 * makes it behave. Calls with nothing to multiply are answered here, as the reference BLAS
 * does: m or n zero returns; alpha or k zero sets C = beta·C (C = 0 for beta = 0), reading
 * neither A nor B (which may then be NULL: OpenBLAS 0.3.21's small-matrix kernels would
 * read them). GEMM_OFFLOAD_LOG=1 prints one line per call: the call, where it ran, the time.
 */
#include "blas_internal.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

/* The exported names (client/blas/libgemm_blas.map): declared here with the ABI every
 * LP64 BLAS uses. Fortran callers may pass hidden character lengths after ldc; they are
 * not read. */
void cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                 const float *b, int ldb, float beta, float *c, int ldc);
void cblas_dgemm(int order, int ta, int tb, int m, int n, int k, double alpha, const double *a, int lda,
                 const double *b, int ldb, double beta, double *c, int ldc);
void sgemm_(const char *ta, const char *tb, const int *m, const int *n, const int *k, const float *alpha,
            const float *a, const int *lda, const float *b, const int *ldb, const float *beta, float *c,
            const int *ldc);
void dgemm_(const char *ta, const char *tb, const int *m, const int *n, const int *k, const double *alpha,
            const double *a, const int *lda, const double *b, const int *ldb, const double *beta, double *c,
            const int *ldc);

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The call as a row-major problem (see blas_internal.h). Column-major C = op(A)·op(B) is
 * row-major Cᵀ = op(B)ᵀ·op(A)ᵀ on the same memory: swap the operands and m with n; an
 * operand not transposed in the call is then stored exactly as the row-major side needs. */
static void to_problem(gb_problem *pr, gb_type type, int row, int ta_t, int tb_t, int m, int n, int k,
                       const void *a, int lda, const void *b, int ldb, void *c, int ldc)
{
    pr->type = type;
    pr->m = row ? m : n;
    pr->n = row ? n : m;
    pr->k = k;
    pr->p = (gb_operand){row ? a : b, pr->m, k, row ? lda : ldb, row ? ta_t : tb_t};
    pr->q = (gb_operand){row ? b : a, k, pr->n, row ? ldb : lda, row ? tb_t : ta_t};
    pr->c = c;
    pr->ldc = ldc;
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

/* Big enough to send: the flop count and the flops per byte on the wire (alpha = 1,
 * beta = 0: A and B out, C back). */
static int worth_sending(const gb_settings *s, gb_type t, int m, int n, int k)
{
    double esz = t == GB_F32 ? 4 : 8;
    double flops = 2.0 * m * (double)n * k;
    double bytes = esz * ((double)m * k + (double)k * n + (double)m * n);
    return flops >= s->min_flops[t] && flops >= s->min_intensity[t] * bytes;
}

/* The common case, kept short (it is all a small product pays): no log, valid arguments,
 * something to multiply, not worth sending. */
static int plain_host_call(const gb_settings *s, gb_type t, int valid, int m, int n, int k, double alpha)
{
    return !s->log && valid && m > 0 && n > 0 && k > 0 && alpha != 0 && (!s->enabled || !worth_sending(s, t, m, n, k));
}

/* Where a call goes and why (for the log). */
typedef enum { GO_HOST = 0, GO_SERVER, GO_HERE } go;

static void run(const gb_call *call, const gb_settings *s, gb_problem *pr, int valid, char order_c, char ta_c,
                char tb_c)
{
    int m = call->m, n = call->n, k = call->k;
    double t0 = s->log ? now_ms() : 0;
    const char *why = NULL;
    char whybuf[200];
    gb_result res;
    res.kernel[0] = '\0';
    go where = GO_HOST;

    if (!valid) {
        why = "invalid arguments";
    } else if (m == 0 || n == 0) {
        why = "nothing to multiply";
        where = GO_HERE;
    } else if (k == 0 || pr->alpha == 0) {
        why = "nothing to multiply: C = beta*C";
        where = GO_HERE;
        scale_c(pr);
    } else {
        if (!s->enabled) {
            why = "no GEMM_SERVER";
        } else if (!worth_sending(s, pr->type, m, n, k)) {
            why = "below threshold";
        } else {
            char desc[128];
            snprintf(desc, sizeof desc, "%s %dx%dx%d (m x k x n)", gb_entry_name(call->entry), m, k, n);
            pr->desc = desc;
            gb_offload(pr, &res);
            if (res.ok) {
                where = GO_SERVER;
            } else {
                snprintf(whybuf, sizeof whybuf, "%s%s", res.backoff ? "" : "fallback: ", res.why);
                why = whybuf;
            }
        }
    }
    if (where == GO_HOST) gb_host_run(call);
    if (s->log) {
        double ms = now_ms() - t0;
        if (where == GO_SERVER)
            gb_write_line("libgemm_blas: %s %s %c%c m=%d n=%d k=%d -> server %.3f ms (exchange %.3f ms, kernel %s)",
                          gb_entry_name(call->entry), order_c == 'R' ? "RowMajor" : "ColMajor", ta_c, tb_c, m, n, k,
                          ms, res.ms, res.kernel[0] ? res.kernel : "?");
        else if (where == GO_HERE)
            gb_write_line("libgemm_blas: %s %s %c%c m=%d n=%d k=%d -> here %.3f ms (%s)",
                          gb_entry_name(call->entry), order_c == 'R' ? "RowMajor" : "ColMajor", ta_c, tb_c, m, n, k,
                          ms, why);
        else
            gb_write_line("libgemm_blas: %s %s %c%c m=%d n=%d k=%d -> host %.3f ms (%s)",
                          gb_entry_name(call->entry), order_c == 'R' ? "RowMajor" : order_c == 'C' ? "ColMajor" : "?",
                          ta_c ? ta_c : '?', tb_c ? tb_c : '?', m, n, k, ms, why);
    }
}

static char cblas_tc(int t) { return t == GB_NO_TRANS ? 'N' : t == GB_TRANS ? 'T' : t == GB_CONJ_TRANS ? 'C' : 0; }

static void cblas_call(gb_call *call, gb_type type, double alpha, double beta)
{
    if (gb_in_host()) {
        gb_host_run(call);
        return;
    }
    const gb_settings *s = gb_settings_get();
    int valid = gb_check_cblas(call->order, call->ta, call->tb, call->m, call->n, call->k, call->lda, call->ldb,
                               call->ldc) == 0;
    if (plain_host_call(s, type, valid, call->m, call->n, call->k, alpha)) {
        gb_host_run(call);
        return;
    }
    gb_problem pr;
    memset(&pr, 0, sizeof pr);
    pr.alpha = alpha;
    pr.beta = beta;
    if (valid)
        to_problem(&pr, type, call->order == GB_ROW_MAJOR, call->ta != GB_NO_TRANS, call->tb != GB_NO_TRANS,
                   call->m, call->n, call->k, call->a, call->lda, call->b, call->ldb, call->c, call->ldc);
    char oc = call->order == GB_ROW_MAJOR ? 'R' : call->order == GB_COL_MAJOR ? 'C' : 0;
    run(call, s, &pr, valid, oc, cblas_tc(call->ta), cblas_tc(call->tb));
}

void cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                 const float *b, int ldb, float beta, float *c, int ldc)
{
    gb_call call; /* only the fields a CBLAS call uses are set: no zero-fill on every call */
    call.entry = GB_CBLAS_SGEMM, call.order = order, call.ta = ta, call.tb = tb, call.m = m, call.n = n, call.k = k;
    call.lda = lda, call.ldb = ldb, call.ldc = ldc, call.alpha_f = alpha, call.beta_f = beta;
    call.a = a, call.b = b, call.c = c;
    cblas_call(&call, GB_F32, alpha, beta);
}

void cblas_dgemm(int order, int ta, int tb, int m, int n, int k, double alpha, const double *a, int lda,
                 const double *b, int ldb, double beta, double *c, int ldc)
{
    gb_call call;
    call.entry = GB_CBLAS_DGEMM, call.order = order, call.ta = ta, call.tb = tb, call.m = m, call.n = n, call.k = k;
    call.lda = lda, call.ldb = ldb, call.ldc = ldc, call.alpha = alpha, call.beta = beta;
    call.a = a, call.b = b, call.c = c;
    cblas_call(&call, GB_F64, alpha, beta);
}

static void fortran_call(gb_call *call, gb_type type, double alpha, double beta)
{
    if (gb_in_host()) {
        gb_host_run(call);
        return;
    }
    const gb_settings *s = gb_settings_get();
    call->m = *call->fm;
    call->n = *call->fn;
    call->k = *call->fk;
    char ta = gb_trans_char(*call->fta), tb = gb_trans_char(*call->ftb);
    int valid = gb_check_fortran(*call->fta, *call->ftb, call->m, call->n, call->k, *call->flda, *call->fldb,
                                 *call->fldc) == 0;
    if (plain_host_call(s, type, valid, call->m, call->n, call->k, alpha)) {
        gb_host_run(call);
        return;
    }
    gb_problem pr;
    memset(&pr, 0, sizeof pr);
    pr.alpha = alpha;
    pr.beta = beta;
    if (valid)
        to_problem(&pr, type, 0, ta != 'N', tb != 'N', call->m, call->n, call->k, call->a, *call->flda, call->b,
                   *call->fldb, call->c, *call->fldc);
    run(call, s, &pr, valid, 'C', ta, tb);
}

void sgemm_(const char *ta, const char *tb, const int *m, const int *n, const int *k, const float *alpha,
            const float *a, const int *lda, const float *b, const int *ldb, const float *beta, float *c,
            const int *ldc)
{
    gb_call call; /* only the fields a Fortran call uses */
    call.entry = GB_SGEMM, call.fta = ta, call.ftb = tb, call.fm = m, call.fn = n, call.fk = k, call.falpha = alpha;
    call.a = a, call.flda = lda, call.b = b, call.fldb = ldb, call.fbeta = beta, call.c = c, call.fldc = ldc;
    fortran_call(&call, GB_F32, *alpha, *beta);
}

void dgemm_(const char *ta, const char *tb, const int *m, const int *n, const int *k, const double *alpha,
            const double *a, const int *lda, const double *b, const int *ldb, const double *beta, double *c,
            const int *ldc)
{
    gb_call call;
    call.entry = GB_DGEMM, call.fta = ta, call.ftb = tb, call.fm = m, call.fn = n, call.fk = k, call.falpha = alpha;
    call.a = a, call.flda = lda, call.b = b, call.fldb = ldb, call.fbeta = beta, call.c = c, call.fldc = ldc;
    fortran_call(&call, GB_F64, *alpha, *beta);
}
