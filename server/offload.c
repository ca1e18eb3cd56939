/*
 * offload.c - a small FIFO of tasks and the threads that run them (see offload.h).
 */
#include "offload.h"

#include <sys/prctl.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Offloaded work yields the CPU to the HTTP threads: health probes and small requests
 * must not queue behind a big encoding on a busy host. */
#define OFFLOAD_NICE 5

typedef struct task {
    void (*fn)(void *);
    void *arg;
    struct task *next;
} task;

struct gemmd_offload {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    task *head, *tail;
    int stopping, nthreads;
    pthread_t *threads;
};

static void *worker(void *arg)
{
    prctl(PR_SET_NAME, "gemmd-encoder", 0, 0, 0); /* shows in top -H, ps -L, /proc */
    gemmd_offload *o = arg;
    (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), OFFLOAD_NICE); /* this thread only */
    pthread_mutex_lock(&o->mu);
    for (;;) {
        while (!o->head && !o->stopping) pthread_cond_wait(&o->cv, &o->mu);
        task *t = o->head;
        if (!t) break; /* stopping and drained */
        o->head = t->next;
        if (!o->head) o->tail = NULL;
        pthread_mutex_unlock(&o->mu);
        t->fn(t->arg);
        free(t);
        pthread_mutex_lock(&o->mu);
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

gemmd_offload *gemmd_offload_new(int threads)
{
    gemmd_offload *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
    o->threads = calloc((size_t)threads, sizeof *o->threads);
    for (int i = 0; o->threads && i < threads; i++) {
        if (pthread_create(&o->threads[i], NULL, worker, o) != 0) break;
        o->nthreads++;
    }
    if (o->nthreads == 0) { /* out of memory, or no thread started */
        gemmd_offload_free(o);
        return NULL;
    }
    return o;
}

int gemmd_offload_run(gemmd_offload *o, void (*fn)(void *), void *arg)
{
    task *t = malloc(sizeof *t);
    if (!t) return -1;
    *t = (task){fn, arg, NULL};
    pthread_mutex_lock(&o->mu);
    if (o->stopping) {
        pthread_mutex_unlock(&o->mu);
        free(t);
        return -1;
    }
    if (o->tail) o->tail->next = t;
    else o->head = t;
    o->tail = t;
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
    return 0;
}

void gemmd_offload_drain(gemmd_offload *o)
{
    pthread_mutex_lock(&o->mu);
    o->stopping = 1;
    pthread_cond_broadcast(&o->cv);
    int n = o->nthreads;
    o->nthreads = 0;
    pthread_mutex_unlock(&o->mu);
    for (int i = 0; i < n; i++) pthread_join(o->threads[i], NULL);
}

void gemmd_offload_free(gemmd_offload *o)
{
    if (!o) return;
    gemmd_offload_drain(o);
    pthread_cond_destroy(&o->cv);
    pthread_mutex_destroy(&o->mu);
    free(o->threads);
    free(o);
}
