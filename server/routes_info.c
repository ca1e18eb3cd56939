/*
 * routes_info.c - GET /healthz, /readyz, /v1/info, /metrics, and the status page: GET /
 * (server/status.html, built in) and GET /v1/status (what it shows, as JSON).
 */
#include <time.h>

#include "fleet.h"
#include "instance.h"
#include "respond.h"
#include "request.h"
#include "routes.h"
#include "usage.h"

/* server/status.html, as the Makefile builds it in */
extern const char gemmd_status_html[];
extern const unsigned long gemmd_status_html_len;

enum MHD_Result gemmd_route_healthz(gemmd_request *req)
{
    if (!gemm_engine_healthy(req->svc->engine))
        return gemmd_respond_errorf(req, 503, "device_lost",
                                    "the engine lost every device it uses; this process cannot recover "
                                    "and must be restarted");
    gemm_buf b = {0};
    gemm_buf_puts(&b, "{\"status\":\"ok\"}\n");
    return gemmd_respond_buf(req, 200, "application/json", &b, NULL);
}

int gemmd_not_ready(gemmd_request *req, gemm_err *err)
{
    gemmd_services *srv = req->svc;
    gemm_engine_stats st;
    if (atomic_load(&srv->stopping)) return gemm_err_set(err, 503, "shutting_down", "the server is shutting down");
    if (!gemm_engine_healthy(srv->engine))
        return gemm_err_set(err, 503, "device_lost",
                            "the engine lost every device it uses; the process must be restarted");
    if (gemm_engine_ready(srv->engine)) return 0;
    gemm_engine_get_stats(srv->engine, &st);
    return gemm_err_set(err, 503, "not_ready", "the engine is not taking work: %d of %d queue places are taken",
                        st.queued, srv->info.queue_capacity);
}

enum MHD_Result gemmd_route_readyz(gemmd_request *req)
{
    gemmd_services *srv = req->svc;
    if (gemmd_not_ready(req, &req->err) != 0) return gemmd_respond_error(req, &req->err);
    gemm_engine_stats st;
    gemm_engine_get_stats(srv->engine, &st);
    gemm_buf b = {0};
    gemm_buf_printf(&b, "{\"status\":\"ready\",\"queued\":%d,\"running\":%d,\"queue_capacity\":%d}\n", st.queued,
                    st.running, srv->info.queue_capacity);
    return gemmd_respond_buf(req, 200, "application/json", &b, NULL);
}

/* ,"key":["name",...] for the bits set of count named ones */
static void names_of_bits(gemm_buf *b, const char *key, unsigned bits, int count, const char *(*name)(int))
{
    gemm_buf_printf(b, ",\"%s\":[", key);
    for (int i = 0, n = 0; i < count; i++)
        if (bits & (1u << i)) gemm_buf_printf(b, "%s\"%s\"", n++ ? "," : "", name(i));
    gemm_buf_puts(b, "]");
}

static const char *dtype_name_i(int i) { return gemm_dtype_name((gemm_dtype)i); }
static const char *math_name_i(int i) { return gemm_math_name((gemm_math)i); }
static const char *door_name_i(int i) { return gemm_option_doors[i]; }
static const char *method_name_i(int i) { return (const char *const[]){"GET", "HEAD", "POST", "PUT", "DELETE"}[i]; }

/* pre then "key":"value" (escaped) */
static void member(gemm_buf *b, const char *pre, const char *key, const char *value)
{
    gemm_buf_printf(b, "%s\"%s\":", pre, key);
    gemm_buf_json_string(b, value);
}

