"""What the server reports beside C: timing, the kernel that ran, job states."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np
import numpy.typing as npt

from ._errors import GemmError

# The stages of the daemon's Server-Timing header, in its order (see docs/API.md, "Timing").
_STAGES = ("recv", "decode", "queue", "h2d", "kernel", "d2h", "encode", "total")


@dataclass(frozen=True)
class Timing:
    """The server's stages of one product in ms, ``gflops`` and the client's ``wall_ms`` (README, "Timing")."""

    recv_ms: float = 0.0
    decode_ms: float = 0.0
    queue_ms: float = 0.0
    h2d_ms: float = 0.0
    kernel_ms: float = 0.0
    d2h_ms: float = 0.0
    encode_ms: float = 0.0
    total_ms: float = 0.0
    gflops: float = 0.0
    wall_ms: Optional[float] = None

    @classmethod
    def from_server_timing(cls, header: Optional[str], flops: float = 0.0,
                           wall_ms: Optional[float] = None) -> "Timing":
        """Parses a ``Server-Timing`` header; unknown entries are ignored, missing ones are 0."""
        durs: Dict[str, float] = {}
        for entry in (header or "").split(","):
            fields = [f.strip() for f in entry.split(";")]
            if not fields or fields[0] not in _STAGES:
                continue
            for f in fields[1:]:
                if f.startswith("dur="):
                    try:
                        durs[fields[0]] = float(f[4:])
                    except ValueError:
                        pass
        kernel = durs.get("kernel", 0.0)
        return cls(gflops=flops / (kernel * 1e6) if kernel > 0 and flops > 0 else 0.0,
                   wall_ms=wall_ms, **{s + "_ms": durs.get(s, 0.0) for s in _STAGES})

    @classmethod
    def from_json(cls, obj: Any) -> "Timing":
        """Reads the ``timing`` object of a job's status."""
        num = {k: float(v) for k, v in (obj.items() if isinstance(obj, Mapping) else ())
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
        return cls(**{f.name: num[f.name] for f in dataclasses.fields(cls) if f.name in num and f.name != "wall_ms"})


@dataclass(frozen=True, eq=False)
class Product:
    """C and what the server reported about computing it (README, "Products")."""

    c: npt.NDArray[Any]
    kernel: str
    tile: int
    block: str
    math: str
    device: str
    timing: Timing
    instance: str = ""
    batched: str = ""
    retries: int = 0
    job_id: Optional[str] = None

    @property
    def shape(self) -> Tuple[int, ...]:
        return tuple(self.c.shape)

    @property
    def dtype(self) -> "np.dtype[Any]":
        return np.dtype(self.c.dtype)


#: The states a job goes through (``queued`` → ``running`` → one of the last three).
JOB_STATES = ("queued", "running", "done", "failed", "cancelled")


@dataclass(frozen=True)
class JobStatus:
    """One ``GET /v1/jobs/{id}`` (README, "Jobs"); ``raw`` is the whole JSON answer."""

    id: str
    state: str
    shape: Tuple[int, int]
    k: int
    dtype: str
    kernel: str
    tile: int
    block: str
    math: str
    device: str
    timing: Timing
    expires_in_s: Optional[float]
    error: Optional[GemmError]
    raw: Mapping[str, Any] = dataclasses.field(repr=False, compare=False)
    #: C's dtype (float32 for float16 / bfloat16 operands unless out_dtype asked for theirs)
    out_dtype: str = ""

    @property
    def finished(self) -> bool:
        """True once the job is done, failed or cancelled."""
        return self.state in ("done", "failed", "cancelled")

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "JobStatus":
        shape = obj.get("shape") or [0, 0]
        err = None
        e = obj.get("error")
        if isinstance(e, Mapping):
            status = e.get("status")
            err = GemmError(str(e.get("message", "")), status if isinstance(status, int) else None,
                            str(e["code"]) if e.get("code") is not None else None)
        exp = obj.get("expires_in_s")
        text = {key: str(obj.get(key, "")) for key in ("id", "state", "dtype", "kernel", "block", "math", "device")}
        return cls(shape=(int(shape[0]), int(shape[1])), k=int(obj.get("k", 0)), tile=int(obj.get("tile", 0)),
                   timing=Timing.from_json(obj.get("timing")),
                   expires_in_s=float(exp) if isinstance(exp, (int, float)) else None,
                   error=err, raw=dict(obj), out_dtype=str(obj.get("out_dtype", obj.get("dtype", ""))), **text)
