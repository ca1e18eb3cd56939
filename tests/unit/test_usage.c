/* test_usage.c - per-token use (usage.h): the gemmd_token_* families in /metrics, the
 * parts of /v1/status (rates, latency, tokens, errors, the wait estimate) from known
 * requests, products and errors, the error ring keeping the newest 20, statuses past the
 * kept ones counted as "other", tokens past GEMMD_USAGE_TOKENS as "other", and no token
 * ever printed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "usage.h"

static gemmd_auth *tokens(void)
{
    char path[] = "/tmp/gemmd_test_usage_XXXXXX", msg[300];
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    static const char text[] = "alice SECRET-alice\nSECRET-two\n";
    assert_int_equal(write(fd, text, sizeof text - 1), (ssize_t)(sizeof text - 1));
    close(fd);
    gemmd_auth *a = gemmd_auth_load(path, msg, sizeof msg);
    unlink(path);
    if (!a) fail_msg("%s", msg);
    return a;
}

static char *render(const gemmd_auth *auth)
{
    gemm_buf b;
    gemm_buf_init(&b);
    gemmd_usage_render(&b, auth);
    assert_false(b.failed);
    gemm_buf_append(&b, "", 1);
    char *s = strdup(b.data);
    gemm_buf_free(&b);
    return s;
}

/* The value of the sample line that starts with `series` ("name{labels}"); fails when absent. */
static double sample(const char *text, const char *series)
{
    char want[200];
    snprintf(want, sizeof want, "\n%s ", series);
    const char *p = strstr(text, want);
    if (!p) fail_msg("no sample %s in:\n%s", series, text);
    return strtod(p + strlen(want), NULL);
}

static void product(int who, int state, double queue_ms, double compute_ms, uint64_t batch)
{
    gemm_job job;
    memset(&job, 0, sizeof job);
    atomic_store(&job.state, state);
    job.timing.queue_ms = queue_ms;
    job.timing.compute_ms = compute_ms;
    job.batch = batch;
    gemmd_usage_product(who, &job);
}

/* The members gemmd_usage_json appends, in an object of their own, with the wait it
 * returns as queue.wait_estimate_s (null for -1), as /v1/status has it. */
static cJSON *status(const gemmd_auth *auth, int queued, double uptime_s)
{
    gemm_buf b;
    gemm_buf_init(&b);
    gemm_buf_puts(&b, "{");
    double wait = gemmd_usage_json(&b, auth, queued, uptime_s);
    if (wait < 0) gemm_buf_puts(&b, ",\"queue\":{\"wait_estimate_s\":null}}");
    else gemm_buf_printf(&b, ",\"queue\":{\"wait_estimate_s\":%.6f}}", wait);
    gemm_buf_append(&b, "", 1);
    assert_false(b.failed);
    cJSON *root = cJSON_Parse(b.data);
    if (!root) fail_msg("not JSON: %s", b.data);
    gemm_buf_free(&b);
    return root;
}

static double num(const cJSON *o, const char *path)
{
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *k = strtok(buf, "."); k; k = strtok(NULL, ".")) o = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(o)) fail_msg("%s is not a number", path);
    return o->valuedouble;
}

static const cJSON *token(const cJSON *root, const char *name)
{
    const cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(root, "tokens"))
        if (!strcmp(cJSON_GetObjectItem(t, "name")->valuestring, name)) return t;
    return NULL;
}

