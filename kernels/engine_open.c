/*
 * engine_open.c - the registry of backends and mechanisms, the engine's configuration keys, open
 * and close, and what the engine reports (describe, stats, health).
 */
#include "engine_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- the registry ---------------------------------------------------------- */

const gemm_backend *const gemm_backends[] = {
#ifdef GEMMD_HAVE_CUDA
    &gemm_backend_cuda, /* auto prefers it where a device is present */
#endif
    &gemm_backend_cpu,
    &gemm_backend_host,
    NULL,
};

const gemm_mech *const gemm_mechs[] = {&gemm_mech_split, &gemm_mech_coalesce, NULL}; /* offered a job in turn */

extern const gemm_key gemm_cpu_keys[], gemm_cuda_keys[], gemm_host_keys[];

#define KEY(f) offsetof(gemm_engine_config, f)
static const gemm_key engine_keys[] = {
    {"backend", GEMM_KEY_BACKEND, KEY(backend), sizeof((gemm_engine_config *)0)->backend, 0, 0,
     "compute engine: auto (CUDA when a GPU is present, else CPU), cpu or cuda"},
    {"queue_depth", GEMM_KEY_INT, KEY(queue_depth), 0, 1, 1000000,
     "products waiting for a worker before new ones get 503 queue_full"},
    {"batch_max", GEMM_KEY_INT, KEY(batch_max), 0, 0, GEMM_COALESCE_MAX,
     "dynamic batching: small queued products of one kind run as one group, each computed as it is alone, up "
     "to this many (0 = backend default: CUDA 32, CPU 1 = off; 1 = off)"},
    {"batch_max_mnk", GEMM_KEY_U64, KEY(batch_max_mnk), 0, 1, 1099511627776LL,
     "what counts as small: products with m*n*k up to this are coalesced, and (times their batch) may run on the "
     "HTTP thread that received them (direct_run)"},
    {"split_min_mnk", GEMM_KEY_U64, KEY(split_min_mnk), 0, 0, 4611686018427387904LL,
     "split products: a single product with m*n*k at least this is cut into row panels of A that run on several "
     "devices (or workers) at once (0 = never)"},
    {"split_ways", GEMM_KEY_INT, KEY(split_ways), 0, 0, GEMM_SPLIT_MAX,
     "split products: panels per product (0 = one per device, so one device never splits; 1 = off; 2..16 = that "
     "many, spread over the devices, several per device allowed)"},
    {"fault_inject", GEMM_KEY_STR, KEY(fault_inject), sizeof((gemm_engine_config *)0)->fault_inject, 0, 0,
     "test hook for the backend (empty = off); never set in production"},
    {NULL, 0, 0, 0, 0, 0, NULL},
};

const gemm_key_section gemm_engine_keys[] = {
    {"engine", engine_keys},
    {"cpu", gemm_cpu_keys},
    {"cuda", gemm_cuda_keys}, /* in every build: one config file serves both */
    {"host", gemm_host_keys},
    {NULL, NULL},
};

void gemm_engine_config_defaults(gemm_engine_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->backend, sizeof cfg->backend, "auto");
    cfg->cpu_workers = 1;
    cfg->queue_depth = 64;
    snprintf(cfg->devices, sizeof cfg->devices, "all");
    cfg->streams_per_device = 4;
    cfg->batch_max_mnk = 1ull << 24;
    cfg->split_min_mnk = GEMM_SPLIT_MIN_MNK_DEFAULT;
}

/* ---- open / close ---------------------------------------------------------- */

static const gemm_backend *find_backend(const char *want, gemm_engine_err *err)
{
    char built[64] = "";
    size_t off = 0;
    for (const gemm_backend *const *b = gemm_backends; *b; b++) {
        if ((*b)->takes) continue; /* inline rows serve beside another, never alone */
        if (strcmp(want, "auto") == 0 ? !(*b)->present || (*b)->present() : strcmp(want, (*b)->name) == 0) return *b;
        off += (size_t)snprintf(built + off, sizeof built - off, "%s%s", off ? ", " : "", (*b)->name);
    }
    gemm_engine_err_set(err, GEMM_E_BAD_BACKEND, "backend \"%s\" is not in this build; it has auto, %s", want, built);
    return NULL;
}

gemm_engine *gemm_engine_open(const gemm_engine_config *cfg, gemm_engine_err *err)
{
    const gemm_backend *be = find_backend(cfg && cfg->backend[0] ? cfg->backend : "auto", err);
    return be ? gemm_engine_open_backend(be, cfg, err) : NULL;
}

static void engine_free(gemm_engine *e)
{
    if (e->self) e->be->close(e->self);
    if (e->near) e->near_be->close(e->near);
    for (int i = 0; i < GEMM_MAX_DEVICES; i++) pthread_cond_destroy(&e->slot_cv[i]);
    pthread_cond_destroy(&e->inited);
    for (int i = 0; i < e->nback; i++) pthread_cond_destroy(&e->args[i].back);
    pthread_mutex_destroy(&e->mu);
    free(e->threads);
    free(e->args);
    free(e);
}

