/*
 * usage.h - who uses the daemon and how: per token, the requests (by status), products,
 * compute seconds and bytes since start (/metrics: gemmd_token_*) and over the last five
 * minutes in 10 s steps; the latest products' times; the last errors (GET /v1/status).
 *
 * who is a request's owner: 0 without a known token ("anonymous"), i for the i-th token
 * of tokens_file, shown by its name (auth.h). The first GEMMD_USAGE_TOKENS tokens have
 * counters of their own; the rest share "other", so /metrics' label set stays bounded.
 * Thread-safe.
 */
#ifndef GEMMD_USAGE_H
#define GEMMD_USAGE_H

#include <stdint.h>

#include "auth.h"
#include "engine.h"
#include "json_codec.h" /* gemm_buf */

#define GEMMD_USAGE_TOKENS 64
#define GEMMD_USAGE_STEP_S 10
#define GEMMD_USAGE_STEPS 30 /* the window: 5 minutes */
#define GEMMD_USAGE_ERRORS 20

/* A request answered (status 0: none was), with its body bytes in and out. */
void gemmd_usage_request(int who, int status, uint64_t bytes_in, uint64_t bytes_out);
/* A product left the engine (done, failed or cancelled: its compute time counts). */
void gemmd_usage_product(int who, const gemm_job *job);
/* An error answer: its route label (routes.h), status and code. */
void gemmd_usage_error(int who, const char *route, int status, const char *code);

/* Appends the gemmd_token_* metrics of every token used since start. */
void gemmd_usage_render(gemm_buf *out, const gemmd_auth *auth);
/* Appends /v1/status's members "tokens", "errors", "rates" and "latency" (no comma before
 * or after). Returns how long a new product would wait, in seconds: with products queued,
 * the time the queue takes to drain at the last minute's rate; else the median queue time
 * of the last minute's products; -1 when products are queued and none finished lately.
 * Rates are over the last minute, or the uptime when shorter. */
double gemmd_usage_json(gemm_buf *out, const gemmd_auth *auth, int queued, double uptime_s);

#endif
