/* test_options.c - the options' table and its reader: every row well formed and found at
 * its doors only, every key, every refusal (with the row's status and code), typed values
 * as JSON and v2 give them, duplicates, control bytes, strict decimal integers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "options.h"

static const unsigned all_doors[GEMM_DOOR_COUNT] = {GEMM_DOOR_QUERY, GEMM_DOOR_FORM, GEMM_DOOR_JSON, GEMM_DOOR_V2};

/* key=value at the query door (value NULL: a key without '='). */
static int set(gemm_options *o, const char *key, const char *value, gemm_err *err)
{
    return gemm_options_set(o, GEMM_DOOR_QUERY, key, strlen(key), value, value ? strlen(value) : 0, err);
}

static const gemm_option *row(const char *name)
{
    const gemm_option *d = gemm_option_find(name, strlen(name), GEMM_DOOR_QUERY);
    assert_non_null(d);
    return d;
}

static void expect_msg(const gemm_err *err, const char *needle, const char *what)
{
    if (needle && !strstr(err->message, needle)) {
        fprintf(stderr, "%s: message \"%s\" lacks \"%s\"\n", what, err->message, needle);
        fail();
    }
}

/* A refused value: status, code, message; and nothing changed but nothing. */
static void expect_bad_value(const char *key, const gemm_opt_value *v, int status, const char *code, const char *needle)
{
    gemm_options o, before;
    gemm_err err;
    gemm_options_init(&o);
    before = o;
    gemm_err_clear(&err);
    assert_int_equal(gemm_option_apply(&o, row(key), v, &err), -1);
    assert_int_equal(err.status, status);
    assert_string_equal(err.code, code);
    expect_msg(&err, needle, key);
    assert_memory_equal(&o, &before, sizeof o); /* a refused value changes nothing */
}

static void expect_bad(const char *key, const char *value, int status, const char *code, const char *needle)
{
    gemm_opt_value v = {.kind = GEMM_VAL_TEXT, .text = value, .len = value ? strlen(value) : 0};
    expect_bad_value(key, &v, status, code, needle);
}

static void test_defaults(void **state)
{
    (void)state;
    gemm_options o;
    memset(&o, 0x5a, sizeof o);
    gemm_options_init(&o);
    assert_int_equal(o.dtype, GEMM_DTYPE_INVALID);
    assert_int_equal(o.out_dtype, GEMM_DTYPE_INVALID);
    assert_string_equal(o.kernel, "auto");
    assert_int_equal(o.tile, 0);
    assert_int_equal(o.math, GEMM_MATH_DEFAULT);
    assert_true(o.m == 0 && o.k == 0 && o.n == 0 && o.panel_of == 0 && o.batch == 0 && o.b_shared == 0);
    assert_true(o.ref[0][0] == '\0' && o.ref[1][0] == '\0' && !o.store && !o.ret && !o.empty);
    assert_true(o.rows == 0 && o.cols == 0 && o.row == 0 && o.given == 0 && o.door_given == 0);
}

/* Every row: a name, a field of its own, a type, doors, an error, help; found at its doors
 * and nowhere else; its example (when it has one) valid at each of them. */
