/* json_body.c - what the values of a JSON request body mean (see json_stream.h): the
 * options, the two operands and their storage, the limits as elements arrive, and the
 * error the whole body deserves. The tokenizer (json_stream.c) calls in here. */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_stream_int.h"

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
    note(s, RK_MEMORY, 0, 503, "out_of_memory", "cannot allocate memory for %s now (%zu bytes held); retry later",
         o->name, s->mem.now);
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
void gemm_jsb_number(gemm_json_stream *s, int x, const gemm_decimal *d)
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
    if (t == T_NUMBER && d) {
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
void gemm_jsb_scalar(gemm_json_stream *s, enum vtype t, const char *str, const gemm_decimal *d)
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
        if (t == T_NUMBER) gemm_jsb_number(s, f->x, d);
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
int gemm_jsb_open(gemm_json_stream *s, char c, int *x)
{
    enum vtype t = c == '[' ? T_ARRAY : T_OBJECT;
    *x = 0;
    if (s->depth == 0) {
        if (c == '{') return R_ROOT;
        gemm_jsb_scalar(s, t, NULL, NULL); /* the same message as for a scalar */
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
            gemm_jsb_scalar(s, t, NULL, NULL);
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
            gemm_jsb_scalar(s, t, NULL, NULL);
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
void gemm_jsb_close(gemm_json_stream *s, frame *f)
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
void gemm_jsb_key(gemm_json_stream *s)
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

void gemm_jsb_release(gemm_json_stream *s)
{
    kill_op(s, &s->op[0]);
    kill_op(s, &s->op[1]);
}

int gemm_jsb_finish(gemm_json_stream *s, gemm_options *opt, gemm_matrix *a, gemm_matrix *b, gemm_err *err)
{
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
        gemm_jsb_release(s);
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
