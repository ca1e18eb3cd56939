/*
 * host.c - the host's own BLAS, which computes every product this library does not send
 * to the server.
 *
 * Found once, on the first call, by name:
 *   - GEMM_BLAS_LIB=name-or-path: dlopen(name, RTLD_NOW | RTLD_LOCAL), then dlsym on that
 *     handle (never the global scope, which holds this library's own definitions first);
 *   - unset: the definition the program would have called without the preload (the next
 *     one after this library in the global scope, dlsym(RTLD_NEXT, ...)), else the system
 *     libblas.so.3 by dlopen. Numpy loads its BLAS with its extension module, outside the
 *     global scope, so for it the second step finds the same libblas.so.3 already loaded.
 * A CBLAS entry of a library without CBLAS is mapped onto its Fortran routine, and the other
 * way round. With neither (the library cannot be loaded, or it is this very library),
 * plain reference loops compute the product, after one warning: slow, never wrong.
 *
 * RTLD_DEEPBIND is not used: it cannot take back bindings of a library that is already
 * loaded, and the sanitizer runtimes refuse it. Instead a thread-local flag marks "inside
 * the host BLAS": a host whose CBLAS calls its Fortran routine through the PLT (netlib's
 * does) comes back into our sgemm_/dgemm_, which then go straight to the host.
 *
 * Argument errors: a call with bad arguments is handed to the host unchanged, so it is
 * reported exactly as the host reports it (its xerbla). Only the built-in loops check
 * themselves: they print the reference BLAS's message on stderr and return (where the
 * reference XERBLA would stop the program).
 */
#define _GNU_SOURCE 1
#include "blas_internal.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*cblas_s_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int,
                           float, float *, int);
typedef void (*cblas_d_fn)(int, int, int, int, int, int, double, const double *, int, const double *,
                           int, double, double *, int);
/* Fortran: character arguments carry a hidden length at the end (gfortran: size_t). */
typedef void (*f77_s_fn)(const char *, const char *, const int *, const int *, const int *, const float *,
                         const float *, const int *, const float *, const int *, const float *, float *,
                         const int *, size_t, size_t);
typedef void (*f77_d_fn)(const char *, const char *, const int *, const int *, const int *, const double *,
                         const double *, const int *, const double *, const int *, const double *, double *,
                         const int *, size_t, size_t);

/* Our own definitions, to recognise a "host" that is this library. */
void cblas_sgemm(int, int, int, int, int, int, float, const float *, int, const float *, int, float, float *, int);
void cblas_dgemm(int, int, int, int, int, int, double, const double *, int, const double *, int, double, double *,
                 int);
void sgemm_(const char *, const char *, const int *, const int *, const int *, const float *, const float *,
            const int *, const float *, const int *, const float *, float *, const int *);
void dgemm_(const char *, const char *, const int *, const int *, const int *, const double *, const double *,
            const int *, const double *, const int *, const double *, double *, const int *);

static struct {
    pthread_once_t once;
    void *handle;
    cblas_s_fn cs;
    cblas_d_fn cd;
    f77_s_fn fs;
    f77_d_fn fd;
    char name[256];
} host = {.once = PTHREAD_ONCE_INIT};

/* initial-exec: a plain TLS load on every call instead of __tls_get_addr (4 bytes of the
 * static TLS surplus when the library is dlopen'ed rather than preloaded). */
static _Thread_local int in_host __attribute__((tls_model("initial-exec")));

int gb_in_host(void) { return in_host; }

const char *gb_entry_name(gb_entry e)
{
    static const char *const names[GB_ENTRY_COUNT] = {"cblas_sgemm", "cblas_dgemm", "sgemm_", "dgemm_"};
    return (unsigned)e < GB_ENTRY_COUNT ? names[e] : "?";
}

static void *ours(int i)
{
    switch (i) {
    case 0: return (void *)cblas_sgemm;
    case 1: return (void *)cblas_dgemm;
    case 2: return (void *)sgemm_;
    default: return (void *)dgemm_;
    }
}

