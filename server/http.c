/*
 * http.c - the libmicrohttpd daemon: options, routing, the access handler's life cycle
 * (headers, body chunks, end of body, resume), per-request log lines and shutdown.
 *
 * The access handler is called once with the headers (route, method, auth, limits and
 * media type are checked there, so 4xx answers go out before a byte of the body is
 * read), once per body chunk, once at the end of the body, and once more after a
 * suspended product is resumed by the engine's done().
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
#include "routes_v2.h"

/* After a body error the rest is read and dropped, up to this much, so the client
 * gets the error; past it the connection is closed. */
#define GEMMD_DISCARD_MAX (64ull * 1024 * 1024)
/* Threads that encode big JSON answers (the HTTP threads stay free for the rest). */
#define GEMMD_OFFLOAD_THREADS 2
/* Locks the synchronous products' handshakes are spread over (see struct gemmd_server). */
#define SYNC_STRIPES 16

/* The server: its services (request.h: what routes work with) and the HTTP layer's own
 * state, which no other file sees. */
struct gemmd_server {
    gemmd_services svc;
    struct MHD_Daemon *daemon;
    char url[128];
    _Atomic int stopping;
    _Atomic int inflight;      /* requests between first call and NOTIFY_COMPLETED */
    /* A request's refs, its suspend/resume handshake (suspended, job_done, abandoned) and
     * its place on a pending list are guarded by the lock of its stripe, one of
     * SYNC_STRIPES picked by the request's address (stripe_of): no lock is shared by all
     * requests, so HTTP threads and engine workers answering different products rarely
     * meet on one. A stripe's lock is never held while calling the engine or another
     * lock's owner, and never with another stripe's, except that shutdown takes all of
     * them in index order to set stopping (set_stopping). The job store and the engine have
     * their own locks, never taken under it, so each is a plain, non-recursive mutex.
     * (gemmd_sync_done may start an offload under it: the offload queue's own lock is
     * taken after it, never the other way.) */
    struct sync_stripe {
        pthread_mutex_t mu;
        gemmd_request *pending; /* this stripe's synchronous products on the engine */
        /* never read: keeps the stripes' locks on different cache lines */
        // cppcheck-suppress unusedStructMember
        char pad[64];
    } stripe[SYNC_STRIPES];
    _Atomic int npending;      /* synchronous products on the engine, all stripes */
    /* answer_spin_us: a small product queued while at most spin_pending others are in
     * flight is polled for this long before its connection is suspended (0: never) */
    long spin_ns;
    int spin_pending;
    uint64_t spin_mnk;
    int direct; /* direct_run: such a product may run on its HTTP thread (submit_here) */
    gemmd_budget_alloc_ctx alloc_ctx, lazy_ctx;
    gemmd_conns *conns;        /* connection limits and deadlines */
};

struct gemmd_server_ext {
    gemmd_server s;
    char *tls_cert, *tls_key;
    MHD_socket quiesced;
    gemmd_conns_config conns_cfg;
};

/* The read increment given to libmicrohttpd for a connection buffer of `buffer` bytes (see
 * gemmd_http_start_fd): the whole buffer before 1.0, the library's own default from 1.0 on. */
static size_t gemmd_read_increment(size_t buffer)
{
#if MHD_VERSION < 0x01000000
    return buffer;
#else
    (void)buffer;
    return 1024;
#endif
}

/* ---- routing ------------------------------------------------------------------ */

/* [instance_id "-"] 32 hex digits (instance.h); the owner may be another instance. */
static int is_job_id(const char *s, size_t n)
{
    return gemmd_instance_id_valid(s, n);
}

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

/* The path as log lines show it: a job id is a capability, so /v1/jobs/{id}[/result]
 * keeps only the route (the id's instance and first GEMMD_JOB_SHORT_LEN digits go in
 * job=), and any other long hex run is cut too. */
static const char *log_path(const gemmd_request *req, char *out, size_t cap)
{
    static const char jobs[] = "/v1/jobs/";
    if (strncmp(req->path, "/v1/matrices/", 13) == 0) {
        snprintf(out, cap, "/v1/matrices/{id}");
    } else if (strncmp(req->path, jobs, sizeof jobs - 1) != 0) {
        snprintf(out, cap, "%s", req->path);
    } else {
        const char *slash = strchr(req->path + sizeof jobs - 1, '/');
        snprintf(out, cap, "/v1/jobs/{id}%.40s", slash ? slash : "");
    }
    scrub_ids(out);
    return out;
}

