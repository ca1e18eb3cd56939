/*
 * routes_jobs.c - POST /v1/matmul (synchronous) and the /v1/jobs family (asynchronous).
 *
 * A synchronous product is listed as pending (gemmd_sync_begin), submitted without any
 * lock held, and then either answered at once (its done() already ran) or suspended
 * (gemmd_sync_wait); done() resumes only a connection that was suspended (gemmd_sync_done),
 * so the resume never comes before the suspend: the handshake is the HTTP layer's, in
 * http.c. The MHD thread that picks the resumed connection up encodes C. A request is
 * reference counted (request.h): the engine's reference keeps it alive if shutdown had to
 * answer and close its connection before the product ended.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_err.h"
#include "log.h"
#include "offload.h"
#include "respond.h"
#include "routes.h"
#include "sync.h"

/* ---- helpers ------------------------------------------------------------------ */

/* Moves the decoded A and B into job and gives it room for C. A resident operand is
 * borrowed (the request holds a reference until it is freed), or with copy_refs copied
 * into a buffer of the job's own (an async job outlives its request). 0 or -1 (*err). */
static int fill_job(gemmd_request *req, gemm_job *job, int copy_refs, gemm_err *err)
{
    job->dtype = req->a.dtype;
    job->m = req->a.rows;
    job->k = req->a.cols;
    job->n = req->b.cols;
    job->a = req->a.data;
    job->b = req->b.data;
    job->batch = req->a.batch;                     /* 0: one product */
    job->b_shared = req->a.batch && !req->b.batch; /* one B for the whole batch */
    req->a.data = req->b.data = NULL;
    for (int i = 0; i < 2; i++) {
        gemmd_matrix_entry *e = req->ref[i];
        if (!e) continue;
        gemmd_matrices_note_use(req->svc->matrices, e);
        void *p = e->m.data;
        if (copy_refs) { /* charged like the rest of the request's memory */
            p = gemm_alloc(&req->alloc, e->bytes);
            if (!p)
                return gemm_err_set(err, 503, "out_of_memory", "cannot allocate %zu bytes for %c now; retry later",
                                    e->bytes, i ? 'B' : 'A');
            memcpy(p, e->m.data, e->bytes);
        }
        if (i) {
            job->b = p;
            job->b_res = copy_refs ? NULL : e->res;
        } else {
            job->a = p;
            job->a_res = copy_refs ? NULL : e->res;
        }
    }
    snprintf(job->kernel, sizeof job->kernel, "%s", req->opt.kernel[0] ? req->opt.kernel : "auto");
    job->tile = req->opt.tile;
    job->math = req->opt.math;
    job->plan_m = req->opt.panel_of; /* the engine checks it against m and the batch */
    job->out_half = gemm_dtype_is_half(job->dtype) && gemmd_request_c_dtype(req) == job->dtype;
    size_t bytes[3], c_bytes;
    if (!gemm_job_bytes(job, bytes))
        return gemm_err_set(err, 413, "too_large", "C's byte size overflows");
    c_bytes = bytes[2];
    gemmd_budget_take_refusal();
    job->c = gemm_alloc(&req->alloc, c_bytes);
    if (!job->c) {
        if (gemmd_budget_take_refusal())
            return gemmd_budget_refuse(req->svc->budget, c_bytes, "C", err, &req->retry_after_s);
        return gemm_err_set(err, 503, "out_of_memory", "cannot allocate %zu bytes for C now; retry later", c_bytes);
    }
    return 0;
}

static void job_meta(const gemm_job *job, gemmd_product_meta *m, const char *id)
{
    m->dtype = gemm_job_c_dtype(job); /* the answer's: C's */
    m->kernel = job->kernel_used;
    m->tile = job->tile_used;
    m->block = job->block;
    m->math = gemm_math_report_name(job->dtype, job->math_used);
    m->device = job->device;
    m->job_id = id;
    m->batch = job->batch;
    m->batched = job->batched;
    m->batch_mode = job->batch_mode;
    m->matrix_id = NULL;
    m->split = job->split_panels >= 2 ? job : NULL;
}