static void test_table(void **state)
{
    (void)state;
    int n = gemm_option_count();
    assert_true(n >= 19 && n <= 64);
    assert_null(gemm_option_at(-1));
    assert_null(gemm_option_at(n));
    for (int i = 0; i < n; i++) {
        const gemm_option *d = gemm_option_at(i);
        assert_non_null(d->name);
        assert_true(strlen(d->name) >= 1 && strspn(d->name, "abcdefghijklmnopqrstuvwxyz_") == strlen(d->name));
        assert_true(d->type < GEMM_OPT_TYPES);
        assert_non_null(gemm_option_types[d->type]);
        assert_true(d->doors != 0 && d->doors < (1u << GEMM_DOOR_COUNT));
        assert_true(d->field < sizeof(gemm_options));
        assert_true(d->status == 400 || d->status == 422);
        assert_true(d->code && d->code[0] && d->help && strlen(d->help) >= 10);
        assert_null(strpbrk(d->help, "{}\"\t\n")); /* `gemm info` prints it as plain text */
        if (d->type == GEMM_OPT_UINT) assert_true(d->min <= d->max);
        for (int j = 0; j < i; j++) {
            assert_string_not_equal(gemm_option_at(j)->name, d->name);
            assert_true(gemm_option_at(j)->field != d->field);
        }
        for (int k = 0; k < GEMM_DOOR_COUNT; k++) {
            const gemm_option *f = gemm_option_find(d->name, strlen(d->name), all_doors[k]);
            assert_ptr_equal(f, (d->doors & all_doors[k]) ? d : NULL);
            if (!f || !d->example) continue;
            gemm_options o;
            gemm_err err;
            gemm_options_init(&o);
            gemm_opt_value v = {.kind = GEMM_VAL_TEXT, .text = d->example, .len = strlen(d->example)};
            assert_int_equal(gemm_option_apply(&o, d, &v, &err), 0);
            assert_int_equal(gemm_options_given(&o, d->field), 1);
        }
    }
    /* every field of gemm_options a request can set has its row */
    static const size_t fields[] = {offsetof(gemm_options, dtype), offsetof(gemm_options, out_dtype),
                                    offsetof(gemm_options, kernel), offsetof(gemm_options, tile),
                                    offsetof(gemm_options, math), offsetof(gemm_options, panel_of),
                                    offsetof(gemm_options, m), offsetof(gemm_options, k), offsetof(gemm_options, n),
                                    offsetof(gemm_options, batch), offsetof(gemm_options, b_shared),
                                    offsetof(gemm_options, ref[0]), offsetof(gemm_options, ref[1]),
                                    offsetof(gemm_options, store), offsetof(gemm_options, ret),
                                    offsetof(gemm_options, rows), offsetof(gemm_options, cols),
                                    offsetof(gemm_options, empty), offsetof(gemm_options, row)};
    for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++) {
        int found = 0;
        for (int i = 0; i < n; i++) found += gemm_option_at(i)->field == fields[f];
        assert_int_equal(found, 1);
    }
    /* panel_of is taken wherever a product's options are */
    const gemm_option *p = row("panel_of");
    assert_int_equal(p->doors, GEMM_DOOR_QUERY | GEMM_DOOR_FORM | GEMM_DOOR_JSON | GEMM_DOOR_V2);
    assert_null(gemm_option_find("dtype", 5, GEMM_DOOR_V2)); /* v2: the inputs' datatype */
    assert_null(gemm_option_find("m", 1, GEMM_DOOR_JSON));
    assert_non_null(gemm_option_find("dtypes", 5, GEMM_DOOR_QUERY)); /* len bytes of name */
    assert_null(gemm_option_find("dtype", 6, GEMM_DOOR_QUERY)); /* "dtype\0" */
    assert_null(gemm_option_find(NULL, 0, GEMM_DOOR_QUERY));
    char names[200];
    gemm_option_names(GEMM_DOOR_FORM, names, sizeof names);
    assert_string_equal(names, "dtype, out_dtype, kernel, tile, math, panel_of, a, b");
    gemm_option_names(GEMM_DOOR_V2, names, 12); /* cut, terminated */
    assert_true(strlen(names) < 12);
    assert_string_equal(gemm_option_doors[0], "query");
    assert_string_equal(gemm_option_doors[3], "v2");
    assert_string_equal(gemm_option_types[GEMM_OPT_UINT], "integer");
}

