/*
 * log.h - one-line structured logs on stderr: time, level, message (key=value pairs).
 */
#ifndef GEMMD_LOG_H
#define GEMMD_LOG_H

typedef enum { GEMMD_LOG_ERROR = 0, GEMMD_LOG_WARN, GEMMD_LOG_INFO, GEMMD_LOG_DEBUG } gemmd_log_level;

/* "error", "warn", "info", "debug"; returns -1 for anything else. */
int gemmd_log_level_from_name(const char *name);
void gemmd_log_set_level(gemmd_log_level level);
int gemmd_log_enabled(gemmd_log_level level);
void gemmd_log(gemmd_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#define LOG_ERROR(...) gemmd_log(GEMMD_LOG_ERROR, __VA_ARGS__)
#define LOG_WARN(...) gemmd_log(GEMMD_LOG_WARN, __VA_ARGS__)
#define LOG_INFO(...) gemmd_log(GEMMD_LOG_INFO, __VA_ARGS__)
#define LOG_DEBUG(...) do { if (gemmd_log_enabled(GEMMD_LOG_DEBUG)) gemmd_log(GEMMD_LOG_DEBUG, __VA_ARGS__); } while (0)
#endif