/* Sets req->route and req->allow from the path; returns 0, or -1 for an unknown path. */
static int resolve(gemmd_request *req, const char *url, const char *method)
{
    int get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    int post = strcmp(method, "POST") == 0;
    int del = strcmp(method, "DELETE") == 0;
    int put = strcmp(method, "PUT") == 0;
    static const char jobs[] = "/v1/jobs/";
    if (gemmd_v2_match(url)) return gemmd_v2_resolve(req, url, method);
    static const char mats[] = "/v1/matrices/";
    if (strcmp(url, "/v1/matrices") == 0) {
        req->allow = "GET, HEAD, POST";
        req->route = post ? GEMMD_ROUTE_MATRIX_CREATE : GEMMD_ROUTE_MATRIX_LIST;
        return post || get ? 0 : 1;
    }
    if (strncmp(url, mats, sizeof mats - 1) == 0) {
        const char *id = url + sizeof mats - 1;
        size_t n = strlen(id);
        if (strchr(id, '/')) return -1;
        req->allow = "GET, HEAD, PUT, DELETE";
        req->route = del ? GEMMD_ROUTE_MATRIX_DELETE : put ? GEMMD_ROUTE_MATRIX_PUT : GEMMD_ROUTE_MATRIX_GET;
        size_t keep = n < sizeof req->job_id - 1 ? n : sizeof req->job_id - 1;
        snprintf(req->job_id, sizeof req->job_id, "%.*s", (int)keep, id);
        if (!is_job_id(id, n)) req->job_id[0] = '\0';
        return get || del || put ? 0 : 1;
    }
    if (strcmp(url, "/v1/matmul") == 0) {
        req->allow = "POST";
        req->route = GEMMD_ROUTE_MATMUL;
        return post ? 0 : 1;
    }
    if (strcmp(url, "/v1/jobs") == 0) {
        req->allow = "POST";
        req->route = GEMMD_ROUTE_JOBS_SUBMIT;
        return post ? 0 : 1;
    }
    if (strncmp(url, jobs, sizeof jobs - 1) == 0) {
        const char *id = url + sizeof jobs - 1;
        const char *slash = strchr(id, '/');
        size_t n = slash ? (size_t)(slash - id) : strlen(id);
        size_t keep = n < sizeof req->job_id - 1 ? n : sizeof req->job_id - 1;
        snprintf(req->job_id, sizeof req->job_id, "%.*s", (int)keep, id);
        if (!slash) {
            req->allow = "GET, HEAD, DELETE";
            req->route = del ? GEMMD_ROUTE_JOB_DELETE : GEMMD_ROUTE_JOB_STATUS;
            if (!get && !del) return 1;
        } else if (strcmp(slash, "/result") == 0) {
            req->allow = "GET, HEAD";
            req->route = GEMMD_ROUTE_JOB_RESULT;
            if (!get) return 1;
        } else {
            return -1;
        }
        if (!is_job_id(id, n)) req->job_id[0] = '\0';
        return 0;
    }
    static const struct { const char *path; gemmd_route route; } fixed[] = {
        {"/healthz", GEMMD_ROUTE_HEALTHZ}, {"/readyz", GEMMD_ROUTE_READYZ},
        {"/v1/info", GEMMD_ROUTE_INFO},    {"/metrics", GEMMD_ROUTE_METRICS},
    };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
        if (strcmp(url, fixed[i].path) == 0) {
            req->allow = "GET, HEAD";
            req->route = fixed[i].route;
            return get ? 0 : 1;
        }
    }
    return -1;
}

static enum MHD_Result dispatch_get(gemmd_request *req)
{
    switch (req->route) {
    case GEMMD_ROUTE_HEALTHZ: return gemmd_route_healthz(req);
    case GEMMD_ROUTE_READYZ: return gemmd_route_readyz(req);
    case GEMMD_ROUTE_INFO: return gemmd_route_info(req);
    case GEMMD_ROUTE_METRICS: return gemmd_route_metrics(req);
    case GEMMD_ROUTE_MATRIX_LIST: return gemmd_route_matrix_list(req);
    case GEMMD_ROUTE_MATRIX_GET:
    case GEMMD_ROUTE_MATRIX_DELETE:
        if (!req->job_id[0])
            return gemmd_respond_errorf(req, 404, "matrix_not_found", "that is not a matrix id ([instance_id-]32 hex digits)");
        return req->route == GEMMD_ROUTE_MATRIX_GET ? gemmd_route_matrix_get(req) : gemmd_route_matrix_delete(req);
    case GEMMD_ROUTE_JOB_STATUS:
    case GEMMD_ROUTE_JOB_RESULT:
    case GEMMD_ROUTE_JOB_DELETE:
        if (!req->job_id[0])
            return gemmd_respond_errorf(req, 404, "job_not_found",
                                        "that is not a job id ([instance_id-]32 hex digits)");
        if (req->route == GEMMD_ROUTE_JOB_STATUS) return gemmd_route_job_status(req);
        if (req->route == GEMMD_ROUTE_JOB_RESULT) return gemmd_route_job_result(req);
        return gemmd_route_job_delete(req);
    default: return gemmd_respond_errorf(req, 500, "internal_error", "no handler for this route");
    }
}

/* First call: everything that can be decided from the request line and headers. */
static enum MHD_Result start_request(gemmd_request *req, const char *url, const char *method)
{
    gemmd_server *srv = req->srv;
    int r = resolve(req, url, method);
    if (r < 0) {
        req->route = GEMMD_ROUTE_OTHER;
        return gemmd_respond_errorf(req, 404, "not_found",
                                    "no route %.60s; see GET /v1/info and the API reference", url);
    }
    if (r > 0)
        return gemmd_respond_errorf(req, 405, "method_not_allowed", "%.60s does not take %s (allowed: %s)", url,
                                    method, req->allow);
    if (srv->svc.auth && req->route != GEMMD_ROUTE_HEALTHZ && req->route != GEMMD_ROUTE_READYZ &&
        req->route != GEMMD_ROUTE_V2_HEALTH) {
        int who = gemmd_auth_identify(srv->svc.auth, gemmd_request_header(req, MHD_HTTP_HEADER_AUTHORIZATION));
        if (who < 0) {
            LOG_DEBUG("request refused: no known bearer token");
            return gemmd_respond_errorf(req, 401, "unauthorized",
                                        "this server needs \"Authorization: Bearer <token>\" with a known token");
        }
        req->owner = who + 1; /* jobs.h: 0 is "no tokens configured" */
    }

