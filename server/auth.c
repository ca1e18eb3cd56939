/*
 * auth.c - bearer tokens from a file, checked in constant time.
 */
#include "auth.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define GEMMD_TOKEN_MAX 256

struct gemmd_auth {
    int n;
    char (*tokens)[GEMMD_TOKEN_MAX + 1];
};

gemmd_auth *gemmd_auth_load(const char *path, char *msg, size_t msglen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(msg, msglen, "tokens_file %s: %s", path, strerror(errno));
        return NULL;
    }
    gemmd_auth *a = calloc(1, sizeof *a);
    int cap = 0, lineno = 0;
    char line[1024];
    while (a && fgets(line, sizeof line, f)) {
        lineno++;
        char *s = line;
        while (*s == ' ' || *s == '\t') s++;
        size_t len = strlen(s);
        while (len && (s[len - 1] == '\n' || s[len - 1] == '\r' || s[len - 1] == ' ' || s[len - 1] == '\t'))
            s[--len] = '\0';
        if (len == 0 || s[0] == '#') continue;
        if (len > GEMMD_TOKEN_MAX) {
            snprintf(msg, msglen, "tokens_file %s line %d: token longer than %d bytes", path, lineno,
                     GEMMD_TOKEN_MAX);
            gemmd_auth_free(a);
            a = NULL;
            break;
        }
        if (a->n == cap) {
            int ncap = cap ? cap * 2 : 8;
            void *p = realloc(a->tokens, (size_t)ncap * sizeof *a->tokens);
            if (!p) {
                snprintf(msg, msglen, "out of memory reading %s", path);
                gemmd_auth_free(a);
                a = NULL;
                break;
            }
            a->tokens = p;
            cap = ncap;
        }
        memset(a->tokens[a->n], 0, sizeof a->tokens[a->n]);
        memcpy(a->tokens[a->n], s, len);
        int dup = 0;
        for (int i = 0; i < a->n; i++) dup |= memcmp(a->tokens[i], a->tokens[a->n], sizeof a->tokens[i]) == 0;
        if (!dup) a->n++; /* one identity per distinct token */
    }
    fclose(f);
    if (a && a->n == 0) {
        snprintf(msg, msglen, "tokens_file %s holds no token (one a line)", path);
        gemmd_auth_free(a);
        a = NULL;
    }
    return a;
}

/* Compares the whole fixed-size slot so the time does not depend on where they differ. */
static int same(const char *tok, const char *slot)
{
    char given[GEMMD_TOKEN_MAX + 1];
    memset(given, 0, sizeof given);
    size_t len = strnlen(tok, GEMMD_TOKEN_MAX + 1);
    if (len > GEMMD_TOKEN_MAX) return 0;
    memcpy(given, tok, len);
    unsigned char diff = 0;
    for (size_t i = 0; i < sizeof given; i++) diff |= (unsigned char)(given[i] ^ slot[i]);
    return diff == 0;
}

int gemmd_auth_identify(const gemmd_auth *a, const char *authorization)
{
    if (!a || !authorization) return -1;
    while (*authorization == ' ') authorization++;
    if (strncasecmp(authorization, "Bearer ", 7) != 0) return -1;
    const char *tok = authorization + 7;
    while (*tok == ' ') tok++;
    if (!*tok) return -1;
    int found = -1;
    for (int i = 0; i < a->n; i++) {
        int m = same(tok, a->tokens[i]);
        found = m ? i : found; /* tokens are distinct: at most one matches */
    }
    return found;
}

int gemmd_auth_check(const gemmd_auth *a, const char *authorization)
{
    if (!a) return 1;
    return gemmd_auth_identify(a, authorization) >= 0;
}

int gemmd_auth_count(const gemmd_auth *a) { return a ? a->n : 0; }

void gemmd_auth_free(gemmd_auth *a)
{
    if (!a) return;
    free(a->tokens);
    free(a);
}
