/*
 * test_budget.c - the memory budget: charges and refusals, the reserve kept for small
 * charges, growth of a charge, moves between holders, Retry-After from what drained, the
 * charging allocator (buffers remember their charge, a request's reservation covers what it
 * allocates,
 * retagging), the buffer table under many buffers, threads charging at once, and the
 * engine's kept memory charged as "cache" and let go when a request needs its room.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "budget.c" /* the budget under test, and its buffer table (charged below) */

/* Bytes charged for p on its own (0 when unknown or inside a reservation). */
static uint64_t gemmd_budget_charged(gemmd_budget *b, void *p)
{
    buf_shard *sh = shard_of(b, p);
    pthread_mutex_lock(&sh->mu);
    buf_entry *e = find_locked(sh, p);
    uint64_t v = e ? e->charged : 0;
    pthread_mutex_unlock(&sh->mu);
    return v;
}

/* Buffers in the table. */
static size_t gemmd_budget_buffers(gemmd_budget *b)
{
    size_t n = 0;
    for (int s = 0; s < SHARDS; s++) {
        pthread_mutex_lock(&b->shard[s].mu);
        n += b->shard[s].count;
        pthread_mutex_unlock(&b->shard[s].mu);
    }
    return n;
}

/* Whether bytes could be charged now, what the cache holds let go for them: 0, or -1. */
static int gemmd_budget_fits(gemmd_budget *b, uint64_t bytes)
{
    uint64_t cap = cap_for(b, bytes), cur = atomic_load(&b->used);
    uint64_t kept = b->reclaim ? atomic_load(&b->by_kind[GEMMD_MEM_CACHE]) : 0;
    cur = cur > kept ? cur - kept : 0;
    return cur <= cap && bytes <= cap - cur ? 0 : -1;
}

#define MIB (1024ull * 1024ull)

/* A stand-in for the engine's cache of kept blocks: what it holds is charged as "cache"
 * through the keep-charge hook; reclaim lets it all go. */
typedef struct {
    gemmd_budget *b;
    uint64_t held;
    int reclaims;
} fake_cache;

static int fake_keep(fake_cache *c, uint64_t bytes)
{
    if (gemmd_budget_keep_charge(c->b, (int64_t)bytes) != 0) return -1;
    c->held += bytes;
    return 0;
}

static uint64_t fake_reclaim(void *ctx)
{
    fake_cache *c = ctx;
    uint64_t n = c->held;
    c->reclaims++;
    gemmd_budget_keep_charge(c->b, -(int64_t)n);
    c->held = 0;
    return n;
}

static void test_cache_gives_way(void **state)
{
    (void)state;
    gemmd_budget *b = gemmd_budget_new(64 * MIB, 7);
    assert_non_null(b);
    fake_cache c = {b, 0, 0};
    gemmd_budget_set_reclaim(b, fake_reclaim, &c);
    /* the cache takes free room, and is refused what would not fit */
    assert_int_equal(fake_keep(&c, 40 * MIB), 0);
    assert_int_not_equal(fake_keep(&c, 40 * MIB), 0);
    gemmd_budget_stats st;
    gemmd_budget_get_stats(b, &st);
    assert_int_equal(st.by_kind[GEMMD_MEM_CACHE], 40 * MIB);
    assert_string_equal(gemmd_mem_kind_name(GEMMD_MEM_CACHE), "cache");
    /* a request's charge that fits beside it does not touch it */
    assert_int_equal(gemmd_budget_charge(b, GEMMD_MEM_INPUT, 4 * MIB), 0);
    assert_int_equal(c.reclaims, 0);
    /* one that does not fit beside it fits once it is let go: "fits" says so ahead */
    assert_int_equal(gemmd_budget_fits(b, 30 * MIB), 0);
    assert_int_equal(gemmd_budget_charge(b, GEMMD_MEM_BODY, 30 * MIB), 0);
    assert_int_equal(c.reclaims, 1);
    gemmd_budget_get_stats(b, &st);
    assert_int_equal(st.by_kind[GEMMD_MEM_CACHE], 0);
    assert_int_equal(st.used, 34 * MIB);
    assert_int_equal(st.refused, 0);
    /* growth goes the same way */
    assert_int_equal(fake_keep(&c, 16 * MIB), 0);
    assert_int_equal(gemmd_budget_adjust(b, GEMMD_MEM_BODY, 30 * MIB, 40 * MIB), 0);
    assert_int_equal(c.reclaims, 2);
    /* and what does not fit even without the cache is refused, counted once */
    assert_int_equal(fake_keep(&c, 8 * MIB), 0);
    assert_int_not_equal(gemmd_budget_charge(b, GEMMD_MEM_BODY, 40 * MIB), 0);
    gemmd_budget_get_stats(b, &st);
    assert_int_equal(st.refused, 1);
    assert_int_equal(c.reclaims, 3);
    gemmd_budget_release(b, GEMMD_MEM_BODY, 40 * MIB);
    gemmd_budget_release(b, GEMMD_MEM_INPUT, 4 * MIB);
    gemmd_budget_get_stats(b, &st);
    assert_int_equal(st.used, 0);
    gemmd_budget_free(b);
}

