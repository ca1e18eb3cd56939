/* test_conns.c - when an answer's send deadline needs to know how much of it the client has
 * taken (gemmd_answer_needs_progress): only when the answer is larger than what a client
 * taking it at min_rate_kb receives within send_timeout. Smaller answers are handed to
 * libmicrohttpd as they lie (respond.c), and their deadline is send_timeout alone.
 *
 * The registry on sockets of its own (socket pairs standing for MHD's connections): a flood
 * of connections that send nothing never holds more than gemmd_conns_pending_room places
 * (newcomers close the oldest, each answered 503 first on plain HTTP), and a connection MHD
 * closes while its client still sends is kept open and drained (lingering close) until the
 * client is done, the client's writes never failing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "config.h"
#include "conns.h"

static gemmd_conns_config cfg_of(double send_s, double rate_kb)
{
    gemmd_conns_config c;
    memset(&c, 0, sizeof c);
    c.send_timeout_s = send_s;
    c.min_rate = rate_kb * 1024.0;
    return c;
}

/* The daemon's defaults: send_timeout 30 s, min_rate_kb 64: 1,966,080 bytes is the edge. */
static void test_defaults_edge(void **st)
{
    (void)st;
    gemmd_config d;
    gemmd_config_defaults(&d);
    gemmd_conns_config c = cfg_of(d.send_timeout_s, d.min_rate_kb);
    const uint64_t edge = (uint64_t)d.send_timeout_s * (uint64_t)d.min_rate_kb * 1024u;
    assert_int_equal(edge, 1966080);
    assert_int_equal(gemmd_answer_needs_progress(&c, 1), 0);
    assert_int_equal(gemmd_answer_needs_progress(&c, 64 * 64 * 4), 0);   /* 64² float32 */
    assert_int_equal(gemmd_answer_needs_progress(&c, 256 * 256 * 4), 0); /* 256² */
    assert_int_equal(gemmd_answer_needs_progress(&c, edge), 0);
    assert_int_equal(gemmd_answer_needs_progress(&c, edge + 1), 1);
    assert_int_equal(gemmd_answer_needs_progress(&c, 1024ull * 1024 * 4), 1); /* 1024² */
    assert_int_equal(gemmd_answer_needs_progress(&c, UINT64_MAX), 1);
}

/* No send deadline, or no minimum rate: progress never matters. */
static void test_no_deadline(void **st)
{
    (void)st;
    gemmd_conns_config none = cfg_of(0, 64), free_rate = cfg_of(30, 0), both = cfg_of(0, 0);
    assert_int_equal(gemmd_answer_needs_progress(&none, UINT64_MAX), 0);
    assert_int_equal(gemmd_answer_needs_progress(&free_rate, UINT64_MAX), 0);
    assert_int_equal(gemmd_answer_needs_progress(&both, UINT64_MAX), 0);
}

/* A short deadline (the hostile-load test's 2 s at 64 KiB/s): 128 KiB is the edge, so a
 * 256² float32 answer (256 KiB) reports its progress. */
static void test_short_deadline(void **st)
{
    (void)st;
    gemmd_conns_config c = cfg_of(2, 64);
    assert_int_equal(gemmd_answer_needs_progress(&c, 128 * 1024), 0);
    assert_int_equal(gemmd_answer_needs_progress(&c, 128 * 1024 + 1), 1);
    assert_int_equal(gemmd_answer_needs_progress(&c, 256 * 256 * 4), 1);
}

/* A connection the registry does not know (NULL): nothing to report to. */
static void test_unknown_connection(void **st)
{
    (void)st;
    assert_int_equal(gemmd_conn_needs_progress(NULL, UINT64_MAX), 0);
}

/* ---- the registry on socket pairs ---------------------------------------------------- */

static struct sockaddr_in client_addr(int last)
{
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl((127u << 24) | (unsigned)last);
    return a;
}

/* What the client side of a pair sees now: 1 open (nothing to read), 0 closed (after what
 * it read into got, if any). */
static int peer_open(int fd, char *got, size_t cap)
{
    size_t n = 0;
    for (;;) {
        ssize_t r = recv(fd, got + n, cap - 1 - n, MSG_DONTWAIT);
        if (r > 0 && n + (size_t)r < cap - 1) {
            n += (size_t)r;
            continue;
        }
        got[n] = '\0';
        return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    }
}

/* 100 connections from one address that send nothing, per_ip_limit 8: 8 admitted, the rest
 * refused. Refused ones wait for a request head to be answered over TLS (on plain HTTP they
 * were answered 503 at once); past gemmd_conns_pending_room connections the oldest refused
 * one is closed for each newcomer. */
