/* test_config.c - defaults, precedence, the config file syntax and every error path. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "config.c" /* the key table under test */

/* Writes text to a fresh temporary file; returns its path in buf. */
static const char *temp_file(char *buf, size_t len, const char *text)
{
    snprintf(buf, len, "/tmp/gemmd_test_config_XXXXXX");
    int fd = mkstemp(buf);
    assert_true(fd >= 0);
    size_t n = strlen(text);
    assert_int_equal(write(fd, text, n), (ssize_t)n);
    close(fd);
    return buf;
}

static void test_defaults(void **state)
{
    (void)state;
    gemmd_config c;
    gemmd_config_defaults(&c);
    assert_string_equal(c.listen, "127.0.0.1");
    assert_int_equal(c.port, 8080);
    assert_int_equal(c.http_threads, 0); /* resolved at start: half the CPUs, 4 to 16 */
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int want = cpus / 2 < 4 ? 4 : cpus / 2 > 16 ? 16 : (int)(cpus / 2);
    assert_int_equal(gemmd_config_http_threads(&c), want);
    c.http_threads = gemmd_config_http_threads(&c);
    assert_int_equal(c.http_threads, want);
    c.http_threads = 3; /* a set count stays */
    assert_int_equal(gemmd_config_http_threads(&c), 3);
    gemmd_config_defaults(&c);
    assert_int_equal(c.connection_limit, 256);
    assert_int_equal(c.per_ip_limit, 64);
    assert_int_equal(c.connection_timeout_s, 60);
    assert_int_equal(c.limits.max_dim, 65536);
    assert_int_equal(c.limits.max_elements, 268435456);
    assert_true(c.limits.max_body_bytes == 2048ull * 1024 * 1024);
    assert_true(c.max_json_bytes == 256ull * 1024 * 1024);
    assert_int_equal(c.job_ttl_s, 600);
    assert_true(c.job_mem_bytes == 2048ull * 1024 * 1024);
    assert_int_equal(c.max_jobs, 1024);
    assert_string_equal(c.log_level, "info");
    assert_string_equal(c.tokens_file, "");
    assert_string_equal(c.tls_priorities, "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2"); /* TLS 1.2+ */
    assert_int_equal(c.shutdown_timeout_s, 600);

    /* The engine's own defaults, but for the host path, which the daemon turns on. */
    gemm_engine_config e;
    gemm_engine_config_defaults(&e);
    assert_int_equal(e.host_max_mnk, 0);
    e.host_max_mnk = 1048576; /* 2^20, about 101^3 */
    assert_memory_equal(&c.engine, &e, sizeof e);

    char msg[256];
    assert_int_equal(gemmd_config_validate(&c, msg, sizeof msg), 0);
}

