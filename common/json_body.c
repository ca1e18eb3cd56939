/* json_body.c - what the values of a JSON body mean (see json_stream.h): the options, the
 * two operands (or the one matrix), their shapes and references, and the error the whole
 * body deserves. The tokenizer (json_stream.c) calls in here; the elements themselves are
 * json_elements.c's. */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_stream_int.h"

const char *gemm_jsb_type_name(enum vtype t)
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
void gemm_jsb_kill(gemm_json_stream *s, operand *o)
{
    (void)s;
    o->dead = 1;
    gemm_json_store_release(&o->st);
}

/* ---- semantic errors ------------------------------------------------------------ */

/* The operand whose own slot an error of this rank goes to, or -1 (the body's). */
static int rank_operand(int rank)
{
    switch (rank) {
    case RK_REF: case RK_STRUCT: case RK_STRUCT + 1: case RK_COUNT: case RK_ELEM:
        return 0;
    case RK_REF + 10: case RK_STRUCT + 10: case RK_STRUCT + 11: case RK_COUNT + 1: case RK_ELEM + 1:
        return 1;
    default:
        return -1;
    }
}

/* The lowest rank noted anywhere (RK_NONE: none). */
int gemm_jsb_best_rank(const gemm_json_stream *s)
{
    int r = s->rank;
    for (int x = 0; x < 2; x++)
        if (s->op[x].rank < r) r = s->op[x].rank;
    return r;
}

void gemm_jsb_note(gemm_json_stream *s, int rank, int replace, int status, const char *code, const char *fmt, ...)
{
    int x = rank_operand(rank);
    operand *o = x == 0 ? &s->op[0] : x == 1 ? &s->op[1] : NULL;
    if (o && o->has_ref && rank != RK_REF + 10 * x) return;
    int *slot_rank = o ? &o->rank : &s->rank;
    gemm_err *slot = o ? &o->err : &s->err;
    if (rank > *slot_rank || (rank == *slot_rank && !replace)) return;
    char msg[sizeof slot->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    *slot_rank = rank;
    gemm_err_set(slot, status, code, "%s", msg);
    if (rank < RK_ELEM) {
        if (x != 1) gemm_jsb_kill(s, &s->op[0]);
        if (x != 0) gemm_jsb_kill(s, &s->op[1]);
    }
}

/* Where an element sits, for messages: "a[2][1]" or "b.data[4]". */
const char *gemm_jsb_place(char *buf, size_t cap, const operand *o, uint64_t i, uint64_t j)
{
    if (o->form == '{') snprintf(buf, cap, "%s.data[%llu]", o->name, (unsigned long long)j);
    else snprintf(buf, cap, "%s[%llu][%llu]", o->name, (unsigned long long)i, (unsigned long long)j);
    return buf;
}

/* gemm_jsb_place() from a row-major index (rows of ncols). */
const char *gemm_jsb_place_index(char *buf, size_t cap, const operand *o, uint64_t idx)
{
    if (o->form == '{' || o->ncols == 0) return gemm_jsb_place(buf, cap, o, 0, idx);
    return gemm_jsb_place(buf, cap, o, idx / o->ncols, idx % o->ncols);
}

static void shape_error(gemm_json_stream *s, int x)
{
    gemm_jsb_note(s, RK_STRUCT + 10 * x, 0, 400, "bad_matrix", "%s.shape must be [rows, cols] with two non-negative integers",
         s->op[x].name);
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
        gemm_jsb_note(s, RK_OPT + k, 0, 422, "bad_option", "\"%s\" is %s; expected a string%s", name, gemm_jsb_type_name(t),
             key == K_TILE ? " or a positive integer" : "");
        return;
    }
    gemm_err_clear(&e);
    if (gemm_options_set(&s->opt, name, str, &e) < 0) {
        gemm_jsb_note(s, RK_OPT + k, 0, e.status, e.code, "%s", e.message);
        return;
    }
    if (key == K_DTYPE) s->body_dtype = 1;
}

