/*
 * cublas.cu - cuBLAS as the yardstick, behind the same signature as our own kernels.
 * Row-major C = A B is the column-major C^T = B^T A^T: B first (ld n), then A (ld k). fp32
 * is CUBLAS_COMPUTE_32F with CUBLAS_DEFAULT_MATH (never TF32 behind the caller's back).
 *
 * Single products run through cublasLt (l->lt) with the algorithm chosen for the planned
 * shape (plan_m rows), cached by shape, so a panel's rows come out to the bit as in the
 * whole product, which cublasGemmEx (choosing per call) does not promise.
 */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "gemm_kernels.h"
#include "gemm_log.h"

namespace {

cudaError_t from_cublas(cublasStatus_t s, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS) return cudaSuccess;
    /* A CUDA error underneath (e.g. a sticky fault) says more than the cuBLAS status. */
    cudaError_t c = cudaGetLastError();
    if (c != cudaSuccess) return c;
    gemm_engine_log(GEMM_LOG_WARN, "cuda: %s failed: %s", what, cublasGetStatusString(s));
    return gemm_cublas_note(NULL, s, what, NULL, 0);
}

/* ---- cublasLt: the algorithm of the planned shape ------------------------------------ */

constexpr int LT_CACHE = 16;

struct lt_key { /* no padding: compared with memcmp */
    int dtype, math, out_half, plan_m, m, n, k;
    unsigned align; /* the smallest alignment of A, B and C, in bytes (at most 256) */
};

struct lt_entry {
    lt_key key;
    unsigned long long used; /* 0: empty */
    int ok;                  /* an algorithm was found and checked for the launch's shape */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc; /* cuBLAS's A (our B), B (our A), C: the launch's shape */
    cublasLtMatmulAlgo_t algo;
};

struct lt_state {
    cublasLtHandle_t h;
    void *ws;
    size_t ws_bytes;
    unsigned long long clock;
    lt_entry e[LT_CACHE];
};

/* The alignment of address bits v: the largest power of two up to 256 dividing it. */
unsigned ptr_align(uintptr_t v)
{
    unsigned a = 256;
    while (a > 1 && (v & (a - 1))) a >>= 1;
    return a;
}

/* The types of l's product (compute, scale, A and B, C); false for int32 or an unknown math. */
bool blas_types(const gemm_launch *l, cublasComputeType_t *ct, cudaDataType_t *scale, cudaDataType_t *ab,
              cudaDataType_t *c)
{
    switch (l->dtype) {
    case GEMM_DTYPE_F64:
        *ct = CUBLAS_COMPUTE_64F, *scale = *ab = *c = CUDA_R_64F;
        return true;
    case GEMM_DTYPE_F16:
    case GEMM_DTYPE_BF16:
        *ab = l->dtype == GEMM_DTYPE_F16 ? CUDA_R_16F : CUDA_R_16BF;
        *c = l->out_half ? *ab : CUDA_R_32F;
        *ct = CUBLAS_COMPUTE_32F, *scale = CUDA_R_32F;
        return true;
    case GEMM_DTYPE_F32:
        *scale = *ab = *c = CUDA_R_32F;
        switch (l->math) {
        case GEMM_MATH_DEFAULT:
        case GEMM_MATH_FP32: *ct = CUBLAS_COMPUTE_32F; return true;
        case GEMM_MATH_TF32: *ct = CUBLAS_COMPUTE_32F_FAST_TF32; return true;
        case GEMM_MATH_BF16: *ct = CUBLAS_COMPUTE_32F_FAST_16BF; return true;
        default: return false;
        }
    default: return false;
    }
}

/* The three layouts of C^T = B^T A^T for `rows` rows of A and C (column-major view). */
cublasStatus_t make_layouts(cudaDataType_t ab, cudaDataType_t c, int rows, int n, int k, cublasLtMatrixLayout_t *la,
                            cublasLtMatrixLayout_t *lb, cublasLtMatrixLayout_t *lc)
{
    *la = *lb = *lc = NULL;
    cublasStatus_t s = cublasLtMatrixLayoutCreate(la, ab, (uint64_t)n, (uint64_t)k, n);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(lb, ab, (uint64_t)k, (uint64_t)rows, k);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(lc, c, (uint64_t)n, (uint64_t)rows, n);
    return s;
}

void destroy_layouts(cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc)
{
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
}

void entry_clear(lt_entry *en)
{
    destroy_layouts(en->la, en->lb, en->lc);
    if (en->op) cublasLtMatmulDescDestroy(en->op);
    memset(en, 0, sizeof *en);
}

