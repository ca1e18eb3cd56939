/*
 * registry.c - the kernel family's table: every member, in lesson order, looked up by
 * name. A member is added by declaring its descriptor here and listing it in the table.
 */
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

int gemm_kernel_supports(const gemm_kernel_desc *desc, gemm_dtype d, gemm_math m, int tile,
                         int cc, const char **why)
{
    const char *dummy;
    if (!why) why = &dummy;
    *why = NULL;
    if (!desc) {
        *why = "unknown kernel";
        return 0;
    }
    if ((int)d < 0 || d >= GEMM_DTYPE_COUNT || !(desc->dtypes & (1u << d))) {
        *why = "this kernel does not run this dtype";
        return 0;
    }
    /* Math modes only matter for float32; float64 and int32 are always exact. */
    if (d == GEMM_DTYPE_F32) {
        gemm_math r = (m == GEMM_MATH_DEFAULT) ? GEMM_MATH_FP32 : m;
        if ((int)r < 0 || r >= GEMM_MATH_COUNT || !(desc->maths & (1u << r))) {
            *why = "this kernel does not offer this math mode for float32";
            return 0;
        }
    } else if (m != GEMM_MATH_DEFAULT && m != GEMM_MATH_FP32) {
        *why = "math modes other than the exact one apply to float32 only";
        return 0;
    }
    if (tile != 0) {
        int ok = 0;
        for (int i = 0; i < 4 && desc->tiles[i]; i++)
            if (desc->tiles[i] == tile) ok = 1;
        if (!ok) {
            *why = desc->tiles[0] ? "this tile size is not offered by this kernel"
                                  : "this kernel takes no tile option";
            return 0;
        }
    }
    if (cc > 0 && cc < desc->min_cc) {
        *why = "this kernel needs a newer GPU (compute capability too low)";
        return 0;
    }
    return 1;
}
