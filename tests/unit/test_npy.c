/* test_npy.c - .npy headers and the streaming reader: NumPy's own bytes (golden files
 * written by NumPy, embedded below), every header variant NumPy or a hand may write,
 * every refusal, chunking (1 byte, random splits), limits before allocation, Fortran
 * order, and random round trips through gemm_npy_write_header3. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npy.h"

/* ---- golden files ------------------------------------------------------
 * Made with /usr/bin/python3 and NumPy (np.save, and numpy.lib.format.write_array with
 * version=(2,0)/(3,0), and write_array_header_1_0 for the header-only ones):
 *   gold_f4_3x4          (np.arange(12, dtype='<f4').reshape(3, 4) - 5.5) / 3
 *   gold_f8_2x7          np.arange(14, dtype='<f8').reshape(2, 7) * -1.25e10
 *   gold_i4_3x2          (np.arange(6, dtype='<i4').reshape(3, 2) - 3) * 1000003
 *   gold_f4_v2/v3_3x4    the first, in format 2.0 and 3.0
 *   gold_f8_fortran_3x5  np.asfortranarray(np.arange(15, dtype='<f8').reshape(3, 5))
 *   gold_hdr_0..4        headers of <f4 1x1, <f8 3x4, <i4 123456789012x5,
 *                        <f4 (2^64-1)x(2^64-1), <f4 1024x1024 */
/* Generated with NumPy 1.24.2. */
static const unsigned char gold_f4_3x4[176] = {
    0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 0x01, 0x00, 0x76, 0x00, 0x7b, 0x27, 0x64, 0x65, 0x73, 0x63,
    0x72, 0x27, 0x3a, 0x20, 0x27, 0x3c, 0x66, 0x34, 0x27, 0x2c, 0x20, 0x27, 0x66, 0x6f, 0x72, 0x74,
    0x72, 0x61, 0x6e, 0x5f, 0x6f, 0x72, 0x64, 0x65, 0x72, 0x27, 0x3a, 0x20, 0x46, 0x61, 0x6c, 0x73,
    0x65, 0x2c, 0x20, 0x27, 0x73, 0x68, 0x61, 0x70, 0x65, 0x27, 0x3a, 0x20, 0x28, 0x33, 0x2c, 0x20,
    0x34, 0x29, 0x2c, 0x20, 0x7d, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x0a,
    0xab, 0xaa, 0xea, 0xbf, 0x00, 0x00, 0xc0, 0xbf, 0x55, 0x55, 0x95, 0xbf, 0x55, 0x55, 0x55, 0xbf,
    0x00, 0x00, 0x00, 0xbf, 0xab, 0xaa, 0x2a, 0xbe, 0xab, 0xaa, 0x2a, 0x3e, 0x00, 0x00, 0x00, 0x3f,
    0x55, 0x55, 0x55, 0x3f, 0x55, 0x55, 0x95, 0x3f, 0x00, 0x00, 0xc0, 0x3f, 0xab, 0xaa, 0xea, 0x3f,
};

static const unsigned char gold_f8_2x7[240] = {
    0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 0x01, 0x00, 0x76, 0x00, 0x7b, 0x27, 0x64, 0x65, 0x73, 0x63,
    0x72, 0x27, 0x3a, 0x20, 0x27, 0x3c, 0x66, 0x38, 0x27, 0x2c, 0x20, 0x27, 0x66, 0x6f, 0x72, 0x74,
    0x72, 0x61, 0x6e, 0x5f, 0x6f, 0x72, 0x64, 0x65, 0x72, 0x27, 0x3a, 0x20, 0x46, 0x61, 0x6c, 0x73,
    0x65, 0x2c, 0x20, 0x27, 0x73, 0x68, 0x61, 0x70, 0x65, 0x27, 0x3a, 0x20, 0x28, 0x32, 0x2c, 0x20,
    0x37, 0x29, 0x2c, 0x20, 0x7d, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x0a,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x80, 0x00, 0x00, 0x00, 0xe8, 0x76, 0x48, 0x07, 0xc2,
    0x00, 0x00, 0x00, 0xe8, 0x76, 0x48, 0x17, 0xc2, 0x00, 0x00, 0x00, 0x2e, 0x59, 0x76, 0x21, 0xc2,
    0x00, 0x00, 0x00, 0xe8, 0x76, 0x48, 0x27, 0xc2, 0x00, 0x00, 0x00, 0xa2, 0x94, 0x1a, 0x2d, 0xc2,
    0x00, 0x00, 0x00, 0x2e, 0x59, 0x76, 0x31, 0xc2, 0x00, 0x00, 0x00, 0x0b, 0x68, 0x5f, 0x34, 0xc2,
    0x00, 0x00, 0x00, 0xe8, 0x76, 0x48, 0x37, 0xc2, 0x00, 0x00, 0x00, 0xc5, 0x85, 0x31, 0x3a, 0xc2,
    0x00, 0x00, 0x00, 0xa2, 0x94, 0x1a, 0x3d, 0xc2, 0x00, 0x00, 0x80, 0xbf, 0xd1, 0x01, 0x40, 0xc2,
    0x00, 0x00, 0x00, 0x2e, 0x59, 0x76, 0x41, 0xc2, 0x00, 0x00, 0x80, 0x9c, 0xe0, 0xea, 0x42, 0xc2,
};

static const unsigned char gold_i4_3x2[152] = {
    0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 0x01, 0x00, 0x76, 0x00, 0x7b, 0x27, 0x64, 0x65, 0x73, 0x63,
    0x72, 0x27, 0x3a, 0x20, 0x27, 0x3c, 0x69, 0x34, 0x27, 0x2c, 0x20, 0x27, 0x66, 0x6f, 0x72, 0x74,
    0x72, 0x61, 0x6e, 0x5f, 0x6f, 0x72, 0x64, 0x65, 0x72, 0x27, 0x3a, 0x20, 0x46, 0x61, 0x6c, 0x73,
    0x65, 0x2c, 0x20, 0x27, 0x73, 0x68, 0x61, 0x70, 0x65, 0x27, 0x3a, 0x20, 0x28, 0x33, 0x2c, 0x20,
    0x32, 0x29, 0x2c, 0x20, 0x7d, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x0a,
    0x37, 0x39, 0xd2, 0xff, 0x7a, 0x7b, 0xe1, 0xff, 0xbd, 0xbd, 0xf0, 0xff, 0x00, 0x00, 0x00, 0x00,
    0x43, 0x42, 0x0f, 0x00, 0x86, 0x84, 0x1e, 0x00,
};

