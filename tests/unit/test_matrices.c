/*
 * test_matrices.c - the resident matrix store over the real CPU engine: ids, owners, the
 * byte budget with reservations (507 / 413), a reader keeping a deleted matrix alive, the
 * bytes coming back when the last reference goes, an expired empty=1 matrix forgotten by a
 * refused reservation, and the listing by last use. Leaks and
 * use-after-free show under `make test-san`.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "matrices.c" /* the store under test, and what it holds (usage below) */

/* Kept count and bytes held (reserved included). */
static void gemmd_matrices_usage(gemmd_matrices *s, int *count, uint64_t *bytes, uint64_t *budget)
{
    pthread_mutex_lock(&s->mu);
    if (count) *count = s->count;
    if (bytes) *bytes = s->held;
    if (budget) *budget = s->budget;
    pthread_mutex_unlock(&s->mu);
}

static gemm_engine *open_engine(void)
{
    gemm_engine_config cfg;
    gemm_engine_config_defaults(&cfg);
    snprintf(cfg.backend, sizeof cfg.backend, "cpu");
    cfg.threads = 1;
    gemm_engine_err err;
    gemm_engine *e = gemm_engine_open(&cfg, &err);
    assert_non_null(e);
    return e;
}

/* A rows x cols float32 matrix filled with v, in engine memory. */
static gemm_matrix make(gemm_engine *e, uint64_t rows, uint64_t cols, float v)
{
    gemm_matrix m = {rows, cols, GEMM_DTYPE_F32, gemm_engine_host_alloc(e, rows * cols * 4), 0};
    assert_non_null(m.data);
    for (uint64_t i = 0; i < rows * cols; i++) ((float *)m.data)[i] = v;
    return m;
}

static void add_matrix(gemmd_matrices *s, gemm_engine *e, uint64_t rows, uint64_t cols, int owner, char id[GEMMD_JOB_ID_LEN + 1])
{
    gemm_err err;
    assert_int_equal(gemmd_matrices_reserve(s, 0, rows * cols * 4, &err), 0);
    gemm_matrix m = make(e, rows, cols, 1.0f);
    gemmd_matrix_entry *me = gemmd_matrices_add(s, &m, NULL, owner, 0, 0, 0, &err);
    assert_non_null(me);
    assert_null(m.data); /* taken over */
    memcpy(id, me->id, GEMMD_JOB_ID_LEN + 1);
    gemmd_matrices_put(s, me);
}

static void test_lifecycle_and_owner(void **state)
{
    (void)state;
    gemm_engine *e = open_engine();
    gemmd_matrices *s = gemmd_matrices_new(e, NULL, 1 << 20, 16, 100, 0);
    char id[GEMMD_JOB_ID_LEN + 1];
    add_matrix(s, e, 4, 8, 1, id);
    assert_int_equal(strlen(id), 32);
    assert_true(strspn(id, "0123456789abcdef") == 32);
    gemmd_matrix_entry *m = gemmd_matrices_get(s, id, 1);
    assert_non_null(m);
    assert_int_equal(m->m.rows, 4);
    assert_int_equal(m->bytes, 128);
    assert_non_null(m->res);
    assert_ptr_equal(m->res->host, m->m.data);
    gemmd_matrices_put(s, m);
    assert_null(gemmd_matrices_get(s, id, 2));            /* another owner */
    assert_non_null(m = gemmd_matrices_get(s, id, GEMMD_OWNER_ANY));
    gemmd_matrices_put(s, m);
    assert_null(gemmd_matrices_get(s, "0123", 1));        /* not an id */
    assert_int_equal(gemmd_matrices_delete(s, id, 2), -1); /* another owner cannot */
    assert_int_equal(gemmd_matrices_delete(s, id, 1), 0);
    assert_null(gemmd_matrices_get(s, id, 1));
    assert_int_equal(gemmd_matrices_delete(s, id, 1), -1);
    int n;
    uint64_t bytes;
    gemmd_matrices_usage(s, &n, &bytes, NULL);
    assert_int_equal(n, 0);
    assert_int_equal(bytes, 0);
    gemmd_matrices_free(s);
    gemm_engine_close(e);
}

