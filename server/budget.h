/*
 * budget.h - the daemon's memory budget (max_inflight_mb; docs/OPERATIONS.md, "Memory
 * budget"): every byte a client can make the daemon hold is admitted here before it is
 * allocated (matrix buffers through the charging allocator, below). Lock-free counters;
 * the buffer table in 16 shards.
 */
#ifndef GEMMD_BUDGET_H
#define GEMMD_BUDGET_H

#include <stdatomic.h>
#include <stdint.h>

#include "gemm_types.h"

/* What holds memory, as /metrics shows it (docs/OPERATIONS.md, "Memory budget"). */
typedef enum {
    GEMMD_MEM_BODY = 0, /* request bodies being received (and buffers they fill) */
    GEMMD_MEM_INPUT,    /* A, B and room for C of products decoded, queued or running */
    GEMMD_MEM_RESULT,   /* finished async results kept in the job store */
    GEMMD_MEM_ANSWER,   /* answers being sent (JSON text, C of a synchronous product) */
    GEMMD_MEM_CACHE,    /* what the engine keeps for reuse, let go first (the reclaim hook) */
    GEMMD_MEM_RESERVED, /* reserved by requests at admission (what they hold inside it) */
    GEMMD_MEM_RESIDENT, /* resident matrices (within resident_mb as well) */
    GEMMD_MEM_NKINDS
} gemmd_mem_kind;

/* "bodies", "inputs", "results", "answers", "cache", "reserved", "resident" */
const char *gemmd_mem_kind_name(gemmd_mem_kind k);

typedef struct gemmd_budget gemmd_budget;

/* limit: bytes (>= 1 MiB). fallback_s: the Retry-After when nothing has been given back
 * lately (the longest a stuck body or answer may hold memory before its deadline). */
gemmd_budget *gemmd_budget_new(uint64_t limit, unsigned fallback_s);
void gemmd_budget_free(gemmd_budget *b);

/* The budget max_inflight_mb asks for: configured bytes, or for 0 half of the host's
 * memory, or of the cgroup's memory limit when that is lower (a container). */
uint64_t gemmd_budget_limit(uint64_t configured);

/* Makes freed buffers go back to the system at once (glibc's malloc: a fixed mmap
 * threshold), so that what the budget gives back the process gives back too. Process-wide. */
void gemmd_budget_tune_malloc(void);
/* Every 50 ms from the connection watchdog: malloc_trim when it pays (docs/OPERATIONS.md,
 * "Memory budget"). Returns 1 when it trimmed. */
int gemmd_budget_tick(gemmd_budget *b, int64_t now_ms);
#define GEMMD_TRIM_MIN (16ull << 20)
#define GEMMD_TRIM_QUIET_MS 1000
#define GEMMD_TRIM_EVERY_MS 5000

/* When a charge of another kind would not fit while the cache holds bytes, fn lets the
 * cache go (releasing its GEMMD_MEM_CACHE charge) and the charge is tried once more. */
void gemmd_budget_set_reclaim(gemmd_budget *b, uint64_t (*fn)(void *ctx), void *ctx);
/* The engine's keep-charge hook (gemm_engine_set_keep_charge) on budget: +bytes charged as
 * GEMMD_MEM_CACHE (refused like any charge), -bytes released. */
int gemmd_budget_keep_charge(void *budget, int64_t delta);
/* fn(ctx) after every release of memory (admit.h's kick); fn must not call back into the
 * budget. Set these hooks before charges run. */
void gemmd_budget_set_release_hook(gemmd_budget *b, void (*fn)(void *ctx), void *ctx);

/* Charges bytes of kind k: 0, or -1 when they do not fit (nothing is charged). */
int gemmd_budget_charge(gemmd_budget *b, gemmd_mem_kind k, uint64_t bytes);
void gemmd_budget_release(gemmd_budget *b, gemmd_mem_kind k, uint64_t bytes);
/* The most one request may ever be charged (the budget less its reserve). */
uint64_t gemmd_budget_max_single(const gemmd_budget *b);

