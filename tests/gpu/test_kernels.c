/*
 * test_kernels.c - every member of the kernel table, on every dtype, tile and float32
 * math mode it offers, on odd and large shapes, against a float64 (or mod-2^32) host
 * reference computed from the same fresh random inputs. The output is poisoned first
 * (every byte 0xFF: NaN for floats, 0xFFFFFFFF for int32), so an element a kernel never
 * writes fails the test.
 *
 *   test_kernels            all shapes (1x1x1 ... 4096^3 float32)
 *   test_kernels --small    small shapes only (the compute-sanitizer run)
 *   test_kernels --kernel NAME   one member only
 *   test_kernels --list     print the table's names, one a line, and exit
 * Inputs come from a new seed each run (printed); GEMM_TEST_SEED=N repeats a run.
 */
#include <time.h>
#include <unistd.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "gemm_kernels.h"
#include "gpu_ref.h"

typedef struct { int m, k, n; int big; } shape;

static const shape shapes[] = {
    {1, 1, 1, 0},
    {37, 53, 29, 0},
    {64, 17, 65, 0},
    {1000, 1, 1000, 0},
    {1023, 1025, 1021, 0},
    {520, 260, 264, 0},    /* whole 128-tiles beside edge tiles, 16-byte rows of B */
    {129, 3001, 65, 0},    /* deep, few tiles: simt splits k (5 pieces, the last shorter) */
    {256, 4096, 256, 0},   /* the same with 16-byte rows: vector stores into the pieces */
    {4096, 4096, 4096, 1}, /* float32 only */
};
static const shape small_shapes[] = {
    {1, 1, 1, 0},
    {37, 53, 29, 0},
    {64, 17, 65, 0},
    {33, 70, 47, 0},
    {160, 40, 136, 0}, /* one whole 128-tile (the unchecked copy) beside edge tiles */
    {131, 33, 129, 0}, /* the same with rows of B not 16-byte aligned */
    {1100, 20, 700, 0}, /* enough 128x64 tiles for simt's default to take them */
    {70, 2100, 36, 0},  /* simt's split-k: 4 pieces of k, 16-byte rows */
    {33, 2050, 47, 0},  /* the same with odd rows and an uneven last piece */
};

static double tolerance(gemm_dtype d, gemm_math math, const shape *s)
{
    if (d == GEMM_DTYPE_F64) return 1e-12;
    if (math == GEMM_MATH_TF32) return 5e-3;
    if (math == GEMM_MATH_BF16) return 3e-2;
    return s->big ? 1e-4 : 1e-5;
}

#define CK(call)                                                                          \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                 \
                    cudaGetErrorString(e_));                                              \
            printf("Bail out! CUDA failure outside a kernel under test\n");               \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

static cudaStream_t stream;
static cublasHandle_t blas;
static int cc;

/* Runs one member on one configuration; reports one TAP line. */
static void check_one(const gemm_kernel_desc *kd, gemm_dtype d, gemm_math math, int tile,
                      const shape *s, const void *dA, const void *dB, void *dC, void *hC,
                      const double *ref, const uint32_t *ref_i)
{
    size_t es = gemm_dtype_size(d), nc = (size_t)s->m * s->n;
    char name[160];
    snprintf(name, sizeof name, "%s %s math=%s tile=%d %dx%dx%d", kd->name, gemm_dtype_name(d),
             gemm_math_report_name(d, math), tile, s->m, s->k, s->n);
    CK(cudaMemsetAsync(dC, 0xFF, nc * es, stream));
    gemm_launch l = {.dtype = d, .math = math, .m = s->m, .n = s->n, .k = s->k,
                     .A = dA, .B = dB, .C = dC, .tile = tile, .stream = stream,
                     .cublas = blas};
    cudaError_t e = kd->launch(&l);
    cudaError_t es2 = cudaStreamSynchronize(stream);
    if (e != cudaSuccess || es2 != cudaSuccess) {
        tap(0, "%s (launch: %s, run: %s)", name, cudaGetErrorString(e), cudaGetErrorString(es2));
        cudaGetLastError();
        return;
    }
    ref_poison(hC, nc * es);
    CK(cudaMemcpy(hC, dC, nc * es, cudaMemcpyDeviceToHost));
    if (d == GEMM_DTYPE_I32) {
        size_t bad = ref_mismatches_i32(hC, ref_i, nc);
        tap(bad == 0, "%s exact (%zu of %zu elements differ)", name, bad, nc);
    } else {
        double err = ref_rel_err(d, hC, ref, nc), tol = tolerance(d, math, s);
        tap(err < tol, "%s rel err %.3g < %.0e", name, err, tol);
    }
}

