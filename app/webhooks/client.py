"""One POST to a receiver, with urllib3: a connect and a read timeout, TLS verified against the system's
certificate authorities, no retry (the notifier's backoff is the retry) and no redirect followed (a 3xx
is an answer that did not take the event). The answer is the HTTP status, or why there was none, in words
that carry neither the URL (a receiver's URL may hold a token) nor anything the receiver sent back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import urllib3
from urllib3 import exceptions as http

#: Connections kept per receiver host (one per notifier thread is plenty).
POOL_PER_HOST = 4


@dataclass(frozen=True)
class Answer:
    #: The receiver's HTTP status; None when no answer came.
    http_status: int | None
    #: Why no 2xx, in a few words; None when delivered.
    error: str | None
    seconds: float

    @property
    def delivered(self) -> bool:
        return self.http_status is not None and 200 <= self.http_status < 300

    @property
    def result(self) -> str:
        """``HTTP 204``, or why there was no answer: for logs, metrics and the operator's views."""
        return f"HTTP {self.http_status}" if self.http_status is not None else (self.error or "no answer")


def why(exc: BaseException) -> str:
    """What went wrong with a request, by the class of the error alone (its message may carry the URL)."""
    if isinstance(exc, http.MaxRetryError) and exc.reason is not None:
        exc = exc.reason
    if isinstance(exc, http.NameResolutionError):
        return "the host name did not resolve"
    if isinstance(exc, http.NewConnectionError):
        return "the connection was refused or failed"
    if isinstance(exc, http.ConnectTimeoutError):
        return "the connection timed out"
    if isinstance(exc, http.ReadTimeoutError):
        return "no answer within the timeout"
    if isinstance(exc, http.SSLError):
        return "TLS failed (the certificate is not trusted, or the handshake broke)"
    if isinstance(exc, http.ProtocolError):
        return "the connection dropped before an answer"
    return f"the request failed ({type(exc).__name__})"


class Poster:
    """POSTs bodies; safe to share between threads (urllib3's pool manager is)."""

    def __init__(self, *, timeout_seconds: float) -> None:
        self.timeout = urllib3.Timeout(connect=timeout_seconds, read=timeout_seconds)
        self.pool = urllib3.PoolManager(num_pools=64, maxsize=POOL_PER_HOST, retries=False, timeout=self.timeout,
                                        cert_reqs="CERT_REQUIRED")

    def post(self, url: str, body: bytes, headers: dict[str, str]) -> Answer:
        started = time.monotonic()
        try:
            response = self.pool.request("POST", url, body=body, headers=headers, redirect=False, retries=False,
                                         preload_content=False, timeout=self.timeout)
        except Exception as exc:
            return Answer(None, why(exc), time.monotonic() - started)
        try:
            status = response.status
        finally:
            # The body is never read: nothing the receiver says past its status is used or kept, and an
            # endless body must not hold a sender. Closing drops the connection rather than reuse it.
            response.close()
            response.release_conn()
        seconds = time.monotonic() - started
        if 200 <= status < 300:
            return Answer(status, None, seconds)
        return Answer(status, f"HTTP {status}", seconds)

    def close(self) -> None:
        self.pool.clear()
