/* multipart.c - streaming multipart/form-data parser (RFC 2046 framing, RFC 7578 parts).
 *
 * The body is scanned for the delimiter "\r\n--" boundary. Parsing starts as if a CRLF
 * preceded the body, so a body that opens with "--boundary" matches too. The delimiter
 * begins with the only CR it contains (boundaries hold no CR), so when a partial match
 * fails none of its bytes can begin another match: they are body bytes, and scanning
 * resumes at the byte that broke the match. A match cut by the end of a chunk is carried
 * over as a count. Part bodies go to the callbacks as they are scanned, never buffered. */
#include "multipart.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MP_MAX_BOUNDARY 70
#define MP_MAX_HEADERS 8192

enum {
    S_PREAMBLE,   /* before the first delimiter: ignored */
    S_AFTER_DELIM,/* right after a delimiter: "--", LWSP or CRLF */
    S_CLOSE_DASH, /* saw one '-' of "--" */
    S_LWSP,       /* transport padding before the CRLF */
    S_DELIM_CR,   /* saw CR, expect LF */
    S_HEADERS,    /* part header lines until an empty line */
    S_BODY,       /* part body */
    S_EPILOGUE,   /* after the close delimiter: ignored */
    S_FAILED
};

struct gemm_multipart {
    gemm_multipart_callbacks cb;
    void *user;
    char delim[4 + MP_MAX_BOUNDARY + 1]; /* "\r\n--" boundary */
    size_t dlen;
    size_t match; /* bytes of delim matched so far, carried across chunks */
    int state;
    int parts; /* begun so far; after the first, each delimiter ends one */
    char hdr[MP_MAX_HEADERS + 1];
    size_t hlen;
};

static const char *bchars = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ'()+_,-./:=? ";

/* Finds parameter `name` in a header value "type; a=b; name="v"" into out (unquoted).
 * Returns 1 when found, 0 when absent, -1 when malformed or too long. */
static int header_param(const char *v, const char *name, char *out, size_t cap)
{
    size_t nlen = strlen(name);
    const char *p = strchr(v, ';');
    while (p) {
        p++;
        while (*p == ' ' || *p == '\t') p++;
        const char *k = p;
        while (*p && *p != '=' && *p != ';' && *p != ' ' && *p != '\t') p++;
        size_t klen = (size_t)(p - k);
        while (*p == ' ' || *p == '\t') p++;
        if (*p != '=') {
            p = strchr(p, ';');
            continue;
        }
        p++;
        while (*p == ' ' || *p == '\t') p++;
        size_t n = 0;
        int match = klen == nlen && strncasecmp(k, name, nlen) == 0, quoted = *p == '"';
        for (p += quoted; *p && (quoted ? *p != '"' : *p != ';' && *p != ' ' && *p != '\t'); p++) {
            if (quoted && *p == '\\' && p[1]) p++;
            if (match) {
                if (n + 1 >= cap) return -1;
                out[n++] = *p;
            }
        }
        if (quoted && *p++ != '"') return -1;
        if (match) {
            out[n] = '\0';
            return 1;
        }
        p = strchr(p, ';');
    }
    return 0;
}

gemm_multipart *gemm_multipart_new(const char *content_type, const gemm_multipart_callbacks *cb, void *user,
                                   gemm_err *err)
{
    char boundary[MP_MAX_BOUNDARY + 2];
    const char *why = NULL; /* a 400 bad_multipart */
    size_t blen;
    int r;
    if (!content_type || strncasecmp(content_type, "multipart/", 10) != 0)
        why = "the Content-Type is not multipart/form-data";
    else if ((r = header_param(content_type, "boundary", boundary, sizeof boundary)) <= 0)
        why = r == 0 ? "the multipart Content-Type has no boundary parameter"
                     : "the multipart boundary is malformed or longer than 70 characters";
    else if ((blen = strlen(boundary)) < 1 || blen > MP_MAX_BOUNDARY || strspn(boundary, bchars) != blen ||
             boundary[blen - 1] == ' ')
        why = "the multipart boundary must be 1 to 70 characters from RFC 2046's set, not ending in a space";
    gemm_multipart *mp = why ? NULL : calloc(1, sizeof *mp);
    if (!mp) {
        gemm_err_set(err, why ? 400 : 500, why ? "bad_multipart" : "out_of_memory", "%s",
                     why ? why : "could not allocate the multipart parser");
        return NULL;
    }
    if (cb) mp->cb = *cb;
    mp->user = user;
    mp->dlen = (size_t)snprintf(mp->delim, sizeof mp->delim, "\r\n--%s", boundary);
    mp->state = S_PREAMBLE;
    mp->match = 2; /* the virtual CRLF before the body */
    return mp;
}

