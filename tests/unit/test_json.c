/* test_json.c - JSON requests (both matrix forms, options, every error with its place
 * named) and the matrix writer (formats, NaN/Inf, round trips), plus gemm_buf. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_codec.h"
#include "json_whole.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

typedef struct {
    int allocs, frees, fail_after; /* fail_after < 0: never fail */
} counting;

static void *count_alloc(void *ctx, size_t bytes)
{
    counting *c = ctx;
    if (c->fail_after >= 0 && c->allocs >= c->fail_after) return NULL;
    c->allocs++;
    return gemm_allocator_host.alloc(NULL, bytes);
}

static void count_free(void *ctx, void *p)
{
    counting *c = ctx;
    c->frees++;
    gemm_allocator_host.free(NULL, p);
}

static void free_ab(gemm_matrix *a, gemm_matrix *b)
{
    gemm_allocator_host.free(NULL, a->data);
    gemm_allocator_host.free(NULL, b->data);
    a->data = b->data = NULL;
}

static int decode(const char *body, gemm_options *opt, gemm_matrix *a, gemm_matrix *b, gemm_err *err)
{
    gemm_err_clear(err);
    return gemm_json_decode_request(body, strlen(body), NULL, &gemm_allocator_host, opt, a, b, err);
}

/* The body must fail with this status, code and a message containing needle. */
static void expect_fail(const char *body, int status, const char *code, const char *needle)
{
    gemm_options opt;
    gemm_matrix a = {0}, b = {0};
    gemm_err err;
    gemm_options_init(&opt);
    int rc = decode(body, &opt, &a, &b, &err);
    if (rc == 0) free_ab(&a, &b);
    if (rc != -1 || err.status != status || strcmp(err.code, code) != 0 || (needle && !strstr(err.message, needle))) {
        fprintf(stderr, "body %s\n  got %d %d %s: %s\n  want %d %s containing \"%s\"\n", body, rc, err.status,
                err.code, err.message, status, code, needle ? needle : "");
        fail();
    }
    assert_null(a.data);
    assert_null(b.data);
}

static char *write_json(const gemm_matrix *m)
{
    gemm_buf b;
    gemm_buf_init(&b);
    gemm_json_write_matrix(&b, m);
    assert_false(b.failed);
    assert_int_equal(strlen(b.data), b.len);
    return b.data; /* the caller frees */
}

/* ---- decoding ------------------------------------------------------------ */

static void test_nested_form_default_float64(void **state)
{
    (void)state;
    gemm_options opt;
    gemm_matrix a, b;
    gemm_err err;
    gemm_options_init(&opt);
    assert_int_equal(decode(" {\"a\": [[1, 2, 3], [4, 5, 6.5]],\n \"b\": [[1], [-2], [3e2]]} \n", &opt, &a, &b, &err), 0);
    assert_int_equal(opt.dtype, GEMM_DTYPE_F64);
    assert_int_equal(a.dtype, GEMM_DTYPE_F64);
    assert_int_equal(a.rows, 2);
    assert_int_equal(a.cols, 3);
    assert_int_equal(b.rows, 3);
    assert_int_equal(b.cols, 1);
    const double *da = a.data, *db = b.data;
    assert_true(da[0] == 1 && da[2] == 3 && da[3] == 4 && da[5] == 6.5);
    assert_true(db[0] == 1 && db[1] == -2 && db[2] == 300);
    char *s = write_json(&a);
    assert_string_equal(s, "[[1,2,3],[4,5,6.5]]"); /* integers print as integers */
    free(s);
    free_ab(&a, &b);
}

