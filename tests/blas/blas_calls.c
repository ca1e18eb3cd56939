/*
 * blas_calls.c - a plain BLAS program (linked with -lblas only) that makes the calls a
 * test describes and writes the resulting C buffers, so that the test can check them
 * against its own float64 reference. tests/e2e/test_blas.py runs it with and without
 * LD_PRELOAD=libgemm_blas.so.
 *
 *     [BLAS_CALLS_LIB=libother.so] blas_calls CASES DATA OUT
 *
 * CASES: one call a line,
 *     entry order ta tb m n k lda ldb ldc alpha beta null_ab a_off a_len b_off b_len c_off c_len
 *   entry: cblas_sgemm | cblas_dgemm | sgemm_ | dgemm_ (called as a program linked with
 *     -lblas calls them), or any other gemm name of client/blas's table (cblas_dgemm64_,
 *     scipy_sgemm_, ...): looked up with dlsym in the global scope, else in BLAS_CALLS_LIB,
 *     which is opened RTLD_LOCAL as NumPy's and SciPy's extensions load their BLAS. The name
 *     gives the ABI: "cblas_" in it is CBLAS, else Fortran; "64" in it is 64-bit integers;
 *     "sgemm" float32;
 *   order: R | C (ignored by Fortran names);
 *   ta, tb: a character N, T, C (any other is passed as is: an invalid argument);
 *   alpha, beta: decimal; null_ab: 1 passes NULL for A and B;
 *   *_off, *_len: where A, B and C start in DATA and how many elements they have.
 * DATA: float64 values, little-endian; sgemm calls get them converted to float32.
 * OUT: DATA after the calls (each C converted back to float64).
 * Exits 0 when every call was made (whatever their results), 2 on a usage or I/O error.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                 const float *b, int ldb, float beta, float *c, int ldc);
void cblas_dgemm(int order, int ta, int tb, int m, int n, int k, double alpha, const double *a, int lda,
                 const double *b, int ldb, double beta, double *c, int ldc);
void sgemm_(const char *ta, const char *tb, const int *m, const int *n, const int *k, const float *alpha,
            const float *a, const int *lda, const float *b, const int *ldb, const float *beta, float *c,
            const int *ldc);
void dgemm_(const char *ta, const char *tb, const int *m, const int *n, const int *k, const double *alpha,
            const double *a, const int *lda, const double *b, const int *ldb, const double *beta, double *c,
            const int *ldc);

static int cblas_trans(char t)
{
    switch (t) {
    case 'N': return 111;
    case 'T': return 112;
    case 'C': return 113;
    default: return 100 + (unsigned char)t; /* invalid on purpose */
    }
}

/* One call of a routine with integers IT and reals FT, CBLAS or Fortran. */
#define CALL(NAME, IT, FT)                                                                               \
    static void NAME(void *fn, int f77, int ord, char ta, char tb, IT m, IT n, IT k, double alpha, const void *a, \
                     IT lda, const void *b, IT ldb, double beta, void *c, IT ldc)                         \
    {                                                                                                     \
        FT al = (FT)alpha, be = (FT)beta;                                                                 \
        if (f77)                                                                                          \
            ((void (*)(const char *, const char *, const IT *, const IT *, const IT *, const FT *, const FT *, \
                       const IT *, const FT *, const IT *, const FT *, FT *, const IT *))fn)(             \
                &ta, &tb, &m, &n, &k, &al, a, &lda, b, &ldb, &be, c, &ldc);                               \
        else                                                                                              \
            ((void (*)(int, int, int, IT, IT, IT, FT, const FT *, IT, const FT *, IT, FT, FT *, IT))fn)(  \
                ord, cblas_trans(ta), cblas_trans(tb), m, n, k, al, a, lda, b, ldb, be, c, ldc);          \
    }
CALL(call_s32, int, float)
CALL(call_d32, int, double)
CALL(call_s64, int64_t, float)
CALL(call_d64, int64_t, double)

