/*
 * main.c - the `gemm` command: subcommands, options, help, exit codes. The subcommands
 * live in their own files (see cli.h).
 */
#include "cli.h"
#include "options.h" /* gemm_parse_u64 */

#include <errno.h>
#include <getopt.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_SERVER "http://127.0.0.1:8080"

static const char *const common_help =
    "Connection options (every subcommand):\n"
    "  -s, --server URL         the daemon: http://host:port, https://host:port, or host:port\n"
    "                           for http (default $GEMM_SERVER, else " DEFAULT_SERVER ")\n"
    "  -t, --token TOKEN        bearer token (default $GEMM_TOKEN)\n"
    "      --timeout SEC        limit on each request, upload to last byte (default none)\n"
    "      --connect-timeout SEC  limit on connecting (default 10)\n"
    "      --cacert FILE        https: verify the server with this PEM bundle (default $GEMM_CACERT,\n"
    "                           else the system's)\n"
    "      --retries N          retries after 503 queue_full, honouring Retry-After (default 3)\n"
    "  -v, --verbose            show the HTTP exchange\n"
    "  -h, --help               this help\n";

static const char *const exit_help =
    "Exit status: 0 ok, 1 server error, 2 usage error, 3 connection failure or timeout,\n"
    "4 local file I/O or format error, 130 interrupted (Ctrl-C).\n";

typedef enum { CMD_NONE, CMD_MULTIPLY, CMD_BENCH, CMD_INFO, CMD_HEALTH, CMD_HELP } command;

/* Each command: its name, another name, and its help before the options every one takes. */
static const struct {
    const char *name, *alias, *help;
} commands[] = {
    [CMD_NONE] = {"", NULL,
                  "usage: gemm [OPTIONS] COMMAND [ARGS]\n"
                  "\n"
                  "Client of the gemmd matrix-multiplication service.\n"
                  "\n"
                  "Commands:\n"
                  "  multiply A B -o C   C = A.B on the server (npy, raw binary, CSV/TSV files)\n"
                  "  bench               measure latency and throughput against the server\n"
                  "  info                the server's version, backends, devices, kernels, limits\n"
                  "  health              liveness and readiness of the server\n"
                  "  help COMMAND        help on one command (or: gemm COMMAND --help)\n"},
    [CMD_MULTIPLY] = {"multiply", "mul",
                      "usage: gemm multiply [OPTIONS] A B [-o C]\n"
                      "\n"
                      "Computes C = A.B on the server. The format of each file comes from its extension\n"
                      "(.npy; .bin/.raw raw little-endian row-major; .csv, .tsv, .txt text) or --format.\n"
                      "Inputs are mapped and sent as they are (a fortran_order .npy is transposed into a\n"
                      "buffer first); .npy and raw outputs are written straight into the output file,\n"
                      "which appears only when the product succeeded. Without -o, C is printed as CSV.\n"
                      "\n"
                      "  -o, --output C           output file ('-' = standard output)\n"
                      "  -f, --format FMT         format of the inputs and output: npy, raw, csv, tsv, txt\n"
                      "      --out-format FMT     format of the output only\n"
                      "  -d, --dtype T            float32, float64, int32, float16, bfloat16: needed for\n"
                      "                           raw inputs; text\n"
                      "                           inputs are parsed as this (default float64); .npy\n"
                      "                           inputs must match it\n"
                      "      --out-dtype T        float16/bfloat16 inputs: C in float32 (default) or in\n"
                      "                           the inputs' dtype (half the bytes back)\n"
                      "      --shape MxK[xN]      shape of a raw A (B has K rows; its columns come from\n"
                      "                           its size, or N)\n"
                      "  -k, --kernel NAME        auto, naive, tiled, cublas, ... (see gemm info)\n"
                      "      --math MODE          float32 only: fp32, tf32, bf16\n"
                      "      --tile N             block tile, for kernels that take one (see gemm info)\n"
                      "      --async              queue a job, wait for it, fetch the result (Ctrl-C cancels it)\n"
                      "      --streams N          send A in N row panels over N connections at once (B is\n"
                      "                           uploaded once as a resident matrix); default: 4 when A, B\n"
                      "                           and C are 64 MiB or more, else 1\n"
                      "      --timing             print the server's stages and the client's time on stderr\n"
                      "      --progress / --no-progress  progress bar for transfers over 64 MB\n"
                      "                           (default: when stderr is a terminal)\n"},
    [CMD_BENCH] = {"bench", NULL,
                   "usage: gemm bench [OPTIONS]\n"
                   "\n"
                   "Sends the same random product repeatedly from C threads (one connection each) and\n"
                   "prints min/median/p99 latency, requests/s, GFLOP/s and payload MB/s (A+B+C bytes).\n"
                   "The first answer is checked against a float64 computation of sampled elements.\n"
                   "\n"
                   "  -n, --size N             square size (default 1024)\n"
                   "      --m M, --k K, --n N  a rectangular shape (each defaults to --size)\n"
                   "  -d, --dtype T            float32 (default), float64, int32, float16, bfloat16\n"
                   "      --out-dtype T        C of float16/bfloat16 operands: float32 (default) or theirs\n"
                   "  -r, --repeat R           requests per thread (default 10)\n"
                   "  -c, --concurrency C      threads (default 1)\n"
                   "  -w, --warmup W           untimed requests per thread first (default 1)\n"
                   "  -k, --kernel NAME        kernel to ask for\n"
                   "      --math MODE, --tile N  as for multiply\n"},
    [CMD_INFO] = {"info", NULL,
                  "usage: gemm info [OPTIONS]\n\n"
                  "Prints GET /v1/info for a person: version, backend, devices, kernels,\n"
                  "dtypes, limits, one \"key: value\" a line, nested parts indented.\n\n"
                  "      --json               the server's JSON as it came, for programs\n"},
    [CMD_HEALTH] = {"health", NULL,
                    "usage: gemm health [OPTIONS]\n\nAsks GET /healthz (alive) and GET /readyz (engine up, queue not "
                    "full).\nExits 0 when both answer 2xx, 1 when the server answers otherwise, 3 when it cannot be "
                    "reached.\n\n"
                    "      --live               ask /healthz only (a liveness probe: a full queue is not a failure)\n"},
    [CMD_HELP] = {"help", NULL, NULL},
};

