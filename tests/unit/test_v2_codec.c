/* test_v2_codec.c - Open Inference Protocol request headers (JSON and binary tensor data,
 * both data layouts, parameters, outputs, every error with its status and code, limits
 * before anything is allocated) and output tensors (flat JSON data, binary sizes). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "v2_codec.h"

static const gemm_limits lim = {1000, 100000, 1u << 30};

static int parse(const char *json, int binary_ok, gemm_v2_request *r, gemm_err *err)
{
    gemm_v2_request_init(r);
    gemm_err_clear(err);
    return gemm_v2_parse_request_admitted(json, strlen(json), binary_ok, &lim, NULL, NULL, r, err);
}

/* The header must fail with this status, code and a message containing needle. */
static void expect_fail(const char *json, int binary_ok, int status, const char *code, const char *needle)
{
    gemm_v2_request r;
    gemm_err err;
    int rc = parse(json, binary_ok, &r, &err);
    if (rc == 0 || err.status != status || strcmp(err.code, code) != 0 || !strstr(err.message, needle))
        fail_msg("%s\n  got rc=%d %d %s \"%s\"\n  want %d %s containing \"%s\"", json, rc, err.status, err.code,
                 err.message, status, code, needle);
    gemm_v2_request_free(&r);
}

static void test_datatypes(void **state)
{
    (void)state;
    gemm_dtype d = GEMM_DTYPE_INVALID;
    assert_int_equal(gemm_v2_dtype_from_name("FP32", &d), 0);
    assert_int_equal(d, GEMM_DTYPE_F32);
    assert_int_equal(gemm_v2_dtype_from_name("FP64", &d), 0);
    assert_int_equal(d, GEMM_DTYPE_F64);
    assert_int_equal(gemm_v2_dtype_from_name("INT32", &d), 0);
    assert_int_equal(d, GEMM_DTYPE_I32);
    static const char *const others[] = {"BOOL", "UINT8", "INT8", "INT64", "BYTES", "UINT64"};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++)
        assert_int_equal(gemm_v2_dtype_from_name(others[i], &d), -1);
    assert_int_equal(gemm_v2_dtype_from_name("fp32", &d), -2); /* strings are case-sensitive */
    assert_int_equal(gemm_v2_dtype_from_name("float32", &d), -2);
    assert_int_equal(gemm_v2_dtype_from_name("", &d), -2);
    assert_int_equal(gemm_v2_dtype_from_name(NULL, &d), -2);
    assert_string_equal(gemm_v2_dtype_name(GEMM_DTYPE_F32), "FP32");
    assert_string_equal(gemm_v2_dtype_name(GEMM_DTYPE_F64), "FP64");
    assert_string_equal(gemm_v2_dtype_name(GEMM_DTYPE_I32), "INT32");
    assert_int_equal(gemm_v2_dtype_from_name("FP16", &d), 0);
    assert_int_equal(d, GEMM_DTYPE_F16);
    assert_int_equal(gemm_v2_dtype_from_name("BF16", &d), 0);
    assert_int_equal(d, GEMM_DTYPE_BF16);
    assert_string_equal(gemm_v2_dtype_name(GEMM_DTYPE_F16), "FP16");
    assert_string_equal(gemm_v2_dtype_name(GEMM_DTYPE_BF16), "BF16");
    assert_string_equal(gemm_v2_dtype_name(GEMM_DTYPE_INVALID), "");
}

