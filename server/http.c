/*
 * http.c - the libmicrohttpd daemon: options, the access handler's life cycle (headers,
 * body chunks, end of body, resume), per-request log lines and shutdown.
 *
 * The access handler is called once with the headers (the route is looked up in the
 * route table, routes.h; method, auth, limits and media type are checked there, so 4xx
 * answers go out before a byte of the body is read), once per body chunk, once at the
 * end of the body, and once more after a suspended request is resumed (sync.h).
 */
#include "http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "auth.h"
#include "framing.h"
#include "instance.h"
#include "log.h"
#include "offload.h"
#include "respond.h"
#include "routes.h"
#include "sync.h"

/* After a body error the rest is read and dropped, up to this much, so the client
 * gets the error; past it the connection is closed. */
#define GEMMD_DISCARD_MAX (64ull * 1024 * 1024)
/* Threads that encode big JSON answers (the HTTP threads stay free for the rest). */
#define GEMMD_OFFLOAD_THREADS 2

/* The server: its services (request.h: what routes work with) and the HTTP layer's own
 * state, which no other file sees. */
struct gemmd_server {
    gemmd_services svc;
    struct MHD_Daemon *daemon;
    char url[128];
    gemmd_budget_alloc_ctx alloc_ctx;
    char *tls_cert, *tls_key;
    MHD_socket quiesced;
    gemmd_conns_config conns_cfg;
};

/* The read increment for a connection buffer (see gemmd_http_start_fd): the whole buffer
 * before 1.0, the library's own default from 1.0 on. */
#if MHD_VERSION < 0x01000000
#define READ_INCREMENT(buffer) (buffer)
#else
#define READ_INCREMENT(buffer) ((void)(buffer), (size_t)1024)
#endif

/* ---- routing ------------------------------------------------------------------ */

static int is_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* Cuts every run of 16 or more hex digits in s (in place) to its first
 * GEMMD_JOB_SHORT_LEN digits and "...": whatever a log line quotes, a job id in it (a
 * bearer capability) never appears whole. */
static void scrub_ids(char *s)
{
    char *w = s;
    for (const char *r = s; *r;) {
        size_t n = 0;
        while (is_hex(r[n])) n++;
        if (n >= 16) {
            memmove(w, r, GEMMD_JOB_SHORT_LEN);
            memcpy(w + GEMMD_JOB_SHORT_LEN, "...", 3); /* 11 <= 16: never longer */
            w += GEMMD_JOB_SHORT_LEN + 3;
            r += n;
        } else if (n) {
            memmove(w, r, n);
            w += n;
            r += n;
        } else {
            *w++ = *r++;
        }
    }
    *w = '\0';
}

/* The path as log lines show it: a route's pattern when it has parameters (a job or
 * matrix id is a capability: its instance and first GEMMD_JOB_SHORT_LEN digits go in
 * job= or matrix=), else the path with any long hex run cut. */
static const char *log_path(const gemmd_request *req, char *out, size_t cap)
{
    if (req->route && strchr(req->route->pattern, '{')) snprintf(out, cap, "%s", req->route->pattern);
    else snprintf(out, cap, "%s", req->path);
    scrub_ids(out);
    return out;
}

/* Matches the route; a path parameter {id} becomes req->job_id when it is a job or matrix
 * id ([instance_id-]32 hex digits), else "" (the handler answers 404). 0, or the status
 * (404, 405) to refuse the request with. */
static int resolve(gemmd_request *req, const char *url, const char *method)
{
    int status = 0;
    req->route = gemmd_routes_match(method, url, req->param, 2, &status, req->allow, sizeof req->allow);
    if (!req->route) return status;
    if (strstr(req->route->pattern, "{id}")) {
        const char *id = req->param[0];
        if (gemmd_instance_id_valid(id, strlen(id))) snprintf(req->job_id, sizeof req->job_id, "%s", id);
    }
    return 0;
}

static enum MHD_Result body_complete(gemmd_request *req);

/* ---- admission (admit.h) ----------------------------------------------------------- */

/* Who asks, for fairness and shares (admit.h): the token, or without tokens the address,
 * hashed into GEMMD_CLIENTS groups. */
