/*
 * test_engine_gpu.c - the CUDA backend through the engine interface: description, one
 * job per kernel with its stage timing, many concurrent jobs of mixed shapes, dtypes and
 * kernels on several streams (every result checked against a host reference), the 422
 * refusals, host memory locked by the workers (its cache: test_host_cache_gpu.c), and the
 * fault paths:
 * device_mem_limit, an injected allocation failure and a real one give 507 and the next job
 * runs; an injected trapping kernel (a sticky error) fails its job with 500 and no later
 * job hangs or is wrong (see the sticky scenarios below for what the driver allows after
 * that). Then: a worker waiting on a 1 s kernel uses almost no CPU (blocking-sync waits)
 * with its stage timing right; a cancel of a running product stops it at the next stage
 * boundary; free memory is live; the request-path calls make no CUDA call; wgmma is
 * listed exactly where it runs.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <stdatomic.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "cuda_host.h"
#include "backend.h"
#include "gemm_scratch.h"
#include "gpu_ref.h"

typedef struct {
    gemm_job job;
    gemm_engine *e;
    double *ref;
    uint32_t *ref_i;
} tjob;


/* The devices the engine opens ("all" unless a scenario needs one device only). */
static const char *open_devices = "all";

/* The defaults, on the CUDA backend's open_devices with this many streams each. */
static void cuda_config(gemm_engine_config *cfg, int streams)
{
    gemm_engine_config_defaults(cfg);
    snprintf(cfg->backend, sizeof cfg->backend, "cuda");
    snprintf(cfg->devices, sizeof cfg->devices, "%s", open_devices);
    cfg->streams_per_device = streams;
}

static gemm_engine *open_cuda(int streams, uint64_t mem_limit, const char *faults, int qdepth)
{
    gemm_engine_config cfg;
    cuda_config(&cfg, streams);
    cfg.device_mem_limit = mem_limit;
    cfg.queue_depth = qdepth;
    snprintf(cfg.fault_inject, sizeof cfg.fault_inject, "%s", faults);
    gemm_engine_err err;
    gemm_engine *e = gemm_engine_open(&cfg, &err);
    if (!e) printf("# open failed: %d %s\n", err.code, err.message);
    return e;
}

/* A job with fresh inputs and its reference; kernel may be "" (auto). */
static tjob *make_job(gemm_engine *e, gemm_dtype d, int m, int k, int n, const char *kernel,
                      int tile, gemm_math math, uint64_t seed)
{
    tjob *t = calloc(1, sizeof *t);
    size_t es = gemm_dtype_size(d);
    t->e = e;
    t->job.dtype = d;
    t->job.m = (uint64_t)m; t->job.k = (uint64_t)k; t->job.n = (uint64_t)n;
    t->job.a = gemm_engine_host_alloc(e, (size_t)m * k * es);
    t->job.b = gemm_engine_host_alloc(e, (size_t)k * n * es);
    t->job.c = gemm_engine_host_alloc(e, (size_t)m * n * es);
    snprintf(t->job.kernel, sizeof t->job.kernel, "%s", kernel);
    t->job.tile = tile;
    t->job.math = math;
    t->job.done = gpu_on_done;
    ref_fill(d, t->job.a, (size_t)m * k, seed);
    ref_fill(d, t->job.b, (size_t)k * n, seed + 7777);
    ref_poison(t->job.c, (size_t)m * n * es);
    return t;
}

static void free_job(tjob *t)
{
    gemm_engine_host_free(t->e, t->job.a);
    gemm_engine_host_free(t->e, t->job.b);
    gemm_engine_host_free(t->e, t->job.c);
    free(t->ref);
    free(t->ref_i);
    free(t);
}

/* 1 when the finished job's C matches the reference (tolerance by dtype and math). */
static int job_correct(tjob *t, double *err_out)
{
    gemm_job *j = &t->job;
    int m = (int)j->m, k = (int)j->k, n = (int)j->n;
    size_t nc = (size_t)m * n;
    if (j->dtype == GEMM_DTYPE_I32) {
        t->ref_i = malloc(nc * sizeof *t->ref_i);
        ref_gemm_i32(j->a, j->b, t->ref_i, m, k, n);
        size_t bad = ref_mismatches_i32(j->c, t->ref_i, nc);
        *err_out = (double)bad;
        return bad == 0;
    }
    t->ref = malloc(nc * sizeof *t->ref);
    ref_gemm_f64(j->dtype, j->a, j->b, t->ref, m, k, n);
    double err = ref_rel_err(j->dtype, j->c, t->ref, nc);
    double tol = j->dtype == GEMM_DTYPE_F64 ? 1e-12
               : j->math_used == GEMM_MATH_TF32 ? 5e-3
               : j->math_used == GEMM_MATH_BF16 ? 3e-2 : 1e-5;
    *err_out = err;
    return err < tol;
}

/* Submits one job and waits for it. Returns the submit status (0 or -1). */
static int run_one(gemm_engine *e, tjob *t, gemm_engine_err *err)
{
    int target = gpu_done_count() + 1;
    if (gemm_engine_submit(e, &t->job, err) != 0) return -1;
    gpu_wait_done(target);
    return 0;
}

static void test_describe(void)
{
    gemm_engine *e = open_cuda(4, 0, "", 64);
    tap(e != NULL, "cuda engine opens with 4 streams per device");
    if (!e) return;
    gemm_engine_info info;
    gemm_engine_describe(e, &info);
    tap(strcmp(info.backend, "cuda") == 0 && info.ndevices >= 1 &&
        info.workers == info.ndevices * 4, "describe: backend cuda, %d device(s), %d workers",
        info.ndevices, info.workers);
    gemm_device_info *d = &info.devices[0];
    tap(d->name[0] && d->total_mem > 0 && d->free_mem > 0 && d->free_mem <= d->total_mem &&
        d->sms > 0 && d->cc_major >= 5 && d->streams == 4,
        "device 0: %s, %llu MiB, %d SMs, cc %d.%d, %d streams", d->name,
        (unsigned long long)(d->total_mem >> 20), d->sms, d->cc_major, d->cc_minor, d->streams);
    int have = 0;
    for (int i = 0; i < info.nkernels; i++) {
        gemm_kernel_info *k = &info.kernels[i];
        if (strcmp(k->name, "naive") == 0 || strcmp(k->name, "tiled") == 0 || strcmp(k->name, "cublas") == 0) have++;
        if (strcmp(k->name, "cublas") == 0)
            tap(!(k->dtypes & (1u << GEMM_DTYPE_I32)) && (k->maths & (1u << GEMM_MATH_TF32)) &&
                (k->maths & (1u << GEMM_MATH_BF16)), "cublas: float32/float64, fp32/tf32/bf16, no int32");
        if (strcmp(k->name, "tiled") == 0)
            tap(k->tiles[0] == 32 && k->tiles[1] == 16, "tiled offers tiles 32 and 16");
    }
    tap(have == 3, "kernels listed: naive, tiled, cublas (%d in all)", info.nkernels);

    /* Host memory: host_alloc makes no CUDA call (it runs on HTTP threads), so a fresh
     * block is pageable; the worker locks it before its first copy, and a freed locked
     * block is handed out again for a similar size, still locked. */
    tjob *t = make_job(e, GEMM_DTYPE_F32, 700, 600, 500, "cublas", 0, GEMM_MATH_DEFAULT, 11);
    void *p = t->job.a;
    struct cudaPointerAttributes attr;
    int fresh = p && cudaPointerGetAttributes(&attr, p) == cudaSuccess && attr.type == cudaMemoryTypeUnregistered;
    cudaGetLastError();
    tap(fresh && ((uintptr_t)p % 64) == 0, "host_alloc gives 64-byte aligned memory, not yet locked");
    gemm_engine_err err;
    double er = 0;
    int ran = run_one(e, t, &err) == 0 && atomic_load(&t->job.state) == GEMM_JOB_DONE && job_correct(t, &er);
    int locked = cudaPointerGetAttributes(&attr, p) == cudaSuccess && attr.type == cudaMemoryTypeHost;
    cudaGetLastError();
    tap(ran && locked, "after a product, its input block is page-locked (locked by the worker)");
    free_job(t);
    void *q = gemm_engine_host_alloc(e, 700 * 600 * 4 - 100);
    locked = q && cudaPointerGetAttributes(&attr, q) == cudaSuccess && attr.type == cudaMemoryTypeHost;
    cudaGetLastError();
    tap(q == p && locked, "a freed locked block is reused for a similar size, still locked (no second registration)");
    gemm_engine_host_free(e, q);
    gemm_engine_close(e);
}

