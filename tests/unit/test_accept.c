/* test_accept.c - Accept negotiation for product answers: defaults to the request's own
 * family, exact types, wildcards, q-values (q=0 refuses), and nothing acceptable. */
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_to_family),
        cmocka_unit_test(test_exact_types),
        cmocka_unit_test(test_q_values),
        cmocka_unit_test(test_nothing_acceptable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
