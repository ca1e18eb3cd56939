/*
 * metrics.c - counters for /metrics in the Prometheus text format 0.0.4.
 *
 * Request counters and histograms are plain atomics (no lock on the request path). The
 * histogram keeps one non-cumulative count per bucket; rendering adds them up, so the
 * exposed buckets are cumulative and the +Inf bucket always equals _count, even while
 * other threads keep counting. Engine figures are read from gemm_engine_get_stats() at
 * render time.
 */
#include "metrics.h"

#include <stdatomic.h>

#include "config.h" /* GEMMD_VERSION */

#define NCODES 600 /* HTTP status codes 0..599 */

static const double bucket_le[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                   0.5,   1.0,    2.5,   5.0,  10.0,  30.0, 60.0};
#define NBUCKETS (sizeof bucket_le / sizeof bucket_le[0])

typedef struct {
    _Atomic uint64_t by_code[NCODES];
    _Atomic uint64_t buckets[NBUCKETS + 1]; /* last: above the largest bound (+Inf only) */
    _Atomic uint64_t sum_ns;
} route_counters;

static route_counters routes[GEMMD_METRIC_ROUTES];
static const char *route_names[GEMMD_METRIC_ROUTES];
static int nroutes;
static _Atomic uint64_t bytes_in_total, bytes_out_total;
static _Atomic int jobs_state[5];
static _Atomic int resident_count;
static _Atomic uint64_t resident_host_bytes, resident_budget;

void gemmd_metrics_init(const char *const *labels, int n)
{
    nroutes = n < GEMMD_METRIC_ROUTES ? n : GEMMD_METRIC_ROUTES;
    for (int r = 0; r < nroutes; r++) route_names[r] = labels[r];
    for (int r = 0; r < GEMMD_METRIC_ROUTES; r++) {
        for (int c = 0; c < NCODES; c++) atomic_store(&routes[r].by_code[c], 0);
        for (size_t b = 0; b <= NBUCKETS; b++) atomic_store(&routes[r].buckets[b], 0);
        atomic_store(&routes[r].sum_ns, 0);
    }
    atomic_store(&bytes_in_total, 0);
    atomic_store(&bytes_out_total, 0);
    for (int s = 0; s < 5; s++) atomic_store(&jobs_state[s], 0);
}

void gemmd_metrics_request(int route, int who, int status, double seconds, uint64_t bytes_in, uint64_t bytes_out)
{
    gemmd_usage_request(who, status >= 0 && status < NCODES ? status : 0, bytes_in, bytes_out);
    if (route < 0 || route >= nroutes) route = nroutes - 1; /* the last label: "other" */
    if (route < 0) return;
    if (status < 0 || status >= NCODES) status = 0;
    if (!(seconds >= 0)) seconds = 0; /* also catches NaN */
    route_counters *rc = &routes[route];
    atomic_fetch_add_explicit(&rc->by_code[status], 1, memory_order_relaxed);
    size_t b = 0;
    while (b < NBUCKETS && seconds > bucket_le[b]) b++;
    atomic_fetch_add_explicit(&rc->buckets[b], 1, memory_order_relaxed);
    double ns = seconds * 1e9;
    if (ns > 1.8e19) ns = 1.8e19;
    atomic_fetch_add_explicit(&rc->sum_ns, (uint64_t)ns, memory_order_relaxed);
    atomic_fetch_add_explicit(&bytes_in_total, bytes_in, memory_order_relaxed);
    atomic_fetch_add_explicit(&bytes_out_total, bytes_out, memory_order_relaxed);
}

void gemmd_metrics_jobs_by_state(const int counts[5])
{
    for (int s = 0; s < 5; s++) atomic_store(&jobs_state[s], counts[s]);
}

void gemmd_metrics_resident(int count, uint64_t host_bytes, uint64_t budget_bytes)
{
    atomic_store(&resident_count, count);
    atomic_store(&resident_host_bytes, host_bytes);
    atomic_store(&resident_budget, budget_bytes);
}

void gemmd_metrics_label_value(gemm_buf *out, const char *v)
{
    for (const char *p = v; *p; p++) {
        if (*p == '\\') gemm_buf_puts(out, "\\\\");
        else if (*p == '"') gemm_buf_puts(out, "\\\"");
        else if (*p == '\n') gemm_buf_puts(out, "\\n");
        else gemm_buf_append(out, p, 1);
    }
}

