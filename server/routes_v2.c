/*
 * routes_v2.c - the Open Inference Protocol (KServe v2; docs/V2.md): health, metadata and
 * inference of the one model "matmul" (A, B -> C = A.B).
 *
 * The JSON header (the whole body, or its first Inference-Header-Content-Length bytes) is
 * buffered, charged as it grows, and parsed once complete; the binary tensor bytes that
 * follow go straight into A and B. The product takes the path of POST /v1/matmul, and its
 * answer comes back through gemmd_v2_answer.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "body.h"
#include "config.h"
#include "respond.h"
#include "routes.h"
#include "v2_codec.h"

struct gemmd_v2 {
    char *json;               /* the JSON header, json_cap bytes charged (kind bodies) */
    size_t json_len, json_cap;
    /* memory the header takes from the request's reservation (or beyond it: outside) */
    uint64_t json_outside, parse_bytes, parse_outside;
    int has_header_len;       /* Inference-Header-Content-Length was given */
    uint64_t header_len;
    int parsed;               /* the header is parsed and A, B are allocated */
    gemm_v2_request r;
    struct {
        char *dst;
        size_t len;
    } seg[2];                 /* where the binary tensor data goes, in body order */
    int nseg, cur;
    size_t seg_off;
    uint64_t binary_total, binary_got;
};

/* The header's text and its parse go back to the reservation (what was beyond it, to the
 * budget). */
static void give_back(gemmd_request *req)
{
    gemmd_v2 *v = req->v2;
    gemmd_resv_give(&req->resv, req->svc->budget, GEMMD_MEM_BODY, v->json_cap, v->json_outside);
    gemmd_resv_give(&req->resv, req->svc->budget, GEMMD_MEM_BODY, v->parse_bytes, v->parse_outside);
    free(v->json);
    v->json = NULL;
    v->json_len = v->json_cap = 0;
    v->json_outside = v->parse_bytes = v->parse_outside = 0;
}

void gemmd_v2_end(gemmd_request *req)
{
    gemmd_v2 *v = req->v2;
    if (v) {
        give_back(req);
        gemm_v2_request_free(&v->r);
        free(v);
        req->v2 = NULL;
    }
    gemmd_operands_end(req);
}

/* ---- routing: the model named in the path -------------------------------------------- */

#define V2_ROUTES "/v2, /v2/health/{live,ready} and /v2/models/" GEMM_V2_MODEL "[/versions/" GEMM_V2_MODEL_VERSION \
                  "][/ready|/infer]"

enum MHD_Result gemmd_v2_not_found(gemmd_request *req, const char *path)
{
    return gemmd_respond_errorf(req, 404, "not_found", "no route %.60s; the v2 routes are " V2_ROUTES, path);
}

/* 0 when the path names this server's model (and its version, if it names one); else
 * -1 with err set to the 404 that says what is served. */
static int check_model(const gemmd_request *req, gemm_err *err)
{
    const char *model = req->param[0], *version = req->param[1];
    if (strcmp(model, GEMM_V2_MODEL) != 0)
        return gemm_err_set(err, 404, "not_found", "unknown model '%.60s'; this server serves model '" GEMM_V2_MODEL "'",
                            model);
    if (strstr(req->route->pattern, "{version}") && strcmp(version, GEMM_V2_MODEL_VERSION) != 0)
        return gemm_err_set(err, 404, "not_found",
                            "model '" GEMM_V2_MODEL "' has no version '%.40s'; its version is " GEMM_V2_MODEL_VERSION,
                            version);
    return 0;
}

/* ---- health and metadata ------------------------------------------------------------- */

#define TENSOR_META(name) "{\"name\":\"" name "\",\"datatype\":\"FP32\",\"shape\":[-1,-1]}"

