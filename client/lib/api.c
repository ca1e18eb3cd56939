/*
 * api.c - the calls of libgemm: a synchronous product, asynchronous jobs (submit, status,
 * wait, fetch, delete) and plain GETs, each one gemm_xfer.
 */
#include "client_internal.h"
#include "gemm_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#define LOCAL_ERR(err) gemm_client_error err##_local; if (!err) err = &err##_local

/* Characters allowed in a kernel name or job id put into a URL: no escaping needed. */
static int url_safe(const char *s)
{
    if (!s || !*s) return 0;
    for (; *s; s++) {
        char ch = *s;
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '-' || ch == '_' || ch == '.'))
            return 0;
    }
    return 1;
}

static int check_request(const gemm_request *r, int need_c, gemm_client_error *err)
{
    if (!r) return gemm_client_err(err, GEMM_CLIENT_E_ARGUMENT, "bad_argument", "no request");
    if (gemm_dtype_size(r->dtype) == 0)
        return gemm_client_err(err, GEMM_CLIENT_E_ARGUMENT, "bad_argument", "unknown dtype %d", (int)r->dtype);
    if (r->m == 0 || r->k == 0 || r->n == 0)
        return gemm_client_err(err, GEMM_CLIENT_E_ARGUMENT, "bad_argument",
                               "every dimension must be >= 1 (m=%llu k=%llu n=%llu)",
                               (unsigned long long)r->m, (unsigned long long)r->k, (unsigned long long)r->n);
    size_t ab, bb, cb, tot;
    if (!gemm_matrix_bytes(r->m, r->k, r->dtype, &ab) || !gemm_matrix_bytes(r->k, r->n, r->dtype, &bb) ||
        !gemm_matrix_bytes(r->m, r->n, gemm_request_c_dtype(r), &cb) || !gemm_add_size(ab, bb, &tot))
        return gemm_client_err(err, GEMM_CLIENT_E_ARGUMENT, "bad_argument", "the matrices' sizes overflow");
    if (!r->a || !r->b || (need_c && !r->c))
        return gemm_client_err(err, GEMM_CLIENT_E_ARGUMENT, "bad_argument", "a NULL matrix buffer");
    if (r->kernel && !url_safe(r->kernel))
        return gemm_client_err(err, GEMM_CLIENT_E_ARGUMENT, "bad_argument",
                               "kernel name \"%s\" has characters other than [A-Za-z0-9._-]", r->kernel);
    if (r->math < GEMM_MATH_DEFAULT || r->math >= GEMM_MATH_COUNT)
        return gemm_client_err(err, GEMM_CLIENT_E_ARGUMENT, "bad_argument", "unknown math mode %d", (int)r->math);
    if (r->tile < 0)
        return gemm_client_err(err, GEMM_CLIENT_E_ARGUMENT, "bad_argument", "tile must be >= 0");
    return 0;
}

int gemm_request_query(const gemm_request *r, const char *path, char *buf, size_t cap,
                       gemm_client_error *err)
{
    int n = snprintf(buf, cap, "%s?m=%llu&k=%llu&n=%llu&dtype=%s", path, (unsigned long long)r->m,
                     (unsigned long long)r->k, (unsigned long long)r->n, gemm_dtype_name(r->dtype));
    if (n > 0 && (size_t)n < cap && r->kernel && *r->kernel)
        n += snprintf(buf + n, cap - (size_t)n, "&kernel=%s", r->kernel);
    if (n > 0 && (size_t)n < cap && r->math != GEMM_MATH_DEFAULT)
        n += snprintf(buf + n, cap - (size_t)n, "&math=%s", gemm_math_name(r->math));
    if (n > 0 && (size_t)n < cap && r->tile > 0)
        n += snprintf(buf + n, cap - (size_t)n, "&tile=%d", r->tile);
    if (n > 0 && (size_t)n < cap && gemm_dtype_is_half(r->dtype))
        n += snprintf(buf + n, cap - (size_t)n, "&out_dtype=%s", gemm_dtype_name(gemm_request_c_dtype(r)));
    if (n < 0 || (size_t)n >= cap)
        return gemm_client_err(err, GEMM_CLIENT_E_ARGUMENT, "bad_argument", "request URL too long");
    return 0;
}

