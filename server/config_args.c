/*
 * config_args.c - the command line: --help from the key table, --config, and --key value /
 * --key=value for every key of the table (dashes or underscores), applied last.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "config_keys.h"

#define MB GEMMD_MB

static void default_text(const gemmd_config *d, const key_desc *k, char *buf, size_t len)
{
    const void *field = (const char *)d + k->offset;
    switch (k->kind) {
    case K_INT: snprintf(buf, len, "%d", *(const int *)field); break;
    case K_U64: snprintf(buf, len, "%llu", (unsigned long long)*(const uint64_t *)field); break;
    case K_MB_U64: snprintf(buf, len, "%llu", (unsigned long long)(*(const uint64_t *)field / MB)); break;
    case K_MB_SIZE: snprintf(buf, len, "%llu", (unsigned long long)(*(const size_t *)field / MB)); break;
    case K_BOOL: snprintf(buf, len, "%s", *(const int *)field ? "true" : "false"); break;
    default: {
        const char *s = (const char *)field;
        snprintf(buf, len, "%s", *s ? s : "(empty)");
    }
    }
}

static void flag_name(const char *key, char *out, size_t len)
{
    size_t i = 0;
    for (; *key && i + 1 < len; key++) out[i++] = *key == '_' ? '-' : *key;
    out[i] = '\0';
}

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
    for (size_t i = 0; i < gemmd_config_nkeys(); i++) {
        const key_desc *k = gemmd_config_key(i);
        char flag[64], env[64], def[300], lhs[96];
        flag_name(k->name, flag, sizeof flag);
        gemmd_config_env_name(k->name, env, sizeof env);
        default_text(&d, k, def, sizeof def);
        snprintf(lhs, sizeof lhs, "--%s VALUE", flag);
        fprintf(out, "  %-29s %s\n  %-29s (env %s, default %s)\n", lhs, k->help, "", env, def);
    }
}

/* Maps "--max-body-mb" (or "--max_body_mb") to its key; NULL if unknown. */
static const key_desc *flag_key(const char *flag)
{
    char name[64];
    size_t i = 0;
    for (const char *p = flag; *p && i + 1 < sizeof name; p++) name[i++] = *p == '-' ? '_' : *p;
    name[i] = '\0';
    return gemmd_config_find_key(name);
}

static int is_flag(const char *a, const char *name)
{
    return strcmp(a, name) == 0;
}

int gemmd_config_from_args(gemmd_config *c, int argc, char **argv, char **envp)
{
    char msg[1024];
    const char *config_path = NULL;
    int config_explicit = 0;

    gemmd_config_defaults(c);

    /* First pass: --help, --version, --config, and shape errors in the flags. */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (is_flag(a, "--help") || is_flag(a, "-h")) {
            gemmd_config_usage(stdout);
            return 1;
        }
        if (is_flag(a, "--version") || is_flag(a, "-V")) {
            printf("gemmd %s\n", GEMMD_VERSION);
            return 1;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--config=", 9) == 0) {
            config_path = a + 9;
            config_explicit = 1;
        } else if (is_flag(a, "--config")) {
            if (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0) {
                fprintf(stderr, "gemmd: --config: missing value (a config file path)\n");
                return -1;
            }
            config_path = argv[++i];
            config_explicit = 1;
        }
    }
    if (!config_path) {
        const char *e = gemmd_config_env_lookup(envp, "GEMMD_CONFIG");
        if (e && *e) {
            config_path = e;
            config_explicit = 1;
        } else if (access("config/gemmd.conf", F_OK) == 0) {
            config_path = "config/gemmd.conf";
        }
    }
    if (config_path && *config_path) {
        if (gemmd_config_load_file(c, config_path, msg, sizeof msg) != 0) {
            fprintf(stderr, "gemmd: %s\n", msg);
            return -1;
        }
    } else if (config_explicit) {
        fprintf(stderr, "gemmd: --config: empty path\n");
        return -1;
    }

    if (gemmd_config_load_env(c, envp, msg, sizeof msg) != 0) {
        fprintf(stderr, "gemmd: %s\n", msg);
        return -1;
    }

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
            fprintf(stderr, "gemmd: unexpected argument '%s' (options are --key value; see --help)\n", a);
            return -1;
        }
        char name[96];
        const char *value = NULL;
        const char *eq = strchr(a + 2, '=');
        size_t nlen = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
        if (nlen >= sizeof name) nlen = sizeof name - 1;
        memcpy(name, a + 2, nlen);
        name[nlen] = '\0';
        if (eq) {
            value = eq + 1;
        } else {
            if (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0) {
                fprintf(stderr, "gemmd: --%s: missing value (see --help)\n", name);
                return -1;
            }
            value = argv[++i];
        }
        if (strcmp(name, "config") == 0) continue; /* read above */
        const key_desc *k = flag_key(name);
        if (!k) {
            fprintf(stderr, "gemmd: unknown option --%s (see --help for the list)\n", name);
            return -1;
        }
        char m[512];
        if (gemmd_config_set(c, k->name, value, m, sizeof m) != 0) {
            fprintf(stderr, "gemmd: --%s: %s\n", name, m);
            return -1;
        }
    }

    if (gemmd_config_validate(c, msg, sizeof msg) != 0) {
        fprintf(stderr, "gemmd: %s\n", msg);
        return -1;
    }
    return 0;
}
