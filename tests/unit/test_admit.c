/*
 * test_admit.c - the admission queue: admitted at once while it fits, else waiting and
 * admitted when memory is given back, FIFO for one client and in turn across clients, the
 * oldest first once it has waited a moment, refused at its deadline or when the queue is
 * full, 413 for what can never fit, a cancelled ticket never woken, and many threads
 * entering and releasing at once with every byte accounted.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "admit.h"

#define MIB (1024ull * 1024ull)

/* What the queue's thread did with the tickets: the order they were woken in. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int order[64], n;
} wakes;

typedef struct {
    wakes *w;
    int id;
    gemmd_admit_ticket t;
} waiter;

static void on_wake(void *arg)
{
    waiter *x = arg;
    pthread_mutex_lock(&x->w->mu);
    x->w->order[x->w->n++] = x->id;
    pthread_cond_broadcast(&x->w->cv);
    pthread_mutex_unlock(&x->w->mu);
}

static void wakes_init(wakes *w)
{
    memset(w, 0, sizeof *w);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
}

/* Waits until n tickets were woken (at most 5 s); returns how many were. */
static int wait_for(wakes *w, int n)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 5;
    pthread_mutex_lock(&w->mu);
    while (w->n < n && pthread_cond_timedwait(&w->cv, &w->mu, &ts) == 0) {
    }
    int got = w->n;
    pthread_mutex_unlock(&w->mu);
    return got;
}

