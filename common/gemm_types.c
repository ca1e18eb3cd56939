/* gemm_types.c - dtypes, math modes, checked sizes, errors, the host allocator. */
#define _POSIX_C_SOURCE 200809L
#include "gemm_types.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <time.h>

const gemm_dtype_info gemm_dtypes[GEMM_DTYPE_COUNT] = {
    [GEMM_DTYPE_F32] = {"float32", "FP32", "<f4", 4, 17},  [GEMM_DTYPE_F64] = {"float64", "FP64", "<f8", 8, 26},
    [GEMM_DTYPE_I32] = {"int32", "INT32", "<i4", 4, 12},   [GEMM_DTYPE_F16] = {"float16", "FP16", "<f2", 2, 17},
    [GEMM_DTYPE_BF16] = {"bfloat16", "BF16", "<V2", 2, 17},
};

#define VALID(d) ((d) >= 0 && (d) < GEMM_DTYPE_COUNT)
size_t gemm_dtype_size(gemm_dtype d) { return VALID(d) ? gemm_dtypes[d].size : 0; }
unsigned gemm_json_elem_width(gemm_dtype d) { return VALID(d) ? gemm_dtypes[d].json_width : 17; }
const char *gemm_dtype_name(gemm_dtype d) { return VALID(d) ? gemm_dtypes[d].name : "invalid"; }

int gemm_dtype_from_name(const char *s, gemm_dtype *out)
{
    static const struct { const char *name; gemm_dtype d; } aliases[] = {
        {"f4", GEMM_DTYPE_F32}, {"float", GEMM_DTYPE_F32}, {"f8", GEMM_DTYPE_F64}, {"double", GEMM_DTYPE_F64},
        {"i4", GEMM_DTYPE_I32}, {"int", GEMM_DTYPE_I32},   {"f2", GEMM_DTYPE_F16}, {"half", GEMM_DTYPE_F16},
    };
    for (int d = 0; s && d < GEMM_DTYPE_COUNT; d++) /* the canonical names and v2's */
        if (strcasecmp(s, gemm_dtypes[d].name) == 0 || strcasecmp(s, gemm_dtypes[d].v2) == 0)
            return *out = (gemm_dtype)d, 0;
    for (size_t i = 0; s && i < sizeof aliases / sizeof aliases[0]; i++)
        if (strcasecmp(s, aliases[i].name) == 0) return *out = aliases[i].d, 0;
    return -1;
}

static const char *const math_names[GEMM_MATH_COUNT] = {"default", "fp32", "tf32", "bf16"};

const char *gemm_math_name(gemm_math m)
{
    return (m >= 0 && m < GEMM_MATH_COUNT) ? math_names[m] : "invalid";
}

int gemm_math_from_name(const char *s, gemm_math *out)
{
    for (int i = 0; s && i < GEMM_MATH_COUNT; i++)
        if (strcasecmp(s, math_names[i]) == 0) return *out = (gemm_math)i, 0;
    return -1;
}

int gemm_out_dtype_resolve(gemm_dtype d, gemm_dtype out, gemm_dtype *c, gemm_err *err)
{
    if (out == GEMM_DTYPE_INVALID) {
        *c = gemm_dtype_is_half(d) ? GEMM_DTYPE_F32 : d;
        return 0;
    }
    if (out == d || (gemm_dtype_is_half(d) && out == GEMM_DTYPE_F32)) {
        *c = out;
        return 0;
    }
    return gemm_err_set(err, 422, "bad_out_dtype",
                        gemm_dtype_is_half(d) ? "out_dtype %s is not available for %s operands; use float32 (the "
                                                "default) or %s"
                                              : "out_dtype %s is not available for %s operands: C is %s (out_dtype "
                                                "chooses between float32 and the input dtype for float16 and "
                                                "bfloat16 operands only)",
                        gemm_dtype_name(out), gemm_dtype_name(d), gemm_dtype_name(d));
}

const char *gemm_math_report_name(gemm_dtype d, gemm_math m)
{
    if (gemm_dtype_is_half(d)) return "fp32"; /* float32 products of the exact half values, float32 sums */
    if (d != GEMM_DTYPE_F32) return "exact";
    return m == GEMM_MATH_DEFAULT ? "fp32" : gemm_math_name(m);
}

bool gemm_mul_size(size_t a, size_t b, size_t *out)
{
    size_t r;
    if (__builtin_mul_overflow(a, b, &r)) return false;
    *out = r;
    return true;
}

bool gemm_add_size(size_t a, size_t b, size_t *out)
{
    size_t r;
    if (__builtin_add_overflow(a, b, &r)) return false;
    *out = r;
    return true;
}