static void client_of(gemmd_request *req)
{
    if (req->owner) {
        req->client = req->owner % GEMMD_CLIENTS;
        return;
    }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(req->conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *sa = ci ? ci->client_addr : NULL;
    const unsigned char *p = NULL;
    size_t n = 0;
    if (sa && sa->sa_family == AF_INET) {
        p = (const unsigned char *)&((const struct sockaddr_in *)sa)->sin_addr;
        n = 4;
    } else if (sa && sa->sa_family == AF_INET6) {
        p = (const unsigned char *)&((const struct sockaddr_in6 *)sa)->sin6_addr;
        n = 16;
    }
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 16777619u;
    req->client = (int)(h % GEMMD_CLIENTS);
}

/* The admitted request's body reader allocates what it planned; then the body is read
 * (a request started at its end, without a body, is complete already). */
static enum MHD_Result opened(gemmd_request *req)
{
    const gemmd_body_reader *body = req->route->body;
    if (body->open && body->open(req) != 0) return gemmd_respond_error(req, &req->err);
    req->phase = REQ_BODY;
    const char *ct = gemmd_request_header(req, MHD_HTTP_HEADER_CONTENT_TYPE);
    LOG_DEBUG("request body admitted: %.*s length=%s%llu limit=%llu reserved=%llu", ct ? (int)strcspn(ct, "; ") : 4,
              ct ? ct : "none", req->has_length ? "" : "chunked, at most ",
              (unsigned long long)(req->has_length ? req->content_length : req->limit), (unsigned long long)req->limit,
              (unsigned long long)req->need);
    return req->deferred ? body_complete(req) : MHD_YES;
}

/* The queue reserved req->need: the request's own from now on, given back when it ends. */
static void reserved(gemmd_request *req)
{
    uint64_t none = 0;
    if (atomic_compare_exchange_strong(&req->resv.total, &none, req->need)) req->t_admitted = gemm_now_ms();
}

/* ---- clients that leave a waiting request (conns.h's watch) ---- */

/* The watch holds req (a reference) until it is called or taken back. */
static void watch(gemmd_request *req, void (*left)(void *arg))
{
    gemmd_request_hold(req);
    gemmd_conn_watch(req->cx, left, req);
}

static void unwatch(gemmd_request *req)
{
    if (gemmd_conn_unwatch(req->cx)) gemmd_request_release(req);
}

/* The client of a request waiting for admission left: out of the queue (its place and the
 * memory it would have reserved go to the others), and its connection resumed to close. */
static void left_queue(void *arg)
{
    gemmd_request *req = arg;
    if (gemmd_admit_cancel(req->svc->admit, &req->ticket)) {
        req->gone = 1;
        gemmd_request_release(req); /* the queue's hold: no wake will come */
        gemmd_sync_unpark(req);
    }
    gemmd_request_release(req); /* the watch's */
}

/* The client of a product on the engine left: a queued product is taken off the queue, a
 * running one stops at its next stage boundary (panels, splits, batches). */
static void left_engine(void *arg)
{
    gemmd_request *req = arg;
    LOG_DEBUG("product cancelled: its client left");
    gemm_engine_cancel(req->svc->engine, req->job);
    gemmd_request_release(req); /* the watch's */
}

/* A waiting request's turn came, or its wait ended in vain (503 with the queue's expected
 * wait in Retry-After: with Expect: 100-continue it goes instead of the 100). */
static enum MHD_Result admitted(gemmd_request *req)
{
    unwatch(req);
    if (req->gone) return MHD_NO; /* its client left while it waited */
    if (gemmd_admit_result(req->svc->admit, &req->ticket, &req->err, &req->retry_after_s) != 0) {
        LOG_DEBUG("request refused after waiting for memory: retry after %d s", req->retry_after_s);
        return gemmd_respond_error(req, &req->err);
    }
    reserved(req); /* done by on_admitted too; whichever is first */
    gemmd_conn_head(req->cx); /* its deadlines start again */
    return opened(req);
}

static void on_admitted(void *arg)
{
    gemmd_request *req = arg;
    /* the reservation is the request's from now on, even if it never runs again (its
     * client may be gone: the request is then freed as its connection closes) */
    if (req->ticket.result == 0) reserved(req);
    gemmd_sync_unpark(req);
    gemmd_request_release(req); /* the queue's hold */
}

static int admission_decided(gemmd_request *req) { return gemmd_admit_decided(&req->ticket); }

/* Before a byte of the body is read, the request reserves what it will hold (req->need,
 * from begin()): at once when it fits and nobody waits, else it waits in the queue with its
 * connection parked, no deadline running but the queue's own. */
static enum MHD_Result admit(gemmd_request *req)
{
    if (!req->need) return opened(req);
    gemmd_request_hold(req); /* the queue's, should the request wait */
    int r = gemmd_admit_enter(req->svc->admit, &req->ticket, req->client, req->need, on_admitted, req, &req->err,
                              &req->retry_after_s);
    if (r != 1) gemmd_request_release(req);
    if (r < 0) {
        LOG_DEBUG("request refused before its body: %d %s (%llu bytes)", req->err.status, req->err.code,
                  (unsigned long long)req->need);
        return gemmd_respond_error(req, &req->err);
    }
    if (r == 0) {
        reserved(req);
        return opened(req);
    }
    LOG_DEBUG("request waits for memory: %llu bytes", (unsigned long long)req->need);
    req->phase = REQ_ADMIT;
    gemmd_conn_wait(req->cx);
    watch(req, left_queue);
    if (gemmd_sync_park(req, admission_decided) == 0) return MHD_YES;
    return admitted(req); /* decided while it was being parked */
}

/* First call: everything that can be decided from the request line and headers. */
static enum MHD_Result start_request(gemmd_request *req, const char *url, const char *method)
{
    gemmd_services *svc = req->svc;
    int r = resolve(req, url, method);
    if (r == 404 && strncmp(url, "/v2", 3) == 0 && (url[3] == '\0' || url[3] == '/'))
        return gemmd_v2_not_found(req, url);
    if (r == 404)
        return gemmd_respond_errorf(req, 404, "not_found", "no route %.60s; see GET /v1/info and the API reference",
                                    url);
    if (r == 405)
        return gemmd_respond_errorf(req, 405, "method_not_allowed", "%.60s does not take %s (allowed: %s)", url,
                                    method, req->allow);
    const gemmd_route_desc *route = req->route;
    if (svc->auth && !(route->flags & GEMMD_OPEN)) {
        int who = gemmd_auth_identify(svc->auth, gemmd_request_header(req, MHD_HTTP_HEADER_AUTHORIZATION));
        if (who < 0) {
            LOG_DEBUG("request refused: no known bearer token");
            return gemmd_respond_errorf(req, 401, "unauthorized",
                                        "this server needs \"Authorization: Bearer <token>\" with a known token");
        }
        req->owner = who + 1; /* jobs.h: 0 is "no tokens configured" */
    }
    if ((route->flags & GEMMD_STOPS) && atomic_load(&svc->stopping))
        return gemmd_respond_errorf(req, 503, "shutting_down", "the server is shutting down; retry elsewhere");
    if (!route->body) return route->handler(req);
    client_of(req);
    if (route->body->begin(req) != 0) {
        LOG_DEBUG("request refused before its body: %d %s", req->err.status, req->err.code);
        return gemmd_respond_error(req, &req->err);
    }
    return admit(req);
}

static enum MHD_Result body_complete(gemmd_request *req)
{
    if (req->failed) {
        LOG_DEBUG("request body refused: %d %s after %llu bytes", req->err.status, req->err.code,
                  (unsigned long long)req->bytes_in);
        return gemmd_respond_error(req, &req->err);
    }
    if (req->route->body->finish(req) != 0) {
        LOG_DEBUG("request body refused: %d %s", req->err.status, req->err.code);
        return gemmd_respond_error(req, &req->err);
    }
    enum MHD_Result rc = req->route->handler(req);
    if (req->phase == REQ_WAIT) {
        gemmd_conn_wait(req->cx); /* no deadline on the engine, but its client is watched */
        if (req->job) watch(req, left_engine);
    }
    return rc;
}

/* A connection resumed after its product (or its answer's encoding) is done, or after
 * shutdown gave up on it. */
static enum MHD_Result resumed(gemmd_request *req)
{
    unwatch(req);
    switch (gemmd_sync_status(req)) {
    case GEMMD_SYNC_DONE: return req->route->answer(req);
    case GEMMD_SYNC_ABANDONED: return gemmd_respond_abandoned(req);
    default: return MHD_YES;
    }
}

/* A connection over connection_limit or per_ip_limit. On plain HTTP the 503 was written
 * when it was accepted: close it now that its request head came. Over TLS it is answered
 * here, and closed after the answer. */
static enum MHD_Result refuse_connection(gemmd_request *req, const char *code, const char *msg)
{
    req->route = NULL;
    if (!req->svc->cfg.tls_cert[0]) return MHD_NO;
    req->close_conn = 1;
    return gemmd_respond_errorf(req, 503, code, "%s", msg);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    gemmd_server *srv = cls;
    gemmd_request *req = *con_cls;
    char lp[176];
    if (!req) {
        /* this thread takes and gives back the blocks of every request it reads: the
         * engine's host cache may keep them for it (gemm_alloc_mark_busy_thread) */
        gemm_alloc_mark_busy_thread();
        req = gemmd_request_new(&srv->svc, conn, method, url);
        if (!req) return MHD_NO;
        *con_cls = req;
        atomic_fetch_add(&srv->svc.inflight, 1);
        req->cx = gemmd_conn_of(conn);
        gemmd_conn_head(req->cx);
        const char *why_msg = NULL;
        const char *why = gemmd_conn_refusal(req->cx, &why_msg);
        if (why) return refuse_connection(req, why, why_msg);
        LOG_DEBUG("request start method=%s path=%s", req->method, log_path(req, lp, sizeof lp));
        /* Framing errors are answered now, and the connection is closed: the rest of the
         * bytes cannot be trusted to be this request's body (framing.h). */
        if (gemmd_framing_check(req, method, version) != 0) {
            LOG_DEBUG("request refused: %d %s", req->err.status, req->err.code);
            return gemmd_respond_error(req, &req->err);
        }
        /* A request with a body is judged now, so that errors go out before the body is
         * read (MHD then closes the connection). One without a body is answered at the
         * end of the request, which keeps the connection alive. */
        if (gemmd_framing_has_body(req)) return start_request(req, url ? url : "", method ? method : "");
        req->phase = REQ_DEFER;
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        gemmd_conn_body(req->cx, n);
        req->bytes_in += n;
        if (req->phase != REQ_BODY) return MHD_YES;
        if (req->failed) {
            req->discarded += n;
        } else if (req->bytes_in > req->limit) {
            gemm_err_set(&req->err, 413, "body_too_large", "the body is over the limit of %llu bytes%s",
                         (unsigned long long)req->limit, req->limit_json ? " for JSON (max_json_mb)" : " (max_body_mb)");
            req->failed = 1;
        } else {
            req->route->body->feed(req, upload_data, n);
        }
        return req->failed && req->discarded > GEMMD_DISCARD_MAX ? MHD_NO : MHD_YES;
    }
    if (req->phase == REQ_DEFER) { /* no body: complete once admitted (opened) */
        req->deferred = 1;
        return start_request(req, url ? url : "", method ? method : "");
    }
    if (req->phase == REQ_ADMIT) return admitted(req);
    if (req->phase == REQ_BODY) return body_complete(req);
    if (req->phase == REQ_WAIT) return resumed(req);
    return MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)conn;
    gemmd_server *srv = cls;
    gemmd_request *req = *con_cls;
    if (!req) return;
    *con_cls = NULL;
    double ms = gemm_now_ms() - req->t_start_ms;
    static const char *const why[] = {"ok", "error", "timeout", "shutdown", "read_error", "client_abort"};
    const char *reason = (unsigned)toe < sizeof why / sizeof why[0] ? why[toe] : "other";
    char lp[176], job[GEMMD_INSTANCE_MAX + 24] = "";
    log_path(req, lp, sizeof lp);
    int mat = req->route && strncmp(req->route->pattern, "/v1/matrices", 12) == 0;
    if (req->job_id[0]) snprintf(job, sizeof job, " %s=%.*s", mat ? "matrix" : "job", GEMMD_JOB_LOG_ID(req->job_id));
    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK)
        LOG_INFO("request method=%s path=%s%s status=%d in=%llu out=%llu ms=%.3f", req->method, lp, job,
                 req->status, (unsigned long long)req->bytes_in, (unsigned long long)req->bytes_out, ms);
    else
        LOG_INFO("request method=%s path=%s%s status=%d in=%llu out=%llu ms=%.3f ended=%s", req->method, lp, job,
                 req->status, (unsigned long long)req->bytes_in, (unsigned long long)req->bytes_out, ms, reason);
    gemmd_metrics_request(gemmd_route_slot(req->route), req->owner, req->status, ms / 1000.0, req->bytes_in,
                          toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? req->bytes_out : 0);
    unwatch(req);
    gemmd_conn_request_done(req->cx);
    /* A product still on the engine (shutdown gave up on it) keeps req until its done(). */
    gemmd_request_release(req);
    atomic_fetch_sub(&srv->svc.inflight, 1);
}