/* The value of operand x's "ref" field (str: the string's text). */
static void ref_value(gemm_json_stream *s, int x, enum vtype t, const char *str)
{
    operand *o = &s->op[x];
    if (!s->refs.resolve) {
        gemm_jsb_note(s, RK_REF + 10 * x, 0, 400, "bad_matrix", "%s.ref: references to resident matrices are not taken here",
             o->name);
    } else if (t != T_STRING) {
        gemm_jsb_note(s, RK_REF + 10 * x, 0, 400, "bad_matrix", "%s.ref is %s; expected a matrix id (a string)", o->name,
             gemm_jsb_type_name(t));
    } else {
        snprintf(o->ref_id, sizeof o->ref_id, "%s", str ? str : "");
        o->ref_named = 1;
    }
}

static int is_option_key(int key) { return key >= K_DTYPE && key <= K_MATH; }

/* A scalar value (string, number, boolean, null) has been read in the current container. */
void gemm_jsb_scalar(gemm_json_stream *s, enum vtype t, const char *str, const gemm_decimal *d)
{
    if (s->depth == 0) {
        if (s->single)
            gemm_jsb_note(s, RK_ROOT, 0, 400, "bad_matrix",
                 "the body is %s; expected [[..],[..]] or {\"shape\": [r,c], \"data\": [..]}", gemm_jsb_type_name(t));
        else
            gemm_jsb_note(s, RK_ROOT, 0, 400, "bad_matrix",
                 "the body is %s; expected a JSON object {\"a\": [[..]], \"b\": [[..]]}", gemm_jsb_type_name(t));
        return;
    }
    frame *f = &s->stack[s->depth - 1];
    operand *o = &s->op[f->x];
    switch (f->role) {
    case R_ROW:
    case R_DATA:
        if (t == T_NUMBER) gemm_jsb_number(s, f->x, d);
        else gemm_jsb_other(s, f->x, t, f->role == R_ROW ? s->stack[s->depth - 2].n : 0, f->n);
        return;
    case R_ROOT:
        if (f->key == K_A || f->key == K_B) {
            o = &s->op[f->key - K_A];
            o->form = 'x';
            gemm_jsb_note(s, RK_STRUCT + 10 * (f->key - K_A), 0, 400, "bad_matrix",
                 "%s is %s; expected nested arrays [[..],[..]] or {\"shape\": [m,k], \"data\": [..]}", o->name,
                 gemm_jsb_type_name(t));
        } else if (f->key >= K_DTYPE && f->key <= K_MATH) {
            option_value(s, f->key, t, str, d);
        }
        return;
    case R_ROWS:
        if (t == T_NUMBER && f->n == 0)
            gemm_jsb_note(s, RK_STRUCT + 10 * f->x, 0, 400, "bad_matrix",
                 "%s is a 1-D array; a matrix is an array of rows, e.g. [[1,2],[3,4]]", o->name);
        else
            gemm_jsb_note(s, RK_STRUCT + 10 * f->x, 0, 400, "bad_matrix", "%s[%llu] is %s, expected an array (a row)", o->name,
                 (unsigned long long)f->n, gemm_jsb_type_name(t));
        return;
    case R_MATOBJ:
        if (f->key == K_SHAPE) {
            shape_error(s, f->x);
        } else if (f->key == K_DATA) {
            gemm_jsb_note(s, RK_STRUCT + 10 * f->x + 1, 0, 400, "bad_matrix",
                 "%s.data must be an array of numbers (row-major), not %s", o->name, gemm_jsb_type_name(t));
        } else if (f->key == K_REF) {
            ref_value(s, f->x, t, str);
        } else if (is_option_key(f->key)) {
            option_value(s, f->key, t, str, d);
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
        if (s->single) { /* the body is the matrix: rows, or an object with its fields */
            s->op[0].present = 1;
            s->op[0].form = c;
            return c == '[' ? R_ROWS : R_MATOBJ;
        }
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
    case R_DATA:
        /* one matrix: {"data": [[..]]} without a shape before it holds rows */
        if (!(s->single && c == '[' && f->n == 0 && !o->seen_shape)) {
            gemm_jsb_other(s, f->x, t, 0, f->n);
            return R_SKIP;
        }
        f->role = R_ROWS;
        o->form = '[';
        o->data_rows = 1; /* and this is its first row */
        /* fall through */
    case R_ROWS:
        if (c == '{') {
            gemm_jsb_scalar(s, t, NULL, NULL);
            return R_SKIP;
        }
        /* row f->n begins */
        if (!o->dead) {
            uint64_t orows, ocols;
            if ((s->limp && s->lim.max_dim && f->n >= s->lim.max_dim) ||
                (f->x == 1 && gemm_jsb_known_shape(&s->op[0], &orows, &ocols) && f->n >= ocols))
                gemm_jsb_kill(s, o); /* one row too many */
        }
        return R_ROW;
    case R_ROW:
        gemm_jsb_other(s, f->x, t, s->stack[s->depth - 2].n, f->n);
        return R_SKIP;
    case R_MATOBJ:
        if (f->key == K_SHAPE) {
            if (c == '[') return R_SHAPE;
            shape_error(s, f->x);
        } else if (f->key == K_DATA) {
            if (c == '[') {
                o->data_array = 1;
                return R_DATA;
            }
            gemm_jsb_scalar(s, t, NULL, NULL);
        } else if (f->key == K_REF) {
            ref_value(s, f->x, t, NULL);
        } else if (is_option_key(f->key)) {
            option_value(s, f->key, t, NULL, NULL);
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
            if ((f->x == 0 && gemm_jsb_known_shape(&s->op[1], &orows, &ocols) && f->n != orows) ||
                (s->limp && s->lim.max_dim && f->n > s->lim.max_dim))
                gemm_jsb_kill(s, o);
        } else if (f->n != o->ncols) {
            gemm_jsb_note(s, RK_STRUCT + 10 * f->x, 0, 400, "bad_matrix", "row %llu of %s has %llu elements, row 0 has %llu",
                 (unsigned long long)rows->n, o->name, (unsigned long long)f->n, (unsigned long long)o->ncols);
        }
        o->rows = rows->n + 1;
        return;
    }
    case R_ROWS:
        o->rows = f->n;
        o->complete = 1;
        gemm_jsb_settle(s, o);
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
            gemm_jsb_kill(s, o);
        return;
    case R_DATA:
        if (o->shape_state == 1) { /* the length is known already: a wrong one fails now */
            uint64_t need;
            if (!__builtin_mul_overflow(o->shape[0], o->shape[1], &need) && need != o->count) gemm_jsb_count_error(s, f->x);
        }
        gemm_jsb_settle(s, o);
        return;
    case R_MATOBJ:
        o->complete = 1;
        if (o->has_ref || o->data_rows) return; /* a reference; one matrix as {"data": [[..]]} */
        if (s->single && o->seen_data && !o->seen_shape && o->form == '{' && o->data_array) {
            /* {"data": [..]} without a shape: rows expected, numbers found (or none at all) */
            if (o->count) {
                gemm_jsb_note(s, RK_STRUCT, 0, 400, "bad_matrix",
                     "%s is a 1-D array; a matrix is an array of rows, e.g. [[1,2],[3,4]]", o->name);
            } else {
                o->form = '[';
                o->rows = 0;
            }
            return;
        }
        if (o->shape_state != 1) shape_error(s, f->x);
        if (!o->seen_data)
            gemm_jsb_note(s, RK_STRUCT + 10 * f->x + 1, 0, 400, "bad_matrix",
                 "%s.data must be an array of numbers (row-major), not missing", o->name);
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
    static const char *const top[] = {NULL, "a", "b", "dtype", "kernel", "tile", "math"};
    if (f->role == R_ROOT) {
        for (int i = K_A; i <= K_MATH; i++) {
            if (strcmp(k, top[i]) == 0 && !s->seen_key[i]) {
                s->seen_key[i] = 1;
                if (i == K_A || i == K_B) {
                    operand *o = &s->op[i - K_A];
                    if (o->given) { /* named in the query: its value is not read */
                        gemm_jsb_note(s, RK_STRUCT + 10 * (i - K_A), 0, 400, "bad_matrix",
                             "%s is named in the query (%s=ID) and given in the body too; send it once", o->name,
                             o->name);
                        return;
                    }
                    o->present = 1;
                }
                f->key = (uint8_t)i;
                return;
            }
        }
    } else if (f->role == R_MATOBJ) {
        operand *o = &s->op[f->x];
        if (o->has_ref) return; /* a reference: the rest of the object is not read */
        if (strcmp(k, "shape") == 0 && !o->seen_shape) {
            o->seen_shape = 1;
            f->key = K_SHAPE;
        } else if (strcmp(k, "data") == 0 && !o->seen_data) {
            o->seen_data = 1;
            f->key = K_DATA;
        } else if (!s->single && strcmp(k, "ref") == 0) {
            /* {"ref": ID}: a resident matrix, whatever else the object says */
            o->has_ref = 1;
            o->rank = RK_NONE;
            o->has_bad = 0;
            gemm_jsb_kill(s, o);
            f->key = K_REF;
        } else if (s->single) { /* one matrix: its object carries the options */
            for (int i = K_DTYPE; i <= K_MATH; i++) {
                if (strcmp(k, top[i]) == 0 && !s->seen_key[i]) {
                    s->seen_key[i] = 1;
                    f->key = (uint8_t)i;
                    return;
                }
            }
        }
    }
}

/* ---- the end --------------------------------------------------------------------------- */

void gemm_jsb_release(gemm_json_stream *s)
{
    gemm_jsb_kill(s, &s->op[0]);
    gemm_jsb_kill(s, &s->op[1]);
}

/* The error the body gets: the lowest rank noted, the body's or an operand's. */
static const gemm_err *reported(const gemm_json_stream *s)
{
    const gemm_err *e = &s->err;
    int r = s->rank;
    for (int x = 0; x < 2; x++)
        if (s->op[x].rank < r) {
            r = s->op[x].rank;
            e = &s->op[x].err;
        }
    return e;
}

int gemm_jsb_finish(gemm_json_stream *s, gemm_options *opt, gemm_matrix *a, gemm_matrix *b, gemm_err *err)
{
    for (int x = 0; x < 2; x++)
        if (!s->op[x].present && !s->op[x].given)
            gemm_jsb_note(s, RK_STRUCT + 10 * x, 0, 400, "bad_matrix", "the body has no \"%s\" matrix", s->op[x].name);
    /* references, resolved in the order a request is read: a's before b's structure counts */
    for (int x = 0; x < 2; x++) {
        operand *o = &s->op[x];
        if (!o->ref_named || gemm_jsb_best_rank(s) <= RK_REF + 10 * x) continue;
        gemm_matrix m;
        gemm_err e;
        memset(&m, 0, sizeof m);
        gemm_err_clear(&e);
        if (s->refs.resolve(s->refs.user, x, o->ref_id, &m, &e) != 0) {
            gemm_jsb_note(s, RK_REF + 10 * x, 0, e.status ? e.status : 404, e.code[0] ? e.code : "matrix_not_found", "%s",
                 e.message);
            continue;
        }
        o->refm = m;
        o->refm.data = NULL;
        o->is_ref = 1;
    }
    /* a resident operand fixes the dtype: it is stored in one */
    for (int x = 0; x < 2; x++) {
        operand *o = &s->op[x];
        if (!o->is_ref || gemm_jsb_best_rank(s) <= RK_REFDTYPE + x) continue;
        if (s->opt.dtype == GEMM_DTYPE_INVALID) s->opt.dtype = o->refm.dtype;
        if (o->refm.dtype != s->opt.dtype)
            gemm_jsb_note(s, RK_REFDTYPE + x, 0, 422, "dtype_mismatch", "%s is a resident %s matrix but the product is %s",
                 o->name, gemm_dtype_name(o->refm.dtype), gemm_dtype_name(s->opt.dtype));
    }
    if (s->opt.dtype == GEMM_DTYPE_INVALID) s->opt.dtype = GEMM_DTYPE_F64;
    gemm_dtype d = s->opt.dtype;
    uint64_t r[2] = {0, 0}, c[2] = {0, 0};
    if (gemm_jsb_best_rank(s) > RK_PRODUCT) {
        gemm_jsb_known_shape(&s->op[0], &r[0], &c[0]);
        gemm_jsb_known_shape(&s->op[1], &r[1], &c[1]);
        gemm_err e;
        if (gemm_check_product(r[0], c[0], r[1], c[1], d, s->limp, &e))
            gemm_jsb_note(s, RK_PRODUCT, 0, e.status, e.code, "%s", e.message);
    }
    for (int x = 0; x < 2 && gemm_jsb_best_rank(s) > RK_COUNT + x; x++) {
        operand *o = &s->op[x];
        if (!o->is_ref && o->form == '{' && o->count != o->shape[0] * o->shape[1]) /* checked: no overflow */
            gemm_jsb_count_error(s, x);
    }
    for (int x = 0; x < 2; x++)
        if (!s->op[x].is_ref) gemm_jsb_last_checks(s, x, d);
    if (gemm_jsb_best_rank(s) < RK_NONE) {
        *err = *reported(s);
        gemm_jsb_release(s);
        return -1;
    }
    *opt = s->opt;
    gemm_matrix *m[2] = {a, b};
    for (int x = 0; x < 2; x++) {
        operand *o = &s->op[x];
        if (o->given) continue; /* the caller's, as it was */
        if (o->is_ref) {
            *m[x] = o->refm;
            continue;
        }
        m[x]->rows = r[x];
        m[x]->cols = c[x];
        m[x]->dtype = d;
        m[x]->batch = 0;
        m[x]->data = gemm_json_store_take(&o->st);
        o->dead = 1;
    }
    return 0;
}

int gemm_jsb_finish_matrix(gemm_json_stream *s, gemm_options *opt, gemm_matrix *m, gemm_err *err)
{
    operand *o = &s->op[0];
    if (s->opt.dtype == GEMM_DTYPE_INVALID) s->opt.dtype = GEMM_DTYPE_F64;
    gemm_dtype d = s->opt.dtype;
    uint64_t rows = 0, cols = 0;
    int rows_with_shape = o->data_rows && o->shape_state == 1; /* {"data": [[..]], "shape": [..]} */
    if (rows_with_shape) {
        rows = o->shape[0];
        cols = o->shape[1];
    } else {
        gemm_jsb_known_shape(o, &rows, &cols);
    }
    if (gemm_jsb_best_rank(s) > RK_PRODUCT) {
        gemm_err e;
        if (gemm_check_matrix(rows, cols, d, s->limp, "the matrix", &e))
            gemm_jsb_note(s, RK_PRODUCT, 0, e.status, e.code, "%s", e.message);
    }
    if (gemm_jsb_best_rank(s) > RK_COUNT && rows_with_shape) {
        /* with a shape, data is flat: its elements are the rows read */
        if (o->rows != rows * cols)
            gemm_jsb_note(s, RK_COUNT, 0, 400, "bad_matrix", "%s.data has %llu numbers but shape [%llu,%llu] needs %llu",
                 o->name, (unsigned long long)o->rows, (unsigned long long)rows, (unsigned long long)cols,
                 (unsigned long long)(rows * cols));
        else
            gemm_jsb_note(s, RK_ELEM, 0, 400, "bad_matrix", "%s.data[0] is an array, expected a number", o->name);
        o->has_bad = 1; /* nothing before it to look at */
        o->bad_index = 0;
    } else if (gemm_jsb_best_rank(s) > RK_COUNT && o->form == '{' && o->count != rows * cols) {
        gemm_jsb_count_error(s, 0);
    }
    gemm_jsb_last_checks(s, 0, d);
    if (gemm_jsb_best_rank(s) < RK_NONE) {
        *err = *reported(s);
        gemm_jsb_release(s);
        return -1;
    }
    *opt = s->opt;
    m->rows = rows;
    m->cols = cols;
    m->dtype = d;
    m->batch = 0;
    m->data = gemm_json_store_take(&o->st);
    o->dead = 1;
    return 0;
}