static void test_set_every_kind(void **state)
{
    (void)state;
    gemmd_config c;
    char msg[1024];
    gemmd_config_defaults(&c);
    assert_int_equal(gemmd_config_set(&c, "port", "9001", msg, sizeof msg), 0);
    assert_int_equal(c.port, 9001);
    assert_int_equal(gemmd_config_set(&c, "tls_priorities", "SECURE256:-VERS-ALL:+VERS-TLS1.3", msg, sizeof msg), 0);
    assert_string_equal(c.tls_priorities, "SECURE256:-VERS-ALL:+VERS-TLS1.3");
    assert_int_equal(gemmd_config_set(&c, "shutdown_timeout", "0", msg, sizeof msg), 0);
    assert_int_equal(c.shutdown_timeout_s, 0);
    assert_int_equal(gemmd_config_set(&c, "shutdown_timeout", "-1", msg, sizeof msg), -1);
    assert_int_equal(gemmd_config_set(&c, "listen", "::1", msg, sizeof msg), 0);
    assert_string_equal(c.listen, "::1");
    assert_int_equal(gemmd_config_set(&c, "backend", "cpu", msg, sizeof msg), 0);
    assert_string_equal(c.engine.backend, "cpu");
    assert_int_equal(gemmd_config_set(&c, "devices", "0,2,3", msg, sizeof msg), 0);
    assert_string_equal(c.engine.devices, "0,2,3");
    assert_int_equal(gemmd_config_set(&c, "max_body_mb", "3", msg, sizeof msg), 0);
    assert_true(c.limits.max_body_bytes == 3u * 1024 * 1024);
    assert_int_equal(gemmd_config_set(&c, "device_mem_limit_mb", "5", msg, sizeof msg), 0);
    assert_true(c.engine.device_mem_limit == 5u * 1024 * 1024);
    assert_int_equal(gemmd_config_set(&c, "max_elements", "1099511627776", msg, sizeof msg), 0);
    assert_true(c.limits.max_elements == 1099511627776ull);
    assert_int_equal(gemmd_config_set(&c, "fault_inject", "cpu_delay_ms:5", msg, sizeof msg), 0);
    assert_string_equal(c.engine.fault_inject, "cpu_delay_ms:5");
    assert_int_equal(gemmd_config_set(&c, "log_level", "debug", msg, sizeof msg), 0);
    assert_string_equal(c.log_level, "debug");
    assert_int_equal(gemmd_config_set(&c, "tokens_file", "", msg, sizeof msg), 0);
    assert_int_equal(gemmd_config_set(&c, "per_ip_limit", "0", msg, sizeof msg), 0);
    assert_int_equal(c.per_ip_limit, 0);
    /* split products: the engine's defaults (4096^3, one panel per device), then set */
    assert_true(c.engine.split_min_mnk == GEMM_SPLIT_MIN_MNK_DEFAULT);
    assert_int_equal(c.engine.split_ways, 0);
    assert_int_equal(gemmd_config_set(&c, "split_min_mnk", "0", msg, sizeof msg), 0);
    assert_true(c.engine.split_min_mnk == 0);
    assert_int_equal(gemmd_config_set(&c, "split_min_mnk", "68719476736", msg, sizeof msg), 0);
    assert_true(c.engine.split_min_mnk == 68719476736ull);
    assert_int_equal(gemmd_config_set(&c, "split_ways", "16", msg, sizeof msg), 0);
    assert_int_equal(c.engine.split_ways, 16);
    assert_int_equal(gemmd_config_set(&c, "split_ways", "17", msg, sizeof msg), -1);
    assert_non_null(strstr(msg, "split_ways"));
    assert_int_equal(gemmd_config_set(&c, "split_ways", "-1", msg, sizeof msg), -1);
    assert_int_equal(c.engine.split_ways, 16);
}

/* Each bad value fails, leaves the field alone and says the key and what it accepts. */
static void expect_bad(const char *key, const char *value, const char *needle)
{
    gemmd_config c, before;
    char msg[1024] = "";
    gemmd_config_defaults(&c);
    before = c;
    assert_int_equal(gemmd_config_set(&c, key, value, msg, sizeof msg), -1);
    assert_memory_equal(&c, &before, sizeof c);
    if (!strstr(msg, needle) || (strcmp(key, "nope") != 0 && !strstr(msg, key)))
        fail_msg("%s=%s: message '%s' lacks '%s' or the key", key, value, msg, needle);
}

static void test_parse_errors(void **state)
{
    (void)state;
    expect_bad("port", "abc", "not an integer");
    expect_bad("port", "80x", "not an integer");
    expect_bad("port", "8 0", "not an integer");
    expect_bad("port", "1.5", "not an integer");
    expect_bad("port", "-", "not an integer");
    expect_bad("port", "", "missing value");
    expect_bad("port", "0", "out of range");
    expect_bad("port", "65536", "out of range");
    expect_bad("port", "-1", "1 to 65535");
    expect_bad("port", "99999999999999999999999", "overflows");
    expect_bad("max_dim", "18446744073709551616", "overflows");
    expect_bad("max_dim", "0", "out of range");
    expect_bad("max_body_mb", "1048577", "out of range");
    expect_bad("job_ttl", "0", "out of range");
    expect_bad("queue_depth", "0", "out of range");
    expect_bad("backend", "gpu", "auto, cpu or cuda");
    expect_bad("backend", "", "auto, cpu or cuda");
    expect_bad("log_level", "verbose", "error, warn, info or debug");
    expect_bad("listen", "localhost", "IP address");
    expect_bad("listen", "300.1.1.1", "IP address");
    expect_bad("devices", "0,,1", "device list");
    expect_bad("devices", "gpu0", "device list");
    expect_bad("nope", "1", "unknown key");
    /* small-product knobs that were measured to gain nothing, and removed */
    static const char *const gone[] = {"answer_spin_us", "worker_spin_us", "wait_spin_us", "zero_copy_mnk",
                                       "batch_max_delay_us", "warmup"};
    for (size_t i = 0; i < sizeof gone / sizeof gone[0]; i++) expect_bad(gone[i], "0", "unknown key");
    char longpath[400];
    memset(longpath, 'x', sizeof longpath - 1);
    longpath[sizeof longpath - 1] = '\0';
    expect_bad("tokens_file", longpath, "at most");
    /* control bytes: in no value, whichever the kind (a tab, an escape, DEL) */
    expect_bad("port", "80\t", "control character (byte 0x09 at 2)");
    expect_bad("tokens_file", "/etc/\x1b[2Jtokens", "control character (byte 0x1b at 5)");
    expect_bad("log_level", "info\x7f", "control character");
    expect_bad("tls_priorities", "NORMAL\r", "control character");
}