    if (gemmd_route_is_v2(req->route)) return gemmd_v2_start(req);
    if (req->route != GEMMD_ROUTE_MATMUL && req->route != GEMMD_ROUTE_JOBS_SUBMIT &&
        req->route != GEMMD_ROUTE_MATRIX_CREATE && req->route != GEMMD_ROUTE_MATRIX_PUT)
        return dispatch_get(req);

    if (atomic_load(&srv->stopping))
        return gemmd_respond_errorf(req, 503, "shutting_down", "the server is shutting down; retry elsewhere");
    if (gemmd_body_begin(req) != 0) {
        LOG_DEBUG("request refused before its body: %d %s", req->err.status, req->err.code);
        return gemmd_respond_error(req, &req->err);
    }
    req->answer = req->family;
    if (req->route == GEMMD_ROUTE_MATMUL) {
        req->answer = gemmd_negotiate(gemmd_request_header(req, MHD_HTTP_HEADER_ACCEPT), req->family);
        if (req->answer == GEMMD_FMT_NONE)
            return gemmd_respond_errorf(req, 406, "not_acceptable",
                                        "Accept offers nothing this server answers: use application/json, "
                                        "application/octet-stream or application/x-npy (or */*)");
    }
    req->phase = REQ_BODY;
    LOG_DEBUG("request body admitted: %s length=%s%llu limit=%llu", gemmd_format_mime(req->family),
              req->has_length ? "" : "chunked, at most ", (unsigned long long)(req->has_length ? req->content_length : req->limit),
              (unsigned long long)req->limit);
    return MHD_YES;
}

static enum MHD_Result body_complete(gemmd_request *req)
{
    if (gemmd_route_is_v2(req->route)) return gemmd_v2_body_done(req);
    if (req->failed) {
        LOG_DEBUG("request body refused: %d %s after %llu bytes", req->err.status, req->err.code,
                  (unsigned long long)req->bytes_in);
        return gemmd_respond_error(req, &req->err);
    }
    if (gemmd_body_finish(req) != 0) {
        LOG_DEBUG("request body refused: %d %s", req->err.status, req->err.code);
        return gemmd_respond_error(req, &req->err);
    }
    LOG_DEBUG("request body decoded: %s A %llux%llu B %llux%llu bytes=%llu recv_ms=%.3f decode_ms=%.3f",
              gemm_dtype_name(req->a.dtype), (unsigned long long)req->a.rows, (unsigned long long)req->a.cols,
              (unsigned long long)req->b.rows, (unsigned long long)req->b.cols, (unsigned long long)req->bytes_in,
              req->t_body_ms - req->t_start_ms, req->t_decoded_ms - req->t_body_ms);
    if (req->route == GEMMD_ROUTE_MATMUL) return gemmd_route_matmul(req);
    if (req->route == GEMMD_ROUTE_MATRIX_CREATE) return gemmd_route_matrix_create(req);
    if (req->route == GEMMD_ROUTE_MATRIX_PUT) return gemmd_route_matrix_put(req);
    return gemmd_route_jobs_submit(req);
}

/* A connection over connection_limit or per_ip_limit. On plain HTTP the 503 was written
 * when it was accepted: close it now that its request head came. Over TLS it is answered
 * here, and closed after the answer. */
