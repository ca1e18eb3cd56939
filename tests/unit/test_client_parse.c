/*
 * test_client_parse.c - libgemm's parsers: shapes, X-Gemm-Shape, Server-Timing,
 * Retry-After, CSV/TSV text matrices (parse and write back exactly), and the server URL
 * forms gemm_client_new takes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "client_internal.h"
#include "gemm_util.h"

static void test_shape(void **state)
{
    (void)state;
    uint64_t d[3];
    assert_int_equal(gemm_client_parse_shape("512x256", d), 2);
    assert_int_equal(d[0], 512);
    assert_int_equal(d[1], 256);
    assert_int_equal(gemm_client_parse_shape("3X4x5", d), 3);
    assert_int_equal(d[0], 3);
    assert_int_equal(d[1], 4);
    assert_int_equal(d[2], 5);
    assert_int_equal(gemm_client_parse_shape("7,9", d), 2);
    assert_int_equal(d[1], 9);
    assert_int_equal(gemm_client_parse_shape("2*3", d), 2);
    assert_int_equal(gemm_client_parse_shape("18446744073709551615x1", d), 2);
    assert_true(d[0] == UINT64_MAX);
    /* refusals */
    const char *bad[] = {"", "5", "x5", "5x", "5xx6", "0x5", "5x0", "-5x3", "5x3x", "1x2x3x4", "a x b",
                         "5 x 3", "18446744073709551616x1", "5x3 "};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (gemm_client_parse_shape(bad[i], d) != -1) fail_msg("\"%s\" was accepted", bad[i]);
    }
    assert_int_equal(gemm_client_parse_shape(NULL, d), -1);
}

static void test_shape_header(void **state)
{
    (void)state;
    uint64_t r = 0, c = 0;
    assert_int_equal(gemm_client_parse_shape_header("512,256", &r, &c), 0);
    assert_int_equal(r, 512);
    assert_int_equal(c, 256);
    assert_int_equal(gemm_client_parse_shape_header("[3, 4]", &r, &c), 0);
    assert_int_equal(r, 3);
    assert_int_equal(c, 4);
    assert_int_equal(gemm_client_parse_shape_header("10x20", &r, &c), 0);
    assert_int_equal(c, 20);
    assert_int_equal(gemm_client_parse_shape_header("1,2,3", &r, &c), -1);
    assert_int_equal(gemm_client_parse_shape_header("7", &r, &c), -1);
    assert_int_equal(gemm_client_parse_shape_header("", &r, &c), -1);
    assert_int_equal(gemm_client_parse_shape_header("-1,2", &r, &c), -1);
    assert_int_equal(gemm_client_parse_shape_header("99999999999999999999,1", &r, &c), -1);
}

static void reset(gemm_timing *t)
{
    memset(t, 0, sizeof *t);
    t->recv_ms = t->decode_ms = t->queue_ms = t->h2d_ms = t->kernel_ms = t->d2h_ms = t->encode_ms =
        t->total_ms = -1;
}

