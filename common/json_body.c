/* json_body.c - what the values of a JSON body mean: options (options.h), the operands (or
 * the one matrix), their shapes and references, and the error the whole body deserves. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "json_stream_int.h"

static void shape_error(gemm_json_stream *s, int x)
{
    bad_matrix(s, RK_STRUCT + 10 * x,
               s->single ? "%s.shape must be [rows, cols] with two non-negative integers"
                         : "%s.shape must be [rows, cols] or [batch, rows, cols] (a batch of matrices), with "
                           "non-negative integers",
               s->op[x].name);
}

/* Operand x has just become 3-D (or a 3-D operand begins its matrix number mat): it is no
 * longer stored when it cannot be valid whatever follows - the other operand is resident
 * (a batched request takes none), it is B and A is 2-D, or both are 3-D and it has more
 * matrices than the other. The error itself is the product's, at the end. */
static void check_batch_early(gemm_json_stream *s, int x, uint64_t mat)
{
    operand *o = &s->op[x], *other = &s->op[1 - x];
    uint64_t ob, orows, ocols;
    if (o->dead) return;
    int nd = gemm_jsb_known_shape(other, &ob, &orows, &ocols);
    if (other->is_ref || other->has_ref || (x == 1 && nd == 2) || (nd == 3 && mat >= ob) || mat >= GEMM_MAX_BATCH)
        gemm_jsb_kill(o);
}

/* ---- what values mean ----------------------------------------------------------------- */

/* The value of option row `key - K_OPT` (a string: its text in s->str; a number: d). */
static void option_value(gemm_json_stream *s, int key, enum vtype t, const gemm_decimal *d)
{
    const gemm_option *def = gemm_option_at(key - K_OPT);
    gemm_opt_value v = {.kind = GEMM_VAL_OTHER, .type_name = gemm_json_type_name((char)t)};
    if (t == T_STRING) v = (gemm_opt_value){.kind = GEMM_VAL_TEXT, .text = s->str, .len = s->str_len};
    else if (t == T_NUMBER) v = (gemm_opt_value){.kind = GEMM_VAL_NUMBER, .number = gemm_decimal_to_f64(d)};
    else if (t == T_BOOL) v = (gemm_opt_value){.kind = GEMM_VAL_BOOL, .boolean = s->lit[0] == 't'};
    gemm_err e;
    if (gemm_option_apply(&s->opt, def, &v, &e) < 0) gemm_jsb_note(s, RK_OPT, 0, e.status, e.code, "%s", e.message);
    else if (def->field == offsetof(gemm_options, dtype)) s->body_dtype = 1;
}

