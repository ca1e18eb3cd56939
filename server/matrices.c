/* matrices.c - the resident matrix store (matrices.h). */
#include "matrices.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "budget.h"
#include "instance.h"
#include "log.h"
#include "metrics.h"

struct gemmd_matrices {
    gemm_engine *engine;
    gemmd_budget *mem;        /* where their bytes are charged (kind resident), or NULL */
    pthread_mutex_t mu;
    gemmd_matrix_entry *head;
    int count;                /* linked entries */
    int max_count;
    uint64_t budget;
    uint64_t held;            /* bytes of live entries (linked or still referenced) + reserved */
    double fill_ttl_ms;       /* an empty=1 matrix not filled by then is forgotten */
    /* each client's share of the store (token_share), and what it holds */
    uint64_t share_bytes;
    int share_count;
    uint64_t client_bytes[GEMMD_CLIENTS];
    int client_count[GEMMD_CLIENTS];
};

static void publish_locked(gemmd_matrices *s) { gemmd_metrics_resident(s->count, s->held, s->budget); }

gemmd_matrices *gemmd_matrices_new(gemm_engine *engine, gemmd_budget *mem, uint64_t budget_bytes, int max_count,
                                   int share_pct, int fill_ttl_s)
{
    gemmd_matrices *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->engine = engine;
    s->mem = mem;
    s->budget = budget_bytes;
    s->max_count = max_count;
    s->share_bytes = budget_bytes / 100 * (uint64_t)share_pct + budget_bytes % 100 * (uint64_t)share_pct / 100;
    s->share_count = (int)((int64_t)s->max_count * share_pct / 100);
    s->fill_ttl_ms = fill_ttl_s > 0 ? fill_ttl_s * 1000.0 : 1e18;
    pthread_mutex_init(&s->mu, NULL);
    publish_locked(s);
    return s;
}

static void destroy(gemmd_matrices *s, gemmd_matrix_entry *e)
{
    gemm_engine_resident_free(s->engine, e->res); /* device copies go later, off this thread */
    gemmd_budget_forget(s->mem, e->m.data);        /* its charge as a resident matrix */
    gemm_engine_host_free(s->engine, e->m.data);
    free(e->row_state);
    free(e);
}

static void destroy_all(gemmd_matrices *s, gemmd_matrix_entry *e)
{
    while (e) {
        gemmd_matrix_entry *next = e->next;
        destroy(s, e);
        e = next;
    }
}