static void test_charge_release(void **state)
{
    (void)state;
    gemmd_budget *b = gemmd_budget_new(64 * MIB, 7);
    assert_non_null(b);
    assert_int_equal(gemmd_budget_charge(b, GEMMD_MEM_BODY, 100), 0);
    assert_int_equal(gemmd_budget_charge(b, GEMMD_MEM_ANSWER, 200), 0);
    gemmd_budget_stats st;
    gemmd_budget_get_stats(b, &st);
    assert_int_equal(st.limit, 64 * MIB);
    assert_int_equal(st.used, 300);
    assert_int_equal(st.by_kind[GEMMD_MEM_BODY], 100);
    assert_int_equal(st.by_kind[GEMMD_MEM_ANSWER], 200);
    gemmd_budget_move(b, GEMMD_MEM_BODY, GEMMD_MEM_INPUT, 60);
    gemmd_budget_get_stats(b, &st);
    assert_int_equal(st.by_kind[GEMMD_MEM_BODY], 40);
    assert_int_equal(st.by_kind[GEMMD_MEM_INPUT], 60);
    assert_int_equal(st.used, 300);
    gemmd_budget_release(b, GEMMD_MEM_BODY, 40);
    gemmd_budget_release(b, GEMMD_MEM_INPUT, 60);
    gemmd_budget_release(b, GEMMD_MEM_ANSWER, 200);
    gemmd_budget_get_stats(b, &st);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.peak, 300);
    assert_string_equal(gemmd_mem_kind_name(GEMMD_MEM_RESULT), "results");
    gemmd_budget_free(b);
}

/* Large charges may use the budget less its eighth; small ones (up to 1/64) all of it. */
static void test_reserve_for_small(void **state)
{
    (void)state;
    gemmd_budget *b = gemmd_budget_new(64 * MIB, 7);
    assert_int_equal(gemmd_budget_max_single(b), 56 * MIB);
    assert_int_equal(gemmd_budget_charge(b, GEMMD_MEM_BODY, 57 * MIB), -1); /* into the reserve */
    assert_int_equal(gemmd_budget_take_refusal(), 57 * MIB);
    assert_int_equal(gemmd_budget_take_refusal(), 0); /* cleared by the call */
    assert_int_equal(gemmd_budget_charge(b, GEMMD_MEM_BODY, 56 * MIB), 0);
    assert_int_equal(gemmd_budget_charge(b, GEMMD_MEM_BODY, 2 * MIB), -1); /* large: reserve untouched */
    assert_int_equal(gemmd_budget_fits(b, 2 * MIB), -1);
    /* small charges (1 MiB = 64 MiB / 64) fill the reserve, and no more */
    for (int i = 0; i < 8; i++) assert_int_equal(gemmd_budget_charge(b, GEMMD_MEM_INPUT, MIB), 0);
    assert_int_equal(gemmd_budget_fits(b, 1), -1);
    assert_int_equal(gemmd_budget_charge(b, GEMMD_MEM_INPUT, 1), -1);
    gemmd_budget_stats st;
    gemmd_budget_get_stats(b, &st);
    assert_int_equal(st.used, 64 * MIB);
    assert_int_equal(st.refused, 3); /* fits() only asks */
    gemmd_budget_release(b, GEMMD_MEM_INPUT, 8 * MIB);
    gemmd_budget_release(b, GEMMD_MEM_BODY, 56 * MIB);
    gemmd_budget_free(b);
}

