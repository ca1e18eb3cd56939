"""The client: one kept-alive HTTP connection per thread, raw binary on the wire."""

from __future__ import annotations

import contextlib
import email.utils
import http.client
import json
import os
import socket
import ssl
import threading
import time
import urllib.parse
import weakref
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import numpy.typing as npt

from ._errors import (GemmBusyError, GemmConnectionError, GemmError, GemmProtocolError,
                      GemmTimeoutError)
from ._types import JobStatus, Product, Timing

#: Where the client goes without a url argument or ``GEMM_SERVER`` (the daemon's default).
DEFAULT_URL = "http://127.0.0.1:8080"

_USER_AGENT = "gemmd-python/0.1.0"  # the package's __version__

# The dtypes the server computes in, as they travel: little-endian, row-major.
_WIRE: Dict[str, "np.dtype[Any]"] = {"float32": np.dtype("<f4"), "float64": np.dtype("<f8"), "int32": np.dtype("<i4"),
                                     "float16": np.dtype("<f2")}

# NumPy has no bfloat16: the optional ml_dtypes package gives one (README, "float16 and bfloat16").
try:
    import ml_dtypes as _ml_dtypes  # type: ignore[import-not-found, unused-ignore]
    _BF16: Optional["np.dtype[Any]"] = np.dtype(_ml_dtypes.bfloat16)
    _WIRE["bfloat16"] = _BF16
except ImportError:  # pragma: no cover - depends on the environment
    _BF16 = None

_NO_BF16 = ("bfloat16 needs the ml_dtypes package (pip install ml_dtypes): NumPy has no bfloat16 type, "
            "so without it bfloat16 arrays cannot be represented")
_HALF = ("float16", "bfloat16")
_TAKES = "float32, float64, int32, float16 or bfloat16"
_CONVERT = "pass dtype=np.float32, np.float64, np.int32 or np.float16 to convert"

# Answers that are read whole into memory (errors, JSON) are at most this large.
_MAX_SMALL_BODY = 16 << 20

Timeout = Optional[float]

# socket.timeout is TimeoutError from Python 3.10 on, its own OSError subclass before.
_TIMEOUTS = (socket.timeout, TimeoutError)


def _x(shape: Sequence[int]) -> str:
    return "x".join(map(str, shape))


# ------------------------------------------------------------------------------ inputs

def wire_dtype(dtype: npt.DTypeLike) -> str:
    """The server's name for ``dtype`` (any byte order), or ``TypeError`` saying what it takes."""
    if isinstance(dtype, str) and dtype.lower() in ("bfloat16", "bf16") and _BF16 is None:
        raise TypeError(_NO_BF16)
    dt = np.dtype(dtype)
    for name, w in _WIRE.items():
        if dt == w if name == "bfloat16" else (dt.kind, dt.itemsize) == (w.kind, w.itemsize):
            return name
    raise TypeError("gemmd computes in %s (ml_dtypes), not %s: %s the inputs" % (_TAKES, dt, _CONVERT))


def _out_name(in_name: str, out_dtype: Optional[npt.DTypeLike]) -> Tuple[str, List[Tuple[str, str]]]:
    """C's dtype name for operands of in_name, and the out_dtype query option (if any)."""
    if out_dtype is None:
        return ("float32" if in_name in _HALF else in_name), []
    name = wire_dtype(out_dtype)
    if name != in_name and not (in_name in _HALF and name == "float32"):
        raise ValueError("out_dtype %s is not available for %s operands: %s" % (
            name, in_name, "C is float32 (the default) or %s" % in_name if in_name in _HALF
            else "C is %s (out_dtype picks float32 or the operands' dtype for float16 and bfloat16)" % in_name))
    return name, [("out_dtype", name)]


