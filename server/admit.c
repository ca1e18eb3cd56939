/*
 * admit.c - the admission queue (admit.h): clients in slots, each with a FIFO of tickets,
 * one lock, and one thread that admits when memory is given back and refuses at
 * deadlines. A decided ticket is woken outside the lock: wake() may take the waiter's own
 * locks.
 *
 * The expected wait (docs/OPERATIONS.md, "Memory budget") divides by the rate at which
 * reservations turn over, not by the bytes freed lately: memory is given back in lumps,
 * whole requests at a time, and the turnover of what is held says how soon the next come.
 */
#include "admit.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#define STARVE_S 0.5       /* the oldest ticket goes first once it has waited this long */
#define TICK_MS 50         /* how often the thread looks at deadlines */

typedef struct {
    gemmd_admit_ticket *head, *tail;
    int waiting;
    uint64_t inflight;         /* bytes of its admitted requests still held */
} client;

struct gemmd_admit {
    gemmd_budget *budget;
    int max_waiting, max_per_client;
    double max_wait_s;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int stop, joined;
    _Atomic int kicked;        /* set without the lock by gemmd_admit_kick */
    client clients[GEMMD_CLIENTS];
    uint64_t share;            /* what one client's big requests may hold at once */
    uint64_t small;            /* a request this small is never held back by the share */
    int rr;                    /* the next client in turn */
    int waiting;
    _Atomic int nwaiting;      /* waiting, read without the lock by gemmd_admit_kick */
    uint64_t waiting_bytes;
    double hold_s;             /* how long a reservation lasts, a decaying average */
    gemmd_admit_stats st;
    gemmd_admit_ticket *woken, **woken_tail; /* decided, to be woken outside the lock */
};

/* A client's requests fit its share: always the first and the small ones (they may take
 * the budget's last eighth, kept for them), the rest within the share. */
static int fits_client(const gemmd_admit *a, const client *c, uint64_t bytes)
{
    return c->inflight == 0 || bytes <= a->small || (c->inflight <= a->share && bytes <= a->share - c->inflight);
}

/* Reserves t's bytes when they fit both its client's share and the budget. */
static int try_admit_locked(gemmd_admit *a, gemmd_admit_ticket *t)
{
    client *c = &a->clients[t->client];
    if (!fits_client(a, c, t->bytes) || gemmd_budget_charge(a->budget, GEMMD_MEM_RESERVED, t->bytes) != 0) return -1;
    c->inflight += t->bytes;
    a->st.admitted++;
    return 0;
}

static int expected_wait_locked(gemmd_admit *a, uint64_t bytes)
{
    gemmd_budget_stats bs;
    gemmd_budget_get_stats(a->budget, &bs);
    uint64_t cap = bytes <= a->small ? bs.limit : gemmd_budget_max_single(a->budget); /* the reserve is not free */
    uint64_t free_now = bs.used < cap ? cap - bs.used : 0;
    double need = (double)a->waiting_bytes + (double)bytes - (double)free_now;
    double held = (double)bs.by_kind[GEMMD_MEM_RESERVED];
    double s = need <= 0 ? 1 : held > 0 ? need / (held / a->hold_s) : a->max_wait_s;
    if (s < 1) s = 1;
    if (s > GEMMD_RETRY_MAX_S) s = GEMMD_RETRY_MAX_S;
    return (int)(s + 0.999);
}

static void unlink_locked(gemmd_admit *a, gemmd_admit_ticket *t)
{
    client *c = &a->clients[t->client];
    gemmd_admit_ticket **pp = &c->head, *prev = NULL;
    while (*pp && *pp != t) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (!*pp) return;
    *pp = t->next;
    if (c->tail == t) c->tail = prev;
    t->next = NULL;
    c->waiting--;
    a->waiting--;
    atomic_store(&a->nwaiting, a->waiting);
    a->waiting_bytes -= t->bytes;
}

/* Decides t (unlinked already) and appends it to the tickets to wake outside the lock. */
static void decide_locked(gemmd_admit *a, gemmd_admit_ticket *t, int result)
{
    t->result = result;
    if (result != 0) t->retry_after_s = expected_wait_locked(a, t->bytes);
    atomic_store(&t->decided, 1);
    t->next = NULL;
    *a->woken_tail = t;
    a->woken_tail = &t->next;
}

/* Admits waiting tickets that fit: the oldest first once it has waited STARVE_S, else the
 * clients in turn, each its oldest. */