/* A growing charge is admitted by the size it grows to, so a body cannot creep into the
 * reserve in small steps. */
static void test_adjust(void **state)
{
    (void)state;
    gemmd_budget *b = gemmd_budget_new(64 * MIB, 7);
    uint64_t c = 0;
    for (uint64_t want = 2 * MIB; want <= 56 * MIB; want += 2 * MIB) {
        assert_int_equal(gemmd_budget_adjust(b, GEMMD_MEM_BODY, c, want), 0);
        c = want;
    }
    assert_int_equal(gemmd_budget_adjust(b, GEMMD_MEM_BODY, c, c + 2 * MIB), -1);
    assert_int_equal(gemmd_budget_adjust(b, GEMMD_MEM_BODY, c, MIB), 0); /* shrinking always works */
    gemmd_budget_stats st;
    gemmd_budget_get_stats(b, &st);
    assert_int_equal(st.used, MIB);
    assert_int_equal(st.by_kind[GEMMD_MEM_BODY], MIB);
    gemmd_budget_release(b, GEMMD_MEM_BODY, MIB);
    gemmd_budget_free(b);
}

/* Retry-After: the fallback while nothing was given back, then excess / drain rate. */
static void test_retry_after(void **state)
{
    (void)state;
    gemmd_budget *b = gemmd_budget_new(64 * MIB, 9);
    assert_int_equal(gemmd_budget_retry_after(b, MIB), 1); /* fits now */
    assert_int_equal(gemmd_budget_charge(b, GEMMD_MEM_RESULT, 56 * MIB), 0);
    assert_int_equal(gemmd_budget_retry_after(b, 10 * MIB), 9); /* nothing drained yet */
    /* 40 MiB given back within the window: 4 MiB/s; 10 MiB more than fits -> 3 s */
    for (int i = 0; i < 8; i++) assert_int_equal(gemmd_budget_charge(b, GEMMD_MEM_INPUT, MIB), 0); /* 64 */
    gemmd_budget_release(b, GEMMD_MEM_RESULT, 40 * MIB);                                    /* 24 used */
    assert_int_equal(gemmd_budget_charge(b, GEMMD_MEM_RESULT, 32 * MIB), 0); /* 56 used */
    unsigned ra = gemmd_budget_retry_after(b, 10 * MIB);
    assert_in_range(ra, 2, 3);
    gemm_err err;
    int r2 = 0;
    assert_int_equal(gemmd_budget_refuse(b, 10 * MIB, "the thing", &err, &r2), -1);
    assert_int_equal(err.status, 503);
    assert_string_equal(err.code, "over_budget");
    assert_non_null(strstr(err.message, "the thing"));
    assert_non_null(strstr(err.message, "max_inflight_mb"));
    assert_in_range(r2, 2, 3);
    assert_int_equal(gemmd_budget_retry_after(b, 100 * MIB), 3600); /* can never fit */
    gemmd_budget_release(b, GEMMD_MEM_RESULT, 48 * MIB);
    gemmd_budget_release(b, GEMMD_MEM_INPUT, 8 * MIB);
    gemmd_budget_free(b);
}

static void test_allocator(void **state)
{
    (void)state;
    gemmd_budget *b = gemmd_budget_new(64 * MIB, 7);
    gemmd_budget_alloc_ctx ctx = {b, gemm_allocator_host, GEMMD_MEM_INPUT, NULL};
    gemm_allocator al = gemmd_budget_allocator(&ctx);
    void *p = gemm_alloc(&al, 3 * MIB);
    assert_non_null(p);
    memset(p, 1, 3 * MIB);
    gemmd_budget_stats st;
    gemmd_budget_get_stats(b, &st);
    assert_int_equal(st.by_kind[GEMMD_MEM_INPUT], 3 * MIB);
    assert_int_equal(gemmd_budget_charged(b, p), 3 * MIB);
    assert_int_equal(gemmd_budget_buffers(b), 1);
    gemmd_budget_adopt(b, p, GEMMD_MEM_ANSWER, NULL);
    gemmd_budget_get_stats(b, &st);
    assert_int_equal(st.by_kind[GEMMD_MEM_INPUT], 0);
    assert_int_equal(st.by_kind[GEMMD_MEM_ANSWER], 3 * MIB);
    /* refused: NULL and the refusal mark, nothing charged or allocated */
    gemmd_budget_take_refusal();
    assert_null(gemm_alloc(&al, 60 * MIB));
    assert_int_equal(gemmd_budget_take_refusal(), 60 * MIB);
    gemm_free(&al, p); /* gives back what p was charged, whatever it is tagged now */
    gemmd_budget_get_stats(b, &st);
    assert_int_equal(st.used, 0);
    assert_int_equal(gemmd_budget_buffers(b), 0);
    /* a buffer from elsewhere is just freed */
    void *q = gemm_alloc(&gemm_allocator_host, 100);
    gemm_free(&al, q);
    gemmd_budget_free(b);
}

