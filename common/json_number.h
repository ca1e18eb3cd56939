/*
 * json_number.h - JSON numbers (RFC 8259, strict) read into float64, float32, the half types
 * and int32 with exactly the bits strtod / strtof give, without calling them in the common
 * cases: a scan into w * 10^q (at most 19 digits), then the first exact path that applies -
 * one double operation (Clinger), x87 extended precision, 128-bit integers - else strtod.
 * json_number.c says why each path rounds correctly.
 */
#ifndef GEMM_JSON_NUMBER_H
#define GEMM_JSON_NUMBER_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "gemm_half.h"
#include "gemm_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Longest number text accepted (characters); longer ones are refused as bad JSON. */
#define GEMM_JSON_NUMBER_MAX 1024

typedef struct {
    uint64_t w;       /* the first (at most 19) significant digits */
    int32_t q;        /* value = w * 10^q, when !trunc */
    uint8_t neg;      /* a leading '-' */
    uint8_t trunc;    /* nonzero digits after the 19th were dropped: w * 10^q is short of it */
    uint8_t integer;  /* no fraction and no exponent in the text */
    const char *text; /* the number's text (len bytes), for the strtod/strtof path */
    size_t len;
} gemm_decimal;

/* The paths of the conversions below that are not inline (d->w != 0). */
double gemm_decimal_to_f64_hard(const gemm_decimal *d);
float gemm_decimal_to_f32_hard(const gemm_decimal *d);

/* Which side of v (the float64 the decimal rounds to) the decimal lies on: -1 below, 0 exactly
 * on it, +1 above. Slow (two directed-rounding strtod calls): for the rare element whose
 * float64 is halfway between two float16 or bfloat16 values (gemm_f64_is_midpoint). */
int gemm_decimal_side(const gemm_decimal *d, double v);
/* The decimal rounded to nearest-even float16 / bfloat16 (dtype d), with one rounding: its
 * float64 rounded, unless that lies exactly halfway between two neighbours; then the side of
 * it the decimal lies on decides. Returns the element's bits. */
uint16_t gemm_decimal_to_half(const gemm_decimal *dec, gemm_dtype d);

/* "a string", "an array", "an object", "a boolean", "null" or "a number": the JSON value
 * that begins with c. */
const char *gemm_json_type_name(char c);

extern const double gemm_num_p10[23];  /* 1e0 .. 1e22, all exact */
extern const double gemm_num_ip10[23]; /* 1e-0 .. 1e-22, each rounded to nearest */
extern const uint64_t gemm_num_p5[28]; /* 5^0 .. 5^27, all below 2^64 */

/* ---- inline: the scanner and the common conversions (called once per element) ---- */

static inline int gemm_num_is_digit(char c) { return (unsigned char)(c - '0') < 10; }
/* The value of hex digit c, or -1. */
static inline int gemm_hex_digit(char c)
{
    if (gemm_num_is_digit(c)) return c - '0';
    c = (char)(c | 0x20);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* The digits at *p taken into *w (*nd: digits met so far), eight at a time where they can
 * be; past the 19th they are only counted (the careful scan then reads the number again).
 * *p ends at the first non-digit. */
static inline void gemm_num_digits(const char **pp, const char *end, uint64_t *w, int *nd)
{
    const char *p = *pp;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ /* p[0]: a word's lowest byte */
    for (uint64_t v; end - p >= 8 && *nd <= 11; p += 8, *nd += 8) {
        memcpy(&v, p, 8);
        /* every byte 0x30..0x3f, and still below 0x40 after adding 6: every byte '0'..'9' */
        if ((v & 0xf0f0f0f0f0f0f0f0ull) != 0x3030303030303030ull ||
            ((v + 0x0606060606060606ull) & 0xf0f0f0f0f0f0f0f0ull) != 0x3030303030303030ull)
            break;
        v -= 0x3030303030303030ull;
        /* pairs, then quads, then all eight: each step scales the more significant half */
        v = (v * 10 + (v >> 8)) & 0x00ff00ff00ff00ffull;
        v = (v * 100 + (v >> 16)) & 0x0000ffff0000ffffull;
        v = (v * 10000 + (v >> 32)) & 0xffffffffull;
        *w = *w * 100000000u + v;
    }
#endif
    for (; p < end && gemm_num_is_digit(*p); p++)
        if (++*nd <= 19) *w = *w * 10 + (unsigned)(*p - '0');
    *pp = p;
}

/* w, q and trunc of a number of more than 19 digits (its grammar checked; its exponent
 * exp10): leading zeros are not significant, digits past the 19th only set trunc. */
void gemm_decimal_scan_long(const char *p, const char *end, int32_t exp10, gemm_decimal *d);

static inline ptrdiff_t gemm_json_scan_number(const char *s, const char *end, int at_eof, gemm_decimal *d)
{
    const char *p = s;
    uint64_t w = 0;
    int nd = 0;        /* digits met (leading zeros included); past 19: the careful scan */
    int32_t q = 0, exp10 = 0;
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
    } else if (gemm_num_is_digit(*p)) {
        gemm_num_digits(&p, end, &w, &nd);
    } else {
        return -(ptrdiff_t)(1 + (p - s));
    }
    if (p < end && *p == '.') {
        integer = 0;
        if (++p == end) NEED_MORE();
        if (!gemm_num_is_digit(*p)) return -(ptrdiff_t)(1 + (p - s));
        const char *f0 = p;
        gemm_num_digits(&p, end, &w, &nd);
        q = -(int32_t)(p - f0);
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        integer = 0;
        int eneg = 0;
        int32_t e = 0;
        if (++p == end) NEED_MORE();
        if (*p == '-' || *p == '+') {
            eneg = *p == '-';
            if (++p == end) NEED_MORE();
        }
        if (!gemm_num_is_digit(*p)) return -(ptrdiff_t)(1 + (p - s));
        for (; p < end && gemm_num_is_digit(*p); p++)
            if (e < 100000000) e = e * 10 + (*p - '0');
        exp10 = eneg ? -e : e;
        q += exp10;
    }
    if (p == end && !at_eof) return 0; /* it may go on in the next chunk */
    d->w = w;
    d->q = q;
    d->trunc = 0;
    d->integer = (uint8_t)integer;
    d->text = s;
    d->len = (size_t)(p - s);
    if (nd > 19) gemm_decimal_scan_long(s, p, exp10, d);
    return p - s;
#undef NEED_MORE
}

