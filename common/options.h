/*
 * options.h - the options of a request: one table (options.c), a row per option, read by
 * every door (query, form, JSON body, v2 "parameters") and listed by GET /v1/info, so that
 * nothing else knows option names and no door can honour an option another ignores. What
 * each door takes and refuses is docs/API.md's ("Options").
 */
#ifndef GEMM_OPTIONS_H
#define GEMM_OPTIONS_H

#include "gemm_types.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GEMM_OPTION_VALUE_MAX 95 /* bytes of a text value (a resident matrix id is the longest) */

typedef struct {
    gemm_dtype dtype;     /* GEMM_DTYPE_INVALID when not given */
    gemm_dtype out_dtype; /* C's dtype asked for; GEMM_DTYPE_INVALID when not given */
    char kernel[48];      /* "auto" by default */
    uint64_t tile;        /* 0 = default */
    gemm_math math;       /* GEMM_MATH_DEFAULT by default */
    uint64_t panel_of;    /* rows of the whole product these rows of A are a panel of (0 = none) */
    uint64_t m, k, n;     /* raw bodies: the shapes (0 = not given) */
    uint64_t batch;       /* raw bodies: products in the body (0 = not batched) */
    int b_shared;         /* raw bodies: B is one k x n matrix shared by the batch */
    char ref[2][GEMM_OPTION_VALUE_MAX + 1]; /* a=ID, b=ID: resident operands ("" none) */
    int store, ret;       /* store=1: C becomes a resident matrix; return=1: and is sent */
    uint64_t rows, cols;  /* POST /v1/matrices: the shape of a raw or empty matrix */
    int empty;            /* POST /v1/matrices?empty=1: created to be filled by PUTs */
    uint64_t row;         /* PUT /v1/matrices/{id}: the first row sent */
    uint64_t given;       /* bit i: the table's row i was given (by any door) */
    uint64_t door_given;  /* the same, by the door being read (gemm_options_door) */
} gemm_options;

enum { GEMM_DOOR_QUERY = 1, GEMM_DOOR_FORM = 2, GEMM_DOOR_JSON = 4, GEMM_DOOR_V2 = 8 };
#define GEMM_DOOR_COUNT 4

/* How a value is read, and the type of the field it sets. */
typedef enum {
    GEMM_OPT_DTYPE,  /* a dtype name (gemm_dtype_from_name): gemm_dtype */
    GEMM_OPT_MATH,   /* default, fp32, tf32, bf16: gemm_math */
    GEMM_OPT_KERNEL, /* 1 to 47 of a-z, 0-9, _: char[48] */
    GEMM_OPT_UINT,   /* a decimal integer from min to max: uint64_t */
    GEMM_OPT_FLAG,   /* 1/0, true/false, yes/no, on/off: int */
    GEMM_OPT_ID,     /* a resident matrix id: char[GEMM_OPTION_VALUE_MAX + 1] */
    GEMM_OPT_TYPES
} gemm_opt_type;

typedef struct {
    const char *name;
    gemm_opt_type type;
    unsigned doors;      /* GEMM_DOOR_* */
    size_t field;        /* offsetof(gemm_options, ...) */
    uint64_t min, max;   /* GEMM_OPT_UINT */
    int status;          /* of a bad value */
    const char *code;
    const char *example; /* a valid value, or NULL */
    const char *help;
} gemm_option;

/* A value as a door has it (type_name: for another JSON type, "null", "an array", ...). */
typedef enum { GEMM_VAL_TEXT, GEMM_VAL_NUMBER, GEMM_VAL_BOOL, GEMM_VAL_OTHER } gemm_val_kind;
typedef struct {
    gemm_val_kind kind;
    const char *text;
    size_t len;
    double number;
    int boolean;
    const char *type_name;
} gemm_opt_value;

int gemm_option_count(void);
const gemm_option *gemm_option_at(int i);
/* The option named by len bytes of name that door takes, or NULL. */
const gemm_option *gemm_option_find(const char *name, size_t len, unsigned door);
/* "query", "form", "json", "v2" (door bit i); "dtype", "integer", ... (a type). */
extern const char *const gemm_option_doors[GEMM_DOOR_COUNT];
extern const char *const gemm_option_types[GEMM_OPT_TYPES];
/* "dtype, out_dtype, ...": the options of door, into buf. */
const char *gemm_option_names(unsigned door, char *buf, size_t cap);

void gemm_options_init(gemm_options *o);
/* A new door begins: it may give again what earlier doors gave. */
void gemm_options_door(gemm_options *o);
/* Whether the option that sets this field (an offsetof) was given. */
int gemm_options_given(const gemm_options *o, size_t field);

/* Applies v to option d: 0, or -1 with *err, nothing changed. */
int gemm_option_apply(gemm_options *o, const gemm_option *d, const gemm_opt_value *v, gemm_err *err);
/* A door of text (query, form): key=value, by length (value NULL: ""). As
 * gemm_option_apply for an option of door; else 1, or -1 for a control byte. */
int gemm_options_set(gemm_options *o, unsigned door, const char *key, size_t key_len, const char *value,
                     size_t value_len, gemm_err *err);

/* Strict decimal parse: digits only, no sign, no overflow. */
int gemm_parse_u64(const char *s, uint64_t *out);

#ifdef __cplusplus
}
#endif
#endif
