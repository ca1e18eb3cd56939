/*
 * auth.h - bearer tokens: one a line in tokens_file, "token" or "name token" (blank lines
 * and lines starting with # are skipped). Compared in constant time. A name (1 to
 * GEMMD_TOKEN_NAME_MAX of A-Z a-z 0-9 _ . -) is how the status page and /metrics show the
 * token's use; an unnamed token is "token<N>", N its place among the distinct tokens
 * (1-based). Names are unique; "anonymous" and "other" are kept for the status figures.
 */
#ifndef GEMMD_AUTH_H
#define GEMMD_AUTH_H

#include <stddef.h>

#define GEMMD_TOKEN_NAME_MAX 32

typedef struct gemmd_auth gemmd_auth;

/* Reads the tokens. NULL with msg set when the file cannot be read or holds none. */
gemmd_auth *gemmd_auth_load(const char *path, char *msg, size_t msglen);
/* Who is asking: the index (0, 1, ...) of the token the header carries, or -1 when it
 * carries none that is known. The same token listed twice has one index. Used as the
 * owner of async jobs, so that the token itself is never stored anywhere else. Every
 * token is compared, whichever matches, so the time does not say which one did. */
int gemmd_auth_identify(const gemmd_auth *a, const char *authorization);
/* The name of the token of index i (gemmd_auth_identify), or NULL. */
const char *gemmd_auth_name(const gemmd_auth *a, int i);
void gemmd_auth_free(gemmd_auth *a);

#endif
