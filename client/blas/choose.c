/*
 * choose.c - which side finishes a product first, learned from the products each side ran
 * (docs/BLAS.md, "Which side runs a product", says why and how). Per dtype, three costs in
 * ms: the host's per flop (h), the server's per byte sent and received (w: the link, HTTP and
 * the server's stages other than the kernel) and per flop of its kernel (g), each the running
 * mean (weight 1/2) of what the products showed.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getaffinity */
#endif
#include "blas_internal.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

/* A host at its best, per core (ms per flop): 100 and 50 GFLOP/s per core, about the peak
 * of a core with two AVX-512 FMA units. Only decides whether the host is worth trying. */
#define GB_HOST_BEST_MS_PER_FLOP_CORE_F32 1e-8
#define GB_HOST_BEST_MS_PER_FLOP_CORE_F64 2e-8
#define GB_RECHECK_EVERY 32 /* decisions between re-measuring a close loser */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
typedef struct {
    double h, w, g; /* 0: not measured yet */
    int since;      /* decisions since the last re-measure */
} costs;
static costs cost[2];

static int cores(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static double mean(double old, double x)
{
    return old > 0 ? (old + x) / 2 : x;
}

gb_choice gb_choose(gb_type t, double flops, double bytes)
{
    gb_choice ch = {.server = 1};
    pthread_mutex_lock(&mu);
    costs *c = &cost[t];
    ch.host_ms = flops * c->h;
    ch.server_ms = bytes * c->w + flops * c->g;
    if (c->w == 0) {
        ch.why = "the server's speed is not known yet";
    } else if (c->h == 0) {
        double best = flops * (t == GB_F32 ? GB_HOST_BEST_MS_PER_FLOP_CORE_F32 : GB_HOST_BEST_MS_PER_FLOP_CORE_F64) /
                      cores();
        ch.server = best >= 2 * ch.server_ms;
        ch.why = ch.server ? "the host would be slower even at its best" : "the host's speed is not known yet";
    } else {
        ch.server = ch.server_ms < ch.host_ms;
        double win = ch.server ? ch.server_ms : ch.host_ms, lose = ch.server ? ch.host_ms : ch.server_ms;
        ch.why = ch.server ? "predicted faster on the server" : "predicted faster on the host";
        if (++c->since >= GB_RECHECK_EVERY && lose < 1.5 * win) { /* it may have become faster */
            ch.server = !ch.server;
            ch.why = "re-measuring the side predicted slower";
            c->since = 0;
        }
    }
    pthread_mutex_unlock(&mu);
    return ch;
}

void gb_learn_host(gb_type t, double flops, double ms)
{
    if (flops <= 0 || ms <= 0) return;
    pthread_mutex_lock(&mu);
    cost[t].h = mean(cost[t].h, ms / flops);
    pthread_mutex_unlock(&mu);
}

void gb_learn_server(gb_type t, double flops, double bytes, double ms, double kernel_ms)
{
    if (flops <= 0 || bytes <= 0 || ms <= 0) return;
    if (kernel_ms < 0 || kernel_ms > ms) kernel_ms = 0; /* not reported */
    pthread_mutex_lock(&mu);
    cost[t].w = mean(cost[t].w, (ms - kernel_ms) / bytes);
    cost[t].g = mean(cost[t].g, kernel_ms / flops);
    pthread_mutex_unlock(&mu);
}
