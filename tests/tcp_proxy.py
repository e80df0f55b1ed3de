"""A small threaded TCP forwarder on 127.0.0.1 that a test controls, to cut a database connection
without touching the shared database server.

    with TcpProxy("127.0.0.1", 5432) as proxy:
        url = f"postgresql+psycopg://postgres@127.0.0.1:{proxy.port}/db"
        ...
        proxy.cut()        # every open connection is reset, new ones are refused
        proxy.resume()     # connections are forwarded again (same port)

``cut(mode=...)``: ``"reset"`` (default) accepts new connections and resets them at once (RST);
``"refuse"`` closes the listening socket, so a connect fails with ``ECONNREFUSED``, and listens
again on the same port at ``resume()``. Either way every open connection is reset.
``blackhole()`` keeps every connection open and forwards nothing (new connections are accepted
and held), as a database host that stops answering behind a proxy: the client's TCP stack sees
every byte acknowledged, so only a client-side deadline ends its wait; ``resume()`` cuts the
held connections and forwards again.
``cut_after(b"COMMIT")`` cuts right after the server got a given message, before its answer gets
back: the commit happened, the client cannot know.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from types import TracebackType
from typing import Literal, Self

_LINGER_RST = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a RST


def _reset(sock: socket.socket) -> None:
    """Drop a connection now. ``shutdown`` first: a plain ``close`` would neither wake the pump
    thread blocked in ``recv`` on it nor end the connection while that ``recv`` holds it."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


class TcpProxy:
    """Forwards ``127.0.0.1:port`` to ``target_host:target_port``, one thread per direction."""

    def __init__(self, target_host: str, target_port: int, port: int = 0) -> None:
        self.target = (target_host, target_port)
        self.host = "127.0.0.1"
        self.port = port
        self.down = False
        self.mode: Literal["reset", "refuse"] = "reset"
        self.accepted = 0
        self.refused = 0
        self.cuts = 0
        self._lock = threading.Lock()
        self._pairs: set[tuple[socket.socket, socket.socket]] = set()
        self._listener: socket.socket | None = None
        self._closed = False
        self._thread: threading.Thread | None = None
        self._marker: bytes | None = None
        self._hold = False
        self.tripped = threading.Event()
        self._cut_delay = 0.3
        self.blackholed = False
        self._held: list[socket.socket] = []

    # -- control -----------------------------------------------------------------------------

    def start(self) -> Self:
        self._listen()
        return self

    def cut(self, mode: Literal["reset", "refuse"] = "reset") -> int:
        """Reset every open connection and refuse new ones until ``resume``; returns how many
        connections were cut."""
        with self._lock:
            self.down = True
            self.mode = mode
            self.cuts += 1
            pairs = list(self._pairs)
            self._pairs.clear()
            listener = self._listener if mode == "refuse" else None
            if listener is not None:
                self._listener = None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                listener.close()
        for a, b in pairs:
            _reset(a)
            _reset(b)
        return len(pairs)

    def blackhole(self) -> None:
        """Forward nothing, close nothing: every byte either way is dropped, and new connections
        are accepted and held without an answer, until ``resume``."""
        with self._lock:
            self.blackholed = True

    def cut_after(self, marker: bytes, delay_s: float = 0.3) -> threading.Event:
        """Arm a cut: the next client message that contains ``marker`` (say ``b"COMMIT"``) is
        forwarded, the server's answers are no longer passed back, and ``delay_s`` later every
        connection is cut as by ``cut()``: the server did the work, the client never hears of it.
        Returns an event set when the marker was seen."""
        with self._lock:
            self._marker = marker
            self._cut_delay = delay_s
            self.tripped.clear()
        return self.tripped

    def resume(self) -> None:
        """Forward again; after a ``refuse`` cut, listen again on the same port."""
        with self._lock:
            self.down = False
            self._hold = False
            self._marker = None
            relisten = self._listener is None and not self._closed
            dropped: list[socket.socket] = []
            if self.blackholed:  # what passed meanwhile is lost: those connections are done
                self.blackholed = False
                dropped = [sock for pair in self._pairs for sock in pair] + self._held
                self._pairs.clear()
                self._held = []
        for sock in dropped:
            _reset(sock)
        if relisten:
            self._listen()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            listener, self._listener = self._listener, None
            pairs = list(self._pairs)
            self._pairs.clear()
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                listener.close()
        for a, b in pairs:
            _reset(a)
            _reset(b)

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._pairs)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- the threads -------------------------------------------------------------------------

    def _listen(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self.port))
        listener.listen(128)
        self.port = listener.getsockname()[1]
        with self._lock:
            self._listener = listener
        self._thread = threading.Thread(
            target=self._accept, args=(listener,), daemon=True, name=f"tcp-proxy-{self.port}"
        )
        self._thread.start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # the listener was closed (cut in "refuse" mode, or close())
            with self._lock:
                down = self.down or self._closed
                if self.blackholed and not down:
                    self._held.append(client)
                    continue
            if down:
                self.refused += 1
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _reset(client)
                continue
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pair = (client, upstream)
            with self._lock:
                if self.down or self._closed:
                    _reset(client)
                    _reset(upstream)
                    continue
                self._pairs.add(pair)
                self.accepted += 1
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst, pair), daemon=True).start()

    def _pump(
        self, src: socket.socket, dst: socket.socket, pair: tuple[socket.socket, socket.socket]
    ) -> None:
        upstream = src is pair[0]  # client -> server
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not upstream and self._hold:
                    continue  # the server's answers are swallowed once the marker passed
                if self.blackholed:
                    continue
                dst.sendall(data)
                if upstream and self._marker is not None and self._marker in data:
                    with self._lock:
                        armed = self._marker is not None and not self.tripped.is_set()
                        if armed:
                            self._hold = True
                            self.tripped.set()
                    if armed:
                        timer = threading.Timer(self._cut_delay, self.cut)
                        timer.daemon = True
                        timer.start()
        except OSError:
            pass
        with self._lock:
            mine = pair in self._pairs
            self._pairs.discard(pair)
        if mine:  # an orderly end on one side: close both
            for sock in pair:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()
