/*
 * matfile.c - matrix files of the `gemm` command.
 *
 * Inputs are mmap'ed and sent as they are: for .npy the bytes after the header, for raw
 * binary the whole file. Only two cases copy: a fortran_order .npy is transposed into a
 * row-major buffer (the wire format is row-major), and text (CSV/TSV) is parsed into one.
 * Outputs in .npy or raw binary are created at their final size in a temporary file of
 * the same folder, mmap'ed, and C is written by the transfer straight into the mapping;
 * the file is renamed into place only when the product succeeded, so an interrupted or
 * failed run leaves no partial output behind.
 */
#include "cli.h"

#include "gemm_util.h"
#include "npy.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *ext_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    const char *dot = strrchr(path, '.');
    if (!dot || (slash && dot < slash)) return "";
    return dot + 1;
}

static int format_from_name(const char *s, gemm_cli_format *out)
{
    static const struct { const char *name; gemm_cli_format f; } names[] = {
        {"npy", GEMM_FMT_NPY}, {"raw", GEMM_FMT_RAW}, {"bin", GEMM_FMT_RAW}, {"csv", GEMM_FMT_CSV},
        {"tsv", GEMM_FMT_TSV}, {"tab", GEMM_FMT_TSV}, {"txt", GEMM_FMT_TXT}, {"text", GEMM_FMT_TXT},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcasecmp(s, names[i].name) == 0) {
            *out = names[i].f;
            return 0;
        }
    }
    return -1;
}

const char *gemm_cli_format_name(gemm_cli_format f)
{
    switch (f) {
    case GEMM_FMT_NPY: return "npy";
    case GEMM_FMT_RAW: return "raw";
    case GEMM_FMT_CSV: return "csv";
    case GEMM_FMT_TSV: return "tsv";
    case GEMM_FMT_TXT: return "txt";
    default: return "auto";
    }
}

int gemm_cli_format_of(const char *path, const char *forced, gemm_cli_format *out, char *msg, size_t cap)
{
    if (forced && *forced) {
        if (format_from_name(forced, out) == 0) return 0;
        snprintf(msg, cap, "unknown format \"%s\" (npy, raw, csv, tsv, txt)", forced);
        return -1;
    }
    if (strcmp(path, "-") == 0) {
        *out = GEMM_FMT_CSV;
        return 0;
    }
    if (format_from_name(ext_of(path), out) == 0) return 0;
    snprintf(msg, cap, "%s: cannot tell the format from the extension (.npy, .bin/.raw, .csv, .tsv, .txt); "
                       "use --format", path);
    return -1;
}

static char delim_of(gemm_cli_format f)
{
    switch (f) {
    case GEMM_FMT_CSV: return ',';
    case GEMM_FMT_TSV: return '\t';
    case GEMM_FMT_TXT: return ' ';
    default: return 0;
    }
}

/* ---------------------------------------------------------------- inputs */

static int map_file(const char *path, void **map, size_t *len, char *msg, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(msg, cap, "%s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(msg, cap, "%s: not a regular file", path);
        close(fd);
        return -1;
    }
    if (st.st_size == 0) {
        snprintf(msg, cap, "%s: empty file", path);
        close(fd);
        return -1;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) {
        snprintf(msg, cap, "%s: mmap: %s", path, strerror(e));
        return -1;
    }
    madvise(p, (size_t)st.st_size, MADV_SEQUENTIAL);
    *map = p;
    *len = (size_t)st.st_size;
    return 0;
}

