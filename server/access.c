/*
 * access.c - the access handler: a request's life from its head to MHD's NOTIFY_COMPLETED.
 * Route, method, auth, limits and media type are checked on the first call, so 4xx
 * answers go out before a byte of the body is read.
 */
#include "access.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "auth.h"
#include "framing.h"
#include "instance.h"
#include "log.h"
#include "respond.h"
#include "routes.h"
#include "sync.h"

/* After a body error the rest is read and dropped, up to this much, so the client
 * gets the error; past it the connection is closed. */
#define GEMMD_DISCARD_MAX (64ull * 1024 * 1024)

/* ---- what log lines show ------------------------------------------------------ */

/* Cuts every run of 16 or more hex digits in s (in place) to its first
 * GEMMD_JOB_SHORT_LEN digits and "...": whatever a log line quotes, a job id in it (a
 * bearer capability) never appears whole. */
static void scrub_ids(char *s)
{
    char *w = s;
    for (const char *r = s; *r;) {
        size_t n = 0;
        while (isxdigit((unsigned char)r[n])) n++;
        if (n >= 16) {
            memmove(w, r, GEMMD_JOB_SHORT_LEN);
            memcpy(w + GEMMD_JOB_SHORT_LEN, "...", 3); /* 11 <= 16: never longer */
            w += GEMMD_JOB_SHORT_LEN + 3;
            r += n;
        } else { /* a short run, or one other character */
            n = n ? n : 1;
            memmove(w, r, n);
            w += n;
            r += n;
        }
    }
    *w = '\0';
}

/* The path as log lines show it: a route's pattern when it has parameters (a job or
 * matrix id is a capability: its instance and first GEMMD_JOB_SHORT_LEN digits go in
 * job= or matrix=), else the path with any long hex run cut. */
