/*
 * test_batch_gpu.c - batched and coalesced products on the CUDA backend, through the
 * engine interface, on poisoned outputs (0xFF: NaN for floats, a wrong int32), every
 * product checked against a host reference (float64 cblas / mod-2^32 loop):
 *   - batched jobs (b products in one job) for every dtype and every kernel that runs
 *     it, B per product and shared, b = 1, odd shapes and b = 2000; cublas reports
 *     "strided" (one cublasGemmStridedBatchedEx / cublasDgemmStridedBatched), our members
 *     "loop" (one launch per product, one H2D, one D2H);
 *   - dynamic batching: 1 stream, a long gpu_delay_ms-free gate product in flight while
 *     64 small products of 3 kinds are queued; they come back right, coalesced (batched > 1,
 *     mode "coalesced loop"), each with its own done(), and each C, kernel and block is
 *     what the same product gets when it runs alone;
 *   - groups of up to 200 products (several batched copy calls each way), each right;
 *     the same with every copy a call of its own (fault_inject copy_loop:1);
 *   - 16 threads submitting 64 mixed small products each to 4 streams with batch_max 32:
 *     every product right;
 *   - a group larger than device_mem_limit falls back to one product at a time;
 *   - products with a resident operand run alone: A crosses once, a kept C has its copy.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>

#include "backend.h"
#include "gpu_ref.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

typedef struct {
    gemm_job job;
    gemm_engine *e;
    int calls;
} bjob;

static void on_done(gemm_job *j)
{
    bjob *t = j->user;
    pthread_mutex_lock(&mu);
    t->calls++;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

static void wait_job(bjob *t)
{
    pthread_mutex_lock(&mu);
    while (t->calls < 1) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

static gemm_engine *open_cuda_cfg(int streams, int batch_max, uint64_t mem_limit, const char *faults)
{
    gemm_engine_config cfg;
    gemm_engine_config_defaults(&cfg);
    cfg.device_mem_limit = mem_limit;
    snprintf(cfg.fault_inject, sizeof cfg.fault_inject, "%s", faults);
    snprintf(cfg.backend, sizeof cfg.backend, "cuda");
    cfg.streams_per_device = streams;
    cfg.queue_depth = 4096;
    cfg.batch_max = batch_max;
    gemm_engine_err err;
    gemm_engine *e = gemm_engine_open(&cfg, &err);
    if (!e) printf("# open failed: %d %s\n", err.code, err.message);
    return e;
}

static gemm_engine *open_cuda(int streams, int batch_max)
{
    return open_cuda_cfg(streams, batch_max, 0, "");
}

static bjob *make(gemm_engine *e, gemm_dtype d, int nb, int shared, int m, int k, int n, const char *kernel,
                  uint64_t seed)
{
    bjob *t = calloc(1, sizeof *t);
    size_t es = gemm_dtype_size(d), bb = shared ? 1 : (size_t)nb;
    t->e = e;
    t->job.dtype = d;
    t->job.m = (uint64_t)m, t->job.k = (uint64_t)k, t->job.n = (uint64_t)n;
    t->job.batch = (uint64_t)nb;
    t->job.b_shared = shared;
    t->job.a = gemm_engine_host_alloc(e, (size_t)nb * m * k * es);
    t->job.b = gemm_engine_host_alloc(e, bb * k * n * es);
    t->job.c = gemm_engine_host_alloc(e, (size_t)nb * m * n * es);
    snprintf(t->job.kernel, sizeof t->job.kernel, "%s", kernel);
    t->job.done = on_done;
    t->job.user = t;
    ref_fill(d, t->job.a, (size_t)nb * m * k, seed);
    ref_fill(d, t->job.b, bb * k * n, seed + 99);
    ref_poison(t->job.c, (size_t)nb * m * n * es);
    return t;
}

static void release(bjob *t)
{
    gemm_engine_host_free(t->e, t->job.a);
    gemm_engine_host_free(t->e, t->job.b);
    gemm_engine_host_free(t->e, t->job.c);
    free(t);
}

/* Every product of the (batched) job right. */
static int correct(bjob *t, double *worst)
{
    gemm_job *j = &t->job;
    int m = (int)j->m, k = (int)j->k, n = (int)j->n;
    uint64_t nb = j->batch > 1 ? j->batch : 1;
    size_t es = gemm_dtype_size(j->dtype), nc = (size_t)m * n;
    double tol = j->dtype == GEMM_DTYPE_F64 ? 1e-12 : j->math_used == GEMM_MATH_TF32 ? 5e-3
               : j->math_used == GEMM_MATH_BF16 ? 3e-2 : 1e-5;
    *worst = 0;
    int ok = 1;
    for (uint64_t i = 0; i < nb; i++) {
        const char *a = (const char *)j->a + i * (size_t)m * k * es;
        const char *b = (const char *)j->b + (j->b_shared ? 0 : i * (size_t)k * n * es);
        const char *c = (const char *)j->c + i * nc * es;
        if (j->dtype == GEMM_DTYPE_I32) {
            uint32_t *ref = malloc(nc * sizeof *ref);
            ref_gemm_i32(a, b, ref, m, k, n);
            size_t bad = ref_mismatches_i32(c, ref, nc);
            free(ref);
            if (bad) ok = 0, *worst = (double)bad;
        } else {
            double *ref = malloc(nc * sizeof *ref);
            ref_gemm_f64(j->dtype, a, b, ref, m, k, n);
            double e = ref_rel_err(j->dtype, c, ref, nc);
            free(ref);
            if (e > *worst) *worst = e;
            if (!(e < tol)) ok = 0;
        }
    }
    return ok;
}

