/*
 * cuda_host.c - host blocks for job buffers, locked by the workers, with a small cache
 * (cuda_host.h; its rules: docs/OPERATIONS.md, "Memory budget").
 *
 * Cached blocks are on an age list and a size-class list, so every step is O(1) under the
 * lock; a busy thread's small blocks go to its own stash, since that lock was the HTTP
 * threads' most contended (bench/results/h100-2026-11-27-reads.md). The mutex is taken
 * before a stash's, never after, and never across a CUDA call; registrations and the
 * slots' generations (a reset bumps one) are atomics, so a worker's check takes no lock.
 */
#include "cuda_host.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "gemm_log.h"

#define HDR 64
#define PAGE 4096
#define MAX_CACHED 256 /* blocks: enough for the buffers of many small products at once */
#define CLASSES 257    /* size classes: 1..255 pages one each, the last one the rest */
#define MAGIC 0x67656d6d686f7374ull /* "gemmhost" */
#define MAX_STASHES 64                /* busy threads with a stash (more: none) */
#define MAX_SLOTS 16                  /* devices (GEMM_MAX_DEVICES) */
#define STASH_BLOCKS 24               /* blocks in one stash: 8 connections' A, B and C */
#define STASH_MAX_CAP (136u << 10)    /* blocks of up to this are stashed (128^2 float64) */

struct stash;

/* The charge hook (gemm_cuda_host_set_charge) and its context; fn NULL: not charged. */
typedef struct {
    int (*fn)(void *, int64_t);
    void *ctx;
} account;

/* Charges bytes (or uncharges, bytes < 0) to a; 0 when taken or there is nothing to ask. */
static int account_add(const account *a, int64_t bytes)
{
    return a->fn && bytes ? a->fn(a->ctx, bytes) : 0;
}

typedef struct block_hdr {
    size_t cap;              /* usable bytes after the header */
    _Atomic int slot;        /* device slot that registered it; -1 = not registered */
    _Atomic unsigned gen;    /* that slot's generation when it did */
    uint64_t magic;
    union {
        struct block_hdr *qnext; /* queued: the unregistration queue's link */
        struct stash *home;      /* handed out: the stash it goes back to (NULL: none) */
    };
    struct block_hdr *older, *newer; /* the cache's age list */
    struct block_hdr *cprev, *cnext; /* its size class's list */
} block_hdr;
_Static_assert(sizeof(block_hdr) <= HDR, "the block header fits in front of the data");

typedef struct stash {
    pthread_mutex_t mu;
    int n;
    size_t bytes;
    account acct; /* the host's, copied under this lock */
    block_hdr *b[STASH_BLOCKS];
} stash;

static _Atomic uint64_t host_ids; /* tells a thread's stash of one host from another's */
static _Thread_local uint64_t my_stash_host; /* the host of this thread's stash ... */
static _Thread_local stash *my_stash_ptr;     /* ... and the stash (NULL: none left) */

struct gemm_cuda_host {
    uint64_t id;
    int ndev;
    int ordinal[MAX_SLOTS];
    _Atomic unsigned gen[MAX_SLOTS]; /* bumped by each reset of that device; starts at 1 */
    size_t max_cached;
    pthread_mutex_t mu;
    block_hdr *oldest, *newest; /* the cached blocks by age */
    block_hdr *cls[CLASSES];    /* the cached blocks by size class (newest first) */
    int ncached;
    size_t cached_bytes;
    _Atomic size_t in_use;   /* bytes handed out */
    block_hdr *queue;        /* registered blocks waiting to be unregistered */
    void (*notify)(void *);
    void *notify_arg;
    atomic_int warned;
    account acct; /* charged the bytes of cached blocks */
    _Atomic int nstashes;
    stash stashes[MAX_STASHES];
};

static block_hdr *hdr_of(void *p) { return (block_hdr *)((char *)p - HDR); }

/* Whether b's registration is still valid (under mu, or not: atomics). */
static int registered(const gemm_cuda_host *h, const block_hdr *b)
{
    int slot = atomic_load_explicit(&b->slot, memory_order_acquire);
    return slot >= 0 && slot < h->ndev &&
           atomic_load_explicit(&b->gen, memory_order_relaxed) ==
               atomic_load_explicit(&h->gen[slot], memory_order_acquire);
}

