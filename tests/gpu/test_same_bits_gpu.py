#!/usr/bin/python3
"""test_same_bits_gpu.py - tests/e2e/test_same_bits.py against the CUDA backend: the host
path off, so that every product reaches the GPU; mixed requests of every dtype (float32
with tf32 and bf16 math too), 1x1x1 to 1024x1024x1024, batched ones among them, sent one
at a time and then by 64 connections at once with coalescing on (batch_max 32) and off
(batch_max 1). Every answer under load is byte-identical to the same request's answer
alone and names the same kernel, tile, block and math; some of them ran coalesced. Run on
a GPU host by `make test` (tests/run.sh runs tests/gpu), or alone:
TEST_ONLY=gpu/test_same_bits_gpu tests/run.sh after `make CUDA=1 check-tests`."""
import os
import runpy

os.environ["GEMMD_TEST_BACKEND"] = "cuda"
here = os.path.dirname(os.path.abspath(__file__))
runpy.run_path(os.path.join(here, "..", "e2e", "test_same_bits.py"), run_name="__main__")
