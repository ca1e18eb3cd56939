/*
 * engine.h - the compute engine: one asynchronous interface, backends behind it.
 *
 *   gemm_engine *e = gemm_engine_open(&cfg, &err);     // backend auto | cpu | cuda
 *   job->a = gemm_engine_host_alloc(e, bytes) ...      // inputs/outputs live in engine memory
 *   gemm_engine_submit(e, job, &err);                  // never blocks on compute
 *   ...  job->done(job) is called exactly once, from an engine thread ...
 *   gemm_engine_close(e);                              // drains, calls every pending done()
 *
 * The generic part (engine.c) owns the bounded queue, the worker threads, cancellation
 * and the queue timing; a backend (cpu.c, cuda/engine_cuda.c) only says how many workers
 * it wants and how one worker runs one job synchronously. The engine never frees a job:
 * the submitter owns it and may free it once done() has been called.
 *
 * Threads: submit, cancel, describe, get_stats, ready, healthy, host_alloc and host_free
 * are called from the daemon's HTTP threads and never wait on a device or make a CUDA
 * call (the CUDA backend reads what it measured at open, on its workers or on its
 * housekeeping thread). Messages go through the logging hook of gemm_log.h.
 */
#ifndef GEMM_ENGINE_H
#define GEMM_ENGINE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "gemm_log.h"
#include "gemm_types.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GEMM_MAX_DEVICES 16
#define GEMM_MAX_KERNELS 32
#define GEMM_NAME_LEN 48

/* ---- configuration (filled from config/gemmd.conf, GEMMD_* and flags) ---- */

typedef struct {
    char backend[8];           /* "auto", "cpu" or "cuda" */
    int threads;               /* CPU backend: BLAS / int32 loop threads (0 = all cores) */
    int cpu_workers;           /* CPU backend: jobs run at once (0 = 1) */
    int queue_depth;           /* jobs waiting (not running) before submit says 503 */
    char devices[128];         /* CUDA: "all" or a comma list of ordinals (after CUDA_VISIBLE_DEVICES) */
    int streams_per_device;    /* CUDA: streams (and worker threads) per device, default 4 */
    uint64_t device_mem_limit; /* CUDA: bytes of cached device buffers per stream (0 = no limit) */
    int wait_spin_us;          /* CUDA: a worker polls its product's event this long before it
                                  sleeps on it (default 50; 0 = sleep at once) */
    int worker_spin_us;        /* a worker that has just finished polls for the next job this
                                  long before it sleeps (0 = sleep at once; the daemon's
                                  worker_spin_us) */
    uint64_t host_cache_bytes; /* CUDA: page-locked host blocks kept for reuse after their
                                  owner freed them (0 or more than 1 GiB: 1 GiB); memory the
                                  daemon's budget no longer counts, so it bounds it */
    char fault_inject[64];     /* test hook: "" or e.g. "oom:3" / "sticky:5" (backend-defined) */
    /* Dynamic batching: a worker that takes a small product (m*n*k <= batch_max_mnk, not
     * itself batched) also takes the queued products of the same dtype, math, kernel, tile
     * and shape, up to batch_max in all, and runs them as one batched job (one gathered
     * H2D, one launch, one scattered D2H on CUDA). */
    int batch_max;             /* products per coalesced launch; 0 = the backend's default
                                  (CUDA 32, CPU 1 = off), 1 = off, at most GEMM_COALESCE_MAX */
    int batch_max_delay_us;    /* how long a worker waits for more of its group (0 = only what
                                  is queued already) */
    uint64_t batch_max_mnk;    /* what counts as small (default 2^24 = 256^3) */
    /* CUDA: a float32 product of m*n*k up to this (default 2^18 = 64^3; 0 = never) that runs
     * alone, with kernel auto, on a device with no other product inside, skips the copies:
     * its kernel reads A and B from their page-locked host blocks and writes C into its own
     * (zero copy). */
    uint64_t zero_copy_mnk;
    /* A product too small for a GPU to pay: float32 (math default or fp32), float64 or
     * int32, kernel auto, no tile, no resident operand, not a panel, with batch*m*n*k up to
     * host_max_mnk (0 = never; at most GEMM_HOST_MAX_MNK), submitted with
     * gemm_engine_submit_here, is computed on the submitting thread by the host (OpenBLAS
     * or the int32 loop, one thread), whatever is queued: no queue, no worker, no device,
     * no copies. Its result says so (device "cpu", kernel "openblas" or "blocked").
     * Applies to a GPU backend only (the CPU backend has its own workers and direct run),
     * and never while fault_inject is set (the hooks count the backend's runs). With it
     * on, the engine sets OpenBLAS to one thread for the process (a GPU engine has no
     * other use for it). Default 0 here; the daemon's host_max_mnk turns it on. */
    uint64_t host_max_mnk;
    /* CUDA: before it takes its first job, each worker runs a few small products of every
     * dtype on its own stream (single and batched), so that what a first product would pay
     * once (loading kernel modules, cuBLAS setting itself up) is paid at start, not by the
     * first requests. Not counted in any statistic; skipped when fault_inject is set (the
     * hooks count products). With warmup set, gemm_engine_open returns once every worker
     * is set up and warm (on the CPU backend: at once). Default 0 here; the daemon turns it
     * on (config key warmup). */
    int warmup;
    /* Split products: a single product with m*n*k >= split_min_mnk (0 = never split) is cut
     * into row panels of A (each with the whole B), run as separate panels by whichever
     * workers take them, and answered as one product. split_ways: panels per product; 0 =
     * one per usable device (so a one-device backend never splits unless asked), 1 = off,
     * 2..GEMM_SPLIT_MAX = that many, spread round robin over the usable devices (several on
     * one device: one GPU, or the CPU's workers, treated as several engines). Never more
     * panels than workers or than rows. See "Split products" in engine.c. */
    uint64_t split_min_mnk;
    int split_ways;
} gemm_engine_config;