enum MHD_Result gemmd_v2_model_meta(gemmd_request *req)
{
    gemm_err e;
    if (check_model(req, &e) != 0) return gemmd_respond_error(req, &e);
    const gemm_engine_info *in = &req->svc->info;
    gemm_buf b = {0};
    gemm_buf_puts(&b, "{\"name\":\"" GEMM_V2_MODEL "\",\"versions\":[\"" GEMM_V2_MODEL_VERSION "\"],"
                      "\"platform\":\"gemmd\",\"inputs\":[" TENSOR_META("A") "," TENSOR_META("B") "],"
                      "\"outputs\":[" TENSOR_META("C"));
    /* The tensors' datatype is the default one; A and B may be any of these, alike (C: theirs,
     * or FP32 for FP16 / BF16 unless parameters.out_dtype asks for theirs). */
    gemm_buf_puts(&b, "],\"parameters\":{\"datatypes\":\"FP32,FP64,INT32,FP16,BF16\",\"out_dtypes\":"
                      "\"FP16:FP32|FP16,BF16:FP32|BF16\"");
    gemm_buf_printf(&b, ",\"backend\":\"%s\",\"kernels\":\"auto", in->backend); /* names: nothing to escape */
    unsigned maths = 0; /* the modes some kernel of this engine takes */
    for (int i = 0; i < in->nkernels; i++) {
        gemm_buf_printf(&b, ",%s", in->kernels[i].name);
        maths |= in->kernels[i].maths;
    }
    gemm_buf_puts(&b, "\",\"maths\":\"");
    for (int i = 0, n = 0; i < GEMM_MATH_COUNT; i++)
        if (maths & (1u << i)) gemm_buf_printf(&b, "%s%s", n++ ? "," : "", gemm_math_name((gemm_math)i));
    gemm_buf_puts(&b, "\"}}\n");
    return gemmd_respond_buf(req, 200, "application/json", &b, NULL);
}

enum MHD_Result gemmd_v2_server_meta(gemmd_request *req)
{
    gemm_buf b = {0};
    gemm_buf_puts(&b, "{\"name\":\"gemmd\",\"version\":\"" GEMMD_VERSION "\",\"extensions\":[\"binary_tensor_data\"]}\n");
    return gemmd_respond_buf(req, 200, "application/json", &b, NULL);
}

enum MHD_Result gemmd_v2_live(gemmd_request *req)
{
    if (!gemm_engine_healthy(req->svc->engine))
        return gemmd_respond_errorf(req, 400, "device_lost",
                                    "not live: the engine lost every device it uses; this process must be restarted");
    gemm_buf b = {0};
    gemm_buf_puts(&b, "{\"live\":true}\n");
    return gemmd_respond_buf(req, 200, "application/json", &b, NULL);
}

/* GET /v2/health/ready, and the model's /ready (a path that names it). */
enum MHD_Result gemmd_v2_ready(gemmd_request *req)
{
    int model = req->param[0][0] != '\0';
    gemm_err e;
    if (model && check_model(req, &e) != 0) return gemmd_respond_error(req, &e);
    if (gemmd_not_ready(req, &e) != 0)
        return gemmd_respond_errorf(req, 400, "not_ready", "not ready: %s", e.message);
    gemm_buf b = {0};
    if (!model) gemm_buf_puts(&b, "{\"ready\":true}\n");
    else gemm_buf_puts(&b, "{\"name\":\"" GEMM_V2_MODEL "\",\"ready\":true}\n");
    return gemmd_respond_buf(req, 200, "application/json", &b, NULL);
}

/* ---- inference: the body ------------------------------------------------------------- */

