/*
 * respond.c - building and queueing answers.
 */
#include "respond.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "engine_err.h"
#include "instance.h"
#include "npy.h"

#define PAYLOAD_BLOCK (256 * 1024)

/* ---- Accept ----------------------------------------------------------------- */

static gemmd_format media_format(const char *s, size_t n, gemmd_format family)
{
#define IS(lit) (n == sizeof(lit) - 1 && strncasecmp(s, lit, n) == 0)
    if (IS("application/json")) return GEMMD_FMT_JSON;
    if (IS("application/octet-stream")) return GEMMD_FMT_RAW;
    if (IS("application/x-npy") || IS("application/npy")) return GEMMD_FMT_NPY;
    if (IS("*/*") || IS("application/*")) return family;
#undef IS
    return GEMMD_FMT_NONE;
}

gemmd_format gemmd_negotiate(const char *accept, gemmd_format family)
{
    if (!accept) return family;
    const char *p = accept;
    while (*p == ' ' || *p == '\t') p++;
    if (!*p) return family;

    gemmd_format best = GEMMD_FMT_NONE;
    double best_q = 0;
    int ranges = 0;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        /* media range up to ';' or the end, trimmed */
        const char *s = p;
        while (s < p + len && (*s == ' ' || *s == '\t')) s++;
        const char *e = s;
        while (e < p + len && *e != ';' && *e != ' ' && *e != '\t') e++;
        double q = 1.0;
        for (const char *a = e; a < p + len; a++) {
            if (*a != ';') continue;
            const char *b = a + 1;
            while (*b == ' ') b++;
            if ((b[0] == 'q' || b[0] == 'Q') && b[1] == '=') q = strtod(b + 2, NULL);
        }
        if (e > s) ranges++;
        gemmd_format f = media_format(s, (size_t)(e - s), family);
        if (f != GEMMD_FMT_NONE && q > 0 &&
            (q > best_q || (q == best_q && f == family && best != family))) {
            best = f;
            best_q = q;
        }
        p += len;
        if (*p == ',') p++;
    }
    return ranges ? best : family; /* an Accept without a media range says nothing */
}

int gemmd_accept(gemmd_request *req, gemmd_format family, gemmd_format *fmt)
{
    *fmt = gemmd_negotiate(gemmd_request_header(req, MHD_HTTP_HEADER_ACCEPT), family);
    if (*fmt != GEMMD_FMT_NONE) return 0;
    return gemm_err_set(&req->err, 406, "not_acceptable",
                        "Accept offers nothing this server answers: use application/json, "
                        "application/octet-stream or application/x-npy (or */*)");
}

/* ---- JSON answer size ---------------------------------------------------------- */

int gemmd_check_json_answer(const gemmd_services *srv, uint64_t rows, uint64_t cols, gemm_dtype d, gemm_err *err)
{
    uint64_t per = gemm_json_elem_width(d);
    uint64_t cap = srv->cfg.max_json_bytes;
    if (rows > 0 && cols <= cap / rows && rows * cols <= cap / per) return 0;
    return gemm_err_set(err, 422, "answer_too_large",
                        "C is %llux%llu: as JSON it could take more than the %llu bytes JSON is limited "
                        "to (max_json_mb); ask for it with Accept: application/octet-stream or "
                        "application/x-npy",
                        (unsigned long long)rows, (unsigned long long)cols, (unsigned long long)cap);
}

/* ---- timing ------------------------------------------------------------------ */

void gemmd_ran_fields_json(gemm_buf *b, const char *pre, const char *kernel, int tile, const char *block,
                           const char *math, const char *device)
{
    gemm_buf_printf(b, "%s\"kernel\":", pre);
    gemm_buf_json_string(b, kernel);
    gemm_buf_printf(b, ",\"tile\":%d,\"block\":", tile);
    gemm_buf_json_string(b, block);
    gemm_buf_puts(b, ",\"math\":");
    gemm_buf_json_string(b, math);
    gemm_buf_puts(b, ",\"device\":");
    gemm_buf_json_string(b, device);
}

void gemmd_ran_json(gemm_buf *b, const char *pre, const gemm_job *job)
{
    gemmd_ran_fields_json(b, pre, job->kernel_used, job->tile_used, job->block,
                          gemm_math_report_name(job->dtype, job->math_used), job->device);
}