#define GEMM_SPLIT_MAX 16
#define GEMM_HOST_MAX_MNK (1ull << 24) /* 256^3: far past where the host pays */
#define GEMM_SPLIT_MIN_MNK_DEFAULT (1ull << 36) /* 4096^3 */

#define GEMM_COALESCE_MAX 1024
/* fault_inject on the CPU backend (comma-separated; anything else fails open with 400
 * bad_config): "cpu_delay_ms:N" makes every job sleep N ms before computing (fills the
 * queue predictably in tests; a cancel ends the sleep, and the job stops before its
 * product); "cpu_fail:N" makes every Nth job fail with 500
 * backend_failure; "cpu_lost:N" simulates losing the device: products 1..N-1 run, the
 * Nth fails with 500 device_error, every later one with 503 device_unavailable, and
 * gemm_engine_healthy() is 0 from the Nth on. On the CUDA backend: "oom:N" (the Nth
 * device allocation fails), "sticky:N" (the Nth job launches a trapping kernel) and
 * "gpu_delay_ms:N" (every job's kernel stage begins with N ms of device-side waiting).
 * The daemon ignores fault_inject in a process it restarted itself (GEMMD_RESTARTS > 0),
 * so a hook fires only once. */

void gemm_engine_config_defaults(gemm_engine_config *cfg);

/* ---- jobs ---------------------------------------------------------------- */

typedef enum {
    GEMM_JOB_QUEUED = 0,
    GEMM_JOB_RUNNING,
    GEMM_JOB_DONE,
    GEMM_JOB_FAILED,
    GEMM_JOB_CANCELLED
} gemm_job_state;

const char *gemm_job_state_name(gemm_job_state s); /* "queued", "running", ... */

typedef struct {
    double queue_ms;   /* submit -> a worker picked it up */
    double h2d_ms;     /* host -> device copies (0 on the CPU backend) */
    double kernel_ms;  /* the product itself (cudaEvent on the GPU) */
    double d2h_ms;     /* device -> host copy (0 on the CPU backend) */
    double compute_ms; /* worker start -> worker end (>= h2d + kernel + d2h) */
    double gflops;     /* 2*m*n*k / kernel time */
} gemm_job_timing;

