/*
 * test_split_gpu.c - split products on the CUDA backend: one product cut into row panels of
 * A (each with the whole B) that run on several streams of one GPU (split_ways 2: one GPU
 * as two engines) or on several GPUs (split_ways 0: one panel per device, when the host
 * has more than one), answered as one product.
 *
 * For each kernel, pinned by name (and kernel auto, which the engine resolves once for the
 * whole shape and pins on every panel), the split product is checked against a float64
 * host reference (int32: exact mod 2^32) and against the same product run whole on an
 * engine that does not split, byte for byte: every panel chooses its block, its k split
 * and cuBLAS's algorithm as for the whole product (gemm_job.plan_m), so a row cannot
 * depend on the rows run with it. The same holds for panels submitted as products of
 * their own with plan_m (a client's parallel requests with panel_of), in 3 to 16 panels,
 * including the shapes where cuBLAS or kernel auto would choose otherwise for a panel.
 * Then: many split products at once on four streams, every one right; a cancel of a
 * running split product (gpu_delay_ms hook) stops every panel and ends it CANCELLED once;
 * and, on a host with two or more GPUs, panels on distinct devices.
 *
 * Run on a GPU host: make test (or build/tests/gpu/test_split_gpu directly).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "backend.h"
#include "gemm_half.h"
#include "gpu_ref.h"


static gemm_engine *open_cuda(int ways, uint64_t min_mnk, const char *faults)
{
    gemm_engine_config cfg;
    gemm_engine_config_defaults(&cfg);
    snprintf(cfg.backend, sizeof cfg.backend, "cuda");
    cfg.streams_per_device = 4;
    cfg.queue_depth = 256;
    cfg.split_ways = ways;
    cfg.split_min_mnk = min_mnk;
    snprintf(cfg.fault_inject, sizeof cfg.fault_inject, "%s", faults);
    gemm_engine_err err;
    gemm_engine *e = gemm_engine_open(&cfg, &err);
    if (!e) printf("# open failed: %d %s\n", err.code, err.message);
    return e;
}

typedef struct {
    gemm_dtype dtype;
    gemm_math math;
    const char *kernel; /* "auto" or a member */
    int tile;
    int m, k, n;
} scase;

/* Same inputs for both engines: a, b filled once; c per engine. */
static void setup(gemm_engine *e, gemm_job *j, const scase *c, void *a, void *b)
{
    memset(j, 0, sizeof *j);
    size_t es = gemm_dtype_size(c->dtype);
    j->dtype = c->dtype;
    j->m = (uint64_t)c->m, j->k = (uint64_t)c->k, j->n = (uint64_t)c->n;
    j->a = a;
    j->b = b;
    j->c = gemm_engine_host_alloc(e, (size_t)c->m * c->n * es);
    ref_poison(j->c, (size_t)c->m * c->n * es);
    snprintf(j->kernel, sizeof j->kernel, "%s", c->kernel);
    j->tile = c->tile;
    j->math = c->math;
    j->done = gpu_on_done;
}

static int run_sync(gemm_engine *e, gemm_job *j)
{
    int target = gpu_done_count() + 1;
    gemm_engine_err err;
    if (gemm_engine_submit(e, j, &err) != 0) {
        printf("# submit: %d %s\n", err.code, err.message);
        return -1;
    }
    gpu_wait_done(target);
    return atomic_load(&j->state) == GEMM_JOB_DONE ? 0 : -1;
}

static double tolerance(const gemm_job *j)
{
    return j->dtype == GEMM_DTYPE_F64 ? 1e-12
           : j->math_used == GEMM_MATH_TF32 ? 5e-3
           : j->math_used == GEMM_MATH_BF16 ? 3e-2 : 1e-5;
}

static int correct(const gemm_job *j, const double *ref, const uint32_t *ref_i)
{
    size_t nc = (size_t)j->m * j->n;
    if (j->dtype == GEMM_DTYPE_I32) return ref_mismatches_i32(j->c, ref_i, nc) == 0;
    return ref_rel_err(j->dtype, j->c, ref, nc) < tolerance(j);
}

