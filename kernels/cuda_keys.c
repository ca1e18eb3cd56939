/*
 * cuda_keys.c - the CUDA backend's configuration keys, in every build: a GPU host's config
 * file reads on a CPU-only build too (the daemon says these keys do nothing there).
 */
#include <stddef.h>

#include "engine.h"

#define KEY(f) offsetof(gemm_engine_config, f)
const gemm_key gemm_cuda_keys[] = {
    {"devices", GEMM_KEY_DEVICES, KEY(devices), sizeof((gemm_engine_config *)0)->devices, 0, 0,
     "CUDA: all, or a comma list of device ordinals (e.g. 0,2)"},
    {"streams_per_device", GEMM_KEY_INT, KEY(streams_per_device), 0, 1, 64,
     "CUDA: streams (and worker threads) per device"},
    {"device_mem_limit_mb", GEMM_KEY_MB, KEY(device_mem_limit), 0, 0, 16777216,
     "CUDA: MiB of cached device buffers per stream (0 = no limit)"},
    {NULL, 0, 0, 0, 0, 0, NULL},
};