static void test_set_each_key(void **state)
{
    (void)state;
    gemm_options o;
    gemm_err err;
#define SET(k, v) (gemm_options_door(&o), set(&o, k, v, &err))
    gemm_options_init(&o);
    assert_int_equal(SET("dtype", "float32"), 0);
    assert_int_equal(o.dtype, GEMM_DTYPE_F32);
    assert_int_equal(SET("dtype", "f8"), 0);
    assert_int_equal(o.dtype, GEMM_DTYPE_F64);
    assert_int_equal(SET("dtype", "INT32"), 0);
    assert_int_equal(o.dtype, GEMM_DTYPE_I32);
    assert_int_equal(SET("dtype", "bfloat16"), 0);
    assert_int_equal(o.dtype, GEMM_DTYPE_BF16);
    assert_int_equal(o.out_dtype, GEMM_DTYPE_INVALID);
    assert_int_equal(SET("out_dtype", "float16"), 0);
    assert_int_equal(o.out_dtype, GEMM_DTYPE_F16);
    assert_int_equal(SET("out_dtype", "FP32"), 0); /* the v2 datatype names */
    assert_int_equal(o.out_dtype, GEMM_DTYPE_F32);
    assert_int_equal(SET("out_dtype", "BF16"), 0);
    assert_int_equal(o.out_dtype, GEMM_DTYPE_BF16);
    assert_int_equal(SET("kernel", "tiled"), 0);
    assert_string_equal(o.kernel, "tiled");
    assert_int_equal(SET("kernel", "wgmma_128x256_v2"), 0);
    assert_string_equal(o.kernel, "wgmma_128x256_v2");
    char k47[48];
    memset(k47, 'k', 47);
    k47[47] = '\0';
    assert_int_equal(SET("kernel", k47), 0);
    assert_string_equal(o.kernel, k47);
    assert_int_equal(SET("tile", "1"), 0);
    assert_int_equal(o.tile, 1);
    assert_int_equal(SET("tile", "1024"), 0);
    assert_int_equal(o.tile, 1024);
    assert_int_equal(SET("tile", "032"), 0);
    assert_int_equal(o.tile, 32);
    const char *maths[] = {"default", "fp32", "tf32", "bf16"};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(SET("math", maths[i]), 0);
        assert_int_equal(o.math, i);
    }
    assert_int_equal(SET("m", "3"), 0);
    assert_int_equal(SET("k", "0"), 0);
    assert_int_equal(SET("n", "18446744073709551615"), 0);
    assert_true(o.m == 3 && o.k == 0 && o.n == UINT64_MAX);
    assert_int_equal(o.panel_of, 0);
    assert_int_equal(SET("panel_of", "4096"), 0);
    assert_int_equal(o.panel_of, 4096);
    assert_int_equal(SET("panel_of", "1"), 0);
    assert_int_equal(o.panel_of, 1);
    assert_int_equal(SET("batch", "7"), 0);
    assert_int_equal(o.batch, 7);
    const char *yes[] = {"1", "true", "TRUE", "yes", "On"}, *no[] = {"0", "false", "No", "off"};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(SET("b_shared", yes[i]), 0);
        assert_int_equal(o.b_shared, 1);
        assert_int_equal(SET("store", yes[i]), 0);
        assert_int_equal(o.store, 1);
    }
    for (int i = 0; i < 4; i++) {
        assert_int_equal(SET("return", no[i]), 0);
        assert_int_equal(o.ret, 0);
        assert_int_equal(SET("empty", no[i]), 0);
        assert_int_equal(o.empty, 0);
    }
    assert_int_equal(SET("a", "node-1-0123456789abcdef0123456789abcdef"), 0);
    assert_string_equal(o.ref[0], "node-1-0123456789abcdef0123456789abcdef");
    assert_int_equal(SET("b", "x"), 0); /* any id: whether a matrix has it is the store's business */
    assert_string_equal(o.ref[1], "x");
    assert_int_equal(SET("rows", "5"), 0);
    assert_int_equal(SET("cols", "0"), 0);
    assert_int_equal(SET("row", "4"), 0);
    assert_true(o.rows == 5 && o.cols == 0 && o.row == 4);
#undef SET
}

static void test_unknown_keys(void **state)
{
    (void)state;
    gemm_options o, before;
    gemm_err err;
    gemm_options_init(&o);
    before = o;
    const char *keys[] = {"Dtype", "tiles", "mm", "K", "", "format", "dtype ", "binary_data_output", "c"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) assert_int_equal(set(&o, keys[i], "1", &err), 1);
    assert_int_equal(gemm_options_set(&o, GEMM_DOOR_QUERY, NULL, 0, "1", 1, &err), 1);
    /* an option of other doors only is not one here */
    assert_int_equal(gemm_options_set(&o, GEMM_DOOR_JSON, "m", 1, "1", 1, &err), 1);
    assert_int_equal(gemm_options_set(&o, GEMM_DOOR_FORM, "store", 5, "1", 1, &err), 1);
    assert_int_equal(gemm_options_set(&o, GEMM_DOOR_V2, "dtype", 5, "float32", 7, &err), 1);
    assert_memory_equal(&o, &before, sizeof o);
}

