/*
 * main.c - gemmd: read the configuration, open the engine, serve HTTP until SIGINT or
 * SIGTERM, then stop gracefully (docs/OPERATIONS.md, "Start, stop, signals").
 *
 * The signals go through a self-pipe: the BLAS library starts its threads before main(),
 * so they never inherit a signal mask set here and sigwait() could miss a signal.
 * The main thread also watches the engine for the loss of every device (restart.h;
 * docs/OPERATIONS.md, "Faults").
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <pthread.h>
#include <unistd.h>

#include "budget.h"
#include "config.h"
#include "engine.h"
#include "engine_err.h"
#include "fleet.h"
#include "http.h"
#include "instance.h"
#include "log.h"
#include "metrics.h"
#include "routes.h"
#include "restart.h"

#define WATCH_MS 100
#define DEVICE_LOST 0 /* wait_event(): the engine lost its devices (signals are > 0) */

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

static int mask_stop_signals(int how)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    return pthread_sigmask(how, &set, NULL);
}

static int install_signals(void)
{
    if (pipe(signal_pipe) != 0) return -1;
    for (int i = 0; i < 2; i++) fcntl(signal_pipe[i], F_SETFD, FD_CLOEXEC);
    fcntl(signal_pipe[1], F_SETFL, O_NONBLOCK);
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0) return -1;
    signal(SIGPIPE, SIG_IGN);
    /* A restart blocks these before exec, so that one arriving meanwhile stays pending
     * for the new process, which takes it here. */
    return mask_stop_signals(SIG_UNBLOCK) == 0 ? 0 : -1;
}

/* The next signal, or DEVICE_LOST when `engine` (if not NULL) has become unhealthy. */
static int wait_event(gemm_engine *engine)
{
    for (;;) {
        struct pollfd p = {signal_pipe[0], POLLIN, 0};
        int r = poll(&p, 1, engine ? WATCH_MS : -1);
        if (r < 0 && errno != EINTR) return SIGTERM; /* cannot happen; stop rather than spin */
        if (r > 0) {
            unsigned char b = 0;
            ssize_t n = read(signal_pipe[0], &b, 1);
            if (n == 1) return b;
            if (n < 0 && errno != EINTR && errno != EAGAIN) return SIGTERM;
        }
        if (engine && !gemm_engine_healthy(engine)) return DEVICE_LOST;
    }
}

/* A signal that arrived while stopping for a restart: then stop for good. */
static int signal_pending(void)
{
    struct pollfd p = {signal_pipe[0], POLLIN, 0};
    return poll(&p, 1, 0) > 0;
}

/* The engine's messages (kernels/, gemm_log.h) go into this log with their level. */
static void engine_log(void *user, gemm_log_level level, const char *msg)
{
    (void)user;
    gemmd_log(level <= GEMM_LOG_DEBUG ? (gemmd_log_level)level : GEMMD_LOG_ERROR, "%s", msg);
}

/* A start that failed on the configuration (a value, a file it names, the address) exits
 * 2, as a bad value in it does; any other failure 1. */
static int exit_code(const gemm_err *err)
{
    return strcmp(err->code, "bad_config") == 0 ? 2 : 1;
}

static void describe_devices(const gemm_engine_info *info, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = '\0';
    for (int i = 0; i < info->ndevices && n + 1 < cap; i++) {
        int w = snprintf(out + n, cap - n, "%s\"%s\"", i ? "," : "", info->devices[i].name);
        if (w < 0) break;
        n += (size_t)w;
    }
    if (info->ndevices == 0) snprintf(out, cap, "\"%s\"", info->backend);
}