/* Resident operands and store=1 are for single products: 400 for a batched request. */
static int check_resident_batch(const gemmd_request *req, gemm_err *err)
{
    if (!req->a.batch && !req->b.batch) return 0;
    if (req->ref[0] || req->ref[1])
        return gemm_err_set(err, 400, "bad_option", "a batched request takes no resident operand (a=ID, b=ID)");
    if (req->store_c)
        return gemm_err_set(err, 400, "bad_option", "store=1 keeps one matrix: it does not take a batched request");
    return 0;
}

/* ---- POST /v1/matmul -------------------------------------------------------------- */

/* ---- answers encoded off the HTTP threads ------------------------------------------ */

/* C of a synchronous product as JSON (an offload thread). */
static void encode_sync(void *arg)
{
    gemmd_request *req = arg;
    gemm_job *job = &req->job;
    gemmd_timing_from_job(&req->timing, &job->timing);
    gemmd_product_meta meta;
    job_meta(job, &meta, NULL);
    req->prepared = gemmd_encode_product_json(req, job->c, job->m, job->n, &meta, NULL, NULL, &req->prepared_buf,
                                              &req->prepared_charge, &req->prepared_err) == 0 ? 1 : -1;
    gemm_free(&req->svc->alloc, job->c); /* read: C goes at once */
    job->c = NULL;
    gemmd_sync_resume(req, 1);
}

static void release_entry(void *ctx);

/* A kept result as JSON (an offload thread). */
static void encode_result(void *arg)
{
    gemmd_request *req = arg;
    gemmd_job_entry *j = req->offload_entry;
    req->offload_entry = NULL;
    gemmd_product_meta meta;
    job_meta(&j->job, &meta, j->id);
    req->prepared = gemmd_encode_product_json(req, j->job.c, j->job.m, j->job.n, &meta, release_entry, j,
                                              &req->prepared_buf, &req->prepared_charge,
                                              &req->prepared_err) == 0 ? 1 : -1;
    gemmd_sync_resume(req, 0);
}

static enum MHD_Result respond_prepared(gemmd_request *req)
{
    int p = req->prepared;
    req->prepared = 0;
    if (p < 0) return gemmd_respond_error(req, &req->prepared_err);
    return gemmd_respond_encoded_json(req, 200, &req->prepared_buf, req->prepared_charge, NULL);
}

/* Under the request's stripe lock (gemmd_sync_done): a big JSON answer is encoded on an offload
 * thread, which answers and drops the engine's reference (0), else -1. */
static int offload_sync(gemmd_request *req)
{
    return gemmd_offload_run(req->svc->offload, encode_sync, req);
}

static void on_sync_done(gemm_job *job)
{
    gemmd_request *req = job->user;
    gemmd_services *srv = req->svc;
    int big_json = atomic_load(&job->state) == GEMM_JOB_DONE && req->answer == GEMMD_FMT_JSON &&
                   !req->store_c && !(req->route->flags & GEMMD_V2) &&
                   srv->offload && gemmd_json_answer_is_big(job->m * (job->batch ? job->batch : 1), job->n,
                                                            gemm_job_c_dtype(job));
    /* inputs go as soon as the product is done; resident ones are only borrowed */
    if (!req->ref[0]) gemm_free(&srv->alloc, job->a);
    if (!req->ref[1]) gemm_free(&srv->alloc, job->b);
    job->a = job->b = NULL;
    gemmd_usage_product(req->owner, job);
    LOG_DEBUG("product done state=%s%s", gemm_job_state_name((gemm_job_state)atomic_load(&job->state)),
              big_json ? " (a big JSON answer: encoded off the HTTP threads)" : "");
    gemmd_sync_done(req, big_json ? offload_sync : NULL);
}

