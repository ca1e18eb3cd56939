/*
 * multiply.c - `gemm multiply A B -o C` (docs/CLIENT.md): the output is committed only when
 * everything succeeded.
 */
#include "cli.h"

#include "client_internal.h" /* the stages of gemm_timing */
#include "gemm_util.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int is_text(gemm_cli_format f) { return f == GEMM_FMT_CSV || f == GEMM_FMT_TSV || f == GEMM_FMT_TXT; }

static void print_ms(const char *name, double v)
{
    if (v >= 0) fprintf(stderr, "  %-16s %10.3f ms\n", name, v);
}

static void print_timing(gemm_timing *t, const gemm_request *r, int async, double wall_ms)
{
    fprintf(stderr, "gemm: %llux%llux%llu %s, kernel %s%s%s%s%s\n", (unsigned long long)r->m,
            (unsigned long long)r->k, (unsigned long long)r->n, gemm_dtype_name(r->dtype),
            t->kernel[0] ? t->kernel : "?", t->math[0] ? ", math " : "", t->math,
            t->device[0] ? ", on " : "", t->device);
    for (int i = 0; i < GEMM_STAGES; i++) {
        char name[32];
        snprintf(name, sizeof name, "server %s", gemm_stage_names[i]);
        print_ms(name, *gemm_timing_stage(t, i));
    }
    /* async: submit + polls + fetch; the transfer line is then that minus the server's
     * total, which includes the polling interval's slack */
    print_ms(async ? "client job" : "client request", t->client_total_ms);
    print_ms(async ? "client - server" : "client transfer", t->client_transfer_ms);
    print_ms("command total", wall_ms);
    if (t->kernel_ms > 0)
        fprintf(stderr, "  %-16s %10.2f GFLOP/s\n", "kernel rate",
                2.0 * (double)r->m * (double)r->n * (double)r->k / (t->kernel_ms * 1e6));
    if (t->retries) fprintf(stderr, "  %-16s %10d\n", "503 retries", t->retries);
}

/* Cancels a queued job after Ctrl-C, with a fresh handle (the main one aborts everything). */
static void cancel_job(const gemm_cli_opts *o, const char *id)
{
    gemm_cli_opts o2 = *o;
    o2.retries = 0;
    if (o2.timeout_ms == 0 || o2.timeout_ms > 5000) o2.timeout_ms = 5000;
    gemm_client *c = gemm_cli_client(&o2, NULL, NULL); /* best effort; job_delete refuses a NULL c */
    if (gemm_client_job_delete(c, id, NULL) == 0) fprintf(stderr, "gemm: job %s cancelled\n", id);
    gemm_client_free(c);
}

/* Submit, poll, fetch. The client time is the whole of it, so that it encloses the server's
 * total (the fetch alone would be smaller). */
static int run_async(const gemm_cli_opts *o, gemm_client *c, const gemm_request *r, gemm_timing *t,
                     gemm_client_error *err)
{
    char id[96];
    double t0 = gemm_now_ms();
    if (gemm_client_job_submit(c, r, id, sizeof id, err) != 0) return -1;
    if (o->verbose) fprintf(stderr, "gemm: job %s queued\n", id);
    gemm_job_info info;
    if (gemm_client_job_wait(c, id, 10, o->timeout_ms, &info, err) != 0) {
        if (err->kind == GEMM_CLIENT_E_ABORTED || err->kind == GEMM_CLIENT_E_TIMEOUT) cancel_job(o, id);
        return -1;
    }
    if (gemm_client_job_fetch(c, id, gemm_request_c_dtype(r), r->m, r->n, r->c, t, err) != 0) {
        if (err->kind == GEMM_CLIENT_E_ABORTED) cancel_job(o, id);
        return -1;
    }
    /* the fetch's Server-Timing may be empty: keep the stages the status reported (the
     * stages are gemm_timing's first members, recv_ms to total_ms) */
    if (t->total_ms < 0) {
        memcpy(t, &info.timing, offsetof(gemm_timing, client_total_ms));
        if (!t->kernel[0]) snprintf(t->kernel, sizeof t->kernel, "%s", info.timing.kernel);
    }
    t->client_total_ms = gemm_now_ms() - t0;
    t->client_transfer_ms = t->total_ms >= 0 ? t->client_total_ms - t->total_ms : -1;
    gemm_client_job_delete(c, id, NULL); /* the result is ours now: let the server forget it */
    return 0;
}

/* Opens A and B (binary ones first: a text input without --dtype takes the other one's
 * dtype) and checks that they make a product. 0, or the exit status after saying why. */
