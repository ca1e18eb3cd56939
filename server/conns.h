/*
 * conns.h - every connection's deadlines, and fair limits on how many are open.
 *
 * libmicrohttpd's own timeout is an idle timer: a client sending one byte a second keeps
 * a connection forever (0.9.75, Debian 12, offers only that: MHD_OPTION_CONNECTION_TIMEOUT
 * and its per-connection form, MHD_CONNECTION_OPTION_TIMEOUT; no head, body or rate
 * deadline, and its connection limits close the connections over them unanswered). Here each connection is registered when MHD accepts it
 * (MHD_OPTION_NOTIFY_CONNECTION) and the access handler reports where its request is;
 * a watchdog thread looks at all of them every WATCH_MS and shuts down the socket of one
 * past its deadline (shutdown(2): MHD then sees the end of the stream and closes and
 * cleans up the connection itself, on its own thread):
 *
 *   waiting for a request head   header_timeout after the connection opened or the
 *                                previous answer went out (not while bytes the client
 *                                sent wait unread in the socket: then MHD is behind,
 *                                not the client)
 *   receiving the body           request_timeout after the head began to be waited for
 *                                (the whole request), and never slower than min_rate
 *                                once header_timeout has passed since the head: by then
 *                                it must have sent min_rate x (elapsed - header_timeout)
 *                                (bytes waiting unread in the socket count as sent)
 *   product on the engine        none (the connection is suspended; it is never shut
 *                                down under a product that still runs)
 *   sending the answer           send_timeout after it was queued, plus one second for
 *                                each min_rate bytes the client has taken
 *
 * Limits: MHD is given room for more connections than connection_limit, so that the ones
 * over a limit are answered 503 (JSON, Connection: close) instead of closed unanswered.
 * When all connection_limit places are taken, a new connection displaces the connection
 * that has waited longest for a request head among the address that holds the most
 * connections (if that address holds more than the newcomer's): idle floods and slow
 * heads cannot lock others out. Over per_ip_limit a connection is refused.
 *
 * Connections that have not sent a request yet (a TLS handshake in progress, a refused
 * connection waiting to be answered) may fill only a quarter of that room: past it, a newcomer
 * closes the oldest of them, a refused one first, else one of the address holding the most.
 * libmicrohttpd stops accepting when its own limit is reached (new connections then wait
 * in the kernel's backlog, /healthz too), and a flood of handshakes that never finish must
 * not get it there.
 *
 * Lingering close: when MHD closes a connection whose client has not closed its side (an
 * answer given before a body was read, Connection: close), the socket is kept open a moment
 * (at most 2 s and 64 MiB; LINGER_MAX sockets at once, half of them for clients that have
 * sent nothing unread) and what the client still sends is read and dropped, the watchdog
 * polling them: a close with unread data would reset the connection, and a client still
 * sending its body would lose the answer. The watchdog also calls cfg.tick every WATCH_MS.
 *
 * Thread-safe: one mutex for the registry; the per-request hooks are lock-free.
 */
#ifndef GEMMD_CONNS_H
#define GEMMD_CONNS_H

#include <microhttpd.h>
#include <stdint.h>

typedef struct gemmd_conns gemmd_conns;
typedef struct gemmd_conn gemmd_conn;