/* A request's reservation: what it allocates comes out of it while it lasts and the rest
 * is charged on its own; transient needs go back to it; a buffer that outlives the request
 * leaves it for a charge of its own; the end gives back what is left. */
static void test_reservation(void **state)
{
    (void)state;
    gemmd_budget *b = gemmd_budget_new(64 * MIB, 7);
    gemmd_resv r = {b, 0, 0};
    assert_int_equal(gemmd_budget_charge(b, GEMMD_MEM_RESERVED, 10 * MIB), 0);
    atomic_store(&r.total, 10 * MIB);
    gemmd_budget_alloc_ctx ctx = {b, gemm_allocator_host, GEMMD_MEM_INPUT, &r};
    gemm_allocator al = gemmd_budget_allocator(&ctx);
    void *a = gemm_alloc(&al, 6 * MIB), *c = gemm_alloc(&al, 6 * MIB);
    assert_non_null(a);
    assert_non_null(c);
    gemmd_budget_stats st;
    gemmd_budget_get_stats(b, &st);
    /* 10 reserved; a inside, c 4 inside and 2 on its own */
    assert_int_equal(st.used, 12 * MIB);
    assert_int_equal(st.by_kind[GEMMD_MEM_RESERVED], 10 * MIB);
    assert_int_equal(st.by_kind[GEMMD_MEM_INPUT], 2 * MIB);
    assert_int_equal(gemmd_budget_charged(b, c), 2 * MIB);
    /* c outlives the request: its 4 reserved bytes become its own charge */
    gemmd_budget_adopt(b, c, GEMMD_MEM_RESULT, &r);
    gemmd_budget_get_stats(b, &st);
    assert_int_equal(st.used, 12 * MIB);
    assert_int_equal(st.by_kind[GEMMD_MEM_RESERVED], 6 * MIB);
    assert_int_equal(st.by_kind[GEMMD_MEM_RESULT], 6 * MIB);
    assert_int_equal(atomic_load(&r.total), 6 * MIB);
    assert_int_equal(gemmd_budget_charged(b, c), 6 * MIB);
    /* a transient need: all of the reservation is taken, so it is charged on its own */
    uint64_t outside = 0;
    assert_int_equal(gemmd_resv_take(&r, b, GEMMD_MEM_BODY, MIB, &outside), 0);
    assert_int_equal(outside, MIB);
    gemmd_resv_give(&r, b, GEMMD_MEM_BODY, MIB, outside);
    gemm_free(&al, a); /* inside the reservation: nothing goes back before its end */
    gemmd_budget_get_stats(b, &st);
    assert_int_equal(st.used, 12 * MIB);
    assert_int_equal(gemmd_resv_end(&r), 6 * MIB);
    gemmd_budget_get_stats(b, &st);
    assert_int_equal(st.used, 6 * MIB); /* c, until it is freed */
    gemm_free(&al, c);
    gemmd_budget_get_stats(b, &st);
    assert_int_equal(st.used, 0);
    /* a need that does not fit takes nothing */
    gemmd_resv r2 = {b, 0, 0};
    assert_int_equal(gemmd_budget_charge(b, GEMMD_MEM_RESERVED, 4 * MIB), 0);
    atomic_store(&r2.total, 4 * MIB);
    assert_int_equal(gemmd_resv_take(&r2, b, GEMMD_MEM_BODY, 100 * MIB, &outside), -1);
    assert_int_equal(atomic_load(&r2.used), 0);
    assert_int_equal(gemmd_resv_take(&r2, b, GEMMD_MEM_BODY, 3 * MIB, &outside), 0);
    assert_int_equal(outside, 0);
    gemmd_resv_give(&r2, b, GEMMD_MEM_BODY, 3 * MIB, 0);
    assert_int_equal(atomic_load(&r2.used), 0);
    gemmd_resv_end(&r2);
    gemmd_budget_get_stats(b, &st);
    assert_int_equal(st.used, 0);
    gemmd_budget_free(b);
}