/* Fills en for key: the heuristic's first algorithm for the planned shape, checked for the
 * launch's own rows (en->ok); a failed status is cublasLt's own error. */
cublasStatus_t entry_fill(lt_state *st, lt_entry *en, const lt_key &key, const gemm_launch *l)
{
    cublasComputeType_t ct;
    cudaDataType_t scale, ab, c;
    memset(en, 0, sizeof *en);
    en->key = key;
    if (!blas_types(l, &ct, &scale, &ab, &c)) return CUBLAS_STATUS_SUCCESS;
    cublasStatus_t s = cublasLtMatmulDescCreate(&en->op, ct, scale);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    s = make_layouts(ab, c, l->m, l->n, l->k, &en->la, &en->lb, &en->lc);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    cublasLtMatrixLayout_t pa = en->la, pb = en->lb, pc = en->lc;
    if (key.plan_m != l->m) {
        s = make_layouts(ab, c, key.plan_m, l->n, l->k, &pa, &pb, &pc);
        if (s != CUBLAS_STATUS_SUCCESS) {
            destroy_layouts(pa, pb, pc);
            return s;
        }
    }
    cublasLtMatmulPreference_t pref = NULL;
    s = cublasLtMatmulPreferenceCreate(&pref);
    uint64_t wsb = st->ws ? st->ws_bytes : 0;
    uint32_t al = key.align;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
    const cublasLtMatmulPreferenceAttributes_t aligns[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4 && s == CUBLAS_STATUS_SUCCESS; i++)
        s = cublasLtMatmulPreferenceSetAttribute(pref, aligns[i], &al, sizeof al);
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    if (s == CUBLAS_STATUS_SUCCESS) {
        memset(&res, 0, sizeof res);
        cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(st->h, en->op, pa, pb, pc, pc, pref, 1, &res, &found);
        if (hs != CUBLAS_STATUS_SUCCESS || res.state != CUBLAS_STATUS_SUCCESS) found = 0;
    }
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (pa != en->la) destroy_layouts(pa, pb, pc);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    if (found < 1) return CUBLAS_STATUS_SUCCESS; /* no algorithm: cublasGemmEx runs it */
    en->algo = res.algo;
    if (key.plan_m != l->m) {
        /* The whole product's algorithm on this panel's rows: it must take them as they are. */
        cublasLtMatmulHeuristicResult_t chk;
        memset(&chk, 0, sizeof chk);
        if (cublasLtMatmulAlgoCheck(st->h, en->op, en->la, en->lb, en->lc, en->lc, &en->algo, &chk) !=
                CUBLAS_STATUS_SUCCESS ||
            chk.workspaceSize > wsb)
            return CUBLAS_STATUS_SUCCESS;
    }
    en->ok = 1;
    return CUBLAS_STATUS_SUCCESS;
}

/* Runs l through cublasLt; *ran false when it has no algorithm for it. */
cublasStatus_t lt_launch(lt_state *st, const gemm_launch *l, bool *ran)
{
    *ran = false;
    lt_key key;
    memset(&key, 0, sizeof key);
    key.dtype = (int)l->dtype, key.math = (int)l->math, key.out_half = l->out_half ? 1 : 0;
    key.plan_m = gemm_plan_rows(l), key.m = l->m, key.n = l->n, key.k = l->k;
    key.align = ptr_align((uintptr_t)l->A | (uintptr_t)l->B | (uintptr_t)l->C); /* the least of the three */
    lt_entry *en = NULL, *victim = &st->e[0];
    for (int i = 0; i < LT_CACHE; i++) {
        if (st->e[i].used && memcmp(&st->e[i].key, &key, sizeof key) == 0) {
            en = &st->e[i];
            break;
        }
        if (st->e[i].used < victim->used) victim = &st->e[i];
    }
    if (!en) {
        entry_clear(victim);
        cublasStatus_t s = entry_fill(st, victim, key, l);
        if (s != CUBLAS_STATUS_SUCCESS) {
            entry_clear(victim);
            return s;
        }
        en = victim;
    }
    en->used = ++st->clock;
    if (!en->ok) return CUBLAS_STATUS_SUCCESS;
    *ran = true;
    const double d1 = 1.0, d0 = 0.0; /* alpha and beta in the scale type */
    const float f1 = 1.0f, f0 = 0.0f;
    const bool f64 = l->dtype == GEMM_DTYPE_F64;
    return cublasLtMatmul(st->h, en->op, f64 ? (const void *)&d1 : &f1, l->B, en->la, l->A, en->lb,
                          f64 ? (const void *)&d0 : &f0, l->C, en->lc, l->C, en->lc, &en->algo, st->ws,
                          st->ws ? st->ws_bytes : 0, l->stream);
}