/* libmicrohttpd's own messages (client went away, TLS handshake failed, ...) become
 * ordinary log lines. */
static void mhd_logger(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
    for (char *p = line; *p; p++)
        if ((unsigned char)*p < 0x20) *p = ' ';
    scrub_ids(line); /* its messages may quote a URL */
    LOG_INFO("http: %s", line);
}

/* ---- start ------------------------------------------------------------------------ */

static uint64_t reclaim_kept(void *engine) { return gemm_engine_trim_kept(engine); }
static void admit_kick(void *admit) { gemmd_admit_kick(admit); }

static void budget_tick(void *budget) { gemmd_budget_tick(budget, (int64_t)gemm_now_ms()); }

/* The memory budget, the charging allocators and the connection limits and deadlines. */
static int start_limits(gemmd_server *s, gemm_err *err)
{
    const gemmd_config *cfg = &s->svc.cfg;
    uint64_t limit = gemmd_budget_limit(cfg->max_inflight_bytes);
    gemmd_budget_tune_malloc();
    /* With nothing given back lately, a refused client is told to come back once the
     * deadlines have dropped what a stuck client may hold. */
    unsigned fallback = (unsigned)(cfg->header_timeout_s + cfg->send_timeout_s);
    s->svc.budget = gemmd_budget_new(limit, fallback ? fallback : 10);
    if (!s->svc.budget) return gemm_err_set(err, 500, "out_of_memory", "cannot allocate the memory budget");
    /* Memory the engine keeps for reuse (the CUDA engine's page-locked blocks) is resident
     * too: it is charged as "cache", takes only room no request needs, and is let go when
     * a request's charge would not fit otherwise. */
    gemmd_budget_set_reclaim(s->svc.budget, reclaim_kept, s->svc.engine);
    gemm_engine_set_keep_charge(s->svc.engine, gemmd_budget_keep_charge, s->svc.budget);
    const gemm_allocator *base = gemm_engine_allocator(s->svc.engine);
    s->svc.base_alloc = *base;
    s->alloc_ctx = (gemmd_budget_alloc_ctx){s->svc.budget, *base, GEMMD_MEM_INPUT, NULL};
    s->svc.alloc = gemmd_budget_allocator(&s->alloc_ctx);
    /* Requests reserve their memory before their bodies, and wait for it in a queue of a
     * quarter of the connections (at least 4), each at most admit_wait seconds; memory given
     * back wakes the queue. */
    int waiting = cfg->connection_limit / 4 > 4 ? cfg->connection_limit / 4 : 4;
    s->svc.admit = gemmd_admit_new(s->svc.budget, waiting, cfg->admit_wait_s, cfg->token_share);
    if (!s->svc.admit) return gemm_err_set(err, 500, "out_of_memory", "cannot start the admission queue");
    gemmd_budget_set_release_hook(s->svc.budget, admit_kick, s->svc.admit);

    s->conns_cfg = (gemmd_conns_config){
        .connection_limit = cfg->connection_limit,
        .per_ip_limit = cfg->per_ip_limit,
        .header_timeout_s = cfg->header_timeout_s,
        .request_timeout_s = cfg->request_timeout_s,
        .send_timeout_s = cfg->send_timeout_s,
        .min_rate = (double)cfg->min_rate_kb * 1024.0,
        .plain_http = !(cfg->tls_cert[0] && cfg->tls_key[0]),
        .mhd_buffer = (uint64_t)(cfg->connection_memory_kb > 0 ? cfg->connection_memory_kb : 64) * 1024,
        .tick = budget_tick, /* memory given back goes back to the system (budget.h) */
        .tick_ctx = s->svc.budget,
    };
    s->svc.conns = gemmd_conns_new(&s->conns_cfg);
    if (!s->svc.conns) return gemm_err_set(err, 500, "out_of_memory", "cannot allocate the connection table");
    s->svc.offload = gemmd_offload_new(GEMMD_OFFLOAD_THREADS);
    if (!s->svc.offload) return gemm_err_set(err, 500, "out_of_memory", "cannot start the offload threads");
    LOG_INFO("limits: memory budget %.0f MiB (max_inflight_mb%s), connections %d (%d per address), "
             "header_timeout %d s, request_timeout %d s, min_rate_kb %d, send_timeout %d s",
             (double)limit / (1024.0 * 1024.0), cfg->max_inflight_bytes ? "" : " = 0: half of this host's memory",
             cfg->connection_limit, cfg->per_ip_limit, cfg->header_timeout_s, cfg->request_timeout_s,
             cfg->min_rate_kb, cfg->send_timeout_s);
    return 0;
}

