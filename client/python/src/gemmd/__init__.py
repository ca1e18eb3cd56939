"""gemmd: offload matrix products from Python to a gemmd server.

    client = gemmd.Client()                 # $GEMM_SERVER / $GEMM_TOKEN, or url=, token=
    c = client.matmul(a, b)                 # an ndarray, C = A·B computed by the server
    c = client.submit(a, b).result(timeout=60)  # the same as a job

A and B travel as raw bytes straight from their buffers, C is read straight into its
ndarray; errors are :class:`GemmError` and its subclasses (client/python/README.md).
"""

from ._client import DEFAULT_URL, Client, Job, prepare, wire_dtype
from ._errors import (GemmBusyError, GemmConnectionError, GemmError, GemmProtocolError,
                      GemmTimeoutError)
from ._types import JOB_STATES, JobStatus, Product, Timing

__version__ = "0.1.0"

__all__ = ["Client", "Job", "Product", "Timing", "JobStatus", "JOB_STATES", "GemmError", "GemmConnectionError",
           "GemmTimeoutError", "GemmBusyError", "GemmProtocolError", "DEFAULT_URL", "prepare", "wire_dtype",
           "__version__"]