static void set_body(gemm_xfer *x, const gemm_request *r)
{
    size_t ab = 0, bb = 0;
    gemm_matrix_bytes(r->m, r->k, r->dtype, &ab);
    gemm_matrix_bytes(r->k, r->n, r->dtype, &bb);
    x->part[0] = r->a;
    x->part_len[0] = ab;
    x->part[1] = r->b;
    x->part_len[1] = bb;
}

int gemm_client_multiply(gemm_client *c, const gemm_request *r, gemm_timing *t, gemm_client_error *err)
{
    LOCAL_ERR(err);
    gemm_client_err_clear(err);
    if (!c) return gemm_client_err(err, GEMM_CLIENT_E_ARGUMENT, "bad_argument", "no client");
    if (check_request(r, 1, err) != 0) return -1;
    char pq[256];
    if (gemm_request_query(r, "/v1/matmul", pq, sizeof pq, err) != 0) return -1;
    gemm_xfer x;
    gemm_xfer_init(&x, c, GEMM_HTTP_POST, pq);
    set_body(&x, r);
    x.want_binary = 1;
    x.dst = r->c;
    gemm_matrix_bytes(r->m, r->n, gemm_request_c_dtype(r), &x.dst_len);
    x.exp_m = r->m;
    x.exp_n = r->n;
    int rc = gemm_xfer_run(&x, t, err);
    if (rc == 0 && (x.status < 200 || x.status >= 300)) rc = gemm_xfer_server_error(&x, err);
    if (rc == 0) err->http_status = x.status;
    gemm_xfer_free(&x);
    return rc;
}

int gemm_client_multiply_batch(gemm_client *c, const gemm_request *r, uint64_t batch, int b_shared,
                               gemm_timing *t, gemm_client_error *err)
{
    LOCAL_ERR(err);
    gemm_client_err_clear(err);
    if (!c) return gemm_client_err(err, GEMM_CLIENT_E_ARGUMENT, "bad_argument", "no client");
    if (check_request(r, 1, err) != 0) return -1;
    if (batch < 1 || batch > GEMM_MAX_BATCH)
        return gemm_client_err(err, GEMM_CLIENT_E_ARGUMENT, "bad_argument",
                               "batch must be from 1 to %d (got %llu)", GEMM_MAX_BATCH, (unsigned long long)batch);
    size_t ab = 0, bb = 0, cb = 0, tot;
    gemm_matrix_bytes(r->m, r->k, r->dtype, &ab); /* each checked by check_request */
    gemm_matrix_bytes(r->k, r->n, r->dtype, &bb);
    gemm_matrix_bytes(r->m, r->n, gemm_request_c_dtype(r), &cb);
    if (!gemm_mul_size(ab, (size_t)batch, &ab) || (!b_shared && !gemm_mul_size(bb, (size_t)batch, &bb)) ||
        !gemm_mul_size(cb, (size_t)batch, &cb) || !gemm_add_size(ab, bb, &tot))
        return gemm_client_err(err, GEMM_CLIENT_E_ARGUMENT, "bad_argument", "the batch's sizes overflow");
    char pq[320];
    if (gemm_request_query(r, "/v1/matmul", pq, sizeof pq - 64, err) != 0) return -1;
    size_t used = strlen(pq);
    snprintf(pq + used, sizeof pq - used, "&batch=%llu%s", (unsigned long long)batch, b_shared ? "&b_shared=1" : "");
    gemm_xfer x;
    gemm_xfer_init(&x, c, GEMM_HTTP_POST, pq);
    x.part[0] = r->a;
    x.part_len[0] = ab;
    x.part[1] = r->b;
    x.part_len[1] = bb;
    x.want_binary = 1;
    x.dst = r->c;
    x.dst_len = cb;
    x.exp_b = batch;
    x.exp_m = r->m;
    x.exp_n = r->n;
    int rc = gemm_xfer_run(&x, t, err);
    if (rc == 0 && (x.status < 200 || x.status >= 300)) rc = gemm_xfer_server_error(&x, err);
    if (rc == 0) err->http_status = x.status;
    gemm_xfer_free(&x);
    return rc;
}

