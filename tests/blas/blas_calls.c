/*
 * blas_calls.c - a plain BLAS program (linked with -lblas only) that makes the calls a
 * test describes and writes the resulting C buffers, so that the test can check them
 * against its own float64 reference. tests/e2e/test_blas.py runs it with and without
 * LD_PRELOAD=libgemm_blas.so.
 *
 *     blas_calls CASES DATA OUT
 *
 * CASES: one call a line,
 *     entry order ta tb m n k lda ldb ldc alpha beta null_ab a_off a_len b_off b_len c_off c_len
 *   entry: cblas_sgemm | cblas_dgemm | sgemm_ | dgemm_;  order: R | C (ignored by sgemm_/dgemm_);
 *   ta, tb: a character N, T, C (any other is passed as is: an invalid argument);
 *   alpha, beta: decimal; null_ab: 1 passes NULL for A and B;
 *   *_off, *_len: where A, B and C start in DATA and how many elements they have.
 * DATA: float64 values, little-endian; sgemm calls get them converted to float32.
 * OUT: DATA after the calls (each C converted back to float64).
 * Exits 0 when every call was made (whatever their results), 2 on a usage or I/O error.
 */
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
        int ord = order == 'R' ? 101 : order == 'C' ? 102 : 100;
        double *a = null_ab ? NULL : data + ao, *b = null_ab ? NULL : data + bo, *c = data + co;
        if (strcmp(entry, "cblas_dgemm") == 0) {
            cblas_dgemm(ord, cblas_trans(ta), cblas_trans(tb), m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        } else if (strcmp(entry, "dgemm_") == 0) {
            dgemm_(&ta, &tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
        } else if (strcmp(entry, "cblas_sgemm") == 0 || strcmp(entry, "sgemm_") == 0) {
            float *af = null_ab ? NULL : to_float(a, al), *bf = null_ab ? NULL : to_float(b, bl);
            float *cf = to_float(c, cl);
            float alf = (float)alpha, bef = (float)beta;
            if (entry[0] == 'c')
                cblas_sgemm(ord, cblas_trans(ta), cblas_trans(tb), m, n, k, alf, af, lda, bf, ldb, bef, cf, ldc);
            else
                sgemm_(&ta, &tb, &m, &n, &k, &alf, af, &lda, bf, &ldb, &bef, cf, &ldc);
            for (size_t i = 0; i < cl; i++) c[i] = cf[i];
            free(af), free(bf), free(cf);
        } else {
            fprintf(stderr, "blas_calls: unknown entry %s\n", entry);
            return 2;
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
