/*
 * offload.h - a few threads for work too long for an HTTP thread: encoding a big JSON
 * answer takes a core for hundreds of milliseconds, and an HTTP thread busy with it
 * delays every other connection it serves (health probes included). The caller suspends
 * the request's connection before queueing and fn resumes it (the same handshake as a
 * product on the engine). Thread-safe.
 */
#ifndef GEMMD_OFFLOAD_H
#define GEMMD_OFFLOAD_H

typedef struct gemmd_offload gemmd_offload;

gemmd_offload *gemmd_offload_new(int threads); /* threads >= 1 */
/* Queues fn(arg): 0, or -1 when the pool is stopping or out of memory (not queued). */
int gemmd_offload_run(gemmd_offload *o, void (*fn)(void *), void *arg);
/* Stops taking work (gemmd_offload_run() returns -1 from now on: the caller does the work
 * itself), runs everything queued, joins the threads. o stays valid. */
void gemmd_offload_drain(gemmd_offload *o);
/* Drains (if not done yet) and frees. */
void gemmd_offload_free(gemmd_offload *o);

#endif
