/*
 * bench_kernels.cu - every member of gemm_kernel_table, cuBLAS included, in one process:
 * for each dtype and math mode and each shape, check the kernel's result against a
 * reference, then time it and report TFLOP/s and the percentage of cuBLAS in the same
 * mode.
 *
 *   bench_kernels [--csv FILE] [--shapes MxNxK,...] [--reps N] [--tune] [--no-main]
 *                 [--kernels a,b,...] [--dtypes a,b,...] [--slow-limit N]
 *
 * Half operands (float16, bfloat16) are measured with C in float32 and in their own type,
 * against cuBLAS with half operands in memory (cublasGemmEx, float32 sums).
 *
 * Correctness first: C is poisoned (all bytes 0xFF: NaN for floats) before the checked run,
 * so an unwritten element fails. The reference is float64 on the host when
 * m*n*k <= 2^27, otherwise a float64-accumulating GPU kernel (int32: exact wrapping uint32
 * arithmetic, on the host or GPU likewise). The relative Frobenius error
 * ||C - R|| / ||R|| must stay under a per-mode bound (fp32 1e-5, tf32 5e-3, bf16 2e-2,
 * float64 1e-12, int32 exact); NaN fails. A kernel that fails is not timed.
 *
 * Timing: one warm-up run, then repeats, each preceded by a write of a buffer larger than
 * L2 (so no repeat finds its inputs in L2), each timed alone with cudaEvents; the median
 * is reported. Inputs are uniform in [-1, 1) (floats) or full-range int32.
 *
 * --tune times the registered variants of the simt (float32), mma (tf32, bf16) and dmma
 * (float64) kernels against each other at a few shapes: the sweep docs/KERNELS.md records.
 * With --kernels, --tune times only the variants of the kernels named.
 * --slow-limit N: kernels named naive and tiled run only when max(m, n, k) <= N (default
 * 4096), so the sweep of the big shapes stays short.
 */
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gemm_kernels.h"

#define CK(x)                                                                                \
    do {                                                                                     \
        cudaError_t e_ = (x);                                                                \
        if (e_ != cudaSuccess) {                                                             \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(2);                                                                         \
        }                                                                                    \
    } while (0)

struct shape {
    int m, n, k;
};

/* ---------------------------------------------------------------- device helpers */

__device__ __forceinline__ uint32_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return (uint32_t)x;
}

__global__ void fill_kernel(void *p, size_t count, int dtype, uint64_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count;
         i += (size_t)gridDim.x * blockDim.x) {
        const uint32_t r = mix(seed * 0x9e3779b97f4a7c15ULL + i);
        const double u = (double)r / 4294967296.0 * 2.0 - 1.0;
        if (dtype == GEMM_DTYPE_F32)
            ((float *)p)[i] = (float)u;
        else if (dtype == GEMM_DTYPE_F16)
            ((__half *)p)[i] = __float2half_rn((float)u);
        else if (dtype == GEMM_DTYPE_BF16)
            ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn((float)u);
        else if (dtype == GEMM_DTYPE_F64)
            ((double *)p)[i] = u;
        else
            ((uint32_t *)p)[i] = r;
    }
}

__host__ __device__ inline double to_d(float x) { return x; }
__host__ __device__ inline double to_d(double x) { return x; }
__host__ __device__ inline double to_d(__half x) { return (double)__half2float(x); }
__host__ __device__ inline double to_d(__nv_bfloat16 x) { return (double)__bfloat162float(x); }
__host__ __device__ inline double to_d(uint32_t x) { return x; } /* exact: back to uint32_t as it was */

/* The reference product in 16x16 shared tiles: float64 sums of float32/float64/float16/
 * bfloat16 inputs (Acc double), exact wrapping uint32 sums of int32 (T and Acc uint32_t). */