/* Many buffers: the table grows, and frees in any order find their charge. */
static void test_many_buffers(void **state)
{
    (void)state;
    enum { N = 3000 };
    gemmd_budget *b = gemmd_budget_new(1024 * MIB, 7);
    gemmd_budget_alloc_ctx ctx = {b, gemm_allocator_host, GEMMD_MEM_INPUT, NULL};
    gemm_allocator al = gemmd_budget_allocator(&ctx);
    void **p = calloc(N, sizeof *p);
    uint64_t total = 0;
    for (int i = 0; i < N; i++) {
        p[i] = gemm_alloc(&al, (size_t)(64 + i));
        assert_non_null(p[i]);
        total += (uint64_t)(64 + i);
    }
    gemmd_budget_stats st;
    gemmd_budget_get_stats(b, &st);
    assert_int_equal(st.used, total);
    assert_int_equal(gemmd_budget_buffers(b), N);
    for (int i = 0; i < N; i += 2) gemm_free(&al, p[i]);
    for (int i = 1; i < N; i += 2) assert_int_equal(gemmd_budget_charged(b, p[i]), (uint64_t)(64 + i));
    for (int i = N - 1; i >= 1; i -= 2) gemm_free(&al, p[i]);
    gemmd_budget_get_stats(b, &st);
    assert_int_equal(st.used, 0);
    assert_int_equal(gemmd_budget_buffers(b), 0);
    free(p);
    gemmd_budget_free(b);
}

/* One thread of the threaded tests: its allocator charges b. */
typedef struct {
    gemmd_budget *b;
    gemm_allocator al;
    unsigned seed;
    int refused; /* charges refused (worker) */
    int bad;     /* a buffer that lost its charge, or an allocation that failed (churner) */
} worker_arg;

/* Runs fn on 8 threads against b, waits for them, and checks that everything was given
 * back: nothing charged, no buffer in the table. */
static void run_threads(gemmd_budget *b, void *(*fn)(void *), worker_arg w[8])
{
    gemmd_budget_alloc_ctx ctx = {b, gemm_allocator_host, GEMMD_MEM_INPUT, NULL};
    pthread_t t[8];
    for (int i = 0; i < 8; i++) {
        w[i] = (worker_arg){b, gemmd_budget_allocator(&ctx), 1234u + (unsigned)i, 0, 0};
        pthread_create(&t[i], NULL, fn, &w[i]);
    }
    for (int i = 0; i < 8; i++) pthread_join(t[i], NULL);
    gemmd_budget_stats st;
    gemmd_budget_get_stats(b, &st);
    assert_int_equal(st.used, 0);
    assert_int_equal(gemmd_budget_buffers(b), 0);
    for (int k = 0; k < GEMMD_MEM_NKINDS; k++) assert_int_equal(st.by_kind[k], 0);
}