static int class_of(const block_hdr *b)
{
    size_t pages = (b->cap + HDR) / PAGE;
    return pages < CLASSES - 1 ? (int)pages : CLASSES - 1;
}

/* This thread's stash of h (NULL: not busy, or none left). */
static stash *my_stash(gemm_cuda_host *h)
{
    if (!gemm_alloc_busy_thread()) return NULL;
    if (my_stash_host != h->id) {
        int i = atomic_fetch_add(&h->nstashes, 1);
        my_stash_host = h->id;
        my_stash_ptr = i < MAX_STASHES ? &h->stashes[i] : NULL;
    }
    return my_stash_ptr;
}

/* Caller holds s->mu: takes s->b[i] out, uncharged, the others kept in order. */
static block_hdr *stash_remove_locked(stash *s, int i)
{
    block_hdr *b = s->b[i];
    memmove(&s->b[i], &s->b[i + 1], (size_t)(s->n - i - 1) * sizeof s->b[0]);
    s->n--;
    s->bytes -= b->cap;
    account_add(&s->acct, -(int64_t)b->cap);
    return b;
}

/* From s, uncharged: the smallest fit in [fresh, fresh + slack], latest given back first. */
static block_hdr *stash_take(stash *s, size_t fresh, size_t slack)
{
    pthread_mutex_lock(&s->mu);
    int best = -1;
    for (int i = s->n - 1; i >= 0; i--) {
        size_t cap = s->b[i]->cap;
        if (cap >= fresh && cap - fresh <= slack && (best < 0 || cap < s->b[best]->cap)) best = i;
    }
    block_hdr *b = best >= 0 ? stash_remove_locked(s, best) : NULL;
    pthread_mutex_unlock(&s->mu);
    return b;
}

/* Keeps b in s if the hook takes it (0: not); a full stash pushes its oldest out (*pushed). */
static int stash_put(gemm_cuda_host *h, stash *s, block_hdr *b, block_hdr **pushed)
{
    int kept = 0;
    *pushed = NULL;
    pthread_mutex_lock(&s->mu);
    /* registered() under the stash's lock: a reset of b's slot bumps the generation before
     * it empties the stashes under their locks, so a stale block never stays */
    if (registered(h, b) && account_add(&s->acct, (int64_t)b->cap) == 0) {
        if (s->n == STASH_BLOCKS) *pushed = stash_remove_locked(s, 0);
        s->b[s->n++] = b;
        s->bytes += b->cap;
        kept = 1;
    }
    pthread_mutex_unlock(&s->mu);
    return kept;
}

/* Caller holds mu: b joins the cache, at the young end, first of its class. */
static void cache_put_locked(gemm_cuda_host *h, block_hdr *b)
{
    b->newer = NULL;
    b->older = h->newest;
    if (h->newest)
        h->newest->newer = b;
    else
        h->oldest = b;
    h->newest = b;
    int c = class_of(b);
    b->cprev = NULL;
    b->cnext = h->cls[c];
    if (h->cls[c]) h->cls[c]->cprev = b;
    h->cls[c] = b;
    h->ncached++;
    h->cached_bytes += b->cap;
}

/* Caller holds mu: b leaves the cache, its bytes uncharged. */
static void cache_take_locked(gemm_cuda_host *h, block_hdr *b)
{
    account_add(&h->acct, -(int64_t)b->cap);
    if (b->older)
        b->older->newer = b->newer;
    else
        h->oldest = b->newer;
    if (b->newer)
        b->newer->older = b->older;
    else
        h->newest = b->older;
    if (b->cprev)
        b->cprev->cnext = b->cnext;
    else
        h->cls[class_of(b)] = b->cnext;
    if (b->cnext) b->cnext->cprev = b->cprev;
    b->older = b->newer = b->cprev = b->cnext = NULL;
    h->ncached--;
    h->cached_bytes -= b->cap;
}

/* Caller holds mu: the smallest cached fit in [fresh, fresh + slack] (NULL: none). */
static block_hdr *cache_find_locked(gemm_cuda_host *h, size_t fresh, size_t slack)
{
    for (size_t pages = (fresh + HDR) / PAGE; pages < CLASSES - 1; pages++) {
        if (pages * PAGE - HDR > fresh + slack) return NULL;
        if (h->cls[pages]) return h->cls[pages];
    }
    block_hdr *best = NULL;
    for (block_hdr *b = h->cls[CLASSES - 1]; b; b = b->cnext)
        if (b->cap >= fresh && b->cap - fresh <= slack && (!best || b->cap < best->cap)) best = b;
    return best;
}

