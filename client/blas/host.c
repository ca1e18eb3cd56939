/*
 * host.c - the host's own BLAS, which computes every product this library does not send
 * to the server.
 *
 * Each entry point's host routine is the routine of the same name (the same ABI), found at
 * the entry's first call:
 *   - GEMM_BLAS_LIB=name-or-path: dlopen(name, RTLD_NOW | RTLD_LOCAL), then dlsym on that
 *     handle (never the global scope, which holds this library's own definitions first);
 *   - unset: the definition the program would have called without the preload, the next
 *     one after this library in the global scope (dlsym(RTLD_NEXT)); else a library loaded
 *     privately (scan.c): NumPy and SciPy load theirs with an extension module, outside the
 *     global scope, and so does conda's NumPy its libcblas.
 * Never this library itself (a copy of it anywhere counts as itself). A name that has no
 * routine runs on the other API's routine of its flavour (cblas_dgemm on dgemm_, ...); with
 * neither, plain reference loops compute the product, after one warning: slow, never wrong.
 *
 * RTLD_DEEPBIND is not used: it cannot take back bindings of a library that is already
 * loaded, and the sanitizer runtimes refuse it. Instead a thread-local flag marks "inside
 * the host BLAS": a host whose CBLAS calls its Fortran routine through the PLT (netlib's
 * does) comes back into our sgemm_/dgemm_, which then go straight to the host.
 *
 * Argument errors: a call with bad arguments is handed to the host unchanged, so it is
 * reported exactly as the host reports it (its xerbla). Only the built-in loops and the
 * other API's routine check here: they print the reference BLAS's message on stderr and
 * return (where the reference XERBLA would stop the program).
 */
#define _GNU_SOURCE 1
#include "blas_internal.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOT_FOUND ((uintptr_t)1)