void gemmd_timing_from_job(gemmd_timing *t, const gemm_job_timing *jt)
{
    t->queue_ms = jt->queue_ms;
    t->h2d_ms = jt->h2d_ms;
    t->kernel_ms = jt->kernel_ms;
    t->d2h_ms = jt->d2h_ms;
    t->compute_ms = jt->compute_ms;
    t->gflops = jt->gflops;
    t->have_compute = 1;
}

/* The X-Gemm-Split header of a split product (job->split_panels >= 2), "panels=P;
 * rows=r0,r1,...; devices=cuda:0,cuda:1,..." (each device's label up to its first space),
 * else "". */
static void split_header(const gemm_job *job, char *out, size_t cap)
{
    out[0] = '\0';
    if (!job || job->split_panels < 2) return;
    int np = job->split_panels > GEMM_SPLIT_MAX ? GEMM_SPLIT_MAX : job->split_panels;
    gemm_buf b = {0};
    gemm_buf_printf(&b, "panels=%d; rows=", np);
    for (int i = 0; i < np; i++) gemm_buf_printf(&b, "%s%llu", i ? "," : "", (unsigned long long)job->split[i].rows);
    gemm_buf_puts(&b, "; devices=");
    for (int i = 0; i < np; i++)
        gemm_buf_printf(&b, "%s%.*s", i ? "," : "", (int)strcspn(job->split[i].device, " "), job->split[i].device);
    if (!b.failed && b.len < cap) memcpy(out, b.data, b.len + 1); /* never cut: cap fits GEMM_SPLIT_MAX */
    gemm_buf_free(&b);
}

/* What ran where, for the answer's headers. */
static void note_job(gemmd_request *req, const gemm_job *job)
{
    snprintf(req->hdr_kernel, sizeof req->hdr_kernel, "%s", job ? job->kernel_used : "");
    snprintf(req->hdr_device, sizeof req->hdr_device, "%s", job ? job->device : "");
    split_header(job, req->hdr_split, sizeof req->hdr_split);
}

int gemmd_product_outcome(gemmd_request *req, const gemm_job *job)
{
    note_job(req, job);
    gemmd_timing_from_job(&req->timing, &job->timing);
    int st = atomic_load(&job->state);
    if (st == GEMM_JOB_DONE) return 0;
    if (st == GEMM_JOB_CANCELLED && atomic_load(&req->svc->stopping))
        return gemm_err_set(&req->err, 503, "shutting_down", "the server is shutting down; the product was cancelled%s",
                            job->timing.compute_ms > 0 ? " while it ran (shutdown_timeout)" : " before it started");
    gemmd_engine_err(&job->err, &req->err);
    return -1;
}

/* Stages are rounded down and the total up, so the printed stages never add up to more
 * than the printed total. */
static double down(double ms) { return ms > 0 ? floor(ms * 1e4) / 1e4 : 0; }
static double up(double ms) { return ms > 0 ? ceil(ms * 1e4) / 1e4 : 0; }

void gemmd_timing_json(gemm_buf *b, const gemmd_timing *t)
{
    gemm_buf_printf(b,
                    "{\"recv_ms\":%.4f,\"decode_ms\":%.4f,\"queue_ms\":%.4f,\"h2d_ms\":%.4f,"
                    "\"kernel_ms\":%.4f,\"d2h_ms\":%.4f,\"compute_ms\":%.4f,\"encode_ms\":%.4f,"
                    "\"total_ms\":%.4f,\"gflops\":%.3f}",
                    down(t->recv_ms), down(t->decode_ms), down(t->queue_ms), down(t->h2d_ms),
                    down(t->kernel_ms), down(t->d2h_ms), down(t->compute_ms), down(t->encode_ms),
                    up(t->total_ms), isfinite(t->gflops) ? t->gflops : 0.0);
}

/* The header is written on every answer, on the HTTP threads: by hand, not by printf's
 * float formatting (a tenth of those threads' time for a 64x64 product). */
typedef struct {
    char *p;
    size_t left; /* room, the terminating NUL included; 0 once something did not fit */
} text_out;

