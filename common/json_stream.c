/* json_stream.c - the tokenizer of the JSON decoder (json_stream.h): a pushdown machine whose
 * stack holds the role each open array or object plays. Chunk ends may cut any token: strings
 * and literals keep their progress in the state, a cut number is copied into a small buffer
 * and finished from there. Numbers inside a row or a data array take a fast loop. */
#include <stdlib.h>
#include <string.h>

#include "json_stream_int.h"

#define STRINGIFY_(x) #x
#define STRINGIFY(x) STRINGIFY_(x)

/* ---- small helpers ------------------------------------------------------------ */

static inline uint64_t off_of(const gemm_json_stream *s, const char *p) { return s->base + (uint64_t)(p - s->data); }

static inline const char *skip_ws(gemm_json_stream *s, const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) {
        if (*p == '\n') {
            s->line++;
            s->line_start = off_of(s, p) + 1;
        }
        p++;
    }
    return p;
}

/* A syntax error at absolute offset off: final. Returns -1. why == NULL: data after the
 * JSON value. */
static int syntax_at(gemm_json_stream *s, uint64_t off, const char *why)
{
    if (s->failed) return -1;
    s->failed = 1;
    uint64_t col = off >= s->line_start ? off - s->line_start + 1 : 1;
    gemm_err_set(&s->syn, 400, "bad_json", "%s at byte %llu (line %llu, column %llu)%s%s",
                 why ? "invalid JSON" : "unexpected data after the JSON value", (unsigned long long)off,
                 (unsigned long long)s->line, (unsigned long long)col, why ? ": " : "", why ? why : "");
    return -1;
}

/* The body failed (s->syn says why): *err (err may be NULL) and nothing held. Returns -1. */
static int give_up(gemm_json_stream *s, gemm_err *err)
{
    if (err) *err = s->syn;
    gemm_jsb_release(s);
    return -1;
}

/* A syntax error at p: reading stops at the end of the chunk. */
static const char *stop(gemm_json_stream *s, const char *p, const char *end, const char *why)
{
    syntax_at(s, off_of(s, p), why);
    return end;
}

/* ---- the tokenizer ---------------------------------------------------------------------- */

/* A value has ended: back in the container (or at the end of the body). */
static inline void value_done(gemm_json_stream *s)
{
    if (s->depth) s->stack[s->depth - 1].n++;
    s->state = s->depth ? S_NEXT : S_END;
}

static int push(gemm_json_stream *s, const char *p, char c)
{
    if (s->depth == GEMM_JSON_MAX_DEPTH)
        return syntax_at(s, off_of(s, p), "arrays and objects nested deeper than " STRINGIFY(GEMM_JSON_MAX_DEPTH));
    int x;
    int role = gemm_jsb_open(s, c, &x);
    s->stack[s->depth++] = (frame){.kind = (uint8_t)c, .role = (uint8_t)role, .x = (uint8_t)x, .key = K_NONE};
    s->state = c == '{' ? S_OBJ_FIRST : S_ARR_FIRST;
    return 0;
}

static void pop(gemm_json_stream *s)
{
    frame f = s->stack[s->depth - 1];
    gemm_jsb_close(s, &f);
    s->depth--;
    value_done(s);
}

/* A byte where a value has just ended and none of ',', ']', '}' (or the end) came. */
static int after_value_error(gemm_json_stream *s, uint64_t off)
{
    if (s->state == S_END) return syntax_at(s, off, NULL);
    return syntax_at(s, off, s->stack[s->depth - 1].kind == '[' ? "expected ',' or ']'" : "expected ',' or '}'");
}

/* The number at t (n bytes of text, which begin at offset off): its length when it ends
 * inside them (the value is taken), 0 when it may go on past them, -1 (a syntax error).
 * At most GEMM_JSON_NUMBER_MAX + 1 bytes are looked at, whether in one chunk or cut, so
 * that the answer does not depend on where chunks end. */