typedef struct gemm_job gemm_job;
typedef void (*gemm_job_cb)(gemm_job *job);

/* One row panel of a split product: rows row0 .. row0+rows-1 of A and C, where it ran. */
typedef struct {
    uint64_t row0, rows;
    int stream;
    char device[GEMM_NAME_LEN];
    char block[32];       /* the block tile the panel ran (see gemm_job.block) */
    double kernel_ms;
} gemm_split_panel;

/* A resident operand: a matrix kept for many products. Its host copy (engine memory,
 * owned by the caller, alive as long as the handle) is the authority; a backend with
 * device memory keeps a copy per device, made by the first product that reads it there
 * (or, for C, by the product that wrote it) and used without a host-to-device copy from
 * then on. A device that is reset loses its copies; the next product copies again. When
 * device memory is short the product simply reads the host copy (spill). */
typedef struct gemm_resident {
    const void *host;
    size_t bytes;
    /* ---- backend-private ---- */
    pthread_mutex_t mu;
    void *dev[GEMM_MAX_DEVICES];
    unsigned gen[GEMM_MAX_DEVICES]; /* the device generation the copy belongs to */
    struct gemm_resident *free_next;
} gemm_resident;

struct gemm_job {
    /* ---- request: set by the submitter before gemm_engine_submit ---- */
    gemm_dtype dtype;
    uint64_t m, k, n;
    void *a, *b;          /* m*k and k*n elements, row-major, from gemm_engine_host_alloc */
    void *c;              /* room for m*n elements of gemm_job_c_dtype(), from gemm_engine_host_alloc */
    /* A batched job (batch > 1) computes batch products C[i] = A[i].B[i] in one go: a holds
     * batch m*k matrices back to back, c room for batch m*n, and b holds batch k*n
     * matrices, or one k*n matrix used by every product when b_shared is set (NumPy
     * matmul broadcasting of a 2-D B). batch 0 and 1 both mean one product. */
    uint64_t batch;
    int b_shared;
    char kernel[GEMM_NAME_LEN]; /* "auto" (or "") or a kernel name from describe() */
    int tile;             /* tile for kernels that take one; 0 = kernel default */
    gemm_math math;
    uint64_t plan_m;      /* rows of the whole product this one is a panel of (0 or m:
                             none): the kernel, its block, its k split and cuBLAS's
                             algorithm are chosen as for that many rows, so that each row
                             comes out as in the whole product (CUDA; the CPU ignores it) */
    int out_half;         /* float16 / bfloat16 operands: 1 = C in their dtype (rounded to
                             nearest even from the float32 result), 0 = C in float32 (the
                             default); ignored for other dtypes (C is in theirs) */
    gemm_resident *a_res, *b_res; /* optional: A / B are resident (a / b still point at
                                     their host copies); NULL: plain host operands */
    gemm_resident *c_res; /* optional: C (host copy at c) is kept resident on the device
                             that computed it, for the next product to read */
    gemm_job_cb done;     /* called exactly once, on an engine thread */
    void *user;           /* for the submitter */

