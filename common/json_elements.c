/* json_elements.c - the elements of a JSON body's operands (stored within what the limits and
 * the other operand allow, in the dtype or converted at the end) and the error slots. */
#include <float.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "json_stream_int.h"
#include "gemm_half.h"

/* ---- error slots and places ----------------------------------------------------- */

void gemm_jsb_kill(operand *o)
{
    o->dead = 1;
    gemm_json_store_release(&o->st);
}

int gemm_jsb_best_rank(const gemm_json_stream *s)
{
    int r = s->rank;
    for (int x = 0; x < 2; x++)
        if (s->op[x].rank < r) r = s->op[x].rank;
    return r;
}

void gemm_jsb_note(gemm_json_stream *s, int rank, int replace, int status, const char *code, const char *fmt, ...)
{
    int x = -1; /* the operand whose own slot this rank goes to, or -1 (the body's) */
    for (int i = 0; i < 2; i++)
        if (rank == RK_REF + 10 * i || rank == RK_STRUCT + 10 * i || rank == RK_STRUCT + 10 * i + 1 ||
            rank == RK_COUNT + i || rank == RK_ELEM + i)
            x = i;
    operand *o = x < 0 ? NULL : &s->op[x];
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
        if (x != 1) gemm_jsb_kill(&s->op[0]);
        if (x != 0) gemm_jsb_kill(&s->op[1]);
    }
}

/* Where an element sits, for messages: "a[2][1]", "a[0][2][1]" or "b.data[4]". */
static const char *place(char *buf, size_t cap, const operand *o, uint64_t mat, uint64_t i, uint64_t j)
{
    if (o->form == '{') snprintf(buf, cap, "%s.data[%llu]", o->name, (unsigned long long)j);
    else if (o->batched)
        snprintf(buf, cap, "%s[%llu][%llu][%llu]", o->name, (unsigned long long)mat, (unsigned long long)i,
                 (unsigned long long)j);
    else snprintf(buf, cap, "%s[%llu][%llu]", o->name, (unsigned long long)i, (unsigned long long)j);
    return buf;
}

/* place() from a row-major index (rows of ncols; 3-D: matrices of mrows rows, as
 * matrix 0 has them once it is closed). */
static const char *place_index(char *buf, size_t cap, const operand *o, uint64_t idx)
{
    if (o->form == '{' || o->ncols == 0) return place(buf, cap, o, 0, 0, idx);
    uint64_t per = o->batched && o->nmat ? o->mrows * o->ncols : 0; /* both within the limits */
    uint64_t mat = per ? idx / per : 0, in = per ? idx % per : idx;
    return place(buf, cap, o, mat, in / o->ncols, in % o->ncols);
}

/* ---- storage -------------------------------------------------------------------- */

int gemm_jsb_known_shape(const operand *o, uint64_t *batch, uint64_t *rows, uint64_t *cols)
{
    *batch = 0;
    if (o->is_ref) { /* resident matrices are 2-D */
        *rows = o->refm.rows;
        *cols = o->refm.cols;
        return 2;
    }
    if (!o->complete) return 0;
    if (o->form == '[' && o->batched) { /* matrix 0 gave the rows and columns of all */
        *batch = o->nmat;
        *rows = o->mrows;
        *cols = o->ncols;
        return 3;
    }
    if (o->form == '[') {
        *rows = o->rows;
        *cols = o->rows ? o->ncols : 0;
        return 2;
    }
    if (o->form == '{' && o->shape_state == 1) {
        int k = o->batched;
        *batch = k ? o->shape[0] : 0;
        *rows = o->shape[k];
        *cols = o->shape[k + 1];
        return 2 + k;
    }
    return 0;
}

int gemm_jsb_declared_count(const operand *o, uint64_t *n)
{
    uint64_t r = o->shape[0];
    for (int i = 1; i < 2 + o->batched; i++)
        if (__builtin_mul_overflow(r, o->shape[i], &r)) return -1;
    *n = r;
    return 0;
}

static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* The most elements operand x can have and still be valid, from what is known now; *exact
 * when that is its size. */
