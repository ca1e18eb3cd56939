/*
 * metrics.h - counters for /metrics (Prometheus text format 0.0.4). Thread-safe.
 */
#ifndef GEMMD_METRICS_H
#define GEMMD_METRICS_H

#include <stdint.h>

#include "admit.h"
#include "budget.h"
#include "conns.h"
#include "engine.h"
#include "json_codec.h" /* gemm_buf */
#include "usage.h"      /* the same requests by token, and over the last minutes */

/* Route labels the request counters keep (the route table's, routes.h), the last one
 * for requests that matched no route. */
#define GEMMD_METRIC_ROUTES 32
void gemmd_metrics_init(const char *const *labels, int n);
/* One finished request: its route's label index (gemmd_route_slot), who sent it (its
 * owner, usage.h), status and duration (seconds, request start to response queued), and
 * the body bytes received and sent. */
void gemmd_metrics_request(int route, int who, int status, double seconds, uint64_t bytes_in, uint64_t bytes_out);
/* Async jobs kept, by state (set by the job store whenever it changes). */
void gemmd_metrics_jobs_by_state(const int counts[5]);

/* Resident matrices kept and the bytes they hold (set by the matrix store). */
void gemmd_metrics_resident(int count, uint64_t host_bytes, uint64_t budget_bytes);

/* Append the exposition (docs/OPERATIONS.md lists it): the requests, the engine's and the
 * stores' figures, and the memory budget, the connections and the admission queue. */
void gemmd_metrics_render(gemm_buf *out, gemm_engine *engine);
void gemmd_metrics_render_limits(gemm_buf *out, const gemmd_budget_stats *st, const gemmd_conns_stats *cs,
                                 const gemmd_admit_stats *as);

/* Appends a metric's # HELP and # TYPE lines. */
void gemmd_metrics_header(gemm_buf *out, const char *name, const char *type, const char *help);
/* ...and then its one sample, "name v". */
void gemmd_metrics_single(gemm_buf *out, const char *name, const char *type, const char *help, uint64_t v);
/* Appends v escaped as a label value (backslash, double quote, newline). */
void gemmd_metrics_label_value(gemm_buf *out, const char *v);
#endif
