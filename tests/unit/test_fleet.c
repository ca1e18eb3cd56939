/* test_fleet.c - the busy fraction over a window (synthetic clock and counters), and the
 * gauges /metrics gets from fleet.c on a real CPU engine. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "fleet.h"
#include "instance.h"

#define W (GEMMD_UTIL_WINDOW_S * 1000.0)

static void near(double got, double want)
{
    if (fabs(got - want) > 1e-9) fail_msg("got %.12f, want %.12f", got, want);
}

static void test_from_start(void **state)
{
    (void)state;
    gemmd_util u;
    double busy[2] = {0, 0}, f[2] = {-1, -1};
    gemmd_util_init(&u, 1000.0);
    gemmd_util_update(&u, 1000.0, 2, busy, f); /* no time has passed */
    near(f[0], 0);
    near(f[1], 0);
    busy[0] = 5.0;  /* 5 s busy in the first 10 s */
    busy[1] = 10.0; /* always busy */
    gemmd_util_update(&u, 11000.0, 2, busy, f);
    near(f[0], 0.5);
    near(f[1], 1.0);
    /* clamped: a counter that went back (device rebuilt), or CPU workers summed past 1;
     * at 80 s the baseline is the sample of 11 s (the newest one a window old) */
    busy[0] = 1.0;
    busy[1] = 1000.0;
    gemmd_util_update(&u, 80000.0, 2, busy, f);
    near(f[0], 0);
    near(f[1], 1);
}

static void test_window_slides(void **state)
{
    (void)state;
    gemmd_util u;
    double busy[1] = {0}, f[1];
    gemmd_util_init(&u, 0);
    /* busy for the first 100 s, then idle: sampled every 5 s */
    double t = 0;
    for (; t <= 100000.0; t += 5000.0) {
        busy[0] = t / 1000.0;
        gemmd_util_update(&u, t, 1, busy, f);
        if (t >= 5000.0) near(f[0], 1.0);
    }
    for (; t <= 200000.0; t += 5000.0) {
        gemmd_util_update(&u, t, 1, busy, f);
        /* idle since 100 s: the window's busy part is what is left of it before then */
        double start = t - W; /* the baseline is the newest sample at least W old */
        double base_t = floor(start / 5000.0) * 5000.0;
        double want = base_t < 100000.0 ? (100000.0 - base_t) / (t - base_t) : 0.0;
        near(f[0], want);
    }
    near(f[0], 0.0);
}

static void test_one_sample_a_second(void **state)
{
    (void)state;
    gemmd_util u;
    double busy[1] = {0}, f[1];
    gemmd_util_init(&u, 0);
    /* scraped 10 times a second for 200 s: samples stay a second apart, so the ring still
     * reaches a full window back */
    for (int i = 1; i <= 2000; i++) {
        double t = i * 100.0;
        busy[0] = t >= 150000.0 ? 150.0 : t / 1000.0; /* busy until 150 s */
        gemmd_util_update(&u, t, 1, busy, f);
        assert_true(u.count <= GEMMD_UTIL_SAMPLES);
    }
    /* at 200 s the window starts at about 140 s: about 10 of its 60 s were busy */
    assert_true(f[0] > 9.0 / 61.0 && f[0] < 11.0 / 60.0);
}

static void test_sparse_scrapes(void **state)
{
    (void)state;
    gemmd_util u;
    double busy[1] = {0}, f[1];
    gemmd_util_init(&u, 0);
    /* one scrape every 5 minutes, half busy: each sees the last interval */
    for (int i = 1; i <= 5; i++) {
        busy[0] = i * 150.0;
        gemmd_util_update(&u, i * 300000.0, 1, busy, f);
        near(f[0], 0.5);
    }
}

static void test_render_cpu(void **state)
{
    (void)state;
    gemm_engine_config cfg;
    gemm_engine_config_defaults(&cfg);
    snprintf(cfg.backend, sizeof cfg.backend, "cpu");
    cfg.threads = 1;
    cfg.queue_depth = 7;
    gemm_engine_err err;
    gemm_engine *e = gemm_engine_open(&cfg, &err);
    assert_non_null(e);
    assert_int_equal(gemmd_instance_set("node-9"), 0);
    gemmd_fleet_start(gemm_now_ms());
    gemm_buf b;
    gemm_buf_init(&b);
    gemmd_fleet_render(&b, e, 3);
    assert_false(b.failed);
    gemm_buf_puts(&b, "");
    const char *want[] = {
        "# TYPE gemmd_instance_info gauge\n", "gemmd_instance_info{instance_id=\"node-9\"} 1\n",
        "# TYPE gemmd_requests_in_flight gauge\n", "gemmd_requests_in_flight 3\n",
        "gemmd_queue_capacity 7\n", "gemmd_workers 1\n",
        "# TYPE gemmd_device_utilization gauge\n", "gemmd_device_utilization{device=\"0\"} 0.0000\n",
    };
    char *text = calloc(1, b.len + 1);
    assert_non_null(text);
    memcpy(text, b.data, b.len);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(text, want[i])) fail_msg("no '%s' in:\n%s", want[i], text);
    free(text);
    gemm_buf_free(&b);
    gemm_buf_init(&b);
    gemmd_fleet_render(&b, e, -1); /* never below 0 */
    text = calloc(1, b.len + 1);
    assert_non_null(text);
    memcpy(text, b.data, b.len);
    assert_non_null(strstr(text, "gemmd_requests_in_flight 0\n"));
    free(text);
    gemm_buf_free(&b);
    gemmd_instance_set("");
    gemm_engine_close(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_from_start),     cmocka_unit_test(test_window_slides),
        cmocka_unit_test(test_one_sample_a_second), cmocka_unit_test(test_sparse_scrapes),
        cmocka_unit_test(test_render_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
