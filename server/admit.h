/*
 * admit.h - admission (docs/OPERATIONS.md, "Memory budget", has the queue's rules): before
 * a byte of its body is read, a request reserves the memory it will hold, or waits for it
 * in a queue, its connection parked.
 *
 *   switch (gemmd_admit_enter(a, &t, client_key, bytes, wake, req, &err, &retry_after)) {
 *   case 0:  admitted: bytes are reserved (release them when done)
 *   case 1:  waiting: park; wake(req) comes from the queue's thread once decided
 *   case -1: refused now (queue full, or more than the budget can ever hold)
 *   }
 *
 * gemmd_admit_kick() is called whenever memory is given back. Thread-safe.
 */
#ifndef GEMMD_ADMIT_H
#define GEMMD_ADMIT_H

#include <stdatomic.h>
#include <stdint.h>

#include "budget.h"
#include "gemm_types.h"

typedef struct gemmd_admit gemmd_admit;

#define GEMMD_CLIENTS 256 /* client keys: tokens, or addresses hashed into as many groups */

typedef struct gemmd_admit_ticket {
    /* ---- private to admit.c ---- */
    struct gemmd_admit_ticket *next;
    int client;                /* index of the client's slot */
    uint64_t bytes;
    double t_enter, deadline;
    void (*wake)(void *arg);
    void *arg;
    int result;                /* 0 admitted, -1 refused (after decided) */
    int retry_after_s;
    _Atomic int decided;
} gemmd_admit_ticket;

typedef struct {
    uint64_t admitted, queued, refused_full, refused_wait, cancelled;
    int waiting;               /* now */
    uint64_t waiting_bytes;    /* now */
} gemmd_admit_stats;

/* max_waiting: requests that may wait at once (>= 1); max_wait_s: how long one may;
 * share_pct: what one client's requests may hold together (1..100). */
gemmd_admit *gemmd_admit_new(gemmd_budget *b, int max_waiting, double max_wait_s, int share_pct);
/* close: refuses what waits (wake is called for each) and every request from now on, and
 * stops the thread; tickets can still be asked about. free closes it if need be. */
void gemmd_admit_close(gemmd_admit *a);
void gemmd_admit_free(gemmd_admit *a);

/* See above. client_key: who asks (taken modulo GEMMD_CLIENTS). On -1, *err is 503
 * over_budget (or 413 too_large when bytes can never fit) and *retry_after_s set. */
int gemmd_admit_enter(gemmd_admit *a, gemmd_admit_ticket *t, int client_key, uint64_t bytes,
                      void (*wake)(void *arg), void *arg, gemm_err *err, int *retry_after_s);
/* Whether a waiting ticket has been decided (then wake has been or is being called). */
static inline int gemmd_admit_decided(gemmd_admit_ticket *t) { return atomic_load(&t->decided) != 0; }
/* A decided ticket: 0 admitted (its bytes are reserved), or -1 with *err (503
 * over_budget, or shutting_down once the queue was closed) and *retry_after_s. */
int gemmd_admit_result(const gemmd_admit_ticket *t, gemm_err *err, int *retry_after_s);
/* The client went away: 1 when t was still waiting (wake will not be called), 0 when it
 * was decided already (wake comes; an admitted ticket's bytes must be released). */
int gemmd_admit_cancel(gemmd_admit *a, gemmd_admit_ticket *t);
/* t's admitted reservation ended after held_s seconds (released by its holder): its
 * client holds that much less, and how long reservations last goes into the expected wait. */
void gemmd_admit_done(gemmd_admit *a, const gemmd_admit_ticket *t, double held_s);
void gemmd_admit_kick(gemmd_admit *a); /* memory was given back */

void gemmd_admit_get_stats(gemmd_admit *a, gemmd_admit_stats *out);

#endif
