/*
 * test_job.h - a job for the engine's unit tests: its own buffers (the plain host
 * allocator, the CPU engine's, so they outlive an engine that was closed), inputs filled
 * and C poisoned by gemm_ref.h, and a done() that counts its calls, notes the thread and
 * the state it came with, wakes the waiter and, when a gate is set, blocks until the gate
 * is opened (to hold a worker).
 */
#ifndef GEMMD_TEST_JOB_H
#define GEMMD_TEST_JOB_H

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "engine.h"
#include "gemm_ref.h"

typedef struct {
    gemm_job job;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int calls;
    int state_at_done;
    pthread_t done_thread;
    int *gate_open; /* when set, done() blocks until *gate_open */
    pthread_mutex_t *gate_mu;
    pthread_cond_t *gate_cv;
} test_job;

static void test_job_done(gemm_job *job)
{
    test_job *t = job->user;
    pthread_mutex_lock(&t->mu);
    /* Once the lock is released the waiter may free t: what the gate needs is read now. */
    int *gate = t->gate_open;
    pthread_mutex_t *gmu = t->gate_mu;
    pthread_cond_t *gcv = t->gate_cv;
    t->calls++;
    t->state_at_done = atomic_load(&job->state);
    t->done_thread = pthread_self();
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    if (gate) {
        pthread_mutex_lock(gmu);
        while (!*gate) pthread_cond_wait(gcv, gmu);
        pthread_mutex_unlock(gmu);
    }
}

static inline void test_job_init(test_job *t, gemm_dtype d, size_t m, size_t k, size_t n, uint64_t seed)
{
    memset(t, 0, sizeof *t);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    size_t es = gemm_dtype_size(d);
    t->job.dtype = d;
    t->job.m = m, t->job.k = k, t->job.n = n;
    t->job.a = gemm_alloc(&gemm_allocator_host, m * k * es);
    t->job.b = gemm_alloc(&gemm_allocator_host, k * n * es);
    t->job.c = gemm_alloc(&gemm_allocator_host, m * n * gemm_dtype_size(ref_c_dtype(d))); /* half: float32 C */
    assert_true(t->job.a && t->job.b && t->job.c);
    ref_fill(d, t->job.a, m * k, seed);
    ref_fill(d, t->job.b, k * n, seed + 1);
    ref_poison(ref_c_dtype(d), t->job.c, m * n);
    t->job.done = test_job_done;
    t->job.user = t;
}

static inline void test_job_free(test_job *t)
{
    gemm_free(&gemm_allocator_host, t->job.a);
    gemm_free(&gemm_allocator_host, t->job.b);
    gemm_free(&gemm_allocator_host, t->job.c);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
}

static inline int test_job_calls(test_job *t)
{
    pthread_mutex_lock(&t->mu);
    int c = t->calls;
    pthread_mutex_unlock(&t->mu);
    return c;
}

/* Until done() has been called `calls` times in all. */
static inline void test_job_wait_for(test_job *t, int calls)
{
    pthread_mutex_lock(&t->mu);
    while (t->calls < calls) pthread_cond_wait(&t->cv, &t->mu);
    pthread_mutex_unlock(&t->mu);
}

static inline void test_job_wait(test_job *t) { test_job_wait_for(t, 1); }

/* Elements of C that differ from the reference (0: right). */
static inline size_t test_job_check(test_job *t, const char *what)
{
    gemm_job *j = &t->job;
    return ref_check(j->dtype, j->a, j->b, j->c, j->m, j->k, j->n, what);
}

#endif