static void test_json_flat_and_nested(void **state)
{
    (void)state;
    gemm_v2_request r;
    gemm_err err;
    const char *body = "{\"id\":\"req-1\",\"inputs\":["
                       "{\"name\":\"B\",\"shape\":[3,2],\"datatype\":\"FP64\",\"data\":[[1,2],[3,4],[5,6.5]]},"
                       "{\"name\":\"A\",\"shape\":[2,3],\"datatype\":\"FP64\",\"data\":[1,-2,3e0,4,0.5,-6]}]}";
    assert_int_equal(parse(body, 0, &r, &err), 0);
    assert_string_equal(r.id, "req-1");
    assert_int_equal(r.dtype, GEMM_DTYPE_F64);
    assert_int_equal(r.in[0].rows, 2);
    assert_int_equal(r.in[0].cols, 3);
    assert_int_equal(r.in[1].rows, 3);
    assert_int_equal(r.in[1].cols, 2);
    assert_false(r.in[0].nested);
    assert_true(r.in[1].nested);
    assert_int_equal(r.order[0], 1); /* B is listed first */
    assert_int_equal(r.order[1], 0);
    assert_false(r.binary_output);
    assert_string_equal(r.opt.kernel, "auto");
    double a[6], b[6];
    assert_int_equal(gemm_v2_fill_input(&r, 0, a, &err), 0);
    assert_int_equal(gemm_v2_fill_input(&r, 1, b, &err), 0);
    const double wa[6] = {1, -2, 3, 4, 0.5, -6}, wb[6] = {1, 2, 3, 4, 5, 6.5};
    for (int i = 0; i < 6; i++) {
        assert_true(a[i] == wa[i]);
        assert_true(b[i] == wb[i]);
    }
    gemm_v2_release_json(&r);
    assert_null(r.root);
    gemm_v2_request_free(&r);

    /* int32 and float32, values at the edges of their ranges */
    body = "{\"inputs\":[{\"name\":\"A\",\"shape\":[1,3],\"datatype\":\"INT32\",\"data\":[2147483647,-2147483648,0]},"
           "{\"name\":\"B\",\"shape\":[3,1],\"datatype\":\"INT32\",\"data\":[[7],[-1],[3]]}]}";
    assert_int_equal(parse(body, 0, &r, &err), 0);
    assert_null(r.id);
    int32_t ia[3];
    assert_int_equal(gemm_v2_fill_input(&r, 0, ia, &err), 0);
    assert_int_equal(ia[0], INT32_MAX);
    assert_int_equal(ia[1], INT32_MIN);
    gemm_v2_request_free(&r);
    body = "{\"inputs\":[{\"name\":\"A\",\"shape\":[1,2],\"datatype\":\"FP32\",\"data\":[3.4028234663852886e38,-1e-45]},"
           "{\"name\":\"B\",\"shape\":[2,1],\"datatype\":\"FP32\",\"data\":[1,2]}]}";
    assert_int_equal(parse(body, 0, &r, &err), 0);
    float fa[2];
    assert_int_equal(gemm_v2_fill_input(&r, 0, fa, &err), 0);
    assert_true(fa[0] == FLT_MAX);
    gemm_v2_request_free(&r);
}

static void test_binary_inputs(void **state)
{
    (void)state;
    gemm_v2_request r;
    gemm_err err;
    const char *body = "{\"inputs\":[{\"name\":\"B\",\"shape\":[3,4],\"datatype\":\"FP32\","
                       "\"parameters\":{\"binary_data_size\":48}},"
                       "{\"name\":\"A\",\"shape\":[2,3],\"datatype\":\"FP32\",\"parameters\":{\"binary_data_size\":24}}],"
                       "\"outputs\":[{\"name\":\"C\",\"parameters\":{\"binary_data\":true}}]}";
    assert_int_equal(parse(body, 1, &r, &err), 0);
    assert_true(r.in[0].binary && r.in[1].binary);
    assert_int_equal(r.in[0].binary_bytes, 24);
    assert_int_equal(r.in[1].binary_bytes, 48);
    assert_int_equal(r.order[0], 1);
    assert_int_equal(r.order[1], 0);
    assert_true(r.binary_output);
    float dst[6];
    assert_int_equal(gemm_v2_fill_input(&r, 0, dst, &err), -1); /* binary: nothing to convert */
    gemm_v2_request_free(&r);

    /* one of each; FP64 sizes */
    body = "{\"inputs\":[{\"name\":\"A\",\"shape\":[2,2],\"datatype\":\"FP64\",\"data\":[1,2,3,4]},"
           "{\"name\":\"B\",\"shape\":[2,5],\"datatype\":\"FP64\",\"parameters\":{\"binary_data_size\":80}}]}";
    assert_int_equal(parse(body, 1, &r, &err), 0);
    assert_false(r.in[0].binary);
    assert_true(r.in[1].binary);
    gemm_v2_request_free(&r);

    expect_fail(body, 0, 400, "bad_binary_size", "Inference-Header-Content-Length");
    expect_fail("{\"inputs\":[{\"name\":\"A\",\"shape\":[2,2],\"datatype\":\"FP64\",\"data\":[1,2,3,4]},"
                "{\"name\":\"B\",\"shape\":[2,5],\"datatype\":\"FP64\",\"parameters\":{\"binary_data_size\":40}}]}",
                1, 400, "bad_binary_size", "binary_data_size is 40 but shape [2,5] of FP64 needs 80 bytes");
    expect_fail("{\"inputs\":[{\"name\":\"A\",\"shape\":[2,2],\"datatype\":\"FP64\",\"data\":[1,2,3,4]},"
                "{\"name\":\"B\",\"shape\":[2,5],\"datatype\":\"FP64\",\"parameters\":{\"binary_data_size\":-8}}]}",
                1, 400, "bad_binary_size", "non-negative integer");
    expect_fail("{\"inputs\":[{\"name\":\"A\",\"shape\":[2,2],\"datatype\":\"FP64\",\"data\":[1,2,3,4]},"
                "{\"name\":\"B\",\"shape\":[2,5],\"datatype\":\"FP64\",\"data\":[1],"
                "\"parameters\":{\"binary_data_size\":80}}]}",
                1, 400, "bad_request", "both \"data\" and binary_data_size");
    expect_fail("{\"inputs\":[{\"name\":\"A\",\"shape\":[2,2],\"datatype\":\"FP64\",\"data\":[1,2,3,4]},"
                "{\"name\":\"B\",\"shape\":[2,5],\"datatype\":\"FP64\","
                "\"parameters\":{\"shared_memory_region\":\"x\"}}]}",
                1, 400, "unsupported", "shared memory");
}

