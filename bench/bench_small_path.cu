/*
 * bench_small_path.cu - where a CUDA worker's time goes for a small product, and what a
 * different sequence of calls would give: the engine's own sequence and variants of it,
 * run by T threads at once (one stream and one cuBLAS handle each, as the workers).
 *
 *   build/bench/bench_small_path [--n 64] [--threads 4] [--group 1] [--ms 1500]
 *                                [--variants engine,pipe2,...]   (default: every variant)
 *
 * Each launch is `group` products of n x n x n float32 (cublasGemmStridedBatchedEx, fp32
 * math), from pinned host memory. Variants:
 *   engine    the daemon's sequence (kernels/cuda/engine_cuda.c): event, H2D A, H2D B,
 *             event, gemm, event, D2H C, event, poll the last event, read three intervals
 *   noevents  the same copies and gemm with one event at the end (no stage timing)
 *   onecopy   engine, but A and B adjacent in one block: one H2D instead of two
 *   pipe2     engine's sequence with two buffer and event sets per thread: launch i+1 is
 *             queued before the thread waits for launch i (same stream, so in order)
 *   block     engine, waiting in cudaEventSynchronize on blocking-sync events (no polling)
 *   zerocopy  the gemm reads A and B from mapped host memory and writes C there: no copies
 *   kernel    only event, gemm (device buffers), event, poll: the launch alone
 *   graph     engine's sequence captured once as a CUDA graph (A and B in one copy from a
 *             fixed pinned staging block): per launch, the request's A and B copied into the
 *             staging block on the host, one cudaGraphLaunch, poll, three intervals, C
 *             copied out of the staging block
 *   graph1    graph without the three stage events (only the last)
 *   gather    engine, with the group's products first gathered on the host from blocks of
 *             their own into the staging stacks (and C scattered back): what the engine's
 *             run_group did for CUDA before it handed the backend each product's blocks
 *   partcopy  each product's A and B copied straight from its own block into the device
 *             stacks (one cudaMemcpyAsync each), each C straight back: no host copies
 *   batchcopy partcopy's copies as one cudaMemcpyBatchAsync each way (what the CUDA
 *             worker does now)
 * Reported per variant: products/s over all threads, wall and thread CPU per launch (us),
 * and whether the last C of every thread equals a float64 host product (inputs are small
 * multiples of 1/8, so fp32 sums are exact). No assertion on time: a benchmark.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CK(x)                                                                                     \
    do {                                                                                          \
        cudaError_t e_ = (x);                                                                     \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));   \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)
#define CB(x)                                                                                     \
    do {                                                                                          \
        cublasStatus_t s_ = (x);                                                                  \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                        \
            fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #x, (int)s_);    \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

enum { V_ENGINE, V_NOEVENTS, V_ONECOPY, V_PIPE2, V_BLOCK, V_ZEROCOPY, V_KERNEL, V_GRAPH, V_GRAPH1, V_GATHER, V_PARTCOPY, V_BATCHCOPY, V_COUNT };
static const char *vname[V_COUNT] = {"engine", "noevents", "onecopy", "pipe2", "block", "zerocopy", "kernel",
                                     "graph", "graph1", "gather", "partcopy", "batchcopy"};

static int N = 64, T = 4, G = 1, MS = 1500;

struct set { /* one launch's buffers and events */
    float *h;  /* pinned, mapped: A stack | B stack | C stack */
    float *d;  /* device: the same layout */
    float *r;  /* graph variants: the request's own blocks (pinned), same layout */
    cudaEvent_t ev[4];
    cudaGraphExec_t g;
};

struct thr {
    int variant;
    pthread_t tid;
    cudaStream_t s;
    cublasHandle_t h;
    void *ws;
    struct set set[2];
    long launches;
    double wall_ms, cpu_ms;
    int ok;
};