static void test_bad_values(void **state)
{
    (void)state;
    expect_bad("dtype", "float8", 422, "bad_option", "dtype 'float8'");
    expect_bad("dtype", "float8", 422, "bad_option", "float32, float64, int32, float16 or bfloat16");
    expect_bad("out_dtype", "float8", 422, "bad_out_dtype", "float8");
    expect_bad("out_dtype", "UINT8", 422, "bad_out_dtype", "UINT8");
    expect_bad("dtype", "", 422, "bad_option", NULL);
    expect_bad("dtype", NULL, 422, "bad_option", NULL);
    expect_bad("kernel", "", 422, "bad_option", "kernel");
    expect_bad("kernel", "Tiled", 422, "bad_option", "a-z");
    expect_bad("kernel", "../etc", 422, "bad_option", NULL);
    expect_bad("kernel", "tiled ", 422, "bad_option", NULL);
    char k48[49];
    memset(k48, 'k', 48);
    k48[48] = '\0';
    expect_bad("kernel", k48, 422, "bad_option", "...");
    const char *tiles[] = {"0", "1025", "-1", "+16", " 16", "16 ", "1e2", "16.0", "0x10", "", "99999999999999999999999"};
    for (size_t i = 0; i < sizeof tiles / sizeof tiles[0]; i++) expect_bad("tile", tiles[i], 422, "bad_option", "1 to 1024");
    expect_bad("math", "fp16", 422, "bad_option", "default, fp32, tf32 or bf16");
    expect_bad("math", "", 422, "bad_option", NULL);
    const char *dims[] = {"-1", "+1", " 1", "1 ", "1.0", "1e3", "0x10", "", "18446744073709551616", "abc", "1,2"};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        expect_bad("m", dims[i], 400, "bad_dimension", "m '");
        expect_bad("k", dims[i], 400, "bad_dimension", "k '");
        expect_bad("n", dims[i], 400, "bad_dimension", "digits only");
        expect_bad("rows", dims[i], 400, "bad_dimension", "rows '");
        expect_bad("row", dims[i], 400, "bad_option", "row '");
    }
    /* panel_of: a count of rows, >= 1 (whether it is >= m is the engine's check) */
    const char *rows[] = {"0", "-1", "+8", " 8", "8 ", "8.0", "1e3", "0x10", "", "18446744073709551616", "abc"};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        expect_bad("panel_of", rows[i], 422, "bad_option", "panel_of '");
    expect_bad("batch", "0", 400, "bad_dimension", ">= 1");
    gemm_options o;
    gemm_err err;
    gemm_options_init(&o);
    assert_int_equal(set(&o, "panel_of", "0", &err), -1);
    assert_string_equal(err.message, "panel_of '0' is not valid; use a decimal integer (digits only) >= 1");
    const char *flags[] = {"2", "", "maybe", "truee", "-1"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        expect_bad("b_shared", flags[i], 400, "bad_option", "1 or 0");
        expect_bad("store", flags[i], 400, "bad_option", "store '");
        expect_bad("empty", flags[i], 400, "bad_option", NULL);
    }
    expect_bad("a", "", 400, "bad_option", "resident matrix");
    char long_id[GEMM_OPTION_VALUE_MAX + 2];
    memset(long_id, 'f', sizeof long_id - 1);
    long_id[sizeof long_id - 1] = '\0';
    expect_bad("b", long_id, 400, "bad_option", "...");
    long_id[GEMM_OPTION_VALUE_MAX] = '\0'; /* the longest there is */
    gemm_options_init(&o);
    assert_int_equal(set(&o, "b", long_id, &err), 0);
    assert_string_equal(o.ref[1], long_id);

    /* values are echoed printable and bounded */
    char longv[300];
    memset(longv, 'z', sizeof longv - 1);
    longv[sizeof longv - 1] = '\0';
    longv[3] = '~';
    longv[4] = '\x80';
    gemm_options_init(&o);
    assert_int_equal(set(&o, "dtype", longv, &err), -1);
    assert_null(strchr(err.message, 0x80));
    assert_true(strlen(err.message) < 200);
    assert_non_null(strstr(err.message, "zzz~?zz"));
}

