/* json_number.c - JSON number text to float64 / float32, correctly rounded (see json_number.h). */
#include "json_number.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- scanning ----------------------------------------------------------------- */

static inline int is_digit(char c) { return (unsigned char)(c - '0') < 10; }

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define GEMM_SWAR 1
/* Eight ASCII digits at p (p[0] the most significant) as their value, or -1 when one of
 * them is not a digit. Little-endian: p[0] is the lowest byte of the word. */
static inline int64_t eight_digits(const char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    /* every byte 0x30..0x3f, and still below 0x40 after adding 6: every byte '0'..'9' */
    if ((v & 0xf0f0f0f0f0f0f0f0ull) != 0x3030303030303030ull ||
        ((v + 0x0606060606060606ull) & 0xf0f0f0f0f0f0f0f0ull) != 0x3030303030303030ull)
        return -1;
    v -= 0x3030303030303030ull;
    /* pairs, then quads, then all eight: each step scales the more significant half */
    v = (v * 10 + (v >> 8)) & 0x00ff00ff00ff00ffull;
    v = (v * 100 + (v >> 16)) & 0x0000ffff0000ffffull;
    v = (v * 10000 + (v >> 32)) & 0xffffffffull;
    return (int64_t)v;
}
#else
#define GEMM_SWAR 0
#endif

/* The careful scan, for numbers with more than 19 digits: leading zeros do not count as
 * significant, digits past the 19th only set trunc (and move the exponent). The grammar
 * was already checked by the fast scan; this only computes w, q and trunc. */
static void scan_long(const char *p, const char *end, gemm_decimal *d)
{
    uint64_t w = 0;
    int64_t q = 0;
    int nd = 0, frac = 0, trunc = 0;
    if (*p == '-') p++;
    for (; p < end; p++) {
        char c = *p;
        if (c == '.') {
            frac = 1;
            continue;
        }
        if (!is_digit(c)) break;
        unsigned v = (unsigned)(c - '0');
        if (nd == 0 && v == 0) {
            if (frac) q--;
        } else if (nd < 19) {
            w = w * 10 + v;
            nd++;
            if (frac) q--;
        } else {
            trunc |= v != 0;
            if (!frac) q++;
        }
    }
    int64_t e = 0;
    if (p < end && (*p == 'e' || *p == 'E')) {
        int eneg = 0;
        p++;
        if (*p == '-' || *p == '+') eneg = *p++ == '-';
        for (; p < end && is_digit(*p); p++)
            if (e < 100000000) e = e * 10 + (*p - '0');
        if (eneg) e = -e;
    }
    q += e;
    if (q > 100000000) q = 100000000;
    if (q < -100000000) q = -100000000;
    d->w = w;
    d->q = (int32_t)q;
    d->trunc = (uint8_t)trunc;
}