/* The most seconds a Retry-After for memory says (admit.h's too): memory turns over in
 * seconds, and a client told to wait longer would wait for nothing. */
#define GEMMD_RETRY_MAX_S 10
/* Fills *err with 503 over_budget naming what was asked and what is held, and
 * *retry_after_s (if not NULL; 3600 when bytes can never fit). Returns -1. */
int gemmd_budget_refuse(gemmd_budget *b, uint64_t bytes, const char *what, gemm_err *err, int *retry_after_s);

typedef struct {
    uint64_t limit, used, peak;
    uint64_t by_kind[GEMMD_MEM_NKINDS];
    uint64_t refused;            /* charges refused since start */
} gemmd_budget_stats;
void gemmd_budget_get_stats(gemmd_budget *b, gemmd_budget_stats *out);

/* ---- reservations (admit.h; docs/OPERATIONS.md, "Memory budget": Admission) ------- */
typedef struct {
    gemmd_budget *budget;
    _Atomic uint64_t total;      /* reserved (charged as GEMMD_MEM_RESERVED) */
    _Atomic uint64_t used;       /* of it, taken by buffers and charges */
} gemmd_resv;

/* bytes for r's holder: from its reservation while it lasts, the rest charged as k. 0
 * with *outside the bytes charged outside it (given back with gemmd_budget_release), or
 * -1 when they do not fit (nothing taken). r may be NULL: all of it is charged as k. */
int gemmd_resv_take(gemmd_resv *r, gemmd_budget *b, gemmd_mem_kind k, uint64_t bytes, uint64_t *outside);
/* Gives back what gemmd_resv_take took for a transient need. */
void gemmd_resv_give(gemmd_resv *r, gemmd_budget *b, gemmd_mem_kind k, uint64_t bytes, uint64_t outside);
/* A charge taken for an estimate of est bytes (outside of them outside a reservation)
 * when held bytes turn out to be needed: the part outside grows by what passed the
 * estimate (when it fits) or shrinks by what was not needed. Returns the new outside. */
uint64_t gemmd_budget_settle_to(gemmd_budget *b, gemmd_mem_kind k, uint64_t est, uint64_t held, uint64_t outside);
/* Gives the reservation back (what is left of it) and empties r. Returns its bytes. */
uint64_t gemmd_resv_end(gemmd_resv *r);

/* ---- charged buffers ---------------------------------------------------------------
 * An allocator whose alloc() charges kind k (or takes it from the reservation resv)
 * before calling base's, and whose free() gives the charge back. NULL from alloc() after
 * a refusal sets the calling thread's refusal mark (gemmd_budget_take_refusal). Buffers
 * from other allocators may be passed to free() too (they are just freed by base). */
typedef struct {
    gemmd_budget *budget;
    gemm_allocator base;
    gemmd_mem_kind kind;
    gemmd_resv *resv;            /* NULL: none */
} gemmd_budget_alloc_ctx;

gemm_allocator gemmd_budget_allocator(gemmd_budget_alloc_ctx *ctx);

/* The buffer's charge moves to kind k (no-op for unknown pointers). With r, p outlives the
 * request that allocated it (a kept result, a resident matrix): what of it was taken from
 * r is charged as kind k on its own, and r shrinks by as much (the total does not change). */
void gemmd_budget_adopt(gemmd_budget *b, void *p, gemmd_mem_kind k, gemmd_resv *r);
/* p leaves the budget (its charge is given back, the buffer is not freed): another
 * accountant owns it from now on (a resident matrix counts against resident_mb). */
void gemmd_budget_forget(gemmd_budget *b, void *p);

/* Bytes of the last refusal on this thread (0: none), cleared by the call. */
uint64_t gemmd_budget_take_refusal(void);

#endif
