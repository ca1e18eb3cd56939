/*
 * gemm_log.h - how the engine and the kernels log: one process-wide hook set by the daemon;
 * without one, stderr ("gemmd engine warn: ..."), debug dropped. From C, C++, any thread.
 */
#ifndef GEMM_LOG_H
#define GEMM_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

/* The same order as the daemon's levels (server/log.h). */
typedef enum { GEMM_LOG_ERROR = 0, GEMM_LOG_WARN, GEMM_LOG_INFO, GEMM_LOG_DEBUG } gemm_log_level;

/* msg: one line, no newline; called on the thread that logs, must not call the engine. */
typedef void (*gemm_log_fn)(void *user, gemm_log_level level, const char *msg);

/* Sets the hook (NULL: back to stderr). */
void gemm_engine_set_log(gemm_log_fn fn, void *user);

void gemm_engine_log(gemm_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif
#endif /* GEMM_LOG_H */