/* ---------------------------------------------------------------- jobs */

const char *gemm_client_job_state_name(gemm_client_job_state s)
{
    switch (s) {
    case GEMM_CLIENT_JOB_QUEUED: return "queued";
    case GEMM_CLIENT_JOB_RUNNING: return "running";
    case GEMM_CLIENT_JOB_DONE: return "done";
    case GEMM_CLIENT_JOB_FAILED: return "failed";
    case GEMM_CLIENT_JOB_CANCELLED: return "cancelled";
    default: return "unknown";
    }
}

static gemm_client_job_state state_from_name(const char *s)
{
    if (!s) return GEMM_CLIENT_JOB_UNKNOWN;
    static const char *const names[] = {"queued", "running", "done", "failed", "cancelled"};
    for (int i = 0; i < 5; i++)
        if (strcmp(s, names[i]) == 0) return (gemm_client_job_state)(i + 1);
    if (strcmp(s, "canceled") == 0) return GEMM_CLIENT_JOB_CANCELLED;
    return GEMM_CLIENT_JOB_UNKNOWN;
}

static double num_or(const cJSON *o, const char *key, double dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

static void copy_str(char *dst, size_t cap, const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsString(v)) snprintf(dst, cap, "%s", v->valuestring);
}

int gemm_client_job_submit(gemm_client *c, const gemm_request *r, char *id, size_t cap,
                           gemm_client_error *err)
{
    LOCAL_ERR(err);
    gemm_client_err_clear(err);
    if (!c || !id || cap == 0) return gemm_client_err(err, GEMM_CLIENT_E_ARGUMENT, "bad_argument", "no client or id buffer");
    if (check_request(r, 0, err) != 0) return -1;
    char pq[256];
    if (gemm_request_query(r, "/v1/jobs", pq, sizeof pq, err) != 0) return -1;
    gemm_xfer x;
    gemm_xfer_init(&x, c, GEMM_HTTP_POST, pq);
    set_body(&x, r);
    int rc = gemm_xfer_run(&x, NULL, err);
    if (rc == 0 && (x.status < 200 || x.status >= 300)) rc = gemm_xfer_server_error(&x, err);
    if (rc == 0) {
        id[0] = '\0';
        cJSON *j = x.text ? cJSON_ParseWithLength(x.text, x.text_len) : NULL;
        copy_str(id, cap, j, "id");
        if (!id[0] && j) copy_str(id, cap, cJSON_GetObjectItemCaseSensitive(j, "job"), "id");
        cJSON_Delete(j);
        if (!id[0] && x.location[0]) {
            const char *slash = strrchr(x.location, '/');
            snprintf(id, cap, "%s", slash ? slash + 1 : x.location);
        }
        if (!url_safe(id)) {
            rc = gemm_client_err(err, GEMM_CLIENT_E_PROTOCOL, "bad_response",
                                 "the server accepted the job but gave no usable id (Location \"%s\")",
                                 x.location);
        }
        err->http_status = x.status;
    }
    gemm_xfer_free(&x);
    return rc;
}