static uint64_t max_elements(const gemm_json_stream *s, int x, int *exact)
{
    const operand *o = &s->op[x], *other = &s->op[1 - x];
    uint64_t m = (uint64_t)(SIZE_MAX / 8), obatch, orows, ocols, t;
    *exact = 0;
    if (s->lim.max_elements) m = min_u64(m, s->lim.max_elements);
    if (o->form == '{') { /* a declared shape is its size (one that overflows was stopped) */
        uint64_t need = 0;
        *exact = o->shape_state == 1 && !gemm_jsb_declared_count(o, &need);
        return *exact ? min_u64(m, need) : m;
    }
    int other_known = gemm_jsb_known_shape(other, &obatch, &orows, &ocols);
    if (o->rows == 0 && o->nmat == 0) { /* row 0 is being read: its length is the column count */
        if (s->lim.max_dim) m = min_u64(m, s->lim.max_dim);
        if (x == 0 && other_known) m = min_u64(m, orows); /* A's columns are B's rows */
        return m;
    }
    if (o->batched) {
        /* a 3-D B after a 3-D A: as many matrices as A, each of A's columns rows */
        if (x == 1 && other_known == 3 && ocols && o->ncols && !__builtin_mul_overflow(obatch, ocols, &t) &&
            !__builtin_mul_overflow(t, o->ncols, &t) && t <= m) {
            *exact = 1;
            return t;
        }
        return m;
    }
    if (x == 1 && other_known && ocols && o->ncols && ocols <= m / o->ncols) { /* B's rows are A's columns */
        *exact = 1;
        return ocols * o->ncols;
    }
    if (s->lim.max_dim && o->ncols && s->lim.max_dim <= m / o->ncols) m = min_u64(m, s->lim.max_dim * o->ncols);
    return m;
}

static void start_storage(gemm_json_stream *s, operand *o)
{
    o->started = 1;
    if (s->body_dtype) gemm_json_store_start(&o->st, s->opt.dtype, 0);
    else if (s->fixed_dtype != GEMM_DTYPE_INVALID) gemm_json_store_start(&o->st, s->fixed_dtype, 0); /* else 422 */
    else gemm_json_store_start(&o->st, GEMM_DTYPE_F64, 1);
}

static void out_of_memory(gemm_json_stream *s, operand *o)
{
    gemm_jsb_note(s, RK_MEMORY, 0, 503, "out_of_memory", "cannot allocate memory for %s now (%zu bytes held); retry later",
         o->name, s->mem.now);
    gemm_jsb_kill(o);
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
    else gemm_jsb_kill(o);
    return -1;
}

/* A value out of the dtype's range (v is its float64 value). */
static void bad_value(gemm_json_stream *s, int x, gemm_dtype d, uint64_t idx, double v, int replace)
{
    char w[96];
    place_index(w, sizeof w, &s->op[x], idx);
    if (d == GEMM_DTYPE_F64)
        gemm_jsb_note(s, RK_ELEM + x, replace, 422, "bad_value", "%s is beyond float64's range", w);
    else if (d == GEMM_DTYPE_F16)
        gemm_jsb_note(s, RK_ELEM + x, replace, 422, "bad_value",
                      "%s = %.17g is beyond float16's range (+-65504; 65520 and beyond round to infinity)", w, v);
    else if (d != GEMM_DTYPE_I32) /* float32, bfloat16 */
        gemm_jsb_note(s, RK_ELEM + x, replace, 422, "bad_value", "%s = %.17g is beyond %s's range (+-%.9g)", w, v,
                      gemm_dtype_name(d), d == GEMM_DTYPE_F32 ? (double)FLT_MAX : (double)gemm_bf16_to_f32(0x7f7f));
    else
        gemm_jsb_note(s, RK_ELEM + x, replace, 422, "bad_value",
                      "%s = %.17g is not an int32 (integers from -2147483648 to 2147483647)", w, v);
}

