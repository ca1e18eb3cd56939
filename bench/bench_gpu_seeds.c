/*
 * bench_gpu_seeds.c - the reference points of the kernel family on the GPU, and what the
 * CUDA engine's streams buy.
 *
 *   build/bench/bench_gpu_seeds [--sizes 1024,2048,4096] [--reps 7] [--jobs 16]
 *
 * Part 1 times every member of the kernel table (each tile it offers; float32 fp32, and
 * cuBLAS also tf32) on n x n x n float32 with cudaEvents: two warm-ups, then the median of
 * --reps launches, as ms, TFLOP/s and the share of cuBLAS fp32.
 * Part 2 runs products through the engine (gemm_engine_*, backend cuda, 4 streams, pinned
 * host buffers): the stages of one n^2 product (H2D, kernel, D2H, payload GB/s), then
 * --jobs products of 2048^2 one at a time versus all submitted at once.
 * Every timed result is checked against a float64 host product on a sample of elements.
 */
#include <stdio.h>

#ifndef GEMMD_HAVE_CUDA
/* Built without CUDA (CUDA=0): nothing to measure. */
int main(void)
{
    fprintf(stderr, "bench_gpu_seeds: this build has no CUDA support (built with CUDA=0)\n");
    return 2;
}
#else
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "engine.h"
#include "gemm_kernels.h"

#define CK(call)                                                                              \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void fill(float *p, size_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        p[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
}

/* Max relative error over 64 sampled elements against a float64 dot product. */
static double sample_err(const float *A, const float *B, const float *C, int m, int k, int n)
{
    double worst = 0;
    for (int t = 0; t < 64; t++) {
        int i = (int)((t * 7919u) % (unsigned)m), j = (int)((t * 104729u) % (unsigned)n);
        double ref = 0, scale = 0;
        for (int p = 0; p < k; p++) {
            double x = (double)A[(size_t)i * k + p] * B[(size_t)p * n + j];
            ref += x;
            scale += x < 0 ? -x : x;
        }
        double e = (C[(size_t)i * n + j] - ref);
        e = e < 0 ? -e : e;
        e /= scale > 0 ? scale : 1;
        if (e != e) return 1e30;
        if (e > worst) worst = e;
    }
    return worst;
}

static void part_kernels(const int *sizes, int nsizes, int reps)
{
    cudaStream_t st;
    cublasHandle_t h;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "cublasCreate failed\n"); exit(1); }
    cublasSetStream(h, st);
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    int cc = prop.major * 10 + prop.minor;
    printf("## Kernels, float32, n x n x n (median of %d, cudaEvent)\n\n", reps);
    printf("| kernel | tile | math | n | ms | TFLOP/s | vs cuBLAS fp32 | max sampled rel err |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (int si = 0; si < nsizes; si++) {
        int n = sizes[si];
        size_t bytes = (size_t)n * n * sizeof(float);
        float *hA = malloc(bytes), *hB = malloc(bytes), *hC = malloc(bytes);
        fill(hA, (size_t)n * n, 11 + n);
        fill(hB, (size_t)n * n, 13 + n);
        void *dA, *dB, *dC;
        CK(cudaMalloc(&dA, bytes)); CK(cudaMalloc(&dB, bytes)); CK(cudaMalloc(&dC, bytes));
        CK(cudaMemcpy(dA, hA, bytes, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dB, hB, bytes, cudaMemcpyHostToDevice));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
        double cublas_ms = 0;
        /* cuBLAS fp32 first, so every row can be compared with it. */
        for (int pass = 0; pass < 2; pass++) {
            for (int ki = 0; gemm_kernel_table[ki]; ki++) {
                const gemm_kernel_desc *kd = gemm_kernel_table[ki];
                int is_cublas = strcmp(kd->name, "cublas") == 0;
                if ((pass == 0) != is_cublas) continue;
                if (!(kd->dtypes & 1u) || kd->min_cc > cc) continue;
                int tiles[5] = {0}, nt = 0;
                for (int t = 0; t < 4 && kd->tiles[t]; t++) tiles[nt++] = kd->tiles[t];
                if (!nt) nt = 1;
                for (int mi = GEMM_MATH_FP32; mi <= GEMM_MATH_TF32; mi++) {
                    if (!(kd->maths & (1u << mi))) continue;
                    for (int t = 0; t < nt; t++) {
                        gemm_launch l = {.dtype = GEMM_DTYPE_F32, .math = (gemm_math)mi, .m = n, .n = n, .k = n,
                                         .A = dA, .B = dB, .C = dC, .tile = tiles[t], .stream = st, .cublas = h};
                        CK(cudaMemsetAsync(dC, 0xFF, bytes, st));
                        for (int w = 0; w < 2; w++) CK(kd->launch(&l));
                        CK(cudaStreamSynchronize(st));
                        CK(cudaMemcpy(hC, dC, bytes, cudaMemcpyDeviceToHost));
                        double err = sample_err(hA, hB, hC, n, n, n);
                        double *ms = malloc((size_t)reps * sizeof *ms);
                        for (int r = 0; r < reps; r++) {
                            CK(cudaEventRecord(e0, st));
                            CK(kd->launch(&l));
                            CK(cudaEventRecord(e1, st));
                            CK(cudaEventSynchronize(e1));
                            float f;
                            CK(cudaEventElapsedTime(&f, e0, e1));
                            ms[r] = f;
                        }
                        qsort(ms, (size_t)reps, sizeof *ms, cmp_d);
                        double med = ms[reps / 2];
                        free(ms);
                        if (is_cublas && mi == GEMM_MATH_FP32) cublas_ms = med;
                        double tf = 2.0 * n * n * (double)n / (med * 1e-3) / 1e12;
                        char tile[12] = "-";
                        if (tiles[t]) snprintf(tile, sizeof tile, "%d", tiles[t]);
                        printf("| %s | %s | %s | %d | %.3f | %.2f | %.0f%% | %.1e |\n", kd->name, tile,
                               gemm_math_name((gemm_math)mi), n, med, tf,
                               cublas_ms > 0 ? 100.0 * cublas_ms / med : 0, err);
                        fflush(stdout);
                    }
                }
            }
        }
        CK(cudaEventDestroy(e0)); CK(cudaEventDestroy(e1));
        CK(cudaFree(dA)); CK(cudaFree(dB)); CK(cudaFree(dC));
        free(hA); free(hB); free(hC);
    }
    cublasDestroy(h);
    CK(cudaStreamDestroy(st));
}

