/*
 * backend.h - what a backend provides (one row of functions), and the registry the engine
 * opens them from (docs/KERNELS.md, "The engine around the kernels").
 */
#ifndef GEMM_BACKEND_H
#define GEMM_BACKEND_H

#include "engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A fault_inject hook: name:N sets the long at `offset` of the backend's state to N. */
typedef struct {
    const char *name;
    size_t offset;
    long min, max;
} gemm_fault_hook;

typedef struct gemm_backend {
    const char *name;
    int (*present)(void); /* auto: nonzero when its device is here (NULL: always) */
    /* State, or NULL with *err set when it cannot run here (a row with `takes`: NULL
     * without an error when the configuration leaves it off). */
    void *(*open)(const gemm_engine_config *cfg, gemm_engine_err *err);
    void (*close)(void *self);
    /* Worker threads; each one's setup / teardown on its own thread (may be NULL). */
    int (*workers)(void *self);
    void *(*worker_init)(void *self, int worker_index);
    void (*worker_fini)(void *self, void *worker);
    /* Before queueing: resolves "auto", refuses what cannot run. */
    int (*validate)(void *self, gemm_job *job, gemm_engine_err *err);
    /* One job to completion: fills c and the results but queue_ms; 0, -1 with job->err
     * set, or GEMM_RUN_CANCELLED (gemm_job_stop_cancelled). */
    int (*run)(void *self, void *worker, gemm_job *job);
    void (*describe)(void *self, gemm_engine_info *out);
    void (*stats)(void *self, gemm_engine_stats *out); /* devices, bytes, memory */
    const gemm_allocator *(*allocator)(void *self);  /* NULL: plain host memory */
    int (*healthy)(void *self); /* 0 once every device is lost (any thread; NULL: 1) */
    int batch_default;          /* batch_max when the configuration says 0 (1: off) */
    int run_parts;              /* 1: run() takes a group's a_parts...; 0: stacks at a, b, c */
    /* Takes a resident handle whose device copies must go (NULL: the engine frees it). */
    void (*resident_free)(void *self, gemm_resident *r);
    /* Worker i's device slot; whether a slot runs now (NULL: slot 0; usable). */
    int (*worker_slot)(void *self, int worker_index);
    int (*slot_usable)(void *self, int slot);
    /* gemm_engine_set_keep_charge / gemm_engine_trim_kept (NULL: nothing kept). */
    void (*set_keep_charge)(void *self, gemm_keep_charge_fn fn, void *ctx);
    uint64_t (*trim_kept)(void *self);
    int (*quick)(void *self); /* 0 while a fault hook holds runs: none on the submitter */
    int offload;              /* 1: products cross a bus; the inline backend runs beside it */
    /* An inline backend (no workers): whether it runs job on the submitting thread. */
    int (*takes)(void *self, const gemm_job *job);
    const gemm_fault_hook *faults; /* the fault_inject hooks it takes, NULL name last */
} gemm_backend;

/* The registry: every backend of this build, NULL-terminated (engine_open.c). */
extern const gemm_backend *const gemm_backends[];
extern const gemm_backend gemm_backend_cpu, gemm_backend_host;
#ifdef GEMMD_HAVE_CUDA
extern const gemm_backend gemm_backend_cuda;
int gemm_cuda_device_count(void); /* usable CUDA devices (0: no driver or none) */
#endif

/* Opens an engine on the backend given (also for tests with a backend of their own). */
gemm_engine *gemm_engine_open_backend(const gemm_backend *be, const gemm_engine_config *cfg,
                                      gemm_engine_err *err);

#define GEMM_RUN_CANCELLED 1

/* Whether a cancel of this running job was asked for (checked at each stage boundary). */
static inline int gemm_job_cancel_requested(gemm_job *job)
{
    return atomic_load_explicit(&job->cancel_requested, memory_order_relaxed) != 0;
}
/* Sets job->err to GEMM_E_CANCELLED, "... stopped before <stage>"; returns GEMM_RUN_CANCELLED. */
int gemm_job_stop_cancelled(gemm_job *job, const char *stage);

/* Reads fault_inject into state by be's hook rows; else GEMM_E_BAD_CONFIG naming them. */
int gemm_faults_parse(const gemm_backend *be, const char *spec, void *state, gemm_engine_err *err);

#ifdef __cplusplus
}
#endif
#endif /* GEMM_BACKEND_H */