static const unsigned char gold_f4_v2_3x4[176] = {
    0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 0x02, 0x00, 0x74, 0x00, 0x00, 0x00, 0x7b, 0x27, 0x64, 0x65,
    0x73, 0x63, 0x72, 0x27, 0x3a, 0x20, 0x27, 0x3c, 0x66, 0x34, 0x27, 0x2c, 0x20, 0x27, 0x66, 0x6f,
    0x72, 0x74, 0x72, 0x61, 0x6e, 0x5f, 0x6f, 0x72, 0x64, 0x65, 0x72, 0x27, 0x3a, 0x20, 0x46, 0x61,
    0x6c, 0x73, 0x65, 0x2c, 0x20, 0x27, 0x73, 0x68, 0x61, 0x70, 0x65, 0x27, 0x3a, 0x20, 0x28, 0x33,
    0x2c, 0x20, 0x34, 0x29, 0x2c, 0x20, 0x7d, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x0a,
    0xab, 0xaa, 0xea, 0xbf, 0x00, 0x00, 0xc0, 0xbf, 0x55, 0x55, 0x95, 0xbf, 0x55, 0x55, 0x55, 0xbf,
    0x00, 0x00, 0x00, 0xbf, 0xab, 0xaa, 0x2a, 0xbe, 0xab, 0xaa, 0x2a, 0x3e, 0x00, 0x00, 0x00, 0x3f,
    0x55, 0x55, 0x55, 0x3f, 0x55, 0x55, 0x95, 0x3f, 0x00, 0x00, 0xc0, 0x3f, 0xab, 0xaa, 0xea, 0x3f,
};

static const unsigned char gold_f4_v3_3x4[176] = {
    0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 0x03, 0x00, 0x74, 0x00, 0x00, 0x00, 0x7b, 0x27, 0x64, 0x65,
    0x73, 0x63, 0x72, 0x27, 0x3a, 0x20, 0x27, 0x3c, 0x66, 0x34, 0x27, 0x2c, 0x20, 0x27, 0x66, 0x6f,
    0x72, 0x74, 0x72, 0x61, 0x6e, 0x5f, 0x6f, 0x72, 0x64, 0x65, 0x72, 0x27, 0x3a, 0x20, 0x46, 0x61,
    0x6c, 0x73, 0x65, 0x2c, 0x20, 0x27, 0x73, 0x68, 0x61, 0x70, 0x65, 0x27, 0x3a, 0x20, 0x28, 0x33,
    0x2c, 0x20, 0x34, 0x29, 0x2c, 0x20, 0x7d, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x0a,
    0xab, 0xaa, 0xea, 0xbf, 0x00, 0x00, 0xc0, 0xbf, 0x55, 0x55, 0x95, 0xbf, 0x55, 0x55, 0x55, 0xbf,
    0x00, 0x00, 0x00, 0xbf, 0xab, 0xaa, 0x2a, 0xbe, 0xab, 0xaa, 0x2a, 0x3e, 0x00, 0x00, 0x00, 0x3f,
    0x55, 0x55, 0x55, 0x3f, 0x55, 0x55, 0x95, 0x3f, 0x00, 0x00, 0xc0, 0x3f, 0xab, 0xaa, 0xea, 0x3f,
};

static const unsigned char gold_f8_fortran_3x5[248] = {
    0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 0x01, 0x00, 0x76, 0x00, 0x7b, 0x27, 0x64, 0x65, 0x73, 0x63,
    0x72, 0x27, 0x3a, 0x20, 0x27, 0x3c, 0x66, 0x38, 0x27, 0x2c, 0x20, 0x27, 0x66, 0x6f, 0x72, 0x74,
    0x72, 0x61, 0x6e, 0x5f, 0x6f, 0x72, 0x64, 0x65, 0x72, 0x27, 0x3a, 0x20, 0x54, 0x72, 0x75, 0x65,
    0x2c, 0x20, 0x27, 0x73, 0x68, 0x61, 0x70, 0x65, 0x27, 0x3a, 0x20, 0x28, 0x33, 0x2c, 0x20, 0x35,
    0x29, 0x2c, 0x20, 0x7d, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x0a,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x14, 0x40,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x24, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xf0, 0x3f,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x18, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x26, 0x40,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1c, 0x40,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x28, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x08, 0x40,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x20, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x2a, 0x40,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x22, 0x40,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x2c, 0x40,
};

/* header of <f4 1x1 */
static const unsigned char gold_hdr_0[128] = {
    0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 0x01, 0x00, 0x76, 0x00, 0x7b, 0x27, 0x64, 0x65, 0x73, 0x63,
    0x72, 0x27, 0x3a, 0x20, 0x27, 0x3c, 0x66, 0x34, 0x27, 0x2c, 0x20, 0x27, 0x66, 0x6f, 0x72, 0x74,
    0x72, 0x61, 0x6e, 0x5f, 0x6f, 0x72, 0x64, 0x65, 0x72, 0x27, 0x3a, 0x20, 0x46, 0x61, 0x6c, 0x73,
    0x65, 0x2c, 0x20, 0x27, 0x73, 0x68, 0x61, 0x70, 0x65, 0x27, 0x3a, 0x20, 0x28, 0x31, 0x2c, 0x20,
    0x31, 0x29, 0x2c, 0x20, 0x7d, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x0a,
};

/* header of <f8 3x4 */
static const unsigned char gold_hdr_1[128] = {
    0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 0x01, 0x00, 0x76, 0x00, 0x7b, 0x27, 0x64, 0x65, 0x73, 0x63,
    0x72, 0x27, 0x3a, 0x20, 0x27, 0x3c, 0x66, 0x38, 0x27, 0x2c, 0x20, 0x27, 0x66, 0x6f, 0x72, 0x74,
    0x72, 0x61, 0x6e, 0x5f, 0x6f, 0x72, 0x64, 0x65, 0x72, 0x27, 0x3a, 0x20, 0x46, 0x61, 0x6c, 0x73,
    0x65, 0x2c, 0x20, 0x27, 0x73, 0x68, 0x61, 0x70, 0x65, 0x27, 0x3a, 0x20, 0x28, 0x33, 0x2c, 0x20,
    0x34, 0x29, 0x2c, 0x20, 0x7d, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x0a,
};

/* header of <i4 123456789012x5 */
static const unsigned char gold_hdr_2[128] = {
    0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 0x01, 0x00, 0x76, 0x00, 0x7b, 0x27, 0x64, 0x65, 0x73, 0x63,
    0x72, 0x27, 0x3a, 0x20, 0x27, 0x3c, 0x69, 0x34, 0x27, 0x2c, 0x20, 0x27, 0x66, 0x6f, 0x72, 0x74,
    0x72, 0x61, 0x6e, 0x5f, 0x6f, 0x72, 0x64, 0x65, 0x72, 0x27, 0x3a, 0x20, 0x46, 0x61, 0x6c, 0x73,
    0x65, 0x2c, 0x20, 0x27, 0x73, 0x68, 0x61, 0x70, 0x65, 0x27, 0x3a, 0x20, 0x28, 0x31, 0x32, 0x33,
    0x34, 0x35, 0x36, 0x37, 0x38, 0x39, 0x30, 0x31, 0x32, 0x2c, 0x20, 0x35, 0x29, 0x2c, 0x20, 0x7d,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x0a,
};