static enum MHD_Result refuse_connection(gemmd_request *req, const char *code, const char *msg)
{
    req->route = GEMMD_ROUTE_OTHER;
    if (!req->srv->svc.cfg.tls_cert[0]) return MHD_NO;
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
        req = gemmd_request_new(srv, conn, method, url);
        if (!req) return MHD_NO;
        *con_cls = req;
        atomic_fetch_add(&srv->inflight, 1);
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
        gemmd_conn_body(req->cx, *upload_data_size);
        if (req->phase == REQ_BODY) {
            if (gemmd_route_is_v2(req->route)) gemmd_v2_body_feed(req, upload_data, *upload_data_size);
            else gemmd_body_feed(req, upload_data, *upload_data_size);
            if (req->failed && req->discarded > GEMMD_DISCARD_MAX) return MHD_NO;
        } else {
            req->bytes_in += *upload_data_size;
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (req->phase == REQ_DEFER) {
        enum MHD_Result rc = start_request(req, url ? url : "", method ? method : "");
        if (req->phase == REQ_BODY) return body_complete(req); /* an empty body */
        return rc;
    }
    if (req->phase == REQ_BODY) {
        enum MHD_Result rc = body_complete(req);
        if (req->phase == REQ_WAIT) gemmd_conn_wait(req->cx); /* no deadline on the engine */
        return rc;
    }
    if (req->phase == REQ_WAIT) return gemmd_route_matmul_resumed(req);
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
    int mat = req->route >= GEMMD_ROUTE_MATRIX_CREATE && req->route <= GEMMD_ROUTE_MATRIX_DELETE;
    if (req->job_id[0]) snprintf(job, sizeof job, " %s=%.*s", mat ? "matrix" : "job", GEMMD_JOB_LOG_ID(req->job_id));
    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK)
        LOG_INFO("request method=%s path=%s%s status=%d in=%llu out=%llu ms=%.3f", req->method, lp, job,
                 req->status, (unsigned long long)req->bytes_in, (unsigned long long)req->bytes_out, ms);
    else
        LOG_INFO("request method=%s path=%s%s status=%d in=%llu out=%llu ms=%.3f ended=%s", req->method, lp, job,
                 req->status, (unsigned long long)req->bytes_in, (unsigned long long)req->bytes_out, ms, reason);
    gemmd_metrics_request(req->route, req->status, ms / 1000.0, req->bytes_in,
                          toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? req->bytes_out : 0);
    gemmd_conn_request_done(req->cx);
    /* A product still on the engine (shutdown gave up on it) keeps req until its done(). */
    gemmd_request_release(req);
    atomic_fetch_sub(&srv->inflight, 1);
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

/* ---- what routes may ask of the HTTP layer (request.h) ----------------------------- */

gemmd_services *gemmd_server_services(gemmd_server *srv) { return &srv->svc; }

int gemmd_server_stopping(const gemmd_server *srv) { return atomic_load(&srv->stopping); }

int gemmd_server_inflight(const gemmd_server *srv) { return atomic_load(&srv->inflight); }

void gemmd_server_conns_stats(const gemmd_server *srv, gemmd_conns_stats *out)
{
    gemmd_conns_get_stats(srv->conns, out);
}

/* The stripe whose lock guards req (see struct gemmd_server): a multiplicative hash of its
 * address, so that requests allocated side by side spread over the stripes. */
static struct sync_stripe *stripe_of(gemmd_server *srv, const gemmd_request *req)
{
    uint64_t h = (uint64_t)(uintptr_t)req * 0x9E3779B97F4A7C15ull;
    return &srv->stripe[(h >> 32) % SYNC_STRIPES];
}

static pthread_mutex_t *lock_of(gemmd_server *srv, const gemmd_request *req)
{
    return &stripe_of(srv, req)->mu;
}

/* Caller holds req's stripe lock. */
static void pending_unlink(gemmd_server *srv, gemmd_request *req)
{
    struct sync_stripe *st = stripe_of(srv, req);
    if (req->pend_prev || st->pending == req) atomic_fetch_sub(&srv->npending, 1);
    if (req->pend_prev)
        req->pend_prev->pend_next = req->pend_next;
    else if (st->pending == req)
        st->pending = req->pend_next;
    if (req->pend_next) req->pend_next->pend_prev = req->pend_prev;
    req->pend_next = req->pend_prev = NULL;
}

/* Drops one reference (req's stripe lock held); 1 when the caller must free req after
 * unlocking. */
static int req_unref_locked(gemmd_request *req) { return --req->refs == 0; }

void gemmd_request_release(gemmd_request *req)
{
    pthread_mutex_t *mu = lock_of(req->srv, req);
    pthread_mutex_lock(mu);
    int last = req_unref_locked(req);
    pthread_mutex_unlock(mu);
    if (last) gemmd_request_free(req);
}

/* Shutdown: stopping is set with every stripe's lock held (taken in index order), so a
 * product that gemmd_sync_begin did not refuse is already on its stripe's list. */
static void set_stopping(gemmd_server *srv)
{
    for (int i = 0; i < SYNC_STRIPES; i++) pthread_mutex_lock(&srv->stripe[i].mu);
    atomic_store(&srv->stopping, 1);
    for (int i = SYNC_STRIPES - 1; i >= 0; i--) pthread_mutex_unlock(&srv->stripe[i].mu);
}

int gemmd_sync_begin(gemmd_request *req)
{
    gemmd_server *srv = req->srv;
    struct sync_stripe *st = stripe_of(srv, req);
    /* Listed before it is submitted, under a lock that shutdown holds while it sets
     * stopping: a product shutdown does not refuse is one it will find in the lists. */
    pthread_mutex_lock(&st->mu);
    if (atomic_load(&srv->stopping)) {
        pthread_mutex_unlock(&st->mu);
        return -1;
    }
    req->pend_prev = NULL;
    req->pend_next = st->pending;
    if (st->pending) st->pending->pend_prev = req;
    st->pending = req;
    atomic_fetch_add(&srv->npending, 1);
    req->refs++; /* the engine's, dropped by done() */
    req->phase = REQ_WAIT;
    pthread_mutex_unlock(&st->mu);
    return 0;
}

void gemmd_sync_refused(gemmd_request *req)
{
    gemmd_server *srv = req->srv;
    pthread_mutex_t *mu = lock_of(srv, req);
    pthread_mutex_lock(mu);
    pending_unlink(srv, req);
    req->refs--; /* never the last: the connection's is held */
    req->phase = REQ_BODY;
    pthread_mutex_unlock(mu);
}

/* Where the handshake stands (req's stripe lock held). */
static int sync_state_locked(const gemmd_request *req)
{
    return req->job_done ? GEMMD_SYNC_DONE : req->abandoned ? GEMMD_SYNC_ABANDONED : GEMMD_SYNC_SUSPENDED;
}

/* A small product (as the engine coalesces them) while at most spin_pending others are
 * in flight (req counts: gemmd_sync_begin listed it). */
static int small_and_few(const gemmd_server *srv, const gemmd_request *req)
{
    const gemm_job *job = &req->job;
    double mnk = (double)job->m * (double)job->n * (double)job->k * (double)gemm_job_batch(job);
    return mnk <= (double)srv->spin_mnk && atomic_load(&srv->npending) <= srv->spin_pending + 1;
}

int gemmd_sync_direct(const gemmd_request *req)
{
    return gemm_engine_runs_on_host(req->srv->svc.engine, &req->job) ||
           (req->srv->direct && small_and_few(req->srv, req));
}

/* A small product queued while the engine is nearly idle is done within tens of
 * microseconds: this HTTP thread polls for it (the lock is taken only once the job has
 * ended, for done()'s mark) and answers in the same call, instead of suspending the
 * connection and being woken to resume it (epoll changes and a wake-up through
 * libmicrohttpd's inter-thread channel). Only while at most spin_pending products are in
 * flight, so that under load the threads stay free for other connections. Returns with
 * mu (req's stripe lock) held. */
static void lock_after_spin(gemmd_server *srv, gemmd_request *req, pthread_mutex_t *mu)
{
    if (srv->spin_ns <= 0 || !small_and_few(srv, req)) {
        pthread_mutex_lock(mu);
        return;
    }
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned i = 0;; i++) {
        int st = atomic_load_explicit(&req->job.state, memory_order_acquire);
        if (st != GEMM_JOB_QUEUED && st != GEMM_JOB_RUNNING) { /* ended: done() marks it next */
            pthread_mutex_lock(mu);
            if (req->job_done || req->abandoned) return;
            pthread_mutex_unlock(mu);
        }
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
        if ((i & 31) == 0) {
            clock_gettime(CLOCK_MONOTONIC, &t);
            if ((long)(t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) >= srv->spin_ns) break;
        }
    }
    pthread_mutex_lock(mu);
}

