/*
 * http.c - the client handle and one HTTP exchange over libcurl: the body streamed from the
 * caller's buffers, a binary answer written straight into the caller's C once its headers
 * were checked, other answers kept as text, 503 retried after Retry-After.
 */
#define _GNU_SOURCE /* asprintf */
#include "client_internal.h"
#include "gemm_util.h"
#include "options.h" /* gemm_parse_u64 */

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* ---------------------------------------------------------------- errors */

const char *gemm_client_error_kind_name(gemm_client_error_kind k)
{
    static const char *const names[] = {"ok", "server", "connect", "timeout", "aborted", "protocol", "argument",
                                        "nomem"};
    return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "unknown";
}

int gemm_client_err(gemm_client_error *err, gemm_client_error_kind kind, const char *code,
                    const char *fmt, ...)
{
    if (!err) return -1;
    err->kind = kind;
    snprintf(err->code, sizeof err->code, "%s", code);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---------------------------------------------------------------- client */

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc = CURLE_OK;

static void global_init(void) { global_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

void gemm_client_options_init(gemm_client_options *o)
{
    *o = (gemm_client_options){.connect_timeout_ms = 10000, .timeout_ms = 0, .max_retries = 3,
                               .max_retry_wait_ms = 30000, .default_retry_wait_ms = 1000};
}

gemm_client *gemm_client_new(const char *url, const gemm_client_options *o, gemm_client_error *err)
{
    if (err) memset(err, 0, sizeof *err);
    if (!url || !*url) {
        GEMM_ARG_ERR(err, "no server URL given");
        return NULL;
    }
    /* host:port and [v6]:port mean http://, as in the Python client */
    const char *scheme = strstr(url, "://") ? "" : "http://";
    if (!*scheme && strncasecmp(url, "http://", 7) != 0 && strncasecmp(url, "https://", 8) != 0) {
        GEMM_ARG_ERR(err, "server URL \"%s\": expected http://host:port, https://host:port or host:port", url);
        return NULL;
    }
    pthread_once(&global_once, global_init);
    if (global_rc != CURLE_OK) {
        gemm_client_err(err, GEMM_CLIENT_E_CONNECT, "curl_init", "curl_global_init failed: %s",
                        curl_easy_strerror(global_rc));
        return NULL;
    }
    gemm_client *c = calloc(1, sizeof *c);
    if (!c) goto nomem;
    if (o) c->o = *o;
    else gemm_client_options_init(&c->o);
    /* the strings are copied: the options point to the copies */
    c->o.token = c->o.ca_file = NULL;
    if (o && o->ca_file && *o->ca_file && !(c->o.ca_file = c->ca_file = strdup(o->ca_file))) goto nomem;
    size_t n = strlen(url);
    while (n > 0 && url[n - 1] == '/') n--;
    if (asprintf(&c->base, "%s%.*s", scheme, (int)n, url) < 0) {
        c->base = NULL;
        goto nomem;
    }
    if (o && o->token && *o->token) {
        if (asprintf(&c->auth_header, "Authorization: Bearer %s", o->token) < 0) {
            c->auth_header = NULL;
            goto nomem;
        }
        c->o.token = c->auth_header + strlen("Authorization: Bearer ");
    }
    if (!(c->curl = curl_easy_init())) goto nomem;
    return c;
nomem:
    gemm_client_free(c);
    gemm_client_err(err, GEMM_CLIENT_E_NOMEM, "out_of_memory", "out of memory creating the client");
    return NULL;
}

void gemm_client_free(gemm_client *c)
{
    if (!c) return;
    if (c->curl) curl_easy_cleanup(c->curl);
    free(c->base);
    free(c->ca_file);
    if (c->auth_header) explicit_bzero(c->auth_header, strlen(c->auth_header)); /* a secret: not left in freed memory */
    free(c->auth_header);
    free(c);
}

/* ---------------------------------------------------------------- one exchange */

/* Forgets the headers of an earlier status line ("100 Continue", a retried 503). */
static void reset_head(gemm_xfer *x)
{
    memset(&x->h, 0, sizeof x->h);
    x->h.retry_after_ms = -1;
}

static void reset_answer(gemm_xfer *x)
{
    x->upart = x->status = 0;
    x->uoff = x->got = x->text.len = 0;
    reset_head(x);
    if (x->text.data) x->text.data[0] = '\0';
    x->header_checked = x->protocol_error = 0; /* protocol_msg is read only when protocol_error is set */
}

static size_t read_cb(char *buf, size_t size, size_t nitems, void *ud)
{
    gemm_xfer *x = ud;
    size_t room = size * nitems, done = 0;
    while (room > 0 && x->upart < 2) {
        size_t left = x->part_len[x->upart] - x->uoff;
        if (left == 0) {
            x->upart++;
            x->uoff = 0;
            continue;
        }
        size_t take = left < room ? left : room;
        memcpy(buf + done, x->part[x->upart] + x->uoff, take);
        x->uoff += take;
        done += take;
        room -= take;
    }
    return done;
}

static int seek_cb(void *ud, curl_off_t offset, int origin)
{
    gemm_xfer *x = ud;
    if (origin != SEEK_SET || offset < 0) return CURL_SEEKFUNC_CANTSEEK;
    size_t off = (size_t)offset;
    for (int i = 0; i < 2; off -= x->part_len[i++])
        if (off <= x->part_len[i]) {
            x->upart = i;
            x->uoff = off;
            return CURL_SEEKFUNC_OK;
        }
    return CURL_SEEKFUNC_FAIL;
}

static void copy_value(char *dst, size_t cap, const char *v, size_t len)
{
    while (len > 0 && memchr("\r\n \t", v[len - 1], 4)) len--;
    while (len > 0 && (*v == ' ' || *v == '\t')) v++, len--;
    snprintf(dst, cap, "%.*s", (int)len, v);
}

static size_t header_cb(char *buf, size_t size, size_t nitems, void *ud)
{
    gemm_xfer *x = ud;
    size_t len = size * nitems;
    if (len >= 5 && strncmp(buf, "HTTP/", 5) == 0) {
        const char *sp = memchr(buf, ' ', len);
        x->status = sp ? atoi(sp + 1) : 0;
        reset_head(x);
        return len;
    }
    const char *colon = memchr(buf, ':', len);
    if (!colon) return len;
    size_t nlen = (size_t)(colon - buf);
    const char *v = colon + 1;
    size_t vlen = len - nlen - 1;
    char tmp[512];
#define IS(name) (nlen == sizeof(name) - 1 && strncasecmp(buf, name, nlen) == 0)
    if (IS("X-Gemm-Shape")) copy_value(x->h.shape, sizeof x->h.shape, v, vlen);
    else if (IS("X-Gemm-Kernel")) copy_value(x->h.kernel, sizeof x->h.kernel, v, vlen);
    else if (IS("X-Gemm-Math")) copy_value(x->h.math, sizeof x->h.math, v, vlen);
    else if (IS("X-Gemm-Device")) copy_value(x->h.device, sizeof x->h.device, v, vlen);
    else if (IS("Location")) copy_value(x->h.location, sizeof x->h.location, v, vlen);
    else if (IS("Content-Type")) copy_value(x->h.content_type, sizeof x->h.content_type, v, vlen);
    else if (IS("Server-Timing")) {
        /* several Server-Timing headers are allowed: join them */
        size_t have = strlen(x->h.server_timing);
        if (have > 0 && have + 2 < sizeof x->h.server_timing) {
            x->h.server_timing[have++] = ',';
            x->h.server_timing[have] = '\0';
        }
        copy_value(x->h.server_timing + have, sizeof x->h.server_timing - have, v, vlen);
    } else if (IS("Retry-After")) {
        copy_value(tmp, sizeof tmp, v, vlen);
        x->h.retry_after_ms = gemm_client_parse_retry_after(tmp, (double)time(NULL));
    } else if (IS("Content-Length")) {
        copy_value(tmp, sizeof tmp, v, vlen);
        x->h.have_length = gemm_parse_u64(tmp, &x->h.content_length) == 0;
    }
#undef IS
    return len;
}

static int is_success(int st) { return st >= 200 && st < 300; }

/* The answer does not match the request: what is wrong goes into x->protocol_msg.
 * Returns 0, which makes curl stop the transfer. */
__attribute__((format(printf, 2, 3))) static size_t protocol_error(gemm_xfer *x, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->protocol_msg, sizeof x->protocol_msg, fmt, ap);
    va_end(ap);
    x->protocol_error = 1;
    return 0;
}

/* Checks the headers of a binary answer once, before its first byte is stored: 0 (stop),
 * or 1 (go on). */
static int binary_headers_ok(gemm_xfer *x)
{
    const char *s = x->h.shape;
    unsigned long long em = x->exp_m, en = x->exp_n;
    uint64_t r, c;
    char *end = NULL;
    x->header_checked = 1;
    if (x->h.content_type[0] && strncasecmp(x->h.content_type, "application/octet-stream", 24) != 0)
        return protocol_error(x, "expected application/octet-stream, the server sent %s", x->h.content_type);
    if (*s && x->exp_b) { /* "b,m,n": the batch, then the rest as a 2-D shape */
        unsigned long long b = strtoull(s, &end, 10);
        if (end == s || *end != ',' || gemm_client_parse_shape_header(end + 1, &r, &c) != 0 || b != x->exp_b ||
            r != em || c != en)
            return protocol_error(x, "the answer's X-Gemm-Shape is \"%s\" but %llu,%llu,%llu was expected", s,
                                  (unsigned long long)x->exp_b, em, en);
    } else if (*s && gemm_client_parse_shape_header(s, &r, &c) != 0) {
        return protocol_error(x, "unreadable X-Gemm-Shape \"%s\"", s);
    } else if (*s && (r != em || c != en)) {
        return protocol_error(x, "the answer is %llux%llu but %llux%llu was expected", (unsigned long long)r,
                              (unsigned long long)c, em, en);
    }
    if (x->h.have_length && x->h.content_length != x->dst_len)
        return protocol_error(x, "the answer has %llu bytes but C takes %zu",
                              (unsigned long long)x->h.content_length, x->dst_len);
    return 1;
}

static size_t write_cb(char *buf, size_t size, size_t nitems, void *ud)
{
    gemm_xfer *x = ud;
    size_t len = size * nitems;
    if (x->dst && is_success(x->status)) {
        if (!x->header_checked && !binary_headers_ok(x)) return 0;
        if (len > x->dst_len - x->got)
            return protocol_error(x, "the answer is longer than C (%zu bytes)", x->dst_len);
        memcpy((unsigned char *)x->dst + x->got, buf, len);
        x->got += len;
        return len;
    }
    size_t limit = x->text_limit ? x->text_limit : 1u << 20;
    size_t room = limit > x->text.len + 1 ? limit - x->text.len - 1 : 0;
    gemm_buf_append(&x->text, buf, len < room ? len : room); /* keep what fits, drop the rest */
    return x->text.failed ? 0 : size * nitems;
}

static int xferinfo_cb(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
    gemm_xfer *x = ud;
    const gemm_client_options *o = &x->cl->o;
    return o->progress(o->progress_ctx, (uint64_t)ulnow, (uint64_t)ultotal, (uint64_t)dlnow, (uint64_t)dltotal) != 0;
}

static int setup(gemm_xfer *x, struct curl_slist **hdrs, char *url, size_t urlcap)
{
    gemm_client *c = x->cl;
    CURL *h = c->curl;
    curl_easy_reset(h); /* keeps the open connection */
    snprintf(url, urlcap, "%s%s", c->base, x->path_query);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, c->errbuf);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, c->o.connect_timeout_ms > 0 ? c->o.connect_timeout_ms : 10000L);
    if (c->o.timeout_ms > 0) curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, c->o.timeout_ms);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 512L * 1024);
    curl_easy_setopt(h, CURLOPT_UPLOAD_BUFFERSIZE, 1024L * 1024);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, header_cb);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, write_cb);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "libgemm/" GEMM_CLIENT_VERSION);
    if (c->o.verbose) curl_easy_setopt(h, CURLOPT_VERBOSE, 1L);
    if (c->o.ca_file) curl_easy_setopt(h, CURLOPT_CAINFO, c->o.ca_file);
    if (c->o.progress) {
        curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, xferinfo_cb);
        curl_easy_setopt(h, CURLOPT_XFERINFODATA, x);
    }
    struct curl_slist *l = NULL, *t;
