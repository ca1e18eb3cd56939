/*
 * config.c - the daemon's configuration (config.h).
 *
 * Every key is described once, in the table below (name, kind, range, help), and the
 * engine's backends add theirs (gemm_engine_keys). The file, environment and flag readers
 * all go through gemmd_config_set(), so a value is checked the same way wherever it comes
 * from, and each error names where it came from (file:line, GEMMD_X or --x) and what the
 * key accepts.
 */
#include "config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <stdarg.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "instance.h"
#include "log.h"

#define MB (1024ull * 1024ull)
/* TLS 1.2 and 1.3 only; GnuTLS's NORMAL set of ciphers otherwise. */
#define GEMMD_TLS_PRIORITIES_DEFAULT "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2"
#define OFF(f) offsetof(gemmd_config, f)
#define SZ(f) sizeof(((gemmd_config *)0)->f)

/* msg = the message; returns -1. */
__attribute__((format(printf, 3, 4))) static int say(char *msg, size_t msglen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, msglen, fmt, ap);
    va_end(ap);
    return -1;
}

typedef enum { /* the engine's key kinds (engine.h), then the daemon's own */
    K_INT = GEMM_KEY_INT,         /* int field, range [min, max] */
    K_U64 = GEMM_KEY_U64,         /* uint64_t field, range [min, max] */
    K_MB_U64 = GEMM_KEY_MB,       /* value in MiB, uint64_t field in bytes */
    K_BOOL = GEMM_KEY_BOOL,       /* true | false (also yes/no, on/off, 1/0); int field */
    K_STR = GEMM_KEY_STR,         /* free string (a path); may be empty */
    K_BACKEND = GEMM_KEY_BACKEND, /* auto | cpu | cuda */
    K_DEVICES = GEMM_KEY_DEVICES, /* all | comma list of ordinals */
    K_MB_SIZE,                    /* value in MiB, size_t field in bytes */
    K_LISTEN,                     /* an IPv4 or IPv6 address */
    K_LOGLEVEL,                   /* error | warn | info | debug */
    K_INSTANCE                    /* an instance_id (instance.h), or empty */
} key_kind;

typedef struct {
    const char *name;
    const char *def; /* the default, as a value of the key (daemon keys) */
    key_kind kind;
    size_t offset; /* into gemmd_config */
    size_t size;   /* string kinds: the buffer size */
    long long min, max;
    const char *help;
} key_desc;