/* Values as JSON and v2 give them: numbers, booleans, other types. */
static void test_typed_values(void **state)
{
    (void)state;
    gemm_options o;
    gemm_err err;
    gemm_opt_value num = {.kind = GEMM_VAL_NUMBER, .number = 16};
    gemm_options_init(&o);
    assert_int_equal(gemm_option_apply(&o, row("tile"), &num, &err), 0);
    assert_int_equal(o.tile, 16);
    num.number = 4096;
    assert_int_equal(gemm_option_apply(&o, row("panel_of"), &num, &err), 0);
    assert_int_equal(o.panel_of, 4096);
    num.number = 1;
    assert_int_equal(gemm_option_apply(&o, row("store"), &num, &err), 0);
    assert_int_equal(o.store, 1);
    gemm_opt_value yes = {.kind = GEMM_VAL_BOOL, .boolean = 1};
    assert_int_equal(gemm_option_apply(&o, row("empty"), &yes, &err), 0);
    assert_int_equal(o.empty, 1);

    /* an integer option: an integer number, as its decimal text would be */
    static const double bad_counts[] = {0, 1025, 2.5, -16, 1e300, -0.5};
    for (size_t i = 0; i < sizeof bad_counts / sizeof bad_counts[0]; i++) {
        gemm_opt_value v = {.kind = GEMM_VAL_NUMBER, .number = bad_counts[i]};
        expect_bad_value("tile", &v, 422, "bad_option", "1 to 1024");
    }
    gemm_opt_value v = {.kind = GEMM_VAL_NUMBER, .number = 2.5};
    expect_bad_value("tile", &v, 422, "bad_option", "tile '2.5'");
    v.number = 0;
    expect_bad_value("panel_of", &v, 422, "bad_option", "panel_of '0'");
    /* names take strings only */
    v.number = 32;
    expect_bad_value("dtype", &v, 422, "bad_option", "dtype is a number; expected a string");
    expect_bad_value("kernel", &v, 422, "bad_option", "kernel is a number");
    expect_bad_value("out_dtype", &v, 422, "bad_out_dtype", "out_dtype is a number");
    expect_bad_value("tile", &yes, 422, "bad_option", "tile is a boolean; expected an integer");
    expect_bad_value("math", &yes, 422, "bad_option", "math is a boolean; expected a string");
    gemm_opt_value other = {.kind = GEMM_VAL_OTHER, .type_name = "an array"};
    expect_bad_value("kernel", &other, 422, "bad_option", "kernel is an array");
    expect_bad_value("panel_of", &other, 422, "bad_option", "panel_of is an array");
    other.type_name = "null";
    expect_bad_value("b_shared", &other, 400, "bad_option", "b_shared is null; expected true, false, 1 or 0");
    other.type_name = NULL;
    expect_bad_value("dtype", &other, 422, "bad_option", "dtype is not a value");
}

/* A door gives an option once; the next door may give it again. */
static void test_duplicates(void **state)
{
    (void)state;
    gemm_options o;
    gemm_err err;
    gemm_options_init(&o);
    assert_int_equal(set(&o, "m", "1", &err), 0);
    assert_int_equal(set(&o, "m", "1000", &err), -1);
    assert_int_equal(err.status, 400);
    assert_string_equal(err.code, "duplicate_option");
    assert_non_null(strstr(err.message, "m is given twice"));
    assert_int_equal(o.m, 1);
    assert_int_equal(set(&o, "dtype", "float8", &err), -1); /* refused: not given */
    assert_int_equal(set(&o, "dtype", "float32", &err), 0);
    gemm_options_door(&o);
    assert_int_equal(gemm_options_given(&o, offsetof(gemm_options, m)), 1); /* still known as given */
    gemm_opt_value v = {.kind = GEMM_VAL_TEXT, .text = "float64", .len = 7};
    assert_int_equal(gemm_option_apply(&o, row("dtype"), &v, &err), 0); /* a body over the query */
    assert_int_equal(o.dtype, GEMM_DTYPE_F64);
    assert_int_equal(gemm_option_apply(&o, row("dtype"), &v, &err), -1);
    assert_string_equal(err.code, "duplicate_option");
    assert_int_equal(gemm_options_given(&o, offsetof(gemm_options, n)), 0);
    assert_int_equal(gemm_options_given(&o, 3), 0); /* no row sets that */
}

