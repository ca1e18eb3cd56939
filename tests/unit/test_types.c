/* test_types.c - dtypes, math modes, checked arithmetic, gemm_check_product and
 * gemm_check_matrix (every limit, overflow of m*k*size), errors, the host allocator. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "gemm_types.h"

static void test_dtypes(void **state)
{
    (void)state;
    assert_int_equal(gemm_dtype_size(GEMM_DTYPE_F32), 4);
    assert_int_equal(gemm_dtype_size(GEMM_DTYPE_F64), 8);
    assert_int_equal(gemm_dtype_size(GEMM_DTYPE_I32), 4);
    assert_int_equal(gemm_dtype_size(GEMM_DTYPE_F16), 2);
    assert_int_equal(gemm_dtype_size(GEMM_DTYPE_BF16), 2);
    assert_string_equal(gemm_dtype_name(GEMM_DTYPE_F16), "float16");
    assert_string_equal(gemm_dtype_name(GEMM_DTYPE_BF16), "bfloat16");
    assert_true(gemm_dtype_is_half(GEMM_DTYPE_F16) && gemm_dtype_is_half(GEMM_DTYPE_BF16));
    assert_false(gemm_dtype_is_half(GEMM_DTYPE_F32) || gemm_dtype_is_half(GEMM_DTYPE_INVALID));
    assert_int_equal(gemm_dtype_size(GEMM_DTYPE_INVALID), 0);
    assert_int_equal(gemm_dtype_size(GEMM_DTYPE_COUNT), 0);
    assert_string_equal(gemm_dtype_name(GEMM_DTYPE_F32), "float32");
    assert_string_equal(gemm_dtype_name(GEMM_DTYPE_F64), "float64");
    assert_string_equal(gemm_dtype_name(GEMM_DTYPE_I32), "int32");
    assert_string_equal(gemm_dtype_name(GEMM_DTYPE_INVALID), "invalid");
    const struct {
        const char *s;
        gemm_dtype d;
    } ok[] = {{"float32", GEMM_DTYPE_F32}, {"f4", GEMM_DTYPE_F32},   {"float", GEMM_DTYPE_F32},
              {"FLOAT32", GEMM_DTYPE_F32}, {"float64", GEMM_DTYPE_F64}, {"f8", GEMM_DTYPE_F64},
              {"double", GEMM_DTYPE_F64},  {"int32", GEMM_DTYPE_I32},   {"i4", GEMM_DTYPE_I32},
              {"Int", GEMM_DTYPE_I32},     {"float16", GEMM_DTYPE_F16}, {"f2", GEMM_DTYPE_F16},
              {"half", GEMM_DTYPE_F16},    {"bfloat16", GEMM_DTYPE_BF16}, {"BF16", GEMM_DTYPE_BF16}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        gemm_dtype d = GEMM_DTYPE_INVALID;
        assert_int_equal(gemm_dtype_from_name(ok[i].s, &d), 0);
        assert_int_equal(d, ok[i].d);
    }
    /* every canonical name maps back to itself */
    for (int d = 0; d < GEMM_DTYPE_COUNT; d++) {
        gemm_dtype back;
        assert_int_equal(gemm_dtype_from_name(gemm_dtype_name((gemm_dtype)d), &back), 0);
        assert_int_equal(back, d);
    }
    const char *bad[] = {"float8", "int64", "", "f", "float32 ", "invalid", "<f4", "bfloat"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gemm_dtype d = GEMM_DTYPE_F64;
        assert_int_equal(gemm_dtype_from_name(bad[i], &d), -1);
        assert_int_equal(d, GEMM_DTYPE_F64);
    }
    gemm_dtype d;
    assert_int_equal(gemm_dtype_from_name(NULL, &d), -1);
}

static void test_math_modes(void **state)
{
    (void)state;
    const char *names[] = {"default", "fp32", "tf32", "bf16"};
    for (int m = 0; m < GEMM_MATH_COUNT; m++) {
        gemm_math back;
        assert_string_equal(gemm_math_name((gemm_math)m), names[m]);
        assert_int_equal(gemm_math_from_name(names[m], &back), 0);
        assert_int_equal(back, m);
    }
    assert_string_equal(gemm_math_name(GEMM_MATH_COUNT), "invalid");
    gemm_math m;
    assert_int_equal(gemm_math_from_name("TF32", &m), 0);
    assert_int_equal(m, GEMM_MATH_TF32);
    assert_int_equal(gemm_math_from_name("fp16", &m), -1);
    assert_int_equal(gemm_math_from_name(NULL, &m), -1);
    assert_string_equal(gemm_math_report_name(GEMM_DTYPE_F32, GEMM_MATH_DEFAULT), "fp32");
    assert_string_equal(gemm_math_report_name(GEMM_DTYPE_F16, GEMM_MATH_DEFAULT), "fp32");
    assert_string_equal(gemm_math_report_name(GEMM_DTYPE_F32, GEMM_MATH_BF16), "bf16");
    assert_string_equal(gemm_math_report_name(GEMM_DTYPE_F64, GEMM_MATH_TF32), "exact");
    assert_string_equal(gemm_math_report_name(GEMM_DTYPE_I32, GEMM_MATH_DEFAULT), "exact");
}

