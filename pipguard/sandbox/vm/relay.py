"""The VM guest's one way out: TCP connections to the host's filtering proxy
(:mod:`pipguard.sandbox.proxy`), carried over a virtio-serial port.

A guest whose plan allows build hosts gets no network device. Instead the
guest side (:class:`GuestRelay`, in the guest's pipguard) listens on the
guest's loopback, where the guest's supervisor connects the sandbox's sockets
as it does for the proxy under ``run``; each connection becomes a numbered
stream in frames on the port. The host side (:class:`HostRelay`, in the
host's pipguard) opens one connection to the host's proxy per stream. So the
guest can reach the proxy and nothing else, whatever its kernel does: there
is no other path out of the VM.

Why not QEMU's user-mode networking restricted to a ``guestfwd``: a
``guestfwd`` to a character device is one byte stream for QEMU's lifetime
(every guest connection to it shares it; the proxy closes after each
request), and the per-connection form (``guestfwd=...-cmd:``) spawns a
program, which QEMU's own seccomp sandbox (``-sandbox spawn=deny``) forbids.

Frames, both directions: connection id (4 bytes, big-endian), length (4
bytes), that many bytes; length 0: that side of the connection ended. The
guest numbers connections upwards from 1; the host opens a proxy connection
only for an id above every id it has seen, and at most
:data:`MAX_CONNECTIONS` at once (the guest is untrusted). One port carries
every stream: a stream whose reader stalls stalls the others (each side
drops a connection whose socket stays unwritable for :data:`STALL_SECONDS`).
"""

from __future__ import annotations

import os
import socket
import struct
import threading
from typing import Callable, Dict, Optional

from pipguard import threads

HEADER = struct.Struct(">II")
MAX_FRAME = 1 << 16
#: the line that ends a complete message on the report port (a guest killed or
#: crashed mid-write leaves a message without it: the host then ignores it)
END = b"\n#pipguard-vm-end\n"
MAX_CONNECTIONS = 64
STALL_SECONDS = 60.0


class _Streams:
    """What both sides share: a frame channel and the sockets keyed by id.

    ``write`` sends bytes on the channel (whole frames under a lock, from any
    thread); the subclass reads frames with :meth:`_dispatch`."""

    def __init__(self, write: Callable[[bytes], None]) -> None:
        self._write_raw = write
        self._write_lock = threading.Lock()
        self._lock = threading.Lock()
        self._sockets: Dict[int, socket.socket] = {}
        self._ended: Dict[int, int] = {}  # id -> sides ended (2: close)
        self.closed = False

    def _send(self, conn_id: int, data: bytes) -> None:
        with self._write_lock:
            self._write_raw(HEADER.pack(conn_id, len(data)) + data)

    def _add(self, conn_id: int, sock: socket.socket) -> None:
        sock.settimeout(STALL_SECONDS)
        with self._lock:
            self._sockets[conn_id] = sock
            self._ended[conn_id] = 0
        threads.start(self._pump, args=(conn_id, sock), name=f"pipguard-vm-relay-{conn_id}")

    def _end_side(self, conn_id: int) -> None:
        with self._lock:
            if conn_id not in self._ended:
                return
            self._ended[conn_id] += 1
            if self._ended[conn_id] < 2:
                return
            sock = self._sockets.pop(conn_id)
            del self._ended[conn_id]
        sock.close()

    def _drop(self, conn_id: int) -> None:
        with self._lock:
            sock = self._sockets.pop(conn_id, None)
            self._ended.pop(conn_id, None)
        if sock is not None:
            sock.close()

    def _pump(self, conn_id: int, sock: socket.socket) -> None:
        """The socket's bytes into frames, until it ends."""
        try:
            while True:
                data = sock.recv(MAX_FRAME)
                if not data:
                    break
                self._send(conn_id, data)
        except OSError:
            pass
        try:
            self._send(conn_id, b"")
        except OSError:
            pass
        self._end_side(conn_id)

    def _deliver(self, conn_id: int, data: bytes) -> None:
        """A frame from the other side, to its socket."""
        with self._lock:
            sock = self._sockets.get(conn_id)
        if sock is None:
            return
        if not data:
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            self._end_side(conn_id)
            return
        try:
            sock.sendall(data)
        except OSError:
            self._drop(conn_id)  # its pump sees the close and tells the other side

    def _read_frames(self, read_exact: Callable[[int], Optional[bytes]],
                     on_new: Optional[Callable[[int], Optional[socket.socket]]]) -> None:
        while True:
            head = read_exact(HEADER.size)
            if head is None:
                break
            conn_id, length = HEADER.unpack(head)
            if length > MAX_FRAME:
                break  # not our framing: stop reading rather than guess
            data = read_exact(length) if length else b""
            if data is None:
                break
            if on_new is not None and data:
                sock = on_new(conn_id)
                if sock is not None:
                    self._add(conn_id, sock)
            self._deliver(conn_id, data)
        self.closed = True
        with self._lock:
            ids = list(self._sockets)
        for conn_id in ids:
            self._drop(conn_id)