static void put_str(text_out *o, const char *s)
{
    size_t n = strlen(s);
    if (o->left == 0 || n >= o->left) {
        o->left = 0;
        return;
    }
    memcpy(o->p, s, n + 1);
    o->p += n;
    o->left -= n;
}

/* v >= 0 with `decimals` digits after the point (v already rounded there by down()/up(); the
 * rate rounded half away from zero), as printf's %.Nf writes it; printf past 1e15. */
static void put_fixed(text_out *o, double v, int decimals)
{
    static const double scale[] = {1, 10, 100, 1000, 10000};
    char buf[48];
    if (!(v >= 0) || v >= 1e15) {
        snprintf(buf, sizeof buf, "%.*f", decimals, isfinite(v) ? v : 0.0);
        put_str(o, buf);
        return;
    }
    unsigned long long q = (unsigned long long)llround(v * scale[decimals]);
    char *e = buf + sizeof buf - 1, *p = e;
    *p = '\0';
    for (int d = 0; d < decimals; d++, q /= 10) *--p = (char)('0' + q % 10);
    if (decimals) *--p = '.';
    do {
        *--p = (char)('0' + q % 10);
        q /= 10;
    } while (q);
    put_str(o, p);
}

static void put_dur(text_out *o, const char *entry, double ms)
{
    put_str(o, entry);
    put_fixed(o, ms, 4);
}

static void server_timing(char *out, size_t cap, const gemmd_timing *t)
{
    text_out o = {out, cap};
    if (cap) out[0] = '\0';
    put_dur(&o, "recv;dur=", down(t->recv_ms));
    put_dur(&o, ", decode;dur=", down(t->decode_ms));
    if (t->have_compute) {
        put_dur(&o, ", queue;dur=", down(t->queue_ms));
        put_dur(&o, ", h2d;dur=", down(t->h2d_ms));
        put_dur(&o, ", kernel;dur=", down(t->kernel_ms));
        /* The kernel's rate rides on its entry as a description (no comma: one entry), where
         * it shows at one decimal. */
        if (isfinite(t->gflops) && t->gflops >= 0.05) {
            put_str(&o, ";desc=\"");
            put_fixed(&o, t->gflops, 1);
            put_str(&o, " GFLOP/s\"");
        }
        put_dur(&o, ", d2h;dur=", down(t->d2h_ms));
        put_dur(&o, ", encode;dur=", down(t->encode_ms));
    }
    put_dur(&o, ", total;dur=", up(t->total_ms));
}

/* recv and decode of this request's own body, where it had one. */
static void fill_request_times(gemmd_request *req)
{
    gemmd_timing *t = &req->timing;
    if (t->recv_ms == 0 && req->t_body_ms > 0) t->recv_ms = req->t_body_ms - req->t_start_ms;
    if (t->decode_ms == 0 && req->t_decoded_ms > req->t_body_ms && req->t_body_ms > 0)
        t->decode_ms = req->t_decoded_ms - req->t_body_ms;
}

/* ---- queueing ------------------------------------------------------------------ */