static void test_shape_data_form_and_mixed(void **state)
{
    (void)state;
    gemm_options opt;
    gemm_matrix a, b;
    gemm_err err;
    gemm_options_init(&opt);
    assert_int_equal(decode("{\"dtype\": \"int32\", \"a\": {\"data\": [1,2,3,4,5,6], \"shape\": [2,3]},"
                            " \"b\": [[1,0],[0,1],[-2147483648,2147483647]]}",
                            &opt, &a, &b, &err),
                     0);
    assert_int_equal(a.dtype, GEMM_DTYPE_I32);
    assert_int_equal(b.dtype, GEMM_DTYPE_I32);
    assert_int_equal(a.rows, 2);
    assert_int_equal(a.cols, 3);
    const int32_t *ia = a.data, *ib = b.data;
    for (int k = 0; k < 6; k++) assert_int_equal(ia[k], k + 1);
    assert_int_equal(ib[4], INT32_MIN);
    assert_int_equal(ib[5], INT32_MAX);
    free_ab(&a, &b);

    gemm_options_init(&opt);
    assert_int_equal(decode("{\"a\": [[0.1, 2]], \"b\": {\"shape\": [2, 2], \"data\": [1, 2, 3, 4]}, \"dtype\": \"float32\"}",
                            &opt, &a, &b, &err),
                     0);
    assert_int_equal(a.dtype, GEMM_DTYPE_F32);
    assert_true(((float *)a.data)[0] == 0.1f);
    assert_true(((float *)b.data)[3] == 4.0f);
    free_ab(&a, &b);
}

static void test_body_options(void **state)
{
    (void)state;
    gemm_options opt;
    gemm_matrix a, b;
    gemm_err err;
    gemm_options_init(&opt);
    /* what the query set stays unless the body says otherwise */
    assert_int_equal(gemm_options_set(&opt, GEMM_DOOR_QUERY, "kernel", 6, "naive", 5, &err), 0);
    assert_int_equal(gemm_options_set(&opt, GEMM_DOOR_QUERY, "dtype", 5, "int32", 5, &err), 0);
    assert_int_equal(decode("{\"a\": [[1]], \"b\": [[2]], \"tile\": 32, \"math\": \"tf32\", \"dtype\": \"float32\", "
                            "\"panel_of\": \"4\"}", &opt, &a, &b, &err),
                     0);
    assert_int_equal(opt.panel_of, 4); /* every option of the JSON door (options.h) */
    assert_string_equal(opt.kernel, "naive");
    assert_int_equal(opt.tile, 32);
    assert_int_equal(opt.math, GEMM_MATH_TF32);
    assert_int_equal(opt.dtype, GEMM_DTYPE_F32);
    assert_int_equal(a.dtype, GEMM_DTYPE_F32);
    free_ab(&a, &b);

    gemm_options_init(&opt);
    assert_int_equal(gemm_options_set(&opt, GEMM_DOOR_QUERY, "dtype", 5, "int32", 5, &err), 0);
    assert_int_equal(decode("{\"a\": [[1]], \"b\": [[2]], \"tile\": \"16\", \"kernel\": \"tiled\", \"other\": 1}",
                            &opt, &a, &b, &err),
                     0);
    assert_int_equal(opt.tile, 16);
    assert_string_equal(opt.kernel, "tiled");
    assert_int_equal(a.dtype, GEMM_DTYPE_I32); /* the query's dtype */
    free_ab(&a, &b);

    expect_fail("{\"a\": [[1]], \"b\": [[2]], \"tile\": 0}", 422, "bad_option", "tile");
    expect_fail("{\"a\": [[1]], \"b\": [[2]], \"tile\": 1025}", 422, "bad_option", "tile");
    expect_fail("{\"a\": [[1]], \"b\": [[2]], \"tile\": 1.5}", 422, "bad_option", "tile");
    expect_fail("{\"a\": [[1]], \"b\": [[2]], \"tile\": -16}", 422, "bad_option", "tile");
    expect_fail("{\"a\": [[1]], \"b\": [[2]], \"tile\": true}", 422, "bad_option", "tile");
    expect_fail("{\"a\": [[1]], \"b\": [[2]], \"dtype\": \"float8\"}", 422, "bad_option", "float8");
    expect_fail("{\"a\": [[1]], \"b\": [[2]], \"out_dtype\": \"float8\"}", 422, "bad_out_dtype", "float8");
    expect_fail("{\"a\": [[1]], \"b\": [[2]], \"dtype\": null}", 422, "bad_option", "dtype");
    expect_fail("{\"a\": [[1]], \"b\": [[2]], \"kernel\": \"Tiled!\"}", 422, "bad_option", "kernel");
    expect_fail("{\"a\": [[1]], \"b\": [[2]], \"kernel\": [\"x\"]}", 422, "bad_option", "kernel");
    expect_fail("{\"a\": [[1]], \"b\": [[2]], \"math\": \"fp16\"}", 422, "bad_option", "math");
}

