/*
 * backend.c - what the engine's files and every backend share, calling none of them: errors,
 * job states and sizes, host memory, the parsing of fault_inject.
 */
#include "engine_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void gemm_engine_err_clear(gemm_engine_err *e)
{
    if (!e) return;
    e->code = GEMM_E_NONE;
    e->message[0] = '\0';
}

int gemm_engine_err_set(gemm_engine_err *e, gemm_ecode code, const char *fmt, ...)
{
    if (!e) return -1;
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

const gemm_allocator *gemm_engine_allocator(gemm_engine *e)
{
    const gemm_allocator *a = (e && e->be->allocator) ? e->be->allocator(e->self) : NULL;
    return a ? a : &gemm_allocator_host;
}

void *gemm_engine_host_alloc(gemm_engine *e, size_t bytes)
{
    return gemm_alloc(gemm_engine_allocator(e), bytes);
}

void gemm_engine_host_free(gemm_engine *e, void *p)
{
    gemm_free(gemm_engine_allocator(e), p);
}

const char *gemm_job_state_name(gemm_job_state s)
{
    static const char *const names[] = {"queued", "running", "done", "failed", "cancelled"}; /* gemm_job_state */
    return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "invalid";
}

int gemm_job_bytes(const gemm_job *job, size_t out[3])
{
    uint64_t nb = gemm_job_batch(job), nbb = job->b_shared ? 1 : nb;
    size_t a, b, c;
    return gemm_matrix_bytes(job->m, job->k, job->dtype, &a) && gemm_matrix_bytes(job->k, job->n, job->dtype, &b) &&
           gemm_matrix_bytes(job->m, job->n, gemm_job_c_dtype(job), &c) && (uint64_t)(size_t)nb == nb &&
           gemm_mul_size(a, (size_t)nb, &out[0]) && gemm_mul_size(b, (size_t)nbb, &out[1]) &&
           gemm_mul_size(c, (size_t)nb, &out[2]);
}

int gemm_job_stop_cancelled(gemm_job *job, const char *stage)
{
    gemm_engine_err_set(&job->err, GEMM_E_CANCELLED,
                        "the job was cancelled while running; it stopped before %s", stage);
    return GEMM_RUN_CANCELLED;
}

int gemm_faults_parse(const gemm_backend *be, const char *spec, void *state, gemm_engine_err *err)
{
    char buf[sizeof((gemm_engine_config *)0)->fault_inject];
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ') tok++;
        if (!*tok) continue;
        char *colon = strchr(tok, ':'), *end = NULL;
        long v = colon ? strtol(colon + 1, &end, 10) : -1;
        const gemm_fault_hook *h = be->faults;
        for (; h && h->name && colon; h++)
            if ((size_t)(colon - tok) == strlen(h->name) && strncmp(tok, h->name, strlen(h->name)) == 0) break;
        if (h && h->name && colon && end != colon + 1 && *end == '\0' && v >= h->min && v <= h->max) {
            *(long *)(void *)((char *)state + h->offset) = v;
            continue;
        }
        char list[256] = "";
        size_t off = 0;
        for (h = be->faults; h && h->name && off < sizeof list; h++)
            off += h->min == h->max
                       ? (size_t)snprintf(list + off, sizeof list - off, "%s%s:%ld", off ? ", " : "", h->name, h->min)
                       : (size_t)snprintf(list + off, sizeof list - off, "%s%s:N (%ld to %ld)", off ? ", " : "",
                                          h->name, h->min, h->max);
        return gemm_engine_err_set(err, GEMM_E_BAD_CONFIG, "fault_inject \"%s\": the %s backend understands %s", tok,
                                   be->name, off ? list : "no hooks");
    }
    return 0;
}