int main(int argc, char **argv)
{
    int small = 0;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--small") == 0) small = 1;
        else if (strcmp(argv[i], "--kernel") == 0 && i + 1 < argc) only = argv[++i];
        else if (strcmp(argv[i], "--list") == 0) {
            for (int k = 0; gemm_kernel_table[k]; k++) printf("%s\n", gemm_kernel_table[k]->name);
            return 0;
        }
        else { fprintf(stderr, "usage: %s [--small] [--kernel NAME] [--list]\n", argv[0]); return 2; }
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        tap_skip("no CUDA device", "kernel family");
        return tap_done();
    }
    struct cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    cc = p.major * 10 + p.minor;
    printf("# device 0: %s, cc %d.%d\n", p.name, p.major, p.minor);
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS || cublasSetStream(blas, stream) != CUBLAS_STATUS_SUCCESS) {
        printf("Bail out! cublasCreate failed\n");
        return 1;
    }

    /* The table itself. */
    int nk = 0;
    for (; gemm_kernel_table[nk]; nk++) {}
    tap(nk >= 3 && gemm_kernel_find("naive") && gemm_kernel_find("tiled") && gemm_kernel_find("cublas"),
        "table lists naive, tiled and cublas (%d members)", nk);
    tap(gemm_kernel_find("no-such-kernel") == NULL, "unknown name is not found");
    const char *why = gemm_kernel_unsupported(gemm_kernel_find("cublas"), GEMM_DTYPE_I32, GEMM_MATH_DEFAULT, 0, cc);
    tap(why != NULL, "cublas refuses int32 (%s)", why ? why : "no reason");
    tap(gemm_kernel_unsupported(gemm_kernel_find("tiled"), GEMM_DTYPE_F32, GEMM_MATH_DEFAULT, 8, cc) != NULL,
        "tiled refuses tile 8");
    tap(gemm_kernel_unsupported(gemm_kernel_find("tiled"), GEMM_DTYPE_F32, GEMM_MATH_TF32, 0, cc) != NULL,
        "tiled refuses math tf32");

    const shape *list = small ? small_shapes : shapes;
    int nshapes = small ? (int)(sizeof small_shapes / sizeof *small_shapes)
                        : (int)(sizeof shapes / sizeof *shapes);
    /* Fresh inputs each run; GEMM_TEST_SEED=N repeats one. */
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    const char *env_seed = getenv("GEMM_TEST_SEED");
    if (env_seed && *env_seed) seed = strtoull(env_seed, NULL, 10);
    printf("# inputs from seed %llu (GEMM_TEST_SEED=%llu repeats them)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    for (int si = 0; si < nshapes; si++) {
        const shape *s = &list[si];
        for (int di = 0; di < GEMM_DTYPE_COUNT; di++) {
            gemm_dtype d = (gemm_dtype)di;
            if (s->big && d != GEMM_DTYPE_F32) continue;
            if (gemm_dtype_is_half(d)) continue; /* half operands: tests/gpu/test_half_gpu.c */
            size_t es = gemm_dtype_size(d);
            size_t na = (size_t)s->m * s->k, nb = (size_t)s->k * s->n, nc = (size_t)s->m * s->n;
            void *hA = malloc(na * es), *hB = malloc(nb * es), *hC = malloc(nc * es);
            double *ref = NULL;
            uint32_t *ref_i = NULL;
            if (!hA || !hB || !hC) { printf("Bail out! host memory\n"); return 1; }
            ref_fill(d, hA, na, seed++);
            ref_fill(d, hB, nb, seed++);
            if (d == GEMM_DTYPE_I32) {
                ref_i = malloc(nc * sizeof *ref_i);
                if (!ref_i) { printf("Bail out! host memory\n"); return 1; }
                ref_gemm_i32(hA, hB, ref_i, s->m, s->k, s->n);
            } else {
                ref = malloc(nc * sizeof *ref);
                if (!ref || ref_gemm_f64(d, hA, hB, ref, s->m, s->k, s->n) != 0) {
                    printf("Bail out! host memory\n");
                    return 1;
                }
            }
            void *dA, *dB, *dC;
            CK(cudaMalloc(&dA, na * es));
            CK(cudaMalloc(&dB, nb * es));
            CK(cudaMalloc(&dC, nc * es));
            CK(cudaMemcpy(dA, hA, na * es, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dB, hB, nb * es, cudaMemcpyHostToDevice));

            for (int ki = 0; gemm_kernel_table[ki]; ki++) {
                const gemm_kernel_desc *kd = gemm_kernel_table[ki];
                if (only && strcmp(only, kd->name) != 0) continue;
                if (!(kd->dtypes & (1u << d))) continue;
                if (kd->min_cc > cc) {
                    tap_skip("device compute capability too low", "%s %s", kd->name, gemm_dtype_name(d));
                    continue;
                }
                /* The default (tile 0: the kernel picks by shape), then each tile it offers. */
                int tiles[5] = {0}, nt = 1;
                for (int t = 0; t < 4 && kd->tiles[t]; t++) tiles[nt++] = kd->tiles[t];
                for (int mi = GEMM_MATH_FP32; mi < GEMM_MATH_COUNT; mi++) {
                    gemm_math math = (gemm_math)mi;
                    if (d != GEMM_DTYPE_F32 && math != GEMM_MATH_FP32) continue;
                    if (!(kd->maths & (1u << math))) continue;
                    if (s->big && math != GEMM_MATH_FP32) continue;
                    gemm_math run_math = d == GEMM_DTYPE_F32 ? math : GEMM_MATH_DEFAULT;
                    for (int t = 0; t < nt; t++)
                        check_one(kd, d, run_math, tiles[t], s, dA, dB, dC, hC, ref, ref_i);
                }
            }
            CK(cudaFree(dA));
            CK(cudaFree(dB));
            CK(cudaFree(dC));
            free(hA); free(hB); free(hC); free(ref); free(ref_i);
        }
    }
    cublasDestroy(blas);
    CK(cudaStreamDestroy(stream));
    return tap_done();
}