static void test_file_syntax(void **state)
{
    (void)state;
    char path[64], msg[1024];
    temp_file(path, sizeof path,
              "# a comment\n"
              "\n"
              "   \t\n"
              "  port   =   9100   \n"
              "listen=0.0.0.0 # trailing comment\n"
              "tokens_file = \"/tmp/with # hash\"\n"
              "tls_cert = ''\n"
              "fault_inject = 'cpu_delay_ms:1'  # quoted\n"
              "; another comment style\n"
              "max_dim = 128\n"
              "max_dim = 256\n"); /* later line wins */
    gemmd_config c;
    gemmd_config_defaults(&c);
    assert_int_equal(gemmd_config_load_file(&c, path, msg, sizeof msg), 0);
    assert_int_equal(c.port, 9100);
    assert_string_equal(c.listen, "0.0.0.0");
    assert_string_equal(c.tokens_file, "/tmp/with # hash");
    assert_string_equal(c.tls_cert, "");
    assert_string_equal(c.engine.fault_inject, "cpu_delay_ms:1");
    assert_int_equal(c.limits.max_dim, 256);
    assert_string_equal(c.config_path, path);
    unlink(path);
}

static void expect_file_error(const char *text, const char *needle)
{
    char path[64], msg[1024] = "", want[128];
    temp_file(path, sizeof path, text);
    gemmd_config c;
    gemmd_config_defaults(&c);
    assert_int_equal(gemmd_config_load_file(&c, path, msg, sizeof msg), -1);
    snprintf(want, sizeof want, "%s:", path);
    if (strncmp(msg, want, strlen(want)) != 0 || !strstr(msg, needle))
        fail_msg("file %s: message '%s' lacks '%s' or the file name", text, msg, needle);
    unlink(path);
}

static void test_file_errors(void **state)
{
    (void)state;
    expect_file_error("port = 1\nbogus = 2\n", ":2: unknown key 'bogus'");
    expect_file_error("\n\n\nport = x\n", ":4: port: 'x' is not an integer");
    expect_file_error("port 8080\n", ":1: expected 'key = value'");
    expect_file_error("= 5\n", ":1: missing key");
    expect_file_error("port =\n", ":1: port: missing value");
    expect_file_error("tokens_file = \"abc\n", ":1: tokens_file: unterminated quote");
    expect_file_error("tokens_file = \"abc\" def\n", "text after the closing quote");
    expect_file_error("backend = gpu\n", ":1: backend: 'gpu' is not a backend");
    expect_file_error("max_elements = 99999999999999999999\n", ":1: max_elements:");

    char msg[512] = "";
    gemmd_config c;
    gemmd_config_defaults(&c);
    assert_int_equal(gemmd_config_load_file(&c, "/nonexistent/gemmd.conf", msg, sizeof msg), -1);
    assert_non_null(strstr(msg, "/nonexistent/gemmd.conf: cannot open"));

    /* a NUL inside a line would end its value there ("port = 80\0 80" read as port 80) */
    char path[64];
    static const char nul[] = "listen = 127.0.0.1\nport = 80\0 80\n";
    temp_file(path, sizeof path, "");
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(nul, 1, sizeof nul - 1, f), sizeof nul - 1);
    fclose(f);
    gemmd_config_defaults(&c);
    assert_int_equal(gemmd_config_load_file(&c, path, msg, sizeof msg), -1);
    assert_non_null(strstr(msg, ":2: the line holds a NUL byte"));
    assert_int_equal(c.port, 8080);
    unlink(path);
    char longline[2100];
    memset(longline, '#', sizeof longline - 2);
    longline[sizeof longline - 2] = '\n';
    longline[sizeof longline - 1] = '\0';
    expect_file_error(longline, ":1: line longer than 2046 bytes");
}

