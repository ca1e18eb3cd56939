/* test_metrics.c - the /metrics exposition parses as Prometheus text 0.0.4: every sample
 * line well-formed with a declared TYPE, label values escaped, histogram buckets
 * cumulative with +Inf == _count, counters moving with the requests recorded, the
 * per-token families included. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "metrics.h"
#include "routes.h"

#define MAXS 2048

typedef struct {
    char name[96];
    char labels[256]; /* canonical: k="v",k="v" with the values unescaped */
    double value;
} sample;

typedef struct {
    sample s[MAXS];
    int n;
    char types[64][96]; /* declared metric families */
    char type_of[64][16];
    int ntypes;
} expo;

static int name_char(int c, int first)
{
    return isalpha(c) || c == '_' || c == ':' || (!first && isdigit(c));
}

static const char *declared_type(const expo *e, const char *name)
{
    for (int i = 0; i < e->ntypes; i++) {
        size_t n = strlen(e->types[i]);
        if (strncmp(name, e->types[i], n) != 0) continue;
        const char *rest = name + n;
        if (*rest == '\0') return e->type_of[i];
        if (strcmp(e->type_of[i], "histogram") == 0 &&
            (!strcmp(rest, "_bucket") || !strcmp(rest, "_sum") || !strcmp(rest, "_count")))
            return e->type_of[i];
    }
    return NULL;
}

/* Parses the whole exposition; fails the test on the first malformed line. */
static void parse(const char *text, expo *e)
{
    memset(e, 0, sizeof *e);
    const char *p = text;
    int lineno = 0;
    while (*p) {
        const char *eol = strchr(p, '\n');
        if (!eol) fail_msg("last line has no newline");
        char line[1024];
        size_t len = (size_t)(eol - p);
        assert_true(len < sizeof line);
        memcpy(line, p, len);
        line[len] = '\0';
        p = eol + 1;
        lineno++;
        if (len == 0) fail_msg("line %d is empty", lineno);
        if (line[0] == '#') {
            char fam[96], rest[256];
            if (sscanf(line, "# HELP %95s %255[^\n]", fam, rest) == 2) continue;
            if (sscanf(line, "# TYPE %95s %15s", fam, rest) == 2) {
                if (strcmp(rest, "counter") && strcmp(rest, "gauge") && strcmp(rest, "histogram"))
                    fail_msg("line %d: unknown type %s", lineno, rest);
                assert_true(e->ntypes < 64);
                for (int i = 0; i < e->ntypes; i++)
                    if (!strcmp(e->types[i], fam)) fail_msg("line %d: TYPE %s twice", lineno, fam);
                snprintf(e->types[e->ntypes], sizeof e->types[0], "%s", fam);
                snprintf(e->type_of[e->ntypes], sizeof e->type_of[0], "%.15s", rest);
                e->ntypes++;
                continue;
            }
            fail_msg("line %d: comment is neither HELP nor TYPE: %s", lineno, line);
        }
        assert_true(e->n < MAXS);
        sample *s = &e->s[e->n++];
        const char *q = line;
        size_t ni = 0;
        if (!name_char((unsigned char)*q, 1)) fail_msg("line %d: bad metric name: %s", lineno, line);
        while (name_char((unsigned char)*q, 0)) {
            assert_true(ni + 1 < sizeof s->name);
            s->name[ni++] = *q++;
        }
        s->name[ni] = '\0';
        size_t li = 0;
        if (*q == '{') {
            q++;
            while (*q != '}') {
                if (li) s->labels[li++] = ',';
                if (!name_char((unsigned char)*q, 1)) fail_msg("line %d: bad label name: %s", lineno, line);
                while (name_char((unsigned char)*q, 0)) s->labels[li++] = *q++;
                if (q[0] != '=' || q[1] != '"') fail_msg("line %d: label without =\": %s", lineno, line);
                s->labels[li++] = '=';
                s->labels[li++] = '"';
                q += 2;
                while (*q != '"') {
                    if (*q == '\0') fail_msg("line %d: unterminated label value", lineno);
                    if (*q == '\\') {
                        q++;
                        if (*q == 'n') s->labels[li++] = '\n';
                        else if (*q == '\\' || *q == '"') s->labels[li++] = *q;
                        else fail_msg("line %d: bad escape \\%c", lineno, *q);
                        q++;
                    } else {
                        s->labels[li++] = *q++;
                    }
                    assert_true(li < sizeof s->labels - 4);
                }
                s->labels[li++] = '"';
                q++;
                if (*q == ',') q++;
                else if (*q != '}') fail_msg("line %d: expected , or } after a label: %s", lineno, line);
            }
            q++;
        }
        s->labels[li] = '\0';
        if (*q != ' ') fail_msg("line %d: no space before the value: %s", lineno, line);
        q++;
        char *end;
        if (!strcmp(q, "+Inf")) s->value = INFINITY;
        else {
            s->value = strtod(q, &end);
            if (end == q || *end != '\0') fail_msg("line %d: bad value '%s'", lineno, q);
        }
        if (!declared_type(e, s->name)) fail_msg("line %d: %s has no TYPE line before it", lineno, s->name);
    }
}