int gemm_client_job_status(gemm_client *c, const char *id, gemm_job_info *info, gemm_client_error *err)
{
    LOCAL_ERR(err);
    gemm_client_err_clear(err);
    if (!c || !info) return gemm_client_err(err, GEMM_CLIENT_E_ARGUMENT, "bad_argument", "no client or info");
    if (!url_safe(id)) return gemm_client_err(err, GEMM_CLIENT_E_ARGUMENT, "bad_argument", "bad job id");
    char pq[160];
    snprintf(pq, sizeof pq, "/v1/jobs/%s", id);
    gemm_xfer x;
    gemm_xfer_init(&x, c, GEMM_HTTP_GET, pq);
    int rc = gemm_xfer_run(&x, NULL, err);
    if (rc == 0 && (x.status < 200 || x.status >= 300)) rc = gemm_xfer_server_error(&x, err);
    if (rc == 0) {
        memset(info, 0, sizeof *info);
        snprintf(info->id, sizeof info->id, "%s", id);
        info->dtype = GEMM_DTYPE_INVALID;
        gemm_timing *t = &info->timing;
        t->recv_ms = t->decode_ms = t->queue_ms = t->h2d_ms = t->kernel_ms = t->d2h_ms = -1;
        t->encode_ms = t->total_ms = -1;
        t->client_transfer_ms = -1;
        cJSON *j = x.text ? cJSON_ParseWithLength(x.text, x.text_len) : NULL;
        if (!cJSON_IsObject(j)) {
            rc = gemm_client_err(err, GEMM_CLIENT_E_PROTOCOL, "bad_response", "job status is not a JSON object");
        } else {
            const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "status");
            if (!cJSON_IsString(st)) st = cJSON_GetObjectItemCaseSensitive(j, "state");
            info->state = state_from_name(cJSON_IsString(st) ? st->valuestring : NULL);
            const cJSON *shape = cJSON_GetObjectItemCaseSensitive(j, "shape");
            if (cJSON_IsArray(shape) && cJSON_GetArraySize(shape) == 2) {
                const cJSON *a0 = cJSON_GetArrayItem(shape, 0), *a1 = cJSON_GetArrayItem(shape, 1);
                if (cJSON_IsNumber(a0) && cJSON_IsNumber(a1) && a0->valuedouble >= 0 && a1->valuedouble >= 0) {
                    info->m = (uint64_t)a0->valuedouble;
                    info->n = (uint64_t)a1->valuedouble;
                }
            }
            const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype");
            if (cJSON_IsString(dt)) gemm_dtype_from_name(dt->valuestring, &info->dtype);
            const cJSON *tm = cJSON_GetObjectItemCaseSensitive(j, "timing");
            if (cJSON_IsObject(tm)) {
                t->recv_ms = num_or(tm, "recv", num_or(tm, "recv_ms", -1));
                t->decode_ms = num_or(tm, "decode", num_or(tm, "decode_ms", -1));
                t->encode_ms = num_or(tm, "encode", num_or(tm, "encode_ms", -1));
                t->queue_ms = num_or(tm, "queue", num_or(tm, "queue_ms", -1));
                t->h2d_ms = num_or(tm, "h2d", num_or(tm, "h2d_ms", -1));
                t->kernel_ms = num_or(tm, "kernel", num_or(tm, "kernel_ms", -1));
                t->d2h_ms = num_or(tm, "d2h", num_or(tm, "d2h_ms", -1));
                t->total_ms = num_or(tm, "total", num_or(tm, "total_ms", -1));
            }
            copy_str(t->kernel, sizeof t->kernel, j, "kernel");
            copy_str(t->math, sizeof t->math, j, "math");
            copy_str(t->device, sizeof t->device, j, "device");
            const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
            if (cJSON_IsObject(e)) {
                copy_str(info->error_code, sizeof info->error_code, e, "code");
                copy_str(info->error_message, sizeof info->error_message, e, "message");
            }
            if (info->state == GEMM_CLIENT_JOB_UNKNOWN)
                rc = gemm_client_err(err, GEMM_CLIENT_E_PROTOCOL, "bad_response",
                                     "job %s has an unknown status", id);
        }
        cJSON_Delete(j);
        err->http_status = x.status;
    }
    gemm_xfer_free(&x);
    return rc;
}

int gemm_client_job_wait(gemm_client *c, const char *id, long poll_ms, long timeout_ms,
                         gemm_job_info *info, gemm_client_error *err)
{
    LOCAL_ERR(err);
    double start = gemm_now_ms();
    long interval = poll_ms > 0 ? poll_ms : 20;
    for (;;) {
        if (gemm_client_job_status(c, id, info, err) != 0) return -1;
        if (info->state == GEMM_CLIENT_JOB_DONE) return 0;
        if (info->state == GEMM_CLIENT_JOB_FAILED || info->state == GEMM_CLIENT_JOB_CANCELLED) {
            gemm_client_err(err, GEMM_CLIENT_E_SERVER,
                            info->error_code[0] ? info->error_code : gemm_client_job_state_name(info->state),
                            "job %s %s%s%s", id, gemm_client_job_state_name(info->state),
                            info->error_message[0] ? ": " : "", info->error_message);
            return -1;
        }
        double left = timeout_ms > 0 ? timeout_ms - (gemm_now_ms() - start) : 1e18;
        if (left <= 0)
            return gemm_client_err(err, GEMM_CLIENT_E_TIMEOUT, "timeout", "job %s still %s after %ld ms", id,
                                   gemm_client_job_state_name(info->state), timeout_ms);
        long ms = interval < left ? interval : (long)left;
        while (ms > 0) {
            long step = ms < 50 ? ms : 50;
            struct timespec ts = {step / 1000, (step % 1000) * 1000000L};
            nanosleep(&ts, NULL);
            ms -= step;
            if (c->o.progress && c->o.progress(c->o.progress_ctx, 0, 0, 0, 0))
                return gemm_client_err(err, GEMM_CLIENT_E_ABORTED, "aborted", "aborted while waiting for job %s", id);
        }
        if (interval < 500) interval = interval * 2 > 500 ? 500 : interval * 2;
    }
}