int gemmd_matmul_begin(gemmd_request *req)
{
    if (gemmd_body_begin(req) != 0) return -1;
    req->answer = gemmd_negotiate(gemmd_request_header(req, MHD_HTTP_HEADER_ACCEPT), req->family);
    if (req->answer == GEMMD_FMT_NONE)
        return gemm_err_set(&req->err, 406, "not_acceptable",
                            "Accept offers nothing this server answers: use application/json, "
                            "application/octet-stream or application/x-npy (or */*)");
    /* shapes known before the body (raw): a JSON answer's text is reserved too */
    if (req->family == GEMMD_FMT_RAW && req->answer == GEMMD_FMT_JSON && (!req->store_c || req->return_c)) {
        uint64_t text = gemmd_json_answer_bytes(req->a.rows * (req->a.batch ? req->a.batch : 1), req->b.cols,
                                                gemmd_request_c_dtype(req));
        req->need = text > UINT64_MAX - req->need ? UINT64_MAX : req->need + text;
    }
    return 0;
}

enum MHD_Result gemmd_route_matmul(gemmd_request *req)
{
    gemmd_services *srv = req->svc;
    gemm_err err;
    gemm_err_clear(&err);
    if (check_resident_batch(req, &err) != 0) return gemmd_respond_error(req, &err);
    if (req->answer == GEMMD_FMT_JSON && (!req->store_c || req->return_c) &&
        gemmd_check_json_answer(srv, req->a.rows * (req->a.batch ? req->a.batch : 1), req->b.cols,
                                gemmd_request_c_dtype(req), &err) != 0)
        return gemmd_respond_error(req, &err);
    if (req->store_c) { /* room for C among the resident matrices before it is computed */
        size_t c_bytes;
        if (!gemm_matrix_bytes(req->a.rows, req->b.cols, gemmd_request_c_dtype(req), &c_bytes))
            return gemmd_respond_errorf(req, 413, "too_large", "C's byte size overflows");
        if (gemmd_matrices_reserve(srv->matrices, req->client, c_bytes, &err) != 0)
            return gemmd_respond_error(req, &err);
        req->reserved = c_bytes;
    }
    if (fill_job(req, &req->job, 0, &err) != 0) return gemmd_respond_error(req, &err);
    if (req->store_c) { /* the engine may keep C on its device for the next product */
        req->c_res = gemm_engine_resident_new(srv->engine, req->job.c, req->reserved);
        if (!req->c_res) return gemmd_respond_errorf(req, 503, "out_of_memory", "cannot allocate a matrix handle now");
        req->job.c_res = req->c_res;
    }
    req->job.done = on_sync_done;
    req->job.user = req;

    if (gemmd_sync_begin(req) != 0)
        return gemmd_respond_errorf(req, 503, "shutting_down", "the server is shutting down; retry elsewhere");
    /* A small product on a nearly idle engine runs here, on an idle worker's stream: its
     * done() has then come before submit_here returns, and the answer goes out below. */
    gemm_engine_err eerr;
    int ran = gemmd_sync_direct(req) ? gemm_engine_submit_here(srv->engine, &req->job, &eerr)
                                     : gemm_engine_submit(srv->engine, &req->job, &eerr);
    if (ran < 0) { /* done() will not come */
        gemmd_sync_refused(req);
        gemmd_engine_err(&eerr, &err);
        LOG_DEBUG("product refused by the engine: %d %s", err.status, err.code);
        return gemmd_respond_error(req, &err);
    }
    LOG_DEBUG("product %s %s %llux%llux%llu kernel=%s", ran ? "ran on its HTTP thread" : "queued", gemm_dtype_name(req->job.dtype),
              (unsigned long long)req->job.m, (unsigned long long)req->job.k, (unsigned long long)req->job.n,
              req->job.kernel);
    switch (gemmd_sync_wait(req)) {
    case GEMMD_SYNC_DONE: return req->route->answer(req); /* already finished: answer now */
    case GEMMD_SYNC_ABANDONED: return gemmd_respond_abandoned(req);
    default: return MHD_YES; /* suspended until done() */
    }
}

typedef struct {
    const gemm_allocator *alloc;
    void *p;
} owned_buffer;