gemm_cuda_host *gemm_cuda_host_open(const int *ordinals, int ndev, size_t max_cached_bytes)
{
    gemm_cuda_host *h = ndev >= 1 && ndev <= MAX_SLOTS ? calloc(1, sizeof *h) : NULL;
    if (!h) return NULL;
    h->ndev = ndev;
    for (int i = 0; i < ndev; i++) {
        h->ordinal[i] = ordinals[i];
        atomic_init(&h->gen[i], 1);
    }
    h->max_cached = max_cached_bytes;
    h->id = atomic_fetch_add(&host_ids, 1) + 1;
    pthread_mutex_init(&h->mu, NULL);
    for (int i = 0; i < MAX_STASHES; i++) pthread_mutex_init(&h->stashes[i].mu, NULL);
    return h;
}

void gemm_cuda_host_set_notify(gemm_cuda_host *h, void (*fn)(void *), void *arg)
{
    pthread_mutex_lock(&h->mu);
    h->notify = fn;
    h->notify_arg = arg;
    pthread_mutex_unlock(&h->mu);
}

static void free_block(block_hdr *b)
{
    b->magic = 0;
    free(b);
}

/* Caller holds mu. */
static void queue_locked(gemm_cuda_host *h, block_hdr *b)
{
    b->qnext = h->queue;
    h->queue = b;
}

/* Caller holds mu: the queued blocks slot registered (stale_too: and stale ones), unqueued. */
static block_hdr *unqueue_locked(gemm_cuda_host *h, int slot, int stale_too)
{
    block_hdr *list = NULL, **link = &h->queue;
    while (*link) {
        block_hdr *b = *link;
        if (b->slot != slot && !(stale_too && !registered(h, b))) {
            link = &b->qnext;
            continue;
        }
        *link = b->qnext;
        b->qnext = list;
        list = b;
    }
    return list;
}

/* Caller holds mu: the stashed blocks of slot (-1: all), uncharged, onto *list; their bytes. */
static size_t stashes_take(gemm_cuda_host *h, int slot, block_hdr **list)
{
    size_t bytes = 0;
    for (int i = 0; i < MAX_STASHES; i++) {
        stash *st = &h->stashes[i];
        pthread_mutex_lock(&st->mu);
        for (int j = st->n - 1; j >= 0; j--) {
            if (slot >= 0 && st->b[j]->slot != slot) continue;
            block_hdr *b = stash_remove_locked(st, j);
            bytes += b->cap;
            b->qnext = *list;
            *list = b;
        }
        pthread_mutex_unlock(&st->mu);
    }
    return bytes;
}

/* Caller holds mu: every cached block to the unregistration queue; returns the bytes. */
static size_t trim_locked(gemm_cuda_host *h)
{
    size_t bytes = h->cached_bytes;
    while (h->oldest) {
        block_hdr *b = h->oldest;
        cache_take_locked(h, b);
        queue_locked(h, b);
    }
    return bytes + stashes_take(h, -1, &h->queue);
}

void gemm_cuda_host_close(gemm_cuda_host *h)
{
    if (!h) return;
    pthread_mutex_lock(&h->mu);
    trim_locked(h);
    block_hdr *list = h->queue;
    h->queue = NULL;
    pthread_mutex_unlock(&h->mu);
    while (list) {
        block_hdr *b = list;
        list = b->qnext;
        if (registered(h, b) && cudaSetDevice(h->ordinal[b->slot]) == cudaSuccess &&
            cudaHostUnregister(b) != cudaSuccess)
            cudaGetLastError(); /* the registration went with the context: nothing to undo */
        cudaGetLastError();
        free_block(b);
    }
    pthread_mutex_destroy(&h->mu);
    for (int i = 0; i < MAX_STASHES; i++) pthread_mutex_destroy(&h->stashes[i].mu);
    free(h);
}

void gemm_cuda_host_device_lost(gemm_cuda_host *h, int slot)
{
    if (slot >= 0 && slot < h->ndev) atomic_fetch_add(&h->gen[slot], 1);
}