int gemmd_sync_wait(gemmd_request *req)
{
    gemmd_server *srv = req->srv;
    /* Shutdown began while it was being submitted: cancel it now (done() may run here).
     * req cannot go away meanwhile: this connection holds it and is ours until we return. */
    if (atomic_load(&srv->stopping)) gemm_engine_cancel(srv->svc.engine, &req->job);
    pthread_mutex_t *mu = lock_of(srv, req);
    lock_after_spin(srv, req, mu);
    int r = sync_state_locked(req);
    if (r == GEMMD_SYNC_SUSPENDED) {
        req->suspended = 1;
        MHD_suspend_connection(req->conn);
    }
    pthread_mutex_unlock(mu);
    return r;
}

int gemmd_sync_status(gemmd_request *req)
{
    pthread_mutex_t *mu = lock_of(req->srv, req);
    pthread_mutex_lock(mu);
    int r = sync_state_locked(req);
    pthread_mutex_unlock(mu);
    return r;
}

void gemmd_sync_done(gemmd_request *req, int (*offload)(gemmd_request *req))
{
    gemmd_server *srv = req->srv;
    struct MHD_Connection *conn = req->conn;
    pthread_mutex_t *mu = lock_of(srv, req);
    pthread_mutex_lock(mu);
    pending_unlink(srv, req);
    if (offload && !req->abandoned && offload(req) == 0) {
        /* the offloaded answer resumes the connection and drops the engine's reference */
        pthread_mutex_unlock(mu);
        return;
    }
    req->job_done = 1;
    int resume = req->suspended;
    req->suspended = 0;
    int last = req_unref_locked(req); /* the engine's */
    pthread_mutex_unlock(mu);
    /* From here on req may be answered and freed by an HTTP thread (unless last): only
     * conn is used. A suspended connection stays open until resumed here, and MHD is
     * never stopped while one is suspended. */
    LOG_DEBUG("product done%s", last ? " (its connection was closed at shutdown)" : resume ? ": resuming" : "");
    if (resume) MHD_resume_connection(conn);
    if (last) gemmd_request_free(req);
}

void gemmd_sync_resume(gemmd_request *req, int engine_ref)
{
    struct MHD_Connection *conn = req->conn;
    pthread_mutex_t *mu = lock_of(req->srv, req);
    pthread_mutex_lock(mu);
    req->job_done = 1;
    int resume = req->suspended;
    req->suspended = 0;
    int last = engine_ref && req_unref_locked(req); /* a product's: done() handed it over */
    pthread_mutex_unlock(mu);
    if (resume) MHD_resume_connection(conn);
    if (last) gemmd_request_free(req);
}

int gemmd_sync_suspend_for(gemmd_request *req, int (*start)(gemmd_request *req))
{
    pthread_mutex_t *mu = lock_of(req->srv, req);
    pthread_mutex_lock(mu);
    if (start(req) != 0) {
        pthread_mutex_unlock(mu);
        return -1;
    }
    req->phase = REQ_WAIT;
    req->suspended = 1;
    MHD_suspend_connection(req->conn);
    pthread_mutex_unlock(mu);
    return 0;
}

/* The pending requests (all, or only those still queued), each with a hold taken, chained
 * on hold_next; gemmd_request_release() drops the holds. */
