#!/usr/bin/python3
"""test_coalesce.py - dynamic batching through the daemon: 64 concurrent clients send
small products of mixed shapes, dtypes, kernels and formats (JSON, raw, .npy, some of
them batched requests) to a daemon whose engine coalesces queued products of one kind
(batch_max); every answer is checked element by element against
NumPy float64 (int32: exact), so each client gets its own product, right. With the
cpu_delay_ms hook holding each run, products pile up in the queue and must be coalesced:
some answers then report it (JSON "batched" with mode "coalesced ...", X-Gemm-Batched).
The same test runs against the CUDA backend on a GPU host (GEMMD_TEST_BACKEND=cuda).
"""
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (Daemon, Tap, compare, load_npy, npy_bytes, random_matrix,  # noqa: E402
                     raw_answer, reference, run_clients, run_guarded)

BACKEND = os.environ.get("GEMMD_TEST_BACKEND", "cpu")
CLIENTS = 64
PER_CLIENT = 6
SHAPES = [(8, 8, 8), (16, 16, 16), (5, 9, 3), (64, 64, 64)]
DTYPES = ["float32", "float64", "int32"]
FORMATS = ["json", "raw", "npy", "raw-batch"]


def kernels_for(dtype):
    if BACKEND == "cuda":
        return ["auto", "tiled", "simt"] + (["cublas"] if dtype != "int32" else [])
    return ["auto", "openblas" if dtype != "int32" else "blocked"]


def one(d, rng, i):
    """Sends product i; returns (ok, name, detail, coalesced)."""
    m, k, n = SHAPES[i % len(SHAPES)]
    dtype = DTYPES[(i // len(SHAPES)) % len(DTYPES)]
    ks = kernels_for(dtype)
    kernel = ks[i % len(ks)]
    fmt = FORMATS[(i // 3) % len(FORMATS)]
    name = "client product %d: %s %dx%dx%d kernel %s via %s" % (i, dtype, m, k, n, kernel, fmt)
    if fmt == "raw-batch":
        a = random_matrix(rng, (3, m, k), dtype)
        b = random_matrix(rng, (k, n), dtype)
        bs = a.astype("<" + a.dtype.str[1:]).tobytes() + b.astype("<" + b.dtype.str[1:]).tobytes()
        r = d.curl("POST", "/v1/matmul?m=%d&k=%d&n=%d&dtype=%s&batch=3&b_shared=1&kernel=%s"
                   % (m, k, n, dtype, kernel), data=bs, content_type="application/octet-stream",
                   accept="application/x-npy")
        c = load_npy(r.body) if r.status == 200 else None
    else:
        a = random_matrix(rng, (m, k), dtype)
        b = random_matrix(rng, (k, n), dtype)
        if fmt == "json":
            r = d.matmul_json(a, b, dtype=dtype, kernel=kernel)
            c = np.array((r.json() or {}).get("c")) if r.status == 200 else None
        elif fmt == "raw":
            r = d.matmul_raw(a, b, dtype, query="&kernel=" + kernel)
            c = raw_answer(r, m, n, dtype)
        else:
            # files of its own: clients run at once (the harness helper shares two names)
            pa = os.path.join(d.tmp.name, "A%d.npy" % i)
            pb = os.path.join(d.tmp.name, "B%d.npy" % i)
            with open(pa, "wb") as f:
                f.write(npy_bytes(a))
            with open(pb, "wb") as f:
                f.write(npy_bytes(b))
            r = d.curl("POST", "/v1/matmul?kernel=" + kernel, form=["a=@" + pa, "b=@" + pb],
                       accept="application/x-npy")
            c = load_npy(r.body) if r.status == 200 else None
    if c is None:
        return False, name, r, False
    ok, why = compare(c, reference(a, b, dtype), dtype, k)
    mode = ""
    if fmt == "json":
        mode = ((r.json() or {}).get("batched") or {}).get("mode", "")
    else:
        mode = re.sub(r"^\d+ ", "", r.header("X-Gemm-Batched") or "")
    return ok, name, why, mode.startswith("coalesced")


def storm(tap, d, label):
    flat, errors = run_clients(CLIENTS, PER_CLIENT, lambda rng, i: one(d, rng, i), seed=1000)
    tap.ok(not errors, "%s: no client raised" % label, errors[:3])
    bad = [x for x in flat if not x[0]]
    tap.ok(len(flat) == CLIENTS * PER_CLIENT and not bad,
           "%s: %d concurrent clients x %d products, every answer right and its own"
           % (label, CLIENTS, PER_CLIENT), bad[:3])
    coalesced = sum(1 for x in flat if x[3])
    tap.diag("%s: %d of %d answers ran coalesced" % (label, coalesced, len(flat)))
    return coalesced


def main(tap):
    # host_max_mnk 0: on CUDA the small products go to the GPU, to be coalesced there
    base = {"backend": BACKEND, "queue_depth": "4096", "per_ip_limit": "0",
            "connection_limit": "1024", "host_max_mnk": "0"}
    # Free-running: whatever piles up is coalesced (how much depends on timing).
    with Daemon(tap, config=dict(base, batch_max="16")) as d:
        storm(tap, d, "batch_max 16")
    # Every run held 20 ms (CPU hook): the queue fills behind it, so products must coalesce.
    if BACKEND == "cpu":
        with Daemon(tap, config=dict(base, batch_max="32", fault_inject="cpu_delay_ms:20")) as d:
            n = storm(tap, d, "runs held 20 ms")
            tap.ok(n > 0, "queued products of one kind were coalesced and said so", n)
            r = d.curl("GET", "/metrics")
            text = r.body.decode("utf-8", "replace")
            got = re.search(r"^gemmd_coalesced_products_total (\d+)$", text, re.M)
            launches = re.search(r"^gemmd_coalesced_launches_total (\d+)$", text, re.M)
            tap.ok(got and launches and int(got.group(1)) >= n and 0 < int(launches.group(1)) <= int(got.group(1)),
                   "/metrics counts the coalesced launches and products (>= the answers that said so)",
                   (got and got.group(0), launches and launches.group(0), n))
    # Off: nothing says it was coalesced.
    with Daemon(tap, config=dict(base, batch_max="1")) as d:
        n = storm(tap, d, "batch_max 1")
        tap.ok(n == 0, "with batch_max 1 no answer says coalesced", n)


if __name__ == "__main__":
    run_guarded(Tap(), main)
