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
- ``cut_at_commit(name, after_reply=True)``: the next transaction that runs the named statement loses its
  COMMIT: with ``after_reply`` the server commits and the reply is dropped (a lost commit reply); without,
  the COMMIT never reaches the server, which rolls the transaction back when the connection closes.
- All three take ``then_refuse=True`` (at the cut, close every proxied connection and refuse new ones: "the
  re-read fails too") and ``on_cut=callable`` (run on the proxy's thread at the cut, before the client
  sees anything: "recovery commits before the worker's re-read"). Each rule fires once.
- ``refuse_connections()`` / ``accept_connections()`` / ``drop_all()`` do the same by hand.
- ``hold_statement(name)``: the next run of the named statement waits at the proxy (its request not
  yet forwarded, or with ``after_reply=True`` its ReadyForQuery not yet passed on) until
  ``Hold.release()``: a stalled connection. ``Hold.reached`` is set when it waits.
- ``disarm(rule)`` takes back a rule that has not fired (False if it already had); ``release_all()``
  disarms every rule and releases every hold.

Every rule is one-shot and carries its own events, so several can be armed at once, from any thread.

A statement is recognised by the ``/* name */`` prefix the store sends with every named statement
(``app.store.connector``), matched in simple Query and Parse messages. psycopg prepares a statement
after ``prepare_threshold`` (5) executions on one connection and then sends only its name, in Bind:
the proxy remembers each connection's prepared statements, so a rule matches those runs too.

Clients must reach the proxy without TLS/GSS encryption: ``url`` sets sslmode and gssencmode to disable
(and the proxy declines an SSLRequest anyway). The upstream may be TCP or a unix socket, so the proxy
works in front of the embedded server (unix socket only) and a real one alike.

It is ``exports_devtools.tcp_proxy`` with a framing of the protocol: connections, refusals and drops are
the TCP proxy's; this module only reads whole messages and decides where a connection is cut.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from exports_devtools.tcp_proxy import Framing, Link, TcpProxy, Upstream

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
    #: Cut the COMMIT of the transaction that runs the statement, rather than the statement itself.
    at_commit: bool = False

    def wait(self, timeout: float = 10.0) -> None:
        if not self.fired.wait(timeout):
            raise AssertionError(f"the proxy never saw a statement containing {self.marker!r}")
        if self.error is not None:
            raise self.error


@dataclass
class Hold:
    """One armed hold. ``reached`` is set once the named statement's connection is waiting at the
    proxy; ``release()`` lets it go on (a hold also ends when its connection or the proxy closes)."""

    marker: bytes
    after_reply: bool
    reached: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)
    #: The held client's port on 127.0.0.1, set as the hold is reached: it names the process holding the
    #: connection (``exports_devtools.processes.pid_of_client_port``).
    client_port: int | None = None

    def release(self) -> None:
        self.released.set()


Rule = Cut | Hold
#: Seconds between two looks, while a connection is held, at whether its link or the proxy closed.
HOLD_POLL = 0.1


def _cstring(body: bytes, start: int) -> tuple[bytes, int]:
    """The NUL-terminated string at ``start`` and the offset past it."""
    end = body.index(b"\0", start)
    return body[start:end], end + 1


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
        self.armed: Rule | None = None      # set by the client pump before the marked statement goes up
        #: The statements this connection prepared, by name: a prepared run sends only the name.
        self.prepared: dict[bytes, bytes] = {}
        #: The statement just parsed: its Bind follows at once and must not match it a second time.
        self.just_parsed: bytes | None = None
        #: A cut_at_commit rule whose statement this connection ran: it fires at the next COMMIT.
        self.commit_rule: Cut | None = None

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
        text = self._statement_text(message)
        rule: Rule | None
        if self.commit_rule is not None and text is not None and text.rstrip(b"\0").strip().upper() == b"COMMIT":
            rule, self.commit_rule = self.commit_rule, None
        else:
            rule = self.proxy._match(text) if text else None
            if isinstance(rule, Cut) and rule.at_commit:
                self.commit_rule = rule   # the statement itself goes through
                return True
        if rule is None:
            return True
        if rule.after_reply:
            self.armed = rule
            return True
        if isinstance(rule, Hold):
            return self.proxy._hold(rule, self.link)
        self.proxy._fire(rule, self.link)
        return False

    def _statement_text(self, message: bytes) -> bytes | None:
        """The text of the statement a Query, Parse or Bind (of a prepared statement) runs."""
        kind, body = message[:1], message[5:]
        try:
            if kind == b"Q":
                return body
            if kind == b"P":
                name, offset = _cstring(body, 0)
                query, _ = _cstring(body, offset)
                if name:
                    self.prepared[name] = query
                    self.just_parsed = name
                return query
            if kind == b"B":
                _portal, offset = _cstring(body, 0)
                name, _ = _cstring(body, offset)
                just_parsed, self.just_parsed = self.just_parsed, None
                if not name or name == just_parsed:
                    return None
                return self.prepared.get(name)
        except ValueError:   # not NUL-terminated: not a message we understand, so never a match
            return None
        return None

    def to_client(self, message: bytes) -> bool:
        if self.armed is None:
            return True
        if isinstance(self.armed, Hold):
            if message[:1] != b"Z":
                return True
            hold, self.armed = self.armed, None
            return self.proxy._hold(hold, self.link)
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
        self._rules: list[Rule] = []
        self._holds: list[Hold] = []   # every hold armed and not yet released, for release_all
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

    def cut_at_commit(self, statement: str, *, after_reply: bool = True, then_refuse: bool = False,
                      on_cut: Callable[[], None] | None = None) -> Cut:
        return self._arm(Cut(_marker(statement), after_reply, then_refuse, on_cut, at_commit=True))

    def hold_statement(self, statement: str, *, after_reply: bool = False) -> Hold:
        hold = Hold(_marker(statement), after_reply)
        with self._rules_lock:
            self._rules.append(hold)
            self._holds = [h for h in self._holds if not h.released.is_set()] + [hold]
        return hold

    def release_all(self) -> None:
        """Disarms every rule and releases every hold: the end of a soak, whatever its faults were doing."""
        with self._rules_lock:
            self._rules.clear()
            holds, self._holds = self._holds, []
        for hold in holds:
            hold.release()

    def disarm(self, rule: Rule) -> bool:
        """Takes back a rule; False when it has already been taken by a statement (it fires, or has)."""
        with self._rules_lock:
            for index, armed in enumerate(self._rules):
                if armed is rule:
                    del self._rules[index]
                    return True
        return False

    # --- internals ---------------------------------------------------------------------------------

    def _arm(self, cut: Cut) -> Cut:
        with self._rules_lock:
            self._rules.append(cut)
        return cut

    def _match(self, text: bytes) -> Rule | None:
        with self._rules_lock:
            for index, rule in enumerate(self._rules):
                if rule.marker in text:
                    del self._rules[index]
                    return rule
        return None

    def _hold(self, hold: Hold, link: Link) -> bool:
        """Waits on the link's pump until the hold is released; False when the link or proxy closed."""
        try:
            hold.client_port = link.client.getpeername()[1]
        except OSError:
            hold.client_port = None   # the client has gone already
        hold.reached.set()
        while not hold.released.wait(HOLD_POLL):
            if link.closed.is_set() or self._closing:
                return False
        return not link.closed.is_set()

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