static const sample *find(const expo *e, const char *name, const char *labels)
{
    for (int i = 0; i < e->n; i++)
        if (!strcmp(e->s[i].name, name) && !strcmp(e->s[i].labels, labels)) return &e->s[i];
    return NULL;
}

static double value_of(const expo *e, const char *name, const char *labels)
{
    const sample *s = find(e, name, labels);
    if (!s) fail_msg("no sample %s{%s}", name, labels);
    return s->value;
}

/* Every histogram: per route, buckets ascending in le, counts non-decreasing, the last
 * bucket is +Inf and equals _count. Returns the number of routes checked. */
static int check_histograms(const expo *e)
{
    int checked = 0;
    for (int i = 0; i < e->n; i++) {
        const sample *c = &e->s[i];
        size_t nl = strlen(c->name);
        if (nl < 6 || strcmp(c->name + nl - 6, "_count") != 0) continue;
        char base[96];
        snprintf(base, sizeof base, "%.*s_bucket", (int)(nl - 6), c->name);
        double prev_le = -1, prev_count = 0;
        int nb = 0, saw_inf = 0;
        for (int j = 0; j < e->n; j++) {
            const sample *b = &e->s[j];
            if (strcmp(b->name, base) != 0) continue;
            /* same labels as _count plus le */
            if (strncmp(b->labels, c->labels, strlen(c->labels)) != 0) continue;
            const char *le = strstr(b->labels, "le=\"");
            assert_non_null(le);
            double lev = !strncmp(le + 4, "+Inf", 4) ? INFINITY : strtod(le + 4, NULL);
            if (!(lev > prev_le)) fail_msg("%s{%s}: le not increasing", base, b->labels);
            if (b->value < prev_count) fail_msg("%s{%s}: bucket counts decrease", base, b->labels);
            prev_le = lev;
            prev_count = b->value;
            nb++;
            saw_inf = isinf(lev);
        }
        if (!saw_inf) fail_msg("%s{%s}: last bucket is not +Inf", base, c->labels);
        if (prev_count != c->value) fail_msg("%s: +Inf bucket %g != count %g", base, prev_count, c->value);
        assert_true(nb >= 2);
        checked++;
    }
    return checked;
}

static char *render(gemm_engine *engine)
{
    gemm_buf b;
    gemm_buf_init(&b);
    gemmd_metrics_render(&b, engine);
    assert_false(b.failed);
    gemm_buf_append(&b, "", 1);
    char *s = strdup(b.data);
    gemm_buf_free(&b);
    return s;
}

/* The labels the daemon counts under: the route table's (main.c does the same). */
static void init_metrics(void)
{
    const char *labels[GEMMD_METRIC_ROUTES];
    gemmd_metrics_init(labels, gemmd_routes_labels(labels, GEMMD_METRIC_ROUTES));
}

/* The label slot of the route answering method and path (-1: none: "other"). */
static int slot(const char *method, const char *path)
{
    char params[2][64], allow[40];
    int status;
    return gemmd_route_slot(gemmd_routes_match(method, path, params, 2, &status, allow, sizeof allow));
}

static void test_empty_exposition_parses(void **state)
{
    (void)state;
    static expo e;
    init_metrics();
    char *text = render(NULL);
    parse(text, &e);
    assert_int_equal(check_histograms(&e), 0);
    assert_true(value_of(&e, "gemmd_bytes_received_total", "") == 0);
    assert_true(value_of(&e, "gemmd_queue_depth", "") == 0);
    assert_true(value_of(&e, "gemmd_jobs", "state=\"queued\"") == 0);
    assert_non_null(strstr(text, "gemmd_build_info{version=\""));
    assert_non_null(strstr(text, "# HELP gemmd_requests_total "));
    assert_non_null(strstr(text, "# TYPE gemmd_request_duration_seconds histogram"));
    free(text);
}