/* Every panel chooses its block, its k split and cuBLAS's algorithm as for the whole
 * product (gemm_job.plan_m): the rows come out as the whole product's, to the bit, for
 * every kernel. The blocks the panels report must then be the whole product's too. */
static int same_blocks(const gemm_job *split, const gemm_job *whole)
{
    for (int i = 0; i < split->split_panels; i++)
        if (strcmp(split->split[i].block, whole->block) != 0) return 0;
    return 1;
}

static int kernel_listed(const gemm_engine_info *info, const char *name)
{
    for (int i = 0; i < info->nkernels; i++)
        if (strcmp(info->kernels[i].name, name) == 0) return 1;
    return 0;
}

/* A case for a kernel this device or build lacks is skipped, and says so: 1 then. */
static int skip_unlisted(const gemm_engine_info *info, const char *kernel, const char *name)
{
    if (strcmp(kernel, "auto") == 0 || kernel_listed(info, kernel)) return 0;
    tap_skip("kernel not listed for this device or build", "%s", name);
    return 1;
}

static void test_equal_to_whole(void)
{
    gemm_engine *esp = open_cuda(2, 1, ""), *ewh = open_cuda(1, 0, "");
    tap(esp && ewh, "cuda engines open: split_ways 2 (one GPU as two engines) and not split");
    if (!esp || !ewh) {
        gemm_engine_close(esp);
        gemm_engine_close(ewh);
        return;
    }
    gemm_engine_info info;
    gemm_engine_describe(esp, &info);
    static const scase cases[] = {
        {GEMM_DTYPE_F32, GEMM_MATH_FP32, "naive", 0, 301, 257, 129},
        {GEMM_DTYPE_F32, GEMM_MATH_FP32, "tiled", 16, 513, 300, 257},
        {GEMM_DTYPE_F32, GEMM_MATH_FP32, "tiled", 32, 1001, 129, 255},
        {GEMM_DTYPE_F32, GEMM_MATH_FP32, "simt", 64, 1001, 513, 769},
        {GEMM_DTYPE_F32, GEMM_MATH_FP32, "simt", 128, 2049, 1000, 1023},
        {GEMM_DTYPE_F32, GEMM_MATH_FP32, "simt", 0, 4097, 1024, 4095},
        {GEMM_DTYPE_F32, GEMM_MATH_FP32, "simt", 0, 255, 4096, 255}, /* deep: split-k likely */
        {GEMM_DTYPE_F32, GEMM_MATH_FP32, "cublas", 0, 2047, 1024, 2049},
        {GEMM_DTYPE_F32, GEMM_MATH_FP32, "auto", 0, 4097, 1024, 4096},
        {GEMM_DTYPE_F32, GEMM_MATH_TF32, "mma", 0, 1999, 512, 1001},
        {GEMM_DTYPE_F32, GEMM_MATH_BF16, "mma", 128, 2001, 768, 2000},
        {GEMM_DTYPE_F32, GEMM_MATH_BF16, "wgmma", 0, 4097, 1024, 4095},
        {GEMM_DTYPE_F32, GEMM_MATH_TF32, "auto", 0, 4096, 1024, 4096},
        {GEMM_DTYPE_F64, GEMM_MATH_DEFAULT, "dmma", 0, 777, 333, 555},
        {GEMM_DTYPE_F64, GEMM_MATH_DEFAULT, "simt", 64, 1001, 257, 513},
        {GEMM_DTYPE_F64, GEMM_MATH_DEFAULT, "cublas", 0, 1025, 512, 1023},
        {GEMM_DTYPE_I32, GEMM_MATH_DEFAULT, "naive", 0, 255, 129, 65},
        {GEMM_DTYPE_I32, GEMM_MATH_DEFAULT, "tiled", 16, 999, 300, 501},
        {GEMM_DTYPE_I32, GEMM_MATH_DEFAULT, "simt", 0, 2049, 1024, 2047},
        {GEMM_DTYPE_I32, GEMM_MATH_DEFAULT, "auto", 0, 3001, 512, 999},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const scase *c = &cases[ci];
        char name[160];
        snprintf(name, sizeof name, "%s %s kernel %s tile %d %dx%dx%d", gemm_dtype_name(c->dtype),
                 gemm_math_name(c->math), c->kernel, c->tile, c->m, c->k, c->n);
        if (skip_unlisted(&info, c->kernel, name)) continue;
        size_t es = gemm_dtype_size(c->dtype);
        size_t abytes = (size_t)c->m * c->k * es, bbytes = (size_t)c->k * c->n * es;
        /* the same inputs in each engine's own host blocks */
        void *a = gemm_engine_host_alloc(esp, abytes), *b = gemm_engine_host_alloc(esp, bbytes);
        void *a2 = gemm_engine_host_alloc(ewh, abytes), *b2 = gemm_engine_host_alloc(ewh, bbytes);
        ref_fill(c->dtype, a, (size_t)c->m * c->k, 500 + ci);
        ref_fill(c->dtype, b, (size_t)c->k * c->n, 900 + ci);
        memcpy(a2, a, abytes);
        memcpy(b2, b, bbytes);
        gemm_job js, jw;
        setup(esp, &js, c, a, b);
        setup(ewh, &jw, c, a2, b2);
        int rs = run_sync(esp, &js), rw = run_sync(ewh, &jw);
        tap(rs == 0 && rw == 0, "%s: split and whole both ran (%s / %s)", name, rs ? js.err.message : "ok",
            rw ? jw.err.message : "ok");
        if (rs == 0 && rw == 0) {
            tap(js.split_panels == 2 && jw.split_panels == 0 && js.split[0].rows + js.split[1].rows == js.m &&
                    js.split[0].rows == (js.m + 1) / 2,
                "%s: ran as 2 panels of %llu and %llu rows", name, (unsigned long long)js.split[0].rows,
                (unsigned long long)js.split[1].rows);
            tap(strcmp(js.kernel_used, jw.kernel_used) == 0 && js.math_used == jw.math_used,
                "%s: every panel ran the kernel resolved for the whole product (%s)", name, jw.kernel_used);
            size_t nc = (size_t)c->m * c->n;
            double *ref = NULL;
            uint32_t *ref_i = NULL;
            if (c->dtype == GEMM_DTYPE_I32) {
                ref_i = malloc(nc * sizeof *ref_i);
                ref_gemm_i32(a, b, ref_i, c->m, c->k, c->n);
            } else {
                ref = malloc(nc * sizeof *ref);
                ref_gemm_f64(c->dtype, a, b, ref, c->m, c->k, c->n);
            }
            tap(correct(&js, ref, ref_i), "%s: split result right against the host reference", name);
            tap(correct(&jw, ref, ref_i), "%s: whole result right against the host reference", name);
            int same = memcmp(js.c, jw.c, nc * es) == 0;
            tap(same_blocks(&js, &jw), "%s: the panels ran the whole product's block (%s | %s, whole %s)", name,
                js.split[0].block, js.split[1].block, jw.block);
            tap(same, "%s: split equals whole byte for byte", name);
            free(ref);
            free(ref_i);
        }
        gemm_engine_host_free(esp, js.c);
        gemm_engine_host_free(ewh, jw.c);
        gemm_engine_host_free(esp, a);
        gemm_engine_host_free(esp, b);
        gemm_engine_host_free(ewh, a2);
        gemm_engine_host_free(ewh, b2);
    }
    gemm_engine_stats st;
    gemm_engine_get_stats(esp, &st);
    tap(st.split_panels == 2 * st.split_products && st.failed == 0, "counters: %llu split products, %llu panels",
        (unsigned long long)st.split_products, (unsigned long long)st.split_panels);
    gemm_engine_close(esp);
    gemm_engine_close(ewh);
}