void gemm_jsb_number(gemm_json_stream *s, int x, const gemm_decimal *d)
{
    operand *o = &s->op[x];
    uint64_t i = o->count++;
    if (o->dead) return;
    if (!o->started) start_storage(s, o);
    if (!o->st.left && make_room(s, o, x)) return;
    void *slot = gemm_json_store_next(&o->st);
    if (!o->st.deferred) {
        if (gemm_decimal_store(d, o->st.type, slot)) {
            if (i < o->first_bad) o->first_bad = i;
            bad_value(s, x, o->st.type, i, gemm_decimal_to_f64(d), 0);
        }
        return;
    }
    /* float64 for a dtype not known yet: what rounding it again would get wrong is noted */
    double v = gemm_decimal_to_f64(d);
    memcpy(slot, &v, 8);
    int side = 0;
    if (gemm_f64_is_midpoint(GEMM_DTYPE_F16, v) || gemm_f64_is_midpoint(GEMM_DTYPE_BF16, v))
        side = gemm_decimal_side(d, v);
    if (side || gemm_f64_is_midpoint(GEMM_DTYPE_F32, v)) {
        float f = gemm_decimal_to_f32(d);
        if ((side || f != (float)v) && gemm_json_store_flip(&o->st, i, f, side)) out_of_memory(s, o);
    }
}

void gemm_jsb_other(gemm_json_stream *s, int x, enum vtype t, uint64_t mat, uint64_t row, uint64_t col)
{
    operand *o = &s->op[x];
    uint64_t i = o->count++;
    char w[96];
    if (i < o->first_bad) o->first_bad = i;
    bad_matrix(s, RK_ELEM + x, "%s is %s, expected a number%s", place(w, sizeof w, o, mat, row, col),
               gemm_json_type_name((char)t),
               o->batched && o->form == '[' && t == T_ARRAY
                   ? " (an operand has at most three dimensions: batch, rows, cols)"
                   : "");
    if (o->dead) return;
    if (!o->started) start_storage(s, o);
    if (!o->st.left && make_room(s, o, x)) return;
    memset(gemm_json_store_next(&o->st), 0, o->st.es);
}

void gemm_jsb_count_error(gemm_json_stream *s, int x, uint64_t count)
{
    const operand *o = &s->op[x];
    char shape[80];
    uint64_t need = 0;
    gemm_jsb_declared_count(o, &need); /* called once the shape was found valid: no overflow */
    int n = snprintf(shape, sizeof shape, "[%llu", (unsigned long long)o->shape[0]);
    for (int i = 1; i < 2 + o->batched; i++)
        n += snprintf(shape + n, sizeof shape - (size_t)n, ",%llu", (unsigned long long)o->shape[i]);
    bad_matrix(s, RK_COUNT + x, "%s.data has %llu numbers but shape %s] needs %llu", o->name,
               (unsigned long long)count, shape, (unsigned long long)need);
}

/* Not when the body fails anyway, nor for float64 held for a later dtype (at the end). */
void gemm_jsb_settle(gemm_json_stream *s, operand *o)
{
    uint64_t bad;
    double v;
    if (o->dead || !o->started || o->st.deferred || o->count == 0 || gemm_jsb_best_rank(s) < RK_NONE) return;
    if (gemm_json_store_assemble(&o->st, o->st.type, 0, 1, &bad, &v)) out_of_memory(s, o);
}

void gemm_jsb_last_checks(gemm_json_stream *s, int x, gemm_dtype d)
{
    operand *o = &s->op[x];
    uint64_t bad;
    double v;
    int r = 0;
    /* held as float64: values before the first non-number element (noted already) checked for
     * d, and converted unless the body fails anyway */
    if (gemm_jsb_best_rank(s) >= RK_ELEM + x && !o->dead && o->started && o->st.deferred && o->count)
        r = gemm_json_store_assemble(&o->st, d, o->first_bad, gemm_jsb_best_rank(s) >= RK_NONE, &bad, &v);
    if (r > 0) bad_value(s, x, d, bad, v, 1);
    else if (r < 0) out_of_memory(s, o);
    if (gemm_jsb_best_rank(s) < RK_NONE) return;
    /* stopped for its size without a limit saying so (no limits: byte sizes beyond memory) */
    if (o->dead || !o->started || o->count == 0) gemm_jsb_note(s, 500, 0, 413, "too_large", "%s is too large", o->name);
    else gemm_jsb_settle(s, o);
}
