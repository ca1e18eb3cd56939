/* test_instance.c - instance_id (the config key, its default) and the ids that carry it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "instance.h"
#include "jobs.h"

static int all_hex(const char *s, size_t n)
{
    return strspn(s, "0123456789abcdef") >= n;
}

static void test_check_names(void **state)
{
    (void)state;
    char why[128];
    const char *good[] = {"a", "gemmd-a", "gpu01-8080", "gemmd-5d8f7c9b6d-x2k9p", "Node_7.rack2", "0"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        if (gemmd_instance_check(good[i], why, sizeof why) != 0) fail_msg("'%s' refused: %s", good[i], why);
    char longest[GEMMD_INSTANCE_MAX + 2];
    memset(longest, 'x', GEMMD_INSTANCE_MAX);
    longest[GEMMD_INSTANCE_MAX] = '\0';
    assert_int_equal(gemmd_instance_check(longest, why, sizeof why), 0);
    longest[GEMMD_INSTANCE_MAX] = 'x';
    longest[GEMMD_INSTANCE_MAX + 1] = '\0';
    assert_int_equal(gemmd_instance_check(longest, why, sizeof why), -1);
    assert_non_null(strstr(why, "at most 62"));
    const char *bad[] = {"", "-a", "a-", ".a", "a.", "a b", "a/b", "a%2f", "a?b", "é", "a:b", "_a"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        why[0] = '\0';
        if (gemmd_instance_check(bad[i], why, sizeof why) != -1 || !why[0])
            fail_msg("'%s' accepted (or no reason given)", bad[i]);
        assert_int_equal(gemmd_instance_set(bad[i][0] ? bad[i] : "a b"), -1);
    }
}

static void test_default_from_host(void **state)
{
    (void)state;
    char out[GEMMD_INSTANCE_MAX + 1], why[128];
    gemmd_instance_from_host(out, sizeof out, "gpu01.lab.example.org", 8080);
    assert_string_equal(out, "gpu01-8080");
    gemmd_instance_from_host(out, sizeof out, "GPU-Box_2", 9000);
    assert_string_equal(out, "gpu-box_2-9000");
    gemmd_instance_from_host(out, sizeof out, "", 8080);
    assert_string_equal(out, "gemmd-8080");
    gemmd_instance_from_host(out, sizeof out, "--", 1);
    assert_string_equal(out, "gemmd-1");
    gemmd_instance_from_host(out, sizeof out, "a b!c-", 65535);
    assert_string_equal(out, "a-b-c-65535");
    char host[200];
    memset(host, 'h', sizeof host - 1);
    host[sizeof host - 1] = '\0';
    gemmd_instance_from_host(out, sizeof out, host, 65535);
    assert_int_equal(strlen(out), GEMMD_INSTANCE_MAX);
    assert_string_equal(out + GEMMD_INSTANCE_MAX - 6, "-65535");
    assert_int_equal(gemmd_instance_check(out, why, sizeof why), 0);
    gemmd_instance_default(out, sizeof out, 8123);
    assert_int_equal(gemmd_instance_check(out, why, sizeof why), 0);
    assert_non_null(strstr(out, "-8123"));
}

static void test_ids(void **state)
{
    (void)state;
    char id[GEMMD_ID_MAX + 1], id2[GEMMD_ID_MAX + 1];
    /* no name: the 32 hex digits alone */
    assert_int_equal(gemmd_instance_set(""), 0);
    assert_string_equal(gemmd_instance_get(), "");
    assert_int_equal(gemmd_instance_new_id(id, sizeof id), 0);
    assert_int_equal(strlen(id), GEMMD_ID_RANDOM_HEX);
    assert_true(all_hex(id, GEMMD_ID_RANDOM_HEX));
    assert_true(gemmd_instance_id_valid(id, strlen(id)));

    assert_int_equal(gemmd_instance_set("gemmd-5d8f-x2k9p"), 0);
    assert_string_equal(gemmd_instance_get(), "gemmd-5d8f-x2k9p");
    assert_int_equal(gemmd_instance_new_id(id, sizeof id), 0);
    assert_int_equal(gemmd_instance_new_id(id2, sizeof id2), 0);
    assert_string_not_equal(id, id2);
    assert_int_equal(strlen(id), strlen("gemmd-5d8f-x2k9p-") + GEMMD_ID_RANDOM_HEX);
    assert_memory_equal(id, "gemmd-5d8f-x2k9p-", 17);
    assert_true(all_hex(id + 17, GEMMD_ID_RANDOM_HEX));
    assert_true(gemmd_instance_id_valid(id, strlen(id)));
    /* too small a buffer */
    assert_int_equal(gemmd_instance_new_id(id2, 40), -1);

    /* the longest name gives the longest id, which fits every id buffer */
    char longest[GEMMD_INSTANCE_MAX + 1];
    memset(longest, 'z', GEMMD_INSTANCE_MAX);
    longest[GEMMD_INSTANCE_MAX] = '\0';
    assert_int_equal(gemmd_instance_set(longest), 0);
    assert_int_equal(gemmd_instance_new_id(id, sizeof id), 0);
    assert_int_equal(strlen(id), GEMMD_ID_MAX);
    assert_true(gemmd_instance_id_valid(id, strlen(id)));
    assert_true(GEMMD_JOB_ID_LEN >= GEMMD_ID_MAX);
    assert_int_equal(gemmd_instance_set(""), 0);
}