/* header of <f4 18446744073709551615x18446744073709551615 */
static const unsigned char gold_hdr_3[128] = {
    0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 0x01, 0x00, 0x76, 0x00, 0x7b, 0x27, 0x64, 0x65, 0x73, 0x63,
    0x72, 0x27, 0x3a, 0x20, 0x27, 0x3c, 0x66, 0x34, 0x27, 0x2c, 0x20, 0x27, 0x66, 0x6f, 0x72, 0x74,
    0x72, 0x61, 0x6e, 0x5f, 0x6f, 0x72, 0x64, 0x65, 0x72, 0x27, 0x3a, 0x20, 0x46, 0x61, 0x6c, 0x73,
    0x65, 0x2c, 0x20, 0x27, 0x73, 0x68, 0x61, 0x70, 0x65, 0x27, 0x3a, 0x20, 0x28, 0x31, 0x38, 0x34,
    0x34, 0x36, 0x37, 0x34, 0x34, 0x30, 0x37, 0x33, 0x37, 0x30, 0x39, 0x35, 0x35, 0x31, 0x36, 0x31,
    0x35, 0x2c, 0x20, 0x31, 0x38, 0x34, 0x34, 0x36, 0x37, 0x34, 0x34, 0x30, 0x37, 0x33, 0x37, 0x30,
    0x39, 0x35, 0x35, 0x31, 0x36, 0x31, 0x35, 0x29, 0x2c, 0x20, 0x7d, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x0a,
};

/* header of <f4 1024x1024 */
static const unsigned char gold_hdr_4[128] = {
    0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 0x01, 0x00, 0x76, 0x00, 0x7b, 0x27, 0x64, 0x65, 0x73, 0x63,
    0x72, 0x27, 0x3a, 0x20, 0x27, 0x3c, 0x66, 0x34, 0x27, 0x2c, 0x20, 0x27, 0x66, 0x6f, 0x72, 0x74,
    0x72, 0x61, 0x6e, 0x5f, 0x6f, 0x72, 0x64, 0x65, 0x72, 0x27, 0x3a, 0x20, 0x46, 0x61, 0x6c, 0x73,
    0x65, 0x2c, 0x20, 0x27, 0x73, 0x68, 0x61, 0x70, 0x65, 0x27, 0x3a, 0x20, 0x28, 0x31, 0x30, 0x32,
    0x34, 0x2c, 0x20, 0x31, 0x30, 0x32, 0x34, 0x29, 0x2c, 0x20, 0x7d, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x0a,
};


/* ---- helpers ------------------------------------------------------------- */

static uint64_t rng_state = 0x1234567887654321ull;
static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

/* An allocator that counts and can be told to fail. */
typedef struct {
    int allocs, frees, fail;
    size_t last_bytes;
} counting;

static void *count_alloc(void *ctx, size_t bytes)
{
    counting *c = ctx;
    c->last_bytes = bytes;
    if (c->fail) return NULL;
    c->allocs++;
    return gemm_allocator_host.alloc(NULL, bytes);
}

static void count_free(void *ctx, void *p)
{
    counting *c = ctx;
    c->frees++;
    gemm_allocator_host.free(NULL, p);
}

/* Builds a .npy file: magic, version, the header dict padded with spaces and '\n' to a
 * multiple of 64 (or not, when pad is 0), then data_len bytes of data. */
static unsigned char *make_npy(int major, const char *dict, int pad, const void *data, size_t data_len,
                               size_t *out_len)
{
    size_t pre = major == 1 ? 10 : 12, dl = strlen(dict);
    size_t hlen = dl + 1;
    if (pad) hlen = ((pre + dl + 1 + 63) / 64) * 64 - pre;
    size_t total = pre + hlen + data_len;
    unsigned char *p = malloc(total ? total : 1);
    assert_non_null(p);
    memcpy(p, "\x93NUMPY", 6);
    p[6] = (unsigned char)major;
    p[7] = 0;
    if (major == 1) {
        p[8] = (unsigned char)(hlen & 0xff);
        p[9] = (unsigned char)(hlen >> 8);
    } else {
        for (int i = 0; i < 4; i++) p[8 + i] = (unsigned char)(hlen >> (8 * i));
    }
    memcpy(p + pre, dict, dl);
    memset(p + pre + dl, ' ', hlen - dl - 1);
    p[pre + hlen - 1] = '\n';
    if (data_len) memcpy(p + pre + hlen, data, data_len);
    *out_len = total;
    return p;
}

/* Feeds buf in chunks: chunk 0 = random sizes (1..max_chunk), else that fixed size.
 * Returns the feed/finish result; on success *m holds the matrix. */
static int read_npy(const void *buf, size_t len, size_t chunk, const gemm_limits *lim,
                    const gemm_allocator *alloc, gemm_matrix *m, gemm_err *err)
{
    gemm_npy_reader *r = gemm_npy_reader_new(lim, alloc ? alloc : &gemm_allocator_host);
    assert_non_null(r);
    const unsigned char *p = buf;
    size_t off = 0;
    int rc = 0;
    while (off < len) {
        size_t n = chunk ? chunk : 1 + rnd() % 97;
        if (n > len - off) n = len - off;
        rc = gemm_npy_reader_feed(r, p + off, n, err);
        if (rc) break;
        off += n;
    }
    if (rc == 0) rc = gemm_npy_reader_finish(r, m, err);
    gemm_npy_reader_free(r);
    return rc;
}

static void expect_error(const void *buf, size_t len, int status, const char *code, const char *needle)
{
    size_t chunks[] = {0, 1, 7, 1 << 20};
    for (size_t i = 0; i < sizeof chunks / sizeof chunks[0]; i++) {
        gemm_err err;
        gemm_matrix m = {0};
        gemm_err_clear(&err);
        int rc = read_npy(buf, len, chunks[i], NULL, NULL, &m, &err);
        if (rc == 0) gemm_allocator_host.free(NULL, m.data);
        assert_int_equal(rc, -1);
        assert_int_equal(err.status, status);
        assert_string_equal(err.code, code);
        if (needle && !strstr(err.message, needle)) {
            fprintf(stderr, "message \"%s\" lacks \"%s\"\n", err.message, needle);
            fail();
        }
    }
}