static void release_buffer(void *ctx)
{
    owned_buffer *ob = ctx;
    gemm_free(ob->alloc, ob->p);
    free(ob);
}

static void release_matrix(void *ctx)
{
    gemmd_matrix_entry *e = ctx;
    gemmd_matrices_put(e->store, e);
}

/* store=1: C joins the resident matrices (201, Location); with return=1 it is also sent in
 * the negotiated format, else the answer describes it in JSON. */
static enum MHD_Result stored_answer(gemmd_request *req)
{
    gemmd_services *srv = req->svc;
    gemm_job *job = &req->job;
    gemm_err err;
    gemm_err_clear(&err);
    gemm_matrix cm = {job->m, job->n, gemm_job_c_dtype(job), job->c, 0};
    char id[GEMMD_JOB_ID_LEN + 1];
    gemmd_budget_adopt(srv->budget, cm.data, GEMMD_MEM_RESIDENT, &req->resv); /* it outlives the request */
    if (gemmd_matrices_add(srv->matrices, &cm, &req->c_res, req->owner, req->client, (int)req->answer, id, &err) != 0)
        return gemmd_respond_error(req, &err); /* C is still the job's: freed with the request */
    job->c = NULL;
    req->reserved = 0; /* the matrix holds those bytes now */
    gemmd_matrix_entry *e = gemmd_matrices_get(srv->matrices, id, GEMMD_OWNER_ANY);
    if (!e) /* deleted already by a guess of a 128-bit id: say what happened */
        return gemmd_respond_errorf(req, 410, "matrix_gone", "C was stored as %s and deleted before the answer", id);
    gemmd_product_meta meta;
    job_meta(job, &meta, NULL);
    meta.matrix_id = e->id;
    if (req->return_c)
        return gemmd_respond_product(req, 201, req->answer, e->m.data, job->m, job->n, &meta, release_matrix, e);
    gemm_buf b;
    gemm_buf_init(&b);
    gemmd_matrices_describe_json(srv->matrices, e, &b);
    /* {"id":..., ...} then the product's own fields */
    if (b.len && b.data[b.len - 1] == '}') b.len--;
    gemm_buf_puts(&b, ",\"kernel\":");
    gemm_buf_json_string(&b, job->kernel_used);
    gemm_buf_puts(&b, ",\"device\":");
    gemm_buf_json_string(&b, job->device);
    req->timing.total_ms = gemm_now_ms() - req->t_start_ms;
    if (req->t_body_ms > 0) req->timing.recv_ms = req->t_body_ms - req->t_start_ms;
    if (req->t_decoded_ms > req->t_body_ms) req->timing.decode_ms = req->t_decoded_ms - req->t_body_ms;
    gemm_buf_puts(&b, ",\"timing\":");
    gemmd_timing_json(&b, &req->timing);
    gemm_buf_puts(&b, "}\n");
    char loc[GEMMD_JOB_ID_LEN + 24];
    snprintf(loc, sizeof loc, "/v1/matrices/%s", e->id);
    gemmd_matrices_put(srv->matrices, e);
    return gemmd_respond_json_header(req, 201, &b, MHD_HTTP_HEADER_LOCATION, loc);
}