static int begin_infer(gemmd_request *req)
{
    gemmd_v2 *v = req->v2;
    gemm_err *err = &req->err;
    const char *ce = gemmd_request_header(req, MHD_HTTP_HEADER_CONTENT_ENCODING);
    if (ce && strcasecmp(ce, "identity") != 0)
        return gemm_err_set(err, 415, "unsupported_media_type",
                            "Content-Encoding %.40s is not supported; send the request uncompressed", ce);
    if (gemmd_request_read_length(req) != 0) return -1;
    const char *hl = gemmd_request_header(req, "Inference-Header-Content-Length");
    uint64_t json_max = req->svc->cfg.max_json_bytes;
    if (!hl) {
        /* All JSON: parsed whole, so the tighter of the two limits holds. */
        int json_tighter = json_max <= req->limit;
        req->limit_json = 1;
        if (json_tighter) req->limit = json_max;
        if (req->has_length && req->content_length > req->limit)
            return gemm_err_set(err, 413, "body_too_large",
                                json_tighter ? "the JSON body has %llu bytes; JSON bodies are parsed whole and may "
                                               "have at most %llu (max_json_mb); send the tensors as binary data "
                                               "(binary_data_size and Inference-Header-Content-Length)"
                                             : "the body has %llu bytes; this server takes at most %llu (max_body_mb)",
                                (unsigned long long)req->content_length, (unsigned long long)req->limit);
        /* held whole while it is parsed, then A, B and C; chunked: a guess, and what passes
         * it is charged as it comes */
        req->need = 2 * (req->has_length ? req->content_length : req->limit < (16u << 20) ? req->limit : 16u << 20);
        return 0;
    }
    if (gemm_parse_u64(hl, &v->header_len) != 0 || v->header_len == 0)
        return gemm_err_set(err, 400, "bad_header_length",
                            "Inference-Header-Content-Length \"%.40s\" is not a positive number", hl);
    v->has_header_len = 1;
    if (v->header_len > json_max)
        return gemm_err_set(err, 413, "body_too_large",
                            "the JSON header has %llu bytes; it may have at most %llu (max_json_mb); send the "
                            "tensors as binary data", (unsigned long long)v->header_len, (unsigned long long)json_max);
    if (!req->has_length)
        return gemm_err_set(err, 411, "length_required",
                            "a body with binary tensor data needs a Content-Length (not chunked): the server "
                            "checks it against the tensors' sizes before reading");
    if (req->content_length > req->limit)
        return gemm_err_set(err, 413, "body_too_large",
                            "the body has %llu bytes; this server takes at most %llu (max_body_mb)",
                            (unsigned long long)req->content_length, (unsigned long long)req->limit);
    if (v->header_len > req->content_length)
        return gemm_err_set(err, 400, "bad_header_length",
                            "Inference-Header-Content-Length (%llu) is larger than the body (%llu bytes)",
                            (unsigned long long)v->header_len, (unsigned long long)req->content_length);
    /* the binary tensor data becomes A and B: the body is what the inputs will hold, and C
     * (its shape is in the header: guessed as half of them until it is read) */
    req->need = req->content_length + req->content_length / 2;
    return 0;
}

/* Appends to the JSON buffer, growing it (by doubling) towards what the headers announce.
 * Each growth is charged before it is made, old and new block together while realloc may
 * hold both. */
static int json_append(gemmd_request *req, const char *data, size_t len)
{
    gemmd_v2 *v = req->v2;
    if (v->json_len + len + 1 > v->json_cap) {
        size_t old = v->json_cap, cap = old ? old : 4096;
        while (cap < v->json_len + len + 1) cap *= 2;
        uint64_t whole = v->has_header_len ? v->header_len : req->has_length ? req->content_length : 0;
        if (whole && cap > whole + 1) cap = (size_t)whole + 1;
        if (cap < v->json_len + len + 1) cap = v->json_len + len + 1;
        uint64_t outside, old_outside = v->json_outside;
        if (gemmd_resv_take(&req->resv, req->svc->budget, GEMMD_MEM_BODY, cap, &outside) != 0)
            return gemmd_budget_refuse(req->svc->budget, cap, "the JSON header", &req->err, &req->retry_after_s);
        char *p = realloc(v->json, cap);
        if (!p) {
            gemmd_resv_give(&req->resv, req->svc->budget, GEMMD_MEM_BODY, cap, outside);
            return gemm_err_set(&req->err, 503, "out_of_memory", "cannot buffer the JSON header now");
        }
        gemmd_resv_give(&req->resv, req->svc->budget, GEMMD_MEM_BODY, old, old_outside);
        v->json_outside = outside;
        v->json = p;
        v->json_cap = cap;
    }
    memcpy(v->json + v->json_len, data, len);
    v->json_len += len;
    v->json[v->json_len] = '\0';
    return 0;
}