static void admit_locked(gemmd_admit *a, double now)
{
    for (int progress = 1; progress && a->waiting;) {
        progress = 0;
        gemmd_admit_ticket *oldest = NULL;
        for (int i = 0; i < GEMMD_CLIENTS; i++) {
            gemmd_admit_ticket *h = a->clients[i].head;
            if (h && fits_client(a, &a->clients[i], h->bytes) && (!oldest || h->t_enter < oldest->t_enter))
                oldest = h;
        }
        if (oldest && now - oldest->t_enter >= STARVE_S) { /* it goes first, or nobody */
            if (try_admit_locked(a, oldest) != 0) break;
            unlink_locked(a, oldest);
            decide_locked(a, oldest, 0);
            progress = 1;
            continue;
        }
        for (int k = 0; k < GEMMD_CLIENTS && !progress; k++) {
            int i = (a->rr + k) % GEMMD_CLIENTS;
            gemmd_admit_ticket *h = a->clients[i].head;
            if (!h || try_admit_locked(a, h) != 0) continue;
            unlink_locked(a, h);
            decide_locked(a, h, 0);
            a->rr = (i + 1) % GEMMD_CLIENTS;
            progress = 1;
        }
    }
}

/* Refuses the tickets past their deadline (all of them when stopping). */
static void expire_locked(gemmd_admit *a, double now)
{
    for (int i = 0; i < GEMMD_CLIENTS; i++) {
        gemmd_admit_ticket *t = a->clients[i].head;
        while (t) {
            gemmd_admit_ticket *next = t->next;
            if (a->stop || now >= t->deadline) {
                unlink_locked(a, t);
                decide_locked(a, t, a->stop ? -2 : -1); /* -2: closed */
                a->st.refused_wait++;
            }
            t = next;
        }
    }
}

/* Once stopping, one last pass refuses whatever still waits (no ticket enters any more). */
static void *run(void *arg)
{
    gemmd_admit *a = arg;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        if (!a->kicked && !a->stop) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            long ns = ts.tv_nsec + TICK_MS * 1000000L;
            ts.tv_sec += ns / 1000000000L;
            ts.tv_nsec = ns % 1000000000L;
            pthread_cond_timedwait(&a->cv, &a->mu, &ts);
        }
        a->kicked = 0;
        int stop = a->stop;
        double now = gemm_now_ms() / 1000.0;
        admit_locked(a, now);
        expire_locked(a, now);
        gemmd_admit_ticket *t = a->woken;
        a->woken = NULL;
        a->woken_tail = &a->woken;
        pthread_mutex_unlock(&a->mu);
        while (t) { /* in the order they were decided */
            gemmd_admit_ticket *next = t->next; /* t may be gone once woken */
            t->next = NULL;
            t->wake(t->arg);
            t = next;
        }
        if (stop) return NULL;
        pthread_mutex_lock(&a->mu);
    }
}

gemmd_admit *gemmd_admit_new(gemmd_budget *b, int max_waiting, double max_wait_s, int share_pct)
{
    gemmd_admit *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->budget = b;
    uint64_t most = gemmd_budget_max_single(b);
    a->share = most / 100 * (uint64_t)share_pct + most % 100 * (uint64_t)share_pct / 100;
    a->small = most / 56; /* as the budget's small charges: a 64th of the limit */
    a->max_waiting = max_waiting > 0 ? max_waiting : 1;
    a->max_per_client = a->max_waiting / 4 > 1 ? a->max_waiting / 4 : 1;
    a->max_wait_s = max_wait_s > 0 ? max_wait_s : 1;
    a->hold_s = 1.0;
    a->woken_tail = &a->woken;
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    if (pthread_create(&a->thread, NULL, run, a) != 0) {
        pthread_cond_destroy(&a->cv);
        pthread_mutex_destroy(&a->mu);
        free(a);
        return NULL;
    }
    return a;
}

void gemmd_admit_close(gemmd_admit *a)
{
    pthread_mutex_lock(&a->mu);
    int joined = a->joined;
    a->stop = a->joined = 1;
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
    if (!joined) pthread_join(a->thread, NULL);
}

void gemmd_admit_free(gemmd_admit *a)
{
    if (!a) return;
    gemmd_admit_close(a);
    pthread_cond_destroy(&a->cv);
    pthread_mutex_destroy(&a->mu);
    free(a);
}

