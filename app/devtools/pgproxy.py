"""A loopback TCP proxy between psycopg and PostgreSQL that loses responses on demand.

A lost response is the case the protocol must survive: the server commits, the client never hears.
The proxy frames the wire protocol (v3) in both directions, so a test can say exactly which statement
loses its answer:

    cut = pg_proxy.cut_after_reply("export_claim")   # the claim commits, its reply is lost
    jobs.claim(Database(pg_proxy.url, Role.APP), ...)
    assert cut.fired.is_set()

- ``cut_after_reply(name)``: the next run of the named statement is forwarded; the server's
  whole reply to it (through ReadyForQuery, i.e. after an autocommit statement has committed) is dropped
  and the connection is closed.
- ``cut_before(name)``: the next run of the named statement is never forwarded; the connection is
  closed, so the server never saw it.
- Both take ``then_refuse=True`` (at the cut, close every proxied connection and refuse new ones: "the
  re-read fails too") and ``on_cut=callable`` (run on the proxy's thread at the cut, before the client
  sees anything: "recovery commits before the worker's re-read"). Each rule fires once.
- ``refuse_connections()`` / ``accept_connections()`` / ``drop_all()`` do the same by hand.

A statement is recognised by the ``/* name */`` prefix the store sends with every named statement
(``app.store.connector``), matched in simple Query and Parse messages. psycopg prepares a statement
after ``prepare_threshold`` (5) executions on one connection and then sends only its name: a
worker-level test that runs one statement many times on a pooled connection should mark a statement
that runs fewer times, or pass ``prepare_threshold=None``.

Clients must reach the proxy without TLS/GSS encryption: ``url`` sets sslmode and gssencmode to disable
(and the proxy declines an SSLRequest anyway). The upstream may be TCP or a unix socket, so the proxy
works in front of the embedded server (unix socket only) and a real one alike.

It is ``app.devtools.tcp_proxy`` with a framing of the protocol: connections, refusals and drops are
the TCP proxy's; this module only reads whole messages and decides where a connection is cut.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from app.devtools.tcp_proxy import Framing, Link, TcpProxy, Upstream

_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104


def _marker(statement: str) -> bytes:
    """What the store puts in front of a named statement's text."""
    return f"/* {statement} */".encode()


@dataclass
class Cut:
    """One armed rule. ``fired`` is set once the connection has been cut; ``error`` holds an exception
    raised by ``on_cut`` (re-raised by ``wait``)."""

    marker: bytes
    after_reply: bool
    then_refuse: bool
    on_cut: Callable[[], None] | None
    fired: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def wait(self, timeout: float = 10.0) -> None:
        if not self.fired.wait(timeout):
            raise AssertionError(f"the proxy never saw a statement containing {self.marker!r}")
        if self.error is not None:
            raise self.error


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _read_message(sock: socket.socket) -> bytes:
    """One typed message, whole, as it travels: type byte, length, body."""
    header = _recv_exact(sock, 5)
    (length,) = struct.unpack("!I", header[1:])
    return header + _recv_exact(sock, length - 4)


def _read_startup(sock: socket.socket) -> bytes:
    header = _recv_exact(sock, 4)
    (length,) = struct.unpack("!I", header)
    return header + _recv_exact(sock, length - 4)


class _Protocol(Framing):
    """One connection read as protocol messages, in both directions."""

    def __init__(self, proxy: PgProxy, link: Link) -> None:
        super().__init__(link)
        self.proxy = proxy
        self.started = False
        self.armed: Cut | None = None      # set by the client pump before the marked statement goes up

    def read_from_client(self, sock: socket.socket) -> bytes:
        if self.started:
            return _read_message(sock)
        startup = _read_startup(sock)
        while struct.unpack("!I", startup[4:8])[0] in (_SSL_REQUEST, _GSSENC_REQUEST):
            sock.sendall(b"N")   # no encryption through the proxy: it must read the messages
            startup = _read_startup(sock)
        return startup

    def read_from_server(self, sock: socket.socket) -> bytes:
        return _read_message(sock)

    def to_server(self, message: bytes) -> bool:
        if not self.started:
            self.started = True   # the startup message: untyped, never a statement
            return True
        cut = self.proxy._match(message) if message[:1] in (b"Q", b"P") else None
        if cut is None:
            return True
        if cut.after_reply:
            self.armed = cut
            return True
        self.proxy._fire(cut, self.link)
        return False

    def to_client(self, message: bytes) -> bool:
        if self.armed is None:
            return True
        if message[:1] == b"Z":
            # ReadyForQuery: the server has finished the statement (and committed it, in
            # autocommit). Nothing of the reply reached the client.
            self.proxy._fire(self.armed, self.link)
        return False


class PgProxy(TcpProxy):
    """Listens on 127.0.0.1 (an ephemeral port) and forwards to ``upstream``: a unix socket path
    (``str``) or a ``(host, port)`` pair."""

    def __init__(self, upstream: Upstream):
        self.url = ""   # set by in_front_of: the URL it was made for, pointed at the proxy
        self._rules: list[Cut] = []
        self._rules_lock = threading.Lock()
        super().__init__(upstream, framing=lambda link: _Protocol(self, link))

    @classmethod
    def in_front_of(cls, url: str) -> PgProxy:
        """A proxy for the server a libpq URL names, whether it listens on TCP or a unix socket."""
        params = conninfo_to_dict(url)
        host = str(params.get("host") or "localhost")
        port = int(params.get("port") or 5432)
        if host.startswith("/"):
            proxy = cls(f"{host}/.s.PGSQL.{port}")
        else:
            proxy = cls((str(params.get("hostaddr") or host), port))
        proxy.url = proxy.url_for(url)
        return proxy

    def url_for(self, url: str) -> str:
        """``url`` (database, user, password kept) pointed at the proxy."""
        params = conninfo_to_dict(url)
        params.pop("hostaddr", None)
        params.update(host="127.0.0.1", port=str(self.port), sslmode="disable", gssencmode="disable")
        return make_conninfo("", **params)

    # --- rules -------------------------------------------------------------------------------------

    def cut_after_reply(self, statement: str, *, then_refuse: bool = False,
                        on_cut: Callable[[], None] | None = None) -> Cut:
        return self._arm(Cut(_marker(statement), True, then_refuse, on_cut))

    def cut_before(self, statement: str, *, then_refuse: bool = False,
                   on_cut: Callable[[], None] | None = None) -> Cut:
        return self._arm(Cut(_marker(statement), False, then_refuse, on_cut))

    # --- internals ---------------------------------------------------------------------------------

    def _arm(self, cut: Cut) -> Cut:
        with self._rules_lock:
            self._rules.append(cut)
        return cut

    def _match(self, message: bytes) -> Cut | None:
        with self._rules_lock:
            for cut in self._rules:
                if cut.marker in message:
                    self._rules.remove(cut)
                    return cut
        return None

    def _fire(self, cut: Cut, link: Link) -> None:
        try:
            if cut.on_cut is not None:
                cut.on_cut()
        except BaseException as exc:   # handed to the test through Cut.wait
            cut.error = exc
        if cut.then_refuse:
            self.refuse_connections()
            self.drop_all()
        link.close()
        cut.fired.set()