static int open_npy(gemm_cli_input *m, const char *path, gemm_dtype want, char *msg, size_t cap)
{
    gemm_npy_header h;
    gemm_err err;
    gemm_err_clear(&err);
    int rc = gemm_npy_parse_header(m->map, m->map_len, &h, &err);
    if (rc == 0) {
        snprintf(msg, cap, "%s: truncated .npy header", path);
        return -1;
    }
    if (rc < 0) {
        snprintf(msg, cap, "%s: %s", path, err.message);
        return -1;
    }
    if (want != GEMM_DTYPE_INVALID && want != h.dtype) {
        snprintf(msg, cap, "%s holds %s but --dtype is %s", path, gemm_dtype_name(h.dtype), gemm_dtype_name(want));
        return -1;
    }
    size_t bytes, need;
    if (!gemm_matrix_bytes(h.rows, h.cols, h.dtype, &bytes) ||
        (h.ndim == 3 && !gemm_mul_size(bytes, (size_t)h.batch, &bytes)) || !gemm_add_size(h.data_offset, bytes, &need)) {
        snprintf(msg, cap, "%s: shape too large", path);
        return -1;
    }
    if (m->map_len < need) {
        snprintf(msg, cap, "%s: truncated: %llux%llu %s needs %zu data bytes, the file has %zu", path,
                 (unsigned long long)h.rows, (unsigned long long)h.cols, gemm_dtype_name(h.dtype), bytes,
                 m->map_len - h.data_offset);
        return -1;
    }
    if (h.ndim == 3 && h.batch == 0) {
        snprintf(msg, cap, "%s: a stack of 0 matrices", path);
        return -1;
    }
    m->dtype = h.dtype;
    m->rows = h.rows;
    m->cols = h.cols;
    m->batch = h.batch; /* 3-D arrays are C order (the parser refuses Fortran order) */
    const unsigned char *src = (const unsigned char *)m->map + h.data_offset;
    if (!h.fortran_order || h.rows == 1 || h.cols == 1) {
        m->data = src;
        return 0;
    }
    /* column-major on disk: transpose into a row-major buffer (the one copy we make) */
    size_t es = gemm_dtype_size(h.dtype);
    unsigned char *dst = malloc(bytes);
    if (!dst) {
        snprintf(msg, cap, "%s: out of memory transposing a fortran_order array", path);
        return -1;
    }
    const uint64_t B = 64;
    for (uint64_t jb = 0; jb < h.cols; jb += B)
        for (uint64_t i = 0; i < h.rows; i++)
            for (uint64_t j = jb; j < h.cols && j < jb + B; j++)
                memcpy(dst + (i * h.cols + j) * es, src + (j * h.rows + i) * es, es);
    m->owned = dst;
    m->data = dst;
    return 0;
}

int gemm_cli_input_open(gemm_cli_input *m, const char *path, gemm_cli_format fmt, gemm_dtype dtype,
                        uint64_t rows, uint64_t cols, char *msg, size_t cap)
{
    memset(m, 0, sizeof *m);
    m->fmt = fmt;
    if (map_file(path, &m->map, &m->map_len, msg, cap) != 0) return -1;
    switch (fmt) {
    case GEMM_FMT_NPY:
        if (open_npy(m, path, dtype, msg, cap) != 0) goto fail;
        return 0;
    case GEMM_FMT_RAW: {
        size_t es = gemm_dtype_size(dtype);
        if (es == 0) {
            snprintf(msg, cap, "%s: raw binary needs --dtype (float32, float64, int32)", path);
            goto fail;
        }
        if (rows == 0) {
            snprintf(msg, cap, "%s: raw binary needs --shape MxK (or MxKxN)", path);
            goto fail;
        }
        if (m->map_len % es != 0) {
            snprintf(msg, cap, "%s: %zu bytes is not a whole number of %s elements", path, m->map_len,
                     gemm_dtype_name(dtype));
            goto fail;
        }
        uint64_t count = m->map_len / es;
        if (cols == 0) {
            if (count % rows != 0) {
                snprintf(msg, cap, "%s: %llu elements do not make %llu whole rows", path,
                         (unsigned long long)count, (unsigned long long)rows);
                goto fail;
            }
            cols = count / rows;
        }
        size_t bytes;
        if (!gemm_matrix_bytes(rows, cols, dtype, &bytes) || bytes != m->map_len) {
            snprintf(msg, cap, "%s: %zu bytes, but %llux%llu %s takes %llu x %llu x %zu", path, m->map_len,
                     (unsigned long long)rows, (unsigned long long)cols, gemm_dtype_name(dtype),
                     (unsigned long long)rows, (unsigned long long)cols, es);
            goto fail;
        }
        m->dtype = dtype;
        m->rows = rows;
        m->cols = cols;
        m->data = m->map;
        return 0;
    }
    case GEMM_FMT_CSV:
    case GEMM_FMT_TSV:
    case GEMM_FMT_TXT: {
        gemm_text_error te;
        void *data = NULL;
        if (dtype == GEMM_DTYPE_INVALID) dtype = GEMM_DTYPE_F64;
        if (gemm_client_text_parse(m->map, m->map_len, delim_of(fmt), dtype, &m->rows, &m->cols, &data, &te) != 0) {
            if (te.line > 0) snprintf(msg, cap, "%s:%d: %s", path, te.line, te.message);
            else snprintf(msg, cap, "%s: %s", path, te.message);
            goto fail;
        }
        m->dtype = dtype;
        m->owned = data;
        m->data = data;
        /* the text is no longer needed */
        munmap(m->map, m->map_len);
        m->map = NULL;
        m->map_len = 0;
        return 0;
    }
    default:
        snprintf(msg, cap, "%s: unknown format", path);
        goto fail;
    }
fail:
    gemm_cli_input_close(m);
    return -1;
}

