/*
 * gemm_half.h - float16 and bfloat16 <-> float32 / float64, bit by bit (uint16_t elements).
 * Widening is exact; narrowing rounds to nearest even with subnormals, overflow to +-inf,
 * NaN kept quiet with its sign and the top of its payload, signed zeros kept.
 */
#ifndef GEMM_HALF_H
#define GEMM_HALF_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "gemm_types.h"

#ifdef __cplusplus
extern "C" {
#endif

static inline uint32_t gemm_half_f32_bits(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    return x;
}

static inline float gemm_half_bits_f32(uint32_t x)
{
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* float16 -> float32, exact. */
static inline float gemm_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    if (e == 0x1f) {
        x = sign | 0x7f800000u | (m << 13); /* infinity, or NaN with its payload */
    } else if (e) {
        x = sign | ((e + 112u) << 23) | (m << 13); /* rebias 15 -> 127 */
    } else if (!m) {
        x = sign;
    } else { /* subnormal m * 2^-24: the leading bit p becomes the implicit one */
        int p = 31 - __builtin_clz(m);
        x = sign | ((uint32_t)(p + 103) << 23) | ((m << (23 - p)) & 0x7fffffu);
    }
    return gemm_half_bits_f32(x);
}

/* float32 -> float16, rounded to nearest even. */
static inline uint16_t gemm_f32_to_f16(float f)
{
    uint32_t x = gemm_half_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu)); /* quiet NaN */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 (and infinity) */
    if (ax >= 0x38800000u) { /* float16 normal range: rebias, round off 13 bits */
        uint32_t r = ax - 0x38000000u;
        r += 0xfffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    if (ax <= 0x33000000u) return sign; /* at most 2^-25, half the smallest subnormal: ties to 0 */
    /* subnormal: round(|f| * 2^24) from the float's 24-bit significand */
    uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
    unsigned shift = 126u - e; /* 14 .. 24 */
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}

/* bfloat16 -> float32, exact. */
static inline float gemm_bf16_to_f32(uint16_t b) { return gemm_half_bits_f32((uint32_t)b << 16); }

/* float32 -> bfloat16, rounded to nearest even. */
static inline uint16_t gemm_f32_to_bf16(float f)
{
    uint32_t x = gemm_half_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* m * 2^e (m != 0; sticky: nonzero bits below m) rounded to nearest-even with a p-bit
 * significand and normal exponents emin..emax (subnormals and overflow to infinity
 * included): the IEEE bits without the sign. */
uint64_t gemm_round_binary(uint64_t m, int e, int sticky, int p, int emin, int emax);
/* float64 -> float16 / bfloat16 (dtype d) with one rounding (none through float32). */
uint16_t gemm_f64_to_half(gemm_dtype d, double v);
/* True when v lies exactly halfway between two neighbours of dtype d (float32, float16 or
 * bfloat16): only then can rounding v differ from rounding the decimal it came from. */
int gemm_f64_is_midpoint(gemm_dtype d, double v);
/* The float32 value of one element of dtype d (GEMM_DTYPE_F16 or GEMM_DTYPE_BF16). */
static inline float gemm_half_to_f32(gemm_dtype d, uint16_t h)
{
    return d == GEMM_DTYPE_BF16 ? gemm_bf16_to_f32(h) : gemm_f16_to_f32(h);
}

/* Arrays: n elements of dtype d (GEMM_DTYPE_F16 or GEMM_DTYPE_BF16) to float32, and back. */
void gemm_half_to_f32_array(gemm_dtype d, const uint16_t *src, float *dst, size_t n);
void gemm_f32_to_half_array(gemm_dtype d, const float *src, uint16_t *dst, size_t n);

#ifdef __cplusplus
}
#endif
#endif