static void expect_dict_error(const char *dict, int status, const char *code, const char *needle)
{
    size_t len;
    float data[64] = {0};
    unsigned char *f = make_npy(1, dict, 1, data, sizeof data, &len);
    expect_error(f, len, status, code, needle);
    /* The header parser alone says the same. */
    gemm_npy_header h;
    gemm_err err;
    gemm_err_clear(&err);
    assert_int_equal(gemm_npy_parse_header(f, len, &h, &err), -1);
    assert_int_equal(err.status, status);
    assert_string_equal(err.code, code);
    free(f);
}

/* ---- tests --------------------------------------------------------------- */

static void test_write_header_golden(void **state)
{
    (void)state;
    struct {
        gemm_dtype d;
        uint64_t r, c;
        const unsigned char *gold;
    } cases[] = {
        {GEMM_DTYPE_F32, 1, 1, gold_hdr_0},
        {GEMM_DTYPE_F64, 3, 4, gold_hdr_1},
        {GEMM_DTYPE_I32, 123456789012ull, 5, gold_hdr_2},
        {GEMM_DTYPE_F32, UINT64_MAX, UINT64_MAX, gold_hdr_3},
        {GEMM_DTYPE_F32, 1024, 1024, gold_hdr_4},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unsigned char buf[256];
        memset(buf, 0xee, sizeof buf);
        size_t n = gemm_npy_write_header3(buf, 128, cases[i].d, 0, cases[i].r, cases[i].c);
        assert_int_equal(n, 128);
        assert_memory_equal(buf, cases[i].gold, 128);
        assert_int_equal(buf[128], 0xee); /* nothing past the header */
        assert_int_equal(n % 64, 0);
        assert_int_equal(buf[n - 1], '\n');
    }
    unsigned char small[127];
    assert_int_equal(gemm_npy_write_header3(small, sizeof small, GEMM_DTYPE_F32, 0, 3, 4), 0);
    assert_int_equal(gemm_npy_write_header3(small, sizeof small, GEMM_DTYPE_INVALID, 0, 3, 4), 0);
}

/* float16 and bfloat16: the headers np.save writes (NumPy 1.24; the bfloat16 array an
 * ml_dtypes 0.5 one, whose descr is '<V2'), byte for byte, and files read back. */
static void test_half_descrs(void **state)
{
    (void)state;
    static const char *const gold[2] = {
        "\x93NUMPY\x01\x00v\x00{'descr': '<f2', 'fortran_order': False, 'shape': (3, 5), }",
        "\x93NUMPY\x01\x00v\x00{'descr': '<V2', 'fortran_order': False, 'shape': (2, 2), }",
    };
    static const gemm_dtype ds[2] = {GEMM_DTYPE_F16, GEMM_DTYPE_BF16};
    static const uint64_t rows[2] = {3, 2}, cols[2] = {5, 2};
    assert_string_equal(gemm_dtypes[GEMM_DTYPE_F16].npy, "<f2");
    assert_string_equal(gemm_dtypes[GEMM_DTYPE_BF16].npy, "<V2");
    for (int i = 0; i < 2; i++) {
        unsigned char want[128], buf[128 + 64];
        size_t g = strlen(gold[i] + 10) + 10; /* the magic holds a NUL: count from the dict */
        memcpy(want, gold[i], g);
        memset(want + g, ' ', 127 - g);
        want[127] = '\n';
        assert_int_equal(gemm_npy_write_header3(buf, 128, ds[i], 0, rows[i], cols[i]), 128);
        assert_memory_equal(buf, want, 128);
        /* the file read back: its dtype and its elements, untouched */
        size_t n = (size_t)(rows[i] * cols[i]);
        for (size_t k = 0; k < n; k++) {
            uint16_t v = (uint16_t)(0x3c00 + 37 * k);
            memcpy(buf + 128 + 2 * k, &v, 2);
        }
        gemm_matrix m = {0};
        gemm_err err;
        gemm_err_clear(&err);
        assert_int_equal(read_npy(buf, 128 + 2 * n, 7, NULL, NULL, &m, &err), 0);
        assert_int_equal(m.dtype, ds[i]);
        assert_int_equal(m.rows, rows[i]);
        assert_int_equal(m.cols, cols[i]);
        assert_memory_equal(m.data, buf + 128, 2 * n);
        gemm_allocator_host.free(NULL, m.data);
    }
    /* a truncated float16 file: counted in 2-byte elements */
    unsigned char f[128 + 29];
    assert_int_equal(gemm_npy_write_header3(f, 128, GEMM_DTYPE_F16, 0, 3, 5), 128);
    memset(f + 128, 0, 29);
    expect_error(f, sizeof f, 400, "truncated", NULL);
}