static void test_syntax_errors_give_position(void **state)
{
    (void)state;
    expect_fail("", 400, "bad_json", "empty");
    expect_fail("   ", 400, "bad_json", "byte");
    expect_fail("{\"a\": [[1, 2]], \"b\": [[1], [2]]", 400, "bad_json", "byte");
    expect_fail("{\"a\": [[1, 2,]], \"b\": [[1], [2]]}", 400, "bad_json", "byte 13 (line 1, column 14)");
    expect_fail("{\n  \"a\": [[1, 2]],\n  \"b\": [[1], [2]] x\n}", 400, "bad_json", "line 3, column 19");
    expect_fail("{\"a\": [[1, 2]], \"b\": [[1], [2]]} {}", 400, "bad_json", "after the JSON value at byte 33");
    expect_fail("{\"a\": [[NaN]], \"b\": [[1]]}", 400, "bad_json", "byte 8");
    expect_fail("{'a': [[1]]}", 400, "bad_json", "(line 1, column");
    /* nesting far deeper than any matrix */
    size_t depth = 5000;
    char *deep = malloc(2 * depth + 1);
    memset(deep, '[', depth);
    memset(deep + depth, ']', depth);
    deep[2 * depth] = '\0';
    expect_fail(deep, 400, "bad_json", NULL);
    free(deep);
    /* a body with a NUL inside */
    gemm_options opt;
    gemm_matrix a = {0}, b = {0};
    gemm_err err;
    gemm_options_init(&opt);
    const char nul[] = "{\"a\": [[1]], \"b\": [[1]]}\0{}";
    assert_int_equal(gemm_json_decode_request(nul, sizeof nul - 1, NULL, &gemm_allocator_host, &opt, &a, &b, &err), -1);
    assert_int_equal(err.status, 400);
    /* ... but one terminating NUL counted in the length is fine */
    const char term[] = "{\"a\": [[1]], \"b\": [[1]]}";
    assert_int_equal(gemm_json_decode_request(term, sizeof term, NULL, &gemm_allocator_host, &opt, &a, &b, &err), 0);
    free_ab(&a, &b);
    /* the length is respected: the same text cut short is an error */
    assert_int_equal(gemm_json_decode_request(term, sizeof term - 3, NULL, &gemm_allocator_host, &opt, &a, &b, &err),
                     -1);
    assert_string_equal(err.code, "bad_json");
}