template <typename T, typename Acc>
__global__ void ref_kernel(int m, int n, int k, const T *A, const T *B, Acc *R)
{
    __shared__ Acc As[16][17], Bs[16][17];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * 16 + ty, col = blockIdx.x * 16 + tx;
    Acc s = 0;
    for (int t = 0; t < k; t += 16) {
        As[ty][tx] = (row < m && t + tx < k) ? (Acc)to_d(A[(size_t)row * k + t + tx]) : (Acc)0;
        Bs[ty][tx] = (t + ty < k && col < n) ? (Acc)to_d(B[(size_t)(t + ty) * n + col]) : (Acc)0;
        __syncthreads();
#pragma unroll
        for (int p = 0; p < 16; p++)
            s += As[ty][p] * Bs[p][tx];
        __syncthreads();
    }
    if (row < m && col < n)
        R[(size_t)row * n + col] = s;
}

/* ---------------------------------------------------------------- host side */

struct ctx {
    cudaStream_t stream;
    cublasHandle_t cublas;
    void *flush;
    size_t flush_bytes;
    cudaEvent_t e0, e1;
    int cc;
    int reps;
    int slow_limit;
    FILE *csv;
    std::vector<std::string> only;
    unsigned dtypes = ~0u; /* bit per gemm_dtype the main run measures (--dtypes) */
    std::string device;
};

static int g_failures; /* checks that failed: the exit status says so */

static double now_flops(const shape &s) { return 2.0 * s.m * (double)s.n * s.k; }

static size_t esize(gemm_dtype d) { return d == GEMM_DTYPE_F64 ? 8 : gemm_dtype_is_half(d) ? 2 : 4; }
/* Bytes of one element of C: half operands write float32 unless out_half. */
static size_t c_esize(gemm_dtype d, int out_half) { return gemm_dtype_is_half(d) && !out_half ? 4 : esize(d); }

/* Element i of a host array of dtype d, as double (float types). */
static double host_value(gemm_dtype d, const unsigned char *p, size_t i)
{
    switch (d) {
    case GEMM_DTYPE_F32: return ((const float *)p)[i];
    case GEMM_DTYPE_F64: return ((const double *)p)[i];
    case GEMM_DTYPE_F16: return to_d(((const __half *)p)[i]);
    case GEMM_DTYPE_BF16: return to_d(((const __nv_bfloat16 *)p)[i]);
    default: return NAN;
    }
}

static void fill(void *p, size_t count, gemm_dtype d, uint64_t seed, cudaStream_t st)
{
    fill_kernel<<<1024, 256, 0, st>>>(p, count, (int)d, seed);
    CK(cudaGetLastError());
}

/* The reference product, on the host for small shapes, else on the GPU; float64 for the
 * float types, uint32 for int32. Returned in host memory (double or uint32 as bytes). */
