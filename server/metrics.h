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

/* Appends the whole exposition: gemmd_requests_total{route,code}, gemmd_request_duration_seconds
 * histogram, gemmd_bytes_received_total, gemmd_bytes_sent_total, gemmd_queue_depth,
 * gemmd_jobs_running, gemmd_jobs{state},
 * gemmd_resident_matrices, gemmd_resident_bytes{where}, gemmd_resident_budget_bytes, gemmd_engine_jobs_total{result},
 * gemmd_compute_seconds_total, per device gemmd_device_busy_seconds_total{device},
 * gemmd_device_bytes_copied_total{device,direction}, gemmd_device_memory_used_bytes{device},
 * gemmd_device_info{device,name}, gemmd_build_info{version,backend}. */
void gemmd_metrics_render(gemm_buf *out, gemm_engine *engine);

/* Appends the memory budget: gemmd_memory_budget_bytes, gemmd_memory_inflight_bytes,
 * gemmd_memory_inflight_peak_bytes, gemmd_memory_held_bytes{holder} (bodies, inputs,
 * results, answers), gemmd_memory_refused_total. */
void gemmd_metrics_render_memory(gemm_buf *out, const gemmd_budget_stats *st);
/* Appends the connections: gemmd_connections_open, gemmd_connections_admitted,
 * gemmd_connections_accepted_total, gemmd_connections_refused_total{limit},
 * gemmd_connections_evicted_total, gemmd_connections_closed_total{deadline}. */
void gemmd_metrics_render_connections(gemm_buf *out, const gemmd_conns_stats *st);

/* Appends the admission queue: gemmd_admission_waiting, gemmd_admission_waiting_bytes,
 * gemmd_admission_total{result}. */
void gemmd_metrics_render_admission(gemm_buf *out, const gemmd_admit_stats *st);

/* Appends a metric's # HELP and # TYPE lines. */
void gemmd_metrics_header(gemm_buf *out, const char *name, const char *type, const char *help);
/* Appends v escaped as a label value (backslash, double quote, newline). */
void gemmd_metrics_label_value(gemm_buf *out, const char *v);
#endif
