/*
 * test_half_gpu.c - float16 and bfloat16 operands on the CUDA backend, through the engine:
 * kernel auto, cublas (cublasLt / cublasGemmEx, half A and B, float32 sums) and wgmma
 * (tensor cores read the half operands in place; Hopper only), C in float32 and in the
 * operands' dtype, odd shapes, a batch with its own Bs and one with a shared B
 * (cublasGemmStridedBatchedEx), a group of queued products run together (dynamic
 * batching), and our own kernels refusing the half dtypes with 422 unsupported_dtype naming
 * what runs them. Every C is compared with a float64 reference of the exact half inputs
 * (their values read from the bit fields, not through the code under test), element by
 * element: |C - ref| <= 4 k eps32 sum|a b| (float32 sums in any order), plus the rounding
 * of C to the half type when it is asked for (half its unit in the last place).
 */
#include <pthread.h>

#include "backend.h"
#include "gemm_half.h"
#include "cuda_engine.h"
#include "gemm_kernels.h"
#include "gpu_ref.h"


/* The value of an element from its fields (float16: 5-bit exponent, bias 15; bfloat16: 8,
 * bias 127). */
static double half_value(gemm_dtype d, uint16_t h)
{
    int bf = d == GEMM_DTYPE_BF16, mb = bf ? 7 : 10, eb = bf ? 8 : 5, bias = bf ? 127 : 15;
    int s = h >> 15, e = (h >> mb) & ((1 << eb) - 1), m = h & ((1 << mb) - 1);
    double v = e == (1 << eb) - 1 ? (m ? NAN : INFINITY)
             : e == 0             ? ldexp((double)m, 1 - bias - mb)
                                  : ldexp((double)(m + (1 << mb)), e - bias - mb);
    return s ? -v : v;
}

/* n elements of dtype d, uniform in [-1, 1) rounded to d. */
static void fill_half(gemm_dtype d, uint16_t *p, size_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 99;
    for (size_t i = 0; i < n; i++) {
        double u = (double)(ref_next(&s) >> 11) / 9007199254740992.0 * 2.0 - 1.0;
        p[i] = gemm_f64_to_half(d, u);
    }
}

/* Mismatches of C (m x n, dtype cd) against the float64 product of the half inputs. */
static size_t check_c(gemm_dtype d, gemm_dtype cd, const uint16_t *a, const uint16_t *b, const void *c, int m,
                      int k, int n, double *worst)
{
    size_t bad = 0;
    double u_out = cd == GEMM_DTYPE_F16 ? 0x1p-11 : cd == GEMM_DTYPE_BF16 ? 0x1p-8 : 0;
    double tiny = cd == GEMM_DTYPE_F16 ? 0x1p-25 : 1e-30;
    *worst = 0;
    for (int i = 0; i < m; i++) {
        for (int j = 0; j < n; j++) {
            double s = 0, mag = 0;
            for (int p = 0; p < k; p++) {
                double x = half_value(d, a[(size_t)i * k + p]) * half_value(d, b[(size_t)p * n + j]);
                s += x;
                mag += fabs(x);
            }
            size_t idx = (size_t)i * n + j;
            double got = cd == GEMM_DTYPE_F32 ? (double)((const float *)c)[idx] : half_value(cd, ((const uint16_t *)c)[idx]);
            double tol = 4.0 * 1.2e-7 * k * mag;
            tol += u_out * (fabs(s) + tol) + tiny;
            double e = fabs(got - s);
            if (!(e <= tol)) {
                if (bad < 3) printf("#   C[%d][%d] = %.9g, expected %.9g (tolerance %.3g)\n", i, j, got, s, tol);
                bad++;
            }
            if (tol > 0 && e / tol > *worst) *worst = e / tol;
        }
    }
    return bad;
}

typedef struct {
    gemm_job job;
    gemm_engine *e;
    uint64_t nb, nbb;
} hjob;

static hjob *make(gemm_engine *e, gemm_dtype d, int out_half, int m, int k, int n, uint64_t batch, int shared,
                  const char *kernel, uint64_t seed)
{
    hjob *h = calloc(1, sizeof *h);
    h->e = e;
    h->nb = batch > 1 ? batch : 1;
    h->nbb = shared ? 1 : h->nb;
    gemm_job *j = &h->job;
    j->dtype = d;
    j->out_half = out_half;
    j->m = (uint64_t)m, j->k = (uint64_t)k, j->n = (uint64_t)n;
    j->batch = batch;
    j->b_shared = shared;
    snprintf(j->kernel, sizeof j->kernel, "%s", kernel);
    size_t bytes[3];
    gemm_job_bytes(j, bytes);
    j->a = gemm_engine_host_alloc(e, bytes[0]);
    j->b = gemm_engine_host_alloc(e, bytes[1]);
    j->c = gemm_engine_host_alloc(e, bytes[2]);
    fill_half(d, j->a, bytes[0] / 2, seed);
    fill_half(d, j->b, bytes[1] / 2, seed + 1);
    ref_poison(j->c, bytes[2]);
    j->done = gpu_on_done;
    j->user = h;
    return h;
}