static ptrdiff_t number_text(gemm_json_stream *s, const char *t, size_t n, int at_eof, uint64_t off)
{
    gemm_decimal d;
    ptrdiff_t r = gemm_json_scan_number(t, t + n, at_eof, &d);
    if (r < 0) return syntax_at(s, off + (uint64_t)(-r - 1), "not a valid number");
    if (r > GEMM_JSON_NUMBER_MAX || (r == 0 && n > GEMM_JSON_NUMBER_MAX))
        return syntax_at(s, off, "a number longer than " STRINGIFY(GEMM_JSON_NUMBER_MAX) " characters");
    if (r > 0) {
        gemm_jsb_scalar(s, T_NUMBER, NULL, &d);
        value_done(s);
    }
    return r;
}

/* A number starting at p (p < end) in the generic path. Returns where reading goes on. */
static const char *number_start(gemm_json_stream *s, const char *p, const char *end)
{
    size_t n = (size_t)(end - p) > GEMM_JSON_NUMBER_MAX + 1 ? GEMM_JSON_NUMBER_MAX + 1 : (size_t)(end - p);
    ptrdiff_t r = number_text(s, p, n, 0, off_of(s, p));
    if (r < 0) return end;
    if (r > 0) return p + r;
    memcpy(s->num, p, n); /* the chunk ends inside the number */
    s->num_len = n;
    s->num_off = off_of(s, p);
    s->state = S_NUMBER;
    return end;
}

/* The number cut by a chunk end is complete: the next byte does not continue it, the body
 * ended, or its buffer is full (one character more than the longest number: decided as
 * number_start decides text in one piece). What follows it in the buffer ("01", "1.5.3")
 * is what the state after a value refuses. */
static void number_finish(gemm_json_stream *s)
{
    ptrdiff_t r = number_text(s, s->num, s->num_len, s->num_len <= GEMM_JSON_NUMBER_MAX, s->num_off);
    if (r > 0 && (size_t)r < s->num_len) after_value_error(s, s->num_off + (uint64_t)r);
}

/* Numbers in a row or a data array, as long as they are whole inside the chunk: the
 * common case, without the general state machine. */
static const char *number_run(gemm_json_stream *s, const char *p, const char *end)
{
    frame *f = &s->stack[s->depth - 1];
    int x = f->x;
    for (;;) {
        p = skip_ws(s, p, end);
        if (p == end || !(gemm_num_is_digit(*p) || *p == '-')) return p;
        gemm_decimal d;
        ptrdiff_t r = gemm_json_scan_number(p, end, 0, &d);
        if (r <= 0 || r > GEMM_JSON_NUMBER_MAX) return p; /* the general path says what is wrong */
        gemm_jsb_number(s, x, &d);
        f->n++;
        p = skip_ws(s, p + r, end);
        s->state = S_NEXT;
        if (p == end || *p != ',') return p;
        p++;
        s->state = S_VALUE;
    }
}

static void capture(gemm_json_stream *s, const char *p, size_t n)
{
    if (!s->str_capture) return;
    if (n > STR_MAX - s->str_len) {
        n = STR_MAX - s->str_len;
        s->str_over = 1;
    }
    memcpy(s->str + s->str_len, p, n);
    s->str_len += n;
    s->str[s->str_len] = '\0';
}

/* Captures code point c, in UTF-8. */
static void capture_code(gemm_json_stream *s, uint32_t c)
{
    char u[4];
    size_t n = c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
    for (size_t i = n - 1; i > 0; i--, c >>= 6) u[i] = (char)(0x80 | (c & 0x3f));
    u[0] = (char)(n == 1 ? c : ((0xf00u >> n) | c) & 0xff); /* 0xc0, 0xe0, 0xf0: the lead byte of n */
    capture(s, u, n);
}

/* Plain characters of a string from p, UTF-8 checked (a character may span chunks): where
 * they end (a quote, a backslash, a control character or a byte that is not UTF-8 there). */
