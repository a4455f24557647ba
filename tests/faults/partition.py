"""A TCP relay that can be cut: a network partition between one process and a server, while
every other process still reaches that server directly.

While cut, the relay keeps every connection open and passes nothing either way, as a partition
that drops packets does (the client finds out by its own timeouts, not by a reset); a
connection made meanwhile is accepted and never answered. Healing closes what the cut held (a
stream that lost bytes cannot be resumed) and relays again, so the client reconnects."""

from __future__ import annotations

import socket
import threading

__all__ = ["Relay"]


class Relay:
    """Listens on 127.0.0.1 at ``port`` and relays each connection to ``target`` (``host:port``)."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._cut = threading.Event()
        self._closed = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []  # every socket open on either side
        threading.Thread(target=self._accept, name="relay-accept", daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cut(self) -> None:
        """From now on nothing passes, in either direction, on any connection."""
        self._cut.set()

    def heal(self) -> None:
        """Close every connection the cut held and relay new ones again."""
        self._close_all()
        self._cut.clear()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self._close_all()

    def _close_all(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by its peer
            sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                self._sockets.append(client)
            if self._cut.is_set():
                continue  # accepted, never answered: heal() closes it
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets.append(upstream)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), name="relay-pump", daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not self._cut.is_set():  # cut: dropped, as the partition drops packets
                    dst.sendall(data)
        except OSError:
            pass  # the other side closed, or heal() did
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
