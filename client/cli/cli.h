/*
 * cli.h - the parts of the `gemm` command: main.c (command line) calls the subcommands
 * (multiply.c, bench.c, info.c), which use common.c and matfile.c.
 */
#ifndef GEMM_CLI_H
#define GEMM_CLI_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "gemm.h"

/* Exit codes (documented in `gemm --help` and docs/CLIENT.md). */
enum {
    GEMM_EXIT_OK = 0,
    GEMM_EXIT_SERVER = 1,      /* the server answered with an error (or a wrong answer) */
    GEMM_EXIT_USAGE = 2,       /* bad command line */
    GEMM_EXIT_CONNECT = 3,     /* could not connect, or a timeout */
    GEMM_EXIT_IO = 4,          /* local file I/O or format error */
    GEMM_EXIT_INTERRUPTED = 130
};

/* ---- options shared by every subcommand -------------------------------- */

typedef struct {
    const char *server, *token, *cacert;
    long timeout_ms;          /* --timeout SECONDS (0 = none) */
    long connect_timeout_ms;  /* --connect-timeout SECONDS */
    int retries;              /* --retries N (-1: the library's default) */
    int verbose, help;
    /* multiply */
    const char *out, *format, *out_format; /* --format: inputs and output; --out-format: output */
    const char *dtype, *out_dtype, *shape, *kernel, *math;
    int tile, async;
    int streams;              /* --streams N (0: chosen from the size) */
    int timing;               /* --timing: print the stages on stderr */
    int progress;             /* -1 auto (terminal), 0 off, 1 on */
    /* info, health */
    int json;                 /* info --json: the server's JSON as it came */
    int live;                 /* health --live: /healthz only */
    /* bench */
    uint64_t size, m, k, n;
    int repeat, concurrency, warmup;
    /* positional */
    const char *pos[4];
    int npos;
} gemm_cli_opts;

/* ---- common.c ------------------------------------------------------------ */

/* Says "gemm: <message>" on stderr; returns rc. */
int gemm_cli_say(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Maps a library error to an exit code, printing "gemm: <message>" on stderr. */
int gemm_cli_fail(const gemm_client_error *err, const char *what);
/* --dtype and --out-dtype (when given) into *dtype and *out_dtype; --math, --kernel and
 * --tile into r. 0, or GEMM_EXIT_USAGE after saying why. */
int gemm_cli_request_opts(const gemm_cli_opts *o, gemm_dtype *dtype, gemm_dtype *out_dtype, gemm_request *r);
/* r->out_half for out_dtype (GEMM_DTYPE_INVALID: not asked) and operands of r->dtype. 0,
 * or GEMM_EXIT_USAGE after saying why. */
int gemm_cli_out_half(gemm_dtype out_dtype, gemm_request *r);

/* The progress of a client's transfers: after SIGINT it stops them; the bar is drawn
 * when enabled and a transfer is over 64 MB. */
typedef struct {
    int enabled;
    double last_draw_ms;
    int drawn;
} gemm_cli_progress;
extern gemm_cli_progress gemm_cli_bar; /* the one bar of the command */
extern volatile sig_atomic_t gemm_cli_interrupted;
void gemm_cli_install_sigint(void);
void gemm_cli_progress_done(gemm_cli_progress *p); /* wipes a drawn bar */
/* Creates the client for the options; with a bar, its progress goes there. */
gemm_client *gemm_cli_client(const gemm_cli_opts *o, gemm_cli_progress *bar, gemm_client_error *err);

/* ---- matrix files -------------------------------------------------------- */

typedef enum { GEMM_FMT_AUTO = 0, GEMM_FMT_NPY, GEMM_FMT_RAW, GEMM_FMT_CSV, GEMM_FMT_TSV, GEMM_FMT_TXT } gemm_cli_format;

/* From --format (when given) or the file's extension. 0, or -1 with msg. */
int gemm_cli_format_of(const char *path, const char *forced, gemm_cli_format *out, char *msg, size_t cap);

typedef struct {
    gemm_cli_format fmt;
    gemm_dtype dtype;
    uint64_t rows, cols;
    uint64_t batch;    /* a 3-D .npy stack: its first dimension (0: a matrix) */
    const void *data;  /* row-major elements: inside the mapping, or owned */
    void *map;
    size_t map_len;
    void *owned;
} gemm_cli_input;

/* Opens an input; dtype GEMM_DTYPE_INVALID when not forced (text then float64), rows/cols the
 * raw shape (cols 0: from the file size). 0 or -1 with msg. */
int gemm_cli_input_open(gemm_cli_input *m, const char *path, gemm_cli_format fmt, gemm_dtype dtype,
                        uint64_t rows, uint64_t cols, char *msg, size_t cap);
void gemm_cli_input_close(gemm_cli_input *m);

typedef struct {
    gemm_cli_format fmt;
    gemm_dtype dtype;
    uint64_t rows, cols;
    char *path, *tmp_path; /* written to tmp_path (same folder), renamed on commit */
    int fd;
    void *map, *owned;     /* the file mapped (.npy, raw), or memory (text, standard output) */
    size_t len;            /* their bytes: the .npy header, then C */
    void *data;            /* where C goes, inside them */
    int to_stdout;
} gemm_cli_output;

/* C, or a batch of C matrices (batch 0: one); only .npy (3-D) and raw take a batch. */
int gemm_cli_output_create(gemm_cli_output *o, const char *path, gemm_cli_format fmt, gemm_dtype dtype,
                           uint64_t batch, uint64_t rows, uint64_t cols, char *msg, size_t cap);
/* Writes text formats, flushes and renames into place. 0 or -1 with msg. */
int gemm_cli_output_commit(gemm_cli_output *o, char *msg, size_t cap);
/* Removes the partial file and frees what the output holds; called after commit too. */
void gemm_cli_output_abort(gemm_cli_output *o);

/* ---- subcommands ---------------------------------------------------------- */

int gemm_cli_multiply(const gemm_cli_opts *o); /* multiply.c */
int gemm_cli_bench(const gemm_cli_opts *o);    /* bench.c */
int gemm_cli_info(const gemm_cli_opts *o);     /* info.c */
int gemm_cli_health(const gemm_cli_opts *o);   /* info.c */

#endif