static command command_of(const char *s)
{
    for (int c = CMD_MULTIPLY; c <= CMD_HELP; c++)
        if (strcmp(s, commands[c].name) == 0 || (commands[c].alias && strcmp(s, commands[c].alias) == 0))
            return (command)c;
    return CMD_NONE;
}

static void usage_of(command c, FILE *f)
{
    fprintf(f, "%s\n%s\n%s", commands[c == CMD_HELP ? CMD_NONE : c].help, common_help, exit_help);
}

static int usage_error(command c, const char *fmt, const char *arg)
{
    gemm_cli_say(0, fmt, arg);
    fprintf(stderr, "(see gemm %s%s--help)\n", c == CMD_HELP ? "" : commands[c].name,
            c == CMD_NONE || c == CMD_HELP ? "" : " ");
    return GEMM_EXIT_USAGE;
}

static int parse_seconds(const char *s, long *ms)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || v < 0 || v > 1e6) return -1;
    *ms = (long)(v * 1000.0 + 0.5);
    if (v > 0 && *ms == 0) *ms = 1;
    return 0;
}

/* ---------------------------------------------------------------- options */

#define DIM_MSG "a dimension must be a whole number >= 1 (got \"%s\")"
#define AT(field) offsetof(gemm_cli_opts, field)

/* Every option, read the way its kind says into its field of gemm_cli_opts: 's' a string,
 * 'f' a flag set to lo, 't' seconds (>= lo) into milliseconds, 'i' an int and 'u' a
 * uint64_t in lo..hi; msg says a value out of range. */
static const struct {
    const char *name;
    int letter; /* its short option, or 0 */
    char kind;
    size_t off;
    long lo, hi;
    const char *msg;
} opts[] = {
    {"server", 's', 's', AT(server), 0, 0, NULL},
    {"token", 't', 's', AT(token), 0, 0, NULL},
    {"timeout", 0, 't', AT(timeout_ms), 0, 0, "--timeout: \"%s\" is not a number of seconds"},
    {"connect-timeout", 0, 't', AT(connect_timeout_ms), 1, 0,
     "--connect-timeout: \"%s\" is not a positive number of seconds"},
    {"retries", 0, 'i', AT(retries), 0, 100, "--retries: \"%s\" is not 0..100"},
    {"cacert", 0, 's', AT(cacert), 0, 0, NULL},
    {"verbose", 'v', 'f', AT(verbose), 1, 0, NULL},
    {"help", 'h', 'f', AT(help), 1, 0, NULL},
    {"output", 'o', 's', AT(out), 0, 0, NULL},
    {"format", 'f', 's', AT(format), 0, 0, NULL},
    {"out-format", 0, 's', AT(out_format), 0, 0, NULL},
    {"out-dtype", 0, 's', AT(out_dtype), 0, 0, NULL},
    {"dtype", 'd', 's', AT(dtype), 0, 0, NULL},
    {"shape", 0, 's', AT(shape), 0, 0, NULL},
    {"kernel", 'k', 's', AT(kernel), 0, 0, NULL},
    {"math", 0, 's', AT(math), 0, 0, NULL},
    {"tile", 0, 'i', AT(tile), 1, 1024, "--tile: \"%s\" is not 1..1024"},
    {"async", 0, 'f', AT(async), 1, 0, NULL},
    {"streams", 0, 'i', AT(streams), 1, 16, "--streams: \"%s\" is not 1..16"},
    {"timing", 0, 'f', AT(timing), 1, 0, NULL},
    {"progress", 0, 'f', AT(progress), 1, 0, NULL},
    {"no-progress", 0, 'f', AT(progress), 0, 0, NULL},
    {"size", 'n', 'u', AT(size), 1, 1L << 40, DIM_MSG},
    {"m", 0, 'u', AT(m), 1, 1L << 40, DIM_MSG},
    {"k", 0, 'u', AT(k), 1, 1L << 40, DIM_MSG},
    {"n", 0, 'u', AT(n), 1, 1L << 40, DIM_MSG},
    {"repeat", 'r', 'i', AT(repeat), 1, 10000000, "--repeat: \"%s\" is not >= 1"},
    {"concurrency", 'c', 'i', AT(concurrency), 1, 1024, "--concurrency: \"%s\" is not 1..1024"},
    {"warmup", 'w', 'i', AT(warmup), 0, 1000000, "--warmup: \"%s\" is not >= 0"},
    {"json", 0, 'f', AT(json), 1, 0, NULL},
    {"live", 0, 'f', AT(live), 1, 0, NULL},
};
enum { NOPTS = sizeof opts / sizeof opts[0], LONG_ONLY = 256 /* getopt's value of row i without a letter: + i */ };