static void test_parameters_and_outputs(void **state)
{
    (void)state;
    gemm_v2_request r;
    gemm_err err;
    const char *ins = "\"inputs\":[{\"name\":\"A\",\"shape\":[1,1],\"datatype\":\"FP32\",\"data\":[2]},"
                      "{\"name\":\"B\",\"shape\":[1,1],\"datatype\":\"FP32\",\"data\":[3]}]";
    char body[1024];
    snprintf(body, sizeof body,
             "{\"parameters\":{\"kernel\":\"tiled\",\"tile\":32,\"math\":\"tf32\",\"binary_data_output\":true,"
             "\"priority\":3,\"custom\":\"ignored\"},%s}", ins);
    assert_int_equal(parse(body, 0, &r, &err), 0);
    assert_string_equal(r.opt.kernel, "tiled");
    assert_int_equal(r.opt.tile, 32);
    assert_int_equal(r.opt.math, GEMM_MATH_TF32);
    assert_true(r.binary_output); /* binary_data_output with no "outputs" */
    gemm_v2_request_free(&r);

    snprintf(body, sizeof body, "{\"parameters\":{\"tile\":\"16\",\"binary_data_output\":true},%s,"
             "\"outputs\":[{\"name\":\"C\",\"parameters\":{\"binary_data\":false}}]}", ins);
    assert_int_equal(parse(body, 0, &r, &err), 0);
    assert_int_equal(r.opt.tile, 16);
    assert_false(r.binary_output); /* the output's own binary_data wins */
    gemm_v2_request_free(&r);

    snprintf(body, sizeof body, "{\"parameters\":{\"binary_data_output\":true},%s,\"outputs\":[{\"name\":\"C\"}]}", ins);
    assert_int_equal(parse(body, 0, &r, &err), 0);
    assert_true(r.binary_output);
    gemm_v2_request_free(&r);

    snprintf(body, sizeof body, "{%s,\"outputs\":[]}", ins);
    assert_int_equal(parse(body, 0, &r, &err), 0);
    assert_false(r.binary_output);
    gemm_v2_request_free(&r);

    snprintf(body, sizeof body, "{\"parameters\":{\"kernel\":\"No Such\"},%s}", ins);
    expect_fail(body, 0, 400, "bad_option", "kernel");
    snprintf(body, sizeof body, "{\"parameters\":{\"math\":\"fp8\"},%s}", ins);
    expect_fail(body, 0, 400, "bad_option", "math");
    snprintf(body, sizeof body, "{\"parameters\":{\"tile\":0},%s}", ins);
    expect_fail(body, 0, 400, "bad_option", "tile");
    snprintf(body, sizeof body, "{\"parameters\":{\"kernel\":7},%s}", ins);
    expect_fail(body, 0, 400, "bad_option", "kernel is a number");
    /* the options' table: panel_of, out_dtype by datatype name; twice, or cut by a NUL */
    snprintf(body, sizeof body, "{\"parameters\":{\"panel_of\":64,\"out_dtype\":\"FP16\",\"dtype\":\"x\",\"m\":-1},%s}",
             ins);
    assert_int_equal(parse(body, 0, &r, &err), 0);
    assert_int_equal(r.opt.panel_of, 64);
    assert_int_equal(r.opt.out_dtype, GEMM_DTYPE_F16);
    assert_int_equal(r.opt.dtype, GEMM_DTYPE_INVALID); /* not a v2 parameter: ignored */
    gemm_v2_request_free(&r);
    snprintf(body, sizeof body, "{\"parameters\":{\"panel_of\":0},%s}", ins);
    expect_fail(body, 0, 400, "bad_option", "panel_of '0'");
    snprintf(body, sizeof body, "{\"parameters\":{\"out_dtype\":\"UINT8\"},%s}", ins);
    expect_fail(body, 0, 400, "bad_out_dtype", "UINT8");
    snprintf(body, sizeof body, "{\"parameters\":{\"tile\":16,\"tile\":16},%s}", ins);
    expect_fail(body, 0, 400, "duplicate_option", "tile is given twice");
    snprintf(body, sizeof body, "{\"parameters\":{\"kernel\":\"auto\\u0000x\"},%s}", ins);
    expect_fail(body, 0, 400, "bad_parameter", "U+0000");
    snprintf(body, sizeof body, "{\"parameters\":{\"kernel\\u0000x\":\"Bad!\"},%s}", ins);
    expect_fail(body, 0, 400, "bad_parameter", "U+0000");
    snprintf(body, sizeof body, "{\"parameters\":{\"kernel\":\"auto\\n\"},%s}", ins);
    expect_fail(body, 0, 400, "bad_option", "control byte");
    snprintf(body, sizeof body, "{\"parameters\":{\"x\":{\"k\\u0000\":1}},%s}", ins); /* not an option's */
    assert_int_equal(parse(body, 0, &r, &err), 0);
    gemm_v2_request_free(&r);
    snprintf(body, sizeof body, "{\"parameters\":{\"binary_data_output\":1},%s}", ins);
    expect_fail(body, 0, 400, "bad_parameter", "binary_data_output");
    snprintf(body, sizeof body, "{\"parameters\":[],%s}", ins);
    expect_fail(body, 0, 400, "bad_parameter", "\"parameters\" is an array");
    snprintf(body, sizeof body, "{%s,\"outputs\":[{\"name\":\"D\"}]}", ins);
    expect_fail(body, 0, 400, "unknown_output", "unexpected inference output 'D'");
    snprintf(body, sizeof body, "{%s,\"outputs\":[{\"name\":\"C\"},{\"name\":\"C\"}]}", ins);
    expect_fail(body, 0, 400, "bad_request", "twice");
    snprintf(body, sizeof body, "{%s,\"outputs\":[{\"name\":\"C\",\"parameters\":{\"binary_data\":\"yes\"}}]}", ins);
    expect_fail(body, 0, 400, "bad_parameter", "binary_data");
    snprintf(body, sizeof body, "{%s,\"outputs\":[{\"name\":\"C\",\"parameters\":{\"classification\":2}}]}", ins);
    expect_fail(body, 0, 400, "unsupported", "classification");
    snprintf(body, sizeof body, "{%s,\"outputs\":{\"name\":\"C\"}}", ins);
    expect_fail(body, 0, 400, "bad_request", "\"outputs\" is an object");
    snprintf(body, sizeof body, "{\"id\":5,%s}", ins);
    expect_fail(body, 0, 400, "bad_request", "\"id\" is a number");
}

