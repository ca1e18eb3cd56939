/* fuzz_json.c - libFuzzer target for the streaming JSON decoder and the writer.
 *
 * The input's first byte seeds how the rest, a body, is cut into chunks (sizes 1 to 64, or
 * every byte alone) and, by its value mod 4, what it is: a request (0, 1), a request whose
 * {"ref": ID} operands are resolved (2; ids "f32" and "f64" exist) and, every other time,
 * whose B is named in the query, or one matrix on its own (3). The body is decoded in those
 * chunks and in one piece: both must give the same matrices, or the same error (status,
 * code and message, byte offsets included), and leave nothing held. When a plain request
 * decodes, A and B are written back with gemm_json_write_matrix (a 3-D operand, a batch,
 * one matrix after the other inside one more array) into a new body that must decode to
 * bit-identical matrices (the writer's digits round-trip). Built and run by `make fuzz`. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_codec.h"
#include "json_stream.h"
#include "json_stream_int.h" /* what the decoder holds: s->mem */

static const gemm_limits lim = {.max_dim = 1 << 12, .max_elements = 1 << 16, .max_body_bytes = 0};

typedef struct {
    int rc;
    gemm_err err;
    gemm_options opt;
    gemm_matrix a, b;
} outcome;

static int resolve(void *user, int which, const char *id, gemm_matrix *out, gemm_err *err)
{
    (void)user, (void)which;
    memset(out, 0, sizeof *out);
    if (strcmp(id, "f32") != 0 && strcmp(id, "f64") != 0)
        return gemm_err_set(err, 404, "matrix_not_found", "no resident matrix %.40s", id);
    out->rows = 2;
    out->cols = 2;
    out->dtype = id[1] == '3' ? GEMM_DTYPE_F32 : GEMM_DTYPE_F64;
    return 0;
}

static void decode(const char *body, size_t len, uint32_t seed, int pieces, outcome *o)
{
    int mode = (int)(seed % 4);
    memset(o, 0, sizeof *o);
    gemm_options_init(&o->opt);
    gemm_json_stream *js = mode == 3 ? gemm_json_stream_new_matrix(&lim, &gemm_allocator_host, &o->opt, pieces ? 0 : len)
                                     : gemm_json_stream_new(&lim, &gemm_allocator_host, &o->opt, pieces ? 0 : len);
    if (!js) abort();
    if (mode == 2) {
        gemm_json_refs refs = {{0, (int)(seed & 4)}, resolve, NULL};
        o->b.rows = 2;
        o->b.cols = 3;
        o->b.dtype = GEMM_DTYPE_F64;
        gemm_json_stream_set_refs(js, &refs, &o->a, &o->b);
    }
    size_t off = 0;
    while (off < len && o->rc == 0) {
        size_t n = len - off;
        if (pieces) {
            seed = seed * 1103515245u + 12345u;
            size_t c = (seed >> 16) % 64 + 1;
            if ((seed >> 8) % 8 == 0) c = 1;
            if (c < n) n = c;
        }
        o->rc = gemm_json_stream_feed(js, body + off, n, &o->err);
        off += n;
    }
    if (o->rc == 0)
        o->rc = mode == 3 ? gemm_json_stream_finish_matrix(js, &o->opt, &o->a, &o->err)
                          : gemm_json_stream_finish(js, &o->opt, &o->a, &o->b, &o->err);
    if (js->mem.now != 0) abort(); /* finished: the matrices are the caller's */
    gemm_json_stream_free(js);
    if (o->rc && (o->err.status == 0 || o->err.code[0] == '\0' || o->a.data || o->b.data)) abort();
}

static size_t bytes_of(const gemm_matrix *m)
{
    size_t n;
    if (!m->data) return 0; /* a resident operand: shape only */
    if (!gemm_matrix_bytes(m->rows, m->cols, m->dtype, &n) || !gemm_mul_size(n, m->batch ? m->batch : 1, &n)) abort();
    return n;
}

