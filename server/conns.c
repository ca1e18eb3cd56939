/*
 * conns.c - the connection registry, the limits and the deadline watchdog (see conns.h).
 *
 * Safety of shutdown(2) from the watchdog: a record leaves the registry in MHD's
 * NOTIFY_CONNECTION CLOSED callback, which MHD calls before it closes the socket, and
 * the watchdog only touches sockets of records it finds in the registry while it holds
 * the registry's lock (which that callback needs): a socket is never shut down after its
 * number could have been reused.
 */
#define _GNU_SOURCE /* POLLRDHUP */
#include "conns.h"

#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gemm_types.h"
#include "log.h"

#define WATCH_MS 50
#define REFUSED_LINGER_US 1000000 /* a refused connection is closed after this at the latest */
#define LINGER_MAX 128            /* sockets in a lingering close at once (more: closed at once) */
#define LINGER_US 2000000         /* a lingering close lasts at most this long */
#define LINGER_BYTES (64ull << 20) /* and reads at most this much */

enum { ST_HEAD = 0, ST_BODY, ST_WAIT, ST_SEND };
enum { REF_NONE = 0, REF_LIMIT, REF_IP };

struct gemmd_conn {
    gemmd_conns *owner;
    int fd;
    unsigned char addr[16];     /* IPv4 as ::ffff:a.b.c.d */
    char addr_text[48];
    int64_t t_open_us;
    _Atomic int state;
    _Atomic int64_t t_req_us;   /* the current request's head is waited for since */
    _Atomic int64_t t_mark_us;  /* BODY: head complete; SEND: answer queued */
    _Atomic uint64_t bytes;     /* BODY: body bytes; SEND: answer bytes taken */
    _Atomic int requests;       /* requests that ended on this connection */
    _Atomic int target;         /* the current request target's verdict (framing.h) */
    _Atomic int refused;        /* set once, when it opens; read by its requests without the lock */
    /* under the registry lock: */
    int closing, counted;
    int watched;                /* gemmd_conn_watch: look for the client leaving */
    void (*left)(void *arg);    /* ...and then call this */
    void *left_arg;
    gemmd_conn *prev, *next;
};

typedef struct {
    unsigned char addr[16];
    int count;                  /* 0: empty slot */
} ip_slot;

typedef struct {
    int fd;
    int64_t t_us;
    uint64_t bytes;
} lingerer;

struct gemmd_conns {
    gemmd_conns_config cfg;
    int64_t header_us, request_us, send_us;
    pthread_mutex_t mu;
    int wake;                   /* eventfd: wakes the watchdog (a lingering socket, stop) */
    pthread_t thread;
    int running, stop;
    gemmd_conn *head;
    gemmd_conns_stats st;       /* open and admitted now, and the counters */
    ip_slot *ips;
    size_t ip_cap;              /* power of two, > 2x the most connections MHD holds */
    int lingering;              /* sockets handed over for a lingering close, not yet closed */
    int nfresh;
    lingerer fresh[LINGER_MAX]; /* handed over, not yet taken by the watchdog */
    int nmine;
    lingerer mine[LINGER_MAX];  /* the watchdog's own: touched by no other thread */
};

static void wake(gemmd_conns *c)
{
    uint64_t one = 1;
    ssize_t n = write(c->wake, &one, sizeof one); /* a full counter is a pending wake-up too */
    (void)n;
}

static int64_t now_us(void) { return (int64_t)(gemm_now_ms() * 1000.0); }

/* connection_limit is at least 1 (config.c's range). */
unsigned gemmd_conns_mhd_limit(const gemmd_conns_config *cfg)
{
    unsigned lim = (unsigned)cfg->connection_limit;
    return lim + (lim / 2 < 64 ? 64 : lim / 2);
}

unsigned gemmd_conns_pending_room(const gemmd_conns_config *cfg)
{
    unsigned lim = (unsigned)cfg->connection_limit;
    return lim + (gemmd_conns_mhd_limit(cfg) - lim) / 4; /* the rest: those being closed */
}