static void release(hjob *h)
{
    gemm_engine_host_free(h->e, h->job.a);
    gemm_engine_host_free(h->e, h->job.b);
    gemm_engine_host_free(h->e, h->job.c);
    free(h);
}

/* Checks every product of a finished job; returns 1 when all are right. */
static int verify(hjob *h, double *worst)
{
    gemm_job *j = &h->job;
    gemm_dtype cd = gemm_job_c_dtype(j);
    size_t sa = (size_t)j->m * j->k, sb = (size_t)j->k * j->n, sc = (size_t)j->m * j->n * gemm_dtype_size(cd);
    size_t bad = 0;
    *worst = 0;
    for (uint64_t i = 0; i < h->nb; i++) {
        double w;
        bad += check_c(j->dtype, cd, (const uint16_t *)j->a + i * sa, (const uint16_t *)j->b + (h->nbb > 1 ? i * sb : 0),
                       (const char *)j->c + i * sc, (int)j->m, (int)j->k, (int)j->n, &w);
        if (w > *worst) *worst = w;
    }
    return bad == 0;
}

static gemm_engine *open_cuda(int batch_max)
{
    gemm_engine_config cfg;
    gemm_engine_config_defaults(&cfg);
    snprintf(cfg.backend, sizeof cfg.backend, "cuda");
    cfg.streams_per_device = 2;
    cfg.batch_max = batch_max;
    gemm_engine_err err;
    gemm_engine *e = gemm_engine_open(&cfg, &err);
    if (!e) printf("# open failed: %d %s\n", err.code, err.message);
    return e;
}

static void run_and_check(gemm_engine *e, hjob *h, const char *what)
{
    gemm_engine_err err;
    int target;
    target = gpu_done_count() + 1;
    if (gemm_engine_submit(e, &h->job, &err) != 0) {
        tap(0, "%s: submitted (%d %s)", what, err.code, err.message);
        return;
    }
    gpu_wait_done(target);
    double worst = 0;
    int ok = atomic_load(&h->job.state) == GEMM_JOB_DONE && verify(h, &worst);
    tap(ok, "%s: kernel %s, C %s, worst error %.2f of the tolerance%s%s", what, h->job.kernel_used,
        gemm_dtype_name(gemm_job_c_dtype(&h->job)), worst, h->job.err.code ? ": " : "", h->job.err.message);
}

