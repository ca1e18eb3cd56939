/* fuzz_npy.c - libFuzzer target for the .npy header parser and streaming reader.
 *
 * The input is a .npy file. It is read twice, whole and in chunks whose sizes come from
 * the input's own bytes; both reads must agree (result, error status, decoded bytes).
 * A header that parses is written back with gemm_npy_write_header3 and must parse to the
 * same shape and dtype. Built and run by `make fuzz`. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npy.h"

static const gemm_limits lim = {.max_dim = 1 << 16, .max_elements = 1 << 18, .max_body_bytes = 0};

static int read_all(const uint8_t *d, size_t n, int chunked, gemm_matrix *m, gemm_err *err)
{
    gemm_npy_reader *r = gemm_npy_reader_new(&lim, &gemm_allocator_host);
    if (!r) abort();
    size_t off = 0;
    unsigned seed = n ? d[0] : 1;
    int rc = 0;
    while (off < n) {
        size_t c = n - off;
        if (chunked) {
            seed = seed * 1103515245u + 12345u;
            c = 1 + (seed >> 16) % 37;
            if (c > n - off) c = n - off;
        }
        rc = gemm_npy_reader_feed(r, d + off, c, err);
        if (rc) break;
        off += c;
    }
    if (rc == 0) rc = gemm_npy_reader_finish(r, m, err);
    gemm_npy_reader_free(r);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gemm_npy_header h;
    gemm_err e1, e2;
    gemm_err_clear(&e1);
    int hr = gemm_npy_parse_header(data, size, &h, &e1);
    if (hr == 1) {
        if (gemm_dtype_size(h.dtype) == 0) abort();
        unsigned char buf[256];
        size_t w = gemm_npy_write_header3(buf, sizeof buf, h.dtype, 0, h.rows, h.cols);
        if (w == 0 || w % 64 != 0) abort();
        gemm_npy_header h2;
        if (gemm_npy_parse_header(buf, w, &h2, &e2) != 1) abort();
        if (h2.rows != h.rows || h2.cols != h.cols || h2.dtype != h.dtype || h2.fortran_order ||
            h2.data_offset != w)
            abort();
    } else if (hr == -1 && (e1.status == 0 || e1.code[0] == '\0')) {
        abort(); /* every refusal carries an error */
    }

    gemm_matrix m1 = {0}, m2 = {0};
    gemm_err_clear(&e1);
    gemm_err_clear(&e2);
    int r1 = read_all(data, size, 0, &m1, &e1);
    int r2 = read_all(data, size, 1, &m2, &e2);
    if (r1 != r2) abort();
    if (r1 == 0) {
        size_t bytes;
        if (!gemm_matrix_bytes(m1.rows, m1.cols, m1.dtype, &bytes)) abort();
        if (m1.rows != m2.rows || m1.cols != m2.cols || m1.dtype != m2.dtype) abort();
        if (memcmp(m1.data, m2.data, bytes) != 0) abort();
    } else if (e1.status != e2.status || strcmp(e1.code, e2.code) != 0 || e1.status == 0) {
        abort();
    }
    gemm_allocator_host.free(NULL, m1.data);
    gemm_allocator_host.free(NULL, m2.data);
    return 0;
}