static void test_checked_arithmetic(void **state)
{
    (void)state;
    size_t r = 12345;
    assert_true(gemm_mul_size(0, SIZE_MAX, &r) && r == 0);
    assert_true(gemm_mul_size(1u << 20, 1u << 20, &r) && r == (size_t)1 << 40);
    assert_true(gemm_mul_size(SIZE_MAX, 1, &r) && r == SIZE_MAX);
    r = 7;
    assert_false(gemm_mul_size(SIZE_MAX, 2, &r));
    assert_false(gemm_mul_size((size_t)1 << 32, (size_t)1 << 32, &r));
    assert_int_equal(r, 7); /* untouched on overflow */
    assert_true(gemm_add_size(SIZE_MAX - 1, 1, &r) && r == SIZE_MAX);
    assert_false(gemm_add_size(SIZE_MAX, 1, &r));
    assert_int_equal(r, SIZE_MAX);
    assert_true(gemm_matrix_bytes(3, 4, GEMM_DTYPE_F64, &r) && r == 96);
    assert_true(gemm_matrix_bytes(0, 4, GEMM_DTYPE_F32, &r) && r == 0);
    assert_false(gemm_matrix_bytes(3, 4, GEMM_DTYPE_INVALID, &r));
    assert_false(gemm_matrix_bytes(SIZE_MAX / 4 + 1, 1, GEMM_DTYPE_F32, &r)); /* only the *size overflows */
    assert_true(gemm_matrix_bytes(SIZE_MAX / 4, 1, GEMM_DTYPE_F32, &r));
    assert_false(gemm_matrix_bytes(UINT64_MAX, UINT64_MAX, GEMM_DTYPE_I32, &r));
}

static void expect_product(uint64_t m, uint64_t k, uint64_t kb, uint64_t n, gemm_dtype d, const gemm_limits *lim,
                           int status, const char *code, const char *needle)
{
    gemm_err err;
    gemm_err_clear(&err);
    int rc = gemm_check_product(m, k, kb, n, d, lim, &err);
    if (status == 0) {
        if (rc) fprintf(stderr, "unexpected: %s\n", err.message);
        assert_int_equal(rc, 0);
        return;
    }
    assert_int_equal(rc, -1);
    assert_int_equal(err.status, status);
    assert_string_equal(err.code, code);
    if (needle && !strstr(err.message, needle)) {
        fprintf(stderr, "message \"%s\" lacks \"%s\"\n", err.message, needle);
        fail();
    }
}