int main(void)
{
    if (gemm_cuda_device_count() == 0) {
        tap_skip("no CUDA device", "float16 / bfloat16 on the CUDA engine");
        return tap_done();
    }
    gemm_engine *e = open_cuda(1);
    if (!e) {
        tap(0, "CUDA engine opens");
        return tap_done();
    }
    static const gemm_dtype ds[2] = {GEMM_DTYPE_F16, GEMM_DTYPE_BF16};
    /* m, k, n: edges in every direction; k and n multiples of 8 (wgmma reads the operands in
     * place) and not (it pads a copy first); several block tiles (300 x 520 x 264). */
    static const int shapes[][3] = {{1, 1, 1},      {7, 13, 5},      {33, 65, 17},  {128, 256, 64},
                                    {257, 129, 383}, {1, 1000, 3},   {300, 520, 264}, {129, 64, 520}};
    /* wgmma runs half operands on Hopper (sm_90a code in this build) */
    const int wgmma = gemm_wgmma_runnable();
    if (!wgmma) tap_skip("wgmma cannot run on this device or build", "float16 / bfloat16 through kernel=wgmma");
    static const char *const kernels[3] = {"auto", "cublas", "wgmma"};
    /* kernel=auto for half operands: cuBLAS where rows are 16-byte multiples, wgmma on big
     * shapes where they are not (kernels/cuda/auto.c) */
    for (int di = 0; di < 2; di++) {
        const gemm_dtype d = di ? GEMM_DTYPE_BF16 : GEMM_DTYPE_F16;
        const char *a = gemm_kernel_auto(d, GEMM_MATH_DEFAULT, 4096, 4096, 4096, 1, 90, 1);
        const char *u = gemm_kernel_auto(d, GEMM_MATH_DEFAULT, 4095, 4095, 4095, 1, 90, 1);
        const char *u4 = gemm_kernel_auto(d, GEMM_MATH_DEFAULT, 4100, 4100, 4100, 1, 90, 1);
        const char *nw = gemm_kernel_auto(d, GEMM_MATH_DEFAULT, 4095, 4095, 4095, 1, 90, 0);
        const char *sm = gemm_kernel_auto(d, GEMM_MATH_DEFAULT, 255, 255, 255, 1, 90, 1);
        tap(!strcmp(a, "cublas") && !strcmp(u, "wgmma") && !strcmp(u4, "wgmma") && !strcmp(nw, "cublas") &&
                !strcmp(sm, "cublas"),
            "%s auto: 4096^3 %s, 4095^3 %s, 4100^3 %s, 4095^3 without wgmma %s, 255^3 %s", gemm_dtype_name(d), a, u,
            u4, nw, sm);
    }
    const int nkernels = wgmma ? 3 : 2;
    uint64_t seed = 1;
    for (int di = 0; di < 2; di++) {
        for (int out = 0; out < 2; out++) {
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                for (int ki = 0; ki < nkernels; ki++) {
                    hjob *h = make(e, ds[di], out, shapes[s][0], shapes[s][1], shapes[s][2], 0, 0, kernels[ki], seed++);
                    char what[128];
                    snprintf(what, sizeof what, "%s %dx%dx%d out %s kernel=%s", gemm_dtype_name(ds[di]), shapes[s][0],
                             shapes[s][1], shapes[s][2], out ? gemm_dtype_name(ds[di]) : "float32", kernels[ki]);
                    run_and_check(e, h, what);
                    release(h);
                }
            }
            for (int shared = 0; shared < 2; shared++) {
                hjob *h = make(e, ds[di], out, 19, 37, 23, 6, shared, "auto", seed++);
                char what[128];
                snprintf(what, sizeof what, "%s batch of 6 (%s B) out %s", gemm_dtype_name(ds[di]),
                         shared ? "one shared" : "own", out ? gemm_dtype_name(ds[di]) : "float32");
                run_and_check(e, h, what);
                tap(strcmp(h->job.batch_mode, "strided") == 0, "%s: one strided-batched call (batch_mode \"%s\")", what,
                    h->job.batch_mode);
                release(h);
            }
        }
        /* our own kernels refuse, naming what runs half operands */
        static const char *const ours[] = {"naive", "tiled", "simt", "mma", "dmma"};
        for (size_t i = 0; i < sizeof ours / sizeof ours[0]; i++) {
            hjob *h = make(e, ds[di], 0, 8, 8, 8, 0, 0, ours[i], 5);
            gemm_engine_err err;
            int rc = gemm_engine_submit(e, &h->job, &err);
            tap(rc != 0 && err.code == GEMM_E_UNSUPPORTED_DTYPE &&
                    strstr(err.message, "cublas") != NULL,
                "kernel %s refuses %s: %d \"%s\"", ours[i], gemm_dtype_name(ds[di]), err.code, err.message);
            release(h);
        }
    }
    gemm_engine_close(e);

    /* dynamic batching: queued products of one shape and out dtype run as one group */
    e = open_cuda(8);
    if (!e) {
        tap(0, "CUDA engine with batch_max 8 opens");
        return tap_done();
    }
    for (int di = 0; di < 2; di++) {
        for (int out = 0; out < 2; out++) {
            enum { N = 24 };
            hjob *hs[N];
            int target;
            target = gpu_done_count();
            int submitted = 0;
            for (int i = 0; i < N; i++) {
                hs[i] = make(e, ds[di], i % 3 == 2 ? !out : out, 31, 47, 29, 0, 0, "auto", 100 + (uint64_t)i);
                gemm_engine_err err;
                if (gemm_engine_submit(e, &hs[i]->job, &err) == 0) submitted++;
            }
            gpu_wait_done(target + submitted);
            int right = 0, grouped = 0;
            for (int i = 0; i < N; i++) {
                double w;
                if (atomic_load(&hs[i]->job.state) == GEMM_JOB_DONE && verify(hs[i], &w)) right++;
                if (hs[i]->job.batched > 1) grouped++;
                release(hs[i]);
            }
            tap(submitted == N && right == N, "%s, %d products (C mixed float32 / %s) with batch_max 8: %d right, %d ran in groups",
                gemm_dtype_name(ds[di]), N, gemm_dtype_name(ds[di]), right, grouped);
        }
    }
    gemm_engine_close(e);
    return tap_done();
}