/* Files the configuration names are checked at start: a directory is not a file. */
static void test_validate_files(void **state)
{
    (void)state;
    char msg[512] = "";
    gemmd_config c;
    gemmd_config_defaults(&c);
    snprintf(c.tokens_file, sizeof c.tokens_file, "/tmp");
    assert_int_equal(gemmd_config_validate(&c, msg, sizeof msg), -1);
    assert_non_null(strstr(msg, "tokens_file: '/tmp' is a directory"));
    gemmd_config_defaults(&c);
    snprintf(c.tls_cert, sizeof c.tls_cert, "/nonexistent.pem");
    snprintf(c.tls_key, sizeof c.tls_key, "/tmp");
    assert_int_equal(gemmd_config_validate(&c, msg, sizeof msg), -1);
    assert_non_null(strstr(msg, "tls_cert: cannot read '/nonexistent.pem'"));
}

static void test_env(void **state)
{
    (void)state;
    char *env[] = {"PATH=/bin", "GEMMD_PORT=7001", "GEMMD_MAX_BODY_MB=12", "GEMMD_BIN=bin/gemmd",
                   "GEMMD_LOG_LEVEL=warn", NULL};
    gemmd_config c;
    char msg[1024];
    gemmd_config_defaults(&c);
    assert_int_equal(gemmd_config_load_env(&c, env, msg, sizeof msg), 0);
    assert_int_equal(c.port, 7001);
    assert_true(c.limits.max_body_bytes == 12u * 1024 * 1024);
    assert_string_equal(c.log_level, "warn");

    char *bad[] = {"GEMMD_QUEUE_DEPTH=lots", NULL};
    assert_int_equal(gemmd_config_load_env(&c, bad, msg, sizeof msg), -1);
    assert_non_null(strstr(msg, "GEMMD_QUEUE_DEPTH"));
    assert_non_null(strstr(msg, "not an integer"));
}

static void test_precedence(void **state)
{
    (void)state;
    char path[64];
    temp_file(path, sizeof path, "port = 1111\nmax_dim = 100\nqueue_depth = 5\nlog_level = warn\n");
    char cfgflag[96];
    snprintf(cfgflag, sizeof cfgflag, "--config=%s", path);
    gemmd_config c;

    /* file only */
    char *a1[] = {"gemmd", cfgflag, NULL};
    char *e0[] = {NULL};
    assert_int_equal(gemmd_config_from_args(&c, 2, a1, e0), 0);
    assert_int_equal(c.port, 1111);
    assert_int_equal(c.limits.max_dim, 100);
    assert_string_equal(c.config_path, path);

    /* env over file */
    char *e1[] = {"GEMMD_PORT=2222", "GEMMD_MAX_DIM=200", NULL};
    assert_int_equal(gemmd_config_from_args(&c, 2, a1, e1), 0);
    assert_int_equal(c.port, 2222);
    assert_int_equal(c.limits.max_dim, 200);
    assert_int_equal(c.engine.queue_depth, 5);

    /* flags over env, both flag spellings */
    char *a2[] = {"gemmd", "--port", "3333", cfgflag, "--max-dim=300", "--queue_depth", "7", NULL};
    assert_int_equal(gemmd_config_from_args(&c, 7, a2, e1), 0);
    assert_int_equal(c.port, 3333);
    assert_int_equal(c.limits.max_dim, 300);
    assert_int_equal(c.engine.queue_depth, 7);
    assert_string_equal(c.log_level, "warn");

    /* GEMMD_CONFIG names the file when --config is absent */
    char envcfg[96];
    snprintf(envcfg, sizeof envcfg, "GEMMD_CONFIG=%s", path);
    char *e2[] = {envcfg, NULL};
    char *a3[] = {"gemmd", NULL};
    assert_int_equal(gemmd_config_from_args(&c, 1, a3, e2), 0);
    assert_int_equal(c.port, 1111);

    /* --config wins over GEMMD_CONFIG */
    char *e3[] = {"GEMMD_CONFIG=/nonexistent/x.conf", NULL};
    assert_int_equal(gemmd_config_from_args(&c, 2, a1, e3), 0);
    assert_int_equal(c.port, 1111);
    unlink(path);
}

