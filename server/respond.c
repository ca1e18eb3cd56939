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

#include "instance.h"

#define PAYLOAD_BLOCK (256 * 1024)

/* libmicrohttpd allocates and zeroes a buffer of the block size with every callback
 * response: 256 KiB for a 16 KiB answer made the allocator map, fault in and unmap fresh
 * pages on every small product (13% of the daemon's CPU time at 64^2). An answer smaller
 * than a block gets a buffer of its own size. */
size_t gemmd_payload_block(uint64_t total)
{
    return total >= PAYLOAD_BLOCK ? PAYLOAD_BLOCK : total > 0 ? (size_t)total : 1;
}
/* JSON answers that may be larger than this are encoded on an offload thread. */
#define GEMMD_JSON_OFFLOAD_BYTES (1u << 20)

/* ---- Accept ----------------------------------------------------------------- */

const char *gemmd_format_mime(gemmd_format f)
{
    switch (f) {
    case GEMMD_FMT_JSON: return "application/json";
    case GEMMD_FMT_RAW: return "application/octet-stream";
    case GEMMD_FMT_NPY: return "application/x-npy";
    default: return "application/json";
    }
}

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
            if (*a == ';') {
                const char *b = a + 1;
                while (*b == ' ') b++;
                if ((b[0] == 'q' || b[0] == 'Q') && b[1] == '=') q = strtod(b + 2, NULL);
            }
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
    gemmd_conn_answer(req->cx, req->bytes_out); /* the send deadline starts */
    enum MHD_Result rc = MHD_queue_response(req->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    if (rc == MHD_YES) req->status = status;
    req->phase = REQ_DONE;
    return rc;
}

static struct MHD_Response *from_buf(gemm_buf *body)
{
    if (body->failed) {
        gemm_buf_free(body);
        return NULL;
    }
    struct MHD_Response *r;
    if (body->len == 0) {
        r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        gemm_buf_free(body);
    } else {
        r = MHD_create_response_from_buffer(body->len, body->data, MHD_RESPMEM_MUST_FREE);
        if (r) {
            gemm_buf_init(body); /* MHD owns the bytes now */
        } else {
            gemm_buf_free(body);
        }
    }
    return r;
}

enum MHD_Result gemmd_respond_buf(gemmd_request *req, int status, const char *mime, gemm_buf *body)
{
    size_t len = body->len;
    struct MHD_Response *r = from_buf(body);
    if (r && mime) MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, mime);
    if (r) req->bytes_out = len;
    return gemmd_respond_queue(req, status, r);
}

enum MHD_Result gemmd_respond_json(gemmd_request *req, int status, gemm_buf *body)
{
    return gemmd_respond_buf(req, status, "application/json", body);
}