/* A PEM file, whole (at most 16 MiB; "" when empty). */
static char *read_file(const char *path, gemm_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        gemm_err_set(err, 500, "bad_config", "cannot read %s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    size_t cap = 0;
    ssize_t n = getdelim(&buf, &cap, '\0', f); /* up to a NUL, which a PEM file never holds */
    fclose(f);
    if (n < 0) {
        free(buf);
        buf = calloc(1, 1);
    } else if (n > (1 << 24)) {
        free(buf);
        gemm_err_set(err, 500, "bad_config", "%s is too large for a PEM file", path);
        return NULL;
    }
    if (!buf) gemm_err_set(err, 500, "out_of_memory", "cannot read %s", path);
    return buf;
}

static int is_loopback(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        return (ntohl(a->sin_addr.s_addr) >> 24) == 127;
    }
    const struct sockaddr_in6 *a6 = (const struct sockaddr_in6 *)ss;
    return IN6_IS_ADDR_LOOPBACK(&a6->sin6_addr);
}

/* The address of listen (an IPv4 or IPv6 literal: the config checked it) and port, and
 * host as URLs write it. 0 or -1. */
static int parse_listen(const char *listen, int port, struct sockaddr_storage *ss, socklen_t *len, char *host,
                        size_t hostlen)
{
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *a = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
    int v6 = inet_pton(AF_INET, listen, &a->sin_addr) != 1;
    if (v6 && inet_pton(AF_INET6, listen, &a6->sin6_addr) != 1) return -1;
    if (v6) a6->sin6_port = htons((uint16_t)port);
    else a->sin_port = htons((uint16_t)port);
    ss->ss_family = v6 ? AF_INET6 : AF_INET;
    *len = v6 ? sizeof *a6 : sizeof *a;
    snprintf(host, hostlen, v6 ? "[%s]" : "%s", listen);
    return 0;
}

