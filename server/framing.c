/*
 * framing.c - the request head's checks before anything else is read (see framing.h).
 */
#include "framing.h"

#include <ctype.h>
#include <string.h>
#include <strings.h>

#include "conns.h"

/* libmicrohttpd from this version on refuses malformed header lines itself. */
#define MHD_HAS_DISCIPLINE (MHD_VERSION >= 0x00097701)

int gemmd_framing_target(const char *target)
{
    size_t n = 0, params = 0;
    int query = 0, bad = 0;
    for (const unsigned char *p = (const unsigned char *)target; *p; p++, n++) {
        if (*p <= 0x20 || *p == 0x7f) bad = 1;
        if (*p == '?' && !query) query = 1, params = 1;
        else if (*p == '&' && query) params++;
    }
    return bad ? GEMMD_TARGET_BAD : n > GEMMD_TARGET_MAX ? GEMMD_TARGET_LONG
           : params > GEMMD_QUERY_MAX ? GEMMD_TARGET_PARAMS : GEMMD_TARGET_OK;
}

void *gemmd_framing_on_target(void *cls, const char *uri, struct MHD_Connection *conn)
{
    (void)cls;
    int verdict = uri ? gemmd_framing_target(uri) : GEMMD_TARGET_OK;
    gemmd_conn_set_target(gemmd_conn_of(conn), verdict);
#if !MHD_HAS_DISCIPLINE
    /* 0.9 found the '?' before this call and splits the query right after it, into its
     * memory pool; a query too big for the pool leaves the connection waiting forever. The
     * request is answered 414 (gemmd_framing_check): leave it no query to split. */
    char *q = verdict ? strchr((char *)uri, '?') : NULL;
    if (q) q[1] = '\0';
#endif
    return NULL;
}

void gemmd_framing_options(struct MHD_OptionItem *items)
{
    int n = 0;
#if MHD_HAS_DISCIPLINE
    /* 1: within what RFC 9110/9112 allow a server, the strict reading (no bare LF, no
     * obs-fold, no whitespace before a colon or in the target, no NUL or bare CR). */
    items[n++] = (struct MHD_OptionItem){MHD_OPTION_CLIENT_DISCIPLINE_LVL, 1, NULL};
#endif
    items[n] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
}

/* ---- the fields --------------------------------------------------------------------- */

static int is_tchar(unsigned char c) { return isalnum(c) || (c && strchr("!#$%&'*+-.^_`|~", c)); }

int gemmd_field_ok(const char *key, size_t klen, const char *val, size_t vlen)
{
    if (!key || klen == 0) return 0;
    for (size_t i = 0; i < klen; i++)
        if (!is_tchar((unsigned char)key[i])) return 0;
    for (size_t i = 0; val && i < vlen; i++) {
        unsigned char c = (unsigned char)val[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f) return 0;
    }
    return 1;
}

/* ---- libmicrohttpd 0.9's read buffer --------------------------------------------------- */

