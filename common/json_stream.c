/* json_stream.c - the JSON request body decoded as it arrives (see json_stream.h).
 *
 * A pushdown tokenizer: `state` says what may come next, the stack holds one frame per
 * open array or object with the role it plays (the top object, a matrix as rows, one row, a
 * matrix object, its shape, its data, or something ignored). Tokens may be cut anywhere by
 * chunk ends: strings and literals keep their progress in the state, numbers cut by a chunk
 * end are copied into a small buffer and finished from there. Numbers inside a row or a
 * data array take a fast loop that stays inside the chunk.
 *
 * Errors other than syntax are noted with a rank (lower wins; equal ranks keep the first)
 * and reading goes on without storing, so that a later syntax error still wins and the
 * shapes in messages are whole (see json_stream.h for the order).
 */
#include "json_stream.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_number.h"
#include "json_store.h"

#define STR_MAX 255      /* captured keys and option values */
#define STRINGIFY_(x) #x
#define STRINGIFY(x) STRINGIFY_(x)
#define NUM_MAX_TEXT STRINGIFY(GEMM_JSON_NUMBER_MAX)

enum role { R_SKIP, R_ROOT, R_ROWS, R_ROW, R_MATOBJ, R_SHAPE, R_DATA };
enum key { K_NONE, K_A, K_B, K_DTYPE, K_KERNEL, K_TILE, K_MATH, K_SHAPE, K_DATA, K_OTHER };
enum state { S_VALUE, S_ARR_FIRST, S_OBJ_FIRST, S_KEY, S_COLON, S_NEXT, S_END, S_STRING, S_NUMBER, S_LITERAL };
enum vtype { T_STRING, T_NUMBER, T_BOOL, T_NULL, T_ARRAY, T_OBJECT };

/* Error ranks: the lowest noted is reported. */
enum {
    RK_ROOT = 10,     /* the body is not an object */
    RK_OPT = 20,      /* + 0..3: dtype, kernel, tile, math */
    RK_STRUCT = 30,   /* + 10 x: operand x's structure; + 1: its data (after its shape) */
    RK_PRODUCT = 50,  /* gemm_check_product */
    RK_COUNT = 60,    /* + x: data length against the shape */
    RK_MEMORY = 66,   /* an allocation failed */
    RK_ELEM = 70,     /* + x: the first bad element of operand x */
    RK_NONE = 1000
};

typedef struct {
    uint8_t kind; /* '{' or '[' */
    uint8_t role;
    uint8_t x;    /* operand, for matrix roles */
    uint8_t key;  /* objects: the key whose value comes next */
    uint64_t n;   /* values finished in this container */
} frame;

typedef struct {
    const char *name;
    int present;          /* the key was given (the first time) */
    int form;             /* 0 none yet, '[' rows, '{' shape/data, other: wrong type */
    int complete;         /* its value has closed */
    uint64_t rows, ncols; /* rows form: rows closed so far, elements of row 0 */
    int seen_shape, seen_data;
    int shape_state;      /* 0 not read, 1 valid, 2 invalid */
    uint64_t shape[2];    /* declared [rows, cols] */
    uint64_t count;       /* elements read (stored or not): the index of the next one */
    int started;          /* storing has begun (the element type is chosen) */
    int dead;             /* no longer stored */
    int has_bad;          /* an element error is noted at bad_index */
    uint64_t bad_index;
    gemm_json_store st;
} operand;

struct gemm_json_stream {
    gemm_limits lim;
    const gemm_limits *limp;
    const gemm_allocator *alloc;
    gemm_options opt;
    int body_dtype;          /* the body named a valid dtype */
    int seen_key[K_OTHER];   /* top-level keys already met */
    uint64_t body_max;        /* the body has at most this many bytes (0: unknown) */
    /* position */
    const char *data;        /* the chunk being fed, which starts at offset base */
    uint64_t base, line, line_start;
    int state;
    int depth;
    frame stack[GEMM_JSON_MAX_DEPTH];
    /* the token in progress */
    int str_key, str_capture, str_over;
    size_t str_len;
    char str[STR_MAX + 1];
    int esc;                 /* 0; 1 after '\'; 2..5 \u digits; 6 '\' and 7 'u' of a low surrogate; 8..11 its digits */
    uint32_t ucode, uhigh;
    const char *lit;
    int lit_pos;
    enum vtype lit_type;
    size_t num_len;
    uint64_t num_off;
    char num[GEMM_JSON_NUMBER_MAX + 2]; /* a cut number: up to one character more than allowed */
    /* errors */
    int failed;              /* a syntax error, in syn */
    gemm_err syn;
    int rank;
    gemm_err err;
    int nul_seen;
    uint64_t nul_off;
    gemm_json_mem mem;       /* what the stores hold from the allocator */
    operand op[2];
};

/* ---- small helpers ------------------------------------------------------------ */

static const char *type_name(enum vtype t)
{
    switch (t) {
    case T_STRING: return "a string";
    case T_NUMBER: return "a number";
    case T_BOOL: return "a boolean";
    case T_NULL: return "null";
    case T_ARRAY: return "an array";
    default: return "an object";
    }
}

static inline int is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
static inline int is_digit(char c) { return (unsigned char)(c - '0') < 10; }

static inline uint64_t off_of(const gemm_json_stream *s, const char *p) { return s->base + (uint64_t)(p - s->data); }

static inline const char *skip_ws(gemm_json_stream *s, const char *p, const char *end)
{
    while (p < end && is_ws(*p)) {
        if (*p == '\n') {
            s->line++;
            s->line_start = off_of(s, p) + 1;
        }
        p++;
    }
    return p;
}