void gemm_jsb_scalar(gemm_json_stream *s, enum vtype t, const char *str, const gemm_decimal *d)
{
    if (s->depth == 0) {
        bad_matrix(s, RK_ROOT,
                   s->single ? "the body is %s; expected [[..],[..]] or {\"shape\": [r,c], \"data\": [..]}"
                             : "the body is %s; expected a JSON object {\"a\": [[..]], \"b\": [[..]]}",
                   gemm_json_type_name((char)t));
        return;
    }
    frame *f = &s->stack[s->depth - 1];
    operand *o = &s->op[f->x];
    switch (f->role) {
    case R_ROW:
    case R_DATA:
        if (t == T_NUMBER) {
            gemm_jsb_number(s, f->x, d);
        } else if (f->role == R_DATA) {
            gemm_jsb_other(s, f->x, t, 0, 0, f->n);
        } else {
            const frame *rows = &s->stack[s->depth - 2];
            gemm_jsb_other(s, f->x, t, rows->role == R_MAT ? s->stack[s->depth - 3].n : 0, rows->n, f->n);
        }
        return;
    case R_ROOT:
        if (f->key == K_A || f->key == K_B) {
            o = &s->op[f->key - K_A];
            o->form = 'x';
            bad_matrix(s, RK_STRUCT + 10 * (f->key - K_A),
                       "%s is %s; expected nested arrays [[..],[..]] or {\"shape\": [m,k], \"data\": [..]}", o->name,
                       gemm_json_type_name((char)t));
        } else if (f->key >= K_OPT) {
            option_value(s, f->key, t, d);
        }
        return;
    case R_ROWS:
        if (t == T_NUMBER && f->n == 0)
            bad_matrix(s, RK_STRUCT + 10 * f->x, "%s is a 1-D array; a matrix is an array of rows, e.g. [[1,2],[3,4]]",
                       o->name);
        else
            bad_matrix(s, RK_STRUCT + 10 * f->x, "%s[%llu] is %s, expected an array (a row)", o->name,
                       (unsigned long long)f->n, gemm_json_type_name((char)t));
        return;
    case R_MAT:
        bad_matrix(s, RK_STRUCT + 10 * f->x, "%s[%llu][%llu] is %s, expected an array (a row)", o->name,
                   (unsigned long long)s->stack[s->depth - 2].n, (unsigned long long)f->n,
                   gemm_json_type_name((char)t));
        return;
    case R_STACK:
        bad_matrix(s, RK_STRUCT + 10 * f->x,
                   "%s[%llu] is %s; %s is 3-D (a batch), each %s[i] a matrix: an array of rows", o->name,
                   (unsigned long long)f->n, gemm_json_type_name((char)t), o->name, o->name);
        return;
    case R_MATOBJ:
        if (f->key == K_SHAPE) {
            shape_error(s, f->x);
        } else if (f->key == K_DATA) {
            bad_matrix(s, RK_STRUCT + 10 * f->x + 1, "%s.data must be an array of numbers (row-major), not %s", o->name,
                       gemm_json_type_name((char)t));
        } else if (f->key == K_REF && !s->refs.resolve) {
            bad_matrix(s, RK_REF + 10 * f->x, "%s.ref: references to resident matrices are not taken here", o->name);
        } else if (f->key == K_REF && t != T_STRING) {
            bad_matrix(s, RK_REF + 10 * f->x, "%s.ref is %s; expected a matrix id (a string)", o->name,
                       gemm_json_type_name((char)t));
        } else if (f->key == K_REF) {
            snprintf(o->ref_id, sizeof o->ref_id, "%s", str ? str : "");
            o->ref_named = 1;
        } else if (f->key >= K_OPT) {
            option_value(s, f->key, t, d);
        }
        return;
    case R_SHAPE: {
        double v = t == T_NUMBER ? gemm_decimal_to_f64(d) : -1;
        if (!gemm_f64_is_count(v) || f->n >= (s->single ? 2u : 3u)) o->shape_state = 2;
        else o->shape[f->n] = (uint64_t)v;
        return;
    }
    default:
        return;
    }
}

/* An array opens in the rows f of a matrix: row f->n. */
static int row_begins(gemm_json_stream *s, frame *f)
{
    operand *o = &s->op[f->x];
    if (!o->dead) {
        uint64_t ob, orows, ocols;
        if ((s->lim.max_dim && f->n >= s->lim.max_dim) ||
            (f->x == 1 && gemm_jsb_known_shape(&s->op[0], &ob, &orows, &ocols) && f->n >= ocols))
            gemm_jsb_kill(o); /* one row too many */
    }
    return R_ROW;
}