    /* ---- result: set by the engine before done() ---- */
    _Atomic int state;    /* gemm_job_state */
    gemm_err err;         /* status != 0 when state is FAILED or CANCELLED (409 cancelled) */
    gemm_job_timing timing;
    char kernel_used[GEMM_NAME_LEN];
    int tile_used;        /* the tile option that selects the block that ran (0: default only) */
    char block[32];       /* that block tile, "BMxBNxBK" [" split-k S"] ("" when none) */
    gemm_math math_used;
    char device[GEMM_NAME_LEN]; /* "cpu" or e.g. "cuda:0 NVIDIA H100 80GB HBM3" */
    int stream;           /* stream index on that device (-1 on the CPU) */
    uint64_t batched;     /* products computed by the launch(es) this job ran in: its own
                             batch for a batched job, 0 for a single product */
    char batch_mode[32];  /* how a batched job ran: "strided" (one batched library call),
                             "loop" (one launch per product on one stream, one H2D, one
                             D2H), "" for a single product; "coalesced strided" /
                             "coalesced loop" for a product the engine ran together with
                             other queued ones (batched = the group's size) */
    int zero_copy;        /* 1: the kernel read A and B from host memory and wrote C there
                             (no H2D, no D2H; zero_copy_mnk) */
    /* A split product (split_panels >= 2) ran as that many row panels, split[0..panels)
     * in row order; then device, stream, tile_used and block are panel 0's, h2d/kernel/d2h
     * the longest panel's (they run side by side), compute_ms from the worker that took the
     * product to the end of its last panel, and gflops 2*m*n*k over kernel_ms. 0: not split. */
    int split_panels;
    gemm_split_panel split[GEMM_SPLIT_MAX];

    /* ---- engine-private ---- */
    double t_submit_ms;
    _Atomic int cancel_requested; /* set by gemm_engine_cancel; read by the worker */
    struct gemm_job *q_next;
    struct gemm_split *split_state; /* a split product's panels (parent), or the split a
                                       panel belongs to; NULL otherwise */
    int panel_index, panel_slot;
    /* A panel's a and c point inside the product's blocks from gemm_engine_host_alloc:
     * these are the blocks themselves, for a backend that pins host memory by block (the
     * same B block is read by every panel, possibly at once). NULL for any other job. */
    void *a_block, *b_block, *c_block;
    /* A coalesced group (dynamic batching) run on a backend with run_parts: batch
     * products, each with its own A, B and C blocks (from gemm_engine_host_alloc), listed
     * here in place of stacks at a, b and c (which are NULL): the backend copies each
     * straight to and from its device stacks, with no gather or scatter on the host. NULL
     * for any other job. */
    void *const *a_parts, *const *b_parts, *const *c_parts;
};

/* The dtype of C: float32 for float16 / bfloat16 operands unless out_half asks for theirs;
 * the operands' dtype otherwise. */
static inline gemm_dtype gemm_job_c_dtype(const gemm_job *job)
{
    return gemm_dtype_is_half(job->dtype) && !job->out_half ? GEMM_DTYPE_F32 : job->dtype;
}

/* Products in a job: batch, or 1 for a single product. */
static inline uint64_t gemm_job_batch(const gemm_job *job)
{
    return job->batch > 1 ? job->batch : 1;
}
/* The rows the job's kernel, block and algorithm are chosen for: plan_m when it is a panel
 * of a taller product, else its own m. */
static inline uint64_t gemm_job_plan_rows(const gemm_job *job)
{
    return job->plan_m > job->m ? job->plan_m : job->m;
}
/* Bytes of the job's A, B and C (all products of a batch; C in gemm_job_c_dtype()); 0 on
 * overflow or a bad dtype. */
int gemm_job_bytes(const gemm_job *job, size_t out[3]);

/* GEMM_MAX_BATCH (gemm_types.h): products in one job. */

/* ---- the engine -------------------------------------------------------- */

typedef struct gemm_engine gemm_engine;

typedef struct {
    char name[GEMM_NAME_LEN];
    uint64_t total_mem, free_mem;
    int sms;
    int cc_major, cc_minor;
    int streams;
} gemm_device_info;

typedef struct {
    char name[GEMM_NAME_LEN];      /* "naive", "tiled", "cublas", "openblas", ... */
    char description[128];
    unsigned dtypes;               /* bit (1u << gemm_dtype) per supported dtype */
    unsigned maths;                /* bit (1u << gemm_math) per supported float32 math mode */
    int tiles[4];                  /* tiles accepted (0-terminated); {0} = no tile option */
} gemm_kernel_info;