/* ---- part 2: through the engine ---- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int ndone;

static void on_done(gemm_job *j)
{
    (void)j;
    pthread_mutex_lock(&mu);
    ndone++;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

static void wait_for(int n)
{
    pthread_mutex_lock(&mu);
    while (ndone < n) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

static gemm_job *new_job(gemm_engine *e, int n, const char *kernel, uint64_t seed)
{
    gemm_job *j = calloc(1, sizeof *j);
    size_t bytes = (size_t)n * n * sizeof(float);
    j->dtype = GEMM_DTYPE_F32;
    j->m = j->k = j->n = (uint64_t)n;
    j->a = gemm_engine_host_alloc(e, bytes);
    j->b = gemm_engine_host_alloc(e, bytes);
    j->c = gemm_engine_host_alloc(e, bytes);
    fill(j->a, (size_t)n * n, seed);
    fill(j->b, (size_t)n * n, seed + 1);
    snprintf(j->kernel, sizeof j->kernel, "%s", kernel);
    j->done = on_done;
    return j;
}

static void free_job(gemm_engine *e, gemm_job *j)
{
    gemm_engine_host_free(e, j->a);
    gemm_engine_host_free(e, j->b);
    gemm_engine_host_free(e, j->c);
    free(j);
}

static int submit_wait(gemm_engine *e, gemm_job *j)
{
    pthread_mutex_lock(&mu);
    int target = ndone + 1;
    pthread_mutex_unlock(&mu);
    gemm_engine_err err;
    if (gemm_engine_submit(e, j, &err) != 0) { fprintf(stderr, "submit: %s\n", err.message); exit(1); }
    wait_for(target);
    if (atomic_load(&j->state) != GEMM_JOB_DONE) { fprintf(stderr, "job failed: %s\n", j->err.message); exit(1); }
    return 0;
}

static void part_engine(const int *sizes, int nsizes, int reps, int njobs)
{
    gemm_engine_config cfg;
    gemm_engine_config_defaults(&cfg);
    snprintf(cfg.backend, sizeof cfg.backend, "cuda");
    cfg.streams_per_device = 4;
    cfg.queue_depth = njobs + 8;
    gemm_engine_err err;
    gemm_engine *e = gemm_engine_open(&cfg, &err);
    if (!e) { fprintf(stderr, "engine: %s\n", err.message); exit(1); }

    printf("\n## Engine stages, float32 n^2 products, pinned host buffers (median of %d by total)\n\n", reps);
    printf("| kernel | n | H2D ms | kernel ms | D2H ms | engine total ms | payload GB/s (A+B+C over total) | H2D / kernel / D2H share |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
    const char *kernels[] = {"cublas", "tiled"};
    for (int ki = 0; ki < 2; ki++)
        for (int si = 0; si < nsizes; si++) {
            int n = sizes[si];
            gemm_job *j = new_job(e, n, kernels[ki], 77 + n);
            submit_wait(e, j); /* warm-up: buffers grow, handles load */
            gemm_job_timing *t = calloc((size_t)reps, sizeof *t);
            for (int r = 0; r < reps; r++) { submit_wait(e, j); t[r] = j->timing; }
            double err_s = sample_err(j->a, j->b, j->c, n, n, n);
            /* median by compute time */
            for (int a = 0; a < reps; a++)
                for (int b = a + 1; b < reps; b++)
                    if (t[b].compute_ms < t[a].compute_ms) { gemm_job_timing x = t[a]; t[a] = t[b]; t[b] = x; }
            gemm_job_timing m = t[reps / 2];
            double gb = 3.0 * n * (double)n * 4 / (m.compute_ms * 1e6);
            double st = m.h2d_ms + m.kernel_ms + m.d2h_ms;
            printf("| %s | %d | %.3f | %.3f | %.3f | %.3f | %.2f | %.0f%% / %.0f%% / %.0f%% (err %.1e) |\n", kernels[ki], n,
                   m.h2d_ms, m.kernel_ms, m.d2h_ms, m.compute_ms, gb, 100 * m.h2d_ms / st, 100 * m.kernel_ms / st,
                   100 * m.d2h_ms / st, err_s);
            fflush(stdout);
            free(t);
            free_job(e, j);
        }

    printf("\n## Stream overlap: %d products of 2048^2 float32 through the engine (4 streams)\n\n", njobs);
    printf("| kernel | one at a time, ms | all submitted at once, ms | speed-up | jobs/s at once |\n");
    printf("| --- | --- | --- | --- | --- |\n");
    for (int ki = 0; ki < 2; ki++) {
        gemm_job **js = calloc((size_t)njobs, sizeof *js);
        for (int i = 0; i < njobs; i++) js[i] = new_job(e, 2048, kernels[ki], 1000 + i);
        for (int i = 0; i < njobs; i++) submit_wait(e, js[i]); /* warm every stream's buffers */
        double t0 = gemm_now_ms();
        for (int i = 0; i < njobs; i++) submit_wait(e, js[i]);
        double serial = gemm_now_ms() - t0;
        pthread_mutex_lock(&mu);
        int target = ndone + njobs;
        pthread_mutex_unlock(&mu);
        t0 = gemm_now_ms();
        for (int i = 0; i < njobs; i++)
            if (gemm_engine_submit(e, js[i], &err) != 0) { fprintf(stderr, "submit: %s\n", err.message); exit(1); }
        wait_for(target);
        double together = gemm_now_ms() - t0;
        int bad = 0;
        for (int i = 0; i < njobs; i++)
            bad += atomic_load(&js[i]->state) != GEMM_JOB_DONE || sample_err(js[i]->a, js[i]->b, js[i]->c, 2048, 2048, 2048) > 1e-5;
        printf("| %s | %.1f | %.1f | %.2fx | %.0f |%s\n", kernels[ki], serial, together, serial / together,
               njobs / (together / 1000.0), bad ? " WRONG RESULTS" : "");
        fflush(stdout);
        for (int i = 0; i < njobs; i++) free_job(e, js[i]);
        free(js);
    }
    gemm_engine_stats s;
    gemm_engine_get_stats(e, &s);
    printf("\nengine stats: device busy %.2f s, H2D %.2f GB, D2H %.2f GB, device buffers %.1f MiB\n",
           s.device_busy_seconds[0], s.bytes_h2d[0] / 1e9, s.bytes_d2h[0] / 1e9, s.device_mem_used[0] / 1048576.0);
    gemm_engine_close(e);
}

int main(int argc, char **argv)
{
    int sizes[8] = {1024, 2048, 4096}, nsizes = 3, reps = 7, njobs = 16;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
            nsizes = 0;
            for (char *p = strtok(argv[++i], ","); p && nsizes < 8; p = strtok(NULL, ",")) sizes[nsizes++] = atoi(p);
        } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--jobs") == 0 && i + 1 < argc) njobs = atoi(argv[++i]);
        else { fprintf(stderr, "usage: %s [--sizes 1024,2048,4096] [--reps 7] [--jobs 16]\n", argv[0]); return 2; }
    }
    if (reps < 1) reps = 1;
    if (njobs < 1) njobs = 1;
    struct cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) { fprintf(stderr, "no CUDA device\n"); return 1; }
    printf("# device: %s, %d SMs, cc %d.%d\n\n", p.name, p.multiProcessorCount, p.major, p.minor);
    part_kernels(sizes, nsizes, reps);
    part_engine(sizes, nsizes, reps, njobs);
    return 0;
}
#endif /* GEMMD_HAVE_CUDA */