ptrdiff_t gemm_json_scan_number(const char *s, const char *end, int at_eof, gemm_decimal *d)
{
    const char *p = s;
    uint64_t w = 0;
    int nd = 0;        /* digits taken into w (leading zeros included) */
    int32_t q = 0;
    int integer = 1;

#define NEED_MORE() return at_eof ? -(ptrdiff_t)(1 + (p - s)) : 0
    d->neg = 0;
    if (*p == '-') {
        d->neg = 1;
        if (++p == end) NEED_MORE();
    }
    if (*p == '0') {
        p++;
        nd = 1;
    } else if (is_digit(*p)) {
#if GEMM_SWAR
        while (end - p >= 8 && nd <= 11) {
            int64_t v = eight_digits(p);
            if (v < 0) break;
            w = w * 100000000u + (uint64_t)v;
            nd += 8;
            p += 8;
        }
#endif
        while (p < end && is_digit(*p)) {
            w = w * 10 + (unsigned)(*p - '0');
            nd++;
            p++;
            if (nd > 19) goto long_number;
        }
    } else {
        return -(ptrdiff_t)(1 + (p - s));
    }
    if (p == end) goto at_end;
    if (*p == '.') {
        integer = 0;
        if (++p == end) NEED_MORE();
        if (!is_digit(*p)) return -(ptrdiff_t)(1 + (p - s));
        const char *f0 = p;
#if GEMM_SWAR
        while (end - p >= 8 && nd <= 11) {
            int64_t v = eight_digits(p);
            if (v < 0) break;
            w = w * 100000000u + (uint64_t)v;
            nd += 8;
            p += 8;
        }
#endif
        while (p < end && is_digit(*p)) {
            w = w * 10 + (unsigned)(*p - '0');
            nd++;
            p++;
            if (nd > 19) goto long_number;
        }
        q = -(int32_t)(p - f0);
        if (p == end) goto at_end;
    }
    if (*p == 'e' || *p == 'E') {
        integer = 0;
        int eneg = 0;
        int32_t e = 0;
        if (++p == end) NEED_MORE();
        if (*p == '-' || *p == '+') {
            eneg = *p == '-';
            if (++p == end) NEED_MORE();
        }
        if (!is_digit(*p)) return -(ptrdiff_t)(1 + (p - s));
        for (; p < end && is_digit(*p); p++)
            if (e < 100000000) e = e * 10 + (*p - '0');
        q += eneg ? -e : e;
        if (p == end) goto at_end;
    }
    goto done;

long_number:
    /* More than 19 digits: finish the grammar check, then the careful scan. */
    while (p < end && is_digit(*p)) p++;
    if (p < end && *p == '.') {
        if (!integer) goto done_long; /* second '.': the number ends before it */
        integer = 0;
        if (++p == end) NEED_MORE();
        if (!is_digit(*p)) return -(ptrdiff_t)(1 + (p - s));
        while (p < end && is_digit(*p)) p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        integer = 0;
        if (++p == end) NEED_MORE();
        if (*p == '-' || *p == '+')
            if (++p == end) NEED_MORE();
        if (!is_digit(*p)) return -(ptrdiff_t)(1 + (p - s));
        while (p < end && is_digit(*p)) p++;
    }
done_long:
    if (p == end && !at_eof) return 0;
    d->integer = (uint8_t)integer;
    d->text = s;
    d->len = (size_t)(p - s);
    scan_long(s, p, d);
    return p - s;

at_end:
    if (!at_eof) return 0;
done:
    d->w = w;
    d->q = q;
    d->trunc = 0;
    d->integer = (uint8_t)integer;
    d->text = s;
    d->len = (size_t)(p - s);
    return p - s;
#undef NEED_MORE
}

/* ---- conversion ------------------------------------------------------------------ */

static const double p10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static const uint64_t p5[28] = {1ull,
                                5ull,
                                25ull,
                                125ull,
                                625ull,
                                3125ull,
                                15625ull,
                                78125ull,
                                390625ull,
                                1953125ull,
                                9765625ull,
                                48828125ull,
                                244140625ull,
                                1220703125ull,
                                6103515625ull,
                                30517578125ull,
                                152587890625ull,
                                762939453125ull,
                                3814697265625ull,
                                19073486328125ull,
                                95367431640625ull,
                                476837158203125ull,
                                2384185791015625ull,
                                11920928955078125ull,
                                59604644775390625ull,
                                298023223876953125ull,
                                1490116119384765625ull,
                                7450580596923828125ull};

/* The text of d, NUL-terminated, for strtod/strtof (d->len <= GEMM_JSON_NUMBER_MAX). */
static const char *c_text(const gemm_decimal *d, char *buf)
{
    size_t n = d->len < GEMM_JSON_NUMBER_MAX ? d->len : GEMM_JSON_NUMBER_MAX;
    memcpy(buf, d->text, n);
    buf[n] = '\0';
    return buf;
}

/* Rounds m * 2^e (m != 0; sticky: nonzero bits below m) to nearest-even with a p-bit
 * significand and normal exponents emin..emax; returns the IEEE bits without the sign. */
static uint64_t round_binary(uint64_t m, int e, int sticky, int p, int emin, int emax)
{
    int lz = __builtin_clzll(m);
    m <<= lz;
    e -= lz;
    int E = e + 63; /* m * 2^e is in [2^E, 2^(E+1)) */
    uint64_t inf = (uint64_t)(emax - emin + 2) << (p - 1);
    if (E > emax) return inf;
    int shift = 64 - p, biased = E - emin + 1;
    if (E < emin) {
        shift += emin - E;
        biased = 0;
        if (shift > 64) return 0; /* below half the smallest subnormal */
    }
    uint64_t mant, rem, half;
    if (shift == 64) {
        mant = 0;
        rem = m;
        half = 1ull << 63;
    } else {
        mant = m >> shift;
        rem = m & ((1ull << shift) - 1);
        half = 1ull << (shift - 1);
    }
    if (rem > half || (rem == half && (sticky || (mant & 1)))) mant++;
    if (biased == 0) return mant; /* subnormal; 2^(p-1) after rounding is the smallest normal */
    if (mant == 1ull << p) {
        mant >>= 1;
        if (++biased >= emax - emin + 2) return inf;
    }
    return ((uint64_t)biased << (p - 1)) | (mant & ((1ull << (p - 1)) - 1));
}

#if defined(__SIZEOF_INT128__)
typedef unsigned __int128 u128;