static void test_batched_jobs(void)
{
    gemm_engine *e = open_cuda(2, 1);
    if (!e) {
        tap(0, "open the CUDA engine");
        return;
    }
    static const int shapes[][4] = {{1, 5, 7, 3}, {3, 1, 1, 1}, {7, 33, 17, 65}, {4, 128, 64, 96},
                                    {2000, 8, 8, 8}, {16, 100, 300, 50}};
    static const struct { gemm_dtype d; const char *kernels[6]; } kinds[] = {
        {GEMM_DTYPE_F32, {"auto", "cublas", "naive", "tiled", "simt", "mma"}},
        {GEMM_DTYPE_F64, {"auto", "cublas", "naive", "tiled", "dmma", NULL}},
        {GEMM_DTYPE_I32, {"auto", "naive", "tiled", "simt", NULL, NULL}},
    };
    for (size_t kd = 0; kd < 3; kd++)
        for (int ki = 0; ki < 6 && kinds[kd].kernels[ki]; ki++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                for (int shared = 0; shared <= 1; shared++) {
                    const int *sh = shapes[s];
                    bjob *t = make(e, kinds[kd].d, sh[0], shared, sh[1], sh[2], sh[3], kinds[kd].kernels[ki],
                                   1000 + s * 10 + (uint64_t)shared);
                    gemm_engine_err err;
                    if (gemm_engine_submit(e, &t->job, &err) != 0) {
                        /* a member that cannot run this dtype/cc here: not a batch question */
                        tap_skip(err.message, "batched %s %s", gemm_dtype_name(kinds[kd].d),
                                 kinds[kd].kernels[ki]);
                        release(t);
                        continue;
                    }
                    wait_job(t);
                    double worst;
                    int st = atomic_load(&t->job.state);
                    int ok = st == GEMM_JOB_DONE && correct(t, &worst);
                    const char *want_mode = sh[0] > 1 ? (strcmp(t->job.kernel_used, "cublas") == 0 ? "strided" : "loop") : "";
                    ok = ok && strcmp(t->job.batch_mode, want_mode) == 0 &&
                         t->job.batched == (uint64_t)(sh[0] > 1 ? sh[0] : 0);
                    tap(ok, "batched %s kernel %s (%s) b=%d %dx%dx%d%s: every product right, mode \"%s\" (err %.3g%s%s)",
                        gemm_dtype_name(kinds[kd].d), kinds[kd].kernels[ki], t->job.kernel_used, sh[0], sh[1], sh[2],
                        sh[3], shared ? " shared B" : "", t->job.batch_mode, ok ? worst : -1,
                        st == GEMM_JOB_DONE ? "" : " ", st == GEMM_JOB_DONE ? "" : t->job.err.message);
                    release(t);
                }
    gemm_engine_close(e);
}

/* The same product as t (its A and B), submitted alone on e once nothing else runs: whether
 * it ran alone with the kernel, block and tile t reports, and C is t's to the bit. */
static int same_alone(gemm_engine *e, bjob *t)
{
    const gemm_job *j = &t->job;
    const size_t es = gemm_dtype_size(j->dtype);
    bjob *one = make(e, j->dtype, 1, 0, (int)j->m, (int)j->k, (int)j->n, j->kernel, 1);
    memcpy(one->job.a, j->a, j->m * j->k * es);
    memcpy(one->job.b, j->b, j->k * j->n * es);
    gemm_engine_err err;
    int same = gemm_engine_submit(e, &one->job, &err) == 0;
    if (same) {
        wait_job(one);
        same = atomic_load(&one->job.state) == GEMM_JOB_DONE && one->job.batched == 0 &&
               strcmp(one->job.kernel_used, j->kernel_used) == 0 && strcmp(one->job.block, j->block) == 0 &&
               one->job.tile_used == j->tile_used && memcmp(one->job.c, j->c, j->m * j->n * es) == 0;
    }
    release(one);
    return same;
}

/* One stream: a big product keeps the worker busy while 64 small ones queue. */
static void test_coalesced(void)
{
    gemm_engine *e = open_cuda(1, 32);
    if (!e) {
        tap(0, "open the CUDA engine");
        return;
    }
    bjob *big = make(e, GEMM_DTYPE_F64, 1, 0, 3072, 3072, 3072, "naive", 5);
    gemm_engine_err err;
    int ok = gemm_engine_submit(e, &big->job, &err) == 0;
    enum { N = 64 };
    bjob *t[N];
    static const char *kern[3] = {"cublas", "simt", "tiled"};
    for (int i = 0; i < N; i++) {
        gemm_dtype d = i % 3 == 0 ? GEMM_DTYPE_F32 : i % 3 == 1 ? GEMM_DTYPE_I32 : GEMM_DTYPE_F64;
        t[i] = make(e, d, 1, 0, 64, 64, 64, kern[i % 3], 200 + (uint64_t)i);
        ok = ok && gemm_engine_submit(e, &t[i]->job, &err) == 0;
    }
    tap(ok, "a long product and 64 small ones of 3 kinds queued on one stream");
    wait_job(big);
    int right = 0, coalesced = 0, modes = 1;
    for (int i = 0; i < N; i++) {
        wait_job(t[i]);
        double worst;
        right += atomic_load(&t[i]->job.state) == GEMM_JOB_DONE && correct(t[i], &worst) && t[i]->calls == 1;
        if (t[i]->job.batched > 1) {
            coalesced++;
            modes = modes && strcmp(t[i]->job.batch_mode, "coalesced loop") == 0;
        }
    }
    tap(right == N, "all 64 coalesced-or-not small products right, one done() each (%d right)", right);
    tap(coalesced > 0 && modes, "products queued behind a long one ran coalesced and say so (%d of %d)", coalesced,
        N);
    int same = 0;
    for (int i = 0; i < N; i++) same += same_alone(e, t[i]);
    tap(same == N, "each of the 64 has the kernel, block and bits it gets alone (%d of %d)", same, N);
    for (int i = 0; i < N; i++) release(t[i]);
    release(big);
    gemm_engine_close(e);
}

/* Groups far larger than one copy call's chunk (64 ranges: 32 products' A and B): 1
 * stream, batch_max 200, 150 float32 products of an odd shape (cuBLAS) and 70 int32 ones
 * (simt) queued behind a long product. Each group's A and B go to the device part by part
 * in several batched copy calls, and C comes back the same way into each product's own
 * block: every product right, one done() each, and groups of more than 32 formed. */
static void test_coalesced_large(const char *faults)
{
    gemm_engine *e = open_cuda_cfg(1, 200, 0, faults);
    if (!e) {
        tap(0, "open the CUDA engine (fault_inject \"%s\")", faults);
        return;
    }
    bjob *big = make(e, GEMM_DTYPE_F64, 1, 0, 3072, 3072, 3072, "naive", 7);
    gemm_engine_err err;
    int ok = gemm_engine_submit(e, &big->job, &err) == 0;
    enum { NF = 150, NI = 70, N = NF + NI };
    bjob *t[N];
    for (int i = 0; i < N; i++) {
        t[i] = i < NF ? make(e, GEMM_DTYPE_F32, 1, 0, 17, 9, 23, "cublas", 5000 + (uint64_t)i)
                      : make(e, GEMM_DTYPE_I32, 1, 0, 31, 33, 7, "simt", 6000 + (uint64_t)i);
        ok = ok && gemm_engine_submit(e, &t[i]->job, &err) == 0;
    }
    tap(ok, "a long product and %d small ones of 2 kinds queued on one stream", N);
    wait_job(big);
    int right = 0, largest = 0;
    for (int i = 0; i < N; i++) {
        wait_job(t[i]);
        double worst;
        right += atomic_load(&t[i]->job.state) == GEMM_JOB_DONE && correct(t[i], &worst) && t[i]->calls == 1;
        if ((int)t[i]->job.batched > largest) largest = (int)t[i]->job.batched;
    }
    tap(right == N, "all %d products of groups up to 200 right, one done() each (%d right)%s", N, right,
        faults[0] ? ", copies one call each (copy_loop:1)" : "");
    tap(largest > 32, "groups larger than one copy call's 32 products formed (largest %d)", largest);
    for (int i = 0; i < N; i++) release(t[i]);
    release(big);
    gemm_engine_close(e);
}

typedef struct {
    gemm_engine *e;
    int id, bad;
} sarg;

static void *storm(void *p)
{
    sarg *s = p;
    static const int shapes[][3] = {{64, 64, 64}, {32, 48, 16}, {128, 128, 128}, {5, 7, 3}};
    static const char *kern[4] = {"auto", "cublas", "simt", "tiled"};
    for (int r = 0; r < 8; r++) {
        bjob *t[8];
        for (int i = 0; i < 8; i++) {
            int x = s->id * 5 + r * 3 + i;
            gemm_dtype d = (gemm_dtype)(x % 3);
            const char *k = kern[x % 4];
            if (d == GEMM_DTYPE_I32 && strcmp(k, "cublas") == 0) k = "auto";
            const int *sh = shapes[x % 4];
            t[i] = make(s->e, d, 1, 0, sh[0], sh[1], sh[2], k, (uint64_t)(s->id * 100000 + r * 100 + i));
            gemm_engine_err err;
            while (gemm_engine_submit(s->e, &t[i]->job, &err) != 0) usleep(100);
        }
        for (int i = 0; i < 8; i++) {
            wait_job(t[i]);
            double w;
            if (atomic_load(&t[i]->job.state) != GEMM_JOB_DONE || !correct(t[i], &w) || t[i]->calls != 1) s->bad++;
            release(t[i]);
        }
    }
    return NULL;
}

static void test_storm(void)
{
    gemm_engine *e = open_cuda(4, 32);
    if (!e) {
        tap(0, "open the CUDA engine");
        return;
    }
    enum { T = 16 };
    pthread_t th[T];
    sarg a[T];
    for (int i = 0; i < T; i++) {
        a[i] = (sarg){e, i, 0};
        pthread_create(&th[i], NULL, storm, &a[i]);
    }
    int bad = 0;
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        bad += a[i].bad;
    }
    tap(bad == 0, "16 threads x 64 mixed small products, 4 streams, batch_max 32: all right (%d wrong)", bad);
    gemm_engine_close(e);
}

