/*
 * http.c - the libmicrohttpd daemon: the services and limits it starts with, its options,
 * and the graceful stop. What happens to each request is access.c's.
 */
#include "http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "access.h"
#include "auth.h"
#include "framing.h"
#include "log.h"
#include "offload.h"
#include "request.h"

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

/* The read increment for a connection buffer (see gemmd_http_start_fd). */
#if MHD_VERSION < 0x01000000
#define READ_INCREMENT(buffer) (buffer)
#else
#define READ_INCREMENT(buffer) ((void)(buffer), (size_t)1024)
#endif

/* ---- start ------------------------------------------------------------------------ */

static uint64_t reclaim_kept(void *engine) { return gemm_engine_trim_kept(engine); }
static void admit_kick(void *admit) { gemmd_admit_kick(admit); }

static void budget_tick(void *budget) { gemmd_budget_tick(budget, (int64_t)gemm_now_ms()); }

/* The memory budget, the charging allocators, the admission queue and the connection limits
 * and deadlines (docs/OPERATIONS.md, "Memory budget", "Connections and deadlines"). */
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
    /* memory the engine keeps for reuse is charged as "cache" */
    gemmd_budget_set_reclaim(s->svc.budget, reclaim_kept, s->svc.engine);
    gemm_engine_set_keep_charge(s->svc.engine, gemmd_budget_keep_charge, s->svc.budget);
    const gemm_allocator *base = gemm_engine_allocator(s->svc.engine);
    s->svc.base_alloc = *base;
    s->alloc_ctx = (gemmd_budget_alloc_ctx){s->svc.budget, *base, GEMMD_MEM_INPUT, NULL};
    s->svc.alloc = gemmd_budget_allocator(&s->alloc_ctx);
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

/* A PEM file (at most 16 MiB), read straight into one buffer of its size: no stdio buffer
 * or grown copy keeps a private key's text in freed memory. */
static char *read_file(const char *path, gemm_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    char *buf = NULL;
    if (fd < 0 || fstat(fd, &st) != 0) {
        gemm_err_set(err, 500, "bad_config", "cannot read %s: %s", path, strerror(errno));
    } else if (st.st_size > (1 << 24)) {
        gemm_err_set(err, 500, "bad_config", "%s is too large for a PEM file", path);
    } else if (!(buf = calloc(1, (size_t)st.st_size + 1))) {
        gemm_err_set(err, 500, "out_of_memory", "cannot read %s", path);
    } else {
        for (ssize_t n, got = 0; got < st.st_size && (n = read(fd, buf + got, (size_t)(st.st_size - got))) > 0;)
            got += n;
    }
    if (fd >= 0) close(fd);
    return buf;
}

/* The private key's text, wiped before it is freed (libmicrohttpd has taken it by then). */
static void drop_key(gemmd_server *s)
{
    if (s->tls_key) explicit_bzero(s->tls_key, strlen(s->tls_key));
    free(s->tls_key);
    s->tls_key = NULL;
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
        MHD_OPTION_EXTERNAL_LOGGER, gemmd_access_log, NULL, MHD_OPTION_HTTPS_MEM_CERT, cert,
        MHD_OPTION_HTTPS_MEM_KEY, key, MHD_OPTION_HTTPS_PRIORITIES, priorities, MHD_OPTION_END);
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
    drop_key(s);
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
    unsigned threads = (unsigned)gemmd_config_http_threads(cfg);
    s->svc.jobs = gemmd_jobs_new(engine, &s->svc.alloc, s->svc.budget, cfg->job_ttl_s, cfg->job_mem_bytes,
                                 cfg->max_jobs, cfg->token_share);
    s->svc.matrices = gemmd_matrices_new(engine, s->svc.budget, cfg->resident_bytes, cfg->max_matrices,
                                         cfg->token_share, cfg->job_ttl_s);
    /* direct_run: a product as small as the engine coalesces, while at most a quarter of
     * the threads' worth of others wait */
    s->svc.sync = gemmd_sync_new(engine, &s->svc.stopping, cfg->direct_run, gemm_engine_small_mnk(engine),
                                 (int)(threads / 4));
    if (!s->svc.jobs || !s->svc.matrices || !s->svc.sync) {
        gemm_err_set(err, 500, "out_of_memory", "cannot allocate the job and matrix stores");
        goto fail;
    }

    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (ss.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    int tls = cfg->tls_cert[0] && cfg->tls_key[0];
    if (tls) {
        s->tls_cert = read_file(cfg->tls_cert, err);
        s->tls_key = s->tls_cert ? read_file(cfg->tls_key, err) : NULL;
        if (!s->tls_key || check_tls(cfg, s->tls_cert, s->tls_key, err) != 0) goto fail;
        flags |= MHD_USE_TLS;
    }
    if (listen_fd < 0 && (listen_fd = listen_on(&ss, sslen, host, cfg->port, err)) < 0) goto fail;
    struct MHD_OptionItem strict[2];
    gemmd_framing_options(strict);
    /* HTTPS: certificate, key, and the protocol versions and ciphers offered (plain HTTP:
     * only the END item). */
    struct MHD_OptionItem tls_opts[4] = {{MHD_OPTION_HTTPS_MEM_CERT, 0, s->tls_cert},
                                         {MHD_OPTION_HTTPS_MEM_KEY, 0, s->tls_key},
                                         {MHD_OPTION_HTTPS_PRIORITIES, 0, (void *)cfg->tls_priorities},
                                         {MHD_OPTION_END, 0, NULL}};
    s->daemon = MHD_start_daemon(
        flags, (uint16_t)cfg->port, NULL, NULL, gemmd_access, &s->svc, MHD_OPTION_EXTERNAL_LOGGER,
        gemmd_access_log, NULL, MHD_OPTION_LISTEN_SOCKET, listen_fd, MHD_OPTION_THREAD_POOL_SIZE, threads,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->connection_timeout_s,
        /* framing.h: the request target is judged before its query is split */
        MHD_OPTION_URI_LOG_CALLBACK, gemmd_framing_on_target, NULL, MHD_OPTION_ARRAY, strict,
        /* room over connection_limit: gemmd answers the connections over its limits itself */
        MHD_OPTION_CONNECTION_LIMIT, gemmd_conns_mhd_limit(&s->conns_cfg), MHD_OPTION_PER_IP_CONNECTION_LIMIT, 0u,
        MHD_OPTION_NOTIFY_CONNECTION, gemmd_conns_notify, s->svc.conns,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)s->conns_cfg.mhd_buffer,
        /* 0.9.7x reads into half of the buffer and grows it only when full, which a body
         * consumed as it arrives never makes it: an increment of the whole buffer lets a
         * large body come in fewer, larger reads. 1.0 grows by other rules. */
        MHD_OPTION_CONNECTION_MEMORY_INCREMENT, READ_INCREMENT((size_t)s->conns_cfg.mhd_buffer),
        MHD_OPTION_NOTIFY_COMPLETED, gemmd_access_completed, &s->svc,
        MHD_OPTION_ARRAY, tls ? tls_opts : tls_opts + 3, MHD_OPTION_END);
    drop_key(s); /* GnuTLS holds the key now */
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
int gemmd_http_shutdown(gemmd_server *s, int keep_socket)
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
