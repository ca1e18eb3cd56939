/* test_half.c - the float16 / bfloat16 converters (gemm_half.h), every bit pattern, against
 * references written another way: widening from the fields with ldexp, narrowing checked by
 * the definition of round-to-nearest-even (no neighbour is nearer; a tie picks the even one)
 * and against the float64 rounding path (frexp / rint), and the decimal rounding of JSON
 * numbers (one rounding from the text, even where its float64 is a halfway case). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "gemm_half.h"
#include "json_codec.h"
#include "json_whole.h"
#include "json_number.h"

/* ---- references ---------------------------------------------------------------- */

/* float16 bits -> value, from the fields: (-1)^s * 2^(e-15) * 1.m, or 2^-14 * 0.m. */
static double ref_f16(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 31) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp((double)m, -24);
    else v = ldexp((double)(m + 1024), e - 25);
    return s ? -v : v;
}

/* bfloat16 bits -> value: (-1)^s * 2^(e-127) * 1.m, or 2^-126 * 0.m (7 fraction bits). */
static double ref_bf16(uint16_t b)
{
    int s = b >> 15, e = (b >> 7) & 255, m = b & 127;
    double v;
    if (e == 255) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp((double)m, -133);
    else v = ldexp((double)(m + 128), e - 134);
    return s ? -v : v;
}

static double ref_val(gemm_dtype d, uint16_t h) { return d == GEMM_DTYPE_BF16 ? ref_bf16(h) : ref_f16(h); }
static uint16_t inf_bits(gemm_dtype d) { return d == GEMM_DTYPE_BF16 ? 0x7f80 : 0x7c00; }
static uint16_t narrow(gemm_dtype d, float f) { return d == GEMM_DTYPE_BF16 ? gemm_f32_to_bf16(f) : gemm_f32_to_f16(f); }

/* h is the nearest value of dtype d to x (finite, not NaN), ties to even: checked against
 * its magnitude neighbours. Returns 1 when it is. */
static int is_nearest(gemm_dtype d, double x, uint16_t h)
{
    uint16_t sign = signbit(x) ? 0x8000 : 0, mag = h & 0x7fff;
    double ax = fabs(x);
    if ((h & 0x8000) != sign) return 0;
    if (mag > inf_bits(d)) return 0; /* NaN */
    if (mag == inf_bits(d)) {
        /* infinity: x is at least halfway past the largest finite value (ties go to the even
         * code, which is infinity's: the largest finite code is odd) */
        double top = ref_val(d, inf_bits(d) - 1), ulp = top - ref_val(d, inf_bits(d) - 2);
        return ax >= top + ulp / 2;
    }
    double v = ref_val(d, mag), dist = fabs(ax - v);
    if (mag > 0) {
        double lo = fabs(ax - ref_val(d, mag - 1));
        if (lo < dist || (lo == dist && (mag & 1))) return 0;
    }
    if (mag + 1 < inf_bits(d)) {
        double hi = fabs(ax - ref_val(d, mag + 1));
        if (hi < dist || (hi == dist && (mag & 1))) return 0;
    } else { /* the largest finite: the "next" is the overflow threshold's other side */
        double ulp = v - ref_val(d, mag - 1);
        if (ax >= v + ulp / 2) return 0;
    }
    return 1;
}

/* ---- widening: every bit pattern ---------------------------------------------------- */

static void widen_all(gemm_dtype d)
{
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = gemm_half_to_f32(d, h);
        double r = ref_val(d, h);
        if (isnan(r)) {
            assert_true(isnan(f));
            assert_int_equal(!!signbit(f), h >> 15);
            continue;
        }
        if ((double)f != r || !!signbit(f) != !!signbit(r)) {
            fprintf(stderr, "%s 0x%04x: got %a, want %a\n", gemm_dtype_name(d), (unsigned)h, (double)f, r);
            fail();
        }
    }
}