static void test_requests_and_histogram(void **state)
{
    (void)state;
    static expo e;
    init_metrics();
    gemmd_metrics_request(slot("POST", "/v1/matmul"), 0, 200, 0.0005, 100, 40);  /* <= 0.001 */
    gemmd_metrics_request(slot("POST", "/v1/matmul"), 0, 200, 0.001, 100, 40);   /* == bound: le 0.001 */
    gemmd_metrics_request(slot("POST", "/v1/matmul"), 0, 422, 0.2, 10, 80);      /* le 0.25 */
    gemmd_metrics_request(slot("POST", "/v1/matmul"), 0, 200, 61.0, 1, 1);       /* +Inf only */
    gemmd_metrics_request(slot("GET", "/healthz"), 0, 200, 0.00001, 0, 3);
    gemmd_metrics_request(slot("GET", "/nowhere"), 0, 404, -1.0, 0, 50);       /* clamped to 0 */
    gemmd_metrics_request(99, 0, 9999, NAN, 0, 0);          /* bad input lands in other/0 */
    int states[5] = {1, 2, 3, 4, 5};
    gemmd_metrics_jobs_by_state(states);

    char *text = render(NULL);
    parse(text, &e);
    assert_int_equal(check_histograms(&e), 3);
    assert_true(value_of(&e, "gemmd_requests_total", "route=\"/v1/matmul\",code=\"200\"") == 3);
    assert_true(value_of(&e, "gemmd_requests_total", "route=\"/v1/matmul\",code=\"422\"") == 1);
    assert_true(value_of(&e, "gemmd_requests_total", "route=\"/healthz\",code=\"200\"") == 1);
    assert_true(value_of(&e, "gemmd_requests_total", "route=\"other\",code=\"404\"") == 1);
    assert_true(value_of(&e, "gemmd_requests_total", "route=\"other\",code=\"0\"") == 1);
    assert_null(find(&e, "gemmd_requests_total", "route=\"/v1/info\",code=\"200\""));

    const char *m = "route=\"/v1/matmul\"";
    assert_true(value_of(&e, "gemmd_request_duration_seconds_bucket", "route=\"/v1/matmul\",le=\"0.001\"") == 2);
    assert_true(value_of(&e, "gemmd_request_duration_seconds_bucket", "route=\"/v1/matmul\",le=\"0.1\"") == 2);
    assert_true(value_of(&e, "gemmd_request_duration_seconds_bucket", "route=\"/v1/matmul\",le=\"0.25\"") == 3);
    assert_true(value_of(&e, "gemmd_request_duration_seconds_bucket", "route=\"/v1/matmul\",le=\"60\"") == 3);
    assert_true(value_of(&e, "gemmd_request_duration_seconds_bucket", "route=\"/v1/matmul\",le=\"+Inf\"") == 4);
    assert_true(value_of(&e, "gemmd_request_duration_seconds_count", m) == 4);
    double sum = value_of(&e, "gemmd_request_duration_seconds_sum", m);
    assert_true(fabs(sum - 61.2015) < 1e-6);

    assert_true(value_of(&e, "gemmd_bytes_received_total", "") == 211);
    assert_true(value_of(&e, "gemmd_bytes_sent_total", "") == 214);
    assert_true(value_of(&e, "gemmd_jobs", "state=\"cancelled\"") == 5);
    assert_true(value_of(&e, "gemmd_jobs", "state=\"running\"") == 2);
    free(text);
}

/* The per-token families (usage.h) that /metrics appends parse too, and a request counted
 * here is counted for its token. */
static void test_token_families(void **state)
{
    (void)state;
    static expo e;
    init_metrics();
    gemmd_metrics_request(slot("POST", "/v1/matmul"), 0, 201, 0.01, 5, 6);
    gemmd_metrics_request(slot("POST", "/v1/matmul"), 0, 201, 0.01, 5, 6);
    gemm_buf b;
    gemm_buf_init(&b);
    gemmd_metrics_render(&b, NULL);
    gemmd_usage_render(&b, NULL);
    gemm_buf_append(&b, "", 1);
    assert_false(b.failed);
    parse(b.data, &e);
    assert_true(value_of(&e, "gemmd_token_requests_total", "token=\"anonymous\",code=\"201\"") == 2);
    assert_true(value_of(&e, "gemmd_token_products_total", "token=\"anonymous\"") == 0);
    assert_true(value_of(&e, "gemmd_token_bytes_total", "token=\"anonymous\",direction=\"in\"") >= 10);
    gemm_buf_free(&b);
}