static int enter(gemmd_admit *a, waiter *x, wakes *w, int id, int client, uint64_t bytes)
{
    gemm_err err;
    int ra = 0;
    x->w = w;
    x->id = id;
    return gemmd_admit_enter(a, &x->t, client, bytes, on_wake, x, &err, &ra);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static uint64_t reserved(gemmd_budget *b)
{
    gemmd_budget_stats st;
    gemmd_budget_get_stats(b, &st);
    return st.by_kind[GEMMD_MEM_RESERVED];
}

/* The release hook as the server sets it (http.c): every release kicks the queue. */
static void kick(void *a) { gemmd_admit_kick(a); }

/* A queue over a budget of mib MiB, wired as the server wires them. */
static gemmd_admit *queue(gemmd_budget **b, uint64_t mib, int max_waiting, double max_wait_s, int share_pct)
{
    *b = gemmd_budget_new(mib * MIB, 1);
    gemmd_admit *a = gemmd_admit_new(*b, max_waiting, max_wait_s, share_pct);
    gemmd_budget_set_release_hook(*b, kick, a);
    return a;
}

static void test_fits_at_once_and_waits(void **state)
{
    (void)state;
    gemmd_budget *b;
    gemmd_admit *a = queue(&b, 64, 8, 5.0, 100);
    wakes w;
    wakes_init(&w);
    waiter x[3];
    assert_int_equal(enter(a, &x[0], &w, 0, 1, 30 * MIB), 0); /* admitted: reserved */
    assert_int_equal(reserved(b), 30 * MIB);
    assert_int_equal(enter(a, &x[1], &w, 1, 1, 30 * MIB), 1); /* 60 of 56 usable: waits */
    assert_int_equal(enter(a, &x[2], &w, 2, 1, 10 * MIB), 1); /* behind it, though it fits */
    gemmd_admit_stats st;
    gemmd_admit_get_stats(a, &st);
    assert_int_equal(st.waiting, 2);
    assert_int_equal(st.waiting_bytes, 40 * MIB);
    sleep_ms(150);
    assert_int_equal(w.n, 0);
    gemmd_budget_release(b, GEMMD_MEM_RESERVED, 30 * MIB); /* the first is done */
    gemmd_admit_done(a, &x[0].t, 0.1);
    assert_int_equal(wait_for(&w, 2), 2);
    assert_int_equal(w.order[0], 1); /* FIFO within a client */
    assert_int_equal(w.order[1], 2);
    gemm_err err;
    int ra;
    assert_int_equal(gemmd_admit_result(&x[1].t, &err, &ra), 0);
    assert_int_equal(gemmd_admit_result(&x[2].t, &err, &ra), 0);
    assert_int_equal(reserved(b), 40 * MIB);
    gemmd_admit_free(a);
    gemmd_budget_free(b);
}

static void test_clients_in_turn(void **state)
{
    (void)state;
    gemmd_budget *b;
    gemmd_admit *a = queue(&b, 64, 16, 5.0, 100);
    wakes w;
    wakes_init(&w);
    waiter x[7];
    assert_int_equal(enter(a, &x[0], &w, 0, 2, 50 * MIB), 0);
    /* the hog queues three more, then bob and carol one each */
    for (int i = 1; i <= 3; i++) assert_int_equal(enter(a, &x[i], &w, i, 2, 10 * MIB), 1);
    assert_int_equal(enter(a, &x[4], &w, 4, 3, 10 * MIB), 1);
    assert_int_equal(enter(a, &x[5], &w, 5, 4, 10 * MIB), 1);
    gemmd_budget_release(b, GEMMD_MEM_RESERVED, 50 * MIB); /* room for five of them */
    gemmd_admit_done(a, &x[0].t, 0.1);
    assert_int_equal(wait_for(&w, 5), 5);
    /* bob and carol are among the first three admitted: clients go in turn */
    int bob = 0, carol = 0;
    for (int i = 0; i < 3; i++) {
        bob |= w.order[i] == 4;
        carol |= w.order[i] == 5;
    }
    assert_true(bob && carol);
    gemmd_admit_free(a);
    gemmd_budget_free(b);
}

static void test_deadline_and_full(void **state)
{
    (void)state;
    gemmd_budget *b;
    gemmd_admit *a = queue(&b, 64, 4, 0.3, 100);
    wakes w;
    wakes_init(&w);
    waiter x[6];
    gemm_err err;
    int ra = 0;
    assert_int_equal(enter(a, &x[0], &w, 0, 5, 50 * MIB), 0);
    assert_int_equal(enter(a, &x[1], &w, 1, 6, 20 * MIB), 1);
    /* one client may hold a quarter of the places (1 of 4): its second is refused now */
    x[2].w = &w;
    assert_int_equal(gemmd_admit_enter(a, &x[2].t, 6, 20 * MIB, on_wake, &x[2], &err, &ra), -1);
    assert_int_equal(err.status, 503);
    assert_string_equal(err.code, "over_budget");
    assert_true(ra >= 1 && ra <= 60);
    for (int i = 3; i <= 5; i++)
        assert_int_equal(enter(a, &x[i], &w, i, i == 3 ? 7 : i == 4 ? 8 : 9, 10 * MIB), 1);
    /* four wait: a fifth client is refused, the queue is full */
    waiter y;
    y.w = &w;
    assert_int_equal(gemmd_admit_enter(a, &y.t, 10, MIB, on_wake, &y, &err, &ra), -1);
    /* the deadline: all four are refused, with a Retry-After */
    assert_int_equal(wait_for(&w, 4), 4);
    for (int i = 1; i <= 5; i++) {
        if (i == 2) continue;
        assert_true(gemmd_admit_decided(&x[i].t));
        assert_int_equal(gemmd_admit_result(&x[i].t, &err, &ra), -1);
        assert_int_equal(err.status, 503);
        assert_true(ra >= 1 && ra <= 60);
    }
    assert_int_equal(reserved(b), 50 * MIB);
    /* more than the budget can ever give one request: 413 at once */
    assert_int_equal(gemmd_admit_enter(a, &y.t, 10, 100 * MIB, on_wake, &y, &err, &ra), -1);
    assert_int_equal(err.status, 413);
    gemmd_admit_free(a);
    gemmd_budget_free(b);
}

static void test_cancel_and_oldest_first(void **state)
{
    (void)state;
    gemmd_budget *b;
    gemmd_admit *a = queue(&b, 64, 16, 10.0, 100);
    wakes w;
    wakes_init(&w);
    waiter x[5];
    assert_int_equal(enter(a, &x[0], &w, 0, 5, 40 * MIB), 0);
    assert_int_equal(enter(a, &x[1], &w, 1, 11, 40 * MIB), 1);
    assert_int_equal(enter(a, &x[2], &w, 2, 12, 20 * MIB), 1);
    assert_int_equal(gemmd_admit_cancel(a, &x[2].t), 1); /* the client left */
    sleep_ms(700);                                     /* big is the oldest, long enough */
    assert_int_equal(enter(a, &x[3], &w, 3, 13, 10 * MIB), 1); /* would fit, but big goes first */
    sleep_ms(150);
    assert_int_equal(w.n, 0);
    gemmd_budget_release(b, GEMMD_MEM_RESERVED, 40 * MIB);
    gemmd_admit_done(a, &x[0].t, 0.1);
    assert_int_equal(wait_for(&w, 2), 2);
    assert_int_equal(w.order[0], 1);
    assert_int_equal(w.order[1], 3);
    assert_int_equal(reserved(b), 50 * MIB);
    gemmd_admit_stats st;
    gemmd_admit_get_stats(a, &st);
    assert_int_equal(st.cancelled, 1);
    assert_int_equal(st.waiting, 0);
    gemmd_admit_free(a);
    gemmd_budget_free(b);
}

/* One client's requests hold at most its share: its second waits for its first, while
 * another client's request goes ahead. */
static void test_share(void **state)
{
    (void)state;
    gemmd_budget *b;
    gemmd_admit *a = queue(&b, 64, 16, 5.0, 50); /* a share: half of 56 MiB */
    wakes w;
    wakes_init(&w);
    waiter x[4];
    assert_int_equal(enter(a, &x[0], &w, 0, 1, 40 * MIB), 0); /* a first request always fits */
    assert_int_equal(enter(a, &x[1], &w, 1, 1, 4 * MIB), 1);  /* 44 > 28: waits for its own */
    assert_int_equal(enter(a, &x[2], &w, 2, 2, 10 * MIB), 1); /* behind it in the queue... */
    assert_int_equal(wait_for(&w, 1), 1);                     /* ...but admitted: it fits */
    assert_int_equal(w.order[0], 2);
    gemmd_budget_release(b, GEMMD_MEM_RESERVED, 40 * MIB);
    gemmd_admit_done(a, &x[0].t, 0.1);
    assert_int_equal(wait_for(&w, 2), 2);
    assert_int_equal(w.order[1], 1);
    gemmd_admit_free(a);
    gemmd_budget_free(b);
}

/* Threads enter, hold a while and release; nothing is lost or reserved twice. */
typedef struct {
    gemmd_admit *a;
    gemmd_budget *b;
    int id, admitted, refused;
} churn_arg;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
} one_wake;