gemm_engine *gemm_engine_open_backend(const gemm_backend *be, const gemm_engine_config *cfg, gemm_engine_err *err)
{
    gemm_engine_config defaults;
    if (!cfg) {
        gemm_engine_config_defaults(&defaults);
        cfg = &defaults;
    }
    gemm_engine_err_clear(err);
    if (!be || !be->open || !be->workers || !be->run || !be->close) {
        gemm_engine_err_set(err, GEMM_E_INTERNAL, "a backend needs open, workers, run and close");
        return NULL;
    }
    gemm_engine *e = calloc(1, sizeof *e);
    if (!e) {
        gemm_engine_err_set(err, GEMM_E_NO_MEMORY, "cannot allocate the engine");
        return NULL;
    }
    e->be = be;
    e->mechs = gemm_mechs;
    e->capacity = cfg->queue_depth > 0 ? cfg->queue_depth : 64;
    e->group_max = cfg->batch_max >= 1 ? cfg->batch_max : be->batch_default > 0 ? be->batch_default : 1;
    if (e->group_max > GEMM_COALESCE_MAX) e->group_max = GEMM_COALESCE_MAX;
    e->group_mnk = cfg->batch_max_mnk ? cfg->batch_max_mnk : 1ull << 24;
    e->split_mnk = cfg->split_min_mnk; /* off at start when it could never split */
    e->split_ways = cfg->split_ways > GEMM_SPLIT_MAX ? GEMM_SPLIT_MAX : cfg->split_ways > 0 ? cfg->split_ways : 0;
    pthread_mutex_init(&e->mu, NULL);
    for (int i = 0; i < GEMM_MAX_DEVICES; i++) pthread_cond_init(&e->slot_cv[i], NULL);
    pthread_cond_init(&e->inited, NULL);

    /* The inline backend beside one that offloads (the host path), when the config has it. */
    for (const gemm_backend *const *b = gemm_backends; *b && be->offload && !e->near; b++)
        if ((*b)->takes && (e->near = (*b)->open(cfg, NULL))) e->near_be = *b;
    e->self = be->open(cfg, err);
    if (!e->self) {
        if (err && err->code == GEMM_E_NONE)
            gemm_engine_err_set(err, GEMM_E_BACKEND, "the %s backend could not start", be->name);
        engine_free(e);
        return NULL;
    }
    if (gemm_sched_start(e, err) != 0) {
        engine_free(e);
        return NULL;
    }
    /* Every worker set up (and warm) before open returns. */
    pthread_mutex_lock(&e->mu);
    while (e->ninited < e->nworkers) pthread_cond_wait(&e->inited, &e->mu);
    pthread_mutex_unlock(&e->mu);
    return e;
}

void gemm_engine_close(gemm_engine *e)
{
    if (!e) return;
    gemm_sched_stop(e);
    /* Host runs that counted themselves before closing end on their own (one small product). */
    while (atomic_load(&e->near_active) > 0) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    engine_free(e);
}

/* ---- memory ---------------------------------------------------------------- */

void gemm_engine_set_keep_charge(gemm_engine *e, gemm_keep_charge_fn fn, void *ctx)
{
    if (e && e->be->set_keep_charge) e->be->set_keep_charge(e->self, fn, ctx);
}

uint64_t gemm_engine_trim_kept(gemm_engine *e)
{
    return (e && e->be->trim_kept) ? e->be->trim_kept(e->self) : 0;
}

gemm_resident *gemm_engine_resident_new(gemm_engine *e, const void *host, size_t bytes)
{
    (void)e;
    gemm_resident *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->host = host;
    r->bytes = bytes;
    pthread_mutex_init(&r->mu, NULL);
    return r;
}

void gemm_engine_resident_free(gemm_engine *e, gemm_resident *r)
{
    if (!r) return;
    if (e && e->be->resident_free) {
        e->be->resident_free(e->self, r);
        return;
    }
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* ---- what the engine reports ----------------------------------------------- */

uint64_t gemm_engine_small_mnk(const gemm_engine *e) { return e->group_mnk; }

void gemm_engine_describe(gemm_engine *e, gemm_engine_info *out)
{
    memset(out, 0, sizeof *out);
    if (!e) return;
    if (e->be->describe) e->be->describe(e->self, out);
    snprintf(out->backend, sizeof out->backend, "%s", e->be->name);
    out->workers = e->nworkers;
    out->queue_capacity = e->capacity;
}

void gemm_engine_get_stats(gemm_engine *e, gemm_engine_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!e) return;
    if (e->be->stats) e->be->stats(e->self, out);
    pthread_mutex_lock(&e->mu);
    out->queued = e->queued;
    out->running = atomic_load(&e->running);
    out->nslots = e->nslots;
    for (int s = 0; s < e->nslots; s++) out->slot_busy[s] = e->slot_busy[s];
    pthread_mutex_unlock(&e->mu);
    out->completed = atomic_load(&e->completed);
    out->failed = atomic_load(&e->failed);
    out->cancelled = atomic_load(&e->cancelled);
    out->rejected = atomic_load(&e->rejected);
    out->compute_seconds = (double)atomic_load(&e->compute_ns) / 1e9;
    out->coalesced_launches = atomic_load(&e->groups);
    out->coalesced_products = atomic_load(&e->grouped);
    out->ran_here = atomic_load(&e->ran_here);
    out->ran_host = atomic_load(&e->ran_host);
    out->split_products = atomic_load(&e->splits);
    out->split_panels = atomic_load(&e->panels);
}

int gemm_engine_healthy(gemm_engine *e)
{
    return e && (!e->be->healthy || e->be->healthy(e->self) != 0);
}

int gemm_engine_ready(gemm_engine *e)
{
    if (!gemm_engine_healthy(e)) return 0;
    pthread_mutex_lock(&e->mu);
    int ok = !e->closing && e->queued < e->capacity;
    pthread_mutex_unlock(&e->mu);
    return ok;
}

int gemm_engine_key_applies(const gemm_engine *e, const char *owner)
{
    if (strcmp(owner, "engine") == 0 || strcmp(owner, e->be->name) == 0) return 1;
    for (const gemm_backend *const *b = gemm_backends; *b && e->be->offload; b++)
        if ((*b)->takes && strcmp(owner, (*b)->name) == 0) return 1;
    return 0;
}
