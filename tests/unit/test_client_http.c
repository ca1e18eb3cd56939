/*
 * test_client_http.c - libgemm against a scripted HTTP server on loopback: the answers a
 * real gemmd never gives (wrong X-Gemm-Shape, short or long bodies, a non-JSON error from
 * a proxy, 503 then 200) must come out as the documented errors, and the request must
 * carry what the API expects (query, headers, A then B in the body).
 */
#define _GNU_SOURCE /* strcasestr */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gemm.h"

typedef struct {
    int lsock;
    int port;
    const char *const *answers; /* one per connection, sent after the request was read */
    int nanswers;
    char last_request[4096];    /* head and body of the last request */
    size_t last_len;
    pthread_t th;
} fake_server;

static void *serve(void *arg)
{
    fake_server *s = arg;
    for (int i = 0; i < s->nanswers; i++) {
        int c = accept(s->lsock, NULL, NULL);
        if (c < 0) return NULL;
        /* read the head, then Content-Length bytes of body */
        size_t len = 0;
        char *buf = s->last_request;
        size_t cap = sizeof s->last_request - 1;
        long body = -1;
        size_t head_end = 0;
        while (len < cap) {
            ssize_t n = read(c, buf + len, cap - len);
            if (n <= 0) break;
            len += (size_t)n;
            buf[len] = '\0';
            if (!head_end) {
                char *e = strstr(buf, "\r\n\r\n");
                if (e) {
                    head_end = (size_t)(e - buf) + 4;
                    char *cl = strcasestr(buf, "Content-Length:");
                    body = cl && cl < e ? atol(cl + 15) : 0;
                }
            }
            if (head_end && len >= head_end + (size_t)body) break;
        }
        s->last_len = len;
        const char *a = s->answers[i];
        size_t alen = strlen(a), off = 0;
        while (off < alen) {
            ssize_t n = write(c, a + off, alen - off);
            if (n <= 0) break;
            off += (size_t)n;
        }
        close(c);
    }
    return NULL;
}