/* The value rounded to nearest-even, as strtod gives it (+-inf beyond range). */
static inline double gemm_decimal_to_f64(const gemm_decimal *d)
{
    if (d->w == 0) return d->neg ? -0.0 : 0.0;
#if defined(__FLT_EVAL_METHOD__) && __FLT_EVAL_METHOD__ == 0
    /* w and 10^|q| are exact doubles: one operation, one correct rounding */
    if (!d->trunc && d->w <= (1ull << 53) && d->q >= -22 && d->q <= 22) {
        double v = (double)d->w;
        v = d->q >= 0 ? v * gemm_num_p10[d->q] : v / gemm_num_p10[-d->q];
        return d->neg ? -v : v;
    }
#endif
    return gemm_decimal_to_f64_hard(d);
}

/* The value rounded to nearest-even float32, as strtof gives it (+-inf beyond range). */
static inline float gemm_decimal_to_f32(const gemm_decimal *d)
{
    if (d->w == 0) return d->neg ? -0.0f : 0.0f;
#if defined(__FLT_EVAL_METHOD__) && __FLT_EVAL_METHOD__ == 0
    /* w * 10^q to within 2 units of the double's last place (a multiplication by 10^-k
     * rounded, then rounded again); the float32 nearest to that is the float32 nearest to
     * the decimal unless a float32 midpoint lies within those 2 units: then the 29 bits
     * below float's 24 are within 3 of 1000...0 and the hard path settles it. Results here
     * are in [1e-22, 2^53 * 1e22]: normal float32 values. */
    if (!d->trunc && d->w <= (1ull << 53) && d->q >= -22 && d->q <= 22) {
        double v = (double)d->w * (d->q >= 0 ? gemm_num_p10[d->q] : gemm_num_ip10[-d->q]);
        uint64_t b;
        memcpy(&b, &v, 8);
        if ((uint32_t)((b & 0x1fffffff) - (0x10000000 - 3)) > 6) {
            float f = (float)v;
            return d->neg ? -f : f;
        }
    }
#endif
    return gemm_decimal_to_f32_hard(d);
}

/* v is an int32: an integer from -2^31 to 2^31 - 1; a count: an integer from 0 to 2^53. */
static inline int gemm_f64_is_i32(double v) { return v >= -2147483648.0 && v <= 2147483647.0 && v == floor(v); }
static inline int gemm_f64_is_count(double v) { return v >= 0 && v <= 9007199254740992.0 && v == floor(v); }

/* The decimal as one element of dtype t at dst: float64 and float32 as strtod and strtof
 * round it, float16 and bfloat16 rounded once from the text, int32 exactly. Returns 0, or -1
 * when it is none of t's values (beyond a float type's range; for int32 not an integer in
 * range, and 0 is written). */
static inline int gemm_decimal_store(const gemm_decimal *d, gemm_dtype t, void *dst)
{
    switch (t) {
    case GEMM_DTYPE_F64: {
        double v = gemm_decimal_to_f64(d);
        memcpy(dst, &v, 8);
        return isinf(v) ? -1 : 0;
    }
    case GEMM_DTYPE_F32: {
        float f = gemm_decimal_to_f32(d);
        memcpy(dst, &f, 4);
        return isinf(f) ? -1 : 0;
    }
    case GEMM_DTYPE_F16:
    case GEMM_DTYPE_BF16: {
        uint16_t h = gemm_decimal_to_half(d, t);
        memcpy(dst, &h, 2);
        return isinf(gemm_half_to_f32(t, h)) ? -1 : 0;
    }
    default: {
        int32_t v = 0;
        int ok = 1;
        if (d->integer && !d->trunc && d->w <= 2147483647ull + d->neg) {
            v = (int32_t)(d->neg ? -(int64_t)d->w : (int64_t)d->w);
        } else {
            double f = gemm_decimal_to_f64(d);
            ok = gemm_f64_is_i32(f);
            if (ok) v = (int32_t)f;
        }
        memcpy(dst, &v, 4);
        return ok ? 0 : -1;
    }
    }
}

#ifdef __cplusplus
}
#endif
#endif