enum MHD_Result gemmd_respond_queue(gemmd_request *req, int status, struct MHD_Response *resp)
{
    if (!resp) {
        static const char oom[] = "{\"error\":{\"code\":\"out_of_memory\",\"message\":\"cannot build the answer\"}}";
        resp = MHD_create_response_from_buffer(sizeof oom - 1, (void *)oom, MHD_RESPMEM_PERSISTENT);
        status = 500;
        if (!resp) return MHD_NO;
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    }
    gemmd_timing *t = &req->timing;
    fill_request_times(req);
    if (t->total_ms == 0) t->total_ms = t->total_base_ms + gemm_now_ms() - req->t_start_ms;
    char st[400];
    server_timing(st, sizeof st, t);
    MHD_add_response_header(resp, "Server-Timing", st);
    if (req->hdr_kernel[0]) MHD_add_response_header(resp, "X-Gemm-Kernel", req->hdr_kernel);
    /* where a product ran, as its JSON "device" says it: nothing on other answers */
    if (req->hdr_device[0]) MHD_add_response_header(resp, "X-Gemm-Device", req->hdr_device);
    if (req->hdr_split[0]) MHD_add_response_header(resp, "X-Gemm-Split", req->hdr_split);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    if (gemmd_instance_get()[0]) MHD_add_response_header(resp, "X-Gemm-Instance", gemmd_instance_get());
    if (req->close_conn) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    gemmd_conn_answer(req->cx); /* the send deadline starts */
    enum MHD_Result rc = MHD_queue_response(req->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    if (rc == MHD_YES) req->status = status;
    req->phase = REQ_DONE;
    return rc;
}

/* A response of body (taken over), with its Content-Type (mime: none when NULL). */
static struct MHD_Response *from_buf(gemmd_request *req, gemm_buf *body, const char *mime)
{
    struct MHD_Response *r = NULL;
    size_t len = body->len;
    if (!body->failed) /* an empty body: MHD is given "", and body's buffer (if any) freed below */
        r = MHD_create_response_from_buffer(len, len ? body->data : (void *)"",
                                            len ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (r && len) gemm_buf_init(body); /* MHD owns the bytes now */
    if (r) {
        req->bytes_out = len;
        if (mime) MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, mime);
    }
    gemm_buf_free(body);
    return r;
}

enum MHD_Result gemmd_respond_buf(gemmd_request *req, int status, const char *mime, gemm_buf *body,
                                  const char *location)
{
    struct MHD_Response *r = from_buf(req, body, mime);
    if (r && location) MHD_add_response_header(r, MHD_HTTP_HEADER_LOCATION, location);
    return gemmd_respond_queue(req, status, r);
}

/* Messages quote what the client sent: bytes that are not UTF-8 become '?', so the
 * JSON answer is always valid UTF-8. */
static void utf8_clean(char *s)
{
    unsigned char *p = (unsigned char *)s;
    while (*p) {
        size_t n = gemm_utf8_seq(p);
        if (n == 0) {
            *p++ = '?';
            continue;
        }
        p += n;
    }
}

/* {"error":{"code":..,"message":..}}; on the Open Inference Protocol's routes its own
 * shape, {"error": message, "code": code}, with 400 for a request that cannot be run. */
enum MHD_Result gemmd_respond_error(gemmd_request *req, const gemm_err *err)
{
    /* a path under /v2 that no row takes (404, 405) is answered in that protocol's shape too */
    int v2 = req->route ? (req->route->flags & GEMMD_V2) != 0
                        : strncmp(req->path, "/v2", 3) == 0 && (req->path[3] == '\0' || req->path[3] == '/');
    int status = err->status >= 400 && err->status <= 599 ? err->status : 500;
    if (v2 && status == 422) status = 400;
    char code[sizeof err->code], msg[sizeof err->message];
    snprintf(code, sizeof code, "%s", err->code[0] ? err->code : "internal_error");
    snprintf(msg, sizeof msg, "%s", err->message[0] ? err->message : "internal error");
    utf8_clean(code);
    utf8_clean(msg);
    gemmd_usage_error(req->owner, req->route ? req->route->metric : NULL, status, code);
    gemm_buf b = {0};
    gemm_buf_puts(&b, v2 ? "{\"error\":" : "{\"error\":{\"code\":");
    gemm_buf_json_string(&b, v2 ? msg : code);
    gemm_buf_puts(&b, v2 ? ",\"code\":" : ",\"message\":");
    gemm_buf_json_string(&b, v2 ? code : msg);
    gemm_buf_puts(&b, v2 ? "}\n" : "}}\n");
    struct MHD_Response *r = from_buf(req, &b, "application/json");
    if (r) {
        if (status == 405 && req->allow[0]) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, req->allow);
        if (status == 401)
            MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"gemmd\"");
        if (status == 503) {
            char ra[16];
            snprintf(ra, sizeof ra, "%d", req->retry_after_s > 0 ? req->retry_after_s : 1);
            MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, ra);
        }
    }
    return gemmd_respond_queue(req, status, r);
}

enum MHD_Result gemmd_respond_waited(gemmd_request *req, int sync_state)
{
    switch (sync_state) {
    case GEMMD_SYNC_DONE: return req->route->answer(req);
    case GEMMD_SYNC_ABANDONED:
        return gemmd_respond_errorf(req, 503, "shutting_down",
                                    "the server is shutting down and the product did not finish within "
                                    "shutdown_timeout; retry elsewhere");
    default: return MHD_YES; /* suspended: answered once resumed */
    }
}

