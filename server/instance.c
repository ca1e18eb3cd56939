/*
 * instance.c - instance_id and the ids that carry it (see instance.h for the scheme).
 *
 * The name is set once at start-up, before the HTTP threads exist, and only read after
 * that, so it needs no lock.
 */
#include "instance.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

static char instance[GEMMD_INSTANCE_MAX + 1];

/* The daemon never leaves the C locale: isalnum is A-Z a-z 0-9. */
static int is_alnum(char c) { return isalnum((unsigned char)c); }

static int is_name_char(char c) { return is_alnum(c) || c == '-' || c == '_' || c == '.'; }

/* 0 when s[0..n) is a valid instance_id, else -1 with why (when not NULL) set. */
static int check_name(const char *s, size_t n, char *why, size_t whylen)
{
    size_t i = 0;
    while (i < n && is_name_char(s[i])) i++;
    const char *bad = n == 0 ? "is empty" : n > GEMMD_INSTANCE_MAX ? "is %zu characters long (at most %d)"
                      : i < n ? "has a character other than A-Z a-z 0-9 . _ - at position %zu"
                      : !is_alnum(s[0]) || !is_alnum(s[n - 1]) ? "must start and end with a letter or a digit"
                                                               : NULL;
    if (bad && why) snprintf(why, whylen, bad, n > GEMMD_INSTANCE_MAX ? n : i + 1, GEMMD_INSTANCE_MAX);
    return bad ? -1 : 0;
}

int gemmd_instance_check(const char *name, char *why, size_t whylen)
{
    return check_name(name, name ? strlen(name) : 0, why, whylen);
}

void gemmd_instance_from_host(char *out, size_t cap, const char *host, int port)
{
    char suffix[16];
    snprintf(suffix, sizeof suffix, "-%d", port);
    size_t room = GEMMD_INSTANCE_MAX - strlen(suffix);
    char name[GEMMD_INSTANCE_MAX + 1];
    size_t n = 0;
    for (const char *p = host ? host : ""; *p && *p != '.' && n < room; p++) {
        char c = *p;
        if (c >= 'A' && c <= 'Z') c = (char)(c - 'A' + 'a');
        name[n++] = is_name_char(c) ? c : '-';
    }
    while (n > 0 && !is_alnum(name[n - 1])) n--; /* it must end with a letter or digit */
    size_t start = 0;
    while (start < n && !is_alnum(name[start])) start++;
    if (start == n) snprintf(out, cap, "gemmd%s", suffix);
    else snprintf(out, cap, "%.*s%s", (int)(n - start), name + start, suffix);
}

void gemmd_instance_default(char *out, size_t cap, int port)
{
    char host[256];
    if (gethostname(host, sizeof host) != 0) host[0] = '\0';
    host[sizeof host - 1] = '\0';
    gemmd_instance_from_host(out, cap, host, port);
}

int gemmd_instance_set(const char *name)
{
    if (name && name[0] && check_name(name, strlen(name), NULL, 0) != 0) return -1;
    snprintf(instance, sizeof instance, "%s", name ? name : "");
    return 0;
}

const char *gemmd_instance_get(void)
{
    return instance;
}

int gemmd_instance_new_id(char *out, size_t cap)
{
    size_t plen = strlen(instance);
    size_t need = (plen ? plen + 1 : 0) + GEMMD_ID_RANDOM_HEX + 1;
    if (cap < need) {
        errno = ERANGE;
        return -1;
    }
    unsigned char raw[GEMMD_ID_RANDOM_HEX / 2];
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
        if (n < 0 && errno != EINTR) return -1;
        if (n > 0) got += (size_t)n;
    }
    char *w = out;
    if (plen) {
        memcpy(w, instance, plen);
        w[plen] = '-';
        w += plen + 1;
    }
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof raw; i++) {
        w[2 * i] = hex[raw[i] >> 4];
        w[2 * i + 1] = hex[raw[i] & 15];
    }
    w[GEMMD_ID_RANDOM_HEX] = '\0';
    return 0;
}

int gemmd_instance_id_valid(const char *s, size_t n)
{
    if (n < GEMMD_ID_RANDOM_HEX || n > GEMMD_ID_MAX) return 0;
    const char *r = s + n - GEMMD_ID_RANDOM_HEX;
    for (size_t i = 0; i < GEMMD_ID_RANDOM_HEX; i++)
        if (!isxdigit((unsigned char)r[i])) return 0;
    if (n == GEMMD_ID_RANDOM_HEX) return 1;
    return n >= GEMMD_ID_RANDOM_HEX + 2 && r[-1] == '-' && check_name(s, n - GEMMD_ID_RANDOM_HEX - 1, NULL, 0) == 0;
}

/* Ids are capabilities: compared in full, whatever byte differs. Their lengths differ only
 * by the instance_id in front, which is no secret. */
int gemmd_instance_id_same(const char *a, const char *b)
{
    size_t n = strnlen(a, GEMMD_ID_MAX + 1);
    if (strnlen(b, GEMMD_ID_MAX + 1) != n) return 0;
    unsigned char diff = 0;
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)(a[i] ^ b[i]);
    return diff == 0;
}

int gemmd_instance_id_log_len(const char *id, int hex_digits)
{
    size_t n = strnlen(id, GEMMD_ID_MAX + 1);
    size_t keep = hex_digits < 0 ? 0 : (size_t)hex_digits;
    if (keep > GEMMD_ID_RANDOM_HEX) keep = GEMMD_ID_RANDOM_HEX;
    if (gemmd_instance_id_valid(id, n)) return (int)(n - GEMMD_ID_RANDOM_HEX + keep);
    return (int)(n < keep ? n : keep);
}