static void test_structure_errors(void **state)
{
    (void)state;
    const char *B = "{\"name\":\"B\",\"shape\":[2,2],\"datatype\":\"FP32\",\"data\":[1,2,3,4]}";
    char body[1024];
    expect_fail("", 0, 400, "bad_json", "empty");
    expect_fail("{\"inputs\": [", 0, 400, "bad_json", "not valid JSON");
    expect_fail("{\"inputs\": []} trailing", 0, 400, "bad_json", "unexpected data after");
    expect_fail("{\"inputs\": []}XY", 1, 400, "bad_json", "unexpected data after");
    expect_fail("[1,2]", 0, 400, "bad_json", "an array");
    expect_fail("{}", 0, 400, "bad_request", "\"inputs\" is missing");
    expect_fail("{\"inputs\":{}}", 0, 400, "bad_request", "\"inputs\" is an object");
    expect_fail("{\"inputs\":[]}", 0, 400, "missing_input", "expected 2 inputs (A and B) but got 0; missing A and B");
    snprintf(body, sizeof body, "{\"inputs\":[%s]}", B);
    expect_fail(body, 0, 400, "missing_input", "missing A");
    snprintf(body, sizeof body, "{\"inputs\":[%s,%s]}", B, B);
    expect_fail(body, 0, 400, "duplicate_input", "input B is given twice");
    snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"X\",\"shape\":[2,2],\"datatype\":\"FP32\",\"data\":[1,2,3,4]},%s]}", B);
    expect_fail(body, 0, 400, "unknown_input", "unexpected inference input 'X'");
    snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"a\",\"shape\":[2,2],\"datatype\":\"FP32\",\"data\":[1,2,3,4]},%s]}", B);
    expect_fail(body, 0, 400, "unknown_input", "'a'"); /* names are case-sensitive */
    snprintf(body, sizeof body, "{\"inputs\":[7,%s]}", B);
    expect_fail(body, 0, 400, "bad_request", "inputs[0] is a number");
    snprintf(body, sizeof body, "{\"inputs\":[{\"shape\":[2,2],\"datatype\":\"FP32\",\"data\":[1,2,3,4]},%s]}", B);
    expect_fail(body, 0, 400, "bad_request", "inputs[0].name is missing");
    snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"A\",\"shape\":[2,2],\"datatype\":\"UINT8\",\"data\":[1,2,3,4]},%s]}", B);
    expect_fail(body, 0, 400, "bad_datatype", "UINT8 is not supported");
    snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"A\",\"shape\":[2,2],\"datatype\":\"FLOAT\",\"data\":[1,2,3,4]},%s]}", B);
    expect_fail(body, 0, 400, "bad_datatype", "unknown datatype 'FLOAT'");
    snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"A\",\"shape\":[2,2],\"data\":[1,2,3,4]},%s]}", B);
    expect_fail(body, 0, 400, "bad_datatype", "datatype is missing");
    snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"A\",\"shape\":[2,2],\"datatype\":\"FP64\",\"data\":[1,2,3,4]},%s]}", B);
    expect_fail(body, 0, 400, "dtype_mismatch", "A is FP64 but B is FP32");
    snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"A\",\"shape\":[4],\"datatype\":\"FP32\",\"data\":[1,2,3,4]},%s]}", B);
    expect_fail(body, 0, 400, "bad_shape", "1 dimensions");
    snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"A\",\"shape\":[1,2,2],\"datatype\":\"FP32\",\"data\":[1,2,3,4]},%s]}", B);
    expect_fail(body, 0, 400, "bad_shape", "3 dimensions");
    snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"A\",\"shape\":[2,-2],\"datatype\":\"FP32\",\"data\":[1,2,3,4]},%s]}", B);
    expect_fail(body, 0, 400, "bad_shape", "non-negative integers");
    snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"A\",\"shape\":[2,1.5],\"datatype\":\"FP32\",\"data\":[1,2,3,4]},%s]}", B);
    expect_fail(body, 0, 400, "bad_shape", "non-negative integers");
    snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"A\",\"shape\":\"2x2\",\"datatype\":\"FP32\",\"data\":[1,2,3,4]},%s]}", B);
    expect_fail(body, 0, 400, "bad_shape", "shape is a string");
    /* shapes that cannot be multiplied: 422 from the shared check (the server answers 400) */
    snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"A\",\"shape\":[1,3],\"datatype\":\"FP32\",\"data\":[1,2,3]},%s]}", B);
    expect_fail(body, 0, 422, "shape_mismatch", "A's columns (3) must equal B's rows (2)");
    snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"A\",\"shape\":[0,2],\"datatype\":\"FP32\",\"data\":[]},%s]}", B);
    expect_fail(body, 0, 422, "empty_matrix", "at least 1");
    /* data against the shape */
    snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"A\",\"shape\":[2,2],\"datatype\":\"FP32\",\"data\":[1,2,3]},%s]}", B);
    expect_fail(body, 0, 400, "bad_data", "data has 3 elements but shape [2,2] needs 4");
    snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"A\",\"shape\":[2,2],\"datatype\":\"FP32\",\"data\":[[1,2],[3]]},%s]}", B);
    expect_fail(body, 0, 400, "bad_data", "data[1] has 1 elements");
    snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"A\",\"shape\":[2,2],\"datatype\":\"FP32\",\"data\":[[1,2],[3,4],[5,6]]},%s]}", B);
    expect_fail(body, 0, 400, "bad_data", "data has 3 rows");
    snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"A\",\"shape\":[2,2],\"datatype\":\"FP32\",\"data\":[[1,2],3]},%s]}", B);
    expect_fail(body, 0, 400, "bad_data", "data[1] is a number");
    snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"A\",\"shape\":[2,2],\"datatype\":\"FP32\"},%s]}", B);
    expect_fail(body, 0, 400, "bad_data", "no \"data\"");
    snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"A\",\"shape\":[2,2],\"datatype\":\"FP32\",\"data\":\"1,2,3,4\"},%s]}", B);
    expect_fail(body, 0, 400, "bad_data", "data is a string");
}

