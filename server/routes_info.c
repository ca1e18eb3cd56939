/*
 * routes_info.c - GET /healthz, /readyz, /v1/info, /metrics, and the status page: GET /
 * (server/status.html, built in) and GET /v1/status (what it shows, as JSON).
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    gemm_buf b;
    gemm_buf_init(&b);
    gemm_buf_puts(&b, "{\"status\":\"ok\"}\n");
    return gemmd_respond_json(req, 200, &b);
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
    gemm_buf b;
    gemm_buf_init(&b);
    gemm_buf_printf(&b, "{\"status\":\"ready\",\"queued\":%d,\"running\":%d,\"queue_capacity\":%d}\n", st.queued,
                    st.running, srv->info.queue_capacity);
    return gemmd_respond_json(req, 200, &b);
}

static cJSON *names_of_bits(unsigned bits, int count, const char *(*name)(int))
{
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; i < count; i++)
        if (bits & (1u << i)) cJSON_AddItemToArray(arr, cJSON_CreateString(name(i)));
    return arr;
}

static const char *dtype_name_i(int i) { return gemm_dtype_name((gemm_dtype)i); }
static const char *math_name_i(int i) { return gemm_math_name((gemm_math)i); }

static cJSON *info_json(gemmd_services *srv)
{
    const gemm_engine_info *in = &srv->info;
    const gemmd_config *cfg = &srv->cfg;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "name", "gemmd");
    cJSON_AddStringToObject(root, "version", GEMMD_VERSION);
    cJSON_AddStringToObject(root, "instance_id", gemmd_instance_get());
    cJSON_AddStringToObject(root, "backend", in->backend);
    cJSON_AddNumberToObject(root, "workers", in->workers);

    gemm_engine_stats st; /* free memory now (the engine samples it off this thread) */
    gemm_engine_get_stats(srv->engine, &st);
    cJSON *devs = cJSON_AddArrayToObject(root, "devices");
    for (int i = 0; i < in->ndevices; i++) {
        const gemm_device_info *d = &in->devices[i];
        uint64_t free_mem = i < st.ndevices && st.device_mem_free[i] ? st.device_mem_free[i] : d->free_mem;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "index", i);
        cJSON_AddStringToObject(o, "name", d->name);
        cJSON_AddNumberToObject(o, "total_mem", (double)d->total_mem);
        cJSON_AddNumberToObject(o, "free_mem", (double)free_mem);
        cJSON_AddNumberToObject(o, "sms", d->sms);
        if (d->cc_major) {
            char cc[16];
            snprintf(cc, sizeof cc, "%d.%d", d->cc_major, d->cc_minor);
            cJSON_AddStringToObject(o, "compute_capability", cc);
        }
        cJSON_AddNumberToObject(o, "streams", d->streams);
        cJSON_AddItemToArray(devs, o);
    }

    cJSON *kers = cJSON_AddArrayToObject(root, "kernels");
    cJSON *auto_k = cJSON_CreateObject();
    cJSON_AddStringToObject(auto_k, "name", "auto");
    cJSON_AddStringToObject(auto_k, "description", "picks the fastest correct kernel for the shape and dtype");
    cJSON_AddItemToArray(kers, auto_k);
    for (int i = 0; i < in->nkernels; i++) {
        const gemm_kernel_info *k = &in->kernels[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", k->name);
        cJSON_AddStringToObject(o, "description", k->description);
        cJSON_AddItemToObject(o, "dtypes", names_of_bits(k->dtypes, GEMM_DTYPE_COUNT, dtype_name_i));
        cJSON_AddItemToObject(o, "maths", names_of_bits(k->maths, GEMM_MATH_COUNT, math_name_i));
        cJSON *tiles = cJSON_AddArrayToObject(o, "tiles");
        for (int t = 0; t < 4 && k->tiles[t]; t++) cJSON_AddItemToArray(tiles, cJSON_CreateNumber(k->tiles[t]));
        cJSON_AddItemToArray(kers, o);
    }

    cJSON *dts = cJSON_AddArrayToObject(root, "dtypes");
    for (int i = 0; i < GEMM_DTYPE_COUNT; i++) cJSON_AddItemToArray(dts, cJSON_CreateString(dtype_name_i(i)));
    cJSON *fmts = cJSON_AddArrayToObject(root, "formats");
    cJSON_AddItemToArray(fmts, cJSON_CreateString("application/json"));
    cJSON_AddItemToArray(fmts, cJSON_CreateString("application/octet-stream"));
    cJSON_AddItemToArray(fmts, cJSON_CreateString("multipart/form-data"));
    cJSON_AddItemToArray(fmts, cJSON_CreateString("application/x-npy"));

    cJSON *lim = cJSON_AddObjectToObject(root, "limits");
    cJSON_AddNumberToObject(lim, "max_dim", (double)cfg->limits.max_dim);
    cJSON_AddNumberToObject(lim, "max_elements", (double)cfg->limits.max_elements);
    cJSON_AddNumberToObject(lim, "max_body_bytes", (double)cfg->limits.max_body_bytes);
    cJSON_AddNumberToObject(lim, "max_json_bytes", (double)cfg->max_json_bytes);
    cJSON_AddNumberToObject(lim, "queue_depth", in->queue_capacity);
    cJSON_AddNumberToObject(lim, "max_jobs", cfg->max_jobs);
    cJSON_AddNumberToObject(lim, "job_mem_bytes", (double)cfg->job_mem_bytes);
    cJSON_AddNumberToObject(lim, "job_ttl_s", cfg->job_ttl_s);
    gemmd_budget_stats bs;
    gemmd_budget_get_stats(srv->budget, &bs);
    cJSON_AddNumberToObject(lim, "max_inflight_bytes", (double)bs.limit);
    cJSON_AddNumberToObject(lim, "connection_limit", cfg->connection_limit);
    cJSON_AddNumberToObject(lim, "per_ip_limit", cfg->per_ip_limit);
    cJSON_AddNumberToObject(lim, "header_timeout_s", cfg->header_timeout_s);
    cJSON_AddNumberToObject(lim, "request_timeout_s", cfg->request_timeout_s);
    cJSON_AddNumberToObject(lim, "min_rate_kb", cfg->min_rate_kb);
    cJSON_AddNumberToObject(lim, "send_timeout_s", cfg->send_timeout_s);

    cJSON *opts = cJSON_AddArrayToObject(root, "options"); /* the options' table (options.h) */
    for (int i = 0; i < gemm_option_count(); i++) {
        const gemm_option *d = gemm_option_at(i);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", d->name);
        cJSON_AddStringToObject(o, "type", gemm_option_types[d->type]);
        cJSON *doors = cJSON_AddArrayToObject(o, "doors");
        for (int k = 0; k < GEMM_DOOR_COUNT; k++)
            if (d->doors & (1u << k)) cJSON_AddItemToArray(doors, cJSON_CreateString(gemm_option_doors[k]));
        if (d->type == GEMM_OPT_UINT) cJSON_AddNumberToObject(o, "min", (double)d->min);
        if (d->type == GEMM_OPT_UINT && d->max != UINT64_MAX) cJSON_AddNumberToObject(o, "max", (double)d->max);
        cJSON_AddNumberToObject(o, "status", d->status);
        cJSON_AddStringToObject(o, "code", d->code);
        if (d->example) cJSON_AddStringToObject(o, "example", d->example);
        cJSON_AddStringToObject(o, "help", d->help);
        cJSON_AddItemToArray(opts, o);
    }

    cJSON *routes = cJSON_AddArrayToObject(root, "routes"); /* the route table (routes.h) */
    for (int i = 0; i < gemmd_nroutes; i++) {
        const gemmd_route_desc *r = &gemmd_routes[i];
        static const struct { unsigned bit; const char *name; } ms[] = {
            {GEMMD_GET, "GET"}, {GEMMD_GET, "HEAD"}, {GEMMD_POST, "POST"}, {GEMMD_PUT, "PUT"}, {GEMMD_DELETE, "DELETE"}};
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "path", r->pattern);
        cJSON *methods = cJSON_AddArrayToObject(o, "methods");
        for (size_t k = 0; k < sizeof ms / sizeof ms[0]; k++)
            if (r->methods & ms[k].bit) cJSON_AddItemToArray(methods, cJSON_CreateString(ms[k].name));
        cJSON_AddBoolToObject(o, "token", srv->auth != NULL && !(r->flags & GEMMD_OPEN));
        cJSON_AddItemToArray(routes, o);
    }

    int streams = 0;
    for (int i = 0; i < in->ndevices; i++) streams += in->devices[i].streams;
    cJSON_AddNumberToObject(root, "streams", streams);
    cJSON_AddBoolToObject(root, "auth", srv->auth != NULL);
    return root;
}

