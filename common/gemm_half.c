/* gemm_half.c - float64 -> float16 / bfloat16 rounding and the array conversions (gemm_half.h). */
#include "gemm_half.h"

#include <math.h>

/* Rounds v to nearest-even in a binary format with a p-bit significand (implicit bit
 * included), normal exponents emin..emax and ebits exponent bits; returns its bits. The
 * significand is scaled to an integer and rounded with rint (the default rounding mode,
 * ties to even): one rounding from float64. */
static uint16_t round_f64(double v, int p, int emin, int emax, int ebits)
{
    uint16_t sign = signbit(v) ? 0x8000u : 0;
    int mbits = p - 1;
    uint16_t inf = (uint16_t)(((1u << ebits) - 1u) << mbits);
    if (isnan(v)) return (uint16_t)(sign | inf | (1u << (mbits - 1)));
    double a = fabs(v);
    if (isinf(a)) return (uint16_t)(sign | inf);
    if (a == 0) return sign;
    int e;
    (void)frexp(a, &e);
    int E = e - 1; /* a is in [2^E, 2^(E+1)) */
    if (E < emin) E = emin; /* subnormal: the quantum stays 2^(emin - mbits) */
    double q = rint(ldexp(a, mbits - E));
    if (q >= ldexp(1.0, p)) { /* rounded up to the next power of two */
        q = ldexp(q, -1);
        E++;
    }
    if (E > emax) return (uint16_t)(sign | inf);
    uint32_t n = (uint32_t)q;
    if (n < (1u << mbits)) return (uint16_t)(sign | n); /* subnormal (or zero) */
    return (uint16_t)(sign | ((uint32_t)(E - emin + 1) << mbits) | (n & ((1u << mbits) - 1u)));
}

uint16_t gemm_f64_to_f16(double v) { return round_f64(v, 11, -14, 15, 5); }
uint16_t gemm_f64_to_bf16(double v) { return round_f64(v, 8, -126, 127, 8); }

uint16_t gemm_f64_to_half(gemm_dtype d, double v)
{
    return d == GEMM_DTYPE_BF16 ? gemm_f64_to_bf16(v) : gemm_f64_to_f16(v);
}

int gemm_f64_is_half_midpoint(gemm_dtype d, double v)
{
    uint64_t bits;
    memcpy(&bits, &v, 8);
    /* a midpoint has at most 12 significant bits (float16) or 9 (bfloat16): a float64 with
     * any of its 41 lowest fraction bits set is none (the common case, decided here) */
    if (bits & ((1ull << 41) - 1)) return 0;
    if (!isfinite(v) || v == 0) return 0;
    int mbits = d == GEMM_DTYPE_BF16 ? 7 : 10, emin = d == GEMM_DTYPE_BF16 ? -126 : -14, e;
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
