/*
 * offload.c - one product on the gemmd server, through libgemm: settings from the
 * environment (read once), a pool of libgemm clients that a thread borrows for one product,
 * the layout chosen and the failures (docs/BLAS.md, "How a product travels", "When the
 * server cannot take a product", "Threads, connections, fork").
 */
#include "blas_internal.h"
#include "gemm.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Default thresholds: the break-even measured in bench/results/blas-offload-cpu.md
 * (docs/BLAS.md says how to measure them for another host). */
#define GB_DEFAULT_MIN_FLOPS_F32 9.0e8
#define GB_DEFAULT_MIN_FLOPS_F64 2.7e8
#define GB_DEFAULT_MIN_INTENSITY_F32 40.0
#define GB_DEFAULT_MIN_INTENSITY_F64 24.0

#define GB_POOL_IDLE 32

static struct {
    pthread_once_t once;
    gb_settings pub;
    char *url, *kernel;
    gemm_math math;
    long backoff_ms;
    gemm_client_options client; /* of every client in the pool */
} cfg = {.once = PTHREAD_ONCE_INIT};

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static gemm_client *pool[GB_POOL_IDLE];
static int pool_n;
static gemm_client *stale[GB_POOL_IDLE]; /* a forked child's inherited connections: never used */
static _Atomic int64_t down_until_ms;    /* back-off after a server failure */

/* ---------------------------------------------------------------- stderr */

void gb_write_line(const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n > sizeof line - 2) n = (int)sizeof line - 2;
    line[n++] = '\n';
    const char *p = line;
    while (n > 0) {
        ssize_t w = write(2, p, (size_t)n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        p += w;
        n -= (int)w;
    }
}

void gb_warn_once(const char *key, const char *fmt, ...)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static char seen[64][48];
    static int nseen;
    int told = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < nseen && !told; i++) told = strcmp(seen[i], key) == 0;
    if (!told && nseen < 64) snprintf(seen[nseen++], sizeof seen[0], "%s", key);
    pthread_mutex_unlock(&mu);
    if (told) return;
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    gb_write_line("libgemm_blas: warning: %s", msg);
}

/* ---------------------------------------------------------------- settings */

/* name as a number >= 0 (whole: an integer in lo..hi), else dflt after one warning. */
static double env_num(const char *name, double dflt, int whole, long lo, long hi)
{
    const char *s = getenv(name);
    char *end;
    if (!s || !*s) return dflt;
    errno = 0;
    double v = whole ? (double)strtol(s, &end, 10) : strtod(s, &end);
    if (!errno && end != s && !*end && isfinite(v) && v >= (whole ? lo : 0) && (!whole || v <= hi)) return v;
    if (whole) gb_warn_once(name, "%s=\"%s\" is not an integer in %ld..%ld; using %ld", name, s, lo, hi, (long)dflt);
    else gb_warn_once(name, "%s=\"%s\" is not a number >= 0; using %g", name, s, dflt);
    return dflt;
}

/* One value of name for both types, else each type's default. */
static void env_pair(const char *name, double v[2], double d32, double d64)
{
    double x = env_num(name, -1, 0, 0, 0);
    v[GB_F32] = x >= 0 ? x : d32;
    v[GB_F64] = x >= 0 ? x : d64;
}

static char *env_dup(const char *name)
{
    const char *s = getenv(name);
    return s && *s ? strdup(s) : NULL;
}

static void atfork_child(void)
{
    /* The parent's connections share sockets with the parent: keep them (reachable, so
     * leak checkers stay quiet) but never use or close them here. */
    pthread_mutex_init(&pool_mu, NULL);
    for (int i = 0; i < pool_n; i++) stale[i] = pool[i];
    for (int i = pool_n; i < GB_POOL_IDLE; i++) stale[i] = NULL;
    pool_n = 0;
}

int gb_log_wanted(void)
{
    const char *lg = getenv("GEMM_OFFLOAD_LOG");
    return lg && *lg && strcmp(lg, "0") != 0;
}

