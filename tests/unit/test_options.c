/* test_options.c - per-request options: defaults, every key, every refusal, strict
 * decimal dimensions. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "options.h"

static void expect_bad(const char *key, const char *value, int status, const char *code, const char *needle)
{
    gemm_options o, before;
    gemm_err err;
    gemm_options_init(&o);
    before = o;
    gemm_err_clear(&err);
    assert_int_equal(gemm_options_set(&o, key, value, &err), -1);
    assert_int_equal(err.status, status);
    assert_string_equal(err.code, code);
    if (needle && !strstr(err.message, needle)) {
        fprintf(stderr, "%s=%s: message \"%s\" lacks \"%s\"\n", key, value, err.message, needle);
        fail();
    }
    assert_memory_equal(&o, &before, sizeof o); /* a refused value changes nothing */
}

static void test_defaults(void **state)
{
    (void)state;
    gemm_options o;
    memset(&o, 0x5a, sizeof o);
    gemm_options_init(&o);
    assert_int_equal(o.dtype, GEMM_DTYPE_INVALID);
    assert_string_equal(o.kernel, "auto");
    assert_int_equal(o.tile, 0);
    assert_int_equal(o.math, GEMM_MATH_DEFAULT);
    assert_true(o.m == 0 && o.k == 0 && o.n == 0 && o.panel_of == 0);
}

static void test_set_each_key(void **state)
{
    (void)state;
    gemm_options o;
    gemm_err err;
    gemm_options_init(&o);
    assert_int_equal(gemm_options_set(&o, "dtype", "float32", &err), 0);
    assert_int_equal(o.dtype, GEMM_DTYPE_F32);
    assert_int_equal(gemm_options_set(&o, "dtype", "f8", &err), 0);
    assert_int_equal(o.dtype, GEMM_DTYPE_F64);
    assert_int_equal(gemm_options_set(&o, "dtype", "INT32", &err), 0);
    assert_int_equal(o.dtype, GEMM_DTYPE_I32);
    assert_int_equal(gemm_options_set(&o, "dtype", "bfloat16", &err), 0);
    assert_int_equal(o.dtype, GEMM_DTYPE_BF16);
    assert_int_equal(o.out_dtype, GEMM_DTYPE_INVALID);
    assert_int_equal(gemm_options_set(&o, "out_dtype", "float16", &err), 0);
    assert_int_equal(o.out_dtype, GEMM_DTYPE_F16);
    assert_int_equal(gemm_options_set(&o, "out_dtype", "float32", &err), 0);
    assert_int_equal(o.out_dtype, GEMM_DTYPE_F32);
    assert_int_equal(gemm_options_set(&o, "kernel", "tiled", &err), 0);
    assert_string_equal(o.kernel, "tiled");
    assert_int_equal(gemm_options_set(&o, "kernel", "wgmma_128x256_v2", &err), 0);
    assert_string_equal(o.kernel, "wgmma_128x256_v2");
    char k47[48];
    memset(k47, 'k', 47);
    k47[47] = '\0';
    assert_int_equal(gemm_options_set(&o, "kernel", k47, &err), 0);
    assert_string_equal(o.kernel, k47);
    assert_int_equal(gemm_options_set(&o, "tile", "1", &err), 0);
    assert_int_equal(o.tile, 1);
    assert_int_equal(gemm_options_set(&o, "tile", "1024", &err), 0);
    assert_int_equal(o.tile, 1024);
    assert_int_equal(gemm_options_set(&o, "tile", "032", &err), 0);
    assert_int_equal(o.tile, 32);
    const char *maths[] = {"default", "fp32", "tf32", "bf16"};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(gemm_options_set(&o, "math", maths[i], &err), 0);
        assert_int_equal(o.math, i);
    }
    assert_int_equal(gemm_options_set(&o, "m", "3", &err), 0);
    assert_int_equal(gemm_options_set(&o, "k", "0", &err), 0);
    assert_int_equal(gemm_options_set(&o, "n", "18446744073709551615", &err), 0);
    assert_true(o.m == 3 && o.k == 0 && o.n == UINT64_MAX);
    assert_int_equal(o.panel_of, 0);
    assert_int_equal(gemm_options_set(&o, "panel_of", "4096", &err), 0);
    assert_int_equal(o.panel_of, 4096);
    assert_int_equal(gemm_options_set(&o, "panel_of", "1", &err), 0);
    assert_int_equal(o.panel_of, 1);
}

