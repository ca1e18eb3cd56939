/*
 * test_host_cache.c - the CUDA backend's host block cache (kernels/cuda/cuda_host.c) on a
 * machine without a GPU: the file is compiled into this test, and the five CUDA runtime
 * calls it makes (cudaHostRegister, cudaHostUnregister, cudaSetDevice, cudaGetLastError,
 * cudaGetErrorString) are this test's own, which count registrations instead of locking
 * pages. What is checked is the cache's own logic:
 *
 * - a freed block that a worker locked is kept and handed out again for a request of a
 *   similar size (within an eighth and a page), the smallest that fits; one never locked
 *   is not kept;
 * - the cache's bounds (bytes, and MAX_CACHED blocks) push the oldest out to the queue,
 *   which the housekeeping side drains (unregistering each block once);
 * - a device reset drops that slot's blocks, and the next pin registers again;
 * - the charge hook is asked before a block is kept and told when it leaves; trim;
 * - 8 threads taking, locking and giving back blocks of 1-40 pages at once: the age list
 *   and the size-class lists stay consistent with the counters, and nothing is leaked
 *   (AddressSanitizer in the sanitizer build);
 * - stashes: a busy thread's small blocks come back to it from whichever thread frees them,
 *   charged, LIFO, at most STASH_BLOCKS (the oldest pushed out to the shared cache, also
 *   when the size asked for changes); larger blocks are shared; a reset, trim and the
 *   charge hook reach stashed blocks; 8 busy threads with a worker freeing half their
 *   blocks leave nothing handed out, cached or registered after trim and drain.
 *
 * The GPU suite's test_engine_gpu checks the same cache against the real driver.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#ifdef GEMMD_HAVE_CUDA

#include <pthread.h>
#include <stdio.h>

#include "cuda_host.c" /* the code under test, calling the CUDA functions below */
#include "host_counts.h"

static atomic_int registered_now; /* blocks registered and not yet unregistered */
static atomic_int register_calls;
static atomic_int fail_register;

cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
    (void)ptr, (void)size, (void)flags;
    atomic_fetch_add(&register_calls, 1);
    if (atomic_load(&fail_register)) return cudaErrorMemoryAllocation;
    atomic_fetch_add(&registered_now, 1);
    return cudaSuccess;
}

cudaError_t cudaHostUnregister(void *ptr)
{
    (void)ptr;
    atomic_fetch_sub(&registered_now, 1);
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    (void)device;
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) { return cudaSuccess; }

const char *cudaGetErrorString(cudaError_t error)
{
    (void)error;
    return "injected by the test";
}

#define KB 1024
#define MB (1024 * 1024)

static gemm_cuda_host *open_host(size_t max_cached)
{
    atomic_store(&registered_now, 0);
    atomic_store(&register_calls, 0);
    atomic_store(&fail_register, 0);
    int ordinals[2] = {0, 1};
    gemm_cuda_host *h = gemm_cuda_host_open(ordinals, 2, max_cached);
    assert_non_null(h);
    return h;
}

/* The age list and the class lists against each other and the counters. */
static void check_lists(gemm_cuda_host *h)
{
    pthread_mutex_lock(&h->mu);
    int n = 0;
    size_t bytes = 0;
    for (block_hdr *b = h->oldest; b; b = b->newer) {
        assert_true(b->newer ? b->newer->older == b : h->newest == b);
        assert_true(registered(h, b));
        n++;
        bytes += b->cap;
    }
    assert_int_equal(n, h->ncached);
    assert_int_equal(bytes, h->cached_bytes);
    assert_true(n <= MAX_CACHED && bytes <= h->max_cached);
    int in_classes = 0;
    for (int c = 0; c < CLASSES; c++)
        for (block_hdr *b = h->cls[c]; b; b = b->cnext) {
            assert_int_equal(class_of(b), c);
            assert_true(b->cnext ? b->cnext->cprev == b : 1);
            assert_true(b->cprev ? b->cprev->cnext == b : h->cls[c] == b);
            in_classes++;
        }
    assert_int_equal(in_classes, n);
    pthread_mutex_unlock(&h->mu);
}

static size_t cached_blocks(gemm_cuda_host *h)
{
    size_t c;
    gemm_cuda_host_counts(h, &c, NULL, NULL);
    return c;
}

