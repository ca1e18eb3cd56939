/*
 * info.c - `gemm info` and `gemm health`. info walks whatever GET /v1/info sends (new
 * fields show up without a change here) and prints it for a person (docs/CLIENT.md).
 */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

/* ---------------------------------------------------------------- the /v1/info printer */

static int is_scalar(const cJSON *v) { return !cJSON_IsObject(v) && !cJSON_IsArray(v); }

static int all_scalars(const cJSON *arr)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, arr)
        if (!is_scalar(e)) return 0;
    return 1;
}

/* A key that names a size in bytes: "total_mem", "free_mem", "max_body_bytes", ... */
static int is_bytes_key(const char *key)
{
    if (!key) return 0;
    size_t n = strlen(key);
    return (n >= 4 && strcmp(key + n - 4, "_mem") == 0) || (n >= 5 && strcmp(key + n - 5, "bytes") == 0);
}

static void print_scalar(FILE *f, const cJSON *v, const char *key)
{
    if (cJSON_IsString(v)) {
        fputs(v->valuestring, f);
    } else if (cJSON_IsBool(v)) {
        fputs(cJSON_IsTrue(v) ? "true" : "false", f);
    } else if (cJSON_IsNull(v)) {
        fputs("-", f);
    } else if (cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        if (d > -9.0e15 && d < 9.0e15 && d == (double)(long long)d) /* in range before the cast */
            fprintf(f, "%lld", (long long)d);
        else
            fprintf(f, "%.6g", d);
        if (is_bytes_key(key) && d >= 1048576.0)
            fprintf(f, " (%.1f %s)", d >= 1073741824.0 ? d / 1073741824.0 : d / 1048576.0,
                    d >= 1073741824.0 ? "GiB" : "MiB");
    }
}

static void print_value(FILE *f, const cJSON *v, int indent);

/* What follows "key:" (sep " ") or "- " (sep ""): a value or a list of values on the same
 * line, "(none)" for an empty object after a key, else the parts below at indent. */
static void print_rest(FILE *f, const cJSON *v, const char *key, const char *sep, int indent)
{
    const cJSON *e;
    if (is_scalar(v) || (cJSON_IsArray(v) && all_scalars(v))) { /* a value, or a list of them */
        fputs(sep, f);
        if (is_scalar(v)) print_scalar(f, v, key);
        else if (!v->child) fputs("(none)", f);
        cJSON_ArrayForEach(e, v) { /* a scalar has no child */
            fputs(e == v->child ? "" : ", ", f);
            print_scalar(f, e, NULL);
        }
    } else if (cJSON_IsObject(v) && !v->child && *sep) {
        fputs(" (none)", f);
    } else {
        fputc('\n', f);
        print_value(f, v, indent);
        return;
    }
    fputc('\n', f);
}

/* The members of an object, one a line at `indent`. A "- " item prints its first member
 * on the dash's line: first_indent is then 0. */
static void print_members(FILE *f, const cJSON *obj, int indent, int first_indent)
{
    const cJSON *m;
    cJSON_ArrayForEach(m, obj) {
        fprintf(f, "%*s%s:", m == obj->child ? first_indent : indent, "", m->string ? m->string : "?");
        print_rest(f, m, m->string, " ", indent + 2);
    }
}

/* An object or an array (print_rest prints scalars itself). */
static void print_value(FILE *f, const cJSON *v, int indent)
{
    const cJSON *e;
    if (cJSON_IsObject(v)) {
        print_members(f, v, indent, indent);
        return;
    }
    cJSON_ArrayForEach(e, v) {
        fprintf(f, "%*s- ", indent, "");
        if (cJSON_IsObject(e) && e->child) print_members(f, e, indent + 2, 0);
        else print_rest(f, e, NULL, "", indent + 2);
    }
}

/* ---------------------------------------------------------------- info, health */

int gemm_cli_info(const gemm_cli_opts *o)
{
    gemm_client_error err;
    gemm_client *c = gemm_cli_client(o, &gemm_cli_bar, &err);
    if (!c) return gemm_cli_fail(&err, "info");
    char *body = NULL;
    int status = 0, rc = GEMM_EXIT_OK, got = gemm_client_get(c, "/v1/info", &body, &status, &err);
    cJSON *j = body ? cJSON_Parse(body) : NULL;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "error"), "message");
    if (got != 0) {
        rc = gemm_cli_fail(&err, "info");
    } else if (status < 200 || status >= 300) {
        fprintf(stderr, "gemm: info: server error %d: %s\n", status, cJSON_IsString(m) ? m->valuestring : body);
        rc = GEMM_EXIT_SERVER;
    } else if (o->json) {
        size_t n = strlen(body);
        fputs(body, stdout);
        if (n == 0 || body[n - 1] != '\n') fputc('\n', stdout);
    } else if (!cJSON_IsObject(j)) {
        rc = gemm_cli_say(GEMM_EXIT_SERVER, "info: the server's answer is not a JSON object");
    } else {
        print_value(stdout, j, 0);
    }
    cJSON_Delete(j);
    free(body);
    gemm_client_free(c);
    if (fflush(stdout) != 0 && rc == GEMM_EXIT_OK) rc = GEMM_EXIT_IO;
    return rc;
}

int gemm_cli_health(const gemm_cli_opts *o)
{
    gemm_client_error err;
    gemm_cli_opts o2 = *o;
    o2.retries = 0; /* a 503 from /readyz is the answer, not something to wait out */
    gemm_client *c = gemm_cli_client(&o2, &gemm_cli_bar, &err);
    if (!c) return gemm_cli_fail(&err, "health");
    static const char *const paths[] = {"/healthz", "/readyz"};
    int n_paths = o->live ? 1 : 2; /* --live: liveness only */
    int rc = GEMM_EXIT_OK;
    for (int i = 0; i < n_paths; i++) {
        char *body = NULL;
        int status = 0;
        if (gemm_client_get(c, paths[i], &body, &status, &err) != 0) {
            rc = gemm_cli_fail(&err, paths[i] + 1); /* body is NULL */
            break;
        }
        size_t n = strlen(body);
        while (n > 0 && (body[n - 1] == '\n' || body[n - 1] == '\r')) body[--n] = '\0';
        printf("%-8s %d %s\n", paths[i] + 1, status, body);
        if (status < 200 || status >= 300) rc = GEMM_EXIT_SERVER;
        free(body);
    }
    gemm_client_free(c);
    return rc;
}
