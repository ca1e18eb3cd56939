/*
 * engine.h - the compute engine: one asynchronous interface, backends behind it
 * (docs/KERNELS.md, "The engine around the kernels"). open; buffers from host_alloc; submit
 * (never blocks on compute); done(job) exactly once, from an engine thread, after which the
 * submitter may free the job; close drains and calls every pending done(). Errors are
 * gemm_ecode values (the daemon maps them: server/engine_err.c). submit, cancel, describe,
 * get_stats, ready, healthy, host_alloc and host_free never wait on a device or call CUDA.
 */
#ifndef GEMM_ENGINE_H
#define GEMM_ENGINE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "gemm_log.h"
#include "gemm_types.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GEMM_MAX_DEVICES 16
#define GEMM_MAX_KERNELS 32
#define GEMM_NAME_LEN 48
#define GEMM_SPLIT_MAX 16
#define GEMM_COALESCE_MAX 1024
#define GEMM_HOST_MAX_MNK (1ull << 24)          /* 256^3: far past where the host pays */
#define GEMM_SPLIT_MIN_MNK_DEFAULT (1ull << 36) /* 4096^3 */

/* ---- errors ---------------------------------------------------------------- */

typedef enum {
    GEMM_E_NONE = 0,
    GEMM_E_QUEUE_FULL,        /* every queue place is taken: retry shortly */
    GEMM_E_SHUTTING_DOWN,     /* close began: retry elsewhere */
    GEMM_E_CANCELLED,         /* gemm_engine_cancel stopped it */
    GEMM_E_EMPTY,             /* m, k or n is 0 */
    GEMM_E_BAD_DTYPE,         /* not a dtype the engine knows */
    GEMM_E_BAD_OPTION,        /* an option out of place (panel_of) */
    GEMM_E_TOO_LARGE,         /* sizes past what the engine or the backend takes */
    GEMM_E_UNKNOWN_KERNEL,    /* no such kernel on this backend */
    GEMM_E_UNSUPPORTED,       /* the kernel cannot run this product here */
    GEMM_E_UNSUPPORTED_DTYPE, /* the kernel does not compute this dtype */
    GEMM_E_UNSUPPORTED_MATH,  /* the math mode needs what the backend lacks */
    GEMM_E_BAD_TILE,          /* the kernel takes no such tile */
    GEMM_E_BACKEND,           /* the backend failed to run the product */
    GEMM_E_DEVICE,            /* a device error during this product */
    GEMM_E_DEVICE_LOST,       /* the device is gone for this process */
    GEMM_E_DEVICE_OOM,        /* device memory is short for this product */
    GEMM_E_NO_MEMORY,         /* host memory is short now */
    GEMM_E_NO_DEVICE,         /* open: no usable device for the backend */
    GEMM_E_BAD_CONFIG,        /* open: a setting the backend refuses */
    GEMM_E_BAD_BACKEND,       /* open: no backend of that name in this build */
    GEMM_E_INTERNAL,          /* a caller broke the interface's rules */
    GEMM_E_COUNT
} gemm_ecode;

typedef struct {
    gemm_ecode code;   /* GEMM_E_NONE: no error */
    char message[400]; /* a sentence a person understands */
} gemm_engine_err;