enum MHD_Result gemmd_respond_errorf(gemmd_request *req, int status, const char *code, const char *fmt, ...)
{
    gemm_err e;
    e.status = status;
    snprintf(e.code, sizeof e.code, "%s", code);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    va_end(ap);
    return gemmd_respond_error(req, &e);
}

/* ---- answers of head and data ------------------------------------------------------- */

/* An answer of head then data: the head copied into prefix (an .npy header) or taken over
 * (owned: freed, and its charge of answer bytes given back, with the answer); data freed
 * with data_alloc (when set) and release(ctx) called once MHD is done with it. */
typedef struct {
    const char *head;
    size_t head_len;
    char *owned;
    uint64_t charge;
    gemmd_budget *budget;
    const char *data;
    size_t data_len;
    const gemm_allocator *data_alloc;
    void (*release)(void *ctx);
    void *ctx;
    gemmd_conn *cx;           /* told how much the client has taken (send deadline) */
    char prefix[128];
} payload;

static ssize_t payload_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    payload *p = cls;
    /* MHD asks for more once what it had was sent: pos is what the client has taken,
     * give or take the socket's buffer. */
    gemmd_conn_progress(p->cx, pos);
    size_t total = p->head_len + p->data_len, off = (size_t)pos, n = 0;
    if (pos >= total) return MHD_CONTENT_READER_END_OF_STREAM;
    if (off < p->head_len) {
        n = p->head_len - off < max ? p->head_len - off : max;
        memcpy(buf, p->head + off, n);
        off += n;
    }
    if (n < max && off < total) {
        size_t k = total - off < max - n ? total - off : max - n;
        memcpy(buf + n, p->data + (off - p->head_len), k);
        n += k;
    }
    return (ssize_t)n;
}

/* data has been read: freed with alloc (when set), and released. */
static void done_with(const gemm_allocator *alloc, const void *data, void (*release)(void *ctx), void *ctx)
{
    if (alloc) gemm_free(alloc, (void *)data);
    if (release) release(ctx);
}

static void let_go(payload *p)
{
    done_with(p->data_alloc, p->data, p->release, p->ctx);
    free(p->owned);
    gemmd_budget_release(p->budget, GEMMD_MEM_ANSWER, p->charge);
}

static void payload_free(void *cls)
{
    let_go(cls);
    free(cls);
}

/* head (NULL: none) and data as a payload; NULL, everything let go, when out of memory. */
static payload *payload_new(gemmd_request *req, gemm_buf *head, uint64_t charge, const void *data, size_t data_len,
                            const gemm_allocator *data_alloc, void (*release)(void *ctx), void *ctx)
{
    payload tmp = {.budget = req->svc->budget, .charge = charge, .data = data, .data_len = data_len,
                   .data_alloc = data_alloc, .release = release, .ctx = ctx, .cx = req->cx};
    if (head) {
        tmp.head = tmp.owned = head->data;
        tmp.head_len = head->len;
        gemm_buf_init(head);
    }
    payload *p = malloc(sizeof *p);
    if (p) *p = tmp;
    else let_go(&tmp);
    return p;
}

/* The response of p (taken over): sent from where it lies, unless the send deadline needs to
 * know how much the client has taken (gemmd_conn_needs_progress) or reader asks for it:
 * then through payload_read, block by block. */
static struct MHD_Response *payload_response(gemmd_request *req, payload *p, int reader)
{
    if (!p) return NULL;
    uint64_t total = (uint64_t)p->head_len + p->data_len;
    struct MHD_Response *r;
    if (reader || gemmd_conn_needs_progress(req->cx, total)) {
        /* libmicrohttpd allocates and zeroes a buffer of the block size with every callback
         * response: 256 KiB for a 16 KiB answer made the allocator map, fault in and unmap
         * fresh pages on every small product (13% of the daemon's CPU time at 64^2). An
         * answer smaller than a block gets a buffer of its own size. */
        size_t block = total >= PAYLOAD_BLOCK ? PAYLOAD_BLOCK : total > 0 ? (size_t)total : 1;
        r = MHD_create_response_from_callback(total, block, payload_read, p, payload_free);
    } else { /* no buffer of libmicrohttpd's to allocate, zero and copy into */
        struct MHD_IoVec iov[2];
        unsigned n = 0;
        if (p->head_len) iov[n++] = (struct MHD_IoVec){p->head, p->head_len};
        if (p->data_len) iov[n++] = (struct MHD_IoVec){p->data, p->data_len};
        r = MHD_create_response_from_iovec(iov, n, payload_free, p);
    }
    if (!r) payload_free(p);
    else req->bytes_out = total;
    return r;
}

