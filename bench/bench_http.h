/*
 * bench_http.h - what the loopback benchmarks share: one raw-binary POST /v1/matmul
 * through libcurl with the Server-Timing header parsed, starting a daemon and waiting
 * for /healthz, medians. Header-only: each benchmark stays one program.
 */
#ifndef GEMM_BENCH_HTTP_H
#define GEMM_BENCH_HTTP_H

#include <curl/curl.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gemm_types.h"

typedef struct {
    char *data;
    size_t len, cap;
} buf;

typedef struct {
    buf body;
    double kernel_ms, total_ms, recv_ms; /* from Server-Timing; -1 when absent */
    long status;
} answer;

static size_t on_body(char *p, size_t sz, size_t nm, void *ud)
{
    buf *b = ud;
    size_t n = sz * nm;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) cap *= 2;
        char *q = realloc(b->data, cap);
        if (!q) return 0;
        b->data = q, b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return n;
}

static double timing_field(const char *h, const char *name)
{
    char key[32];
    snprintf(key, sizeof key, "%s;dur=", name);
    const char *p = strstr(h, key);
    return p ? strtod(p + strlen(key), NULL) : -1;
}

static size_t on_header(char *p, size_t sz, size_t nm, void *ud)
{
    answer *a = ud;
    size_t n = sz * nm;
    if (n > 14 && strncasecmp(p, "Server-Timing:", 14) == 0) {
        char line[512];
        size_t l = n < sizeof line - 1 ? n : sizeof line - 1;
        memcpy(line, p, l);
        line[l] = '\0';
        double k = timing_field(line, "kernel"), t = timing_field(line, "total"),
               r = timing_field(line, "recv");
        if (k >= 0) a->kernel_ms = k;
        if (t >= 0) a->total_ms = t;
        if (r >= 0) a->recv_ms = r;
    }
    return n;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* One POST /v1/matmul (float32, body A then B); fills *ans; returns the wall time in ms
 * or -1. The handle keeps its connection between calls, as a client library would. */
static double post_matmul(CURL *c, const char *url, const void *ab, size_t ab_bytes, size_t m,
                          size_t k, size_t n, answer *ans)
{
    char full[512];
    snprintf(full, sizeof full, "%s/v1/matmul?m=%zu&k=%zu&n=%zu&dtype=float32", url, m, k, n);
    ans->body.len = 0;
    ans->kernel_ms = ans->total_ms = ans->recv_ms = -1;
    ans->status = 0;
    curl_easy_setopt(c, CURLOPT_URL, full);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, ab);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)ab_bytes);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &ans->body);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, ans);
    double t0 = gemm_now_ms();
    CURLcode rc = curl_easy_perform(c);
    double t1 = gemm_now_ms();
    if (rc != CURLE_OK) {
        fprintf(stderr, "bench: %s: %s\n", full, curl_easy_strerror(rc));
        return -1;
    }
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &ans->status);
    return t1 - t0;
}

/* Polls GET /healthz until 200 (0) or `seconds` pass (-1). */
static int wait_healthy(const char *url, int seconds)
{
    char full[512];
    snprintf(full, sizeof full, "%s/healthz", url);
    CURL *c = curl_easy_init();
    if (!c) return -1;
    curl_easy_setopt(c, CURLOPT_URL, full);
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 2L);
    int ok = -1;
    for (int i = 0; i < seconds * 10; i++) {
        long code = 0;
        if (curl_easy_perform(c) == CURLE_OK &&
            curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code) == CURLE_OK && code == 200) {
            ok = 0;
            break;
        }
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
    }
    curl_easy_cleanup(c);
    return ok;
}

/* Starts `path --listen 127.0.0.1 --port P --backend cpu EXTRA...`; returns its pid. */
static pid_t start_daemon(const char *path, int port, const char *extra)
{
    char portbuf[16];
    snprintf(portbuf, sizeof portbuf, "%d", port);
    char *argv[32] = {(char *)path, "--listen", "127.0.0.1", "--port", portbuf, "--backend", "cpu"};
    int argc = 7;
    char *extra_copy = extra ? strdup(extra) : NULL, *save = NULL;
    for (char *t = extra_copy ? strtok_r(extra_copy, " ", &save) : NULL; t && argc < 31;
         t = strtok_r(NULL, " ", &save))
        argv[argc++] = t;
    argv[argc] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        execv(path, argv);
        fprintf(stderr, "bench: cannot run %s: %s\n", path, strerror(errno));
        _exit(127);
    }
    free(extra_copy);
    return pid;
}

/* A handle with the headers of a raw-binary request; *hdrs is freed by the caller. */
static CURL *bench_curl(struct curl_slist **hdrs)
{
    CURL *c = curl_easy_init();
    if (!c) return NULL;
    *hdrs = curl_slist_append(NULL, "Content-Type: application/octet-stream");
    *hdrs = curl_slist_append(*hdrs, "Accept: application/octet-stream");
    *hdrs = curl_slist_append(*hdrs, "Expect:"); /* send the body without waiting for 100 */
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, *hdrs);
    curl_easy_setopt(c, CURLOPT_TCP_NODELAY, 1L);
    return c;
}

/* Deterministic uniform [-1, 1) floats. */
static void bench_fill(float *p, size_t n, uint64_t seed)
{
    uint64_t x = 88172645463325252ull + seed;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = (float)((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
}

#endif /* GEMM_BENCH_HTTP_H */