static void test_f16_to_f32_all(void **state)
{
    (void)state;
    widen_all(GEMM_DTYPE_F16);
    /* a few by hand */
    assert_true(gemm_f16_to_f32(0x3c00) == 1.0f);
    assert_true(gemm_f16_to_f32(0x7bff) == 65504.0f);
    assert_true(gemm_f16_to_f32(0x0001) == 0x1p-24f);
    assert_true(gemm_f16_to_f32(0x0400) == 0x1p-14f);
    assert_true(gemm_f16_to_f32(0x03ff) == 0x1.ff8p-15f);
    assert_true(gemm_f16_to_f32(0xc000) == -2.0f);
}

static void test_bf16_to_f32_all(void **state)
{
    (void)state;
    widen_all(GEMM_DTYPE_BF16);
    assert_true(gemm_bf16_to_f32(0x3f80) == 1.0f);
    assert_true(gemm_bf16_to_f32(0x7f7f) == 0x1.fep127f);
    assert_true(gemm_bf16_to_f32(0x0001) == 0x1p-133f);
}

/* ---- narrowing -------------------------------------------------------------------- */

/* x narrowed from float32 and from float64 (when x is a float, both are one rounding and must
 * agree), and checked against the definition. */
static void check_narrow(gemm_dtype d, float x)
{
    uint16_t h = narrow(d, x), h64 = gemm_f64_to_half(d, (double)x);
    if (isnan(x)) {
        assert_true(isnan(gemm_half_to_f32(d, h)));
        assert_true(isnan(gemm_half_to_f32(d, h64)));
        assert_int_equal(h >> 15, !!signbit(x));
        return;
    }
    if (h != h64 || !is_nearest(d, (double)x, h)) {
        fprintf(stderr, "%s from %a (0x%08x): float32 path 0x%04x, float64 path 0x%04x\n", gemm_dtype_name(d),
                (double)x, gemm_half_f32_bits(x), (unsigned)h, (unsigned)h64);
        fail();
    }
}

static void narrow_all(gemm_dtype d)
{
    /* every value exactly (it comes back), and the points around every gap between
     * neighbours: the midpoint (a tie) and one float32 step either side of it */
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        double v = ref_val(d, h);
        if (isnan(v)) continue;
        float f = (float)v;
        assert_int_equal(narrow(d, f), h);
        assert_int_equal(gemm_f64_to_half(d, v), h);
        if ((h & 0x7fff) >= inf_bits(d)) continue;
        double next = (h & 0x7fff) + 1 < inf_bits(d) ? ref_val(d, (uint16_t)(h + 1))
                                                       : copysign(fabs(v) + (fabs(v) - fabs(ref_val(d, (uint16_t)(h - 1)))), v);
        float mid = (float)((v + next) / 2); /* exact: a float32 has the bits */
        assert_true((double)mid == (v + next) / 2);
        check_narrow(d, mid);
        check_narrow(d, nextafterf(mid, 0.0f));
        check_narrow(d, nextafterf(mid, copysignf(INFINITY, mid)));
    }
    /* float32 bit patterns across the whole range, a prime stride apart */
    for (uint64_t b = 0; b < (1ull << 32); b += 4093) check_narrow(d, gemm_half_bits_f32((uint32_t)b));
    check_narrow(d, INFINITY);
    check_narrow(d, -INFINITY);
    check_narrow(d, NAN);
    check_narrow(d, -NAN);
    check_narrow(d, 0.0f);
    check_narrow(d, -0.0f);
    check_narrow(d, FLT_MAX);
    check_narrow(d, 0x1p-149f);
}