/* header + the raw data equals what np.save wrote, byte for byte */
static void test_write_whole_file_golden(void **state)
{
    (void)state;
    struct {
        gemm_dtype d;
        uint64_t r, c;
        const unsigned char *gold;
        size_t len;
    } cases[] = {
        {GEMM_DTYPE_F32, 3, 4, gold_f4_3x4, sizeof gold_f4_3x4},
        {GEMM_DTYPE_F64, 2, 7, gold_f8_2x7, sizeof gold_f8_2x7},
        {GEMM_DTYPE_I32, 3, 2, gold_i4_3x2, sizeof gold_i4_3x2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unsigned char buf[512];
        size_t h = gemm_npy_write_header3(buf, sizeof buf, cases[i].d, 0, cases[i].r, cases[i].c);
        assert_int_equal(h, 128);
        size_t es = gemm_dtype_size(cases[i].d), n = (size_t)(cases[i].r * cases[i].c);
        /* The element values, computed here as NumPy computed them. */
        for (size_t k = 0; k < n; k++) {
            if (cases[i].d == GEMM_DTYPE_F32) {
                float v = ((float)k - 5.5f) / 3.0f;
                memcpy(buf + h + k * es, &v, es);
            } else if (cases[i].d == GEMM_DTYPE_F64) {
                double v = (double)k * -1.25e10;
                memcpy(buf + h + k * es, &v, es);
            } else {
                int32_t v = ((int32_t)k - 3) * 1000003;
                memcpy(buf + h + k * es, &v, es);
            }
        }
        assert_int_equal(h + n * es, cases[i].len);
        assert_memory_equal(buf, cases[i].gold, cases[i].len);
    }
}

static void check_f4_3x4(const gemm_matrix *m)
{
    assert_int_equal(m->rows, 3);
    assert_int_equal(m->cols, 4);
    assert_int_equal(m->dtype, GEMM_DTYPE_F32);
    const float *f = m->data;
    for (int k = 0; k < 12; k++) assert_true(f[k] == ((float)k - 5.5f) / 3.0f);
}

static void test_read_golden_any_chunking(void **state)
{
    (void)state;
    const struct {
        const unsigned char *p;
        size_t len;
        int major;
    } files[] = {
        {gold_f4_3x4, sizeof gold_f4_3x4, 1},
        {gold_f4_v2_3x4, sizeof gold_f4_v2_3x4, 2},
        {gold_f4_v3_3x4, sizeof gold_f4_v3_3x4, 3},
    };
    size_t chunks[] = {1, 2, 3, 5, 8, 10, 11, 12, 64, 127, 128, 129, 4096, 0, 0, 0, 0, 0};
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
            gemm_matrix m;
            gemm_err err;
            gemm_err_clear(&err);
            assert_int_equal(read_npy(files[f].p, files[f].len, chunks[c], NULL, NULL, &m, &err), 0);
            check_f4_3x4(&m);
            gemm_allocator_host.free(NULL, m.data);
        }
        gemm_npy_header h;
        gemm_err err;
        assert_int_equal(gemm_npy_parse_header(files[f].p, files[f].len, &h, &err), 1);
        assert_int_equal(h.major, files[f].major);
        assert_int_equal(h.minor, 0);
        assert_int_equal(h.data_offset, files[f].len - 48);
        /* Every shorter prefix of the header asks for more. */
        for (size_t n = 0; n < h.data_offset; n++)
            assert_int_equal(gemm_npy_parse_header(files[f].p, n, &h, &err), 0);
    }
    gemm_matrix m;
    gemm_err err;
    assert_int_equal(read_npy(gold_f8_2x7, sizeof gold_f8_2x7, 1, NULL, NULL, &m, &err), 0);
    assert_int_equal(m.dtype, GEMM_DTYPE_F64);
    for (int k = 0; k < 14; k++) assert_true(((double *)m.data)[k] == (double)k * -1.25e10);
    gemm_allocator_host.free(NULL, m.data);
    assert_int_equal(read_npy(gold_i4_3x2, sizeof gold_i4_3x2, 0, NULL, NULL, &m, &err), 0);
    assert_int_equal(m.dtype, GEMM_DTYPE_I32);
    assert_int_equal(m.rows, 3);
    assert_int_equal(m.cols, 2);
    for (int k = 0; k < 6; k++) assert_int_equal(((int32_t *)m.data)[k], (k - 3) * 1000003);
    gemm_allocator_host.free(NULL, m.data);
}

static void test_read_fortran_golden(void **state)
{
    (void)state;
    for (size_t chunk = 0; chunk < 4; chunk++) {
        gemm_matrix m;
        gemm_err err;
        gemm_npy_reader *r = gemm_npy_reader_new(NULL, &gemm_allocator_host);
        size_t off = 0, len = sizeof gold_f8_fortran_3x5;
        while (off < len) {
            size_t n = chunk ? chunk : 1 + rnd() % 50;
            if (n > len - off) n = len - off;
            assert_int_equal(gemm_npy_reader_feed(r, gold_f8_fortran_3x5 + off, n, &err), 0);
            off += n;
        }
        const gemm_npy_header *h = gemm_npy_reader_header(r);
        assert_non_null(h);
        assert_int_equal(h->fortran_order, 1);
        assert_int_equal(gemm_npy_reader_finish(r, &m, &err), 0);
        gemm_npy_reader_free(r);
        assert_int_equal(m.rows, 3);
        assert_int_equal(m.cols, 5);
        for (int k = 0; k < 15; k++) assert_true(((double *)m.data)[k] == (double)k);
        gemm_allocator_host.free(NULL, m.data);
    }
}

/* Fortran-order arrays of 2-byte elements (float16 '<f2', bfloat16 '<V2'): transposed into
 * row-major like the others (a 2-byte element once went through the 8-byte path). The data
 * is column-major 0..14 as element bit patterns, so C[i][j] must be the pattern j*3 + i. */
static void test_read_fortran_half(void **state)
{
    (void)state;
    static const char *const descr[] = {"<f2", "<V2"};
    static const gemm_dtype want[] = {GEMM_DTYPE_F16, GEMM_DTYPE_BF16};
    for (int t = 0; t < 2; t++) {
        char dict[128];
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': True, 'shape': (3, 5), }", descr[t]);
        unsigned char file[256];
        size_t hl = strlen(dict), pad = (64 - (10 + hl + 1) % 64) % 64, head = 10 + hl + pad + 1;
        memcpy(file, "\x93NUMPY\x01\x00", 8);
        file[8] = (unsigned char)((head - 10) & 0xff);
        file[9] = (unsigned char)((head - 10) >> 8);
        memcpy(file + 10, dict, hl);
        memset(file + 10 + hl, ' ', pad);
        file[head - 1] = '\n';
        for (int k = 0; k < 15; k++) { /* column-major: element (i, j) at k = j*3 + i */
            file[head + 2 * k] = (unsigned char)k;
            file[head + 2 * k + 1] = 0;
        }
        gemm_matrix m;
        gemm_err err;
        gemm_npy_reader *r = gemm_npy_reader_new(NULL, &gemm_allocator_host);
        assert_int_equal(gemm_npy_reader_feed(r, file, head + 30, &err), 0);
        assert_int_equal(gemm_npy_reader_finish(r, &m, &err), 0);
        gemm_npy_reader_free(r);
        assert_int_equal(m.dtype, want[t]);
        assert_int_equal(m.rows, 3);
        assert_int_equal(m.cols, 5);
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 5; j++) assert_int_equal(((uint16_t *)m.data)[i * 5 + j], j * 3 + i);
        gemm_allocator_host.free(NULL, m.data);
    }
}