static void test_structure_errors_name_the_place(void **state)
{
    (void)state;
    expect_fail("[[1]]", 400, "bad_matrix", "expected a JSON object");
    expect_fail("42", 400, "bad_matrix", "expected a JSON object");
    expect_fail("{\"b\": [[1]]}", 400, "bad_matrix", "no \"a\"");
    expect_fail("{\"a\": [[1]]}", 400, "bad_matrix", "no \"b\"");
    expect_fail("{\"a\": [1, 2, 3], \"b\": [[1]]}", 400, "bad_matrix", "a is a 1-D array");
    expect_fail("{\"a\": [[1]], \"b\": [1]}", 400, "bad_matrix", "b is a 1-D array");
    expect_fail("{\"a\": \"1 2; 3 4\", \"b\": [[1]]}", 400, "bad_matrix", "a is a string");
    expect_fail("{\"a\": [[1, 2], 3], \"b\": [[1]]}", 400, "bad_matrix", "a[1] is a number, expected an array");
    expect_fail("{\"a\": [[1,2,3],[4,5,6],[7,8,9],[1,2]], \"b\": [[1],[2],[3]]}", 400, "bad_matrix",
                "row 3 of a has 2 elements, row 0 has 3");
    expect_fail("{\"a\": [[1,2],[3,4],[5,6]], \"b\": [[1],[2],[3]]}", 422, "shape_mismatch", "A is 3x2 and B is 3x1");
    expect_fail("{\"a\": [[1,2],[3,4],[5,\"6\"]], \"b\": [[1],[2]]}", 400, "bad_matrix",
                "a[2][1] is a string, expected a number");
    expect_fail("{\"a\": [[1,2],[3,4]], \"b\": [[1],[null]]}", 400, "bad_matrix", "b[1][0] is null, expected a number");
    expect_fail("{\"a\": [[1,[2]]], \"b\": [[1],[2]]}", 400, "bad_matrix", "a[0][1] is an array, expected a number");
    expect_fail("{\"a\": [[1,2]], \"b\": {\"shape\": [2,3], \"data\": [1,2,3,4,5]}}", 400, "bad_matrix",
                "b.data has 5 numbers but shape [2,3] needs 6");
    expect_fail("{\"a\": [[1,2]], \"b\": {\"shape\": [2,3], \"data\": [1,2,3,4,5,6,7]}}", 400, "bad_matrix",
                "b.data has 7 numbers but shape [2,3] needs 6");
    expect_fail("{\"a\": [[1,2]], \"b\": {\"shape\": [2,1], \"data\": [1,true]}}", 400, "bad_matrix",
                "b.data[1] is a boolean, expected a number");
    expect_fail("{\"a\": [[1,2]], \"b\": {\"shape\": [2], \"data\": [1,2]}}", 400, "bad_matrix", "b.shape");
    expect_fail("{\"a\": [[1,2]], \"b\": {\"shape\": [2,1,1,1], \"data\": [1,2]}}", 400, "bad_matrix", "b.shape");
    expect_fail("{\"a\": [[1,2]], \"b\": {\"shape\": [2,-1], \"data\": [1,2]}}", 400, "bad_matrix", "b.shape");
    expect_fail("{\"a\": [[1,2]], \"b\": {\"shape\": [2,0.5], \"data\": [1,2]}}", 400, "bad_matrix", "b.shape");
    expect_fail("{\"a\": [[1,2]], \"b\": {\"shape\": [2,1]}}", 400, "bad_matrix", "b.data");
    expect_fail("{\"a\": [[1,2]], \"b\": {\"shape\": [2,1], \"data\": {}}}", 400, "bad_matrix", "b.data");
    /* empty matrices */
    expect_fail("{\"a\": [], \"b\": [[1]]}", 422, "empty_matrix", NULL);
    expect_fail("{\"a\": [[]], \"b\": [[1]]}", 422, "empty_matrix", NULL);
    expect_fail("{\"a\": [[],[]], \"b\": [[1]]}", 422, "empty_matrix", NULL);
    expect_fail("{\"a\": {\"shape\": [0,2], \"data\": []}, \"b\": [[1],[2]]}", 422, "empty_matrix", NULL);
}