static size_t queued_blocks(gemm_cuda_host *h)
{
    size_t q;
    gemm_cuda_host_counts(h, NULL, NULL, &q);
    return q;
}

/* A block taken, locked by slot 0 and given back: cached. */
static void *locked_block(gemm_cuda_host *h, gemm_allocator *a, size_t bytes)
{
    void *p = a->alloc(a->ctx, bytes);
    assert_non_null(p);
    assert_int_equal(gemm_cuda_host_pin(h, p, 0), 0); /* slot 0's registration locks it */
    return p;
}

static void test_reuse(void **st)
{
    (void)st;
    gemm_cuda_host *h = open_host(64 * MB);
    gemm_allocator a = gemm_cuda_host_allocator(h);

    /* never locked: not kept */
    void *plain = a.alloc(a.ctx, 100);
    a.free(a.ctx, plain);
    assert_int_equal(cached_blocks(h), 0);

    /* a 100-byte block, locked: kept, and reused by a 1000-byte request */
    void *tiny = locked_block(h, &a, 100);
    a.free(a.ctx, tiny);
    assert_int_equal(cached_blocks(h), 1);
    void *again = a.alloc(a.ctx, 1000);
    assert_ptr_equal(again, tiny);
    assert_int_equal(cached_blocks(h), 0);
    assert_int_equal(gemm_cuda_host_pin(h, again, 0), 0);
    assert_int_equal(atomic_load(&register_calls), 1); /* no second registration */

    /* 3 MiB cached: a 2 MiB request does not take it, one within an eighth does */
    void *big = locked_block(h, &a, 3 * MB);
    a.free(a.ctx, big);
    void *mid = a.alloc(a.ctx, 2 * MB);
    assert_ptr_not_equal(mid, big);
    void *near = a.alloc(a.ctx, 3 * MB - 200 * KB);
    assert_ptr_equal(near, big);

    /* the smallest that fits: blocks of 2, 3 and 5 pages cached; requests take each */
    void *p2 = locked_block(h, &a, 2 * PAGE - HDR), *p3 = locked_block(h, &a, 3 * PAGE - HDR),
         *p5 = locked_block(h, &a, 5 * PAGE - HDR);
    a.free(a.ctx, p5);
    a.free(a.ctx, p3);
    a.free(a.ctx, p2);
    check_lists(h);
    assert_ptr_equal(a.alloc(a.ctx, 2 * PAGE - HDR - 10), p2);
    assert_ptr_equal(a.alloc(a.ctx, 3 * PAGE - HDR), p3);
    void *q = a.alloc(a.ctx, 3 * PAGE - HDR); /* 5 pages is more than an eighth and a page over */
    assert_ptr_not_equal(q, p5);
    check_lists(h);

    a.free(a.ctx, again), a.free(a.ctx, mid), a.free(a.ctx, near), a.free(a.ctx, p2), a.free(a.ctx, p3),
        a.free(a.ctx, q);
    check_lists(h);
    size_t in_use;
    gemm_cuda_host_counts(h, NULL, &in_use, NULL);
    assert_int_equal(in_use, 0);
    gemm_cuda_host_close(h);
    assert_int_equal(atomic_load(&registered_now), 0); /* close unregistered what it held */
}