static const key_desc daemon_keys[] = {
    {"listen", "127.0.0.1", K_LISTEN, OFF(listen), SZ(listen), 0, 0,
     "address to bind (IPv4 or IPv6); binding beyond loopback without tokens_file warns"},
    {"port", "8080", K_INT, OFF(port), 0, 1, 65535, "TCP port"},
    {"http_threads", "0", K_INT, OFF(http_threads), 0, 0, 1024,
     "HTTP threads (libmicrohttpd thread pool; 0 = half the CPUs, 4 to 16)"},
    {"direct_run", "true", K_BOOL, OFF(direct_run), 0, 0, 1,
     "an HTTP thread runs a small product (m*n*k up to batch_max_mnk) itself, on an idle stream, while "
     "few products are in flight and nothing is queued, instead of handing it to a worker"},
    {"connection_limit", "256", K_INT, OFF(connection_limit), 0, 1, 1000000, "connections open at once"},
    {"per_ip_limit", "64", K_INT, OFF(per_ip_limit), 0, 0, 1000000,
     "connections open at once from one address (0 = no limit)"},
    {"connection_memory_kb", "64", K_INT, OFF(connection_memory_kb), 0, 16, 16384,
     "KiB of libmicrohttpd buffer per connection: request head, reads and writes"},
    {"connection_timeout", "60", K_INT, OFF(connection_timeout_s), 0, 0, 86400,
     "seconds a connection may stay idle (0 = never time out)"},
    {"header_timeout", "10", K_INT, OFF(header_timeout_s), 0, 0, 86400,
     "seconds a request head may take, from the connection or the previous answer (0 = none)"},
    {"request_timeout", "600", K_INT, OFF(request_timeout_s), 0, 0, 86400,
     "seconds the whole request (head and body) may take (0 = none)"},
    {"min_rate_kb", "64", K_INT, OFF(min_rate_kb), 0, 0, 10485760,
     "KiB/s a body must average after header_timeout, and an answer must be taken at (0 = none)"},
    {"send_timeout", "30", K_INT, OFF(send_timeout_s), 0, 0, 86400,
     "seconds an answer may wait for the client to take it, plus its size at min_rate_kb (0 = none)"},
    {"max_inflight_mb", "0", K_MB_U64, OFF(max_inflight_bytes), 0, 0, 16777216,
     "MiB of memory all requests in flight may hold: bodies, inputs, kept results, answers "
     "(0 = half of the host's or the container's memory)"},
    {"max_dim", "65536", K_U64, OFF(limits.max_dim), 0, 1, 4294967295LL, "largest m, k or n accepted"},
    {"max_elements", "268435456", K_U64, OFF(limits.max_elements), 0, 1, 1099511627776LL,
     "largest element count of A, B or C"},
    {"max_body_mb", "2048", K_MB_SIZE, OFF(limits.max_body_bytes), 0, 1, 1048576,
     "largest request body in MiB (checked from Content-Length before reading)"},
    {"max_json_mb", "256", K_MB_U64, OFF(max_json_bytes), 0, 1, 65536,
     "largest JSON body or answer in MiB (/v1 bodies are decoded as they arrive, /v2 bodies held whole)"},
    {"job_ttl", "600", K_INT, OFF(job_ttl_s), 0, 1, 2592000, "seconds a finished async job is kept"},
    {"job_mem_mb", "2048", K_MB_U64, OFF(job_mem_bytes), 0, 1, 16777216, "MiB of memory all kept async jobs may hold"},
    {"max_jobs", "1024", K_INT, OFF(max_jobs), 0, 1, 10000000, "async jobs kept at once"},
    {"resident_mb", "4096", K_MB_U64, OFF(resident_bytes), 0, 0, 16777216,
     "MiB all resident matrices may hold (0: none)"},
    {"max_matrices", "4096", K_INT, OFF(max_matrices), 0, 1, 10000000, "resident matrices kept at once"},
    {"tokens_file", "", K_STR, OFF(tokens_file), SZ(tokens_file), 0, 0,
     "file of bearer tokens, one a line, \"token\" or \"name token\" (empty = no authentication)"},
    {"tls_cert", "", K_STR, OFF(tls_cert), SZ(tls_cert), 0, 0, "PEM certificate (with tls_key: serve HTTPS)"},
    {"tls_key", "", K_STR, OFF(tls_key), SZ(tls_key), 0, 0, "PEM private key (with tls_cert: serve HTTPS)"},
    {"tls_priorities", GEMMD_TLS_PRIORITIES_DEFAULT, K_STR, OFF(tls_priorities), SZ(tls_priorities), 0, 0,
     "GnuTLS priority string for HTTPS (protocol versions, ciphers); the default allows TLS 1.2 and 1.3 only"},
    {"admit_wait", "30", K_INT, OFF(admit_wait_s), 0, 1, 3600,
     "seconds a request may wait for memory before its body is read; then 503 over_budget"},
    {"token_share", "50", K_INT, OFF(token_share), 0, 1, 100,
     "percent of what the daemon keeps (memory in flight, resident matrices, async jobs) one token, or "
     "one address without tokens, may hold"},
    {"shutdown_timeout", "600", K_INT, OFF(shutdown_timeout_s), 0, 0, 86400,
     "seconds running products may take to finish after SIGTERM; then they are cancelled and their "
     "clients get 503"},
    {"log_level", "info", K_LOGLEVEL, OFF(log_level), SZ(log_level), 0, 0, "error, warn, info or debug"},
    {"restart_on_device_loss", "true", K_BOOL, OFF(restart_on_device_loss), 0, 0, 1,
     "re-exec gemmd in place (same pid and port) when the engine has lost every device"},
    {"instance_id", "", K_INSTANCE, OFF(instance_id), SZ(instance_id), 0, 0,
     "this daemon's name among its peers, carried by job ids (empty = <short host name>-<port>)"},
};