static void fill_fail(const char *a_data, const char *dtype, const char *needle)
{
    char body[512];
    snprintf(body, sizeof body,
             "{\"inputs\":[{\"name\":\"A\",\"shape\":[1,2],\"datatype\":\"%s\",\"data\":%s},"
             "{\"name\":\"B\",\"shape\":[2,1],\"datatype\":\"%s\",\"data\":[1,1]}]}", dtype, a_data, dtype);
    gemm_v2_request r;
    gemm_err err;
    assert_int_equal(parse(body, 0, &r, &err), 0);
    double dst[2];
    int rc = gemm_v2_fill_input(&r, 0, dst, &err);
    if (rc == 0 || err.status != 400 || strcmp(err.code, "bad_data") != 0 || !strstr(err.message, needle))
        fail_msg("%s: rc=%d %d %s \"%s\", want 400 bad_data \"%s\"", body, rc, err.status, err.code, err.message,
                 needle);
    gemm_v2_request_free(&r);
}

static void test_value_errors(void **state)
{
    (void)state;
    fill_fail("[1,\"2\"]", "FP32", "element 1 is a string");
    fill_fail("[1,null]", "FP64", "element 1 is null");
    fill_fail("[[1,true]]", "FP64", "element 1 is a boolean");
    fill_fail("[1,1e39]", "FP32", "beyond FP32's range");
    fill_fail("[1e309,1]", "FP64", "element 0");
    fill_fail("[1.5,1]", "INT32", "element 0 = 1.5 is not an INT32");
    fill_fail("[1,2147483648]", "INT32", "not an INT32");
    fill_fail("[-2147483649,1]", "INT32", "not an INT32");
}