static std::vector<unsigned char> reference(ctx &c, gemm_dtype d, const shape &s, const void *dA,
                                            const void *dB)
{
    const size_t mn = (size_t)s.m * s.n;
    const size_t outsz = d == GEMM_DTYPE_I32 ? 4 : 8;
    std::vector<unsigned char> out(mn * outsz);
    const bool host = (double)s.m * s.n * s.k <= (double)(1 << 27);
    if (host) {
        const size_t es = esize(d);
        std::vector<unsigned char> A((size_t)s.m * s.k * es), B((size_t)s.k * s.n * es);
        CK(cudaMemcpy(A.data(), dA, A.size(), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(B.data(), dB, B.size(), cudaMemcpyDeviceToHost));
        for (int i = 0; i < s.m; i++) {
            if (d == GEMM_DTYPE_I32) {
                const uint32_t *a = (const uint32_t *)A.data(), *b = (const uint32_t *)B.data();
                uint32_t *r = (uint32_t *)out.data() + (size_t)i * s.n;
                for (int j = 0; j < s.n; j++)
                    r[j] = 0;
                for (int p = 0; p < s.k; p++) {
                    const uint32_t av = a[(size_t)i * s.k + p];
                    for (int j = 0; j < s.n; j++)
                        r[j] += av * b[(size_t)p * s.n + j];
                }
            } else {
                double *r = (double *)out.data() + (size_t)i * s.n;
                for (int j = 0; j < s.n; j++)
                    r[j] = 0;
                for (int p = 0; p < s.k; p++) {
                    const double av = host_value(d, A.data(), (size_t)i * s.k + p);
                    for (int j = 0; j < s.n; j++)
                        r[j] += av * host_value(d, B.data(), (size_t)p * s.n + j);
                }
            }
        }
        return out;
    }
    void *dR;
    CK(cudaMalloc(&dR, mn * outsz));
    dim3 blk(16, 16), grd((s.n + 15) / 16, (s.m + 15) / 16);
    if (d == GEMM_DTYPE_F32)
        ref_kernel<float, double><<<grd, blk, 0, c.stream>>>(s.m, s.n, s.k, (const float *)dA,
                                                             (const float *)dB, (double *)dR);
    else if (d == GEMM_DTYPE_F64)
        ref_kernel<double, double><<<grd, blk, 0, c.stream>>>(s.m, s.n, s.k, (const double *)dA,
                                                              (const double *)dB, (double *)dR);
    else if (d == GEMM_DTYPE_F16)
        ref_kernel<__half, double><<<grd, blk, 0, c.stream>>>(s.m, s.n, s.k, (const __half *)dA,
                                                              (const __half *)dB, (double *)dR);
    else if (d == GEMM_DTYPE_BF16)
        ref_kernel<__nv_bfloat16, double><<<grd, blk, 0, c.stream>>>(
            s.m, s.n, s.k, (const __nv_bfloat16 *)dA, (const __nv_bfloat16 *)dB, (double *)dR);
    else
        ref_kernel<uint32_t, uint32_t><<<grd, blk, 0, c.stream>>>(s.m, s.n, s.k, (const uint32_t *)dA,
                                                                  (const uint32_t *)dB, (uint32_t *)dR);
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(c.stream));
    CK(cudaMemcpy(out.data(), dR, out.size(), cudaMemcpyDeviceToHost));
    CK(cudaFree(dR));
    return out;
}

/* Relative Frobenius error of the device result against the reference; int32: the number
 * of differing elements. NaN anywhere gives NaN. */
static double check(gemm_dtype d, int out_half, const shape &s, const void *dC,
                    const std::vector<unsigned char> &ref)
{
    const size_t mn = (size_t)s.m * s.n;
    std::vector<unsigned char> C(mn * c_esize(d, out_half));
    const gemm_dtype cd = gemm_dtype_is_half(d) && !out_half ? GEMM_DTYPE_F32 : d;
    CK(cudaMemcpy(C.data(), dC, C.size(), cudaMemcpyDeviceToHost));
    if (d == GEMM_DTYPE_I32) {
        const uint32_t *c = (const uint32_t *)C.data(), *r = (const uint32_t *)ref.data();
        size_t bad = 0;
        for (size_t i = 0; i < mn; i++)
            bad += c[i] != r[i];
        return (double)bad;
    }
    const double *r = (const double *)ref.data();
    double num = 0, den = 0;
    for (size_t i = 0; i < mn; i++) {
        const double v = host_value(cd, C.data(), i);
        if (std::isnan(v))
            return NAN;
        num += (v - r[i]) * (v - r[i]);
        den += r[i] * r[i];
    }
    return std::sqrt(num / (den > 0 ? den : 1));
}

static double bound(gemm_dtype d, gemm_math m, int out_half)
{
    /* Half operands are exact inputs, their products exact in float32: the error is the
     * float32 sums', plus C's own rounding when C is half. */
    if (gemm_dtype_is_half(d))
        return !out_half ? 1e-5 : d == GEMM_DTYPE_F16 ? 1e-3 : 8e-3;
    if (d == GEMM_DTYPE_F64)
        return 1e-12;
    if (d == GEMM_DTYPE_I32)
        return 0;
    if (m == GEMM_MATH_TF32)
        return 5e-3;
    if (m == GEMM_MATH_BF16)
        return 2e-2;
    return 1e-5;
}

typedef cudaError_t (*launch_fn)(int variant, const gemm_launch *l);

