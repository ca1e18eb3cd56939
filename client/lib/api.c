/*
 * api.c - the calls of libgemm: a product (or a batch of them), asynchronous jobs (submit,
 * status, wait, fetch, delete) and plain GETs, each one gemm_xfer.
 */
#include "client_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gemm_url_safe(const char *s)
{
    return s && *s && strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == strlen(s);
}

/* Checks r before anything is sent; sz receives the bytes of A, B and C. */
static int check_request(const gemm_request *r, int need_c, size_t sz[3], gemm_client_error *err)
{
    size_t tot;
    if (!r) return GEMM_ARG_ERR(err, "no request");
    if (gemm_dtype_size(r->dtype) == 0) return GEMM_ARG_ERR(err, "unknown dtype %d", (int)r->dtype);
    if (r->m == 0 || r->k == 0 || r->n == 0)
        return GEMM_ARG_ERR(err, "every dimension must be >= 1 (m=%llu k=%llu n=%llu)", (unsigned long long)r->m,
                            (unsigned long long)r->k, (unsigned long long)r->n);
    if (!gemm_matrix_bytes(r->m, r->k, r->dtype, &sz[0]) || !gemm_matrix_bytes(r->k, r->n, r->dtype, &sz[1]) ||
        !gemm_matrix_bytes(r->m, r->n, gemm_request_c_dtype(r), &sz[2]) || !gemm_add_size(sz[0], sz[1], &tot))
        return GEMM_ARG_ERR(err, "the matrices' sizes overflow");
    if (!r->a || !r->b || (need_c && !r->c)) return GEMM_ARG_ERR(err, "a NULL matrix buffer");
    if (r->kernel && !gemm_url_safe(r->kernel))
        return GEMM_ARG_ERR(err, "kernel name \"%s\" has characters other than [A-Za-z0-9._-]", r->kernel);
    if (r->math < GEMM_MATH_DEFAULT || r->math >= GEMM_MATH_COUNT)
        return GEMM_ARG_ERR(err, "unknown math mode %d", (int)r->math);
    if (r->tile < 0) return GEMM_ARG_ERR(err, "tile must be >= 0");
    return 0;
}

int gemm_request_query(const gemm_request *r, const char *path, char *buf, size_t cap,
                       gemm_client_error *err)
{
    char tile[24] = "";
    int kernel = r->kernel && *r->kernel, math = r->math != GEMM_MATH_DEFAULT, half = gemm_dtype_is_half(r->dtype);
    if (r->tile > 0) snprintf(tile, sizeof tile, "&tile=%d", r->tile);
    int n = snprintf(buf, cap, "%s?m=%llu&k=%llu&n=%llu&dtype=%s%s%s%s%s%s%s%s", path, (unsigned long long)r->m,
                     (unsigned long long)r->k, (unsigned long long)r->n, gemm_dtype_name(r->dtype),
                     kernel ? "&kernel=" : "", kernel ? r->kernel : "", math ? "&math=" : "",
                     math ? gemm_math_name(r->math) : "", tile, half ? "&out_dtype=" : "",
                     half ? gemm_dtype_name(gemm_request_c_dtype(r)) : "");
    if (n < 0 || (size_t)n >= cap) return GEMM_ARG_ERR(err, "request URL too long");
    return 0;
}

/* POST /v1/matmul for r, or for a batch of `batch` products (?batch=; 0: one product). */
static int product(gemm_client *c, const gemm_request *r, uint64_t batch, int b_shared, gemm_timing *t,
                   gemm_client_error *err)
{
    size_t sz[3], tot;
    char pq[320];
    if (!c) return GEMM_ARG_ERR(err, "no client");
    if (check_request(r, 1, sz, err) != 0) return -1;
    if (batch > GEMM_MAX_BATCH)
        return GEMM_ARG_ERR(err, "batch must be from 1 to %d (got %llu)", GEMM_MAX_BATCH, (unsigned long long)batch);
    if (batch && (!gemm_mul_size(sz[0], (size_t)batch, &sz[0]) ||
                  (!b_shared && !gemm_mul_size(sz[1], (size_t)batch, &sz[1])) ||
                  !gemm_mul_size(sz[2], (size_t)batch, &sz[2]) || !gemm_add_size(sz[0], sz[1], &tot)))
        return GEMM_ARG_ERR(err, "the batch's sizes overflow");
    if (gemm_request_query(r, "/v1/matmul", pq, sizeof pq - 64, err) != 0) return -1;
    if (batch)
        snprintf(pq + strlen(pq), 64, "&batch=%llu%s", (unsigned long long)batch, b_shared ? "&b_shared=1" : "");
    gemm_xfer x = {.cl = c, .method = GEMM_HTTP_POST, .path_query = pq, .part = {r->a, r->b},
                   .part_len = {sz[0], sz[1]}, .dst = r->c, .dst_len = sz[2], .exp_b = batch, .exp_m = r->m,
                   .exp_n = r->n};
    return gemm_xfer_call(&x, NULL, t, err);
}

