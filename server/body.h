/*
 * body.h - the operands a body carries: A, B and the options of a product (/v1/matmul,
 * /v1/jobs; v2 fills them from its own reader), or the one matrix of POST /v1/matrices.
 * Decoded as the body arrives, straight into engine memory: raw into A and B once
 * admitted, JSON through json_stream.h (the body never held whole), npy and multipart
 * through npy readers.
 */
#ifndef GEMMD_BODY_H
#define GEMMD_BODY_H

#include "multipart.h"
#include "npy.h"
#include "request.h"

struct gemmd_operands {
    int one_matrix;            /* POST /v1/matrices: one matrix (a), not a product */
    gemmd_format family;       /* the body's format */
    gemmd_format answer;       /* the product's answer, negotiated from Accept */
    gemm_options opt;
    gemm_matrix a, b;          /* decoded inputs (engine memory) until handed to a job */
    gemmd_matrix_entry *ref[2];/* A / B named by id (a reference held until freed): a / b
                                  then hold their shape and dtype, data NULL */
    int have[2];
    int store_c, return_c;     /* ?store=1: C becomes a resident matrix; &return=1: and is sent */
    int admit_pending;         /* allocations planned by begin(), made once admitted */
    size_t reserved;           /* bytes reserved in the matrix store, until added or freed */
    int matrix_empty;          /* POST /v1/matrices?empty=1: created to be filled by PUTs */
    gemm_resident *c_res;      /* store=1: C's engine handle, until the store takes it */
    gemm_job job;              /* the synchronous product */
    gemmd_job_entry *entry;    /* POST /v1/jobs: its place in the job store, until submitted */

    struct gemm_json_stream *js; /* JSON bodies: the decoder */
    size_t raw_a_bytes, raw_total, raw_got;
    gemm_multipart *mp;
    gemm_npy_reader *rd[2];
    int part;                  /* current part: 0 a, 1 b, 2 text option, -1 none */
    char part_name[16];
    char text[128];
    size_t text_len;
};

/* The operands of req (an empty set), or NULL with req->err set (503). */
gemmd_operands *gemmd_operands_new(gemmd_request *req);
/* The body reader's steps (routes.h): begin for a product and for one matrix, then open
 * (the allocations begin planned, once admitted), feed, finish (into op->a, op->b), end. */
int gemmd_body_begin(gemmd_request *req);
int gemmd_matrix_begin(gemmd_request *req);
int gemmd_body_open(gemmd_request *req);
void gemmd_body_feed(gemmd_request *req, const char *data, size_t len);
int gemmd_body_finish(gemmd_request *req);
void gemmd_operands_end(gemmd_request *req);
/* The body is decoded: its time noted, and logged. */
void gemmd_body_decoded(gemmd_request *req);

/* 422 unsupported_math when a math mode is asked for a product that is not float32, and
 * 422 bad_out_dtype when out_dtype is not one the operands' dtype allows (float16 /
 * bfloat16: float32 or theirs; others: only theirs). 0 or -1. */
int gemmd_check_math(const gemm_options *o, gemm_dtype dtype, gemm_err *err);
/* The dtype of the product's C (A's dtype and opt.out_dtype, checked). */
gemm_dtype gemmd_c_dtype(const gemmd_operands *op);

#endif