static void test_f32_to_f16(void **state)
{
    (void)state;
    narrow_all(GEMM_DTYPE_F16);
    assert_int_equal(gemm_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(gemm_f32_to_f16(65519.99f), 0x7bff);
    assert_int_equal(gemm_f32_to_f16(65520.0f), 0x7c00); /* the tie past the largest goes to infinity */
    assert_int_equal(gemm_f32_to_f16(-65520.0f), 0xfc00);
    assert_int_equal(gemm_f32_to_f16(0x1p-25f), 0x0000);                 /* tie: to the even zero */
    assert_int_equal(gemm_f32_to_f16(nextafterf(0x1p-25f, 1)), 0x0001); /* just above: the smallest */
    assert_int_equal(gemm_f32_to_f16(0x1.8p-24f), 0x0002);               /* 1.5 ulps: tie to even 2 */
    assert_int_equal(gemm_f32_to_f16(0x1.ffcp-15f), 0x0400);             /* rounds up into the normals */
    assert_int_equal(gemm_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);          /* tie to even */
    assert_int_equal(gemm_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
    assert_int_equal(gemm_f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(gemm_f32_to_f16(NAN) & 0x7e00, 0x7e00); /* a quiet NaN */
}

static void test_f32_to_bf16(void **state)
{
    (void)state;
    narrow_all(GEMM_DTYPE_BF16);
    assert_int_equal(gemm_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(gemm_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80); /* tie to even */
    assert_int_equal(gemm_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    assert_int_equal(gemm_f32_to_bf16(FLT_MAX), 0x7f80);      /* beyond the largest + half: infinity */
    assert_int_equal(gemm_f32_to_bf16(0x1.fep127f), 0x7f7f);
    assert_int_equal(gemm_f32_to_bf16(gemm_half_bits_f32(0x7fa00001)) & 0x7fc0, 0x7fc0); /* sNaN -> quiet */
    assert_int_equal(gemm_f32_to_bf16(gemm_half_bits_f32(0x00008000)), 0x0000);          /* subnormal tie */
    assert_int_equal(gemm_f32_to_bf16(gemm_half_bits_f32(0x00018000)), 0x0002);
}

/* float64 inputs: a value a hair above a halfway point must round up, where rounding through
 * float32 first would land on the tie and go to even (down). */
static void test_f64_single_rounding(void **state)
{
    (void)state;
    double mid16 = 1.0 + 0x1p-11, mid_bf = 1.0 + 0x1p-8;
    assert_int_equal(gemm_f64_to_half(GEMM_DTYPE_F16, mid16), 0x3c00);
    assert_int_equal(gemm_f64_to_half(GEMM_DTYPE_F16, mid16 + 0x1p-40), 0x3c01);
    assert_int_equal(gemm_f32_to_f16((float)(mid16 + 0x1p-40)), 0x3c00); /* the double rounding it avoids */
    assert_int_equal(gemm_f64_to_half(GEMM_DTYPE_F16, mid16 - 0x1p-40), 0x3c00);
    assert_int_equal(gemm_f64_to_half(GEMM_DTYPE_BF16, mid_bf + 0x1p-40), 0x3f81);
    assert_int_equal(gemm_f64_to_half(GEMM_DTYPE_BF16, mid_bf), 0x3f80);
    assert_int_equal(gemm_f64_to_half(GEMM_DTYPE_F16, 1e300), 0x7c00);
    assert_int_equal(gemm_f64_to_half(GEMM_DTYPE_F16, -1e-300), 0x8000);
    assert_int_equal(gemm_f64_to_half(GEMM_DTYPE_BF16, 1e300), 0x7f80);
    assert_int_equal(gemm_f64_to_half(GEMM_DTYPE_BF16, 1e-300), 0x0000);
    assert_true(gemm_f64_is_midpoint(GEMM_DTYPE_F16, mid16));
    assert_false(gemm_f64_is_midpoint(GEMM_DTYPE_F16, mid16 + 0x1p-40));
    assert_false(gemm_f64_is_midpoint(GEMM_DTYPE_F16, 1.0));
    assert_true(gemm_f64_is_midpoint(GEMM_DTYPE_F16, 65520.0));
    assert_true(gemm_f64_is_midpoint(GEMM_DTYPE_F16, 0x1p-25));
    assert_true(gemm_f64_is_midpoint(GEMM_DTYPE_BF16, mid_bf));
    assert_false(gemm_f64_is_midpoint(GEMM_DTYPE_BF16, mid16));
    /* float32: halfway between 1 and its successor; an odd multiple of 2^-150 (subnormal) */
    assert_true(gemm_f64_is_midpoint(GEMM_DTYPE_F32, 1.0 + 0x1p-24));
    assert_false(gemm_f64_is_midpoint(GEMM_DTYPE_F32, 1.0 + 0x1p-23));
    assert_false(gemm_f64_is_midpoint(GEMM_DTYPE_F32, 1.0 + 0x1p-24 + 0x1p-40));
    assert_true(gemm_f64_is_midpoint(GEMM_DTYPE_F32, 3 * 0x1p-150));
    assert_false(gemm_f64_is_midpoint(GEMM_DTYPE_F32, 0x1p-149));
}

/* ---- JSON numbers: one rounding from the text ------------------------------------------ */

static uint16_t json_element(const char *num, gemm_dtype d, int dtype_last)
{
    char body[256];
    if (dtype_last)
        snprintf(body, sizeof body, "{\"a\": [[%s]], \"b\": [[1]], \"dtype\": \"%s\"}", num, gemm_dtype_name(d));
    else
        snprintf(body, sizeof body, "{\"dtype\": \"%s\", \"a\": [[%s]], \"b\": [[1]]}", gemm_dtype_name(d), num);
    gemm_options opt;
    gemm_options_init(&opt);
    gemm_matrix a = {0}, b = {0};
    gemm_err err;
    gemm_err_clear(&err);
    int rc = gemm_json_decode_request(body, strlen(body), NULL, &gemm_allocator_host, &opt, &a, &b, &err);
    if (rc != 0) fprintf(stderr, "%s: %s\n", body, err.message);
    assert_int_equal(rc, 0);
    assert_int_equal(a.dtype, d);
    uint16_t h;
    memcpy(&h, a.data, 2);
    gemm_free(&gemm_allocator_host, a.data);
    gemm_free(&gemm_allocator_host, b.data);
    return h;
}

static void test_json_decimal_rounding(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        gemm_dtype d;
        uint16_t want;
    } cases[] = {
        {"1.00048828125", GEMM_DTYPE_F16, 0x3c00},                   /* exactly halfway: to even */
        {"1.00048828125000000001", GEMM_DTYPE_F16, 0x3c01},          /* its float64 is the tie; the text is above */
        {"1.00048828124999999999", GEMM_DTYPE_F16, 0x3c00},
        {"1.00146484375", GEMM_DTYPE_F16, 0x3c02},                   /* halfway, odd below: up */
        {"1.001464843749999999999999", GEMM_DTYPE_F16, 0x3c01},
        {"65519.99", GEMM_DTYPE_F16, 0x7bff},
        {"-65504", GEMM_DTYPE_F16, 0xfbff},
        {"5.960464477539062e-8", GEMM_DTYPE_F16, 0x0001},           /* 2^-24 */
        {"2.98023223876953125e-8", GEMM_DTYPE_F16, 0x0000},         /* 2^-25 exactly: tie to zero */
        {"2.980232238769531250000001e-8", GEMM_DTYPE_F16, 0x0001},  /* above the tie */
        {"-0", GEMM_DTYPE_F16, 0x8000},
        {"0.1", GEMM_DTYPE_F16, 0x2e66},
        {"2049", GEMM_DTYPE_F16, 0x6800},                            /* an integer halfway: to even */
        {"2051", GEMM_DTYPE_F16, 0x6802},
        {"2049.0000000000000001", GEMM_DTYPE_F16, 0x6801},
        {"1.00390625", GEMM_DTYPE_BF16, 0x3f80},                     /* 1 + 2^-8: tie to even */
        {"1.00390625000000000001", GEMM_DTYPE_BF16, 0x3f81},
        {"1.01171875", GEMM_DTYPE_BF16, 0x3f82},                     /* 1 + 3 * 2^-8: tie, odd below: up */
        {"0.1", GEMM_DTYPE_BF16, 0x3dcd},
        {"3.3895313892515355e38", GEMM_DTYPE_BF16, 0x7f7f},
        {"1e-45", GEMM_DTYPE_BF16, 0x0000},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (int last = 0; last < 2; last++) {
            uint16_t h = json_element(cases[i].text, cases[i].d, last);
            if (h != cases[i].want) {
                fprintf(stderr, "%s as %s (dtype %s): got 0x%04x, want 0x%04x\n", cases[i].text,
                        gemm_dtype_name(cases[i].d), last ? "last" : "first", (unsigned)h, (unsigned)cases[i].want);
                fail();
            }
        }
    }
}

static void test_json_out_of_range(void **state)
{
    (void)state;
    static const char *const bodies[] = {
        "{\"dtype\": \"float16\", \"a\": [[65520]], \"b\": [[1]]}",
        "{\"a\": [[1, -7e4]], \"b\": [[1], [2]], \"dtype\": \"float16\"}",
        "{\"dtype\": \"bfloat16\", \"a\": [[3.4e38]], \"b\": [[1]]}",
        "{\"a\": [[1e39]], \"b\": [[1]], \"dtype\": \"bfloat16\"}",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        gemm_options opt;
        gemm_options_init(&opt);
        gemm_matrix a = {0}, b = {0};
        gemm_err err;
        gemm_err_clear(&err);
        assert_int_equal(gemm_json_decode_request(bodies[i], strlen(bodies[i]), NULL, &gemm_allocator_host, &opt, &a,
                                                  &b, &err), -1);
        assert_int_equal(err.status, 422);
        assert_string_equal(err.code, "bad_value");
        assert_non_null(strstr(err.message, "range"));
        assert_null(a.data);
        assert_null(b.data);
    }
}

/* ---- JSON answers: each element reads back to itself ----------------------------------- */

static void test_json_answer_round_trip(void **state)
{
    (void)state;
    static const gemm_dtype ds[] = {GEMM_DTYPE_F16, GEMM_DTYPE_BF16};
    for (int k = 0; k < 2; k++) {
        gemm_dtype d = ds[k];
        uint16_t *vals = malloc(65536 * 2);
        size_t n = 0;
        for (uint32_t i = 0; i < 65536; i++)
            if (isfinite(ref_val(d, (uint16_t)i))) vals[n++] = (uint16_t)i;
        gemm_matrix m = {1, n, d, vals, 0};
        gemm_buf out;
        gemm_buf_init(&out);
        gemm_json_write_matrix(&out, &m); /* [[v, v, ...]] */
        assert_false(out.failed);
        assert_true(out.len > 4);
        char *body = malloc(out.len + 128);
        int len = sprintf(body, "{\"dtype\":\"%s\",\"shape\":[1,%zu],\"data\":", gemm_dtype_name(d), n);
        memcpy(body + len, out.data + 1, out.len - 2); /* flat: [v, v, ...] */
        len += (int)out.len - 2;
        len += sprintf(body + len, "}");
        gemm_buf_free(&out);
        gemm_options opt;
        gemm_options_init(&opt);
        gemm_matrix one = {0};
        gemm_err err;
        gemm_err_clear(&err);
        int rc = gemm_json_decode_matrix(body, (size_t)len, NULL, &gemm_allocator_host, &opt, &one, &err);
        if (rc != 0) fprintf(stderr, "%s\n", err.message);
        assert_int_equal(rc, 0);
        assert_int_equal(one.dtype, d);
        assert_int_equal(one.rows * one.cols, n);
        assert_memory_equal(one.data, vals, n * 2);
        gemm_free(&gemm_allocator_host, one.data);
        free(body);
        free(vals);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_to_f32_all),       cmocka_unit_test(test_bf16_to_f32_all),
        cmocka_unit_test(test_f32_to_f16),           cmocka_unit_test(test_f32_to_bf16),
        cmocka_unit_test(test_f64_single_rounding),  cmocka_unit_test(test_json_decimal_rounding),
        cmocka_unit_test(test_json_out_of_range),    cmocka_unit_test(test_json_answer_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
