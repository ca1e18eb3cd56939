/*
 * npy.h - NumPy .npy files (format 1.0, 2.0 and 3.0), read as a stream and written: 2-D
 * arrays and 3-D stacks (C order) of the descrs in gemm_dtypes[].npy ('=' taken for '<';
 * bfloat16 is '<V2', as np.save writes an ml_dtypes.bfloat16 array); a fortran_order matrix
 * is transposed on finish. Other dtypes are refused naming the dtype (docs/API.md).
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

/* Parses the header at the start of buf[0..len): 1 (*hdr filled), 0 (more bytes needed), or
 * -1 (400 bad_npy, 415 unsupported_dtype, 422 bad_shape). */
int gemm_npy_parse_header(const void *buf, size_t len, gemm_npy_header *hdr, gemm_err *err);

/* Writes a format 1.0 header for a C-order batch x rows x cols array (batch 0: a rows x cols
 * one); the total length is a multiple of 64. Returns the bytes written, or 0 if cap is too
 * small (128 is enough). */
size_t gemm_npy_write_header3(void *buf, size_t cap, gemm_dtype d, uint64_t batch, uint64_t rows,
                              uint64_t cols);

/* Streaming reader: chunks of any size. Once the header is complete the shape is checked
 * against the limits and the data buffer taken from the allocator; data is copied into it. */
typedef struct gemm_npy_reader gemm_npy_reader;

gemm_npy_reader *gemm_npy_reader_new(const gemm_limits *lim, const gemm_allocator *alloc);
int gemm_npy_reader_feed(gemm_npy_reader *r, const void *data, size_t len, gemm_err *err);
/* The header, once parsed (NULL before). */
const gemm_npy_header *gemm_npy_reader_header(const gemm_npy_reader *r);
/* The whole array arrived (else 400 truncated): the buffer moves to *out (the caller frees
 * it with the same allocator; out->batch 0 for 2-D). 0 or -1. */
int gemm_npy_reader_finish(gemm_npy_reader *r, gemm_matrix *out, gemm_err *err);
/* Frees the reader and any buffer not handed out. NULL is fine. */
void gemm_npy_reader_free(gemm_npy_reader *r);

#ifdef __cplusplus
}
#endif
#endif
