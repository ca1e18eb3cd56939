/* json_codec.c - matrices written as JSON, and the byte buffer answers are built in. */
#include "json_codec.h"
#include "gemm_half.h"
#include "json_number.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- gemm_buf ----------------------------------------------------------- */

void gemm_buf_init(gemm_buf *b) { *b = (gemm_buf){0}; }

void gemm_buf_free(gemm_buf *b)
{
    free(b->data);
    gemm_buf_init(b);
}

/* Makes room for n more bytes plus a terminating NUL; 0 on success. */
static int buf_reserve(gemm_buf *b, size_t n)
{
    size_t need;
    if (b->failed) return -1;
    if (!gemm_add_size(b->len, n, &need) || !gemm_add_size(need, 1, &need)) {
        b->failed = 1;
        return -1;
    }
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *p = realloc(b->data, cap);
    if (!p) {
        b->failed = 1;
        return -1;
    }
    b->data = p;
    b->cap = cap;
    return 0;
}

void gemm_buf_append(gemm_buf *b, const void *p, size_t n)
{
    if (buf_reserve(b, n)) return;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void gemm_buf_puts(gemm_buf *b, const char *s)
{
    gemm_buf_append(b, s, strlen(s));
}

void gemm_buf_printf(gemm_buf *b, const char *fmt, ...)
{
    va_list ap;
    if (buf_reserve(b, 64)) return;
    va_start(ap, fmt);
    int n = vsnprintf(b->data + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = 1;
        return;
    }
    if ((size_t)n >= b->cap - b->len) {
        if (buf_reserve(b, (size_t)n)) return;
        va_start(ap, fmt);
        vsnprintf(b->data + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
}

void gemm_buf_json_string(gemm_buf *b, const char *s)
{
    static const char from[] = "\"\\\n\r\t\b\f", to[] = "\"\\nrtbf", hex[] = "0123456789abcdef";
    gemm_buf_append(b, "\"", 1);
    const char *run = s;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        const char *k = strchr(from, *p);
        if (!k && *p >= 0x20 && *p != 0x7f) continue;
        char esc[7] = {'\\', k ? to[k - from] : 'u', '0', '0', hex[*p >> 4], hex[*p & 15], '\0'};
        gemm_buf_append(b, run, (size_t)((const char *)p - run));
        gemm_buf_append(b, esc, k ? 2 : 6);
        run = (const char *)p + 1;
    }
    gemm_buf_append(b, run, strlen(run));
    gemm_buf_append(b, "\"", 1);
}

/* ---- writing matrices ---------------------------------------------------- */

/* "00" .. "99": two digits at a time. */
static const char digit_pairs[201] = "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
                                     "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
                                     "8081828384858687888990919293949596979899";

/* Writes the 8 digits of u (< 10^8, leading zeros kept) at p. */
static void put_8digits(char *p, uint32_t u)
{
    uint32_t hi = u / 10000, lo = u % 10000;
    memcpy(p, digit_pairs + 2 * (hi / 100), 2);
    memcpy(p + 2, digit_pairs + 2 * (hi % 100), 2);
    memcpy(p + 4, digit_pairs + 2 * (lo / 100), 2);
    memcpy(p + 6, digit_pairs + 2 * (lo % 100), 2);
}

/* Writes v in decimal at p; returns the length. */
static size_t put_i64(char *p, int64_t v)
{
    char tmp[24];
    size_t n = sizeof tmp, len = 0;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    while (u >= 100) {
        n -= 2;
        memcpy(tmp + n, digit_pairs + 2 * (u % 100), 2);
        u /= 100;
    }
    if (u >= 10) {
        n -= 2;
        memcpy(tmp + n, digit_pairs + 2 * u, 2);
    } else {
        tmp[--n] = (char)('0' + u);
    }
    if (v < 0) p[len++] = '-';
    memcpy(p + len, tmp + n, sizeof tmp - n);
    return len + sizeof tmp - n;
}

/* Lays out P significant digits dig[0..P) (exponent e: the value is d.ddd x 10^e) the
 * way printf's %.<P>g does: trailing zeros dropped, scientific notation when e < -4 or
 * e >= P. Returns the end of what was written at s. */
static char *put_g_layout(char *s, const char *dig, int P, int e)
{
    int nd = P;
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    if (e < -4 || e >= P) {
        *s++ = dig[0];
        if (nd > 1) {
            *s++ = '.';
            memcpy(s, dig + 1, (size_t)nd - 1);
            s += nd - 1;
        }
        *s++ = 'e';
        *s++ = e < 0 ? '-' : '+';
        int ae = e < 0 ? -e : e;
        if (ae >= 100) *s++ = (char)('0' + ae / 100);
        *s++ = (char)('0' + ae / 10 % 10);
        *s++ = (char)('0' + ae % 10);
    } else if (e >= 0) {
        memcpy(s, dig, (size_t)e + 1);
        s += e + 1;
        if (nd > e + 1) {
            *s++ = '.';
            memcpy(s, dig + e + 1, (size_t)(nd - e - 1));
            s += nd - e - 1;
        }
    } else {
        *s++ = '0';
        *s++ = '.';
        for (int i = 0; i < -e - 1; i++) *s++ = '0';
        memcpy(s, dig, (size_t)nd);
        s += nd;
    }
    return s;
}

#if defined(__SIZEOF_INT128__)
/* printf("%.<P>g") of v (finite, nonzero; P = 9 or 17) with exact integer arithmetic:
 * v = m * 2^e2, and for a decimal exponent e with k = P - 1 - e in 0..27, v * 10^k =
 * m * 5^k * 2^(e2 + k) exactly, m * 5^k < 2^117 in 128 bits. Its integer part is the P
 * digits, its fraction rounds them (exact halves to even, as printf does). e starts from
 * the binary exponent (floor(E * log10 2), or one less than the true e) and moves until
 * the integer part has P digits. Returns 0 when k leaves 0..27 (|v| below about 10^(P-28)
 * or at least 10^(P-1); integers below 2^53 are put_i64's): the caller uses snprintf. That
 * range holds every value the codec benchmark writes; outside it snprintf is the one path. */
static size_t put_g_exact(char *p, double v, int P)
{
    const uint64_t lo_lim = P == 9 ? 100000000ull : 10000000000000000ull, hi_lim = lo_lim * 10;
    uint64_t bits;
    memcpy(&bits, &v, 8);
    char *s = p;
    if (bits >> 63) *s++ = '-';
    int bexp = (int)((bits >> 52) & 0x7ff);
    uint64_t m = (bits & ((1ull << 52) - 1)) | (bexp ? 1ull << 52 : 0);
    int e2 = bexp ? bexp - 1075 : -1074;
    int E = e2 + 63 - __builtin_clzll(m); /* v in [2^E, 2^(E+1)) */
    int e = E >= 0 ? (E * 78913) >> 18 : -((-E * 78913 + (1 << 18) - 1) >> 18); /* floor(E log10 2) */
    uint64_t ip;
    unsigned __int128 rem, half;
    for (int tries = 0;; tries++) {
        int k = P - 1 - e;
        if (k < 0 || k > 27 || tries > 2) return 0;
        unsigned __int128 n = (unsigned __int128)m * gemm_num_p5[k];
        int sh = -(e2 + k);
        if (sh <= 0) { /* an integer: v * 10^k < 10^18 here, so the shift cannot overflow */
            if (-sh > 63 || (n >> (64 + sh)) != 0) return 0;
            ip = (uint64_t)(n << -sh);
            rem = half = 0;
        } else if (sh >= 128) {
            return 0;
        } else {
            unsigned __int128 q = n >> sh;
            if (q >> 64) {
                e++;
                continue;
            }
            ip = (uint64_t)q;
            rem = n & (((unsigned __int128)1 << sh) - 1);
            half = (unsigned __int128)1 << (sh - 1);
        }
        if (ip >= hi_lim) {
            e++;
            continue;
        }
        if (ip < lo_lim) {
            e--;
            continue;
        }
        break;
    }
    uint64_t d = ip + (rem > half || (half && rem == half && (ip & 1)));
    if (d == hi_lim) {
        d = lo_lim;
        e++;
    }
    char dig[17]; /* P digits: the first, (P = 17) the next eight, the last eight */
    uint64_t first = P == 17 ? d / 10000000000000000ull : d / 100000000;
    dig[0] = (char)('0' + first);
    if (P == 17) put_8digits(dig + 1, (uint32_t)(d / 100000000 % 100000000));
    put_8digits(dig + P - 8, (uint32_t)(d % 100000000));
    return (size_t)(put_g_layout(s, dig, P, e) - p);
}
#endif

/* Writes one element (at most 32 bytes) at p; returns the length. */
static size_t put_double(char *p, double v, int digits)
{
    if (!isfinite(v)) {
        memcpy(p, "null", 4);
        return 4;
    }
    /* Integer-valued and exactly representable: print directly (fast and exact). */
    if (v == v && fabs(v) < 9007199254740992.0 && v == (double)(int64_t)v) {
        if (v == 0 && signbit(v)) {
            memcpy(p, "-0", 2);
            return 2;
        }
        return put_i64(p, (int64_t)v);
    }
#if defined(__SIZEOF_INT128__)
    size_t fast = put_g_exact(p, v, digits);
    if (fast) return fast;
#endif
    int n = snprintf(p, 32, "%.*g", digits, v);
    return n > 0 && n < 32 ? (size_t)n : 0;
}

void gemm_json_write_matrix(gemm_buf *out, const gemm_matrix *m)
{
    size_t es = gemm_dtype_size(m->dtype);
    if (es == 0 || (m->rows && m->cols && !m->data)) {
        out->failed = 1;
        return;
    }
    /* Reserve a good guess once; each element makes room for its worst case (40 bytes with
     * its comma) only when the room left is short. */
    size_t guess;
    if (gemm_mul_size((size_t)m->rows, (size_t)m->cols, &guess) && gemm_mul_size(guess, 12, &guess))
        buf_reserve(out, guess);
    gemm_buf_append(out, "[", 1);
    for (uint64_t i = 0; i < m->rows && !out->failed; i++) {
        gemm_buf_append(out, i ? ",[" : "[", i ? 2 : 1);
        const void *row = (const char *)m->data + (size_t)(i * m->cols) * es;
        for (uint64_t j = 0; j < m->cols; j++) {
            if (out->cap - out->len < 41 && buf_reserve(out, 40)) return;
            char *p = out->data + out->len;
            size_t n = 0;
            if (j) p[n++] = ',';
            switch (m->dtype) {
            case GEMM_DTYPE_F32:
                n += put_double(p + n, ((const float *)row)[j], 9);
                break;
            case GEMM_DTYPE_F64:
                n += put_double(p + n, ((const double *)row)[j], 17);
                break;
            case GEMM_DTYPE_F16:
            case GEMM_DTYPE_BF16: /* the exact float32 value, 9 digits: it reads back to the same element */
                n += put_double(p + n, gemm_half_to_f32(m->dtype, ((const uint16_t *)row)[j]), 9);
                break;
            default:
                n += put_i64(p + n, ((const int32_t *)row)[j]);
                break;
            }
            out->len += n;
        }
        gemm_buf_append(out, "]", 1);
    }
    gemm_buf_append(out, "]", 1);
}