typedef struct {
    char backend[8];               /* "cpu" or "cuda" */
    int workers;
    int queue_capacity;
    int ndevices;
    gemm_device_info devices[GEMM_MAX_DEVICES];
    int nkernels;
    gemm_kernel_info kernels[GEMM_MAX_KERNELS];
} gemm_engine_info;

typedef struct {
    int queued;                    /* jobs waiting now */
    int running;                   /* jobs on a worker now, until their done() has returned */
    uint64_t completed, failed, cancelled, rejected; /* since open */
    uint64_t coalesced_launches;   /* groups of queued products run as one batched job */
    uint64_t coalesced_products;   /* products that ran in those groups */
    uint64_t ran_here;             /* jobs run (or running) on the thread that submitted them (submit_here) */
    uint64_t ran_host;             /* of those, products the host computed (host_max_mnk) */
    uint64_t split_products;       /* products run as row panels (each counted once above) */
    uint64_t split_panels;         /* the panels they ran as */
    double compute_seconds;        /* sum of compute_ms / 1000 */
    int ndevices;
    double device_busy_seconds[GEMM_MAX_DEVICES];
    uint64_t bytes_h2d[GEMM_MAX_DEVICES];
    uint64_t bytes_d2h[GEMM_MAX_DEVICES];
    uint64_t device_mem_used[GEMM_MAX_DEVICES];
    uint64_t device_mem_free[GEMM_MAX_DEVICES];
    uint64_t resident_bytes[GEMM_MAX_DEVICES]; /* device copies of resident operands */
    int nslots;                    /* device slots of the workers (CUDA: devices; CPU: 1) */
    int slot_busy[GEMM_MAX_DEVICES]; /* workers of each slot running a product, group or panel now */
} gemm_engine_stats;

/* Opens the backend named by cfg->backend ("auto": CUDA when built in and a device is
 * present, else CPU). NULL with *err set on failure. */
gemm_engine *gemm_engine_open(const gemm_engine_config *cfg, gemm_err *err);

/* Queues a job. Never waits for compute. Returns 0, or -1 with *err set and done()
 * NOT called: 503 queue_full when the queue is at capacity, 422 for a kernel / dtype /
 * math / tile combination the backend cannot run, 503 shutting_down after close began. */
int gemm_engine_submit(gemm_engine *e, gemm_job *job, gemm_err *err);

/* As gemm_engine_submit, but when nothing is queued and a worker of the slot the job would
 * go to is idle, the job runs here, on the calling thread, on that worker's backend state
 * (stream, buffers, handles; the worker takes nothing meanwhile): no hand-off to another
 * thread. A product small enough for the host (host_max_mnk, gemm_engine_runs_on_host)
 * is computed here by the host, queued jobs or not. Returns 1 when it ran here (done()
 * has been called, from this thread, before the return), 0 when it was queued, -1 as
 * submit. Never split; cancellation works as for
 * a running job. For a caller that would otherwise wait for a small product anyway. */
int gemm_engine_submit_here(gemm_engine *e, gemm_job *job, gemm_err *err);
/* Whether gemm_engine_submit_here would compute job on the host (host_max_mnk), by its
 * request fields alone: then it always runs there (returns 1), whatever is queued. */
int gemm_engine_runs_on_host(const gemm_engine *e, const gemm_job *job);

/* Asks for a job to be cancelled; returns 1 if it was dequeued, 0 otherwise.
 * - Queued: it is taken off the queue and done() is called at once, from the calling
 *   thread, with state CANCELLED and 409 cancelled.
 * - Running: the request is noted and the worker stops the job at its next stage
 *   boundary: before it starts; on the CUDA backend before the host-to-device copy, and
 *   for a product long enough to be run stage by stage (see engine_cuda.c) also before
 *   the kernel and before the device-to-host copy; on the CPU backend before the product
 *   (before each product of a batched job) and, for int32, between panels of k. A product
 *   coalesced into a group (dynamic batching) stops only if the cancel came before the
 *   group started. done() is then called once, from the worker,
 *   with state CANCELLED and 409 cancelled (the message names the stage; c is not
 *   complete). A split product passes the request to each of its panels; it ends
 *   CANCELLED once they have all stopped or finished (unless one failed: then FAILED). A job past its last boundary completes as usual (DONE or FAILED): the
 *   caller discards that result. A kernel that is running is never interrupted.
 * - Finished, or not known to the engine: nothing happens. */