/* A group that does not fit device_mem_limit (3 MiB) where each product does (768 KiB):
 * the products run one by one instead, all right, none 507. Every kernel stage waits 50 ms
 * (gpu_delay_ms), so the 7 products behind the first are queued together. */
static void test_group_too_big(void)
{
    gemm_engine *e = open_cuda_cfg(1, 32, 3u << 20, "gpu_delay_ms:50");
    if (!e) {
        tap(0, "open the CUDA engine with device_mem_limit 3 MiB");
        return;
    }
    enum { N = 8 };
    bjob *t[N];
    gemm_engine_err err;
    int ok = 1;
    for (int i = 0; i < N; i++) {
        t[i] = make(e, GEMM_DTYPE_F32, 1, 0, 256, 256, 256, "cublas", 900 + (uint64_t)i);
        ok = ok && gemm_engine_submit(e, &t[i]->job, &err) == 0;
    }
    int right = 0;
    for (int i = 0; i < N; i++) {
        wait_job(t[i]);
        double w;
        right += atomic_load(&t[i]->job.state) == GEMM_JOB_DONE && correct(t[i], &w);
    }
    tap(ok && right == N, "a group over device_mem_limit runs its products one by one: %d of %d right", right, N);
    for (int i = 0; i < N; i++) release(t[i]);
    gemm_engine_close(e);
}