int gemm_jsb_open(gemm_json_stream *s, char c, int *x)
{
    *x = s->depth ? s->stack[s->depth - 1].x : 0;
    if (s->depth == 0 && s->single) { /* the body is the matrix: rows, or an object with its fields */
        s->op[0].form = c;
        return c == '[' ? R_ROWS : R_MATOBJ;
    }
    if (s->depth == 0 && c == '{') return R_ROOT;
    frame *f = s->depth ? &s->stack[s->depth - 1] : NULL;
    operand *o = f ? &s->op[f->x] : NULL;
    switch (f ? f->role : R_SKIP) {
    case R_ROOT:
        if (f->key != K_A && f->key != K_B) break;
        *x = f->key - K_A;
        s->op[*x].form = c;
        return c == '[' ? R_ROWS : R_MATOBJ;
    case R_DATA:
        /* one matrix: {"data": [[..]]} without a shape before it holds rows */
        if (!(s->single && c == '[' && f->n == 0 && !o->seen_shape)) break;
        f->role = R_ROWS;
        o->form = '[';
        o->data_rows = 1; /* and this is its first row */
        /* fall through */
    case R_ROWS:
    case R_MAT:
        if (c == '{') break;
        return row_begins(s, f);
    case R_STACK:
        if (c == '{') break;
        check_batch_early(s, f->x, f->n); /* matrix f->n begins */
        return R_MAT;
    case R_ROW: {
        /* an array as the very first element: the operand is 3-D, its rows were matrices */
        frame *rows = &s->stack[s->depth - 2];
        if (s->single || c != '[' || f->n || rows->role != R_ROWS || rows->n || o->batched) break;
        o->batched = 1;
        rows->role = R_STACK;
        f->role = R_MAT;
        check_batch_early(s, f->x, 0);
        return row_begins(s, f);
    }
    case R_MATOBJ:
        if (c == '[' && f->key == K_SHAPE) return R_SHAPE;
        if (c == '[' && f->key == K_DATA) {
            o->data_array = 1;
            return R_DATA;
        }
        break;
    }
    /* no container that means something here: what a value of its type would do */
    gemm_jsb_scalar(s, c == '[' ? T_ARRAY : T_OBJECT, NULL, NULL);
    return R_SKIP;
}

void gemm_jsb_close(gemm_json_stream *s, frame *f)
{
    operand *o = &s->op[f->x];
    switch (f->role) {
    case R_ROW: {
        frame *rows = &s->stack[s->depth - 2];
        if (rows->n == 0 && o->nmat == 0) { /* row 0 (of matrix 0): the column count */
            o->ncols = f->n;
            uint64_t ob, orows, ocols;
            if ((f->x == 0 && gemm_jsb_known_shape(&s->op[1], &ob, &orows, &ocols) && f->n != orows) ||
                (s->lim.max_dim && f->n > s->lim.max_dim))
                gemm_jsb_kill(o);
        } else if (f->n != o->ncols && rows->role == R_MAT) {
            bad_matrix(s, RK_STRUCT + 10 * f->x, "row %llu of %s[%llu] has %llu elements, row 0 of %s[0] has %llu",
                       (unsigned long long)rows->n, o->name, (unsigned long long)s->stack[s->depth - 3].n,
                       (unsigned long long)f->n, o->name, (unsigned long long)o->ncols);
        } else if (f->n != o->ncols) {
            bad_matrix(s, RK_STRUCT + 10 * f->x, "row %llu of %s has %llu elements, row 0 has %llu",
                       (unsigned long long)rows->n, o->name, (unsigned long long)f->n, (unsigned long long)o->ncols);
        }
        o->rows = rows->n + 1;
        return;
    }
    case R_MAT: /* matrix nmat of a 3-D operand */
        if (o->nmat == 0) {
            o->mrows = f->n;
            uint64_t ob, orows, ocols;
            if ((f->x == 1 && gemm_jsb_known_shape(&s->op[0], &ob, &orows, &ocols) && f->n != ocols) ||
                (s->lim.max_dim && f->n > s->lim.max_dim))
                gemm_jsb_kill(o);
        } else if (f->n != o->mrows) {
            bad_matrix(s, RK_STRUCT + 10 * f->x, "%s[%llu] has %llu rows, %s[0] has %llu", o->name,
                       (unsigned long long)o->nmat, (unsigned long long)f->n, o->name, (unsigned long long)o->mrows);
        }
        o->nmat++;
        return;
    case R_ROWS:
        o->rows = f->n;
        /* fall through */
    case R_STACK:
        o->complete = 1;
        gemm_jsb_settle(s, o);
        return;
    case R_SHAPE: {
        if ((f->n != 2 && (f->n != 3 || s->single)) || o->shape_state == 2) {
            o->shape_state = 2;
            shape_error(s, f->x);
            return;
        }
        o->shape_state = 1;
        o->batched = f->n == 3;
        if (o->seen_data && o->count > 0) return; /* data came first: compared at the end */
        /* declared sizes are checked before anything is allocated for them */
        gemm_err e;
        gemm_dtype d = s->body_dtype ? s->opt.dtype : GEMM_DTYPE_F64;
        if (o->batched ? gemm_check_stack(o->shape[0], o->shape[1], o->shape[2], d, &s->lim, o->name, &e)
                       : gemm_check_matrix(o->shape[0], o->shape[1], d, &s->lim, o->name, &e))
            gemm_jsb_kill(o);
        else if (o->batched)
            check_batch_early(s, f->x, o->shape[0] - 1);
        return;
    }
    case R_DATA:
        if (o->shape_state == 1) { /* the length is known already: a wrong one fails now */
            uint64_t need;
            if (!gemm_jsb_declared_count(o, &need) && need != o->count) gemm_jsb_count_error(s, f->x, o->count);
        }
        gemm_jsb_settle(s, o);
        return;
    case R_MATOBJ:
        o->complete = 1;
        if (o->has_ref || o->data_rows) return; /* a reference; one matrix as {"data": [[..]]} */
        if (s->single && o->seen_data && !o->seen_shape && o->form == '{' && o->data_array) {
            /* {"data": [..]} without a shape: rows expected, numbers found (or none at all) */
            if (o->count) {
                bad_matrix(s, RK_STRUCT, "%s is a 1-D array; a matrix is an array of rows, e.g. [[1,2],[3,4]]",
                           o->name);
            } else {
                o->form = '[';
                o->rows = 0;
            }
            return;
        }
        if (o->shape_state != 1) shape_error(s, f->x);
        if (!o->seen_data)
            bad_matrix(s, RK_STRUCT + 10 * f->x + 1, "%s.data must be an array of numbers (row-major), not missing",
                       o->name);
        return;
    default:
        return;
    }
}