static void host_init(void)
{
    static const char *const sym[4] = {"cblas_sgemm", "cblas_dgemm", "sgemm_", "dgemm_"};
    void *fn[4] = {NULL, NULL, NULL, NULL};
    const char *lib = getenv("GEMM_BLAS_LIB");
    const char *tried = lib && *lib ? lib : "libblas.so.3";
    char why[192] = "";

    if (!(lib && *lib)) {
        for (int i = 0; i < 4; i++) fn[i] = dlsym(RTLD_NEXT, sym[i]);
    }
    int found = 0;
    for (int i = 0; i < 4; i++) found += fn[i] != NULL && fn[i] != ours(i);
    if (!found) {
        memset(fn, 0, sizeof fn);
        host.handle = dlopen(tried, RTLD_NOW | RTLD_LOCAL);
        if (!host.handle) {
            const char *e = dlerror();
            snprintf(why, sizeof why, "%s", e ? e : "dlopen failed");
        } else {
            for (int i = 0; i < 4; i++) fn[i] = dlsym(host.handle, sym[i]);
        }
    }
    for (int i = 0; i < 4; i++)
        if (fn[i] == ours(i)) {
            fn[i] = NULL;
            snprintf(why, sizeof why, "%s is this library itself", tried);
        }
    host.cs = (cblas_s_fn)fn[0];
    host.cd = (cblas_d_fn)fn[1];
    host.fs = (f77_s_fn)fn[2];
    host.fd = (f77_d_fn)fn[3];

    void *any = fn[3] ? fn[3] : fn[1] ? fn[1] : fn[2] ? fn[2] : fn[0];
    Dl_info di;
    if (any && dladdr(any, &di) && di.dli_fname)
        snprintf(host.name, sizeof host.name, "%s", di.dli_fname);
    else if (any)
        snprintf(host.name, sizeof host.name, "%s", tried);
    else
        snprintf(host.name, sizeof host.name, "built-in loops");

    if (!(host.cs || host.fs) || !(host.cd || host.fd))
        gb_warn_once("no_host_blas",
                     "no host BLAS found (%s%s%s): products that are not offloaded run on slow "
                     "built-in loops; set GEMM_BLAS_LIB to the BLAS library to use",
                     tried, why[0] ? ": " : "", why);
}

const char *gb_host_name(void)
{
    pthread_once(&host.once, host_init);
    return host.name;
}

/* ---------------------------------------------------------------- checks */

char gb_trans_char(char t)
{
    switch (t) {
    case 'N': case 'n': return 'N';
    case 'T': case 't': case 'C': case 'c': return 'T';
    default: return 0;
    }
}

static int max1(int v) { return v > 1 ? v : 1; }

int gb_check_fortran(char ta, char tb, int m, int n, int k, int lda, int ldb, int ldc)
{
    char a = gb_trans_char(ta), b = gb_trans_char(tb);
    if (!a) return 1;
    if (!b) return 2;
    if (m < 0) return 3;
    if (n < 0) return 4;
    if (k < 0) return 5;
    if (lda < max1(a == 'N' ? m : k)) return 8;
    if (ldb < max1(b == 'N' ? k : n)) return 10;
    if (ldc < max1(m)) return 13;
    return 0;
}

static int cblas_trans_ok(int t) { return t == GB_NO_TRANS || t == GB_TRANS || t == GB_CONJ_TRANS; }

int gb_check_cblas(int order, int ta, int tb, int m, int n, int k, int lda, int ldb, int ldc)
{
    if (order != GB_ROW_MAJOR && order != GB_COL_MAJOR) return 1;
    if (!cblas_trans_ok(ta)) return 2;
    if (!cblas_trans_ok(tb)) return 3;
    if (m < 0) return 4;
    if (n < 0) return 5;
    if (k < 0) return 6;
    int na = ta == GB_NO_TRANS, nb = tb == GB_NO_TRANS;
    if (order == GB_COL_MAJOR) {
        if (lda < max1(na ? m : k)) return 9;
        if (ldb < max1(nb ? k : n)) return 11;
        if (ldc < max1(m)) return 14;
    } else {
        if (lda < max1(na ? k : m)) return 9;
        if (ldb < max1(nb ? n : k)) return 11;
        if (ldc < max1(n)) return 14;
    }
    return 0;
}