/* Many split products at once on 4 streams: every one right, each done() once. */
static void test_concurrent(void)
{
    gemm_engine *e = open_cuda(2, 1, "");
    if (!e) {
        tap(0, "concurrent: engine opens");
        return;
    }
    enum { N = 24 };
    gemm_job jobs[N];
    void *as[N], *bs[N];
    static const char *kernels[] = {"auto", "simt", "tiled", "naive"};
    int start = gpu_done_count(), submitted = 0;
    for (int i = 0; i < N; i++) {
        scase c = {i % 3 == 0 ? GEMM_DTYPE_F32 : i % 3 == 1 ? GEMM_DTYPE_F64 : GEMM_DTYPE_I32,
                   GEMM_MATH_DEFAULT, kernels[i % 4], 0, 100 + 37 * i, 64 + 9 * i, 90 + 13 * i};
        size_t es = gemm_dtype_size(c.dtype);
        as[i] = gemm_engine_host_alloc(e, (size_t)c.m * c.k * es);
        bs[i] = gemm_engine_host_alloc(e, (size_t)c.k * c.n * es);
        ref_fill(c.dtype, as[i], (size_t)c.m * c.k, 3000 + (uint64_t)i);
        ref_fill(c.dtype, bs[i], (size_t)c.k * c.n, 4000 + (uint64_t)i);
        setup(e, &jobs[i], &c, as[i], bs[i]);
        gemm_engine_err err;
        if (gemm_engine_submit(e, &jobs[i], &err) == 0) submitted++;
        else printf("# submit %d: %s\n", i, err.message);
    }
    gpu_wait_done(start + submitted);
    int right = 0, split = 0;
    for (int i = 0; i < N; i++) {
        gemm_job *j = &jobs[i];
        size_t nc = (size_t)j->m * j->n;
        double *ref = NULL;
        uint32_t *ref_i = NULL;
        if (j->dtype == GEMM_DTYPE_I32) {
            ref_i = malloc(nc * sizeof *ref_i);
            ref_gemm_i32(j->a, j->b, ref_i, (int)j->m, (int)j->k, (int)j->n);
        } else {
            ref = malloc(nc * sizeof *ref);
            ref_gemm_f64(j->dtype, j->a, j->b, ref, (int)j->m, (int)j->k, (int)j->n);
        }
        right += atomic_load(&j->state) == GEMM_JOB_DONE && correct(j, ref, ref_i);
        split += j->split_panels == 2;
        free(ref);
        free(ref_i);
    }
    tap(submitted == N && right == N && split == N, "concurrent: %d split products on 4 streams, %d right, %d split",
        N, right, split);
    tap(gpu_done_count() == start + submitted, "concurrent: each done() once");
    for (int i = 0; i < N; i++) {
        gemm_engine_host_free(e, jobs[i].c);
        gemm_engine_host_free(e, as[i]);
        gemm_engine_host_free(e, bs[i]);
    }
    gemm_engine_close(e);
}

