"""A loopback TCP proxy that holds, cuts or refuses connections on demand: the link between a client
and a server, for the faults a real server cannot be asked to produce.

Each accepted connection gets its own upstream connection and one pump thread per direction. The
faults, all safe to call from any thread:

- ``hold()`` / ``release()``: while held, connections are still accepted but no byte passes either
  way, on open and new connections alike: a stalled link, or a hung server that keeps its sockets
  open. ``held`` is set while it holds. ``hold_after(n)`` holds once ``n`` more client-to-server
  bytes have passed (counted from the call, across connections): part way into an upload.
- ``cut_after(n)``: the client-to-server bytes past ``n`` (counted from the call, across connections)
  are never forwarded; the connection carrying them is closed and ``cut`` is set.
- ``refuse_connections()`` / ``accept_connections()``: new connections are closed as soon as accepted.
- ``drop_all()`` closes every open connection; ``close()`` does that and stops listening.

A protocol on top (``exports_devtools.pgproxy``) passes ``framing``: a factory of ``Framing`` objects, one
per connection, that read whole messages instead of chunks and judge each before it is forwarded.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

#: What the proxy connects to: a port on 127.0.0.1, a (host, port) pair or a unix socket path.
Upstream = int | tuple[str, int] | str
#: Bytes read at a time by the default framing.
CHUNK = 65536
#: Seconds close() waits for the proxy's threads, all together.
JOIN_TIMEOUT = 5.0


def recv_some(sock: socket.socket) -> bytes:
    """The next bytes from ``sock``; EOFError once the peer has closed."""
    data = sock.recv(CHUNK)
    if not data:
        raise EOFError
    return data


class Framing:
    """How one connection's traffic is read and judged. This one passes raw chunks through.

    ``read_from_client`` / ``read_from_server`` return the next unit from a socket (EOFError at the
    end); ``to_server`` / ``to_client`` say whether that unit is forwarded. A hook may close the link
    (``link.close()``) to cut the connection at that unit: nothing more passes either way.
    """

    def __init__(self, link: Link) -> None:
        self.link = link

    def read_from_client(self, sock: socket.socket) -> bytes:
        return recv_some(sock)

    def read_from_server(self, sock: socket.socket) -> bytes:
        return recv_some(sock)

    def to_server(self, unit: bytes) -> bool:
        return True

    def to_client(self, unit: bytes) -> bool:
        return True


class Link:
    """One accepted connection and its upstream connection."""

    def __init__(self, proxy: TcpProxy, client: socket.socket, server: socket.socket,
                 framing: Callable[[Link], Framing]) -> None:
        self.proxy = proxy
        self.client = client
        self.server = server
        self.closed = threading.Event()
        self._closing = threading.Lock()
        self.framing = framing(self)

    def start(self) -> list[threading.Thread]:
        pumps = [
            threading.Thread(target=self._pump, args=(self.client, self.server, self.framing.read_from_client,
                                                      self.framing.to_server, True),
                             name="proxy-up", daemon=True),
            threading.Thread(target=self._pump, args=(self.server, self.client, self.framing.read_from_server,
                                                      self.framing.to_client, False),
                             name="proxy-down", daemon=True),
        ]
        for pump in pumps:
            pump.start()
        return pumps

    def close(self) -> None:
        with self._closing:
            if self.closed.is_set():
                return
            self.closed.set()
        for sock in (self.client, self.server):
            try:
                # shutdown wakes a pump blocked in recv or sendall on this socket; close alone does not.
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        self.proxy._forget(self)

    def _pump(self, source: socket.socket, target: socket.socket, read: Callable[[socket.socket], bytes],
              passes: Callable[[bytes], bool], upstream: bool) -> None:
        try:
            while True:
                unit = read(source)
                if upstream:
                    self.proxy._count_toward_hold(len(unit))
                if not self.proxy._wait_while_held(self):
                    return
                if upstream and not self.proxy._spend(len(unit)):
                    self.close()
                    self.proxy.cut.set()
                    return
                forward = passes(unit)
                if self.closed.is_set():
                    return
                if forward:
                    target.sendall(unit)
        except (EOFError, OSError):
            pass
        finally:
            self.close()


class TcpProxy:
    """Listens on 127.0.0.1 (an ephemeral ``port``) and forwards each connection to ``upstream``."""

    def __init__(self, upstream: Upstream, *, held: bool = False,
                 framing: Callable[[Link], Framing] = Framing) -> None:
        self.upstream = upstream
        self._framing = framing
        self.held = threading.Event()
        if held:
            self.held.set()
        self.cut = threading.Event()
        self.connections_accepted = 0
        self.connections_refused = 0
        # One lock for the proxy's state; waiting on it is how a held pump learns of release or close.
        self._state = threading.Condition()
        self._links: set[Link] = set()
        self._threads: list[threading.Thread] = []
        self._cut_budget: int | None = None
        self._hold_budget: int | None = None
        self._refusing = False
        self._closing = False
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        accept = threading.Thread(target=self._accept_loop, name=f"proxy-accept-{self.port}", daemon=True)
        self._threads.append(accept)
        accept.start()

    # --- faults ------------------------------------------------------------------------------------

    def hold(self) -> None:
        with self._state:
            self.held.set()

    def release(self) -> None:
        with self._state:
            self.held.clear()
            self._state.notify_all()

    def hold_after(self, n: int) -> None:
        with self._state:
            self._hold_budget = n

    def cut_after(self, n: int) -> None:
        with self._state:
            self._cut_budget = n

    def refuse_connections(self) -> None:
        with self._state:
            self._refusing = True

    def accept_connections(self) -> None:
        with self._state:
            self._refusing = False

    def drop_all(self) -> None:
        with self._state:
            links = list(self._links)
        for link in links:
            link.close()

    def close(self) -> None:
        with self._state:
            self._closing = True
            self._state.notify_all()
            threads = list(self._threads)
        try:
            self._listener.shutdown(socket.SHUT_RDWR)   # wakes the blocked accept()
        except OSError:
            pass
        self._listener.close()
        self.drop_all()
        deadline = time.monotonic() + JOIN_TIMEOUT
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))

    # --- internals ---------------------------------------------------------------------------------

    def _connect_upstream(self) -> socket.socket:
        if isinstance(self.upstream, str):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.upstream)
            except OSError:
                sock.close()
                raise
            return sock
        if isinstance(self.upstream, int):
            return socket.create_connection(("127.0.0.1", self.upstream))
        return socket.create_connection(self.upstream)

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._state:
                refusing = self._refusing or self._closing
                if refusing:
                    self.connections_refused += 1
            if refusing:
                client.close()
                continue
            try:
                server = self._connect_upstream()
            except OSError:
                client.close()
                continue
            link = Link(self, client, server, self._framing)
            with self._state:
                if not self._closing:
                    self._links.add(link)
                    self.connections_accepted += 1
                    self._threads += link.start()
                    continue
            link.close()

    def _forget(self, link: Link) -> None:
        with self._state:
            self._links.discard(link)
            self._state.notify_all()

    def _wait_while_held(self, link: Link) -> bool:
        """Returns once the proxy lets traffic pass: True, or False when the link or the proxy closed."""
        with self._state:
            self._state.wait_for(lambda: not self.held.is_set() or link.closed.is_set() or self._closing)
            return not (link.closed.is_set() or self._closing)

    def _count_toward_hold(self, n: int) -> None:
        """Holds the link once ``n`` more client-to-server bytes would pass the armed hold (which it disarms)."""
        with self._state:
            if self._hold_budget is None:
                return
            if n > self._hold_budget:
                self._hold_budget = None
                self.held.set()
            else:
                self._hold_budget -= n

    def _spend(self, n: int) -> bool:
        """False when ``n`` more client-to-server bytes pass the armed cut (which it disarms)."""
        with self._state:
            if self._cut_budget is None:
                return True
            if n > self._cut_budget:
                self._cut_budget = None
                return False
            self._cut_budget -= n
            return True
