/*
 * parallel.c - one product over several connections (docs/CLIENT.md,
 * gemm_client_multiply_streams).
 */
#include "client_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MAX_STREAMS 16
#define AUTO_MIN_BYTES (64ull << 20) /* below this (A + B + C) one request is as fast */
#define AUTO_STREAMS 4

int gemm_client_auto_streams(const gemm_request *r)
{
    size_t ab, bb, cb;
    if (!r || !gemm_matrix_bytes(r->m, r->k, r->dtype, &ab) || !gemm_matrix_bytes(r->k, r->n, r->dtype, &bb) ||
        !gemm_matrix_bytes(r->m, r->n, gemm_request_c_dtype(r), &cb))
        return 1;
    return (uint64_t)ab + bb + cb < AUTO_MIN_BYTES || r->m < 2 * AUTO_STREAMS ? 1 : AUTO_STREAMS;
}

/* What the panels share with the caller's thread, whose progress callback alone may ask them
 * to stop (the panels' own callback counts bytes and reports the stop). */
typedef struct {
    uint64_t whole_m; /* the rows of the whole product (panel_of: chosen as for it) */
    const char *b_id; /* B, resident */
    _Atomic int stop;
    _Atomic int finished;
    /* the barrier between B's shares and A's panels: each panel arrives once its share of
     * B is in; the caller's thread sets expected once it knows how many panels started */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived, expected; /* expected -1: not known yet */
} shared_state;

typedef struct {
    gemm_client *cl;
    shared_state *sh;
    _Atomic unsigned long long up, down; /* its progress */
    unsigned long long up_base; /* bytes of this panel's earlier requests (its share of B) */
    gemm_request r;   /* this panel: m rows of A and C */
    uint64_t b_row0, b_rows; /* this panel's share of B to PUT first (0 rows: B is in) */
    int stopped;             /* it stopped because another one failed */
    gemm_timing t;
    gemm_client_error err;
    int rc;
} panel;

static int panel_progress_cb(void *ctx, uint64_t up_now, uint64_t up_total, uint64_t down_now, uint64_t down_total)
{
    (void)up_total;
    (void)down_total;
    panel *p = ctx;
    atomic_store(&p->up, p->up_base + (unsigned long long)up_now);
    atomic_store(&p->down, (unsigned long long)down_now);
    return atomic_load(&p->sh->stop);
}

/* Faults in the whole pages of C this panel will write before its bytes arrive (a fresh
 * mapping of an output file would take a fault per page); kernels before 5.14 lack it. */
