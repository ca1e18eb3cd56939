"""Exceptions raised by the gemmd client: every failure that involves the server is a
:class:`GemmError`; mistakes found before anything is sent are ``ValueError`` / ``TypeError``.
"""

from __future__ import annotations

from typing import Optional


class GemmError(Exception):
    """The server refused a request, or a job failed: ``status`` (HTTP, None without an
    answer), the server's stable ``code`` (``"shape_mismatch"``, ...; None when it gave
    none) and ``message``, a sentence for a person."""

    def __init__(self, message: str, status: Optional[int] = None, code: Optional[str] = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def __str__(self) -> str:
        head = " ".join(([str(self.status)] if self.status is not None else []) + ([self.code] if self.code else []))
        return "%s: %s" % (head, self.message) if head else self.message

    def __repr__(self) -> str:
        return "%s(status=%r, code=%r, message=%r)" % (type(self).__name__, self.status, self.code,
                                                       self.message)


class GemmConnectionError(GemmError):
    """No answer: the server could not be reached, refused the connection, closed it
    mid-answer, or its TLS certificate could not be verified."""


class GemmTimeoutError(GemmError):
    """A connect, send or wait for the answer took longer than the client's timeout, or
    a job did not finish within the time given to ``Job.result()`` / ``Job.wait()``."""


class GemmBusyError(GemmError):
    """503 (queue full, job store full, shutting down, device unavailable) still answered
    after the client's retries. ``retries`` says how many 503 answers were waited out."""

    def __init__(self, message: str, status: Optional[int] = None, code: Optional[str] = None,
                 retries: int = 0) -> None:
        super().__init__(message, status, code)
        self.retries = retries


class GemmProtocolError(GemmError):
    """The answer did not match the request (shape, dtype, length or content type), or
    was not what the API promises. The connection is closed."""
