/* test_auth.c - the bearer-token file (comments, blank lines, whitespace, missing or
 * empty files, over-long tokens, names) and the Authorization header check. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "auth.h"

/* Whether the header carries a known token; how many distinct tokens a holds. */
static int check(const gemmd_auth *a, const char *authorization) { return gemmd_auth_identify(a, authorization) >= 0; }
static int count(const gemmd_auth *a)
{
    int n = 0;
    while (gemmd_auth_name(a, n)) n++;
    return n;
}

static const char *temp_file(char *buf, size_t len, const char *text)
{
    snprintf(buf, len, "/tmp/gemmd_test_auth_XXXXXX");
    int fd = mkstemp(buf);
    assert_true(fd >= 0);
    size_t n = strlen(text);
    assert_int_equal(write(fd, text, n), (ssize_t)n);
    close(fd);
    return buf;
}

static void test_load_and_check(void **state)
{
    (void)state;
    char path[64], msg[300];
    temp_file(path, sizeof path, "# operators\n  alpha-123  \n\n\tbeta\r\n# end\n");
    gemmd_auth *a = gemmd_auth_load(path, msg, sizeof msg);
    unlink(path);
    assert_non_null(a);
    assert_int_equal(count(a), 2);
    assert_true(check(a, "Bearer alpha-123"));
    assert_true(check(a, "bearer beta"));
    assert_true(check(a, "Bearer   beta"));
    assert_false(check(a, NULL));
    assert_false(check(a, ""));
    assert_false(check(a, "Bearer "));
    assert_false(check(a, "Bearer alpha"));     /* a prefix is not the token */
    assert_false(check(a, "Bearer alpha-1234")); /* nor a longer one */
    assert_false(check(a, "Basic YWxwaGEtMTIzOg=="));
    assert_false(check(a, "alpha-123"));
    assert_false(check(a, "Bearer # operators"));
    gemmd_auth_free(a);
}

/* Each distinct token is one identity (the owner of async jobs); a token listed twice
 * is one identity; an unknown or missing token is none. */
static void test_identify(void **state)
{
    (void)state;
    char path[64], msg[300];
    temp_file(path, sizeof path, "alpha\nbeta\nalpha\ngamma\n");
    gemmd_auth *a = gemmd_auth_load(path, msg, sizeof msg);
    unlink(path);
    assert_non_null(a);
    assert_int_equal(count(a), 3);
    assert_int_equal(gemmd_auth_identify(a, "Bearer alpha"), 0);
    assert_int_equal(gemmd_auth_identify(a, "Bearer beta"), 1);
    assert_int_equal(gemmd_auth_identify(a, "Bearer gamma"), 2);
    assert_int_equal(gemmd_auth_identify(a, "bearer  gamma"), 2);
    assert_int_equal(gemmd_auth_identify(a, "Bearer delta"), -1);
    assert_int_equal(gemmd_auth_identify(a, "Bearer alph"), -1);
    assert_int_equal(gemmd_auth_identify(a, NULL), -1);
    assert_int_equal(gemmd_auth_identify(NULL, "Bearer alpha"), -1);
    gemmd_auth_free(a);
}

/* "name token" lines name a token; an unnamed one is token<N> (its place among the
 * distinct tokens); the name is never taken for the token. */
static void test_names(void **state)
{
    (void)state;
    char path[64], msg[300];
    temp_file(path, sizeof path, "alice s3cret-a\n  plain-token\n# x\nbob.v2_x-y\tsecret b2\nalice s3cret-a\n");
    gemmd_auth *a = gemmd_auth_load(path, msg, sizeof msg);
    assert_null(a); /* "bob.v2_x-y secret b2": three words */
    assert_non_null(strstr(msg, "line 4"));
    assert_non_null(strstr(msg, "name token"));
    unlink(path);

    temp_file(path, sizeof path, "alice s3cret-a\n  plain-token\n# x\nbob.v2_x-y\tsecret-b2\nalice s3cret-a\n");
    a = gemmd_auth_load(path, msg, sizeof msg);
    unlink(path);
    assert_non_null(a);
    assert_int_equal(count(a), 3);
    assert_int_equal(gemmd_auth_identify(a, "Bearer s3cret-a"), 0);
    assert_int_equal(gemmd_auth_identify(a, "Bearer alice"), -1);
    assert_int_equal(gemmd_auth_identify(a, "Bearer alice s3cret-a"), -1);
    assert_int_equal(gemmd_auth_identify(a, "Bearer plain-token"), 1);
    assert_int_equal(gemmd_auth_identify(a, "Bearer secret-b2"), 2);
    assert_string_equal(gemmd_auth_name(a, 0), "alice");
    assert_string_equal(gemmd_auth_name(a, 1), "token2");
    assert_string_equal(gemmd_auth_name(a, 2), "bob.v2_x-y");
    assert_null(gemmd_auth_name(a, 3));
    assert_null(gemmd_auth_name(a, -1));
    assert_null(gemmd_auth_name(NULL, 0));
    gemmd_auth_free(a);

    static const char *const bad[][2] = {
        {"al/ice tok\n", "A-Z a-z 0-9"},
        {"abcdefghijabcdefghijabcdefghijabc tok\n", "1 to 32"}, /* 33 characters */
        {"alice t1\nalice t2\n", "alice is taken"},
        {"t1\ntoken1 t2\n", "token1 is taken"},
        {"anonymous t1\n", "anonymous is taken"},
        {"other t1\n", "other is taken"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        temp_file(path, sizeof path, bad[i][0]);
        a = gemmd_auth_load(path, msg, sizeof msg);
        unlink(path);
        if (a || !strstr(msg, bad[i][1])) fail_msg("%s: got %s, want an error with \"%s\"", bad[i][0], msg, bad[i][1]);
    }
}

static void test_no_auth_allows(void **state)
{
    (void)state;
    assert_int_equal(gemmd_auth_identify(NULL, NULL), -1);
    gemmd_auth_free(NULL);
}

static void test_bad_files(void **state)
{
    (void)state;
    char path[64], msg[300];
    assert_null(gemmd_auth_load("/nonexistent/tokens", msg, sizeof msg));
    assert_non_null(strstr(msg, "/nonexistent/tokens"));

    temp_file(path, sizeof path, "# only comments\n\n");
    assert_null(gemmd_auth_load(path, msg, sizeof msg));
    assert_non_null(strstr(msg, "no token"));
    unlink(path);

    char big[400];
    memset(big, 'x', 300);
    big[300] = '\n';
    big[301] = '\0';
    temp_file(path, sizeof path, big);
    assert_null(gemmd_auth_load(path, msg, sizeof msg));
    assert_non_null(strstr(msg, "longer than"));
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_and_check),
        cmocka_unit_test(test_identify),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_no_auth_allows),
        cmocka_unit_test(test_bad_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