int gemm_engine_cancel(gemm_engine *e, gemm_job *job);

/* Stops accepting, lets running jobs finish, fails queued ones with 503 shutting_down
 * (their done() is called), joins the workers and frees the engine. */
void gemm_engine_close(gemm_engine *e);

/* Memory for job inputs and outputs: pinned on the CUDA backend. */
void *gemm_engine_host_alloc(gemm_engine *e, size_t bytes);
void gemm_engine_host_free(gemm_engine *e, void *p);
const gemm_allocator *gemm_engine_allocator(gemm_engine *e);
/* Memory the engine keeps after its owners freed it, for reuse (the CUDA engine's cache of
 * page-locked blocks; the CPU engine keeps none), can be charged to the caller's account:
 * fn(ctx, +bytes) before bytes are kept (nonzero: they are let go instead), fn(ctx, -bytes)
 * when kept bytes are reused or let go. fn is called from any thread, under the engine's
 * allocator lock: it must not call into the engine. NULL stops charging (call it before
 * the account goes away). gemm_engine_trim_kept lets everything kept go now (it stops
 * being charged at once; the memory is freed shortly after) and returns the bytes. */
typedef int (*gemm_keep_charge_fn)(void *ctx, int64_t delta);
void gemm_engine_set_keep_charge(gemm_engine *e, gemm_keep_charge_fn fn, void *ctx);
uint64_t gemm_engine_trim_kept(gemm_engine *e);

/* Resident operands (see gemm_resident): a handle for host bytes at host, and its release
 * (device copies are freed later by the backend, off the caller's thread; the caller
 * frees the host copy). Neither makes a device call. new: NULL when out of memory. */
gemm_resident *gemm_engine_resident_new(gemm_engine *e, const void *host, size_t bytes);
void gemm_engine_resident_free(gemm_engine *e, gemm_resident *r);

void gemm_engine_describe(gemm_engine *e, gemm_engine_info *out);
/* What the engine counts as a small product: m*n*k (times the batch) at most this much
 * (batch_max_mnk, or its default when the configuration said 0). */
uint64_t gemm_engine_small_mnk(const gemm_engine *e);
/* device_mem_free: the live free memory of each device (CUDA: cudaMemGetInfo sampled about
 * every second by the backend's housekeeping thread, never on the caller's thread; CPU:
 * available RAM now). gemm_engine_info.devices[].free_mem is the same sample. */
void gemm_engine_get_stats(gemm_engine *e, gemm_engine_stats *out);
/* True when the engine is open, not closing, healthy, and its queue has room. */
int gemm_engine_ready(gemm_engine *e);
/* False once the backend has lost every device it uses: no product can run in this
 * process any more and only a new process can recover (the daemon restarts itself). */
int gemm_engine_healthy(gemm_engine *e);

/* ---- what a backend provides (used by engine.c only) -------------------- */