void gemm_cuda_host_device_reset(gemm_cuda_host *h, int slot)
{
    if (slot < 0 || slot >= h->ndev) return;
    pthread_mutex_lock(&h->mu);
    block_hdr *drop = unqueue_locked(h, slot, 0);
    for (block_hdr *b = h->oldest, *next; b; b = next) {
        next = b->newer;
        if (b->slot == slot) {
            cache_take_locked(h, b);
            b->qnext = drop;
            drop = b;
        }
    }
    stashes_take(h, slot, &drop);
    pthread_mutex_unlock(&h->mu);
    while (drop) { /* registrations are gone: just free */
        block_hdr *b = drop;
        drop = b->qnext;
        free_block(b);
    }
}

static void *host_alloc(void *ctx, size_t bytes)
{
    gemm_cuda_host *h = ctx;
    if (bytes == 0) bytes = 1;
    if (bytes > SIZE_MAX - HDR - PAGE) return NULL;
    /* A cached block at most an eighth (and a page) bigger than a new one would be: a
     * locked block is resident in full, while the budget is charged what was asked. */
    const size_t fresh = (bytes + HDR + PAGE - 1) / PAGE * PAGE - HDR, slack = fresh / 8 + PAGE;
    stash *mine = fresh <= STASH_MAX_CAP ? my_stash(h) : NULL;
    block_hdr *b = mine ? stash_take(mine, fresh, slack) : NULL;
    if (!b) {
        pthread_mutex_lock(&h->mu);
        b = cache_find_locked(h, fresh, slack);
        if (b) cache_take_locked(h, b);
        pthread_mutex_unlock(&h->mu);
    }
    if (!b) {
        b = aligned_alloc(PAGE, fresh + HDR);
        if (!b) return NULL;
        memset(b, 0, sizeof *b);
        b->cap = fresh;
        atomic_init(&b->slot, -1);
        atomic_init(&b->gen, 0);
        b->magic = MAGIC;
    }
    b->home = mine;
    atomic_fetch_add(&h->in_use, b->cap);
    return (char *)b + HDR;
}

/* Releases mu and, when blocks were queued, wakes whatever drains the queue. */
static void unlock_notify(gemm_cuda_host *h, size_t queued)
{
    void (*notify)(void *) = h->notify;
    void *arg = h->notify_arg;
    pthread_mutex_unlock(&h->mu);
    if (queued && notify) notify(arg);
}

/* A registered block no stash keeps: into the shared cache, or queued to be unregistered. */
static void cache_keep(gemm_cuda_host *h, block_hdr *b)
{
    int queued = 0;
    pthread_mutex_lock(&h->mu);
    if (!registered(h, b)) {
        pthread_mutex_unlock(&h->mu);
        free_block(b); /* its registration went with a reset meanwhile */
        return;
    }
    /* Keep it, pushing out the oldest for room, unless it is too big or the memory budget
     * refuses it (requests come first): then it is let go. */
    const int fits = b->cap <= h->max_cached;
    while (fits && h->ncached > 0 && (h->ncached == MAX_CACHED || h->cached_bytes + b->cap > h->max_cached)) {
        block_hdr *old = h->oldest;
        cache_take_locked(h, old);
        queue_locked(h, old);
        queued++;
    }
    if (fits && account_add(&h->acct, (int64_t)b->cap) == 0) {
        cache_put_locked(h, b);
    } else {
        queue_locked(h, b);
        queued++;
    }
    unlock_notify(h, queued);
}

static void host_free(void *ctx, void *p)
{
    gemm_cuda_host *h = ctx;
    if (!p) return;
    block_hdr *b = hdr_of(p);
    if (b->magic != MAGIC) {
        gemm_engine_log(GEMM_LOG_ERROR, "cuda: host_free of a pointer this allocator did not give out");
        abort();
    }
    stash *home = b->home;
    b->home = NULL;
    atomic_fetch_sub(&h->in_use, b->cap);
    if (!registered(h, b)) {
        free_block(b); /* never locked, or its registration went with a reset */
        return;
    }
    block_hdr *pushed;
    if (home && b->cap <= STASH_MAX_CAP && stash_put(h, home, b, &pushed)) {
        if (pushed) cache_keep(h, pushed);
        return;
    }
    cache_keep(h, b);
}