static void test_header_variants(void **state)
{
    (void)state;
    const char *dicts[] = {
        "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }",
        "{'descr':'<f4','fortran_order':False,'shape':(3,4)}",
        "{'shape': (3,4,), 'fortran_order': False, 'descr': '<f4'}",
        "{ 'fortran_order' : False , 'shape' : ( 3 , 4 ) , 'descr' : '<f4' , }",
        "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (3, 4)}",
        "{'descr': '=f4', 'fortran_order': False, 'shape': (3L, 4L), }",
        "{'descr': '<f4',\t'fortran_order': False,\n'shape': (3, 4)}",
    };
    float data[12];
    for (int k = 0; k < 12; k++) data[k] = ((float)k - 5.5f) / 3.0f;
    for (size_t i = 0; i < sizeof dicts / sizeof dicts[0]; i++) {
        for (int major = 1; major <= 3; major++) {
            for (int pad = 0; pad <= 1; pad++) {
                size_t len;
                unsigned char *f = make_npy(major, dicts[i], pad, data, sizeof data, &len);
                gemm_matrix m;
                gemm_err err;
                gemm_err_clear(&err);
                int rc = read_npy(f, len, 0, NULL, NULL, &m, &err);
                if (rc) fprintf(stderr, "%s: %s\n", dicts[i], err.message);
                assert_int_equal(rc, 0);
                check_f4_3x4(&m);
                gemm_allocator_host.free(NULL, m.data);
                free(f);
            }
        }
    }
    /* float64 and int32 descriptors, and the '=' order */
    const struct {
        const char *descr;
        gemm_dtype d;
    } kinds[] = {{"<f8", GEMM_DTYPE_F64}, {"=f8", GEMM_DTYPE_F64}, {"<i4", GEMM_DTYPE_I32}, {"=i4", GEMM_DTYPE_I32}};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        char dict[128];
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (2, 2), }", kinds[i].descr);
        unsigned char data8[32] = {0};
        size_t len;
        unsigned char *f = make_npy(1, dict, 1, data8, 4 * gemm_dtype_size(kinds[i].d), &len);
        gemm_npy_header h;
        gemm_err err;
        assert_int_equal(gemm_npy_parse_header(f, len, &h, &err), 1);
        assert_int_equal(h.dtype, kinds[i].d);
        assert_int_equal(h.rows, 2);
        assert_int_equal(h.cols, 2);
        assert_int_equal(h.fortran_order, 0);
        free(f);
    }
}

/* 3-D stacks: read with batch set, written by write_header3 and read back, limits. */
static void test_3d(void **state)
{
    (void)state;
    float data[12];
    for (int i = 0; i < 12; i++) data[i] = (float)i - 3.5f;
    size_t len;
    unsigned char *f = make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, 2), }", 1, data,
                                sizeof data, &len);
    size_t chunks[] = {0, 1, 5};
    for (size_t c = 0; c < 3; c++) {
        gemm_matrix m = {0};
        gemm_err err;
        assert_int_equal(read_npy(f, len, chunks[c], NULL, NULL, &m, &err), 0);
        assert_int_equal(m.batch, 2);
        assert_int_equal(m.rows, 3);
        assert_int_equal(m.cols, 2);
        assert_memory_equal(m.data, data, sizeof data);
        gemm_allocator_host.free(NULL, m.data);
    }
    free(f);

    /* a 2-D array says batch 0 */
    f = make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }", 1, data, sizeof data, &len);
    gemm_matrix m2 = {0};
    gemm_err err;
    m2.batch = 77;
    assert_int_equal(read_npy(f, len, 0, NULL, NULL, &m2, &err), 0);
    assert_int_equal(m2.batch, 0);
    gemm_allocator_host.free(NULL, m2.data);
    free(f);

    /* write_header3 round trip */
    unsigned char hdr[128];
    size_t hl = gemm_npy_write_header3(hdr, sizeof hdr, GEMM_DTYPE_I32, 1000, 7, 9);
    assert_true(hl > 0 && hl % 64 == 0);
    gemm_npy_header h;
    assert_int_equal(gemm_npy_parse_header(hdr, hl, &h, &err), 1);
    assert_int_equal(h.batch, 1000);
    assert_int_equal(h.rows, 7);
    assert_int_equal(h.cols, 9);
    assert_int_equal(h.dtype, GEMM_DTYPE_I32);
    assert_int_equal(gemm_npy_write_header3(hdr, sizeof hdr, GEMM_DTYPE_F32, 0, 7, 9),
                     gemm_npy_write_header3(hdr, sizeof hdr, GEMM_DTYPE_F32, 0, 7, 9));

    /* limits: a zero batch, a stack over max_elements, a stack that overflows */
    f = make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 3, 2), }", 1, NULL, 0, &len);
    expect_error(f, len, 422, "bad_batch", NULL);
    free(f);
    f = make_npy(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (1000000, 4194304, 4194304), }", 1, NULL, 0,
                 &len);
    expect_error(f, len, 413, "too_large", NULL);
    free(f);
    gemm_limits lim = {0, 100, 0};
    f = make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (5, 5, 5), }", 1, NULL, 0, &len);
    gemm_matrix m3 = {0};
    assert_int_equal(read_npy(f, len, 0, &lim, NULL, &m3, &err), -1);
    assert_int_equal(err.status, 413);
    assert_string_equal(err.code, "too_large");
    free(f);
}

static void test_shape_errors(void **state)
{
    (void)state;
    expect_dict_error("{'descr': '<f4', 'fortran_order': False, 'shape': (12,), }", 422, "bad_shape", "must be 2-D");
    expect_dict_error("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 422, "bad_shape", "must be 2-D");
    expect_dict_error("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, 2, 2), }", 422, "bad_shape",
                      "must be 2-D");
    expect_dict_error("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3, 2), }", 422, "bad_shape",
                      "C order");
    expect_dict_error("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999, 2), }", 413,
                      "too_large", NULL);
    expect_dict_error("{'descr': '<f4', 'fortran_order': False, 'shape': (3, -4), }", 400, "bad_npy", "shape");
    expect_dict_error("{'descr': '<f4', 'fortran_order': False, 'shape': [3, 4], }", 400, "bad_npy", "shape");
    expect_dict_error("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4x), }", 400, "bad_npy", NULL);

    /* zero dimensions reach the reader's limit check */
    size_t len;
    unsigned char *f = make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4), }", 1, NULL, 0, &len);
    expect_error(f, len, 422, "empty_matrix", NULL);
    free(f);
    f = make_npy(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (5, 0), }", 1, NULL, 0, &len);
    expect_error(f, len, 422, "empty_matrix", NULL);
    free(f);
    /* a size that overflows size_t */
    f = make_npy(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", 1, NULL, 0,
                 &len);
    expect_error(f, len, 413, "too_large", NULL);
    free(f);
}