static const char *string_text(gemm_json_stream *s, const char *p, const char *end)
{
    for (; p < end; p++) {
        unsigned char c = (unsigned char)*p;
        if (s->u8_need) {
            if (c < s->u8_lo || c > s->u8_hi) break;
            s->u8_need--, s->u8_lo = 0x80, s->u8_hi = 0xbf;
        } else if (c == '"' || c == '\\' || c < 0x20 || (c >= 0x80 && gemm_utf8_lead(c, &s->u8_need, &s->u8_lo, &s->u8_hi) != 0)) {
            break;
        }
    }
    return p;
}

/* Inside a string. Returns where reading goes on. */
static const char *string_run(gemm_json_stream *s, const char *p, const char *end)
{
    while (p < end) {
        if (s->esc == 0) {
            const char *q = string_text(s, p, end);
            capture(s, p, (size_t)(q - p));
            p = q;
            if (p == end) return p;
            if (s->u8_need || (unsigned char)*p >= 0x80) {
                syntax_at(s, off_of(s, p), "a string that is not UTF-8 (RFC 8259 section 8.1)");
                return end;
            }
            if (*p == '"') {
                p++;
                if (s->str_key) {
                    gemm_jsb_key(s);
                    s->state = S_COLON;
                } else {
                    gemm_jsb_scalar(s, T_STRING, s->str, NULL);
                    value_done(s);
                }
                return p;
            }
            if (*p == '\\') {
                s->esc = 1;
                p++;
                continue;
            }
            return stop(s, p, end, "a control character inside a string (escape it)");
        }
        char c = *p;
        if (s->esc == 1) {
            static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
            const char *k = c ? strchr(from, c) : NULL;
            if (k) {
                capture(s, &to[k - from], 1);
                s->esc = 0;
            } else if (c == 'u') {
                s->esc = 2;
                s->ucode = 0;
            } else {
                return stop(s, p, end, "an invalid escape in a string");
            }
        } else if (s->esc == 6 || s->esc == 7) {
            if (c != (s->esc == 6 ? '\\' : 'u'))
                return stop(s, p, end, "a \\u escape of a high surrogate without its low half");
            s->esc++;
            s->ucode = 0;
        } else {
            int h = gemm_hex_digit(c);
            if (h < 0) return stop(s, p, end, "\\u must be followed by four hex digits");
            s->ucode = s->ucode * 16 + (uint32_t)h;
            if (++s->esc == 6) { /* first \uXXXX complete */
                if (s->ucode >= 0xd800 && s->ucode <= 0xdbff) {
                    s->uhigh = s->ucode;
                } else if (s->ucode >= 0xdc00 && s->ucode <= 0xdfff) {
                    return stop(s, p, end, "a \\u escape of a lone low surrogate");
                } else {
                    capture_code(s, s->ucode);
                    s->esc = 0;
                }
            } else if (s->esc == 12) { /* the low half */
                if (s->ucode < 0xdc00 || s->ucode > 0xdfff)
                    return stop(s, p, end, "a \\u escape of a high surrogate without its low half");
                capture_code(s, 0x10000 + ((s->uhigh - 0xd800) << 10) + (s->ucode - 0xdc00));
                s->esc = 0;
            }
        }
        p++;
    }
    return p;
}

static void string_start(gemm_json_stream *s, int key)
{
    const frame *f = s->depth ? &s->stack[s->depth - 1] : NULL;
    s->str_key = key;
    /* kept: the keys of the objects that are read, and the values of options and references */
    s->str_capture = f && (f->role == R_ROOT || f->role == R_MATOBJ) &&
                     (key || f->key >= K_OPT || (f->role == R_MATOBJ && f->key == K_REF));
    s->str_over = 0;
    s->str_len = 0;
    s->str[0] = '\0';
    s->esc = 0;
    s->u8_need = 0;
    s->state = S_STRING;
}