static void test_flag_errors(void **state)
{
    (void)state;
    gemmd_config c;
    char *e0[] = {NULL};
    char *a1[] = {"gemmd", "--config=/nonexistent/none.conf", "--port", "1", NULL};
    assert_int_equal(gemmd_config_from_args(&c, 2, a1, e0), -1);
    char *a2[] = {"gemmd", "--config=/dev/null", "--port", NULL};
    assert_int_equal(gemmd_config_from_args(&c, 3, a2, e0), -1); /* missing value */
    char *a3[] = {"gemmd", "--config=/dev/null", "--port", "--listen", "::1", NULL};
    assert_int_equal(gemmd_config_from_args(&c, 5, a3, e0), -1); /* missing value */
    char *a4[] = {"gemmd", "--config=/dev/null", "--bogus", "1", NULL};
    assert_int_equal(gemmd_config_from_args(&c, 4, a4, e0), -1); /* unknown option */
    char *a5[] = {"gemmd", "--config=/dev/null", "--backend", "tpu", NULL};
    assert_int_equal(gemmd_config_from_args(&c, 4, a5, e0), -1); /* bad backend */
    char *a6[] = {"gemmd", "--config=/dev/null", "stray", NULL};
    assert_int_equal(gemmd_config_from_args(&c, 3, a6, e0), -1); /* positional */
    char *a7[] = {"gemmd", "--config=/dev/null", "--port=99999", NULL};
    assert_int_equal(gemmd_config_from_args(&c, 3, a7, e0), -1); /* out of range */
    char *a8[] = {"gemmd", "--config", NULL};
    assert_int_equal(gemmd_config_from_args(&c, 2, a8, e0), -1); /* --config without path */
    char *e1[] = {"GEMMD_PORT=http", NULL};
    char *a9[] = {"gemmd", "--config=/dev/null", NULL};
    assert_int_equal(gemmd_config_from_args(&c, 2, a9, e1), -1); /* bad env */
    char *a10[] = {"gemmd", "--config=/dev/null", "--tls-cert=/etc/hostname", NULL};
    assert_int_equal(gemmd_config_from_args(&c, 3, a10, e0), -1); /* cert without key */
    char *a11[] = {"gemmd", "--config=/dev/null", "--tokens-file=/nonexistent/tokens", NULL};
    assert_int_equal(gemmd_config_from_args(&c, 3, a11, e0), -1); /* unreadable */
    char *a12[] = {"gemmd", "--config=/dev/null", "--per-ip-limit=300", NULL};
    assert_int_equal(gemmd_config_from_args(&c, 3, a12, e0), -1); /* > connection_limit */
}

static void test_bool_key(void **state)
{
    (void)state;
    gemmd_config c;
    char msg[1024];
    gemmd_config_defaults(&c);
    assert_int_equal(c.restart_on_device_loss, 1);
    assert_int_equal(c.direct_run, 1);
    assert_int_equal(gemmd_config_set(&c, "direct_run", "off", msg, sizeof msg), 0);
    assert_int_equal(c.direct_run, 0);
    static const struct { const char *text; int value; } ok[] = {
        {"false", 0}, {"true", 1}, {"no", 0}, {"yes", 1}, {"off", 0}, {"on", 1}, {"0", 0}, {"1", 1},
        {"FALSE", 0}, {"True", 1},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        c.restart_on_device_loss = !ok[i].value;
        assert_int_equal(gemmd_config_set(&c, "restart_on_device_loss", ok[i].text, msg, sizeof msg), 0);
        assert_int_equal(c.restart_on_device_loss, ok[i].value);
    }
    static const char *const bad[] = {"maybe", "", "2", "-1", "truee", "y e s"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        c.restart_on_device_loss = 1;
        assert_int_equal(gemmd_config_set(&c, "restart_on_device_loss", bad[i], msg, sizeof msg), -1);
        assert_int_equal(c.restart_on_device_loss, 1); /* a refused value changes nothing */
        assert_non_null(strstr(msg, "true or false"));
    }
}