static void test_dtype_errors(void **state)
{
    (void)state;
    expect_dict_error("{'descr': '>f4', 'fortran_order': False, 'shape': (3, 4), }", 415, "unsupported_dtype",
                      "big-endian");
    expect_dict_error("{'descr': '>f4', 'fortran_order': False, 'shape': (3, 4), }", 415, "unsupported_dtype",
                      "a.astype('<f4')");
    expect_dict_error("{'descr': '>f8', 'fortran_order': False, 'shape': (3, 4), }", 415, "unsupported_dtype",
                      "a.astype('<f8')");
    expect_dict_error("{'descr': '>i4', 'fortran_order': False, 'shape': (3, 4), }", 415, "unsupported_dtype",
                      "a.astype('<i4')");
    expect_dict_error("{'descr': '>f2', 'fortran_order': False, 'shape': (3, 4), }", 415, "unsupported_dtype",
                      "a.astype('<f2')");
    expect_dict_error("{'descr': '|O', 'fortran_order': False, 'shape': (3, 4), }", 415, "unsupported_dtype",
                      "object arrays");
    const char *others[] = {"<i8", "<u2", "<c8", "|u1", "|b1", "<U10", "|f4", "<f16", "f4", "", "|V2", "<V4", ">u2"};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        char dict[160], needle[32];
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (3, 4), }", others[i]);
        snprintf(needle, sizeof needle, "'%s'", others[i]);
        expect_dict_error(dict, 415, "unsupported_dtype", needle);
        expect_dict_error(dict, 415, "unsupported_dtype", "float32");
        expect_dict_error(dict, 415, "unsupported_dtype", "int32");
    }
    /* header text is echoed printable only */
    expect_dict_error("{'descr': '<\x01\xff\x1b[2J', 'fortran_order': False, 'shape': (3, 4), }", 415,
                      "unsupported_dtype", "'<\?\?\?[2J'");
    expect_dict_error("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), 'k\x07\xc3\xa9': 1}", 400, "bad_npy",
                      "'k\?\?\?'");
    expect_dict_error("{'descr': [('x', '<f4'), ('y', '<i4')], 'fortran_order': False, 'shape': (3, 4), }", 415,
                      "unsupported_dtype", "structured");
    /* dtype is judged before shape, and by the same rules for 1-D arrays */
    expect_dict_error("{'descr': '>f4', 'fortran_order': False, 'shape': (3,), }", 415, "unsupported_dtype",
                      "big-endian");
}

static void test_header_malformed(void **state)
{
    (void)state;
    const char *bad[] = {
        "",
        "[]",
        "{'descr': '<f4', 'fortran_order': False}",
        "{'descr': '<f4', 'shape': (3, 4)}",
        "{'fortran_order': False, 'shape': (3, 4)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), 'extra': 1}",
        "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (3, 4)}",
        "{'descr': '<f4', 'fortran_order': Maybe, 'shape': (3, 4)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4)",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4)} trailing",
        "{'descr': '<f4' 'fortran_order': False, 'shape': (3, 4)}",
        "{'descr: '<f4', 'fortran_order': False, 'shape': (3, 4)}",
        "{descr: '<f4', 'fortran_order': False, 'shape': (3, 4)}",
        "{'descr': <f4, 'fortran_order': False, 'shape': (3, 4)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4),,}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) expect_dict_error(bad[i], 400, "bad_npy", NULL);

    /* not .npy at all, wrong versions */
    const char *junk = "PK\x03\x04 this is a zip file, not an npy file at all................";
    expect_error(junk, strlen(junk), 400, "bad_npy", "not a .npy");
    const unsigned char v4[] = {0x93, 'N', 'U', 'M', 'P', 'Y', 4, 0, 10, 0, '{', '}'};
    expect_error(v4, sizeof v4, 400, "bad_npy", "4.0");
    const unsigned char v11[] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 1, 10, 0, '{', '}'};
    expect_error(v11, sizeof v11, 400, "bad_npy", "1.1");
    /* a wrong magic is refused on its first byte */
    gemm_npy_reader *r = gemm_npy_reader_new(NULL, &gemm_allocator_host);
    gemm_err err;
    assert_int_equal(gemm_npy_reader_feed(r, "\x93NUMPZ", 6, &err), -1);
    assert_null(gemm_npy_reader_header(r));
    assert_int_equal(err.status, 400);
    assert_int_equal(gemm_npy_reader_feed(r, "x", 1, &err), -1); /* and stays failed */
    gemm_npy_reader_free(r);
}

static void test_header_too_long(void **state)
{
    (void)state;
    /* format 2.0 with a header one byte over the limit: refused from the 12-byte prefix */
    unsigned char pre[12] = {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0};
    uint32_t hl = GEMM_NPY_MAX_HEADER + 1;
    for (int i = 0; i < 4; i++) pre[8 + i] = (unsigned char)(hl >> (8 * i));
    expect_error(pre, sizeof pre, 400, "bad_npy", "header");
    gemm_npy_header h;
    gemm_err err;
    assert_int_equal(gemm_npy_parse_header(pre, sizeof pre, &h, &err), -1);
    assert_int_equal(err.status, 400);
    /* exactly at the limit is fine (a padded dict) */
    char *dict = malloc(GEMM_NPY_MAX_HEADER);
    const char *d = "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }";
    memset(dict, ' ', GEMM_NPY_MAX_HEADER - 1);
    memcpy(dict, d, strlen(d));
    dict[GEMM_NPY_MAX_HEADER - 1] = '\0';
    float data[12];
    for (int k = 0; k < 12; k++) data[k] = ((float)k - 5.5f) / 3.0f;
    size_t len;
    unsigned char *f = make_npy(2, dict, 0, data, sizeof data, &len);
    assert_int_equal(len, 12 + GEMM_NPY_MAX_HEADER + 48);
    gemm_matrix m;
    assert_int_equal(read_npy(f, len, 0, NULL, NULL, &m, &err), 0);
    check_f4_3x4(&m);
    gemm_allocator_host.free(NULL, m.data);
    free(f);
    free(dict);
}

static void test_truncated_and_excess(void **state)
{
    (void)state;
    gemm_err err;
    gemm_matrix m;
    /* one byte missing: the message says how many were expected and received */
    gemm_err_clear(&err);
    assert_int_equal(read_npy(gold_f4_3x4, sizeof gold_f4_3x4 - 1, 1, NULL, NULL, &m, &err), -1);
    assert_int_equal(err.status, 400);
    assert_string_equal(err.code, "truncated");
    assert_non_null(strstr(err.message, "expected 48 bytes, got 47"));
    /* ended inside the header */
    for (size_t n = 0; n < 128; n += 9) {
        gemm_err_clear(&err);
        assert_int_equal(read_npy(gold_f4_3x4, n, 0, NULL, NULL, &m, &err), -1);
        assert_int_equal(err.status, 400);
        assert_string_equal(err.code, "truncated");
    }
    /* one byte too many, in the same chunk or a later one */
    unsigned char more[sizeof gold_f4_3x4 + 1];
    memcpy(more, gold_f4_3x4, sizeof gold_f4_3x4);
    more[sizeof gold_f4_3x4] = 0;
    expect_error(more, sizeof more, 400, "bad_npy", "longer than its header");
}