/* A value begins at p (not whitespace). Returns where reading goes on. */
static const char *value_start(gemm_json_stream *s, const char *p, const char *end)
{
    char c = *p;
    switch (c) {
    case '{':
    case '[':
        if (push(s, p, c)) return end;
        return p + 1;
    case '"':
        string_start(s, 0);
        return p + 1;
    case 't':
    case 'f':
    case 'n':
        s->lit = c == 't' ? "true" : c == 'f' ? "false" : "null";
        s->lit_pos = 1;
        s->state = S_LITERAL;
        return p + 1;
    default:
        if (c == '-' || gemm_num_is_digit(c)) return number_start(s, p, end);
        return stop(s, p, end, "expected a value");
    }
}

int gemm_json_stream_feed(gemm_json_stream *s, const char *data, size_t len, gemm_err *err)
{
    const char *p = data, *end = data + len;
    s->data = data;
    while (p < end && !s->failed) {
        /* between tokens: whitespace (after the value, until a NUL ends the body) */
        if (s->state < S_STRING && !(s->state == S_END && s->nul_off) && (p = skip_ws(s, p, end)) == end) break;
        switch (s->state) {
        case S_VALUE:
        case S_ARR_FIRST: {
            int role = s->depth ? s->stack[s->depth - 1].role : R_SKIP;
            if (role == R_ROW || role == R_DATA) {
                p = number_run(s, p, end);
                if (p == end || s->state == S_NEXT) break;
            }
            if (*p == ']' && s->state == S_ARR_FIRST) {
                pop(s);
                p++;
                break;
            }
            p = value_start(s, p, end);
            break;
        }
        case S_OBJ_FIRST:
        case S_KEY:
            if (*p == '}' && s->state == S_OBJ_FIRST) {
                pop(s);
                p++;
            } else if (*p == '"') {
                string_start(s, 1);
                p++;
            } else {
                syntax_at(s, off_of(s, p), "expected a key (a string in double quotes)");
            }
            break;
        case S_COLON:
            if (*p != ':') {
                syntax_at(s, off_of(s, p), "expected ':' after a key");
                break;
            }
            s->state = S_VALUE;
            p++;
            break;
        case S_NEXT: {
            frame *f = &s->stack[s->depth - 1];
            if (*p == ',') {
                s->state = f->kind == '[' ? S_VALUE : S_KEY;
                p++;
            } else if (*p == (f->kind == '[' ? ']' : '}')) {
                pop(s);
                p++;
            } else {
                after_value_error(s, off_of(s, p));
            }
            break;
        }
        case S_END: /* one NUL at the very end (a C string's) */
            if (!s->nul_off && *p == '\0') s->nul_off = off_of(s, p++);
            else syntax_at(s, s->nul_off ? s->nul_off : off_of(s, p), NULL);
            break;
        case S_STRING:
            p = string_run(s, p, end);
            break;
        case S_NUMBER: {
            const char *q = p;
            while (q < end && (gemm_num_is_digit(*q) || *q == '.' || *q == 'e' || *q == 'E' || *q == '+' || *q == '-')) q++;
            size_t n = (size_t)(q - p), room = sizeof s->num - 1 - s->num_len;
            memcpy(s->num + s->num_len, p, n < room ? n : room);
            s->num_len += n < room ? n : room;
            p = q;
            if (p < end || n > room) number_finish(s);
            break;
        }
        case S_LITERAL:
            while (p < end && s->lit[s->lit_pos]) {
                if (*p != s->lit[s->lit_pos]) {
                    syntax_at(s, off_of(s, p), "expected true, false or null");
                    break;
                }
                p++;
                s->lit_pos++;
            }
            if (!s->failed && !s->lit[s->lit_pos]) {
                gemm_jsb_scalar(s, s->lit[0] == 'n' ? T_NULL : T_BOOL, NULL, NULL);
                value_done(s);
            }
            break;
        }
    }
    s->base += len;
    return s->failed ? give_up(s, err) : 0;
}