static void test_bounds(void **st)
{
    (void)st;
    /* bytes: room for three 2-page blocks; the fourth pushes the oldest out */
    gemm_cuda_host *h = open_host(3 * (2 * PAGE - HDR));
    gemm_allocator a = gemm_cuda_host_allocator(h);
    void *b[4];
    for (int i = 0; i < 4; i++) b[i] = locked_block(h, &a, 2 * PAGE - HDR);
    for (int i = 0; i < 4; i++) a.free(a.ctx, b[i]);
    assert_int_equal(cached_blocks(h), 3);
    assert_int_equal(queued_blocks(h), 1);
    check_lists(h);
    /* the oldest (b[0]) went: the three others come back, b[0] does not */
    void *got[3];
    for (int i = 0; i < 3; i++) {
        got[i] = a.alloc(a.ctx, 2 * PAGE - HDR);
        assert_true(got[i] == b[1] || got[i] == b[2] || got[i] == b[3]);
    }
    assert_int_equal(cached_blocks(h), 0);
    assert_int_equal(atomic_load(&registered_now), 4);
    assert_int_equal(gemm_cuda_host_drain(h, 0), 1); /* b[0] unregistered and freed */
    assert_int_equal(atomic_load(&registered_now), 3);
    for (int i = 0; i < 3; i++) a.free(a.ctx, got[i]);
    gemm_cuda_host_close(h);
    assert_int_equal(atomic_load(&registered_now), 0);

    /* blocks: at most MAX_CACHED, whatever the bytes */
    h = open_host(1024 * MB);
    a = gemm_cuda_host_allocator(h);
    enum { N = MAX_CACHED + 44 };
    void **many = calloc(N, sizeof *many);
    assert_non_null(many);
    for (int i = 0; i < N; i++) many[i] = locked_block(h, &a, 100);
    for (int i = 0; i < N; i++) a.free(a.ctx, many[i]);
    assert_int_equal(cached_blocks(h), MAX_CACHED);
    assert_int_equal(queued_blocks(h), N - MAX_CACHED);
    check_lists(h);
    assert_int_equal(gemm_cuda_host_drain(h, 0), N - MAX_CACHED);
    assert_int_equal(gemm_cuda_host_trim(h), (size_t)MAX_CACHED * (PAGE - HDR));
    assert_int_equal(cached_blocks(h), 0);
    assert_int_equal(gemm_cuda_host_drain(h, 0), MAX_CACHED);
    assert_int_equal(atomic_load(&registered_now), 0);
    free(many);
    gemm_cuda_host_close(h);
}

static void test_reset(void **st)
{
    (void)st;
    gemm_cuda_host *h = open_host(64 * MB);
    gemm_allocator a = gemm_cuda_host_allocator(h);
    void *on0 = locked_block(h, &a, 10 * KB);
    void *p = a.alloc(a.ctx, 20 * KB);
    assert_int_equal(gemm_cuda_host_pin(h, p, 1), 1); /* locked by slot 1: says so */
    void *held = locked_block(h, &a, 30 * KB);    /* still handed out at the reset */
    a.free(a.ctx, on0);
    a.free(a.ctx, p);
    assert_int_equal(cached_blocks(h), 2);
    gemm_cuda_host_device_lost(h, 0);
    gemm_cuda_host_device_reset(h, 0);
    assert_int_equal(cached_blocks(h), 1); /* slot 1's stays */
    check_lists(h);
    /* the held block's registration went with the reset: the next pin registers again */
    int calls = atomic_load(&register_calls);
    assert_int_equal(gemm_cuda_host_pin(h, held, 0), 0);
    assert_int_equal(atomic_load(&register_calls), calls + 1);
    /* a failed registration leaves the block pageable, and it is not kept */
    void *pageable = a.alloc(a.ctx, 50 * KB);
    atomic_store(&fail_register, 1);
    assert_int_equal(gemm_cuda_host_pin(h, pageable, 0), GEMM_PIN_PAGEABLE);
    atomic_store(&fail_register, 0);
    size_t before = cached_blocks(h);
    a.free(a.ctx, pageable);
    assert_int_equal(cached_blocks(h), before);
    a.free(a.ctx, held);
    check_lists(h);
    gemm_cuda_host_close(h);
}

/* Two devices: a block slot 0 locked serves slot 1 through slot 0's registration (pin says
 * whose, with no second registration), until slot 0 is about to be reset: from then on
 * (before the reset drops the registration) no device takes it as locked, a freed one is not
 * kept, and the next pin registers it again for the device that asks. */
static void test_foreign_then_lost(void **st)
{
    (void)st;
    gemm_cuda_host *h = open_host(64 * MB);
    gemm_allocator a = gemm_cuda_host_allocator(h);
    void *p = locked_block(h, &a, 10 * KB), *q = locked_block(h, &a, 10 * KB);
    int calls = atomic_load(&register_calls);
    assert_int_equal(gemm_cuda_host_pin(h, p, 1), 0); /* slot 0's registration, used by slot 1 */
    assert_int_equal(atomic_load(&register_calls), calls);
    gemm_cuda_host_device_lost(h, 0); /* slot 0's reset begins */
    assert_int_equal(gemm_cuda_host_pin(h, p, 1), 1); /* registered again, by slot 1 */
    assert_int_equal(atomic_load(&register_calls), calls + 1);
    size_t before = cached_blocks(h);
    a.free(a.ctx, q); /* slot 0's registration no longer counts: not kept */
    assert_int_equal(cached_blocks(h), before);
    gemm_cuda_host_device_reset(h, 0);
    a.free(a.ctx, p); /* slot 1's: kept */
    assert_int_equal(cached_blocks(h), before + 1);
    check_lists(h);
    gemm_cuda_host_close(h);
}