/* Binds and listens as libmicrohttpd would (SO_REUSEADDR; IPv6 only for an IPv6 address),
 * so that a failure says what it is: the socket, or -1 with err set (bad_config). */
static int listen_on(const struct sockaddr_storage *ss, socklen_t len, const char *host, int port, gemm_err *err)
{
    int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd >= 0) {
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (ss->ss_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
        if (bind(fd, (const struct sockaddr *)ss, len) == 0 && listen(fd, SOMAXCONN) == 0) return fd;
    }
    int e = errno;
    if (fd >= 0) close(fd);
    gemm_err_set(err, 400, "bad_config", "cannot listen on %s port %d: %s", host, port,
                 e == EADDRINUSE      ? "another process is listening there (ss -ltnp shows which)"
                 : e == EADDRNOTAVAIL ? "that is not an address of this host"
                 : e == EACCES        ? "a port below 1024 needs privileges (CAP_NET_BIND_SERVICE)"
                                      : strerror(e));
    return -1;
}

static enum MHD_Result refuse_all(void *cls, struct MHD_Connection *c, const char *u, const char *m, const char *v,
                                  const char *d, size_t *n, void **p)
{
    (void)cls, (void)c, (void)u, (void)m, (void)v, (void)d, (void)n, (void)p;
    return MHD_NO;
}