static void prefault(void *p, size_t len)
{
#ifdef MADV_POPULATE_WRITE
    long pg = sysconf(_SC_PAGESIZE);
    if (pg <= 0 || !p || len < (size_t)pg) return;
    uintptr_t a = ((uintptr_t)p + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
    uintptr_t b = ((uintptr_t)p + len) & ~((uintptr_t)pg - 1);
    if (b > a) (void)madvise((void *)a, b - a, MADV_POPULATE_WRITE);
#else
    (void)p;
    (void)len;
#endif
}

/* PUT rows [b_row0, b_row0 + b_rows) of B into the empty resident matrix. */
static int put_b_share(panel *p)
{
    char pq[200];
    size_t row_bytes = 0;
    snprintf(pq, sizeof pq, "/v1/matrices/%s?row=%llu", p->sh->b_id, (unsigned long long)p->b_row0);
    gemm_matrix_bytes(1, p->r.n, p->r.dtype, &row_bytes);
    gemm_xfer x = {.cl = p->cl, .method = GEMM_HTTP_PUT, .path_query = pq,
                   .part = {(const unsigned char *)p->r.b + p->b_row0 * row_bytes},
                   .part_len = {(size_t)p->b_rows * row_bytes}};
    int rc = gemm_xfer_call(&x, NULL, NULL, &p->err);
    p->up_base += (unsigned long long)p->b_rows * row_bytes; /* what the progress adds to its PUT's */
    return rc;
}

/* Faults in the panel's C, then waits until every started panel has its share of B in, or
 * a stop. 0, or -1 (stopped). */
static int barrier_wait(panel *p, size_t c_bytes)
{
    shared_state *sh = p->sh;
    prefault(p->r.c, c_bytes);
    pthread_mutex_lock(&sh->mu);
    sh->arrived++;
    pthread_cond_broadcast(&sh->cv);
    while (!atomic_load(&sh->stop) && (sh->expected < 0 || sh->arrived < sh->expected))
        pthread_cond_wait(&sh->cv, &sh->mu);
    int stopped = atomic_load(&sh->stop);
    pthread_mutex_unlock(&sh->mu);
    return stopped ? -1 : 0;
}

/* Wakes every waiter: after a stop (a panel failed, or the caller said stop) and after a
 * panel's end (whichever way: the caller's thread wakes at once, not at its next tick). */
static void notify(shared_state *sh, int stop, int done)
{
    pthread_mutex_lock(&sh->mu);
    if (stop) atomic_store(&sh->stop, 1);
    if (done) atomic_fetch_add(&sh->finished, 1);
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
}

static void *run_panel(void *arg)
{
    panel *p = arg;
    char pq[400];
    size_t c_bytes = 0;
    gemm_matrix_bytes(p->r.m, p->r.n, gemm_request_c_dtype(&p->r), &c_bytes);
    int stop = 0;
    if (p->b_rows && put_b_share(p) != 0) {
        p->rc = stop = -1;
    } else if (barrier_wait(p, c_bytes) != 0) {
        /* another panel failed (its error is the one told) */
        p->rc = gemm_client_err(&p->err, GEMM_CLIENT_E_ABORTED, "aborted", "stopped: another panel failed");
        p->stopped = 1;
    } else if ((p->rc = gemm_request_query(&p->r, "/v1/matmul", pq, sizeof pq - 136, &p->err)) != 0) {
        stop = 1;
    } else {
        /* panel_of: the server runs the algorithm of the whole product on these rows, so that
         * they come out as in one request (a server that predates it ignores it) */
        snprintf(pq + strlen(pq), 136, "&b=%s&panel_of=%llu", p->sh->b_id, (unsigned long long)p->sh->whole_m);
        gemm_xfer x = {.cl = p->cl, .method = GEMM_HTTP_POST, .path_query = pq, .part = {p->r.a},
                       .dst = p->r.c, .dst_len = c_bytes, .exp_m = p->r.m, .exp_n = p->r.n};
        gemm_matrix_bytes(p->r.m, p->r.k, p->r.dtype, &x.part_len[0]);
        p->rc = gemm_xfer_call(&x, NULL, &p->t, &p->err);
    }
    notify(p->sh, stop, 1);
    return NULL;
}

/* POST /v1/matrices with B (empty: without its rows, which the panels PUT); its id into
 * id[cap]. */
static int upload_b(gemm_client *c, const gemm_request *r, int empty, char *id, size_t cap, gemm_client_error *err)
{
    char pq[160];
    snprintf(pq, sizeof pq, "/v1/matrices?rows=%llu&cols=%llu&dtype=%s%s", (unsigned long long)r->k,
             (unsigned long long)r->n, gemm_dtype_name(r->dtype), empty ? "&empty=1" : "");
    gemm_xfer x = {.cl = c, .method = GEMM_HTTP_POST, .path_query = pq, .part = {r->b}};
    if (!empty) gemm_matrix_bytes(r->k, r->n, r->dtype, &x.part_len[0]);
    cJSON *j = NULL;
    int rc = gemm_xfer_call(&x, &j, NULL, err);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "id");
    id[0] = '\0';
    if (cJSON_IsString(v) && strlen(v->valuestring) < cap && gemm_url_safe(v->valuestring)) /* [instance_id-]hex */
        snprintf(id, cap, "%s", v->valuestring);
    cJSON_Delete(j);
    if (rc == 0 && !id[0])
        rc = gemm_client_err(err, GEMM_CLIENT_E_PROTOCOL, "bad_response",
                             "the server kept B but gave no usable matrix id");
    return rc;
}

static void delete_b(gemm_client *c, const char *id)
{
    char pq[160];
    gemm_client_error e;
    snprintf(pq, sizeof pq, "/v1/matrices/%s", id);
    gemm_xfer x = {.cl = c, .method = GEMM_HTTP_DELETE, .path_query = pq};
    gemm_xfer_call(&x, NULL, NULL, &e); /* best effort: a leftover is freed by the server's restart */
}

/* The panels' bytes so far, added up, to the caller's progress callback: its answer. */
static int report(gemm_client *c, const panel *p, int nstarted, uint64_t up_total, uint64_t down_total)
{
    uint64_t up = 0, down = 0;
    for (int i = 0; i < nstarted; i++) {
        up += atomic_load(&p[i].up);
        down += atomic_load(&p[i].down);
    }
    return c->o.progress(c->o.progress_ctx, up, up_total, down, down_total);
}

/* The caller's thread while the nstarted panels run: it reports their progress together
 * (waking every 20 ms, or when the last one ends) and passes a stop on; then once more at
 * the end, as one connection's transfer does, since a fast product may be done before the
 * first 20 ms. */
static void watch(gemm_client *c, const gemm_request *r, int parts, panel *p, int nstarted, shared_state *sh)
{
    size_t up_total = 0, down_total = 0, b_total = 0;
    gemm_matrix_bytes(r->m, r->k, r->dtype, &up_total);
    if (parts && gemm_matrix_bytes(r->k, r->n, r->dtype, &b_total)) up_total += b_total;
    gemm_matrix_bytes(r->m, r->n, gemm_request_c_dtype(r), &down_total);
    pthread_mutex_lock(&sh->mu);
    sh->expected = nstarted;
    pthread_cond_broadcast(&sh->cv);
    while (atomic_load(&sh->finished) < nstarted) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 20 * 1000000L;
        until.tv_sec += until.tv_nsec / 1000000000L;
        until.tv_nsec %= 1000000000L;
        while (atomic_load(&sh->finished) < nstarted && pthread_cond_timedwait(&sh->cv, &sh->mu, &until) == 0) {
        }
        if (!c->o.progress || atomic_load(&sh->finished) >= nstarted) continue;
        pthread_mutex_unlock(&sh->mu);
        if (report(c, p, nstarted, up_total, down_total)) notify(sh, 1, 0);
        pthread_mutex_lock(&sh->mu);
    }
    pthread_mutex_unlock(&sh->mu);
    if (c->o.progress) report(c, p, nstarted, up_total, down_total);
}