int main(int argc, char **argv)
{
    gemmd_config cfg;
    int rc = gemmd_config_from_args(&cfg, argc, argv, environ);
    if (rc > 0) return 0;  /* --help / --version */
    if (rc < 0) return 2;  /* the message is printed (the values checked together too) */
    int level = gemmd_log_level_from_name(cfg.log_level);
    gemmd_log_set_level(level < 0 ? GEMMD_LOG_INFO : (gemmd_log_level)level);
    const char *labels[GEMMD_METRIC_ROUTES];
    gemmd_metrics_init(labels, gemmd_routes_labels(labels, GEMMD_METRIC_ROUTES));
    gemmd_config_resolve_instance(&cfg);
    cfg.http_threads = gemmd_config_http_threads(&cfg); /* the log and /v1/info show it */
    if (gemmd_instance_set(cfg.instance_id) != 0) { /* a derived name is always valid */
        fprintf(stderr, "gemmd: instance_id: '%s' is not valid\n", cfg.instance_id);
        return 2;
    }

    int restarts = gemmd_restart_count();
    int listen_fd = gemmd_restart_inherited_socket(cfg.listen, cfg.port);
    if (restarts > 0 && cfg.engine.fault_inject[0]) {
        /* Test hook rule: a hook fires in the first process only, or a restart would
         * inject the same fault again. */
        LOG_INFO("restart %d: ignoring fault_inject = %s (a test hook applies to the first process only)",
                 restarts, cfg.engine.fault_inject);
        cfg.engine.fault_inject[0] = '\0';
    }

    if (install_signals() != 0) {
        fprintf(stderr, "gemmd: cannot install the signal handlers: %s\n", strerror(errno));
        if (listen_fd >= 0) close(listen_fd);
        return 1;
    }

    gemm_err err;
    gemm_err_clear(&err);
    gemm_engine_set_log(engine_log, NULL);
    /* Page-locked blocks the CUDA engine keeps after their request freed them: at most a
     * quarter of the memory budget (the engine caps it at its own 1 GiB), and charged to
     * it as "cache" while kept (http.c), so they only take room no request needs. */
    uint64_t quarter = gemmd_budget_limit(cfg.max_inflight_bytes) / 4;
    cfg.engine.host_cache_bytes = quarter > 0 ? quarter : 1;
    gemm_engine_err eerr;
    gemm_engine *engine = gemm_engine_open(&cfg.engine, &eerr);
    if (!engine) {
        gemmd_engine_err(&eerr, &err);
        LOG_ERROR("engine did not start: %s (%s)", err.message, err.code);
        if (listen_fd >= 0) close(listen_fd);
        return exit_code(&err);
    }
    gemmd_config_warn_idle(&cfg, engine);
    gemmd_fleet_start(gemm_now_ms());
    gemmd_server *srv = gemmd_http_start_fd(&cfg, engine, listen_fd, &err);
    if (!srv) {
        LOG_ERROR("http did not start: %s (%s)", err.message, err.code);
        gemm_engine_close(engine);
        return exit_code(&err);
    }
    gemm_engine_info info;
    gemm_engine_describe(engine, &info);
    char devices[512];
    describe_devices(&info, devices, sizeof devices);
    char restarted[64] = "";
    if (restarts > 0)
        snprintf(restarted, sizeof restarted, " restart=%d listen_fd=%s", restarts, listen_fd >= 0 ? "inherited" : "new");
    LOG_INFO("gemmd %s listening url=%s instance=%s backend=%s devices=[%s] workers=%d queue=%d http_threads=%d%s%s%s",
             GEMMD_VERSION, gemmd_http_url(srv), gemmd_instance_get(), info.backend, devices, info.workers,
             info.queue_capacity,
             cfg.http_threads, restarted, cfg.config_path[0] ? " config=" : "", cfg.config_path);

    int sig = wait_event(engine);
    if (sig == DEVICE_LOST) {
        char why[160] = "restart_on_device_loss = false";
        if (cfg.restart_on_device_loss && gemmd_restart_allowed(why, sizeof why)) {
            LOG_ERROR("the engine lost every device it uses (backend=%s devices=[%s]); restarting gemmd in place "
                      "(restart %d; the listening socket is kept, queued work fails with 503, running work "
                      "finishes, async job results kept in memory are lost)",
                      info.backend, devices, restarts + 1);
            int keep = gemmd_http_shutdown(srv, 1);
            gemm_engine_close(engine);
            mask_stop_signals(SIG_BLOCK);
            if (signal_pending()) {
                LOG_INFO("received a stop signal while restarting: stopped");
                if (keep >= 0) close(keep);
                return 0;
            }
            gemmd_restart_exec(argv, keep);
            LOG_ERROR("restart failed: cannot exec /proc/self/exe: %s", strerror(errno));
            if (keep >= 0) close(keep);
            return 1;
        }
        LOG_ERROR("the engine lost every device it uses (backend=%s devices=[%s]) and gemmd does not restart "
                  "itself (%s): products fail with 503, /healthz and /readyz answer 503; restart the process",
                  info.backend, devices, why);
        sig = wait_event(NULL);
    }
    LOG_INFO("received %s: stopping (no new connections, queued work fails with 503, running work finishes)",
             sig == SIGINT ? "SIGINT" : "SIGTERM");
    gemmd_http_shutdown(srv, 0);
    gemm_engine_close(engine);
    LOG_INFO("stopped");
    close(signal_pipe[0]);
    close(signal_pipe[1]);
    return 0;
}