/* A key the decoder reads, met twice in one object, fails the body; its second value is
 * not read. */
void gemm_jsb_key(gemm_json_stream *s)
{
    frame *f = &s->stack[s->depth - 1];
    f->key = K_OTHER;
    if (s->str_over || memchr(s->str, '\0', s->str_len)) return;
    const char *k = s->str;
    operand *o = &s->op[f->x];
    if (f->role == R_ROOT && (strcmp(k, "a") == 0 || strcmp(k, "b") == 0)) {
        int x = k[0] - 'a';
        o = &s->op[x];
        if (s->seen_key[K_A + x]) {
            bad_matrix(s, RK_DUP, "\"%s\" is given twice; send it once", o->name);
        } else if (o->given) { /* named in the query: its value is not read */
            bad_matrix(s, RK_STRUCT + 10 * x,
                       "%s is named in the query (%s=ID) and given in the body too; send it once", o->name, o->name);
        } else {
            f->key = (uint8_t)(K_A + x);
        }
        s->seen_key[K_A + x] = 1;
        return;
    }
    if (f->role == R_MATOBJ) {
        if (o->has_ref) return; /* a reference: the rest of the object is not read */
        if (strcmp(k, "shape") == 0 || strcmp(k, "data") == 0) {
            int *seen = k[0] == 's' ? &o->seen_shape : &o->seen_data;
            if (*seen)
                bad_matrix(s, RK_DUP, "%s.%s is given twice; send it once", o->name, k);
            else f->key = k[0] == 's' ? K_SHAPE : K_DATA;
            *seen = 1;
            return;
        }
        if (!s->single && strcmp(k, "ref") == 0) {
            /* {"ref": ID}: a resident matrix, whatever else the object says */
            o->has_ref = 1;
            o->rank = RK_NONE;
            o->first_bad = UINT64_MAX;
            gemm_jsb_kill(o);
            f->key = K_REF;
            return;
        }
        if (!s->single) return; /* one matrix: its object carries the options */
    } else if (f->role != R_ROOT) {
        return;
    }
    const gemm_option *d = gemm_option_find(k, s->str_len, GEMM_DOOR_JSON);
    if (d) f->key = (uint8_t)(K_OPT + (d - gemm_option_at(0)));
}

