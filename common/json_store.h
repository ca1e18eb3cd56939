/*
 * json_store.h - the elements of one JSON operand as they are read: typed, in blocks taken
 * from an allocator, assembled into one exact buffer when the operand is complete.
 *
 * The first 512 bytes of elements stay inside the store. Then room comes in blocks: one of
 * the exact size when the size is known (nothing is copied again), else blocks that add half
 * of what is held (at least 16 KiB), never beyond what the limits and the rest of the body
 * allow. Assembly copies (or converts) the blocks into the result one after the other,
 * giving each back as it is copied. So the allocator holds, while reading, the elements plus
 * at most a third of them unused (plus 16 KiB), and while assembling that plus the result.
 *
 * A store whose type is not known yet holds float64 (deferred) and notes the rare element
 * whose float64 lies exactly halfway between two float32 (or float16, bfloat16) values with
 * what its text rounds to: assembly then gives what rounding the text once gives.
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
 * have (exact: its size); more: the most elements the rest of the body can still carry.
 * Returns 0, 1 when the next element would be over limit (nothing stored), -1 when the
 * allocator failed. */
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

/* Element index holds v as float64 but its text rounds to f as float32, or v lies halfway
 * between two float16 / bfloat16 values and the text lies on side of it (+-1). 0 or -1
 * (memory). */
int gemm_json_store_flip(gemm_json_store *st, uint64_t index, float f, int side);

/* Assembles the elements into one buffer of type d (d == the held type, or any type from
 * a deferred store). Values of a deferred store are checked for d before index upto (float64
 * finite, float32 not rounding to infinity, int32 an integer in range); the first that is
 * not is returned in *bad (its float64 value in *bad_value), with 1. With build == 0 only
 * that check is made, nothing allocated. Returns 0, 1 (a bad value), -1 (memory). */
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
