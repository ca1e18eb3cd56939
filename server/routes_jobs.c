/*
 * routes_jobs.c - POST /v1/matmul (synchronous) and the /v1/jobs family (asynchronous).
 *
 * A synchronous product goes through sync.h's handshake; the MHD thread that picks the
 * resumed connection up encodes C. The engine's reference keeps the request alive if
 * shutdown had to answer and close its connection before the product ended.
 */
#include <stdio.h>
#include <string.h>

#include "body.h"
#include "engine_err.h"
#include "log.h"
#include "offload.h"
#include "respond.h"
#include "routes.h"
#include "sync.h"

/* ---- helpers ------------------------------------------------------------------ */

/* Moves the decoded A and B into job and gives it room for C. A resident operand is
 * borrowed (the request holds a reference until it is freed), or with copy_refs copied
 * into a buffer of the job's own (an async job outlives its request). 0 or -1 (req->err). */
static int fill_job(gemmd_request *req, gemm_job *job, int copy_refs)
{
    gemmd_operands *op = req->op;
    job->dtype = op->a.dtype;
    job->m = op->a.rows;
    job->k = op->a.cols;
    job->n = op->b.cols;
    job->a = op->a.data;
    job->b = op->b.data;
    job->batch = op->a.batch;                    /* 0: one product */
    job->b_shared = op->a.batch && !op->b.batch; /* one B for the whole batch */
    op->a.data = op->b.data = NULL;
    for (int i = 0; i < 2; i++) {
        gemmd_matrix_entry *e = op->ref[i];
        if (!e) continue;
        gemmd_matrices_note_use(req->svc->matrices, e);
        void *p = e->m.data;
        if (copy_refs) { /* charged like the rest of the request's memory */
            if (!(p = gemmd_request_alloc(req, e->bytes, i ? "B" : "A"))) return -1;
            memcpy(p, e->m.data, e->bytes);
        }
        *(i ? &job->b : &job->a) = p;
        *(i ? &job->b_res : &job->a_res) = copy_refs ? NULL : e->res;
    }
    snprintf(job->kernel, sizeof job->kernel, "%s", op->opt.kernel[0] ? op->opt.kernel : "auto");
    job->tile = op->opt.tile;
    job->math = op->opt.math;
    job->plan_m = op->opt.panel_of; /* the engine checks it against m and the batch */
    job->out_half = gemm_dtype_is_half(job->dtype) && gemmd_c_dtype(op) == job->dtype;
    size_t bytes[3];
    if (!gemm_job_bytes(job, bytes)) return gemm_err_set(&req->err, 413, "too_large", "C's byte size overflows");
    job->c = gemmd_request_alloc(req, bytes[2], "C");
    return job->c ? 0 : -1;
}

/* Resident operands and store=1 are for single products: 400 for a batched request. */
static int check_resident_batch(gemmd_request *req)
{
    const gemmd_operands *op = req->op;
    if (!op->a.batch && !op->b.batch) return 0;
    if (op->ref[0] || op->ref[1])
        return gemm_err_set(&req->err, 400, "bad_option", "a batched request takes no resident operand (a=ID, b=ID)");
    if (op->store_c)
        return gemm_err_set(&req->err, 400, "bad_option",
                            "store=1 keeps one matrix: it does not take a batched request");
    return 0;
}

/* ---- answers encoded off the HTTP threads ------------------------------------------ */

/* C of a synchronous product as JSON (an offload thread). */
static void encode_sync(void *arg)
{
    gemmd_request *req = arg;
    gemm_job *job = req->job;
    gemmd_timing_from_job(&req->timing, &job->timing);
    gemmd_product_meta meta = {.job = job};
    req->prepared = gemmd_encode_product_json(req, job->c, job->m, job->n, &meta, NULL, NULL, &req->prepared_buf,
                                              &req->prepared_charge, &req->prepared_err) == 0 ? 1 : -1;
    gemm_free(&req->svc->alloc, job->c); /* read: C goes at once */
    job->c = NULL;
    gemmd_sync_resume(req, 1);
}

static void release_entry(void *ctx)
{
    gemmd_job_entry *j = ctx;
    gemmd_jobs_put(j->store, j);
}