gemmd_conns *gemmd_conns_new(const gemmd_conns_config *cfg)
{
    gemmd_conns *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->cfg = *cfg;
    c->header_us = (int64_t)(cfg->header_timeout_s * 1e6);
    c->request_us = (int64_t)(cfg->request_timeout_s * 1e6);
    c->send_us = (int64_t)(cfg->send_timeout_s * 1e6);
    size_t need = 2 * (size_t)gemmd_conns_mhd_limit(cfg) + 16;
    c->ip_cap = 64;
    while (c->ip_cap < need) c->ip_cap *= 2;
    c->ips = calloc(c->ip_cap, sizeof *c->ips);
    c->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!c->ips || c->wake < 0) {
        if (c->wake >= 0) close(c->wake);
        free(c->ips);
        free(c);
        return NULL;
    }
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

/* ---- addresses ------------------------------------------------------------------ */

static void addr_key(const struct sockaddr *sa, unsigned char key[16], char *text, size_t tlen)
{
    memset(key, 0, 16);
    snprintf(text, tlen, "?");
    if (!sa) return;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        key[10] = key[11] = 0xff;
        memcpy(key + 12, &a->sin_addr, 4);
        inet_ntop(AF_INET, &a->sin_addr, text, (socklen_t)tlen);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a6 = (const struct sockaddr_in6 *)sa;
        memcpy(key, &a6->sin6_addr, 16);
        inet_ntop(AF_INET6, &a6->sin6_addr, text, (socklen_t)tlen);
    }
}

static uint64_t addr_hash(const unsigned char *k) /* FNV-1a */
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < 16; i++) h = (h ^ k[i]) * 1099511628211ull;
    return h;
}

static size_t ip_home(const gemmd_conns *c, const unsigned char *k)
{
    return (size_t)addr_hash(k) & (c->ip_cap - 1);
}

static ip_slot *ip_find(gemmd_conns *c, const unsigned char *k)
{
    for (size_t i = ip_home(c, k);; i = (i + 1) & (c->ip_cap - 1)) {
        if (c->ips[i].count == 0) return NULL;
        if (memcmp(c->ips[i].addr, k, 16) == 0) return &c->ips[i];
    }
}

static int ip_count(gemmd_conns *c, const unsigned char *k)
{
    ip_slot *s = ip_find(c, k);
    return s ? s->count : 0;
}

static void ip_add(gemmd_conns *c, const unsigned char *k)
{
    ip_slot *s = ip_find(c, k);
    if (s) {
        s->count++;
        return;
    }
    size_t i = ip_home(c, k);
    while (c->ips[i].count) i = (i + 1) & (c->ip_cap - 1);
    memcpy(c->ips[i].addr, k, 16);
    c->ips[i].count = 1;
}

static void ip_del(gemmd_conns *c, const unsigned char *k)
{
    ip_slot *s = ip_find(c, k);
    if (!s || --s->count > 0) return;
    size_t i = (size_t)(s - c->ips), mask = c->ip_cap - 1;
    for (size_t j = (i + 1) & mask; c->ips[j].count; j = (j + 1) & mask) {
        size_t home = ip_home(c, c->ips[j].addr);
        int between = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!between) {
            c->ips[i] = c->ips[j];
            c->ips[j].count = 0;
            i = j;
        }
    }
}

/* ---- closing ---------------------------------------------------------------------- */

/* Writes a whole small answer on a socket MHD has not answered on, best effort. */
static void write_canned(int fd, int status, const char *reason, const char *code, const char *message,
                         int retry_after)
{
    char body[512], msg[768];
    int bl = snprintf(body, sizeof body, "{\"error\":{\"code\":\"%s\",\"message\":\"%s\"}}\n", code, message);
    if (bl < 0 || (size_t)bl >= sizeof body) return;
    char ra[40] = "";
    if (retry_after > 0) snprintf(ra, sizeof ra, "Retry-After: %d\r\n", retry_after);
    int ml = snprintf(msg, sizeof msg,
                      "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                      "Cache-Control: no-store\r\nConnection: close\r\n%s\r\n%s",
                      status, reason, bl, ra, body);
    if (ml < 0 || (size_t)ml >= sizeof msg) return;
    ssize_t n = send(fd, msg, (size_t)ml, MSG_DONTWAIT | MSG_NOSIGNAL);
    (void)n;
}

/* Reads and drops what the client sent (so that the close is a FIN after our answer,
 * not a reset that could overtake it). */