int gemm_cuda_host_pin(gemm_cuda_host *h, void *p, int slot)
{
    if (!p || slot < 0 || slot >= h->ndev) return GEMM_PIN_PAGEABLE;
    block_hdr *b = hdr_of(p);
    if (b->magic != MAGIC) return GEMM_PIN_PAGEABLE;
    if (registered(h, b)) /* the common case, without the lock */
        return atomic_load_explicit(&b->slot, memory_order_relaxed);
    unsigned gen = atomic_load(&h->gen[slot]);
    /* Not registered (or going with a reset). The driver may still hold it: that device's
     * reset is under way, or another worker registered it at this moment. */
    cudaError_t e = cudaHostRegister(b, HDR + b->cap, cudaHostRegisterPortable);
    if (e == cudaErrorHostMemoryAlreadyRegistered) {
        cudaGetLastError();
        int s = atomic_load_explicit(&b->slot, memory_order_acquire);
        return s >= 0 && s < h->ndev ? s : GEMM_PIN_ELSEWHERE;
    }
    if (e == cudaSuccess) {
        pthread_mutex_lock(&h->mu);
        atomic_store_explicit(&b->gen, gen, memory_order_relaxed);
        atomic_store_explicit(&b->slot, slot, memory_order_release); /* after gen: registered() */
        pthread_mutex_unlock(&h->mu);
        return slot;
    }
    cudaGetLastError();
    if (!atomic_exchange(&h->warned, 1))
        gemm_engine_log(GEMM_LOG_WARN, "cuda: cudaHostRegister of %zu bytes failed (%s); job buffers stay "
                        "pageable and copies will be slower", HDR + b->cap, cudaGetErrorString(e));
    return GEMM_PIN_PAGEABLE;
}

int gemm_cuda_host_drain(gemm_cuda_host *h, int slot)
{
    pthread_mutex_lock(&h->mu);
    block_hdr *mine = unqueue_locked(h, slot, 1);
    pthread_mutex_unlock(&h->mu);
    int released = 0;
    while (mine) {
        block_hdr *b = mine;
        mine = b->qnext;
        /* its slot is entered: registered() stays what it was when it left the queue */
        cudaError_t e = registered(h, b) ? cudaHostUnregister(b) : cudaSuccess;
        if (e == cudaSuccess) {
            free_block(b);
            released++;
            continue;
        }
        /* A broken context: the reset that follows drops it; until then it stays queued. */
        cudaGetLastError();
        gemm_engine_log(GEMM_LOG_DEBUG, "cuda: cudaHostUnregister of %zu bytes failed (%s); retried later",
                        HDR + b->cap, cudaGetErrorString(e));
        pthread_mutex_lock(&h->mu);
        queue_locked(h, b);
        pthread_mutex_unlock(&h->mu);
    }
    return released;
}

size_t gemm_cuda_host_trim(gemm_cuda_host *h)
{
    pthread_mutex_lock(&h->mu);
    size_t bytes = trim_locked(h);
    unlock_notify(h, bytes);
    return bytes;
}

void gemm_cuda_host_set_charge(gemm_cuda_host *h, int (*fn)(void *ctx, int64_t delta), void *ctx)
{
    const account to = {fn, ctx};
    pthread_mutex_lock(&h->mu);
    /* Cache and stashes move to the new account; what it refuses is let go below. */
    account_add(&h->acct, -(int64_t)h->cached_bytes);
    h->acct = to;
    int refused = account_add(&to, (int64_t)h->cached_bytes) != 0;
    if (refused) h->acct.fn = NULL;
    for (int i = 0; i < MAX_STASHES; i++) {
        stash *st = &h->stashes[i];
        pthread_mutex_lock(&st->mu);
        account_add(&st->acct, -(int64_t)st->bytes);
        st->acct = to;
        if (account_add(&to, (int64_t)st->bytes) != 0) st->acct.fn = NULL, refused = 1;
        pthread_mutex_unlock(&st->mu);
    }
    size_t trimmed = 0;
    if (refused) { /* let it all go (uncharged from whichever account holds it), then charge */
        trimmed = trim_locked(h);
        h->acct = to;
        for (int i = 0; i < MAX_STASHES; i++) {
            pthread_mutex_lock(&h->stashes[i].mu);
            h->stashes[i].acct = to;
            pthread_mutex_unlock(&h->stashes[i].mu);
        }
    }
    unlock_notify(h, trimmed);
}

gemm_allocator gemm_cuda_host_allocator(gemm_cuda_host *h)
{
    gemm_allocator a = {host_alloc, host_free, h};
    return a;
}
