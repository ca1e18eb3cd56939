/*
 * common.c - what every subcommand of `gemm` shares: a client from the options, Ctrl-C and
 * the progress bar, errors to exit codes. SIGINT only sets a flag, which the progress
 * callback (called during transfers, retry waits and job polls) answers with "stop".
 */
#include "cli.h"

#include <stdarg.h>
#include <stdio.h>

int gemm_cli_say(int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("gemm: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return rc;
}

int gemm_cli_fail(const gemm_client_error *err, const char *what)
{
    gemm_client_error_kind k = err->kind;
    if (k == GEMM_CLIENT_E_SERVER)
        return gemm_cli_say(GEMM_EXIT_SERVER, "%s: server error %d %s: %s", what, err->http_status, err->code,
                            err->message);
    if (k == GEMM_CLIENT_E_ABORTED) return gemm_cli_say(GEMM_EXIT_INTERRUPTED, "%s: interrupted", what);
    return gemm_cli_say(k == GEMM_CLIENT_E_CONNECT || k == GEMM_CLIENT_E_TIMEOUT ? GEMM_EXIT_CONNECT
                        : k == GEMM_CLIENT_E_ARGUMENT                            ? GEMM_EXIT_USAGE
                        : k == GEMM_CLIENT_E_NOMEM                               ? GEMM_EXIT_IO
                                                                                 : GEMM_EXIT_SERVER,
                        "%s: %s%s", what,
                        k == GEMM_CLIENT_E_PROTOCOL  ? "bad answer from the server: "
                        : k == GEMM_CLIENT_E_CONNECT ? "cannot reach the server: "
                        : k == GEMM_CLIENT_E_TIMEOUT ? "timed out: "
                                                     : "",
                        err->message);
}

int gemm_cli_request_opts(const gemm_cli_opts *o, gemm_dtype *dtype, gemm_dtype *out_dtype, gemm_request *r)
{
    if (o->dtype && gemm_dtype_from_name(o->dtype, dtype) != 0)
        return gemm_cli_say(GEMM_EXIT_USAGE, "--dtype \"%s\": expected float32, float64, int32, float16 or bfloat16",
                            o->dtype);
    if (o->out_dtype && gemm_dtype_from_name(o->out_dtype, out_dtype) != 0)
        return gemm_cli_say(GEMM_EXIT_USAGE, "--out-dtype \"%s\": expected float32, float16 or bfloat16", o->out_dtype);
    if (o->math && gemm_math_from_name(o->math, &r->math) != 0)
        return gemm_cli_say(GEMM_EXIT_USAGE, "--math \"%s\": expected fp32, tf32 or bf16", o->math);
    r->kernel = o->kernel;
    r->tile = o->tile;
    return 0;
}

int gemm_cli_out_half(gemm_dtype out_dtype, gemm_request *r)
{
    gemm_dtype cd;
    gemm_err oe;
    if (gemm_out_dtype_resolve(r->dtype, out_dtype, &cd, &oe) != 0)
        return gemm_cli_say(GEMM_EXIT_USAGE, "--out-dtype: %s", oe.message);
    r->out_half = gemm_dtype_is_half(r->dtype) && cd == r->dtype;
    return 0;
}

/* ---------------------------------------------------------------- Ctrl-C and the bar */

volatile sig_atomic_t gemm_cli_interrupted = 0;
gemm_cli_progress gemm_cli_bar;

static void on_sigint(int sig)
{
    (void)sig;
    gemm_cli_interrupted = 1;
}

void gemm_cli_install_sigint(void)
{
    struct sigaction sa = {.sa_handler = on_sigint, .sa_flags = SA_RESETHAND}; /* once; no SA_RESTART: EINTR */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}

static int progress_cb(void *ctx, uint64_t up_now, uint64_t up_total, uint64_t down_now, uint64_t down_total)
{
    gemm_cli_progress *p = ctx;
    if (gemm_cli_interrupted) return 1;
    double now_ms = gemm_now_ms();
    if (!p || !p->enabled || (up_total < (64u << 20) && down_total < (64u << 20)) || now_ms - p->last_draw_ms < 100)
        return 0;
    p->last_draw_ms = now_ms;
    int upload = up_total > 0 && up_now < up_total;
    uint64_t now = upload ? up_now : down_now, total = upload ? up_total : down_total;
    double frac = total > 0 ? (double)now / (double)total : 0.0;
    if (frac > 1) frac = 1;
    int done = (int)(frac * 30); /* of the bar's 30 places */
    fprintf(stderr, "\r%s [%.*s%.*s] %5.1f%%  %.1f / %.1f MB   ", upload ? "sending  " : "receiving", done,
            "##############################", 30 - done, "..............................", frac * 100.0, now / 1e6,
            total / 1e6);
    fflush(stderr);
    p->drawn = 1;
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

gemm_client *gemm_cli_client(const gemm_cli_opts *o, gemm_cli_progress *bar, gemm_client_error *err)
{
    gemm_client_options co;
    gemm_client_options_init(&co);
    co.token = o->token;
    co.timeout_ms = o->timeout_ms;
    if (o->connect_timeout_ms > 0) co.connect_timeout_ms = o->connect_timeout_ms;
    if (o->retries >= 0) co.max_retries = o->retries;
    co.verbose = o->verbose;
    co.ca_file = o->cacert;
    if (bar) {
        co.progress = progress_cb;
        co.progress_ctx = bar;
    }
    return gemm_client_new(o->server, &co, err);
}