static void drain(int fd)
{
    char junk[4096];
    for (int i = 0; i < 16; i++) {
        ssize_t n = recv(fd, junk, sizeof junk, MSG_DONTWAIT);
        if (n <= 0) break;
    }
}

static void uncount(gemmd_conns *c, gemmd_conn *x)
{
    if (!x->counted) return;
    x->counted = 0;
    c->st.admitted--;
    ip_del(c, x->addr);
}

/* Uncounts x and shuts its socket down so that MHD closes the connection; abort: reset at
 * close and drop what is unsent (a client that stopped reading or sending). Lock held. */
static void shut(gemmd_conns *c, gemmd_conn *x, int abort)
{
    if (x->closing) return;
    x->closing = 1;
    uncount(c, x);
    if (abort) {
        struct linger lg = {1, 0};
        setsockopt(x->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    shutdown(x->fd, SHUT_RDWR);
}

/* ---- MHD's notifications ------------------------------------------------------------ */

static const char *const refusal_code[] = {NULL, "too_many_connections", "too_many_connections_from_address"};

static void refusal_message(const gemmd_conns *c, int why, char *out, size_t len)
{
    if (why == REF_IP)
        snprintf(out, len, "this address already has %d connections open (per_ip_limit); reuse them or retry",
                 c->cfg.per_ip_limit);
    else
        snprintf(out, len, "the server has %d connections open (connection_limit), all busy; retry shortly",
                 c->cfg.connection_limit);
}

/* The admitted connection to displace for a newcomer from key, or NULL: among those
 * waiting for a request head, the oldest of the address holding the most, if that
 * address holds more than the newcomer's would. Lock held. */
static gemmd_conn *victim(gemmd_conns *c, const unsigned char *key)
{
    int mine = ip_count(c, key) + 1;
    gemmd_conn *best = NULL;
    int best_n = 0;
    int64_t best_t = 0;
    for (gemmd_conn *x = c->head; x; x = x->next) {
        if (!x->counted || x->closing || atomic_load(&x->state) != ST_HEAD) continue;
        int n = ip_count(c, x->addr);
        int64_t t = atomic_load(&x->t_req_us);
        if (n > best_n || (n == best_n && t < best_t)) {
            best = x;
            best_n = n;
            best_t = t;
        }
    }
    return best && best_n >= mine ? best : NULL;
}

/* Near MHD's own limit (more than gemmd_conns_pending_room open, not counting those being
 * closed): the connection that has not sent a request yet to close for newcomer x, or NULL.
 * A refused one first (the oldest), else the oldest of the address holding the most. Lock
 * held. */
static gemmd_conn *pending_victim(gemmd_conns *c, const gemmd_conn *x)
{
    gemmd_conn *best = NULL;
    int live = 0, best_n = -1;
    for (gemmd_conn *v = c->head; v; v = v->next) {
        if (v->closing) continue;
        live++;
        if (v == x || atomic_load(&v->requests) != 0 || atomic_load(&v->state) != ST_HEAD) continue;
        int n = v->refused ? INT32_MAX : ip_count(c, v->addr);
        if (n > best_n || (n == best_n && v->t_open_us < best->t_open_us)) {
            best = v;
            best_n = n;
        }
    }
    return live > (int)gemmd_conns_pending_room(&c->cfg) ? best : NULL;
}

/* Closes v to make room for a newcomer (lock held): first, on plain HTTP, what it sent is
 * dropped and a 503 written when answer; abort: reset at close. */
static void evict(gemmd_conns *c, gemmd_conn *v, int answer, int abort, int64_t waited_us)
{
    if (c->cfg.plain_http && answer) {
        drain(v->fd);
        write_canned(v->fd, 503, "Service Unavailable", "too_many_connections",
                     "the server is full and this connection had not sent a request; retry", 1);
    }
    shut(c, v, abort);
    c->st.evicted++;
    LOG_DEBUG("connection from %s closed to make room: it had waited %.1f s for a request head", v->addr_text,
              (double)waited_us / 1e6);
}

gemmd_conn *gemmd_conns_open(gemmd_conns *c, int fd, const struct sockaddr *client)
{
    gemmd_conn *x = calloc(1, sizeof *x);
    if (!x) return NULL; /* no record: no deadlines for this one, but it still works */
    x->owner = c;
    x->fd = fd;
    addr_key(client, x->addr, x->addr_text, sizeof x->addr_text);
    x->t_open_us = now_us();
    atomic_store(&x->t_req_us, x->t_open_us);
    atomic_store(&x->state, ST_HEAD);
    pthread_mutex_lock(&c->mu);
    c->st.accepted++;
    x->next = c->head;
    if (c->head) c->head->prev = x;
    c->head = x;
    c->st.open++;
    int why = REF_NONE;
    if (c->cfg.per_ip_limit > 0 && ip_count(c, x->addr) >= c->cfg.per_ip_limit) {
        why = REF_IP;
    } else if (c->st.admitted >= c->cfg.connection_limit) {
        gemmd_conn *v = victim(c, x->addr);
        if (v) evict(c, v, atomic_load(&v->requests) == 0, 0, x->t_open_us - atomic_load(&v->t_req_us));
        else why = REF_LIMIT;
    }
    if (why == REF_NONE) {
        x->counted = 1;
        c->st.admitted++;
        ip_add(c, x->addr);
    } else {
        x->refused = why;
        if (why == REF_IP) c->st.refused_ip++;
        else c->st.refused_limit++;
        if (c->cfg.plain_http && x->fd >= 0) {
            /* Answer at once and stop sending; the watchdog closes it after a moment,
             * the access handler at once if a request head comes. */
            char m[200];
            refusal_message(c, why, m, sizeof m);
            write_canned(x->fd, 503, "Service Unavailable", refusal_code[why], m, 1);
            shutdown(x->fd, SHUT_WR);
        }
    }
    gemmd_conn *v = c->st.open > (int)gemmd_conns_pending_room(&c->cfg) ? pending_victim(c, x) : NULL;
    if (v) evict(c, v, !v->refused, v->refused, x->t_open_us - v->t_open_us);
    pthread_mutex_unlock(&c->mu);
    return x;
}

/* What the client does: 1 it has sent bytes not read yet (it may still be sending), 0 it
 * waits, -1 it has closed its side (or the socket failed). */
static int client_state(int fd)
{
    char b;
    ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n > 0 ? 1 : n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
}

/* MHD is about to close x's socket (lock held): keep it for a lingering close, unless the
 * watchdog closed it, the client has, or too many linger. A client with nothing unread
 * takes at most half the places (a close then resets nothing): the rest are for clients
 * still sending, whose writes a close would break. */
static void linger(gemmd_conns *c, const gemmd_conn *x)
{
    int st = x->closing || x->fd < 0 || c->stop ? -1 : client_state(x->fd);
    if (st < 0 || c->lingering >= (st ? LINGER_MAX : LINGER_MAX / 2)) return;
    int fd = fcntl(x->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return;
    shutdown(fd, SHUT_WR); /* the answer, then the end of the stream */
    c->fresh[c->nfresh++] = (lingerer){fd, now_us(), 0};
    c->lingering++;
    wake(c); /* the watchdog starts reading it now */
}

void gemmd_conns_close(gemmd_conns *c, gemmd_conn *x)
{
    if (!x) return;
    pthread_mutex_lock(&c->mu);
    linger(c, x);
    uncount(c, x);
    if (x->prev) x->prev->next = x->next;
    else c->head = x->next;
    if (x->next) x->next->prev = x->prev;
    c->st.open--;
    pthread_mutex_unlock(&c->mu);
    free(x);
}

void gemmd_conns_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                        enum MHD_ConnectionNotificationCode code)
{
    gemmd_conns *c = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *fd = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *ad = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        *socket_context = gemmd_conns_open(c, fd ? fd->connect_fd : -1, ad ? ad->client_addr : NULL);
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        gemmd_conns_close(c, *socket_context);
        *socket_context = NULL;
    }
}

gemmd_conn *gemmd_conn_of(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci = conn ? MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT)
                                              : NULL;
    return ci ? (gemmd_conn *)ci->socket_context : NULL;
}

