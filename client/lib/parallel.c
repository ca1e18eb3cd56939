/*
 * parallel.c - one large product over several connections at once: B is uploaded once
 * as a resident matrix, A is cut into row panels sent in parallel (each POST
 * /v1/matmul?b=ID carries one panel of A and answers that panel of C, written straight
 * into place), and B is deleted afterwards. Every panel is the same product the single
 * request would run on those rows, so C is the same bytes.
 */
#include "client_internal.h"
#include "gemm_util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#define MAX_STREAMS 16
#define AUTO_MIN_BYTES (64ull << 20) /* below this (A + B + C) one request is as fast */
#define AUTO_STREAMS 4

int gemm_client_auto_streams(const gemm_request *r)
{
    size_t ab, bb, cb;
    if (!r || !gemm_matrix_bytes(r->m, r->k, r->dtype, &ab) || !gemm_matrix_bytes(r->k, r->n, r->dtype, &bb) ||
        !gemm_matrix_bytes(r->m, r->n, gemm_request_c_dtype(r), &cb))
        return 1;
    uint64_t total = (uint64_t)ab + bb + cb;
    if (total < AUTO_MIN_BYTES || r->m < 2 * AUTO_STREAMS) return 1;
    return AUTO_STREAMS;
}

/* What the panels share with the caller's thread: their progress, and a stop asked by the
 * caller's progress callback (which only that thread calls: the panels' own callback just
 * counts and reports the stop). */
typedef struct {
    _Atomic int stop;
    _Atomic int finished;
} shared_state;

typedef struct {
    shared_state *sh;
    _Atomic unsigned long long up, down;
} panel_progress;

static int panel_progress_cb(void *ctx, uint64_t up_now, uint64_t up_total, uint64_t down_now, uint64_t down_total)
{
    (void)up_total;
    (void)down_total;
    panel_progress *pp = ctx;
    atomic_store(&pp->up, (unsigned long long)up_now);
    atomic_store(&pp->down, (unsigned long long)down_now);
    return atomic_load(&pp->sh->stop);
}

/* A second handle on the same server (own connection); its progress goes to pp. */
static gemm_client *clone_client(const gemm_client *c, panel_progress *pp)
{
    gemm_client *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->o = c->o;
    d->o.progress = panel_progress_cb;
    d->o.progress_ctx = pp;
    d->base = strdup(c->base);
    d->auth_header = c->auth_header ? strdup(c->auth_header) : NULL;
    d->ca_file = c->ca_file ? strdup(c->ca_file) : NULL;
    d->curl = curl_easy_init();
    if (!d->base || !d->curl || (c->auth_header && !d->auth_header) || (c->ca_file && !d->ca_file)) {
        gemm_client_free(d);
        return NULL;
    }
    return d;
}

typedef struct {
    gemm_client *cl;
    panel_progress pp;
    gemm_request r;   /* this panel: m rows of A and C */
    const char *b_id;
    gemm_timing t;
    gemm_client_error err;
    int rc;
} panel;

static void *run_panel(void *arg)
{
    panel *p = arg;
    char pq[400];
    gemm_client_err_clear(&p->err);
    p->rc = gemm_request_query(&p->r, "/v1/matmul", pq, sizeof pq - 136, &p->err);
    if (p->rc != 0) return NULL;
    snprintf(pq + strlen(pq), sizeof pq - strlen(pq), "&b=%s", p->b_id);
    gemm_xfer x;
    gemm_xfer_init(&x, p->cl, GEMM_HTTP_POST, pq);
    gemm_matrix_bytes(p->r.m, p->r.k, p->r.dtype, &x.part_len[0]);
    x.part[0] = p->r.a;
    x.want_binary = 1;
    x.dst = p->r.c;
    gemm_matrix_bytes(p->r.m, p->r.n, gemm_request_c_dtype(&p->r), &x.dst_len);
    x.exp_m = p->r.m;
    x.exp_n = p->r.n;
    p->rc = gemm_xfer_run(&x, &p->t, &p->err);
    if (p->rc == 0 && (x.status < 200 || x.status >= 300)) p->rc = gemm_xfer_server_error(&x, &p->err);
    gemm_xfer_free(&x);
    atomic_fetch_add(&p->pp.sh->finished, 1);
    return NULL;
}

/* POST /v1/matrices with B; its id into id[cap]. */
static int upload_b(gemm_client *c, const gemm_request *r, char *id, size_t cap, gemm_client_error *err)
{
    char pq[160];
    snprintf(pq, sizeof pq, "/v1/matrices?rows=%llu&cols=%llu&dtype=%s", (unsigned long long)r->k,
             (unsigned long long)r->n, gemm_dtype_name(r->dtype));
    gemm_xfer x;
    gemm_xfer_init(&x, c, GEMM_HTTP_POST, pq);
    x.part[0] = r->b;
    gemm_matrix_bytes(r->k, r->n, r->dtype, &x.part_len[0]);
    int rc = gemm_xfer_run(&x, NULL, err);
    if (rc == 0 && (x.status < 200 || x.status >= 300)) rc = gemm_xfer_server_error(&x, err);
    if (rc == 0) {
        id[0] = '\0';
        cJSON *j = x.text ? cJSON_ParseWithLength(x.text, x.text_len) : NULL;
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "id");
        static const char id_chars[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ._-";
        if (cJSON_IsString(v) && strlen(v->valuestring) < cap && v->valuestring[0] &&
            strspn(v->valuestring, id_chars) == strlen(v->valuestring)) /* [instance_id-]hex: URL-safe */
            snprintf(id, cap, "%s", v->valuestring);
        cJSON_Delete(j);
        if (!id[0])
            rc = gemm_client_err(err, GEMM_CLIENT_E_PROTOCOL, "bad_response",
                                 "the server kept B but gave no usable matrix id");
    }
    gemm_xfer_free(&x);
    return rc;
}

