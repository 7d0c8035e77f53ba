"""A tenant's webhook receiver for tests, the demo and the chaos soak: a real HTTP server on loopback, in
this process, that checks every request's signature as a receiver would (``app.webhooks.signing.verify``)
and keeps what it received.

What it answers is set while it runs: ``up`` (204 at once), ``slow`` (it reads the request, keeps it, and
answers only once ``release()`` is called, past any client's timeout), ``failing`` (503 to a share of
requests, 204 to the rest, seeded). ``stop()`` takes it down (connections are refused) and ``start()``
brings it back on the same port.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from app.webhooks import signing

#: Seconds a slow answer waits for release() before it answers anyway (a test that forgot to release).
HOLD_LIMIT_SECONDS = 60.0
#: The largest body read.
MAX_BODY = 1 << 20


@dataclass(frozen=True)
class Received:
    """One request as it arrived: its headers (lower-cased names), its body, whether its signature
    verified, and what it was answered."""

    headers: dict[str, str]
    body: bytes
    #: The webhook-id the signature check returned; None when it failed.
    event_id: str | None
    problem: str | None
    answered: int

    @property
    def verified(self) -> bool:
        return self.event_id is not None


class WebhookReceiver:
    def __init__(self, secret: str, *, port: int = 0, failure_rate: float = 0.0, seed: int = 0) -> None:
        self.secret = secret
        self.port = port
        self.mode = "up"
        self.failure_rate = failure_rate
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._received: list[Received] = []
        self._arrived: list[str | None] = []
        self._release = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/exports"

    def start(self) -> WebhookReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                receiver._handle(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="webhook-receiver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Down: the listening socket closes, and new connections are refused."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def release(self) -> None:
        """Lets every held slow answer go (and any later one, until ``hold()``)."""
        self._release.set()

    def hold(self) -> None:
        self._release.clear()

    def received(self) -> list[Received]:
        with self._lock:
            return list(self._received)

    def by_event(self) -> dict[str, list[Received]]:
        """Every verified request, by its webhook-id, in arrival order."""
        found: dict[str, list[Received]] = {}
        for request in self.received():
            if request.event_id is not None:
                found.setdefault(request.event_id, []).append(request)
        return found

    def arrived(self) -> list[str | None]:
        """The event id of every request that reached it, in order, answered or still held."""
        with self._lock:
            return list(self._arrived)

    def delivered(self) -> set[str]:
        """The ids some verified request of which was answered 2xx: the events a receiver has."""
        return {r.event_id for r in self.received() if r.event_id is not None and 200 <= r.answered < 300}

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = min(int(handler.headers.get("content-length") or 0), MAX_BODY)
        body = handler.rfile.read(length)
        headers = {k.lower(): v for k, v in handler.headers.items()}
        try:
            event_id: str | None = signing.verify(self.secret, headers, body)
            problem = None
        except (signing.InvalidSignature, signing.SecretError) as exc:
            event_id, problem = None, str(exc)
        with self._lock:
            mode = self.mode
            failing = mode == "failing" and self._rng.random() < self.failure_rate
            self._arrived.append(event_id)
        status = 401 if problem else 503 if failing else 204
        if mode == "slow":
            self._release.wait(HOLD_LIMIT_SECONDS)
        with self._lock:
            self._received.append(Received(headers, body, event_id, problem, status))
        try:
            handler.send_response(status)
            handler.send_header("content-length", "0")
            handler.end_headers()
        except OSError:
            pass   # the client gave up waiting (a slow answer): what it was sent is recorded all the same
