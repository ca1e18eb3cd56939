/*
 * restart.c - restarting the daemon in place: the inherited listening socket, the
 * restart limit and the exec itself (see restart.h).
 */
#include "restart.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gemm_types.h"
#include "log.h"
#include "options.h"

/* Decimal digits up to 10^9 (what gemmd_restart_exec writes); -1 otherwise. */
static int parse_nonneg(const char *s)
{
    uint64_t v;
    return gemm_parse_u64(s, &v) == 0 && v <= 1000000000u ? (int)v : -1;
}

int gemmd_restart_count(void)
{
    int n = parse_nonneg(getenv("GEMMD_RESTARTS"));
    return n < 0 ? 0 : n;
}

int gemmd_restart_inherited_socket(const char *listen, int port)
{
    const char *v = getenv("GEMMD_LISTEN_FD");
    if (!v) return -1;
    int fd = parse_nonneg(v);
    unsetenv("GEMMD_LISTEN_FD");
    if (fd < 3) { /* never stdin/stdout/stderr */
        LOG_WARN("GEMMD_LISTEN_FD=%.20s is not a usable descriptor; binding %s:%d instead", v, listen, port);
        return -1;
    }

    unsigned char addr[16];
    int family = inet_pton(AF_INET6, listen, addr) == 1 ? AF_INET6 : AF_INET;

    const char *why = NULL;
    struct stat st;
    int type = 0, acc = 0;
    socklen_t len = sizeof type;
    struct sockaddr_storage ss;
    socklen_t sslen = sizeof ss;
    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) {
        why = "not a socket";
    } else if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) {
        why = "not a stream socket";
    } else if ((len = sizeof acc, getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &len)) != 0 || !acc) {
        why = "not listening";
    } else if (getsockname(fd, (struct sockaddr *)&ss, &sslen) != 0 || ss.ss_family != family) {
        why = "of another address family than listen";
    } else if (port != 0) {
        int got = ss.ss_family == AF_INET ? ntohs(((struct sockaddr_in *)&ss)->sin_port)
                                          : ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        if (got != port) why = "bound to another port";
    }
    if (why) {
        /* Close only what is a socket: another descriptor is not ours to touch. */
        if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)) close(fd);
        LOG_WARN("GEMMD_LISTEN_FD=%d is %s; binding %s:%d instead", fd, why, listen, port);
        return -1;
    }
    int fl = fcntl(fd, F_GETFD);
    if (fl >= 0) fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
    return fd;
}

/* Reads GEMMD_RESTART_TIMES, keeping the times inside the window; returns how many. */
static int recent_times(double now, double *out, int cap)
{
    const char *v = getenv("GEMMD_RESTART_TIMES");
    int n = 0;
    while (v && *v && n < cap) {
        char *end = NULL;
        double t = strtod(v, &end);
        if (end == v) break;
        if (t <= now && now - t < GEMMD_RESTART_WINDOW_S) out[n++] = t;
        v = *end == ',' ? end + 1 : "";
    }
    return n;
}

int gemmd_restart_allowed(char *why, size_t whylen)
{
    double t[64];
    int n = recent_times(gemm_now_ms() / 1000.0, t, 64);
    if (n < GEMMD_RESTART_MAX) return 1;
    snprintf(why, whylen, "already restarted %d times within %d s (the limit)", n, GEMMD_RESTART_WINDOW_S);
    return 0;
}

/* Every descriptor above stderr but listen_fd closes on exec: one a library opened
 * without FD_CLOEXEC (a GPU driver's device files) must not keep the old process's
 * state alive in the new one. */
static void cloexec_all_but(int keep)
{
    DIR *dir = opendir("/proc/self/fd");
    if (!dir) return;
    int self = dirfd(dir);
    struct dirent *de;
    while ((de = readdir(dir)) != NULL) {
        char *end = NULL;
        long fd = strtol(de->d_name, &end, 10);
        if (end == de->d_name || *end || fd <= 2 || fd == keep || fd == self) continue;
        int fl = fcntl((int)fd, F_GETFD);
        if (fl >= 0 && !(fl & FD_CLOEXEC)) fcntl((int)fd, F_SETFD, fl | FD_CLOEXEC);
    }
    closedir(dir);
}

int gemmd_restart_exec(char **argv, int listen_fd)
{
    double now = gemm_now_ms() / 1000.0, t[64];
    int n = recent_times(now, t, 63);
    char times[64 * 24] = "", num[32];
    size_t used = 0;
    for (int i = 0; i <= n; i++) {
        int w = snprintf(times + used, sizeof times - used, "%s%.3f", i ? "," : "", i < n ? t[i] : now);
        if (w < 0 || (size_t)w >= sizeof times - used) break;
        used += (size_t)w;
    }
    snprintf(num, sizeof num, "%d", gemmd_restart_count() + 1);
    if (setenv("GEMMD_RESTARTS", num, 1) != 0 || setenv("GEMMD_RESTART_TIMES", times, 1) != 0) return -1;
    if (listen_fd >= 0) {
        snprintf(num, sizeof num, "%d", listen_fd);
        if (setenv("GEMMD_LISTEN_FD", num, 1) != 0) return -1;
    } else {
        unsetenv("GEMMD_LISTEN_FD");
    }
    cloexec_all_but(listen_fd);
    execv("/proc/self/exe", argv);
    int saved = errno;
    unsetenv("GEMMD_LISTEN_FD");
    errno = saved;
    return -1;
}