enum MHD_Result gemmd_route_info(gemmd_request *req)
{
    gemmd_services *srv = req->svc;
    const gemm_engine_info *in = &srv->info;
    const gemmd_config *cfg = &srv->cfg;
    gemm_buf b = {0};
    gemm_buf_puts(&b, "{\"name\":\"gemmd\"");
    member(&b, ",", "version", GEMMD_VERSION);
    member(&b, ",", "instance_id", gemmd_instance_get());
    member(&b, ",", "backend", in->backend);
    gemm_buf_printf(&b, ",\"workers\":%d,\"devices\":[", in->workers);
    gemm_engine_stats st; /* free memory now (the engine samples it off this thread) */
    gemm_engine_get_stats(srv->engine, &st);
    for (int i = 0; i < in->ndevices; i++) {
        const gemm_device_info *d = &in->devices[i];
        uint64_t free_mem = i < st.ndevices && st.device_mem_free[i] ? st.device_mem_free[i] : d->free_mem;
        gemm_buf_printf(&b, "%s{\"index\":%d", i ? "," : "", i);
        member(&b, ",", "name", d->name);
        gemm_buf_printf(&b, ",\"total_mem\":%llu,\"free_mem\":%llu,\"sms\":%d", (unsigned long long)d->total_mem,
                        (unsigned long long)free_mem, d->sms);
        if (d->cc_major) gemm_buf_printf(&b, ",\"compute_capability\":\"%d.%d\"", d->cc_major, d->cc_minor);
        gemm_buf_printf(&b, ",\"streams\":%d}", d->streams);
    }
    gemm_buf_puts(&b, "],\"kernels\":[{\"name\":\"auto\",\"description\":\"picks the fastest correct kernel for "
                      "the shape and dtype\"}");
    for (int i = 0; i < in->nkernels; i++) {
        const gemm_kernel_info *k = &in->kernels[i];
        member(&b, ",{", "name", k->name);
        member(&b, ",", "description", k->description);
        names_of_bits(&b, "dtypes", k->dtypes, GEMM_DTYPE_COUNT, dtype_name_i);
        names_of_bits(&b, "maths", k->maths, GEMM_MATH_COUNT, math_name_i);
        gemm_buf_puts(&b, ",\"tiles\":[");
        for (int t = 0; t < 4 && k->tiles[t]; t++) gemm_buf_printf(&b, "%s%d", t ? "," : "", k->tiles[t]);
        gemm_buf_puts(&b, "]}");
    }
    gemm_buf_puts(&b, "]");
    names_of_bits(&b, "dtypes", (1u << GEMM_DTYPE_COUNT) - 1, GEMM_DTYPE_COUNT, dtype_name_i);
    gemm_buf_puts(&b, ",\"formats\":[\"application/json\",\"application/octet-stream\",\"multipart/form-data\","
                      "\"application/x-npy\"]");
    gemmd_budget_stats bs;
    gemmd_budget_get_stats(srv->budget, &bs);
    gemm_buf_printf(&b, ",\"limits\":{\"max_dim\":%llu,\"max_elements\":%llu,\"max_body_bytes\":%llu,"
                    "\"max_json_bytes\":%llu,\"queue_depth\":%d,\"max_jobs\":%d,\"job_mem_bytes\":%llu,"
                    "\"job_ttl_s\":%d,\"max_inflight_bytes\":%llu,\"connection_limit\":%d,\"per_ip_limit\":%d,"
                    "\"header_timeout_s\":%d,\"request_timeout_s\":%d,\"min_rate_kb\":%d,\"send_timeout_s\":%d}",
                    (unsigned long long)cfg->limits.max_dim, (unsigned long long)cfg->limits.max_elements,
                    (unsigned long long)cfg->limits.max_body_bytes, (unsigned long long)cfg->max_json_bytes,
                    in->queue_capacity, cfg->max_jobs, (unsigned long long)cfg->job_mem_bytes, cfg->job_ttl_s,
                    (unsigned long long)bs.limit, cfg->connection_limit, cfg->per_ip_limit, cfg->header_timeout_s,
                    cfg->request_timeout_s, cfg->min_rate_kb, cfg->send_timeout_s);
    gemm_buf_puts(&b, ",\"options\":["); /* the options' table (options.h) */
    for (int i = 0; i < gemm_option_count(); i++) {
        const gemm_option *d = gemm_option_at(i);
        gemm_buf_printf(&b, "%s{\"name\":\"%s\",\"type\":\"%s\"", i ? "," : "", d->name, /* identifiers */
                        gemm_option_types[d->type]);
        names_of_bits(&b, "doors", d->doors, GEMM_DOOR_COUNT, door_name_i);
        if (d->type == GEMM_OPT_UINT) gemm_buf_printf(&b, ",\"min\":%llu", (unsigned long long)d->min);
        if (d->type == GEMM_OPT_UINT && d->max != UINT64_MAX)
            gemm_buf_printf(&b, ",\"max\":%llu", (unsigned long long)d->max);
        gemm_buf_printf(&b, ",\"status\":%d,\"code\":\"%s\"", d->status, d->code);
        if (d->example) member(&b, ",", "example", d->example);
        member(&b, ",", "help", d->help);
        gemm_buf_puts(&b, "}");
    }
    gemm_buf_puts(&b, "],\"routes\":["); /* the route table (routes.h) */
    for (int i = 0; i < gemmd_nroutes; i++) {
        const gemmd_route_desc *r = &gemmd_routes[i];
        member(&b, i ? ",{" : "{", "path", r->pattern);
        unsigned m = r->methods; /* as GET, HEAD, POST, PUT, DELETE: GET implies HEAD */
        names_of_bits(&b, "methods", (m & GEMMD_GET ? 3u : 0u) | (m & ~(unsigned)GEMMD_GET) << 1, 5, method_name_i);
        gemm_buf_printf(&b, ",\"token\":%s}", srv->auth && !(r->flags & GEMMD_OPEN) ? "true" : "false");
    }
    int streams = 0;
    for (int i = 0; i < in->ndevices; i++) streams += in->devices[i].streams;
    gemm_buf_printf(&b, "],\"streams\":%d,\"auth\":%s}\n", streams, srv->auth ? "true" : "false");
    return gemmd_respond_buf(req, 200, "application/json", &b, NULL);
}