static void test_check_product(void **state)
{
    (void)state;
    gemm_limits lim = {.max_dim = 1000, .max_elements = 100000, .max_body_bytes = 0};
    expect_product(3, 4, 4, 2, GEMM_DTYPE_F32, &lim, 0, NULL, NULL);
    expect_product(1, 1, 1, 1, GEMM_DTYPE_I32, &lim, 0, NULL, NULL);
    expect_product(3, 4, 5, 2, GEMM_DTYPE_F32, &lim, 422, "shape_mismatch",
                   "A is 3x4 and B is 5x2: A's columns (4) must equal B's rows (5)");
    expect_product(0, 4, 4, 2, GEMM_DTYPE_F32, &lim, 422, "empty_matrix", "A is 0x4");
    expect_product(3, 0, 0, 2, GEMM_DTYPE_F32, &lim, 422, "empty_matrix", NULL);
    expect_product(3, 4, 4, 0, GEMM_DTYPE_F32, &lim, 422, "empty_matrix", "B is 4x0");
    expect_product(0, 4, 5, 2, GEMM_DTYPE_F32, &lim, 422, "empty_matrix", NULL); /* empty before mismatch */
    expect_product(3, 4, 4, 2, GEMM_DTYPE_INVALID, &lim, 422, "bad_dtype", NULL);
    /* max_dim: each of m, k, n; exactly at the limit is fine */
    expect_product(1000, 1, 1, 100, GEMM_DTYPE_F32, &lim, 0, NULL, NULL);
    expect_product(1001, 1, 1, 1, GEMM_DTYPE_F32, &lim, 413, "too_large", "1001");
    expect_product(1, 1001, 1001, 1, GEMM_DTYPE_F32, &lim, 413, "too_large", "limit of 1000");
    expect_product(1, 1, 1, 1001, GEMM_DTYPE_F32, &lim, 413, "too_large", NULL);
    /* max_elements: A, B, C each */
    expect_product(400, 250, 250, 1, GEMM_DTYPE_F32, &lim, 0, NULL, NULL); /* A = 100000 exactly */
    expect_product(401, 250, 250, 1, GEMM_DTYPE_F32, &lim, 413, "too_large", "A would be 401x250");
    expect_product(1, 250, 250, 401, GEMM_DTYPE_F32, &lim, 413, "too_large", "B would be 250x401");
    expect_product(400, 1, 1, 251, GEMM_DTYPE_F32, &lim, 413, "too_large", "C would be 400x251");
    /* no limits: only overflow of m*k*size (and k*n*size, m*n*size) stops it */
    expect_product(UINT64_MAX, 1, 1, 1, GEMM_DTYPE_F32, NULL, 413, "too_large", "overflows");
    expect_product((uint64_t)1 << 62, 1, 1, 1, GEMM_DTYPE_F32, NULL, 413, "too_large", "A would be");
    expect_product((uint64_t)1 << 61, 1, 1, 1, GEMM_DTYPE_F64, NULL, 413, "too_large", NULL);
    expect_product((uint64_t)1 << 32, (uint64_t)1 << 32, (uint64_t)1 << 32, 1, GEMM_DTYPE_I32, NULL, 413, "too_large", NULL);
    expect_product(1, (uint64_t)1 << 31, (uint64_t)1 << 31, (uint64_t)1 << 31, GEMM_DTYPE_I32, NULL, 413, "too_large",
                   "B would be");
    expect_product((uint64_t)1 << 31, 1, 1, (uint64_t)1 << 31, GEMM_DTYPE_F64, NULL, 413, "too_large", "C would be");
    expect_product((uint64_t)1 << 20, (uint64_t)1 << 20, (uint64_t)1 << 20, 1, GEMM_DTYPE_F64, NULL, 0, NULL, NULL);
    /* a zero limit means "no limit" for that field */
    gemm_limits only_dim = {.max_dim = 10, .max_elements = 0, .max_body_bytes = 0};
    expect_product(10, 10, 10, 10, GEMM_DTYPE_F64, &only_dim, 0, NULL, NULL);
    gemm_limits only_elems = {.max_dim = 0, .max_elements = 10, .max_body_bytes = 0};
    expect_product(1, 10, 10, 1, GEMM_DTYPE_F64, &only_elems, 0, NULL, NULL);
    expect_product(1, 11, 11, 1, GEMM_DTYPE_F64, &only_elems, 413, "too_large", NULL);
    assert_int_equal(gemm_check_product(3, 4, 5, 2, GEMM_DTYPE_F32, &lim, NULL), -1); /* NULL err is fine */
}

static void test_check_matrix(void **state)
{
    (void)state;
    gemm_limits lim = {.max_dim = 100, .max_elements = 1000, .max_body_bytes = 0};
    gemm_err err;
    assert_int_equal(gemm_check_matrix(10, 100, GEMM_DTYPE_F32, &lim, "A", &err), 0);
    assert_int_equal(gemm_check_matrix(0, 3, GEMM_DTYPE_F32, &lim, "part a", &err), -1);
    assert_int_equal(err.status, 422);
    assert_string_equal(err.code, "empty_matrix");
    assert_non_null(strstr(err.message, "part a is 0x3"));
    assert_int_equal(gemm_check_matrix(3, 0, GEMM_DTYPE_F32, &lim, NULL, &err), -1);
    assert_string_equal(err.code, "empty_matrix");
    assert_int_equal(gemm_check_matrix(101, 1, GEMM_DTYPE_F32, &lim, "B", &err), -1);
    assert_int_equal(err.status, 413);
    assert_non_null(strstr(err.message, "limit of 100"));
    assert_int_equal(gemm_check_matrix(1, 101, GEMM_DTYPE_F32, &lim, "B", &err), -1);
    assert_int_equal(err.status, 413);
    assert_int_equal(gemm_check_matrix(11, 100, GEMM_DTYPE_F32, &lim, "B", &err), -1);
    assert_int_equal(err.status, 413);
    assert_non_null(strstr(err.message, "1100 elements"));
    assert_int_equal(gemm_check_matrix(2, 2, GEMM_DTYPE_INVALID, &lim, "B", &err), -1);
    assert_int_equal(err.status, 422);
    assert_int_equal(gemm_check_matrix((uint64_t)1 << 62, 2, GEMM_DTYPE_F32, NULL, "B", &err), -1);
    assert_int_equal(err.status, 413);
    assert_string_equal(err.code, "too_large");
    assert_int_equal(gemm_check_matrix((uint64_t)1 << 30, (uint64_t)1 << 30, GEMM_DTYPE_F64, NULL, "B", &err), 0);
}