static void test_limits_before_allocation(void **state)
{
    (void)state;
    counting c = {0};
    gemm_allocator a = {count_alloc, count_free, &c};
    gemm_limits lim = {.max_dim = 1000, .max_elements = 100000, .max_body_bytes = 0};
    struct {
        const char *dict;
        int status;
        const char *code;
    } cases[] = {
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1001, 2), }", 413, "too_large"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 1001), }", 413, "too_large"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (400, 251), }", 413, "too_large"},
        {"{'descr': '<f8', 'fortran_order': True, 'shape': (1000, 1000), }", 413, "too_large"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (0, 1), }", 422, "empty_matrix"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len;
        unsigned char *f = make_npy(1, cases[i].dict, 1, NULL, 0, &len);
        gemm_npy_reader *r = gemm_npy_reader_new(&lim, &a);
        gemm_err err;
        gemm_err_clear(&err);
        assert_int_equal(gemm_npy_reader_feed(r, f, len, &err), -1);
        assert_int_equal(err.status, cases[i].status);
        assert_string_equal(err.code, cases[i].code);
        /* the header itself was fine: it stays readable for the caller's message */
        const gemm_npy_header *h = gemm_npy_reader_header(r);
        assert_non_null(h);
        assert_int_equal(h->dtype, GEMM_DTYPE_F32 + (i == 3));
        gemm_npy_reader_free(r);
        free(f);
    }
    assert_int_equal(c.allocs, 0);
    /* at the limits exactly: allowed, exactly one buffer of the right size */
    size_t len;
    unsigned char *f = make_npy(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (100, 1000), }", 1, NULL, 0, &len);
    gemm_npy_reader *r = gemm_npy_reader_new(&lim, &a);
    gemm_err err;
    assert_int_equal(gemm_npy_reader_feed(r, f, len, &err), 0);
    assert_non_null(gemm_npy_reader_header(r));
    assert_int_equal(c.allocs, 1);
    assert_int_equal(c.last_bytes, 400000);
    /* freeing an unfinished reader returns the buffer */
    gemm_npy_reader_free(r);
    assert_int_equal(c.frees, 1);
    /* an allocator that fails: 500 out_of_memory */
    c.fail = 1;
    r = gemm_npy_reader_new(&lim, &a);
    gemm_err_clear(&err);
    assert_int_equal(gemm_npy_reader_feed(r, f, len, &err), -1);
    assert_int_equal(err.status, 500);
    assert_string_equal(err.code, "out_of_memory");
    gemm_npy_reader_free(r);
    free(f);
}

/* Random shapes and dtypes, C and Fortran order, written here, read back in random
 * chunks; the decoded matrix must equal the source element for element. */
static void test_random_round_trip(void **state)
{
    (void)state;
    for (int iter = 0; iter < 300; iter++) {
        gemm_dtype d = (gemm_dtype)(rnd() % 3);
        uint64_t rows = 1 + rnd() % 70, cols = 1 + rnd() % 70;
        int fortran = (int)(rnd() % 2);
        size_t es = gemm_dtype_size(d), n = (size_t)(rows * cols);
        unsigned char *src = malloc(n * es), *file = malloc(256 + n * es);
        for (size_t k = 0; k < n * es; k++) src[k] = (unsigned char)rnd();
        size_t h;
        if (!fortran) {
            h = gemm_npy_write_header3(file, 256, d, 0, rows, cols);
            assert_true(h > 0);
            memcpy(file + h, src, n * es);
        } else {
            char dict[160];
            snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': True, 'shape': (%llu, %llu), }",
                     d == GEMM_DTYPE_F32 ? "<f4" : d == GEMM_DTYPE_F64 ? "<f8" : "<i4", (unsigned long long)rows,
                     (unsigned long long)cols);
            size_t len;
            unsigned char *hdr = make_npy(1 + iter % 3, dict, 1, NULL, 0, &len);
            h = len;
            memcpy(file, hdr, h);
            free(hdr);
            /* column-major: element (i, j) at j*rows + i */
            for (size_t i = 0; i < rows; i++)
                for (size_t j = 0; j < cols; j++)
                    memcpy(file + h + (j * rows + i) * es, src + (i * cols + j) * es, es);
        }
        gemm_matrix m;
        gemm_err err;
        gemm_err_clear(&err);
        int rc = read_npy(file, h + n * es, iter % 5 == 0 ? 1 : 0, NULL, NULL, &m, &err);
        if (rc) fprintf(stderr, "iter %d: %s\n", iter, err.message);
        assert_int_equal(rc, 0);
        assert_int_equal(m.rows, rows);
        assert_int_equal(m.cols, cols);
        assert_int_equal(m.dtype, d);
        assert_memory_equal(m.data, src, n * es);
        gemm_allocator_host.free(NULL, m.data);
        free(src);
        free(file);
    }
}

static void test_reader_api_edges(void **state)
{
    (void)state;
    gemm_npy_reader_free(NULL);
    gemm_npy_reader *r = gemm_npy_reader_new(NULL, NULL); /* host allocator by default */
    gemm_err err;
    assert_null(gemm_npy_reader_header(r));
    assert_int_equal(gemm_npy_reader_feed(r, gold_i4_3x2, 100, &err), 0);
    assert_null(gemm_npy_reader_header(r));
    assert_int_equal(gemm_npy_reader_feed(r, gold_i4_3x2 + 100, 28, &err), 0);
    const gemm_npy_header *h = gemm_npy_reader_header(r);
    assert_non_null(h);
    assert_int_equal(h->data_offset, 128);
    assert_int_equal(gemm_npy_reader_feed(r, NULL, 0, &err), 0);
    assert_int_equal(gemm_npy_reader_feed(r, gold_i4_3x2 + 128, sizeof gold_i4_3x2 - 128, &err), 0);
    gemm_matrix m;
    assert_int_equal(gemm_npy_reader_finish(r, &m, &err), 0);
    assert_int_equal(gemm_npy_reader_finish(r, &m, &err), -1); /* only once */
    gemm_npy_reader_free(r);                                     /* does not free m */
    assert_int_equal(((int32_t *)m.data)[5], 2 * 1000003);
    gemm_allocator_host.free(NULL, m.data);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_header_golden),
        cmocka_unit_test(test_write_whole_file_golden),
        cmocka_unit_test(test_read_golden_any_chunking),
        cmocka_unit_test(test_read_fortran_golden),
        cmocka_unit_test(test_read_fortran_half),
        cmocka_unit_test(test_header_variants),
        cmocka_unit_test(test_shape_errors),
        cmocka_unit_test(test_3d),
        cmocka_unit_test(test_dtype_errors),
        cmocka_unit_test(test_header_malformed),
        cmocka_unit_test(test_header_too_long),
        cmocka_unit_test(test_truncated_and_excess),
        cmocka_unit_test(test_limits_before_allocation),
        cmocka_unit_test(test_random_round_trip),
        cmocka_unit_test(test_reader_api_edges),
        cmocka_unit_test(test_half_descrs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