static void start(fake_server *s, const char *const *answers, int n)
{
    memset(s, 0, sizeof *s);
    s->answers = answers;
    s->nanswers = n;
    s->lsock = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(s->lsock >= 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(s->lsock, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t al = sizeof a;
    assert_int_equal(getsockname(s->lsock, (struct sockaddr *)&a, &al), 0);
    s->port = ntohs(a.sin_port);
    assert_int_equal(listen(s->lsock, 8), 0);
    assert_int_equal(pthread_create(&s->th, NULL, serve, s), 0);
}

static void stop(fake_server *s)
{
    pthread_join(s->th, NULL);
    close(s->lsock);
}

static gemm_client *client_for(const fake_server *s, int retries)
{
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", s->port);
    gemm_client_options o;
    gemm_client_options_init(&o);
    o.max_retries = retries;
    o.timeout_ms = 10000;
    o.token = "abc";
    gemm_client_error err;
    gemm_client *c = gemm_client_new(url, &o, &err);
    assert_non_null(c);
    return c;
}

/* A 1x2 . 2x1 float64 product: A = [1 2], B = [3; 4], C = [11]. */
static double A[2] = {1, 2}, B[2] = {3, 4};

static gemm_request one_by_one(double *c)
{
    gemm_request r = GEMM_REQUEST_INIT;
    r.dtype = GEMM_DTYPE_F64;
    r.m = 1;
    r.k = 2;
    r.n = 1;
    r.a = A;
    r.b = B;
    r.c = c;
    r.kernel = "tiled";
    r.tile = 16;
    return r;
}

#define OK_HEAD "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n"

/* C bytes without a NUL, so answers can be C strings: 0x4141414141414141 as a double. */
static const char C_BYTES[] = "AAAAAAAA";

static void test_request_and_answer(void **state)
{
    (void)state;
    const char *answers[] = {
        OK_HEAD "X-Gemm-Shape: 1,1\r\nX-Gemm-Kernel: tiled\r\nX-Gemm-Device: fake\r\n"
                "Server-Timing: recv;dur=0.5, queue;dur=0.25, kernel;dur=2, total;dur=3\r\n"
                "Content-Length: 8\r\n\r\nAAAAAAAA",
    };
    fake_server s;
    start(&s, answers, 1);
    gemm_client *c = client_for(&s, 0);
    double out = 0;
    gemm_request r = one_by_one(&out);
    gemm_timing t;
    gemm_client_error err;
    int rc = gemm_client_multiply(c, &r, &t, &err);
    stop(&s);
    gemm_client_free(c);
    if (rc != 0) fail_msg("%s: %s", err.code, err.message);
    assert_memory_equal(&out, C_BYTES, 8);
    assert_string_equal(t.kernel, "tiled");
    assert_string_equal(t.device, "fake");
    assert_float_equal(t.recv_ms, 0.5, 1e-12);
    assert_float_equal(t.queue_ms, 0.25, 1e-12);
    assert_float_equal(t.kernel_ms, 2, 1e-12);
    assert_float_equal(t.total_ms, 3, 1e-12);
    assert_float_equal(t.h2d_ms, -1, 0);
    assert_int_equal(t.bytes_sent, 32);
    assert_int_equal(t.bytes_received, 8);
    assert_int_equal(err.http_status, 200);
    /* what went out */
    const char *req = s.last_request;
    assert_non_null(strstr(req, "POST /v1/matmul?m=1&k=2&n=1&dtype=float64&kernel=tiled&tile=16 HTTP/1.1\r\n"));
    assert_non_null(strstr(req, "\r\nAuthorization: Bearer abc\r\n"));
    assert_non_null(strstr(req, "\r\nContent-Type: application/octet-stream\r\n"));
    assert_non_null(strstr(req, "\r\nAccept: application/octet-stream\r\n"));
    assert_non_null(strstr(req, "\r\nContent-Length: 32\r\n"));
    const char *body = strstr(req, "\r\n\r\n");
    assert_non_null(body);
    body += 4;
    assert_int_equal(s.last_len - (size_t)(body - req), 32);
    assert_memory_equal(body, A, 16);      /* A first */
    assert_memory_equal(body + 16, B, 16); /* then B */
}

static void expect_failure(const char *answer, gemm_client_error_kind kind, const char *code, const char *msg_part)
{
    const char *answers[] = {answer};
    fake_server s;
    start(&s, answers, 1);
    gemm_client *c = client_for(&s, 0);
    double out = 0;
    gemm_request r = one_by_one(&out);
    gemm_client_error err;
    int rc = gemm_client_multiply(c, &r, NULL, &err);
    stop(&s);
    gemm_client_free(c);
    assert_int_equal(rc, -1);
    if (err.kind != kind) fail_msg("kind %s, expected %s (%s)", gemm_client_error_kind_name(err.kind),
                                   gemm_client_error_kind_name(kind), err.message);
    if (code) assert_string_equal(err.code, code);
    if (msg_part && !strstr(err.message, msg_part)) fail_msg("message \"%s\" lacks \"%s\"", err.message, msg_part);
}

static void test_protocol_errors(void **state)
{
    (void)state;
    expect_failure(OK_HEAD "X-Gemm-Shape: 2,1\r\nContent-Length: 8\r\n\r\nAAAAAAAA", GEMM_CLIENT_E_PROTOCOL,
                   "bad_response", "2x1");
    expect_failure(OK_HEAD "X-Gemm-Shape: 1,1\r\nContent-Length: 16\r\n\r\nAAAAAAAAAAAAAAAA", GEMM_CLIENT_E_PROTOCOL,
                   "bad_response", "16 bytes");
    /* no Content-Length (read to close): too long, too short */
    expect_failure(OK_HEAD "X-Gemm-Shape: 1,1\r\n\r\nAAAAAAAAAAAA", GEMM_CLIENT_E_PROTOCOL, "bad_response",
                   "longer");
    expect_failure(OK_HEAD "X-Gemm-Shape: 1,1\r\n\r\nAAAA", GEMM_CLIENT_E_PROTOCOL, "bad_response", "4 bytes");
    expect_failure("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}",
                   GEMM_CLIENT_E_PROTOCOL, "bad_response", "application/json");
    expect_failure(OK_HEAD "X-Gemm-Shape: banana\r\nContent-Length: 8\r\n\r\nAAAAAAAA", GEMM_CLIENT_E_PROTOCOL,
                   "bad_response", "banana");
}

static void test_server_errors(void **state)
{
    (void)state;
    expect_failure("HTTP/1.1 422 Unprocessable Entity\r\nContent-Type: application/json\r\nConnection: close\r\n"
                   "Content-Length: 69\r\n\r\n{\"error\":{\"code\":\"shape_mismatch\",\"message\":\"A is 3x4 and B is 5x2\"}}",
                   GEMM_CLIENT_E_SERVER, "shape_mismatch", "A is 3x4 and B is 5x2");
    /* a proxy's HTML page: the status and the start of the text */
    expect_failure("HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/html\r\nConnection: close\r\n"
                   "Content-Length: 29\r\n\r\n<html>upstream is down</html>",
                   GEMM_CLIENT_E_SERVER, "http_502", "upstream is down");
    /* the connection closes without an answer */
    expect_failure("", GEMM_CLIENT_E_CONNECT, "connect_failed", NULL);
}

static void test_retry_after_503(void **state)
{
    (void)state;
    const char *answers[] = {
        "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 0\r\nContent-Type: application/json\r\nConnection: close\r\n"
        "Content-Length: 57\r\n\r\n{\"error\":{\"code\":\"queue_full\",\"message\":\"queue is full\"}}",
        "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 0.05\r\nContent-Type: application/json\r\nConnection: close\r\n"
        "Content-Length: 57\r\n\r\n{\"error\":{\"code\":\"queue_full\",\"message\":\"queue is full\"}}",
        OK_HEAD "X-Gemm-Shape: 1,1\r\nContent-Length: 8\r\n\r\nAAAAAAAA",
    };
    fake_server s;
    start(&s, answers, 3);
    gemm_client *c = client_for(&s, 5);
    double out = 0;
    gemm_request r = one_by_one(&out);
    gemm_timing t;
    gemm_client_error err;
    int rc = gemm_client_multiply(c, &r, &t, &err);
    stop(&s);
    gemm_client_free(c);
    if (rc != 0) fail_msg("%s: %s", err.code, err.message);
    assert_int_equal(t.retries, 2);
    assert_int_equal(err.retries, 2);
    assert_memory_equal(&out, C_BYTES, 8);
    /* the body was sent again, whole, on the last try */
    const char *body = strstr(s.last_request, "\r\n\r\n");
    assert_non_null(body);
    assert_memory_equal(body + 4, A, 16);
    assert_memory_equal(body + 20, B, 16);

    /* retries exhausted: the 503 with the server's message */
    const char *two[] = {answers[0], answers[0]};
    start(&s, two, 2);
    c = client_for(&s, 1);
    rc = gemm_client_multiply(c, &r, NULL, &err);
    stop(&s);
    gemm_client_free(c);
    assert_int_equal(rc, -1);
    assert_int_equal(err.kind, GEMM_CLIENT_E_SERVER);
    assert_int_equal(err.http_status, 503);
    assert_string_equal(err.code, "queue_full");
    assert_int_equal(err.retries, 1);
}

static void test_job_submit(void **state)
{
    (void)state;
    const char *answers[] = {
        "HTTP/1.1 202 Accepted\r\nLocation: /v1/jobs/abc123\r\nContent-Type: application/json\r\nConnection: close\r\n"
        "Content-Length: 2\r\n\r\n{}",
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: 132\r\n\r\n"
        "{\"id\":\"abc123\",\"state\":\"failed\",\"shape\":[1,1],\"dtype\":\"float64\","
        "\"error\":{\"status\":500,\"code\":\"backend_failed\",\"message\":\"it broke\"}}",
    };
    fake_server s;
    start(&s, answers, 2);
    gemm_client *c = client_for(&s, 0);
    double out = 0;
    gemm_request r = one_by_one(&out);
    gemm_client_error err;
    char id[96];
    assert_int_equal(gemm_client_job_submit(c, &r, id, sizeof id, &err), 0);
    assert_string_equal(id, "abc123"); /* from Location when the body has no id */
    gemm_job_info info;
    int rc = gemm_client_job_wait(c, id, 1, 10000, &info, &err);
    stop(&s);
    gemm_client_free(c);
    assert_int_equal(rc, -1);
    assert_int_equal(info.state, GEMM_CLIENT_JOB_FAILED);
    assert_int_equal(err.kind, GEMM_CLIENT_E_SERVER);
    assert_string_equal(err.code, "backend_failed");
    assert_non_null(strstr(err.message, "it broke"));
    assert_int_equal(info.m, 1);
    assert_int_equal(info.dtype, GEMM_DTYPE_F64);
}

static void test_refused(void **state)
{
    (void)state;
    fake_server s;
    start(&s, NULL, 0);
    int port = s.port;
    stop(&s); /* closed: nothing listens there now */
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    gemm_client_error err;
    gemm_client *c = gemm_client_new(url, NULL, &err);
    assert_non_null(c);
    char *body = NULL;
    assert_int_equal(gemm_client_get(c, "/healthz", &body, NULL, &err), -1);
    assert_null(body);
    assert_int_equal(err.kind, GEMM_CLIENT_E_CONNECT);
    assert_true(err.curl_code != 0);
    gemm_client_free(c);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN); /* the scripted server writes to clients that may have gone */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request_and_answer), cmocka_unit_test(test_protocol_errors),
        cmocka_unit_test(test_server_errors),      cmocka_unit_test(test_retry_after_503),
        cmocka_unit_test(test_job_submit),         cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