static gemmd_request *hold_pending(gemmd_server *srv, int queued_only)
{
    gemmd_request *held = NULL;
    for (int i = 0; i < SYNC_STRIPES; i++) {
        struct sync_stripe *st = &srv->stripe[i];
        pthread_mutex_lock(&st->mu);
        for (gemmd_request *r = st->pending; r; r = r->pend_next) {
            if (queued_only && atomic_load(&r->job.state) != GEMM_JOB_QUEUED) continue;
            r->refs++;
            r->hold_next = held;
            held = r;
        }
        pthread_mutex_unlock(&st->mu);
    }
    return held;
}

/* Cancels the pending synchronous products (only the queued ones unless running_too);
 * returns how many. */
static int cancel_pending(gemmd_server *srv, int running_too)
{
    int n = 0;
    gemmd_request *r = hold_pending(srv, !running_too);
    while (r) {
        gemmd_request *next = r->hold_next;
        /* Queued: done() runs right here (503 shutting_down). Running: asked to stop at
         * its next stage boundary. No lock is held: done() takes r's stripe lock. */
        gemm_engine_cancel(srv->svc.engine, &r->job);
        gemmd_request_release(r);
        r = next;
        n++;
    }
    return n;
}

/* Shutdown gives up on the pending products: each suspended connection is resumed to
 * answer 503 (the engine keeps its reference until done()); returns how many. */
static int abandon_pending(gemmd_server *srv)
{
    int n = 0;
    gemmd_request *resume = NULL;
    for (int i = 0; i < SYNC_STRIPES; i++) {
        struct sync_stripe *st = &srv->stripe[i];
        pthread_mutex_lock(&st->mu);
        for (gemmd_request *r = st->pending; r; r = r->pend_next) {
            r->abandoned = 1; /* one being submitted right now answers 503 instead of suspending */
            if (!r->suspended) continue;
            r->suspended = 0; /* done() will not resume it: we do */
            r->hold_next = resume;
            resume = r;
            n++;
        }
        pthread_mutex_unlock(&st->mu);
    }
    /* Each stays suspended (and so alive: its connection holds it) until resumed here. */
    while (resume) {
        gemmd_request *next = resume->hold_next;
        MHD_resume_connection(resume->conn);
        resume = next;
    }
    return n;
}

/* ---- start ------------------------------------------------------------------------ */

static uint64_t reclaim_kept(void *engine) { return gemm_engine_trim_kept(engine); }

static void budget_tick(void *budget) { gemmd_budget_tick(budget, (int64_t)gemm_now_ms()); }