enum MHD_Result gemmd_respond_parts(gemmd_request *req, int status, const char *mime, gemm_buf *head, uint64_t charge,
                                    const void *data, size_t data_len, const gemm_allocator *free_with,
                                    const char *name, const char *value)
{
    payload *p = payload_new(req, head, charge, data, data_len, free_with, NULL, NULL);
    struct MHD_Response *r = payload_response(req, p, 0);
    if (r) {
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, mime);
        if (name) MHD_add_response_header(r, name, value);
    }
    return gemmd_respond_queue(req, status, r);
}

/* ---- products ---------------------------------------------------------------------- */

/* A resident matrix in an answer of any format: X-Gemm-Matrix and its Location. */
static void add_matrix_headers(struct MHD_Response *r, const char *id)
{
    char loc[GEMMD_JOB_ID_LEN + 24];
    snprintf(loc, sizeof loc, "/v1/matrices/%s", id);
    MHD_add_response_header(r, "X-Gemm-Matrix", id);
    MHD_add_response_header(r, MHD_HTTP_HEADER_LOCATION, loc);
}

/* The most bytes the JSON of a rows x cols answer can take: the widest element and its
 * comma, a row's brackets, and room for the fields around C. */
uint64_t gemmd_json_answer_bytes(uint64_t rows, uint64_t cols, gemm_dtype d)
{
    size_t t, brackets;
    if (!gemm_mul_size(rows, cols, &t) || !gemm_mul_size(t, gemm_json_elem_width(d), &t) ||
        !gemm_mul_size(rows, 3, &brackets) || !gemm_add_size(t, brackets, &t) || !gemm_add_size(t, 8192, &t))
        return UINT64_MAX;
    return t;
}

uint64_t gemmd_answer_rows(uint64_t m, uint64_t batch)
{
    size_t rows;
    return gemm_mul_size(m, batch ? batch : 1, &rows) ? rows : UINT64_MAX;
}

enum MHD_Result gemmd_respond_encoded_json(gemmd_request *req, int status, gemm_buf *b, uint64_t charge,
                                           const char *matrix_id)
{
    struct MHD_Response *r = payload_response(req, payload_new(req, b, charge, NULL, 0, NULL, NULL, NULL), 1);
    if (r) {
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
        if (matrix_id) add_matrix_headers(r, matrix_id);
    }
    return gemmd_respond_queue(req, status, r);
}

static void split_json(gemm_buf *b, const gemm_job *job)
{
    if (!job || job->split_panels < 2) return;
    int np = job->split_panels > GEMM_SPLIT_MAX ? GEMM_SPLIT_MAX : job->split_panels;
    gemm_buf_printf(b, ",\"split\":{\"panels\":%d,\"rows\":[", np);
    for (int i = 0; i < np; i++) gemm_buf_printf(b, "%s%llu", i ? "," : "", (unsigned long long)job->split[i].rows);
    gemm_buf_puts(b, "],\"devices\":[");
    for (int i = 0; i < np; i++) {
        if (i) gemm_buf_puts(b, ",");
        gemm_buf_json_string(b, job->split[i].device);
    }
    gemm_buf_puts(b, "],\"streams\":[");
    for (int i = 0; i < np; i++) gemm_buf_printf(b, "%s%d", i ? "," : "", job->split[i].stream);
    gemm_buf_puts(b, "],\"kernel_ms\":[");
    for (int i = 0; i < np; i++)
        gemm_buf_printf(b, "%s%.4f", i ? "," : "", isfinite(job->split[i].kernel_ms) ? job->split[i].kernel_ms : 0.0);
    gemm_buf_puts(b, "]}");
}