static void test_value_ranges(void **state)
{
    (void)state;
    expect_fail("{\"dtype\": \"int32\", \"a\": [[1.5]], \"b\": [[1]]}", 422, "bad_value", "a[0][0]");
    expect_fail("{\"dtype\": \"int32\", \"a\": [[2147483648]], \"b\": [[1]]}", 422, "bad_value", "int32");
    expect_fail("{\"dtype\": \"int32\", \"a\": [[1]], \"b\": [[-2147483649]]}", 422, "bad_value", "b[0][0]");
    expect_fail("{\"dtype\": \"int32\", \"a\": {\"shape\": [1,2], \"data\": [1, 1e10]}, \"b\": [[1],[1]]}", 422,
                "bad_value", "a.data[1]");
    expect_fail("{\"dtype\": \"float32\", \"a\": [[1e39]], \"b\": [[1]]}", 422, "bad_value", "float32");
    expect_fail("{\"dtype\": \"float32\", \"a\": [[1]], \"b\": [[-3.5e38]]}", 422, "bad_value", "b[0][0]");
    expect_fail("{\"a\": [[1e999]], \"b\": [[1]]}", 422, "bad_value", "a[0][0]");
    /* the edges themselves are fine */
    gemm_options opt;
    gemm_matrix a, b;
    gemm_err err;
    gemm_options_init(&opt);
    assert_int_equal(decode("{\"dtype\": \"float32\", \"a\": [[3.4028234663852886e38, -3.4028234663852886e38, 1e-45]],"
                            " \"b\": [[1],[2],[3]]}",
                            &opt, &a, &b, &err),
                     0);
    assert_true(((float *)a.data)[0] == FLT_MAX);
    assert_true(((float *)a.data)[1] == -FLT_MAX);
    free_ab(&a, &b);
    gemm_options_init(&opt);
    assert_int_equal(decode("{\"a\": [[1.7976931348623157e308, 5e-324, -0.0]], \"b\": [[1],[2],[3]]}", &opt, &a, &b, &err),
                     0);
    assert_true(((double *)a.data)[0] == DBL_MAX);
    assert_true(signbit(((double *)a.data)[2]));
    free_ab(&a, &b);
}

static void test_limits_before_allocation(void **state)
{
    (void)state;
    counting c = {0, 0, -1};
    gemm_allocator al = {count_alloc, count_free, &c};
    gemm_limits lim = {.max_dim = 4, .max_elements = 12, .max_body_bytes = 0};
    gemm_options opt;
    gemm_matrix a, b;
    gemm_err err;
    const char *too_big[] = {
        "{\"a\": [[1,2,3,4,5]], \"b\": [[1],[2],[3],[4],[5]]}",                  /* k = 5 > max_dim */
        "{\"a\": {\"shape\": [4,4], \"data\": []}, \"b\": [[1],[2],[3],[4]]}",   /* A has 16 > 12 */
        "{\"a\": {\"shape\": [4,3], \"data\": []}, \"b\": {\"shape\": [3,4], \"data\": []}}", /* C has 16 */
        "{\"a\": {\"shape\": [9007199254740992, 1], \"data\": []}, \"b\": [[1]]}",
    };
    for (size_t i = 0; i < sizeof too_big / sizeof too_big[0]; i++) {
        gemm_options_init(&opt);
        gemm_err_clear(&err);
        assert_int_equal(gemm_json_decode_request(too_big[i], strlen(too_big[i]), &lim, &al, &opt, &a, &b, &err), -1);
        assert_int_equal(err.status, 413);
        assert_string_equal(err.code, "too_large");
    }
    assert_int_equal(c.allocs, 0);
    /* without limits, sizes whose bytes overflow are still refused before allocation */
    const char *huge = "{\"a\": {\"shape\": [4294967296, 4294967296], \"data\": []}, \"b\": {\"shape\": [4294967296, 1], \"data\": []}}";
    gemm_options_init(&opt);
    assert_int_equal(gemm_json_decode_request(huge, strlen(huge), NULL, &al, &opt, &a, &b, &err), -1);
    assert_int_equal(err.status, 413);
    assert_int_equal(c.allocs, 0);

    /* B's allocation fails: A is given back, 503 out_of_memory (as for raw bodies) */
    c.fail_after = 1;
    const char *ok = "{\"a\": [[1,2]], \"b\": [[1],[2]]}";
    gemm_options_init(&opt);
    assert_int_equal(gemm_json_decode_request(ok, strlen(ok), &lim, &al, &opt, &a, &b, &err), -1);
    assert_int_equal(err.status, 503);
    assert_string_equal(err.code, "out_of_memory");
    assert_int_equal(c.allocs, 1);
    assert_int_equal(c.frees, 1);
    /* a bad element in B: nothing is kept (small operands never left the decoder) */
    c.fail_after = -1;
    c.allocs = c.frees = 0;
    const char *bad = "{\"a\": [[1,2]], \"b\": [[1],[\"x\"]]}";
    assert_int_equal(gemm_json_decode_request(bad, strlen(bad), &lim, &al, &opt, &a, &b, &err), -1);
    assert_int_equal(c.allocs, c.frees);
    assert_int_equal(c.allocs, 0);
}