bool gemm_matrix_bytes(uint64_t rows, uint64_t cols, gemm_dtype d, size_t *out)
{
    size_t es = gemm_dtype_size(d), n;
    if (es == 0 || rows > SIZE_MAX || cols > SIZE_MAX) return false;
    if (!gemm_mul_size((size_t)rows, (size_t)cols, &n)) return false;
    return gemm_mul_size(n, es, out);
}

void gemm_err_clear(gemm_err *e)
{
    if (e) *e = (gemm_err){0};
}

int gemm_err_set(gemm_err *e, int status, const char *code, const char *fmt, ...)
{
    if (!e) return -1;
    e->status = status;
    snprintf(e->code, sizeof e->code, "%s", code ? code : "error");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

const char *gemm_shown(const char *s, size_t len, char *buf, size_t cap)
{
    size_t i = 0, n = 0;
    for (; i < len && n + 4 < cap; i++) buf[n++] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
    if (i < len) n += (size_t)snprintf(buf + n, cap - n, "...");
    buf[n] = '\0';
    return buf;
}

static int check_elements(const char *what, uint64_t r, uint64_t c, gemm_dtype d,
                          const gemm_limits *lim, gemm_err *err)
{
    size_t bytes, elems;
    if (!gemm_mul_size(r, c, &elems) || !gemm_matrix_bytes(r, c, d, &bytes))
        return gemm_err_set(err, 413, "too_large",
                            "%s would be %llux%llu, whose size overflows", what,
                            (unsigned long long)r, (unsigned long long)c);
    if (lim && lim->max_elements && elems > lim->max_elements)
        return gemm_err_set(err, 413, "too_large",
                            "%s would be %llux%llu = %zu elements; this server allows at most %llu",
                            what, (unsigned long long)r, (unsigned long long)c, elems,
                            (unsigned long long)lim->max_elements);
    return 0;
}

int gemm_check_product(uint64_t m, uint64_t k, uint64_t kb, uint64_t n, gemm_dtype d,
                       const gemm_limits *lim, gemm_err *err)
{
    if (gemm_dtype_size(d) == 0)
        return gemm_err_set(err, 422, "bad_dtype", "unsupported dtype; use float32, float64, int32, float16 or bfloat16");
    if (m == 0 || k == 0 || kb == 0 || n == 0)
        return gemm_err_set(err, 422, "empty_matrix",
                            "A is %llux%llu and B is %llux%llu: every dimension must be at least 1",
                            (unsigned long long)m, (unsigned long long)k,
                            (unsigned long long)kb, (unsigned long long)n);
    if (k != kb)
        return gemm_err_set(err, 422, "shape_mismatch",
                            "A is %llux%llu and B is %llux%llu: A's columns (%llu) must equal B's rows (%llu)",
                            (unsigned long long)m, (unsigned long long)k,
                            (unsigned long long)kb, (unsigned long long)n,
                            (unsigned long long)k, (unsigned long long)kb);
    if (lim && lim->max_dim) {
        uint64_t big = m > k ? m : k;
        big = big > n ? big : n;
        if (big > lim->max_dim)
            return gemm_err_set(err, 413, "too_large",
                                "dimension %llu exceeds this server's limit of %llu (m=%llu k=%llu n=%llu)",
                                (unsigned long long)big, (unsigned long long)lim->max_dim,
                                (unsigned long long)m, (unsigned long long)k, (unsigned long long)n);
    }
    if (check_elements("A", m, k, d, lim, err) || check_elements("B", k, n, d, lim, err) ||
        check_elements("C", m, n, d, lim, err))
        return -1;
    return 0;
}

#define GEMM_HUGE_PAGE ((size_t)2 << 20)

/* Matrix buffers are written once, soon after they are allocated, so a fresh buffer costs
 * one page fault per 4 KiB page it spans. Buffers of 2 MiB and more are aligned to 2 MiB
 * and offered to transparent huge pages (where the kernel has them in madvise mode), which
 * cuts those faults about 500-fold; the advice is a hint and its failure is harmless. */
static void *host_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    void *p = NULL;
    size_t align = bytes >= GEMM_HUGE_PAGE ? GEMM_HUGE_PAGE : 64;
    size_t rounded = (bytes + align - 1) & ~(align - 1);
    if (rounded < bytes) return NULL;
    if (posix_memalign(&p, align, rounded ? rounded : 64) != 0) return NULL;
#ifdef MADV_HUGEPAGE
    if (align == GEMM_HUGE_PAGE) (void)madvise(p, rounded, MADV_HUGEPAGE);
#endif
    return p;
}

static void host_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}

const gemm_allocator gemm_allocator_host = {host_alloc, host_free, NULL};

static _Thread_local int busy_thread;

void gemm_alloc_mark_busy_thread(void) { busy_thread = 1; }

int gemm_alloc_busy_thread(void) { return busy_thread; }