void gemm_cli_input_close(gemm_cli_input *m)
{
    if (m->map) munmap(m->map, m->map_len);
    free(m->owned);
    memset(m, 0, sizeof *m);
}

/* ---------------------------------------------------------------- outputs */

int gemm_cli_output_create(gemm_cli_output *o, const char *path, gemm_cli_format fmt, gemm_dtype dtype,
                           uint64_t rows, uint64_t cols, char *msg, size_t cap)
{
    return gemm_cli_output_create3(o, path, fmt, dtype, 0, rows, cols, msg, cap);
}

/* Bytes of o's C: batch matrices (or one); 0 on overflow. */
static size_t output_bytes(const gemm_cli_output *o)
{
    size_t bytes = 0;
    if (!gemm_matrix_bytes(o->rows, o->cols, o->dtype, &bytes) ||
        (o->batch && !gemm_mul_size(bytes, (size_t)o->batch, &bytes)))
        return 0;
    return bytes;
}

int gemm_cli_output_create3(gemm_cli_output *o, const char *path, gemm_cli_format fmt, gemm_dtype dtype,
                            uint64_t batch, uint64_t rows, uint64_t cols, char *msg, size_t cap)
{
    memset(o, 0, sizeof *o);
    o->fd = -1;
    o->fmt = fmt;
    o->dtype = dtype;
    o->rows = rows;
    o->cols = cols;
    o->batch = batch;
    if (batch && fmt != GEMM_FMT_NPY && fmt != GEMM_FMT_RAW) {
        snprintf(msg, cap, "%s: a batch of %llu products is written as .npy (3-D) or raw binary, not text", path,
                 (unsigned long long)batch);
        return -1;
    }
    size_t bytes = output_bytes(o);
    if (bytes == 0) {
        snprintf(msg, cap, "C (%llux%llu) is too large", (unsigned long long)rows, (unsigned long long)cols);
        return -1;
    }
    int mapped = fmt == GEMM_FMT_NPY || fmt == GEMM_FMT_RAW;
    o->to_stdout = strcmp(path, "-") == 0;
    if (o->to_stdout || !mapped) {
        /* text, or standard output: C lands in memory and is written out on commit */
        o->owned = malloc(bytes);
        if (!o->owned) {
            snprintf(msg, cap, "out of memory for C (%zu bytes)", bytes);
            return -1;
        }
        o->data = o->owned;
        if (!o->to_stdout) {
            o->path = strdup(path);
            if (!o->path) goto nomem;
        }
        return 0;
    }
    o->path = strdup(path);
    char *dirbuf = strdup(path), *basebuf = strdup(path);
    if (!o->path || !dirbuf || !basebuf) {
        free(dirbuf);
        free(basebuf);
        goto nomem;
    }
    size_t tlen = strlen(path) + 32;
    o->tmp_path = malloc(tlen);
    if (o->tmp_path) snprintf(o->tmp_path, tlen, "%s/.%s.partXXXXXX", dirname(dirbuf), basename(basebuf));
    free(dirbuf);
    free(basebuf);
    if (!o->tmp_path) goto nomem;
    o->fd = mkstemp(o->tmp_path);
    if (o->fd < 0) {
        snprintf(msg, cap, "%s: cannot create: %s", path, strerror(errno));
        free(o->tmp_path);
        o->tmp_path = NULL;
        goto fail;
    }
    mode_t um = umask(0);
    umask(um);
    if (fchmod(o->fd, 0666 & ~um) != 0) { /* mkstemp makes 0600; give the usual mode */ }
    unsigned char hdr[256];
    size_t hlen = 0;
    if (fmt == GEMM_FMT_NPY) {
        hlen = gemm_npy_write_header3(hdr, sizeof hdr, dtype, batch, rows, cols);
        if (hlen == 0) {
            snprintf(msg, cap, "%s: cannot write the .npy header", path);
            goto fail;
        }
    }
    if (!gemm_add_size(hlen, bytes, &o->map_len)) {
        snprintf(msg, cap, "C is too large");
        goto fail;
    }
    int e = posix_fallocate(o->fd, 0, (off_t)o->map_len);
    if (e != 0 && e != EOPNOTSUPP && e != EINVAL) {
        snprintf(msg, cap, "%s: cannot make room for %zu bytes: %s", path, o->map_len, strerror(e));
        goto fail;
    }
    if (ftruncate(o->fd, (off_t)o->map_len) != 0) {
        snprintf(msg, cap, "%s: %s", path, strerror(errno));
        goto fail;
    }
    o->map = mmap(NULL, o->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, o->fd, 0);
    if (o->map == MAP_FAILED) {
        o->map = NULL;
        snprintf(msg, cap, "%s: mmap: %s", path, strerror(errno));
        goto fail;
    }
    memcpy(o->map, hdr, hlen);
    o->data = (unsigned char *)o->map + hlen;
    return 0;
nomem:
    snprintf(msg, cap, "out of memory");
fail:
    gemm_cli_output_abort(o);
    return -1;
}