enum MHD_Result gemmd_respond_json_header(gemmd_request *req, int status, gemm_buf *body, const char *name,
                                          const char *value)
{
    size_t len = body->len;
    struct MHD_Response *r = from_buf(body);
    if (r) {
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
        MHD_add_response_header(r, name, value);
        req->bytes_out = len;
    }
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
    gemm_buf b;
    gemm_buf_init(&b);
    if (v2) {
        gemm_buf_puts(&b, "{\"error\":");
        gemm_buf_json_string(&b, msg);
        gemm_buf_puts(&b, ",\"code\":");
        gemm_buf_json_string(&b, code);
        gemm_buf_puts(&b, "}\n");
    } else {
        gemm_buf_puts(&b, "{\"error\":{\"code\":");
        gemm_buf_json_string(&b, code);
        gemm_buf_puts(&b, ",\"message\":");
        gemm_buf_json_string(&b, msg);
        gemm_buf_puts(&b, "}}\n");
    }
    size_t len = b.len;
    struct MHD_Response *r = from_buf(&b);
    if (r) {
        req->bytes_out = len;
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
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

enum MHD_Result gemmd_respond_abandoned(gemmd_request *req)
{
    return gemmd_respond_errorf(req, 503, "shutting_down",
                                "the server is shutting down and the product did not finish within "
                                "shutdown_timeout; retry elsewhere");
}

enum MHD_Result gemmd_respond_errorf(gemmd_request *req, int status, const char *code, const char *fmt, ...)
{
    gemm_err e;
    gemm_err_clear(&e);
    e.status = status;
    snprintf(e.code, sizeof e.code, "%s", code);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    va_end(ap);
    return gemmd_respond_error(req, &e);
}

/* ---- products ---------------------------------------------------------------- */

typedef struct {
    unsigned char prefix[128];
    size_t prefix_len;
    const unsigned char *data;
    size_t data_len;
    void (*release)(void *ctx);
    void *ctx;
    gemmd_conn *cx;         /* told how much the client has taken (send deadline) */
} payload;

ssize_t gemmd_read_two_parts(const void *head, size_t head_len, const void *data, size_t data_len, uint64_t pos,
                             char *buf, size_t max)
{
    size_t total = head_len + data_len;
    if (pos >= total) return MHD_CONTENT_READER_END_OF_STREAM;
    size_t off = (size_t)pos, n = 0;
    if (off < head_len) {
        size_t k = head_len - off < max ? head_len - off : max;
        memcpy(buf, (const char *)head + off, k);
        n += k;
        off += k;
    }
    if (n < max && off < total) {
        size_t doff = off - head_len;
        size_t k = data_len - doff < max - n ? data_len - doff : max - n;
        memcpy(buf + n, (const char *)data + doff, k);
        n += k;
    }
    return (ssize_t)n;
}

struct MHD_Response *gemmd_two_part_response(gemmd_conn *cx, const void *head, size_t head_len, const void *data,
                                             size_t data_len, MHD_ContentReaderCallback read,
                                             MHD_ContentReaderFreeCallback free_cb, void *cls)
{
    uint64_t total = (uint64_t)head_len + data_len;
    if (gemmd_conn_needs_progress(cx, total))
        return MHD_create_response_from_callback(total, gemmd_payload_block(total), read, cls, free_cb);
    /* No buffer of libmicrohttpd's to allocate, zero and copy into, as a reader needs. */
    struct MHD_IoVec iov[2];
    unsigned n = 0;
    if (head_len) iov[n++] = (struct MHD_IoVec){head, head_len};
    if (data_len) iov[n++] = (struct MHD_IoVec){data, data_len};
    return MHD_create_response_from_iovec(iov, n, free_cb, cls);
}

static ssize_t payload_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    payload *p = cls;
    /* MHD asks for more once what it had was sent: pos is what the client has taken,
     * give or take the socket's buffer. */
    gemmd_conn_progress(p->cx, pos);
    return gemmd_read_two_parts(p->prefix, p->prefix_len, p->data, p->data_len, pos, buf, max);
}

static void payload_free(void *cls)
{
    payload *p = cls;
    if (p->release) p->release(p->ctx);
    free(p);
}

/* ---- charged JSON answers ------------------------------------------------------ */

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
    uint64_t per = gemm_json_elem_width(d);
    if (rows && cols > UINT64_MAX / rows / per) return UINT64_MAX;
    return rows * cols * per + rows * 3 + 8192;
}

typedef struct {
    char *data;
    size_t len;
    gemmd_budget *budget;
    uint64_t charge;
    gemmd_conn *cx;
} charged_text;

static ssize_t text_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    charged_text *t = cls;
    gemmd_conn_progress(t->cx, pos);
    return gemmd_read_two_parts(t->data, t->len, NULL, 0, pos, buf, max);
}

static void text_free(void *cls)
{
    charged_text *t = cls;
    free(t->data);
    gemmd_budget_release(t->budget, GEMMD_MEM_ANSWER, t->charge);
    free(t);
}

enum MHD_Result gemmd_respond_encoded_json(gemmd_request *req, int status, gemm_buf *b, uint64_t charge,
                                           const char *matrix_id)
{
    gemmd_budget *bud = req->svc->budget;
    charged_text *t = calloc(1, sizeof *t);
    if (!t) {
        gemm_buf_free(b);
        gemmd_budget_release(bud, GEMMD_MEM_ANSWER, charge);
        return gemmd_respond_queue(req, 500, NULL);
    }
    t->data = b->data;
    t->len = b->len;
    gemm_buf_init(b);
    t->budget = bud;
    t->charge = charge;
    t->cx = req->cx;
    struct MHD_Response *r = MHD_create_response_from_callback(t->len, gemmd_payload_block(t->len), text_read, t, text_free);
    if (!r) {
        text_free(t);
        return gemmd_respond_queue(req, 500, NULL);
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    if (matrix_id) add_matrix_headers(r, matrix_id);
    req->bytes_out = t->len;
    return gemmd_respond_queue(req, status, r);
}

void gemmd_split_header(const gemm_job *job, char *out, size_t cap)
{
    if (cap == 0) return;
    out[0] = '\0';
    if (!job || job->split_panels < 2) return;
    int np = job->split_panels > GEMM_SPLIT_MAX ? GEMM_SPLIT_MAX : job->split_panels;
    size_t off = 0;
#define PUT(...)                                                                 \
    do {                                                                         \
        int w_ = snprintf(out + off, off < cap ? cap - off : 0, __VA_ARGS__);    \
        if (w_ > 0) off += (size_t)w_;                                           \
    } while (0)
    PUT("panels=%d; rows=", np);
    for (int i = 0; i < np; i++) PUT("%s%llu", i ? "," : "", (unsigned long long)job->split[i].rows);
    PUT("; devices=");
    for (int i = 0; i < np; i++) {
        const char *d = job->split[i].device;
        size_t len = strcspn(d, " ");
        PUT("%s%.*s", i ? "," : "", (int)len, d);
    }
#undef PUT
    if (off >= cap) out[0] = '\0'; /* never a cut header: cap is sized for GEMM_SPLIT_MAX */
}

void gemmd_split_json(gemm_buf *b, const gemm_job *job)
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
    char shape[72];
    if (m->batch)
        snprintf(shape, sizeof shape, "%llu,%llu,%llu", (unsigned long long)m->batch, (unsigned long long)rows,
                 (unsigned long long)cols);
    else
        snprintf(shape, sizeof shape, "%llu,%llu", (unsigned long long)rows, (unsigned long long)cols);
    MHD_add_response_header(r, "X-Gemm-Shape", shape);
    if (m->batched) {
        char b[48];
        snprintf(b, sizeof b, "%llu %s", (unsigned long long)m->batched, m->batch_mode ? m->batch_mode : "");
        MHD_add_response_header(r, "X-Gemm-Batched", b);
    }
    MHD_add_response_header(r, "X-Gemm-Dtype", gemm_dtype_name(m->dtype));
    char tile[16];
    snprintf(tile, sizeof tile, "%d", m->tile);
    MHD_add_response_header(r, "X-Gemm-Tile", tile);
    if (m->block && m->block[0]) MHD_add_response_header(r, "X-Gemm-Block", m->block);
    if (m->math) MHD_add_response_header(r, "X-Gemm-Math", m->math);
    if (m->job_id) MHD_add_response_header(r, "X-Gemm-Job", m->job_id);
    if (m->matrix_id) add_matrix_headers(r, m->matrix_id);
}