static key_desc all_keys[sizeof daemon_keys / sizeof daemon_keys[0] + 32];
static const char *owners[sizeof all_keys / sizeof all_keys[0]]; /* an engine key's section; NULL: the daemon's */
static size_t nall;
static pthread_once_t keys_once = PTHREAD_ONCE_INIT;

static void build_keys(void)
{
    for (size_t i = 0; i < sizeof daemon_keys / sizeof daemon_keys[0]; i++) all_keys[nall++] = daemon_keys[i];
    for (const gemm_key_section *s = gemm_engine_keys; s->owner; s++)
        for (const gemm_key *k = s->keys; k->name && nall < sizeof all_keys / sizeof all_keys[0]; k++) {
            owners[nall] = s->owner;
            all_keys[nall++] = (key_desc){k->name, NULL, (key_kind)k->kind, OFF(engine) + k->offset, k->size,
                                          k->min, k->max, k->help};
        }
}

static size_t nkeys(void)
{
    pthread_once(&keys_once, build_keys);
    return nall;
}

/* The key called name (file spelling, e.g. "max_body_mb"; a flag's dashes read as
 * underscores); NULL if unknown. */
static const key_desc *find_key(const char *name)
{
    char n[64];
    size_t i = 0;
    for (; name[i] && i + 1 < sizeof n; i++) n[i] = name[i] == '-' ? '_' : name[i];
    n[i] = '\0';
    for (i = 0; i < nkeys(); i++)
        if (strcmp(all_keys[i].name, n) == 0) return &all_keys[i];
    return NULL;
}

void gemmd_config_defaults(gemmd_config *c)
{
    char msg[160];
    memset(c, 0, sizeof *c);
    gemm_engine_config_defaults(&c->engine);
    c->engine.host_max_mnk = 1ull << 20; /* about 101^3; the engine's own default is 0 */
    for (size_t i = 0; i < sizeof daemon_keys / sizeof daemon_keys[0]; i++)
        gemmd_config_set(c, daemon_keys[i].name, daemon_keys[i].def, msg, sizeof msg);
}

/* ---------------------------------------------------------------- one value */

static const char *kind_accepts(const key_desc *k, char *buf, size_t len)
{
    switch (k->kind) {
    case K_INT:
    case K_U64: snprintf(buf, len, "an integer from %lld to %lld", k->min, k->max); break;
    case K_MB_U64:
    case K_MB_SIZE: snprintf(buf, len, "a whole number of MiB from %lld to %lld", k->min, k->max); break;
    case K_STR: snprintf(buf, len, "a string (a path, or a list) of at most %zu bytes, or empty", k->size - 1); break;
    case K_LISTEN: snprintf(buf, len, "an IPv4 or IPv6 address such as 127.0.0.1, 0.0.0.0 or ::1"); break;
    case K_BACKEND: snprintf(buf, len, "auto, cpu or cuda"); break;
    case K_DEVICES: snprintf(buf, len, "all, or a comma list of device ordinals such as 0,1"); break;
    case K_LOGLEVEL: snprintf(buf, len, "error, warn, info or debug"); break;
    case K_BOOL: snprintf(buf, len, "true or false (or yes/no, on/off, 1/0; any case)"); break;
    case K_INSTANCE:
        snprintf(buf, len, "empty, or 1 to %d characters of A-Z a-z 0-9 . _ - starting and ending with a "
                 "letter or digit", GEMMD_INSTANCE_MAX);
        break;
    }
    return buf;
}

/* Strict decimal integer: optional sign, digits only. 0 (*overflow set when it does not
 * fit a long long), or -1. */
static int parse_ll(const char *s, long long *out, int *overflow)
{
    const char *p = s;
    int neg = 0;
    unsigned long long v = 0;
    *overflow = 0;
    if (*p == '-' || *p == '+') neg = (*p++ == '-');
    if (!isdigit((unsigned char)*p)) return -1;
    for (; *p; p++) {
        if (!isdigit((unsigned char)*p)) return -1; /* "99999999999999999999x" is still not an integer */
        unsigned d = (unsigned)(*p - '0');
        if (v > (9223372036854775807ull - d) / 10) *overflow = 1;
        else if (!*overflow) v = v * 10 + d;
    }
    *out = neg ? -(long long)v : (long long)v;
    return 0;
}

