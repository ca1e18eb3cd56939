/*
 * test_gate.h - a gate a fake backend's run() can hold jobs at, for the engine's unit
 * tests: close it, let run() pass through it (blocking while closed, counting who waits),
 * wait until n runs are held, open it.
 */
#ifndef GEMMD_TEST_GATE_H
#define GEMMD_TEST_GATE_H

#include <pthread.h>

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open, held;
} test_gate;

#define TEST_GATE_OPEN {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 1, 0}

static inline void test_gate_close(test_gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->open = 0;
    g->held = 0;
    pthread_mutex_unlock(&g->mu);
}

static inline void test_gate_open(test_gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->open = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* In run(): counts itself held and waits while the gate is closed. */
static inline void test_gate_pass(test_gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->held++;
    pthread_cond_broadcast(&g->cv);
    while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

/* Until n runs have reached the gate since it was closed. */
static inline void test_gate_wait_held(test_gate *g, int n)
{
    pthread_mutex_lock(&g->mu);
    while (g->held < n) pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

#endif