def prepare(a: npt.ArrayLike, b: npt.ArrayLike,
            dtype: Optional[npt.DTypeLike] = None) -> Tuple[npt.NDArray[Any], npt.NDArray[Any], str]:
    """(A, B, dtype name) as the server takes them (client/python/README.md, "Products"):
    shapes checked, C-contiguous, little-endian, one dtype, copied only when needed."""
    a_arr = np.asarray(a)
    b_arr = np.asarray(b)
    for name, x in (("A", a_arr), ("B", b_arr)):
        if x.ndim not in (2, 3):
            raise ValueError("%s must be a 2-D matrix or a 3-D stack of matrices, not %d-D with shape %s"
                             % (name, x.ndim, x.shape))
        if 0 in x.shape:
            raise ValueError("%s is %s: gemmd multiplies matrices with at least one row and column%s"
                             % (name, _x(x.shape), " and stacks of at least one" if x.ndim == 3 else ""))
    if a_arr.ndim == 2 and b_arr.ndim == 3:
        raise ValueError("A is one %dx%d matrix and B a stack of %d: gemmd takes a stack of As with one B or "
                         "a B each; send np.broadcast_to(a, (%d,) + a.shape) as A"
                         % (a_arr.shape + (b_arr.shape[0], b_arr.shape[0])))
    if a_arr.ndim == 3 and b_arr.ndim == 3 and a_arr.shape[0] != b_arr.shape[0]:
        raise ValueError("A is a stack of %d matrices and B a stack of %d: the counts must be equal (or B one "
                         "matrix for all)" % (a_arr.shape[0], b_arr.shape[0]))
    if a_arr.shape[-1] != b_arr.shape[-2]:
        raise ValueError("A is %s and B is %s: A's columns (%d) must equal B's rows (%d)"
                         % (_x(a_arr.shape), _x(b_arr.shape), a_arr.shape[-1], b_arr.shape[-2]))
    if dtype is None:
        dt = np.result_type(a_arr.dtype, b_arr.dtype)
        try:
            name = wire_dtype(dt)
        except TypeError:
            raise TypeError("A is %s and B is %s, which NumPy promotes to %s; gemmd computes in %s: %s"
                            % (a_arr.dtype, b_arr.dtype, dt, _TAKES, _CONVERT)) from None
    else:
        name = wire_dtype(dtype)
    w = _WIRE[name]
    return np.ascontiguousarray(a_arr, dtype=w), np.ascontiguousarray(b_arr, dtype=w), name


def _bytes_of(x: npt.NDArray[Any]) -> memoryview:
    """The buffer of a C-contiguous array as bytes, without a copy."""
    if _BF16 is not None and x.dtype == _BF16:  # no buffer format of its own: its bits as uint16
        x = x.view(np.uint16)
    return x.data.cast("B")


def _options(kernel: Optional[str], math: Optional[str], tile: Optional[int]) -> List[Tuple[str, str]]:
    q: List[Tuple[str, str]] = []
    for key, v, what in (("kernel", kernel, "a kernel name (a non-empty str)"),
                         ("math", math, "'fp32', 'tf32' or 'bf16'")):
        if v is not None and (not isinstance(v, str) or not v):
            raise TypeError("%s must be %s, not %r" % (key, what, v))
        if v is not None:
            q.append((key, v))
    if tile is not None:
        if isinstance(tile, bool) or not isinstance(tile, (int, np.integer)) or tile <= 0:
            raise ValueError("tile must be a positive int, not %r" % (tile,))
        q.append(("tile", str(int(tile))))
    return q


def _retry_after(value: Optional[str], default: float, cap: float) -> float:
    """Seconds to wait for a ``Retry-After`` (delta seconds or an HTTP date)."""
    v = (value or "").strip()
    try:  # absent or not a date: TypeError before Python 3.10, ValueError since
        wait = float(v) if v.isdigit() else email.utils.parsedate_to_datetime(v).timestamp() - time.time()
    except (TypeError, ValueError, IndexError, OverflowError):
        wait = default
    return max(0.0, min(wait, cap))