/* ---- the request's hooks ------------------------------------------------------------ */

/* A new stage (BODY: the head is complete; SEND: an answer is queued) starts now. */
static void mark(gemmd_conn *x, int state)
{
    if (!x) return;
    atomic_store(&x->bytes, 0);
    atomic_store(&x->t_mark_us, now_us());
    atomic_store(&x->state, state);
}

void gemmd_conn_head(gemmd_conn *x) { mark(x, ST_BODY); }

void gemmd_conn_body(gemmd_conn *x, uint64_t bytes)
{
    if (x) atomic_fetch_add_explicit(&x->bytes, bytes, memory_order_relaxed);
}

void gemmd_conn_wait(gemmd_conn *x)
{
    if (x) atomic_store(&x->state, ST_WAIT);
}

void gemmd_conn_answer(gemmd_conn *x) { mark(x, ST_SEND); }

int gemmd_answer_needs_progress(const gemmd_conns_config *cfg, uint64_t bytes)
{
    if (!(cfg->send_timeout_s > 0) || !(cfg->min_rate > 0)) return 0;
    return (double)bytes > cfg->min_rate * cfg->send_timeout_s;
}

int gemmd_conn_needs_progress(const gemmd_conn *x, uint64_t bytes)
{
    return x ? gemmd_answer_needs_progress(&x->owner->cfg, bytes) : 0;
}