static void add_product_headers(struct MHD_Response *r, uint64_t rows, uint64_t cols, const gemmd_product_meta *m)
{
    const gemm_job *job = m->job;
    char v[72];
    if (job && job->batch)
        snprintf(v, sizeof v, "%llu,%llu,%llu", (unsigned long long)job->batch, (unsigned long long)rows,
                 (unsigned long long)cols);
    else
        snprintf(v, sizeof v, "%llu,%llu", (unsigned long long)rows, (unsigned long long)cols);
    MHD_add_response_header(r, "X-Gemm-Shape", v);
    if (job && job->batched) {
        snprintf(v, sizeof v, "%llu %s", (unsigned long long)job->batched, job->batch_mode);
        MHD_add_response_header(r, "X-Gemm-Batched", v);
    }
    MHD_add_response_header(r, "X-Gemm-Dtype", gemm_dtype_name(job ? gemm_job_c_dtype(job) : m->dtype));
    snprintf(v, sizeof v, "%d", job ? job->tile_used : 0);
    MHD_add_response_header(r, "X-Gemm-Tile", v);
    if (job && job->block[0]) MHD_add_response_header(r, "X-Gemm-Block", job->block);
    if (job) MHD_add_response_header(r, "X-Gemm-Math", gemm_math_report_name(job->dtype, job->math_used));
    if (m->job_id) MHD_add_response_header(r, "X-Gemm-Job", m->job_id);
    if (m->matrix_id) add_matrix_headers(r, m->matrix_id);
}

int gemmd_answer_text_begin(gemmd_request *req, uint64_t est, gemm_buf *b, uint64_t *outside, gemm_err *err)
{
    gemm_buf_init(b);
    *outside = 0;
    if (est > SIZE_MAX || gemmd_resv_take(&req->resv, req->svc->budget, GEMMD_MEM_ANSWER, est, outside) != 0)
        return gemmd_budget_refuse(req->svc->budget, est, "the JSON answer", err, &req->retry_after_s);
    b->data = malloc((size_t)est);
    b->cap = b->data ? (size_t)est : 0;
    b->failed = !b->data;
    return 0;
}

int gemmd_answer_text_end(gemmd_request *req, gemm_buf *b, uint64_t est, uint64_t outside, uint64_t *charge)
{
    gemmd_budget *bud = req->svc->budget;
    if (b->failed) {
        gemm_buf_free(b);
        gemmd_budget_release(bud, GEMMD_MEM_ANSWER, outside);
        return -1;
    }
    char *shrunk = realloc(b->data, b->len + 1);
    if (shrunk) {
        b->data = shrunk;
        b->cap = b->len + 1;
    }
    /* Charged what is held now: the text itself (more, if it grew past the bound). */
    *charge = gemmd_budget_settle_to(bud, GEMMD_MEM_ANSWER, est, b->cap, outside);
    return 0;
}

