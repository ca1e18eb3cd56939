/* test_choose.c - the BLAS preload's choice of side (client/blas/choose.c): the server first,
 * then the host unless even a host at its best would lose, then the smaller prediction from
 * the learned costs (running means), a close loser re-measured every 32 decisions and a far
 * one never, and a kernel time the server did not report counted as link time. The file is
 * compiled in, so its state starts empty. */
#define _GNU_SOURCE /* choose.c: sched_getaffinity */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "../../client/blas/choose.c"

static void learn_then_choose(void **state)
{
    (void)state;
    gb_choice c = gb_choose(GB_F32, 1e9, 1e7);
    assert_true(c.server);
    assert_non_null(strstr(c.why, "server's speed is not known"));

    gb_learn_server(GB_F32, 1e9, 1e7, 10, 2); /* w = 8e-7 ms/byte, g = 2e-9 ms/flop */
    c = gb_choose(GB_F32, 1e9, 1e7);
    assert_false(c.server); /* a host at its best: 10 ms on one core, not 2x the server's 10 */
    assert_non_null(strstr(c.why, "host's speed is not known"));
    assert_float_equal(c.server_ms, 10, 1e-9);

    gb_learn_host(GB_F32, 1e9, 30);
    gb_learn_host(GB_F32, 1e9, 10); /* the running mean: 20 ms */
    c = gb_choose(GB_F32, 1e9, 1e7);
    assert_true(c.server);
    assert_float_equal(c.host_ms, 20, 1e-9);
    assert_non_null(strstr(c.why, "predicted faster on the server"));
    /* half the bytes, the same flops: 4 + 2 ms against the host's 20 */
    c = gb_choose(GB_F32, 1e9, 5e6);
    assert_float_equal(c.server_ms, 6, 1e-9);
    /* a product with ten times the bytes per flop: the host wins */
    c = gb_choose(GB_F32, 1e8, 1e7);
    assert_false(c.server);
    assert_non_null(strstr(c.why, "predicted faster on the host"));
    /* a far loser (2x) is never re-measured */
    for (int i = 0; i < 100; i++) assert_true(gb_choose(GB_F32, 1e9, 1e7).server);
}

static void close_loser_and_prior(void **state)
{
    (void)state;
    /* a huge product: even the best host (1e12 flops at 50 GFLOP/s per core) loses */
    gb_learn_server(GB_F64, 1e12, 1e7, 10, -1); /* kernel not reported: all 10 ms are link */
    gb_choice c = gb_choose(GB_F64, 1e12, 1e7);
    assert_true(c.server);
    assert_non_null(strstr(c.why, "slower even at its best"));
    assert_float_equal(c.server_ms, 10, 1e-9);

    gb_learn_host(GB_F64, 1e9, 12); /* 12 ms against the server's 10 at 1e7 bytes */
    int host_at = -1;
    for (int i = 1; i <= 40; i++) {
        c = gb_choose(GB_F64, 1e9, 1e7);
        if (!c.server) {
            assert_int_equal(host_at, -1);
            host_at = i;
            assert_non_null(strstr(c.why, "re-measuring"));
        }
    }
    assert_int_equal(host_at, GB_RECHECK_EVERY);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(learn_then_choose),
        cmocka_unit_test(close_loser_and_prior),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
