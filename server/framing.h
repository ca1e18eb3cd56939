/*
 * framing.h - a request head is judged before anything else (RFC 9112; the cases and why:
 * docs/OPERATIONS.md, "Security"): on 0.9 the head is walked again as libmicrohttpd left it
 * in its read buffer (gemmd_head_*), and the target judged before its query is split.
 */
#ifndef GEMMD_FRAMING_H
#define GEMMD_FRAMING_H

#include <microhttpd.h>
#include <stddef.h>

#include "request.h"

#define GEMMD_TARGET_MAX 8192 /* bytes of a request target (RFC 9112 section 3 asks for 8000) */
#define GEMMD_QUERY_MAX 64    /* query parameters */

/* What is wrong with a request target as the client sent it (0: nothing). */
enum { GEMMD_TARGET_OK = 0, GEMMD_TARGET_BAD, GEMMD_TARGET_LONG, GEMMD_TARGET_PARAMS };
int gemmd_framing_target(const char *target);

/* MHD_OPTION_URI_LOG_CALLBACK: judges the target before libmicrohttpd splits its query,
 * notes the verdict on the connection (conns.h), and on 0.9 leaves a refused target no
 * query to split. Returns NULL (the request's context stays unset). */
void *gemmd_framing_on_target(void *cls, const char *uri, struct MHD_Connection *conn);

/* libmicrohttpd's own strictness for this version, as MHD_OPTION_ARRAY items (ends with
 * MHD_OPTION_END); items holds at least 2. */
void gemmd_framing_options(struct MHD_OptionItem *items);

/* The first call of a request: 0, or -1 with req->err set and req->close_conn (answer it,
 * and the connection closes). method and version are the access handler's arguments. */
int gemmd_framing_check(gemmd_request *req, const char *method, const char *version);

/* Whether the request has a body (a Content-Length other than 0, or a Transfer-Encoding). */
int gemmd_framing_has_body(gemmd_request *req);

/* A header field's name is a token and its value holds no control character but HTAB. */
int gemmd_field_ok(const char *key, size_t klen, const char *val, size_t vlen);

/* ---- libmicrohttpd 0.9's read buffer ---------------------------------------------------
 * 0.9 parses the head in place: the request line and the header lines stay where they
 * arrived, the colon of each line and every CR LF (or bare LF) overwritten with NUL, and
 * each name and value pointing into that buffer, in order. A walk over the fields checks
 * that nothing lies between one field's value and the next field's name but one line end,
 * and between the last value and the end of the head but two: a NUL inside a value, a
 * folded line or a moved name shows as bytes where there should be none. */
typedef struct {
    const char *pos;  /* where the previous line's text ended */
    const char *end;  /* the end of the head (its blank line included) */
    int bad;
} gemmd_head_walk;

/* head..head+size: the whole head, from the method (the access handler's method points
 * there); version: where the HTTP version of the request line begins. */
void gemmd_head_begin(gemmd_head_walk *w, const char *head, size_t size, const char *version);
void gemmd_head_field(gemmd_head_walk *w, const char *key, size_t klen, const char *val, size_t vlen);
/* 0 when the head is as a well-formed one is left, else -1. */
int gemmd_head_end(gemmd_head_walk *w);

#endif