static void test_server_timing(void **state)
{
    (void)state;
    gemm_timing t;
    reset(&t);
    int n = gemm_client_parse_server_timing("recv;dur=1.5, decode;dur=0.25, queue;dur=0.02, h2d;dur=1.21, "
                                            "kernel;dur=2.67, d2h;dur=1.18, encode;dur=0.5, total;dur=5.3",
                                            &t);
    assert_int_equal(n, 8);
    assert_float_equal(t.recv_ms, 1.5, 1e-12);
    assert_float_equal(t.decode_ms, 0.25, 1e-12);
    assert_float_equal(t.queue_ms, 0.02, 1e-12);
    assert_float_equal(t.h2d_ms, 1.21, 1e-12);
    assert_float_equal(t.kernel_ms, 2.67, 1e-12);
    assert_float_equal(t.d2h_ms, 1.18, 1e-12);
    assert_float_equal(t.encode_ms, 0.5, 1e-12);
    assert_float_equal(t.total_ms, 5.3, 1e-12);

    /* descriptions, unknown metrics, missing durations, odd spacing and case */
    reset(&t);
    n = gemm_client_parse_server_timing("cache;desc=\"hit\", Kernel;desc=k;dur=3,total ;dur=4, queue, db;dur=9", &t);
    assert_int_equal(n, 2); /* whitespace before ';' is allowed (OWS) */
    assert_float_equal(t.kernel_ms, 3, 1e-12);
    assert_float_equal(t.total_ms, 4, 1e-12);
    assert_float_equal(t.queue_ms, -1, 0);
    reset(&t);
    n = gemm_client_parse_server_timing("total;dur=abc, kernel;dur=-2, h2d;dur=7", &t);
    assert_int_equal(n, 1);
    assert_float_equal(t.total_ms, -1, 0);
    assert_float_equal(t.kernel_ms, -1, 0);
    assert_float_equal(t.h2d_ms, 7, 1e-12);
    reset(&t);
    assert_int_equal(gemm_client_parse_server_timing("", &t), 0);
    assert_int_equal(gemm_client_parse_server_timing(NULL, &t), 0);
    assert_int_equal(gemm_client_parse_server_timing(",,, ;;;", &t), 0);
}