/* The value of option `row` into its field of *o: 0, or -1 when it is not one. */
static int set_option(gemm_cli_opts *o, int row, const char *arg)
{
    void *field = (char *)o + opts[row].off;
    uint64_t v = 0;
    switch (opts[row].kind) {
    case 's': *(const char **)field = arg; return 0;
    case 'f': *(int *)field = (int)opts[row].lo; return 0;
    case 't': return parse_seconds(arg, field) != 0 || *(long *)field < opts[row].lo ? -1 : 0;
    }
    if (gemm_parse_u64(arg, &v) != 0 || v < (uint64_t)opts[row].lo || v > (uint64_t)opts[row].hi) return -1;
    if (opts[row].kind == 'u') *(uint64_t *)field = v;
    else *(int *)field = (int)v;
    return 0;
}

/* The command line into *o and *cmd; options may come before or after the command.
 * Returns -1, or the exit status of a usage error (said on stderr). */
static int parse_args(int argc, char **argv, gemm_cli_opts *o, command *cmd)
{
    struct option longopts[NOPTS + 1];
    memset(longopts, 0, sizeof longopts);
    for (int i = 0; i < NOPTS; i++)
        longopts[i] = (struct option){opts[i].name, opts[i].kind == 'f' ? no_argument : required_argument, NULL,
                                      opts[i].letter ? opts[i].letter : LONG_ONLY + i};
    opterr = 0;
    optind = 1;
    /* "+": stop at the first non-option so positional arguments keep their order */
    while (optind < argc) {
        int opt = getopt_long(argc, argv, "+:s:t:vho:f:d:k:n:r:c:w:", longopts, NULL), row = 0;
        if (opt == -1) {
            const char *a = argv[optind++];
            if (*cmd == CMD_NONE) {
                if ((*cmd = command_of(a)) == CMD_NONE) return usage_error(CMD_NONE, "unknown command \"%s\"", a);
            } else if (o->npos < 4) {
                o->pos[o->npos++] = a;
            } else {
                return usage_error(*cmd, "too many arguments (\"%s\")", a);
            }
            continue;
        }
        while (row < NOPTS && longopts[row].val != opt) row++;
        if (row == NOPTS)
            return usage_error(*cmd, opt == ':' ? "option %s needs a value" : "unknown option \"%s\"",
                               argv[optind - 1]);
        if (set_option(o, row, optarg) != 0) return usage_error(*cmd, opts[row].msg, optarg);
    }
    return -1;
}

int main(int argc, char **argv)
{
    gemm_cli_opts o = {.server = getenv("GEMM_SERVER"), .token = getenv("GEMM_TOKEN"),
                       .cacert = getenv("GEMM_CACERT"), .retries = -1, .progress = -1, .repeat = 10,
                       .concurrency = 1, .warmup = 1, .size = 1024};
    if (!o.server || !*o.server) o.server = DEFAULT_SERVER;
    command cmd = CMD_NONE;
    int rc = parse_args(argc, argv, &o, &cmd);
    if (rc >= 0) return rc;
    if (cmd == CMD_HELP && o.npos > 0 && command_of(o.pos[0]) == CMD_NONE)
        return usage_error(CMD_NONE, "no command \"%s\"", o.pos[0]);
    if (cmd == CMD_HELP || o.help) { /* usage_of(CMD_HELP) is the general help */
        usage_of(cmd == CMD_HELP && o.npos > 0 ? command_of(o.pos[0]) : cmd, stdout);
        return GEMM_EXIT_OK;
    }
    if (cmd == CMD_NONE) {
        usage_of(CMD_NONE, stderr);
        return GEMM_EXIT_USAGE;
    }
    if (cmd != CMD_MULTIPLY && o.npos > 0) return usage_error(cmd, "unexpected argument \"%s\"", o.pos[0]);
    gemm_cli_install_sigint();
    switch (cmd) {
    case CMD_MULTIPLY:
        if (o.npos != 2) return usage_error(cmd, "multiply takes two inputs, A and B%s", "");
        return gemm_cli_multiply(&o);
    case CMD_BENCH: return gemm_cli_bench(&o);
    case CMD_INFO: return gemm_cli_info(&o);
    default: return gemm_cli_health(&o);
    }
}