/* A kept result as JSON (an offload thread). */
static void encode_result(void *arg)
{
    gemmd_request *req = arg;
    gemmd_job_entry *j = req->offload_entry;
    req->offload_entry = NULL;
    gemmd_product_meta meta = {.job = &j->job, .job_id = j->id};
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

/* Under the request's stripe lock (gemmd_sync_done): a big JSON answer is encoded on an
 * offload thread, which answers and drops the engine's reference (0), else -1. */
static int offload_sync(gemmd_request *req) { return gemmd_offload_run(req->svc->offload, encode_sync, req); }

/* ---- POST /v1/matmul -------------------------------------------------------------- */

static void on_sync_done(gemm_job *job)
{
    gemmd_request *req = job->user;
    gemmd_services *srv = req->svc;
    const gemmd_operands *op = req->op;
    int big_json = atomic_load(&job->state) == GEMM_JOB_DONE && op->answer == GEMMD_FMT_JSON && !op->store_c &&
                   !(req->route->flags & GEMMD_V2) && srv->offload &&
                   gemmd_json_answer_bytes(gemmd_answer_rows(job->m, job->batch), job->n, gemm_job_c_dtype(job)) >=
                       GEMMD_JSON_OFFLOAD_BYTES;
    /* inputs go as soon as the product is done; resident ones are only borrowed */
    if (!op->ref[0]) gemm_free(&srv->alloc, job->a);
    if (!op->ref[1]) gemm_free(&srv->alloc, job->b);
    job->a = job->b = NULL;
    gemmd_usage_product(req->owner, job);
    LOG_DEBUG("product done state=%s%s", gemm_job_state_name((gemm_job_state)atomic_load(&job->state)),
              big_json ? " (a big JSON answer: encoded off the HTTP threads)" : "");
    gemmd_sync_done(req, big_json ? offload_sync : NULL);
}

int gemmd_matmul_begin(gemmd_request *req)
{
    if (gemmd_body_begin(req) != 0) return -1;
    gemmd_operands *op = req->op;
    if (gemmd_accept(req, op->family, &op->answer) != 0) return -1;
    /* shapes known before the body (raw): a JSON answer's text is reserved too */
    if (op->family == GEMMD_FMT_RAW && op->answer == GEMMD_FMT_JSON && (!op->store_c || op->return_c)) {
        uint64_t text = gemmd_json_answer_bytes(gemmd_answer_rows(op->a.rows, op->a.batch), op->b.cols,
                                                gemmd_c_dtype(op));
        req->need = text > UINT64_MAX - req->need ? UINT64_MAX : req->need + text;
    }
    return 0;
}

enum MHD_Result gemmd_route_matmul(gemmd_request *req)
{
    gemmd_services *srv = req->svc;
    gemmd_operands *op = req->op;
    if (check_resident_batch(req) != 0) return gemmd_respond_error(req, &req->err);
    if (op->answer == GEMMD_FMT_JSON && (!op->store_c || op->return_c) &&
        gemmd_check_json_answer(srv, gemmd_answer_rows(op->a.rows, op->a.batch), op->b.cols, gemmd_c_dtype(op),
                                &req->err) != 0)
        return gemmd_respond_error(req, &req->err);
    if (op->store_c) { /* room for C among the resident matrices before it is computed */
        size_t c_bytes;
        if (!gemm_matrix_bytes(op->a.rows, op->b.cols, gemmd_c_dtype(op), &c_bytes))
            return gemmd_respond_errorf(req, 413, "too_large", "C's byte size overflows");
        if (gemmd_matrices_reserve(srv->matrices, req->client, c_bytes, &req->err) != 0)
            return gemmd_respond_error(req, &req->err);
        op->reserved = c_bytes;
    }
    gemm_job *job = &op->job;
    if (fill_job(req, job, 0) != 0) return gemmd_respond_error(req, &req->err);
    if (op->store_c) { /* the engine may keep C on its device for the next product */
        op->c_res = gemm_engine_resident_new(srv->engine, job->c, op->reserved);
        if (!op->c_res) return gemmd_respond_errorf(req, 503, "out_of_memory", "cannot allocate a matrix handle now");
        job->c_res = op->c_res;
    }
    job->done = on_sync_done;
    job->user = req;

    if (gemmd_sync_begin(req, job) != 0)
        return gemmd_respond_errorf(req, 503, "shutting_down", "the server is shutting down; retry elsewhere");
    /* A small product on a nearly idle engine runs here, on an idle worker's stream: its
     * done() has then come before submit_here returns, and the answer goes out below. */
    gemm_engine_err eerr;
    int ran = gemmd_sync_direct(req) ? gemm_engine_submit_here(srv->engine, job, &eerr)
                                     : gemm_engine_submit(srv->engine, job, &eerr);
    if (ran < 0) { /* done() will not come */
        gemmd_sync_refused(req);
        gemmd_engine_err(&eerr, &req->err);
        LOG_DEBUG("product refused by the engine: %d %s", req->err.status, req->err.code);
        return gemmd_respond_error(req, &req->err);
    }
    LOG_DEBUG("product %s %s %llux%llux%llu kernel=%s", ran ? "ran on its HTTP thread" : "queued",
              gemm_dtype_name(job->dtype), (unsigned long long)job->m, (unsigned long long)job->k,
              (unsigned long long)job->n, job->kernel);
    return gemmd_respond_waited(req, gemmd_sync_wait(req));
}

/* store=1: C joins the resident matrices (201, Location); with return=1 it is also sent in
 * the negotiated format, else the answer describes it in JSON. */
static enum MHD_Result stored_answer(gemmd_request *req)
{
    gemmd_services *srv = req->svc;
    gemmd_operands *op = req->op;
    gemm_job *job = req->job;
    gemm_matrix cm = {job->m, job->n, gemm_job_c_dtype(job), job->c, 0};
    gemmd_budget_adopt(srv->budget, cm.data, GEMMD_MEM_RESIDENT, &req->resv); /* it outlives the request */
    gemmd_matrix_entry *e = gemmd_matrices_add(srv->matrices, &cm, &op->c_res, req->owner, req->client,
                                               (int)op->answer, 0, &req->err);
    if (!e) return gemmd_respond_error(req, &req->err); /* C is still the job's: freed with the request */
    job->c = NULL;
    op->reserved = 0; /* the matrix holds those bytes now */
    gemmd_product_meta meta = {.job = job, .matrix_id = e->id};
    if (op->return_c)
        return gemmd_respond_product(req, 201, op->answer, e->m.data, job->m, job->n, &meta, gemmd_matrix_release, e);
    gemm_buf b = {0};
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
    return gemmd_respond_buf(req, 201, "application/json", &b, loc);
}

enum MHD_Result gemmd_route_matmul_answer(gemmd_request *req)
{
    if (req->prepared) return respond_prepared(req);
    gemm_job *job = req->job;
    if (gemmd_product_outcome(req, job) != 0) return gemmd_respond_error(req, &req->err);
    if (req->op->store_c) return stored_answer(req);
    void *c = job->c;
    job->c = NULL; /* the answer owns C now */
    gemmd_budget_adopt(req->svc->budget, c, GEMMD_MEM_ANSWER, NULL);
    gemmd_product_meta meta = {.job = job, .free_with = &req->svc->alloc};
    return gemmd_respond_product(req, 200, req->op->answer, c, job->m, job->n, &meta, NULL, NULL);
}

/* ---- POST /v1/jobs -------------------------------------------------------------- */

/* The job's place in the store, its inputs' and result's bytes reserved (op->entry): 0, or
 * -1 with req->err (503 job_store_full with the Retry-After of the oldest kept job). */
static int reserve_job(gemmd_request *req)
{
    gemmd_operands *op = req->op;
    size_t c_bytes, a_bytes, b_bytes;
    if (!gemm_matrix_bytes(op->a.rows, op->b.cols, gemmd_c_dtype(op), &c_bytes) ||
        !gemm_mul_size(c_bytes, (size_t)(op->a.batch ? op->a.batch : 1), &c_bytes) ||
        !gemm_matrix_bytes(op->a.rows, op->a.cols, op->a.dtype, &a_bytes) ||
        !gemm_mul_size(a_bytes, (size_t)(op->a.batch ? op->a.batch : 1), &a_bytes) ||
        !gemm_matrix_bytes(op->b.rows, op->b.cols, op->b.dtype, &b_bytes) ||
        !gemm_mul_size(b_bytes, (size_t)(op->b.batch ? op->b.batch : 1), &b_bytes) ||
        !gemm_add_size(a_bytes, b_bytes, &a_bytes))
        return gemm_err_set(&req->err, 413, "too_large", "C's byte size overflows");
    op->entry = gemmd_jobs_reserve(req->svc->jobs, req->client, a_bytes, c_bytes, &req->err);
    if (op->entry) return 0;
    if (req->err.status == 503 && strcmp(req->err.code, "job_store_full") == 0)
        req->retry_after_s = gemmd_jobs_retry_after_s(req->svc->jobs);
    LOG_DEBUG("job refused: %d %s%s", req->err.status, req->err.code,
              req->retry_after_s ? " (retry after the oldest expires)" : "");
    return -1;
}

/* A raw body's shapes come in the query: its place in the store is taken before the body is
 * read (before 100 Continue), so that a full store refuses it before it is sent. */
int gemmd_jobs_begin(gemmd_request *req)
{
    if (gemmd_body_begin(req) != 0) return -1;
    return req->op->family == GEMMD_FMT_RAW ? reserve_job(req) : 0;
}

enum MHD_Result gemmd_route_jobs_submit(gemmd_request *req)
{
    gemmd_services *srv = req->svc;
    gemmd_operands *op = req->op;
    if (!op->entry && reserve_job(req) != 0) return gemmd_respond_error(req, &req->err);
    gemmd_job_entry *j = op->entry;
    op->entry = NULL;
    if (check_resident_batch(req) != 0 ||
        (op->store_c && gemm_err_set(&req->err, 400, "bad_option", "store=1 is taken by POST /v1/matmul only; an "
                                     "async job's result is fetched from /v1/jobs/{id}/result")) ||
        fill_job(req, &j->job, 1) != 0) {
        gemmd_jobs_put(srv->jobs, j);
        return gemmd_respond_error(req, &req->err);
    }
    /* the job's buffers outlive this request: out of its reservation, charged on their own */
    gemmd_budget_adopt(srv->budget, j->job.a, GEMMD_MEM_INPUT, &req->resv);
    gemmd_budget_adopt(srv->budget, j->job.b, GEMMD_MEM_INPUT, &req->resv);
    gemmd_budget_adopt(srv->budget, j->job.c, GEMMD_MEM_INPUT, &req->resv);
    j->family = (int)op->answer;
    j->owner = req->owner;
    j->recv_ms = req->t_body_ms - req->t_start_ms;
    j->decode_ms = req->t_decoded_ms - req->t_body_ms;
    j->t_start_ms = req->t_start_ms; /* a raw job is created before its body: not t_created_ms */
    /* the access log shows its prefix; j may be done and even deleted once submitted: only
     * this copy of its id is used below */
    snprintf(req->job_id, sizeof req->job_id, "%s", j->id);
    if (gemmd_jobs_submit(srv->jobs, j, &req->err) != 0) return gemmd_respond_error(req, &req->err);
    char location[sizeof "/v1/jobs/" + sizeof req->job_id];
    snprintf(location, sizeof location, "/v1/jobs/%s", req->job_id);
    gemm_buf b = {0};
    gemm_buf_printf(&b, "{\"id\":\"%s\",\"state\":\"queued\",\"location\":\"%s\",\"result\":\"%s/result\"}\n",
                    req->job_id, location, location);
    return gemmd_respond_buf(req, 202, "application/json", &b, location);
}

/* ---- GET /v1/jobs/{id} ---------------------------------------------------------- */

/* Also the answer for another token's job: its existence is not revealed. */
static enum MHD_Result no_such_job(gemmd_request *req)
{
    return gemmd_respond_errorf(req, 404, "job_not_found",
                                "no job %.40s is kept here: it never existed, was deleted, or expired "
                                "(job_ttl)", req->job_id);
}

enum MHD_Result gemmd_route_job_status(gemmd_request *req)
{
    gemmd_services *srv = req->svc;
    gemmd_job_entry *j = gemmd_jobs_get_owned(srv->jobs, req->job_id, req->owner);
    if (!j) return no_such_job(req);
    gemmd_job_view v;
    gemmd_jobs_view(srv->jobs, j, &v);
    gemmd_jobs_put(srv->jobs, j);

    gemmd_timing t = {.recv_ms = v.recv_ms, .decode_ms = v.decode_ms};
    if (v.finished) gemmd_timing_from_job(&t, &v.timing);
    t.total_ms = v.total_ms;
    if (v.kernel[0] && v.finished) snprintf(req->hdr_kernel, sizeof req->hdr_kernel, "%s", v.kernel);
    if (v.device[0]) snprintf(req->hdr_device, sizeof req->hdr_device, "%s", v.device);

    gemm_buf b = {0};
    gemm_buf_printf(&b, "{\"id\":\"%s\",\"state\":\"%s\",\"shape\":[%llu,%llu],\"k\":%llu,\"dtype\":\"%s\","
                    "\"out_dtype\":\"%s\"", v.id, gemm_job_state_name(v.state), (unsigned long long)v.m,
                    (unsigned long long)v.n, (unsigned long long)v.k, gemm_dtype_name(v.dtype),
                    gemm_dtype_name(v.c_dtype)); /* the names need no escaping */
    gemmd_ran_fields_json(&b, ",", v.kernel, v.tile, v.block, gemm_math_report_name(v.dtype, v.math), v.device);
    gemm_buf_printf(&b, ",\"location\":\"/v1/jobs/%s\",\"result\":\"/v1/jobs/%s/result\"", v.id, v.id);
    if (v.finished) gemm_buf_printf(&b, ",\"expires_in_s\":%.1f", v.expires_in_s);
    if (v.finished && v.state != GEMM_JOB_DONE) {
        gemm_buf_printf(&b, ",\"error\":{\"status\":%d,\"code\":\"%s\",\"message\":", v.err.status, v.err.code);
        gemm_buf_json_string(&b, v.err.message);
        gemm_buf_puts(&b, "}");
    }
    gemm_buf_puts(&b, ",\"timing\":");
    gemmd_timing_json(&b, &t);
    gemm_buf_puts(&b, "}\n");
    return gemmd_respond_buf(req, 200, "application/json", &b, NULL); /* Server-Timing: this request's own times */
}

/* ---- GET /v1/jobs/{id}/result ------------------------------------------------------ */

/* Under the request's stripe lock (gemmd_sync_suspend_for): starts encoding req's kept result. */
static int offload_result(gemmd_request *req) { return gemmd_offload_run(req->svc->offload, encode_result, req); }

enum MHD_Result gemmd_route_job_result(gemmd_request *req)
{
    gemmd_services *srv = req->svc;
    gemmd_job_entry *j = gemmd_jobs_get_owned(srv->jobs, req->job_id, req->owner);
    if (!j) return no_such_job(req);
    gemmd_job_view v;
    gemmd_jobs_view(srv->jobs, j, &v);
    gemmd_format fmt = GEMMD_FMT_NONE;
    uint64_t rows = gemmd_answer_rows(v.m, j->job.batch);
    int rc = -1;
    if (!v.finished)
        gemm_err_set(&req->err, 409, "job_not_done", "job %s is %s; poll GET /v1/jobs/%s until it is done", v.id,
                     gemm_job_state_name(v.state), v.id);
    else if (v.state != GEMM_JOB_DONE)
        req->err = v.err;
    else if ((rc = gemmd_accept(req, (gemmd_format)j->family, &fmt)) == 0 && fmt == GEMMD_FMT_JSON)
        rc = gemmd_check_json_answer(srv, rows, v.n, v.c_dtype, &req->err);
    if (rc != 0) {
        gemmd_jobs_put(srv->jobs, j);
        return gemmd_respond_error(req, &req->err);
    }
    req->timing.recv_ms = v.recv_ms;
    req->timing.decode_ms = v.decode_ms;
    gemmd_timing_from_job(&req->timing, &v.timing);
    req->timing.total_base_ms = v.total_ms;
    if (fmt == GEMMD_FMT_JSON && srv->offload &&
        gemmd_json_answer_bytes(rows, v.n, v.c_dtype) >= GEMMD_JSON_OFFLOAD_BYTES) {
        /* Encoded on an offload thread while this connection waits suspended. */
        req->offload_entry = j;
        if (gemmd_sync_suspend_for(req, offload_result) == 0) {
            gemmd_conn_wait(req->cx);
            return MHD_YES;
        }
        req->offload_entry = NULL;
    }
    gemmd_product_meta meta = {.job = &j->job, .job_id = j->id};
    /* The entry (and C in it) lives until the answer is sent: the reference goes with it. */
    return gemmd_respond_product(req, 200, fmt, j->job.c, v.m, v.n, &meta, release_entry, j);
}

/* ---- DELETE /v1/jobs/{id} -------------------------------------------------------- */

enum MHD_Result gemmd_route_job_delete(gemmd_request *req)
{
    if (gemmd_jobs_delete_owned(req->svc->jobs, req->job_id, req->owner) != 0) return no_such_job(req);
    gemm_buf b = {0};
    return gemmd_respond_buf(req, 204, NULL, &b, NULL);
}