enum MHD_Result gemmd_route_matmul_answer(gemmd_request *req)
{
    if (req->prepared) return respond_prepared(req);
    gemm_job *job = &req->job;
    if (job->kernel_used[0]) snprintf(req->hdr_kernel, sizeof req->hdr_kernel, "%s", job->kernel_used);
    if (job->device[0]) snprintf(req->hdr_device, sizeof req->hdr_device, "%s", job->device);
    gemmd_split_header(job, req->hdr_split, sizeof req->hdr_split);
    gemmd_timing_from_job(&req->timing, &job->timing);
    int st = atomic_load(&job->state);
    if (st != GEMM_JOB_DONE) {
        if (st == GEMM_JOB_CANCELLED && atomic_load(&req->svc->stopping))
            return gemmd_respond_errorf(req, 503, "shutting_down",
                                        "the server is shutting down; the product was cancelled%s",
                                        job->timing.compute_ms > 0 ? " while it ran (shutdown_timeout)"
                                                                   : " before it started");
        gemm_err err;
        gemmd_engine_err(&job->err, &err);
        return gemmd_respond_error(req, &err);
    }
    if (req->store_c) return stored_answer(req);
    owned_buffer *ob = malloc(sizeof *ob);
    if (!ob) return gemmd_respond_queue(req, 500, NULL);
    ob->alloc = &req->svc->alloc;
    ob->p = job->c;
    job->c = NULL; /* the answer owns C now */
    gemmd_budget_retag(req->svc->budget, ob->p, GEMMD_MEM_ANSWER);
    gemmd_product_meta meta;
    job_meta(job, &meta, NULL);
    return gemmd_respond_product(req, 200, req->answer, ob->p, job->m, job->n, &meta, release_buffer, ob);
}

/* ---- POST /v1/jobs -------------------------------------------------------------- */

enum MHD_Result gemmd_route_jobs_submit(gemmd_request *req)
{
    gemmd_services *srv = req->svc;
    gemm_err err;
    gemm_err_clear(&err);
    size_t c_bytes, a_bytes, b_bytes;
    if (!gemm_matrix_bytes(req->a.rows, req->b.cols, gemmd_request_c_dtype(req), &c_bytes) ||
        !gemm_mul_size(c_bytes, (size_t)(req->a.batch ? req->a.batch : 1), &c_bytes) ||
        !gemm_matrix_bytes(req->a.rows, req->a.cols, req->a.dtype, &a_bytes) ||
        !gemm_mul_size(a_bytes, (size_t)(req->a.batch ? req->a.batch : 1), &a_bytes) ||
        !gemm_matrix_bytes(req->b.rows, req->b.cols, req->b.dtype, &b_bytes) ||
        !gemm_mul_size(b_bytes, (size_t)(req->b.batch ? req->b.batch : 1), &b_bytes))
        return gemmd_respond_errorf(req, 413, "too_large", "C's byte size overflows");
    gemmd_job_entry *j = gemmd_jobs_reserve(srv->jobs, req->client, a_bytes + b_bytes, c_bytes, &err);
    if (!j) {
        if (err.status == 503 && strcmp(err.code, "job_store_full") == 0)
            req->retry_after_s = gemmd_jobs_retry_after_s(srv->jobs);
        LOG_DEBUG("job refused: %d %s%s", err.status, err.code, req->retry_after_s ? " (retry after the oldest expires)" : "");
        return gemmd_respond_error(req, &err);
    }
    if (check_resident_batch(req, &err) != 0) {
        gemmd_jobs_abandon(srv->jobs, j);
        return gemmd_respond_error(req, &err);
    }
    if (req->store_c) {
        gemmd_jobs_abandon(srv->jobs, j);
        return gemmd_respond_errorf(req, 400, "bad_option",
                                    "store=1 is taken by POST /v1/matmul only; an async job's result is fetched "
                                    "from /v1/jobs/{id}/result");
    }
    if (fill_job(req, &j->job, 1, &err) != 0) {
        gemmd_jobs_abandon(srv->jobs, j);
        return gemmd_respond_error(req, &err);
    }
    /* the job's buffers outlive this request: out of its reservation, charged on their own */
    gemmd_budget_adopt(srv->budget, j->job.a, GEMMD_MEM_INPUT, &req->resv);
    gemmd_budget_adopt(srv->budget, j->job.b, GEMMD_MEM_INPUT, &req->resv);
    gemmd_budget_adopt(srv->budget, j->job.c, GEMMD_MEM_INPUT, &req->resv);
    j->family = (int)req->answer;
    j->owner = req->owner;
    j->recv_ms = req->t_body_ms - req->t_start_ms;
    j->decode_ms = req->t_decoded_ms - req->t_body_ms;
    char id[GEMMD_JOB_ID_LEN + 1];
    memcpy(id, j->id, sizeof id);
    snprintf(req->job_id, sizeof req->job_id, "%s", id); /* the access log shows its prefix */
    if (gemmd_jobs_submit(srv->jobs, j, &err) != 0) return gemmd_respond_error(req, &err);
    /* j may already be done and even deleted: only the copied id is used below. */
    char location[sizeof "/v1/jobs/" + GEMMD_JOB_ID_LEN];
    snprintf(location, sizeof location, "/v1/jobs/%s", id);
    gemm_buf b;
    gemm_buf_init(&b);
    gemm_buf_printf(&b, "{\"id\":\"%s\",\"state\":\"queued\",\"location\":\"%s\",\"result\":\"%s/result\"}\n", id,
                    location, location);
    return gemmd_respond_json_header(req, 202, &b, MHD_HTTP_HEADER_LOCATION, location);
}

