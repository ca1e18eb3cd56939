/*
 * config.h - daemon configuration: defaults, then config/gemmd.conf (key = value),
 * then GEMMD_* environment variables, then command-line flags; later wins.
 */
#ifndef GEMMD_CONFIG_H
#define GEMMD_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#include "engine.h"
#include "gemm_types.h"

#ifndef GEMMD_VERSION
#define GEMMD_VERSION "0.1.0" /* printed by --version, /v1/info and gemmd_build_info */
#endif

/* TLS 1.2 and 1.3 only; GnuTLS's NORMAL set of ciphers otherwise. */
#define GEMMD_TLS_PRIORITIES_DEFAULT "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2"

typedef struct {
    char listen[64];            /* listen = 127.0.0.1 (address to bind) */
    int port;                   /* port = 8080 */
    int http_threads;           /* http_threads = 0: half the CPUs, 4 to 16 (libmicrohttpd thread pool) */
    int direct_run;             /* direct_run = true: an HTTP thread runs a small product itself
                                   (on an idle worker's stream) while the engine is nearly idle */
    int connection_limit;       /* connection_limit = 256 */
    int per_ip_limit;           /* per_ip_limit = 64 */
    int connection_memory_kb;   /* connection_memory_kb = 64: libmicrohttpd's buffer per
                                   connection (request head, reads, writes) */
    int connection_timeout_s;   /* connection_timeout = 60 (seconds idle) */
    int header_timeout_s;       /* header_timeout = 10: a request head must arrive within */
    int request_timeout_s;      /* request_timeout = 600: head and body must arrive within */
    int min_rate_kb;            /* min_rate_kb = 64: KiB/s a body must keep up (0 = off) */
    int send_timeout_s;         /* send_timeout = 30: an answer must start being taken within */
    uint64_t max_inflight_bytes;/* max_inflight_mb = 0: memory budget of requests in flight
                                   (0 = half of the host's or the cgroup's memory) */
    gemm_engine_config engine;  /* backend, threads, cpu_workers, queue_depth, devices,
                                   streams_per_device, device_mem_limit, fault_inject */
    gemm_limits limits;         /* max_dim, max_elements, max_body_mb */
    uint64_t max_json_bytes;    /* max_json_mb = 64: JSON bodies are parsed whole */
    int job_ttl_s;              /* job_ttl = 600: finished async jobs kept this long */
    uint64_t job_mem_bytes;     /* job_mem_mb = 2048: memory of all kept async jobs */
    int max_jobs;               /* max_jobs = 1024: async jobs kept at once */
    uint64_t resident_bytes;    /* resident_mb = 4096: memory of all resident matrices */
    int max_matrices;           /* max_matrices = 4096: resident matrices kept at once */
    char tokens_file[256];      /* tokens_file = (empty: no auth) one bearer token a line */
    char tls_cert[256];         /* tls_cert / tls_key: PEM files; both set -> HTTPS */
    char tls_key[256];
    char tls_priorities[256];   /* tls_priorities = NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2
                                   (GnuTLS priority string: TLS 1.2 and 1.3 only) */
    int admit_wait_s;           /* admit_wait = 30: how long a request may wait for memory */
    int token_share;            /* token_share = 50: percent of what is kept one client may hold */
    int shutdown_timeout_s;     /* shutdown_timeout = 600: how long running products may
                                   finish after SIGTERM before their clients get 503 */
    char log_level[8];          /* log_level = info (error|warn|info|debug) */
    char config_path[256];      /* the file that was read ("" if none) */
    int restart_on_device_loss; /* restart_on_device_loss = true: re-exec in place when the
                                   engine has lost every device */
    char instance_id[64];       /* instance_id = (empty: "<short host name>-<port>") the name
                                   job ids carry, see instance.h */
} gemmd_config;

void gemmd_config_defaults(gemmd_config *c);

/* Applies one key = value (the names of the config file; flags and GEMMD_* variables map
 * onto the same keys). Returns 0, or -1 with a message naming the key and what it accepts. */
int gemmd_config_set(gemmd_config *c, const char *key, const char *value, char *msg, size_t msglen);

/* Reads a config file. Unknown keys and bad values are errors naming file and line. */
int gemmd_config_load_file(gemmd_config *c, const char *path, char *msg, size_t msglen);

/* Applies GEMMD_<KEY> variables (GEMMD_PORT, GEMMD_MAX_DIM, ...). */
int gemmd_config_load_env(gemmd_config *c, char **envp, char *msg, size_t msglen);

/* Full start-up order: defaults, --config FILE (else GEMMD_CONFIG, else
 * config/gemmd.conf if it exists), environment, flags. Returns 0 to run, 1 when --help or
 * --version was printed (exit 0), -1 on error (message printed to stderr, exit 2). */
int gemmd_config_from_args(gemmd_config *c, int argc, char **argv, char **envp);

void gemmd_config_usage(FILE *out);

/* Fills instance_id when it is empty: "<short host name>-<port>" (instance.h). */
void gemmd_config_resolve_instance(gemmd_config *c);

/* Warns, once each, of an engine key set to other than its default that does nothing on the
 * backend e runs (streams_per_device on a CPU engine). */
void gemmd_config_warn_idle(const gemmd_config *c, gemm_engine *e);

/* Checks the values fit together (ports, limits, tls pair, token file readable). */
int gemmd_config_validate(const gemmd_config *c, char *msg, size_t msglen);
/* The HTTP threads to run: http_threads, or for 0 half the CPUs online, at least 4, at
 * most 16; resolve writes that into c (the log and /v1/info then show it). */
int gemmd_config_http_threads(const gemmd_config *c);
void gemmd_config_resolve_http_threads(gemmd_config *c);
#endif