/* Whether libmicrohttpd (GnuTLS) takes this certificate, key and priority string: a daemon
 * without a socket or a thread is started and stopped (its complaints go to the log). */
static int tls_taken(const char *cert, const char *key, const char *priorities)
{
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_TLS | MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ERROR_LOG, 0, NULL, NULL, refuse_all, NULL,
        MHD_OPTION_EXTERNAL_LOGGER, mhd_logger, NULL, MHD_OPTION_HTTPS_MEM_CERT, cert, MHD_OPTION_HTTPS_MEM_KEY, key,
        MHD_OPTION_HTTPS_PRIORITIES, priorities, MHD_OPTION_END);
    if (d) MHD_stop_daemon(d);
    return d != NULL;
}

/* The TLS files and tls_priorities, checked before anything listens: 0, or -1 with err set. */
static int check_tls(const gemmd_config *cfg, const char *cert, const char *key, gemm_err *err)
{
    if (!tls_taken(cert, key, "NORMAL"))
        return gemm_err_set(err, 400, "bad_config",
                            "tls_cert %s and tls_key %s are not a PEM certificate and its private key "
                            "(see the log above)", cfg->tls_cert, cfg->tls_key);
    if (!tls_taken(cert, key, cfg->tls_priorities))
        return gemm_err_set(err, 400, "bad_config",
                            "tls_priorities \"%.200s\" is not a priority string GnuTLS accepts "
                            "(see the log above)", cfg->tls_priorities);
    return 0;
}

/* Frees what start made (after MHD_stop_daemon, and once the engine holds none of our
 * jobs: their done() touches the stores). */
static void free_server(gemmd_server *s)
{
    gemmd_jobs_free(s->svc.jobs);
    gemmd_matrices_free(s->svc.matrices); /* no request holds one any more */
    gemmd_conns_free(s->svc.conns);
    gemmd_offload_free(s->svc.offload);
    if (s->svc.budget) gemm_engine_set_keep_charge(s->svc.engine, NULL, NULL); /* off the budget first */
    gemmd_budget_set_release_hook(s->svc.budget, NULL, NULL);
    gemmd_admit_free(s->svc.admit);
    gemmd_budget_free(s->svc.budget);
    gemmd_auth_free(s->svc.auth);
    gemmd_sync_free(s->svc.sync);
    free(s->tls_cert);
    free(s->tls_key);
    free(s);
}