/* Products with a resident operand are not coalesced (they once were, as plain operands):
 * one stream, every kernel stage 50 ms long (gpu_delay_ms), a plain product holds the
 * worker while 6 small products queue behind it, A resident in all of them (one handle)
 * and C kept in the last. Each runs alone and right; A crosses to the device once (the
 * first of them makes its device copy), each B once; and the kept C has a device copy. */
static void test_resident_alone(void)
{
    gemm_engine *e = open_cuda_cfg(1, 32, 0, "gpu_delay_ms:50");
    if (!e) {
        tap(0, "open the CUDA engine with gpu_delay_ms:50");
        return;
    }
    enum { N = 6, D = 64 };
    const uint64_t mat = (uint64_t)D * D * 4;
    bjob *t[N];
    gemm_resident *ra = NULL, *rc = NULL;
    for (int i = 0; i < N; i++) {
        t[i] = make(e, GEMM_DTYPE_F32, 1, 0, D, D, D, "", 960 + (uint64_t)i);
        if (i == 0)
            ra = gemm_engine_resident_new(e, t[0]->job.a, mat);
        else
            memcpy(t[i]->job.a, t[0]->job.a, mat); /* one A for all */
        t[i]->job.a_res = ra;
    }
    t[N - 1]->job.c_res = rc = gemm_engine_resident_new(e, t[N - 1]->job.c, mat);
    gemm_engine_stats st;
    gemm_engine_get_stats(e, &st);
    const uint64_t h2d0 = st.bytes_h2d[0], res0 = st.resident_bytes[0];
    bjob *hold = make(e, GEMM_DTYPE_F32, 1, 0, D, D, D, "", 950); /* holds the worker 50 ms */
    gemm_engine_err err;
    int ok = gemm_engine_submit(e, &hold->job, &err) == 0;
    for (int i = 0; i < N; i++) ok = ok && gemm_engine_submit(e, &t[i]->job, &err) == 0;
    int right = 0, alone = 0;
    wait_job(hold);
    for (int i = 0; i < N; i++) {
        wait_job(t[i]);
        double w;
        right += atomic_load(&t[i]->job.state) == GEMM_JOB_DONE && correct(t[i], &w);
        alone += t[i]->job.batched == 0;
    }
    gemm_engine_get_stats(e, &st);
    const uint64_t h2d = st.bytes_h2d[0] - h2d0, res = st.resident_bytes[0] - res0;
    const uint64_t want = 2 * mat /* hold's A and B */ + mat /* A, once */ + N * mat /* each B */;
    tap(ok && right == N && alone == N && h2d == want && res == 2 * mat,
        "resident operands are not coalesced: %d of %d right, %d alone, %llu bytes to the device (want %llu), "
        "device copies +%llu bytes (want A and the kept C, %llu)", right, N, alone, (unsigned long long)h2d,
        (unsigned long long)want, (unsigned long long)res, (unsigned long long)(2 * mat));
    gemm_engine_resident_free(e, ra); /* the engine frees the device copies */
    gemm_engine_resident_free(e, rc);
    release(hold);
    for (int i = 0; i < N; i++) release(t[i]);
    gemm_engine_close(e);
}

int main(void)
{
    if (gemm_cuda_device_count() == 0) {
        tap_skip("no CUDA device", "batched and coalesced products on CUDA");
        return tap_done();
    }
    test_batched_jobs();
    test_coalesced();
    test_coalesced_large("");
    test_coalesced_large("copy_loop:1");
    test_storm();
    test_group_too_big();
    test_resident_alone();
    return tap_done();
}