int gemm_client_job_fetch(gemm_client *c, const char *id, gemm_dtype dtype, uint64_t m, uint64_t n,
                          void *c_out, gemm_timing *t, gemm_client_error *err)
{
    LOCAL_ERR(err);
    gemm_client_err_clear(err);
    size_t bytes;
    if (!c || !c_out || m == 0 || n == 0 || !gemm_matrix_bytes(m, n, dtype, &bytes))
        return gemm_client_err(err, GEMM_CLIENT_E_ARGUMENT, "bad_argument", "bad output buffer or shape");
    if (!url_safe(id)) return gemm_client_err(err, GEMM_CLIENT_E_ARGUMENT, "bad_argument", "bad job id");
    char pq[176];
    snprintf(pq, sizeof pq, "/v1/jobs/%s/result", id);
    gemm_xfer x;
    gemm_xfer_init(&x, c, GEMM_HTTP_GET, pq);
    x.want_binary = 1;
    x.dst = c_out;
    x.dst_len = bytes;
    x.exp_m = m;
    x.exp_n = n;
    int rc = gemm_xfer_run(&x, t, err);
    if (rc == 0 && (x.status < 200 || x.status >= 300)) rc = gemm_xfer_server_error(&x, err);
    if (rc == 0) err->http_status = x.status;
    gemm_xfer_free(&x);
    return rc;
}

int gemm_client_job_delete(gemm_client *c, const char *id, gemm_client_error *err)
{
    LOCAL_ERR(err);
    gemm_client_err_clear(err);
    if (!c) return gemm_client_err(err, GEMM_CLIENT_E_ARGUMENT, "bad_argument", "no client");
    if (!url_safe(id)) return gemm_client_err(err, GEMM_CLIENT_E_ARGUMENT, "bad_argument", "bad job id");
    char pq[160];
    snprintf(pq, sizeof pq, "/v1/jobs/%s", id);
    gemm_xfer x;
    gemm_xfer_init(&x, c, GEMM_HTTP_DELETE, pq);
    int rc = gemm_xfer_run(&x, NULL, err);
    if (rc == 0 && (x.status < 200 || x.status >= 300)) rc = gemm_xfer_server_error(&x, err);
    if (rc == 0) err->http_status = x.status;
    gemm_xfer_free(&x);
    return rc;
}

int gemm_client_get(gemm_client *c, const char *path, char **body, int *status, gemm_client_error *err)
{
    LOCAL_ERR(err);
    gemm_client_err_clear(err);
    if (!c || !path || path[0] != '/' || !body)
        return gemm_client_err(err, GEMM_CLIENT_E_ARGUMENT, "bad_argument", "path must start with '/'");
    *body = NULL;
    gemm_xfer x;
    gemm_xfer_init(&x, c, GEMM_HTTP_GET, path);
    x.text_limit = 64u << 20;
    int rc = gemm_xfer_run(&x, NULL, err);
    if (rc == 0) {
        if (status) *status = x.status;
        err->http_status = x.status;
        if (x.text) {
            *body = x.text;
            x.text = NULL;
        } else {
            *body = calloc(1, 1);
            if (!*body) rc = gemm_client_err(err, GEMM_CLIENT_E_NOMEM, "out_of_memory", "out of memory");
        }
    }
    gemm_xfer_free(&x);
    return rc;
}