/* ---- the end --------------------------------------------------------------------------- */

void gemm_jsb_release(gemm_json_stream *s)
{
    gemm_jsb_kill(&s->op[0]);
    gemm_jsb_kill(&s->op[1]);
}

/* The body has been judged: 0 and its options, or -1 with the error it gets (the lowest rank
 * noted, the body's or an operand's) and nothing held. */
static int verdict(gemm_json_stream *s, gemm_options *opt, gemm_err *err)
{
    const gemm_err *e = &s->err;
    int r = s->rank;
    for (int x = 0; x < 2; x++)
        if (s->op[x].rank < r) {
            r = s->op[x].rank;
            e = &s->op[x].err;
        }
    if (r >= RK_NONE) {
        *opt = s->opt;
        return 0;
    }
    *err = *e;
    gemm_jsb_release(s);
    return -1;
}

/* Operand o's elements become matrix m, the caller's. */
static void hand_over(operand *o, gemm_matrix *m, uint64_t batch, uint64_t rows, uint64_t cols, gemm_dtype d)
{
    *m = (gemm_matrix){.rows = rows, .cols = cols, .dtype = d, .data = gemm_json_store_take(&o->st), .batch = batch};
    o->dead = 1;
}

/* The product's shapes and limits, as a raw or .npy request has them checked: a batched
 * (3-D) one takes no resident operand; each A[i]·B[i] as gemm_check_product; the batches
 * as NumPy matmul broadcasts them (gemm_check_batch_pair); the stacks of A, B and C within
 * the limits (gemm_check_stack). nd: 0, 2 or 3 (gemm_jsb_known_shape). */
static int check_product(const gemm_json_stream *s, const int nd[2], const uint64_t bt[2], const uint64_t r[2],
                         const uint64_t c[2], gemm_dtype d, gemm_err *e)
{
    static const char *const up[2] = {"A", "B"};
    int x3 = nd[0] == 3 ? 0 : nd[1] == 3 ? 1 : -1;
    if (x3 >= 0 && (s->op[0].is_ref || s->op[1].is_ref))
        return gemm_err_set(e, 400, "bad_option",
                            "%s is 3-D (a batch of %llu matrices) and %s is a resident matrix; a batched request takes "
                            "no resident operand (a=ID, b=ID or {\"ref\": ID}): send both in the body",
                            s->op[x3].name, (unsigned long long)bt[x3], s->op[1 - x3].name);
    if (gemm_check_product(r[0], c[0], r[1], c[1], d, &s->lim, e)) return -1;
    if (x3 < 0) return 0;
    for (int x = 0; x < 2; x++)
        if (nd[x] == 3 && bt[x] == 0) return gemm_check_stack(0, r[x], c[x], d, &s->lim, up[x], e); /* 422 bad_batch */
    if (gemm_check_batch_pair(nd[0] == 3 ? bt[0] : 0, nd[1] == 3 ? bt[1] : 0, e)) return -1;
    if (gemm_check_stack(bt[0], r[0], c[0], d, &s->lim, "A", e) ||
        (nd[1] == 3 && gemm_check_stack(bt[1], r[1], c[1], d, &s->lim, "B", e)) ||
        gemm_check_stack(bt[0], r[0], c[1], d, &s->lim, "C", e))
        return -1;
    return 0;
}