gemmd_server *gemmd_http_start_fd(const gemmd_config *cfg, gemm_engine *engine, int listen_fd, gemm_err *err)
{
    gemmd_server *s = calloc(1, sizeof *s);
    if (!s) {
        if (listen_fd >= 0) close(listen_fd);
        gemm_err_set(err, 500, "out_of_memory", "cannot allocate the server");
        return NULL;
    }
    s->quiesced = MHD_INVALID_SOCKET;
    s->svc.cfg = *cfg;
    s->svc.engine = engine;
    gemm_engine_describe(engine, &s->svc.info);

    struct sockaddr_storage ss;
    socklen_t sslen;
    char host[96];
    if (parse_listen(cfg->listen, cfg->port, &ss, &sslen, host, sizeof host) != 0) {
        gemm_err_set(err, 400, "bad_config", "listen = %s is not an IPv4 or IPv6 address literal", cfg->listen);
        goto fail;
    }
    if (cfg->tokens_file[0]) {
        char msg[300];
        s->svc.auth = gemmd_auth_load(cfg->tokens_file, msg, sizeof msg);
        if (!s->svc.auth) {
            gemm_err_set(err, 400, "bad_config", "%s", msg);
            goto fail;
        }
    } else if (!is_loopback(&ss)) {
        LOG_WARN("!!! listening on %s without tokens_file: ANYONE who can reach this address can use the "
                 "server; set tokens_file (one bearer token a line) or bind 127.0.0.1 !!!", cfg->listen);
    }
    if (start_limits(s, err) != 0) goto fail;
    s->svc.jobs = gemmd_jobs_new(engine, cfg->job_ttl_s, cfg->job_mem_bytes, cfg->max_jobs, cfg->token_share);
    s->svc.matrices = gemmd_matrices_new(engine, cfg->resident_bytes, cfg->max_matrices, cfg->token_share,
                                         cfg->job_ttl_s);
    if (!s->svc.jobs || !s->svc.matrices) {
        gemm_err_set(err, 500, "out_of_memory", "cannot allocate the job store");
        goto fail;
    }
    gemmd_jobs_set_memory(s->svc.jobs, &s->svc.alloc, s->svc.budget);
    gemmd_matrices_set_memory(s->svc.matrices, s->svc.budget);

    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (ss.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    int tls = cfg->tls_cert[0] && cfg->tls_key[0];
    if (tls) {
        s->tls_cert = read_file(cfg->tls_cert, err);
        s->tls_key = s->tls_cert ? read_file(cfg->tls_key, err) : NULL;
        if (!s->tls_key || check_tls(cfg, s->tls_cert, s->tls_key, err) != 0) goto fail;
        flags |= MHD_USE_TLS;
    }
    unsigned threads = (unsigned)gemmd_config_http_threads(cfg);
    /* direct_run: a product as small as the engine coalesces, while at most a quarter of
     * the threads' worth of others wait */
    s->svc.sync = gemmd_sync_new(engine, &s->svc.stopping, cfg->direct_run, gemm_engine_small_mnk(engine),
                                 (int)(threads / 4));
    if (!s->svc.sync) {
        gemm_err_set(err, 500, "out_of_memory", "cannot allocate the server");
        goto fail;
    }
    unsigned mhd_limit = gemmd_conns_mhd_limit(&s->conns_cfg);
    /* Bind cfg->listen, or adopt the socket a restarted daemon handed over. */
    if (listen_fd < 0 && (listen_fd = listen_on(&ss, sslen, host, cfg->port, err)) < 0) goto fail;
    struct MHD_OptionItem strict[2];
    gemmd_framing_options(strict);
    /* HTTPS: certificate, key, and the protocol versions and ciphers offered. */
    struct MHD_OptionItem tls_opts[4] = {{MHD_OPTION_END, 0, NULL}};
    if (tls) {
        tls_opts[0] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, s->tls_cert};
        tls_opts[1] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, s->tls_key};
        tls_opts[2] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_PRIORITIES, 0, (void *)cfg->tls_priorities};
        tls_opts[3] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
    }
    s->daemon = MHD_start_daemon(
        flags, (uint16_t)cfg->port, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_logger, NULL,
        MHD_OPTION_LISTEN_SOCKET, listen_fd, MHD_OPTION_THREAD_POOL_SIZE, threads,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->connection_timeout_s,
        /* framing.h: the request target is judged before its query is split */
        MHD_OPTION_URI_LOG_CALLBACK, gemmd_framing_on_target, NULL, MHD_OPTION_ARRAY, strict,
        /* room over connection_limit: gemmd answers the connections over its limits itself */
        MHD_OPTION_CONNECTION_LIMIT, mhd_limit, MHD_OPTION_PER_IP_CONNECTION_LIMIT, 0u,
        MHD_OPTION_NOTIFY_CONNECTION, gemmd_conns_notify, s->svc.conns,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)s->conns_cfg.mhd_buffer,
        /* libmicrohttpd 0.9.7x reads into half of the connection's buffer and grows that
         * only when it is full, which a body consumed as it arrives never makes it. With
         * an increment of the whole buffer each read grows it until a few KiB are left, so
         * a large body comes in reads of almost the whole buffer, in fewer passes of the
         * event loop; small requests cost the same (the library clears the whole buffer
         * between requests either way). 1.0 grows by other rules: its default is kept. */
        MHD_OPTION_CONNECTION_MEMORY_INCREMENT, READ_INCREMENT((size_t)s->conns_cfg.mhd_buffer),
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_ARRAY, tls_opts, MHD_OPTION_END);
    if (!s->daemon) {
        gemm_err_set(err, 500, "internal_error", "libmicrohttpd did not start on %s port %d (see the log above)",
                     cfg->listen, cfg->port);
        goto fail;
    }
    listen_fd = -1; /* the daemon owns it now */
    if (gemmd_conns_start(s->svc.conns) != 0) {
        gemm_err_set(err, 500, "internal_error", "cannot start the connection watchdog");
        MHD_stop_daemon(s->daemon);
        goto fail;
    }
    /* the port is cfg->port: bound here, or checked on the socket handed over (restart.c) */
    snprintf(s->url, sizeof s->url, "%s://%s:%d", tls ? "https" : "http", host, cfg->port);
    return s;

