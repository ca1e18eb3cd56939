/*
 * log.c - one line per message on stderr: "2026-11-22T04:41:03.123Z info message".
 *
 * Each line is formatted into one buffer and written with a single write(2), so lines
 * from different threads never interleave. Messages are expected to be key=value pairs;
 * control characters in them are replaced so that one message stays one line.
 */
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static _Atomic int current_level = GEMMD_LOG_INFO;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

int gemmd_log_level_from_name(const char *name)
{
    if (!name) return -1;
    for (int i = 0; i < 4; i++)
        if (strcmp(name, level_names[i]) == 0) return i;
    return -1;
}

void gemmd_log_set_level(gemmd_log_level level)
{
    atomic_store(&current_level, (int)level);
}

int gemmd_log_enabled(gemmd_log_level level)
{
    return (int)level <= atomic_load(&current_level);
}

void gemmd_log(gemmd_log_level level, const char *fmt, ...)
{
    if (!gemmd_log_enabled(level)) return;
    char line[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int lvl = (level >= GEMMD_LOG_ERROR && level <= GEMMD_LOG_DEBUG) ? (int)level : GEMMD_LOG_ERROR;
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000L,
                     level_names[lvl]);
    if (n < 0) return;
    size_t used = (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + used, sizeof line - used, fmt, ap);
    va_end(ap);
    if (m < 0) m = 0;
    size_t end = used + (size_t)m;
    if (end > sizeof line - 2) end = sizeof line - 2; /* truncated: room for '\n' */
    for (size_t i = used; i < end; i++)
        if ((unsigned char)line[i] < 0x20 || line[i] == 0x7f) line[i] = ' ';
    line[end++] = '\n';
    size_t off = 0;
    while (off < end) {
        ssize_t w = write(STDERR_FILENO, line + off, end - off);
        if (w <= 0) break;
        off += (size_t)w;
    }
}