def _reader(read: Callable[[int], bytes]) -> Callable[[int], Optional[bytes]]:
    def read_exact(size: int) -> Optional[bytes]:
        out = b""
        while len(out) < size:
            try:
                chunk = read(size - len(out))
            except OSError:
                return None
            if not chunk:
                return None
            out += chunk
        return out
    return read_exact


class HostRelay(_Streams):
    """The host side: accepts QEMU's connection to ``path`` (a unix socket in
    the run's private directory; QEMU's chardev of the guest's ``net`` port
    connects at start) and opens a connection to ``127.0.0.1:proxy_port`` for
    each new stream. Listening from construction, serving after :meth:`start`."""

    def __init__(self, path: str, proxy_port: int) -> None:
        super().__init__(self._write)
        self.proxy_port = proxy_port
        self.path = path
        self.opened = 0
        #: stream id -> local port of its connection to the proxy (the port the proxy's records name)
        self.streams: Dict[int, int] = {}
        self._highest = 0
        self._conn: Optional[socket.socket] = None
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(path)
        self._server.listen(1)
        self._thread = threads.start(self._serve, name="pipguard-vm-relay", begin=False)

    def _write(self, data: bytes) -> None:
        assert self._conn is not None  # frames go out only after a frame came in
        self._conn.sendall(data)

    def start(self) -> "HostRelay":
        threads.begin_thread(self._thread)
        return self

    def _serve(self) -> None:
        try:
            conn, _ = self._server.accept()  # QEMU only: the directory is ours, mode 0700
        except OSError:
            return
        finally:
            self._server.close()
        self._conn = conn
        self._read_frames(_reader(conn.recv), self._open)

    def _open(self, conn_id: int) -> Optional[socket.socket]:
        with self._lock:
            if conn_id <= self._highest:
                return None  # an id already seen: its stream is open, or ended for good
            self._highest = conn_id
            full = len(self._sockets) >= MAX_CONNECTIONS
        if full:
            self._send(conn_id, b"")  # too many at once: this one ends at once
            return None
        try:
            sock = socket.create_connection(("127.0.0.1", self.proxy_port), timeout=10)
        except OSError:
            self._send(conn_id, b"")
            return None
        self.opened += 1
        self.streams[conn_id] = sock.getsockname()[1]
        return sock

    def stop(self) -> None:
        for sock in (self._server, self._conn):
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
        self._thread.join(5)


class GuestRelay(_Streams):
    """The guest side, in the shape of :class:`pipguard.sandbox.proxy.IndexProxy`
    for :func:`pipguard.sandbox.run` (``port``, ``records``, a context
    manager that serves after the launcher's fork): a listener on the
    guest's ``127.0.0.1:port``, each connection a stream on the virtio-serial
    device ``device``. It records nothing: the host's proxy decides and
    records every destination, and the host merges its records into the report."""

    def __init__(self, device: str, allowed=(), timeout: float = 60.0) -> None:
        self._fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
        super().__init__(self._write)
        self.allowed = allowed  # enforced on the host, not here
        self.records: list = []
        #: stream id -> the guest-side client port of its connection: the guest supervisor's
        #: socket, which its ``index-proxy`` event names (so the host can tell whose request it was)
        self.streams: Dict[int, int] = {}
        self._next = 0
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(64)
        self.port = self._server.getsockname()[1]

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]

    def __enter__(self) -> "GuestRelay":
        threads.start(self._accept, name="pipguard-vm-relay-accept")
        threads.start(self._read_frames, args=(_reader(lambda n: os.read(self._fd, n)), None),
                      name="pipguard-vm-relay-port")
        return self

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._server.accept()
            except OSError:
                return
            self._next += 1
            try:
                self.streams[self._next] = sock.getpeername()[1]
            except OSError:
                pass  # already gone: its stream ends at once
            self._add(self._next, sock)

    def __exit__(self, *exc) -> None:
        try:
            self._server.close()
        except OSError:
            pass