/* ---- GET /v1/jobs/{id} ---------------------------------------------------------- */

/* Also the answer for another token's job: its existence is not revealed. */
static enum MHD_Result no_such_job(gemmd_request *req)
{
    return gemmd_respond_errorf(req, 404, "job_not_found",
                                "no job %.40s is kept here: it never existed, was deleted, or expired "
                                "(job_ttl)", req->job_id);
}

static const char *view_state_name(const gemmd_job_view *v)
{
    return gemm_job_state_name(v->state);
}

enum MHD_Result gemmd_route_job_status(gemmd_request *req)
{
    gemmd_services *srv = req->svc;
    gemmd_job_entry *j = gemmd_jobs_get_owned(srv->jobs, req->job_id, req->owner);
    if (!j) return no_such_job(req);
    gemmd_job_view v;
    gemmd_jobs_view(srv->jobs, j, &v);
    gemmd_jobs_put(srv->jobs, j);

    gemmd_timing t = {0};
    t.recv_ms = v.recv_ms;
    t.decode_ms = v.decode_ms;
    if (v.finished) gemmd_timing_from_job(&t, &v.timing);
    t.total_ms = v.total_ms;
    if (v.kernel[0] && v.finished) snprintf(req->hdr_kernel, sizeof req->hdr_kernel, "%s", v.kernel);
    if (v.device[0]) snprintf(req->hdr_device, sizeof req->hdr_device, "%s", v.device);

    gemm_buf b;
    gemm_buf_init(&b);
    gemm_buf_printf(&b, "{\"id\":\"%s\",\"state\":\"%s\",\"shape\":[%llu,%llu],\"k\":%llu,\"dtype\":", v.id,
                    view_state_name(&v), (unsigned long long)v.m, (unsigned long long)v.n,
                    (unsigned long long)v.k);
    gemm_buf_json_string(&b, gemm_dtype_name(v.dtype));
    gemm_buf_puts(&b, ",\"out_dtype\":");
    gemm_buf_json_string(&b, gemm_dtype_name(v.c_dtype));
    gemm_buf_puts(&b, ",\"kernel\":");
    gemm_buf_json_string(&b, v.kernel);
    gemm_buf_printf(&b, ",\"tile\":%d,\"block\":", v.tile);
    gemm_buf_json_string(&b, v.block);
    gemm_buf_puts(&b, ",\"math\":");
    gemm_buf_json_string(&b, gemm_math_report_name(v.dtype, v.math));
    gemm_buf_puts(&b, ",\"device\":");
    gemm_buf_json_string(&b, v.device);
    gemm_buf_printf(&b, ",\"location\":\"/v1/jobs/%s\",\"result\":\"/v1/jobs/%s/result\"", v.id, v.id);
    if (v.finished) gemm_buf_printf(&b, ",\"expires_in_s\":%.1f", v.expires_in_s);
    if (v.finished && v.state != GEMM_JOB_DONE) {
        gemm_buf_printf(&b, ",\"error\":{\"status\":%d,\"code\":", v.err.status);
        gemm_buf_json_string(&b, v.err.code);
        gemm_buf_puts(&b, ",\"message\":");
        gemm_buf_json_string(&b, v.err.message);
        gemm_buf_puts(&b, "}");
    }
    gemm_buf_puts(&b, ",\"timing\":");
    gemmd_timing_json(&b, &t);
    gemm_buf_puts(&b, "}\n");
    req->timing = t;
    req->timing.total_ms = 0; /* this request's own total in Server-Timing */
    req->timing.have_compute = 0;
    req->timing.recv_ms = req->timing.decode_ms = 0;
    return gemmd_respond_json(req, 200, &b);
}