/* The parse fails with msg, or (NULL) a callback failed: its error is kept, or one supplied. */
static int failed(gemm_multipart *mp, gemm_err *err, const char *msg)
{
    mp->state = S_FAILED;
    if (msg || (err && err->status == 0))
        gemm_err_set(err, 400, "bad_multipart", "%s", msg ? msg : "a multipart part was refused");
    return -1;
}

static int emit(gemm_multipart *mp, const char *p, size_t n, gemm_err *err)
{
    if (n == 0 || mp->state != S_BODY || !mp->cb.part_data) return 0;
    if (mp->cb.part_data(mp->user, p, n, err)) return failed(mp, err, NULL);
    return 0;
}

/* The header block (without its final empty line) is in mp->hdr: parse it, begin the part. */
static int begin_part(gemm_multipart *mp, gemm_err *err)
{
    char name[256], filename[256], ctype[256];
    int have_disp = 0, have_name = 0, have_file = 0, have_ctype = 0;
    char *line = mp->hdr;
    char *end = mp->hdr + mp->hlen;
    *end = '\0';
    while (line < end) {
        char *eol = strstr(line, "\r\n");
        if (!eol) eol = end;
        *eol = '\0';
        /* Folded continuation lines (obsolete) are refused rather than guessed at. */
        if (*line == ' ' || *line == '\t') return failed(mp, err, "folded multipart part headers are not supported");
        char *colon = strchr(line, ':');
        if (!colon || colon == line) return failed(mp, err, "a multipart part header line has no name");
        *colon = '\0';
        char *v = colon + 1;
        while (*v == ' ' || *v == '\t') v++;
        size_t vl = strlen(v);
        while (vl && (v[vl - 1] == ' ' || v[vl - 1] == '\t')) v[--vl] = '\0';
        if (strcasecmp(line, "Content-Disposition") == 0) {
            if (have_disp) return failed(mp, err, "a multipart part has two Content-Disposition headers");
            have_disp = 1;
            if (strncasecmp(v, "form-data", 9) != 0 || (v[9] && v[9] != ';' && v[9] != ' ' && v[9] != '\t'))
                return failed(mp, err, "a multipart part's Content-Disposition is not form-data");
            if ((have_name = header_param(v, "name", name, sizeof name)) < 0)
                return failed(mp, err, "a multipart part's name is malformed or too long");
            if ((have_file = header_param(v, "filename", filename, sizeof filename)) < 0)
                return failed(mp, err, "a multipart part's filename is malformed or too long");
        } else if (strcasecmp(line, "Content-Type") == 0) {
            if (vl >= sizeof ctype) return failed(mp, err, "a multipart part's Content-Type is too long");
            memcpy(ctype, v, vl + 1);
            have_ctype = 1;
        }
        line = eol + 2;
    }
    if (!have_name) return failed(mp, err, "a multipart part has no Content-Disposition: form-data; name=\"...\"");
    mp->parts++;
    mp->state = S_BODY;
    if (mp->cb.part_begin &&
        mp->cb.part_begin(mp->user, name, have_file ? filename : NULL, have_ctype ? ctype : NULL, err))
        return failed(mp, err, NULL);
    return 0;
}

/* Scans body or preamble bytes for the delimiter. Returns the bytes consumed; sets
 * *found when a whole delimiter ended at that point. */
static size_t scan(gemm_multipart *mp, const char *p, size_t len, int *found, gemm_err *err)
{
    size_t i = 0, m = mp->match; /* the m bytes before p[i] match the delimiter (some may be carried over) */
    mp->match = 0;
    for (;;) {
        while (i < len && m < mp->dlen && p[i] == mp->delim[m]) {
            i++;
            m++;
        }
        *found = m == mp->dlen;
        if (*found || i == len) { /* the body before it goes; a match cut by the chunk's end is kept */
            if (emit(mp, p, i >= m ? i - m : 0, err)) return (size_t)-1;
            if (!*found) mp->match = m;
            return i;
        }
        /* Broken: the bytes matched were body bytes, and only their CR can begin another match;
         * those carried over from the previous chunk go now, the rest with this chunk's. */
        if (m > i && emit(mp, mp->delim, m - i, err)) return (size_t)-1;
        size_t from = m && m <= i ? i - m + 1 : i;
        const char *cr = memchr(p + from, '\r', len - from);
        i = cr ? (size_t)(cr - p) : len;
        m = 0;
    }
}