static void *worker(void *arg)
{
    worker_arg *w = arg;
    for (int i = 0; i < 2000; i++) {
        void *p = gemm_alloc(&w->al, 4096);
        if (gemmd_budget_charge(w->b, GEMMD_MEM_BODY, 100 * 1024) != 0) w->refused++;
        else gemmd_budget_release(w->b, GEMMD_MEM_BODY, 100 * 1024);
        gemm_free(&w->al, p);
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    gemmd_budget *b = gemmd_budget_new(2 * MIB, 7);
    worker_arg w[8];
    run_threads(b, worker, w);
    gemmd_budget_stats st;
    gemmd_budget_get_stats(b, &st);
    assert_true(st.peak <= 2 * MIB);
    gemmd_budget_free(b);
}

/* Threads each keep many buffers alive while they take, look up, retag and give back:
 * every shard of the table grows and shrinks under several threads, and every buffer
 * keeps its own charge and kind. */
static void *churner(void *arg)
{
    worker_arg *w = arg;
    enum { LIVE = 96 };
    void *p[LIVE] = {0};
    size_t sz[LIVE] = {0};
    for (int i = 0; i < 6000; i++) {
        unsigned r = rand_r(&w->seed);
        int s = (int)(r % LIVE);
        if (p[s]) {
            if (gemmd_budget_charged(w->b, p[s]) != sz[s]) w->bad++;
            if (r & 0x100) gemmd_budget_adopt(w->b, p[s], GEMMD_MEM_RESULT, NULL);
            if (gemmd_budget_charged(w->b, p[s]) != sz[s]) w->bad++;
            gemm_free(&w->al, p[s]);
            p[s] = NULL;
        } else {
            sz[s] = 16 + (r >> 12) % 4000;
            p[s] = gemm_alloc(&w->al, sz[s]);
            if (!p[s]) w->bad++;
        }
    }
    for (int s = 0; s < LIVE; s++)
        if (p[s]) gemm_free(&w->al, p[s]);
    return NULL;
}

static void test_threads_many_live(void **state)
{
    (void)state;
    gemmd_budget *b = gemmd_budget_new(256 * MIB, 7);
    worker_arg w[8];
    run_threads(b, churner, w);
    for (int i = 0; i < 8; i++) assert_int_equal(w[i].bad, 0);
    gemmd_budget_free(b);
}

/* The heaps' free pages go back to the system once GEMMD_TRIM_MIN has been given back and
 * the charges have not grown for GEMMD_TRIM_QUIET_MS; at most every GEMMD_TRIM_EVERY_MS. */
static void test_tick_trims(void **state)
{
    (void)state;
    gemmd_budget *b = gemmd_budget_new(1024 * MIB, 10);
    int64_t t = 1000000;
    assert_int_equal(gemmd_budget_tick(b, t), 0);
    assert_int_equal(gemmd_budget_charge(b, GEMMD_MEM_BODY, 64 * MIB), 0);
    assert_int_equal(gemmd_budget_tick(b, t += 50), 0); /* grew: quiet from now */
    gemmd_budget_release(b, GEMMD_MEM_BODY, GEMMD_TRIM_MIN - 1);
    assert_int_equal(gemmd_budget_tick(b, t += 2 * GEMMD_TRIM_QUIET_MS), 0); /* too little given back */
    gemmd_budget_release(b, GEMMD_MEM_BODY, 1);
    assert_int_equal(gemmd_budget_tick(b, t += 50), 1);
    assert_int_equal(gemmd_budget_tick(b, t += 50), 0); /* nothing given back since */
    /* more given back, but growth in between: quiet again first */
    assert_int_equal(gemmd_budget_charge(b, GEMMD_MEM_BODY, 8 * MIB), 0);
    assert_int_equal(gemmd_budget_tick(b, t += GEMMD_TRIM_EVERY_MS), 0);
    gemmd_budget_release(b, GEMMD_MEM_BODY, 56 * MIB);
    assert_int_equal(gemmd_budget_tick(b, t += GEMMD_TRIM_QUIET_MS / 2), 0);
    assert_int_equal(gemmd_budget_tick(b, t += GEMMD_TRIM_QUIET_MS / 2), 1);
    /* at most every GEMMD_TRIM_EVERY_MS */
    assert_int_equal(gemmd_budget_charge(b, GEMMD_MEM_BODY, 32 * MIB), 0);
    assert_int_equal(gemmd_budget_tick(b, t += 50), 0);
    gemmd_budget_release(b, GEMMD_MEM_BODY, 32 * MIB);
    assert_int_equal(gemmd_budget_tick(b, t += GEMMD_TRIM_QUIET_MS), 0);
    assert_int_equal(gemmd_budget_tick(b, t += GEMMD_TRIM_EVERY_MS), 1);
    assert_int_equal(gemmd_budget_tick(NULL, t), 0);
    gemmd_budget_free(b);
}

static void test_default_limit(void **state)
{
    (void)state;
    uint64_t lim = gemmd_budget_limit(0);
    assert_true(lim >= 64 * MIB);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_charge_release), cmocka_unit_test(test_reserve_for_small),
        cmocka_unit_test(test_adjust),         cmocka_unit_test(test_retry_after),
        cmocka_unit_test(test_allocator),      cmocka_unit_test(test_reservation),
        cmocka_unit_test(test_many_buffers),   cmocka_unit_test(test_threads),
        cmocka_unit_test(test_threads_many_live), cmocka_unit_test(test_tick_trims),
        cmocka_unit_test(test_default_limit),  cmocka_unit_test(test_cache_gives_way),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