static void test_help_and_version(void **state)
{
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    gemmd_config_usage(f);
    fclose(f);
    static const char *const expect[] = {
        "--listen VALUE", "default 127.0.0.1", "--port VALUE", "default 8080", "--http-threads VALUE",
        "--connection-limit VALUE", "default 256", "--per-ip-limit VALUE", "--connection-timeout VALUE",
        "--backend VALUE", "default auto", "--threads VALUE", "--cpu-workers VALUE", "--queue-depth VALUE",
        "--devices VALUE", "default all", "--streams-per-device VALUE", "--device-mem-limit-mb VALUE",
        "--fault-inject VALUE", "--max-dim VALUE", "default 65536", "--max-elements VALUE",
        "default 268435456", "--max-body-mb VALUE", "default 2048", "--max-json-mb VALUE", "default 256",
        "--job-ttl VALUE", "default 600", "--job-mem-mb VALUE", "--max-jobs VALUE", "default 1024",
        "--tokens-file VALUE", "--tls-cert VALUE", "--tls-key VALUE", "--log-level VALUE",
        "default info", "GEMMD_MAX_BODY_MB", "--config FILE", "--help", "--version"};
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++)
        if (!strstr(buf, expect[i])) fail_msg("usage lacks '%s'", expect[i]);
    free(buf);

    gemmd_config c;
    char *e0[] = {NULL};
    /* --help wins even over a broken config */
    char *a1[] = {"gemmd", "--config=/nonexistent", "--help", NULL};
    FILE *saved = stdout;
    stdout = fopen("/dev/null", "w");
    assert_int_equal(gemmd_config_from_args(&c, 3, a1, e0), 1);
    char *a2[] = {"gemmd", "--version", NULL};
    assert_int_equal(gemmd_config_from_args(&c, 2, a2, e0), 1);
    fclose(stdout);
    stdout = saved;
}

static void test_shipped_config_file(void **state)
{
    (void)state;
    /* config/gemmd.conf sets every key to its default. */
    if (access("config/gemmd.conf", R_OK) != 0) skip();
    gemmd_config c, d;
    char msg[1024];
    gemmd_config_defaults(&c);
    gemmd_config_defaults(&d);
    assert_int_equal(gemmd_config_load_file(&c, "config/gemmd.conf", msg, sizeof msg), 0);
    memset(c.config_path, 0, sizeof c.config_path);
    assert_memory_equal(&c, &d, sizeof c);
}

/* Every engine key (each backend's section) is a key of the daemon, under its own name, with
 * its default; a CPU build reads the CUDA backend's keys too. */
static void test_engine_key_rows(void **state)
{
    (void)state;
    gemmd_config c;
    gemmd_config_defaults(&c);
    char msg[512];
    for (const gemm_key_section *s = gemm_engine_keys; s->owner; s++) {
        for (const gemm_key *k = s->keys; k->name; k++) {
            const key_desc *d = find_key(k->name);
            if (!d) fail_msg("engine key %s (section %s) is not a key of the daemon", k->name, s->owner);
            assert_int_equal(d->offset, offsetof(gemmd_config, engine) + k->offset);
        }
    }
    assert_int_equal(gemmd_config_set(&c, "streams_per_device", "8", msg, sizeof msg), 0);
    assert_int_equal(c.engine.streams_per_device, 8);
    assert_int_equal(gemmd_config_set(&c, "device_mem_limit_mb", "3", msg, sizeof msg), 0);
    assert_int_equal(c.engine.device_mem_limit, 3ull << 20);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),         cmocka_unit_test(test_set_every_kind),
        cmocka_unit_test(test_parse_errors),     cmocka_unit_test(test_file_syntax),
        cmocka_unit_test(test_file_errors),      cmocka_unit_test(test_validate_files),
        cmocka_unit_test(test_env),              cmocka_unit_test(test_precedence),
        cmocka_unit_test(test_flag_errors),      cmocka_unit_test(test_help_and_version),
        cmocka_unit_test(test_shipped_config_file), cmocka_unit_test(test_bool_key),
        cmocka_unit_test(test_engine_key_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
