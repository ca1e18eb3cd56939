/*
 * usage.c - per-token use, the last minutes' rates and times, the last errors (usage.h).
 *
 * The window is a ring of GEMMD_USAGE_STEPS steps of GEMMD_USAGE_STEP_S seconds, each
 * stamped with its number (monotonic time / step): a step is cleared when it is first
 * written in a new round, and read only while its stamp is one of the last STEPS.
 */
#include "usage.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NSLOTS (GEMMD_USAGE_TOKENS + 2) /* anonymous, the tokens, other */
#define NCODES 24                        /* statuses kept apart per token; more share "other" */
#define NSAMPLES 1024                    /* the latest products' times */
#define MINUTE_STEPS (60 / GEMMD_USAGE_STEP_S)
#define SHARDS 16

typedef struct {
    uint64_t requests, errors, products, bytes_in, bytes_out;
    double compute_s;
} use;

typedef struct {
    int64_t stamp;  /* the step's number + 1 (0: never written) */
    uint64_t jobs;  /* engine jobs finished (a batch is one job of many products) */
    use slot[NSLOTS];
} step;

typedef struct {
    int status; /* -1: "other" */
    uint64_t n;
} code_count;

typedef struct {
    double t_ms, engine_ms, queue_ms;
} sample_times;

typedef struct {
    double when; /* Unix time */
    char route[48];
    char code[32];
    int status, slot;
} error_entry;

/* The counters live in shards, one per group of threads (a thread keeps the shard it first
 * wrote to): every request writes them, and one lock and one set of lines written by all
 * the HTTP threads cost more than the additions. Readers sum the shards. */
typedef struct {
    pthread_mutex_t mu;
    use total[NSLOTS];
    code_count codes[NSLOTS][NCODES];
    step steps[GEMMD_USAGE_STEPS];
    sample_times sample[NSAMPLES / SHARDS];
    uint64_t nsamples;
} shard;

static shard S[SHARDS];
static pthread_once_t S_once = PTHREAD_ONCE_INIT;
static _Atomic unsigned S_next;
static _Thread_local shard *S_mine;

static struct {
    pthread_mutex_t mu;
    error_entry err[GEMMD_USAGE_ERRORS];
    uint64_t nerrors;
} E = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void shards_init(void)
{
    for (int i = 0; i < SHARDS; i++) pthread_mutex_init(&S[i].mu, NULL);
}

/* This thread's shard, locked. */
static shard *lock_mine(void)
{
    if (!S_mine) { /* this thread's first count */
        pthread_once(&S_once, shards_init);
        S_mine = &S[atomic_fetch_add_explicit(&S_next, 1, memory_order_relaxed) % SHARDS];
    }
    pthread_mutex_lock(&S_mine->mu);
    return S_mine;
}

static int slot_of(int who) { return who < 0 ? 0 : who <= GEMMD_USAGE_TOKENS ? who : NSLOTS - 1; }

static const char *slot_name(const gemmd_auth *auth, int s)
{
    const char *name = s > 0 && s < NSLOTS - 1 ? gemmd_auth_name(auth, s - 1) : NULL;
    return name ? name : s == 0 ? "anonymous" : "other";
}

static int64_t step_no(double now_ms) { return (int64_t)(now_ms / (GEMMD_USAGE_STEP_S * 1000.0)); }

/* Under the shard's lock: its step now, cleared when it starts a new round. */
static step *step_now(shard *sh, double now_ms)
{
    int64_t no = step_no(now_ms);
    step *st = &sh->steps[no % GEMMD_USAGE_STEPS];
    if (st->stamp != no + 1) {
        memset(st, 0, sizeof *st);
        st->stamp = no + 1;
    }
    return st;
}

static void add(use *u, const use *d)
{
    u->requests += d->requests;
    u->errors += d->errors;
    u->products += d->products;
    u->bytes_in += d->bytes_in;
    u->bytes_out += d->bytes_out;
    u->compute_s += d->compute_s;
}