void gemmd_metrics_header(gemm_buf *out, const char *name, const char *type, const char *help)
{
    gemm_buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}
#define header gemmd_metrics_header

void gemmd_metrics_single(gemm_buf *out, const char *name, const char *type, const char *help, uint64_t v)
{
    header(out, name, type, help);
    gemm_buf_printf(out, "%s %llu\n", name, (unsigned long long)v);
}
#define single gemmd_metrics_single

/* The route labels are the route table's own (routes.c: paths, methods, "other"): nothing
 * in them to escape. */
static void render_requests(gemm_buf *out)
{
    header(out, "gemmd_requests_total", "counter", "HTTP requests answered, by route and status code.");
    for (int r = 0; r < nroutes; r++) {
        for (int c = 0; c < NCODES; c++) {
            uint64_t v = atomic_load_explicit(&routes[r].by_code[c], memory_order_relaxed);
            if (v)
                gemm_buf_printf(out, "gemmd_requests_total{route=\"%s\",code=\"%d\"} %llu\n", route_names[r], c,
                                (unsigned long long)v);
        }
    }

    header(out, "gemmd_request_duration_seconds", "histogram",
           "Time from request start to the answer being queued, by route.");
    for (int r = 0; r < nroutes; r++) {
        const char *route = route_names[r];
        uint64_t counts[NBUCKETS + 1], total = 0;
        for (size_t b = 0; b <= NBUCKETS; b++) {
            counts[b] = atomic_load_explicit(&routes[r].buckets[b], memory_order_relaxed);
            total += counts[b];
        }
        if (!total) continue;
        uint64_t cum = 0;
        for (size_t b = 0; b <= NBUCKETS; b++) {
            cum += counts[b];
            gemm_buf_printf(out, "gemmd_request_duration_seconds_bucket{route=\"%s\",le=\"", route);
            if (b < NBUCKETS) gemm_buf_printf(out, "%g\"} %llu\n", bucket_le[b], (unsigned long long)cum);
            else gemm_buf_printf(out, "+Inf\"} %llu\n", (unsigned long long)cum);
        }
        double sum = (double)atomic_load_explicit(&routes[r].sum_ns, memory_order_relaxed) / 1e9;
        gemm_buf_printf(out, "gemmd_request_duration_seconds_sum{route=\"%s\"} %.9f\n", route, sum);
        gemm_buf_printf(out, "gemmd_request_duration_seconds_count{route=\"%s\"} %llu\n", route,
                        (unsigned long long)total);
    }

    single(out, "gemmd_bytes_received_total", "counter", "Request body bytes received.", atomic_load(&bytes_in_total));
    single(out, "gemmd_bytes_sent_total", "counter", "Response body bytes sent.", atomic_load(&bytes_out_total));
}