/* The memory budget, the charging allocators and the connection limits and deadlines. */
static int start_limits(gemmd_server *s, gemm_err *err)
{
    struct gemmd_server_ext *x = (struct gemmd_server_ext *)s;
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
    s->alloc_ctx = (gemmd_budget_alloc_ctx){s->svc.budget, *base, GEMMD_MEM_INPUT, 0};
    s->svc.alloc = gemmd_budget_allocator(&s->alloc_ctx);
    /* Host memory is committed as the body writes it, on every backend (the CUDA engine
     * page-locks its blocks on the worker, before its copies, not when they are allocated). */
    gemmd_budget_lazy_allocator(&s->lazy_ctx, s->svc.budget, base, 0);
    s->svc.lazy_alloc = gemmd_budget_allocator(&s->lazy_ctx);
    s->svc.lazy_bodies = s->lazy_ctx.lazy;

    x->conns_cfg = (gemmd_conns_config){
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
    s->conns = gemmd_conns_new(&x->conns_cfg);
    if (!s->conns) return gemm_err_set(err, 500, "out_of_memory", "cannot allocate the connection table");
    s->svc.offload = gemmd_offload_new(GEMMD_OFFLOAD_THREADS);
    if (!s->svc.offload) return gemm_err_set(err, 500, "out_of_memory", "cannot start the offload threads");
    LOG_INFO("limits: memory budget %.0f MiB (max_inflight_mb%s), connections %d (%d per address), "
             "header_timeout %d s, request_timeout %d s, min_rate_kb %d, send_timeout %d s",
             (double)limit / (1024.0 * 1024.0), cfg->max_inflight_bytes ? "" : " = 0: half of this host's memory",
             cfg->connection_limit, cfg->per_ip_limit, cfg->header_timeout_s, cfg->request_timeout_s,
             cfg->min_rate_kb, cfg->send_timeout_s);
    return 0;
}

static char *read_file(const char *path, gemm_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        gemm_err_set(err, 500, "bad_config", "cannot read %s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            char *p = cap <= (1u << 24) ? realloc(buf, cap) : NULL;
            if (!p) {
                free(buf);
                fclose(f);
                gemm_err_set(err, 500, "bad_config", "%s is too large for a PEM file", path);
                return NULL;
            }
            buf = p;
        }
        size_t n = fread(buf + len, 1, 4096, f);
        len += n;
        if (n < 4096) break;
    }
    fclose(f);
    buf[len] = '\0';
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

static int parse_listen(const char *listen, int port, struct sockaddr_storage *ss, socklen_t *len, char *host,
                        size_t hostlen)
{
    char buf[80];
    snprintf(buf, sizeof buf, "%s", listen);
    char *h = buf;
    size_t n = strlen(h);
    if (n >= 2 && h[0] == '[' && h[n - 1] == ']') {
        h[n - 1] = '\0';
        h++;
    }
    if (strcmp(h, "localhost") == 0) h = "127.0.0.1";
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *a = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, h, &a->sin_addr) == 1) {
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)port);
        *len = sizeof *a;
        snprintf(host, hostlen, "%s", h);
        return 0;
    }
    if (inet_pton(AF_INET6, h, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        *len = sizeof *a6;
        snprintf(host, hostlen, "[%s]", h);
        return 0;
    }
    return -1;
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

gemmd_server *gemmd_http_start(const gemmd_config *cfg, gemm_engine *engine, gemm_err *err)
{
    return gemmd_http_start_fd(cfg, engine, -1, err);
}

gemmd_server *gemmd_http_start_fd(const gemmd_config *cfg, gemm_engine *engine, int listen_fd, gemm_err *err)
{
    struct gemmd_server_ext *x = calloc(1, sizeof *x);
    if (!x) {
        if (listen_fd >= 0) close(listen_fd);
        gemm_err_set(err, 500, "out_of_memory", "cannot allocate the server");
        return NULL;
    }
    gemmd_server *s = &x->s;
    x->quiesced = MHD_INVALID_SOCKET;
    s->svc.cfg = *cfg;
    s->svc.engine = engine;
    gemm_engine_describe(engine, &s->svc.info);
    for (int i = 0; i < SYNC_STRIPES; i++) /* lock order: struct gemmd_server */
        pthread_mutex_init(&s->stripe[i].mu, NULL);

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
    s->svc.jobs = gemmd_jobs_new(engine, cfg->job_ttl_s, cfg->job_mem_bytes, cfg->max_jobs);
    s->svc.matrices = gemmd_matrices_new(engine, cfg->resident_bytes, cfg->max_matrices);
    if (!s->svc.jobs || !s->svc.matrices) {
        gemm_err_set(err, 500, "out_of_memory", "cannot allocate the job store");
        goto fail;
    }
    gemmd_jobs_set_memory(s->svc.jobs, &s->svc.alloc, s->svc.budget);

    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (ss.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    int tls = cfg->tls_cert[0] && cfg->tls_key[0];
    if (tls) {
        x->tls_cert = read_file(cfg->tls_cert, err);
        x->tls_key = x->tls_cert ? read_file(cfg->tls_key, err) : NULL;
        if (!x->tls_key || check_tls(cfg, x->tls_cert, x->tls_key, err) != 0) goto fail;
        flags |= MHD_USE_TLS;
    }
    unsigned threads = (unsigned)gemmd_config_http_threads(cfg);
    s->spin_ns = (long)cfg->answer_spin_us * 1000L;
    s->spin_pending = (int)(threads / 4); /* others in flight: a quarter of the threads */
    s->spin_mnk = gemm_engine_small_mnk(engine); /* "small" as the engine coalesces it */
    s->direct = cfg->direct_run;
    unsigned mhd_limit = gemmd_conns_mhd_limit(&x->conns_cfg);
    /* Bind cfg->listen, or adopt the socket a restarted daemon handed over. */
    if (listen_fd < 0 && (listen_fd = listen_on(&ss, sslen, host, cfg->port, err)) < 0) goto fail;
    struct MHD_OptionItem strict[2];
    gemmd_framing_options(strict);
    /* HTTPS: certificate, key, and the protocol versions and ciphers offered. */
    struct MHD_OptionItem tls_opts[4] = {{MHD_OPTION_END, 0, NULL}};
    if (tls) {
        tls_opts[0] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, x->tls_cert};
        tls_opts[1] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, x->tls_key};
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
        MHD_OPTION_NOTIFY_CONNECTION, gemmd_conns_notify, s->conns,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)x->conns_cfg.mhd_buffer,
        /* libmicrohttpd 0.9.7x reads into half of the connection's buffer and grows that
         * only when it is full, which a body consumed as it arrives never makes it. With
         * an increment of the whole buffer each read grows it until a few KiB are left, so
         * a large body comes in reads of almost the whole buffer, in fewer passes of the
         * event loop; small requests cost the same (the library clears the whole buffer
         * between requests either way). 1.0 grows by other rules: its default is kept. */
        MHD_OPTION_CONNECTION_MEMORY_INCREMENT, gemmd_read_increment((size_t)x->conns_cfg.mhd_buffer),
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_ARRAY, tls_opts, MHD_OPTION_END);
    if (!s->daemon) {
        gemm_err_set(err, 500, "internal_error", "libmicrohttpd did not start on %s port %d (see the log above)",
                     cfg->listen, cfg->port);
        goto fail;
    }
    listen_fd = -1; /* the daemon owns it now */
    if (gemmd_conns_start(s->conns) != 0) {
        gemm_err_set(err, 500, "internal_error", "cannot start the connection watchdog");
        MHD_stop_daemon(s->daemon);
        goto fail;
    }
    /* the port is cfg->port: bound here, or checked on the socket handed over (restart.c) */
    snprintf(s->url, sizeof s->url, "%s://%s:%d", tls ? "https" : "http", host, cfg->port);
    return s;