/* Adds one status to a token's list (the last entry counts the statuses past the list). */
static void count_code(code_count *c, int status, uint64_t n)
{
    int i = 0;
    while (status >= 0 && i < NCODES - 1 && c[i].n && c[i].status != status) i++;
    if (status < 0) i = NCODES - 1; /* a shard's "other" */
    c[i].status = i == NCODES - 1 && c[i].status != status ? -1 : status;
    c[i].n += n;
}

void gemmd_usage_request(int who, int status, uint64_t bytes_in, uint64_t bytes_out)
{
    int s = slot_of(who);
    use d = {.requests = 1, .errors = status >= 400, .bytes_in = bytes_in, .bytes_out = bytes_out};
    double now = gemm_now_ms();
    shard *sh = lock_mine();
    add(&step_now(sh, now)->slot[s], &d);
    add(&sh->total[s], &d);
    count_code(sh->codes[s], status, 1);
    pthread_mutex_unlock(&sh->mu);
}

void gemmd_usage_product(int who, const gemm_job *job)
{
    int s = slot_of(who), done = atomic_load(&job->state) == GEMM_JOB_DONE;
    const gemm_job_timing *t = &job->timing;
    use d = {.products = done ? (job->batch ? job->batch : 1) : 0, .compute_s = t->compute_ms / 1000.0};
    double now = gemm_now_ms();
    shard *sh = lock_mine();
    step *st = step_now(sh, now);
    add(&st->slot[s], &d);
    add(&sh->total[s], &d);
    if (done) {
        st->jobs++;
        sh->sample[sh->nsamples++ % (NSAMPLES / SHARDS)] = (sample_times){now, t->queue_ms + t->compute_ms, t->queue_ms};
    }
    pthread_mutex_unlock(&sh->mu);
}

void gemmd_usage_error(int who, const char *route, int status, const char *code)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    pthread_mutex_lock(&E.mu);
    error_entry *e = &E.err[E.nerrors++ % GEMMD_USAGE_ERRORS];
    e->when = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
    snprintf(e->route, sizeof e->route, "%s", route ? route : "other");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    e->status = status;
    e->slot = slot_of(who);
    pthread_mutex_unlock(&E.mu);
}

/* The shards' totals and status counts, summed. */
static void sum_totals(use total[NSLOTS], code_count codes[NSLOTS][NCODES])
{
    memset(total, 0, NSLOTS * sizeof *total);
    memset(codes, 0, NSLOTS * sizeof *codes);
    pthread_once(&S_once, shards_init);
    for (int i = 0; i < SHARDS; i++) {
        pthread_mutex_lock(&S[i].mu);
        for (int s = 0; s < NSLOTS; s++) {
            add(&total[s], &S[i].total[s]);
            for (int k = 0; k < NCODES && S[i].codes[s][k].n; k++)
                count_code(codes[s], S[i].codes[s][k].status, S[i].codes[s][k].n);
        }
        pthread_mutex_unlock(&S[i].mu);
    }
}

/* ---- /metrics ------------------------------------------------------------------- */

