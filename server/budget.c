/*
 * budget.c - the memory budget: atomic counters for the charges, a ring of per-second
 * counters of what was given back (the drain rate behind Retry-After), and a hash table
 * from buffer to charge for the charging allocator, in shards with a lock each: every
 * request puts, looks up and takes out several buffers, from every HTTP thread and worker
 * at once, and one lock for all of them was a place where they queued.
 */
#include "budget.h"

#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

#define MIB (1024ull * 1024ull)
#define DRAIN_SLOTS 16
#define DRAIN_WINDOW_S 10
#define SHARDS 16 /* a power of two */

typedef struct {
    _Atomic int64_t sec;
    _Atomic uint64_t bytes;
} drain_slot;

typedef struct {
    void *p;              /* NULL: empty slot */
    uint64_t charged;     /* bytes charged on their own */
    uint64_t in_resv;     /* bytes taken from a reservation instead */
    unsigned char kind;
} buf_entry;

/* One shard of the buffer table, on cache lines of its own. */
typedef struct {
    pthread_mutex_t mu;
    buf_entry *tab;
    size_t cap, count;    /* cap: a power of two */
} __attribute__((aligned(64))) buf_shard;

struct gemmd_budget {
    uint64_t limit, reserve, small;
    unsigned fallback_s;
    _Atomic uint64_t used, peak, refused;
    _Atomic uint64_t by_kind[GEMMD_MEM_NKINDS];
    drain_slot drain[DRAIN_SLOTS];

    _Atomic uint64_t given; /* bytes given back since start */
    /* gemmd_budget_tick's, on its one thread: */
    uint64_t tick_used, given_at_trim;
    int64_t quiet_since, trimmed_at;

    uint64_t (*reclaim)(void *); /* lets the cache go (gemmd_budget_set_reclaim) */
    void *reclaim_ctx;
    void (*released)(void *);    /* gemmd_budget_set_release_hook */
    void *released_ctx;

    buf_shard shard[SHARDS]; /* the buffer table */
};

static _Thread_local uint64_t last_refusal;

static const char *const kind_names[GEMMD_MEM_NKINDS] = {"bodies", "inputs", "results",  "answers",
                                                          "cache",  "reserved", "resident"};

const char *gemmd_mem_kind_name(gemmd_mem_kind k)
{
    return (unsigned)k < GEMMD_MEM_NKINDS ? kind_names[k] : "other";
}

static int64_t now_s(void) { return (int64_t)(gemm_now_ms() / 1000.0); }

gemmd_budget *gemmd_budget_new(uint64_t limit, unsigned fallback_s)
{
    gemmd_budget *b = aligned_alloc(64, (sizeof *b + 63) / 64 * 64);
    if (!b) return NULL;
    memset(b, 0, sizeof *b);
    b->limit = limit;
    b->reserve = limit / 8;
    b->small = limit / 64;
    b->fallback_s = fallback_s ? fallback_s : 1;
    for (int s = 0; s < SHARDS; s++) {
        buf_shard *sh = &b->shard[s];
        sh->cap = 32;
        sh->tab = calloc(sh->cap, sizeof *sh->tab);
        if (!sh->tab) {
            while (s-- > 0) free(b->shard[s].tab);
            free(b);
            return NULL;
        }
        pthread_mutex_init(&sh->mu, NULL);
    }
    for (int i = 0; i < DRAIN_SLOTS; i++) atomic_store(&b->drain[i].sec, -1);
    return b;
}

void gemmd_budget_free(gemmd_budget *b)
{
    if (!b) return;
    for (int s = 0; s < SHARDS; s++) {
        pthread_mutex_destroy(&b->shard[s].mu);
        free(b->shard[s].tab);
    }
    free(b);
}

/* ---- the default limit ------------------------------------------------------------ */

static uint64_t read_u64_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[64] = "";
    uint64_t v = 0;
    if (fgets(line, sizeof line, f) && line[0] >= '0' && line[0] <= '9') v = strtoull(line, NULL, 10);
    fclose(f);
    return v; /* 0 also for "max" (no limit) */
}

