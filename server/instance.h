/*
 * instance.h - the name of this daemon among its peers (instance_id), and the ids it hands
 * out, "<instance_id>-<32 hex digits>" (docs/OPERATIONS.md, "Instances and ids").
 */
#ifndef GEMMD_INSTANCE_H
#define GEMMD_INSTANCE_H

#include <stddef.h>

#define GEMMD_INSTANCE_MAX 62   /* longest instance_id */
#define GEMMD_ID_RANDOM_HEX 32  /* the random part: 128 bits in hex */
#define GEMMD_ID_MAX (GEMMD_INSTANCE_MAX + 1 + GEMMD_ID_RANDOM_HEX) /* 95: longest id */

/* 0 when name is a valid instance_id, else -1 with why set ("... at position 3"). */
int gemmd_instance_check(const char *name, char *why, size_t whylen);

/* The instance_id a daemon takes when none is configured (the docs' rule), e.g.
 * "gpu01-8080"; "gemmd-8080" when the host name gives nothing. */
void gemmd_instance_default(char *out, size_t cap, int port);
/* The same from a given host name (for tests). */
void gemmd_instance_from_host(char *out, size_t cap, const char *host, int port);

/* Sets the process's instance_id (before any thread uses it; "" = none). Returns 0, or -1
 * when name is not valid (nothing changes). */
int gemmd_instance_set(const char *name);
/* The process's instance_id ("" when none was set). */
const char *gemmd_instance_get(void);

/* A fresh id into out[cap] (cap > GEMMD_ID_MAX is always enough). 0, or -1 (errno set)
 * when the random bytes cannot be drawn or cap is too small. */
int gemmd_instance_new_id(char *out, size_t cap);

/* Whether s[0..n) has the shape of an id (of any instance): [instance_id "-"] 32 hex. */
int gemmd_instance_id_valid(const char *s, size_t n);

/* Whether two ids are the same, in a time that does not depend on where they differ. */
int gemmd_instance_id_same(const char *a, const char *b);

/* How much of id a log line may show: its instance part (no secret) and the first hex
 * digits of its random part, at most hex_digits of them. */
int gemmd_instance_id_log_len(const char *id, int hex_digits);

#endif