/* ---- the end --------------------------------------------------------------------------- */

/* The body has ended: a number or literal it ended in, and syntax. 0, or -1 (*err). */
static int end_of_body(gemm_json_stream *s, const char *expected, gemm_err *err)
{
    if (!s->failed && s->state == S_NUMBER) number_finish(s);
    if (!s->failed && s->state != S_END && s->base)
        syntax_at(s, s->base, s->state == S_STRING ? "the body ends inside a string" : "the body ends before the JSON value does");
    else if (!s->failed && s->state != S_END) {
        s->failed = 1;
        gemm_err_set(&s->syn, 400, "bad_json", "the body is empty; expected %s", expected);
    }
    return s->failed ? give_up(s, err) : 0;
}

int gemm_json_stream_finish(gemm_json_stream *s, gemm_options *opt, gemm_matrix *a, gemm_matrix *b, gemm_err *err)
{
    gemm_matrix *m[2] = {a, b};
    for (int x = 0; x < 2; x++) {
        if (s->op[x].given) continue; /* the caller's */
        m[x]->data = NULL;
        m[x]->batch = 0; /* until the body says it is 3-D */
    }
    if (end_of_body(s, "a JSON object with \"a\" and \"b\"", err)) return -1;
    return gemm_jsb_finish(s, opt, a, b, err);
}

int gemm_json_stream_finish_matrix(gemm_json_stream *s, gemm_options *opt, gemm_matrix *m, gemm_err *err)
{
    m->data = NULL;
    m->batch = 0;
    if (end_of_body(s, "a matrix: [[..],[..]] or {\"shape\": [r,c], \"data\": [..]}", err)) return -1;
    return gemm_jsb_finish_matrix(s, opt, m, err);
}

/* ---- life ------------------------------------------------------------------------------- */

gemm_json_stream *gemm_json_stream_new(const gemm_limits *lim, const gemm_allocator *alloc, const gemm_options *opt,
                                       uint64_t body_max)
{
    gemm_json_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    if (lim) s->lim = *lim; /* else none: zeros */
    s->alloc = alloc ? alloc : &gemm_allocator_host;
    if (opt) s->opt = *opt;
    else gemm_options_init(&s->opt);
    gemm_options_door(&s->opt); /* the body may repeat the query's options */
    s->body_max = body_max;
    s->line = 1;
    s->state = S_VALUE;
    s->rank = RK_NONE;
    s->fixed_dtype = GEMM_DTYPE_INVALID;
    for (int x = 0; x < 2; x++) {
        s->op[x].name = x ? "b" : "a";
        s->op[x].rank = RK_NONE;
        s->op[x].first_bad = UINT64_MAX;
        gemm_json_store_init(&s->op[x].st, s->alloc, &s->mem);
    }
    return s;
}

gemm_json_stream *gemm_json_stream_new_matrix(const gemm_limits *lim, const gemm_allocator *alloc,
                                              const gemm_options *opt, uint64_t body_max)
{
    gemm_json_stream *s = gemm_json_stream_new(lim, alloc, opt, body_max);
    if (!s) return NULL;
    s->single = 1;
    s->op[0].name = "matrix";
    return s;
}

void gemm_json_stream_set_refs(gemm_json_stream *s, const gemm_json_refs *refs, const gemm_matrix *a,
                               const gemm_matrix *b)
{
    const gemm_matrix *m[2] = {a, b};
    s->refs = *refs;
    for (int x = 0; x < 2; x++) {
        operand *o = &s->op[x];
        if (!refs->given[x]) continue;
        o->given = o->is_ref = 1;
        o->refm = *m[x];
        o->refm.data = NULL;
        if (s->fixed_dtype == GEMM_DTYPE_INVALID) s->fixed_dtype = m[x]->dtype;
    }
}

void gemm_json_stream_free(gemm_json_stream *s)
{
    if (!s) return;
    gemm_jsb_release(s);
    free(s);
}