uint64_t gemmd_budget_limit(uint64_t configured)
{
    if (configured) return configured;
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    uint64_t host = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 8192 * MIB;
    uint64_t cg = read_u64_file("/sys/fs/cgroup/memory.max");                   /* cgroup v2 */
    if (!cg) cg = read_u64_file("/sys/fs/cgroup/memory/memory.limit_in_bytes"); /* v1 */
    if (cg && cg < host) host = cg;
    uint64_t lim = host / 2;
    return lim < 64 * MIB ? 64 * MIB : lim;
}

void gemmd_budget_tune_malloc(void)
{
    /* glibc's threshold would grow with each mapped block freed (up to 32 MiB), and
     * matrix-sized buffers would come from heaps that keep freed memory. */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    mallopt(M_TRIM_THRESHOLD, 4 << 20);
}

int gemmd_budget_tick(gemmd_budget *b, int64_t now_ms)
{
    if (!b) return 0;
    uint64_t used = atomic_load(&b->used), given = atomic_load_explicit(&b->given, memory_order_relaxed);
    if (used > b->tick_used || !b->quiet_since) b->quiet_since = now_ms;
    b->tick_used = used;
    if (given - b->given_at_trim < GEMMD_TRIM_MIN || now_ms - b->quiet_since < GEMMD_TRIM_QUIET_MS ||
        (b->trimmed_at && now_ms - b->trimmed_at < GEMMD_TRIM_EVERY_MS))
        return 0;
    double t0 = gemm_now_ms();
    malloc_trim(0);
    LOG_DEBUG("memory: free heap pages given back to the system (%.0f MiB given back since the last time, "
              "%.1f ms)", (double)(given - b->given_at_trim) / MIB, gemm_now_ms() - t0);
    b->given_at_trim = given;
    b->trimmed_at = now_ms;
    return 1;
}

/* ---- counters ----------------------------------------------------------------------- */

static uint64_t cap_for(const gemmd_budget *b, uint64_t bytes)
{
    return bytes > b->small ? b->limit - b->reserve : b->limit;
}

uint64_t gemmd_budget_max_single(const gemmd_budget *b) { return b->limit - b->reserve; }

/* Adds bytes to used when the total stays within cap (cap_for(admitted_as)). */
static int take_within(gemmd_budget *b, uint64_t bytes, uint64_t admitted_as)
{
    uint64_t cap = cap_for(b, admitted_as);
    uint64_t cur = atomic_load(&b->used);
    do {
        if (cur > cap || bytes > cap - cur) return -1;
    } while (!atomic_compare_exchange_weak(&b->used, &cur, cur + bytes));
    uint64_t peak = atomic_load_explicit(&b->peak, memory_order_relaxed);
    while (cur + bytes > peak && !atomic_compare_exchange_weak(&b->peak, &peak, cur + bytes)) {
    }
    return 0;
}

/* take_within, and for kinds other than the cache a second try after the cache was let
 * go; a final refusal is counted. */
static int take(gemmd_budget *b, gemmd_mem_kind k, uint64_t bytes, uint64_t admitted_as)
{
    if (take_within(b, bytes, admitted_as) == 0) return 0;
    if (k != GEMMD_MEM_CACHE && b->reclaim && atomic_load(&b->by_kind[GEMMD_MEM_CACHE]) > 0) {
        b->reclaim(b->reclaim_ctx);
        if (take_within(b, bytes, admitted_as) == 0) return 0;
    }
    if (k != GEMMD_MEM_CACHE) { /* the cache is simply not kept: nobody was refused */
        atomic_fetch_add_explicit(&b->refused, 1, memory_order_relaxed);
        last_refusal = bytes;
    }
    return -1;
}

void gemmd_budget_set_reclaim(gemmd_budget *b, uint64_t (*fn)(void *ctx), void *ctx)
{
    b->reclaim = fn;
    b->reclaim_ctx = ctx;
}

int gemmd_budget_keep_charge(void *budget, int64_t delta)
{
    gemmd_budget *b = budget;
    if (delta >= 0) return gemmd_budget_charge(b, GEMMD_MEM_CACHE, (uint64_t)delta);
    gemmd_budget_release(b, GEMMD_MEM_CACHE, (uint64_t)(-(delta + 1)) + 1);
    return 0;
}

