/*
 * engine_err.c - the one place an engine error becomes an HTTP answer (engine_err.h).
 */
#include "engine_err.h"

static const struct {
    int status;
    const char *code;
} table[GEMM_E_COUNT] = {
    [GEMM_E_QUEUE_FULL] = {503, "queue_full"},
    [GEMM_E_SHUTTING_DOWN] = {503, "shutting_down"},
    [GEMM_E_CANCELLED] = {409, "cancelled"},
    [GEMM_E_EMPTY] = {422, "empty_matrix"},
    [GEMM_E_BAD_DTYPE] = {422, "bad_dtype"},
    [GEMM_E_BAD_OPTION] = {422, "bad_option"},
    [GEMM_E_TOO_LARGE] = {413, "too_large"},
    [GEMM_E_UNKNOWN_KERNEL] = {422, "unknown_kernel"},
    [GEMM_E_UNSUPPORTED] = {422, "unsupported"},
    [GEMM_E_UNSUPPORTED_DTYPE] = {422, "unsupported_dtype"},
    [GEMM_E_UNSUPPORTED_MATH] = {422, "unsupported_math"},
    [GEMM_E_BAD_TILE] = {422, "bad_tile"},
    [GEMM_E_BACKEND] = {500, "backend_failure"},
    [GEMM_E_DEVICE] = {500, "device_error"},
    [GEMM_E_DEVICE_LOST] = {503, "device_unavailable"},
    [GEMM_E_DEVICE_OOM] = {507, "device_out_of_memory"},
    [GEMM_E_NO_MEMORY] = {503, "out_of_memory"},
    [GEMM_E_NO_DEVICE] = {503, "no_device"},
    [GEMM_E_BAD_CONFIG] = {400, "bad_config"},
    [GEMM_E_BAD_BACKEND] = {400, "bad_backend"},
    [GEMM_E_INTERNAL] = {500, "internal_error"},
};

void gemmd_engine_err(const gemm_engine_err *in, gemm_err *out)
{
    unsigned c = (unsigned)in->code;
    if (c == GEMM_E_NONE)
        gemm_err_clear(out);
    else if (c < GEMM_E_COUNT && table[c].code)
        gemm_err_set(out, table[c].status, table[c].code, "%s", in->message);
    else
        gemm_err_set(out, 500, "internal_error", "%s", in->message[0] ? in->message : "the engine failed");
}