/* A cancel of a running split product (each panel's kernel stage starts with 1 s of device
 * waiting, so it runs stage by stage) stops every panel: CANCELLED, 409, once. */
static void test_cancel(void)
{
    gemm_engine *e = open_cuda(2, 1, "gpu_delay_ms:1000");
    if (!e) {
        tap(0, "cancel: engine opens");
        return;
    }
    scase c = {GEMM_DTYPE_F32, GEMM_MATH_DEFAULT, "simt", 0, 1024, 512, 1024};
    void *a = gemm_engine_host_alloc(e, 1024 * 512 * 4), *b = gemm_engine_host_alloc(e, 512 * 1024 * 4);
    ref_fill(c.dtype, a, 1024 * 512, 1);
    ref_fill(c.dtype, b, 512 * 1024, 2);
    gemm_job j;
    setup(e, &j, &c, a, b);
    int start = gpu_done_count();
    gemm_engine_err err;
    int rc = gemm_engine_submit(e, &j, &err);
    gemm_engine_stats st;
    do {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
        gemm_engine_get_stats(e, &st);
    } while (rc == 0 && st.split_products < 1);
    gemm_engine_cancel(e, &j);
    if (rc == 0) gpu_wait_done(start + 1);
    tap(rc == 0 && atomic_load(&j.state) == GEMM_JOB_CANCELLED && j.err.code == GEMM_E_CANCELLED,
        "cancel: a running split product ends CANCELLED with 409 (%s)", j.err.message);
    tap(gpu_done_count() == start + 1, "cancel: done() once");
    gemm_engine_host_free(e, j.c);
    gemm_engine_host_free(e, a);
    gemm_engine_host_free(e, b);
    gemm_engine_close(e);
}