static struct {
    pthread_mutex_t mu;
    int lib_tried;
    void *lib; /* GEMM_BLAS_LIB's handle */
    char lib_error[192];
    _Atomic uintptr_t fn[GB_ENTRY_COUNT]; /* 0: not looked up yet; NOT_FOUND */
    char where[GB_ENTRY_COUNT][256];
} host = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* initial-exec: a plain TLS load on every call instead of __tls_get_addr (4 bytes of the
 * static TLS surplus when the library is dlopen'ed rather than preloaded). */
static _Thread_local int in_host __attribute__((tls_model("initial-exec")));

int gb_in_host(void) { return in_host; }

/* Finds e's host routine (under host.mu): its address or NULL, its library in host.where[e]. */
static void *lookup(gb_entry e)
{
    const char *name = gb_entries[e].name, *lib = getenv("GEMM_BLAS_LIB"), *how = "RTLD_NEXT";
    char *where = host.where[e];
    void *fn = NULL;
    Dl_info di;
    if (lib && *lib) {
        if (!host.lib_tried) {
            host.lib_tried = 1;
            host.lib = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
            const char *err = host.lib ? "" : dlerror();
            snprintf(host.lib_error, sizeof host.lib_error, "%s", err ? err : "dlopen failed");
        }
        how = "GEMM_BLAS_LIB";
        fn = host.lib ? dlsym(host.lib, name) : NULL;
        snprintf(where, sizeof host.where[e], "%s", lib);
    } else if (!(fn = dlsym(RTLD_NEXT, name))) {
        how = "a library loaded privately";
        fn = gb_scan_find(name, where, sizeof host.where[e]);
    }
    if (fn && dladdr(fn, &di) && di.dli_fname) snprintf(where, sizeof host.where[e], "%s", di.dli_fname);
    if (fn && gb_is_ours(where)) {
        fn = NULL;
        snprintf(host.lib_error, sizeof host.lib_error, "%s is this library itself", where);
    }
    if (gb_settings_get()->log)
        gb_write_line("libgemm_blas: %s: host %s%s%s", name, fn ? where : "none", fn ? ", found as " : "",
                      fn ? how : "");
    return fn;
}

/* The entry's host routine, looked up at its first call; NULL when there is none. */
static void *host_fn(gb_entry e)
{
    uintptr_t f = atomic_load_explicit(&host.fn[e], memory_order_acquire);
    if (!f) {
        pthread_mutex_lock(&host.mu);
        if (!(f = atomic_load_explicit(&host.fn[e], memory_order_relaxed))) { /* no other thread's yet */
            void *fn = lookup(e);
            f = fn ? (uintptr_t)fn : NOT_FOUND;
            atomic_store_explicit(&host.fn[e], f, memory_order_release);
        }
        pthread_mutex_unlock(&host.mu);
    }
    return f == NOT_FOUND ? NULL : (void *)f;
}

const char *gb_host_name(gb_entry e)
{
    if (host_fn(e)) return host.where[e];
    if (host_fn(GB_OTHER_API(e))) return host.where[GB_OTHER_API(e)];
    return "built-in loops";
}

/* ---------------------------------------------------------------- checks */

static char trans_char(char t)
{
    switch (t) {
    case 'N': case 'n': return 'N';
    case 'T': case 't': case 'C': case 'c': return 'T';
    default: return 0;
    }
}

char gb_trans(const gb_call *c, int t)
{
    if (gb_entries[c->entry].f77) return trans_char((char)t);
    return t == GB_NO_TRANS ? 'N' : t == GB_TRANS || t == GB_CONJ_TRANS ? 'T' : 0;
}

static int64_t max1(int64_t v) { return v > 1 ? v : 1; }

/* The Fortran parameter numbers; CBLAS numbers each one more (order comes first). */
static int check_f77(const gb_call *c)
{
    char a = gb_trans(c, c->ta), b = gb_trans(c, c->tb);
    int row = c->order == GB_ROW_MAJOR;
    if (!a) return 1;
    if (!b) return 2;
    if (c->m < 0) return 3;
    if (c->n < 0) return 4;
    if (c->k < 0) return 5;
    if (c->lda < max1((a == 'N') != row ? c->m : c->k)) return 8;
    if (c->ldb < max1((b == 'N') != row ? c->k : c->n)) return 10;
    if (c->ldc < max1(row ? c->n : c->m)) return 13;
    return 0;
}

int gb_check(const gb_call *c)
{
    if (gb_entries[c->entry].f77) return check_f77(c);
    if (c->order != GB_ROW_MAJOR && c->order != GB_COL_MAJOR) return 1;
    int bad = check_f77(c);
    return bad ? bad + 1 : 0;
}

/* ---------------------------------------------------------------- built-in loops */

/* The reference algorithm, column-major, after the checks: quick returns, alpha == 0
 * without reading A or B, beta == 0 without reading C. */
#define GB_REF_GEMM(NAME, T)                                                                    \
    static void NAME(const gb_call *x)                                                          \
    {                                                                                           \
        const T *a = x->a, *b = x->b, alpha = (T)x->alpha, beta = (T)x->beta;                   \
        T *c = x->c;                                                                            \
        int nta = gb_trans(x, x->ta) == 'N', ntb = gb_trans(x, x->tb) == 'N';                  \
        if (x->m == 0 || x->n == 0 || ((alpha == 0 || x->k == 0) && beta == 1)) return;        \
        for (int64_t j = 0; j < x->n; j++) {                                                    \
            T *cj = c + j * x->ldc;                                                             \
            for (int64_t i = 0; i < x->m; i++) {                                                \
                T s = 0;                                                                        \
                for (int64_t l = 0; l < x->k && alpha != 0; l++)                                \
                    s += (nta ? a[l * x->lda + i] : a[i * x->lda + l]) *                        \
                         (ntb ? b[j * x->ldb + l] : b[l * x->ldb + j]);                         \
                cj[i] = beta == 0 ? alpha * s : alpha * s + beta * cj[i];                       \
            }                                                                                   \
        }                                                                                       \
    }
GB_REF_GEMM(ref_sgemm, float)
GB_REF_GEMM(ref_dgemm, double)

/* ---------------------------------------------------------------- dispatch */

/* The call in the column-major form of entry `to` (a row-major call is the column-major
 * one on Cᵀ: operands, m and n swapped). */
static gb_call as_entry(const gb_call *c, gb_entry to)
{
    int row = c->order == GB_ROW_MAJOR, f77 = gb_entries[to].f77;
    char ta = gb_trans(c, row ? c->tb : c->ta), tb = gb_trans(c, row ? c->ta : c->tb);
    return (gb_call){to, GB_COL_MAJOR, f77 ? ta : ta == 'N' ? GB_NO_TRANS : GB_TRANS,
                     f77 ? tb : tb == 'N' ? GB_NO_TRANS : GB_TRANS, row ? c->n : c->m, row ? c->m : c->n, c->k,
                     row ? c->ldb : c->lda, row ? c->lda : c->ldb, c->ldc, c->alpha, c->beta,
                     row ? c->b : c->a, row ? c->a : c->b, c->c};
}

/* A call whose name has no host routine: checked here (reference messages), then the
 * other API's routine or the built-in loops. */
static void without_own(const gb_call *c)
{
    const gb_entry_info *e = &gb_entries[c->entry];
    int bad = gb_check(c);
    if (bad && e->f77)
        gb_write_line(" ** On entry to %s parameter number %2d had an illegal value",
                      e->type == GB_F32 ? "SGEMM " : "DGEMM ", bad);
    else if (bad)
        gb_write_line("Parameter %d to routine %s was incorrect", bad, e->name);
    if (bad) return;
    gb_entry other = GB_OTHER_API(c->entry);
    void *fn = host_fn(other);
    gb_call x = as_entry(c, fn ? other : c->entry);
    if (fn) {
        gb_entries[other].call(fn, &x);
        return;
    }
    gb_warn_once("no_host_blas",
                 "no host BLAS found for %s (%s): products that are not offloaded run on slow built-in loops; "
                 "set GEMM_BLAS_LIB to the BLAS library to use",
                 e->name, host.lib_error[0] ? host.lib_error : "no library in the process defines it");
    if (e->type == GB_F32) ref_sgemm(&x);
    else ref_dgemm(&x);
}

void gb_host_run(const gb_call *c)
{
    int outer = in_host;
    in_host = 1;
    void *fn = host_fn(c->entry);
    if (fn) gb_entries[c->entry].call(fn, c);
    else without_own(c);
    in_host = outer;
}
