/* gemm_half.c - float64 -> float16 / bfloat16 rounding and the array conversions (gemm_half.h). */
#include "gemm_half.h"

#include <math.h>

uint64_t gemm_round_binary(uint64_t m, int e, int sticky, int p, int emin, int emax)
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
    /* (a shift by 64, the width, is no shift in C: shift 64 keeps nothing of m) */
    uint64_t mant = shift == 64 ? 0 : m >> shift, half = 1ull << (shift - 1);
    uint64_t rem = shift == 64 ? m : m & ((1ull << shift) - 1);
    if (rem > half || (rem == half && (sticky || (mant & 1)))) mant++;
    if (biased == 0) return mant; /* subnormal; 2^(p-1) after rounding is the smallest normal */
    if (mant == 1ull << p) {
        mant >>= 1;
        if (++biased >= emax - emin + 2) return inf;
    }
    return ((uint64_t)biased << (p - 1)) | (mant & ((1ull << (p - 1)) - 1));
}

uint16_t gemm_f64_to_half(gemm_dtype d, double v)
{
    /* rounded once to p significand bits and normal exponents emin..emax */
    int p = d == GEMM_DTYPE_BF16 ? 8 : 11, emin = d == GEMM_DTYPE_BF16 ? -126 : -14, emax = 1 - emin;
    uint64_t b, m;
    memcpy(&b, &v, 8);
    uint16_t sign = (uint16_t)((b >> 48) & 0x8000u), inf = (uint16_t)((emax - emin + 2) << (p - 1));
    int e = (int)((b >> 52) & 0x7ff);
    m = b & ((1ull << 52) - 1);
    if (e == 0x7ff) return (uint16_t)(sign | inf | (m ? 1u << (p - 2) : 0)); /* NaN: a quiet one */
    if (e == 0 && m == 0) return sign;
    if (e) m |= 1ull << 52;
    return (uint16_t)(sign | gemm_round_binary(m, (e ? e : 1) - 1075, 0, p, emin, emax));
}

int gemm_f64_is_midpoint(gemm_dtype d, double v)
{
    uint64_t bits;
    memcpy(&bits, &v, 8);
    /* a midpoint has at most 25 significant bits (float32), 12 or 9: a float64 with any of its
     * 28 (float32) or 41 lowest fraction bits set is none (the common case, decided here) */
    if (bits & (d == GEMM_DTYPE_F32 ? (1ull << 28) - 1 : (1ull << 41) - 1)) return 0;
    if (!isfinite(v) || v == 0) return 0;
    int mbits = d == GEMM_DTYPE_F32 ? 23 : d == GEMM_DTYPE_BF16 ? 7 : 10, emin = d == GEMM_DTYPE_F16 ? -14 : -126, e;
    double a = fabs(v);
    (void)frexp(a, &e);
    int E = e - 1 < emin ? emin : e - 1;
    double s = ldexp(a, mbits - E); /* exact: the significand as a multiple of the quantum */
    return s - floor(s) == 0.5;
}

void gemm_half_to_f32_array(gemm_dtype d, const uint16_t *src, float *dst, size_t n)
{
    if (d == GEMM_DTYPE_BF16) {
        for (size_t i = 0; i < n; i++) dst[i] = gemm_bf16_to_f32(src[i]);
    } else {
        for (size_t i = 0; i < n; i++) dst[i] = gemm_f16_to_f32(src[i]);
    }
}

void gemm_f32_to_half_array(gemm_dtype d, const float *src, uint16_t *dst, size_t n)
{
    if (d == GEMM_DTYPE_BF16) {
        for (size_t i = 0; i < n; i++) dst[i] = gemm_f32_to_bf16(src[i]);
    } else {
        for (size_t i = 0; i < n; i++) dst[i] = gemm_f32_to_f16(src[i]);
    }
}