static void test_errors(void **state)
{
    (void)state;
    gemm_err e;
    memset(&e, 0x7f, sizeof e);
    gemm_err_clear(&e);
    assert_int_equal(e.status, 0);
    assert_string_equal(e.code, "");
    assert_string_equal(e.message, "");
    assert_int_equal(gemm_err_set(&e, 422, "shape_mismatch", "A is %dx%d", 3, 4), -1);
    assert_int_equal(e.status, 422);
    assert_string_equal(e.code, "shape_mismatch");
    assert_string_equal(e.message, "A is 3x4");
    /* long messages and codes are truncated, always terminated */
    char big[1000];
    memset(big, 'm', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    gemm_err_set(&e, 500, big, "%s", big);
    assert_int_equal(strlen(e.code), sizeof e.code - 1);
    assert_int_equal(strlen(e.message), sizeof e.message - 1);
    gemm_err_set(&e, 500, NULL, "x");
    assert_string_equal(e.code, "error");
    assert_int_equal(gemm_err_set(NULL, 400, "x", "y"), -1);
    gemm_err_clear(NULL);
}

/* C's dtype: float32 by default for the half types, theirs when asked; nothing else. */
static void test_out_dtype(void **state)
{
    (void)state;
    static const struct {
        gemm_dtype in, out, want;
    } ok[] = {
        {GEMM_DTYPE_F16, GEMM_DTYPE_INVALID, GEMM_DTYPE_F32},   {GEMM_DTYPE_F16, GEMM_DTYPE_F32, GEMM_DTYPE_F32},
        {GEMM_DTYPE_F16, GEMM_DTYPE_F16, GEMM_DTYPE_F16},       {GEMM_DTYPE_BF16, GEMM_DTYPE_INVALID, GEMM_DTYPE_F32},
        {GEMM_DTYPE_BF16, GEMM_DTYPE_BF16, GEMM_DTYPE_BF16},    {GEMM_DTYPE_F32, GEMM_DTYPE_INVALID, GEMM_DTYPE_F32},
        {GEMM_DTYPE_F32, GEMM_DTYPE_F32, GEMM_DTYPE_F32},       {GEMM_DTYPE_F64, GEMM_DTYPE_F64, GEMM_DTYPE_F64},
        {GEMM_DTYPE_I32, GEMM_DTYPE_INVALID, GEMM_DTYPE_I32},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        gemm_dtype c = GEMM_DTYPE_INVALID;
        gemm_err err;
        assert_int_equal(gemm_out_dtype_resolve(ok[i].in, ok[i].out, &c, &err), 0);
        assert_int_equal(c, ok[i].want);
    }
    static const gemm_dtype bad[][2] = {
        {GEMM_DTYPE_F16, GEMM_DTYPE_BF16}, {GEMM_DTYPE_F16, GEMM_DTYPE_F64}, {GEMM_DTYPE_BF16, GEMM_DTYPE_F16},
        {GEMM_DTYPE_BF16, GEMM_DTYPE_I32}, {GEMM_DTYPE_F32, GEMM_DTYPE_F16}, {GEMM_DTYPE_F32, GEMM_DTYPE_F64},
        {GEMM_DTYPE_F64, GEMM_DTYPE_F32},  {GEMM_DTYPE_I32, GEMM_DTYPE_F32},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gemm_dtype c = GEMM_DTYPE_INVALID;
        gemm_err err;
        gemm_err_clear(&err);
        assert_int_equal(gemm_out_dtype_resolve(bad[i][0], bad[i][1], &c, &err), -1);
        assert_int_equal(err.status, 422);
        assert_string_equal(err.code, "bad_out_dtype");
        assert_non_null(strstr(err.message, gemm_dtype_name(bad[i][1])));
        assert_int_equal(c, GEMM_DTYPE_INVALID);
    }
}

static void test_host_allocator(void **state)
{
    (void)state;
    size_t sizes[] = {0, 1, 63, 64, 65, 4096, 1000003};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        unsigned char *p = gemm_alloc(&gemm_allocator_host, sizes[i]);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 64, 0);
        if (sizes[i]) memset(p, 0xab, sizes[i]); /* the whole size is usable */
        gemm_free(&gemm_allocator_host, p);
    }
    gemm_free(&gemm_allocator_host, NULL);
    assert_null(gemm_alloc(&gemm_allocator_host, SIZE_MAX - 10));
    double t0 = gemm_now_ms(), t1 = gemm_now_ms();
    assert_true(t1 >= t0);
    assert_true(t0 > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtypes),        cmocka_unit_test(test_math_modes),   cmocka_unit_test(test_checked_arithmetic),
        cmocka_unit_test(test_check_product), cmocka_unit_test(test_check_matrix), cmocka_unit_test(test_errors),
        cmocka_unit_test(test_host_allocator), cmocka_unit_test(test_out_dtype),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
