/* json_store.c - typed elements in blocks, assembled at the end (see json_store.h). */
#include "json_store.h"
#include "json_number.h"

#include <math.h>

#define FIRST_BLOCK 16384 /* bytes */

static void *take(gemm_json_store *st, size_t bytes)
{
    void *p = gemm_alloc(st->alloc, bytes ? bytes : 1);
    if (p) {
        st->mem->now += bytes;
        if (st->mem->now > st->mem->peak) st->mem->peak = st->mem->now;
    }
    return p;
}

static void give(gemm_json_store *st, void *p, size_t bytes)
{
    if (!p) return;
    gemm_free(st->alloc, p);
    st->mem->now -= bytes;
}

/* Gives back the blocks (those copied are NULL already) and the notes. */
static void give_blocks(gemm_json_store *st)
{
    for (int k = 0; k < st->nblk; k++) give(st, st->blk[k].p, st->blk[k].cap * st->es);
    st->nblk = 0;
    st->whole = 0;
    give(st, st->flips, st->flips_cap * sizeof *st->flips);
    st->flips = NULL;
    st->nflips = st->flips_cap = 0;
}

void gemm_json_store_init(gemm_json_store *st, const gemm_allocator *alloc, gemm_json_mem *mem)
{
    memset(st, 0, offsetof(gemm_json_store, inl));
    st->alloc = alloc;
    st->mem = mem;
    st->type = GEMM_DTYPE_INVALID;
}

void gemm_json_store_start(gemm_json_store *st, gemm_dtype type, int deferred)
{
    st->type = deferred ? GEMM_DTYPE_F64 : type;
    st->deferred = deferred;
    st->es = gemm_dtype_size(st->type);
    st->cur = st->inl;
    st->left = GEMM_JSON_STORE_INLINE / st->es;
}

int gemm_json_store_room(gemm_json_store *st, uint64_t limit, int exact, uint64_t more)
{
    uint64_t n = st->count;
    if (n >= limit || more == 0 || st->nblk == GEMM_JSON_STORE_BLOCKS) return 1;
    uint64_t most = limit - n < more ? limit - n : more; /* elements the rest can still bring */
    /* the whole operand in one block when its size is known (the inline elements move in,
     * nothing moves again), else a block of half what is held, at least FIRST_BLOCK bytes */
    int whole = exact && st->nblk == 0 && limit - n <= more;
    uint64_t want = n / 2;
    if (want < FIRST_BLOCK / st->es) want = FIRST_BLOCK / st->es;
    if (want > most || st->nblk == GEMM_JSON_STORE_BLOCKS - 1) want = most;
    size_t cap = whole ? (size_t)limit : (size_t)want, moved = whole ? (size_t)n : 0;
    unsigned char *p = take(st, cap * st->es);
    if (!p) return -1;
    memcpy(p, st->inl, moved * st->es);
    st->blk[st->nblk].p = p;
    st->blk[st->nblk].cap = cap;
    st->nblk++;
    st->whole |= whole;
    st->cur = p + moved * st->es;
    st->left = cap - moved;
    return 0;
}

int gemm_json_store_flip(gemm_json_store *st, uint64_t index, float f, int side)
{
    if (st->nflips == st->flips_cap) {
        size_t ncap = st->flips_cap ? st->flips_cap * 2 : 16;
        gemm_json_flip *p = take(st, ncap * sizeof *p);
        if (!p) return -1;
        if (st->nflips) memcpy(p, st->flips, st->nflips * sizeof *p);
        give(st, st->flips, st->flips_cap * sizeof *st->flips);
        st->flips = p;
        st->flips_cap = ncap;
    }
    st->flips[st->nflips++] = (gemm_json_flip){.index = index, .value = f, .side = (signed char)side};
    return 0;
}

/* Converts (and checks before upto) n float64 values src[0..n), the first being element
 * first, into dst as type d (dst NULL: check only). Returns the index of the first bad
 * value, or UINT64_MAX. */