/* A syntax error at absolute offset off: final. Returns -1. why == NULL: data after the
 * JSON value. */
static int syntax_at(gemm_json_stream *s, uint64_t off, const char *why)
{
    if (s->failed) return -1;
    s->failed = 1;
    uint64_t col = off >= s->line_start ? off - s->line_start + 1 : 1;
    if (!why)
        gemm_err_set(&s->syn, 400, "bad_json", "unexpected data after the JSON value at byte %llu (line %llu, column %llu)",
                     (unsigned long long)off, (unsigned long long)s->line, (unsigned long long)col);
    else
        gemm_err_set(&s->syn, 400, "bad_json", "invalid JSON at byte %llu (line %llu, column %llu): %s",
                     (unsigned long long)off, (unsigned long long)s->line, (unsigned long long)col, why);
    return -1;
}

/* ---- memory ------------------------------------------------------------------- */

/* Stops storing operand o and gives its memory back. */
static void kill_op(gemm_json_stream *s, operand *o)
{
    (void)s;
    o->dead = 1;
    gemm_json_store_release(&o->st);
}

/* ---- semantic errors ------------------------------------------------------------ */

/* Notes an error of this rank unless one of a lower (or, without replace, equal) rank is
 * noted. An error that makes the body fail whatever the elements hold lets both operands go. */
static void note(gemm_json_stream *s, int rank, int replace, int status, const char *code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 6, 7)))
#endif
    ;