/* The built-in loops' argument errors: the reference BLAS's messages, then return. The
 * program's xerbla_ / cblas_xerbla are not called: the common ones stop the program. */
static void report_fortran(gb_entry e, int info)
{
    const char *name = (e == GB_SGEMM || e == GB_CBLAS_SGEMM) ? "SGEMM " : "DGEMM ";
    gb_write_line(" ** On entry to %s parameter number %2d had an illegal value", name, info);
}

static void report_cblas(gb_entry e, int param)
{
    gb_write_line("Parameter %d to routine %s was incorrect", param, gb_entry_name(e));
}

/* ---------------------------------------------------------------- built-in loops */

/* The reference algorithm, column-major, after the checks: quick returns, alpha == 0
 * without reading A or B, beta == 0 without reading C. */
#define GB_REF_GEMM(NAME, T)                                                                    \
    static void NAME(char ta, char tb, int m, int n, int k, T alpha, const T *a, int lda,       \
                     const T *b, int ldb, T beta, T *c, int ldc)                                \
    {                                                                                           \
        if (m == 0 || n == 0 || ((alpha == 0 || k == 0) && beta == 1)) return;                  \
        for (int j = 0; j < n; j++) {                                                           \
            T *cj = c + (size_t)j * (size_t)ldc;                                                \
            if (alpha == 0) {                                                                   \
                for (int i = 0; i < m; i++) cj[i] = beta == 0 ? (T)0 : beta * cj[i];            \
                continue;                                                                       \
            }                                                                                   \
            for (int i = 0; i < m; i++) {                                                       \
                T s = 0;                                                                        \
                for (int l = 0; l < k; l++) {                                                   \
                    T av = ta == 'N' ? a[(size_t)l * (size_t)lda + (size_t)i]                   \
                                     : a[(size_t)i * (size_t)lda + (size_t)l];                  \
                    T bv = tb == 'N' ? b[(size_t)j * (size_t)ldb + (size_t)l]                   \
                                     : b[(size_t)l * (size_t)ldb + (size_t)j];                  \
                    s += av * bv;                                                               \
                }                                                                               \
                cj[i] = beta == 0 ? alpha * s : alpha * s + beta * cj[i];                       \
            }                                                                                   \
        }                                                                                       \
    }
GB_REF_GEMM(ref_sgemm, float)
GB_REF_GEMM(ref_dgemm, double)

/* ---------------------------------------------------------------- dispatch */

static char cblas_char(int t) { return t == GB_NO_TRANS ? 'N' : t == GB_TRANS ? 'T' : 'C'; }

/* A CBLAS call, without a host CBLAS: checked here, then the host's Fortran routine or the
 * built-in loops, column-major (a row-major call is the column-major one on Cᵀ). */
static void cblas_via_fortran(const gb_call *c)
{
    int bad = gb_check_cblas(c->order, c->ta, c->tb, c->m, c->n, c->k, c->lda, c->ldb, c->ldc);
    if (bad) {
        report_cblas(c->entry, bad);
        return;
    }
    int row = c->order == GB_ROW_MAJOR;
    char t1 = cblas_char(row ? c->tb : c->ta), t2 = cblas_char(row ? c->ta : c->tb);
    int m = row ? c->n : c->m, n = row ? c->m : c->n, k = c->k;
    const void *x = row ? c->b : c->a, *y = row ? c->a : c->b;
    int ldx = row ? c->ldb : c->lda, ldy = row ? c->lda : c->ldb;
    if (c->entry == GB_CBLAS_SGEMM) {
        if (host.fs)
            host.fs(&t1, &t2, &m, &n, &k, &c->alpha_f, x, &ldx, y, &ldy, &c->beta_f, c->c, &c->ldc, 1, 1);
        else
            ref_sgemm(gb_trans_char(t1), gb_trans_char(t2), m, n, k, c->alpha_f, x, ldx, y, ldy, c->beta_f,
                      c->c, c->ldc);
    } else {
        if (host.fd)
            host.fd(&t1, &t2, &m, &n, &k, &c->alpha, x, &ldx, y, &ldy, &c->beta, c->c, &c->ldc, 1, 1);
        else
            ref_dgemm(gb_trans_char(t1), gb_trans_char(t2), m, n, k, c->alpha, x, ldx, y, ldy, c->beta, c->c,
                      c->ldc);
    }
}

