/* test_conns.c - when an answer's send deadline needs to know how much of it the client has
 * taken (gemmd_answer_needs_progress): only when the answer is larger than what a client
 * taking it at min_rate_kb receives within send_timeout. Smaller answers are handed to
 * libmicrohttpd as they lie (respond.c), and their deadline is send_timeout alone. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "config.h"
#include "conns.h"

static gemmd_conns_config cfg_of(double send_s, double rate_kb)
{
    gemmd_conns_config c;
    memset(&c, 0, sizeof c);
    c.send_timeout_s = send_s;
    c.min_rate = rate_kb * 1024.0;
    return c;
}

/* The daemon's defaults: send_timeout 30 s, min_rate_kb 64: 1,966,080 bytes is the edge. */
static void test_defaults_edge(void **st)
{
    (void)st;
    gemmd_config d;
    gemmd_config_defaults(&d);
    gemmd_conns_config c = cfg_of(d.send_timeout_s, d.min_rate_kb);
    const uint64_t edge = (uint64_t)d.send_timeout_s * (uint64_t)d.min_rate_kb * 1024u;
    assert_int_equal(edge, 1966080);
    assert_int_equal(gemmd_answer_needs_progress(&c, 1), 0);
    assert_int_equal(gemmd_answer_needs_progress(&c, 64 * 64 * 4), 0);   /* 64² float32 */
    assert_int_equal(gemmd_answer_needs_progress(&c, 256 * 256 * 4), 0); /* 256² */
    assert_int_equal(gemmd_answer_needs_progress(&c, edge), 0);
    assert_int_equal(gemmd_answer_needs_progress(&c, edge + 1), 1);
    assert_int_equal(gemmd_answer_needs_progress(&c, 1024ull * 1024 * 4), 1); /* 1024² */
    assert_int_equal(gemmd_answer_needs_progress(&c, UINT64_MAX), 1);
}

/* No send deadline, or no minimum rate: progress never matters. */
static void test_no_deadline(void **st)
{
    (void)st;
    gemmd_conns_config none = cfg_of(0, 64), free_rate = cfg_of(30, 0), both = cfg_of(0, 0);
    assert_int_equal(gemmd_answer_needs_progress(&none, UINT64_MAX), 0);
    assert_int_equal(gemmd_answer_needs_progress(&free_rate, UINT64_MAX), 0);
    assert_int_equal(gemmd_answer_needs_progress(&both, UINT64_MAX), 0);
}

/* A short deadline (the hostile-load test's 2 s at 64 KiB/s): 128 KiB is the edge, so a
 * 256² float32 answer (256 KiB) reports its progress. */
static void test_short_deadline(void **st)
{
    (void)st;
    gemmd_conns_config c = cfg_of(2, 64);
    assert_int_equal(gemmd_answer_needs_progress(&c, 128 * 1024), 0);
    assert_int_equal(gemmd_answer_needs_progress(&c, 128 * 1024 + 1), 1);
    assert_int_equal(gemmd_answer_needs_progress(&c, 256 * 256 * 4), 1);
}

/* A connection the registry does not know (NULL): nothing to report to. */
static void test_unknown_connection(void **st)
{
    (void)st;
    assert_int_equal(gemmd_conn_needs_progress(NULL, UINT64_MAX), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_edge),
        cmocka_unit_test(test_no_deadline),
        cmocka_unit_test(test_short_deadline),
        cmocka_unit_test(test_unknown_connection),
    };
    return cmocka_run_group_tests_name("conns", tests, NULL, NULL);
}