static void test_limits_before_allocation(void **state)
{
    (void)state;
    /* Shapes far over the limits fail with 413 while the data is tiny: nothing is sized
     * from the shapes before they are checked. */
    expect_fail("{\"inputs\":[{\"name\":\"A\",\"shape\":[100000,100000],\"datatype\":\"FP32\","
                "\"parameters\":{\"binary_data_size\":4}},"
                "{\"name\":\"B\",\"shape\":[100000,1],\"datatype\":\"FP32\",\"parameters\":{\"binary_data_size\":4}}]}",
                1, 413, "too_large", "exceeds this server's limit");
    expect_fail("{\"inputs\":[{\"name\":\"A\",\"shape\":[1000,1000],\"datatype\":\"FP32\",\"data\":[1]},"
                "{\"name\":\"B\",\"shape\":[1000,1],\"datatype\":\"FP32\",\"data\":[1]}]}",
                0, 413, "too_large", "A");
    expect_fail("{\"inputs\":[{\"name\":\"A\",\"shape\":[9007199254740992,9007199254740992],\"datatype\":\"FP64\","
                "\"data\":[1]},{\"name\":\"B\",\"shape\":[9007199254740992,1],\"datatype\":\"FP64\",\"data\":[1]}]}",
                0, 413, "too_large", "");
    expect_fail("{\"inputs\":[{\"name\":\"A\",\"shape\":[1e300,1],\"datatype\":\"FP64\",\"data\":[1]},"
                "{\"name\":\"B\",\"shape\":[1,1],\"datatype\":\"FP64\",\"data\":[1]}]}",
                0, 400, "bad_shape", "non-negative integers");
    /* an over-long id */
    size_t n = GEMM_V2_ID_MAX + 1;
    char *body = malloc(n + 256);
    assert_non_null(body);
    memcpy(body, "{\"id\":\"", 7);
    memset(body + 7, 'x', n);
    strcpy(body + 7 + n, "\",\"inputs\":[]}");
    expect_fail(body, 0, 400, "bad_request", "\"id\" is longer than");
    free(body);
}

static void test_id_utf8(void **state)
{
    (void)state;
    gemm_v2_request r;
    gemm_err err;
    const char *body = "{\"id\":\"a\\u0000b\\\"q\xc3\xa9\",\"inputs\":[{\"name\":\"A\",\"shape\":[1,1],"
                       "\"datatype\":\"FP32\",\"data\":[2]},{\"name\":\"B\",\"shape\":[1,1],\"datatype\":\"FP32\","
                       "\"data\":[3]}]}";
    assert_int_equal(parse(body, 0, &r, &err), 0);
    assert_non_null(r.id);
    for (const unsigned char *p = (const unsigned char *)r.id; *p; p += gemm_utf8_seq(p)) /* UTF-8 to its end */
        assert_int_not_equal(gemm_utf8_seq(p), 0);
    gemm_v2_request_free(&r);
    /* Bytes that are not UTF-8 in any string: not JSON (RFC 8259 section 8.1), where they are */
    static const char *const bad[] = {"\xff", "\xc3", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xc0\xaf"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char doc[300];
        snprintf(doc, sizeof doc, "{\"id\":\"%s\",\"inputs\":[]}", bad[i]);
        expect_fail(doc, 0, 400, "bad_json", "not valid JSON (at byte 7)");
        snprintf(doc, sizeof doc, "{\"inputs\":[{\"name\":\"A%s\",\"shape\":[1,1],\"datatype\":\"FP32\",\"data\":[2]}]}",
                 bad[i]);
        expect_fail(doc, 0, 400, "bad_json", "not valid JSON (at byte 21)");
    }
}