int gemmd_json_answer_is_big(uint64_t rows, uint64_t cols, gemm_dtype d)
{
    return gemmd_json_answer_bytes(rows, cols, d) >= GEMMD_JSON_OFFLOAD_BYTES;
}

int gemmd_encode_product_json(gemmd_request *req, const void *data, uint64_t rows, uint64_t cols,
                              const gemmd_product_meta *meta, void (*release)(void *ctx), void *ctx, gemm_buf *out,
                              uint64_t *charge, gemm_err *err)
{
    if (meta->kernel) snprintf(req->hdr_kernel, sizeof req->hdr_kernel, "%s", meta->kernel);
    if (meta->device) snprintf(req->hdr_device, sizeof req->hdr_device, "%s", meta->device);
    gemmd_split_header(meta->split, req->hdr_split, sizeof req->hdr_split);
    fill_request_times(req);
    /* The text is admitted against the memory budget at its largest before it is written,
     * and its charge goes with it until MHD is done sending it. */
    gemmd_budget *bud = req->svc->budget;
    uint64_t nb = meta->batch ? meta->batch : 1;
    /* a batch: rows * nb rows, and each matrix its own "[", "]" and "," */
    uint64_t est = gemmd_json_answer_bytes(rows * nb, cols, meta->dtype);
    if (meta->batch && est != UINT64_MAX) est += 3 * nb;
    gemm_buf_init(out);
    *charge = 0;
    uint64_t outside = 0; /* what the request's reservation does not cover */
    if (est > SIZE_MAX || gemmd_resv_take(&req->resv, bud, GEMMD_MEM_ANSWER, est, &outside) != 0) {
        if (release) release(ctx);
        return gemmd_budget_refuse(bud, est, "the JSON answer", err, &req->retry_after_s);
    }
    gemm_buf b;
    gemm_buf_init(&b);
    b.data = malloc((size_t)est);
    b.cap = b.data ? (size_t)est : 0;
    b.failed = !b.data;
    size_t one = 0;
    gemm_matrix_bytes(rows, cols, meta->dtype, &one);
    double t0 = gemm_now_ms();
    gemm_matrix c = {rows, cols, meta->dtype, (void *)data, 0};
    gemm_buf_puts(&b, "{");
    if (meta->job_id) {
        gemm_buf_puts(&b, "\"id\":");
        gemm_buf_json_string(&b, meta->job_id);
        gemm_buf_puts(&b, ",");
    }
    if (meta->matrix_id)
        gemm_buf_printf(&b, "\"matrix_id\":\"%s\",\"location\":\"/v1/matrices/%s\",", meta->matrix_id,
                        meta->matrix_id);
    gemm_buf_puts(&b, "\"c\":");
    if (meta->batch) { /* nested 3-D: one matrix after the other */
        gemm_buf_puts(&b, "[");
        for (uint64_t i = 0; i < meta->batch; i++) {
            if (i) gemm_buf_puts(&b, ",");
            c.data = (char *)data + i * one;
            gemm_json_write_matrix(&b, &c);
        }
        gemm_buf_puts(&b, "]");
        gemm_buf_printf(&b, ",\"shape\":[%llu,%llu,%llu],\"dtype\":", (unsigned long long)meta->batch,
                        (unsigned long long)rows, (unsigned long long)cols);
    } else {
        gemm_json_write_matrix(&b, &c);
        gemm_buf_printf(&b, ",\"shape\":[%llu,%llu],\"dtype\":", (unsigned long long)rows,
                        (unsigned long long)cols);
    }
    gemm_buf_json_string(&b, gemm_dtype_name(meta->dtype));
    gemm_buf_puts(&b, ",\"kernel\":");
    gemm_buf_json_string(&b, meta->kernel ? meta->kernel : "");
    gemm_buf_printf(&b, ",\"tile\":%d,\"block\":", meta->tile);
    gemm_buf_json_string(&b, meta->block ? meta->block : "");
    gemm_buf_puts(&b, ",\"math\":");
    gemm_buf_json_string(&b, meta->math ? meta->math : "");
    gemm_buf_puts(&b, ",\"device\":");
    gemm_buf_json_string(&b, meta->device ? meta->device : "");
    if (meta->batched) {
        gemm_buf_printf(&b, ",\"batched\":{\"products\":%llu,\"mode\":", (unsigned long long)meta->batched);
        gemm_buf_json_string(&b, meta->batch_mode ? meta->batch_mode : "");
        gemm_buf_puts(&b, "}");
    }
    gemmd_split_json(&b, meta->split);
    if (release) release(ctx); /* meta may point into what ctx owns */
    double t1 = gemm_now_ms();
    req->timing.encode_ms = t1 - t0;
    req->timing.total_ms = req->timing.total_base_ms + t1 - req->t_start_ms;
    gemm_buf_puts(&b, ",\"timing\":");
    gemmd_timing_json(&b, &req->timing);
    gemm_buf_puts(&b, "}\n");
    if (b.failed) {
        gemm_buf_free(&b);
        gemmd_budget_release(bud, GEMMD_MEM_ANSWER, outside);
        return gemm_err_set(err, 500, "out_of_memory", "cannot build the JSON answer");
    }
    /* Charged what is held now: the text itself (more, if it grew past the bound). */
    char *shrunk = realloc(b.data, b.len + 1);
    if (shrunk) {
        b.data = shrunk;
        b.cap = b.len + 1;
    }
    *out = b;
    *charge = gemmd_budget_settle_to(bud, GEMMD_MEM_ANSWER, est, b.cap, outside);
    return 0;
}