void gemmd_conn_progress(gemmd_conn *x, uint64_t taken)
{
    if (x && atomic_load_explicit(&x->state, memory_order_relaxed) == ST_SEND)
        atomic_store_explicit(&x->bytes, taken, memory_order_relaxed);
}

void gemmd_conn_request_done(gemmd_conn *x)
{
    if (!x) return;
    atomic_fetch_add(&x->requests, 1);
    atomic_store(&x->t_req_us, now_us());
    atomic_store(&x->state, ST_HEAD);
}

void gemmd_conn_set_target(gemmd_conn *x, int verdict)
{
    if (x) atomic_store(&x->target, verdict);
}

int gemmd_conn_take_target(gemmd_conn *x)
{
    return x ? atomic_exchange(&x->target, 0) : 0;
}

uint64_t gemmd_conn_addr_hash(const gemmd_conn *x)
{
    return x ? addr_hash(x->addr) : 0;
}

const char *gemmd_conn_refusal(gemmd_conn *x, const char **message)
{
    int why = x ? atomic_load_explicit(&x->refused, memory_order_relaxed) : REF_NONE;
    if (why == REF_NONE) return NULL;
    static _Thread_local char m[200];
    refusal_message(x->owner, why, m, sizeof m);
    if (message) *message = m;
    return refusal_code[why];
}

/* ---- the watchdog -------------------------------------------------------------------- */

/* Bytes that arrived on the socket and wait to be read. */
static uint64_t unread(int fd)
{
    int n = 0;
    return ioctl(fd, SIOCINQ, &n) == 0 && n > 0 ? (uint64_t)n : 0;
}

/* Whether the client has closed its side (or the socket failed): POLLRDHUP sees a FIN
 * even behind bytes not read yet. */