static double now_ms(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static size_t elems(void) { return (size_t)G * N * N; }

static void gemm(struct thr *t, const float *A, const float *B, float *C)
{
    const float one = 1, zero = 0;
    long long st = (long long)N * N;
    /* row-major C = A B is column-major C^T = B^T A^T: pass B first */
    CB(cublasGemmStridedBatchedEx(t->h, CUBLAS_OP_N, CUBLAS_OP_N, N, N, N, &one, B, CUDA_R_32F, N, st, A,
                                  CUDA_R_32F, N, st, &zero, C, CUDA_R_32F, N, st, G, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
}

static void poll(cudaEvent_t ev)
{
    cudaError_t e;
    while ((e = cudaEventQuery(ev)) == cudaErrorNotReady) {
    }
    CK(e);
}

/* The engine's sequence after its H2D: event, gemm, event, D2H of C, event. */
static void gemm_and_back(struct thr *t, struct set *x)
{
    float *dA = x->d, *dB = x->d + elems(), *dC = x->d + 2 * elems();
    CK(cudaEventRecord(x->ev[1], t->s));
    gemm(t, dA, dB, dC);
    CK(cudaEventRecord(x->ev[2], t->s));
    CK(cudaMemcpyAsync(x->h + 2 * elems(), dC, elems() * sizeof(float), cudaMemcpyDeviceToHost, t->s));
    CK(cudaEventRecord(x->ev[3], t->s));
}

/* Queues one launch on set x (everything but the wait). */
static void submit(struct thr *t, struct set *x)
{
    size_t b = elems() * sizeof(float);
    float *hA = x->h, *hB = x->h + elems(), *hC = x->h + 2 * elems();
    float *dA = x->d, *dB = x->d + elems(), *dC = x->d + 2 * elems();
    cudaStream_t s = t->s;
    switch (t->variant) {
    case V_GRAPH:
    case V_GRAPH1: /* the request's A and B into the fixed staging block, then one graph */
        memcpy(hA, x->r, 2 * b);
        CK(cudaGraphLaunch(x->g, s));
        break;
    case V_PARTCOPY:
    case V_BATCHCOPY: { /* each product's blocks straight to and from the device stacks */
        void *dst[2 * 4096];
        const void *src[2 * 4096];
        size_t sz[2 * 4096], one = (size_t)N * N * sizeof(float);
        for (int g = 0; g < G; g++) {
            size_t o = (size_t)g * N * N;
            dst[2 * g] = dA + o, src[2 * g] = x->r + o;
            dst[2 * g + 1] = dB + o, src[2 * g + 1] = x->r + elems() + o;
            sz[2 * g] = sz[2 * g + 1] = one;
        }
        struct cudaMemcpyAttributes at;
        memset(&at, 0, sizeof at);
        at.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        size_t idx = 0;
        CK(cudaEventRecord(x->ev[0], s));
        if (t->variant == V_BATCHCOPY)
            CK(cudaMemcpyBatchAsync(dst, src, sz, (size_t)2 * G, &at, &idx, 1, s));
        else
            for (int q = 0; q < 2 * G; q++) CK(cudaMemcpyAsync(dst[q], src[q], sz[q], cudaMemcpyHostToDevice, s));
        CK(cudaEventRecord(x->ev[1], s));
        gemm(t, dA, dB, dC);
        CK(cudaEventRecord(x->ev[2], s));
        for (int g = 0; g < G; g++) {
            size_t o = (size_t)g * N * N;
            dst[g] = x->r + 2 * elems() + o, src[g] = dC + o, sz[g] = one;
        }
        if (t->variant == V_BATCHCOPY)
            CK(cudaMemcpyBatchAsync(dst, src, sz, (size_t)G, &at, &idx, 1, s));
        else
            for (int q = 0; q < G; q++) CK(cudaMemcpyAsync(dst[q], src[q], sz[q], cudaMemcpyDeviceToHost, s));
        CK(cudaEventRecord(x->ev[3], s));
        break;
    }
    case V_NOEVENTS:
        CK(cudaMemcpyAsync(dA, hA, b, cudaMemcpyHostToDevice, s));
        CK(cudaMemcpyAsync(dB, hB, b, cudaMemcpyHostToDevice, s));
        gemm(t, dA, dB, dC);
        CK(cudaMemcpyAsync(hC, dC, b, cudaMemcpyDeviceToHost, s));
        CK(cudaEventRecord(x->ev[3], s));
        break;
    case V_GATHER: /* the group's products into one stack on the host first, then as onecopy */
        for (int g = 0; g < G; g++) {
            size_t o = (size_t)g * N * N, one = (size_t)N * N * sizeof(float);
            memcpy(hA + o, x->r + o, one);
            memcpy(hB + o, x->r + elems() + o, one);
        }
        __attribute__((fallthrough));
    case V_ONECOPY:
        CK(cudaEventRecord(x->ev[0], s));
        CK(cudaMemcpyAsync(dA, hA, 2 * b, cudaMemcpyHostToDevice, s));
        gemm_and_back(t, x);
        break;
    case V_ZEROCOPY:
        CK(cudaEventRecord(x->ev[0], s));
        gemm(t, hA, hB, hC);
        CK(cudaEventRecord(x->ev[3], s));
        break;
    case V_KERNEL:
        CK(cudaEventRecord(x->ev[0], s));
        gemm(t, dA, dB, dC);
        CK(cudaEventRecord(x->ev[3], s));
        break;
    default: /* engine, pipe2, block */
        CK(cudaEventRecord(x->ev[0], s));
        CK(cudaMemcpyAsync(dA, hA, b, cudaMemcpyHostToDevice, s));
        CK(cudaMemcpyAsync(dB, hB, b, cudaMemcpyHostToDevice, s));
        gemm_and_back(t, x);
        break;
    }
}

/* Waits for set x's launch and reads its stage times, as the engine does. */
static void complete(struct thr *t, struct set *x)
{
    float ms;
    if (t->variant == V_BLOCK)
        CK(cudaEventSynchronize(x->ev[3]));
    else
        poll(x->ev[3]);
    if (t->variant == V_ENGINE || t->variant == V_PIPE2 || t->variant == V_BLOCK || t->variant == V_ONECOPY ||
        t->variant == V_GRAPH || t->variant >= V_GATHER) {
        CK(cudaEventElapsedTime(&ms, x->ev[0], x->ev[1]));
        CK(cudaEventElapsedTime(&ms, x->ev[1], x->ev[2]));
        CK(cudaEventElapsedTime(&ms, x->ev[2], x->ev[3]));
    }
    if (t->variant == V_GRAPH || t->variant == V_GRAPH1 || t->variant == V_GATHER) /* C out of the staging block */
        memcpy(x->r + 2 * elems(), x->h + 2 * elems(), elems() * sizeof(float));
}

/* Captures set x's launch as a graph: the engine's sequence with A and B in one copy
 * (graph1: no stage events, only the last). */
static void capture(struct thr *t, struct set *x)
{
    size_t b = elems() * sizeof(float);
    float *hA = x->h, *hC = x->h + 2 * elems();
    float *dA = x->d, *dB = x->d + elems(), *dC = x->d + 2 * elems();
    cudaStream_t s = t->s;
    cudaGraph_t graph;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    if (t->variant != V_GRAPH1) CK(cudaEventRecordWithFlags(x->ev[0], s, cudaEventRecordExternal));
    CK(cudaMemcpyAsync(dA, hA, 2 * b, cudaMemcpyHostToDevice, s));
    if (t->variant != V_GRAPH1) CK(cudaEventRecordWithFlags(x->ev[1], s, cudaEventRecordExternal));
    gemm(t, dA, dB, dC);
    if (t->variant != V_GRAPH1) CK(cudaEventRecordWithFlags(x->ev[2], s, cudaEventRecordExternal));
    CK(cudaMemcpyAsync(hC, dC, b, cudaMemcpyDeviceToHost, s));
    CK(cudaEventRecordWithFlags(x->ev[3], s, cudaEventRecordExternal));
    CK(cudaStreamEndCapture(s, &graph));
    CK(cudaGraphInstantiate(&x->g, graph, 0));
    CK(cudaGraphDestroy(graph));
}

static int check(const struct set *x, int request)
{
    const float *base = request ? x->r : x->h;
    const float *A = base, *B = base + elems(), *C = base + 2 * elems();
    for (int g = 0; g < G; g++)
        for (int r = 0; r < N; r++)
            for (int c = 0; c < N; c++) {
                double s = 0;
                for (int p = 0; p < N; p++)
                    s += (double)A[(size_t)g * N * N + r * N + p] * B[(size_t)g * N * N + p * N + c];
                if ((double)C[(size_t)g * N * N + r * N + c] != s) return 0;
            }
    return 1;
}

static volatile int go, stop;

static void *thread_main(void *arg)
{
    struct thr *t = (struct thr *)arg;
    CK(cudaSetDevice(0));
    while (!go) {
    }
    double w0 = now_ms(CLOCK_MONOTONIC), c0 = now_ms(CLOCK_THREAD_CPUTIME_ID);
    long n = 0;
    if (t->variant == V_PIPE2) {
        submit(t, &t->set[0]);
        for (; !stop; n++) {
            submit(t, &t->set[(n + 1) & 1]);
            complete(t, &t->set[n & 1]);
        }
        complete(t, &t->set[n & 1]);
        n++;
    } else {
        for (; !stop; n++) {
            submit(t, &t->set[0]);
            complete(t, &t->set[0]);
        }
    }
    t->wall_ms = now_ms(CLOCK_MONOTONIC) - w0;
    t->cpu_ms = now_ms(CLOCK_THREAD_CPUTIME_ID) - c0;
    t->launches = n;
    return NULL;
}

static void run_variant(int v)
{
    struct thr *th = (struct thr *)calloc((size_t)T, sizeof *th);
    size_t all = 3 * elems() * sizeof(float);
    unsigned evflags = cudaEventBlockingSync * (v == V_BLOCK);
    for (int i = 0; i < T; i++) {
        struct thr *t = &th[i];
        t->variant = v;
        CK(cudaStreamCreateWithFlags(&t->s, cudaStreamNonBlocking));
        CB(cublasCreate(&t->h));
        CB(cublasSetStream(t->h, t->s));
        CB(cublasSetMathMode(t->h, CUBLAS_PEDANTIC_MATH));
        CK(cudaMalloc(&t->ws, 32u << 20)); /* a workspace of its own, as the daemon's: capture allocates nothing */
        CB(cublasSetWorkspace(t->h, t->ws, 32u << 20));
        for (int k = 0; k < 2; k++) {
            struct set *x = &t->set[k];
            CK(cudaHostAlloc((void **)&x->h, all, cudaHostAllocMapped | cudaHostAllocPortable));
            CK(cudaMalloc((void **)&x->d, all));
            for (size_t e = 0; e < 2 * elems(); e++)
                x->h[e] = (float)((int)((e * 2654435761u + (size_t)i * 97 + k) % 17) - 8) / 8.0f;
            memset(x->h + 2 * elems(), 0xFF, elems() * sizeof(float)); /* poison C */
            CK(cudaHostAlloc((void **)&x->r, all, cudaHostAllocPortable));
            memcpy(x->r, x->h, 2 * elems() * sizeof(float));
            memset(x->r + 2 * elems(), 0xFF, elems() * sizeof(float));
            for (int q = 0; q < 4; q++) CK(cudaEventCreateWithFlags(&x->ev[q], evflags));
            x->g = NULL;
            if (v == V_GRAPH || v == V_GRAPH1) capture(t, x);
        }
        /* warm-up: the handle's first call, the kernels' first load */
        for (int w = 0; w < 20; w++) {
            submit(t, &t->set[0]);
            complete(t, &t->set[0]);
        }
        memset(t->set[0].h + 2 * elems(), 0xFF, elems() * sizeof(float));
        memset(t->set[1].h + 2 * elems(), 0xFF, elems() * sizeof(float));
        memset(t->set[0].r + 2 * elems(), 0xFF, elems() * sizeof(float));
    }
    go = 0, stop = 0;
    for (int i = 0; i < T; i++) pthread_create(&th[i].tid, NULL, thread_main, &th[i]);
    go = 1;
    struct timespec d = {MS / 1000, (long)(MS % 1000) * 1000000L};
    nanosleep(&d, NULL);
    stop = 1;
    long launches = 0;
    double wall = 0, cpu = 0;
    int ok = 1;
    for (int i = 0; i < T; i++) {
        pthread_join(th[i].tid, NULL);
        CK(cudaStreamSynchronize(th[i].s));
        launches += th[i].launches;
        wall = th[i].wall_ms > wall ? th[i].wall_ms : wall;
        cpu += th[i].cpu_ms;
        int gr = v == V_GRAPH || v == V_GRAPH1 || v >= V_GATHER;
        ok &= v == V_KERNEL || check(&th[i].set[0], gr);
        if (v == V_PIPE2) ok &= check(&th[i].set[1], 0);
    }
    double per_launch_wall = wall * T * 1000.0 / (double)launches;
    printf("%-9s %12.0f %10.0f %14.1f %13.1f   %s\n", vname[v], (double)launches * G / (wall / 1000.0),
           (double)launches / (wall / 1000.0), per_launch_wall, cpu * 1000.0 / (double)launches,
           v == V_KERNEL ? "(no copies: C not checked)" : ok ? "C equal" : "C WRONG");
    fflush(stdout);
    for (int i = 0; i < T; i++) {
        struct thr *t = &th[i];
        for (int k = 0; k < 2; k++) {
            CK(cudaFreeHost(t->set[k].h));
            CK(cudaFreeHost(t->set[k].r));
            if (t->set[k].g) CK(cudaGraphExecDestroy(t->set[k].g));
            CK(cudaFree(t->set[k].d));
            for (int q = 0; q < 4; q++) CK(cudaEventDestroy(t->set[k].ev[q]));
        }
        CB(cublasDestroy(t->h));
        CK(cudaFree(t->ws));
        CK(cudaStreamDestroy(t->s));
    }
    free(th);
    if (!ok && v != V_KERNEL) exit(1);
}

int main(int argc, char **argv)
{
    char list[256] = "engine,noevents,onecopy,pipe2,block,zerocopy,kernel,graph,graph1,gather,partcopy,batchcopy";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--n") && i + 1 < argc) N = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) T = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--group") && i + 1 < argc) G = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ms") && i + 1 < argc) MS = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--variants") && i + 1 < argc) snprintf(list, sizeof list, "%s", argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--n 64] [--threads 4] [--group 1] [--ms 1500] [--variants a,b,...]\n",
                    argv[0]);
            return 2;
        }
    }
    if (N < 1 || N > 1024 || T < 1 || T > 64 || G < 1 || G > 4096 || MS < 100) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    struct cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    printf("%s: %d threads, launches of %d product(s) of %d^3 float32, %d ms each\n", p.name, T, G, N, MS);
    printf("%-9s %12s %10s %14s %13s\n", "variant", "products/s", "launches/s", "wall_us/launch",
           "cpu_us/launch");
    char *save = NULL;
    for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int v = 0;
        while (v < V_COUNT && strcmp(vname[v], tok) != 0) v++;
        if (v == V_COUNT) {
            fprintf(stderr, "unknown variant %s\n", tok);
            return 2;
        }
        run_variant(v);
    }
    return 0;
}