/* ---- GET /v1/jobs/{id}/result ------------------------------------------------------ */

static void release_entry(void *ctx)
{
    gemmd_job_entry *j = ctx;
    gemmd_jobs_put(j->store, j);
}

/* Under the request's stripe lock (gemmd_sync_suspend_for): starts encoding req's kept result. */
static int offload_result(gemmd_request *req)
{
    return gemmd_offload_run(req->svc->offload, encode_result, req);
}

enum MHD_Result gemmd_route_job_result(gemmd_request *req)
{
    gemmd_services *srv = req->svc;
    gemmd_job_entry *j = gemmd_jobs_get_owned(srv->jobs, req->job_id, req->owner);
    if (!j) return no_such_job(req);
    gemmd_job_view v;
    gemmd_jobs_view(srv->jobs, j, &v);
    if (!v.finished) {
        gemmd_jobs_put(srv->jobs, j);
        return gemmd_respond_errorf(req, 409, "job_not_done",
                                    "job %s is %s; poll GET /v1/jobs/%s until it is done", v.id,
                                    view_state_name(&v), v.id);
    }
    if (v.state != GEMM_JOB_DONE) {
        gemmd_jobs_put(srv->jobs, j);
        return gemmd_respond_error(req, &v.err);
    }
    gemmd_format fmt = gemmd_negotiate(gemmd_request_header(req, MHD_HTTP_HEADER_ACCEPT), (gemmd_format)j->family);
    if (fmt == GEMMD_FMT_NONE) {
        gemmd_jobs_put(srv->jobs, j);
        return gemmd_respond_errorf(req, 406, "not_acceptable",
                                    "Accept offers nothing this server answers: use application/json, "
                                    "application/octet-stream or application/x-npy");
    }
    gemm_err err;
    if (fmt == GEMMD_FMT_JSON &&
        gemmd_check_json_answer(srv, v.m * (j->job.batch ? j->job.batch : 1), v.n, v.c_dtype, &err) != 0) {
        gemmd_jobs_put(srv->jobs, j);
        return gemmd_respond_error(req, &err);
    }
    req->timing.recv_ms = v.recv_ms;
    req->timing.decode_ms = v.decode_ms;
    gemmd_timing_from_job(&req->timing, &v.timing);
    req->timing.total_base_ms = v.total_ms;
    if (fmt == GEMMD_FMT_JSON && srv->offload &&
        gemmd_json_answer_is_big(v.m * (j->job.batch ? j->job.batch : 1), v.n, v.c_dtype)) {
        /* Encoded on an offload thread while this connection waits suspended. */
        req->offload_entry = j;
        if (gemmd_sync_suspend_for(req, offload_result) == 0) {
            gemmd_conn_wait(req->cx);
            return MHD_YES;
        }
        req->offload_entry = NULL;
    }
    gemmd_product_meta meta;
    job_meta(&j->job, &meta, j->id);
    /* The entry (and C in it) lives until the answer is sent: the reference goes with it. */
    return gemmd_respond_product(req, 200, fmt, j->job.c, v.m, v.n, &meta, release_entry, j);
}

/* ---- DELETE /v1/jobs/{id} -------------------------------------------------------- */

enum MHD_Result gemmd_route_job_delete(gemmd_request *req)
{
    if (gemmd_jobs_delete_owned(req->svc->jobs, req->job_id, req->owner) != 0) return no_such_job(req);
    gemm_buf b;
    gemm_buf_init(&b);
    return gemmd_respond_buf(req, 204, NULL, &b);
}
