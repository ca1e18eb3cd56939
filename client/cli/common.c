/*
 * common.c - what every subcommand of the `gemm` command shares: a client handle made
 * from the command-line options, and library errors turned into messages and exit codes.
 * The subcommands (multiply.c, bench.c, info.c) use it; main.c only parses the command
 * line and calls them.
 */
#include "cli.h"

#include <stdio.h>

int gemm_cli_fail(const gemm_client_error *err, const char *what)
{
    gemm_client_error_kind k = err->kind;
    if (k == GEMM_CLIENT_E_SERVER) {
        fprintf(stderr, "gemm: %s: server error %d %s: %s\n", what, err->http_status, err->code, err->message);
        return GEMM_EXIT_SERVER;
    }
    if (k == GEMM_CLIENT_E_ABORTED) {
        fprintf(stderr, "gemm: %s: interrupted\n", what);
        return GEMM_EXIT_INTERRUPTED;
    }
    fprintf(stderr, "gemm: %s: %s%s\n", what,
            k == GEMM_CLIENT_E_PROTOCOL  ? "bad answer from the server: "
            : k == GEMM_CLIENT_E_CONNECT ? "cannot reach the server: "
            : k == GEMM_CLIENT_E_TIMEOUT ? "timed out: "
                                         : "",
            err->message);
    return k == GEMM_CLIENT_E_CONNECT || k == GEMM_CLIENT_E_TIMEOUT ? GEMM_EXIT_CONNECT
           : k == GEMM_CLIENT_E_ARGUMENT                            ? GEMM_EXIT_USAGE
           : k == GEMM_CLIENT_E_NOMEM                               ? GEMM_EXIT_IO
                                                                    : GEMM_EXIT_SERVER;
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
        co.progress = gemm_cli_progress_cb;
        co.progress_ctx = bar;
    }
    return gemm_client_new(o->server, &co, err);
}

int gemm_cli_request_opts(const gemm_cli_opts *o, gemm_dtype *dtype, gemm_request *r)
{
    if (o->dtype && gemm_dtype_from_name(o->dtype, dtype) != 0) {
        fprintf(stderr, "gemm: --dtype \"%s\": expected float32, float64, int32, float16 or bfloat16\n", o->dtype);
        return GEMM_EXIT_USAGE;
    }
    if (o->math && gemm_math_from_name(o->math, &r->math) != 0) {
        fprintf(stderr, "gemm: --math \"%s\": expected fp32, tf32 or bf16\n", o->math);
        return GEMM_EXIT_USAGE;
    }
    r->kernel = o->kernel;
    r->tile = o->tile;
    return 0;
}
