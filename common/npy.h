/*
 * npy.h - NumPy .npy files (format 1.0, 2.0 and 3.0), read as a stream and written.
 *
 * Only 2-D arrays (and 3-D stacks of matrices, C order) of the descrs of gemm_dtypes[].npy
 * are accepted: float32 ('<f4'), float64 ('<f8'), int32 ('<i4'), float16 ('<f2') and bfloat16
 * ('<V2'; '=' is taken for '<'). NumPy has no bfloat16: np.save writes an ml_dtypes.bfloat16
 * array as '<V2', which np.load gives as a 2-byte void array (.view(ml_dtypes.bfloat16) makes
 * it bfloat16 again). Big-endian, object, structured and other dtypes are refused with a
 * message naming the dtype. fortran_order arrays are transposed into row-major on finish.
 */
#ifndef GEMM_NPY_H
#define GEMM_NPY_H

#include "gemm_types.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GEMM_NPY_MAX_HEADER 65536 /* header bytes we accept (NumPy writes < 4 KiB) */

typedef struct {
    int major, minor;      /* format version */
    gemm_dtype dtype;
    uint64_t rows, cols;
    uint64_t batch;        /* 0 for a 2-D array; the first dimension of a 3-D one */
    int ndim;              /* 2 or 3 */
    int fortran_order;
    size_t data_offset;    /* bytes before the data: magic + version + length + header */
} gemm_npy_header;

/* Parses the header at the start of buf[0..len).
 * Returns 1 when complete (*hdr filled), 0 when more bytes are needed, -1 on error:
 * 400 bad_npy (not .npy, malformed header), 415 unsupported_dtype (big-endian, object,
 * other dtypes: the message names it), 422 bad_shape (not 2-D or 3-D, or a 3-D array in
 * fortran_order). */
int gemm_npy_parse_header(const void *buf, size_t len, gemm_npy_header *hdr, gemm_err *err);

/* Writes a format 1.0 header for a C-order batch x rows x cols array (batch 0: a rows x cols
 * one); the total length is a multiple of 64. Returns the bytes written, or 0 if cap is too
 * small (128 is enough). */
size_t gemm_npy_write_header3(void *buf, size_t cap, gemm_dtype d, uint64_t batch, uint64_t rows,
                              uint64_t cols);

/* Streaming reader: feed the file in chunks of any size. Once the header is complete
 * the shape is checked against the limits (413 too_large) and the data buffer is taken
 * from the allocator (500 out_of_memory when it fails); data bytes are then copied
 * straight into it. More bytes than the header announces: 400 bad_npy. */
typedef struct gemm_npy_reader gemm_npy_reader;

gemm_npy_reader *gemm_npy_reader_new(const gemm_limits *lim, const gemm_allocator *alloc);
int gemm_npy_reader_feed(gemm_npy_reader *r, const void *data, size_t len, gemm_err *err);
/* The header, once parsed (NULL before). */
const gemm_npy_header *gemm_npy_reader_header(const gemm_npy_reader *r);
/* Checks that the whole array arrived (400 truncated otherwise), transposes a
 * fortran_order array, and moves the buffer to *out (out->batch: 0 for 2-D, else the
 * first dimension of a 3-D array) (the caller frees it with the same
 * allocator). Returns 0 or -1. */
int gemm_npy_reader_finish(gemm_npy_reader *r, gemm_matrix *out, gemm_err *err);
/* Frees the reader and any buffer not handed out. NULL is fine. */
void gemm_npy_reader_free(gemm_npy_reader *r);

#ifdef __cplusplus
}
#endif
#endif
