/* fuzz_json.c - libFuzzer target for the JSON request decoder and the matrix writer.
 *
 * The input is a request body. When it decodes, A and B are written back with
 * gemm_json_write_matrix into a new body that must decode to bit-identical matrices
 * (the writer's digits round-trip). Every refusal must carry an error. Built and run by
 * `make fuzz`. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_codec.h"

static const gemm_limits lim = {.max_dim = 1 << 12, .max_elements = 1 << 16, .max_body_bytes = 0};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gemm_options opt;
    gemm_matrix a = {0}, b = {0};
    gemm_err err;
    gemm_options_init(&opt);
    gemm_err_clear(&err);
    if (gemm_json_decode_request((const char *)data, size, &lim, &gemm_allocator_host, &opt, &a, &b, &err)) {
        if (err.status == 0 || err.code[0] == '\0' || a.data || b.data) abort();
        return 0;
    }
    if (a.cols != b.rows || a.dtype != opt.dtype || b.dtype != opt.dtype) abort();

    gemm_buf body;
    gemm_buf_init(&body);
    gemm_buf_printf(&body, "{\"dtype\": \"%s\", \"a\": ", gemm_dtype_name(opt.dtype));
    gemm_json_write_matrix(&body, &a);
    gemm_buf_puts(&body, ", \"b\": ");
    gemm_json_write_matrix(&body, &b);
    gemm_buf_puts(&body, "}");
    if (body.failed) abort();

    gemm_options opt2;
    gemm_matrix a2, b2;
    gemm_options_init(&opt2);
    if (gemm_json_decode_request(body.data, body.len, &lim, &gemm_allocator_host, &opt2, &a2, &b2, &err)) {
        fprintf(stderr, "re-decoding failed: %s\n%s\n", err.message, body.data);
        abort();
    }
    size_t ba, bb;
    if (!gemm_matrix_bytes(a.rows, a.cols, a.dtype, &ba) || !gemm_matrix_bytes(b.rows, b.cols, b.dtype, &bb)) abort();
    if (a2.rows != a.rows || a2.cols != a.cols || b2.rows != b.rows || b2.cols != b.cols ||
        memcmp(a.data, a2.data, ba) != 0 || memcmp(b.data, b2.data, bb) != 0)
        abort();
    gemm_allocator_host.free(NULL, a.data);
    gemm_allocator_host.free(NULL, b.data);
    gemm_allocator_host.free(NULL, a2.data);
    gemm_allocator_host.free(NULL, b2.data);
    gemm_buf_free(&body);
    return 0;
}