static void test_unknown_keys(void **state)
{
    (void)state;
    gemm_options o, before;
    gemm_err err;
    gemm_options_init(&o);
    before = o;
    const char *keys[] = {"Dtype", "tiles", "mm", "K", "", "format", "dtype "};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) assert_int_equal(gemm_options_set(&o, keys[i], "1", &err), 1);
    assert_int_equal(gemm_options_set(&o, NULL, "1", &err), 1);
    assert_memory_equal(&o, &before, sizeof o);
}

static void test_bad_values(void **state)
{
    (void)state;
    expect_bad("dtype", "float8", 422, "bad_option", "float8");
    expect_bad("dtype", "float8", 422, "bad_option", "float32, float64, int32, float16 or bfloat16");
    expect_bad("out_dtype", "float8", 422, "bad_out_dtype", "float8");
    expect_bad("dtype", "", 422, "bad_option", NULL);
    expect_bad("dtype", NULL, 422, "bad_option", NULL);
    expect_bad("kernel", "", 422, "bad_option", "kernel");
    expect_bad("kernel", "Tiled", 422, "bad_option", "a-z");
    expect_bad("kernel", "../etc", 422, "bad_option", NULL);
    expect_bad("kernel", "tiled ", 422, "bad_option", NULL);
    char k48[49];
    memset(k48, 'k', 48);
    k48[48] = '\0';
    expect_bad("kernel", k48, 422, "bad_option", "...");
    const char *tiles[] = {"0", "1025", "-1", "+16", " 16", "16 ", "1e2", "16.0", "0x10", "", "99999999999999999999999"};
    for (size_t i = 0; i < sizeof tiles / sizeof tiles[0]; i++) expect_bad("tile", tiles[i], 422, "bad_option", "1 to 1024");
    expect_bad("math", "fp16", 422, "bad_option", "default, fp32, tf32 or bf16");
    expect_bad("math", "", 422, "bad_option", NULL);
    const char *dims[] = {"-1", "+1", " 1", "1 ", "1.0", "1e3", "0x10", "", "18446744073709551616", "abc", "1,2"};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        expect_bad("m", dims[i], 400, "bad_dimension", "m '");
        expect_bad("k", dims[i], 400, "bad_dimension", "k '");
        expect_bad("n", dims[i], 400, "bad_dimension", "digits only");
    }
    /* panel_of: a count of rows, >= 1 (whether it is >= m is the engine's check) */
    const char *rows[] = {"0", "-1", "+8", " 8", "8 ", "8.0", "1e3", "0x10", "", "18446744073709551616", "abc"};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        expect_bad("panel_of", rows[i], 422, "bad_option", "panel_of '");
    /* values are echoed printable and bounded */
    gemm_options o;
    gemm_err err;
    gemm_options_init(&o);
    char longv[300];
    memset(longv, 'z', sizeof longv - 1);
    longv[sizeof longv - 1] = '\0';
    longv[3] = '\n';
    longv[4] = '\x01';
    assert_int_equal(gemm_options_set(&o, "dtype", longv, &err), -1);
    assert_null(strchr(err.message, '\n'));
    assert_null(strchr(err.message, '\x01'));
    assert_true(strlen(err.message) < 150);
    assert_non_null(strstr(err.message, "zzz??zz"));
}

static void test_parse_u64(void **state)
{
    (void)state;
    uint64_t v = 77;
    assert_int_equal(gemm_parse_u64("0", &v), 0);
    assert_int_equal(v, 0);
    assert_int_equal(gemm_parse_u64("000123", &v), 0);
    assert_int_equal(v, 123);
    assert_int_equal(gemm_parse_u64("18446744073709551615", &v), 0);
    assert_true(v == UINT64_MAX);
    v = 77;
    const char *bad[] = {"18446744073709551616", "99999999999999999999", "", "-0", "+0", " 0", "0 ", "1_000", "١"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) assert_int_equal(gemm_parse_u64(bad[i], &v), -1);
    assert_int_equal(gemm_parse_u64(NULL, &v), -1);
    assert_int_equal(v, 77); /* untouched on failure */
    /* every value up to a few thousand, and random ones, round-trip through printf */
    uint64_t s = 88172645463325252ull;
    for (int i = 0; i < 20000; i++) {
        uint64_t x;
        if (i < 5000) x = (uint64_t)i;
        else {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            x = s >> (s % 64);
        }
        char buf[32];
        snprintf(buf, sizeof buf, "%llu", (unsigned long long)x);
        assert_int_equal(gemm_parse_u64(buf, &v), 0);
        assert_true(v == x);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),     cmocka_unit_test(test_set_each_key), cmocka_unit_test(test_unknown_keys),
        cmocka_unit_test(test_bad_values),   cmocka_unit_test(test_parse_u64),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