static void test_id_shapes(void **state)
{
    (void)state;
    const char *hex = "0123456789abcdef0123456789ABCDEF";
    char buf[256];
    assert_true(gemmd_instance_id_valid(hex, 32));
    snprintf(buf, sizeof buf, "other-node-%s", hex); /* another instance's id has the shape too */
    assert_true(gemmd_instance_id_valid(buf, strlen(buf)));
    snprintf(buf, sizeof buf, "a-%s", hex);
    assert_true(gemmd_instance_id_valid(buf, strlen(buf)));
    const char *bad[] = {
        "",
        "0123456789abcdef0123456789abcde",   /* 31 */
        "0123456789abcdef0123456789abcdef0", /* 33 hex: no separator */
        "0123456789abcdef0123456789abcdeg",
        "-0123456789abcdef0123456789abcdef",
        "a_0123456789abcdef0123456789abcdef",
        "a--0123456789abcdef0123456789abcdef",
        "a b-0123456789abcdef0123456789abcdef",
        "../0123456789abcdef0123456789abcdef",
        "a/-0123456789abcdef0123456789abcdef",
        "nonsense",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (gemmd_instance_id_valid(bad[i], strlen(bad[i]))) fail_msg("'%s' taken for an id", bad[i]);
    memset(buf, 'a', 63);
    snprintf(buf + 63, sizeof buf - 63, "-%s", hex); /* instance part 63 long: too long */
    assert_false(gemmd_instance_id_valid(buf, strlen(buf)));
    /* n is honoured: a longer string cut at an id's end */
    snprintf(buf, sizeof buf, "%s/result", hex);
    assert_true(gemmd_instance_id_valid(buf, 32));
    assert_false(gemmd_instance_id_valid(buf, strlen(buf)));
    /* the same id, or not: a byte anywhere, a prefix, an instance part in front */
    snprintf(buf, sizeof buf, "%s", hex);
    assert_true(gemmd_instance_id_same(buf, hex));
    buf[31] = 'e';
    assert_false(gemmd_instance_id_same(buf, hex));
    buf[31] = 'F', buf[0] = '1';
    assert_false(gemmd_instance_id_same(buf, hex));
    assert_false(gemmd_instance_id_same("0123456789abcdef", hex));
    snprintf(buf, sizeof buf, "a-%s", hex);
    assert_false(gemmd_instance_id_same(buf, hex));
    assert_true(gemmd_instance_id_same("", ""));
}

static void test_log_len(void **state)
{
    (void)state;
    const char *plain = "0123456789abcdef0123456789abcdef";
    const char *named = "gemmd-a-0123456789abcdef0123456789abcdef";
    assert_int_equal(gemmd_instance_id_log_len(plain, 8), 8);
    assert_int_equal(gemmd_instance_id_log_len(named, 8), 16); /* "gemmd-a-" and 8 digits */
    assert_int_equal(gemmd_instance_id_log_len(named, 0), 8);
    assert_int_equal(gemmd_instance_id_log_len(named, 99), (int)strlen(named));
    assert_int_equal(gemmd_instance_id_log_len("nonsense-but-long-enough-to-matter", 8), 8);
    assert_int_equal(gemmd_instance_id_log_len("abc", 8), 3);
}

static void test_config_key(void **state)
{
    (void)state;
    gemmd_config c;
    char msg[1024];
    gemmd_config_defaults(&c);
    assert_string_equal(c.instance_id, "");
    assert_int_equal(gemmd_config_set(&c, "instance_id", "gemmd-b", msg, sizeof msg), 0);
    assert_string_equal(c.instance_id, "gemmd-b");
    gemmd_config_resolve_instance(&c); /* set: kept */
    assert_string_equal(c.instance_id, "gemmd-b");
    assert_int_equal(gemmd_config_set(&c, "instance_id", "bad/name", msg, sizeof msg), -1);
    assert_non_null(strstr(msg, "instance_id"));
    assert_non_null(strstr(msg, "position 4"));
    assert_string_equal(c.instance_id, "gemmd-b");
    assert_int_equal(gemmd_config_set(&c, "instance_id", "", msg, sizeof msg), 0);
    c.port = 8181;
    gemmd_config_resolve_instance(&c);
    assert_non_null(strstr(c.instance_id, "-8181"));

    char env0[] = "GEMMD_INSTANCE_ID=pod-7", env1[] = "GEMMD_INSTANCE_ID=-pod";
    char *e_ok[] = {env0, NULL}, *e_bad[] = {env1, NULL};
    gemmd_config_defaults(&c);
    assert_int_equal(gemmd_config_load_env(&c, e_ok, msg, sizeof msg), 0);
    assert_string_equal(c.instance_id, "pod-7");
    assert_int_equal(gemmd_config_load_env(&c, e_bad, msg, sizeof msg), -1);
    assert_non_null(strstr(msg, "GEMMD_INSTANCE_ID"));

    char a0[] = "gemmd", a1[] = "--instance-id", a2[] = "node-3", a3[] = "--config", a4[] = "/dev/null";
    char *argv[] = {a0, a1, a2, a3, a4, NULL};
    char *envp[] = {env0, NULL};
    gemmd_config_defaults(&c);
    assert_int_equal(gemmd_config_from_args(&c, 5, argv, envp), 0);
    assert_string_equal(c.instance_id, "node-3"); /* the flag outranks the environment */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check_names), cmocka_unit_test(test_default_from_host),
        cmocka_unit_test(test_ids),         cmocka_unit_test(test_id_shapes),
        cmocka_unit_test(test_log_len),     cmocka_unit_test(test_config_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
