"""A network path between one client and a server on loopback, which a test can cut.

``Link`` forwards a port of its own to the server's, byte for byte, in threads. ``cut``
drops every connection through it and refuses new ones, as a broken cable or a firewall
rule between two machines would (the server itself stays up for its other clients), until
``restore`` opens the same port again. One link per client lets a test take a server away
from one controller and not the other.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class Link:
    """Forwards ``127.0.0.1:port`` to ``127.0.0.1:upstream`` until ``cut``."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.is_cut = False
        self._serve()

    @property
    def url(self) -> str:
        """The link's end as an ``http://`` endpoint (an etcd member's, for one client)."""
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        listener = self._listener
        threading.Thread(
            target=self._accept, args=(listener,), name=f"link :{self.port}", daemon=True
        ).start()

    def restore(self) -> None:
        """The path is back after ``cut``: the same port accepts and forwards again."""
        with self._lock:
            if not self.is_cut:
                return
            self._listener = socket.create_server(("127.0.0.1", self.port))
            self.is_cut = False
        self._serve()

    def cut(self) -> None:
        """Every connection dropped, and new ones refused from now on."""
        with self._lock:
            self.is_cut = True
            doomed = [self._listener, *self._open]
            self._open.clear()
        for sock in doomed:
            _drop(sock)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # cut: the listener is closed
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream), 5)
            except OSError:  # the server is down: so is the path through the link
                _drop(client)
                continue
            with self._lock:
                if self.is_cut:
                    _drop(client)
                    _drop(server)
                    continue
                self._open |= {client, server}
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Bytes one way until either end closes; then both ends go."""
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    _drop(source)
    _drop(sink)


def _drop(sock: socket.socket) -> None:
    """Shut down first: that wakes a thread blocked in ``accept`` or ``recv`` on it."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
