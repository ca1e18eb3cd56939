/* json_number.c - JSON number text to float64 / float32, correctly rounded (see json_number.h). */
#include "json_number.h"
#include "gemm_half.h"

#include <fenv.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- scanning ----------------------------------------------------------------- */

void gemm_decimal_scan_long(const char *p, const char *end, int32_t exp10, gemm_decimal *d)
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
        if (!gemm_num_is_digit(c)) break;
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
    q += exp10;
    if (q > 100000000) q = 100000000;
    if (q < -100000000) q = -100000000;
    d->w = w;
    d->q = (int32_t)q;
    d->trunc = (uint8_t)trunc;
}

const char *gemm_json_type_name(char c)
{
    static const char first[] = "\"[{tfn";
    static const char *const names[] = {"a string", "an array", "an object", "a boolean", "a boolean", "null"};
    const char *k = c ? strchr(first, c) : NULL;
    return k ? names[k - first] : "a number";
}

/* ---- conversion ------------------------------------------------------------------ */

const double gemm_num_p10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
const double gemm_num_ip10[23] = {1e-0,  1e-1,  1e-2,  1e-3,  1e-4,  1e-5,  1e-6,  1e-7,
                                  1e-8,  1e-9,  1e-10, 1e-11, 1e-12, 1e-13, 1e-14, 1e-15,
                                  1e-16, 1e-17, 1e-18, 1e-19, 1e-20, 1e-21, 1e-22};

const uint64_t gemm_num_p5[28] = {1ull, 5ull, 25ull, 125ull, 625ull, 3125ull, 15625ull, 78125ull, 390625ull,
                                  1953125ull, 9765625ull, 48828125ull, 244140625ull, 1220703125ull, 6103515625ull,
                                  30517578125ull, 152587890625ull, 762939453125ull, 3814697265625ull,
                                  19073486328125ull, 95367431640625ull, 476837158203125ull, 2384185791015625ull,
                                  11920928955078125ull, 59604644775390625ull, 298023223876953125ull,
                                  1490116119384765625ull, 7450580596923828125ull};

/* The text of d, NUL-terminated, for strtod/strtof (d->len <= GEMM_JSON_NUMBER_MAX). */
static const char *c_text(const gemm_decimal *d, char *buf)
{
    size_t n = d->len < GEMM_JSON_NUMBER_MAX ? d->len : GEMM_JSON_NUMBER_MAX;
    memcpy(buf, d->text, n);
    buf[n] = '\0';
    return buf;
}

#if defined(__SIZEOF_INT128__)
typedef unsigned __int128 u128;

/* w * 10^q for w != 0, |q| <= 27, rounded to p bits: w * 5^q is an exact product, or
 * (w << 64) / 5^|q| a quotient with a remainder; the top 64 bits and a sticky bit round
 * correctly to either precision, subnormals and overflow included. */
static uint64_t exact_bits(uint64_t w, int q, int p, int emin, int emax)
{
    if (q >= 0) {
        u128 n = (u128)w * gemm_num_p5[q];
        uint64_t hi = (uint64_t)(n >> 64), lo = (uint64_t)n;
        if (hi == 0) return gemm_round_binary(lo, q, 0, p, emin, emax);
        int lz = __builtin_clzll(hi);
        uint64_t m = lz ? (hi << lz) | (lo >> (64 - lz)) : hi;
        return gemm_round_binary(m, q + 64 - lz, (lo << lz) != 0, p, emin, emax);
    }
    int k = -q, lz = __builtin_clzll(w);
    u128 num = (u128)(w << lz) << 64;
    u128 quo = num / gemm_num_p5[k];
    uint64_t rem = (uint64_t)num - (uint64_t)quo * gemm_num_p5[k];
    uint64_t hi = (uint64_t)(quo >> 64), lo = (uint64_t)quo; /* hi >= 1: num >= 2^127 > 2^64 * 5^k */
    int l2 = __builtin_clzll(hi);
    uint64_t m = l2 ? (hi << l2) | (lo >> (64 - l2)) : hi;
    return gemm_round_binary(m, -lz - k - l2, (lo << l2) != 0 || rem != 0, p, emin, emax);
}
#define HAVE_EXACT 1
#else
#define HAVE_EXACT 0
#endif