void gemmd_matrices_free(gemmd_matrices *s)
{
    if (!s) return;
    destroy_all(s, s->head);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static int unref_locked(gemmd_matrices *s, gemmd_matrix_entry *e);

/* Unlinks the matrices made with empty=1 whose rows did not all come within fill_ttl;
 * those nobody reads any more are chained on *gone, to be destroyed after unlocking. */
static void expire_locked(gemmd_matrices *s, gemmd_matrix_entry **gone)
{
    double now = gemm_now_ms();
    for (gemmd_matrix_entry **p = &s->head; *p;) {
        gemmd_matrix_entry *e = *p;
        if (!e->row_state || now - e->t_created_ms < s->fill_ttl_ms) {
            p = &e->next;
            continue;
        }
        LOG_INFO("matrix %.*s forgotten: %llu of its %llu rows came within job_ttl", GEMMD_JOB_LOG_ID(e->id),
                 (unsigned long long)e->rows_filled, (unsigned long long)e->m.rows);
        *p = e->next;
        e->next = NULL;
        s->count--;
        if (unref_locked(s, e)) {
            e->next = *gone;
            *gone = e;
        }
    }
}

int gemmd_matrices_reserve(gemmd_matrices *s, int client, size_t bytes, gemm_err *err)
{
    if (bytes > s->budget)
        return gemm_err_set(err, 413, "too_large",
                            "the matrix has %zu bytes; resident matrices may hold at most %llu in all "
                            "(resident_mb)", bytes, (unsigned long long)s->budget);
    int c = (int)((unsigned)client % GEMMD_CLIENTS), rc = 0;
    gemmd_matrix_entry *gone = NULL;
    pthread_mutex_lock(&s->mu);
    expire_locked(s, &gone);
    if (s->count >= s->max_count)
        rc = gemm_err_set(err, 507, "insufficient_storage",
                          "%d resident matrices are kept, the most this server keeps (max_matrices); "
                          "DELETE some first", s->count);
    else if (bytes > s->budget - s->held)
        rc = gemm_err_set(err, 507, "insufficient_storage",
                          "no room for %zu more bytes of resident matrices: %llu of %llu are held "
                          "(resident_mb); DELETE matrices you no longer need", bytes,
                          (unsigned long long)s->held, (unsigned long long)s->budget);
    else if (s->client_count[c] &&
             (s->client_count[c] >= s->share_count || s->client_bytes[c] + bytes > s->share_bytes))
        rc = gemm_err_set(err, 507, "insufficient_storage",
                          "this client (token, or address without tokens) keeps %d resident matrices of %llu "
                          "bytes, and %zu more would pass its share (token_share: %d matrices, %llu bytes); "
                          "DELETE matrices it no longer needs", s->client_count[c],
                          (unsigned long long)s->client_bytes[c], bytes, s->share_count,
                          (unsigned long long)s->share_bytes);
    if (rc == 0) {
        s->held += bytes;
        s->client_bytes[c] += bytes;
        s->client_count[c]++;
        publish_locked(s);
    }
    pthread_mutex_unlock(&s->mu);
    destroy_all(s, gone); /* expired, nobody reads them any more */
    return rc;
}

void gemmd_matrices_unreserve(gemmd_matrices *s, int client, size_t bytes)
{
    int c = (int)((unsigned)client % GEMMD_CLIENTS);
    pthread_mutex_lock(&s->mu);
    s->held -= bytes <= s->held ? bytes : s->held;
    s->client_bytes[c] -= bytes <= s->client_bytes[c] ? bytes : s->client_bytes[c];
    s->client_count[c] -= s->client_count[c] > 0;
    publish_locked(s);
    pthread_mutex_unlock(&s->mu);
}

gemmd_matrix_entry *gemmd_matrices_add(gemmd_matrices *s, gemm_matrix *m, gemm_resident **res, int owner, int client,
                                       int family, int empty, gemm_err *err)
{
    gemmd_matrix_entry *e = calloc(1, sizeof *e);
    if (!e || (empty && !(e->row_state = calloc(m->rows ? (size_t)m->rows : 1, 1)))) {
        gemm_err_set(err, 503, "out_of_memory", "cannot allocate a matrix entry now");
    } else if (gemmd_instance_new_id(e->id, sizeof e->id) != 0) {
        gemm_err_set(err, 500, "internal_error", "cannot draw a random matrix id: %s", strerror(errno));
    } else {
        gemm_matrix_bytes(m->rows, m->cols, m->dtype, &e->bytes);
        e->res = res && *res ? *res : gemm_engine_resident_new(s->engine, m->data, e->bytes);
        if (!e->res) gemm_err_set(err, 503, "out_of_memory", "cannot allocate a matrix handle now");
    }
    if (!e || !e->res) {
        if (e) free(e->row_state);
        free(e);
        return NULL;
    }
    if (res) *res = NULL;
    e->m = *m;
    e->owner = owner;
    e->client = (int)((unsigned)client % GEMMD_CLIENTS);
    e->family = family;
    e->store = s;
    e->refs = 2; /* the store's list and the caller's */
    e->t_created_ms = e->t_used_ms = gemm_now_ms();
    pthread_mutex_lock(&s->mu);
    e->next = s->head;
    s->head = e;
    s->count++;
    publish_locked(s);
    pthread_mutex_unlock(&s->mu);
    m->data = NULL;
    return e;
}

static gemmd_matrix_entry *find_locked(gemmd_matrices *s, const char *id, int owner, gemmd_matrix_entry ***link)
{
    if (!id || !gemmd_instance_id_valid(id, strlen(id))) return NULL;
    for (gemmd_matrix_entry **p = &s->head; *p; p = &(*p)->next) {
        gemmd_matrix_entry *e = *p;
        if (!gemmd_instance_id_same(e->id, id)) continue;
        if (owner != GEMMD_OWNER_ANY && e->owner != owner) return NULL;
        if (link) *link = p;
        return e;
    }
    return NULL;
}

gemmd_matrix_entry *gemmd_matrices_get(gemmd_matrices *s, const char *id, int owner)
{
    gemmd_matrix_entry *gone = NULL;
    pthread_mutex_lock(&s->mu);
    expire_locked(s, &gone);
    gemmd_matrix_entry *e = find_locked(s, id, owner, NULL);
    if (e) {
        e->refs++;
        e->t_used_ms = gemm_now_ms();
    }
    pthread_mutex_unlock(&s->mu);
    destroy_all(s, gone);
    return e;
}

/* Drops a reference (lock held); 1 when the caller must destroy e after unlocking. */
static int unref_locked(gemmd_matrices *s, gemmd_matrix_entry *e)
{
    if (--e->refs > 0) return 0;
    s->held -= e->bytes <= s->held ? e->bytes : s->held;
    s->client_bytes[e->client] -= e->bytes <= s->client_bytes[e->client] ? e->bytes : s->client_bytes[e->client];
    s->client_count[e->client] -= s->client_count[e->client] > 0;
    publish_locked(s);
    return 1;
}

void gemmd_matrices_put(gemmd_matrices *s, gemmd_matrix_entry *e)
{
    if (!e) return;
    pthread_mutex_lock(&s->mu);
    int last = unref_locked(s, e);
    pthread_mutex_unlock(&s->mu);
    if (last) destroy(s, e);
}

void gemmd_matrix_release(void *entry)
{
    gemmd_matrix_entry *e = entry;
    gemmd_matrices_put(e->store, e);
}

void gemmd_matrices_note_use(gemmd_matrices *s, gemmd_matrix_entry *e)
{
    pthread_mutex_lock(&s->mu);
    e->uses++;
    e->t_used_ms = gemm_now_ms();
    pthread_mutex_unlock(&s->mu);
}

int gemmd_matrices_delete(gemmd_matrices *s, const char *id, int owner)
{
    pthread_mutex_lock(&s->mu);
    gemmd_matrix_entry **link = NULL;
    gemmd_matrix_entry *e = find_locked(s, id, owner, &link);
    if (!e) {
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    *link = e->next;
    e->next = NULL;
    s->count--;
    publish_locked(s);
    int last = unref_locked(s, e);
    pthread_mutex_unlock(&s->mu);
    LOG_DEBUG("matrix %.*s deleted%s", GEMMD_JOB_LOG_ID(id), last ? "" : " (freed once its readers finish)");
    if (last) destroy(s, e);
    return 0;
}

int gemmd_matrices_claim_rows(gemmd_matrices *s, gemmd_matrix_entry *e, uint64_t row0, uint64_t rows, gemm_err *err)
{
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    if (!e->row_state) {
        rc = gemm_err_set(err, 409, "matrix_complete",
                          "matrix %s has all its rows: a resident matrix is read-only once complete; upload "
                          "another one (POST /v1/matrices)", e->id);
    } else if (rows == 0 || row0 >= e->m.rows || rows > e->m.rows - row0) {
        rc = gemm_err_set(err, 422, "bad_rows", "rows %llu..%llu are outside matrix %s's %llu rows",
                          (unsigned long long)row0, (unsigned long long)(row0 + rows),
                          e->id, (unsigned long long)e->m.rows);
    } else {
        for (uint64_t r = row0; r < row0 + rows; r++)
            if (e->row_state[r]) {
                rc = gemm_err_set(err, 409, "rows_taken",
                                  "row %llu of matrix %s is %s; each row is written once, by one PUT",
                                  (unsigned long long)r, e->id,
                                  e->row_state[r] == 2 ? "written already" : "being written by another request");
                break;
            }
        if (rc == 0) memset(e->row_state + row0, 1, (size_t)rows);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

uint64_t gemmd_matrices_release_rows(gemmd_matrices *s, gemmd_matrix_entry *e, uint64_t row0, uint64_t rows,
                                     int written)
{
    unsigned char *done = NULL;
    pthread_mutex_lock(&s->mu);
    uint64_t filled = e->rows_filled;
    if (e->row_state && row0 < e->m.rows && rows <= e->m.rows - row0) {
        memset(e->row_state + row0, written ? 2 : 0, (size_t)rows);
        if (written) filled = e->rows_filled += rows;
        if (filled == e->m.rows) { /* complete: read-only from now on */
            done = e->row_state;
            e->row_state = NULL;
        }
    }
    pthread_mutex_unlock(&s->mu);
    free(done);
    return filled;
}

int gemmd_matrices_ready(gemmd_matrices *s, const gemmd_matrix_entry *e)
{
    pthread_mutex_lock(&s->mu);
    int ready = e->row_state == NULL;
    pthread_mutex_unlock(&s->mu);
    return ready;
}

static void describe_locked(const gemmd_matrix_entry *e, double now, gemm_buf *out)
{
    gemm_buf_printf(out, "{\"id\":\"%s\",\"shape\":[%llu,%llu],\"dtype\":\"%s\"", e->id, /* names need no escaping */
                    (unsigned long long)e->m.rows, (unsigned long long)e->m.cols, gemm_dtype_name(e->m.dtype));
    gemm_buf_printf(out, ",\"bytes\":%zu,\"where\":\"host\",\"uses\":%llu,\"age_s\":%.3f,\"idle_s\":%.3f,"
                         "\"location\":\"/v1/matrices/%s\",\"state\":\"%s\",\"rows_filled\":%llu}",
                    e->bytes, (unsigned long long)e->uses, (now - e->t_created_ms) / 1000.0,
                    (now - e->t_used_ms) / 1000.0, e->id, e->row_state ? "filling" : "ready",
                    (unsigned long long)(e->row_state ? e->rows_filled : e->m.rows));
}

void gemmd_matrices_describe_json(gemmd_matrices *s, const gemmd_matrix_entry *e, gemm_buf *out)
{
    pthread_mutex_lock(&s->mu);
    describe_locked(e, gemm_now_ms(), out);
    pthread_mutex_unlock(&s->mu);
}

static int by_last_use(const void *x, const void *y)
{
    const gemmd_matrix_entry *a = *(const gemmd_matrix_entry *const *)x;
    const gemmd_matrix_entry *b = *(const gemmd_matrix_entry *const *)y;
    return a->t_used_ms > b->t_used_ms ? -1 : a->t_used_ms < b->t_used_ms ? 1 : 0;
}

void gemmd_matrices_list_json(gemmd_matrices *s, int owner, gemm_buf *out)
{
    pthread_mutex_lock(&s->mu);
    int n = 0;
    uint64_t bytes = 0;
    gemmd_matrix_entry **v = calloc((size_t)s->count + 1, sizeof *v);
    for (gemmd_matrix_entry *e = s->head; e && v; e = e->next)
        if (owner == GEMMD_OWNER_ANY || e->owner == owner) {
            v[n++] = e;
            bytes += e->bytes;
        }
    if (v) qsort(v, (size_t)n, sizeof *v, by_last_use);
    double now = gemm_now_ms();
    gemm_buf_puts(out, "{\"matrices\":[");
    for (int i = 0; i < n; i++) {
        if (i) gemm_buf_puts(out, ",");
        describe_locked(v[i], now, out);
    }
    gemm_buf_printf(out, "],\"count\":%d,\"bytes\":%llu,\"budget_bytes\":%llu,\"held_bytes\":%llu}\n", n,
                    (unsigned long long)bytes, (unsigned long long)s->budget, (unsigned long long)s->held);
    pthread_mutex_unlock(&s->mu);
    if (!v) out->failed = 1;
    free(v);
}