static void flood(int plain)
{
    gemmd_conns_config cfg = cfg_of(0, 0);
    cfg.connection_limit = 8;
    cfg.per_ip_limit = 8;
    cfg.plain_http = plain;
    int room = (int)gemmd_conns_pending_room(&cfg);
    assert_int_equal(gemmd_conns_mhd_limit(&cfg), 72);
    assert_int_equal(room, 24);
    gemmd_conns *c = gemmd_conns_new(&cfg);
    assert_non_null(c);
    enum { N = 100 };
    int pair[N][2];
    gemmd_conn *x[N];
    struct sockaddr_in a = client_addr(71);
    for (int i = 0; i < N; i++) {
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, pair[i]), 0);
        x[i] = gemmd_conns_open(c, pair[i][0], (const struct sockaddr *)&a);
        assert_non_null(x[i]);
    }
    int open = 0, answered = 0;
    for (int i = 0; i < N; i++) {
        char got[1024];
        int o = peer_open(pair[i][1], got, sizeof got);
        open += o;
        answered += strncmp(got, "HTTP/1.1 503", 12) == 0 && strstr(got, "\"too_many_connections_from_address\"");
        /* kept: the 8 admitted, and over TLS the newest refused */
        assert_int_equal(o, i < 8 || (!plain && i >= N - (room - 8)));
    }
    assert_int_equal(open, plain ? 8 : room);
    assert_int_equal(answered, plain ? N - 8 : 0);
    gemmd_conns_stats st;
    gemmd_conns_get_stats(c, &st);
    assert_int_equal(st.open, N); /* until MHD closes them */
    assert_int_equal(st.admitted, 8);
    assert_int_equal(st.refused_ip, N - 8);
    assert_int_equal(st.evicted, N - room);
    for (int i = 0; i < N; i++) {
        gemmd_conns_close(c, x[i]);
        close(pair[i][0]);
        close(pair[i][1]);
    }
    gemmd_conns_free(c);
}

static void test_pending_flood_tls(void **st)
{
    (void)st;
    flood(0);
}

static void test_pending_flood_plain(void **st)
{
    (void)st;
    flood(1);
}

static _Atomic int ticks;
static void count_tick(void *ctx)
{
    (void)ctx;
    atomic_fetch_add(&ticks, 1);
}

/* MHD closes a connection whose client is still sending (an answer given before its body
 * was read): the socket stays open, what comes is read and dropped, and the client sees the
 * end of the stream once it has sent all, never a failed write. */
static void test_lingering_close(void **st)
{
    (void)st;
    gemmd_conns_config cfg = cfg_of(0, 0);
    cfg.connection_limit = 8;
    cfg.tick = count_tick;
    gemmd_conns *c = gemmd_conns_new(&cfg);
    assert_non_null(c);
    assert_int_equal(gemmd_conns_start(c), 0);
    int p[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, p), 0);
    struct sockaddr_in a = client_addr(9);
    gemmd_conn *x = gemmd_conns_open(c, p[0], (const struct sockaddr *)&a);
    assert_int_equal(send(p[1], "POST / HTTP/1.1\r\n", 17, 0), 17);
    gemmd_conns_close(c, x); /* as MHD does, then it closes its descriptor */
    close(p[0]);
    static char body[1 << 16];
    for (int i = 0; i < 64; i++) { /* 4 MiB more than the socket holds: read by the watchdog */
        struct pollfd pf = {p[1], POLLOUT, 0};
        assert_int_equal(poll(&pf, 1, 30000), 1);
        assert_int_equal(send(p[1], body, sizeof body, MSG_NOSIGNAL), (ssize_t)sizeof body);
    }
    shutdown(p[1], SHUT_WR);
    struct pollfd pf = {p[1], POLLIN, 0};
    assert_int_equal(poll(&pf, 1, 30000), 1);
    char b;
    assert_int_equal(recv(p[1], &b, 1, 0), 0); /* the end of the stream, after everything was taken */
    close(p[1]);
    for (int i = 0; i < 1000 && atomic_load(&ticks) == 0; i++) usleep(10000); /* the next round ticks */
    assert_true(atomic_load(&ticks) > 0);
    gemmd_conns_stop(c);
    gemmd_conns_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_edge),
        cmocka_unit_test(test_no_deadline),
        cmocka_unit_test(test_short_deadline),
        cmocka_unit_test(test_unknown_connection),
        cmocka_unit_test(test_pending_flood_tls),
        cmocka_unit_test(test_pending_flood_plain),
        cmocka_unit_test(test_lingering_close),
    };
    return cmocka_run_group_tests_name("conns", tests, NULL, NULL);
}
