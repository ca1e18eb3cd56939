/*
 * jobs.h - the store of asynchronous jobs (POST /v1/jobs ... GET /v1/jobs/{id}/result).
 *
 * Entries are reference counted (the store's list, the engine, every reader): DELETE of a
 * running job only unlinks it and cancels it, and its done() frees it. Inputs and result
 * are reserved against job_mem_mb at submit; a sweeper thread forgets expired jobs. A job
 * reads done only once its done() has run under the store's lock, so a status that says
 * done always comes with a fetchable result. With tokens a job belongs to its token
 * (owner = gemmd_auth_identify() + 1; 0 without): another token's lookups find nothing.
 */
#ifndef GEMMD_JOBS_H
#define GEMMD_JOBS_H

#include <stddef.h>
#include <stdint.h>

#include "admit.h"
#include "engine.h"
#include "instance.h"

typedef struct gemmd_budget gemmd_budget;

#define GEMMD_JOB_ID_LEN GEMMD_ID_MAX /* instance.h */
#define GEMMD_JOB_SHORT_LEN 8 /* the prefix that log lines carry, never the whole id */
/* printf arguments for "%.*s": an id as log lines show it ("gemmd-a-8c1f02ab"). */
#define GEMMD_JOB_LOG_ID(id) gemmd_instance_id_log_len((id), GEMMD_JOB_SHORT_LEN), (id)
#define GEMMD_OWNER_ANY (-1)  /* lookups that ignore the owner (tests, internal) */

typedef struct gemmd_jobs gemmd_jobs;

typedef struct gemmd_job_entry {
    gemm_job job;         /* the engine job; job.user points back to the entry */
    char id[GEMMD_JOB_ID_LEN + 1];
    int family;           /* the request's format family (answer default), set by the caller */
    int owner;            /* who made it (see Owners above), set by the caller before submit */
    int client;           /* whose share it counts against (admit.h's client key) */
    double recv_ms;       /* set by the caller before submit */
    double decode_ms;
    double t_start_ms;    /* the request's arrival: the job's total counts from it */
    /* ---- private to jobs.c, under the store's lock ---- */
    gemmd_jobs *store;
    int refs;
    int linked;           /* in the store's list */
    int in_engine;        /* submitted, done() not called yet */
    int finished;         /* done() was called */
    gemm_job_state state; /* the final state, copied from the engine in done() */
    double t_created_ms, t_finished_ms;
    size_t reserved;      /* bytes reserved against mem_bytes (inputs until done, result) */
    size_t reserved_inputs; /* the inputs' part of it */
    struct gemmd_job_entry *next, *held_next; /* the list; shutdown's holds */
} gemmd_job_entry;

/* What a status answer shows; copied under the lock. */
typedef struct {
    char id[GEMMD_JOB_ID_LEN + 1];
    gemm_job_state state;
    int finished;
    gemm_err err;
    gemm_job_timing timing;
    double recv_ms, decode_ms;
    double total_ms;      /* created -> finished (or -> now while not finished) */
    double age_ms;        /* since created */
    double expires_in_s;  /* finished: seconds until the result is forgotten */
    gemm_dtype dtype;
    gemm_dtype c_dtype; /* C's (float32 for float16 / bfloat16 operands unless out_dtype) */
    uint64_t m, k, n;
    char kernel[GEMM_NAME_LEN];
    int tile;
    char block[32];
    gemm_math math;
    char device[GEMM_NAME_LEN];
} gemmd_job_view;

/* Job buffers are freed with alloc (the daemon's charged allocator; NULL: the engine's) and
 * a finished result's charge is moved to "results" in budget. share_pct: what one client
 * may keep of max_jobs and mem_bytes (token_share). */
gemmd_jobs *gemmd_jobs_new(gemm_engine *engine, const gemm_allocator *alloc, gemmd_budget *budget, int ttl_s,
                          uint64_t mem_bytes, int max_jobs, int share_pct);
/* Frees every entry and buffer, once the engine holds none of them (after shutdown). */
void gemmd_jobs_free(gemmd_jobs *s);

/* A fresh entry with a random id for client, its inputs' and result's bytes reserved;
 * NULL with 503 job_store_full, 413 too_large, 503 shutting_down, or 500. */
gemmd_job_entry *gemmd_jobs_reserve(gemmd_jobs *s, int client, size_t input_bytes, size_t result_bytes,
                                    gemm_err *err);
/* Queues it on the engine and lists it: 0, or -1 with *err (the entry is given back). One
 * reserved but not submitted goes back with gemmd_jobs_put (with its buffers). */
int gemmd_jobs_submit(gemmd_jobs *s, gemmd_job_entry *j, gemm_err *err);

/* The entry with that id made by owner, with a reference taken; NULL when unknown,
 * expired, or made by another owner (GEMMD_OWNER_ANY: whoever made it). */
gemmd_job_entry *gemmd_jobs_get_owned(gemmd_jobs *s, const char *id, int owner);
void gemmd_jobs_put(gemmd_jobs *s, gemmd_job_entry *j);
void gemmd_jobs_view(gemmd_jobs *s, gemmd_job_entry *j, gemmd_job_view *out);

/* Cancels it (queued), asks the engine to stop it (running) or forgets it (finished).
 * 0, or -1 when no such job of that owner is kept. */
int gemmd_jobs_delete_owned(gemmd_jobs *s, const char *id, int owner);

/* Forgets finished jobs older than the TTL (the sweeper and every lookup do it too). */
void gemmd_jobs_sweep(gemmd_jobs *s);
/* Refuses new jobs, cancels the queued ones and asks the engine to stop the running ones. */
void gemmd_jobs_shutdown(gemmd_jobs *s);
/* Retry-After for job_store_full: until the oldest finished job expires (or the TTL). */
int gemmd_jobs_retry_after_s(gemmd_jobs *s);
/* Test hook: called first in every job's done(), before the store sees its state. */
void gemmd_jobs_set_done_hook(gemmd_jobs *s, void (*hook)(gemmd_job_entry *j, void *arg), void *arg);

#endif