static void *routine(const char *entry, void *lib)
{
    if (strcmp(entry, "cblas_sgemm") == 0) return (void *)cblas_sgemm;
    if (strcmp(entry, "cblas_dgemm") == 0) return (void *)cblas_dgemm;
    if (strcmp(entry, "sgemm_") == 0) return (void *)sgemm_;
    if (strcmp(entry, "dgemm_") == 0) return (void *)dgemm_;
    void *fn = dlsym(RTLD_DEFAULT, entry);
    return fn || !lib ? fn : dlsym(lib, entry);
}

static float *to_float(const double *x, size_t n)
{
    float *f = malloc((n ? n : 1) * sizeof *f);
    if (!f) exit(2);
    for (size_t i = 0; i < n; i++) f[i] = (float)x[i];
    return f;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: blas_calls CASES DATA OUT\n");
        return 2;
    }
    FILE *fd = fopen(argv[2], "rb");
    if (!fd || fseek(fd, 0, SEEK_END) != 0) return 2;
    long bytes = ftell(fd);
    if (bytes < 0 || bytes % 8 || fseek(fd, 0, SEEK_SET) != 0) return 2;
    size_t total = (size_t)bytes / 8;
    double *data = malloc((total ? total : 1) * sizeof *data);
    if (!data || fread(data, 8, total, fd) != total) return 2;
    fclose(fd);

    const char *libname = getenv("BLAS_CALLS_LIB");
    void *lib = libname && *libname ? dlopen(libname, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (libname && *libname && !lib) {
        fprintf(stderr, "blas_calls: %s\n", dlerror());
        return 2;
    }
    FILE *fc = fopen(argv[1], "r");
    if (!fc) return 2;
    char line[512];
    int calls = 0;
    while (fgets(line, sizeof line, fc)) {
        char entry[32], order, ta, tb;
        int m, n, k, lda, ldb, ldc, null_ab;
        double alpha, beta;
        size_t ao, al, bo, bl, co, cl;
        if (line[0] == '#' || line[0] == '\n') continue;
        if (sscanf(line, "%31s %c %c %c %d %d %d %d %d %d %lf %lf %d %zu %zu %zu %zu %zu %zu", entry, &order, &ta, &tb,
                   &m, &n, &k, &lda, &ldb, &ldc, &alpha, &beta, &null_ab, &ao, &al, &bo, &bl, &co, &cl) != 19 ||
            ao + al > total || bo + bl > total || co + cl > total) {
            fprintf(stderr, "blas_calls: bad case line: %s", line);
            return 2;
        }
        void *fn = routine(entry, lib);
        if (!fn) {
            fprintf(stderr, "blas_calls: no routine %s\n", entry);
            return 2;
        }
        int ord = order == 'R' ? 101 : order == 'C' ? 102 : 100, f77 = !strstr(entry, "cblas_");
        int i64 = strstr(entry, "64") != NULL, f32 = strstr(entry, "sgemm") != NULL;
        double *a = null_ab ? NULL : data + ao, *b = null_ab ? NULL : data + bo, *c = data + co;
        if (f32) {
            float *af = null_ab ? NULL : to_float(a, al), *bf = null_ab ? NULL : to_float(b, bl);
            float *cf = to_float(c, cl);
            if (i64) call_s64(fn, f77, ord, ta, tb, m, n, k, alpha, af, lda, bf, ldb, beta, cf, ldc);
            else call_s32(fn, f77, ord, ta, tb, m, n, k, alpha, af, lda, bf, ldb, beta, cf, ldc);
            for (size_t i = 0; i < cl; i++) c[i] = cf[i];
            free(af), free(bf), free(cf);
        } else if (i64) {
            call_d64(fn, f77, ord, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        } else {
            call_d32(fn, f77, ord, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        }
        calls++;
    }
    fclose(fc);
    FILE *fo = fopen(argv[3], "wb");
    if (!fo || fwrite(data, 8, total, fo) != total || fclose(fo) != 0) return 2;
    free(data);
    printf("calls %d\n", calls);
    return 0;
}
