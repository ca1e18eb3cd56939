/*
 * progress.c - Ctrl-C and the progress bar of the `gemm` command.
 *
 * SIGINT only sets a flag; libgemm calls the progress callback many times a second during
 * a transfer (and while waiting to retry or polling a job), and the callback answers
 * "stop" once the flag is set, so curl aborts the transfer and the command can remove its
 * partial output and exit 130. A second Ctrl-C kills the process the usual way.
 */
#include "cli.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

volatile sig_atomic_t gemm_cli_interrupted = 0;
gemm_cli_progress gemm_cli_bar;

static void on_sigint(int sig)
{
    (void)sig;
    gemm_cli_interrupted = 1;
    signal(SIGINT, SIG_DFL);
}

void gemm_cli_install_sigint(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: blocking calls return EINTR */
    sigaction(SIGINT, &sa, NULL);
}

#define BAR_MIN_BYTES (64ull << 20)

static void draw(gemm_cli_progress *p, uint64_t up_now, uint64_t up_total, uint64_t down_now,
                 uint64_t down_total)
{
    const int width = 30;
    int upload = up_total > 0 && up_now < up_total;
    uint64_t now = upload ? up_now : down_now, total = upload ? up_total : down_total;
    double frac = total > 0 ? (double)now / (double)total : 0.0;
    if (frac > 1) frac = 1;
    char bar[64];
    int fill = (int)(frac * width);
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = '\0';
    fprintf(stderr, "\r%s [%s] %5.1f%%  %.1f / %.1f MB   ", upload ? "sending  " : "receiving", bar,
            frac * 100.0, now / 1e6, total / 1e6);
    fflush(stderr);
    p->drawn = 1;
}

int gemm_cli_progress_cb(void *ctx, uint64_t up_now, uint64_t up_total, uint64_t down_now,
                         uint64_t down_total)
{
    gemm_cli_progress *p = ctx;
    if (gemm_cli_interrupted) return 1;
    if (!p || !p->enabled) return 0;
    if (up_total < BAR_MIN_BYTES && down_total < BAR_MIN_BYTES) return 0;
    double now = gemm_now_ms();
    if (now - p->last_draw_ms < 100) return 0;
    p->last_draw_ms = now;
    draw(p, up_now, up_total, down_now, down_total);
    return 0;
}

void gemm_cli_progress_done(gemm_cli_progress *p)
{
    if (p && p->drawn) {
        fprintf(stderr, "\r%*s\r", 78, "");
        fflush(stderr);
        p->drawn = 0;
    }
}
