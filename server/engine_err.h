/*
 * engine_err.h - the engine's errors as the daemon answers them: one table from each
 * gemm_ecode to an HTTP status and the JSON error code clients see (engine_err.c).
 */
#ifndef GEMMD_ENGINE_ERR_H
#define GEMMD_ENGINE_ERR_H

#include "engine.h"

/* *out = in as status, code and message (no error: cleared; a code missing from the
 * table: 500 internal_error). */
void gemmd_engine_err(const gemm_engine_err *in, gemm_err *out);

#endif