int gemm_client_multiply(gemm_client *c, const gemm_request *r, gemm_timing *t, gemm_client_error *err)
{
    GEMM_ERR_BEGIN(err);
    return product(c, r, 0, 0, t, err);
}

int gemm_client_multiply_batch(gemm_client *c, const gemm_request *r, uint64_t batch, int b_shared,
                               gemm_timing *t, gemm_client_error *err)
{
    GEMM_ERR_BEGIN(err);
    if (batch < 1) return GEMM_ARG_ERR(err, "batch must be from 1 to %d (got 0)", GEMM_MAX_BATCH);
    return product(c, r, batch, b_shared, t, err);
}

/* ---------------------------------------------------------------- jobs */

static const char *const state_names[] = {"unknown", "queued", "running", "done", "failed", "cancelled"};

const char *gemm_client_job_state_name(gemm_client_job_state s)
{
    return s >= GEMM_CLIENT_JOB_QUEUED && s <= GEMM_CLIENT_JOB_CANCELLED ? state_names[s] : "unknown";
}

static gemm_client_job_state state_from_name(const char *s)
{
    for (int i = GEMM_CLIENT_JOB_QUEUED; s && i <= GEMM_CLIENT_JOB_CANCELLED; i++)
        if (strcmp(s, state_names[i]) == 0) return (gemm_client_job_state)i;
    return GEMM_CLIENT_JOB_UNKNOWN;
}

static void copy_str(char *dst, size_t cap, const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsString(v)) snprintf(dst, cap, "%s", v->valuestring);
}

int gemm_client_job_submit(gemm_client *c, const gemm_request *r, char *id, size_t cap,
                           gemm_client_error *err)
{
    GEMM_ERR_BEGIN(err);
    size_t sz[3];
    char pq[256];
    if (!c || !id || cap == 0) return GEMM_ARG_ERR(err, "no client or id buffer");
    if (check_request(r, 0, sz, err) != 0 || gemm_request_query(r, "/v1/jobs", pq, sizeof pq, err) != 0) return -1;
    gemm_xfer x = {.cl = c, .method = GEMM_HTTP_POST, .path_query = pq, .part = {r->a, r->b},
                   .part_len = {sz[0], sz[1]}};
    cJSON *j = NULL;
    int rc = gemm_xfer_call(&x, &j, NULL, err);
    if (rc == 0) {
        id[0] = '\0';
        copy_str(id, cap, j, "id");
        if (!id[0] && x.h.location[0]) {
            const char *slash = strrchr(x.h.location, '/');
            snprintf(id, cap, "%s", slash ? slash + 1 : x.h.location);
        }
        if (!gemm_url_safe(id))
            rc = gemm_client_err(err, GEMM_CLIENT_E_PROTOCOL, "bad_response",
                                 "the server accepted the job but gave no usable id (Location \"%s\")",
                                 x.h.location);
    }
    cJSON_Delete(j);
    return rc;
}

/* The fields of a job's status into *info. 0, or -1 when it is not one. */
static int read_status(const cJSON *j, const char *id, gemm_job_info *info, gemm_client_error *err)
{
    *info = (gemm_job_info){.dtype = GEMM_DTYPE_INVALID};
    snprintf(info->id, sizeof info->id, "%s", id);
    gemm_timing *t = &info->timing;
    gemm_timing_unset(t);
    if (!cJSON_IsObject(j))
        return gemm_client_err(err, GEMM_CLIENT_E_PROTOCOL, "bad_response", "job status is not a JSON object");
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "state");
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
    for (int i = 0; cJSON_IsObject(tm) && i < GEMM_STAGES; i++) { /* "queue_ms", ... */
        char key[16];
        snprintf(key, sizeof key, "%s_ms", gemm_stage_names[i]);
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(tm, key);
        *gemm_timing_stage(t, i) = cJSON_IsNumber(v) ? v->valuedouble : -1;
    }
    copy_str(t->kernel, sizeof t->kernel, j, "kernel");
    copy_str(t->math, sizeof t->math, j, "math");
    copy_str(t->device, sizeof t->device, j, "device");
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    copy_str(info->error_code, sizeof info->error_code, e, "code");
    copy_str(info->error_message, sizeof info->error_message, e, "message");
    if (info->state == GEMM_CLIENT_JOB_UNKNOWN)
        return gemm_client_err(err, GEMM_CLIENT_E_PROTOCOL, "bad_response", "job %s has an unknown status", id);
    return 0;
}