static void test_each_kernel(void)
{
    gemm_engine *e = open_cuda(2, 0, "", 64);
    if (!e) { tap(0, "open"); return; }
    struct { const char *kernel; int tile; gemm_dtype d; gemm_math math; const char *want; int want_tile; const char *want_block; } cases[] = {
        {"naive", 0, GEMM_DTYPE_F32, GEMM_MATH_DEFAULT, "naive", 0, NULL},
        {"tiled", 0, GEMM_DTYPE_F32, GEMM_MATH_DEFAULT, "tiled", 32, NULL},
        {"tiled", 16, GEMM_DTYPE_F64, GEMM_MATH_DEFAULT, "tiled", 16, NULL},
        {"tiled", 32, GEMM_DTYPE_I32, GEMM_MATH_DEFAULT, "tiled", 32, NULL},
        {"cublas", 0, GEMM_DTYPE_F32, GEMM_MATH_FP32, "cublas", 0, NULL},
        {"cublas", 0, GEMM_DTYPE_F32, GEMM_MATH_TF32, "cublas", 0, NULL},
        {"cublas", 0, GEMM_DTYPE_F32, GEMM_MATH_BF16, "cublas", 0, NULL},
        {"cublas", 0, GEMM_DTYPE_F64, GEMM_MATH_DEFAULT, "cublas", 0, NULL},
        {"auto", 0, GEMM_DTYPE_I32, GEMM_MATH_DEFAULT, NULL, -1, NULL},
        {"", 0, GEMM_DTYPE_F32, GEMM_MATH_DEFAULT, NULL, -1, NULL},
        /* 257 x 300: nine 128x128 blocks, far from a wave: simt's default is the small block,
         * and the answer says so (the launcher and the report make one choice). */
        {"simt", 0, GEMM_DTYPE_F32, GEMM_MATH_DEFAULT, "simt", 64, "64x64x16"},
        {"simt", 128, GEMM_DTYPE_F32, GEMM_MATH_DEFAULT, "simt", 128, "128x128x8"},
        {"tiled", 16, GEMM_DTYPE_F32, GEMM_MATH_DEFAULT, "tiled", 16, "16x16"},
        {"cublas", 0, GEMM_DTYPE_F64, GEMM_MATH_DEFAULT, "cublas", 0, ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tjob *t = make_job(e, cases[i].d, 257, 300, 129, cases[i].kernel, cases[i].tile, cases[i].math, 100 + i);
        gemm_engine_err err;
        int rc = run_one(e, t, &err);
        double er = 0;
        gemm_job *j = &t->job;
        int ok = rc == 0 && atomic_load(&j->state) == GEMM_JOB_DONE && job_correct(t, &er);
        const gemm_job_timing *tm = &j->timing;
        int timing_ok = tm->h2d_ms > 0 && tm->kernel_ms > 0 && tm->d2h_ms > 0 && tm->gflops > 0 &&
                        tm->h2d_ms + tm->kernel_ms + tm->d2h_ms <= tm->compute_ms + 0.05;
        int names_ok = (!cases[i].want || strcmp(j->kernel_used, cases[i].want) == 0) &&
                       (cases[i].want_tile < 0 || j->tile_used == cases[i].want_tile) &&
                       (!cases[i].want_block || strcmp(j->block, cases[i].want_block) == 0) &&
                       strncmp(j->device, "cuda:", 5) == 0 && j->stream >= 0 &&
                       (cases[i].d != GEMM_DTYPE_F32 ||
                        j->math_used == (cases[i].math == GEMM_MATH_DEFAULT ? GEMM_MATH_FP32 : cases[i].math));
        tap(ok && timing_ok && names_ok,
            "kernel=%s tile=%d %s math=%s -> %s tile %d block \"%s\" on %s stream %d: err %.3g; h2d %.3f + kernel %.3f + d2h %.3f <= total %.3f ms",
            cases[i].kernel[0] ? cases[i].kernel : "(none)", cases[i].tile, gemm_dtype_name(cases[i].d),
            gemm_math_name(cases[i].math), j->kernel_used, j->tile_used, j->block, j->device, j->stream, er,
            tm->h2d_ms, tm->kernel_ms, tm->d2h_ms, tm->compute_ms);
        if (rc != 0 || atomic_load(&j->state) != GEMM_JOB_DONE)
            printf("#   submit %d / %d: %s\n", rc, j->err.code, rc ? err.message : j->err.message);
        free_job(t);
    }
    if (strcmp(cases[8].kernel, "auto") == 0) {
        tjob *t = make_job(e, GEMM_DTYPE_I32, 3, 3, 3, "auto", 0, GEMM_MATH_DEFAULT, 5);
        gemm_engine_err err;
        run_one(e, t, &err);
        tap(strcmp(t->job.kernel_used, "cublas") != 0 && t->job.kernel_used[0],
            "auto never sends int32 to cuBLAS (chose %s)", t->job.kernel_used);
        free_job(t);
    }

    /* refusals: 422 before queueing, done() not called */
    struct { const char *kernel; int tile; gemm_dtype d; gemm_math math; gemm_ecode code; } bad[] = {
        {"cublas", 0, GEMM_DTYPE_I32, GEMM_MATH_DEFAULT, GEMM_E_UNSUPPORTED_DTYPE},
        {"tiled", 8, GEMM_DTYPE_F32, GEMM_MATH_DEFAULT, GEMM_E_BAD_TILE},
        {"naive", 16, GEMM_DTYPE_F32, GEMM_MATH_DEFAULT, GEMM_E_BAD_TILE},
        {"naive", 0, GEMM_DTYPE_F32, GEMM_MATH_TF32, GEMM_E_UNSUPPORTED_MATH},
        {"cublas", 0, GEMM_DTYPE_F64, GEMM_MATH_BF16, GEMM_E_UNSUPPORTED_MATH},
        {"warp-magic", 0, GEMM_DTYPE_F32, GEMM_MATH_DEFAULT, GEMM_E_UNKNOWN_KERNEL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        tjob *t = make_job(e, bad[i].d, 4, 4, 4, bad[i].kernel, bad[i].tile, bad[i].math, 1);
        gemm_engine_err err;
        int before = gpu_done_count();
        int rc = gemm_engine_submit(e, &t->job, &err);
        int after = gpu_done_count();
        tap(rc == -1 && err.code == bad[i].code && before == after, "kernel=%s tile=%d %s math=%s refused: %d (%s)",
            bad[i].kernel, bad[i].tile, gemm_dtype_name(bad[i].d), gemm_math_name(bad[i].math), err.code, err.message);
        free_job(t);
    }
    gemm_engine_close(e);
}

/* Many jobs at once over 4 streams: mixed shapes, dtypes, kernels; all must be right. */
static void test_concurrent(void)
{
    enum { N = 120 };
    gemm_engine *e = open_cuda(4, 0, "", N);
    if (!e) { tap(0, "open"); return; }
    static const int shp[][3] = {{1, 1, 1}, {37, 53, 29}, {128, 256, 64}, {300, 200, 500}, {513, 129, 257}, {1000, 1, 1000}};
    static const char *kern[] = {"auto", "naive", "tiled", "cublas"};
    tjob *jobs[N];
    int base = gpu_done_count();
    int submitted = 0;
    uint64_t bytes_in = 0, bytes_out = 0;
    for (int i = 0; i < N; i++) {
        gemm_dtype d = (gemm_dtype)(i % 3);
        const char *k = kern[(i / 3) % 4];
        if (d == GEMM_DTYPE_I32 && strcmp(k, "cublas") == 0) k = "tiled";
        int tile = strcmp(k, "tiled") == 0 ? ((i / 12) % 2 ? 16 : 32) : 0;
        const int *s = shp[(i / 2) % 6];
        jobs[i] = make_job(e, d, s[0], s[1], s[2], k, tile, GEMM_MATH_DEFAULT, 1000 + i);
        gemm_engine_err err;
        if (gemm_engine_submit(e, &jobs[i]->job, &err) == 0) submitted++;
        else printf("# submit %d failed: %s\n", i, err.message);
        size_t es = gemm_dtype_size(d);
        bytes_in += ((uint64_t)s[0] * s[1] + (uint64_t)s[1] * s[2]) * es;
        bytes_out += (uint64_t)s[0] * s[2] * es;
    }
    gpu_wait_done(base + submitted);
    int right = 0, streams_seen = 0;
    unsigned seen = 0;
    for (int i = 0; i < N; i++) {
        double er;
        if (atomic_load(&jobs[i]->job.state) == GEMM_JOB_DONE && job_correct(jobs[i], &er)) right++;
        else printf("#   job %d (%s %s %llux%llux%llu) wrong or failed: %s\n", i, jobs[i]->job.kernel_used,
                    gemm_dtype_name(jobs[i]->job.dtype), (unsigned long long)jobs[i]->job.m,
                    (unsigned long long)jobs[i]->job.k, (unsigned long long)jobs[i]->job.n, jobs[i]->job.err.message);
        if (jobs[i]->job.stream >= 0 && jobs[i]->job.stream < 32) seen |= 1u << jobs[i]->job.stream;
    }
    for (int s = 0; s < 32; s++) streams_seen += (seen >> s) & 1;
    tap(submitted == N && right == N, "%d concurrent jobs (mixed shapes, dtypes, kernels, tiles) all right: %d of %d",
        N, right, N);
    printf("# jobs ran on %d distinct stream(s)\n", streams_seen);
    gemm_engine_stats st;
    gemm_engine_get_stats(e, &st);
    uint64_t h2d = 0, d2h = 0, mem = 0;
    double busy = 0;
    for (int i = 0; i < st.ndevices; i++) {
        h2d += st.bytes_h2d[i];
        d2h += st.bytes_d2h[i];
        mem += st.device_mem_used[i];
        busy += st.device_busy_seconds[i];
    }
    tap(st.ndevices >= 1 && h2d == bytes_in && d2h == bytes_out && mem > 0 && busy > 0 &&
        st.completed >= (uint64_t)N,
        "stats: h2d %llu B, d2h %llu B, device memory %llu B, busy %.3f s, %llu completed",
        (unsigned long long)h2d, (unsigned long long)d2h, (unsigned long long)mem, busy,
        (unsigned long long)st.completed);
    for (int i = 0; i < N; i++) free_job(jobs[i]);
    gemm_engine_close(e);
}

static int expect_ok(gemm_engine *e, gemm_dtype d, int m, int k, int n, const char *kernel, const char *what)
{
    tjob *t = make_job(e, d, m, k, n, kernel, 0, GEMM_MATH_DEFAULT, 42);
    gemm_engine_err err;
    int rc = run_one(e, t, &err);
    double er = 0;
    int ok = rc == 0 && atomic_load(&t->job.state) == GEMM_JOB_DONE && job_correct(t, &er);
    tap(ok, "%s: %s %dx%dx%d kernel=%s right (err %.3g)%s%s", what, gemm_dtype_name(d), m, k, n,
        t->job.kernel_used, er, ok ? "" : " -- ", ok ? "" : (rc ? err.message : t->job.err.message));
    free_job(t);
    return ok;
}

static void expect_fail(gemm_engine *e, gemm_dtype d, int m, int k, int n, const char *kernel, gemm_ecode code,
                        const char *what)
{
    tjob *t = make_job(e, d, m, k, n, kernel, 0, GEMM_MATH_DEFAULT, 43);
    gemm_engine_err err;
    int rc = run_one(e, t, &err);
    const gemm_engine_err *je = rc ? &err : &t->job.err;
    tap(atomic_load(&t->job.state) == GEMM_JOB_FAILED && je->code == code, "%s: %d (%s)", what, je->code,
        je->message);
    free_job(t);
}


/* ---- waiting, cancelling, sampling ---------------------------------------- */

/* What done() saw on the worker's own thread: its CPU time and the wall clock. */
typedef struct {
    tjob *t;
    double cpu_ms, wall_ms;
} timed_done;
static timed_done timed[4];
static int ntimed;

static double thread_cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void on_done_timed(gemm_job *j)
{
    gpu_done_state *s = gpu_done();
    pthread_mutex_lock(&s->mu);
    if (ntimed < 4) {
        timed[ntimed].t = j->user;
        timed[ntimed].cpu_ms = thread_cpu_ms(); /* this is the worker thread */
        timed[ntimed].wall_ms = gemm_now_ms();
        ntimed++;
    }
    s->n++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* A worker waiting for a long kernel sleeps: with gpu_delay_ms:1000 every product's kernel
 * stage lasts a second of device time; the worker's CPU time over the second product (done()
 * of the first to done() of the second, both on that one worker) must be a small part of
 * the wall time (spinning would make it all of it). The stage timing stays right: the
 * kernel stage holds the second, the copies are short, and they add up to no more than the
 * worker's total. */
/* Run where submitted (gemm_engine_submit_here) on the CUDA engine: on an idle engine each
 * product runs on the calling thread, on an idle worker's stream, and is right; kernel
 * auto runs a small float32 product alone on one of ours (tiled up to 64^3, simt up to
 * 256^3: auto.c), a larger one and other dtypes as the table says; an explicit kernel is
 * kept. Then 8 threads mixing submit_here and submit with dynamic batching on: every
 * answer right, and the counters add up. */
struct here_arg {
    gemm_engine *e;
    int id, bad, here;
};

static void here_done(gemm_job *j)
{
    atomic_store((atomic_int *)j->user, 1);
}

static void *here_main(void *p)
{
    struct here_arg *a = p;
    static const int shp[][3] = {{64, 64, 64}, {37, 53, 29}, {200, 200, 200}, {5, 300, 7}, {64, 64, 64}};
    for (int i = 0; i < 40; i++) {
        const int *s = shp[(a->id + i) % 5];
        gemm_dtype d = (gemm_dtype)((a->id + i) % 3);
        tjob *t = make_job(a->e, d, s[0], s[1], s[2], "", 0, GEMM_MATH_DEFAULT, 5000 + (uint64_t)(a->id * 100 + i));
        atomic_int finished = 0;
        t->job.done = here_done; /* this job's own: the others' done() count in gpu_on_done's */
        t->job.user = &finished;
        gemm_engine_err err;
        int rc = (i % 2) ? gemm_engine_submit_here(a->e, &t->job, &err) : gemm_engine_submit(a->e, &t->job, &err);
        if (rc < 0) {
            printf("# submit: %s\n", err.message);
            a->bad++;
            free_job(t);
            continue;
        }
        if (rc == 1) a->here++;
        while (!atomic_load(&finished)) sched_yield(); /* done() is the engine's last touch */
        int st = atomic_load(&t->job.state);
        double er;
        if (st != GEMM_JOB_DONE || !job_correct(t, &er)) {
            printf("#   %s %dx%dx%d (%s) wrong or failed: %s\n", gemm_dtype_name(d), s[0], s[1], s[2],
                   t->job.kernel_used, t->job.err.message);
            a->bad++;
        }
        free_job(t);
    }
    return NULL;
}

/* How a product runs depends on the request alone: run where it was submitted
 * (submit_here) and queued, each product gets the same kernel, block and bits; auto gives
 * a small single float32 product tiled up to 64^3 and simt up to 256^3, anything larger
 * cuBLAS, and a panel (plan_m) what its whole product gets. */
static void test_same_launch(void)
{
    gemm_engine *e = open_cuda(2, 0, "", 64);
    if (!e) { tap(0, "open"); return; }
    struct { gemm_dtype d; int m, k, n; uint64_t plan_m; const char *want; } cases[] = {
        {GEMM_DTYPE_F32, 64, 64, 64, 0, "tiled"},
        {GEMM_DTYPE_F32, 37, 61, 53, 0, "tiled"},
        {GEMM_DTYPE_F32, 1, 1, 1, 0, "tiled"},
        {GEMM_DTYPE_F32, 65, 64, 64, 0, "simt"},
        {GEMM_DTYPE_F32, 200, 131, 249, 0, "simt"},
        {GEMM_DTYPE_F32, 257, 256, 256, 0, "cublas"},
        {GEMM_DTYPE_F32, 32, 64, 64, 64, "tiled"},    /* half of a 64^3 product */
        {GEMM_DTYPE_F32, 64, 256, 256, 256, "simt"},  /* a quarter of 256^3 */
        {GEMM_DTYPE_F32, 64, 256, 256, 512, "cublas"}, /* an eighth of 512x256x256 */
        {GEMM_DTYPE_F64, 64, 64, 64, 0, "cublas"},
        {GEMM_DTYPE_I32, 100, 50, 70, 0, "simt"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tjob *t[2];
        int rc[2];
        gemm_engine_err err;
        for (int here = 0; here < 2; here++) {
            t[here] = make_job(e, cases[i].d, cases[i].m, cases[i].k, cases[i].n, "", 0, GEMM_MATH_DEFAULT, 9000 + i);
            t[here]->job.plan_m = cases[i].plan_m;
            int target = gpu_done_count() + 1;
            rc[here] = here ? gemm_engine_submit_here(e, &t[here]->job, &err) : gemm_engine_submit(e, &t[here]->job, &err);
            if (rc[here] >= 0) gpu_wait_done(target);
        }
        const gemm_job *q = &t[0]->job, *h = &t[1]->job;
        double er = 0;
        int ok = rc[0] == 0 && rc[1] == 1 && atomic_load(&q->state) == GEMM_JOB_DONE &&
                 atomic_load(&h->state) == GEMM_JOB_DONE && job_correct(t[0], &er) &&
                 strcmp(q->kernel_used, cases[i].want) == 0 && strcmp(h->kernel_used, q->kernel_used) == 0 &&
                 strcmp(h->block, q->block) == 0 && h->tile_used == q->tile_used &&
                 memcmp(h->c, q->c, (size_t)cases[i].m * cases[i].n * gemm_dtype_size(cases[i].d)) == 0;
        tap(ok, "%s %dx%dx%d (panel of %llu rows): queued and run here (rc %d, %d) both ran %s / %s (want %s), "
            "block \"%s\" / \"%s\", the same bits; err %.3g",
            gemm_dtype_name(cases[i].d), cases[i].m, cases[i].k, cases[i].n, (unsigned long long)cases[i].plan_m,
            rc[0], rc[1], q->kernel_used, h->kernel_used, cases[i].want, q->block, h->block, er);
        free_job(t[0]);
        free_job(t[1]);
    }
    gemm_engine_close(e);
}

static void test_submit_here(void)
{
    gemm_engine *e = open_cuda(2, 0, "", 64); /* returns with every worker idle */
    if (!e) { tap(0, "open"); return; }
    struct { gemm_dtype d; int m, k, n; const char *kernel; const char *want; } cases[] = {
        {GEMM_DTYPE_F32, 64, 64, 64, "", "tiled"},
        {GEMM_DTYPE_F32, 37, 61, 29, "auto", "tiled"},
        {GEMM_DTYPE_F32, 200, 200, 200, "", "simt"},
        {GEMM_DTYPE_F32, 256, 256, 256, "", "simt"},
        {GEMM_DTYPE_F32, 512, 512, 512, "", "cublas"},
        {GEMM_DTYPE_F32, 64, 64, 64, "cublas", "cublas"},
        {GEMM_DTYPE_F64, 64, 64, 64, "", "cublas"},
        {GEMM_DTYPE_I32, 64, 64, 64, "", "simt"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tjob *t = make_job(e, cases[i].d, cases[i].m, cases[i].k, cases[i].n, cases[i].kernel, 0,
                           GEMM_MATH_DEFAULT, 4000 + i);
        gemm_engine_stats st0, st1;
        gemm_engine_get_stats(e, &st0);
        gemm_engine_err err;
        int target = gpu_done_count() + 1;
        int rc = gemm_engine_submit_here(e, &t->job, &err);
        int done_before_return = gpu_done_count() >= target;
        if (rc == 0) gpu_wait_done(target);
        gemm_engine_get_stats(e, &st1);
        double er = 0;
        int ok = rc == 1 && done_before_return && atomic_load(&t->job.state) == GEMM_JOB_DONE &&
                 job_correct(t, &er) && strcmp(t->job.kernel_used, cases[i].want) == 0 &&
                 st1.ran_here == st0.ran_here + 1 && t->job.stream >= 0 && t->job.timing.kernel_ms > 0;
        tap(ok, "submit_here %s %dx%dx%d kernel \"%s\": ran here (rc %d), ran %s (want %s) on stream %d, err %.3g%s%s",
            gemm_dtype_name(cases[i].d), cases[i].m, cases[i].k, cases[i].n, cases[i].kernel, rc,
            t->job.kernel_used, cases[i].want, t->job.stream, er, rc < 0 ? " -- " : "", rc < 0 ? err.message : "");
        free_job(t);
    }
    gemm_engine_close(e);

    gemm_engine_config cfg;
    cuda_config(&cfg, 4);
    cfg.queue_depth = 256;
    cfg.batch_max = 8;
    gemm_engine_err err;
    e = gemm_engine_open(&cfg, &err);
    if (!e) { tap(0, "open with batch_max 8: %s", err.message); return; }
    enum { T = 8 };
    pthread_t th[T];
    struct here_arg a[T];
    for (int i = 0; i < T; i++) {
        a[i] = (struct here_arg){e, i, 0, 0};
        pthread_create(&th[i], NULL, here_main, &a[i]);
    }
    int bad = 0, here = 0;
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        bad += a[i].bad, here += a[i].here;
    }
    gemm_engine_stats st;
    do {
        sched_yield();
        gemm_engine_get_stats(e, &st);
    } while (st.running > 0 || st.queued > 0);
    tap(bad == 0 && st.completed == T * 40 && st.ran_here == (uint64_t)here,
        "%d threads mixing submit_here and submit (batch_max 8): %d wrong or failed of %d; %d ran where "
        "submitted, %llu coalesced", T, bad, T * 40, here, (unsigned long long)st.coalesced_products);
    gemm_engine_close(e);
}

static void test_blocking_wait(void)
{
    gemm_engine_config cfg;
    gemm_engine_config_defaults(&cfg);
    snprintf(cfg.backend, sizeof cfg.backend, "cuda");
    snprintf(cfg.devices, sizeof cfg.devices, "0");
    cfg.streams_per_device = 1;
    /* One product at a time: with dynamic batching the two could run as one group when the
     * second is queued before the worker takes the first, and end together. */
    cfg.batch_max = 1;
    snprintf(cfg.fault_inject, sizeof cfg.fault_inject, "gpu_delay_ms:1000");
    gemm_engine_err err;
    gemm_engine *e = gemm_engine_open(&cfg, &err);
    if (!e) { tap(0, "open with gpu_delay_ms:1000: %s", err.message); return; }
    tjob *t[2];
    gpu_done_state *ds = gpu_done();
    pthread_mutex_lock(&ds->mu);
    int base = ds->n;
    ntimed = 0;
    pthread_mutex_unlock(&ds->mu);
    int sub = 0;
    for (int i = 0; i < 2; i++) {
        t[i] = make_job(e, GEMM_DTYPE_F32, 256, 128, 192, "tiled", 0, GEMM_MATH_DEFAULT, 900 + i);
        t[i]->job.done = on_done_timed;
        t[i]->job.user = t[i];
        if (gemm_engine_submit(e, &t[i]->job, &err) == 0) sub++;
    }
    gpu_wait_done(base + sub);
    double er0 = 0, er1 = 0;
    int right = sub == 2 && ntimed == 2 && timed[0].t == t[0] && timed[1].t == t[1] &&
                atomic_load(&t[0]->job.state) == GEMM_JOB_DONE && atomic_load(&t[1]->job.state) == GEMM_JOB_DONE &&
                job_correct(t[0], &er0) && job_correct(t[1], &er1);
    double wall = ntimed == 2 ? timed[1].wall_ms - timed[0].wall_ms : 0;
    double cpu = ntimed == 2 ? timed[1].cpu_ms - timed[0].cpu_ms : 1e9;
    tap(right, "two products with a 1 s kernel stage each, on one worker: both right (err %.2g, %.2g)", er0, er1);
    /* Wide margin: spinning costs ~100%% of the wall time, sleeping well under 1%%. */
    tap(wall >= 900 && cpu < 0.1 * wall,
        "the worker sleeps while its kernel runs: %.1f ms of CPU over %.0f ms of wall time (%.2f%%)", cpu, wall,
        wall > 0 ? 100.0 * cpu / wall : 0);
    const gemm_job_timing *tm = &t[1]->job.timing;
    tap(tm->kernel_ms >= 950 && tm->h2d_ms > 0 && tm->h2d_ms < 100 && tm->d2h_ms > 0 && tm->d2h_ms < 100 &&
        tm->h2d_ms + tm->kernel_ms + tm->d2h_ms <= tm->compute_ms + 0.05,
        "stage timing with stage-by-stage waits: h2d %.3f + kernel %.1f + d2h %.3f <= total %.1f ms",
        tm->h2d_ms, tm->kernel_ms, tm->d2h_ms, tm->compute_ms);
    for (int i = 0; i < 2; i++) free_job(t[i]);
    gemm_engine_close(e);
}

/* A cancel of a running product stops it at the next stage boundary: with a 1.5 s kernel
 * stage, a cancel during the kernel stops it before its D2H copy, so C keeps its poison;
 * CANCELLED, 409 cancelled, done() once. The next product on that worker is right. */
static void test_cancel_running(void)
{
    gemm_engine_config cfg;
    gemm_engine_config_defaults(&cfg);
    snprintf(cfg.backend, sizeof cfg.backend, "cuda");
    snprintf(cfg.devices, sizeof cfg.devices, "0");
    cfg.streams_per_device = 1;
    snprintf(cfg.fault_inject, sizeof cfg.fault_inject, "gpu_delay_ms:1500");
    gemm_engine_err err;
    gemm_engine *e = gemm_engine_open(&cfg, &err);
    if (!e) { tap(0, "open with gpu_delay_ms:1500: %s", err.message); return; }
    tjob *t = make_job(e, GEMM_DTYPE_F64, 300, 200, 100, "tiled", 0, GEMM_MATH_DEFAULT, 950);
    int base = gpu_done_count();
    int sub = gemm_engine_submit(e, &t->job, &err) == 0;
    while (sub && atomic_load(&t->job.state) == GEMM_JOB_QUEUED) usleep(1000);
    usleep(300 * 1000); /* into the kernel stage (any moment before its end would do) */
    int r = gemm_engine_cancel(e, &t->job);
    if (sub) gpu_wait_done(base + 1);
    size_t nc = 300 * 100, poisoned = 0;
    for (size_t i = 0; i < nc; i++) poisoned += isnan(((double *)t->job.c)[i]);
    const gemm_engine_err *je = &t->job.err;
    tap(sub && r == 0 && atomic_load(&t->job.state) == GEMM_JOB_CANCELLED && je->code == GEMM_E_CANCELLED &&
            strstr(je->message, "before its") && poisoned == nc,
        "cancel while running: %s %d (%s); C untouched (%zu of %zu poisoned)",
        gemm_job_state_name((gemm_job_state)atomic_load(&t->job.state)), je->code, je->message, poisoned, nc);
    tap(strstr(je->message, "device-to-host") && t->job.timing.kernel_ms >= 1400,
        "it stopped after its kernel (%.0f ms), before the D2H copy", t->job.timing.kernel_ms);
    free_job(t);
    gemm_engine_stats st;
    gemm_engine_get_stats(e, &st);
    tap(st.cancelled == 1 && st.completed == 0 && st.failed == 0 && st.running == 0,
        "stats: %llu cancelled, %llu completed, %llu failed", (unsigned long long)st.cancelled,
        (unsigned long long)st.completed, (unsigned long long)st.failed);
    expect_ok(e, GEMM_DTYPE_F64, 300, 200, 100, "tiled", "the next product after a cancel");
    gemm_engine_close(e);
}

static double now_ms_sleep(int ms)
{
    usleep((useconds_t)ms * 1000);
    return gemm_now_ms();
}

/* Free memory is live: it drops when something else takes device memory and comes back
 * when it is freed (sampled about every second off the request path). */
static void test_free_memory(void)
{
    gemm_engine *e = open_cuda(1, 0, "", 16);
    if (!e) { tap(0, "open"); return; }
    gemm_engine_stats st;
    gemm_engine_get_stats(e, &st);
    gemm_engine_info info;
    gemm_engine_describe(e, &info);
    uint64_t before = st.device_mem_free[0];
    tap(before > 0 && before <= info.devices[0].total_mem && info.devices[0].free_mem > 0,
        "free memory sampled: %llu of %llu MiB", (unsigned long long)(before >> 20),
        (unsigned long long)(info.devices[0].total_mem >> 20));
    size_t take = (size_t)1 << 30;
    void *p = NULL;
    if (before < 4 * (uint64_t)take || cudaSetDevice(0) != cudaSuccess || cudaMalloc(&p, take) != cudaSuccess) {
        cudaGetLastError();
        tap_skip("less than 4 GiB free or cudaMalloc failed", "free memory follows a 1 GiB allocation");
        gemm_engine_close(e);
        return;
    }
    uint64_t low = before;
    for (double t0 = gemm_now_ms(); gemm_now_ms() - t0 < 5000 && low > before - take / 2; now_ms_sleep(100)) {
        gemm_engine_get_stats(e, &st);
        low = st.device_mem_free[0];
    }
    cudaFree(p);
    uint64_t back = low;
    for (double t0 = gemm_now_ms(); gemm_now_ms() - t0 < 5000 && back < before - take / 2; now_ms_sleep(100)) {
        gemm_engine_get_stats(e, &st);
        back = st.device_mem_free[0];
    }
    tap(low <= before - take / 2 && back >= before - take / 2,
        "free memory follows a 1 GiB allocation: %llu -> %llu -> %llu MiB", (unsigned long long)(before >> 20),
        (unsigned long long)(low >> 20), (unsigned long long)(back >> 20));
    gemm_engine_close(e);
}

/* The calls the daemon makes on its HTTP threads make no CUDA call: a thread that only
 * makes those (describe, stats, ready, healthy, host_alloc/free of locked blocks, submit
 * with kernel=auto on a shape where wgmma is a candidate, cancel of a queued job) has no
 * CUDA context current afterwards. The runtime makes the primary context current on a
 * thread at its first call that needs one (cudaMemGetInfo, cudaHostRegister,
 * cudaFuncGetAttributes would), so the driver's cuCtxGetCurrent tells. */
typedef struct {
    gemm_engine *e;
    void *locked[3];
    int ctx_checked, ctx_none, refused;
} http_side;

static void *http_thread(void *arg)
{
    http_side *hs = arg;
    gemm_engine_info info;
    gemm_engine_stats st;
    gemm_engine_describe(hs->e, &info);
    gemm_engine_get_stats(hs->e, &st);
    (void)gemm_engine_ready(hs->e);
    (void)gemm_engine_healthy(hs->e);
    for (int i = 0; i < 3; i++) gemm_engine_host_free(hs->e, hs->locked[i]);
    void *p = gemm_engine_host_alloc(hs->e, 4 << 20);
    gemm_engine_host_free(hs->e, p);
    /* A job that stays queued behind a gate is submitted (validate runs here) and
     * cancelled from this thread. */
    tjob *t = make_job(hs->e, GEMM_DTYPE_F32, 3072, 512, 3072, "auto", 0, GEMM_MATH_BF16, 3); /* a "big" shape */
    gemm_engine_err err;
    if (gemm_engine_submit(hs->e, &t->job, &err) == 0) {
        if (gemm_engine_cancel(hs->e, &t->job) == 0) { /* it started: wait for it */
            gpu_done_state *ds = gpu_done();
            pthread_mutex_lock(&ds->mu);
            while (atomic_load(&t->job.state) < GEMM_JOB_DONE) pthread_cond_wait(&ds->cv, &ds->mu);
            pthread_mutex_unlock(&ds->mu);
        }
    } else {
        hs->refused = 1;
    }
    free_job(t);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    int (*get_ctx)(void **) = lib ? (int (*)(void **))dlsym(lib, "cuCtxGetCurrent") : NULL;
    if (get_ctx) {
        void *ctx = (void *)1;
        hs->ctx_checked = get_ctx(&ctx) == 0;
        hs->ctx_none = ctx == NULL;
    }
    return NULL;
}

static void test_no_cuda_on_request_path(void)
{
    gemm_engine *e = open_cuda(1, 0, "gpu_delay_ms:1500", 16);
    if (!e) { tap(0, "open"); return; }
    /* three locked blocks: a product's buffers, after it ran */
    tjob *g = make_job(e, GEMM_DTYPE_F32, 64, 64, 64, "tiled", 0, GEMM_MATH_DEFAULT, 1);
    gemm_engine_err err;
    run_one(e, g, &err);
    /* a gate: the one worker is busy for 1.5 s, so the request-side job stays queued */
    tjob *gate = make_job(e, GEMM_DTYPE_F32, 64, 64, 64, "tiled", 0, GEMM_MATH_DEFAULT, 2);
    int base = gpu_done_count();
    int gated = gemm_engine_submit(e, &gate->job, &err) == 0;
    http_side hs = {.e = e, .locked = {g->job.a, g->job.b, g->job.c}};
    g->job.a = g->job.b = g->job.c = NULL; /* now the thread's to free */
    pthread_t th;
    int started = pthread_create(&th, NULL, http_thread, &hs) == 0;
    if (started) pthread_join(th, NULL);
    if (gated) gpu_wait_done(base + 1);
    if (!hs.ctx_checked)
        tap_skip("cuCtxGetCurrent not found in libcuda.so.1", "the request-path calls make no CUDA call");
    else
        tap(started && !hs.refused && hs.ctx_none,
            "the request-path calls (describe, stats, host_alloc/free, submit with auto, cancel) leave the "
            "thread without a CUDA context: no CUDA call made");
    free(g->ref);
    free(g);
    free_job(gate);
    gemm_engine_close(e);
}

/* wgmma is listed exactly where it runs: listed -> kernel=wgmma runs and is right; not
 * listed (no sm_90a code in this build for this GPU) -> refused with 422 before queueing. */
static void test_wgmma_listed_iff_runs(void)
{
    gemm_engine *e = open_cuda(1, 0, "", 16);
    if (!e) { tap(0, "open"); return; }
    gemm_engine_info info;
    gemm_engine_describe(e, &info);
    int listed = 0;
    for (int i = 0; i < info.nkernels; i++) listed |= strcmp(info.kernels[i].name, "wgmma") == 0;
    tjob *t = make_job(e, GEMM_DTYPE_F32, 256, 320, 192, "wgmma", 0, GEMM_MATH_TF32, 77);
    gemm_engine_err err;
    int rc = run_one(e, t, &err);
    double er = 0;
    if (listed)
        tap(rc == 0 && atomic_load(&t->job.state) == GEMM_JOB_DONE && job_correct(t, &er),
            "wgmma is listed (cc %d.%d) and runs: err %.2g", info.devices[0].cc_major, info.devices[0].cc_minor, er);
    else
        tap(rc == -1 && err.code == GEMM_E_UNSUPPORTED, "wgmma is not listed (cc %d.%d) and is refused: %d %s",
            info.devices[0].cc_major, info.devices[0].cc_minor, err.code, err.message);
    free_job(t);
    gemm_engine_close(e);
}

/* ---- sticky errors: each scenario in a fresh process -----------------------
 * A sticky error (here a kernel that traps) poisons the CUDA context of the process: the
 * engine fails the jobs in flight with 500, resets the device and tries to make a new
 * context. Where the driver refuses that for the rest of the process (the H100 driver 580
 * does: every new context fails with cudaErrorDevicesUnavailable), the device is marked
 * lost and its jobs fail at once with 503 device_unavailable. Either way no job hangs,
 * none is silently wrong, and the engine closes. Because the poisoning outlives the engine,
 * each scenario runs in its own process (this program, re-executed). The scenarios are of
 * one device (devices = "0"): on a host with several GPUs a trap has been seen to break the
 * process's contexts on the other GPUs too (H200 x2, driver 580); that case is
 * tests/gpu/test_multigpu_gpu.py's. */

static int ok_or_unavailable(tjob *t, const char **what)
{
    double er;
    int st = atomic_load(&t->job.state);
    if (st == GEMM_JOB_DONE && job_correct(t, &er)) { *what = "right"; return 1; }
    if (st == GEMM_JOB_FAILED && t->job.err.code == GEMM_E_DEVICE_LOST) {
        *what = "503 device_unavailable";
        return 1;
    }
    *what = t->job.err.message[0] ? t->job.err.message : "wrong result";
    return 0;
}

/* The engine's messages reach the logging hook (the daemon's log), with their levels. */
static atomic_int hook_warn_or_error;
static void hook_print(void *user, gemm_log_level level, const char *msg)
{
    (void)user;
    printf("# engine log, level %d: %s\n", (int)level, msg);
    fflush(stdout);
    if (level <= GEMM_LOG_WARN && strstr(msg, "cuda:")) atomic_fetch_add(&hook_warn_or_error, 1);
}

static int child_sticky_single(void)
{
    open_devices = "0";
    gemm_engine_set_log(hook_print, NULL);
    gemm_engine *e = open_cuda(1, 0, "sticky:2", 16);
    if (!e) return 1;
    int good = expect_ok(e, GEMM_DTYPE_F32, 100, 100, 100, "tiled", "before the sticky error");
    tjob *t = make_job(e, GEMM_DTYPE_F32, 100, 100, 100, "tiled", 0, GEMM_MATH_DEFAULT, 3);
    gemm_engine_err err;
    run_one(e, t, &err);
    int trapped = atomic_load(&t->job.state) == GEMM_JOB_FAILED && t->job.err.code == GEMM_E_DEVICE;
    printf("# trapping job: %d (%s)\n", t->job.err.code, t->job.err.message);
    free_job(t);
    int after = 1;
    const char *kernels[] = {"cublas", "tiled", "naive"};
    for (int i = 0; i < 3; i++) {
        t = make_job(e, (gemm_dtype)i, 300, 200, 100, kernels[i], 0, GEMM_MATH_DEFAULT, 10 + i);
        double t0 = gemm_now_ms();
        run_one(e, t, &err);
        const char *what;
        int ok = ok_or_unavailable(t, &what);
        printf("# after the fault, %s %s: %s in %.1f ms\n", kernels[i], gemm_dtype_name((gemm_dtype)i), what,
               gemm_now_ms() - t0);
        after &= ok;
        free_job(t);
    }
    gemm_engine_close(e);
    int logged = atomic_load(&hook_warn_or_error);
    printf("# %d warning/error message(s) reached the logging hook\n", logged);
    return good && trapped && after && logged >= 1 ? 0 : 1;
}

static int child_sticky_concurrent(void)
{
    enum { N = 32 };
    open_devices = "0";
    gemm_engine *e = open_cuda(4, 0, "sticky:6", 64);
    if (!e) return 1;
    tjob *jobs[N];
    int base = gpu_done_count();
    int sub = 0;
    for (int i = 0; i < N; i++) {
        jobs[i] = make_job(e, (gemm_dtype)(i % 3), 200 + i, 150, 170, i % 3 == 2 ? "tiled" : "auto", 0,
                           GEMM_MATH_DEFAULT, 500 + i);
        gemm_engine_err err;
        if (gemm_engine_submit(e, &jobs[i]->job, &err) == 0) sub++;
    }
    gpu_wait_done(base + sub);
    int right = 0, f500 = 0, f503 = 0, other = 0;
    for (int i = 0; i < N; i++) {
        double er;
        gemm_job *j = &jobs[i]->job;
        int st = atomic_load(&j->state);
        if (st == GEMM_JOB_DONE && job_correct(jobs[i], &er)) right++;
        else if (st == GEMM_JOB_FAILED && j->err.code == GEMM_E_DEVICE) f500++;
        else if (st == GEMM_JOB_FAILED && j->err.code == GEMM_E_DEVICE_LOST) f503++;
        else { other++; printf("# job %d: %s\n", i, j->err.message[0] ? j->err.message : "wrong result"); }
    }
    printf("# %d jobs on 4 streams, trap on the 6th: %d right, %d failed 500 device_error, %d failed 503 "
           "device_unavailable, %d otherwise\n", N, right, f500, f503, other);
    for (int i = 0; i < N; i++) free_job(jobs[i]);
    tjob *t = make_job(e, GEMM_DTYPE_F64, 333, 222, 111, "naive", 0, GEMM_MATH_DEFAULT, 9);
    gemm_engine_err err;
    run_one(e, t, &err);
    const char *what;
    int after = ok_or_unavailable(t, &what);
    printf("# the next job: %s\n", what);
    free_job(t);
    gemm_engine_close(e);
    return sub == N && f500 >= 1 && other == 0 && after ? 0 : 1;
}

/* Two devices, lost:2: the second product resets device 0 and marks it lost, as a reset that
 * cannot make a new context does, and that reset drops every host registration device 0
 * made. The first product's blocks (locked by device 0) then serve device 1: they are
 * registered again there, not taken as locked through device 0's dead registration, so
 * the copies through them read right; blocks freed and handed out again from the cache
 * too. */
static int child_lost_registrations(void)
{
    open_devices = "0,1";
    gemm_engine *e = open_cuda(1, 0, "lost:2", 16);
    if (!e) return 1;
    tjob *t = make_job(e, GEMM_DTYPE_F32, 48, 48, 48, "", 0, GEMM_MATH_DEFAULT, 21);
    gemm_engine_err err;
    double er = 0;
    run_one(e, t, &err);
    int first = atomic_load(&t->job.state) == GEMM_JOB_DONE && job_correct(t, &er) &&
                strncmp(t->job.device, "cuda:0", 6) == 0;
    printf("# first product on %s: %s\n", t->job.device, first ? "right" : "WRONG");
    tjob *l = make_job(e, GEMM_DTYPE_F32, 48, 48, 48, "", 0, GEMM_MATH_DEFAULT, 22);
    run_one(e, l, &err);
    int lost = atomic_load(&l->job.state) == GEMM_JOB_FAILED && l->job.err.code == GEMM_E_DEVICE;
    printf("# second product: %d (%s)\n", l->job.err.code, l->job.err.message);
    free_job(l);
    int after = 1;
    for (int i = 0; i < 4; i++) { /* the first blocks again, then blocks from the cache */
        if (i > 0) {
            free_job(t);
            t = make_job(e, GEMM_DTYPE_F32, 48, 48, 48, "", 0, GEMM_MATH_DEFAULT, 30 + (uint64_t)i);
        } else {
            ref_poison(t->job.c, 48 * 48 * 4);
            free(t->ref), t->ref = NULL;
        }
        run_one(e, t, &err);
        int ok = atomic_load(&t->job.state) == GEMM_JOB_DONE && job_correct(t, &er) &&
                 strncmp(t->job.device, "cuda:1", 6) == 0;
        printf("# after the loss, product %d on %s: %s (err %.3g)\n", i, t->job.device, ok ? "right" : "WRONG",
               er);
        after &= ok;
    }
    free_job(t);
    int healthy = gemm_engine_healthy(e);
    gemm_engine_close(e);
    return first && lost && after && healthy ? 0 : 1;
}

static void run_child(const char *flag, const char *name)
{
    char self[4096], cmd[4200];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) { tap(0, "%s (cannot find this program)", name); return; }
    self[n] = '\0';
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", self, flag);
    FILE *p = popen(cmd, "r");
    if (!p) { tap(0, "%s (popen failed)", name); return; }
    char line[1024];
    while (fgets(line, sizeof line, p)) printf("#   %s", line[0] == '#' ? line + 2 : line);
    int rc = pclose(p);
    tap(rc == 0, "%s (child exit %d)", name, rc);
}

static void test_faults(void)
{
    /* device_mem_limit: 4 MiB per stream; a 1024^2 float32 product needs 12 MiB */
    gemm_engine *e = open_cuda(2, 4u << 20, "", 16);
    if (e) {
        expect_fail(e, GEMM_DTYPE_F32, 1024, 1024, 1024, "tiled", GEMM_E_DEVICE_OOM,
                    "over device_mem_limit");
        expect_ok(e, GEMM_DTYPE_F32, 512, 256, 512, "tiled", "after the over-limit product");
        gemm_engine_close(e);
    } else tap(0, "open with device_mem_limit");

    /* the first device allocation fails */
    e = open_cuda(1, 0, "oom:1", 16);
    if (e) {
        expect_fail(e, GEMM_DTYPE_F32, 200, 300, 100, "cublas", GEMM_E_DEVICE_OOM,
                    "injected allocation failure");
        expect_ok(e, GEMM_DTYPE_F32, 200, 300, 100, "cublas", "after the allocation failure");
        gemm_engine_close(e);
    } else tap(0, "open with oom:1");

    /* an allocation failure among concurrent products fails only its own product */
    e = open_cuda(4, 0, "oom:5", 64);
    if (e) {
        enum { N = 24 };
        tjob *jobs[N];
        int base = gpu_done_count();
        int sub = 0;
        /* each stream's first product allocates its three buffers, so with all of them
         * queued at once allocation 5 falls in some stream's first product, with nothing
         * cached to give back and retry with */
        for (int i = 0; i < N; i++)
            jobs[i] = make_job(e, (gemm_dtype)(i % 3), 100 + 16 * i, 90 + 8 * i, 110 + 16 * i,
                               i % 3 == 2 ? "tiled" : "auto", 0, GEMM_MATH_DEFAULT, 700 + i);
        for (int i = 0; i < N; i++) {
            gemm_engine_err err;
            if (gemm_engine_submit(e, &jobs[i]->job, &err) == 0) sub++;
        }
        gpu_wait_done(base + sub);
        int right = 0, oom = 0, other = 0;
        for (int i = 0; i < N; i++) {
            double er;
            gemm_job *j = &jobs[i]->job;
            int st = atomic_load(&j->state);
            if (st == GEMM_JOB_DONE && job_correct(jobs[i], &er)) right++;
            else if (st == GEMM_JOB_FAILED && j->err.code == GEMM_E_DEVICE_OOM) oom++;
            else { other++; printf("# job %d: %s\n", i, j->err.message[0] ? j->err.message : "wrong result"); }
        }
        tap(sub == N && oom == 1 && right == N - 1 && other == 0,
            "%d concurrent products on 4 streams, allocation 5 fails: %d right, %d failed 507, %d otherwise",
            N, right, oom, other);
        for (int i = 0; i < N; i++) free_job(jobs[i]);
        gemm_engine_close(e);
    } else tap(0, "open with oom:5");

    /* a real out-of-memory: more than the device has */
    e = open_cuda(1, 0, "", 16);
    if (e) {
        gemm_engine_info info;
        gemm_engine_describe(e, &info);
        /* A and C of 40000 x 400000 float32 (64 GB each) exceed an 80 GB device together;
         * host memory for them is not needed because the job fails before any copy. */
        tjob t;
        memset(&t, 0, sizeof t);
        uint64_t rows = info.devices[0].total_mem / 4 / 100000 + 1; /* A alone larger than the device */
        t.job.dtype = GEMM_DTYPE_F32;
        t.job.m = rows; t.job.k = 100000; t.job.n = 1;
        static float dummy[4];
        t.job.a = t.job.b = t.job.c = dummy;
        snprintf(t.job.kernel, sizeof t.job.kernel, "naive");
        t.job.done = gpu_on_done;
        gemm_engine_err err;
        int rc = run_one(e, &t, &err);
        tap(rc == 0 && atomic_load(&t.job.state) == GEMM_JOB_FAILED && t.job.err.code == GEMM_E_DEVICE_OOM,
            "a product larger than device memory: %d (%s)", t.job.err.code, t.job.err.message);
        expect_ok(e, GEMM_DTYPE_F64, 64, 64, 64, "tiled", "after the real out-of-memory");
        gemm_engine_close(e);
    }

    /* fault_inject syntax is checked */
    gemm_engine_config cfg;
    gemm_engine_config_defaults(&cfg);
    snprintf(cfg.backend, sizeof cfg.backend, "cuda");
    snprintf(cfg.fault_inject, sizeof cfg.fault_inject, "explode:1");
    gemm_engine_err err;
    gemm_engine *bad = gemm_engine_open(&cfg, &err);
    tap(bad == NULL && err.code == GEMM_E_BAD_CONFIG, "unknown fault_inject is refused: %s", err.message);
    if (bad) gemm_engine_close(bad);
    gemm_engine_config_defaults(&cfg);
    snprintf(cfg.backend, sizeof cfg.backend, "cuda");
    snprintf(cfg.devices, sizeof cfg.devices, "0,99");
    bad = gemm_engine_open(&cfg, &err);
    tap(bad == NULL && err.code == GEMM_E_BAD_CONFIG, "devices naming a missing ordinal is refused: %s", err.message);
    if (bad) gemm_engine_close(bad);
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--sticky-single") == 0) return child_sticky_single();
    if (argc == 2 && strcmp(argv[1], "--sticky-concurrent") == 0) return child_sticky_concurrent();
    if (argc == 2 && strcmp(argv[1], "--lost-registrations") == 0) return child_lost_registrations();
    if (gemm_cuda_device_count() == 0) {
        tap_skip("no CUDA device", "CUDA engine");
        return tap_done();
    }
    test_describe();
    test_each_kernel();
    test_concurrent();
    test_submit_here();
    test_same_launch();
    test_faults();
    test_blocking_wait();
    test_cancel_running();
    test_free_memory();
    test_no_cuda_on_request_path();
    test_wgmma_listed_iff_runs();
    run_child("--sticky-single", "sticky error on one stream: the job fails with 500, later jobs are right or 503 device_unavailable at once; the engine's messages reach the logging hook");
    run_child("--sticky-concurrent", "sticky error among 32 jobs on 4 streams: each right, 500 or 503; none hangs or is wrong");
    if (gemm_cuda_device_count() >= 2)
        run_child("--lost-registrations", "lost:2 resets device 0: the blocks it locked serve device 1 registered "
                  "there, and every answer is right");
    else
        tap_skip("fewer than two CUDA devices", "lost:2 and device 0's host registrations");
    return tap_done();
}
