/*
 * conns.h - every connection's deadlines, and fair limits on how many are open
 * (docs/OPERATIONS.md, "Connections and deadlines", says why libmicrohttpd's own do not do):
 * a watchdog thread shuts down the socket of one past its deadline, answers 503 over a
 * limit, and lingers on a close so that unread bytes cause no reset. Thread-safe: one mutex
 * for the registry; the per-request hooks are lock-free.
 */
#ifndef GEMMD_CONNS_H
#define GEMMD_CONNS_H

#include <microhttpd.h>
#include <stdint.h>

typedef struct gemmd_conns gemmd_conns;
typedef struct gemmd_conn gemmd_conn;

typedef struct {
    int connection_limit;      /* connections admitted at once (at least 1) */
    int per_ip_limit;          /* from one address (0: no limit) */
    double header_timeout_s;   /* 0: none */
    double request_timeout_s;  /* 0: none */
    double send_timeout_s;     /* 0: none */
    double min_rate;           /* bytes per second (0: none) */
    int plain_http;            /* 1: a connection closed before its head may get a canned
                                  answer written on the socket (not over TLS) */
    uint64_t mhd_buffer;       /* bytes of libmicrohttpd's buffer per connection: what it may
                                  hold of an answer beyond what reached the socket */
    void (*tick)(void *ctx);   /* called by the watchdog every WATCH_MS, no lock held (or NULL) */
    void *tick_ctx;
} gemmd_conns_config;

/* MHD's connection limit for cfg: connection_limit plus room to answer the refused.
 * pending_room: how many may be open before a newcomer closes one that sent no request
 * (a quarter of that room; the rest is for those MHD is still closing). */
unsigned gemmd_conns_mhd_limit(const gemmd_conns_config *cfg);
unsigned gemmd_conns_pending_room(const gemmd_conns_config *cfg);

/* start: the watchdog thread (0 or -1); stop: before MHD_stop_daemon; free: after it. */
gemmd_conns *gemmd_conns_new(const gemmd_conns_config *cfg);
int gemmd_conns_start(gemmd_conns *c);
void gemmd_conns_stop(gemmd_conns *c);
void gemmd_conns_free(gemmd_conns *c);

/* The MHD_OPTION_NOTIFY_CONNECTION callback (cls: the gemmd_conns): open registers a
 * connection and counts it against the limits (NULL when out of memory: no deadlines, but
 * it works); close frees it as MHD is about to close it. */
void gemmd_conns_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                        enum MHD_ConnectionNotificationCode code);
gemmd_conn *gemmd_conns_open(gemmd_conns *c, int fd, const struct sockaddr *client);
void gemmd_conns_close(gemmd_conns *c, gemmd_conn *x);
gemmd_conn *gemmd_conn_of(struct MHD_Connection *conn); /* NULL if it has no record */

/* Where the connection's request is (c may be NULL: then they do nothing). */
void gemmd_conn_head(gemmd_conn *c);                 /* the request head is complete */
void gemmd_conn_body(gemmd_conn *c, uint64_t bytes); /* body bytes arrived */
void gemmd_conn_wait(gemmd_conn *c);                 /* suspended on the engine */
void gemmd_conn_answer(gemmd_conn *c);               /* an answer is queued */
void gemmd_conn_progress(gemmd_conn *c, uint64_t taken); /* bytes of the answer taken so far */
/* Whether the send deadline of an answer of this size needs gemmd_conn_progress: only
 * past send_timeout x min_rate bytes; a smaller one may go to MHD without a reader. */
int gemmd_conn_needs_progress(const gemmd_conn *c, uint64_t bytes);
int gemmd_answer_needs_progress(const gemmd_conns_config *cfg, uint64_t bytes);
void gemmd_conn_request_done(gemmd_conn *c);         /* the request ended (keep-alive: the
                                                        next head is waited for) */

/* A suspended connection does not notice a client that goes away: watched, the watchdog
 * looks for a FIN every round and then calls left(arg) once, from its thread, no lock held.
 * unwatch: 1 when left has not been called (the caller keeps what it gave left), else 0. */
void gemmd_conn_watch(gemmd_conn *c, void (*left)(void *arg), void *arg);
int gemmd_conn_unwatch(gemmd_conn *c);

/* The request target's verdict (framing.h), noted before the request's first call. */
void gemmd_conn_set_target(gemmd_conn *c, int verdict);
int gemmd_conn_take_target(gemmd_conn *c);

/* A hash of the client's address (0 for a connection the registry does not know). */
uint64_t gemmd_conn_addr_hash(const gemmd_conn *x);

/* Over a limit: NULL when admitted, else the error code to answer 503 with
 * ("too_many_connections" or "too_many_connections_from_address") and *message. */
const char *gemmd_conn_refusal(gemmd_conn *c, const char **message);

typedef struct {
    int open, admitted;
    uint64_t accepted, refused_limit, refused_ip, evicted;
    uint64_t closed_header, closed_body, closed_request, closed_send;
    uint64_t left;             /* clients gone while their request waited */
} gemmd_conns_stats;
void gemmd_conns_get_stats(gemmd_conns *c, gemmd_conns_stats *out);

#endif
