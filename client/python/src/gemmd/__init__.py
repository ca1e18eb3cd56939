"""gemmd: offload matrix products from Python to a gemmd server (client/python/README.md).

    c = gemmd.Client().matmul(a, b)         # $GEMM_SERVER / $GEMM_TOKEN, or url=, token=
"""

from ._client import DEFAULT_URL, Client, Job, prepare, wire_dtype
from ._errors import (GemmBusyError, GemmConnectionError, GemmError, GemmProtocolError,
                      GemmTimeoutError)
from ._types import JOB_STATES, JobStatus, Product, Timing

__version__ = "0.1.0"

__all__ = ["Client", "Job", "Product", "Timing", "JobStatus", "JOB_STATES", "GemmError", "GemmConnectionError",
           "GemmTimeoutError", "GemmBusyError", "GemmProtocolError", "DEFAULT_URL", "prepare", "wire_dtype",
           "__version__"]