static void note_drain(gemmd_budget *b, uint64_t bytes)
{
    int64_t s = now_s();
    drain_slot *d = &b->drain[s % DRAIN_SLOTS];
    int64_t old = atomic_load(&d->sec);
    if (old != s && atomic_compare_exchange_strong(&d->sec, &old, s)) atomic_store(&d->bytes, 0);
    atomic_fetch_add_explicit(&d->bytes, bytes, memory_order_relaxed);
}

/* A charge changed from old_bytes to new_bytes without releasing it first; a growth that
 * does not fit returns -1 and changes nothing. */
static int gemmd_budget_adjust(gemmd_budget *b, gemmd_mem_kind k, uint64_t old_bytes, uint64_t new_bytes)
{
    if (!b || new_bytes == old_bytes) return 0;
    if (new_bytes < old_bytes) {
        gemmd_budget_release(b, k, old_bytes - new_bytes);
        return 0;
    }
    /* A growth is admitted by the size it grows to: a big body cannot creep into the
     * reserve a few MiB at a time. */
    uint64_t delta = new_bytes - old_bytes;
    if (take(b, k, delta, new_bytes) != 0) return -1;
    atomic_fetch_add_explicit(&b->by_kind[k], delta, memory_order_relaxed);
    return 0;
}

int gemmd_budget_charge(gemmd_budget *b, gemmd_mem_kind k, uint64_t bytes)
{
    return gemmd_budget_adjust(b, k, 0, bytes);
}

void gemmd_budget_set_release_hook(gemmd_budget *b, void (*fn)(void *ctx), void *ctx)
{
    if (!b) return;
    b->released = fn;
    b->released_ctx = ctx;
}

void gemmd_budget_release(gemmd_budget *b, gemmd_mem_kind k, uint64_t bytes)
{
    if (!b || bytes == 0) return;
    atomic_fetch_sub_explicit(&b->by_kind[k], bytes, memory_order_relaxed);
    atomic_fetch_sub(&b->used, bytes);
    atomic_fetch_add_explicit(&b->given, bytes, memory_order_relaxed);
    note_drain(b, bytes);
    if (b->released) b->released(b->released_ctx);
}

/* bytes from one kind to another (no admission: the total does not change) */
static void gemmd_budget_move(gemmd_budget *b, gemmd_mem_kind from, gemmd_mem_kind to, uint64_t bytes)
{
    if (!b || bytes == 0 || from == to) return;
    atomic_fetch_add_explicit(&b->by_kind[to], bytes, memory_order_relaxed);
    atomic_fetch_sub_explicit(&b->by_kind[from], bytes, memory_order_relaxed);
}

static unsigned gemmd_budget_retry_after(gemmd_budget *b, uint64_t bytes)
{
    if (!b) return 1;
    uint64_t cap = cap_for(b, bytes), used = atomic_load(&b->used);
    if (bytes > cap) return 3600; /* never fits; the caller should have said 413 */
    uint64_t need = used + bytes > cap ? used + bytes - cap : 0;
    if (need == 0) return 1;
    int64_t s = now_s();
    uint64_t drained = 0;
    for (int i = 0; i < DRAIN_SLOTS; i++) {
        int64_t at = atomic_load(&b->drain[i].sec);
        if (at >= 0 && at <= s && s - at < DRAIN_WINDOW_S) drained += atomic_load(&b->drain[i].bytes);
    }
    double secs = drained ? (double)need / ((double)drained / DRAIN_WINDOW_S) : b->fallback_s;
    if (secs < 1) return 1;
    if (secs > GEMMD_RETRY_MAX_S) return GEMMD_RETRY_MAX_S;
    return (unsigned)(secs + 0.999);
}

int gemmd_budget_refuse(gemmd_budget *b, uint64_t bytes, const char *what, gemm_err *err, int *retry_after_s)
{
    unsigned ra = gemmd_budget_retry_after(b, bytes);
    if (retry_after_s) *retry_after_s = (int)ra;
    uint64_t used = b ? atomic_load(&b->used) : 0, limit = b ? b->limit : 0;
    return gemm_err_set(err, 503, "over_budget",
                        "%s needs %.1f MiB but the server holds %.1f of its %.0f MiB memory budget "
                        "(max_inflight_mb) for requests in flight; retry in %u s",
                        what ? what : "this request", (double)bytes / MIB, (double)used / MIB,
                        (double)limit / MIB, ra);
}

