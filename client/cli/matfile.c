/*
 * matfile.c - matrix files of the `gemm` command: inputs mapped (a fortran_order .npy
 * transposed, text parsed, into a buffer); .npy and raw outputs mapped temporary files that
 * the transfer writes into, renamed into place only when the product succeeded.
 */
#include "cli.h"

#include "gemm_util.h"
#include "npy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* What went wrong, into msg[cap]. Returns -1. */
__attribute__((format(printf, 3, 4))) static int fail(char *msg, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, cap, fmt, ap);
    va_end(ap);
    return -1;
}

static int format_from_name(const char *s, gemm_cli_format *out)
{
    static const struct { const char *name; gemm_cli_format f; } names[] = {
        {"npy", GEMM_FMT_NPY}, {"raw", GEMM_FMT_RAW}, {"bin", GEMM_FMT_RAW}, {"csv", GEMM_FMT_CSV},
        {"tsv", GEMM_FMT_TSV}, {"tab", GEMM_FMT_TSV}, {"txt", GEMM_FMT_TXT}, {"text", GEMM_FMT_TXT},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcasecmp(s, names[i].name) == 0) {
            *out = names[i].f;
            return 0;
        }
    return -1;
}

int gemm_cli_format_of(const char *path, const char *forced, gemm_cli_format *out, char *msg, size_t cap)
{
    if (forced && *forced)
        return format_from_name(forced, out) == 0
                   ? 0
                   : fail(msg, cap, "unknown format \"%s\" (npy, raw, csv, tsv, txt)", forced);
    if (strcmp(path, "-") == 0) {
        *out = GEMM_FMT_CSV;
        return 0;
    }
    const char *slash = strrchr(path, '/'), *dot = strrchr(path, '.');
    if (dot && (!slash || dot > slash) && format_from_name(dot + 1, out) == 0) return 0;
    return fail(msg, cap, "%s: cannot tell the format from the extension (.npy, .bin/.raw, .csv, .tsv, .txt); "
                          "use --format", path);
}

static char delim_of(gemm_cli_format f)
{
    return f == GEMM_FMT_CSV ? ',' : f == GEMM_FMT_TSV ? '\t' : f == GEMM_FMT_TXT ? ' ' : 0;
}

/* ---------------------------------------------------------------- inputs */

static int map_file(gemm_cli_input *m, const char *path, char *msg, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fail(msg, cap, "%s: %s", path, strerror(errno));
    struct stat st;
    const char *bad = fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ? "not a regular file"
                      : st.st_size == 0                           ? "empty file"
                                                                  : NULL;
    void *p = bad ? MAP_FAILED : mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (bad) return fail(msg, cap, "%s: %s", path, bad);
    if (p == MAP_FAILED) return fail(msg, cap, "%s: mmap: %s", path, strerror(e));
    madvise(p, (size_t)st.st_size, MADV_SEQUENTIAL);
    m->map = p;
    m->map_len = (size_t)st.st_size;
    return 0;
}

static int open_npy(gemm_cli_input *m, const char *path, gemm_dtype want, char *msg, size_t cap)
{
    gemm_npy_header h;
    gemm_err err;
    gemm_err_clear(&err);
    int rc = gemm_npy_parse_header(m->map, m->map_len, &h, &err);
    if (rc == 0) return fail(msg, cap, "%s: truncated .npy header", path);
    if (rc < 0) return fail(msg, cap, "%s: %s", path, err.message);
    if (want != GEMM_DTYPE_INVALID && want != h.dtype)
        return fail(msg, cap, "%s holds %s but --dtype is %s", path, gemm_dtype_name(h.dtype), gemm_dtype_name(want));
    size_t bytes, need;
    if (!gemm_matrix_bytes(h.rows, h.cols, h.dtype, &bytes) ||
        (h.ndim == 3 && !gemm_mul_size(bytes, (size_t)h.batch, &bytes)) || !gemm_add_size(h.data_offset, bytes, &need))
        return fail(msg, cap, "%s: shape too large", path);
    if (m->map_len < need)
        return fail(msg, cap, "%s: truncated: %llux%llu %s needs %zu data bytes, the file has %zu", path,
                    (unsigned long long)h.rows, (unsigned long long)h.cols, gemm_dtype_name(h.dtype), bytes,
                    m->map_len - h.data_offset);
    if (h.ndim == 3 && h.batch == 0) return fail(msg, cap, "%s: a stack of 0 matrices", path);
    m->dtype = h.dtype;
    m->rows = h.rows;
    m->cols = h.cols;
    m->batch = h.batch; /* 3-D arrays are C order (the parser refuses Fortran order) */
    const unsigned char *src = (const unsigned char *)m->map + h.data_offset;
    m->data = src;
    if (!h.fortran_order || h.rows == 1 || h.cols == 1) return 0;
    /* column-major on disk: transpose into a row-major buffer (the one copy we make) */
    size_t es = gemm_dtype_size(h.dtype);
    unsigned char *dst = malloc(bytes);
    if (!dst) return fail(msg, cap, "%s: out of memory transposing a fortran_order array", path);
    const uint64_t B = 64;
    for (uint64_t jb = 0; jb < h.cols; jb += B)
        for (uint64_t i = 0; i < h.rows; i++)
            for (uint64_t j = jb; j < h.cols && j < jb + B; j++)
                memcpy(dst + (i * h.cols + j) * es, src + (j * h.rows + i) * es, es);
    m->data = m->owned = dst;
    return 0;
}

