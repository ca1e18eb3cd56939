#!/usr/bin/python3
"""test_coalesce_gpu.py - tests/e2e/test_coalesce.py against the CUDA backend: 64 concurrent
clients with mixed small products of every dtype, several kernels (auto, tiled, simt,
cublas) and formats, batched requests among them, through a daemon that coalesces queued
products (batch_max 16); every answer right and its own; batch_max 1 says
nothing was coalesced. Run on a GPU host by `make test` (tests/run.sh runs tests/gpu)."""
import os
import runpy

os.environ["GEMMD_TEST_BACKEND"] = "cuda"
here = os.path.dirname(os.path.abspath(__file__))
runpy.run_path(os.path.join(here, "..", "e2e", "test_coalesce.py"), run_name="__main__")