static int client_left(int fd)
{
    struct pollfd pf = {fd, POLLRDHUP, 0};
    return poll(&pf, 1, 0) > 0 && (pf.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

static void check_locked(gemmd_conns *c, gemmd_conn *x, int64_t now)
{
    if (x->closing) return;
    if (x->refused) {
        if (now - x->t_open_us >= REFUSED_LINGER_US) shut(c, x, 1);
        return;
    }
    int st = atomic_load(&x->state);
    double rate = c->cfg.min_rate;
    if (st == ST_HEAD) {
        if (c->header_us > 0 && now - atomic_load(&x->t_req_us) > c->header_us) {
            /* Bytes the client sent that MHD has not read yet: its thread is busy, the
             * client is not slow. Look again once they are read. */
            if (unread(x->fd) > 0) return;
            int never = atomic_load(&x->requests) == 0;
            if (c->cfg.plain_http && never) {
                char m[160];
                snprintf(m, sizeof m, "no complete request head arrived within %.0f s (header_timeout)",
                         c->cfg.header_timeout_s);
                drain(x->fd);
                write_canned(x->fd, 408, "Request Timeout", "request_timeout", m, 0);
            }
            c->st.closed_header++;
            LOG_DEBUG("connection from %s closed: no request head within header_timeout", x->addr_text);
            shut(c, x, 0);
        }
        return;
    }
    if (st == ST_BODY) {
        int64_t t_head = atomic_load(&x->t_mark_us);
        uint64_t waiting = unread(x->fd), got = atomic_load(&x->bytes) + waiting; /* arrived, read or not */
        if (!waiting && client_left(x->fd)) {
            /* gone before its body was whole: libmicrohttpd (0.9.75) does not always see the
             * end of the stream of a connection it suspended and resumed on the same thread */
            c->st.left++;
            LOG_DEBUG("connection from %s closed: the client left before its body was whole", x->addr_text);
        } else if (c->request_us > 0 && now - atomic_load(&x->t_req_us) > c->request_us) {
            c->st.closed_request++;
            LOG_INFO("connection from %s closed: the request took longer than request_timeout (%.0f s, %llu "
                     "body bytes)", x->addr_text, c->cfg.request_timeout_s, (unsigned long long)got);
        } else if (rate > 0 && now - t_head > c->header_us &&
                   (double)got < rate * (double)(now - t_head - c->header_us) / 1e6) {
            c->st.closed_body++;
            LOG_INFO("connection from %s closed: its body arrived slower than min_rate_kb (%llu bytes in %.1f s)",
                     x->addr_text, (unsigned long long)got, (double)(now - t_head) / 1e6);
        } else {
            return;
        }
        shut(c, x, 1);
        return;
    }
    if (st == ST_SEND && c->send_us > 0) {
        /* Taken: handed to MHD less what still sits in MHD's buffer and, unacknowledged,
         * in the socket's send queue. */
        uint64_t handed = atomic_load(&x->bytes), queued = c->cfg.mhd_buffer; /* MHD's write buffer */
        int outq = 0;
        if (ioctl(x->fd, SIOCOUTQ, &outq) == 0 && outq > 0) queued += (uint64_t)outq;
        uint64_t taken = handed > queued ? handed - queued : 0;
        int64_t allowed = c->send_us + (rate > 0 ? (int64_t)((double)taken / rate * 1e6) : INT64_MAX / 4);
        if (now - atomic_load(&x->t_mark_us) > allowed) {
            c->st.closed_send++;
            LOG_INFO("connection from %s closed: the client stopped taking its answer (%llu bytes taken in "
                     "%.1f s; send_timeout)", x->addr_text, (unsigned long long)taken,
                     (double)(now - atomic_load(&x->t_mark_us)) / 1e6);
            shut(c, x, 1);
        }
    }
}

/* Reads and drops what lingering sockets received; closes those that are done (the client
 * closed, LINGER_US, LINGER_BYTES). Returns how many were closed. The watchdog's own list:
 * no lock. */
static int linger_step(gemmd_conns *c, int64_t now)
{
    char junk[65536];
    int closed = 0;
    for (int i = 0; i < c->nmine;) {
        lingerer *l = &c->mine[i];
        int done = 0;
        for (uint64_t got = 0; !done && got < (4u << 20);) { /* at most 4 MiB a socket a round */
            ssize_t n = recv(l->fd, junk, sizeof junk, MSG_DONTWAIT);
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
            if (n <= 0) done = 1;
            else got += (uint64_t)n, l->bytes += (uint64_t)n;
        }
        if (done || now - l->t_us > LINGER_US || l->bytes > LINGER_BYTES) {
            close(l->fd);
            *l = c->mine[--c->nmine];
            closed++;
        } else {
            i++;
        }
    }
    return closed;
}

/* Waits until `until`: reads the lingering sockets as data comes, and takes the ones
 * handed over as they come (linger() wakes it); closed: lingering sockets the caller closed.
 * Returns 1 when the watchdog must stop. */
static int wait_until(gemmd_conns *c, int64_t until, int closed)
{
    for (;;) {
        pthread_mutex_lock(&c->mu);
        c->lingering -= closed;
        while (c->nfresh > 0) c->mine[c->nmine++] = c->fresh[--c->nfresh];
        int stop = c->stop;
        pthread_mutex_unlock(&c->mu);
        int64_t now = now_us();
        if (stop || now >= until) return stop;
        struct pollfd pf[LINGER_MAX + 1];
        pf[0] = (struct pollfd){c->wake, POLLIN, 0};
        for (int i = 0; i < c->nmine; i++) pf[i + 1] = (struct pollfd){c->mine[i].fd, POLLIN, 0};
        closed = 0;
        if (poll(pf, (nfds_t)c->nmine + 1, (int)((until - now + 999) / 1000)) <= 0) continue;
        uint64_t n;
        if (pf[0].revents && read(c->wake, &n, sizeof n) < 0) n = 0; /* only a wake-up */
        closed = linger_step(c, now_us());
    }
}

typedef struct gone {
    void (*left)(void *arg);
    void *arg;
    struct gone *next;
} gone;

/* The watched connections whose client left (lock held): their callbacks chained on *out,
 * to be called after unlocking. */
static void watch_locked(gemmd_conns *c, gemmd_conn *x, gone **out)
{
    if (!x->watched || x->closing || !client_left(x->fd)) return;
    gone *g = malloc(sizeof *g);
    if (!g) return; /* look again next round */
    x->watched = 0;
    LOG_DEBUG("connection from %s: the client left before its answer", x->addr_text);
    c->st.left++;
    *g = (gone){x->left, x->left_arg, *out};
    *out = g;
    x->left = NULL;
}

void gemmd_conn_watch(gemmd_conn *x, void (*left)(void *arg), void *arg)
{
    if (!x) return;
    pthread_mutex_lock(&x->owner->mu);
    x->watched = 1;
    x->left = left;
    x->left_arg = arg;
    pthread_mutex_unlock(&x->owner->mu);
}

int gemmd_conn_unwatch(gemmd_conn *x)
{
    if (!x) return 0;
    pthread_mutex_lock(&x->owner->mu);
    int had = x->watched;
    x->watched = 0;
    x->left = NULL;
    pthread_mutex_unlock(&x->owner->mu);
    return had;
}

static void *watchdog(void *arg)
{
    prctl(PR_SET_NAME, "gemmd-watchdog", 0, 0, 0); /* shows in top -H, ps -L, /proc */
    gemmd_conns *c = arg;
    int closed = 0;
    for (int64_t next = now_us() + WATCH_MS * 1000;; next += WATCH_MS * 1000) {
        if (wait_until(c, next, closed)) break;
        pthread_mutex_lock(&c->mu);
        int64_t now = now_us();
        gone *left = NULL;
        if (!c->stop)
            for (gemmd_conn *x = c->head; x; x = x->next) {
                watch_locked(c, x, &left);
                check_locked(c, x, now);
            }
        int stop = c->stop;
        pthread_mutex_unlock(&c->mu);
        while (left) { /* the clients that left: their requests are told, no lock held */
            gone *after = left->next;
            left->left(left->arg);
            free(left);
            left = after;
        }
        if (stop) break;
        closed = linger_step(c, now); /* the time and byte limits */
        if (c->cfg.tick) c->cfg.tick(c->cfg.tick_ctx);
        if (next < now - WATCH_MS * 1000) next = now; /* late (a long tick): no rounds to catch up */
    }
    return NULL;
}

int gemmd_conns_start(gemmd_conns *c)
{
    if (pthread_create(&c->thread, NULL, watchdog, c) != 0) return -1;
    c->running = 1;
    return 0;
}

void gemmd_conns_stop(gemmd_conns *c)
{
    if (!c || !c->running) return;
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_mutex_unlock(&c->mu);
    wake(c);
    pthread_join(c->thread, NULL);
    c->running = 0;
}

void gemmd_conns_free(gemmd_conns *c)
{
    if (!c) return;
    gemmd_conns_stop(c);
    /* MHD_stop_daemon closed every connection (CLOSED for each); free any left. */
    for (int i = 0; i < c->nmine; i++) close(c->mine[i].fd);
    for (int i = 0; i < c->nfresh; i++) close(c->fresh[i].fd);
    for (gemmd_conn *x = c->head, *next; x; x = next) {
        next = x->next;
        free(x);
    }
    close(c->wake);
    pthread_mutex_destroy(&c->mu);
    free(c->ips);
    free(c);
}

void gemmd_conns_get_stats(gemmd_conns *c, gemmd_conns_stats *out)
{
    pthread_mutex_lock(&c->mu);
    *out = c->st;
    pthread_mutex_unlock(&c->mu);
}
