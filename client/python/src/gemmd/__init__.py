"""gemmd: offload matrix products from Python to a gemmd server.

    import numpy as np, gemmd

    client = gemmd.Client()                 # $GEMM_SERVER / $GEMM_TOKEN, or url=, token=
    c = client.matmul(a, b)                 # an ndarray, C = A·B computed by the server
    p = client.product(a, b, kernel="cublas", math="tf32")
    p.c, p.kernel, p.timing.kernel_ms       # C, the kernel that ran, the server's timing

    job = client.submit(a, b)               # queued; returns at once
    c = job.result(timeout=60)              # polls, then fetches C

A and B travel as raw little-endian bytes straight from their buffers, and C is read from
the socket straight into its ndarray. Errors are :class:`GemmError` (``status``, ``code``,
``message``) and its subclasses.
"""

from ._client import DEFAULT_URL, Client, Job, prepare, wire_dtype
from ._errors import (GemmBusyError, GemmConnectionError, GemmError, GemmProtocolError,
                      GemmTimeoutError)
from ._types import JOB_STATES, JobStatus, Product, Timing

__version__ = "0.1.0"

__all__ = ["Client", "Job", "Product", "Timing", "JobStatus", "JOB_STATES", "GemmError", "GemmConnectionError",
           "GemmTimeoutError", "GemmBusyError", "GemmProtocolError", "DEFAULT_URL", "prepare", "wire_dtype",
           "__version__"]