static void test_retry_after(void **state)
{
    (void)state;
    assert_int_equal(gemm_client_parse_retry_after("1", 0), 1000);
    assert_int_equal(gemm_client_parse_retry_after("0", 0), 0);
    assert_int_equal(gemm_client_parse_retry_after("2.5", 0), 2500);
    assert_int_equal(gemm_client_parse_retry_after("999999", 0), 86400L * 1000);
    assert_int_equal(gemm_client_parse_retry_after("-3", 0), -1);
    assert_int_equal(gemm_client_parse_retry_after("soon", 0), -1);
    assert_int_equal(gemm_client_parse_retry_after("", 0), -1);
    assert_int_equal(gemm_client_parse_retry_after(NULL, 0), -1);
    /* Sun, 06 Nov 1994 08:49:37 GMT = 784111777 */
    assert_int_equal(gemm_client_parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", 784111777.0 - 4), 4000);
    assert_int_equal(gemm_client_parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", 784111777.0 + 100), 0);
}

static void test_text_parse(void **state)
{
    (void)state;
    const char *csv = "# a comment\n1, 2.5,3\r\n\n-4,5e1 ,6\n";
    uint64_t r, c;
    void *data;
    gemm_text_error e;
    assert_int_equal(gemm_client_text_parse(csv, strlen(csv), 0, GEMM_DTYPE_F64, &r, &c, &data, &e), 0);
    assert_int_equal(r, 2);
    assert_int_equal(c, 3);
    const double want[] = {1, 2.5, 3, -4, 50, 6};
    for (int i = 0; i < 6; i++) assert_float_equal(((double *)data)[i], want[i], 0);
    free(data);

    const char *tsv = "1\t2\n3\t4";
    assert_int_equal(gemm_client_text_parse(tsv, strlen(tsv), 0, GEMM_DTYPE_I32, &r, &c, &data, &e), 0);
    assert_int_equal(r, 2);
    assert_int_equal(c, 2);
    assert_int_equal(((int32_t *)data)[3], 4);
    free(data);

    const char *ws = "  1   2 3\n4 5\t6  \n";
    assert_int_equal(gemm_client_text_parse(ws, strlen(ws), ' ', GEMM_DTYPE_F32, &r, &c, &data, &e), 0);
    assert_int_equal(r, 2);
    assert_int_equal(c, 3);
    assert_float_equal(((float *)data)[5], 6, 0);
    free(data);

    const char *ints = "2147483647,-2147483648,3.0\n";
    assert_int_equal(gemm_client_text_parse(ints, strlen(ints), ',', GEMM_DTYPE_I32, &r, &c, &data, &e), 0);
    assert_int_equal(((int32_t *)data)[0], INT32_MAX);
    assert_int_equal(((int32_t *)data)[1], INT32_MIN);
    assert_int_equal(((int32_t *)data)[2], 3);
    free(data);

    /* not NUL-terminated: the parser must stop at len */
    char buf[8] = {'1', ',', '2', '\n', '3', ',', '4', '9'};
    assert_int_equal(gemm_client_text_parse(buf, 7, ',', GEMM_DTYPE_F64, &r, &c, &data, &e), 0);
    assert_float_equal(((double *)data)[3], 4, 0);
    free(data);
}

static void expect_text_error(const char *text, char delim, gemm_dtype d, int line, const char *needle)
{
    uint64_t r, c;
    void *data = (void *)1;
    gemm_text_error e;
    if (gemm_client_text_parse(text, strlen(text), delim, d, &r, &c, &data, &e) != -1)
        fail_msg("\"%s\" was accepted", text);
    assert_null(data);
    if (e.line != line) fail_msg("\"%s\": line %d, expected %d (%s)", text, e.line, line, e.message);
    if (!strstr(e.message, needle)) fail_msg("\"%s\": message \"%s\" lacks \"%s\"", text, e.message, needle);
}

static void test_text_errors(void **state)
{
    (void)state;
    expect_text_error("1,2\n3\n", ',', GEMM_DTYPE_F64, 2, "has 1 values");
    expect_text_error("1,x\n", ',', GEMM_DTYPE_F64, 1, "\"x\"");
    expect_text_error("1,,2\n", ',', GEMM_DTYPE_F64, 1, "value 2");
    expect_text_error("1.5\n", ',', GEMM_DTYPE_I32, 1, "int32");
    expect_text_error("2147483648\n", ',', GEMM_DTYPE_I32, 1, "int32");
    expect_text_error("1e39\n", ',', GEMM_DTYPE_F32, 1, "float32");
    expect_text_error("1e999\n", ',', GEMM_DTYPE_F64, 1, "float64");
    expect_text_error("# only a comment\n\n", ',', GEMM_DTYPE_F64, 0, "no values");
    expect_text_error("", ',', GEMM_DTYPE_F64, 0, "no values");
    expect_text_error("1,2\n3,4,\n", ',', GEMM_DTYPE_F64, 2, "value 3");
}

static void test_text_round_trip(void **state)
{
    (void)state;
    const double vals[] = {0.1, -1e-300, 1.0 / 3.0, 6.02214076e23, -0.0, 123456789.123456789};
    char *out = NULL;
    size_t outlen = 0;
    FILE *f = open_memstream(&out, &outlen);
    assert_non_null(f);
    assert_int_equal(gemm_client_text_write(f, '\t', GEMM_DTYPE_F64, 2, 3, vals), 0);
    fclose(f);
    uint64_t r, c;
    void *data;
    gemm_text_error e;
    assert_int_equal(gemm_client_text_parse(out, outlen, 0, GEMM_DTYPE_F64, &r, &c, &data, &e), 0);
    assert_int_equal(r, 2);
    assert_int_equal(c, 3);
    assert_memory_equal(data, vals, sizeof vals); /* bit-exact, -0.0 included */
    free(data);
    free(out);

    const float fv[] = {1.1f, 3.4028235e38f, 1e-45f, -2.5f};
    out = NULL;
    f = open_memstream(&out, &outlen);
    assert_int_equal(gemm_client_text_write(f, ',', GEMM_DTYPE_F32, 1, 4, fv), 0);
    fclose(f);
    assert_int_equal(gemm_client_text_parse(out, outlen, ',', GEMM_DTYPE_F32, &r, &c, &data, &e), 0);
    assert_memory_equal(data, fv, sizeof fv);
    free(data);
    free(out);

    const int32_t iv[] = {INT32_MIN, -1, 0, INT32_MAX};
    out = NULL;
    f = open_memstream(&out, &outlen);
    assert_int_equal(gemm_client_text_write(f, ',', GEMM_DTYPE_I32, 4, 1, iv), 0);
    fclose(f);
    assert_string_equal(out, "-2147483648\n-1\n0\n2147483647\n");
    assert_int_equal(gemm_client_text_parse(out, outlen, ',', GEMM_DTYPE_I32, &r, &c, &data, &e), 0);
    assert_int_equal(r, 4);
    assert_int_equal(c, 1);
    assert_memory_equal(data, iv, sizeof iv);
    free(data);
    free(out);
}

static void test_client_arguments(void **state)
{
    (void)state;
    gemm_client_error err;
    assert_null(gemm_client_new(NULL, NULL, &err));
    assert_int_equal(err.kind, GEMM_CLIENT_E_ARGUMENT);
    assert_null(gemm_client_new("ftp://localhost:8080", NULL, &err));
    assert_int_equal(err.kind, GEMM_CLIENT_E_ARGUMENT);
    assert_non_null(strstr(err.message, "host:port"));
    /* host:port and [v6]:port are http://, as in the Python client; a scheme is kept */
    static const char *const urls[][2] = {
        {"localhost:8080", "http://localhost:8080"},    {"[::1]:8080/", "http://[::1]:8080"},
        {"gpu-box", "http://gpu-box"},                  {"HTTPS://h:1", "HTTPS://h:1"},
        {"http://127.0.0.1:8080//", "http://127.0.0.1:8080"},
    };
    for (size_t i = 0; i < sizeof urls / sizeof urls[0]; i++) {
        gemm_client *h = gemm_client_new(urls[i][0], NULL, &err);
        assert_non_null(h);
        assert_string_equal(h->base, urls[i][1]);
        gemm_client_free(h);
    }

    gemm_client_options o;
    gemm_client_options_init(&o);
    o.token = "t0ken";
    gemm_client *c = gemm_client_new("http://127.0.0.1:1/", &o, &err);
    assert_non_null(c);
    double a = 1, b = 2, cc = 0;
    gemm_request r = GEMM_REQUEST_INIT;
    r.dtype = GEMM_DTYPE_F64;
    r.k = r.n = 1;
    r.a = &a;
    r.b = &b;
    r.c = &cc;
    /* checked before anything is sent */
    r.m = 0;
    assert_int_equal(gemm_client_multiply(c, &r, NULL, &err), -1);
    assert_int_equal(err.kind, GEMM_CLIENT_E_ARGUMENT);
    r.m = 1;
    r.c = NULL;
    assert_int_equal(gemm_client_multiply(c, &r, NULL, &err), -1);
    assert_int_equal(err.kind, GEMM_CLIENT_E_ARGUMENT);
    r.c = &cc;
    r.kernel = "tiled&tile=8";
    assert_int_equal(gemm_client_multiply(c, &r, NULL, &err), -1);
    assert_int_equal(err.kind, GEMM_CLIENT_E_ARGUMENT);
    r.kernel = NULL;
    r.m = UINT64_MAX / 2;
    assert_int_equal(gemm_client_multiply(c, &r, NULL, &err), -1);
    assert_int_equal(err.kind, GEMM_CLIENT_E_ARGUMENT);
    assert_int_equal(gemm_client_job_status(c, "../admin", &(gemm_job_info){0}, &err), -1);
    assert_int_equal(err.kind, GEMM_CLIENT_E_ARGUMENT);
    assert_int_equal(gemm_client_job_delete(c, "", &err), -1);
    assert_int_equal(err.kind, GEMM_CLIENT_E_ARGUMENT);
    char *body = NULL;
    assert_int_equal(gemm_client_get(c, "no-slash", &body, NULL, &err), -1);
    assert_null(body);
    gemm_client_free(c);
    gemm_client_free(NULL);
    assert_string_equal(gemm_client_error_kind_name(GEMM_CLIENT_E_TIMEOUT), "timeout");
    assert_string_equal(gemm_client_job_state_name(GEMM_CLIENT_JOB_DONE), "done");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shape),           cmocka_unit_test(test_shape_header),
        cmocka_unit_test(test_server_timing),   cmocka_unit_test(test_retry_after),
        cmocka_unit_test(test_text_parse),      cmocka_unit_test(test_text_errors),
        cmocka_unit_test(test_text_round_trip), cmocka_unit_test(test_client_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