/* A request about job id: path_fmt has one %s for it. */
static int job_call(gemm_client *c, gemm_http_method m, const char *path_fmt, const char *id, gemm_xfer *x,
                    cJSON **json, gemm_timing *t, gemm_client_error *err)
{
    char pq[176];
    if (!c) return GEMM_ARG_ERR(err, "no client");
    if (!gemm_url_safe(id)) return GEMM_ARG_ERR(err, "bad job id");
    snprintf(pq, sizeof pq, path_fmt, id);
    x->cl = c;
    x->method = m;
    x->path_query = pq;
    return gemm_xfer_call(x, json, t, err);
}

int gemm_client_job_status(gemm_client *c, const char *id, gemm_job_info *info, gemm_client_error *err)
{
    GEMM_ERR_BEGIN(err);
    gemm_xfer x = {0};
    cJSON *j = NULL;
    if (!c || !info) return GEMM_ARG_ERR(err, "no client or info");
    int rc = job_call(c, GEMM_HTTP_GET, "/v1/jobs/%s", id, &x, &j, NULL, err);
    if (rc == 0) rc = read_status(j, id, info, err);
    cJSON_Delete(j);
    return rc;
}

int gemm_client_job_wait(gemm_client *c, const char *id, long poll_ms, long timeout_ms,
                         gemm_job_info *info, gemm_client_error *err)
{
    GEMM_ERR_BEGIN(err);
    double start = gemm_now_ms();
    long interval = poll_ms > 0 ? poll_ms : 20;
    for (;;) {
        if (gemm_client_job_status(c, id, info, err) != 0) return -1;
        const char *state = gemm_client_job_state_name(info->state);
        if (info->state == GEMM_CLIENT_JOB_DONE) return 0;
        if (info->state == GEMM_CLIENT_JOB_FAILED || info->state == GEMM_CLIENT_JOB_CANCELLED)
            return gemm_client_err(err, GEMM_CLIENT_E_SERVER, info->error_code[0] ? info->error_code : state,
                                   "job %s %s%s%s", id, state, info->error_message[0] ? ": " : "",
                                   info->error_message);
        double left = timeout_ms > 0 ? timeout_ms - (gemm_now_ms() - start) : 1e18;
        if (left <= 0)
            return gemm_client_err(err, GEMM_CLIENT_E_TIMEOUT, "timeout", "job %s still %s after %ld ms", id, state,
                                   timeout_ms);
        if (gemm_client_pause(c, interval < left ? interval : (long)left) != 0)
            return gemm_client_err(err, GEMM_CLIENT_E_ABORTED, "aborted", "aborted while waiting for job %s", id);
        if (interval < 500) interval = interval * 2 > 500 ? 500 : interval * 2;
    }
}

int gemm_client_job_fetch(gemm_client *c, const char *id, gemm_dtype dtype, uint64_t m, uint64_t n,
                          void *c_out, gemm_timing *t, gemm_client_error *err)
{
    GEMM_ERR_BEGIN(err);
    gemm_xfer x = {.dst = c_out, .exp_m = m, .exp_n = n};
    if (!c || !c_out || m == 0 || n == 0 || !gemm_matrix_bytes(m, n, dtype, &x.dst_len))
        return GEMM_ARG_ERR(err, "bad output buffer or shape");
    return job_call(c, GEMM_HTTP_GET, "/v1/jobs/%s/result", id, &x, NULL, t, err);
}

int gemm_client_job_delete(gemm_client *c, const char *id, gemm_client_error *err)
{
    GEMM_ERR_BEGIN(err);
    gemm_xfer x = {0};
    return job_call(c, GEMM_HTTP_DELETE, "/v1/jobs/%s", id, &x, NULL, NULL, err);
}

int gemm_client_get(gemm_client *c, const char *path, char **body, int *status, gemm_client_error *err)
{
    GEMM_ERR_BEGIN(err);
    if (!c || !path || path[0] != '/' || !body) return GEMM_ARG_ERR(err, "path must start with '/'");
    gemm_xfer x = {.cl = c, .method = GEMM_HTTP_GET, .path_query = path, .text_limit = 64u << 20};
    int rc = gemm_xfer_run(&x, NULL, err);
    *body = NULL;
    if (rc == 0) {
        if (status) *status = x.status;
        err->http_status = x.status;
        *body = x.text.data ? x.text.data : calloc(1, 1);
        x.text.data = NULL;
        if (!*body) rc = gemm_client_err(err, GEMM_CLIENT_E_NOMEM, "out_of_memory", "out of memory");
    }
    gemm_buf_free(&x.text);
    return rc;
}