/* The state byte c leads to in the rest of a delimiter line ("--" close, LWSP, CRLF), or -1. */
static int after_delim_next(int st, char c)
{
    if (st == S_CLOSE_DASH) return c == '-' ? S_EPILOGUE : -1;
    if (st == S_DELIM_CR) return c == '\n' ? S_HEADERS : -1;
    if (c == '-' && st == S_AFTER_DELIM) return S_CLOSE_DASH;
    return c == ' ' || c == '\t' ? S_LWSP : c == '\r' ? S_DELIM_CR : -1;
}

int gemm_multipart_feed(gemm_multipart *mp, const void *data, size_t len, gemm_err *err)
{
    const char *p = data;
    if (mp->state == S_FAILED) return gemm_err_set(err, 400, "bad_multipart", "the multipart parser already failed");
    while (len) {
        switch (mp->state) {
        case S_PREAMBLE:
        case S_BODY: {
            int found;
            size_t n = scan(mp, p, len, &found, err);
            if (n == (size_t)-1) return -1;
            p += n;
            len -= n;
            if (found) mp->state = S_AFTER_DELIM;
            break;
        }
        case S_AFTER_DELIM:
        case S_CLOSE_DASH:
        case S_LWSP:
        case S_DELIM_CR: {
            int next = after_delim_next(mp->state, *p);
            if (next < 0 && mp->parts == 0) { /* in the preamble, a boundary-like line that is not one is text */
                mp->state = S_PREAMBLE;
                break;
            }
            if (next < 0)
                return failed(mp, err,
                              mp->state == S_DELIM_CR ? "a multipart boundary line does not end with CRLF"
                                                      : "a multipart boundary line is followed by unexpected bytes");
            if ((next == S_EPILOGUE || next == S_HEADERS) && mp->parts && mp->cb.part_end &&
                mp->cb.part_end(mp->user, err)) /* the part before it ends */
                return failed(mp, err, NULL);
            if (next == S_EPILOGUE && mp->parts == 0) return failed(mp, err, "the multipart body has no parts");
            mp->state = next;
            mp->hlen = 0;
            p++, len--;
            break;
        }
        case S_HEADERS: {
            /* Copy up to the end of the header block ("\r\n" alone, or "\r\n\r\n"). */
            while (len) {
                if (mp->hlen >= MP_MAX_HEADERS)
                    return failed(mp, err, "a multipart part's headers exceed 8 KiB");
                char c = *p++;
                len--;
                if (c == '\0') return failed(mp, err, "a multipart part header contains a NUL byte");
                mp->hdr[mp->hlen++] = c;
                if (c != '\n') continue;
                if (mp->hlen < 2 || mp->hdr[mp->hlen - 2] != '\r')
                    return failed(mp, err, "a multipart part header line does not end with CRLF");
                if (mp->hlen == 2 || (mp->hlen >= 4 && memcmp(mp->hdr + mp->hlen - 4, "\r\n\r\n", 4) == 0)) {
                    mp->hlen = mp->hlen == 2 ? 0 : mp->hlen - 4;
                    if (begin_part(mp, err)) return -1;
                    break;
                }
            }
            break;
        }
        case S_EPILOGUE:
            return 0;
        default:
            return failed(mp, err, "the multipart parser is in a bad state");
        }
    }
    return 0;
}

int gemm_multipart_finish(gemm_multipart *mp, gemm_err *err)
{
    if (mp->state == S_EPILOGUE) return 0;
    int st = mp->state;
    if (st == S_FAILED) return gemm_err_set(err, 400, "bad_multipart", "the multipart parser already failed");
    mp->state = S_FAILED;
    return gemm_err_set(err, 400, "truncated",
                        mp->parts == 0 && st == S_PREAMBLE ? "the multipart body ended before its first boundary"
                                       : "the multipart body ended before its closing boundary");
}

void gemm_multipart_free(gemm_multipart *mp)
{
    free(mp);
}