struct account {
    int64_t charged;
    int64_t limit;
};

static int charge(void *ctx, int64_t delta)
{
    struct account *ac = ctx;
    if (delta > 0 && ac->charged + delta > ac->limit) return -1;
    ac->charged += delta;
    return 0;
}

static void test_charge(void **st)
{
    (void)st;
    gemm_cuda_host *h = open_host(64 * MB);
    gemm_allocator a = gemm_cuda_host_allocator(h);
    struct account ac = {0, 3 * PAGE};
    gemm_cuda_host_set_charge(h, charge, &ac);
    void *x = locked_block(h, &a, 2 * PAGE - HDR), *y = locked_block(h, &a, 2 * PAGE - HDR);
    a.free(a.ctx, x);
    assert_int_equal(ac.charged, 2 * PAGE - HDR); /* kept, charged */
    a.free(a.ctx, y);                             /* no room in the account: let go */
    assert_int_equal(cached_blocks(h), 1);
    assert_int_equal(queued_blocks(h), 1);
    void *z = a.alloc(a.ctx, 2 * PAGE - HDR); /* reused: uncharged */
    assert_ptr_equal(z, x);
    assert_int_equal(ac.charged, 0);
    a.free(a.ctx, z);
    assert_int_equal(gemm_cuda_host_trim(h), 2 * PAGE - HDR);
    assert_int_equal(ac.charged, 0);
    check_lists(h);
    gemm_cuda_host_set_charge(h, NULL, NULL);
    gemm_cuda_host_close(h);
    assert_int_equal(atomic_load(&registered_now), 0);
}

struct churn_arg {
    gemm_cuda_host *h;
    unsigned seed;
};

static void *churn_main(void *p)
{
    struct churn_arg *c = p;
    gemm_allocator a = gemm_cuda_host_allocator(c->h);
    void *held[6] = {0};
    for (int i = 0; i < 4000; i++) {
        int k = (int)(rand_r(&c->seed) % 6);
        if (held[k]) {
            a.free(a.ctx, held[k]);
            held[k] = NULL;
        } else {
            size_t bytes = 1 + (size_t)(rand_r(&c->seed) % (40 * PAGE));
            held[k] = a.alloc(a.ctx, bytes);
            assert_non_null(held[k]);
            memset(held[k], 0x5a, bytes); /* the whole block is ours */
            if (rand_r(&c->seed) % 4) gemm_cuda_host_pin(c->h, held[k], (int)(rand_r(&c->seed) % 2));
        }
        if (i % 500 == 0) gemm_cuda_host_drain(c->h, (int)(rand_r(&c->seed) % 2));
    }
    for (int k = 0; k < 6; k++) a.free(a.ctx, held[k]);
    return NULL;
}

static void test_churn(void **st)
{
    (void)st;
    gemm_cuda_host *h = open_host(2 * MB); /* small: blocks keep being pushed out */
    enum { T = 8 };
    pthread_t th[T];
    struct churn_arg c[T];
    for (int i = 0; i < T; i++) {
        c[i] = (struct churn_arg){h, 1234u + (unsigned)i};
        assert_int_equal(pthread_create(&th[i], NULL, churn_main, &c[i]), 0);
    }
    for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
    check_lists(h);
    size_t in_use, nc, nq;
    gemm_cuda_host_counts(h, &nc, &in_use, &nq);
    assert_int_equal(in_use, 0);
    fprintf(stderr, "# after the churn: %zu cached, %zu queued\n", nc, nq);
    gemm_cuda_host_drain(h, 0);
    gemm_cuda_host_drain(h, 1);
    gemm_cuda_host_trim(h);
    gemm_cuda_host_drain(h, 0);
    gemm_cuda_host_drain(h, 1);
    assert_int_equal(cached_blocks(h), 0);
    assert_int_equal(queued_blocks(h), 0);
    assert_int_equal(atomic_load(&registered_now), 0); /* each registration undone once */
    gemm_cuda_host_close(h);
}