static int open_raw(gemm_cli_input *m, const char *path, gemm_dtype dtype, uint64_t rows, uint64_t cols, char *msg,
                    size_t cap)
{
    size_t es = gemm_dtype_size(dtype), bytes;
    if (es == 0) return fail(msg, cap, "%s: raw binary needs --dtype (float32, float64, int32)", path);
    if (rows == 0) return fail(msg, cap, "%s: raw binary needs --shape MxK (or MxKxN)", path);
    if (m->map_len % es != 0)
        return fail(msg, cap, "%s: %zu bytes is not a whole number of %s elements", path, m->map_len,
                    gemm_dtype_name(dtype));
    uint64_t count = m->map_len / es;
    if (cols == 0 && count % rows != 0)
        return fail(msg, cap, "%s: %llu elements do not make %llu whole rows", path, (unsigned long long)count,
                    (unsigned long long)rows);
    if (cols == 0) cols = count / rows;
    if (!gemm_matrix_bytes(rows, cols, dtype, &bytes) || bytes != m->map_len)
        return fail(msg, cap, "%s: %zu bytes, but %llux%llu %s takes %llu x %llu x %zu", path, m->map_len,
                    (unsigned long long)rows, (unsigned long long)cols, gemm_dtype_name(dtype),
                    (unsigned long long)rows, (unsigned long long)cols, es);
    m->dtype = dtype;
    m->rows = rows;
    m->cols = cols;
    m->data = m->map;
    return 0;
}

static int open_text(gemm_cli_input *m, const char *path, gemm_dtype dtype, char *msg, size_t cap)
{
    gemm_text_error te;
    void *data = NULL;
    if (dtype == GEMM_DTYPE_INVALID) dtype = GEMM_DTYPE_F64;
    if (gemm_client_text_parse(m->map, m->map_len, delim_of(m->fmt), dtype, &m->rows, &m->cols, &data, &te) != 0)
        return te.line > 0 ? fail(msg, cap, "%s:%d: %s", path, te.line, te.message)
                           : fail(msg, cap, "%s: %s", path, te.message);
    m->dtype = dtype;
    m->data = m->owned = data;
    munmap(m->map, m->map_len); /* the text is no longer needed (map_len is read only with a map) */
    m->map = NULL;
    return 0;
}

int gemm_cli_input_open(gemm_cli_input *m, const char *path, gemm_cli_format fmt, gemm_dtype dtype,
                        uint64_t rows, uint64_t cols, char *msg, size_t cap)
{
    *m = (gemm_cli_input){.fmt = fmt};
    if (map_file(m, path, msg, cap) != 0) return -1;
    int rc = fmt == GEMM_FMT_NPY   ? open_npy(m, path, dtype, msg, cap)
             : fmt == GEMM_FMT_RAW ? open_raw(m, path, dtype, rows, cols, msg, cap)
             : delim_of(fmt)       ? open_text(m, path, dtype, msg, cap)
                                   : fail(msg, cap, "%s: unknown format", path);
    if (rc != 0) gemm_cli_input_close(m);
    return rc;
}

void gemm_cli_input_close(gemm_cli_input *m)
{
    if (m->map) munmap(m->map, m->map_len);
    free(m->owned);
    memset(m, 0, sizeof *m);
}

/* ---------------------------------------------------------------- outputs */

/* Creates the hidden temporary file of o beside o->path (".C.npy.partXXXXXX") with the usual
 * mode (mkstemp makes it 0600). 0, or -1 with msg. */
static int open_tmp(gemm_cli_output *o, char *msg, size_t cap)
{
    size_t tlen = strlen(o->path) + 32;
    const char *slash = strrchr(o->path, '/'), *base = slash ? slash + 1 : o->path;
    if (!(o->tmp_path = malloc(tlen))) return fail(msg, cap, "out of memory");
    snprintf(o->tmp_path, tlen, "%.*s.%s.partXXXXXX", (int)(base - o->path), o->path, base);
    if ((o->fd = mkstemp(o->tmp_path)) < 0) {
        free(o->tmp_path);
        o->tmp_path = NULL;
        return fail(msg, cap, "%s: cannot create: %s", o->path, strerror(errno));
    }
    mode_t um = umask(0);
    umask(um);
    if (fchmod(o->fd, 0666 & ~um) != 0) { /* keep 0600 */ }
    return 0;
}