/* One program, one process: the counters start at zero and are only added to here. */
static void test_use(void **state)
{
    (void)state;
    gemmd_auth *auth = tokens();
    gemmd_usage_request(1, 200, 100, 1000);
    gemmd_usage_request(1, 200, 100, 1000);
    gemmd_usage_request(1, 422, 10, 50);
    gemmd_usage_request(2, 200, 7, 8);
    gemmd_usage_request(0, 401, 0, 90);
    for (int i = 1; i <= 10; i++) product(1, GEMM_JOB_DONE, 0.5, i - 0.5, 0); /* engine time i ms */
    product(2, GEMM_JOB_DONE, 2.0, 1000.0, 4);  /* a batch of 4: 4 products, one job */
    product(2, GEMM_JOB_FAILED, 0, 500.0, 0);   /* its compute time counts, not a product */
    gemmd_usage_error(2, "/v1/matmul", 422, "shape_mismatch");

    char *text = render(auth);
    assert_true(sample(text, "gemmd_token_requests_total{token=\"alice\",code=\"200\"}") == 2);
    assert_true(sample(text, "gemmd_token_requests_total{token=\"alice\",code=\"422\"}") == 1);
    assert_true(sample(text, "gemmd_token_requests_total{token=\"token2\",code=\"200\"}") == 1);
    assert_true(sample(text, "gemmd_token_requests_total{token=\"anonymous\",code=\"401\"}") == 1);
    assert_true(sample(text, "gemmd_token_products_total{token=\"alice\"}") == 10);
    assert_true(sample(text, "gemmd_token_products_total{token=\"token2\"}") == 4);
    assert_true(fabs(sample(text, "gemmd_token_compute_seconds_total{token=\"alice\"}") - 0.05) < 1e-6);
    assert_true(fabs(sample(text, "gemmd_token_compute_seconds_total{token=\"token2\"}") - 1.5) < 1e-6);
    assert_true(sample(text, "gemmd_token_bytes_total{token=\"alice\",direction=\"in\"}") == 210);
    assert_true(sample(text, "gemmd_token_bytes_total{token=\"alice\",direction=\"out\"}") == 2050);
    assert_non_null(strstr(text, "# TYPE gemmd_token_requests_total counter\n"));
    assert_null(strstr(text, "SECRET"));
    free(text);

    /* queued 0: the wait is the median queue time of the last minute's products */
    cJSON *root = status(auth, 0, 5.0);
    assert_true(num(root, "latency.jobs") == 11);
    assert_true(num(root, "latency.p50_ms") == 6.0);     /* nearest rank of 1..10 ms and 1002 ms */
    assert_true(num(root, "latency.p95_ms") == 1002.0);
    assert_true(fabs(num(root, "latency.mean_ms") - (55.0 + 1002.0) / 11) < 1e-4);
    assert_true(num(root, "latency.queue_p50_ms") == 0.5);
    assert_true(fabs(num(root, "queue.wait_estimate_s") - 0.0005) < 1e-9);
    /* up 5 s: rates over those 5 s */
    assert_true(fabs(num(root, "rates.products_per_s") - 14 / 5.0) < 1e-4);
    assert_true(fabs(num(root, "rates.requests_per_s") - 5 / 5.0) < 1e-4);
    assert_true(fabs(num(root, "rates.errors_per_s") - 2 / 5.0) < 1e-4);
    const cJSON *steps = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "rates"), "products");
    double sum = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, steps) sum += x->valuedouble;
    assert_int_equal(cJSON_GetArraySize(steps), GEMMD_USAGE_STEPS);
    assert_true(sum == 14);
    const cJSON *alice = token(root, "alice"), *two = token(root, "token2");
    assert_non_null(alice);
    assert_non_null(two);
    assert_non_null(token(root, "anonymous"));
    assert_true(num(alice, "window.requests") == 3 && num(alice, "total.requests") == 3);
    assert_true(num(alice, "window.errors") == 1 && num(two, "window.errors") == 0);
    assert_true(num(two, "window.products") == 4 && num(two, "total.bytes_in") == 7);
    const cJSON *e = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "errors"), 0);
    assert_string_equal(cJSON_GetObjectItem(e, "token")->valuestring, "token2");
    assert_string_equal(cJSON_GetObjectItem(e, "code")->valuestring, "shape_mismatch");
    assert_string_equal(cJSON_GetObjectItem(e, "route")->valuestring, "/v1/matmul");
    assert_true(num(e, "status") == 422 && num(e, "time") > 1e9);
    char *json = cJSON_PrintUnformatted(root);
    assert_null(strstr(json, "SECRET"));
    cJSON_free(json);
    cJSON_Delete(root);

    /* queued 3: the time the queue takes to drain at the last minute's 11 jobs in 5 s */
    root = status(auth, 3, 5.0);
    assert_true(fabs(num(root, "queue.wait_estimate_s") - 3 / (11 / 5.0)) < 1e-5);
    cJSON_Delete(root);
    gemmd_auth_free(auth);
}

/* The newest GEMMD_USAGE_ERRORS errors, newest first; more statuses than kept share
 * code="other"; tokens past GEMMD_USAGE_TOKENS share the name "other". */
