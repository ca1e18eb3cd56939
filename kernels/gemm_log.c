/* gemm_log.c - the engine's logging hook (gemm_log.h): read under a mutex, called without. */
#include "gemm_log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

static pthread_mutex_t hook_mu = PTHREAD_MUTEX_INITIALIZER;
static gemm_log_fn hook_fn;
static void *hook_user;

void gemm_engine_set_log(gemm_log_fn fn, void *user)
{
    pthread_mutex_lock(&hook_mu);
    hook_fn = fn;
    hook_user = user;
    pthread_mutex_unlock(&hook_mu);
}

void gemm_engine_log(gemm_log_level level, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n < 0) msg[0] = '\0';

    pthread_mutex_lock(&hook_mu);
    gemm_log_fn fn = hook_fn;
    void *user = hook_user;
    pthread_mutex_unlock(&hook_mu);
    if (fn) {
        fn(user, level, msg);
        return;
    }
    if (level == GEMM_LOG_DEBUG) return;
    /* One write per line, so lines from several threads do not interleave. */
    char line[1100];
    static const char *const names[] = {"error", "warn", "info"};
    int len = snprintf(line, sizeof line, "gemmd engine %s: %s\n", (unsigned)level < 3 ? names[level] : "debug", msg);
    if (len <= 0) return;
    if ((size_t)len >= sizeof line) {
        len = (int)sizeof line - 1;
        line[len - 1] = '\n';
    }
    ssize_t w = write(STDERR_FILENO, line, (size_t)len);
    (void)w;
}