int gemmd_encode_product_json(gemmd_request *req, const void *data, uint64_t rows, uint64_t cols,
                              const gemmd_product_meta *meta, void (*release)(void *ctx), void *ctx, gemm_buf *out,
                              uint64_t *charge, gemm_err *err)
{
    const gemm_job *job = meta->job;
    note_job(req, job);
    fill_request_times(req);
    gemm_dtype dt = job ? gemm_job_c_dtype(job) : meta->dtype;
    uint64_t batch = job ? job->batch : 0, nb = batch ? batch : 1, outside;
    /* The text is admitted at its largest before it is written (a batch: rows * nb rows,
     * and each matrix its own "[", "]" and ","), and its charge goes with it until MHD is
     * done sending it. */
    size_t est = gemmd_json_answer_bytes(gemmd_answer_rows(rows, batch), cols, dt), brackets;
    if (batch && (!gemm_mul_size(3, nb, &brackets) || !gemm_add_size(est, brackets, &est))) est = UINT64_MAX;
    *charge = 0;
    gemm_buf b;
    if (gemmd_answer_text_begin(req, est, &b, &outside, err) != 0) {
        done_with(meta->free_with, data, release, ctx);
        return -1;
    }
    size_t one = 0;
    gemm_matrix_bytes(rows, cols, dt, &one);
    double t0 = gemm_now_ms();
    gemm_matrix c = {rows, cols, dt, (void *)data, 0};
    gemm_buf_puts(&b, "{");
    if (meta->job_id) gemm_buf_printf(&b, "\"id\":\"%s\",", meta->job_id); /* ids need no escaping */
    if (meta->matrix_id)
        gemm_buf_printf(&b, "\"matrix_id\":\"%s\",\"location\":\"/v1/matrices/%s\",", meta->matrix_id,
                        meta->matrix_id);
    gemm_buf_puts(&b, batch ? "\"c\":[" : "\"c\":"); /* a batch: nested 3-D, one matrix after the other */
    for (uint64_t i = 0; i < nb; i++) {
        if (i) gemm_buf_puts(&b, ",");
        c.data = (char *)data + i * one;
        gemm_json_write_matrix(&b, &c);
    }
    gemm_buf_puts(&b, batch ? "],\"shape\":[" : ",\"shape\":[");
    if (batch) gemm_buf_printf(&b, "%llu,", (unsigned long long)batch);
    gemm_buf_printf(&b, "%llu,%llu],\"dtype\":", (unsigned long long)rows, (unsigned long long)cols);
    gemm_buf_json_string(&b, gemm_dtype_name(dt));
    if (job) gemmd_ran_json(&b, ",", job);
    else gemmd_ran_fields_json(&b, ",", "", 0, "", "", "");
    if (job && job->batched) {
        gemm_buf_printf(&b, ",\"batched\":{\"products\":%llu,\"mode\":", (unsigned long long)job->batched);
        gemm_buf_json_string(&b, job->batch_mode);
        gemm_buf_puts(&b, "}");
    }
    split_json(&b, job);
    done_with(meta->free_with, data, release, ctx); /* job may be what ctx owns */
    double t1 = gemm_now_ms();
    req->timing.encode_ms = t1 - t0;
    req->timing.total_ms = req->timing.total_base_ms + t1 - req->t_start_ms;
    gemm_buf_puts(&b, ",\"timing\":");
    gemmd_timing_json(&b, &req->timing);
    gemm_buf_puts(&b, "}\n");
    if (gemmd_answer_text_end(req, &b, est, outside, charge) != 0)
        return gemm_err_set(err, 500, "out_of_memory", "cannot build the JSON answer");
    *out = b;
    return 0;
}

enum MHD_Result gemmd_respond_product(gemmd_request *req, int status, gemmd_format fmt, const void *data,
                                      uint64_t rows, uint64_t cols, const gemmd_product_meta *meta,
                                      void (*release)(void *ctx), void *ctx)
{
    if (fmt == GEMMD_FMT_JSON) {
        gemm_buf b;
        uint64_t charge = 0;
        gemm_err e;
        if (gemmd_encode_product_json(req, data, rows, cols, meta, release, ctx, &b, &charge, &e) != 0)
            return gemmd_respond_error(req, &e);
        return gemmd_respond_encoded_json(req, status, &b, charge, meta->matrix_id);
    }
    const gemm_job *job = meta->job;
    note_job(req, job);
    fill_request_times(req);
    gemm_dtype dt = job ? gemm_job_c_dtype(job) : meta->dtype;
    uint64_t batch = job ? job->batch : 0;
    size_t one = 0, len = 0; /* checked when C was allocated */
    if (gemm_matrix_bytes(rows, cols, dt, &one)) gemm_mul_size(one, batch ? batch : 1, &len);
    payload *p = payload_new(req, NULL, 0, data, len, meta->free_with, release, ctx);
    if (p && fmt == GEMMD_FMT_NPY) {
        p->head = p->prefix;
        p->head_len = gemm_npy_write_header3(p->prefix, sizeof p->prefix, dt, batch, rows, cols);
    }
    struct MHD_Response *r = payload_response(req, p, 0); /* no encoding: the total is taken as it is queued */
    if (r) {
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                                fmt == GEMMD_FMT_NPY ? "application/x-npy" : "application/octet-stream");
        add_product_headers(r, rows, cols, meta);
    }
    return gemmd_respond_queue(req, status, r);
}