static int valid_devices(const char *v)
{
    if (strcmp(v, "all") == 0) return 1;
    for (const char *p = v;; p++) {
        int ndig = 0;
        for (; isdigit((unsigned char)*p); p++)
            if (++ndig > 3) return 0; /* ordinals are small */
        if (!ndig) return 0;
        if (*p == '\0') return 1;
        if (*p != ',') return 0;
    }
}

/* What is wrong with value for a key of kind k (NULL: nothing); why: room for a reason. */
static const char *check_value(const key_desc *k, const char *value, char *why, size_t whylen)
{
    unsigned char addr[16];
    static const char *const bools[] = {"true", "yes", "on", "1", "false", "no", "off", "0"};
    switch (k->kind) {
    case K_LISTEN:
        return inet_pton(AF_INET, value, addr) == 1 || inet_pton(AF_INET6, value, addr) == 1 ? NULL
                                                                                             : "is not an IP address";
    case K_BACKEND:
        return strcmp(value, "auto") && strcmp(value, "cpu") && strcmp(value, "cuda") ? "is not a backend" : NULL;
    case K_DEVICES: return valid_devices(value) ? NULL : "is not a device list";
    case K_LOGLEVEL: return gemmd_log_level_from_name(value) < 0 ? "is not a log level" : NULL;
    case K_INSTANCE: return value[0] && gemmd_instance_check(value, why, whylen) != 0 ? why : NULL;
    case K_BOOL:
        for (int i = 0; i < 8; i++)
            if (strcasecmp(value, bools[i]) == 0) return NULL;
        return "is not a boolean";
    default: return NULL;
    }
}

int gemmd_config_set(gemmd_config *c, const char *key, const char *value, char *msg, size_t msglen)
{
    char acc[160], why[96];
    const key_desc *k = find_key(key);
    if (!k || strchr(key, '-')) {
        size_t used = 0;
        int w = snprintf(msg, msglen, "unknown key '%s'; known keys: ", key);
        for (size_t i = 0; w >= 0 && i < nkeys() && (used += (size_t)w) < msglen; i++)
            w = snprintf(msg + used, msglen - used, "%s%s", i ? ", " : "", all_keys[i].name);
        return -1;
    }
    if (!value) value = "";
    void *field = (char *)c + k->offset;
    for (const unsigned char *p = (const unsigned char *)value; *p; p++)
        if (*p < 0x20 || *p == 0x7f)
            return say(msg, msglen, "%s: the value holds a control character (byte 0x%02x at %zu); accepted: %s",
                       k->name, *p, (size_t)(p - (const unsigned char *)value), kind_accepts(k, acc, sizeof acc));
    const char *bad = NULL;
    long long v = 0;
    int overflow = 0, number = k->kind == K_INT || k->kind == K_U64 || k->kind == K_MB_U64 || k->kind == K_MB_SIZE;
    if (number && value[0] == '\0')
        return say(msg, msglen, "%s: missing value; accepted: %s", k->name, kind_accepts(k, acc, sizeof acc));
    if (number && parse_ll(value, &v, &overflow) != 0) bad = "is not an integer";
    else if (number && overflow) bad = "overflows";
    else if (!number) bad = check_value(k, value, why, sizeof why);
    if (bad)
        return say(msg, msglen, "%s: '%.*s' %s; accepted: %s", k->name, k->kind == K_INSTANCE ? 70 : 60, value, bad,
                   kind_accepts(k, acc, sizeof acc));
    if (number && (v < k->min || v > k->max))
        return say(msg, msglen, "%s: %lld is out of range; accepted: %s", k->name, v, kind_accepts(k, acc, sizeof acc));
    switch (k->kind) {
    case K_INT: *(int *)field = (int)v; return 0;
    case K_U64: *(uint64_t *)field = (uint64_t)v; return 0;
    case K_MB_U64: *(uint64_t *)field = (uint64_t)v * MB; return 0;
    case K_MB_SIZE: *(size_t *)field = (size_t)((uint64_t)v * MB); return 0;
    case K_BOOL: *(int *)field = strchr("tTyY1", value[0]) || strcasecmp(value, "on") == 0; return 0;
    default: break;
    }
    size_t n = strlen(value);
    if (n >= k->size)
        return say(msg, msglen, "%s: value is %zu bytes long; accepted: %s", k->name, n,
                   kind_accepts(k, acc, sizeof acc));
    memcpy(field, value, n + 1);
    return 0;
}