/* Blocks in the global cache (not in a stash). */
static int global_blocks(gemm_cuda_host *h)
{
    pthread_mutex_lock(&h->mu);
    int n = h->ncached;
    pthread_mutex_unlock(&h->mu);
    return n;
}

/* Bytes kept: the shared cache's and every stash's. */
static size_t kept_bytes(gemm_cuda_host *h)
{
    pthread_mutex_lock(&h->mu);
    size_t bytes = h->cached_bytes;
    for (int i = 0; i < MAX_STASHES; i++) {
        pthread_mutex_lock(&h->stashes[i].mu);
        bytes += h->stashes[i].bytes;
        pthread_mutex_unlock(&h->stashes[i].mu);
    }
    pthread_mutex_unlock(&h->mu);
    return bytes;
}

struct free_arg {
    gemm_allocator *a;
    void **p;
    int n;
};

static void *free_main(void *p) /* another thread (a worker) gives the blocks back */
{
    struct free_arg *f = p;
    for (int i = 0; i < f->n; i++) f->a->free(f->a->ctx, f->p[i]);
    return NULL;
}

static void free_elsewhere(gemm_allocator *a, void **p, int n)
{
    struct free_arg f = {a, p, n};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, free_main, &f), 0);
    pthread_join(t, NULL);
}

static int reset_dropped; /* test_stash: blocks its reset dropped, cached and queued */