void gemm_engine_err_clear(gemm_engine_err *e);
/* Sets code and the printf-formatted message; NULL e does nothing. Returns -1. */
int gemm_engine_err_set(gemm_engine_err *e, gemm_ecode code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- configuration (config/gemmd.conf, GEMMD_* and flags; key rows: gemm_engine_keys) ---- */

typedef struct {
    /* the engine (what each key does: its row in gemm_engine_keys, and config/gemmd.conf) */
    char backend[8];           /* "auto", "cpu" or "cuda" */
    char fault_inject[64];     /* test hooks, backend-defined (below); "" = none */
    int queue_depth;           /* jobs waiting (not running) before submit says queue full */
    int batch_max;             /* coalescing (coalesce.c): 0 = the backend's default, 1 = off */
    uint64_t batch_max_mnk;    /* what counts as small */
    uint64_t split_min_mnk;    /* split products (split.c): 0 = never */
    int split_ways;            /* 0 = one panel per usable device slot, 1 = off */
    /* the CPU backend */
    int threads;               /* BLAS / int32 loop threads (0 = all cores) */
    int cpu_workers;           /* jobs run at once (0 = 1) */
    /* the CUDA backend */
    char devices[128];         /* "all" or a comma list of ordinals */
    int streams_per_device;    /* streams (and workers) per device */
    uint64_t device_mem_limit; /* bytes of cached device buffers per stream (0 = no limit) */
    uint64_t host_cache_bytes; /* page-locked host blocks kept for reuse (0 or > 1 GiB: 1 GiB) */
    uint64_t host_max_mnk;     /* the host path (host.c): batch*m*n*k up to this (0 = never) */
} gemm_engine_config;

/* fault_inject: comma-separated hooks, each owned by one backend (its `faults` rows in
 * backend.h; what each does: config/gemmd.conf); a hook the backend in use does not take
 * fails open with GEMM_E_BAD_CONFIG. With any hook set the host path is off and products
 * never run on the submitting thread. */

void gemm_engine_config_defaults(gemm_engine_config *cfg);

/* The configuration keys by owner ("engine", "cpu", "cuda", "host"), all in every build. */
typedef enum {
    GEMM_KEY_INT,     /* int field in [min, max] */
    GEMM_KEY_U64,     /* uint64_t field in [min, max] */
    GEMM_KEY_MB,      /* value in MiB in [min, max], uint64_t field in bytes */
    GEMM_KEY_BOOL,    /* int field, 0 or 1 */
    GEMM_KEY_STR,     /* char[size] */
    GEMM_KEY_BACKEND, /* char[size]: auto, cpu or cuda */
    GEMM_KEY_DEVICES  /* char[size]: all, or a comma list of ordinals */
} gemm_key_kind;

typedef struct {
    const char *name;  /* the file spelling: GEMMD_<NAME> and --name-with-dashes too */
    gemm_key_kind kind;
    size_t offset;     /* into gemm_engine_config */
    size_t size;       /* string kinds: the buffer */
    long long min, max;
    const char *help;
} gemm_key;

typedef struct {
    const char *owner;    /* NULL ends the list */
    const gemm_key *keys; /* a row with a NULL name ends them */
} gemm_key_section;

extern const gemm_key_section gemm_engine_keys[];

/* ---- jobs ------------------------------------------------------------------ */

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
    double h2d_ms;     /* host -> device copies (0 on the CPU) */
    double kernel_ms;  /* the product itself (cudaEvent on the GPU) */
    double d2h_ms;     /* device -> host copy (0 on the CPU) */
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
    char block[32];
    double kernel_ms;
} gemm_split_panel;

/* A resident operand: its host copy (alive as long as the handle) rules; devices copy it. */
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
    void *c;              /* room for m*n elements of gemm_job_c_dtype() */
    /* batch > 1: batch products C[i] = A[i].B[i]; a holds batch m*k matrices back to back,
     * c room for batch m*n, b batch k*n matrices or, with b_shared, one for all. */
    uint64_t batch;
    int b_shared;
    char kernel[GEMM_NAME_LEN]; /* "auto" (or "") or a kernel name from describe() */
    int tile;             /* tile for kernels that take one; 0 = kernel default */
    gemm_math math;
    uint64_t plan_m;      /* panel_of: rows of the whole product; the launch is chosen for it */
    int out_half;         /* float16 / bfloat16: 1 = C in their dtype, 0 = C in float32 */
    gemm_resident *a_res, *b_res; /* optional: A / B are resident (a / b: their host copies) */
    gemm_resident *c_res; /* optional: C (host copy at c) is kept on the device that made it */
    gemm_job_cb done;     /* called exactly once, on an engine thread */
    void *user;           /* for the submitter */

    _Atomic int state;    /* gemm_job_state */
    /* ---- result: set by the engine before done() (submit clears it and what follows) ---- */
    gemm_engine_err err;  /* set when state is FAILED or CANCELLED */
    gemm_job_timing timing;
    char kernel_used[GEMM_NAME_LEN];
    int tile_used;        /* the tile option that selects the block that ran (0: default only) */
    char block[32];       /* that block tile, "BMxBNxBK" [" split-k S"] ("" when none) */
    gemm_math math_used;
    char device[GEMM_NAME_LEN]; /* "cpu" or e.g. "cuda:0 NVIDIA H100 80GB HBM3" */
    int stream;           /* stream index on that device (-1 on the CPU) */
    uint64_t batched;     /* its batch, or its group's size when coalesced (0: single) */
    char batch_mode[32];  /* "strided", "loop", "coalesced loop" or "" (docs/API.md) */
    /* A split product (split_panels >= 2): its panels in row order; device, stream, tile_used
     * and block are panel 0's, h2d/kernel/d2h the longest panel's. 0: not split. */
    int split_panels;
    gemm_split_panel split[GEMM_SPLIT_MAX];

    /* ---- engine-private ---- */
    double t_submit_ms;
    _Atomic int cancel_requested; /* set by gemm_engine_cancel; read by the worker */
    struct gemm_job *q_next;
    struct gemm_split *split_state; /* a split product's panels, or the split a panel is of */
    int panel_index, panel_slot;
    void *a_block, *c_block; /* a panel: the blocks its a and c point inside */
    void *const *a_parts, *const *b_parts, *const *c_parts; /* a group (run_parts): each one's */
};