struct result {
    bool ok;
    double err, ms;
};

/* Check once, then time. fn(variant, l) launches. */
static result measure(ctx &c, launch_fn fn, int variant, gemm_launch l, const shape &s,
                      const std::vector<unsigned char> &ref)
{
    result r = {false, NAN, NAN};
    const size_t cbytes = (size_t)s.m * s.n * c_esize(l.dtype, l.out_half);
    CK(cudaMemsetAsync(l.C, 0xFF, cbytes, c.stream));
    cudaError_t e = fn(variant, &l);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(c.stream);
    if (e != cudaSuccess) {
        fprintf(stderr, "launch failed: %s\n", cudaGetErrorString(e));
        if (e != cudaErrorInvalidValue && e != cudaErrorNotSupported &&
            e != cudaErrorInvalidConfiguration)
            exit(2); /* a sticky device fault: nothing after this would be trustworthy */
        return r;
    }
    r.err = check(l.dtype, l.out_half, s, l.C, ref);
    r.ok = !std::isnan(r.err) && r.err <= bound(l.dtype, l.math, l.out_half);
    if (!r.ok) {
        g_failures++;
        return r;
    }
    /* Warm-up (already done by the checked run), then the repeats. */
    std::vector<float> t;
    int reps = c.reps;
    for (int i = 0; i < reps; i++) {
        CK(cudaMemsetAsync(c.flush, i & 0xFF, c.flush_bytes, c.stream));
        CK(cudaEventRecord(c.e0, c.stream));
        CK(fn(variant, &l));
        CK(cudaEventRecord(c.e1, c.stream));
        CK(cudaEventSynchronize(c.e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, c.e0, c.e1));
        t.push_back(ms);
        if (i == 0 && ms > 200.f)
            reps = std::min(reps, 3); /* the slow lesson kernels at big sizes */
    }
    std::sort(t.begin(), t.end());
    r.ms = t[t.size() / 2];
    return r;
}

static const gemm_kernel_desc *g_desc; /* the member measure() launches through desc_fn, variant_fn */
static cudaError_t desc_fn(int, const gemm_launch *l) { return g_desc->launch(l); }
static cudaError_t variant_fn(int v, const gemm_launch *l) { return g_desc->variants[v].launch(l); }

static const char *mode_name(gemm_dtype d, gemm_math m, int out_half = 0)
{
    if (d == GEMM_DTYPE_F16)
        return out_half ? "float16->float16" : "float16->float32";
    if (d == GEMM_DTYPE_BF16)
        return out_half ? "bfloat16->bfloat16" : "bfloat16->float32";
    if (d == GEMM_DTYPE_F64)
        return "float64";
    if (d == GEMM_DTYPE_I32)
        return "int32";
    return m == GEMM_MATH_TF32 ? "float32/tf32" : m == GEMM_MATH_BF16 ? "float32/bf16" : "float32/fp32";
}

static void csv_row(ctx &c, const char *section, const char *kernel, const char *variant,
                    gemm_dtype d, gemm_math m, const shape &s, const result &r, double cublas_ms,
                    int out_half = 0)
{
    const double tf = r.ok ? now_flops(s) / (r.ms * 1e-3) / 1e12 : NAN;
    const double pct = (r.ok && cublas_ms > 0) ? 100.0 * cublas_ms / r.ms : NAN;
    if (c.csv) {
        fprintf(c.csv, "%s,%s,%s,%s,%s,%s,%d,%d,%d,%s,%.5g,%.4g,%.4g,%.3g\n", section, c.device.c_str(),
                kernel, variant, gemm_dtype_name(d),
                d == GEMM_DTYPE_F32 ? gemm_math_name(m) : gemm_dtype_is_half(d) ? (out_half ? "out=half" : "out=float32") : "exact",
                s.m, s.n, s.k,
                r.ok ? "ok" : "FAIL", r.ms, tf, pct, r.err);
        fflush(c.csv);
    }
    char pcts[32] = "   (no cuBLAS)";
    if (!std::isnan(pct))
        snprintf(pcts, sizeof pcts, "%6.1f%% of cuBLAS", pct);
    printf("  %-8s %-34s %-13s %5dx%5dx%5d  %s  %9.3f ms %8.2f TFLOP/s %s  err %.2e\n", kernel,
           variant, mode_name(d, m, out_half), s.m, s.n, s.k, r.ok ? "ok  " : "FAIL", r.ms, tf, pcts, r.err);
    fflush(stdout);
}