static void test_write_output(void **state)
{
    (void)state;
    gemm_buf b;
    float c[6] = {1, -2.5f, 3, 0.1f, 1e-30f, 65504};
    gemm_matrix m = {.rows = 2, .cols = 3, .dtype = GEMM_DTYPE_F32, .data = c};
    gemm_buf_init(&b);
    gemm_v2_write_output(&b, "C", &m, 0);
    assert_false(b.failed);
    assert_string_equal(b.data, "{\"name\":\"C\",\"datatype\":\"FP32\",\"shape\":[2,3],"
                                "\"data\":[1,-2.5,3,0.100000001,1e-30,65504]}");
    gemm_buf_free(&b);
    gemm_v2_write_output(&b, "C", &m, 1);
    assert_string_equal(b.data, "{\"name\":\"C\",\"datatype\":\"FP32\",\"shape\":[2,3],"
                                "\"parameters\":{\"binary_data_size\":24}}");
    gemm_buf_free(&b);
    int32_t ci[1] = {INT32_MIN};
    gemm_matrix mi = {.rows = 1, .cols = 1, .dtype = GEMM_DTYPE_I32, .data = ci};
    gemm_v2_write_output(&b, "C", &mi, 0);
    assert_string_equal(b.data, "{\"name\":\"C\",\"datatype\":\"INT32\",\"shape\":[1,1],\"data\":[-2147483648]}");
    gemm_buf_free(&b);

    /* Random float64: the text parses back to the same values, flat and in order, and
     * stays under the size bound used for the JSON limit. */
    enum { R = 17, K = 29 };
    static double cd[R * K];
    uint64_t x = 0x243f6a8885a308d3ull;
    for (int i = 0; i < R * K; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        double mant = (double)(x >> 11) / 9007199254740992.0 - 0.5;
        cd[i] = ldexp(mant, (int)(x % 2000) - 1000);
    }
    cd[0] = -1.2345678901234567e-308;
    gemm_matrix md = {.rows = R, .cols = K, .dtype = GEMM_DTYPE_F64, .data = cd};
    gemm_v2_write_output(&b, "C", &md, 0);
    assert_false(b.failed);
    assert_true(b.len <= gemm_v2_json_bytes_bound(R, K, GEMM_DTYPE_F64));
    cJSON *o = cJSON_Parse(b.data);
    assert_non_null(o);
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(o, "data");
    assert_true(cJSON_IsArray(data));
    int i = 0;
    for (const cJSON *e = data->child; e; e = e->next, i++) {
        assert_true(cJSON_IsNumber(e));
        assert_true(e->valuedouble == cd[i]);
    }
    assert_int_equal(i, R * K);
    cJSON_Delete(o);
    gemm_buf_free(&b);
}


/* The first pass finds the data arrays as cJSON reads the keys: escapes decoded, the first
 * of two equal keys, a key cut at \u0000; and only those of "inputs". */
static void test_data_keys(void **state)
{
    (void)state;
    gemm_v2_request r;
    gemm_err err;
    float a[2], b[2];
    const char *bodies[] = {
        "{\"inputs\":[{\"name\":\"A\",\"shape\":[1,2],\"datatype\":\"FP32\",\"d\\u0061ta\":[1,2]},"
        "{\"name\":\"B\",\"shape\":[2,1],\"datatype\":\"FP32\",\"data\":[3,4]}]}",
        "{\"inputs\":[{\"name\":\"A\",\"shape\":[1,2],\"datatype\":\"FP32\",\"data\":[1,2],\"data\":[9,9,9]},"
        "{\"name\":\"B\",\"shape\":[2,1],\"datatype\":\"FP32\",\"data\\u0000x\":[3,4],\"data\":[8]}]}",
        "{\"inputs\":[{\"name\":\"A\",\"shape\":[1,2],\"datatype\":\"FP32\",\"data\":[1,2]},"
        "{\"name\":\"B\",\"shape\":[2,1],\"datatype\":\"FP32\",\"data\":[3,4]}],"
        "\"inputs\":[{\"name\":\"A\",\"data\":[7]}],\"parameters\":{\"data\":[[1],[2]]}}",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        if (parse(bodies[i], 0, &r, &err) != 0) fail_msg("%s: %s %s", bodies[i], err.code, err.message);
        assert_int_equal(gemm_v2_fill_input(&r, 0, a, &err), 0);
        assert_int_equal(gemm_v2_fill_input(&r, 1, b, &err), 0);
        assert_true(a[0] == 1 && a[1] == 2 && b[0] == 3 && b[1] == 4);
        gemm_v2_request_free(&r);
    }
}

/* Tensor data is RFC 8259 strictly (cJSON took "01" and "1."); syntax errors anywhere are
 * bad_json at their byte in the request, after a data array too. */
static void test_data_syntax(void **state)
{
    (void)state;
    const char *B = "{\"name\":\"B\",\"shape\":[2,1],\"datatype\":\"FP32\",\"data\":[1,2]}";
    const char *bad[] = {"[01,2]", "[1.,2]", "[.5,2]", "[+1,2]", "[1,2,]", "[[1,2]", "[1 2]", "[NaN,1]", "[1,2]]"};
    char body[512];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"A\",\"shape\":[1,2],\"datatype\":\"FP32\",\"data\":%s},%s]}",
                 bad[i], B);
        expect_fail(body, 0, 400, "bad_json", "not valid JSON");
    }
    /* a bad token after the data: its offset in the request, not in what cJSON saw */
    snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"A\",\"data\":[1, 2, 3, 4],\"shape\":[1,2] x},%s]}", B);
    char want[64];
    snprintf(want, sizeof want, "at byte %zu)", (size_t)(strchr(body, 'x') - body));
    expect_fail(body, 0, 400, "bad_json", want);
    /* one cJSON refuses (a bad escape in a key after the data) */
    snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"A\",\"data\":[1, 2, 3, 4],\"\\q\":1},%s]}", B);
    expect_fail(body, 0, 400, "bad_json", "not valid JSON");
    /* nesting deeper than cJSON takes */
    size_t n = 1200;
    char *deep = malloc(2 * n + 64);
    assert_non_null(deep);
    strcpy(deep, "{\"x\":");
    memset(deep + 5, '[', n);
    memset(deep + 5 + n, ']', n);
    strcpy(deep + 5 + 2 * n, "}");
    expect_fail(deep, 0, 400, "bad_json", "not valid JSON");
    free(deep);
}