/* Whether [p, p + n) lies in the head and holds only NUL. */
static int nuls(const gemmd_head_walk *w, const char *p, size_t n)
{
    if (p > w->end || (size_t)(w->end - p) < n) return 0;
    for (size_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

void gemmd_head_begin(gemmd_head_walk *w, const char *head, size_t size, const char *version)
{
    w->end = head + size;
    w->bad = !version || version < head || version >= w->end;
    w->pos = w->bad ? w->end : version + strnlen(version, (size_t)(w->end - version));
}

void gemmd_head_field(gemmd_head_walk *w, const char *key, size_t klen, const char *val, size_t vlen)
{
    if (w->bad) return;
    /* one line end (CR LF or LF, each now NUL) since the previous line's text */
    size_t gap = key > w->pos ? (size_t)(key - w->pos) : 0;
    if (gap < 1 || gap > 2 || !nuls(w, w->pos, gap)) {
        w->bad = 1;
        return;
    }
    /* the name, its colon (now NUL), optional whitespace, the value */
    const char *v0 = key + klen + 1;
    if (!val || val < v0 || val > w->end || (size_t)(w->end - val) < vlen || !nuls(w, key + klen, 1)) {
        w->bad = 1;
        return;
    }
    for (const char *p = v0; p < val; p++)
        if (*p != ' ' && *p != '\t') w->bad = 1;
    w->pos = val + vlen;
}

int gemmd_head_end(gemmd_head_walk *w)
{
    /* the last line's end and the blank line's: 2 to 4 NUL up to the end of the head */
    size_t left = w->bad ? 0 : (size_t)(w->end - w->pos);
    return !w->bad && left >= 2 && left <= 4 && nuls(w, w->pos, left) ? 0 : -1;
}

/* ---- the first call ------------------------------------------------------------------- */

struct field_scan {
    int ncl, nte, bad;
    gemmd_head_walk walk;
};

static enum MHD_Result scan_field(void *cls, enum MHD_ValueKind kind, const char *key, size_t klen,
                                  const char *val, size_t vlen)
{
    (void)kind;
    struct field_scan *s = cls;
    if (!gemmd_field_ok(key, klen, val, vlen)) s->bad = 1;
    if (key && strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) s->ncl++;
    if (key && strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) s->nte++;
    gemmd_head_field(&s->walk, key, klen, val, vlen);
    return MHD_YES;
}

static int malformed(gemmd_request *req, const char *why)
{
    return gemm_err_set(&req->err, 400, "bad_request", "%s (RFC 9112); the connection is closed", why);
}

/* libmicrohttpd takes the first of several Content-Length headers and reads a body with an
 * unknown Transfer-Encoding until the client closes: both could make this server and a
 * proxy in front of it disagree on where a request ends, so both are refused. */
static int check_length(gemmd_request *req, const struct field_scan *s)
{
    if (s->ncl > 1)
        return gemm_err_set(&req->err, 400, "bad_length",
                            "the request has %d Content-Length headers; send exactly one", s->ncl);
    if (s->nte == 0) return 0;
    const char *te = gemmd_request_header(req, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    if (s->nte > 1 || !te || strcasecmp(te, "chunked") != 0)
        return gemm_err_set(&req->err, 501, "unsupported_transfer_encoding",
                            "Transfer-Encoding \"%.60s\"%s is not supported; send the body with a "
                            "Content-Length, or with Transfer-Encoding: chunked alone",
                            te ? te : "", s->nte > 1 ? " (in several headers)" : "");
    if (s->ncl)
        return gemm_err_set(&req->err, 400, "bad_length",
                            "the request has both Transfer-Encoding and Content-Length; send one of them");
    return 0;
}

static int judge(gemmd_request *req, const char *method, const char *version)
{
    int target = gemmd_conn_take_target(req->cx);
    if (target == GEMMD_TARGET_BAD) return malformed(req, "the request target holds whitespace or a control character");
    if (target == GEMMD_TARGET_LONG)
        return gemm_err_set(&req->err, 414, "uri_too_long", "the request target is longer than %d bytes",
                            GEMMD_TARGET_MAX);
    if (target == GEMMD_TARGET_PARAMS)
        return gemm_err_set(&req->err, 414, "uri_too_long", "the query has more than %d parameters", GEMMD_QUERY_MAX);
    struct field_scan s = {0};
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(req->conn, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
    gemmd_head_begin(&s.walk, method, ci ? ci->header_size : 0, version);
    MHD_get_connection_values_n(req->conn, MHD_HEADER_KIND, scan_field, &s);
    if (s.bad)
        return malformed(req, "a header name is not a token (whitespace before its colon?) or a header value "
                              "holds a control character");
#if !MHD_HAS_DISCIPLINE
    if (gemmd_head_end(&s.walk) != 0)
        return malformed(req, "the request head has a NUL in a header line or a folded line (obs-fold)");
#endif
    return check_length(req, &s);
}

int gemmd_framing_check(gemmd_request *req, const char *method, const char *version)
{
    req->close_conn = judge(req, method, version) != 0; /* nothing after a refused head can be trusted */
    return req->close_conn ? -1 : 0;
}

int gemmd_framing_has_body(gemmd_request *req)
{
    const char *cl = gemmd_request_header(req, MHD_HTTP_HEADER_CONTENT_LENGTH);
    const char *te = gemmd_request_header(req, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    return (cl && strcmp(cl, "0") != 0) || te;
}
