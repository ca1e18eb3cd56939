/*
 * json_number.h - JSON numbers read into float64, float32 and int32 exactly as strtod and
 * strtof would round them, without calling them in the common cases.
 *
 * A number is first scanned (RFC 8259 grammar, strict: no leading zeros, no "1.", no ".5",
 * no "+1") into a gemm_decimal: up to 19 significant digits as an integer w and a power of
 * ten q, value = w * 10^q. Conversion then takes the first of these paths that applies:
 *
 *   exact double arithmetic  w <= 2^53 and |q| <= 22: w and 10^|q| are exact doubles, so one
 *                            multiplication or division rounds once, correctly (float64).
 *                            For float32 the double is rounded again, which is only wrong
 *                            when the double lies exactly halfway between two floats; that
 *                            case is detected and settled with the exact residual (fma).
 *   128-bit integers         w < 2^64 and |q| <= 27 (5^27 < 2^63): w * 5^q is an exact
 *                            128-bit product, or (w << 64) / 5^|q| an exact quotient with a
 *                            remainder; the top 64 bits and a sticky bit round correctly to
 *                            any precision, subnormals and overflow included.
 *   strtod / strtof          everything else (more than 19 significant digits, exponents
 *                            beyond those ranges): the C library, which rounds correctly.
 *
 * Every path gives the bits strtod (float64) or strtof (float32) give for the same text.
 */
#ifndef GEMM_JSON_NUMBER_H
#define GEMM_JSON_NUMBER_H

#include <stddef.h>
#include <stdint.h>

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

/* Scans one JSON number starting at p (p < end). Returns its length in bytes (> 0); or 0
 * when the text reaches end while the number could still go on (more input needed; with
 * at_eof the end closes it instead); or -(1 + i) when byte i (i may equal end - p at EOF)
 * cannot continue a valid number. */
ptrdiff_t gemm_json_scan_number(const char *p, const char *end, int at_eof, gemm_decimal *out);

/* The value rounded to nearest-even, as strtod / strtof give it (+-inf beyond range). */
double gemm_decimal_to_f64(const gemm_decimal *d);
float gemm_decimal_to_f32(const gemm_decimal *d);

/* True when rounding the double v to float32 could differ from rounding the decimal it came
 * from (v lies exactly halfway between two float32 values). */
int gemm_f64_is_f32_midpoint(double v);

#ifdef __cplusplus
}
#endif
#endif