static uint64_t convert(gemm_json_store *st, const double *src, size_t n, uint64_t first, gemm_dtype d, void *dst,
                        uint64_t upto, size_t *fl, double *bad_value)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t idx = first + i;
        double v = src[i];
        int check = idx < upto;
        while (*fl < st->nflips && st->flips[*fl].index < idx) (*fl)++;
        const gemm_json_flip *flip = *fl < st->nflips && st->flips[*fl].index == idx ? &st->flips[*fl] : NULL;
        if (d == GEMM_DTYPE_F64) {
            if (check && !isfinite(v)) goto bad;
            if (dst) ((double *)dst)[i] = v;
        } else if (d == GEMM_DTYPE_F32) {
            float f = flip ? flip->value : (float)v;
            if (check && isinf(f)) goto bad;
            if (dst) ((float *)dst)[i] = f;
        } else if (gemm_dtype_is_half(d)) {
            double w = flip && flip->side ? nextafter(v, flip->side > 0 ? INFINITY : -INFINITY) : v;
            uint16_t h = gemm_f64_to_half(d, w);
            if (check && !isfinite(gemm_half_to_f32(d, h))) goto bad;
            if (dst) ((uint16_t *)dst)[i] = h;
        } else {
            if (check && !gemm_f64_is_i32(v)) goto bad;
            if (dst) ((int32_t *)dst)[i] = gemm_f64_is_i32(v) ? (int32_t)v : 0;
        }
        continue;
    bad:
        *bad_value = v;
        return idx;
    }
    return UINT64_MAX;
}

int gemm_json_store_assemble(gemm_json_store *st, gemm_dtype d, uint64_t upto, int build, uint64_t *bad,
                             double *bad_value)
{
    uint64_t n = st->count;
    size_t es_out = gemm_dtype_size(d);
    if (st->out) return 0;
    if (!st->deferred && d != st->type) return -1; /* a stored type is final */
    if (!st->deferred) upto = 0;                   /* its values were checked as they came */
    if (!build && !st->deferred) return 0;
    /* a whole block of the final type and size is the result as it is */
    if (build && st->whole && st->type == d && st->blk[0].cap == n) {
        st->out = st->blk[0].p;
        st->out_type = d;
        st->nblk = 0;
        st->whole = 0;
        return 0;
    }
    unsigned char *out = NULL;
    if (build) {
        out = take(st, (size_t)n * es_out);
        if (!out) return -1;
    }
    size_t fl = 0;
    uint64_t done = 0, b;
    int part = st->whole ? 0 : -1; /* -1: the inline elements */
    for (; done < n; part++) {
        const void *src = part < 0 ? st->inl : st->blk[part].p;
        size_t cnt = part < 0 ? GEMM_JSON_STORE_INLINE / st->es : st->blk[part].cap;
        if (cnt > n - done) cnt = (size_t)(n - done);
        void *dst = out ? out + (size_t)done * es_out : NULL;
        if (st->deferred) {
            b = convert(st, src, cnt, done, d, dst, upto, &fl, bad_value);
            if (b != UINT64_MAX) {
                give(st, out, (size_t)n * es_out);
                *bad = b;
                return 1;
            }
        } else if (dst) {
            memcpy(dst, src, cnt * es_out);
        }
        done += cnt;
        if (out && part >= 0) { /* copied: this block can go */
            give(st, st->blk[part].p, st->blk[part].cap * st->es);
            st->blk[part].p = NULL;
        }
    }
    if (!out) return 0;
    give_blocks(st);
    st->out = out;
    st->out_type = d;
    return 0;
}

void *gemm_json_store_take(gemm_json_store *st)
{
    void *p = st->out;
    if (p) st->mem->now -= (size_t)st->count * gemm_dtype_size(st->out_type);
    st->out = NULL;
    return p;
}

void gemm_json_store_release(gemm_json_store *st)
{
    give_blocks(st);
    if (st->out) give(st, st->out, (size_t)st->count * gemm_dtype_size(st->out_type));
    st->out = NULL;
    st->cur = NULL;
    st->left = 0;
}