#define ADD(s) do { t = curl_slist_append(l, s); if (!t) goto nomem; l = t; } while (0)
    ADD(x->dst ? "Accept: application/octet-stream" : "Accept: application/json, */*;q=0.5");
    if (c->auth_header) ADD(c->auth_header);
    if (x->method == GEMM_HTTP_DELETE || x->method == GEMM_HTTP_PUT) /* else GET, after the reset, or POST */
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, x->method == GEMM_HTTP_PUT ? "PUT" : "DELETE");
    if (x->method == GEMM_HTTP_POST || x->method == GEMM_HTTP_PUT) { /* the body from x's parts */
        ADD("Content-Type: application/octet-stream");
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(x->part_len[0] + x->part_len[1]));
        curl_easy_setopt(h, CURLOPT_READFUNCTION, read_cb);
        curl_easy_setopt(h, CURLOPT_READDATA, x);
        curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, seek_cb);
        curl_easy_setopt(h, CURLOPT_SEEKDATA, x);
    }
#undef ADD
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, l);
    *hdrs = l;
    return 0;
nomem:
    curl_slist_free_all(l);
    return -1;
}

int gemm_client_pause(gemm_client *c, long ms)
{
    while (ms > 0) {
        long step = ms < 50 ? ms : 50;
        struct timespec ts = {step / 1000, (step % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        ms -= step;
        if (c->o.progress && c->o.progress(c->o.progress_ctx, 0, 0, 0, 0)) return -1;
    }
    return 0;
}

static void fill_timing(gemm_xfer *x, gemm_timing *t, int retries)
{
    CURL *h = x->cl->curl;
    curl_off_t us = 0;
    gemm_timing_unset(t);
    if (curl_easy_getinfo(h, CURLINFO_TOTAL_TIME_T, &us) == CURLE_OK) t->client_total_ms = us / 1000.0;
    if (curl_easy_getinfo(h, CURLINFO_CONNECT_TIME_T, &us) == CURLE_OK) t->client_connect_ms = us / 1000.0;
    if (curl_easy_getinfo(h, CURLINFO_STARTTRANSFER_TIME_T, &us) == CURLE_OK)
        t->client_first_byte_ms = us / 1000.0;
    if (curl_easy_getinfo(h, CURLINFO_SIZE_UPLOAD_T, &us) == CURLE_OK) t->bytes_sent = (uint64_t)us;
    if (curl_easy_getinfo(h, CURLINFO_SIZE_DOWNLOAD_T, &us) == CURLE_OK) t->bytes_received = (uint64_t)us;
    gemm_client_parse_server_timing(x->h.server_timing, t);
    t->client_transfer_ms = t->total_ms >= 0 ? t->client_total_ms - t->total_ms : -1;
    snprintf(t->kernel, sizeof t->kernel, "%s", x->h.kernel);
    snprintf(t->math, sizeof t->math, "%s", x->h.math);
    snprintf(t->device, sizeof t->device, "%s", x->h.device);
    t->retries = retries;
}

static int transport_error(gemm_xfer *x, CURLcode rc, gemm_client_error *err)
{
    gemm_client *c = x->cl;
    const char *detail = c->errbuf[0] ? c->errbuf : curl_easy_strerror(rc);
    err->curl_code = (int)rc;
    err->http_status = x->status;
    if (x->protocol_error)
        return gemm_client_err(err, GEMM_CLIENT_E_PROTOCOL, "bad_response", "%s (%s%s)",
                               x->protocol_msg, c->base, x->path_query);
    if (x->text.failed)
        return gemm_client_err(err, GEMM_CLIENT_E_NOMEM, "out_of_memory", "out of memory reading the answer");
    switch (rc) {
    case CURLE_OPERATION_TIMEDOUT:
        return gemm_client_err(err, GEMM_CLIENT_E_TIMEOUT, "timeout", "%s: %s", c->base, detail);
    case CURLE_ABORTED_BY_CALLBACK:
        return gemm_client_err(err, GEMM_CLIENT_E_ABORTED, "aborted", "transfer aborted");
    case CURLE_URL_MALFORMAT:
    case CURLE_UNSUPPORTED_PROTOCOL:
        return gemm_client_err(err, GEMM_CLIENT_E_ARGUMENT, "bad_url", "%s: %s", c->base, detail);
    default:
        return gemm_client_err(err, GEMM_CLIENT_E_CONNECT, "connect_failed", "%s: %s", c->base, detail);
    }
}

int gemm_xfer_run(gemm_xfer *x, gemm_timing *t, gemm_client_error *err)
{
    gemm_client *c = x->cl;
    char url[2048];
    int retries = 0;
    memset(err, 0, sizeof *err);
    if (strlen(c->base) + strlen(x->path_query) >= sizeof url)
        return gemm_client_err(err, GEMM_CLIENT_E_ARGUMENT, "bad_url", "URL too long");
    for (;;) {
        struct curl_slist *hdrs = NULL;
        reset_answer(x);
        c->errbuf[0] = '\0';
        if (setup(x, &hdrs, url, sizeof url) != 0)
            return gemm_client_err(err, GEMM_CLIENT_E_NOMEM, "out_of_memory", "out of memory building headers");
        CURLcode rc = curl_easy_perform(c->curl);
        curl_slist_free_all(hdrs);
        curl_easy_setopt(c->curl, CURLOPT_HTTPHEADER, NULL);
        if (t) fill_timing(x, t, retries);
        err->retries = retries;
        /* A server that answers 503 before reading the body may close the connection while we
         * still send: curl then reports a send error although a complete answer arrived. Treat
         * that as the 503 it is. */
        if (rc != CURLE_OK && !(x->status == 503 && (rc == CURLE_SEND_ERROR || rc == CURLE_RECV_ERROR)))
            return transport_error(x, rc, err);
        if (x->dst && is_success(x->status) && x->got != x->dst_len) {
            err->http_status = x->status;
            return gemm_client_err(err, GEMM_CLIENT_E_PROTOCOL, "bad_response",
                                   "the answer had %zu bytes, C takes %zu", x->got, x->dst_len);
        }
        if (x->status == 503 && retries < c->o.max_retries) {
            long ms = x->h.retry_after_ms >= 0 ? x->h.retry_after_ms
                                             : (c->o.default_retry_wait_ms > 0 ? c->o.default_retry_wait_ms : 1000);
            long cap = c->o.max_retry_wait_ms > 0 ? c->o.max_retry_wait_ms : 30000;
            if (ms > cap) ms = cap;
            retries++;
            if (gemm_client_pause(c, ms) != 0) {
                err->retries = retries;
                return gemm_client_err(err, GEMM_CLIENT_E_ABORTED, "aborted", "aborted while waiting to retry");
            }
            continue;
        }
        return 0;
    }
}

/* A non-2xx answer into *err: the JSON error's code and message. Returns -1. */
static int server_error(const gemm_xfer *x, gemm_client_error *err)
{
    err->kind = GEMM_CLIENT_E_SERVER;
    err->http_status = x->status;
    err->curl_code = 0;
    snprintf(err->code, sizeof err->code, "http_%d", x->status);
    snprintf(err->message, sizeof err->message, "HTTP %d from %s%s", x->status, x->cl->base, x->path_query);
    cJSON *j = x->text.data ? cJSON_ParseWithLength(x->text.data, x->text.len) : NULL;
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    const cJSON *code = cJSON_GetObjectItemCaseSensitive(e, "code");
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(e, "message");
    if (cJSON_IsString(code)) snprintf(err->code, sizeof err->code, "%s", code->valuestring);
    if (cJSON_IsString(msg)) {
        snprintf(err->message, sizeof err->message, "%s", msg->valuestring);
    } else if (x->text.len > 0) { /* not our JSON (a proxy?): the start of what came */
        char shown[208];
        snprintf(err->message, sizeof err->message, "HTTP %d: %s", x->status,
                 gemm_shown(x->text.data, x->text.len, shown, sizeof shown));
    }
    cJSON_Delete(j);
    return -1;
}

int gemm_xfer_call(gemm_xfer *x, cJSON **json, gemm_timing *t, gemm_client_error *err)
{
    int rc = gemm_xfer_run(x, t, err);
    if (rc == 0 && !is_success(x->status)) rc = server_error(x, err);
    if (rc == 0) err->http_status = x->status;
    if (rc == 0 && json) *json = x->text.data ? cJSON_ParseWithLength(x->text.data, x->text.len) : NULL;
    gemm_buf_free(&x->text);
    return rc;
}
