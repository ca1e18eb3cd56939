/*
 * auth.c - bearer tokens from a file, checked in constant time, each with a name.
 */
#include "auth.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define GEMMD_TOKEN_MAX 256

typedef struct {
    char token[GEMMD_TOKEN_MAX + 1]; /* zero-padded: compared whole */
    char name[GEMMD_TOKEN_NAME_MAX + 1];
} entry;

struct gemmd_auth {
    int n;
    entry *e;
};

static int valid_name(const char *s, size_t len)
{
    if (len == 0 || len > GEMMD_TOKEN_NAME_MAX) return 0;
    for (size_t i = 0; i < len; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("_.-", s[i])) return 0;
    return 1;
}

/* One line: "token" or "name token", trimmed. 0 (added, or a token already listed), or
 * -1 with msg set. */
static int add_line(gemmd_auth *a, char *s, const char *where, char *msg, size_t msglen)
{
    size_t nlen = strcspn(s, " \t");
    char *tok = s + nlen;
    tok += strspn(tok, " \t");
    if (!*tok) { /* no name: the whole line is the token */
        tok = s;
        nlen = 0;
    } else if (tok[strcspn(tok, " \t")]) {
        snprintf(msg, msglen, "%s: expected \"token\" or \"name token\", found more words", where);
        return -1;
    } else if (!valid_name(s, nlen)) {
        snprintf(msg, msglen, "%s: a token's name is 1 to %d of A-Z a-z 0-9 _ . -", where, GEMMD_TOKEN_NAME_MAX);
        return -1;
    }
    size_t len = strlen(tok);
    if (len > GEMMD_TOKEN_MAX) {
        snprintf(msg, msglen, "%s: token longer than %d bytes", where, GEMMD_TOKEN_MAX);
        return -1;
    }
    void *p = realloc(a->e, (size_t)(a->n + 1) * sizeof *a->e); /* a few lines: one at a time */
    if (!p) {
        snprintf(msg, msglen, "%s: out of memory", where);
        return -1;
    }
    a->e = p;
    entry *e = &a->e[a->n];
    memset(e, 0, sizeof *e);
    memcpy(e->token, tok, len);
    if (nlen) memcpy(e->name, s, nlen);
    else snprintf(e->name, sizeof e->name, "token%d", a->n + 1);
    for (int i = 0; i < a->n; i++)
        if (memcmp(a->e[i].token, e->token, sizeof e->token) == 0) return 0; /* one identity per token */
    int taken = strcmp(e->name, "anonymous") == 0 || strcmp(e->name, "other") == 0;
    for (int i = 0; i < a->n; i++) taken |= strcmp(a->e[i].name, e->name) == 0;
    if (taken) {
        snprintf(msg, msglen, "%s: the name %s is taken (by an earlier line, or kept for anonymous and other)",
                 where, e->name);
        return -1;
    }
    a->n++;
    return 0;
}

gemmd_auth *gemmd_auth_load(const char *path, char *msg, size_t msglen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(msg, msglen, "tokens_file %s: %s", path, strerror(errno));
        return NULL;
    }
    gemmd_auth *a = calloc(1, sizeof *a);
    int lineno = 0;
    char line[1024], where[300];
    while (a && fgets(line, sizeof line, f)) {
        lineno++;
        char *s = line;
        while (*s == ' ' || *s == '\t') s++;
        size_t len = strlen(s);
        while (len && strchr(" \t\r\n", s[len - 1])) s[--len] = '\0';
        if (len == 0 || s[0] == '#') continue;
        snprintf(where, sizeof where, "tokens_file %s line %d", path, lineno);
        if (add_line(a, s, where, msg, msglen) != 0) {
            gemmd_auth_free(a);
            a = NULL;
        }
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
    char given[GEMMD_TOKEN_MAX + 1] = {0};
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
        int m = same(tok, a->e[i].token);
        found = m ? i : found; /* tokens are distinct: at most one matches */
    }
    return found;
}

const char *gemmd_auth_name(const gemmd_auth *a, int i)
{
    return a && i >= 0 && i < a->n ? a->e[i].name : NULL;
}

void gemmd_auth_free(gemmd_auth *a)
{
    if (!a) return;
    free(a->e);
    free(a);
}