void gemmd_usage_render(gemm_buf *out, const gemmd_auth *auth)
{
    static const char *const help[4][2] = {
        {"gemmd_token_requests_total", "HTTP requests answered, by token name and status code."},
        {"gemmd_token_products_total", "Products computed for each token."},
        {"gemmd_token_compute_seconds_total", "Seconds engine workers spent on each token's products."},
        {"gemmd_token_bytes_total", "Body bytes received (in) and sent (out), by token."}};
    static use total[NSLOTS]; /* under mu */
    static code_count codes[NSLOTS][NCODES];
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&mu);
    sum_totals(total, codes);
    for (int m = 0; m < 4; m++) {
        const char *fam = help[m][0];
        gemm_buf_printf(out, "# HELP %s %s\n# TYPE %s counter\n", fam, help[m][1], fam);
        for (int s = 0; s < NSLOTS; s++) {
            const use *u = &total[s];
            if (!u->requests && !u->products) continue; /* never used */
            const char *name = slot_name(auth, s);      /* [A-Za-z0-9_.-]: nothing to escape */
            switch (m) {
            case 0:
                for (const code_count *c = codes[s]; c < codes[s] + NCODES && c->n; c++) {
                    gemm_buf_printf(out, "%s{token=\"%s\",code=\"", fam, name);
                    if (c->status < 0) gemm_buf_puts(out, "other");
                    else gemm_buf_printf(out, "%d", c->status);
                    gemm_buf_printf(out, "\"} %llu\n", (unsigned long long)c->n);
                }
                break;
            case 1: gemm_buf_printf(out, "%s{token=\"%s\"} %llu\n", fam, name, (unsigned long long)u->products); break;
            case 2: gemm_buf_printf(out, "%s{token=\"%s\"} %.6f\n", fam, name, u->compute_s); break;
            default:
                gemm_buf_printf(out, "%s{token=\"%s\",direction=\"in\"} %llu\n", fam, name,
                                (unsigned long long)u->bytes_in);
                gemm_buf_printf(out, "%s{token=\"%s\",direction=\"out\"} %llu\n", fam, name,
                                (unsigned long long)u->bytes_out);
            }
        }
    }
    pthread_mutex_unlock(&mu);
}

