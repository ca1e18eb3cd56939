/*
 * fleet.h - the load figures a balancer or autoscaler reads from /metrics (docs/OPERATIONS.md,
 * "Metrics for balancers and autoscalers", says how the busy fraction is sampled).
 */
#ifndef GEMMD_FLEET_H
#define GEMMD_FLEET_H

#include <pthread.h>

#include "engine.h"
#include "json_codec.h" /* gemm_buf */

#define GEMMD_UTIL_WINDOW_S 60
#define GEMMD_UTIL_SAMPLES 64

typedef struct {
    double t_ms;
    double busy_s[GEMM_MAX_DEVICES];
} gemmd_util_sample;

typedef struct {
    gemmd_util_sample ring[GEMMD_UTIL_SAMPLES];
    int count, newest; /* samples held; index of the newest */
} gemmd_util;

/* Starts the history at t0_ms with every device idle so far (busy 0). */
void gemmd_util_init(gemmd_util *u, double t0_ms);
/* Records the busy seconds of nd (<= GEMM_MAX_DEVICES) devices at now_ms; writes each
 * one's busy fraction (0..1) over the window into frac[nd]. Not thread-safe (caller locks). */
void gemmd_util_update(gemmd_util *u, double now_ms, int nd, const double *busy_s, double *frac);

/* Marks the start of this process's engine (the window's first baseline). */
void gemmd_fleet_start(double now_ms);
/* Seconds since gemmd_fleet_start (0 before it). */
double gemmd_fleet_uptime_s(void);
/* Each device's busy fraction over the window into frac[GEMM_MAX_DEVICES], from st (the
 * engine's stats now), recording a sample; returns the number of devices. Thread-safe. */
int gemmd_fleet_utilization(const gemm_engine_stats *st, double *frac);

/* Appends gemmd_instance_info{instance_id}, gemmd_requests_in_flight,
 * gemmd_queue_capacity, gemmd_workers and gemmd_device_utilization{device}.
 * in_flight: requests being read, computed or answered, the scrape itself left out. */
void gemmd_fleet_render(gemm_buf *out, gemm_engine *engine, int in_flight);

#endif