struct mode {
    gemm_dtype d;
    gemm_math m;
    int out_half; /* half operands: C in their type */
};
static const mode MODES[] = {{GEMM_DTYPE_F32, GEMM_MATH_FP32, 0},
                             {GEMM_DTYPE_F32, GEMM_MATH_TF32, 0},
                             {GEMM_DTYPE_F32, GEMM_MATH_BF16, 0},
                             {GEMM_DTYPE_F64, GEMM_MATH_DEFAULT, 0},
                             {GEMM_DTYPE_I32, GEMM_MATH_DEFAULT, 0},
                             {GEMM_DTYPE_F16, GEMM_MATH_DEFAULT, 0},
                             {GEMM_DTYPE_F16, GEMM_MATH_DEFAULT, 1},
                             {GEMM_DTYPE_BF16, GEMM_MATH_DEFAULT, 0},
                             {GEMM_DTYPE_BF16, GEMM_MATH_DEFAULT, 1}};

struct bufs {
    void *A, *B, *C;
};

static bufs alloc_inputs(ctx &c, gemm_dtype d, const shape &s, uint64_t seed)
{
    bufs b;
    const size_t es = esize(d);
    CK(cudaMalloc(&b.A, (size_t)s.m * s.k * es));
    CK(cudaMalloc(&b.B, (size_t)s.k * s.n * es));
    CK(cudaMalloc(&b.C, (size_t)s.m * s.n * std::max(es, (size_t)4))); /* half operands: float32 C */
    fill(b.A, (size_t)s.m * s.k, d, seed, c.stream);
    fill(b.B, (size_t)s.k * s.n, d, seed + 1, c.stream);
    CK(cudaStreamSynchronize(c.stream));
    return b;
}

static void free_bufs(bufs &b)
{
    cudaFree(b.A);
    cudaFree(b.B);
    cudaFree(b.C);
}

static gemm_launch make_launch(ctx &c, gemm_dtype d, gemm_math m, const shape &s, const bufs &b,
                               int out_half = 0)
{
    gemm_launch l{}; /* zeroed */
    l.dtype = d;
    l.math = d == GEMM_DTYPE_F32 ? m : GEMM_MATH_DEFAULT;
    l.m = s.m;
    l.n = s.n;
    l.k = s.k;
    l.A = b.A;
    l.B = b.B;
    l.C = b.C;
    l.stream = c.stream;
    l.cublas = c.cublas;
    l.out_half = out_half;
    return l;
}

static bool wanted(const ctx &c, const char *name)
{
    if (c.only.empty())
        return true;
    for (const std::string &s : c.only)
        if (s == name)
            return true;
    return false;
}