/* m as JSON: nested arrays, three deep for a batch. */
static void write_operand(gemm_buf *out, const gemm_matrix *m)
{
    if (!m->batch) {
        gemm_json_write_matrix(out, m);
        return;
    }
    gemm_matrix one = *m;
    one.batch = 0;
    size_t step = bytes_of(m) / m->batch;
    gemm_buf_puts(out, "[");
    for (uint64_t i = 0; i < m->batch; i++) {
        if (i) gemm_buf_puts(out, ",");
        one.data = (char *)m->data + i * step;
        gemm_json_write_matrix(out, &one);
    }
    gemm_buf_puts(out, "]");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    uint32_t seed = data[0];
    const char *body = (const char *)data + 1;
    size_t len = size - 1;

    outcome whole, cut;
    decode(body, len, seed, 0, &whole);
    decode(body, len, seed, 1, &cut);
    if (whole.rc != cut.rc) {
        fprintf(stderr, "one piece %d (%s), in chunks %d (%s)\n", whole.rc, whole.err.message, cut.rc, cut.err.message);
        abort();
    }
    if (whole.rc) {
        if (whole.err.status != cut.err.status || strcmp(whole.err.code, cut.err.code) ||
            strcmp(whole.err.message, cut.err.message)) {
            fprintf(stderr, "one piece: %s\nin chunks: %s\n", whole.err.message, cut.err.message);
            abort();
        }
        return 0;
    }
    /* a product as NumPy matmul broadcasts a leading batch dimension; one matrix is 2-D */
    if (seed % 4 != 3 && (whole.a.cols != whole.b.rows || whole.a.dtype != whole.opt.dtype ||
                          whole.b.dtype != whole.opt.dtype || (whole.b.batch && whole.b.batch != whole.a.batch) ||
                          ((whole.a.batch || whole.b.batch) && (!whole.a.data || !whole.b.data))))
        abort();
    if (seed % 4 == 3 && whole.a.batch) abort();
    if (cut.a.rows != whole.a.rows || cut.a.cols != whole.a.cols || cut.b.rows != whole.b.rows ||
        cut.b.cols != whole.b.cols || cut.a.dtype != whole.a.dtype || cut.a.batch != whole.a.batch ||
        cut.b.batch != whole.b.batch ||
        (whole.a.data && memcmp(cut.a.data, whole.a.data, bytes_of(&whole.a))) ||
        (whole.b.data && memcmp(cut.b.data, whole.b.data, bytes_of(&whole.b))))
        abort();
    if (seed % 4 >= 2) { /* references or one matrix: no round trip */
        gemm_allocator_host.free(NULL, whole.a.data);
        gemm_allocator_host.free(NULL, whole.b.data);
        gemm_allocator_host.free(NULL, cut.a.data);
        gemm_allocator_host.free(NULL, cut.b.data);
        return 0;
    }

    gemm_buf out;
    gemm_buf_init(&out);
    gemm_buf_printf(&out, "{\"dtype\": \"%s\", \"a\": ", gemm_dtype_name(whole.opt.dtype));
    write_operand(&out, &whole.a);
    gemm_buf_puts(&out, ", \"b\": ");
    write_operand(&out, &whole.b);
    gemm_buf_puts(&out, "}");
    if (out.failed) abort();
    outcome again;
    decode(out.data, out.len, seed, 1, &again);
    if (again.rc) {
        fprintf(stderr, "re-decoding failed: %s\n%s\n", again.err.message, out.data);
        abort();
    }
    if (again.a.rows != whole.a.rows || again.a.cols != whole.a.cols || again.b.rows != whole.b.rows ||
        again.b.cols != whole.b.cols || again.a.batch != whole.a.batch || again.b.batch != whole.b.batch || memcmp(again.a.data, whole.a.data, bytes_of(&whole.a)) ||
        memcmp(again.b.data, whole.b.data, bytes_of(&whole.b)))
        abort();
    outcome *all[3] = {&whole, &cut, &again};
    for (int i = 0; i < 3; i++) {
        gemm_allocator_host.free(NULL, all[i]->a.data);
        gemm_allocator_host.free(NULL, all[i]->b.data);
    }
    gemm_buf_free(&out);
    return 0;
}