/* w * 10^q for w != 0, |q| <= 27, rounded to p bits exactly (see json_number.h). */
static uint64_t exact_bits(uint64_t w, int q, int p, int emin, int emax)
{
    if (q >= 0) {
        u128 n = (u128)w * p5[q];
        uint64_t hi = (uint64_t)(n >> 64), lo = (uint64_t)n;
        if (hi == 0) return round_binary(lo, q, 0, p, emin, emax);
        int lz = __builtin_clzll(hi);
        uint64_t m = lz ? (hi << lz) | (lo >> (64 - lz)) : hi;
        return round_binary(m, q + 64 - lz, (lo << lz) != 0, p, emin, emax);
    }
    int k = -q, lz = __builtin_clzll(w);
    u128 num = (u128)(w << lz) << 64;
    u128 quo = num / p5[k];
    uint64_t rem = (uint64_t)num - (uint64_t)quo * p5[k];
    uint64_t hi = (uint64_t)(quo >> 64), lo = (uint64_t)quo; /* hi >= 1: num >= 2^127 > 2^64 * 5^k */
    int l2 = __builtin_clzll(hi);
    uint64_t m = l2 ? (hi << l2) | (lo >> (64 - l2)) : hi;
    return round_binary(m, -lz - k - l2, (lo << l2) != 0 || rem != 0, p, emin, emax);
}
#define HAVE_EXACT 1
#else
#define HAVE_EXACT 0
#endif

/* One rounding of w * 10^q in double arithmetic is correct only with plain binary64
 * evaluation (not x87 extended precision). */
#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD == 0
#define HAVE_CLINGER 1
#else
#define HAVE_CLINGER 0
#endif

double gemm_decimal_to_f64(const gemm_decimal *d)
{
    double v;
    if (d->w == 0) return d->neg ? -0.0 : 0.0;
    if (!d->trunc) {
#if HAVE_CLINGER
        if (d->w <= (1ull << 53) && d->q >= -22 && d->q <= 22) {
            v = (double)d->w;
            v = d->q >= 0 ? v * p10[d->q] : v / p10[-d->q];
            return d->neg ? -v : v;
        }
#endif
#if HAVE_EXACT
        if (d->q >= -27 && d->q <= 27) {
            uint64_t bits = exact_bits(d->w, d->q, 53, -1022, 1023);
            memcpy(&v, &bits, 8);
            return d->neg ? -v : v;
        }
#endif
    }
    char buf[GEMM_JSON_NUMBER_MAX + 1];
    return strtod(c_text(d, buf), NULL);
}

int gemm_f64_is_f32_midpoint(double v)
{
    uint64_t b;
    v = fabs(v);
    memcpy(&b, &v, 8);
    int ex = (int)(b >> 52);
    if (ex >= 1023 + 128) return 0; /* float32 overflow: +-inf whichever side */
    if (ex >= 1023 - 126) /* float32 normal range (and above): 29 bits below float's 24 */
        return (b & ((1ull << 29) - 1)) == (1ull << 28);
    /* below float32's normal range: midpoints are odd multiples of 2^-150 */
    double t = v * 0x1p150;
    return t >= 1 && t == floor(t) && fmod(t, 2.0) == 1.0;
}

float gemm_decimal_to_f32(const gemm_decimal *d)
{
    if (d->w == 0) return d->neg ? -0.0f : 0.0f;
    if (!d->trunc) {
#if HAVE_CLINGER
        if (d->w <= (1ull << 53) && d->q >= -22 && d->q <= 22) {
            double x = (double)d->w, p = p10[d->q >= 0 ? d->q : -d->q];
            double v = d->q >= 0 ? x * p : x / p;
            float f = (float)v;
            if (gemm_f64_is_f32_midpoint(v)) {
                /* v is halfway between two floats: the exact residual says which side of
                 * v the decimal lies (0: exactly v, and the tie goes to even as (float) did) */
                double r = d->q >= 0 ? fma(x, p, -v) : fma(-v, p, x);
                if (r > 0 && (double)f < v) f = nextafterf(f, INFINITY);
                else if (r < 0 && (double)f > v) f = nextafterf(f, 0.0f);
            }
            return d->neg ? -f : f;
        }
#endif
#if HAVE_EXACT
        if (d->q >= -27 && d->q <= 27) {
            uint32_t bits = (uint32_t)exact_bits(d->w, d->q, 24, -126, 127);
            float f;
            memcpy(&f, &bits, 4);
            return d->neg ? -f : f;
        }
#endif
    }
    char buf[GEMM_JSON_NUMBER_MAX + 1];
    return strtof(c_text(d, buf), NULL);
}