static void render_engine(gemm_buf *out, gemm_engine *engine)
{
    gemm_engine_stats st = {0};
    if (engine) gemm_engine_get_stats(engine, &st);
    int nd = st.ndevices < 0 ? 0 : st.ndevices > GEMM_MAX_DEVICES ? GEMM_MAX_DEVICES : st.ndevices;

    single(out, "gemmd_queue_depth", "gauge", "Products waiting for an engine worker.", st.queued);
    single(out, "gemmd_jobs_running", "gauge",
           "Products running on the engine (on a worker, or on the HTTP thread that received them: direct_run).",
           st.running);

    header(out, "gemmd_jobs", "gauge", "Async jobs kept by the job store, by state.");
    for (int s = 0; s < 5; s++)
        gemm_buf_printf(out, "gemmd_jobs{state=\"%s\"} %d\n", gemm_job_state_name((gemm_job_state)s),
                        atomic_load(&jobs_state[s]));

    single(out, "gemmd_resident_matrices", "gauge",
           "Resident matrices kept (/v1/matrices).", atomic_load(&resident_count));
    header(out, "gemmd_resident_bytes", "gauge",
           "Bytes held by resident matrices: host copies (reservations included) and, per device, "
           "the device copies the CUDA backend keeps.");
    gemm_buf_printf(out, "gemmd_resident_bytes{where=\"host\"} %llu\n",
                    (unsigned long long)atomic_load(&resident_host_bytes));
    for (int i = 0; i < nd; i++) /* device copies (CUDA) */
        gemm_buf_printf(out, "gemmd_resident_bytes{where=\"device\",device=\"%d\"} %llu\n", i,
                        (unsigned long long)st.resident_bytes[i]);
    single(out, "gemmd_resident_budget_bytes", "gauge", "resident_mb in bytes.", atomic_load(&resident_budget));

    header(out, "gemmd_engine_jobs_total", "counter", "Products the engine finished, by result.");
    gemm_buf_printf(out, "gemmd_engine_jobs_total{result=\"completed\"} %llu\n", (unsigned long long)st.completed);
    gemm_buf_printf(out, "gemmd_engine_jobs_total{result=\"failed\"} %llu\n", (unsigned long long)st.failed);
    gemm_buf_printf(out, "gemmd_engine_jobs_total{result=\"cancelled\"} %llu\n", (unsigned long long)st.cancelled);
    gemm_buf_printf(out, "gemmd_engine_jobs_total{result=\"rejected\"} %llu\n", (unsigned long long)st.rejected);

    single(out, "gemmd_coalesced_launches_total", "counter",
           "Groups of queued small products the engine ran as one batched job (dynamic batching).",
           st.coalesced_launches);
    single(out, "gemmd_coalesced_products_total", "counter", "Products that ran in those groups.",
           st.coalesced_products);
    single(out, "gemmd_direct_runs_total", "counter",
           "Products run by the HTTP thread that received them, on an idle stream (direct_run).", st.ran_here);
    single(out, "gemmd_host_runs_total", "counter",
           "Products computed on the host by the HTTP thread that received them (host_max_mnk; also counted in "
           "gemmd_direct_runs_total).", st.ran_host);
    single(out, "gemmd_split_products_total", "counter",
           "Products the engine cut into row panels run on several devices or workers at once (each also counted "
           "once in gemmd_engine_jobs_total).", st.split_products);
    single(out, "gemmd_split_panels_total", "counter", "Row panels those products ran as.", st.split_panels);

    header(out, "gemmd_compute_seconds_total", "counter", "Seconds engine workers spent computing products.");
    gemm_buf_printf(out, "gemmd_compute_seconds_total %.6f\n", st.compute_seconds);

    header(out, "gemmd_device_busy_seconds_total", "counter", "Seconds each device spent running products.");
    for (int d = 0; d < nd; d++)
        gemm_buf_printf(out, "gemmd_device_busy_seconds_total{device=\"%d\"} %.6f\n", d, st.device_busy_seconds[d]);
    header(out, "gemmd_device_bytes_copied_total", "counter", "Bytes copied between host and each device.");
    for (int d = 0; d < nd; d++) {
        gemm_buf_printf(out, "gemmd_device_bytes_copied_total{device=\"%d\",direction=\"h2d\"} %llu\n", d,
                        (unsigned long long)st.bytes_h2d[d]);
        gemm_buf_printf(out, "gemmd_device_bytes_copied_total{device=\"%d\",direction=\"d2h\"} %llu\n", d,
                        (unsigned long long)st.bytes_d2h[d]);
    }
    header(out, "gemmd_device_running", "gauge",
           "Streams of each device running a product, batch or panel now (its workers busy).");
    for (int d = 0; d < nd; d++)
        gemm_buf_printf(out, "gemmd_device_running{device=\"%d\"} %d\n", d, d < st.nslots ? st.slot_busy[d] : 0);
    header(out, "gemmd_device_memory_used_bytes", "gauge", "Device memory held by the engine's buffers.");
    for (int d = 0; d < nd; d++)
        gemm_buf_printf(out, "gemmd_device_memory_used_bytes{device=\"%d\"} %llu\n", d,
                        (unsigned long long)st.device_mem_used[d]);
}

void gemmd_metrics_render(gemm_buf *out, gemm_engine *engine)
{
    render_requests(out);
    render_engine(out, engine);

    gemm_engine_info info = {0};
    if (engine) gemm_engine_describe(engine, &info);
    int nd = info.ndevices < 0 ? 0 : info.ndevices > GEMM_MAX_DEVICES ? GEMM_MAX_DEVICES : info.ndevices;
    header(out, "gemmd_device_info", "gauge", "The devices the engine computes on, by index and name (always 1).");
    for (int d = 0; d < nd; d++) {
        gemm_buf_printf(out, "gemmd_device_info{device=\"%d\",name=\"", d);
        gemmd_metrics_label_value(out, info.devices[d].name);
        gemm_buf_puts(out, "\"} 1\n");
    }
    header(out, "gemmd_build_info", "gauge", "Version and compute backend of this daemon (always 1).");
    gemm_buf_printf(out, "gemmd_build_info{version=\"%s\",backend=\"%s\"} 1\n", GEMMD_VERSION, /* nothing to escape */
                    info.backend[0] ? info.backend : "none");
}

