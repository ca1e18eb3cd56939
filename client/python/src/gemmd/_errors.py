"""Exceptions raised by the gemmd client (client/python/README.md, "Errors")."""

from __future__ import annotations

from typing import Optional


class GemmError(Exception):
    """The server refused a request, or a job failed: ``status`` (HTTP), ``code`` and ``message``."""

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
    """No answer: unreachable, refused, closed mid-answer, or an unverified TLS certificate."""


class GemmTimeoutError(GemmError):
    """A request, or a job's wait, took longer than its timeout."""


class GemmBusyError(GemmError):
    """503 still answered after ``retries`` retries."""

    def __init__(self, message: str, status: Optional[int] = None, code: Optional[str] = None,
                 retries: int = 0) -> None:
        super().__init__(message, status, code)
        self.retries = retries


class GemmProtocolError(GemmError):
    """The answer did not match the request, or was not what the API promises."""