/* The file of a mapped output (.npy or raw) at its final size, o->len, mapped. */
static int map_output(gemm_cli_output *o, char *msg, size_t cap)
{
    if (open_tmp(o, msg, cap) != 0) return -1;
    int e = posix_fallocate(o->fd, 0, (off_t)o->len);
    if (e != 0 && e != EOPNOTSUPP && e != EINVAL)
        return fail(msg, cap, "%s: cannot make room for %zu bytes: %s", o->path, o->len, strerror(e));
    if (ftruncate(o->fd, (off_t)o->len) != 0) return fail(msg, cap, "%s: %s", o->path, strerror(errno));
    o->map = mmap(NULL, o->len, PROT_READ | PROT_WRITE, MAP_SHARED, o->fd, 0);
    if (o->map == MAP_FAILED) {
        o->map = NULL;
        return fail(msg, cap, "%s: mmap: %s", o->path, strerror(errno));
    }
    return 0;
}

int gemm_cli_output_create(gemm_cli_output *o, const char *path, gemm_cli_format fmt, gemm_dtype dtype,
                           uint64_t batch, uint64_t rows, uint64_t cols, char *msg, size_t cap)
{
    *o = (gemm_cli_output){.fmt = fmt, .dtype = dtype, .rows = rows, .cols = cols, .fd = -1};
    int mapped = fmt == GEMM_FMT_NPY || fmt == GEMM_FMT_RAW;
    if (batch && !mapped)
        return fail(msg, cap, "%s: a batch of %llu products is written as .npy (3-D) or raw binary, not text", path,
                    (unsigned long long)batch);
    unsigned char hdr[256];
    size_t bytes, hlen = 0;
    if (!gemm_matrix_bytes(rows, cols, dtype, &bytes) || (batch && !gemm_mul_size(bytes, (size_t)batch, &bytes)))
        return fail(msg, cap, "C (%llux%llu) is too large", (unsigned long long)rows, (unsigned long long)cols);
    if (fmt == GEMM_FMT_NPY && (hlen = gemm_npy_write_header3(hdr, sizeof hdr, dtype, batch, rows, cols)) == 0)
        return fail(msg, cap, "%s: cannot write the .npy header", path);
    if (!gemm_add_size(hlen, bytes, &o->len)) return fail(msg, cap, "C is too large");
    o->to_stdout = strcmp(path, "-") == 0;
    if (!o->to_stdout && !(o->path = strdup(path))) return fail(msg, cap, "out of memory");
    int in_memory = o->to_stdout || !mapped; /* text, or standard output: C is written out on commit */
    if (in_memory ? !(o->owned = malloc(o->len)) : map_output(o, msg, cap) != 0) {
        if (in_memory) fail(msg, cap, "out of memory for C (%zu bytes)", bytes);
        gemm_cli_output_abort(o);
        return -1;
    }
    unsigned char *start = o->owned ? o->owned : o->map;
    memcpy(start, hdr, hlen);
    o->data = start + hlen;
    return 0;
}

static int write_all(int fd, const void *p, size_t n)
{
    const unsigned char *b = p;
    while (n > 0) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -1;
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

/* C as text into the file f: 0, or -1 with msg (name: how to call f in it). */
static int write_text(gemm_cli_output *o, FILE *f, const char *name, char *msg, size_t cap)
{
    int rc = gemm_client_text_write(f, delim_of(o->fmt), o->dtype, o->rows, o->cols, o->data), e = errno;
    if (f == stdout ? fflush(f) != 0 : fclose(f) != 0) {
        e = rc == 0 ? errno : e;
        rc = -1;
    }
    return rc == 0 ? 0 : fail(msg, cap, "%s: %s", name, strerror(e));
}

int gemm_cli_output_commit(gemm_cli_output *o, char *msg, size_t cap)
{
    if (o->to_stdout && delim_of(o->fmt)) return write_text(o, stdout, "standard output", msg, cap);
    if (o->to_stdout) /* the header and C; freed by gemm_cli_output_abort, as every output's memory */
        return write_all(1, o->owned, o->len) != 0 ? fail(msg, cap, "standard output: %s", strerror(errno)) : 0;
    if (!o->map) { /* text output: written through a temporary file too */
        if (open_tmp(o, msg, cap) != 0) return -1;
        FILE *f = fdopen(o->fd, "w");
        if (!f) return fail(msg, cap, "%s: %s", o->path, strerror(errno));
        o->fd = -1;
        setvbuf(f, NULL, _IOFBF, 1 << 20);
        if (write_text(o, f, o->path, msg, cap) != 0) return -1;
    } else {
        int fd = o->fd;
        if (munmap(o->map, o->len) != 0) return fail(msg, cap, "%s: munmap: %s", o->path, strerror(errno));
        o->map = NULL;
        o->fd = -1;
        if (close(fd) != 0) return fail(msg, cap, "%s: %s", o->path, strerror(errno));
    }
    if (rename(o->tmp_path, o->path) != 0) return fail(msg, cap, "%s: rename: %s", o->path, strerror(errno));
    free(o->tmp_path); /* in place: nothing to remove */
    o->tmp_path = NULL;
    gemm_cli_output_abort(o);
    return 0;
}

void gemm_cli_output_abort(gemm_cli_output *o)
{
    if (o->map) munmap(o->map, o->len);
    if (o->fd >= 0) close(o->fd);
    if (o->tmp_path) unlink(o->tmp_path);
    free(o->tmp_path);
    free(o->path);
    free(o->owned);
    *o = (gemm_cli_output){.fd = -1};
}
