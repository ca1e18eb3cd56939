/*
 * restart.h - the daemon restarts itself in place when its engine has lost every device
 * (docs/OPERATIONS.md, "Faults").
 *
 * What travels through the environment:
 *   GEMMD_LISTEN_FD=N        the inherited listening socket (read once, then removed)
 *   GEMMD_RESTARTS=N         restarts so far; > 0 means this process was restarted, and
 *                            then fault_inject (a test hook) is ignored so it fires once
 *   GEMMD_RESTART_TIMES=t,.. CLOCK_MONOTONIC seconds of the recent restarts, for the limit
 */
#ifndef GEMMD_RESTART_H
#define GEMMD_RESTART_H

#include <stddef.h>

#define GEMMD_RESTART_MAX 5          /* restarts allowed ... */
#define GEMMD_RESTART_WINDOW_S 600   /* ... within this many seconds */

/* Restarts so far (GEMMD_RESTARTS; 0 when unset or malformed). */
int gemmd_restart_count(void);

/* The socket named by GEMMD_LISTEN_FD when it is a listening stream socket of the family
 * of `listen` (an address literal) on `port` (0 = any), with FD_CLOEXEC set; else -1
 * (an unusable one is closed and a warning logged). Removes GEMMD_LISTEN_FD either way. */
int gemmd_restart_inherited_socket(const char *listen, int port);

/* 1 when another restart is within the limit; 0 with *why set otherwise. */
int gemmd_restart_allowed(char *why, size_t whylen);

/* Replaces the process: /proc/self/exe with argv, listen_fd (or none when < 0) handed
 * over, the restart count and times updated. Returns only on failure (errno set). */
int gemmd_restart_exec(char **argv, int listen_fd);

#endif