static void wake_one(void *arg)
{
    one_wake *o = arg;
    pthread_mutex_lock(&o->mu);
    o->done = 1;
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

static void *churner(void *arg)
{
    churn_arg *c = arg;
    int name = c->id % 3;
    for (int i = 0; i < 200; i++) {
        one_wake o = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
        gemmd_admit_ticket t;
        gemm_err err;
        int ra;
        uint64_t bytes = (uint64_t)(1 + (c->id + i) % 7) * MIB;
        int r = gemmd_admit_enter(c->a, &t, name, bytes, wake_one, &o, &err, &ra);
        if (r == 1) {
            pthread_mutex_lock(&o.mu);
            while (!o.done) pthread_cond_wait(&o.cv, &o.mu);
            pthread_mutex_unlock(&o.mu);
            r = gemmd_admit_result(&t, &err, &ra);
        }
        if (r == 0) {
            c->admitted++;
            gemmd_budget_release(c->b, GEMMD_MEM_RESERVED, bytes);
            gemmd_admit_done(c->a, &t, 0.001);
        } else {
            c->refused++;
        }
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    gemmd_budget *b;
    gemmd_admit *a = queue(&b, 16, 64, 5.0, 100);
    pthread_t th[8];
    churn_arg c[8];
    for (int i = 0; i < 8; i++) {
        c[i] = (churn_arg){a, b, i, 0, 0};
        assert_int_equal(pthread_create(&th[i], NULL, churner, &c[i]), 0);
    }
    int admitted = 0;
    for (int i = 0; i < 8; i++) {
        pthread_join(th[i], NULL);
        admitted += c[i].admitted;
    }
    assert_true(admitted > 0);
    assert_int_equal(reserved(b), 0);
    gemmd_admit_stats st;
    gemmd_admit_get_stats(a, &st);
    assert_int_equal(st.waiting, 0);
    assert_int_equal(st.waiting_bytes, 0);
    gemmd_admit_free(a);
    gemmd_budget_free(b);
}

/* Closing the queue (shutdown): what waits is refused with 503 shutting_down, not as a
 * wait in vain; and so is whatever enters afterwards. */
static void test_close_says_shutting_down(void **state)
{
    (void)state;
    gemmd_budget *b = gemmd_budget_new(64 * MIB, 1);
    gemmd_admit *a = gemmd_admit_new(b, 8, 30.0, 100);
    wakes w;
    wakes_init(&w);
    waiter x[2];
    gemm_err err;
    int ra = 0;
    assert_int_equal(enter(a, &x[0], &w, 0, 1, 50 * MIB), 0);
    assert_int_equal(enter(a, &x[1], &w, 1, 2, 20 * MIB), 1);
    gemmd_admit_close(a);
    assert_int_equal(wait_for(&w, 1), 1);
    assert_int_equal(gemmd_admit_result(&x[1].t, &err, &ra), -1);
    assert_int_equal(err.status, 503);
    assert_string_equal(err.code, "shutting_down");
    assert_int_equal(ra, 1);
    assert_int_equal(gemmd_admit_enter(a, &x[1].t, 2, MIB, on_wake, &x[1], &err, &ra), -1);
    assert_string_equal(err.code, "shutting_down");
    gemmd_admit_free(a);
    gemmd_budget_free(b);
}

/* The expected wait counts the budget's reserve (its last eighth) as free only for small
 * requests, and says at most GEMMD_RETRY_MAX_S. */
static void test_expected_wait(void **state)
{
    (void)state;
    gemmd_budget *b = gemmd_budget_new(64 * MIB, 1);
    gemmd_admit *a = gemmd_admit_new(b, 1, 30.0, 100);
    wakes w;
    wakes_init(&w);
    waiter x[3];
    gemm_err err;
    int ra = 0;
    assert_int_equal(enter(a, &x[0], &w, 0, 1, 56 * MIB), 0); /* all a big request may hold */
    for (int i = 0; i < 30; i++) gemmd_admit_done(a, &x[0].t, 10.0); /* reservations last 10 s */
    assert_int_equal(enter(a, &x[1], &w, 1, 2, 2 * MIB), 1);
    /* 2 + 8 MiB must be given back of the 56 held, which turn over in 10 s: 2 s, not 1 */
    x[2].w = &w;
    assert_int_equal(gemmd_admit_enter(a, &x[2].t, 3, 8 * MIB, on_wake, &x[2], &err, &ra), -1);
    assert_string_equal(err.code, "over_budget");
    assert_int_equal(ra, 2);
    /* 600 MiB waiting ahead would be a minute and more: said as GEMMD_RETRY_MAX_S */
    gemmd_admit_free(a);
    a = gemmd_admit_new(b, 1, 30.0, 100);
    for (int i = 0; i < 30; i++) gemmd_admit_done(a, &x[0].t, 10.0);
    assert_int_equal(enter(a, &x[1], &w, 1, 2, 50 * MIB), 1);
    assert_int_equal(gemmd_admit_enter(a, &x[2].t, 3, 50 * MIB, on_wake, &x[2], &err, &ra), -1);
    assert_int_equal(ra, GEMMD_RETRY_MAX_S);
    gemmd_admit_free(a);
    gemmd_budget_free(b);
}

/* The engine's cache, as the budget's reclaim sees it: let go only once armed. */
typedef struct {
    gemmd_budget *b;
    uint64_t held;
    int armed;
} cache;

static uint64_t reclaim_cache(void *ctx)
{
    cache *c = ctx;
    uint64_t n = c->armed ? c->held : 0;
    c->held -= n;
    gemmd_budget_release(c->b, GEMMD_MEM_CACHE, n); /* the release hook kicks the queue */
    return n;
}

/* A waiting ticket that fits only once the cache is let go: the queue's thread reserves
 * it under its lock, the reclaim releases memory, and the release hook kicks the queue
 * again, from inside that lock. It must be admitted, not hang (it did with a cache on the
 * GPU backend). */
static void test_reclaim_inside_the_queue(void **state)
{
    (void)state;
    gemmd_budget *b;
    gemmd_admit *a = queue(&b, 64, 8, 5.0, 100);
    cache c = {b, 40 * MIB, 0};
    gemmd_budget_set_reclaim(b, reclaim_cache, &c);
    wakes w;
    wakes_init(&w);
    waiter x[2];
    assert_int_equal(enter(a, &x[0], &w, 0, 1, 10 * MIB), 0);
    assert_int_equal(gemmd_budget_charge(b, GEMMD_MEM_CACHE, 40 * MIB), 0);
    assert_int_equal(enter(a, &x[1], &w, 1, 2, 30 * MIB), 1); /* 80 of 56: waits, the cache kept */
    c.armed = 1;
    gemmd_budget_release(b, GEMMD_MEM_RESERVED, 10 * MIB);
    gemmd_admit_done(a, &x[0].t, 0.1);
    assert_int_equal(wait_for(&w, 1), 1);
    gemm_err err;
    int ra;
    assert_int_equal(gemmd_admit_result(&x[1].t, &err, &ra), 0);
    assert_int_equal(c.held, 0);
    assert_int_equal(reserved(b), 30 * MIB);
    gemmd_admit_free(a);
    gemmd_budget_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fits_at_once_and_waits), cmocka_unit_test(test_clients_in_turn),
        cmocka_unit_test(test_deadline_and_full),      cmocka_unit_test(test_cancel_and_oldest_first),
        cmocka_unit_test(test_share),                  cmocka_unit_test(test_threads),
        cmocka_unit_test(test_close_says_shutting_down), cmocka_unit_test(test_expected_wait),
        cmocka_unit_test(test_reclaim_inside_the_queue),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