typedef struct gemm_backend {
    const char *name;
    /* Creates backend state; returns NULL with *err set when it cannot run here. */
    void *(*open)(const gemm_engine_config *cfg, gemm_err *err);
    /* Number of worker threads the generic engine should start for it. */
    int (*workers)(void *self);
    /* Per-worker setup/teardown on the worker's own thread (may be NULL). */
    void *(*worker_init)(void *self, int worker_index);
    void (*worker_fini)(void *self, void *worker);
    /* Checks options before queueing: resolve "auto", reject what cannot run (422). */
    int (*validate)(void *self, gemm_job *job, gemm_err *err);
    /* Runs one job to completion on this worker: fills c, timing (not queue_ms),
     * kernel_used, tile_used, math_used, device, stream; returns 0, or -1 with job->err
     * set, or GEMM_RUN_CANCELLED when it stopped at a stage boundary because a cancel was
     * asked for (gemm_job_cancel_requested), through gemm_job_stop_cancelled. */
    int (*run)(void *self, void *worker, gemm_job *job);
    void (*describe)(void *self, gemm_engine_info *out);
    void (*stats)(void *self, gemm_engine_stats *out); /* devices, bytes, memory */
    const gemm_allocator *(*allocator)(void *self);
    void (*close)(void *self);
    /* 1 while the backend can still run products, 0 once every device it uses is lost
     * (e.g. a CUDA context that could not be rebuilt after a sticky error). Called from
     * any thread. May be NULL: always healthy. */
    int (*healthy)(void *self);
    /* batch_max when the configuration says 0 (1: no dynamic batching by default). */
    int batch_default;
    /* 1: run() takes a coalesced group as a_parts / b_parts / c_parts (see gemm_job);
     * 0: the engine gathers the group into stacks at a and b and scatters c itself. */
    int run_parts;
    /* Takes a resident handle whose device copies must be freed (may be NULL: the
     * backend keeps none; engine.c frees the handle). The backend frees it when done. */
    void (*resident_free)(void *self, gemm_resident *r);
    /* The device slot (0 .. GEMM_MAX_DEVICES-1) worker worker_index runs on, and whether
     * a slot can run products now (not lost): jobs go to the least-loaded usable slot,
     * split panels one per usable slot (engine.c). Either may be NULL: every worker is on
     * slot 0, and every slot is usable. slot_usable is called under the engine's lock. */
    int (*worker_slot)(void *self, int worker_index);
    int (*slot_usable)(void *self, int slot);
    /* gemm_engine_set_keep_charge / gemm_engine_trim_kept (may be NULL: nothing kept). */
    void (*set_keep_charge)(void *self, gemm_keep_charge_fn fn, void *ctx);
    uint64_t (*trim_kept)(void *self);
    /* Whether a product will take about the time of its work: 0 while a fault_inject hook
     * holds or breaks runs (a product held by design, or a device reset, must not run on
     * the thread that submitted it: gemm_engine_submit_here queues it). May be NULL: 1. */
    int (*quick)(void *self);
} gemm_backend;

#define GEMM_RUN_CANCELLED 1

/* For backends: whether a cancel of this running job was asked for (a relaxed read: the
 * worker checks it at each stage boundary). */
static inline int gemm_job_cancel_requested(gemm_job *job)
{
    return atomic_load_explicit(&job->cancel_requested, memory_order_relaxed) != 0;
}
/* For backends: sets job->err to 409 cancelled, "... stopped before <stage>", and returns
 * GEMM_RUN_CANCELLED for run() to return. */
int gemm_job_stop_cancelled(gemm_job *job, const char *stage);

extern const gemm_backend gemm_backend_cpu;
/* Computes a float32 / float64 / int32 job on the calling thread (OpenBLAS, or the int32
 * loop on one thread): fills c, kernel_used, math_used, device ("cpu"), stream (-1),
 * timing.kernel_ms and gflops; 0, or -1 / GEMM_RUN_CANCELLED with job->err set. The
 * host path of gemm_engine_submit_here (host_max_mnk). */
int gemm_host_product(gemm_job *job);
/* OpenBLAS to one thread for the whole process (an engine with host_max_mnk calls it). */
void gemm_host_threads_one(void);

/* Opens an engine on the backend given (gemm_engine_open picks cpu or cuda by name);
 * for tests of the generic engine with a backend of their own. */
gemm_engine *gemm_engine_open_backend(const gemm_backend *be, const gemm_engine_config *cfg, gemm_err *err);
#ifdef GEMMD_HAVE_CUDA
extern const gemm_backend gemm_backend_cuda;
/* Number of usable CUDA devices (0 when the driver or a device is missing). */
int gemm_cuda_device_count(void);
#endif

#ifdef __cplusplus
}
#endif
#endif /* GEMM_ENGINE_H */