int gemm_jsb_finish(gemm_json_stream *s, gemm_options *opt, gemm_matrix *a, gemm_matrix *b, gemm_err *err)
{
    for (int x = 0; x < 2; x++)
        if (!s->op[x].form && !s->op[x].given) /* a key taken is followed by its value */
            bad_matrix(s, RK_STRUCT + 10 * x, "the body has no \"%s\" matrix", s->op[x].name);
    /* references, resolved in the order a request is read: a's before b's structure counts */
    for (int x = 0; x < 2; x++) {
        operand *o = &s->op[x];
        if (!o->ref_named || gemm_jsb_best_rank(s) <= RK_REF + 10 * x) continue;
        gemm_matrix m = {0};
        gemm_err e = {0};
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
    uint64_t bt[2] = {0, 0}, r[2] = {0, 0}, c[2] = {0, 0};
    int nd[2] = {0, 0};
    if (gemm_jsb_best_rank(s) > RK_PRODUCT) {
        for (int x = 0; x < 2; x++) nd[x] = gemm_jsb_known_shape(&s->op[x], &bt[x], &r[x], &c[x]);
        gemm_err e;
        if (check_product(s, nd, bt, r, c, d, &e)) gemm_jsb_note(s, RK_PRODUCT, 0, e.status, e.code, "%s", e.message);
    }
    for (int x = 0; x < 2 && gemm_jsb_best_rank(s) > RK_COUNT + x; x++) {
        operand *o = &s->op[x];
        uint64_t need = 0;
        gemm_jsb_declared_count(o, &need); /* the product's checks passed: no overflow */
        if (!o->is_ref && o->form == '{' && o->count != need) gemm_jsb_count_error(s, x, o->count);
    }
    for (int x = 0; x < 2; x++)
        if (!s->op[x].is_ref) gemm_jsb_last_checks(s, x, d);
    if (verdict(s, opt, err)) return -1;
    gemm_matrix *m[2] = {a, b};
    for (int x = 0; x < 2; x++) {
        if (s->op[x].given) continue; /* the caller's, as it was */
        if (s->op[x].is_ref) *m[x] = s->op[x].refm;
        else hand_over(&s->op[x], m[x], nd[x] == 3 ? bt[x] : 0, r[x], c[x], d);
    }
    return 0;
}

int gemm_jsb_finish_matrix(gemm_json_stream *s, gemm_options *opt, gemm_matrix *m, gemm_err *err)
{
    operand *o = &s->op[0];
    if (s->opt.dtype == GEMM_DTYPE_INVALID) s->opt.dtype = GEMM_DTYPE_F64;
    gemm_dtype d = s->opt.dtype;
    uint64_t batch, rows = 0, cols = 0;
    int rows_with_shape = o->data_rows && o->shape_state == 1; /* {"data": [[..]], "shape": [..]} */
    gemm_jsb_known_shape(o, &batch, &rows, &cols);
    if (rows_with_shape) {
        rows = o->shape[0];
        cols = o->shape[1];
    }
    if (gemm_jsb_best_rank(s) > RK_PRODUCT) {
        gemm_err e;
        if (gemm_check_matrix(rows, cols, d, &s->lim, "the matrix", &e))
            gemm_jsb_note(s, RK_PRODUCT, 0, e.status, e.code, "%s", e.message);
    }
    if (gemm_jsb_best_rank(s) > RK_COUNT && rows_with_shape) {
        /* with a shape, data is flat: its elements are the rows read */
        if (o->rows != rows * cols) gemm_jsb_count_error(s, 0, o->rows);
        else
            bad_matrix(s, RK_ELEM, "%s.data[0] is an array, expected a number", o->name);
        o->first_bad = 0; /* nothing before it to look at */
    } else if (gemm_jsb_best_rank(s) > RK_COUNT && o->form == '{' && o->count != rows * cols) {
        gemm_jsb_count_error(s, 0, o->count);
    }
    gemm_jsb_last_checks(s, 0, d);
    if (verdict(s, opt, err)) return -1;
    hand_over(o, m, 0, rows, cols, d);
    return 0;
}