void gemmd_metrics_render_limits(gemm_buf *out, const gemmd_budget_stats *st, const gemmd_conns_stats *cs,
                                 const gemmd_admit_stats *as)
{
    single(out, "gemmd_memory_budget_bytes", "gauge",
           "The memory budget of requests in flight (max_inflight_mb).", st->limit);
    single(out, "gemmd_memory_inflight_bytes", "gauge", "Bytes charged against the memory budget now.", st->used);
    single(out, "gemmd_memory_inflight_peak_bytes", "gauge", "The most bytes charged at once since start.", st->peak);
    header(out, "gemmd_memory_held_bytes", "gauge",
           "Bytes charged now, by what holds them: request bodies being received, inputs of products "
           "decoded, queued or running, kept async results, answers being sent, the engine's cache, "
           "reservations made at admission, resident matrices.");
    for (int k = 0; k < GEMMD_MEM_NKINDS; k++)
        gemm_buf_printf(out, "gemmd_memory_held_bytes{holder=\"%s\"} %llu\n", gemmd_mem_kind_name((gemmd_mem_kind)k),
                        (unsigned long long)st->by_kind[k]);
    single(out, "gemmd_memory_refused_total", "counter",
           "Charges the memory budget refused (answered 503).", st->refused);

    single(out, "gemmd_connections_open", "gauge", "Connections open now (admitted and refused).", cs->open);
    single(out, "gemmd_connections_admitted", "gauge",
           "Connections counted against connection_limit now.", cs->admitted);
    single(out, "gemmd_connections_accepted_total", "counter", "Connections accepted since start.", cs->accepted);
    header(out, "gemmd_connections_refused_total", "counter",
           "Connections answered 503 and closed for being over a limit.");
    gemm_buf_printf(out, "gemmd_connections_refused_total{limit=\"connection_limit\"} %llu\n",
                    (unsigned long long)cs->refused_limit);
    gemm_buf_printf(out, "gemmd_connections_refused_total{limit=\"per_ip_limit\"} %llu\n",
                    (unsigned long long)cs->refused_ip);
    single(out, "gemmd_connections_evicted_total", "counter",
           "Connections waiting for a request head closed to make room for a newcomer.", cs->evicted);
    header(out, "gemmd_connections_closed_total", "counter", "Connections closed at a deadline, by deadline.");
    static const char *const deadlines[] = {"header", "min_rate", "request", "send"};
    const uint64_t closed[] = {cs->closed_header, cs->closed_body, cs->closed_request, cs->closed_send};
    for (int i = 0; i < 4; i++)
        gemm_buf_printf(out, "gemmd_connections_closed_total{deadline=\"%s\"} %llu\n", deadlines[i],
                        (unsigned long long)closed[i]);
    single(out, "gemmd_clients_left_total", "counter",
           "Clients that left a request waiting for memory or the engine, or before its body was whole: their work "
           "was stopped.", cs->left);

    single(out, "gemmd_admission_waiting", "gauge",
           "Requests waiting for memory before their bodies are read.", as->waiting);
    single(out, "gemmd_admission_waiting_bytes", "gauge", "Bytes those requests wait for.", as->waiting_bytes);
    header(out, "gemmd_admission_total", "counter",
           "Requests that reserved memory before their bodies, by how: admitted (at once or after waiting), "
           "queued (waited), refused_full (the queue or the client's places were full), refused_wait (admit_wait "
           "passed), cancelled (the client left while waiting).");
    static const char *const names[] = {"admitted", "queued", "refused_full", "refused_wait", "cancelled"};
    const uint64_t v[] = {as->admitted, as->queued, as->refused_full, as->refused_wait, as->cancelled};
    for (int i = 0; i < 5; i++)
        gemm_buf_printf(out, "gemmd_admission_total{result=\"%s\"} %llu\n", names[i], (unsigned long long)v[i]);
}
