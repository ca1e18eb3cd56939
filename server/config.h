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

typedef struct {               /* the keys of config.c's table, by the same names */
    char listen[64];            /* address to bind (127.0.0.1) */
    int port;
    int http_threads;           /* 0: half the CPUs, 4 to 16 (gemmd_config_http_threads) */
    int direct_run;             /* an HTTP thread runs a small product itself */
    int connection_limit;
    int per_ip_limit;
    int connection_memory_kb;   /* libmicrohttpd's buffer per connection */
    int connection_timeout_s;   /* seconds idle */
    int header_timeout_s;
    int request_timeout_s;
    int min_rate_kb;            /* KiB/s a body must keep up (0 = off) */
    int send_timeout_s;
    uint64_t max_inflight_bytes;/* max_inflight_mb (0 = half of the host's or cgroup's memory) */
    gemm_engine_config engine;  /* the engine's sections (backend, workers, devices, ...) */
    gemm_limits limits;         /* max_dim, max_elements, max_body_mb */
    uint64_t max_json_bytes;
    int job_ttl_s;              /* finished async jobs are kept this long */
    uint64_t job_mem_bytes;
    int max_jobs;
    uint64_t resident_bytes;
    int max_matrices;
    char tokens_file[256];      /* empty: no auth */
    char tls_cert[256];         /* tls_cert and tls_key set: HTTPS */
    char tls_key[256];
    char tls_priorities[256];   /* GnuTLS priority string */
    int admit_wait_s;
    int token_share;            /* percent of what is kept one client may hold */
    int shutdown_timeout_s;
    char log_level[8];
    char config_path[256];      /* the file that was read ("" if none) */
    int restart_on_device_loss;
    char instance_id[64];       /* empty: "<short host name>-<port>" (instance.h) */
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

/* Checks the values fit together (connection limits, the TLS pair, the files named). */
int gemmd_config_validate(const gemmd_config *c, char *msg, size_t msglen);
/* The HTTP threads to run: http_threads, or for 0 half the CPUs online, at least 4, at
 * most 16. */
int gemmd_config_http_threads(const gemmd_config *c);
#endif