/* The page is open (it asks for a token itself, for the JSON); the policy lets it fetch
 * only from this origin and load nothing from anywhere. */
enum MHD_Result gemmd_route_status_page(gemmd_request *req)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(gemmd_status_html_len, (void *)gemmd_status_html,
                                                             MHD_RESPMEM_PERSISTENT);
    if (r) {
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/html; charset=utf-8");
        MHD_add_response_header(r, "Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; "
                                "style-src 'unsafe-inline'; connect-src 'self'; img-src data:");
        req->bytes_out = gemmd_status_html_len;
    }
    return gemmd_respond_queue(req, 200, r);
}

enum MHD_Result gemmd_route_status(gemmd_request *req)
{
    gemmd_services *srv = req->svc;
    const gemm_engine_info *in = &srv->info;
    gemm_engine_stats st;
    gemm_engine_get_stats(srv->engine, &st);
    double busy[GEMM_MAX_DEVICES] = {0}, uptime = gemmd_fleet_uptime_s();
    int nbusy = gemmd_fleet_utilization(&st, busy);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    gemmd_budget_stats bs;
    gemmd_budget_get_stats(srv->budget, &bs);

    gemm_buf b = {0};
    member(&b, "{", "version", GEMMD_VERSION);
    member(&b, ",", "instance_id", gemmd_instance_get());
    gemm_buf_printf(&b, ",\"backend\":\"%s\",\"uptime_s\":%.1f,\"time\":%.3f,\"busy_window_s\":%d,\"devices\":[",
                    in->backend, uptime, (double)now.tv_sec + (double)now.tv_nsec / 1e9, GEMMD_UTIL_WINDOW_S);
    for (int i = 0; i < in->ndevices; i++) {
        const gemm_device_info *d = &in->devices[i];
        uint64_t used = i < st.ndevices ? st.device_mem_used[i] : 0;
        uint64_t free_mem = i < st.ndevices && st.device_mem_free[i] ? st.device_mem_free[i] : d->free_mem;
        gemm_buf_printf(&b, "%s{\"index\":%d,\"name\":", i ? "," : "", i);
        gemm_buf_json_string(&b, d->name);
        gemm_buf_printf(&b, ",\"busy\":%.4f,\"running\":%d,\"streams\":%d,\"mem_total\":%llu,\"mem_used\":%llu,"
                        "\"mem_free\":%llu}", i < nbusy ? busy[i] : 0.0, i < st.nslots ? st.slot_busy[i] : 0,
                        d->streams, (unsigned long long)d->total_mem, (unsigned long long)used,
                        (unsigned long long)free_mem);
    }
    gemm_buf_printf(&b, "],\"memory\":{\"budget_bytes\":%llu,\"inflight_bytes\":%llu},", (unsigned long long)bs.limit,
                    (unsigned long long)bs.used);
    double wait = gemmd_usage_json(&b, srv->auth, st.queued, uptime);
    gemm_buf_printf(&b, ",\"queue\":{\"queued\":%d,\"running\":%d,\"capacity\":%d,\"workers\":%d,\"wait_estimate_s\":",
                    st.queued, st.running, in->queue_capacity, in->workers);
    if (wait < 0) gemm_buf_puts(&b, "null}}\n");
    else gemm_buf_printf(&b, "%.6f}}\n", wait);
    return gemmd_respond_buf(req, 200, "application/json", &b, NULL);
}

enum MHD_Result gemmd_route_metrics(gemmd_request *req)
{
    gemm_buf b = {0};
    gemmd_jobs_sweep(req->svc->jobs); /* expired jobs leave the gauges too */
    gemmd_metrics_render(&b, req->svc->engine);
    gemmd_fleet_render(&b, req->svc->engine, atomic_load(&req->svc->inflight) - 1);
    gemmd_budget_stats bs;
    gemmd_conns_stats cs;
    gemmd_admit_stats as;
    gemmd_budget_get_stats(req->svc->budget, &bs);
    gemmd_conns_get_stats(req->svc->conns, &cs);
    gemmd_admit_get_stats(req->svc->admit, &as);
    gemmd_metrics_render_limits(&b, &bs, &cs, &as);
    gemmd_usage_render(&b, req->svc->auth);
    return gemmd_respond_buf(req, 200, "text/plain; version=0.0.4; charset=utf-8", &b, NULL);
}
