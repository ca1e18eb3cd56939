/*
 * host.c - the host's own BLAS, which computes every product this library does not send:
 * the lookup order, the scan of the loaded libraries and the built-in loops are in
 * docs/BLAS.md, "The host BLAS". A thread-local flag marks "inside the host BLAS", so a host
 * CBLAS that calls its Fortran routine through the PLT reaches the host directly (not
 * RTLD_DEEPBIND: it cannot rebind loaded libraries and the sanitizers refuse it). Bad
 * arguments go to the host unchanged, so its xerbla reports them.
 */
#define _GNU_SOURCE 1
#include "blas_internal.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <regex.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- the libraries loaded
 *
 * Their dynamic symbol tables (dl_iterate_phdr) find a routine in a library loaded
 * RTLD_LOCAL (NumPy's and SciPy's wheels), where dlsym(RTLD_NEXT) does not look, and name
 * the gemm entry points that the table of blas_internal.h lacks (warned once per library).
 */
#ifndef ElfW /* link.h has it; for tools that do not read system headers */
#define ElfW(type) Elf64_##type
#endif

typedef struct {
    const char *want; /* a name to find, or NULL */
    void *addr;       /* where it was found */
    char *path;       /* ... in which library */
    size_t size;
    int log;          /* say which libraries and names were found */
    int libs;         /* BLAS libraries seen */
} scan;

static pthread_once_t entry_re_once = PTHREAD_ONCE_INIT;
static regex_t entry_re;
static int entry_re_ok;

static void compile_entry_re(void)
{
    const char *re = "^([[:alnum:]]+_)?(cblas_)?[sd]gemm(_|64_?|_64_?)?$";
    entry_re_ok = regcomp(&entry_re, re, REG_EXTENDED | REG_NOSUB) == 0;
}

/* Non-zero for a path that is this library (any copy of it). */
static int is_ours(const char *path)
{
    const char *base = strrchr(path, '/');
    return strncmp(base ? base + 1 : path, "libgemm_blas", 12) == 0;
}

/* Relocated by the loader on most targets, relative to the object's base elsewhere (the vDSO). */
static const void *dyn_ptr(const struct dl_phdr_info *info, ElfW(Addr) p)
{
    return (const void *)(p < info->dlpi_addr ? p + info->dlpi_addr : p);
}

/* Symbols in a DT_GNU_HASH table: past the highest bucket's chain. */
static size_t gnu_hash_count(const uint32_t *h)
{
    uint32_t nbuckets = h[0], first = h[1], last = 0;
    const uint32_t *buckets = h + 4 + h[2] * (sizeof(ElfW(Addr)) / 4), *chain = buckets + nbuckets;
    for (uint32_t i = 0; i < nbuckets; i++) last = buckets[i] > last ? buckets[i] : last;
    if (last < first) return first;
    while (!(chain[last - first] & 1)) last++;
    return last + 1;
}

static int one_object(struct dl_phdr_info *info, size_t size, void *arg)
{
    scan *s = arg;
    const char *path = info->dlpi_name;
    (void)size;
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC) dyn = (const void *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    if (!dyn || !path || !path[0] || is_ours(path)) return 0;
    const ElfW(Sym) *sym = NULL;
    const char *str = NULL;
    size_t nsym = 0;
    for (; dyn->d_tag != DT_NULL; dyn++) {
        if (dyn->d_tag == DT_SYMTAB) sym = dyn_ptr(info, dyn->d_un.d_ptr);
        else if (dyn->d_tag == DT_STRTAB) str = dyn_ptr(info, dyn->d_un.d_ptr);
        else if (dyn->d_tag == DT_HASH) nsym = ((const uint32_t *)dyn_ptr(info, dyn->d_un.d_ptr))[1];
        else if (dyn->d_tag == DT_GNU_HASH && !nsym) nsym = gnu_hash_count(dyn_ptr(info, dyn->d_un.d_ptr));
    }
    char known[512] = "", unknown[512] = ""; /* its gemm entry points: in the table, not in it */
    for (size_t i = 1; sym && str && i < nsym; i++) {
        const char *name = str + sym[i].st_name;
        if (ELF32_ST_TYPE(sym[i].st_info) != STT_FUNC || sym[i].st_shndx == SHN_UNDEF || !strstr(name, "gemm") ||
            regexec(&entry_re, name, 0, NULL, 0) != 0)
            continue;
        int in_table = 0;
        for (int e = 0; e < GB_ENTRY_COUNT && !in_table; e++) in_table = strcmp(name, gb_entries[e].name) == 0;
        char *list = in_table ? known : unknown;
        size_t len = strlen(list);
        snprintf(list + len, sizeof known - len, "%s%s", len ? " " : "", name);
        if (s->want && !s->addr && strcmp(name, s->want) == 0) {
            s->addr = (void *)(info->dlpi_addr + sym[i].st_value);
            snprintf(s->path, s->size, "%s", path);
        }
    }
    if (!known[0] && !unknown[0]) return 0;
    s->libs++;
    if (s->log)
        gb_write_line("libgemm_blas: BLAS in this process: %s (%s%s%s)", path, known[0] ? "interposed: " : "", known,
                      unknown[0] ? "; not interposed: see the warning" : "");
    const char *base = strrchr(path, '/');
    if (unknown[0])
        gb_warn_once(base ? base + 1 : path,
                     "%s defines %s: gemm entry points this library does not interpose; products the program "
                     "computes through them are never offloaded (docs/BLAS.md lists the names it has)",
                     path, unknown);
    return 0;
}

static void run_scan(scan *s)
{
    pthread_once(&entry_re_once, compile_entry_re);
    if (entry_re_ok) dl_iterate_phdr(one_object, s);
}

__attribute__((constructor)) static void at_start(void)
{
    if (!gb_log_wanted()) return;
    char names[1024] = "";
    for (int e = 0; e < GB_ENTRY_COUNT; e++) {
        size_t len = strlen(names);
        snprintf(names + len, sizeof names - len, " %s", gb_entries[e].name);
    }
    gb_write_line("libgemm_blas: interposes%s", names);
    scan s = {NULL, NULL, NULL, 0, 1, 0};
    run_scan(&s);
    if (!s.libs)
        gb_write_line("libgemm_blas: BLAS in this process: none yet (one loaded later, as NumPy's and SciPy's are, "
                      "is named at its first call)");
}

__attribute__((destructor)) static void at_exit(void)
{
    scan s = {NULL, NULL, NULL, 0, 0, 0};
    run_scan(&s);
}

/* ---------------------------------------------------------------- the host routines */

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
    } else if (!(fn = dlsym(RTLD_NEXT, name))) { /* a library loaded privately defines it? */
        scan s = {name, NULL, where, sizeof host.where[e], 0, 0};
        run_scan(&s);
        how = "a library loaded privately";
        fn = s.addr;
    }
    if (fn && dladdr(fn, &di) && di.dli_fname) snprintf(where, sizeof host.where[e], "%s", di.dli_fname);
    if (fn && is_ours(where)) {
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

char gb_trans(const gb_call *c, int t)
{
    if (gb_entries[c->entry].f77)
        return t == 'N' || t == 'n' ? 'N' : t == 'T' || t == 't' || t == 'C' || t == 'c' ? 'T' : 0;
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