/* The dtype of C: float32 for half operands unless out_half asks for theirs. */
static inline gemm_dtype gemm_job_c_dtype(const gemm_job *job)
{
    return gemm_dtype_is_half(job->dtype) && !job->out_half ? GEMM_DTYPE_F32 : job->dtype;
}
static inline uint64_t gemm_job_batch(const gemm_job *job)
{
    return job->batch > 1 ? job->batch : 1;
}
/* The rows the job's kernel, block and algorithm are chosen for. */
static inline uint64_t gemm_job_plan_rows(const gemm_job *job)
{
    return job->plan_m > job->m ? job->plan_m : job->m;
}
/* Bytes of the job's A, B and C (all products of a batch); 0 on overflow or a bad dtype. */
int gemm_job_bytes(const gemm_job *job, size_t out[3]);

/* ---- the engine ------------------------------------------------------------ */

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
    uint64_t ran_here;             /* jobs run on the thread that submitted them (submit_here) */
    uint64_t ran_host;             /* of those, products the host path computed */
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
    int slot_busy[GEMM_MAX_DEVICES]; /* workers of each slot running something now */
} gemm_engine_stats;

/* Opens cfg->backend ("auto": CUDA when a device is present, else CPU); returns once every
 * worker is set up (and warmed up). NULL with *err set on failure. */
gemm_engine *gemm_engine_open(const gemm_engine_config *cfg, gemm_engine_err *err);

/* Queues a job; 0, or -1 with *err set and done() NOT called. */
int gemm_engine_submit(gemm_engine *e, gemm_job *job, gemm_engine_err *err);

/* As gemm_engine_submit, but the job may run on the calling thread (direct.c): 1 when it
 * ran here (done() has been called), 0 when it was queued, -1 as submit. */
int gemm_engine_submit_here(gemm_engine *e, gemm_job *job, gemm_engine_err *err);
/* Whether gemm_engine_submit_here would give job to the host path, by its request alone. */
int gemm_engine_runs_on_host(const gemm_engine *e, const gemm_job *job);

/* Cancels a job: a queued one is dequeued and done() called here (returns 1); a running
 * one stops at its next stage boundary (docs/API.md, DELETE /v1/jobs), then done() once,
 * CANCELLED; a finished or unknown one: nothing (0). */
int gemm_engine_cancel(gemm_engine *e, gemm_job *job);

/* Lets running jobs finish, fails queued ones (GEMM_E_SHUTTING_DOWN), frees the engine. */
void gemm_engine_close(gemm_engine *e);

/* Memory for job inputs and outputs: page-locked on the CUDA backend. */
void *gemm_engine_host_alloc(gemm_engine *e, size_t bytes);
void gemm_engine_host_free(gemm_engine *e, void *p);
const gemm_allocator *gemm_engine_allocator(gemm_engine *e);
/* Memory kept for reuse (CUDA: locked blocks) is charged: fn(ctx, +bytes) before it is kept
 * (nonzero: let go), fn(ctx, -bytes) when it leaves; under the allocator's lock (no engine
 * call from fn). trim_kept lets it all go. */
typedef int (*gemm_keep_charge_fn)(void *ctx, int64_t delta);
void gemm_engine_set_keep_charge(gemm_engine *e, gemm_keep_charge_fn fn, void *ctx);
uint64_t gemm_engine_trim_kept(gemm_engine *e);

/* Resident operands: a handle for host bytes, and its release (no device call). */
gemm_resident *gemm_engine_resident_new(gemm_engine *e, const void *host, size_t bytes);
void gemm_engine_resident_free(gemm_engine *e, gemm_resident *r);

void gemm_engine_describe(gemm_engine *e, gemm_engine_info *out);
/* What the engine counts as a small product (batch_max_mnk, or its default). */
uint64_t gemm_engine_small_mnk(const gemm_engine *e);
/* Counters, and each device's free memory (CUDA: sampled about every second). */
void gemm_engine_get_stats(gemm_engine *e, gemm_engine_stats *out);
/* True when the engine is open, not closing, healthy, and its queue has room. */
int gemm_engine_ready(gemm_engine *e);
/* False once the backend has lost every device it uses (only a new process recovers). */
int gemm_engine_healthy(gemm_engine *e);
/* Whether the keys of section `owner` (gemm_engine_keys) act on this engine. */
int gemm_engine_key_applies(const gemm_engine *e, const char *owner);

#ifdef __cplusplus
}
#endif
#endif /* GEMM_ENGINE_H */
