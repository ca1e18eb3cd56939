/*
 * gemm_log.h - how the engine and the kernels say things: one process-wide hook.
 *
 * Everything kernels/ has to report (a CUDA call that failed, a device reset, a host block
 * that could not be pinned) goes through gemm_engine_log(). The daemon sets the hook once,
 * before it opens the engine, and routes the messages into its own log with their levels;
 * without a hook they go to stderr, one line each ("gemmd engine warn: ..."), debug lines
 * dropped. Usable from C and C++ (the .cu units), from any thread.
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

void gemm_engine_log(gemm_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#ifdef __cplusplus
}
#endif
#endif /* GEMM_LOG_H */