/* Control bytes: in an option's value, 400 with its code; in any other key or value, 400
 * bad_option; a NUL counts, wherever it is. */
static void test_control_bytes(void **state)
{
    (void)state;
    gemm_options o, before;
    gemm_err err;
    gemm_options_init(&o);
    before = o;
    assert_int_equal(gemm_options_set(&o, GEMM_DOOR_QUERY, "m", 1, "1\0", 2, &err), -1);
    assert_int_equal(err.status, 400);
    assert_string_equal(err.code, "bad_dimension");
    assert_non_null(strstr(err.message, "control byte (0x00)"));
    assert_int_equal(gemm_options_set(&o, GEMM_DOOR_QUERY, "dtype", 5, "float32\n", 8, &err), -1);
    assert_int_equal(err.status, 400);
    assert_string_equal(err.code, "bad_option");
    assert_int_equal(gemm_options_set(&o, GEMM_DOOR_FORM, "out_dtype", 9, "\x7f" "float32", 8, &err), -1);
    assert_int_equal(err.status, 400);
    assert_string_equal(err.code, "bad_out_dtype");
    assert_int_equal(gemm_options_set(&o, GEMM_DOOR_QUERY, "dtype\0x", 7, "float32", 7, &err), -1);
    assert_string_equal(err.code, "bad_option");
    assert_int_equal(gemm_options_set(&o, GEMM_DOOR_QUERY, "other", 5, "\t", 1, &err), -1);
    assert_int_equal(err.status, 400);
    assert_non_null(strstr(err.message, "'other'"));
    gemm_opt_value v = {.kind = GEMM_VAL_TEXT, .text = "auto\0", .len = 5};
    assert_int_equal(gemm_option_apply(&o, row("kernel"), &v, &err), -1);
    assert_int_equal(err.status, 400);
    assert_memory_equal(&o, &before, sizeof o);
    assert_int_equal(gemm_options_set(&o, GEMM_DOOR_QUERY, "other", 5, "\xc3\xa9", 2, &err), 1); /* UTF-8 is text */
}

static void test_parse_u64(void **state)
{
    (void)state;
    uint64_t v = 77;
    assert_int_equal(gemm_parse_u64("0", &v), 0);
    assert_int_equal(v, 0);
    assert_int_equal(gemm_parse_u64("000123", &v), 0);
    assert_int_equal(v, 123);
    assert_int_equal(gemm_parse_u64("18446744073709551615", &v), 0);
    assert_true(v == UINT64_MAX);
    v = 77;
    const char *bad[] = {"18446744073709551616", "99999999999999999999", "", "-0", "+0", " 0", "0 ", "1_000", "١"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) assert_int_equal(gemm_parse_u64(bad[i], &v), -1);
    assert_int_equal(gemm_parse_u64(NULL, &v), -1);
    assert_int_equal(v, 77); /* untouched on failure */
    /* every value up to a few thousand, and random ones, round-trip through printf */
    uint64_t s = 88172645463325252ull;
    for (int i = 0; i < 20000; i++) {
        uint64_t x;
        if (i < 5000) x = (uint64_t)i;
        else {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            x = s >> (s % 64);
        }
        char buf[32];
        snprintf(buf, sizeof buf, "%llu", (unsigned long long)x);
        assert_int_equal(gemm_parse_u64(buf, &v), 0);
        assert_true(v == x);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),      cmocka_unit_test(test_table),      cmocka_unit_test(test_set_each_key),
        cmocka_unit_test(test_unknown_keys),  cmocka_unit_test(test_bad_values), cmocka_unit_test(test_typed_values),
        cmocka_unit_test(test_duplicates),    cmocka_unit_test(test_control_bytes),
        cmocka_unit_test(test_parse_u64),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