/* ---------------------------------------------------------------- the file */

static char *trim(char *s)
{
    while (isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
    return s;
}

/* Parses the value part in place: "quoted", 'quoted', or bare up to a " #" comment.
 * Returns the value or NULL with *why set. */
static char *parse_value(char *v, const char **why)
{
    v = trim(v);
    if (*v == '"' || *v == '\'') {
        char q = *v;
        char *end = strchr(v + 1, q);
        if (!end) {
            *why = "unterminated quote";
            return NULL;
        }
        *end = '\0';
        char *rest = trim(end + 1);
        if (*rest && *rest != '#') {
            *why = "text after the closing quote";
            return NULL;
        }
        return v + 1;
    }
    for (char *p = v; *p; p++) {
        if (*p == '#' && (p == v || isspace((unsigned char)p[-1]))) {
            *p = '\0';
            break;
        }
    }
    return trim(v);
}

/* One line of a file (0 when it is blank or a comment); -1 with what is wrong in why. */
static int file_line(gemmd_config *c, char *line, ssize_t got, char *why, size_t whylen)
{
    if (got > 2046) return say(why, whylen, "line longer than 2046 bytes");
    if (memchr(line, '\0', (size_t)got)) /* it would end the value there, silently */
        return say(why, whylen, "the line holds a NUL byte");
    char *s = trim(line);
    if (*s == '\0' || *s == '#' || *s == ';') return 0;
    char *eq = strchr(s, '=');
    if (!eq) return say(why, whylen, "expected 'key = value', got '%.80s'", s);
    *eq = '\0';
    char *key = trim(s);
    const char *bad = NULL;
    char *value = parse_value(eq + 1, &bad);
    if (*key == '\0') return say(why, whylen, "missing key before '='");
    if (!value) return say(why, whylen, "%s: %s", key, bad);
    return gemmd_config_set(c, key, value, why, whylen);
}

int gemmd_config_load_file(gemmd_config *c, const char *path, char *msg, size_t msglen)
{
    FILE *f = fopen(path, "r");
    if (!f) return say(msg, msglen, "%s: cannot open: %s", path, strerror(errno));
    char *line = NULL, why[512];
    size_t cap = 0;
    ssize_t got;
    int lineno = 0, rc = 0;
    while (rc == 0 && (got = getline(&line, &cap, f)) >= 0)
        if ((rc = file_line(c, line, got, why, sizeof why)) != 0)
            snprintf(msg, msglen, "%s:%d: %s", path, lineno + 1, why);
        else
            lineno++;
    if (rc == 0 && ferror(f)) rc = say(msg, msglen, "%s: read error", path);
    free(line);
    fclose(f);
    if (rc == 0) snprintf(c->config_path, sizeof c->config_path, "%s", path);
    return rc;
}

/* ---------------------------------------------------------------- environment */

/* "GEMMD_MAX_BODY_MB" for "max_body_mb". */
static void env_name(const char *key, char *out, size_t len)
{
    size_t i = (size_t)snprintf(out, len, "GEMMD_");
    for (; *key && i + 1 < len; key++) out[i++] = (char)toupper((unsigned char)*key);
    out[i] = '\0';
}

static const char *env_lookup(char **envp, const char *name)
{
    size_t n = strlen(name);
    for (char **e = envp; e && *e; e++)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=') return *e + n + 1;
    return NULL;
}

int gemmd_config_load_env(gemmd_config *c, char **envp, char *msg, size_t msglen)
{
    for (size_t i = 0; i < nkeys(); i++) {
        char name[64], m[512];
        env_name(all_keys[i].name, name, sizeof name);
        const char *v = env_lookup(envp, name);
        if (v && gemmd_config_set(c, all_keys[i].name, v, m, sizeof m) != 0) {
            return say(msg, msglen, "environment variable %s: %s", name, m);
        }
    }
    return 0;
}

void gemmd_config_resolve_instance(gemmd_config *c)
{
    if (!c->instance_id[0]) gemmd_instance_default(c->instance_id, sizeof c->instance_id, c->port);
}

int gemmd_config_http_threads(const gemmd_config *c)
{
    if (c->http_threads > 0) return c->http_threads;
    /* The HTTP threads carry most of a small product's CPU time (receiving, answering). */
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    long t = cpus > 0 ? cpus / 2 : 4;
    return t < 4 ? 4 : t > 16 ? 16 : (int)t;
}

void gemmd_config_warn_idle(const gemmd_config *c, gemm_engine *e)
{
    gemmd_config d;
    gemmd_config_defaults(&d);
    gemm_engine_info info;
    gemm_engine_describe(e, &info);
    for (size_t i = 0; i < nkeys(); i++) {
        const key_desc *k = &all_keys[i];
        const char *v = (const char *)c + k->offset, *dv = (const char *)&d + k->offset;
        int is_str = k->kind == K_STR || k->kind == K_BACKEND || k->kind == K_DEVICES;
        size_t size = k->kind == K_INT || k->kind == K_BOOL ? sizeof(int) : sizeof(uint64_t);
        if (!owners[i] || gemm_engine_key_applies(e, owners[i]) || (is_str ? strcmp(v, dv) == 0 : memcmp(v, dv, size) == 0))
            continue;
        LOG_WARN("%s is set but does nothing on the %s backend (a key of the %s section); ignored", k->name,
                 info.backend, owners[i]);
    }
}

/* Each value's range and form were checked by gemmd_config_set, the only way in. */
int gemmd_config_validate(const gemmd_config *c, char *msg, size_t msglen)
{
    if (c->per_ip_limit > c->connection_limit)
        return say(msg, msglen, "per_ip_limit (%d) is larger than connection_limit (%d)", c->per_ip_limit,
                   c->connection_limit);
    if (c->tls_cert[0] && !c->tls_priorities[0])
        return say(msg, msglen, "tls_priorities: must not be empty when serving HTTPS (default: %s)",
                   GEMMD_TLS_PRIORITIES_DEFAULT);
    if ((c->tls_cert[0] != '\0') != (c->tls_key[0] != '\0'))
        return say(msg, msglen, "tls_cert and tls_key must be set together (got only %s)",
                   c->tls_cert[0] ? "tls_cert" : "tls_key");
    const char *files[3] = {c->tokens_file, c->tls_cert, c->tls_key};
    const char *names[3] = {"tokens_file", "tls_cert", "tls_key"};
    for (int i = 0; i < 3; i++) {
        struct stat st;
        if (files[i][0] && (access(files[i], R_OK) != 0 || stat(files[i], &st) != 0))
            return say(msg, msglen, "%s: cannot read '%s': %s", names[i], files[i], strerror(errno));
        if (files[i][0] && S_ISDIR(st.st_mode))
            return say(msg, msglen, "%s: '%s' is a directory, not a file", names[i], files[i]);
    }
    return 0;
}

/* ---------------------------------------------------------------- the command line */

void gemmd_config_usage(FILE *out)
{
    gemmd_config d;
    gemmd_config_defaults(&d);
    fprintf(out,
            "usage: gemmd [--config FILE] [--KEY VALUE | --KEY=VALUE]...\n"
            "\n"
            "gemmd serves matrix products C = A.B over HTTP (GPU when present, else CPU).\n"
            "Settings come from built-in defaults, then the config file (--config FILE, else\n"
            "$GEMMD_CONFIG, else config/gemmd.conf when it exists), then GEMMD_<KEY>\n"
            "environment variables, then flags; later wins.\n"
            "\n"
            "  --config FILE                 read FILE (key = value lines)\n"
            "  -h, --help                    print this help and exit\n"
            "  -V, --version                 print the version and exit\n"
            "\n");
    for (size_t i = 0; i < nkeys(); i++) {
        const key_desc *k = &all_keys[i];
        const void *f = (const char *)&d + k->offset;
        char lhs[96], env[64], def[300];
        int n = snprintf(lhs, sizeof lhs, "--%s VALUE", k->name);
        for (int j = 2; j < n - 6; j++) lhs[j] = lhs[j] == '_' ? '-' : lhs[j];
        env_name(k->name, env, sizeof env);
        switch (k->kind) {
        case K_INT: snprintf(def, sizeof def, "%d", *(const int *)f); break;
        case K_U64: snprintf(def, sizeof def, "%llu", (unsigned long long)*(const uint64_t *)f); break;
        case K_MB_U64: snprintf(def, sizeof def, "%llu", (unsigned long long)(*(const uint64_t *)f / MB)); break;
        case K_MB_SIZE: snprintf(def, sizeof def, "%llu", (unsigned long long)(*(const size_t *)f / MB)); break;
        case K_BOOL: snprintf(def, sizeof def, "%s", *(const int *)f ? "true" : "false"); break;
        default: snprintf(def, sizeof def, "%s", *(const char *)f ? (const char *)f : "(empty)");
        }
        fprintf(out, "  %-29s %s\n  %-29s (env %s, default %s)\n", lhs, k->help, "", env, def);
    }
}

/* The flags are read twice: for --config first (the file comes before the environment),
 * then for the others. */
int gemmd_config_from_args(gemmd_config *c, int argc, char **argv, char **envp)
{
    char msg[1024];
    const char *path = NULL;
    int explicit = 0;
    gemmd_config_defaults(c);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            gemmd_config_usage(stdout);
            return 1;
        }
        if (strcmp(argv[i], "--version") == 0 || strcmp(argv[i], "-V") == 0) {
            printf("gemmd %s\n", GEMMD_VERSION);
            return 1;
        }
    }
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) { /* no --config: $GEMMD_CONFIG, else config/gemmd.conf when it exists */
            const char *e = explicit ? NULL : env_lookup(envp, "GEMMD_CONFIG");
            if (e && *e) path = e;
            else if (!explicit && access("config/gemmd.conf", F_OK) == 0) path = "config/gemmd.conf";
            if ((path && gemmd_config_load_file(c, path, msg, sizeof msg) != 0) ||
                gemmd_config_load_env(c, envp, msg, sizeof msg) != 0) {
                fprintf(stderr, "gemmd: %s\n", msg);
                return -1;
            }
        }
        for (int i = 1; i < argc; i++) {
            const char *a = argv[i];
            if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
                fprintf(stderr, "gemmd: unexpected argument '%s' (options are --key value; see --help)\n", a);
                return -1;
            }
            char name[96];
            const char *eq = strchr(a + 2, '='), *value = eq ? eq + 1 : NULL;
            snprintf(name, sizeof name, "%.*s", (int)(eq ? (size_t)(eq - (a + 2)) : strlen(a + 2)), a + 2);
            if (!eq && (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0)) {
                fprintf(stderr, "gemmd: --%s: missing value (see --help)\n", name);
                return -1;
            }
            if (!eq) value = argv[++i];
            if (pass == 0 && strcmp(name, "config") == 0) {
                if (!*value) {
                    fprintf(stderr, "gemmd: --config: empty path\n");
                    return -1;
                }
                path = value;
                explicit = 1;
            }
            if (pass == 0 || strcmp(name, "config") == 0) continue;
            const key_desc *k = find_key(name);
            if (!k) {
                fprintf(stderr, "gemmd: unknown option --%s (see --help for the list)\n", name);
                return -1;
            }
            if (gemmd_config_set(c, k->name, value, msg, sizeof msg) != 0) {
                fprintf(stderr, "gemmd: --%s: %s\n", name, msg);
                return -1;
            }
        }
    }
    if (gemmd_config_validate(c, msg, sizeof msg) == 0) return 0;
    fprintf(stderr, "gemmd: %s\n", msg);
    return -1;
}