typedef struct {
    int connection_limit;      /* connections admitted at once */
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

/* MHD's connection limit for cfg: connection_limit plus room to answer the refused. */
unsigned gemmd_conns_mhd_limit(const gemmd_conns_config *cfg);
/* Connections open at most before a newcomer closes one that has not sent a request:
 * connection_limit plus a quarter of MHD's room over it (the rest is for those being
 * closed, which MHD counts until its thread has cleaned them up). */
unsigned gemmd_conns_pending_room(const gemmd_conns_config *cfg);

gemmd_conns *gemmd_conns_new(const gemmd_conns_config *cfg);
/* Starts the watchdog thread: 0 or -1. */
int gemmd_conns_start(gemmd_conns *c);
/* Stops the watchdog (before MHD_stop_daemon). */
void gemmd_conns_stop(gemmd_conns *c);
/* After MHD_stop_daemon (every connection is closed by then). */
void gemmd_conns_free(gemmd_conns *c);

/* A connection MHD accepted (its socket, the client's address): registered, counted against
 * the limits (refused, or making room, as above). NULL when out of memory (then it has no
 * deadlines, but works). gemmd_conns_close: MHD is about to close it (a lingering close may
 * keep its socket a moment); x is freed. gemmd_conns_notify calls both. */
gemmd_conn *gemmd_conns_open(gemmd_conns *c, int fd, const struct sockaddr *client);
void gemmd_conns_close(gemmd_conns *c, gemmd_conn *x);

/* The MHD_OPTION_NOTIFY_CONNECTION callback (cls: the gemmd_conns). */
void gemmd_conns_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                        enum MHD_ConnectionNotificationCode code);

/* The record of an MHD connection (NULL if it has none). */
gemmd_conn *gemmd_conn_of(struct MHD_Connection *conn);

/* Where the connection's request is (c may be NULL: then they do nothing). */
void gemmd_conn_head(gemmd_conn *c);                 /* the request head is complete */
void gemmd_conn_body(gemmd_conn *c, uint64_t bytes); /* body bytes arrived */
void gemmd_conn_wait(gemmd_conn *c);                 /* suspended on the engine */
void gemmd_conn_answer(gemmd_conn *c, uint64_t bytes); /* an answer of that size is queued */
void gemmd_conn_progress(gemmd_conn *c, uint64_t taken); /* bytes of the answer taken so far */
/* Whether the send deadline of an answer of this size depends on gemmd_conn_progress: only
 * when it is larger than send_timeout x min_rate (a smaller one, taken at min_rate, is
 * done within send_timeout anyway). An answer that needs none may be handed to
 * libmicrohttpd as it lies, without a reader callback. */
int gemmd_conn_needs_progress(const gemmd_conn *c, uint64_t bytes);
/* The same rule for a configuration (0 for a connection the registry does not know). */
int gemmd_answer_needs_progress(const gemmd_conns_config *cfg, uint64_t bytes);
void gemmd_conn_request_done(gemmd_conn *c);         /* the request ended (keep-alive: the
                                                        next head is waited for) */

/* While a request waits (for admission, for the engine) its connection is suspended, and
 * MHD does not notice a client that goes away. Watched, the watchdog looks for it every
 * round (a FIN, even behind unread bytes; a half-closed client counts as gone) and then
 * calls left(arg) once, from its thread, no lock held. unwatch: 1 when left has not been
 * called (the caller keeps what it gave left), else 0. (A client that leaves while its body
 * arrives is closed by the watchdog on its own.) */
void gemmd_conn_watch(gemmd_conn *c, void (*left)(void *arg), void *arg);
int gemmd_conn_unwatch(gemmd_conn *c);

/* The verdict on the request target (framing.h's GEMMD_TARGET_*), noted before the request's
 * first call and taken (cleared) by it. */
void gemmd_conn_set_target(gemmd_conn *c, int verdict);
int gemmd_conn_take_target(gemmd_conn *c);

/* Over a limit: NULL when admitted, else the error code to answer 503 with
 * ("too_many_connections" or "too_many_connections_from_address") and *message. */
const char *gemmd_conn_refusal(gemmd_conn *c, const char **message);

typedef struct {
    int open, admitted, max_open;
    uint64_t accepted, refused_limit, refused_ip, evicted;
    uint64_t closed_header, closed_body, closed_request, closed_send;
    uint64_t left;             /* clients gone while their request waited */
} gemmd_conns_stats;
void gemmd_conns_get_stats(gemmd_conns *c, gemmd_conns_stats *out);

#endif