/* What one busy thread does in test_stash (a thread of its own: the mark is for life). */
static void *stash_main(void *arg)
{
    gemm_cuda_host *h = arg;
    gemm_allocator a = gemm_cuda_host_allocator(h);
    struct account ac = {0, 1024 * MB};
    gemm_cuda_host_set_charge(h, charge, &ac);
    gemm_alloc_mark_busy_thread();
    assert_true(gemm_alloc_busy_thread());

    /* a busy thread's small blocks come back to its stash, from whichever thread frees
     * them, charged, and it takes them again without registering anew */
    void *p[3];
    for (int i = 0; i < 3; i++) p[i] = locked_block(h, &a, 16 * KB);
    a.free(a.ctx, p[0]);
    free_elsewhere(&a, p + 1, 2);
    assert_int_equal(cached_blocks(h), 3);
    assert_int_equal(global_blocks(h), 0);
    size_t cap = hdr_of(p[0])->cap;
    assert_int_equal(ac.charged, (int64_t)(3 * cap));
    void *q[3];
    for (int i = 0; i < 3; i++) {
        q[i] = a.alloc(a.ctx, 16 * KB);
        assert_true(q[i] == p[0] || q[i] == p[1] || q[i] == p[2]);
        assert_int_equal(gemm_cuda_host_pin(h, q[i], 0), 0);
    }
    assert_true(q[0] != q[1] && q[1] != q[2] && q[0] != q[2]);
    assert_int_equal(atomic_load(&register_calls), 3);
    assert_int_equal(ac.charged, 0);
    assert_int_equal(cached_blocks(h), 0);
    free_elsewhere(&a, q, 3);

    /* a block over STASH_MAX_CAP (a 256^2 float32 matrix) goes to the cache that every
     * thread shares */
    void *big = locked_block(h, &a, 256 * KB);
    a.free(a.ctx, big);
    assert_int_equal(global_blocks(h), 1);

    /* a stash holds STASH_BLOCKS at most: the oldest go to the shared cache */
    enum { N = STASH_BLOCKS + 6 };
    void *many[N];
    for (int i = 0; i < N; i++) many[i] = locked_block(h, &a, 16 * KB);
    free_elsewhere(&a, many, N);
    assert_int_equal(cached_blocks(h), N + 1);
    assert_int_equal(global_blocks(h), 6 + 1);
    check_lists(h);

    /* The stash was full of 16 KiB blocks: 128 KiB blocks coming back push them out */
    enum { M = STASH_BLOCKS + 3 };
    void *mid[M];
    for (int i = 0; i < M; i++) mid[i] = locked_block(h, &a, 128 * KB);
    free_elsewhere(&a, mid, M);
    size_t mcap = hdr_of(mid[0])->cap;
    assert_true(mcap <= STASH_MAX_CAP);
    int stashed = (int)(cached_blocks(h) - (size_t)global_blocks(h));
    assert_int_equal(stashed, STASH_BLOCKS);
    pthread_mutex_lock(&my_stash_ptr->mu);
    for (int i = 0; i < my_stash_ptr->n; i++) assert_int_equal(my_stash_ptr->b[i]->cap, mcap);
    pthread_mutex_unlock(&my_stash_ptr->mu);
    check_lists(h);

    /* the block given back last is taken first (LIFO within the smallest that fits) */
    void *l1 = a.alloc(a.ctx, 128 * KB), *l2 = a.alloc(a.ctx, 128 * KB);
    assert_true(l1 == mid[M - 1] && l2 == mid[M - 2]);
    a.free(a.ctx, l2);
    a.free(a.ctx, l1);
    assert_ptr_equal(a.alloc(a.ctx, 128 * KB), l1);
    a.free(a.ctx, l1);
    assert_int_equal(ac.charged, (int64_t)kept_bytes(h)); /* stashed or not, every kept byte is charged */

    /* a reset of the slot drops the stashed blocks with the others, uncharged (the fake
     * driver keeps counting them as registered: the reset's own undoing is not modelled) */
    reset_dropped = (int)(cached_blocks(h) + queued_blocks(h)); /* all slot 0's */
    gemm_cuda_host_device_lost(h, 0);
    gemm_cuda_host_device_reset(h, 0);
    assert_int_equal(cached_blocks(h), 0);
    assert_int_equal(ac.charged, 0);

    /* taking the hook off uncharges what the stash holds; trim lets it go to the queue */
    void *r = locked_block(h, &a, 16 * KB);
    a.free(a.ctx, r);
    assert_int_equal(ac.charged, (int64_t)cap);
    gemm_cuda_host_set_charge(h, NULL, NULL);
    assert_int_equal(ac.charged, 0);
    size_t q0 = queued_blocks(h);
    assert_int_equal(gemm_cuda_host_trim(h), cap);
    assert_int_equal(queued_blocks(h), q0 + 1);

    /* a hook whose account cannot take what the stash holds when it is set: all let go,
     * nothing charged; blocks given back later are charged to it */
    void *s1 = locked_block(h, &a, 16 * KB), *s2 = locked_block(h, &a, 16 * KB);
    a.free(a.ctx, s1);
    a.free(a.ctx, s2);
    assert_int_equal(cached_blocks(h), 2);
    struct account small = {0, (int64_t)cap};
    gemm_cuda_host_set_charge(h, charge, &small);
    assert_int_equal(cached_blocks(h), 0);
    assert_int_equal(small.charged, 0);
    void *s3 = locked_block(h, &a, 16 * KB);
    a.free(a.ctx, s3);
    assert_int_equal(small.charged, (int64_t)cap);
    assert_int_equal(cached_blocks(h), 1);
    assert_ptr_equal(a.alloc(a.ctx, 16 * KB), s3);
    assert_int_equal(small.charged, 0);
    a.free(a.ctx, s3);
    gemm_cuda_host_set_charge(h, NULL, NULL);
    assert_int_equal(small.charged, 0);
    size_t in_use;
    gemm_cuda_host_counts(h, NULL, &in_use, NULL);
    assert_int_equal(in_use, 0);
    return NULL;
}

static void test_stash(void **st)
{
    (void)st;
    gemm_cuda_host *h = open_host(64 * MB);
    assert_false(gemm_alloc_busy_thread()); /* cmocka's thread is not marked */
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, stash_main, h), 0);
    pthread_join(t, NULL);
    gemm_cuda_host_drain(h, 0);
    gemm_cuda_host_close(h);
    assert_int_equal(atomic_load(&registered_now), reset_dropped); /* every other one undone */
}

/* Busy threads taking blocks, half of them given back by a worker thread (through a
 * hand-off list), the other half by themselves, with trims and drains meanwhile. */
struct handoff {
    pthread_mutex_t mu;
    void *p[4096];
    int n, done;
};

struct stash_churn_arg {
    gemm_cuda_host *h;
    struct handoff *ho;
    unsigned seed;
};