fail:
    if (listen_fd >= 0) close(listen_fd);
    gemmd_jobs_free(s->svc.jobs);
    gemmd_matrices_free(s->svc.matrices);
    gemmd_conns_free(s->conns);
    gemmd_offload_free(s->svc.offload);
    if (s->svc.budget) gemm_engine_set_keep_charge(s->svc.engine, NULL, NULL); /* off the budget first */
    gemmd_budget_free(s->svc.budget);
    gemmd_auth_free(s->svc.auth);
    for (int i = 0; i < SYNC_STRIPES; i++) pthread_mutex_destroy(&s->stripe[i].mu);
    free(x->tls_cert);
    free(x->tls_key);
    free(x);
    return NULL;
}

const char *gemmd_http_url(const gemmd_server *s) { return s->url; }

/* ---- shutdown ---------------------------------------------------------------------- */

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int engine_idle(gemm_engine *e, int *running)
{
    gemm_engine_stats st;
    gemm_engine_get_stats(e, &st);
    if (running) *running = st.running + st.queued;
    return st.queued == 0 && st.running == 0;
}

/* Waits until the engine holds no job, at most limit_ms (< 0: however long it takes).
 * Returns 1 when it is idle. */
static int wait_engine_idle(gemm_engine *e, double limit_ms)
{
    double t0 = gemm_now_ms(), said = t0;
    int n = 0;
    while (!engine_idle(e, &n)) {
        double now = gemm_now_ms();
        if (limit_ms >= 0 && now - t0 >= limit_ms) return 0;
        if (limit_ms < 0 && now - said >= 30000.0) {
            LOG_WARN("shutdown: still waiting for %d products to leave the engine (%.0f s)", n, (now - t0) / 1000.0);
            said = now;
        }
        sleep_ms(10);
    }
    return 1;
}

/* The graceful stop: no new connections or products; queued work fails with 503; running
 * async jobs are cancelled (nobody could fetch them); running synchronous products get
 * shutdown_timeout to finish. Past it they are asked to stop, and whatever is still
 * suspended is resumed and answered 503, so that MHD_stop_daemon() never meets a
 * suspended connection. Only once the engine holds none of our jobs (their done()
 * touches the server and the store) is anything freed. */
static int shutdown_server(gemmd_server *s, int keep_socket)
{
    struct gemmd_server_ext *x = (struct gemmd_server_ext *)s;
    x->quiesced = MHD_quiesce_daemon(s->daemon); /* no new connections */

    set_stopping(s); /* no new products, from keep-alive connections either */
    cancel_pending(s, 0); /* queued products answer 503 shutting_down */
    gemmd_jobs_shutdown(s->svc.jobs);      /* async jobs: queued cancelled, running asked to stop */

    double limit_ms = s->svc.cfg.shutdown_timeout_s * 1000.0;
    if (!wait_engine_idle(s->svc.engine, limit_ms)) {
        int n = cancel_pending(s, 1);
        LOG_WARN("shutdown: %d products still running after shutdown_timeout (%d s): asked them to stop", n,
                 s->svc.cfg.shutdown_timeout_s);
        /* A product that stops at a stage boundary answers itself; give it a moment, but
         * no more than the timeout itself (0: everything is answered at once). */
        wait_engine_idle(s->svc.engine, limit_ms < 2000.0 ? limit_ms : 2000.0);
    }
    /* Whatever is still waiting is answered now, whatever the time: even a product listed
     * just before stopping was set and not yet on the engine when it looked idle. */
    int n = abandon_pending(s);
    if (n) LOG_WARN("shutdown: answered %d waiting clients with 503; their products are left to end", n);
    /* Give the answers in flight a moment to go out. */
    double t0 = gemm_now_ms();
    while (atomic_load(&s->inflight) > 0 && gemm_now_ms() - t0 < 3000.0) sleep_ms(5);
    if (atomic_load(&s->inflight) > 0)
        LOG_WARN("shutdown: closing %d requests that did not finish in time", atomic_load(&s->inflight));

    gemmd_offload_drain(s->svc.offload); /* answers being encoded are finished and resumed */
    gemmd_conns_stop(s->conns); /* no deadline may fire while MHD closes what is left */
    MHD_stop_daemon(s->daemon); /* nothing is suspended any more */
    wait_engine_idle(s->svc.engine, -1.0);
    int kept = -1;
    if (x->quiesced != MHD_INVALID_SOCKET) {
        int fl = keep_socket ? fcntl(x->quiesced, F_GETFD) : -1;
        if (fl >= 0 && fcntl(x->quiesced, F_SETFD, fl & ~FD_CLOEXEC) == 0)
            kept = x->quiesced;
        else
            close(x->quiesced);
    }
    gemmd_jobs_free(s->svc.jobs);
    gemmd_matrices_free(s->svc.matrices); /* no request holds one any more */
    gemmd_conns_free(s->conns);
    gemmd_offload_free(s->svc.offload);
    if (s->svc.budget) gemm_engine_set_keep_charge(s->svc.engine, NULL, NULL); /* off the budget first */
    gemmd_budget_free(s->svc.budget);
    gemmd_auth_free(s->svc.auth);
    for (int i = 0; i < SYNC_STRIPES; i++) pthread_mutex_destroy(&s->stripe[i].mu);
    free(x->tls_cert);
    free(x->tls_key);
    free(x);
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