double gemm_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int gemm_check_matrix(uint64_t rows, uint64_t cols, gemm_dtype d, const gemm_limits *lim,
                      const char *what, gemm_err *err)
{
    if (!what) what = "the matrix";
    if (gemm_dtype_size(d) == 0)
        return gemm_err_set(err, 422, "bad_dtype", "%s: unsupported dtype; use float32, float64, int32, float16 or bfloat16", what);
    if (rows == 0 || cols == 0)
        return gemm_err_set(err, 422, "empty_matrix",
                            "%s is %llux%llu: every dimension must be at least 1", what,
                            (unsigned long long)rows, (unsigned long long)cols);
    if (lim && lim->max_dim && (rows > lim->max_dim || cols > lim->max_dim))
        return gemm_err_set(err, 413, "too_large",
                            "%s is %llux%llu: dimension %llu exceeds this server's limit of %llu", what,
                            (unsigned long long)rows, (unsigned long long)cols,
                            (unsigned long long)(rows > cols ? rows : cols),
                            (unsigned long long)lim->max_dim);
    return check_elements(what, rows, cols, d, lim, err);
}

int gemm_check_stack(uint64_t batch, uint64_t rows, uint64_t cols, gemm_dtype d,
                     const gemm_limits *lim, const char *what, gemm_err *err)
{
    if (!what) what = "the array";
    if (gemm_check_matrix(rows, cols, d, lim, what, err) != 0) return -1;
    if (batch == 0)
        return gemm_err_set(err, 422, "bad_batch", "%s has a batch of 0 matrices; send at least one",
                            what);
    if (batch > GEMM_MAX_BATCH)
        return gemm_err_set(err, 413, "too_large",
                            "%s holds %llu matrices; one request carries at most %d", what,
                            (unsigned long long)batch, GEMM_MAX_BATCH);
    size_t elems, bytes;
    if (!gemm_mul_size((size_t)rows, (size_t)cols, &elems) || !gemm_mul_size(elems, (size_t)batch, &elems) ||
        !gemm_mul_size(elems, gemm_dtype_size(d), &bytes))
        return gemm_err_set(err, 413, "too_large", "%s: %llu x %llu x %llu elements overflow", what,
                            (unsigned long long)batch, (unsigned long long)rows,
                            (unsigned long long)cols);
    if (lim && lim->max_elements && elems > lim->max_elements)
        return gemm_err_set(err, 413, "too_large",
                            "%s is %llux%llux%llu = %zu elements, more than this server's limit of "
                            "%llu per array", what, (unsigned long long)batch,
                            (unsigned long long)rows, (unsigned long long)cols, elems,
                            (unsigned long long)lim->max_elements);
    return 0;
}

int gemm_check_batch_pair(uint64_t a_batch, uint64_t b_batch, gemm_err *err)
{
    if (b_batch && !a_batch)
        return gemm_err_set(err, 422, "batch_mismatch",
                            "B is 3-D (%llu matrices) but A is 2-D; a batched product needs A of shape "
                            "(b, m, k) (B may be (b, k, n) or one (k, n) for all)",
                            (unsigned long long)b_batch);
    if (b_batch && b_batch != a_batch)
        return gemm_err_set(err, 422, "batch_mismatch",
                            "A holds %llu matrices and B %llu; send as many Bs as As, or one 2-D B for all",
                            (unsigned long long)a_batch, (unsigned long long)b_batch);
    return 0;
}

int gemm_utf8_lead(unsigned char c, unsigned char *need, unsigned char *lo, unsigned char *hi)
{
    static const struct { unsigned char first, last, need, lo, hi; } lead[] = {
        {0xc2, 0xdf, 1, 0x80, 0xbf}, {0xe0, 0xe0, 2, 0xa0, 0xbf}, {0xe1, 0xec, 2, 0x80, 0xbf},
        {0xed, 0xed, 2, 0x80, 0x9f}, {0xee, 0xef, 2, 0x80, 0xbf}, {0xf0, 0xf0, 3, 0x90, 0xbf},
        {0xf1, 0xf3, 3, 0x80, 0xbf}, {0xf4, 0xf4, 3, 0x80, 0x8f},
    };
    for (size_t i = 0; i < sizeof lead / sizeof lead[0]; i++) {
        if (c >= lead[i].first && c <= lead[i].last) {
            *need = lead[i].need, *lo = lead[i].lo, *hi = lead[i].hi;
            return 0;
        }
    }
    return -1;
}

size_t gemm_utf8_seq(const unsigned char *p)
{
    unsigned char need, lo, hi;
    if (p[0] < 0x80) return 1;
    if (gemm_utf8_lead(p[0], &need, &lo, &hi)) return 0;
    for (size_t i = 1; i <= need; i++, lo = 0x80, hi = 0xbf)
        if (p[i] < lo || p[i] > hi) return 0; /* also stops at the terminating NUL */
    return (size_t)need + 1;
}