static void delete_b(gemm_client *c, const char *id)
{
    char pq[160];
    snprintf(pq, sizeof pq, "/v1/matrices/%s", id);
    gemm_xfer x;
    gemm_client_error e;
    gemm_xfer_init(&x, c, GEMM_HTTP_DELETE, pq);
    gemm_xfer_run(&x, NULL, &e); /* best effort: a leftover is freed by the server's restart */
    gemm_xfer_free(&x);
}

int gemm_client_multiply_streams(gemm_client *c, const gemm_request *r, int streams, gemm_timing *t,
                                 gemm_client_error *err)
{
    gemm_client_error local;
    if (!err) err = &local;
    gemm_client_err_clear(err);
    if (!c || !r) return gemm_client_err(err, GEMM_CLIENT_E_ARGUMENT, "bad_argument", "no client or request");
    if (streams < 0) return gemm_client_err(err, GEMM_CLIENT_E_ARGUMENT, "bad_argument", "streams must be >= 0");
    int n = streams > 0 ? streams : gemm_client_auto_streams(r);
    if (n > MAX_STREAMS) n = MAX_STREAMS;
    if ((uint64_t)n > r->m) n = (int)r->m;
    size_t es = gemm_dtype_size(r->dtype), esc = gemm_dtype_size(gemm_request_c_dtype(r));
    if (n <= 1 || es == 0 || !r->a || !r->b || !r->c || r->k == 0 || r->n == 0)
        return gemm_client_multiply(c, r, t, err); /* one request (and its argument checks) */

    double t0 = gemm_now_ms();
    char id[128];
    if (upload_b(c, r, id, sizeof id, err) != 0) return -1;
    panel *p = calloc((size_t)n, sizeof *p);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    int *started = calloc((size_t)n, sizeof *started);
    shared_state sh;
    atomic_init(&sh.stop, 0);
    atomic_init(&sh.finished, 0);
    int rc = 0;
    if (!p || !th || !started) {
        rc = gemm_client_err(err, GEMM_CLIENT_E_NOMEM, "out_of_memory", "out of memory");
        goto out;
    }
    uint64_t row = 0;
    for (int i = 0; i < n; i++) {
        uint64_t rows = r->m / (uint64_t)n + ((uint64_t)i < r->m % (uint64_t)n ? 1 : 0);
        p[i].r = *r;
        p[i].r.m = rows;
        p[i].r.a = (const char *)r->a + row * r->k * es;
        p[i].r.c = (char *)r->c + row * r->n * esc;
        p[i].b_id = id;
        row += rows;
        p[i].pp.sh = &sh;
        p[i].cl = clone_client(c, &p[i].pp);
        if (!p[i].cl) {
            rc = gemm_client_err(err, GEMM_CLIENT_E_NOMEM, "out_of_memory", "out of memory for a connection");
            break;
        }
    }
    for (int i = 0; rc == 0 && i < n; i++) {
        if (pthread_create(&th[i], NULL, run_panel, &p[i]) != 0) {
            rc = gemm_client_err(err, GEMM_CLIENT_E_NOMEM, "thread", "cannot start a transfer thread");
            break;
        }
        started[i] = 1;
    }
    /* The caller's thread reports the panels' progress together, and passes a stop on. */
    int nstarted = 0;
    for (int i = 0; i < n; i++) nstarted += started[i];
    size_t up_total = 0, down_total = 0;
    gemm_matrix_bytes(r->m, r->k, r->dtype, &up_total);
    gemm_matrix_bytes(r->m, r->n, gemm_request_c_dtype(r), &down_total);
    while (atomic_load(&sh.finished) < nstarted) {
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
        if (!c->o.progress) continue;
        uint64_t up = 0, down = 0;
        for (int i = 0; i < n; i++) {
            up += atomic_load(&p[i].pp.up);
            down += atomic_load(&p[i].pp.down);
        }
        if (c->o.progress(c->o.progress_ctx, up, up_total, down, down_total)) atomic_store(&sh.stop, 1);
    }
    for (int i = 0; i < n; i++)
        if (started[i]) pthread_join(th[i], NULL);
    for (int i = 0; rc == 0 && i < n; i++)
        if (p[i].rc != 0) {
            *err = p[i].err;
            rc = -1;
        }
    if (rc == 0 && t) {
        *t = p[0].t;
        t->bytes_sent = t->bytes_received = 0;
        for (int i = 0; i < n; i++) {
            t->bytes_sent += p[i].t.bytes_sent;
            t->bytes_received += p[i].t.bytes_received;
            if (p[i].t.kernel_ms > t->kernel_ms) t->kernel_ms = p[i].t.kernel_ms;
            if (p[i].t.total_ms > t->total_ms) t->total_ms = p[i].t.total_ms;
        }
        t->client_total_ms = gemm_now_ms() - t0;
        t->client_transfer_ms = t->total_ms >= 0 ? t->client_total_ms - t->total_ms : -1;
    }
out:
    delete_b(c, id);
    if (p)
        for (int i = 0; i < n; i++) gemm_client_free(p[i].cl);
    free(p);
    free(th);
    free(started);
    if (rc == 0) err->http_status = 200;
    return rc;
}
