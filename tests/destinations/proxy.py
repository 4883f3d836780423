"""A TCP forwarder for outage tests: eventspark talks to the proxy, the proxy to the real server.

`stop()` closes the listener and aborts every open connection (RST), so clients see their
connections reset and new ones refused, as when the server goes down; `start()` listens again on
the same port. The machine's servers keep running for everything else.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

from tests.destinations.conftest import free_port

_ACCEPT_POLL_SEC = 0.05
_ABORT = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST instead of FIN


class TcpProxy:
    """Forwards 127.0.0.1:`port` to `target_host`:`target_port`, one thread per direction."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._stopping = threading.Event()
        self._acceptor: threading.Thread | None = None
        self._pumps: list[threading.Thread] = []
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def running(self) -> bool:
        return self._listener is not None

    def start(self) -> None:
        """Listens again (no-op when running)."""
        if self._listener is not None:
            return
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        listener.settimeout(_ACCEPT_POLL_SEC)
        self._stopping.clear()
        self._listener = listener
        self._acceptor = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        self._acceptor.start()

    def stop(self) -> None:
        """Refuses new connections and resets the open ones (no-op when stopped)."""
        listener, self._listener = self._listener, None
        if listener is None:
            return
        self._stopping.set()
        if self._acceptor is not None:
            self._acceptor.join(5.0)
            self._acceptor = None
        listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, set()
            pumps, self._pumps = self._pumps, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _ABORT)
                sock.shutdown(socket.SHUT_RDWR)  # wakes the pump blocked in recv()
        for pump in pumps:
            pump.join(5.0)
        for sock in sockets:
            sock.close()

    def __enter__(self) -> TcpProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _accept(self, listener: socket.socket) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            try:
                upstream = socket.create_connection(self.target, timeout=5.0)
            except OSError:
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _ABORT)
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._stopping.is_set():
                    client.close()
                    upstream.close()
                    return
                self._sockets.update((client, upstream))
                for source, sink in ((client, upstream), (upstream, client)):
                    pump = threading.Thread(target=self._pump, args=(source, sink), daemon=True)
                    self._pumps.append(pump)
                    pump.start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)  # pass the end of the stream on