static void settings_init(void)
{
    gb_settings *s = &cfg.pub;
    s->log = gb_log_wanted();
    env_pair("GEMM_OFFLOAD_MIN_FLOPS", s->min_flops, GB_DEFAULT_MIN_FLOPS_F32, GB_DEFAULT_MIN_FLOPS_F64);
    env_pair("GEMM_OFFLOAD_MIN_INTENSITY", s->min_intensity, GB_DEFAULT_MIN_INTENSITY_F32,
             GB_DEFAULT_MIN_INTENSITY_F64);
    s->learn = (int)env_num("GEMM_OFFLOAD_LEARN", 1, 1, 0, 1);
    cfg.url = env_dup("GEMM_SERVER");
    cfg.kernel = env_dup("GEMM_OFFLOAD_KERNEL");
    const char *m = getenv("GEMM_OFFLOAD_MATH");
    if (m && *m && gemm_math_from_name(m, &cfg.math) != 0) {
        gb_warn_once("GEMM_OFFLOAD_MATH", "GEMM_OFFLOAD_MATH=\"%s\" is not one of default, fp32, tf32, bf16; "
                     "using the server's default", m);
        cfg.math = GEMM_MATH_DEFAULT;
    }
    cfg.backoff_ms = (long)env_num("GEMM_OFFLOAD_BACKOFF_MS", 10000, 1, 0, 86400000L);
    gemm_client_options *o = &cfg.client;
    gemm_client_options_init(o);
    o->token = env_dup("GEMM_TOKEN");
    o->timeout_ms = (long)env_num("GEMM_OFFLOAD_TIMEOUT_MS", 300000, 1, 0, 86400000L);
    o->connect_timeout_ms = (long)env_num("GEMM_OFFLOAD_CONNECT_TIMEOUT_MS", 3000, 1, 1, 600000L);
    o->max_retries = (int)env_num("GEMM_OFFLOAD_RETRIES", 2, 1, 0, 100);
    o->max_retry_wait_ms = 2000;
    o->default_retry_wait_ms = 200;
    s->enabled = cfg.url != NULL;
    if (!s->enabled)
        gb_warn_once("no_server", "GEMM_SERVER is not set: every product runs on the host BLAS");
    pthread_atfork(NULL, NULL, atfork_child);
}

const gb_settings *gb_settings_get(void)
{
    pthread_once(&cfg.once, settings_init);
    return &cfg.pub;
}

/* ---------------------------------------------------------------- client pool */

static gemm_client *pool_take(gemm_client_error *err)
{
    gemm_client *c = NULL;
    pthread_mutex_lock(&pool_mu);
    if (pool_n > 0) c = pool[--pool_n];
    pthread_mutex_unlock(&pool_mu);
    return c ? c : gemm_client_new(cfg.url, &cfg.client, err);
}

static void pool_give(gemm_client *c)
{
    pthread_mutex_lock(&pool_mu);
    if (pool_n < GB_POOL_IDLE) {
        pool[pool_n++] = c;
        c = NULL;
    }
    pthread_mutex_unlock(&pool_mu);
    gemm_client_free(c);
}

/* ---------------------------------------------------------------- failures */

/* Fills res->why, warns once per reason, and starts the back-off when the server as a
 * whole cannot take products right now. */
static void failed(const gb_problem *pr, const gemm_client_error *e, gb_result *res)
{
    const char *key = e->code[0] ? e->code : gemm_client_error_kind_name(e->kind);
    snprintf(res->why, sizeof res->why, "%s", key);
    /* 503 (after retries), other 5xx, a refused token and a bad URL concern every product;
     * other 4xx (too large, an option the server does not take) and local limits this one */
    int server_wide = e->kind != GEMM_CLIENT_E_NOMEM && strcmp(e->code, "too_large") != 0;
    if (e->kind == GEMM_CLIENT_E_SERVER) {
        server_wide = e->http_status >= 500 || e->http_status == 401 || e->http_status == 403;
        snprintf(res->why, sizeof res->why, "HTTP %d %s", e->http_status, key);
    } else if (e->kind == GEMM_CLIENT_E_NOMEM) {
        snprintf(res->why, sizeof res->why, "out of memory");
    }
    char when[96] = "";
    if (server_wide && cfg.backoff_ms > 0) {
        atomic_store(&down_until_ms, (int64_t)gemm_now_ms() + cfg.backoff_ms);
        snprintf(when, sizeof when, "; for %ld ms every product does, then the server is tried again",
                 cfg.backoff_ms);
    }
    gb_warn_once(key,
                 "%s could not run on %s (%s: %s)%s; it ran on the host BLAS (%s)%s. This warning "
                 "is given once per reason",
                 pr->desc, cfg.url, res->why, e->message, e->retries ? " after retries" : "", pr->host, when);
}

