/* fuzz_v2.c - libFuzzer target for the Open Inference Protocol request parser and the
 * output tensor writer.
 *
 * The input is an inference request header; its first byte says whether binary tensor
 * data follows (odd: Inference-Header-Content-Length was given). When it parses, the
 * shapes must multiply, binary sizes must match the shapes, and the JSON inputs are
 * converted; they are then written back as output tensors inside a new request, which must
 * parse to bit-identical matrices. Every refusal must carry an error. Built and run by
 * `make fuzz`. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "v2_codec.h"

static const gemm_limits lim = {.max_dim = 1 << 12, .max_elements = 1 << 16, .max_body_bytes = 0};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int binary_ok = data[0] & 1;
    gemm_v2_request r;
    gemm_err err;
    gemm_v2_request_init(&r);
    gemm_err_clear(&err);
    if (gemm_v2_parse_request_admitted((const char *)data + 1, size - 1, binary_ok, &lim, NULL, NULL, &r, &err)) {
        if (err.status == 0 || err.code[0] == '\0') abort();
        gemm_v2_request_free(&r);
        return 0;
    }
    if (r.in[0].cols != r.in[1].rows || gemm_dtype_size(r.dtype) == 0) abort();
    if (r.order[0] == r.order[1]) abort();
    void *m[2] = {NULL, NULL};
    size_t bytes[2];
    int all_json = 1;
    for (int i = 0; i < 2; i++) {
        if (!gemm_matrix_bytes(r.in[i].rows, r.in[i].cols, r.dtype, &bytes[i])) abort();
        if (r.in[i].binary) {
            if (!binary_ok || r.in[i].binary_bytes != bytes[i]) abort();
            all_json = 0;
            continue;
        }
        m[i] = calloc(1, bytes[i]);
        if (!m[i]) abort();
        if (gemm_v2_fill_input(&r, i, m[i], &err) != 0) {
            if (err.status != 400) abort();
            all_json = 0;
        }
    }
    if (all_json) {
        /* Written back as tensors, the inputs parse to the same bits. */
        gemm_buf body;
        gemm_buf_init(&body);
        gemm_buf_puts(&body, "{\"inputs\":[");
        for (int i = 0; i < 2; i++) {
            gemm_matrix t = {.rows = r.in[i].rows, .cols = r.in[i].cols, .dtype = r.dtype, .data = m[i]};
            if (i) gemm_buf_puts(&body, ",");
            gemm_v2_write_output(&body, i ? "B" : "A", &t, 0);
        }
        gemm_buf_puts(&body, "]}");
        if (body.failed) abort();
        gemm_v2_request r2;
        gemm_v2_request_init(&r2);
        if (gemm_v2_parse_request_admitted(body.data, body.len, 0, &lim, NULL, NULL, &r2, &err)) {
            fprintf(stderr, "re-parsing failed: %s\n%s\n", err.message, body.data);
            abort();
        }
        for (int i = 0; i < 2; i++) {
            void *m2 = calloc(1, bytes[i]);
            if (!m2 || gemm_v2_fill_input(&r2, i, m2, &err) != 0 || memcmp(m2, m[i], bytes[i]) != 0) abort();
            free(m2);
        }
        gemm_v2_request_free(&r2);
        gemm_buf_free(&body);
    }
    free(m[0]);
    free(m[1]);
    gemm_v2_request_free(&r);
    return 0;
}
