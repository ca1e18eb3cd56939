/*
 * sync.h - a request that waits for the engine: the suspend/resume handshake of a
 * synchronous product, the requests' reference counts, and shutdown's view of what waits.
 *
 * The product is listed before it is submitted (shutdown finds it); the connection is
 * suspended only if done() has not run yet, and done() resumes only a suspended one: the
 * resume never comes before the suspend. All under the request's stripe lock.
 *
 *   gemmd_sync_begin(req, job); gemm_engine_submit[_here](...) (else gemmd_sync_refused)
 *   switch (gemmd_sync_wait(req))  DONE: answer now; SUSPENDED: resumed later by done();
 *                                  ABANDONED: shutdown gave up, answer 503
 *
 * Lock order: a stripe's lock is never held while calling the engine, nor with another
 * stripe's (gemmd_sync_stop takes all in index order); the offload queue's lock may be
 * taken under it, never the other way.
 */
#ifndef GEMMD_SYNC_H
#define GEMMD_SYNC_H

#include <stdatomic.h>
#include <stdint.h>

#include "engine.h"

typedef struct gemmd_request gemmd_request;
typedef struct gemmd_sync gemmd_sync;

/* stopping: set by gemmd_sync_stop; direct (direct_run): a product of m*n*k (times its
 * batch) up to small_mnk may run on its HTTP thread while at most few others wait. */
gemmd_sync *gemmd_sync_new(gemm_engine *engine, _Atomic int *stopping, int direct, uint64_t small_mnk, int few);
void gemmd_sync_free(gemmd_sync *s);

/* Shutdown: stop sets *stopping under every stripe's lock (a product not refused by
 * gemmd_sync_begin is listed from then on); cancel_pending cancels the queued products
 * (and the running ones with running_too: they stop at their next stage boundary);
 * abandon_pending resumes every suspended connection to answer 503 (the engine keeps its
 * reference until done()). Both return how many. */
void gemmd_sync_stop(gemmd_sync *s);
int gemmd_sync_cancel_pending(gemmd_sync *s, int running_too);
int gemmd_sync_abandon_pending(gemmd_sync *s);

/* ---- a request's side --------------------------------------------------------------- */
enum { GEMMD_SYNC_SUSPENDED = 0, GEMMD_SYNC_DONE = 1, GEMMD_SYNC_ABANDONED = 2 };

/* Lists req's job as pending and takes the engine's reference, before submit: 0, or -1
 * when shutdown has begun (nothing taken; answer 503). */
int gemmd_sync_begin(gemmd_request *req, gemm_job *job);
/* The engine refused the product: done() will not come; undoes gemmd_sync_begin. */
void gemmd_sync_refused(gemmd_request *req);
/* Whether req's product should run on this HTTP thread (gemm_engine_submit_here): on the
 * host (host_max_mnk), or small with direct_run while few others are in flight. */
int gemmd_sync_direct(const gemmd_request *req);
/* After a submit (see above); status: what a resumed connection finds. */
int gemmd_sync_wait(gemmd_request *req);
int gemmd_sync_status(gemmd_request *req);
/* done() of a synchronous product: unlists req; when offload is given and shutdown has
 * not abandoned req, offload(req) is tried under the lock (0: it took the answer over and
 * will call gemmd_sync_resume(req, 1)); else gemmd_sync_resume(req, 1). */
void gemmd_sync_done(gemmd_request *req, int (*offload)(gemmd_request *req));
/* An answer prepared off the HTTP threads is ready: marks it done, resumes the suspended
 * connection, and with engine_ref drops the engine's reference (handed over by done()). */
void gemmd_sync_resume(gemmd_request *req, int engine_ref);
/* Suspends req's connection while start(req) runs elsewhere (under the lock, so its end,
 * gemmd_sync_resume, cannot come first): 0 when start returned 0 (suspended), else -1
 * and nothing was suspended. */
int gemmd_sync_suspend_for(gemmd_request *req, int (*start)(gemmd_request *req));
/* A request that waits for something other than the engine (admission): a hold keeps it
 * alive for whoever will unpark it; park suspends its connection unless ready(req) says
 * the wait is over already (then 1: go on now; 0: parked until gemmd_sync_unpark). */
void gemmd_request_hold(gemmd_request *req);
int gemmd_sync_park(gemmd_request *req, int (*ready)(gemmd_request *req));
void gemmd_sync_unpark(gemmd_request *req);
/* Drops a hold (or the connection's reference) on req, freeing it when it was the last. */
void gemmd_request_release(gemmd_request *req);

#endif
