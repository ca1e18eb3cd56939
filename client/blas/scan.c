/*
 * scan.c - the BLAS libraries loaded in the process, read from their dynamic symbol
 * tables (dl_iterate_phdr): where a name's host routine is when the library is not in the
 * global scope (NumPy's and SciPy's wheels, conda's libcblas: loaded RTLD_LOCAL with an
 * extension module, so dlsym(RTLD_NEXT) does not see them), and what to tell the user.
 *
 * A gemm entry point is a defined function named [word_][cblas_]{s,d}gemm with no suffix or
 * one of _ 64 64_ _64 _64_ (sgemm_, cblas_dgemm64_, scipy_sgemm_64_, MKL's sgemm_64); the
 * kernels OpenBLAS exports (dgemm_nn, sgemm_incopy_HASWELL, ...) are not. A library that
 * defines one under a name the table of blas_internal.h lacks is reached by the program
 * without this library: that is warned about once per library, at every scan (a routine's
 * first lookup, and at exit). With GEMM_OFFLOAD_LOG=1 the start says which names this
 * library defines and which BLAS libraries are loaded then (those loaded later, as NumPy's,
 * are named at their routines' first call).
 */
#define _GNU_SOURCE 1
#include "blas_internal.h"

#include <link.h>
#include <pthread.h>
#include <regex.h>
#include <stdio.h>
#include <string.h>

#ifndef ElfW /* link.h has it; for tools that do not read system headers */
#define ElfW(type) Elf64_##type
#endif

enum { MAX_NAMES = 24 };

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

int gb_is_ours(const char *path)
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

static void one_library(scan *s, const char *path, const char **names, void *const *addrs, int n)
{
    char known[512] = "", unknown[512] = "";
    for (int i = 0; i < n; i++) {
        int in_table = 0;
        for (int e = 0; e < GB_ENTRY_COUNT && !in_table; e++) in_table = strcmp(names[i], gb_entries[e].name) == 0;
        char *list = in_table ? known : unknown;
        size_t len = strlen(list);
        snprintf(list + len, sizeof known - len, "%s%s", len ? " " : "", names[i]);
        if (s->want && !s->addr && strcmp(names[i], s->want) == 0) {
            s->addr = addrs[i];
            snprintf(s->path, s->size, "%s", path);
        }
    }
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
}

static int one_object(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC) dyn = (const void *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    if (!dyn || !info->dlpi_name || !info->dlpi_name[0] || gb_is_ours(info->dlpi_name)) return 0;
    const ElfW(Sym) *sym = NULL;
    const char *str = NULL;
    size_t nsym = 0;
    for (; dyn->d_tag != DT_NULL; dyn++) {
        if (dyn->d_tag == DT_SYMTAB) sym = dyn_ptr(info, dyn->d_un.d_ptr);
        else if (dyn->d_tag == DT_STRTAB) str = dyn_ptr(info, dyn->d_un.d_ptr);
        else if (dyn->d_tag == DT_HASH) nsym = ((const uint32_t *)dyn_ptr(info, dyn->d_un.d_ptr))[1];
        else if (dyn->d_tag == DT_GNU_HASH && !nsym) nsym = gnu_hash_count(dyn_ptr(info, dyn->d_un.d_ptr));
    }
    const char *names[MAX_NAMES];
    void *addrs[MAX_NAMES];
    int n = 0;
    for (size_t i = 1; sym && str && i < nsym && n < MAX_NAMES; i++) {
        const char *name = str + sym[i].st_name;
        if (ELF32_ST_TYPE(sym[i].st_info) != STT_FUNC || sym[i].st_shndx == SHN_UNDEF || !strstr(name, "gemm") ||
            regexec(&entry_re, name, 0, NULL, 0) != 0)
            continue;
        names[n] = name;
        addrs[n++] = (void *)(info->dlpi_addr + sym[i].st_value);
    }
    if (n) one_library(arg, info->dlpi_name, names, addrs, n);
    return 0;
}

static void run_scan(scan *s)
{
    pthread_once(&entry_re_once, compile_entry_re);
    if (entry_re_ok) dl_iterate_phdr(one_object, s);
}

void *gb_scan_find(const char *name, char *path, size_t size)
{
    scan s = {name, NULL, path, size, 0, 0};
    run_scan(&s);
    return s.addr;
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
