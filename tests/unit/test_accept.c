/* test_accept.c - Accept negotiation for product answers: defaults to the request's own
 * family, exact types, wildcards, q-values (q=0 refuses), and nothing acceptable; the sizes
 * of JSON answers, which saturate instead of wrapping. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "respond.h"

static void test_defaults_to_family(void **state)
{
    (void)state;
    assert_int_equal(gemmd_negotiate(NULL, GEMMD_FMT_RAW), GEMMD_FMT_RAW);
    assert_int_equal(gemmd_negotiate("", GEMMD_FMT_NPY), GEMMD_FMT_NPY);
    assert_int_equal(gemmd_negotiate(" , ,", GEMMD_FMT_RAW), GEMMD_FMT_RAW); /* no media range */
    assert_int_equal(gemmd_negotiate("*/*", GEMMD_FMT_JSON), GEMMD_FMT_JSON);
    assert_int_equal(gemmd_negotiate("*/*", GEMMD_FMT_NPY), GEMMD_FMT_NPY);
    assert_int_equal(gemmd_negotiate("application/*", GEMMD_FMT_RAW), GEMMD_FMT_RAW);
}

static void test_exact_types(void **state)
{
    (void)state;
    assert_int_equal(gemmd_negotiate("application/json", GEMMD_FMT_RAW), GEMMD_FMT_JSON);
    assert_int_equal(gemmd_negotiate("application/octet-stream", GEMMD_FMT_JSON), GEMMD_FMT_RAW);
    assert_int_equal(gemmd_negotiate("application/x-npy", GEMMD_FMT_JSON), GEMMD_FMT_NPY);
    assert_int_equal(gemmd_negotiate("Application/JSON; charset=utf-8", GEMMD_FMT_NPY), GEMMD_FMT_JSON);
    /* a listed type wins over the wildcard at the same q only when it is the family */
    assert_int_equal(gemmd_negotiate("text/html, application/x-npy", GEMMD_FMT_JSON), GEMMD_FMT_NPY);
}

static void test_q_values(void **state)
{
    (void)state;
    assert_int_equal(gemmd_negotiate("application/json;q=0.5, application/x-npy", GEMMD_FMT_JSON), GEMMD_FMT_NPY);
    assert_int_equal(gemmd_negotiate("application/json;q=0.9, application/x-npy;q=0.1", GEMMD_FMT_NPY),
                     GEMMD_FMT_JSON);
    assert_int_equal(gemmd_negotiate("application/json;q=0", GEMMD_FMT_JSON), GEMMD_FMT_NONE);
    assert_int_equal(gemmd_negotiate("application/octet-stream, */*;q=0.1", GEMMD_FMT_JSON), GEMMD_FMT_RAW);
    /* equal q: the request's own family is preferred */
    assert_int_equal(gemmd_negotiate("application/json, application/octet-stream", GEMMD_FMT_RAW), GEMMD_FMT_RAW);
}

static void test_nothing_acceptable(void **state)
{
    (void)state;
    assert_int_equal(gemmd_negotiate("text/html", GEMMD_FMT_JSON), GEMMD_FMT_NONE);
    assert_int_equal(gemmd_negotiate("image/png, text/*", GEMMD_FMT_RAW), GEMMD_FMT_NONE);
}

/* Shapes from the network: an answer's rows and text size saturate at UINT64_MAX. */
static void test_answer_sizes(void **state)
{
    (void)state;
    assert_int_equal(gemmd_answer_rows(7, 0), 7);
    assert_int_equal(gemmd_answer_rows(7, 3), 21);
    assert_true(gemmd_answer_rows(1ull << 40, 1ull << 40) == UINT64_MAX);
    uint64_t small = gemmd_json_answer_bytes(2, 3, GEMM_DTYPE_F64);
    assert_true(small > 6 && small < 8192 + 6 * 64);
    assert_true(gemmd_json_answer_bytes(1ull << 62, 1, GEMM_DTYPE_F32) == UINT64_MAX);
    assert_true(gemmd_json_answer_bytes(1ull << 63, 0, GEMM_DTYPE_F32) == UINT64_MAX); /* its brackets */
    assert_true(gemmd_json_answer_bytes(UINT64_MAX, 1, GEMM_DTYPE_F32) == UINT64_MAX);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_to_family),
        cmocka_unit_test(test_exact_types),
        cmocka_unit_test(test_q_values),
        cmocka_unit_test(test_nothing_acceptable),
        cmocka_unit_test(test_answer_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
