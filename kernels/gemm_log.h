/*
 * gemm_log.h - how the engine and the kernels say things: one process-wide hook, set by
 * the daemon before it opens the engine; without one, stderr, one line each ("gemmd engine
 * warn: ..."), debug dropped. Usable from C and C++, from any thread.
 */
#ifndef GEMM_LOG_H
#define GEMM_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

/* The same order as the daemon's levels (server/log.h). */
typedef enum { GEMM_LOG_ERROR = 0, GEMM_LOG_WARN, GEMM_LOG_INFO, GEMM_LOG_DEBUG } gemm_log_level;

/* msg: one line, no trailing newline. Called on the thread that logs; must not call back
 * into the engine. */
typedef void (*gemm_log_fn)(void *user, gemm_log_level level, const char *msg);

/* Sets the hook (NULL: back to stderr). */
void gemm_engine_set_log(gemm_log_fn fn, void *user);

void gemm_engine_log(gemm_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif
#endif /* GEMM_LOG_H */
