/*
 * main.c - gemmd: read the configuration, open the engine, serve HTTP until SIGINT or
 * SIGTERM, then stop accepting, fail queued work, let running work finish and its
 * answers go out, free everything and exit 0.
 *
 * SIGINT and SIGTERM go through a self-pipe that the main thread reads: a signal can be
 * delivered to any thread, including the BLAS library's, which starts its threads before
 * main() and so never inherits a signal mask set here (sigwait() would then miss it and
 * the default action would kill the process).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "engine.h"
#include "http.h"
#include "log.h"
#include "metrics.h"

extern char **environ;

static int signal_pipe[2] = {-1, -1};

static void on_signal(int sig)
{
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    ssize_t n = write(signal_pipe[1], &b, 1); /* async-signal-safe; a full pipe is fine */
    (void)n;
    errno = saved;
}

static int install_signals(void)
{
    if (pipe(signal_pipe) != 0) return -1;
    for (int i = 0; i < 2; i++) {
        fcntl(signal_pipe[i], F_SETFD, FD_CLOEXEC);
    }
    fcntl(signal_pipe[1], F_SETFL, O_NONBLOCK);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0) return -1;
    signal(SIGPIPE, SIG_IGN);
    return 0;
}

static int wait_signal(void)
{
    unsigned char b = 0;
    for (;;) {
        ssize_t n = read(signal_pipe[0], &b, 1);
        if (n == 1) return b;
        if (n < 0 && errno == EINTR) continue;
        return SIGTERM; /* cannot happen; stop rather than spin */
    }
}

static void describe_devices(gemm_engine *engine, char *out, size_t cap)
{
    gemm_engine_info info;
    gemm_engine_describe(engine, &info);
    size_t n = 0;
    out[0] = '\0';
    for (int i = 0; i < info.ndevices && n + 1 < cap; i++) {
        int w = snprintf(out + n, cap - n, "%s\"%s\"", i ? "," : "", info.devices[i].name);
        if (w < 0) break;
        n += (size_t)w;
    }
    if (info.ndevices == 0) snprintf(out, cap, "\"%s\"", info.backend);
}

int main(int argc, char **argv)
{
    gemmd_config cfg;
    int rc = gemmd_config_from_args(&cfg, argc, argv, environ);
    if (rc > 0) return 0;  /* --help / --version */
    if (rc < 0) return 2;  /* the message is printed */
    char msg[512];
    if (gemmd_config_validate(&cfg, msg, sizeof msg) != 0) {
        fprintf(stderr, "gemmd: %s\n", msg);
        return 2;
    }
    int level = gemmd_log_level_from_name(cfg.log_level);
    gemmd_log_set_level(level < 0 ? GEMMD_LOG_INFO : (gemmd_log_level)level);
    gemmd_metrics_init();

    if (install_signals() != 0) {
        fprintf(stderr, "gemmd: cannot install the signal handlers: %s\n", strerror(errno));
        return 1;
    }

    gemm_err err;
    gemm_err_clear(&err);
    gemm_engine *engine = gemm_engine_open(&cfg.engine, &err);
    if (!engine) {
        LOG_ERROR("engine did not start: %s (%s)", err.message, err.code);
        return 1;
    }
    gemmd_server *srv = gemmd_http_start(&cfg, engine, &err);
    if (!srv) {
        LOG_ERROR("http did not start: %s (%s)", err.message, err.code);
        gemm_engine_close(engine);
        return 1;
    }
    gemm_engine_info info;
    gemm_engine_describe(engine, &info);
    char devices[512];
    describe_devices(engine, devices, sizeof devices);
    LOG_INFO("gemmd %s listening url=%s backend=%s devices=[%s] workers=%d queue=%d http_threads=%d%s%s",
             GEMMD_VERSION, gemmd_http_url(srv), info.backend, devices, info.workers, info.queue_capacity,
             cfg.http_threads, cfg.config_path[0] ? " config=" : "", cfg.config_path);

    int sig = wait_signal();
    LOG_INFO("received %s: stopping (no new connections, queued work fails with 503, running work finishes)",
             sig == SIGINT ? "SIGINT" : "SIGTERM");
    gemmd_http_shutdown(srv);
    gemm_engine_close(engine);
    LOG_INFO("stopped");
    close(signal_pipe[0]);
    close(signal_pipe[1]);
    return 0;
}