#if defined(LDBL_MANT_DIG) && LDBL_MANT_DIG == 64 && (defined(__x86_64__) || defined(__i386__))
/* x87 extended precision: w < 2^64 is exact in a long double and so is 10^k for k <= 27
 * (5^27 < 2^64), so one multiplication or division rounds once, to 64 bits. Rounding that
 * again to 53 bits gives the correctly rounded double unless the 64-bit result lies
 * exactly halfway between two doubles (its 11 low bits 100 0000 0000): then 0 is returned
 * and the caller takes the exact path. */
static const long double p10l[28] = {1e0L,  1e1L,  1e2L,  1e3L,  1e4L,  1e5L,  1e6L,  1e7L,  1e8L,  1e9L,
                                     1e10L, 1e11L, 1e12L, 1e13L, 1e14L, 1e15L, 1e16L, 1e17L, 1e18L, 1e19L,
                                     1e20L, 1e21L, 1e22L, 1e23L, 1e24L, 1e25L, 1e26L, 1e27L};

static int extended_f64(uint64_t w, int q, double *out)
{
    long double x = (long double)w;
    long double y = q >= 0 ? x * p10l[q] : x / p10l[-q];
    uint64_t mant;
    memcpy(&mant, &y, 8); /* the 64-bit significand, explicit leading bit */
    if ((mant & 0x7ff) == 0x400) return 0;
    *out = (double)y;
    return 1;
}
#define HAVE_EXTENDED 1
#else
#define HAVE_EXTENDED 0
#endif

double gemm_decimal_to_f64_hard(const gemm_decimal *d)
{
    if (!d->trunc && d->q >= -27 && d->q <= 27) { /* (what one double operation rounds right is inline) */
#if HAVE_EXTENDED
        double x;
        if (extended_f64(d->w, d->q, &x)) return d->neg ? -x : x;
#endif
#if HAVE_EXACT
        double e;
        uint64_t bits = exact_bits(d->w, d->q, 53, -1022, 1023);
        memcpy(&e, &bits, 8);
        return d->neg ? -e : e;
#endif
    }
    char buf[GEMM_JSON_NUMBER_MAX + 1];
    return strtod(c_text(d, buf), NULL);
}

float gemm_decimal_to_f32_hard(const gemm_decimal *d)
{
    if (!d->trunc && d->q >= -27 && d->q <= 27) {
#if HAVE_EXACT
        uint32_t bits = (uint32_t)exact_bits(d->w, d->q, 24, -126, 127);
        float f;
        memcpy(&f, &bits, 4);
        return d->neg ? -f : f;
#endif
    }
    char buf[GEMM_JSON_NUMBER_MAX + 1];
    return strtof(c_text(d, buf), NULL);
}

int gemm_decimal_side(const gemm_decimal *d, double v)
{
    /* an integer of at most 53 bits is its float64 exactly (the common case: integers above
     * 2048 are often float16 midpoints) */
    if (!d->trunc && d->w <= (1ull << 53) && d->q >= 0 && d->q <= 22 &&
        (double)d->w * gemm_num_p10[d->q] < 0x1p53)
        return 0;
    char buf[GEMM_JSON_NUMBER_MAX + 1];
    const char *t = c_text(d, buf);
    int mode = fegetround();
    fesetround(FE_DOWNWARD); /* the thread's own mode (fenv is per thread), put back below */
    double lo = strtod(t, NULL);
    fesetround(FE_UPWARD);
    double hi = strtod(t, NULL);
    fesetround(mode);
    if (lo == hi) return 0; /* the decimal is exactly a float64 */
    return lo == v ? 1 : -1;
}

uint16_t gemm_decimal_to_half(const gemm_decimal *dec, gemm_dtype d)
{
    double v = gemm_decimal_to_f64(dec);
    if (gemm_f64_is_midpoint(d, v)) {
        int side = gemm_decimal_side(dec, v);
        if (side) v = nextafter(v, side > 0 ? INFINITY : -INFINITY);
    }
    return gemm_f64_to_half(d, v);
}