static int open_inputs(const gemm_cli_opts *o, gemm_cli_format fa, gemm_cli_format fb, gemm_dtype dtype,
                       gemm_cli_input *A, gemm_cli_input *B)
{
    const char *pa = o->pos[0], *pb = o->pos[1];
    char msg[600];
    uint64_t shape[3] = {0, 0, 0};
    int nshape = 0;
    if (o->shape && (nshape = gemm_client_parse_shape(o->shape, shape)) < 0)
        return gemm_cli_say(GEMM_EXIT_USAGE, "--shape \"%s\": expected MxK or MxKxN (whole numbers >= 1)", o->shape);
    int a_first = !(is_text(fa) && !is_text(fb));
    for (int pass = 0; pass < 2; pass++) {
        int doing_a = (pass == 0) == a_first;
        gemm_dtype want = dtype;
        const gemm_cli_input *other = doing_a ? B : A;
        if (want == GEMM_DTYPE_INVALID && other->data) want = other->dtype;
        int ok;
        if (doing_a) {
            ok = gemm_cli_input_open(A, pa, fa, fa == GEMM_FMT_NPY ? dtype : want, shape[0],
                                     nshape >= 2 ? shape[1] : 0, msg, sizeof msg);
        } else {
            uint64_t rows = nshape >= 2 ? shape[1] : A->data ? A->cols : 0;
            uint64_t cols = nshape == 3 ? shape[2] : 0;
            ok = gemm_cli_input_open(B, pb, fb, fb == GEMM_FMT_NPY ? dtype : want, rows, cols, msg, sizeof msg);
            if (ok != 0 && fb == GEMM_FMT_RAW && rows == 0)
                snprintf(msg, sizeof msg, "%s: raw binary B needs --shape MxKxN (or A's shape from A)", pb);
        }
        if (ok != 0) return gemm_cli_say(strstr(msg, "needs --") ? GEMM_EXIT_USAGE : GEMM_EXIT_IO, "%s", msg);
    }
    if (A->dtype != B->dtype)
        return gemm_cli_say(GEMM_EXIT_IO, "A is %s and B is %s: give both the same dtype", gemm_dtype_name(A->dtype),
                            gemm_dtype_name(B->dtype));
    if (A->cols != B->rows)
        return gemm_cli_say(GEMM_EXIT_IO, "A is %llux%llu and B is %llux%llu: A's columns (%llu) must equal B's rows "
                            "(%llu)", (unsigned long long)A->rows, (unsigned long long)A->cols,
                            (unsigned long long)B->rows, (unsigned long long)B->cols, (unsigned long long)A->cols,
                            (unsigned long long)B->rows);
    /* 3-D .npy: A (b, m, k) with B (b, k, n) or one (k, n) for all, as numpy.matmul. */
    if (B->batch && (!A->batch || B->batch != A->batch))
        return gemm_cli_say(GEMM_EXIT_IO, "A holds %llu matrices and B %llu: B must hold as many as A, or be one 2-D "
                            "matrix", (unsigned long long)A->batch, (unsigned long long)B->batch);
    if (A->batch && o->async)
        return gemm_cli_say(GEMM_EXIT_USAGE, "--async takes one product; send a 3-D batch without it");
    return 0;
}

int gemm_cli_multiply(const gemm_cli_opts *o)
{
    double start = gemm_now_ms();
    char msg[600];
    const char *pa = o->pos[0], *pb = o->pos[1], *pc = o->out ? o->out : "-";
    gemm_cli_format fa, fb, fc;
    if (gemm_cli_format_of(pa, o->format, &fa, msg, sizeof msg) != 0 ||
        gemm_cli_format_of(pb, o->format, &fb, msg, sizeof msg) != 0 ||
        gemm_cli_format_of(pc, o->out_format ? o->out_format : o->format, &fc, msg, sizeof msg) != 0)
        return gemm_cli_say(GEMM_EXIT_USAGE, "%s", msg);
    if (strcmp(pa, "-") == 0 || strcmp(pb, "-") == 0)
        return gemm_cli_say(GEMM_EXIT_USAGE, "inputs must be files (they are mapped, not read from a pipe)");
    gemm_dtype dtype = GEMM_DTYPE_INVALID, out_dtype = GEMM_DTYPE_INVALID;
    gemm_request req = GEMM_REQUEST_INIT;
    int rc = gemm_cli_request_opts(o, &dtype, &out_dtype, &req);
    if (rc != 0) return rc;
    gemm_cli_input A = {0}, B = {0};
    gemm_cli_output C = {.fd = -1};
    if ((rc = open_inputs(o, fa, fb, dtype, &A, &B)) != 0) goto out;
    req.dtype = A.dtype;
    if ((rc = gemm_cli_out_half(out_dtype, &req)) != 0) goto out;
    if (gemm_cli_output_create(&C, pc, fc, gemm_request_c_dtype(&req), A.batch, A.rows, B.cols, msg, sizeof msg) != 0) {
        rc = gemm_cli_say(GEMM_EXIT_IO, "%s", msg);
        goto out;
    }
    req.m = A.rows;
    req.k = A.cols;
    req.n = B.cols;
    req.a = A.data;
    req.b = B.data;
    req.c = C.data;

    gemm_client_error err;
    gemm_cli_bar.enabled = o->progress > 0 || (o->progress < 0 && isatty(2));
    gemm_client *cl = gemm_cli_client(o, &gemm_cli_bar, &err);
    gemm_timing t;
    int r = !cl       ? -1 /* err says why */
            : A.batch  ? gemm_client_multiply_batch(cl, &req, A.batch, B.batch == 0, &t, &err)
            : o->async ? run_async(o, cl, &req, &t, &err)
                       : gemm_client_multiply_streams(cl, &req, o->streams, &t, &err);
    gemm_client_free(cl);
    gemm_cli_progress_done(&gemm_cli_bar);
    if (gemm_cli_interrupted) {
        fprintf(stderr, "\ngemm: interrupted; no output written\n");
        rc = GEMM_EXIT_INTERRUPTED;
    } else if (r != 0) {
        rc = gemm_cli_fail(&err, "multiply");
    } else if (gemm_cli_output_commit(&C, msg, sizeof msg) != 0) {
        rc = gemm_cli_say(GEMM_EXIT_IO, "%s", msg);
    } else if (o->timing) {
        print_timing(&t, &req, o->async, gemm_now_ms() - start); /* rc is GEMM_EXIT_OK */
    }
out:
    gemm_cli_output_abort(&C);
    gemm_cli_input_close(&A);
    gemm_cli_input_close(&B);
    return rc;
}