fail:
    if (listen_fd >= 0) close(listen_fd);
    free_server(s);
    return NULL;
}

const char *gemmd_http_url(const gemmd_server *s) { return s->url; }

/* ---- shutdown ---------------------------------------------------------------------- */

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Waits until the engine holds no job, at most limit_ms (< 0: however long it takes).
 * Returns 1 when it is idle. */
static int wait_engine_idle(gemm_engine *e, double limit_ms)
{
    double t0 = gemm_now_ms(), said = t0;
    for (gemm_engine_stats st;; sleep_ms(10)) {
        gemm_engine_get_stats(e, &st);
        double now = gemm_now_ms();
        if (st.queued == 0 && st.running == 0) return 1;
        if (limit_ms >= 0 && now - t0 >= limit_ms) return 0;
        if (limit_ms < 0 && now - said >= 30000.0) {
            LOG_WARN("shutdown: still waiting for %d products to leave the engine (%.0f s)", st.running + st.queued,
                     (now - t0) / 1000.0);
            said = now;
        }
    }
}

/* The graceful stop: no new connections or products; queued work fails with 503; running
 * async jobs are cancelled (nobody could fetch them); running synchronous products get
 * shutdown_timeout to finish. Past it they are asked to stop, and whatever is still
 * suspended is resumed and answered 503, so that MHD_stop_daemon() never meets a
 * suspended connection. Only once the engine holds none of our jobs (their done()
 * touches the server and the store) is anything freed. */
static int shutdown_server(gemmd_server *s, int keep_socket)
{
    s->quiesced = MHD_quiesce_daemon(s->daemon); /* no new connections */

    gemmd_sync_stop(s->svc.sync); /* no new products, from keep-alive connections either */
    gemmd_admit_close(s->svc.admit); /* those waiting for memory answer 503 */
    gemmd_sync_cancel_pending(s->svc.sync, 0); /* queued products answer 503 shutting_down */
    gemmd_jobs_shutdown(s->svc.jobs);      /* async jobs: queued cancelled, running asked to stop */

    double limit_ms = s->svc.cfg.shutdown_timeout_s * 1000.0;
    if (!wait_engine_idle(s->svc.engine, limit_ms)) {
        int n = gemmd_sync_cancel_pending(s->svc.sync, 1);
        LOG_WARN("shutdown: %d products still running after shutdown_timeout (%d s): asked them to stop", n,
                 s->svc.cfg.shutdown_timeout_s);
        /* A product that stops at a stage boundary answers itself; give it a moment, but
         * no more than the timeout itself (0: everything is answered at once). */
        wait_engine_idle(s->svc.engine, limit_ms < 2000.0 ? limit_ms : 2000.0);
    }
    /* Whatever is still waiting is answered now, whatever the time: even a product listed
     * just before stopping was set and not yet on the engine when it looked idle. */
    int n = gemmd_sync_abandon_pending(s->svc.sync);
    if (n) LOG_WARN("shutdown: answered %d waiting clients with 503; their products are left to end", n);
    /* Give the answers in flight a moment to go out. */
    double t0 = gemm_now_ms();
    while (atomic_load(&s->svc.inflight) > 0 && gemm_now_ms() - t0 < 3000.0) sleep_ms(5);
    if (atomic_load(&s->svc.inflight) > 0)
        LOG_WARN("shutdown: closing %d requests that did not finish in time", atomic_load(&s->svc.inflight));

    gemmd_offload_drain(s->svc.offload); /* answers being encoded are finished and resumed */
    gemmd_conns_stop(s->svc.conns); /* no deadline may fire while MHD closes what is left */
    MHD_stop_daemon(s->daemon); /* nothing is suspended any more */
    wait_engine_idle(s->svc.engine, -1.0);
    int kept = -1;
    if (s->quiesced != MHD_INVALID_SOCKET) {
        int fl = keep_socket ? fcntl(s->quiesced, F_GETFD) : -1;
        if (fl >= 0 && fcntl(s->quiesced, F_SETFD, fl & ~FD_CLOEXEC) == 0)
            kept = s->quiesced;
        else
            close(s->quiesced);
    }
    free_server(s);
    return kept;
}

void gemmd_http_shutdown(gemmd_server *s)
{
    if (s) shutdown_server(s, 0);
}

int gemmd_http_shutdown_keep_socket(gemmd_server *s)
{
    return s ? shutdown_server(s, 1) : -1;
}