enum MHD_Result gemmd_route_info(gemmd_request *req)
{
    cJSON *root = info_json(req->svc);
    char *text = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    gemm_buf b;
    gemm_buf_init(&b);
    if (!text) return gemmd_respond_errorf(req, 500, "out_of_memory", "cannot build the info answer");
    gemm_buf_puts(&b, text);
    gemm_buf_puts(&b, "\n");
    cJSON_free(text);
    return gemmd_respond_json(req, 200, &b);
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

    gemm_buf b;
    gemm_buf_init(&b);
    gemm_buf_puts(&b, "{\"version\":");
    gemm_buf_json_string(&b, GEMMD_VERSION);
    gemm_buf_puts(&b, ",\"instance_id\":");
    gemm_buf_json_string(&b, gemmd_instance_get());
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
    return gemmd_respond_json(req, 200, &b);
}

enum MHD_Result gemmd_route_metrics(gemmd_request *req)
{
    gemm_buf b;
    gemm_buf_init(&b);
    gemmd_jobs_sweep(req->svc->jobs); /* expired jobs leave the gauges too */
    gemmd_metrics_render(&b, req->svc->engine);
    gemmd_fleet_render(&b, req->svc->engine, atomic_load(&req->svc->inflight) - 1);
    gemmd_budget_stats bs;
    gemmd_budget_get_stats(req->svc->budget, &bs);
    gemmd_metrics_render_memory(&b, &bs);
    gemmd_conns_stats cs;
    gemmd_conns_get_stats(req->svc->conns, &cs);
    gemmd_metrics_render_connections(&b, &cs);
    gemmd_admit_stats as;
    gemmd_admit_get_stats(req->svc->admit, &as);
    gemmd_metrics_render_admission(&b, &as);
    gemmd_usage_render(&b, req->svc->auth);
    return gemmd_respond_buf(req, 200, "text/plain; version=0.0.4; charset=utf-8", &b, NULL);
}