int gemmd_admit_enter(gemmd_admit *a, gemmd_admit_ticket *t, int client_key, uint64_t bytes,
                      void (*wake)(void *arg), void *arg, gemm_err *err, int *retry_after_s)
{
    *t = (gemmd_admit_ticket){.bytes = bytes, .wake = wake, .arg = arg};
    *retry_after_s = 0;
    if (bytes > gemmd_budget_max_single(a->budget))
        return gemm_err_set(err, 413, "too_large",
                            "this request needs %.1f MiB, more than this server's memory budget lets one request "
                            "hold (%.1f MiB of max_inflight_mb)", (double)bytes / (1 << 20),
                            (double)gemmd_budget_max_single(a->budget) / (1 << 20));
    pthread_mutex_lock(&a->mu);
    if (a->stop) {
        pthread_mutex_unlock(&a->mu);
        *retry_after_s = 1;
        return gemm_err_set(err, 503, "shutting_down", "the server is shutting down; retry elsewhere");
    }
    int c = (int)((unsigned)client_key % GEMMD_CLIENTS);
    t->client = c;
    /* Nobody waits ahead of it, and it fits: admitted at once. */
    if (!a->waiting && try_admit_locked(a, t) == 0) {
        pthread_mutex_unlock(&a->mu);
        return 0;
    }
    if (a->waiting >= a->max_waiting || a->clients[c].waiting >= a->max_per_client) {
        *retry_after_s = expected_wait_locked(a, bytes);
        a->st.refused_full++;
        int full = a->waiting >= a->max_waiting;
        pthread_mutex_unlock(&a->mu);
        return gemm_err_set(err, 503, "over_budget",
                            "this request needs %.1f MiB of the memory budget (max_inflight_mb) and %s; retry in %d s",
                            (double)bytes / (1 << 20),
                            full ? "the queue of requests waiting for memory is full"
                                 : "this client already has as many requests waiting for memory as it may",
                            *retry_after_s);
    }
    double now = gemm_now_ms() / 1000.0;
    t->t_enter = now;
    t->deadline = now + a->max_wait_s;
    client *cl = &a->clients[c];
    if (cl->tail) cl->tail->next = t;
    else cl->head = t;
    cl->tail = t;
    cl->waiting++;
    a->waiting++;
    atomic_store(&a->nwaiting, a->waiting);
    a->waiting_bytes += bytes;
    a->st.queued++;
    a->kicked = 1; /* it may fit already, behind others that do not */
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
    return 1;
}

int gemmd_admit_result(const gemmd_admit_ticket *t, gemm_err *err, int *retry_after_s)
{
    if (t->result == 0) return 0;
    *retry_after_s = t->result == -2 ? 1 : t->retry_after_s;
    if (t->result == -2) return gemm_err_set(err, 503, "shutting_down", "the server is shutting down; retry elsewhere");
    return gemm_err_set(err, 503, "over_budget",
                        "this request needs %.1f MiB of the memory budget (max_inflight_mb) and waited for it "
                        "in vain (admit_wait); retry in %d s",
                        (double)t->bytes / (1 << 20), t->retry_after_s);
}

int gemmd_admit_cancel(gemmd_admit *a, gemmd_admit_ticket *t)
{
    pthread_mutex_lock(&a->mu);
    int waiting = !atomic_load(&t->decided);
    if (waiting) {
        unlink_locked(a, t);
        a->st.cancelled++;
        a->kicked = 1; /* those behind it may fit now */
        pthread_cond_signal(&a->cv);
    }
    pthread_mutex_unlock(&a->mu);
    return waiting;
}

void gemmd_admit_done(gemmd_admit *a, const gemmd_admit_ticket *t, double held_s)
{
    pthread_mutex_lock(&a->mu);
    client *c = &a->clients[t->client];
    c->inflight -= t->bytes <= c->inflight ? t->bytes : c->inflight;
    a->hold_s = 0.8 * a->hold_s + 0.2 * (held_s > 0.001 ? held_s : 0.001);
    if (a->waiting) {
        a->kicked = 1;
        pthread_cond_signal(&a->cv);
    }
    pthread_mutex_unlock(&a->mu);
}

void gemmd_admit_kick(gemmd_admit *a)
{
    /* Called on every release of memory, from any thread, and from inside the queue's own
     * lock too: a reservation that lets the engine's cache go releases memory while the
     * queue holds its lock. So no lock here: a flag and a signal. A signal lost in the race
     * with the thread's wait is made up by its next tick (TICK_MS). */
    if (!a || atomic_load_explicit(&a->nwaiting, memory_order_relaxed) == 0) return;
    atomic_store(&a->kicked, 1);
    pthread_cond_signal(&a->cv);
}

void gemmd_admit_get_stats(gemmd_admit *a, gemmd_admit_stats *out)
{
    pthread_mutex_lock(&a->mu);
    *out = a->st;
    out->waiting = a->waiting;
    out->waiting_bytes = a->waiting_bytes;
    pthread_mutex_unlock(&a->mu);
}