static void test_budget(void **state)
{
    (void)state;
    gemm_engine *e = open_engine();
    gemmd_matrices *s = gemmd_matrices_new(e, NULL, 1024, 3, 100, 0);
    gemm_err err;
    assert_int_equal(gemmd_matrices_reserve(s, 0, 2048, &err), -1);
    assert_int_equal(err.status, 413);
    char a[GEMMD_JOB_ID_LEN + 1], b[GEMMD_JOB_ID_LEN + 1], c[GEMMD_JOB_ID_LEN + 1];
    add_matrix(s, e, 8, 16, 0, a);                                 /* 512 */
    assert_int_equal(gemmd_matrices_reserve(s, 0, 600, &err), -1);
    assert_int_equal(err.status, 507);
    assert_string_equal(err.code, "insufficient_storage");
    assert_int_equal(gemmd_matrices_reserve(s, 0, 512, &err), 0); /* exactly full */
    gemmd_matrices_unreserve(s, 0, 512);
    add_matrix(s, e, 4, 16, 0, b);                                 /* 256 */
    add_matrix(s, e, 1, 1, 0, c);                                  /* 4: the third */
    assert_int_equal(gemmd_matrices_reserve(s, 0, 4, &err), -1); /* max_count */
    assert_int_equal(err.status, 507);

    /* A reader keeps a deleted matrix (and its bytes) until it lets go. */
    gemmd_matrix_entry *m = gemmd_matrices_get(s, a, 0);
    assert_int_equal(gemmd_matrices_delete(s, a, 0), 0);
    uint64_t bytes;
    gemmd_matrices_usage(s, NULL, &bytes, NULL);
    assert_int_equal(bytes, 512 + 256 + 4);
    assert_true(((float *)m->m.data)[127] == 1.0f);          /* still readable */
    gemmd_matrices_put(s, m);
    gemmd_matrices_usage(s, NULL, &bytes, NULL);
    assert_int_equal(bytes, 256 + 4);
    assert_int_equal(gemmd_matrices_reserve(s, 0, 600, &err), 0);
    gemmd_matrices_unreserve(s, 0, 600);
    gemmd_matrices_free(s);
    gemm_engine_close(e);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void test_listing_by_last_use(void **state)
{
    (void)state;
    gemm_engine *e = open_engine();
    gemmd_matrices *s = gemmd_matrices_new(e, NULL, 1 << 20, 16, 100, 0);
    char a[GEMMD_JOB_ID_LEN + 1], b[GEMMD_JOB_ID_LEN + 1], c[GEMMD_JOB_ID_LEN + 1], other[GEMMD_JOB_ID_LEN + 1];
    add_matrix(s, e, 2, 2, 5, a);
    sleep_ms(2);
    add_matrix(s, e, 2, 2, 5, b);
    sleep_ms(2);
    add_matrix(s, e, 2, 2, 5, c);
    add_matrix(s, e, 2, 2, 6, other);
    sleep_ms(2);
    gemmd_matrix_entry *m = gemmd_matrices_get(s, a, 5); /* a is now the most recent */
    gemmd_matrices_note_use(s, m);
    gemmd_matrices_put(s, m);
    gemm_buf out;
    gemm_buf_init(&out);
    gemmd_matrices_list_json(s, 5, &out);
    gemm_buf_append(&out, "", 1);
    const char *pa = strstr(out.data, a), *pb = strstr(out.data, b), *pc = strstr(out.data, c);
    assert_non_null(pa);
    assert_non_null(pb);
    assert_non_null(pc);
    assert_true(pa < pc && pc < pb);              /* a (used last), c, b (least recently used) */
    assert_null(strstr(out.data, other));          /* another owner's is not listed */
    assert_non_null(strstr(out.data, "\"count\":3"));
    assert_non_null(strstr(out.data, "\"uses\":1"));
    gemm_buf_free(&out);
    gemmd_matrices_free(s);
    gemm_engine_close(e);
}

/* An empty=1 matrix not filled within its ttl is forgotten by the next reservation, and
 * its bytes come back even when that reservation is refused. */
static void test_refused_frees_expired(void **state)
{
    (void)state;
    gemm_engine *e = open_engine();
    gemmd_matrices *s = gemmd_matrices_new(e, NULL, 1024, 3, 100, 1);
    char a[GEMMD_JOB_ID_LEN + 1], b[GEMMD_JOB_ID_LEN + 1];
    gemm_err err;
    add_matrix(s, e, 8, 16, 0, a); /* 512 */
    assert_int_equal(gemmd_matrices_reserve(s, 0, 256, &err), 0);
    gemm_matrix m = make(e, 4, 16, 0.0f);
    gemmd_matrix_entry *me = gemmd_matrices_add(s, &m, NULL, 0, 0, 0, 1, &err); /* empty=1, never filled */
    assert_non_null(me);
    memcpy(b, me->id, GEMMD_JOB_ID_LEN + 1);
    gemmd_matrices_put(s, me);
    uint64_t bytes;
    gemmd_matrices_usage(s, NULL, &bytes, NULL);
    assert_int_equal(bytes, 512 + 256);
    sleep_ms(1100); /* past its ttl of 1 s */
    assert_int_equal(gemmd_matrices_reserve(s, 0, 600, &err), -1); /* 600 > 1024 - 512 */
    assert_int_equal(err.status, 507);
    int n;
    gemmd_matrices_usage(s, &n, &bytes, NULL);
    assert_int_equal(n, 1);
    assert_int_equal(bytes, 512);
    gemmd_matrices_free(s);
    gemm_engine_close(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lifecycle_and_owner),
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_listing_by_last_use),
        cmocka_unit_test(test_refused_frees_expired),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
