/*
 * matrices.h - the store of resident matrices (/v1/matrices; docs/API.md): operands kept
 * between requests, named by id in later products. Bytes count against resident_mb from
 * their reservation until the last reference goes (DELETE only unlinks); nothing is
 * evicted behind a client's back: a full store answers 507. Owners work as for jobs.
 * Thread-safe; one mutex, never held while calling the engine.
 */
#ifndef GEMMD_MATRICES_H
#define GEMMD_MATRICES_H

#include <stddef.h>
#include <stdint.h>

#include "admit.h"
#include "engine.h"
#include "jobs.h"
#include "json_codec.h"

typedef struct gemmd_matrices gemmd_matrices;

typedef struct gemmd_matrix_entry {
    char id[GEMMD_JOB_ID_LEN + 1];
    gemm_matrix m;        /* data from the engine's allocator, read-only once added */
    gemm_resident *res;   /* the engine's handle: device copies on the CUDA backend */
    size_t bytes;
    int owner;
    int client;           /* whose share it counts against (admit.h's client key) */
    int family;           /* the format it arrived in: the default of GET */
    /* ---- private to matrices.c, under the store's lock ---- */
    gemmd_matrices *store;
    int refs;
    double t_created_ms, t_used_ms;
    uint64_t uses;        /* products that read it */
    unsigned char *row_state; /* a matrix filled in parts: per row 0 free, 1 being written,
                                 2 written; NULL once every row is (or when it came whole) */
    uint64_t rows_filled;
    struct gemmd_matrix_entry *next;
} gemmd_matrix_entry;

/* The matrices' bytes are charged in mem (kind resident, or NULL) from when the caller
 * adopted them (gemmd_budget_adopt) until they are freed. budget_bytes: resident_mb;
 * max_count: matrices kept at once; share_pct: what one client may keep of both
 * (token_share); fill_ttl_s: how long an empty=1 matrix may take to be filled before it
 * is forgotten (job_ttl). */
gemmd_matrices *gemmd_matrices_new(gemm_engine *engine, gemmd_budget *mem, uint64_t budget_bytes, int max_count,
                                   int share_pct, int fill_ttl_s);
/* Frees every matrix; no reference may be held any more. */
void gemmd_matrices_free(gemmd_matrices *s);

/* Sets aside bytes for a matrix client is about to add: 0, or -1 with 507
 * insufficient_storage (no room, max_matrices, the client's share) or 413 too_large. */
int gemmd_matrices_reserve(gemmd_matrices *s, int client, size_t bytes, gemm_err *err);
void gemmd_matrices_unreserve(gemmd_matrices *s, int client, size_t bytes);
/* Adds m (data taken over; res too, when not NULL) with a fresh id, in bytes reserved
 * before, and returns it with a reference for the caller. empty: filled later by PUTs of
 * rows, unreadable until the last one. On failure (NULL, *err) nothing is taken and the
 * reservation stays with the caller. */
gemmd_matrix_entry *gemmd_matrices_add(gemmd_matrices *s, gemm_matrix *m, gemm_resident **res, int owner, int client,
                                       int family, int empty, gemm_err *err);

/* Claims rows [row0, row0 + rows) of e for one PUT: 0, or -1 with 409 matrix_complete,
 * 422 bad_rows or 409 rows_taken. */
int gemmd_matrices_claim_rows(gemmd_matrices *s, gemmd_matrix_entry *e, uint64_t row0, uint64_t rows, gemm_err *err);
/* Ends a claim (written: the rows are filled, else free again); returns the rows filled. */
uint64_t gemmd_matrices_release_rows(gemmd_matrices *s, gemmd_matrix_entry *e, uint64_t row0, uint64_t rows,
                                     int written);
/* 1 when every row of e is there (always, for a matrix that came whole). */
int gemmd_matrices_ready(gemmd_matrices *s, const gemmd_matrix_entry *e);

/* The matrix with that id made by owner (GEMMD_OWNER_ANY: anyone's), with a reference
 * taken and its last use set to now; NULL when unknown, deleted or another owner's. */
gemmd_matrix_entry *gemmd_matrices_get(gemmd_matrices *s, const char *id, int owner);
void gemmd_matrices_put(gemmd_matrices *s, gemmd_matrix_entry *e);
void gemmd_matrix_release(void *entry); /* gemmd_matrices_put, as an answer's release() */
/* Counts a product that read it. */
void gemmd_matrices_note_use(gemmd_matrices *s, gemmd_matrix_entry *e);
/* Unlinks it (freed when the last reference goes). 0, or -1 when owner has no such one. */
int gemmd_matrices_delete(gemmd_matrices *s, const char *id, int owner);

/* Appends {"matrices":[...], "count":N, "bytes":B, "budget_bytes":X} for owner's matrices,
 * most recently used first. */
void gemmd_matrices_list_json(gemmd_matrices *s, int owner, gemm_buf *out);
/* Appends one matrix's description: {"id","shape","dtype","bytes","where",...}. */
void gemmd_matrices_describe_json(gemmd_matrices *s, const gemmd_matrix_entry *e, gemm_buf *out);

#endif