/* The parse of the header is charged (kind bodies) before it allocates. */
static int admit_parse(void *user, uint64_t bytes, gemm_err *err)
{
    gemmd_request *req = user;
    gemmd_v2 *v = req->v2;
    uint64_t outside;
    if (gemmd_resv_take(&req->resv, req->svc->budget, GEMMD_MEM_BODY, bytes, &outside) != 0)
        return gemmd_budget_refuse(req->svc->budget, bytes, "parsing the JSON header", err, &req->retry_after_s);
    v->parse_bytes += bytes;
    v->parse_outside += outside;
    return 0;
}

/* The parsed header: checks the sizes against the body, allocates A and B (charged as
 * inputs), fills the JSON inputs and lays out where the binary bytes go. 0 or -1. */
static int take_inputs(gemmd_request *req)
{
    gemmd_v2 *v = req->v2;
    gemm_err *err = &req->err;
    gemm_v2_request *r = &v->r;
    uint64_t bin = 0;
    for (int i = 0; i < 2; i++)
        if (r->in[i].binary) bin += r->in[i].binary_bytes; /* each <= max_elements * 8: no overflow */
    if (req->has_length && (!v->has_header_len ? bin != 0 : req->content_length != v->header_len + bin))
        return gemm_err_set(err, 400, "length_mismatch",
                            "the body has %llu bytes but the JSON header (%llu) and the binary_data_size of the "
                            "inputs (%llu) add up to %llu", (unsigned long long)req->content_length,
                            (unsigned long long)v->header_len, (unsigned long long)bin,
                            (unsigned long long)(v->header_len + bin));

    gemmd_operands *op = req->op;
    gemm_matrix *m[2] = {&op->a, &op->b};
    for (int i = 0; i < 2; i++) {
        size_t bytes;
        gemm_matrix_bytes(r->in[i].rows, r->in[i].cols, r->dtype, &bytes); /* checked by the parser */
        if (!(m[i]->data = gemmd_request_alloc(req, bytes, i ? "B" : "A"))) return -1;
        m[i]->rows = r->in[i].rows;
        m[i]->cols = r->in[i].cols;
        m[i]->dtype = r->dtype;
        if (!r->in[i].binary && gemm_v2_fill_input(r, i, m[i]->data, err) != 0) return -1;
    }
    for (int k = 0; k < 2; k++) {
        int i = r->order[k];
        if (!r->in[i].binary) continue;
        v->seg[v->nseg].dst = m[i]->data;
        v->seg[v->nseg].len = r->in[i].binary_bytes;
        v->nseg++;
    }
    v->binary_total = bin;
    op->opt = r->opt;
    op->opt.dtype = r->dtype;
    if (gemmd_check_math(&op->opt, r->dtype, err) != 0) return -1; /* out_dtype and math, as on /v1 */
    v->parsed = 1;
    return 0;
}

/* The header is complete: parse it and take the inputs; then the header's text and its
 * parse are given back, whatever happened. 0 or -1 (req->err). */
static int header_done(gemmd_request *req)
{
    gemmd_v2 *v = req->v2;
    int rc = gemm_v2_parse_request_admitted(v->json, v->json_len, v->has_header_len, &req->svc->cfg.limits,
                                            admit_parse, req, &v->r, &req->err);
    if (rc == 0) rc = take_inputs(req);
    gemm_v2_release_json(&v->r);
    give_back(req);
    return rc;
}