/* ---- writing ------------------------------------------------------------- */

static void test_write_formats(void **state)
{
    (void)state;
    float f[] = {1.0f, -0.0f, 0.1f, 16777216.0f, 1e30f, NAN, INFINITY, -INFINITY, FLT_MAX, 1e-45f, -2.5f, 3e9f};
    gemm_matrix m = {3, 4, GEMM_DTYPE_F32, f, 0};
    char *s = write_json(&m);
    assert_string_equal(s, "[[1,-0,0.100000001,16777216],[1.00000002e+30,null,null,null],"
                           "[3.40282347e+38,1.40129846e-45,-2.5,3000000000]]");
    free(s);
    double d[] = {0.1, 1e300, -123456789012345.0, 9007199254740993.0, 1e16, NAN};
    gemm_matrix md = {2, 3, GEMM_DTYPE_F64, d, 0};
    s = write_json(&md);
    assert_string_equal(s, "[[0.10000000000000001,1.0000000000000001e+300,-123456789012345],"
                           "[9007199254740992,10000000000000000,null]]");
    free(s);
    int32_t i[] = {INT32_MIN, -1, 0, INT32_MAX};
    gemm_matrix mi = {4, 1, GEMM_DTYPE_I32, i, 0};
    s = write_json(&mi);
    assert_string_equal(s, "[[-2147483648],[-1],[0],[2147483647]]");
    free(s);
    /* appends to what is there */
    gemm_buf b;
    gemm_buf_init(&b);
    gemm_buf_puts(&b, "{\"c\": ");
    gemm_json_write_matrix(&b, &mi);
    gemm_buf_printf(&b, ", \"shape\": [%d,%d]}", 4, 1);
    assert_string_equal(b.data, "{\"c\": [[-2147483648],[-1],[0],[2147483647]], \"shape\": [4,1]}");
    gemm_buf_free(&b);
    assert_null(b.data);
    /* an invalid dtype marks the buffer failed instead of writing garbage */
    gemm_buf_init(&b);
    gemm_matrix bad = {1, 1, GEMM_DTYPE_INVALID, i, 0};
    gemm_json_write_matrix(&b, &bad);
    assert_true(b.failed);
    gemm_buf_free(&b);
}

/* float32 output equals printf("%.9g") exactly, over random values of every magnitude
 * and an even stride through all finite bit patterns (the writer formats most float32
 * values without printf). */
static void test_float32_text_matches_printf(void **state)
{
    (void)state;
    enum { N = 4096 };
    float *v = malloc(N * sizeof *v);
    gemm_buf want, got;
    uint32_t stride_bits = 0;
    for (int round = 0; round < 200; round++) {
        for (int i = 0; i < N; i++) {
            uint32_t bits;
            float f;
            do {
                if (round % 2) {
                    bits = stride_bits;
                    stride_bits += 2097143u; /* prime stride: ~2000 steps cover the bit space */
                } else {
                    bits = (uint32_t)rnd();
                }
                memcpy(&f, &bits, 4);
                if (round % 4 == 2) f = (float)((double)(rnd() >> 11) / 9007199254740992.0 * 2 - 1);
            } while (!isfinite(f));
            v[i] = f;
        }
        gemm_matrix m = {1, N, GEMM_DTYPE_F32, v, 0};
        gemm_buf_init(&got);
        gemm_json_write_matrix(&got, &m);
        gemm_buf_init(&want);
        gemm_buf_puts(&want, "[[");
        for (int i = 0; i < N; i++) {
            double d = v[i];
            if (d == floor(d) && fabs(d) < 9007199254740992.0)
                gemm_buf_printf(&want, "%s%s%.0f", i ? "," : "", (d == 0 && signbit(d)) ? "-" : "", d);
            else
                gemm_buf_printf(&want, "%s%.9g", i ? "," : "", d);
        }
        gemm_buf_puts(&want, "]]");
        assert_string_equal(got.data, want.data);
        gemm_buf_free(&got);
        gemm_buf_free(&want);
    }
    free(v);
}