enum MHD_Result gemmd_respond_product(gemmd_request *req, int status, gemmd_format fmt, const void *data,
                                      uint64_t rows, uint64_t cols, const gemmd_product_meta *meta,
                                      void (*release)(void *ctx), void *ctx)
{
    if (meta->kernel) snprintf(req->hdr_kernel, sizeof req->hdr_kernel, "%s", meta->kernel);
    if (meta->device) snprintf(req->hdr_device, sizeof req->hdr_device, "%s", meta->device);
    gemmd_split_header(meta->split, req->hdr_split, sizeof req->hdr_split);
    size_t bytes = 0, one = 0;
    gemm_matrix_bytes(rows, cols, meta->dtype, &one);
    bytes = one * (size_t)(meta->batch ? meta->batch : 1); /* checked when C was allocated */
    fill_request_times(req);

    if (fmt == GEMMD_FMT_JSON) {
        gemm_buf b;
        uint64_t charge = 0;
        gemm_err e;
        if (gemmd_encode_product_json(req, data, rows, cols, meta, release, ctx, &b, &charge, &e) != 0)
            return gemmd_respond_error(req, &e);
        return gemmd_respond_encoded_json(req, status, &b, charge, meta->matrix_id);
    }

    payload *p = calloc(1, sizeof *p);
    if (!p) {
        if (release) release(ctx);
        return gemmd_respond_queue(req, 500, NULL);
    }
    p->data = data;
    p->data_len = bytes;
    p->release = release;
    p->ctx = ctx;
    p->cx = req->cx;
    if (fmt == GEMMD_FMT_NPY)
        p->prefix_len = gemm_npy_write_header3(p->prefix, sizeof p->prefix, meta->dtype, meta->batch, rows, cols);
    req->timing.encode_ms = 0;
    req->timing.total_ms = req->timing.total_base_ms + gemm_now_ms() - req->t_start_ms;
    uint64_t total = p->prefix_len + p->data_len;
    struct MHD_Response *r = gemmd_two_part_response(req->cx, p->prefix, p->prefix_len, p->data, p->data_len,
                                                     payload_read, payload_free, p);
    if (!r) {
        payload_free(p);
        return gemmd_respond_queue(req, 500, NULL);
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, gemmd_format_mime(fmt));
    add_product_headers(r, rows, cols, meta);
    req->bytes_out = total;
    return gemmd_respond_queue(req, status, r);
}