void gemmd_v2_feed(gemmd_request *req, const char *data, size_t len)
{
    gemmd_v2 *v = req->v2;
    while (len && !req->failed) {
        if (!v->parsed) {
            size_t take = len;
            if (v->has_header_len && take > v->header_len - v->json_len) take = (size_t)(v->header_len - v->json_len);
            if (json_append(req, data, take) != 0 ||
                (v->has_header_len && v->json_len == v->header_len && header_done(req) != 0))
                req->failed = 1;
            data += take;
            len -= take;
            continue;
        }
        if (v->cur >= v->nseg) {
            gemm_err_set(&req->err, 400, "length_mismatch",
                         "the body is longer than the JSON header and the inputs' binary_data_size announce");
            req->failed = 1;
            return;
        }
        size_t room = v->seg[v->cur].len - v->seg_off;
        size_t n = len < room ? len : room;
        memcpy(v->seg[v->cur].dst + v->seg_off, data, n);
        v->seg_off += n;
        v->binary_got += n;
        data += n;
        len -= n;
        if (v->seg_off == v->seg[v->cur].len) {
            v->cur++;
            v->seg_off = 0;
        }
    }
}

/* ---- inference: the product ------------------------------------------------------------ */

int gemmd_v2_finish(gemmd_request *req)
{
    gemmd_v2 *v = req->v2;
    gemm_err *err = &req->err;
    req->t_body_ms = gemm_now_ms();
    if (!v->parsed) {
        if (v->has_header_len)
            return gemm_err_set(err, 400, "truncated", "the body ended inside the JSON header "
                                                       "(Inference-Header-Content-Length is larger than what came)");
        if (header_done(req) != 0) return -1;
    }
    if (v->binary_got != v->binary_total)
        return gemm_err_set(err, 400, "truncated", "the body ended after %llu of the %llu bytes of binary tensor data",
                            (unsigned long long)v->binary_got, (unsigned long long)v->binary_total);
    req->t_decoded_ms = gemm_now_ms();
    const gemmd_config *cfg = &req->svc->cfg;
    const gemmd_operands *op = req->op;
    if (!v->r.binary_output &&
        gemm_v2_json_bytes_bound(op->a.rows, op->b.cols, gemmd_c_dtype(op)) > cfg->max_json_bytes)
        return gemm_err_set(err, 400, "answer_too_large",
                            "C is %llux%llu: as JSON tensor data it could take more than the %llu bytes JSON is "
                            "limited to (max_json_mb); ask for it as binary data: \"outputs\": [{\"name\": \"C\", "
                            "\"parameters\": {\"binary_data\": true}}]", (unsigned long long)op->a.rows,
                            (unsigned long long)op->b.cols, (unsigned long long)cfg->max_json_bytes);
    gemmd_body_decoded(req);
    return 0;
}

enum MHD_Result gemmd_v2_infer(gemmd_request *req)
{
    req->op->answer = GEMMD_FMT_RAW;
    return gemmd_route_matmul(req);
}

/* The answer's "parameters": what ran where, and the timing (ms) of each stage. */
static void answer_parameters(gemm_buf *b, const gemm_job *job, const gemmd_timing *t)
{
    gemmd_ran_json(b, ",\"parameters\":{", job);
    if (job->split_panels >= 2) { /* the protocol's parameters are scalars: the split as three */
        int np = job->split_panels > GEMM_SPLIT_MAX ? GEMM_SPLIT_MAX : job->split_panels;
        gemm_buf_printf(b, ",\"split_panels\":%d,\"split_rows\":\"", np);
        for (int i = 0; i < np; i++) gemm_buf_printf(b, "%s%llu", i ? "," : "", (unsigned long long)job->split[i].rows);
        gemm_buf_puts(b, "\",\"split_devices\":\"");
        for (int i = 0; i < np; i++) /* labels up to their first space: "cuda:1", "cpu" (no quotes in them) */
            gemm_buf_printf(b, "%s%.*s", i ? "," : "", (int)strcspn(job->split[i].device, " \"\\"), job->split[i].device);
        gemm_buf_puts(b, "\"");
    }
    gemm_buf_printf(b,
                    ",\"recv_ms\":%.4f,\"decode_ms\":%.4f,\"queue_ms\":%.4f,\"h2d_ms\":%.4f,\"kernel_ms\":%.4f,"
                    "\"d2h_ms\":%.4f,\"compute_ms\":%.4f,\"encode_ms\":%.4f,\"total_ms\":%.4f,\"gflops\":%.3f}",
                    t->recv_ms, t->decode_ms, t->queue_ms, t->h2d_ms, t->kernel_ms, t->d2h_ms, t->compute_ms,
                    t->encode_ms, t->total_ms, isfinite(t->gflops) ? t->gflops : 0.0);
}