/* The same for float64 and printf("%.17g"). */
static void test_float64_text_matches_printf(void **state)
{
    (void)state;
    enum { N = 4096 };
    double *v = malloc(N * sizeof *v);
    gemm_buf want, got;
    uint64_t stride_bits = 0;
    for (int round = 0; round < 200; round++) {
        for (int i = 0; i < N; i++) {
            double f;
            do {
                uint64_t r = rnd(), bits = r;
                if (round % 2) {
                    bits = stride_bits;
                    stride_bits += 0x0000c3a5c85c97cbull; /* odd stride through the bit space */
                }
                memcpy(&f, &bits, 8);
                if (round % 4 == 2) f = (double)(r >> 11) / 9007199254740992.0 * 2 - 1;
                if (round % 8 == 4) f = (double)(int64_t)r / (double)(1ull << (r % 64));
            } while (!isfinite(f));
            v[i] = f;
        }
        gemm_matrix m = {N, 1, GEMM_DTYPE_F64, v, 0};
        gemm_buf_init(&got);
        gemm_json_write_matrix(&got, &m);
        gemm_buf_init(&want);
        gemm_buf_puts(&want, "[");
        for (int i = 0; i < N; i++) {
            double d = v[i];
            if (d == floor(d) && fabs(d) < 9007199254740992.0)
                gemm_buf_printf(&want, "%s[%s%.0f]", i ? "," : "", (d == 0 && signbit(d)) ? "-" : "", d);
            else
                gemm_buf_printf(&want, "%s[%.17g]", i ? "," : "", d);
        }
        gemm_buf_puts(&want, "]");
        assert_string_equal(got.data, want.data);
        gemm_buf_free(&got);
        gemm_buf_free(&want);
    }
    free(v);
}

/* Random matrices, written and decoded again, are bit-identical (NaN/Inf excluded:
 * JSON cannot carry them). Values mix integers, fractions and extreme exponents. */
