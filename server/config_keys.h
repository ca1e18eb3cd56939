/*
 * config_keys.h - the table of configuration keys, shared by the readers in config.c
 * (file, environment) and the command line in config_args.c. Private to the daemon.
 */
#ifndef GEMMD_CONFIG_KEYS_H
#define GEMMD_CONFIG_KEYS_H

#include <stddef.h>

#include "config.h"

#define GEMMD_MB (1024ull * 1024ull)

typedef enum {
    K_INT,      /* int field, range [min, max] */
    K_U64,      /* uint64_t field, range [min, max] */
    K_MB_U64,   /* value in MiB, uint64_t field in bytes */
    K_MB_SIZE,  /* value in MiB, size_t field in bytes */
    K_STR,      /* free string (a path); may be empty */
    K_LISTEN,   /* an IPv4 or IPv6 address */
    K_BACKEND,  /* auto | cpu | cuda */
    K_DEVICES,  /* all | comma list of ordinals */
    K_LOGLEVEL, /* error | warn | info | debug */
    K_BOOL,     /* true | false (also yes/no, on/off, 1/0); int field */
    K_INSTANCE  /* an instance_id (instance.h), or empty */
} key_kind;

typedef struct {
    const char *name;
    key_kind kind;
    size_t offset; /* into gemmd_config */
    size_t size;   /* K_STR-like kinds: the buffer size */
    long long min, max;
    const char *help;
} key_desc;

/* Every key: the daemon's, then the engine's sections. */
size_t gemmd_config_nkeys(void);
const key_desc *gemmd_config_key(size_t i);

/* The key called name (file spelling, e.g. "max_body_mb"); NULL if unknown. */
const key_desc *gemmd_config_find_key(const char *name);
/* "GEMMD_MAX_BODY_MB" for "max_body_mb". */
void gemmd_config_env_name(const char *key, char *out, size_t len);
/* The value of variable name in envp; NULL if unset. */
const char *gemmd_config_env_lookup(char **envp, const char *name);

#endif
