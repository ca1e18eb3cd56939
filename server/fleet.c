/*
 * fleet.c - load gauges for balancers and autoscalers (see fleet.h).
 */
#include "fleet.h"

#include <string.h>

#include "instance.h"
#include "metrics.h" /* gemmd_metrics_label_value */

/* ---- busy fraction over a window ------------------------------------------------- */

void gemmd_util_init(gemmd_util *u, double t0_ms)
{
    memset(u, 0, sizeof *u);
    u->ring[0].t_ms = t0_ms;
    u->count = 1;
}

static const gemmd_util_sample *at(const gemmd_util *u, int age) /* 0: newest */
{
    int i = (u->newest - age) % GEMMD_UTIL_SAMPLES;
    return &u->ring[i < 0 ? i + GEMMD_UTIL_SAMPLES : i];
}

void gemmd_util_update(gemmd_util *u, double now_ms, int nd, const double *busy_s, double *frac)
{
    /* The baseline: the newest sample at least a window old, else the oldest held. */
    const gemmd_util_sample *base = at(u, u->count - 1);
    for (int age = 0; age < u->count; age++) {
        const gemmd_util_sample *s = at(u, age);
        if (now_ms - s->t_ms >= GEMMD_UTIL_WINDOW_S * 1000.0) {
            base = s;
            break;
        }
    }
    double span_s = (now_ms - base->t_ms) / 1000.0;
    for (int d = 0; d < nd; d++) {
        double f = span_s > 0.001 ? (busy_s[d] - base->busy_s[d]) / span_s : 0.0;
        /* Counters reset (a device rebuilt) or summed over several CPU workers: 0..1. */
        frac[d] = f < 0 ? 0 : f > 1 ? 1 : f;
    }
    if (now_ms - at(u, 0)->t_ms >= 1000.0) {
        u->newest = (u->newest + 1) % GEMMD_UTIL_SAMPLES;
        if (u->count < GEMMD_UTIL_SAMPLES) u->count++;
        gemmd_util_sample *s = &u->ring[u->newest];
        memset(s, 0, sizeof *s);
        s->t_ms = now_ms;
        for (int d = 0; d < nd; d++) s->busy_s[d] = busy_s[d];
    }
}

/* ---- the process's history and the gauges ------------------------------------------ */

static pthread_mutex_t util_mu = PTHREAD_MUTEX_INITIALIZER;
static gemmd_util util;
static double started_ms;

void gemmd_fleet_start(double now_ms)
{
    pthread_mutex_lock(&util_mu);
    gemmd_util_init(&util, now_ms);
    started_ms = now_ms;
    pthread_mutex_unlock(&util_mu);
}

double gemmd_fleet_uptime_s(void) { return started_ms > 0 ? (gemm_now_ms() - started_ms) / 1000.0 : 0; }

int gemmd_fleet_utilization(const gemm_engine_stats *st, double *frac)
{
    int nd = st->ndevices < 0 ? 0 : st->ndevices > GEMM_MAX_DEVICES ? GEMM_MAX_DEVICES : st->ndevices;
    double now = gemm_now_ms();
    pthread_mutex_lock(&util_mu); /* the history began at gemmd_fleet_start (main.c, before any request) */
    gemmd_util_update(&util, now, nd, st->device_busy_seconds, frac);
    pthread_mutex_unlock(&util_mu);
    return nd;
}

void gemmd_fleet_render(gemm_buf *out, gemm_engine *engine, int in_flight)
{
    gemm_engine_stats st = {0};
    gemm_engine_info info = {0};
    gemm_engine_get_stats(engine, &st);
    gemm_engine_describe(engine, &info);
    double frac[GEMM_MAX_DEVICES] = {0};
    int nd = gemmd_fleet_utilization(&st, frac);

    gemmd_metrics_header(out, "gemmd_instance_info", "gauge",
                         "The instance_id that this daemon's job ids carry (always 1).");
    gemm_buf_puts(out, "gemmd_instance_info{instance_id=\"");
    gemmd_metrics_label_value(out, gemmd_instance_get());
    gemm_buf_puts(out, "\"} 1\n");
    gemmd_metrics_single(out, "gemmd_requests_in_flight", "gauge",
                         "HTTP requests being read, computed or answered (this scrape left out).",
                         in_flight < 0 ? 0 : in_flight);
    gemmd_metrics_single(out, "gemmd_queue_capacity", "gauge",
                         "Products that may wait for a worker (queue_depth).", info.queue_capacity);
    gemmd_metrics_single(out, "gemmd_workers", "gauge", "Engine workers: products computed at once.", info.workers);
    gemmd_metrics_header(out, "gemmd_device_utilization", "gauge",
           "Fraction of the last 60 s each device spent running products (0 to 1).");
    for (int d = 0; d < nd; d++)
        gemm_buf_printf(out, "gemmd_device_utilization{device=\"%d\"} %.4f\n", d, frac[d]);
}