static void run_main(ctx &c, const std::vector<shape> &shapes)
{
    for (const shape &s : shapes) {
        for (int dt = 0; dt < GEMM_DTYPE_COUNT; dt++) {
            const gemm_dtype d = (gemm_dtype)dt;
            if (!(c.dtypes & (1u << dt)))
                continue;
            bufs b = alloc_inputs(c, d, s, 1234 + dt);
            std::vector<unsigned char> ref = reference(c, d, s, b.A, b.B);
            for (const mode &md : MODES) {
                if (md.d != d)
                    continue;
                printf("== %s %dx%dx%d (m x n x k)\n", mode_name(d, md.m, md.out_half), s.m, s.n, s.k);
                gemm_launch l = make_launch(c, d, md.m, s, b, md.out_half);
                /* cuBLAS first: the yardstick for the percentages. */
                double cublas_ms = -1;
                const gemm_kernel_desc *cb = gemm_kernel_find("cublas");
                if (cb && !gemm_kernel_unsupported(cb, d, md.m, 0, c.cc)) {
                    g_desc = cb;
                    result r = measure(c, desc_fn, 0, l, s, ref);
                    if (r.ok)
                        cublas_ms = r.ms;
                    if (wanted(c, "cublas"))
                        csv_row(c, "main", "cublas", "-", d, md.m, s, r, cublas_ms, md.out_half);
                }
                for (size_t i = 0; gemm_kernel_table[i]; i++) {
                    const gemm_kernel_desc *k = gemm_kernel_table[i];
                    if (k == cb || !wanted(c, k->name))
                        continue;
                    if (gemm_kernel_unsupported(k, d, md.m, 0, c.cc))
                        continue;
                    const bool slow = !strcmp(k->name, "naive") || !strcmp(k->name, "tiled");
                    if (slow && std::max(s.m, std::max(s.n, s.k)) > c.slow_limit)
                        continue;
                    g_desc = k;
                    result r = measure(c, desc_fn, 0, l, s, ref);
                    csv_row(c, "main", k->name, "default", d, md.m, s, r, cublas_ms, md.out_half);
                }
            }
            free_bufs(b);
        }
    }
}

static void run_tune(ctx &c, const std::vector<shape> &shapes)
{
    /* The kernel whose variants are tuned in each mode, against cuBLAS in the same mode. */
    static const struct { gemm_dtype d; gemm_math m; const char *kernel; } tuned[] = {
        {GEMM_DTYPE_F32, GEMM_MATH_FP32, "simt"}, {GEMM_DTYPE_F32, GEMM_MATH_TF32, "mma"},
        {GEMM_DTYPE_F32, GEMM_MATH_BF16, "mma"}, {GEMM_DTYPE_F64, GEMM_MATH_DEFAULT, "dmma"}};
    for (const shape &s : shapes) {
        for (gemm_dtype d : {GEMM_DTYPE_F32, GEMM_DTYPE_F64}) {
            bool any = false;
            for (const auto &t : tuned)
                any = any || (t.d == d && wanted(c, t.kernel));
            if (!any)
                continue;
            bufs b = alloc_inputs(c, d, s, d == GEMM_DTYPE_F32 ? 99 : 98);
            std::vector<unsigned char> ref = reference(c, d, s, b.A, b.B);
            for (const auto &t : tuned) {
                if (t.d != d || !wanted(c, t.kernel))
                    continue;
                printf("== tune %s %dx%dx%d\n", mode_name(d, t.m), s.m, s.n, s.k);
                gemm_launch l = make_launch(c, d, t.m, s, b);
                g_desc = gemm_kernel_find("cublas");
                result rc = measure(c, desc_fn, 0, l, s, ref);
                const double cublas_ms = rc.ok ? rc.ms : -1;
                csv_row(c, "tune", "cublas", "-", d, t.m, s, rc, cublas_ms);
                g_desc = gemm_kernel_find(t.kernel);
                for (int v = 0; v < g_desc->nvariants; v++) {
                    result r = measure(c, variant_fn, v, l, s, ref);
                    csv_row(c, "tune", t.kernel, g_desc->variants[v].name, d, t.m, s, r, cublas_ms);
                }
            }
            free_bufs(b);
        }
    }
}

/* The comma-separated items of s. */
static std::vector<std::string> split(const std::string &s)
{
    std::vector<std::string> v;
    size_t p = 0;
    while (p <= s.size()) {
        size_t e = s.find(',', p);
        if (e == std::string::npos)
            e = s.size();
        v.push_back(s.substr(p, e - p));
        p = e + 1;
    }
    return v;
}