def _check_out(out: Optional[npt.NDArray[Any]], shape: Tuple[int, ...], dtype: str) -> None:
    if out is None:
        return
    if not isinstance(out, np.ndarray):
        raise TypeError("out must be an ndarray, not %s" % type(out).__name__)
    if out.shape != shape or out.dtype != _WIRE[dtype] or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("out must be a writeable C-contiguous %s %s array; it is %s %s%s%s"
                         % (_x(shape), dtype, _x(out.shape), out.dtype,
                            "" if out.flags.c_contiguous else ", not C-contiguous",
                            "" if out.flags.writeable else ", read-only"))


# ------------------------------------------------------------------------------ client

class Client:
    """A connection to a gemmd server per thread that uses it (client/python/README.md)."""

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, *,
                 timeout: Timeout = 300.0, connect_timeout: float = 10.0, retries: int = 3,
                 max_retry_wait: float = 30.0, cafile: Optional[str] = None,
                 ssl_context: Optional[ssl.SSLContext] = None) -> None:
        url = url or os.environ.get("GEMM_SERVER") or DEFAULT_URL
        if "://" not in url:
            url = "http://" + url
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("the server URL must be http://host[:port] or https://host[:port], not %r" % url)
        if parts.query or parts.fragment:
            raise ValueError("the server URL takes no query or fragment: %r" % url)
        try:
            port = parts.port
        except ValueError:
            raise ValueError("bad port in the server URL %r" % url) from None
        if retries < 0:
            raise ValueError("retries must be >= 0")
        self.url = "%s://%s%s" % (parts.scheme, parts.netloc, parts.path.rstrip("/"))
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self._token = token if token is not None else (os.environ.get("GEMM_TOKEN") or None)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.retries = retries
        self.max_retry_wait = max_retry_wait
        self._ssl: Optional[ssl.SSLContext] = None
        if self._https:
            self._ssl = ssl_context or ssl.create_default_context(
                cafile=cafile if cafile is not None else (os.environ.get("GEMM_CACERT") or None))
        self._local = threading.local()
        self._conns: "weakref.WeakSet[http.client.HTTPConnection]" = weakref.WeakSet()
        self._conns_lock = threading.Lock()

    def __repr__(self) -> str:
        return "gemmd.Client(%r%s)" % (self.url, ", token=..." if self._token else "")

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes every connection this client holds (it reconnects if used again)."""
        with self._conns_lock:
            conns = list(self._conns)
        for c in conns:
            c.close()

    # ---------------------------------------------------------------- products

    def matmul(self, a: npt.ArrayLike, b: npt.ArrayLike, *, kernel: Optional[str] = None,
               math: Optional[str] = None, tile: Optional[int] = None,
               dtype: Optional[npt.DTypeLike] = None, out: Optional[npt.NDArray[Any]] = None,
               out_dtype: Optional[npt.DTypeLike] = None) -> npt.NDArray[Any]:
        """C = A·B computed by the server, as an ndarray (``out`` when given)."""
        return self.product(a, b, kernel=kernel, math=math, tile=tile, dtype=dtype, out=out, out_dtype=out_dtype).c

    def product(self, a: npt.ArrayLike, b: npt.ArrayLike, *, kernel: Optional[str] = None,
                math: Optional[str] = None, tile: Optional[int] = None,
                dtype: Optional[npt.DTypeLike] = None, out: Optional[npt.NDArray[Any]] = None,
                out_dtype: Optional[npt.DTypeLike] = None) -> Product:
        """Like :meth:`matmul`, but returns a :class:`Product`: C with what the server reported."""
        shape, k, c_name, t0, (resp, conn, retries) = self._post(
            "/v1/matmul", a, b, _options(kernel, math, tile), dtype, out_dtype, out, "application/octet-stream", 200)
        return self._read_product(resp, conn, shape, c_name, out, k, t0, retries)

    def submit(self, a: npt.ArrayLike, b: npt.ArrayLike, *, kernel: Optional[str] = None,
               math: Optional[str] = None, tile: Optional[int] = None,
               dtype: Optional[npt.DTypeLike] = None, out_dtype: Optional[npt.DTypeLike] = None) -> "Job":
        """Queues C = A·B as a job (``POST /v1/jobs``) and returns at once with a :class:`Job`."""
        shape, k, c_name, _, (resp, conn, _) = self._post(
            "/v1/jobs", a, b, _options(kernel, math, tile), dtype, out_dtype, None, "application/json", 202)
        obj = self._read_json(resp, conn, "/v1/jobs")
        job_id = obj.get("id")
        if not isinstance(job_id, str) or not job_id:
            raise GemmProtocolError("202 for a job without an id: %r" % (obj,), resp.status)
        return Job(self, job_id, shape, k, c_name)

    def job(self, job_id: str) -> "Job":
        """A :class:`Job` for an id returned earlier (by this or another client)."""
        if not isinstance(job_id, str) or not job_id or "/" in job_id:
            raise ValueError("not a job id: %r" % (job_id,))
        return Job(self, job_id, None, None, None)

    # ---------------------------------------------------------------- service

    def info(self) -> Dict[str, Any]:
        """``GET /v1/info`` as a dict."""
        return self._get_json("/v1/info")[0]

    def health(self) -> Dict[str, Any]:
        """``GET /healthz``: ``{"status": "ok"}``, or :class:`GemmError` (503 ``device_lost``)."""
        return self._get_json("/healthz", retry_busy=False)[0]

    def ready(self) -> bool:
        """``GET /readyz``: True when the server takes products now, False when it answers 503."""
        return self._get_json("/readyz", retry_busy=False, ok=(200, 503))[1].status == 200

    # ---------------------------------------------------------------- internals

    def _post(self, route: str, a: npt.ArrayLike, b: npt.ArrayLike, opts: List[Tuple[str, str]],
              dtype: Optional[npt.DTypeLike], out_dtype: Optional[npt.DTypeLike], out: Optional[npt.NDArray[Any]],
              accept: str, ok: int) -> Tuple[Tuple[int, ...], int, str, float,
                                    Tuple[http.client.HTTPResponse, http.client.HTTPConnection, int]]:
        """Sends A and B in raw binary to route; returns C's shape, k, C's dtype, the start and the answer."""
        a_w, b_w, name = prepare(a, b, dtype)
        c_name, out_opt = _out_name(name, out_dtype)
        k = int(a_w.shape[-1])
        shape = a_w.shape[:-1] + b_w.shape[-1:]
        _check_out(out, shape, c_name)
        q = [("m", str(a_w.shape[-2])), ("k", str(k)), ("n", str(b_w.shape[-1])), ("dtype", name)]
        if a_w.ndim == 3:
            q += [("batch", str(a_w.shape[0]))] + ([("b_shared", "1")] if b_w.ndim == 2 else [])
        path = route + "?" + urllib.parse.urlencode(q + opts + out_opt)
        t0 = time.perf_counter()
        return shape, k, c_name, t0, self._call("POST", path, body=(_bytes_of(a_w), _bytes_of(b_w)),
                                                content_type="application/octet-stream", accept=accept, ok=(ok,))

    def _open(self) -> Tuple[http.client.HTTPConnection, bool]:
        """This thread's connection, connected; and whether it was already (kept alive)."""
        conn: Optional[http.client.HTTPConnection] = getattr(self._local, "conn", None)
        if conn is not None and conn.sock is not None:
            return conn, True
        if conn is None:
            conn = (http.client.HTTPSConnection(self._host, self._port, timeout=self.connect_timeout,
                                                context=self._ssl) if self._https
                    else http.client.HTTPConnection(self._host, self._port, timeout=self.connect_timeout))
            self._local.conn = conn
            with self._conns_lock:
                self._conns.add(conn)
        with self._failing(conn, "connecting to", self.connect_timeout):
            try:
                conn.connect()
            except ssl.SSLCertVerificationError as e:
                raise GemmConnectionError("cannot verify the certificate of %s: %s (pass cafile= or set "
                                          "GEMM_CACERT)" % (self.url, e.verify_message or e)) from e
        assert conn.sock is not None
        conn.sock.settimeout(self.timeout)
        return conn, False

    def _send(self, method: str, path: str, body: Sequence[memoryview], content_type: Optional[str],
              accept: str) -> Tuple[http.client.HTTPResponse, http.client.HTTPConnection]:
        """One request on this thread's connection (reopened once if the server closed it idle)."""
        for attempt in (0, 1):
            conn, reused = self._open()
            with self._failing(conn, "%s %s to" % (method, path.split("?")[0]), self.timeout):
                try:
                    conn.putrequest(method, self._prefix + path, skip_accept_encoding=True)
                    conn.putheader("User-Agent", _USER_AGENT)
                    conn.putheader("Accept", accept)
                    if self._token:
                        conn.putheader("Authorization", "Bearer " + self._token)
                    if method in ("POST", "PUT"):
                        if content_type:
                            conn.putheader("Content-Type", content_type)
                        conn.putheader("Content-Length", str(sum(len(p) for p in body)))
                    conn.endheaders()
                    try:
                        for p in body:
                            conn.send(p)
                    except _TIMEOUTS:
                        raise
                    except OSError:
                        # The server may have answered early (an error it saw in the head) and
                        # closed: read that answer if it is there.
                        pass
                    return conn.getresponse(), conn
                except ConnectionError:
                    # a kept-alive connection closed while idle (connection_timeout): once more, afresh
                    if not reused or attempt:
                        raise
                    conn.close()
        raise AssertionError("unreachable")

    def _call(self, method: str, path: str, *, body: Sequence[memoryview] = (),
              content_type: Optional[str] = None, accept: str = "application/json",
              retry_busy: bool = True,
              ok: Iterable[int] = (200,)) -> Tuple[http.client.HTTPResponse, http.client.HTTPConnection, int]:
        """``_send`` with 503 answers retried after their Retry-After (bounded); an answer not ok raises."""
        retries = 0
        while True:
            resp, conn = self._send(method, path, body, content_type, accept)
            if resp.status != 503 or not retry_busy or retries >= self.retries:
                break
            wait = _retry_after(resp.getheader("Retry-After"), 1.0, self.max_retry_wait)
            self._drain(resp, conn)
            time.sleep(wait)
            retries += 1
        if resp.status not in ok:
            raise self._error(resp, conn, retries)
        return resp, conn, retries

    @contextlib.contextmanager
    def _failing(self, conn: http.client.HTTPConnection, what: str, limit: Timeout) -> Iterator[None]:
        """A failure on conn closes it and becomes a GemmError about ``what`` (then the URL)."""
        try:
            yield
        except BaseException as e:
            conn.close()
            if isinstance(e, _TIMEOUTS):
                raise GemmTimeoutError("%s %s took longer than %gs" % (what, self.url, limit or 0)) from None
            if isinstance(e, (OSError, http.client.HTTPException)):
                raise GemmConnectionError("%s %s: %s" % (what, self.url, e)) from e
            raise

    def _drain(self, resp: http.client.HTTPResponse, conn: http.client.HTTPConnection) -> bytes:
        """Reads a small answer whole (the connection stays usable), or closes a large one's."""
        data = b""
        if resp.length is None or resp.length <= _MAX_SMALL_BODY:
            with self._failing(conn, "reading an answer from", self.timeout):
                data = resp.read(_MAX_SMALL_BODY + 1)
        if not resp.isclosed():
            conn.close()
            resp.close()
        return data

    def _error(self, resp: http.client.HTTPResponse, conn: http.client.HTTPConnection,
               retries: int = 0) -> GemmError:
        """The exception for an error answer, from its JSON ``{"error": {code, message}}``."""
        status = resp.status
        body = self._drain(resp, conn)
        code: Optional[str] = None
        message = ""
        try:
            obj = json.loads(body.decode("utf-8"))
            err = obj.get("error") if isinstance(obj, dict) else None
            if isinstance(err, dict):
                code = str(err["code"]) if err.get("code") is not None else None
                message = str(err.get("message", ""))
        except (ValueError, UnicodeDecodeError):
            pass
        if not message:
            text = body[:200].decode("utf-8", "replace").strip()
            message = "HTTP %d %s%s" % (status, resp.reason, (": " + text) if text else "")
        if status == 503:
            if retries:
                message += " (after %d retr%s)" % (retries, "y" if retries == 1 else "ies")
            return GemmBusyError(message, status, code, retries)
        return GemmError(message, status, code)

    def _read_json(self, resp: http.client.HTTPResponse, conn: http.client.HTTPConnection,
                   path: str) -> Dict[str, Any]:
        body = self._drain(resp, conn)
        try:
            obj = json.loads(body.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            obj = None
        if not isinstance(obj, dict):
            raise GemmProtocolError("%s did not answer a JSON object: %r" % (path, body[:200]), resp.status)
        return obj

    def _get_json(self, path: str, retry_busy: bool = True,
                  ok: Iterable[int] = (200,)) -> Tuple[Dict[str, Any], http.client.HTTPResponse]:
        resp, conn, _ = self._call("GET", path, retry_busy=retry_busy, ok=ok)
        return self._read_json(resp, conn, path), resp

    def _read_product(self, resp: http.client.HTTPResponse, conn: http.client.HTTPConnection,
                      shape: Optional[Tuple[int, ...]], dtype: Optional[str], out: Optional[npt.NDArray[Any]],
                      k: int, t0: float, retries: int, job_id: Optional[str] = None) -> Product:
        """Reads a raw C straight into an ndarray (``out`` or a new one), checked against the request."""
        with self._failing(conn, "reading C from", self.timeout):
            st = resp.status
            ctype = (resp.getheader("Content-Type") or "").split(";")[0].strip().lower()
            if ctype != "application/octet-stream":
                raise GemmProtocolError("asked for application/octet-stream, got %r" % ctype, st)
            try:
                got_shape = tuple(int(x) for x in (resp.getheader("X-Gemm-Shape") or "").split(","))
                if len(got_shape) not in (2, 3) or min(got_shape) <= 0:
                    raise ValueError
            except ValueError:
                raise GemmProtocolError("bad X-Gemm-Shape %r" % resp.getheader("X-Gemm-Shape"), st) from None
            got_dtype = resp.getheader("X-Gemm-Dtype") or ""
            if got_dtype == "bfloat16" and _BF16 is None:
                raise GemmProtocolError("the answer is bfloat16: " + _NO_BF16, st)
            if got_dtype not in _WIRE:
                raise GemmProtocolError("bad X-Gemm-Dtype %r" % got_dtype, st)
            if shape is not None and got_shape != shape:
                raise GemmProtocolError("asked for a %s product, the answer is %s" % (_x(shape), _x(got_shape)), st)
            if dtype is not None and got_dtype != dtype:
                raise GemmProtocolError("asked for %s, the answer is %s" % (dtype, got_dtype), st)
            nbytes = int(np.prod(got_shape)) * _WIRE[got_dtype].itemsize
            if resp.length is not None and resp.length != nbytes:
                raise GemmProtocolError("a %s %s answer must be %d bytes, Content-Length says %d"
                                        % (_x(got_shape), got_dtype, nbytes, resp.length), st)
            _check_out(out, got_shape, got_dtype)
            c = out if out is not None else np.empty(got_shape, dtype=_WIRE[got_dtype])
            view = _bytes_of(c)
            got = 0
            while got < nbytes:
                r = resp.readinto(view[got:])
                if not r:
                    raise GemmConnectionError("the answer from %s ended after %d of %d bytes"
                                              % (self.url, got, nbytes), st)
                got += r
            if not resp.isclosed() and resp.read(1):  # a chunked answer's end
                raise GemmProtocolError("the answer is longer than %d bytes" % nbytes, st)
        tile = resp.getheader("X-Gemm-Tile") or "0"
        h = {k: resp.getheader("X-Gemm-" + k.capitalize()) or "" for k in
             ("kernel", "block", "math", "device", "instance", "batched")}
        return Product(c=c, tile=int(tile) if tile.lstrip("-").isdigit() else 0,
                       timing=Timing.from_server_timing(resp.getheader("Server-Timing"),
                                                        2.0 * float(np.prod(got_shape)) * k,
                                                        (time.perf_counter() - t0) * 1e3),
                       retries=retries, job_id=job_id, **h)


# ------------------------------------------------------------------------------ jobs

class Job:
    """A product queued with :meth:`Client.submit`; a context manager that cancels it at the end."""

    def __init__(self, client: Client, job_id: str, shape: Optional[Tuple[int, ...]], k: Optional[int],
                 dtype: Optional[str]) -> None:
        self.client = client
        self.id = job_id
        self._shape = shape
        self._k = k
        self._dtype = dtype

    def __repr__(self) -> str:
        return "gemmd.Job(%r)" % self.id

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.cancel()
        except GemmError:
            if exc[0] is None:
                raise

    def _path(self, tail: str = "") -> str:
        return "/v1/jobs/%s%s" % (urllib.parse.quote(self.id, safe=""), tail)

    def _status(self) -> Tuple[JobStatus, Optional[str]]:
        obj, resp = self.client._get_json(self._path())
        st = JobStatus.from_json(obj)
        if self._k is None and st.k > 0:
            # A job found by its id: C's shape comes from the answer (a batch's count is
            # not in the status), k and the dtype from here.
            self._k, self._dtype = st.k, st.out_dtype or st.dtype
        return st, resp.getheader("Retry-After")

    def status(self) -> JobStatus:
        """``GET /v1/jobs/{id}``: the job's state and, once it ran, kernel and timing."""
        return self._status()[0]

    def wait(self, timeout: Timeout = None) -> JobStatus:
        """Polls until the job has finished and returns its last status (README, "Jobs")."""
        deadline = None if timeout is None else time.monotonic() + timeout
        interval = 0.02
        while True:
            st, retry_after = self._status()
            if st.finished:
                return st
            wait = _retry_after(retry_after, interval, self.client.max_retry_wait) if retry_after else interval
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise GemmTimeoutError("job %s is still %s after %gs" % (self.id, st.state, timeout or 0))
                wait = min(wait, left)
            time.sleep(wait)
            interval = min(interval * 2, 0.5)

    def result(self, timeout: Timeout = None, *, out: Optional[npt.NDArray[Any]] = None) -> npt.NDArray[Any]:
        """Waits for the job and returns C; a failed or cancelled job raises its GemmError."""
        return self.product(timeout, out=out).c

    def product(self, timeout: Timeout = None, *, out: Optional[npt.NDArray[Any]] = None) -> Product:
        """Like :meth:`result`, but returns a :class:`Product` with the server's timing."""
        st = self.wait(timeout)
        if st.error is not None and st.state != "done":
            raise st.error
        t0 = time.perf_counter()
        resp, conn, retries = self.client._call("GET", self._path("/result"), accept="application/octet-stream")
        return self.client._read_product(resp, conn, self._shape, self._dtype, out, self._k or 0, t0, retries,
                                         self.id)

    def cancel(self) -> bool:
        """``DELETE /v1/jobs/{id}``: cancels or forgets the job; False when the server does not know it."""
        try:
            resp, conn, _ = self.client._call("DELETE", self._path(), ok=(200, 204))
        except GemmError as e:
            if e.status == 404 and e.code == "job_not_found":
                return False
            raise
        self.client._drain(resp, conn)
        return True