static void test_random_round_trip(void **state)
{
    (void)state;
    for (int iter = 0; iter < 200; iter++) {
        gemm_dtype d = (gemm_dtype)(iter % 3);
        uint64_t m = 1 + rnd() % 20, k = 1 + rnd() % 20, n = 1 + rnd() % 20;
        size_t es = gemm_dtype_size(d);
        void *src[2] = {malloc(m * k * es), malloc(k * n * es)};
        size_t cnt[2] = {(size_t)(m * k), (size_t)(k * n)};
        for (int w = 0; w < 2; w++) {
            for (size_t e = 0; e < cnt[w]; e++) {
                uint64_t r = rnd();
                if (d == GEMM_DTYPE_I32) {
                    ((int32_t *)src[w])[e] = (int32_t)(uint32_t)r;
                } else if (d == GEMM_DTYPE_F32) {
                    float v;
                    uint32_t bits = (uint32_t)r;
                    memcpy(&v, &bits, 4);
                    if (!isfinite(v) || r % 4 == 0) v = (float)(int32_t)(r >> 40) / (r % 8 == 0 ? 1 : 64);
                    ((float *)src[w])[e] = v;
                } else {
                    double v;
                    memcpy(&v, &r, 8);
                    if (!isfinite(v) || r % 4 == 0) v = (double)(int64_t)r / (r % 8 == 0 ? 1 : 1024);
                    ((double *)src[w])[e] = v;
                }
            }
        }
        gemm_matrix ma = {m, k, d, src[0], 0}, mb = {k, n, d, src[1], 0};
        gemm_buf body;
        gemm_buf_init(&body);
        gemm_buf_printf(&body, "{\"dtype\": \"%s\", \"a\": ", gemm_dtype_name(d));
        gemm_json_write_matrix(&body, &ma);
        gemm_buf_puts(&body, ", \"b\": ");
        if (iter % 2) {
            gemm_json_write_matrix(&body, &mb);
        } else {
            /* the shape/data form, built from the nested text without its inner brackets */
            gemm_buf tmp;
            gemm_buf_init(&tmp);
            gemm_json_write_matrix(&tmp, &mb);
            gemm_buf_printf(&body, "{\"shape\": [%llu, %llu], \"data\": [", (unsigned long long)k,
                            (unsigned long long)n);
            for (size_t i = 0; i < tmp.len; i++)
                if (tmp.data[i] != '[' && tmp.data[i] != ']') gemm_buf_append(&body, tmp.data + i, 1);
            gemm_buf_puts(&body, "]}");
            gemm_buf_free(&tmp);
        }
        gemm_buf_puts(&body, "}");
        assert_false(body.failed);
        gemm_options opt;
        gemm_matrix a, b;
        gemm_err err;
        gemm_options_init(&opt);
        gemm_err_clear(&err);
        int rc = gemm_json_decode_request(body.data, body.len, NULL, &gemm_allocator_host, &opt, &a, &b, &err);
        if (rc) fprintf(stderr, "iter %d: %s\n", iter, err.message);
        assert_int_equal(rc, 0);
        assert_int_equal(a.rows, m);
        assert_int_equal(a.cols, k);
        assert_int_equal(b.rows, k);
        assert_int_equal(b.cols, n);
        assert_memory_equal(a.data, src[0], cnt[0] * es);
        assert_memory_equal(b.data, src[1], cnt[1] * es);
        free_ab(&a, &b);
        gemm_buf_free(&body);
        free(src[0]);
        free(src[1]);
    }
}

/* ---- gemm_buf -------------------------------------------------------------- */

static void test_buf(void **state)
{
    (void)state;
    gemm_buf b;
    gemm_buf_init(&b);
    assert_null(b.data);
    gemm_buf_append(&b, "", 0);
    assert_non_null(b.data);
    assert_string_equal(b.data, "");
    /* printf that outgrows the buffer several times over */
    char big[5000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    gemm_buf_printf(&b, "<%s|%d>", big, 42);
    assert_int_equal(b.len, 4999 + 5);
    assert_int_equal(b.data[0], '<');
    assert_string_equal(b.data + 5000, "|42>");
    for (int i = 0; i < 1000; i++) gemm_buf_printf(&b, "%d,", i);
    assert_false(b.failed);
    assert_int_equal(strlen(b.data), b.len);
    gemm_buf_free(&b);

    gemm_buf_init(&b);
    gemm_buf_json_string(&b, "plain");
    gemm_buf_puts(&b, " ");
    gemm_buf_json_string(&b, "q\"b\\s/\n\r\t\b\f\x01\x1f\x7f \xc3\xa9");
    assert_string_equal(b.data, "\"plain\" \"q\\\"b\\\\s/\\n\\r\\t\\b\\f\\u0001\\u001f\\u007f \xc3\xa9\"");
    gemm_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nested_form_default_float64),
        cmocka_unit_test(test_shape_data_form_and_mixed),
        cmocka_unit_test(test_body_options),
        cmocka_unit_test(test_syntax_errors_give_position),
        cmocka_unit_test(test_structure_errors_name_the_place),
        cmocka_unit_test(test_value_ranges),
        cmocka_unit_test(test_limits_before_allocation),
        cmocka_unit_test(test_write_formats),
        cmocka_unit_test(test_float32_text_matches_printf),
        cmocka_unit_test(test_float64_text_matches_printf),
        cmocka_unit_test(test_random_round_trip),
        cmocka_unit_test(test_buf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