static std::vector<shape> parse_shapes(const char *arg)
{
    std::vector<shape> v;
    for (const std::string &tok : split(arg)) {
        shape sh;
        if (sscanf(tok.c_str(), "%dx%dx%d", &sh.m, &sh.n, &sh.k) == 3 && sh.m > 0 && sh.n > 0 &&
            sh.k > 0)
            v.push_back(sh);
        else if (sscanf(tok.c_str(), "%d", &sh.m) == 1 && sh.m > 0) {
            sh.n = sh.k = sh.m;
            v.push_back(sh);
        } else {
            fprintf(stderr, "bad shape '%s' (want N or MxNxK)\n", tok.c_str());
            exit(2);
        }
    }
    return v;
}

int main(int argc, char **argv)
{
    ctx c;
    c.reps = 10;
    c.slow_limit = 4096;
    c.csv = nullptr;
    bool tune = false, main_run = true;
    std::vector<shape> shapes = parse_shapes(
        "512,1024,2048,4096,8192,4095,4097,8192x8192x1024,1024x1024x8192,8192x1024x8192,"
        "1024x8192x1024,3000x5000x700");
    std::vector<shape> tshapes = parse_shapes("4096,8192,4097,2048");
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--csv") && i + 1 < argc) {
            c.csv = fopen(argv[++i], "w");
            if (!c.csv) {
                perror("csv");
                return 2;
            }
        } else if (!strcmp(argv[i], "--shapes") && i + 1 < argc)
            shapes = parse_shapes(argv[++i]);
        else if (!strcmp(argv[i], "--tune-shapes") && i + 1 < argc)
            tshapes = parse_shapes(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            c.reps = std::max(1, atoi(argv[++i]));
        else if (!strcmp(argv[i], "--slow-limit") && i + 1 < argc)
            c.slow_limit = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tune"))
            tune = true;
        else if (!strcmp(argv[i], "--no-main"))
            main_run = false;
        else if (!strcmp(argv[i], "--kernels") && i + 1 < argc) {
            for (const std::string &k : split(argv[++i]))
                c.only.push_back(k);
        } else if (!strcmp(argv[i], "--dtypes") && i + 1 < argc) {
            c.dtypes = 0;
            for (const std::string &name : split(argv[++i])) {
                gemm_dtype d;
                if (gemm_dtype_from_name(name.c_str(), &d) != 0) {
                    fprintf(stderr, "unknown dtype in --dtypes: %s\n", name.c_str());
                    return 2;
                }
                c.dtypes |= 1u << d;
            }
        } else {
            fprintf(stderr,
                    "usage: %s [--csv FILE] [--shapes N|MxNxK,...] [--reps N] [--tune] "
                    "[--tune-shapes ...] [--no-main] [--kernels a,b] [--dtypes a,b] "
                    "[--slow-limit N]\n",
                    argv[0]);
            return 2;
        }
    }
    int dev;
    CK(cudaGetDevice(&dev));
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, dev));
    c.cc = p.major * 10 + p.minor;
    c.device = p.name;
    for (char &ch : c.device)
        if (ch == ',')
            ch = ' ';
    printf("device: %s (cc %d.%d, %d SMs, L2 %d MiB)\n", p.name, p.major, p.minor,
           p.multiProcessorCount, p.l2CacheSize >> 20);
    CK(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
    if (cublasCreate(&c.cublas) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasCreate failed\n");
        return 2;
    }
    cublasSetStream(c.cublas, c.stream);
    c.flush_bytes = std::max<size_t>((size_t)p.l2CacheSize * 2, 64u << 20);
    CK(cudaMalloc(&c.flush, c.flush_bytes));
    CK(cudaEventCreate(&c.e0));
    CK(cudaEventCreate(&c.e1));
    if (c.csv)
        fprintf(c.csv, "section,device,kernel,variant,dtype,math,m,n,k,status,ms,tflops,"
                       "pct_cublas,rel_err\n");
    if (tune)
        run_tune(c, tshapes);
    if (main_run)
        run_main(c, shapes);
    if (c.csv)
        fclose(c.csv);
    cublasDestroy(c.cublas);
    cudaFree(c.flush);
    cudaStreamDestroy(c.stream);
    if (g_failures)
        printf("%d checks FAILED\n", g_failures);
    return g_failures ? 1 : 0;
}