/* Several GPUs: split_ways 0 gives one panel per device, each on its own device. */
static void test_devices(void)
{
    gemm_engine *e = open_cuda(0, 1, "");
    if (!e) {
        tap(0, "devices: engine opens");
        return;
    }
    gemm_engine_info info;
    gemm_engine_describe(e, &info);
    if (info.ndevices < 2) {
        tap_skip("one CUDA device on this host", "one panel per GPU on distinct GPUs");
        gemm_engine_close(e);
        return;
    }
    scase c = {GEMM_DTYPE_F32, GEMM_MATH_DEFAULT, "auto", 0, 4099, 1024, 2048};
    void *a = gemm_engine_host_alloc(e, (size_t)c.m * c.k * 4), *b = gemm_engine_host_alloc(e, (size_t)c.k * c.n * 4);
    ref_fill(c.dtype, a, (size_t)c.m * c.k, 11);
    ref_fill(c.dtype, b, (size_t)c.k * c.n, 12);
    gemm_job j;
    setup(e, &j, &c, a, b);
    int ok = run_sync(e, &j) == 0 && j.split_panels == info.ndevices;
    for (int p = 0; ok && p < j.split_panels; p++)
        for (int q = p + 1; q < j.split_panels; q++)
            if (strcmp(j.split[p].device, j.split[q].device) == 0) ok = 0;
    double *ref = malloc((size_t)c.m * c.n * sizeof *ref);
    ref_gemm_f64(c.dtype, a, b, ref, c.m, c.k, c.n);
    tap(ok && correct(&j, ref, NULL), "devices: %d panels on %d distinct GPUs, right", j.split_panels, info.ndevices);
    free(ref);
    gemm_engine_host_free(e, j.c);
    gemm_engine_host_free(e, a);
    gemm_engine_host_free(e, b);
    gemm_engine_close(e);
}

/* ---- panels as separate products (what a client's parallel requests are) ---- */

typedef struct {
    gemm_dtype dtype;
    gemm_math math;
    const char *kernel;
    int m, k, n;
    int panels;
} pcase;

/* Inputs in [-1, 1): float32 / float64 by ref_fill, half types rounded from float32. */
static void fill_any(gemm_dtype d, void *p, size_t n, uint64_t seed)
{
    if (!gemm_dtype_is_half(d)) {
        ref_fill(d, p, n, seed);
        return;
    }
    float *f = malloc(n * sizeof *f);
    ref_fill(GEMM_DTYPE_F32, f, n, seed);
    uint16_t *h = p;
    for (size_t i = 0; i < n; i++) h[i] = d == GEMM_DTYPE_F16 ? gemm_f32_to_f16(f[i]) : gemm_f32_to_bf16(f[i]);
    free(f);
}