/* C as JSON tensor data, or after the JSON header as binary data (both charged as answers
 * until MHD is done with them: the text at its largest before it is written). */
enum MHD_Result gemmd_v2_answer(gemmd_request *req)
{
    gemmd_v2 *v = req->v2;
    gemm_job *job = req->job;
    gemmd_timing *t = &req->timing;
    if (gemmd_product_outcome(req, job) != 0) return gemmd_respond_error(req, &req->err);
    t->recv_ms = req->t_body_ms - req->t_start_ms;
    t->decode_ms = req->t_decoded_ms - req->t_body_ms;
    gemm_matrix c = {.rows = job->m, .cols = job->n, .dtype = gemm_job_c_dtype(job), .data = job->c};
    int binary = v->r.binary_output;
    /* the parameters and an id of GEMM_V2_ID_MAX bytes, escaped, fit in 8 KiB */
    uint64_t est = (binary ? 0 : gemm_v2_json_bytes_bound(c.rows, c.cols, c.dtype)) + 8192, outside, charge;
    gemm_buf b;
    if (gemmd_answer_text_begin(req, est, &b, &outside, &req->err) != 0) {
        gemm_free(&req->alloc, job->c);
        job->c = NULL;
        return gemmd_respond_error(req, &req->err);
    }
    double t0 = gemm_now_ms();
    gemm_buf_puts(&b, "{\"model_name\":\"" GEMM_V2_MODEL "\",\"model_version\":\"" GEMM_V2_MODEL_VERSION "\"");
    if (v->r.id) {
        gemm_buf_puts(&b, ",\"id\":");
        gemm_buf_json_string(&b, v->r.id);
    }
    gemm_buf_puts(&b, ",\"outputs\":[");
    gemm_v2_write_output(&b, "C", &c, binary);
    gemm_buf_puts(&b, "]");
    if (!binary) {
        gemm_free(&req->alloc, job->c); /* encoded: C goes now */
        job->c = NULL;
    }
    double t1 = gemm_now_ms();
    t->encode_ms = t1 - t0;
    t->total_ms = t1 - req->t_start_ms;
    answer_parameters(&b, job, t);
    gemm_buf_puts(&b, binary ? "}" : "}\n");
    if (gemmd_answer_text_end(req, &b, est, outside, &charge) != 0)
        return gemmd_respond_errorf(req, 500, "out_of_memory", "cannot build the answer");
    if (!binary) return gemmd_respond_encoded_json(req, 200, &b, charge, NULL);
    size_t c_len;
    gemm_matrix_bytes(c.rows, c.cols, c.dtype, &c_len);
    char hl[24];
    snprintf(hl, sizeof hl, "%zu", b.len);
    gemmd_budget_adopt(req->svc->budget, job->c, GEMMD_MEM_ANSWER, NULL);
    job->c = NULL; /* the answer owns the header text and C from here on */
    return gemmd_respond_parts(req, 200, "application/octet-stream", &b, charge, c.data, c_len, &req->svc->alloc,
                               "Inference-Header-Content-Length", hl);
}

/* ---- start ------------------------------------------------------------------------------ */

int gemmd_v2_begin(gemmd_request *req)
{
    if (check_model(req, &req->err) != 0) return -1;
    gemmd_v2 *v = calloc(1, sizeof *v);
    if (!v) return gemm_err_set(&req->err, 503, "out_of_memory", "cannot allocate the request now; retry later");
    gemm_v2_request_init(&v->r);
    req->v2 = v;
    return gemmd_operands_new(req) ? begin_infer(req) : -1;
}
