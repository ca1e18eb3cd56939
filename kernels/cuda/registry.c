/* registry.c - the kernel family's table, in lesson order: a member is a row. */
#include <stddef.h>
#include <string.h>

#include "gemm_kernels.h"

extern const gemm_kernel_desc gemm_kernel_naive;
extern const gemm_kernel_desc gemm_kernel_tiled;
extern const gemm_kernel_desc gemm_kernel_cublas;
extern const gemm_kernel_desc gemm_kernel_simt;
extern const gemm_kernel_desc gemm_kernel_mma;
extern const gemm_kernel_desc gemm_kernel_dmma;
extern const gemm_kernel_desc gemm_kernel_wgmma;

const gemm_kernel_desc *const gemm_kernel_table[] = {
    &gemm_kernel_naive,
    &gemm_kernel_tiled,
    &gemm_kernel_simt,
    &gemm_kernel_mma,
    &gemm_kernel_dmma,
    &gemm_kernel_wgmma,
    &gemm_kernel_cublas,
    NULL,
};

const gemm_kernel_desc *gemm_kernel_find(const char *name)
{
    if (!name) return NULL;
    for (size_t i = 0; gemm_kernel_table[i]; i++)
        if (strcmp(gemm_kernel_table[i]->name, name) == 0) return gemm_kernel_table[i];
    return NULL;
}

const char *gemm_kernel_unsupported(const gemm_kernel_desc *desc, gemm_dtype d, gemm_math m, int tile, int cc)
{
    if (!desc) return "unknown kernel";
    if ((int)d < 0 || d >= GEMM_DTYPE_COUNT || !(desc->dtypes & (1u << d))) return "this kernel does not run this dtype";
    /* Math modes only matter for float32; float64 and int32 are always exact. */
    const gemm_math r = m == GEMM_MATH_DEFAULT ? GEMM_MATH_FP32 : m;
    if (d == GEMM_DTYPE_F32 && ((int)r < 0 || r >= GEMM_MATH_COUNT || !(desc->maths & (1u << r))))
        return "this kernel does not offer this math mode for float32";
    if (d != GEMM_DTYPE_F32 && m != GEMM_MATH_DEFAULT && m != GEMM_MATH_FP32)
        return "math modes other than the exact one apply to float32 only";
    int ok = tile == 0;
    for (int i = 0; i < 4 && desc->tiles[i]; i++) ok |= desc->tiles[i] == tile;
    if (!ok) return desc->tiles[0] ? "this tile size is not offered by this kernel" : "this kernel takes no tile option";
    if (cc > 0 && cc < desc->min_cc) return "this kernel needs a newer GPU (compute capability too low)";
    return NULL;
}