void gemmd_budget_get_stats(gemmd_budget *b, gemmd_budget_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!b) return;
    out->limit = b->limit;
    out->used = atomic_load(&b->used);
    out->peak = atomic_load(&b->peak);
    out->refused = atomic_load(&b->refused);
    for (int k = 0; k < GEMMD_MEM_NKINDS; k++) out->by_kind[k] = atomic_load(&b->by_kind[k]);
}

uint64_t gemmd_budget_take_refusal(void)
{
    uint64_t v = last_refusal;
    last_refusal = 0;
    return v;
}

/* ---- the buffer table (open addressing, linear probing, backward-shift delete) ------ */

static uint64_t hash_of(const void *p)
{
    return ((uint64_t)(uintptr_t)p >> 4) * 0x9e3779b97f4a7c15ull;
}

/* The top bits pick the shard, the middle ones the slot in it. */
static buf_shard *shard_of(gemmd_budget *b, const void *p)
{
    return &b->shard[hash_of(p) >> 60 & (SHARDS - 1)];
}

static size_t slot_of(const buf_shard *sh, const void *p)
{
    return (size_t)(hash_of(p) >> 17) & (sh->cap - 1);
}

static buf_entry *find_locked(buf_shard *sh, const void *p)
{
    for (size_t i = slot_of(sh, p);; i = (i + 1) & (sh->cap - 1)) {
        if (sh->tab[i].p == p) return &sh->tab[i];
        if (!sh->tab[i].p) return NULL;
    }
}

static int grow_locked(buf_shard *sh)
{
    size_t ncap = sh->cap * 2;
    buf_entry *nt = calloc(ncap, sizeof *nt), *old = sh->tab;
    if (!nt) return -1;
    size_t ocap = sh->cap;
    sh->tab = nt;
    sh->cap = ncap;
    for (size_t i = 0; i < ocap; i++) {
        if (!old[i].p) continue;
        size_t j = slot_of(sh, old[i].p);
        while (nt[j].p) j = (j + 1) & (ncap - 1);
        nt[j] = old[i];
    }
    free(old);
    return 0;
}

static int put(gemmd_budget *b, const buf_entry *e)
{
    buf_shard *sh = shard_of(b, e->p);
    pthread_mutex_lock(&sh->mu);
    if ((sh->count + 1) * 2 > sh->cap && grow_locked(sh) != 0) {
        pthread_mutex_unlock(&sh->mu);
        return -1;
    }
    size_t i = slot_of(sh, e->p);
    while (sh->tab[i].p) i = (i + 1) & (sh->cap - 1);
    sh->tab[i] = *e;
    sh->count++;
    pthread_mutex_unlock(&sh->mu);
    return 0;
}

/* Removes p's entry into *out; 0, or -1 when p is not in the table. */
static int take_entry(gemmd_budget *b, const void *p, buf_entry *out)
{
    buf_shard *sh = shard_of(b, p);
    pthread_mutex_lock(&sh->mu);
    buf_entry *e = find_locked(sh, p);
    if (!e) {
        pthread_mutex_unlock(&sh->mu);
        return -1;
    }
    *out = *e;
    size_t i = (size_t)(e - sh->tab), mask = sh->cap - 1;
    sh->tab[i].p = NULL;
    /* Shift later members of the probe run back over the hole. */
    for (size_t j = (i + 1) & mask; sh->tab[j].p; j = (j + 1) & mask) {
        size_t home = slot_of(sh, sh->tab[j].p);
        /* j's entry may move to i if home is not in (i, j] cyclically */
        int between = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!between) {
            sh->tab[i] = sh->tab[j];
            sh->tab[j].p = NULL;
            i = j;
        }
    }
    sh->count--;
    pthread_mutex_unlock(&sh->mu);
    return 0;
}

/* ---- reservations ------------------------------------------------------------------ */