/* ---------------------------------------------------------------- the product */

void gb_offload(const gb_problem *pr, gb_result *res)
{
    memset(res, 0, sizeof *res);
    gb_settings_get();
    int64_t until = atomic_load(&down_until_ms);
    if (until && gemm_now_ms() < (double)until) {
        res->backoff = 1;
        snprintf(res->why, sizeof res->why, "server failed recently");
        return;
    }
    size_t esz = pr->type == GB_F32 ? 4 : 8, bytes_c, bytes;
    gemm_dtype dt = pr->type == GB_F32 ? GEMM_DTYPE_F32 : GEMM_DTYPE_F64;
    if (!gemm_matrix_bytes((uint64_t)pr->m, (uint64_t)pr->n, dt, &bytes_c) ||
        !gemm_matrix_bytes((uint64_t)pr->m, (uint64_t)pr->k, dt, &bytes) ||
        !gemm_matrix_bytes((uint64_t)pr->k, (uint64_t)pr->n, dt, &bytes)) {
        failed(pr, &(gemm_client_error){.kind = GEMM_CLIENT_E_ARGUMENT, .code = "too_large",
                                        .message = "the matrices' sizes overflow"}, res);
        return;
    }
    double mn = (double)pr->m * (double)pr->n;
    int tight_c = pr->alpha == 1 && pr->beta == 0 && pr->ldc == pr->n;
    double direct = gb_pack_cost(&pr->p, 0) + gb_pack_cost(&pr->q, 0) + (tight_c ? 0 : mn);
    double swapped = gb_pack_cost(&pr->q, 1) + gb_pack_cost(&pr->p, 1) + 2 * mn;
    int swap = swapped < direct;

    void *own_a = NULL, *own_b = NULL, *own_t = NULL;
    const void *a = swap ? gb_pack(&pr->q, 1, esz, &own_a) : gb_pack(&pr->p, 0, esz, &own_a);
    const void *b = a ? (swap ? gb_pack(&pr->p, 1, esz, &own_b) : gb_pack(&pr->q, 0, esz, &own_b)) : NULL;
    void *t = pr->c;
    if (swap || !tight_c) t = own_t = malloc(bytes_c);
    if (!a || !b || !t) {
        failed(pr, &(gemm_client_error){.kind = GEMM_CLIENT_E_NOMEM, .code = "out_of_memory",
                                        .message = "packing the operands"}, res);
        goto out;
    }

    gemm_request r = {.dtype = dt, .m = (uint64_t)(swap ? pr->n : pr->m), .k = (uint64_t)pr->k,
                      .n = (uint64_t)(swap ? pr->m : pr->n), .a = a, .b = b, .c = t, .kernel = cfg.kernel,
                      .math = cfg.math};
    gemm_client_error err;
    gemm_client *cl = pool_take(&err); /* NULL: err says why (not a server error) */
    gemm_timing tm;
    double t0 = gemm_now_ms();
    int rc = cl ? gemm_client_multiply(cl, &r, &tm, &err) : -1;
    res->ms = gemm_now_ms() - t0;
    if (rc != 0 && err.kind != GEMM_CLIENT_E_SERVER) gemm_client_free(cl); /* the connection: in any state */
    else pool_give(cl);
    if (rc != 0) {
        failed(pr, &err, res);
        goto out;
    }
    if (own_t) gb_epilogue(pr->type, pr->c, pr->ldc, own_t, pr->m, pr->n, swap, pr->alpha, pr->beta);
    res->ok = 1;
    res->kernel_ms = tm.kernel_ms;
    snprintf(res->kernel, sizeof res->kernel, "%s", tm.kernel);
out:
    free(own_a);
    free(own_b);
    free(own_t);
}