int gemm_client_multiply_streams(gemm_client *c, const gemm_request *r, int streams, gemm_timing *t,
                                 gemm_client_error *err)
{
    GEMM_ERR_BEGIN(err);
    if (!c || !r) return GEMM_ARG_ERR(err, "no client or request");
    if (streams < 0) return GEMM_ARG_ERR(err, "streams must be >= 0");
    int n = streams > 0 ? streams : gemm_client_auto_streams(r);
    if (n > MAX_STREAMS) n = MAX_STREAMS;
    if ((uint64_t)n > r->m) n = (int)r->m;
    size_t es = gemm_dtype_size(r->dtype), esc = gemm_dtype_size(gemm_request_c_dtype(r));
    if (n <= 1 || es == 0 || !r->a || !r->b || !r->c || r->k == 0 || r->n == 0)
        return gemm_client_multiply(c, r, t, err); /* one request (and its argument checks) */

    double t0 = gemm_now_ms();
    char id[128];
    /* B empty, its rows PUT by the panels; a server that does not know empty matrices
     * answers 400 (a raw matrix without its bytes): B goes whole, first */
    int parts = 1;
    if (upload_b(c, r, 1, id, sizeof id, err) != 0) {
        if (err->kind != GEMM_CLIENT_E_SERVER || err->http_status != 400) return -1;
        memset(err, 0, sizeof *err);
        parts = 0;
        if (upload_b(c, r, 0, id, sizeof id, err) != 0) return -1;
    }
    shared_state sh = {.whole_m = r->m, .b_id = id, .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER,
                       .expected = -1};
    panel p[MAX_STREAMS];
    pthread_t th[MAX_STREAMS];
    memset(p, 0, sizeof p);
    int rc = 0, nstarted = 0;
    uint64_t row = 0;
    for (int i = 0; i < n && rc == 0; row += p[i++].r.m) {
        p[i].r = *r;
        p[i].r.m = r->m / (uint64_t)n + ((uint64_t)i < r->m % (uint64_t)n ? 1 : 0);
        p[i].r.a = (const char *)r->a + row * r->k * es;
        p[i].r.c = (char *)r->c + row * r->n * esc;
        if (parts) { /* B's rows shared out the same way */
            p[i].b_rows = r->k / (uint64_t)n + ((uint64_t)i < r->k % (uint64_t)n ? 1 : 0);
            p[i].b_row0 = i ? p[i - 1].b_row0 + p[i - 1].b_rows : 0;
        }
        p[i].sh = &sh;
        gemm_client_options o = c->o; /* a handle of its own (its own connection), same settings */
        o.progress = panel_progress_cb;
        o.progress_ctx = &p[i];
        if (!(p[i].cl = gemm_client_new(c->base, &o, NULL)))
            rc = gemm_client_err(err, GEMM_CLIENT_E_NOMEM, "out_of_memory", "out of memory for a connection");
        else if (pthread_create(&th[i], NULL, run_panel, &p[i]) != 0)
            rc = gemm_client_err(err, GEMM_CLIENT_E_NOMEM, "thread", "cannot start a transfer thread");
        else
            nstarted++;
    }
    if (rc != 0) notify(&sh, 1, 0); /* not every share of B will come: the started ones stop */
    watch(c, r, parts, p, nstarted, &sh);
    for (int i = 0; i < nstarted; i++) pthread_join(th[i], NULL);
    /* the first panel's own failure; "stopped because another failed" only if none */
    for (int pass = 0; pass < 2 && rc == 0; pass++)
        for (int i = 0; rc == 0 && i < n; i++)
            if (p[i].rc != 0 && (pass || !p[i].stopped)) {
                *err = p[i].err;
                rc = -1;
            }
    if (rc == 0 && t) {
        *t = p[0].t;
        for (int i = 1; i < n; i++) {
            t->bytes_sent += p[i].t.bytes_sent;
            t->bytes_received += p[i].t.bytes_received;
            if (p[i].t.kernel_ms > t->kernel_ms) t->kernel_ms = p[i].t.kernel_ms;
            if (p[i].t.total_ms > t->total_ms) t->total_ms = p[i].t.total_ms;
        }
        t->client_total_ms = gemm_now_ms() - t0;
        t->client_transfer_ms = t->total_ms >= 0 ? t->client_total_ms - t->total_ms : -1;
    }
    delete_b(c, id);
    for (int i = 0; i < n; i++) gemm_client_free(p[i].cl);
    if (rc == 0) err->http_status = 200;
    return rc;
}