cudaError_t cublas_launch(const gemm_launch *l)
{
    if (l->lt && (l->batch <= 1)) {
        bool ran = false;
        cublasStatus_t s = lt_launch((lt_state *)l->lt, l, &ran);
        if (s != CUBLAS_STATUS_SUCCESS) return from_cublas(s, "cublasLtMatmul");
        if (ran) return cudaSuccess;
    }

    cublasHandle_t h = (cublasHandle_t)l->cublas;
    if (!h) return cudaErrorInvalidValue;
    cublasStatus_t s = cublasSetStream(h, l->stream);
    if (s != CUBLAS_STATUS_SUCCESS) return from_cublas(s, "cublasSetStream");
    s = cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
    if (s != CUBLAS_STATUS_SUCCESS) return from_cublas(s, "cublasSetMathMode");

    const int batch = l->batch > 1 ? l->batch : 1;
    if (l->dtype == GEMM_DTYPE_F64 && batch > 1) {
        /* C^T = B^T A^T in cuBLAS's column-major view, one call for the whole batch. */
        const double one = 1.0, zero = 0.0;
        s = cublasDgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, l->n, l->m, l->k, &one,
                                      (const double *)l->B, l->n, l->stride_b,
                                      (const double *)l->A, l->k, l->stride_a, &zero,
                                      (double *)l->C, l->n, l->stride_c, batch);
        return from_cublas(s, "cublasDgemmStridedBatched");
    }
    if (l->dtype == GEMM_DTYPE_F64) {
        const double one = 1.0, zero = 0.0;
        s = cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, l->n, l->m, l->k, &one,
                        (const double *)l->B, l->n, (const double *)l->A, l->k, &zero,
                        (double *)l->C, l->n);
        return from_cublas(s, "cublasDgemm");
    }
    /* float32 and the half dtypes: the same types cublasLt is given. */
    cublasComputeType_t ct;
    cudaDataType_t scale, ab, c;
    if (!blas_types(l, &ct, &scale, &ab, &c))
        return l->dtype == GEMM_DTYPE_F32 ? cudaErrorInvalidValue : cudaErrorNotSupported;
    const bool half = l->dtype == GEMM_DTYPE_F16 || l->dtype == GEMM_DTYPE_BF16;
    const float one = 1.0f, zero = 0.0f;
    if (batch > 1) {
        s = cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, l->n, l->m, l->k, &one, l->B, ab, l->n,
                                       l->stride_b, l->A, ab, l->k, l->stride_a, &zero, l->C, c, l->n,
                                       l->stride_c, batch, ct, CUBLAS_GEMM_DEFAULT);
        return from_cublas(s, half ? "cublasGemmStridedBatchedEx (half)" : "cublasGemmStridedBatchedEx");
    }
    s = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, l->n, l->m, l->k, &one, l->B, ab, l->n, l->A, ab, l->k, &zero,
                     l->C, c, l->n, ct, CUBLAS_GEMM_DEFAULT);
    return from_cublas(s, half ? "cublasGemmEx (half)" : "cublasGemmEx");
}

} // namespace

extern "C" void *gemm_lt_create(void *workspace, size_t workspace_bytes)
{
    lt_state *st = (lt_state *)calloc(1, sizeof *st);
    if (!st) return NULL;
    if (cublasLtCreate(&st->h) != CUBLAS_STATUS_SUCCESS) {
        free(st);
        return NULL;
    }
    st->ws = workspace;
    st->ws_bytes = workspace ? workspace_bytes : 0;
    return st;
}

extern "C" void gemm_lt_destroy(void *lt)
{
    lt_state *st = (lt_state *)lt;
    if (!st) return;
    for (int i = 0; i < LT_CACHE; i++)
        if (st->e[i].used) entry_clear(&st->e[i]);
    cublasLtDestroy(st->h);
    free(st);
}

extern "C" const gemm_kernel_desc gemm_kernel_cublas = {
    "cublas",
    "cuBLAS (the production yardstick); float32 fp32/tf32/bf16, float64, float16 and bfloat16, no int32",
    (1u << GEMM_DTYPE_F32) | (1u << GEMM_DTYPE_F64) | (1u << GEMM_DTYPE_F16) | (1u << GEMM_DTYPE_BF16),
    (1u << GEMM_MATH_FP32) | (1u << GEMM_MATH_TF32) | (1u << GEMM_MATH_BF16),
    {0, 0, 0, 0},
    0,
    cublas_launch,
    NULL,
    1,
    NULL, 0,
};
