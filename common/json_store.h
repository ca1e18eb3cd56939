/*
 * json_store.h - the elements of one JSON operand as they are read: typed, in blocks from an
 * allocator (one of the exact size when the size is known, else blocks that add half of what
 * is held, never beyond what the limits and the rest of the body allow), assembled into one
 * exact buffer at the end, each block given back as it is copied: while reading at most a
 * third more than the elements (plus 16 KiB) is held. A store whose dtype is not known yet
 * holds float64 and notes the rare element whose float64 is a float32 (or half) midpoint
 * with what its text rounds to, so that every element is still rounded once.
 */
#ifndef GEMM_JSON_STORE_H
#define GEMM_JSON_STORE_H

#include <string.h>

#include "gemm_types.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GEMM_JSON_STORE_INLINE 512 /* bytes of elements kept inside the store */
#define GEMM_JSON_STORE_BLOCKS 48

/* What a decoder holds from its allocator (shared by its stores). */
typedef struct {
    size_t now, peak;
} gemm_json_mem;

typedef struct {
    uint64_t index;
    float value;      /* the float32 the text rounds to */
    signed char side; /* the float64 is halfway between two float16 or bfloat16 values: the
                         side of it the text lies on (-1 below, +1 above, 0 on it) */
} gemm_json_flip;

typedef struct {
    const gemm_allocator *alloc;
    gemm_json_mem *mem;
    gemm_dtype type;      /* the type held */
    int deferred;         /* float64 standing in for a dtype not known yet */
    size_t es;            /* bytes per element held */
    uint64_t count;       /* elements stored */
    unsigned char *cur;   /* where the next element goes */
    size_t left;          /* elements that still fit there */
    int whole;            /* blk[0] holds every element from the first (none inline) */
    int nblk;
    struct {
        unsigned char *p;
        size_t cap;       /* elements */
    } blk[GEMM_JSON_STORE_BLOCKS];
    gemm_json_flip *flips; /* deferred float32 corrections, by increasing index */
    size_t nflips, flips_cap;
    unsigned char *out;   /* the assembled elements (count of them, in out_type) */
    gemm_dtype out_type;
    _Alignas(64) unsigned char inl[GEMM_JSON_STORE_INLINE];
} gemm_json_store;

void gemm_json_store_init(gemm_json_store *st, const gemm_allocator *alloc, gemm_json_mem *mem);
/* Starts storing elements of this type (deferred: float64 for a dtype decided later). */
void gemm_json_store_start(gemm_json_store *st, gemm_dtype type, int deferred);

/* Room for the next element when st->left == 0. limit: the most elements the operand may
 * have (exact: its size); more: the most the rest of the body can carry. 0, 1 (over limit),
 * -1 (memory). */
int gemm_json_store_room(gemm_json_store *st, uint64_t limit, int exact, uint64_t more);

/* The slot of the next element (st->left > 0): write es bytes there. */
static inline void *gemm_json_store_next(gemm_json_store *st)
{
    void *p = st->cur;
    st->cur += st->es;
    st->left--;
    st->count++;
    return p;
}

/* Element index's text rounds to f as float32, and lies on side (+-1, 0) of its float64 for
 * the half types (gemm_json_flip). 0 or -1 (memory). */
int gemm_json_store_flip(gemm_json_store *st, uint64_t index, float f, int side);

/* Assembles the elements into one buffer of type d (the held type, or any from a deferred
 * store, whose values before index upto are checked for d: the first bad one in *bad and
 * *bad_value). build == 0: only that check. 0, 1 (a bad value), -1 (memory). */
int gemm_json_store_assemble(gemm_json_store *st, gemm_dtype d, uint64_t upto, int build, uint64_t *bad,
                             double *bad_value);
/* The assembled buffer, now the caller's (NULL when there is none). */
void *gemm_json_store_take(gemm_json_store *st);
/* Gives everything back; the store holds nothing afterwards (and stores no more). */
void gemm_json_store_release(gemm_json_store *st);

#ifdef __cplusplus
}
#endif
#endif