int gemmd_resv_take(gemmd_resv *r, gemmd_budget *b, gemmd_mem_kind k, uint64_t bytes, uint64_t *outside)
{
    uint64_t inside = 0;
    if (r) { /* as much as the reservation has left */
        uint64_t used = atomic_load(&r->used), total = atomic_load(&r->total);
        do {
            inside = used < total ? (total - used < bytes ? total - used : bytes) : 0;
        } while (inside && !atomic_compare_exchange_weak(&r->used, &used, used + inside));
    }
    if (gemmd_budget_charge(b, k, bytes - inside) != 0) {
        if (inside) atomic_fetch_sub(&r->used, inside);
        return -1;
    }
    *outside = bytes - inside;
    return 0;
}

void gemmd_resv_give(gemmd_resv *r, gemmd_budget *b, gemmd_mem_kind k, uint64_t bytes, uint64_t outside)
{
    gemmd_budget_release(b, k, outside);
    if (r && bytes > outside) { /* never below 0: the reservation may have ended meanwhile */
        uint64_t used = atomic_load(&r->used), back = bytes - outside;
        while (!atomic_compare_exchange_weak(&r->used, &used, used > back ? used - back : 0)) {
        }
    }
}

uint64_t gemmd_budget_settle_to(gemmd_budget *b, gemmd_mem_kind k, uint64_t est, uint64_t held, uint64_t outside)
{
    if (held > est) /* more than the estimate: charged on its own, if it fits */
        return gemmd_budget_adjust(b, k, outside, outside + (held - est)) == 0 ? outside + (held - est) : outside;
    uint64_t spare = est - held, keep = outside > spare ? outside - spare : 0;
    gemmd_budget_adjust(b, k, outside, keep);
    return keep;
}

uint64_t gemmd_resv_end(gemmd_resv *r)
{
    if (!r) return 0;
    uint64_t total = atomic_exchange(&r->total, 0);
    atomic_store(&r->used, 0);
    gemmd_budget_release(r->budget, GEMMD_MEM_RESERVED, total);
    return total;
}

/* ---- the charging allocator ----------------------------------------------------------- */

static void *budget_alloc(void *ctx, size_t bytes)
{
    gemmd_budget_alloc_ctx *c = ctx;
    uint64_t outside;
    if (gemmd_resv_take(c->resv, c->budget, c->kind, bytes, &outside) != 0) return NULL;
    void *p = gemm_alloc(&c->base, bytes);
    if (p) {
        buf_entry e = {p, outside, bytes - outside, (unsigned char)c->kind};
        if (put(c->budget, &e) == 0) return p;
        gemm_free(&c->base, p);
    }
    gemmd_budget_release(c->budget, c->kind, outside);
    return NULL;
}

static void budget_free(void *ctx, void *p)
{
    gemmd_budget_alloc_ctx *c = ctx;
    if (!p) return;
    gemmd_budget_forget(c->budget, p);
    gemm_free(&c->base, p);
}

gemm_allocator gemmd_budget_allocator(gemmd_budget_alloc_ctx *ctx)
{
    gemm_allocator a = {budget_alloc, budget_free, ctx};
    return a;
}

void gemmd_budget_adopt(gemmd_budget *b, void *p, gemmd_mem_kind k, gemmd_resv *r)
{
    if (!b || !p) return;
    buf_shard *sh = shard_of(b, p);
    pthread_mutex_lock(&sh->mu);
    buf_entry *e = find_locked(sh, p);
    if (e) {
        gemmd_budget_move(b, (gemmd_mem_kind)e->kind, k, e->charged);
        e->kind = (unsigned char)k;
        if (e->in_resv && r) { /* out of the reservation, into a charge of its own */
            gemmd_budget_move(b, GEMMD_MEM_RESERVED, k, e->in_resv);
            atomic_fetch_sub(&r->total, e->in_resv);
            atomic_fetch_sub(&r->used, e->in_resv);
            e->charged += e->in_resv;
            e->in_resv = 0;
        }
    }
    pthread_mutex_unlock(&sh->mu);
}

void gemmd_budget_forget(gemmd_budget *b, void *p)
{
    if (!b || !p) return;
    buf_entry e;
    if (take_entry(b, p, &e) == 0) gemmd_budget_release(b, (gemmd_mem_kind)e.kind, e.charged);
}