static double elem(gemm_dtype d, const void *p, size_t i)
{
    switch (d) {
    case GEMM_DTYPE_F64: return ((const double *)p)[i];
    case GEMM_DTYPE_F16: return gemm_f16_to_f32(((const uint16_t *)p)[i]);
    case GEMM_DTYPE_BF16: return gemm_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

/* 97 elements of C (float32 or float64) against a float64 dot product of the inputs. */
static int sampled_right(const pcase *c, const void *a, const void *b, const void *cc, gemm_dtype cd, double tol)
{
    uint64_t s = 77;
    for (int t = 0; t < 97; t++) {
        size_t i = (size_t)(ref_next(&s) % (uint64_t)c->m), j = (size_t)(ref_next(&s) % (uint64_t)c->n);
        double ref = 0, mag = 0;
        for (size_t p = 0; p < (size_t)c->k; p++) {
            double x = elem(c->dtype, a, i * (size_t)c->k + p) * elem(c->dtype, b, p * (size_t)c->n + j);
            ref += x;
            mag += fabs(x);
        }
        double got = elem(cd, cc, i * (size_t)c->n + j);
        if (!(fabs(got - ref) <= tol * (mag > 1 ? mag : 1))) {
            printf("# C[%zu][%zu] = %.9g, reference %.9g\n", i, j, got, ref);
            return 0;
        }
    }
    return 1;
}

/* A product run whole, then as P separate products of its row panels, each with plan_m =
 * the whole m (the panel_of of a request): every panel must give the whole product's rows
 * byte for byte, whichever kernel auto picks for the whole shape and whatever cuBLAS's
 * heuristics would pick for a panel's own shape. */
static void test_panels_as_whole(void)
{
    gemm_engine *e = open_cuda(1, 0, "");
    tap(e != NULL, "panels: engine opens (no split)");
    if (!e) return;
    gemm_engine_info info;
    gemm_engine_describe(e, &info);
    static const pcase cases[] = {
        {GEMM_DTYPE_F32, GEMM_MATH_DEFAULT, "auto", 4096, 4096, 4096, 8},
        {GEMM_DTYPE_F32, GEMM_MATH_DEFAULT, "auto", 4096, 4096, 4096, 16},
        {GEMM_DTYPE_F32, GEMM_MATH_DEFAULT, "auto", 4096, 4096, 4096, 3},
        {GEMM_DTYPE_F32, GEMM_MATH_FP32, "cublas", 2047, 1024, 2049, 8},
        {GEMM_DTYPE_F32, GEMM_MATH_FP32, "cublas", 3000, 700, 5000, 7},
        {GEMM_DTYPE_F32, GEMM_MATH_TF32, "auto", 4096, 1024, 4096, 8},
        {GEMM_DTYPE_F32, GEMM_MATH_BF16, "auto", 4096, 4096, 4096, 16},
        {GEMM_DTYPE_BF16, GEMM_MATH_DEFAULT, "auto", 4096, 4096, 4096, 8},
        {GEMM_DTYPE_F16, GEMM_MATH_DEFAULT, "auto", 2048, 2048, 2048, 16},
        {GEMM_DTYPE_F64, GEMM_MATH_DEFAULT, "auto", 1025, 512, 1023, 5},
        {GEMM_DTYPE_F32, GEMM_MATH_FP32, "simt", 255, 4096, 255, 4},
        {GEMM_DTYPE_F32, GEMM_MATH_FP32, "simt", 4097, 1024, 4095, 9},
        {GEMM_DTYPE_F32, GEMM_MATH_TF32, "mma", 1999, 512, 1001, 7},
        {GEMM_DTYPE_F64, GEMM_MATH_DEFAULT, "dmma", 2049, 333, 2055, 3},
        {GEMM_DTYPE_F32, GEMM_MATH_DEFAULT, "auto", 512, 512, 512, 8},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const pcase *c = &cases[ci];
        char name[160];
        snprintf(name, sizeof name, "panels: %s %s kernel %s %dx%dx%d in %d", gemm_dtype_name(c->dtype),
                 gemm_math_name(c->math), c->kernel, c->m, c->k, c->n, c->panels);
        if (skip_unlisted(&info, c->kernel, name)) continue;
        const size_t es = gemm_dtype_size(c->dtype);
        const gemm_dtype cd = gemm_dtype_is_half(c->dtype) ? GEMM_DTYPE_F32 : c->dtype;
        const size_t ces = gemm_dtype_size(cd);
        void *a = gemm_engine_host_alloc(e, (size_t)c->m * c->k * es), *b = gemm_engine_host_alloc(e, (size_t)c->k * c->n * es);
        fill_any(c->dtype, a, (size_t)c->m * c->k, 300 + ci);
        fill_any(c->dtype, b, (size_t)c->k * c->n, 700 + ci);
        gemm_job whole;
        memset(&whole, 0, sizeof whole);
        whole.dtype = c->dtype;
        whole.m = (uint64_t)c->m, whole.k = (uint64_t)c->k, whole.n = (uint64_t)c->n;
        whole.a = a, whole.b = b;
        whole.c = gemm_engine_host_alloc(e, (size_t)c->m * c->n * ces);
        ref_poison(whole.c, (size_t)c->m * c->n * ces);
        snprintf(whole.kernel, sizeof whole.kernel, "%s", c->kernel);
        whole.math = c->math;
        whole.done = gpu_on_done;
        int ok = run_sync(e, &whole) == 0;
        tap(ok, "%s: whole ran (%s, block %s)", name, ok ? whole.kernel_used : whole.err.message, whole.block);
        /* of the sum of |a_ip b_pj|: float32 sums, and tf32 / bf16 inputs rounded */
        const double tol = c->dtype == GEMM_DTYPE_F64 ? 1e-12
                           : whole.math_used == GEMM_MATH_TF32 ? 2e-3
                           : whole.math_used == GEMM_MATH_BF16 ? 1e-2 : 1e-4;
        if (ok) tap(sampled_right(c, a, b, whole.c, cd, tol), "%s: whole right at 97 elements against float64", name);
        int row = 0, equal = ok, kernels_same = ok, blocks_same = ok;
        for (int p = 0; ok && p < c->panels; p++) {
            int rows = c->m / c->panels + (p < c->m % c->panels ? 1 : 0);
            gemm_job pj;
            memset(&pj, 0, sizeof pj);
            pj = whole;
            memset(&pj.err, 0, sizeof pj.err);
            pj.m = (uint64_t)rows;
            pj.plan_m = (uint64_t)c->m;
            pj.a = gemm_engine_host_alloc(e, (size_t)rows * c->k * es);
            pj.c = gemm_engine_host_alloc(e, (size_t)rows * c->n * ces);
            memcpy(pj.a, (const char *)a + (size_t)row * c->k * es, (size_t)rows * c->k * es);
            ref_poison(pj.c, (size_t)rows * c->n * ces);
            snprintf(pj.kernel, sizeof pj.kernel, "%s", c->kernel);
            if (run_sync(e, &pj) != 0) {
                tap(0, "%s: panel %d ran (%s)", name, p, pj.err.message);
                ok = 0;
            } else {
                if (memcmp(pj.c, (const char *)whole.c + (size_t)row * c->n * ces, (size_t)rows * c->n * ces) != 0)
                    equal = 0;
                if (strcmp(pj.kernel_used, whole.kernel_used) != 0) kernels_same = 0;
                if (strcmp(pj.block, whole.block) != 0) {
                    printf("# panel %d ran block %s, whole %s\n", p, pj.block, whole.block);
                    blocks_same = 0;
                }
            }
            gemm_engine_host_free(e, pj.a);
            gemm_engine_host_free(e, pj.c);
            row += rows;
        }
        if (ok) {
            tap(kernels_same, "%s: every panel ran the whole product's kernel (%s)", name, whole.kernel_used);
            tap(blocks_same, "%s: every panel ran the whole product's block (%s)", name, whole.block);
            tap(equal, "%s: the panels equal the whole product byte for byte", name);
        }
        gemm_engine_host_free(e, whole.c);
        gemm_engine_host_free(e, a);
        gemm_engine_host_free(e, b);
    }
    /* panel_of below m, or on a batch, is refused at submit */
    gemm_job bad;
    memset(&bad, 0, sizeof bad);
    bad.dtype = GEMM_DTYPE_F32;
    bad.m = 8, bad.k = 8, bad.n = 8, bad.plan_m = 7;
    bad.a = gemm_engine_host_alloc(e, 256), bad.b = gemm_engine_host_alloc(e, 256), bad.c = gemm_engine_host_alloc(e, 256);
    bad.done = gpu_on_done;
    gemm_engine_err err;
    tap(gemm_engine_submit(e, &bad, &err) != 0 && err.code == GEMM_E_BAD_OPTION, "panels: plan_m below m is refused (%s)",
        err.message);
    bad.plan_m = 16, bad.batch = 2;
    gemm_engine_host_free(e, bad.a);
    gemm_engine_host_free(e, bad.c);
    bad.a = gemm_engine_host_alloc(e, 512), bad.c = gemm_engine_host_alloc(e, 512);
    tap(gemm_engine_submit(e, &bad, &err) != 0 && err.code == GEMM_E_BAD_OPTION, "panels: plan_m on a batch is refused (%s)",
        err.message);
    gemm_engine_host_free(e, bad.a);
    gemm_engine_host_free(e, bad.b);
    gemm_engine_host_free(e, bad.c);
    gemm_engine_close(e);
}

int main(void)
{
    if (gemm_cuda_device_count() == 0) {
        tap_skip("no CUDA device", "split products on CUDA");
        return tap_done();
    }
    test_equal_to_whole();
    test_panels_as_whole();
    test_concurrent();
    test_cancel();
    test_devices();
    return tap_done();
}