/* A Fortran call, without a host Fortran routine: checked here, then the host's CBLAS
 * (column-major) or the built-in loops. */
static void fortran_via_cblas(const gb_call *c)
{
    int bad = gb_check_fortran(*c->fta, *c->ftb, *c->fm, *c->fn, *c->fk, *c->flda, *c->fldb, *c->fldc);
    if (bad) {
        report_fortran(c->entry, bad);
        return;
    }
    char ta = gb_trans_char(*c->fta), tb = gb_trans_char(*c->ftb);
    int cta = ta == 'N' ? GB_NO_TRANS : GB_TRANS, ctb = tb == 'N' ? GB_NO_TRANS : GB_TRANS;
    if (c->entry == GB_SGEMM) {
        float al = *(const float *)c->falpha, be = *(const float *)c->fbeta;
        if (host.cs)
            host.cs(GB_COL_MAJOR, cta, ctb, *c->fm, *c->fn, *c->fk, al, c->a, *c->flda, c->b, *c->fldb, be,
                    c->c, *c->fldc);
        else
            ref_sgemm(ta, tb, *c->fm, *c->fn, *c->fk, al, c->a, *c->flda, c->b, *c->fldb, be, c->c, *c->fldc);
    } else {
        double al = *(const double *)c->falpha, be = *(const double *)c->fbeta;
        if (host.cd)
            host.cd(GB_COL_MAJOR, cta, ctb, *c->fm, *c->fn, *c->fk, al, c->a, *c->flda, c->b, *c->fldb, be,
                    c->c, *c->fldc);
        else
            ref_dgemm(ta, tb, *c->fm, *c->fn, *c->fk, al, c->a, *c->flda, c->b, *c->fldb, be, c->c, *c->fldc);
    }
}

void gb_host_run(const gb_call *c)
{
    pthread_once(&host.once, host_init);
    int outer = in_host;
    in_host = 1;
    switch (c->entry) {
    case GB_CBLAS_SGEMM:
        if (host.cs)
            host.cs(c->order, c->ta, c->tb, c->m, c->n, c->k, c->alpha_f, c->a, c->lda, c->b, c->ldb, c->beta_f,
                    c->c, c->ldc);
        else
            cblas_via_fortran(c);
        break;
    case GB_CBLAS_DGEMM:
        if (host.cd)
            host.cd(c->order, c->ta, c->tb, c->m, c->n, c->k, c->alpha, c->a, c->lda, c->b, c->ldb, c->beta, c->c,
                    c->ldc);
        else
            cblas_via_fortran(c);
        break;
    case GB_SGEMM:
        if (host.fs)
            host.fs(c->fta, c->ftb, c->fm, c->fn, c->fk, c->falpha, c->a, c->flda, c->b, c->fldb, c->fbeta, c->c,
                    c->fldc, 1, 1);
        else
            fortran_via_cblas(c);
        break;
    case GB_DGEMM:
        if (host.fd)
            host.fd(c->fta, c->ftb, c->fm, c->fn, c->fk, c->falpha, c->a, c->flda, c->b, c->fldb, c->fbeta, c->c,
                    c->fldc, 1, 1);
        else
            fortran_via_cblas(c);
        break;
    default:
        break;
    }
    in_host = outer;
}