/* ---- /v1/status ------------------------------------------------------------------ */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile (nearest rank) of v[0..n), sorted here; 0 when n is 0. */
static double quantile(double *v, int n, double q)
{
    if (n == 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[(int)floor(q * (n - 1) + 0.5)];
}

static void use_json(gemm_buf *out, const char *key, const use *u)
{
    gemm_buf_printf(out, "\"%s\":{\"requests\":%llu,\"errors\":%llu,\"products\":%llu,\"compute_s\":%.6f,"
                    "\"bytes_in\":%llu,\"bytes_out\":%llu}", key, (unsigned long long)u->requests,
                    (unsigned long long)u->errors, (unsigned long long)u->products, u->compute_s,
                    (unsigned long long)u->bytes_in, (unsigned long long)u->bytes_out);
}

double gemmd_usage_json(gemm_buf *out, const gemmd_auth *auth, int queued, double uptime_s)
{
    static double engine[NSAMPLES], wait[NSAMPLES], wait_min[NSAMPLES]; /* under mu */
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    double now = gemm_now_ms(), window_s = GEMMD_USAGE_STEPS * GEMMD_USAGE_STEP_S;
    int64_t no = step_no(now);
    use total[NSLOTS] = {0}, win[NSLOTS] = {0}, sum[GEMMD_USAGE_STEPS] = {0}, minute = {0};
    uint64_t jobs_min = 0;

    pthread_once(&S_once, shards_init);
    pthread_mutex_lock(&mu);
    int n = 0, nmin = 0;
    for (int i = 0; i < SHARDS; i++) {
        shard *sh = &S[i];
        pthread_mutex_lock(&sh->mu);
        for (int s = 0; s < NSLOTS; s++) add(&total[s], &sh->total[s]);
        for (int age = 0; age < GEMMD_USAGE_STEPS && age <= no; age++) { /* sum[age]: age steps ago */
            const step *st = &sh->steps[(no - age) % GEMMD_USAGE_STEPS];
            if (st->stamp != no - age + 1) continue;
            for (int s = 0; s < NSLOTS; s++) {
                add(&win[s], &st->slot[s]);
                add(&sum[age], &st->slot[s]);
                if (age < MINUTE_STEPS) add(&minute, &st->slot[s]);
            }
            if (age < MINUTE_STEPS) jobs_min += st->jobs;
        }
        uint64_t kept = NSAMPLES / SHARDS;
        for (uint64_t j = sh->nsamples > kept ? sh->nsamples - kept : 0; j < sh->nsamples; j++) {
            const sample_times *x = &sh->sample[j % kept];
            if (now - x->t_ms > window_s * 1000.0) continue;
            engine[n] = x->engine_ms;
            wait[n++] = x->queue_ms;
            if (now - x->t_ms <= 60000.0) wait_min[nmin++] = x->queue_ms;
        }
        pthread_mutex_unlock(&sh->mu);
    }
    gemm_buf_puts(out, "\"tokens\":[");
    for (int s = 0, n = 0; s < NSLOTS; s++) {
        if (!total[s].requests && !total[s].products) continue;
        gemm_buf_printf(out, "%s{\"name\":\"%s\",", n++ ? "," : "", slot_name(auth, s)); /* no escaping needed */
        use_json(out, "window", &win[s]);
        gemm_buf_puts(out, ",");
        use_json(out, "total", &total[s]);
        gemm_buf_puts(out, "}");
    }
    gemm_buf_puts(out, "],\"errors\":[");
    pthread_mutex_lock(&E.mu);
    for (uint64_t i = 0; i < E.nerrors && i < GEMMD_USAGE_ERRORS; i++) { /* newest first */
        const error_entry *e = &E.err[(E.nerrors - 1 - i) % GEMMD_USAGE_ERRORS];
        /* the route table's labels and error codes are identifiers: nothing to escape */
        gemm_buf_printf(out, "%s{\"time\":%.3f,\"route\":\"%s\",\"status\":%d,\"code\":\"%s\",\"token\":\"%s\"}",
                        i ? "," : "", e->when, e->route, e->status, e->code, slot_name(auth, e->slot));
    }
    pthread_mutex_unlock(&E.mu);
    double mean = 0;
    for (int i = 0; i < n; i++) mean += engine[i] / n;
    double p50 = quantile(engine, n, 0.5), p95 = quantile(engine, n, 0.95);
    double q50 = quantile(wait, n, 0.5), q95 = quantile(wait, n, 0.95), q50_min = quantile(wait_min, nmin, 0.5);
    pthread_mutex_unlock(&mu);

    /* the last minute: the step now (begun (now % step) ago) and the 5 before it */
    double span_s = fmod(now / 1000.0, GEMMD_USAGE_STEP_S) + (MINUTE_STEPS - 1) * GEMMD_USAGE_STEP_S;
    if (uptime_s > 0 && uptime_s < span_s) span_s = uptime_s;
    if (span_s < 1) span_s = 1;
    gemm_buf_printf(out, "],\"rates\":{\"step_s\":%d,\"products_per_s\":%.4f,\"requests_per_s\":%.4f,"
                    "\"errors_per_s\":%.4f", GEMMD_USAGE_STEP_S, (double)minute.products / span_s,
                    (double)minute.requests / span_s, (double)minute.errors / span_s);
    static const char *const series[3] = {"products", "requests", "errors"};
    for (int k = 0; k < 3; k++) { /* per step, oldest first */
        gemm_buf_printf(out, ",\"%s\":[", series[k]);
        for (int age = GEMMD_USAGE_STEPS - 1; age >= 0; age--) {
            const use *u = &sum[age];
            uint64_t v = k == 0 ? u->products : k == 1 ? u->requests : u->errors;
            gemm_buf_printf(out, "%llu%s", (unsigned long long)v, age ? "," : "]");
        }
    }
    gemm_buf_printf(out, "},\"latency\":{\"window_s\":%.0f,\"jobs\":%d,\"mean_ms\":%.4f,\"p50_ms\":%.4f,"
                    "\"p95_ms\":%.4f,\"queue_p50_ms\":%.4f,\"queue_p95_ms\":%.4f}", window_s, n, mean, p50, p95,
                    q50, q95);
    double jobs_per_s = (double)jobs_min / span_s;
    if (queued > 0 && jobs_per_s > 0) return queued / jobs_per_s;
    if (nmin) return q50_min / 1000.0;
    return queued > 0 ? -1 : 0; /* queued, and nothing finished lately: unknown */
}