typedef struct {
    uint64_t asked;
    int refuse;
} admit_log;

static int admit(void *user, uint64_t bytes, gemm_err *err)
{
    admit_log *l = user;
    l->asked = bytes;
    if (l->refuse) return gemm_err_set(err, 503, "over_budget", "no room for %llu", (unsigned long long)bytes);
    return 0;
}

/* The tree of the rest is admitted before it is allocated, and the tensor data is not in it. */
static void test_admission(void **state)
{
    (void)state;
    enum { R = 300, C = 300 };
    gemm_buf b;
    gemm_buf_init(&b);
    gemm_buf_puts(&b, "{\"id\":\"x\",\"inputs\":[{\"name\":\"A\",\"shape\":[300,300],\"datatype\":\"FP64\",\"data\":[");
    for (int i = 0; i < R * C; i++) gemm_buf_printf(&b, "%s%d.125", i ? "," : "", i % 1000);
    gemm_buf_puts(&b, "]},{\"name\":\"B\",\"shape\":[300,1],\"datatype\":\"FP64\",\"data\":[");
    for (int i = 0; i < R; i++) gemm_buf_printf(&b, "%s[%d]", i ? "," : "", i);
    gemm_buf_puts(&b, "]}]}");
    assert_false(b.failed);
    const gemm_limits big = {1000, 1000000, 1u << 30};
    gemm_v2_request r;
    gemm_err err;
    admit_log l = {0, 0};
    gemm_v2_request_init(&r);
    assert_int_equal(gemm_v2_parse_request_admitted(b.data, b.len, 0, &big, admit, &l, &r, &err), 0);
    /* a few nodes and strings: KiBs, where the body has MBs (and its tree took ~80 bytes a number) */
    assert_true(l.asked > 0 && l.asked < 16384);
    assert_true(b.len > 500000);
    double *a = malloc(sizeof(double) * R * C), bb[R];
    assert_non_null(a);
    assert_int_equal(gemm_v2_fill_input(&r, 0, a, &err), 0);
    assert_int_equal(gemm_v2_fill_input(&r, 1, bb, &err), 0);
    for (int i = 0; i < R * C; i++) assert_true(a[i] == (i % 1000) + 0.125);
    for (int i = 0; i < R; i++) assert_true(bb[i] == i);
    gemm_v2_request_free(&r);
    free(a);

    /* a refusal: its error, nothing parsed */
    l.refuse = 1;
    gemm_v2_request_init(&r);
    assert_int_equal(gemm_v2_parse_request_admitted(b.data, b.len, 0, &big, admit, &l, &r, &err), -1);
    assert_int_equal(err.status, 503);
    assert_string_equal(err.code, "over_budget");
    assert_null(r.root);
    gemm_v2_request_free(&r);

    /* numbers elsewhere (not tensor data) are in the tree, and in what is admitted */
    gemm_buf o;
    gemm_buf_init(&o);
    gemm_buf_puts(&o, "{\"parameters\":{\"junk\":[");
    for (int i = 0; i < 10000; i++) gemm_buf_printf(&o, "%s%d", i ? "," : "", i);
    gemm_buf_puts(&o, "]},\"inputs\":[]}");
    l.refuse = 0;
    gemm_v2_request_init(&r);
    assert_int_equal(gemm_v2_parse_request_admitted(o.data, o.len, 0, &big, admit, &l, &r, &err), -1);
    assert_string_equal(err.code, "missing_input");
    assert_true(l.asked >= 10000 * sizeof(cJSON));
    gemm_v2_request_free(&r);
    gemm_buf_free(&o);
    gemm_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_datatypes),
        cmocka_unit_test(test_json_flat_and_nested),
        cmocka_unit_test(test_binary_inputs),
        cmocka_unit_test(test_parameters_and_outputs),
        cmocka_unit_test(test_structure_errors),
        cmocka_unit_test(test_value_errors),
        cmocka_unit_test(test_limits_before_allocation),
        cmocka_unit_test(test_id_utf8),
        cmocka_unit_test(test_write_output),
        cmocka_unit_test(test_data_keys),
        cmocka_unit_test(test_data_syntax),
        cmocka_unit_test(test_admission),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