static void test_bounds(void **state)
{
    (void)state;
    gemmd_auth *auth = tokens();
    for (int i = 0; i < 25; i++) {
        char code[16];
        snprintf(code, sizeof code, "e%d", i);
        gemmd_usage_error(GEMMD_USAGE_TOKENS + 5 + i, NULL, 500, code);
    }
    cJSON *root = status(auth, 0, 100.0);
    const cJSON *errs = cJSON_GetObjectItem(root, "errors");
    assert_int_equal(cJSON_GetArraySize(errs), GEMMD_USAGE_ERRORS);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(errs, 0), "code")->valuestring, "e24");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(errs, 19), "code")->valuestring, "e5");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(errs, 0), "token")->valuestring, "other");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(errs, 0), "route")->valuestring, "other");
    cJSON_Delete(root);

    for (int st = 100; st < 140; st++) gemmd_usage_request(GEMMD_USAGE_TOKENS + 1, st, 0, 0);
    gemmd_usage_request(GEMMD_USAGE_TOKENS + 9, 100, 0, 0); /* shares the slot, and status 100 */
    char *text = render(auth);
    assert_true(sample(text, "gemmd_token_requests_total{token=\"other\",code=\"100\"}") == 2);
    assert_true(sample(text, "gemmd_token_requests_total{token=\"other\",code=\"122\"}") == 1);
    assert_null(strstr(text, "code=\"123\""));
    assert_true(sample(text, "gemmd_token_requests_total{token=\"other\",code=\"other\"}") == 140 - 123);
    assert_true(sample(text, "gemmd_token_requests_total{token=\"alice\",code=\"200\"}") == 2);
    free(text);
    gemmd_auth_free(auth);
}

/* Sum of token2's request samples (every code), and whether a code label repeats. */
static double token2_requests(const char *text, int *repeated)
{
    const char *key = "\ngemmd_token_requests_total{token=\"token2\",code=\"";
    char seen[64][16];
    int n = 0;
    double sum = 0;
    *repeated = 0;
    for (const char *p = strstr(text, key); p; p = strstr(p + 1, key)) {
        const char *c = p + strlen(key), *q = strchr(c, '"');
        for (int i = 0; i < n; i++)
            if ((size_t)(q - c) == strlen(seen[i]) && !strncmp(seen[i], c, (size_t)(q - c))) *repeated = 1;
        if (n < 64) snprintf(seen[n++], sizeof seen[0], "%.*s", (int)(q - c), c);
        sum += strtod(strchr(q, ' ') + 1, NULL);
    }
    return sum;
}

static void *writer(void *arg)
{
    int t = (int)(intptr_t)arg;
    for (int i = 0; i < 1000; i++) {
        gemmd_usage_request(2, i % 2 ? 300 + t * 3 + i % 3 : 200, 1, 1);
        if (i % 10 == 0) product(2, GEMM_JOB_DONE, 0.1, 0.1, 0);
    }
    return NULL;
}

/* Threads write their own shards; /metrics sums them: nothing lost, one series per code
 * (25 statuses across the shards: the 24th on is "other"). Runs after the tests above. */
static void test_shards(void **state)
{
    (void)state;
    gemmd_auth *auth = tokens();
    char *text = render(auth);
    int rep;
    double before = token2_requests(text, &rep), ok_before = sample(text, "gemmd_token_requests_total{token=\"token2\",code=\"200\"}");
    double products = sample(text, "gemmd_token_products_total{token=\"token2\"}");
    free(text);
    pthread_t th[8];
    for (int t = 0; t < 8; t++) assert_int_equal(pthread_create(&th[t], NULL, writer, (void *)(intptr_t)t), 0);
    for (int t = 0; t < 8; t++) pthread_join(th[t], NULL);
    text = render(auth);
    assert_true(token2_requests(text, &rep) - before == 8000);
    assert_false(rep);
    assert_true(sample(text, "gemmd_token_requests_total{token=\"token2\",code=\"200\"}") - ok_before == 4000);
    assert_true(sample(text, "gemmd_token_requests_total{token=\"token2\",code=\"other\"}") > 0);
    assert_true(sample(text, "gemmd_token_products_total{token=\"token2\"}") - products == 800);
    free(text);
    cJSON *root = status(auth, 0, 100.0);
    assert_true(num(token(root, "token2"), "window.requests") >= 8000);
    cJSON_Delete(root);
    gemmd_auth_free(auth);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_use),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_shards),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
