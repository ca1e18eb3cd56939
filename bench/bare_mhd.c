/*
 * bare_mhd.c - the ceiling of our own HTTP library: a bare libmicrohttpd server with the
 * daemon's threading (internal polling thread, epoll, a thread pool of the same size) that
 * reads any POST body and answers with the bytes a product of that request would return
 * (batch*m*n elements of the dtype in the query, all zeros), as application/octet-stream.
 *
 * No decoding, no engine, no copies: whatever gemmd spends beyond this server on the same
 * request is gemmd's own cost. bench/load.py runs wrk against both, in alternating rounds.
 *
 *   build/bench/bare_mhd --port 8090 --threads 4 [--listen 127.0.0.1] [--connection-limit 1024]
 *
 * Runs until SIGINT/SIGTERM.
 */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Answers come from one zeroed buffer that only grows (under a lock); a response points
 * into it, so nothing is copied or allocated per request once it is large enough. */
static pthread_mutex_t zeros_mu = PTHREAD_MUTEX_INITIALIZER;
static char *zeros;
static size_t zeros_len;
static volatile sig_atomic_t stop;

#define MAX_ANSWER (1ull << 31) /* 2 GiB: more than any benchmark asks for */

static const char *zeros_for(size_t n)
{
    pthread_mutex_lock(&zeros_mu);
    if (n > zeros_len) {
        /* Old buffers stay alive: responses in flight may still point into them. */
        char *z = calloc(1, n);
        if (z) {
            zeros = z;
            zeros_len = n;
        }
    }
    const char *z = n <= zeros_len ? zeros : NULL;
    pthread_mutex_unlock(&zeros_mu);
    return z;
}

static uint64_t query_u64(struct MHD_Connection *c, const char *key)
{
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, key);
    if (!v || !*v) return 0;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    return *end ? 0 : (uint64_t)x;
}

/* C's element size: float64 8, else 4 (C of float16 / bfloat16 operands is float32). */
static size_t elem_size(const char *dtype)
{
    return dtype && strcmp(dtype, "float64") == 0 ? 8 : 4;
}

static enum MHD_Result answer(struct MHD_Connection *c, unsigned status, const char *body, size_t len,
                              enum MHD_ResponseMemoryMode mode, const char *mime)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, mode);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, mime);
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

static int marker; /* *con_cls for a request whose headers have been seen */

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    (void)cls, (void)url, (void)version, (void)upload_data;
    if (!*con_cls) {
        *con_cls = &marker;
        return MHD_YES;
    }
    if (*upload_data_size) { /* read and drop the body, as it arrives */
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (strcmp(method, "POST") != 0) {
        static const char ok[] = "{\"status\":\"ok\"}";
        return answer(c, MHD_HTTP_OK, ok, sizeof ok - 1, MHD_RESPMEM_PERSISTENT, "application/json");
    }
    uint64_t m = query_u64(c, "m"), n = query_u64(c, "n"), b = query_u64(c, "batch");
    size_t es = elem_size(MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "dtype"));
    if (b) m = m > UINT64_MAX / b ? UINT64_MAX : m * b;
    if (m == 0 || n == 0 || m > MAX_ANSWER / es / n) {
        static const char bad[] = "{\"error\":{\"code\":\"bad_request\",\"message\":\"need m and n\"}}";
        return answer(c, MHD_HTTP_BAD_REQUEST, bad, sizeof bad - 1, MHD_RESPMEM_PERSISTENT, "application/json");
    }
    size_t len = (size_t)(m * n * es);
    const char *z = zeros_for(len);
    if (!z) return MHD_NO;
    return answer(c, MHD_HTTP_OK, z, len, MHD_RESPMEM_PERSISTENT, "application/octet-stream");
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode t)
{
    (void)cls, (void)c, (void)t;
    *con_cls = NULL;
}

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

static void usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--port P] [--threads N] [--listen ADDR] [--connection-limit N] [--timeout S]\n"
            "          [--connection-memory-kb K (default 64, the daemon's connection_memory_kb)]\n"
            "  a bare libmicrohttpd server answering POST ?m=&n=&dtype=[&batch=] with batch*m*n zeros (the ceiling)\n",
            argv0);
}

int main(int argc, char **argv)
{
    int port = 8090, threads = 4, limit = 1024, timeout = 60, mem_kb = 64, bad = 0;
    const char *listen = "127.0.0.1";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[++i] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(argv[0]);
            return 0;
        }
        if (!v) bad = 1;
        else if (strcmp(a, "--port") == 0) port = atoi(v);
        else if (strcmp(a, "--threads") == 0) threads = atoi(v);
        else if (strcmp(a, "--listen") == 0) listen = v;
        else if (strcmp(a, "--connection-limit") == 0) limit = atoi(v);
        else if (strcmp(a, "--timeout") == 0) timeout = atoi(v);
        else if (strcmp(a, "--connection-memory-kb") == 0) mem_kb = atoi(v);
        else bad = 1;
    }
    if (bad || port < 0 || port > 65535 || threads < 1 || limit < 1 || timeout < 0 || mem_kb < 16 ||
        mem_kb > 16384) {
        usage(argv[0]);
        return 2;
    }
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, listen, &sa.sin_addr) != 1) {
        fprintf(stderr, "bare_mhd: --listen takes an IPv4 address, not %s\n", listen);
        return 2;
    }
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG, (uint16_t)port, NULL, NULL, on_request,
        NULL, MHD_OPTION_SOCK_ADDR, &sa, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)threads,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)timeout, MHD_OPTION_CONNECTION_LIMIT, (unsigned)limit,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)mem_kb * 1024,
        /* as the daemon sets it (server/http.c): reads of almost the whole buffer before 1.0 */
        MHD_OPTION_CONNECTION_MEMORY_INCREMENT, (size_t)(MHD_VERSION < 0x01000000 ? mem_kb * 1024 : 1024),
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL,
        MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "bare_mhd: cannot listen on %s:%d\n", listen, port);
        return 1;
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    fprintf(stderr, "bare_mhd: listening on http://%s:%d with %d threads\n", listen, port, threads);
    while (!stop) pause();
    MHD_stop_daemon(d);
    return 0;
}