static void note(gemm_json_stream *s, int rank, int replace, int status, const char *code, const char *fmt, ...)
{
    if (rank > s->rank || (rank == s->rank && !replace)) return;
    char msg[sizeof s->err.message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    s->rank = rank;
    gemm_err_set(&s->err, status, code, "%s", msg);
    if (rank < RK_ELEM) {
        kill_op(s, &s->op[0]);
        kill_op(s, &s->op[1]);
    }
}

/* Where an element sits, for messages: "a[2][1]" or "b.data[4]". */
static const char *place(char *buf, size_t cap, const operand *o, uint64_t i, uint64_t j)
{
    if (o->form == '{') snprintf(buf, cap, "%s.data[%llu]", o->name, (unsigned long long)j);
    else snprintf(buf, cap, "%s[%llu][%llu]", o->name, (unsigned long long)i, (unsigned long long)j);
    return buf;
}

/* place() from a row-major index (rows of ncols). */
static const char *place_index(char *buf, size_t cap, const operand *o, uint64_t idx)
{
    if (o->form == '{' || o->ncols == 0) return place(buf, cap, o, 0, idx);
    return place(buf, cap, o, idx / o->ncols, idx % o->ncols);
}

static void shape_error(gemm_json_stream *s, int x)
{
    note(s, RK_STRUCT + 10 * x, 0, 400, "bad_matrix", "%s.shape must be [rows, cols] with two non-negative integers",
         s->op[x].name);
}

/* ---- storage -------------------------------------------------------------------- */

/* The shape of operand o when it is fully known and well formed. */
static int known_shape(const operand *o, uint64_t *rows, uint64_t *cols)
{
    if (!o->complete) return 0;
    if (o->form == '[') {
        *rows = o->rows;
        *cols = o->rows ? o->ncols : 0;
        return 1;
    }
    if (o->form == '{' && o->shape_state == 1) {
        *rows = o->shape[0];
        *cols = o->shape[1];
        return 1;
    }
    return 0;
}

static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* The most elements operand x can have and still be valid, from what is known now; *exact
 * when that is its size. */
static uint64_t max_elements(const gemm_json_stream *s, int x, int *exact)
{
    const operand *o = &s->op[x], *other = &s->op[1 - x];
    uint64_t m = (uint64_t)(SIZE_MAX / 8), orows, ocols;
    *exact = 0;
    if (s->limp && s->lim.max_elements) m = min_u64(m, s->lim.max_elements);
    if (o->form == '{') {
        if (o->shape_state == 1) {
            *exact = 1;
            return min_u64(m, o->shape[0] * o->shape[1]); /* checked not to overflow */
        }
        return m;
    }
    int other_known = known_shape(other, &orows, &ocols);
    if (o->rows == 0) { /* row 0 is being read: its length is the column count */
        if (s->limp && s->lim.max_dim) m = min_u64(m, s->lim.max_dim);
        if (x == 0 && other_known) m = min_u64(m, orows); /* A's columns are B's rows */
        return m;
    }
    if (x == 1 && other_known && ocols && o->ncols && ocols <= m / o->ncols) { /* B's rows are A's columns */
        *exact = 1;
        return ocols * o->ncols;
    }
    if (s->limp && s->lim.max_dim && o->ncols && s->lim.max_dim <= m / o->ncols) m = min_u64(m, s->lim.max_dim * o->ncols);
    return m;
}

static void start_storage(gemm_json_stream *s, operand *o)
{
    o->started = 1;
    gemm_json_store_start(&o->st, s->opt.dtype, !s->body_dtype);
}

static void out_of_memory(gemm_json_stream *s, operand *o)
{
    note(s, RK_MEMORY, 0, 500, "out_of_memory", "could not allocate memory for %s (%zu bytes held)", o->name,
         s->mem.now);
    kill_op(s, o);
}

/* Room for element index i of operand x (its store is full). 0, or -1 when x stops being
 * stored (the element is one too many for any valid body, or memory ran out). */
static int make_room(gemm_json_stream *s, operand *o, int x)
{
    int exact;
    uint64_t limit = max_elements(s, x, &exact);
    /* each element still to come takes at least two bytes of the body ("1," or "1]") */
    uint64_t more = UINT64_MAX;
    if (s->body_max) more = (s->body_max > s->base ? s->body_max - s->base : 0) / 2 + 1;
    int r = gemm_json_store_room(&o->st, limit, exact, more);
    if (r == 0) return 0;
    if (r < 0) out_of_memory(s, o);
    else kill_op(s, o);
    return -1;
}

/* The element error at index i of operand x: noted if it is the first. */
static void elem_error_at(gemm_json_stream *s, int x, uint64_t i)
{
    operand *o = &s->op[x];
    if (!o->has_bad) {
        o->has_bad = 1;
        o->bad_index = i;
    }
}

/* A value out of the dtype's range (v is its float64 value). */
static void bad_value(gemm_json_stream *s, int x, gemm_dtype d, uint64_t idx, double v, int replace)
{
    char w[96];
    const operand *o = &s->op[x];
    place_index(w, sizeof w, o, idx);
    if (d == GEMM_DTYPE_F32)
        note(s, RK_ELEM + x, replace, 422, "bad_value", "%s = %.17g is beyond float32's range (+-%.9g)", w, v,
             (double)FLT_MAX);
    else if (d == GEMM_DTYPE_F64)
        note(s, RK_ELEM + x, replace, 422, "bad_value", "%s is beyond float64's range", w);
    else
        note(s, RK_ELEM + x, replace, 422, "bad_value",
             "%s = %.17g is not an int32 (integers from -2147483648 to 2147483647)", w, v);
}

static inline int i32_ok(double v) { return v >= -2147483648.0 && v <= 2147483647.0 && v == floor(v); }

/* The next element of operand x, a number. */
static void store_number(gemm_json_stream *s, int x, const gemm_decimal *d)
{
    operand *o = &s->op[x];
    uint64_t i = o->count++;
    if (o->dead) return;
    if (!o->started) start_storage(s, o);
    if (!o->st.left && make_room(s, o, x)) return;
    switch (o->st.type) {
    case GEMM_DTYPE_F64: {
        double v = gemm_decimal_to_f64(d);
        memcpy(gemm_json_store_next(&o->st), &v, 8);
        if (o->st.deferred) {
            if (gemm_f64_is_f32_midpoint(v)) {
                float f = gemm_decimal_to_f32(d);
                if (f != (float)v && gemm_json_store_flip(&o->st, i, f)) out_of_memory(s, o);
            }
        } else if (!isfinite(v)) {
            elem_error_at(s, x, i);
            bad_value(s, x, GEMM_DTYPE_F64, i, v, 0);
        }
        break;
    }
    case GEMM_DTYPE_F32: {
        float f = gemm_decimal_to_f32(d);
        memcpy(gemm_json_store_next(&o->st), &f, 4);
        if (isinf(f)) {
            elem_error_at(s, x, i);
            bad_value(s, x, GEMM_DTYPE_F32, i, gemm_decimal_to_f64(d), 0);
        }
        break;
    }
    default: {
        int32_t v = 0;
        if (d->integer && !d->trunc && d->w <= 2147483647ull) {
            v = d->neg ? -(int32_t)d->w : (int32_t)d->w;
        } else if (d->integer && !d->trunc && d->neg && d->w == 2147483648ull) {
            v = INT32_MIN;
        } else {
            double f = gemm_decimal_to_f64(d);
            if (i32_ok(f)) {
                v = (int32_t)f;
            } else {
                elem_error_at(s, x, i);
                bad_value(s, x, GEMM_DTYPE_I32, i, f, 0);
            }
        }
        memcpy(gemm_json_store_next(&o->st), &v, 4);
        break;
    }
    }
}

/* The next element of operand x is not a number. */
static void store_other(gemm_json_stream *s, int x, enum vtype t, uint64_t row, uint64_t col)
{
    operand *o = &s->op[x];
    uint64_t i = o->count++;
    char w[96];
    elem_error_at(s, x, i);
    note(s, RK_ELEM + x, 0, 400, "bad_matrix", "%s is %s, expected a number", place(w, sizeof w, o, row, col),
         type_name(t));
    if (o->dead) return;
    if (!o->started) start_storage(s, o);
    if (!o->st.left && make_room(s, o, x)) return;
    memset(gemm_json_store_next(&o->st), 0, o->st.es);
}

/* Operand x's data has a length its shape does not allow. */
static void count_error(gemm_json_stream *s, int x)
{
    const operand *o = &s->op[x];
    note(s, RK_COUNT + x, 0, 400, "bad_matrix", "%s.data has %llu numbers but shape [%llu,%llu] needs %llu", o->name,
         (unsigned long long)o->count, (unsigned long long)o->shape[0], (unsigned long long)o->shape[1],
         (unsigned long long)(o->shape[0] * o->shape[1]));
}

/* Operand o's elements are all read: in their final type they are assembled now, unless
 * the body fails anyway (held as float64 for a later dtype: at the end). */
static void settle(gemm_json_stream *s, operand *o)
{
    uint64_t bad;
    double v;
    if (o->dead || !o->started || o->st.deferred || o->count == 0 || s->rank < RK_NONE) return;
    if (gemm_json_store_assemble(&o->st, o->st.type, 0, 1, &bad, &v)) out_of_memory(s, o);
}

/* ---- what values mean ----------------------------------------------------------------- */

static void option_value(gemm_json_stream *s, int key, enum vtype t, const char *str, const gemm_decimal *d)
{
    static const char *const names[] = {"dtype", "kernel", "tile", "math"};
    int k = key - K_DTYPE;
    const char *name = names[k];
    char num[32];
    gemm_err e;
    if (t == T_NUMBER) {
        double v = gemm_decimal_to_f64(d);
        if (v >= 0 && v <= 1e15 && v == floor(v)) {
            snprintf(num, sizeof num, "%.0f", v);
            str = num;
            t = T_STRING;
        }
    }
    if (t != T_STRING) {
        note(s, RK_OPT + k, 0, 422, "bad_option", "\"%s\" is %s; expected a string%s", name, type_name(t),
             key == K_TILE ? " or a positive integer" : "");
        return;
    }
    gemm_err_clear(&e);
    if (gemm_options_set(&s->opt, name, str, &e) < 0) {
        note(s, RK_OPT + k, 0, e.status, e.code, "%s", e.message);
        return;
    }
    if (key == K_DTYPE) s->body_dtype = 1;
}

/* A scalar value (string, number, boolean, null) has been read in the current container. */
static void scalar(gemm_json_stream *s, enum vtype t, const char *str, const gemm_decimal *d)
{
    if (s->depth == 0) {
        note(s, RK_ROOT, 0, 400, "bad_matrix", "the body is %s; expected a JSON object {\"a\": [[..]], \"b\": [[..]]}",
             type_name(t));
        return;
    }
    frame *f = &s->stack[s->depth - 1];
    operand *o = &s->op[f->x];
    switch (f->role) {
    case R_ROW:
    case R_DATA:
        if (t == T_NUMBER) store_number(s, f->x, d);
        else store_other(s, f->x, t, f->role == R_ROW ? s->stack[s->depth - 2].n : 0, f->n);
        return;
    case R_ROOT:
        if (f->key == K_A || f->key == K_B) {
            o = &s->op[f->key - K_A];
            o->form = 'x';
            note(s, RK_STRUCT + 10 * (f->key - K_A), 0, 400, "bad_matrix",
                 "%s is %s; expected nested arrays [[..],[..]] or {\"shape\": [m,k], \"data\": [..]}", o->name,
                 type_name(t));
        } else if (f->key >= K_DTYPE && f->key <= K_MATH) {
            option_value(s, f->key, t, str, d);
        }
        return;
    case R_ROWS:
        if (t == T_NUMBER && f->n == 0)
            note(s, RK_STRUCT + 10 * f->x, 0, 400, "bad_matrix",
                 "%s is a 1-D array; a matrix is an array of rows, e.g. [[1,2],[3,4]]", o->name);
        else
            note(s, RK_STRUCT + 10 * f->x, 0, 400, "bad_matrix", "%s[%llu] is %s, expected an array (a row)", o->name,
                 (unsigned long long)f->n, type_name(t));
        return;
    case R_MATOBJ:
        if (f->key == K_SHAPE) {
            shape_error(s, f->x);
        } else if (f->key == K_DATA) {
            note(s, RK_STRUCT + 10 * f->x + 1, 0, 400, "bad_matrix",
                 "%s.data must be an array of numbers (row-major), not %s", o->name, type_name(t));
        }
        return;
    case R_SHAPE: {
        double v = t == T_NUMBER ? gemm_decimal_to_f64(d) : -1;
        if (!(v >= 0 && v <= 9007199254740992.0) || v != floor(v) || f->n >= 2) o->shape_state = 2;
        else o->shape[f->n] = (uint64_t)v;
        return;
    }
    default:
        return;
    }
}

/* An array or object opens: the role it plays. */
static int open_role(gemm_json_stream *s, char c, int *x)
{
    enum vtype t = c == '[' ? T_ARRAY : T_OBJECT;
    *x = 0;
    if (s->depth == 0) {
        if (c == '{') return R_ROOT;
        scalar(s, t, NULL, NULL); /* the same message as for a scalar */
        return R_SKIP;
    }
    frame *f = &s->stack[s->depth - 1];
    operand *o = &s->op[f->x];
    *x = f->x;
    switch (f->role) {
    case R_ROOT:
        if (f->key == K_A || f->key == K_B) {
            *x = f->key - K_A;
            s->op[*x].form = c;
            return c == '[' ? R_ROWS : R_MATOBJ;
        }
        if (f->key >= K_DTYPE && f->key <= K_MATH) option_value(s, f->key, t, NULL, NULL);
        return R_SKIP;
    case R_ROWS:
        if (c == '{') {
            scalar(s, t, NULL, NULL);
            return R_SKIP;
        }
        /* row f->n begins */
        if (!o->dead) {
            uint64_t orows, ocols;
            if ((s->limp && s->lim.max_dim && f->n >= s->lim.max_dim) ||
                (f->x == 1 && known_shape(&s->op[0], &orows, &ocols) && f->n >= ocols))
                kill_op(s, o); /* one row too many */
        }
        return R_ROW;
    case R_ROW:
    case R_DATA:
        store_other(s, f->x, t, f->role == R_ROW ? s->stack[s->depth - 2].n : 0, f->n);
        return R_SKIP;
    case R_MATOBJ:
        if (f->key == K_SHAPE) {
            if (c == '[') return R_SHAPE;
            shape_error(s, f->x);
        } else if (f->key == K_DATA) {
            if (c == '[') return R_DATA;
            scalar(s, t, NULL, NULL);
        }
        return R_SKIP;
    case R_SHAPE:
        o->shape_state = 2;
        return R_SKIP;
    default:
        return R_SKIP;
    }
}

/* The container on top of the stack closes. */
static void close_role(gemm_json_stream *s, frame *f)
{
    operand *o = &s->op[f->x];
    switch (f->role) {
    case R_ROW: {
        frame *rows = &s->stack[s->depth - 2];
        if (rows->n == 0) {
            o->ncols = f->n;
            uint64_t orows, ocols;
            if ((f->x == 0 && known_shape(&s->op[1], &orows, &ocols) && f->n != orows) ||
                (s->limp && s->lim.max_dim && f->n > s->lim.max_dim))
                kill_op(s, o);
        } else if (f->n != o->ncols) {
            note(s, RK_STRUCT + 10 * f->x, 0, 400, "bad_matrix", "row %llu of %s has %llu elements, row 0 has %llu",
                 (unsigned long long)rows->n, o->name, (unsigned long long)f->n, (unsigned long long)o->ncols);
        }
        o->rows = rows->n + 1;
        return;
    }
    case R_ROWS:
        o->rows = f->n;
        o->complete = 1;
        settle(s, o);
        return;
    case R_SHAPE:
        if (f->n != 2 || o->shape_state == 2) {
            o->shape_state = 2;
            shape_error(s, f->x);
            return;
        }
        o->shape_state = 1;
        if (o->seen_data && o->count > 0) return; /* data came first: compared at the end */
        /* declared sizes are checked before anything is allocated for them */
        gemm_err e;
        if (gemm_check_matrix(o->shape[0], o->shape[1], s->body_dtype ? s->opt.dtype : GEMM_DTYPE_F64, s->limp,
                              o->name, &e))
            kill_op(s, o);
        return;
    case R_DATA:
        if (o->shape_state == 1) { /* the length is known already: a wrong one fails now */
            uint64_t need;
            if (!__builtin_mul_overflow(o->shape[0], o->shape[1], &need) && need != o->count) count_error(s, f->x);
        }
        settle(s, o);
        return;
    case R_MATOBJ:
        if (o->shape_state != 1) shape_error(s, f->x);
        if (!o->seen_data)
            note(s, RK_STRUCT + 10 * f->x + 1, 0, 400, "bad_matrix",
                 "%s.data must be an array of numbers (row-major), not missing", o->name);
        o->complete = 1;
        return;
    default:
        return;
    }
}

/* A key has been read (in s->str) in the object on top. */
static void key_done(gemm_json_stream *s)
{
    frame *f = &s->stack[s->depth - 1];
    f->key = K_OTHER;
    if (s->str_over || memchr(s->str, '\0', s->str_len)) return;
    const char *k = s->str;
    if (f->role == R_ROOT) {
        static const char *const top[] = {NULL, "a", "b", "dtype", "kernel", "tile", "math"};
        for (int i = K_A; i <= K_MATH; i++) {
            if (strcmp(k, top[i]) == 0 && !s->seen_key[i]) {
                s->seen_key[i] = 1;
                f->key = (uint8_t)i;
                if (i == K_A || i == K_B) s->op[i - K_A].present = 1;
                return;
            }
        }
    } else if (f->role == R_MATOBJ) {
        operand *o = &s->op[f->x];
        if (strcmp(k, "shape") == 0 && !o->seen_shape) {
            o->seen_shape = 1;
            f->key = K_SHAPE;
        } else if (strcmp(k, "data") == 0 && !o->seen_data) {
            o->seen_data = 1;
            f->key = K_DATA;
        }
    }
}

/* ---- the tokenizer ---------------------------------------------------------------------- */

/* A value has ended: back in the container (or at the end of the body). */
static inline void value_done(gemm_json_stream *s)
{
    if (s->depth == 0) {
        s->state = S_END;
    } else {
        s->stack[s->depth - 1].n++;
        s->state = S_NEXT;
    }
}

static int push(gemm_json_stream *s, const char *p, char c)
{
    if (s->depth == GEMM_JSON_MAX_DEPTH) {
        char why[64];
        snprintf(why, sizeof why, "arrays and objects nested deeper than %d", GEMM_JSON_MAX_DEPTH);
        return syntax_at(s, off_of(s, p), why);
    }
    int x;
    int role = open_role(s, c, &x);
    frame *f = &s->stack[s->depth++];
    f->kind = (uint8_t)c;
    f->role = (uint8_t)role;
    f->x = (uint8_t)x;
    f->key = K_NONE;
    f->n = 0;
    s->state = c == '{' ? S_OBJ_FIRST : S_ARR_FIRST;
    return 0;
}

static void pop(gemm_json_stream *s)
{
    frame f = s->stack[s->depth - 1];
    close_role(s, &f);
    s->depth--;
    value_done(s);
}

/* Is the value about to start an option's value (its string is kept)? */
static int capture_value(const gemm_json_stream *s)
{
    if (s->depth == 0) return 0;
    const frame *f = &s->stack[s->depth - 1];
    return f->role == R_ROOT && f->key >= K_DTYPE && f->key <= K_MATH;
}

static void number_value(gemm_json_stream *s, const gemm_decimal *d)
{
    scalar(s, T_NUMBER, NULL, d);
    value_done(s);
}

/* A number starting at p (p < end) in the generic path. Returns where reading goes on. */
static const char *number_start(gemm_json_stream *s, const char *p, const char *end)
{
    gemm_decimal d;
    /* only as much text as a cut number could have in its buffer, so that the answer does
     * not depend on where chunks end */
    int cut = end - p > GEMM_JSON_NUMBER_MAX + 1;
    ptrdiff_t r = gemm_json_scan_number(p, cut ? p + GEMM_JSON_NUMBER_MAX + 1 : end, 0, &d);
    if (r < 0) {
        syntax_at(s, off_of(s, p) + (uint64_t)(-r - 1), "not a valid number");
        return end;
    }
    if (r > GEMM_JSON_NUMBER_MAX || (r == 0 && cut)) {
        syntax_at(s, off_of(s, p), "a number longer than " NUM_MAX_TEXT " characters");
        return end;
    }
    if (r == 0) { /* the chunk ends inside the number */
        s->num_len = (size_t)(end - p);
        memcpy(s->num, p, s->num_len);
        s->num_off = off_of(s, p);
        s->state = S_NUMBER;
        return end;
    }
    number_value(s, &d);
    return p + r;
}

/* A byte where a value has just ended and none of ',', ']', '}' (or the end) came. */
static int after_value_error(gemm_json_stream *s, uint64_t off)
{
    if (s->state == S_END) return syntax_at(s, off, NULL);
    return syntax_at(s, off, s->stack[s->depth - 1].kind == '[' ? "expected ',' or ']'" : "expected ',' or '}'");
}

/* The number cut by a chunk end is complete (the next byte does not continue it, or EOF). */
static int number_finish(gemm_json_stream *s)
{
    gemm_decimal d;
    ptrdiff_t r = gemm_json_scan_number(s->num, s->num + s->num_len, 1, &d);
    if (r < 0) return syntax_at(s, s->num_off + (uint64_t)(-r - 1), "not a valid number");
    if (r > GEMM_JSON_NUMBER_MAX) return syntax_at(s, s->num_off, "a number longer than " NUM_MAX_TEXT " characters");
    number_value(s, &d);
    /* what follows the number inside the buffer ("01", "1.5.3") is what the state after
     * a value refuses, as it would in one piece */
    if ((size_t)r < s->num_len) return after_value_error(s, s->num_off + (uint64_t)r);
    return 0;
}

/* The buffer of a cut number filled up (GEMM_JSON_NUMBER_MAX + 1 characters of [0-9.eE+-]):
 * the same decision number_start makes on text in one piece. */
static void number_overflow(gemm_json_stream *s)
{
    gemm_decimal d;
    ptrdiff_t r = gemm_json_scan_number(s->num, s->num + s->num_len, 0, &d);
    if (r < 0) {
        syntax_at(s, s->num_off + (uint64_t)(-r - 1), "not a valid number");
    } else if (r == 0 || r > GEMM_JSON_NUMBER_MAX) {
        syntax_at(s, s->num_off, "a number longer than " NUM_MAX_TEXT " characters");
    } else { /* the number ended inside: what follows it is refused */
        number_value(s, &d);
        after_value_error(s, s->num_off + (uint64_t)r);
    }
}

/* Numbers in a row or a data array, as long as they are whole inside the chunk: the
 * common case, without the general state machine. */
static const char *number_run(gemm_json_stream *s, const char *p, const char *end)
{
    frame *f = &s->stack[s->depth - 1];
    int x = f->x;
    for (;;) {
        p = skip_ws(s, p, end);
        if (p == end || !(is_digit(*p) || *p == '-')) return p;
        gemm_decimal d;
        ptrdiff_t r = gemm_json_scan_number(p, end, 0, &d);
        if (r <= 0 || r > GEMM_JSON_NUMBER_MAX) return p; /* the general path says what is wrong */
        store_number(s, x, &d);
        f->n++;
        p = skip_ws(s, p + r, end);
        s->state = S_NEXT;
        if (p == end || *p != ',') return p;
        p++;
        s->state = S_VALUE;
    }
}

static void capture(gemm_json_stream *s, const char *p, size_t n)
{
    if (!s->str_capture) return;
    if (n > STR_MAX - s->str_len) {
        n = STR_MAX - s->str_len;
        s->str_over = 1;
    }
    memcpy(s->str + s->str_len, p, n);
    s->str_len += n;
    s->str[s->str_len] = '\0';
}

static void capture_code(gemm_json_stream *s, uint32_t c)
{
    char u[4];
    size_t n;
    if (c < 0x80) {
        u[0] = (char)c;
        n = 1;
    } else if (c < 0x800) {
        u[0] = (char)(0xc0 | (c >> 6));
        u[1] = (char)(0x80 | (c & 0x3f));
        n = 2;
    } else if (c < 0x10000) {
        u[0] = (char)(0xe0 | (c >> 12));
        u[1] = (char)(0x80 | ((c >> 6) & 0x3f));
        u[2] = (char)(0x80 | (c & 0x3f));
        n = 3;
    } else {
        u[0] = (char)(0xf0 | (c >> 18));
        u[1] = (char)(0x80 | ((c >> 12) & 0x3f));
        u[2] = (char)(0x80 | ((c >> 6) & 0x3f));
        u[3] = (char)(0x80 | (c & 0x3f));
        n = 4;
    }
    capture(s, u, n);
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    c = (char)(c | 0x20);
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* Inside a string. Returns where reading goes on. */
static const char *string_run(gemm_json_stream *s, const char *p, const char *end)
{
    while (p < end) {
        if (s->esc == 0) {
            const char *q = p;
            while (q < end && *q != '"' && *q != '\\' && (unsigned char)*q >= 0x20) q++;
            capture(s, p, (size_t)(q - p));
            p = q;
            if (p == end) return p;
            if (*p == '"') {
                p++;
                if (s->str_key) {
                    key_done(s);
                    s->state = S_COLON;
                } else {
                    scalar(s, T_STRING, s->str, NULL);
                    value_done(s);
                }
                return p;
            }
            if (*p == '\\') {
                s->esc = 1;
                p++;
                continue;
            }
            syntax_at(s, off_of(s, p), "a control character inside a string (escape it)");
            return end;
        }
        char c = *p;
        if (s->esc == 1) {
            static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
            const char *k = c ? strchr(from, c) : NULL;
            if (k) {
                capture(s, &to[k - from], 1);
                s->esc = 0;
            } else if (c == 'u') {
                s->esc = 2;
                s->ucode = 0;
            } else {
                syntax_at(s, off_of(s, p), "an invalid escape in a string");
                return end;
            }
        } else if (s->esc == 6 || s->esc == 7) {
            if (c != (s->esc == 6 ? '\\' : 'u')) {
                syntax_at(s, off_of(s, p), "a \\u escape of a high surrogate without its low half");
                return end;
            }
            s->esc++;
            s->ucode = 0;
        } else {
            int h = hex_value(c);
            if (h < 0) {
                syntax_at(s, off_of(s, p), "\\u must be followed by four hex digits");
                return end;
            }
            s->ucode = s->ucode * 16 + (uint32_t)h;
            if (++s->esc == 6) { /* first \uXXXX complete */
                if (s->ucode >= 0xd800 && s->ucode <= 0xdbff) {
                    s->uhigh = s->ucode;
                } else if (s->ucode >= 0xdc00 && s->ucode <= 0xdfff) {
                    syntax_at(s, off_of(s, p), "a \\u escape of a lone low surrogate");
                    return end;
                } else {
                    capture_code(s, s->ucode);
                    s->esc = 0;
                }
            } else if (s->esc == 12) { /* the low half */
                if (s->ucode < 0xdc00 || s->ucode > 0xdfff) {
                    syntax_at(s, off_of(s, p), "a \\u escape of a high surrogate without its low half");
                    return end;
                }
                capture_code(s, 0x10000 + ((s->uhigh - 0xd800) << 10) + (s->ucode - 0xdc00));
                s->esc = 0;
            }
        }
        p++;
    }
    return p;
}

static void string_start(gemm_json_stream *s, int key)
{
    s->str_key = key;
    int role = s->depth ? s->stack[s->depth - 1].role : R_SKIP;
    s->str_capture = key ? (role == R_ROOT || role == R_MATOBJ) : capture_value(s);
    s->str_over = 0;
    s->str_len = 0;
    s->str[0] = '\0';
    s->esc = 0;
    s->state = S_STRING;
}

/* A value begins at p (not whitespace). Returns where reading goes on. */
static const char *value_start(gemm_json_stream *s, const char *p, const char *end)
{
    char c = *p;
    switch (c) {
    case '{':
    case '[':
        if (push(s, p, c)) return end;
        return p + 1;
    case '"':
        string_start(s, 0);
        return p + 1;
    case 't':
        s->lit = "true", s->lit_type = T_BOOL;
        break;
    case 'f':
        s->lit = "false", s->lit_type = T_BOOL;
        break;
    case 'n':
        s->lit = "null", s->lit_type = T_NULL;
        break;
    default:
        if (c == '-' || is_digit(c)) return number_start(s, p, end);
        syntax_at(s, off_of(s, p), "expected a value");
        return end;
    }
    s->lit_pos = 1;
    s->state = S_LITERAL;
    return p + 1;
}

int gemm_json_stream_feed(gemm_json_stream *s, const char *data, size_t len, gemm_err *err)
{
    const char *p = data, *end = data + len;
    s->data = data;
    while (p < end && !s->failed) {
        switch (s->state) {
        case S_VALUE:
        case S_ARR_FIRST: {
            int role = s->depth ? s->stack[s->depth - 1].role : R_SKIP;
            if (role == R_ROW || role == R_DATA) {
                p = number_run(s, p, end);
                if (p == end || s->state == S_NEXT) break;
            }
            p = skip_ws(s, p, end);
            if (p == end) break;
            if (*p == ']' && s->state == S_ARR_FIRST) {
                pop(s);
                p++;
                break;
            }
            p = value_start(s, p, end);
            break;
        }
        case S_OBJ_FIRST:
        case S_KEY:
            p = skip_ws(s, p, end);
            if (p == end) break;
            if (*p == '}' && s->state == S_OBJ_FIRST) {
                pop(s);
                p++;
            } else if (*p == '"') {
                string_start(s, 1);
                p++;
            } else {
                syntax_at(s, off_of(s, p), "expected a key (a string in double quotes)");
            }
            break;
        case S_COLON:
            p = skip_ws(s, p, end);
            if (p == end) break;
            if (*p != ':') {
                syntax_at(s, off_of(s, p), "expected ':' after a key");
                break;
            }
            s->state = S_VALUE;
            p++;
            break;
        case S_NEXT: {
            p = skip_ws(s, p, end);
            if (p == end) break;
            frame *f = &s->stack[s->depth - 1];
            if (*p == ',') {
                s->state = f->kind == '[' ? S_VALUE : S_KEY;
                p++;
            } else if (*p == (f->kind == '[' ? ']' : '}')) {
                pop(s);
                p++;
            } else {
                after_value_error(s, off_of(s, p));
            }
            break;
        }
        case S_END:
            for (; p < end; p++) {
                if (s->nul_seen) {
                    syntax_at(s, s->nul_off, NULL);
                    break;
                }
                if (*p == '\0') {
                    s->nul_seen = 1;
                    s->nul_off = off_of(s, p);
                } else if (is_ws(*p)) {
                    if (*p == '\n') {
                        s->line++;
                        s->line_start = off_of(s, p) + 1;
                    }
                } else {
                    syntax_at(s, off_of(s, p), NULL);
                    break;
                }
            }
            break;
        case S_STRING:
            p = string_run(s, p, end);
            break;
        case S_NUMBER: {
            const char *q = p;
            while (q < end && (is_digit(*q) || *q == '.' || *q == 'e' || *q == 'E' || *q == '+' || *q == '-')) q++;
            size_t n = (size_t)(q - p), room = sizeof s->num - 1 - s->num_len;
            if (n > room) { /* one more than the longest number: decide as in one piece */
                memcpy(s->num + s->num_len, p, room);
                s->num_len += room;
                number_overflow(s);
                break;
            }
            memcpy(s->num + s->num_len, p, n);
            s->num_len += n;
            p = q;
            if (p < end) number_finish(s);
            break;
        }
        case S_LITERAL:
            while (p < end && s->lit[s->lit_pos]) {
                if (*p != s->lit[s->lit_pos]) {
                    syntax_at(s, off_of(s, p), "expected true, false or null");
                    break;
                }
                p++;
                s->lit_pos++;
            }
            if (!s->failed && !s->lit[s->lit_pos]) {
                scalar(s, s->lit_type, NULL, NULL);
                value_done(s);
            }
            break;
        }
    }
    s->base += len;
    if (s->failed) {
        if (err) *err = s->syn;
        kill_op(s, &s->op[0]);
        kill_op(s, &s->op[1]);
        return -1;
    }
    return 0;
}

/* ---- the end --------------------------------------------------------------------------- */

/* Operand x held as float64 gets the final dtype d; element values are checked before the
 * first non-number element (which is already noted). When the body fails anyway, only
 * checked, nothing allocated. */
static void convert(gemm_json_stream *s, int x, gemm_dtype d)
{
    operand *o = &s->op[x];
    if (o->dead || !o->started || !o->st.deferred || o->count == 0) return;
    uint64_t bad;
    double v;
    int r = gemm_json_store_assemble(&o->st, d, o->has_bad ? o->bad_index : o->count, s->rank >= RK_NONE, &bad, &v);
    if (r > 0) bad_value(s, x, d, bad, v, 1);
    else if (r < 0) out_of_memory(s, o);
}

static void release(gemm_json_stream *s)
{
    kill_op(s, &s->op[0]);
    kill_op(s, &s->op[1]);
}

int gemm_json_stream_finish(gemm_json_stream *s, gemm_options *opt, gemm_matrix *a, gemm_matrix *b, gemm_err *err)
{
    a->data = b->data = NULL;
    if (!s->failed && s->state == S_NUMBER) number_finish(s);
    if (!s->failed && s->state != S_END) {
        if (s->base == 0) {
            gemm_err_set(err, 400, "bad_json", "the body is empty; expected a JSON object with \"a\" and \"b\"");
            release(s);
            return -1;
        }
        syntax_at(s, s->base, s->state == S_STRING ? "the body ends inside a string" : "the body ends before the JSON value does");
    }
    if (s->failed) {
        *err = s->syn;
        release(s);
        return -1;
    }

    for (int x = 0; x < 2; x++)
        if (!s->op[x].present)
            note(s, RK_STRUCT + 10 * x, 0, 400, "bad_matrix", "the body has no \"%s\" matrix", s->op[x].name);
    if (s->opt.dtype == GEMM_DTYPE_INVALID) s->opt.dtype = GEMM_DTYPE_F64;
    gemm_dtype d = s->opt.dtype;
    uint64_t ar = 0, ac = 0, br = 0, bc = 0;
    if (s->rank > RK_PRODUCT) {
        known_shape(&s->op[0], &ar, &ac);
        known_shape(&s->op[1], &br, &bc);
        gemm_err e;
        if (gemm_check_product(ar, ac, br, bc, d, s->limp, &e))
            note(s, RK_PRODUCT, 0, e.status, e.code, "%s", e.message);
    }
    for (int x = 0; x < 2 && s->rank > RK_COUNT + x; x++) {
        operand *o = &s->op[x];
        if (o->form == '{' && o->count != o->shape[0] * o->shape[1]) /* the product check passed: no overflow */
            count_error(s, x);
    }
    for (int x = 0; x < 2 && s->rank >= RK_ELEM + x; x++) convert(s, x, d);
    for (int x = 0; x < 2 && s->rank >= RK_NONE; x++) {
        operand *o = &s->op[x];
        /* stopped for its size without a limit saying so (no limits: byte sizes beyond memory) */
        if (o->dead || !o->started || o->count == 0)
            note(s, 500, 0, 413, "too_large", "%s is too large", o->name);
        else settle(s, o);
    }
    if (s->rank < RK_NONE) {
        *err = s->err;
        release(s);
        return -1;
    }
    *opt = s->opt;
    gemm_matrix *m[2] = {a, b};
    for (int x = 0; x < 2; x++) {
        operand *o = &s->op[x];
        m[x]->rows = x ? br : ar;
        m[x]->cols = x ? bc : ac;
        m[x]->dtype = d;
        m[x]->data = gemm_json_store_take(&o->st);
        o->dead = 1;
    }
    return 0;
}

/* ---- life ------------------------------------------------------------------------------- */

gemm_json_stream *gemm_json_stream_new(const gemm_limits *lim, const gemm_allocator *alloc, const gemm_options *opt,
                                       uint64_t body_max)
{
    gemm_json_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    if (lim) {
        s->lim = *lim;
        s->limp = &s->lim;
    }
    s->alloc = alloc ? alloc : &gemm_allocator_host;
    if (opt) s->opt = *opt;
    else gemm_options_init(&s->opt);
    s->body_max = body_max;
    s->line = 1;
    s->state = S_VALUE;
    s->rank = RK_NONE;
    for (int x = 0; x < 2; x++) {
        s->op[x].name = x ? "b" : "a";
        gemm_json_store_init(&s->op[x].st, s->alloc, &s->mem);
    }
    return s;
}

void gemm_json_stream_free(gemm_json_stream *s)
{
    if (!s) return;
    release(s);
    free(s);
}

size_t gemm_json_stream_held(const gemm_json_stream *s) { return s->mem.now; }
size_t gemm_json_stream_peak(const gemm_json_stream *s) { return s->mem.peak; }
uint64_t gemm_json_stream_offset(const gemm_json_stream *s) { return s->base; }