static void test_label_escaping(void **state)
{
    (void)state;
    gemm_buf b;
    gemm_buf_init(&b);
    gemmd_metrics_label_value(&b, "a\"b\\c\nd");
    gemm_buf_append(&b, "", 1);
    assert_string_equal(b.data, "a\\\"b\\\\c\\nd");
    gemm_buf_free(&b);

    /* and the escaped form round-trips through the parser */
    static expo e;
    gemm_buf_init(&b);
    gemm_buf_puts(&b, "# TYPE x gauge\nx{name=\"");
    gemmd_metrics_label_value(&b, "GPU \"0\" \\ nvidia\nH100");
    gemm_buf_puts(&b, "\"} 1\n");
    gemm_buf_append(&b, "", 1);
    parse(b.data, &e);
    assert_int_equal(e.n, 1);
    assert_string_equal(e.s[0].labels, "name=\"GPU \"0\" \\ nvidia\nH100\"");
    gemm_buf_free(&b);
}

static void *hammer(void *arg)
{
    (void)arg;
    for (int i = 0; i < 20000; i++)
        gemmd_metrics_request(slot("GET", "/v1/info"), 0, 200, (i % 100) * 0.0007, 1, 2);
    return NULL;
}

/* Rendering while other threads count still gives cumulative buckets with +Inf == count,
 * and afterwards no increment was lost. */
static void test_concurrent_counting(void **state)
{
    (void)state;
    static expo e;
    init_metrics();
    pthread_t t[4];
    for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&t[i], NULL, hammer, NULL), 0);
    for (int r = 0; r < 5; r++) {
        char *text = render(NULL);
        parse(text, &e);
        check_histograms(&e);
        free(text);
    }
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    char *text = render(NULL);
    parse(text, &e);
    assert_int_equal(check_histograms(&e), 1);
    assert_true(value_of(&e, "gemmd_requests_total", "route=\"/v1/info\",code=\"200\"") == 80000);
    assert_true(value_of(&e, "gemmd_request_duration_seconds_count", "route=\"/v1/info\"") == 80000);
    assert_true(value_of(&e, "gemmd_bytes_sent_total", "") == 160000);
    free(text);
}

static void done_cb(gemm_job *job)
{
    (void)job;
}

/* With a real CPU engine: the engine families appear and move after a product. */
static void test_engine_stats(void **state)
{
    (void)state;
    static expo e;
    gemm_engine_config cfg;
    gemm_engine_config_defaults(&cfg);
    snprintf(cfg.backend, sizeof cfg.backend, "cpu");
    cfg.threads = 1;
    gemm_engine_err err;
    gemm_engine *eng = gemm_engine_open(&cfg, &err);
    if (!eng) fail_msg("engine open: %s", err.message);

    gemm_job job;
    memset(&job, 0, sizeof job);
    job.dtype = GEMM_DTYPE_F64;
    job.m = job.k = job.n = 8;
    job.a = gemm_engine_host_alloc(eng, 64 * 8);
    job.b = gemm_engine_host_alloc(eng, 64 * 8);
    job.c = gemm_engine_host_alloc(eng, 64 * 8);
    for (int i = 0; i < 64; i++) ((double *)job.a)[i] = ((double *)job.b)[i] = i;
    job.done = done_cb;
    assert_int_equal(gemm_engine_submit(eng, &job, &err), 0);
    for (int i = 0; i < 5000 && atomic_load(&job.state) != GEMM_JOB_DONE; i++) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(atomic_load(&job.state), GEMM_JOB_DONE);

    char *text = render(eng);
    parse(text, &e);
    assert_true(value_of(&e, "gemmd_engine_jobs_total", "result=\"completed\"") >= 1);
    assert_true(value_of(&e, "gemmd_engine_jobs_total", "result=\"failed\"") == 0);
    assert_true(value_of(&e, "gemmd_compute_seconds_total", "") >= 0);
    assert_non_null(strstr(text, "backend=\"cpu\"} 1\n"));
    assert_true(value_of(&e, "gemmd_device_busy_seconds_total", "device=\"0\"") >= 0);
    assert_non_null(strstr(text, "gemmd_device_info{device=\"0\",name=\"cpu"));
    free(text);

    gemm_engine_host_free(eng, job.a);
    gemm_engine_host_free(eng, job.b);
    gemm_engine_host_free(eng, job.c);
    gemm_engine_close(eng);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_exposition_parses), cmocka_unit_test(test_requests_and_histogram),
        cmocka_unit_test(test_label_escaping),          cmocka_unit_test(test_concurrent_counting),
        cmocka_unit_test(test_token_families),
        cmocka_unit_test(test_engine_stats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