static void *stash_churn_main(void *p)
{
    struct stash_churn_arg *c = p;
    gemm_allocator a = gemm_cuda_host_allocator(c->h);
    gemm_alloc_mark_busy_thread();
    void *held[6] = {0};
    size_t len[6] = {0};
    const unsigned char base = (unsigned char)(c->seed & 0xff); /* this thread's: base + slot */
    for (int i = 0; i < 3000; i++) {
        int k = (int)(rand_r(&c->seed) % 6);
        if (held[k]) {
            /* still all ours: no block is handed out twice */
            const unsigned char *q = held[k], mark = (unsigned char)(base + k);
            assert_true(q[0] == mark && q[len[k] / 2] == mark && q[len[k] - 1] == mark);
            int mine = rand_r(&c->seed) % 2;
            pthread_mutex_lock(&c->ho->mu);
            if (!mine && c->ho->n < 4096) {
                c->ho->p[c->ho->n++] = held[k];
                held[k] = NULL;
            }
            pthread_mutex_unlock(&c->ho->mu);
            if (held[k]) a.free(a.ctx, held[k]);
            held[k] = NULL;
        } else {
            size_t bytes = 1 + (size_t)(rand_r(&c->seed) % (60 * PAGE)); /* stashed and not */
            held[k] = a.alloc(a.ctx, bytes);
            assert_non_null(held[k]);
            memset(held[k], base + k, bytes);
            len[k] = bytes;
            if (rand_r(&c->seed) % 8) gemm_cuda_host_pin(c->h, held[k], (int)(rand_r(&c->seed) % 2));
        }
        if (i % 700 == 0) gemm_cuda_host_trim(c->h);
        if (i % 500 == 0) gemm_cuda_host_drain(c->h, (int)(rand_r(&c->seed) % 2));
    }
    for (int k = 0; k < 6; k++) a.free(a.ctx, held[k]);
    return NULL;
}

static void *handoff_main(void *p)
{
    struct stash_churn_arg *c = p;
    gemm_allocator a = gemm_cuda_host_allocator(c->h);
    for (;;) {
        pthread_mutex_lock(&c->ho->mu);
        int n = c->ho->n, done = c->ho->done;
        void *take[64];
        int t = 0;
        while (c->ho->n > 0 && t < 64) take[t++] = c->ho->p[--c->ho->n];
        pthread_mutex_unlock(&c->ho->mu);
        for (int i = 0; i < t; i++) a.free(a.ctx, take[i]);
        if (done && n == 0) return NULL;
    }
}

static void test_stash_churn(void **st)
{
    (void)st;
    gemm_cuda_host *h = open_host(8 * MB);
    struct handoff ho = {.n = 0, .done = 0};
    pthread_mutex_init(&ho.mu, NULL);
    enum { T = 8 };
    pthread_t th[T], w;
    struct stash_churn_arg c[T], wc = {h, &ho, 0};
    assert_int_equal(pthread_create(&w, NULL, handoff_main, &wc), 0);
    for (int i = 0; i < T; i++) {
        c[i] = (struct stash_churn_arg){h, &ho, 0x700u + 17u * (unsigned)i}; /* distinct low bytes */
        assert_int_equal(pthread_create(&th[i], NULL, stash_churn_main, &c[i]), 0);
    }
    for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
    pthread_mutex_lock(&ho.mu);
    ho.done = 1;
    pthread_mutex_unlock(&ho.mu);
    pthread_join(w, NULL);
    check_lists(h);
    size_t in_use, nc, nq;
    gemm_cuda_host_counts(h, &nc, &in_use, &nq);
    assert_int_equal(in_use, 0);
    fprintf(stderr, "# after the churn with stashes: %zu cached, %zu queued\n", nc, nq);
    gemm_cuda_host_trim(h);
    gemm_cuda_host_drain(h, 0);
    gemm_cuda_host_drain(h, 1);
    assert_int_equal(cached_blocks(h), 0);
    assert_int_equal(queued_blocks(h), 0);
    assert_int_equal(atomic_load(&registered_now), 0);
    pthread_mutex_destroy(&ho.mu);
    gemm_cuda_host_close(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reuse),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_reset),
        cmocka_unit_test(test_foreign_then_lost),
        cmocka_unit_test(test_charge),
        cmocka_unit_test(test_churn),
        cmocka_unit_test(test_stash),
        cmocka_unit_test(test_stash_churn),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else /* a build without CUDA has no host block cache: say so, as TAP's skip */

#include <stdio.h>

int main(void)
{
    printf("1..1\nok 1 - the host block cache # SKIP built without CUDA: the cache is the CUDA backend's\n");
    return 0;
}

#endif