static int write_all(int fd, const void *p, size_t n)
{
    const unsigned char *b = p;
    while (n > 0) {
        ssize_t w = write(fd, b, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

int gemm_cli_output_commit(gemm_cli_output *o, char *msg, size_t cap)
{
    size_t bytes = output_bytes(o);
    if (o->to_stdout) {
        int rc = 0;
        if (o->fmt == GEMM_FMT_NPY) {
            unsigned char hdr[256];
            size_t hlen = gemm_npy_write_header3(hdr, sizeof hdr, o->dtype, o->batch, o->rows, o->cols);
            rc = (hlen == 0 || write_all(1, hdr, hlen) != 0 || write_all(1, o->data, bytes) != 0) ? -1 : 0;
        } else if (o->fmt == GEMM_FMT_RAW) {
            rc = write_all(1, o->data, bytes);
        } else {
            rc = gemm_client_text_write(stdout, delim_of(o->fmt), o->dtype, o->rows, o->cols, o->data);
            if (fflush(stdout) != 0) rc = -1;
        }
        if (rc != 0) snprintf(msg, cap, "standard output: %s", strerror(errno));
        free(o->owned);
        o->owned = NULL;
        return rc;
    }
    if (!o->map) {
        /* text output: written through a temporary file too */
        size_t tlen = strlen(o->path) + 32;
        char *dirbuf = strdup(o->path), *basebuf = strdup(o->path);
        o->tmp_path = malloc(tlen);
        if (!dirbuf || !basebuf || !o->tmp_path) {
            free(dirbuf);
            free(basebuf);
            snprintf(msg, cap, "out of memory");
            return -1;
        }
        snprintf(o->tmp_path, tlen, "%s/.%s.partXXXXXX", dirname(dirbuf), basename(basebuf));
        free(dirbuf);
        free(basebuf);
        o->fd = mkstemp(o->tmp_path);
        if (o->fd < 0) {
            snprintf(msg, cap, "%s: cannot create: %s", o->path, strerror(errno));
            free(o->tmp_path);
            o->tmp_path = NULL;
            return -1;
        }
        mode_t um = umask(0);
        umask(um);
        if (fchmod(o->fd, 0666 & ~um) != 0) { /* keep 0600 */ }
        FILE *f = fdopen(o->fd, "w");
        if (!f) {
            snprintf(msg, cap, "%s: %s", o->path, strerror(errno));
            return -1;
        }
        o->fd = -1;
        setvbuf(f, NULL, _IOFBF, 1 << 20);
        int rc = gemm_client_text_write(f, delim_of(o->fmt), o->dtype, o->rows, o->cols, o->data);
        int e = errno;
        if (fclose(f) != 0 && rc == 0) {
            rc = -1;
            e = errno;
        }
        if (rc != 0) {
            snprintf(msg, cap, "%s: %s", o->path, strerror(e));
            return -1;
        }
    } else {
        if (munmap(o->map, o->map_len) != 0) {
            snprintf(msg, cap, "%s: munmap: %s", o->path, strerror(errno));
            return -1;
        }
        o->map = NULL;
        if (close(o->fd) != 0) {
            o->fd = -1;
            snprintf(msg, cap, "%s: %s", o->path, strerror(errno));
            return -1;
        }
        o->fd = -1;
    }
    if (rename(o->tmp_path, o->path) != 0) {
        snprintf(msg, cap, "%s: rename: %s", o->path, strerror(errno));
        return -1;
    }
    free(o->tmp_path);
    o->tmp_path = NULL;
    free(o->path);
    o->path = NULL;
    free(o->owned);
    o->owned = NULL;
    return 0;
}

void gemm_cli_output_abort(gemm_cli_output *o)
{
    if (o->map) munmap(o->map, o->map_len);
    o->map = NULL;
    if (o->fd >= 0) close(o->fd);
    o->fd = -1;
    if (o->tmp_path) unlink(o->tmp_path);
    free(o->tmp_path);
    o->tmp_path = NULL;
    free(o->path);
    o->path = NULL;
    free(o->owned);
    o->owned = NULL;
}