static const char *log_path(const gemmd_request *req, char *out, size_t cap)
{
    snprintf(out, cap, "%s", req->route && strchr(req->route->pattern, '{') ? req->route->pattern : req->path);
    scrub_ids(out);
    return out;
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

static enum MHD_Result body_complete(gemmd_request *req)
{
    if (req->failed || req->route->body->finish(req) != 0) {
        LOG_DEBUG("request body refused: %d %s after %llu bytes", req->err.status, req->err.code,
                  (unsigned long long)req->bytes_in);
        return gemmd_respond_error(req, &req->err);
    }
    enum MHD_Result rc = req->route->handler(req);
    if (req->phase == REQ_WAIT) {
        gemmd_conn_wait(req->cx); /* no deadline on the engine, but its client is watched */
        if (req->job) watch(req, left_engine);
    }
    return rc;
}

/* ---- admission (admit.h) ----------------------------------------------------------- */

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

/* A waiting request's turn came, or its wait ended in vain (503 with the queue's expected
 * wait in Retry-After: with Expect: 100-continue it goes instead of the 100). */
static enum MHD_Result admitted(gemmd_request *req)
{
    unwatch(req);
    if (req->gone) return MHD_NO; /* its client left while it waited */
    if (gemmd_admit_result(&req->ticket, &req->err, &req->retry_after_s) != 0) {
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
    int r = 0;
    const gemmd_route_desc *route = gemmd_routes_match(method, url, req->param, 2, &r, req->allow, sizeof req->allow);
    req->route = route;
    if (r == 404 && strncmp(url, "/v2", 3) == 0 && (url[3] == '\0' || url[3] == '/'))
        return gemmd_v2_not_found(req, url);
    if (r == 404)
        return gemmd_respond_errorf(req, 404, "not_found", "no route %.60s; see GET /v1/info and the API reference",
                                    url);
    if (r == 405)
        return gemmd_respond_errorf(req, 405, "method_not_allowed", "%.60s does not take %s (allowed: %s)", url,
                                    method, req->allow);
    /* a path parameter {id} that is a job or matrix id ([instance_id-]32 hex digits) becomes
     * req->job_id, else "" stays (the handler answers 404) */
    if (strstr(route->pattern, "{id}") && gemmd_instance_id_valid(req->param[0], strlen(req->param[0])))
        snprintf(req->job_id, sizeof req->job_id, "%s", req->param[0]);
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
    /* who asks, for fairness and shares (admit.h): the token, or without tokens the address */
    req->client = req->owner ? req->owner % GEMMD_CLIENTS : (int)(gemmd_conn_addr_hash(req->cx) % GEMMD_CLIENTS);
    if (route->body->begin(req) != 0) {
        LOG_DEBUG("request refused before its body: %d %s", req->err.status, req->err.code);
        return gemmd_respond_error(req, &req->err);
    }
    return admit(req);
}

/* A connection over connection_limit or per_ip_limit. On plain HTTP the 503 was written
 * when it was accepted: close it now that its request head came. Over TLS it is answered
 * here, and closed after the answer. */
static enum MHD_Result refuse_connection(gemmd_request *req, const char *code, const char *msg)
{
    if (!req->svc->cfg.tls_cert[0]) return MHD_NO;
    req->close_conn = 1;
    return gemmd_respond_errorf(req, 503, code, "%s", msg);
}

enum MHD_Result gemmd_access(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                             const char *version, const char *upload_data, size_t *upload_data_size, void **con_cls)
{
    gemmd_services *svc = cls;
    gemmd_request *req = *con_cls;
    char lp[176];
    if (!req) {
        /* this thread takes and gives back the blocks of every request it reads: the
         * engine's host cache may keep them for it (gemm_alloc_mark_busy_thread) */
        gemm_alloc_mark_busy_thread();
        req = gemmd_request_new(svc, conn, method, url);
        if (!req) return MHD_NO;
        *con_cls = req;
        atomic_fetch_add(&svc->inflight, 1);
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
                         (unsigned long long)req->limit,
                         req->limit_json ? " for JSON (max_json_mb)" : " (max_body_mb)");
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
    if (req->phase == REQ_WAIT) { /* its product (or its answer's encoding) is done, or shutdown gave up */
        unwatch(req);
        return gemmd_respond_waited(req, gemmd_sync_status(req));
    }
    return MHD_YES;
}

void gemmd_access_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                            enum MHD_RequestTerminationCode toe)
{
    (void)conn;
    gemmd_services *svc = cls;
    gemmd_request *req = *con_cls;
    if (!req) return;
    *con_cls = NULL;
    double ms = gemm_now_ms() - req->t_start_ms;
    static const char *const why[] = {"", " ended=error", " ended=timeout", " ended=shutdown", " ended=read_error",
                                      " ended=client_abort"};
    const char *reason = (unsigned)toe < sizeof why / sizeof why[0] ? why[toe] : " ended=other";
    char lp[176], job[GEMMD_INSTANCE_MAX + 24] = "";
    log_path(req, lp, sizeof lp);
    int mat = req->route && strncmp(req->route->pattern, "/v1/matrices", 12) == 0;
    if (req->job_id[0]) snprintf(job, sizeof job, " %s=%.*s", mat ? "matrix" : "job", GEMMD_JOB_LOG_ID(req->job_id));
    LOG_INFO("request method=%s path=%s%s status=%d in=%llu out=%llu ms=%.3f%s", req->method, lp, job, req->status,
             (unsigned long long)req->bytes_in, (unsigned long long)req->bytes_out, ms, reason);
    gemmd_metrics_request(gemmd_route_slot(req->route), req->owner, req->status, ms / 1000.0, req->bytes_in,
                          toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? req->bytes_out : 0);
    unwatch(req);
    gemmd_conn_request_done(req->cx);
    /* A product still on the engine (shutdown gave up on it) keeps req until its done(). */
    gemmd_request_release(req);
    atomic_fetch_sub(&svc->inflight, 1);
}

void gemmd_access_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
    scrub_ids(line); /* its messages may quote a URL; gemmd_log blanks control characters */
    LOG_INFO("http: %s", line);
}
