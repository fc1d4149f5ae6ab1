"""Loopback listeners that record what a (possibly sandboxed) program sends them.

Each listener binds an ephemeral port on a loopback address, runs in a daemon thread and is
stopped by its fixture. ``received`` holds one ``bytes`` per TCP connection (appended when the
peer closes or goes quiet) or per UDP datagram.
"""
from __future__ import annotations

import socket
import threading
import time
from typing import List, Optional, Tuple, Union

IDLE_SECONDS = 2.0


class _Listener:
    kind = "?"

    def __init__(self, host: str = "127.0.0.1"):
        self.host = host
        self.family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.received: List[bytes] = []
        self.peers: List[Tuple] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._sock: Optional[socket.socket] = None
        self.port = 0

    @property
    def address(self) -> str:
        """``host:port`` (``[::1]:port`` for IPv6), the format of PIPGUARD_TEST_SINK / _DNS."""
        return f"[{self.host}]:{self.port}" if self.family == socket.AF_INET6 else f"{self.host}:{self.port}"

    def _record(self, data: bytes, peer) -> None:
        with self._lock:
            self.received.append(data)
            self.peers.append(peer)

    def wait(self, count: int = 1, timeout: float = 10.0) -> bool:
        """Wait until at least ``count`` items were received; True if they were."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.received) >= count:
                    return True
            time.sleep(0.02)
        with self._lock:
            return len(self.received) >= count

    def data(self) -> bytes:
        """Everything received so far, concatenated."""
        with self._lock:
            return b"".join(self.received)

    def contains(self, needle: Union[str, bytes]) -> bool:
        if isinstance(needle, str):
            needle = needle.encode()
        return needle in self.data()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=IDLE_SECONDS + 3)
        if self._sock is not None:
            self._sock.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def __repr__(self):
        return f"<{type(self).__name__} {self.address} received={len(self.received)}>"


class TcpSink(_Listener):
    kind = "tcp"

    def start(self) -> "TcpSink":
        s = socket.socket(self.family, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((self.host, 0))
        s.listen(16)
        s.settimeout(0.1)
        self._sock, self.port = s, s.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, name=f"tcp-sink-{self.port}", daemon=True)
        self._thread.start()
        return self

    def _serve(self) -> None:
        workers = []
        while not self._stop.is_set():
            try:
                conn, peer = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                break
            t = threading.Thread(target=self._handle, args=(conn, peer), daemon=True)
            t.start()
            workers.append(t)
        for t in workers:
            t.join(timeout=IDLE_SECONDS + 1)

    def _handle(self, conn: socket.socket, peer) -> None:
        chunks = []
        conn.settimeout(IDLE_SECONDS)
        try:
            while True:
                b = conn.recv(65536)
                if not b:
                    break
                chunks.append(b)
        except OSError:
            pass
        finally:
            conn.close()
            self._record(b"".join(chunks), peer)


class UdpSink(_Listener):
    kind = "udp"

    def start(self) -> "UdpSink":
        s = socket.socket(self.family, socket.SOCK_DGRAM)
        s.bind((self.host, 0))
        s.settimeout(0.1)
        self._sock, self.port = s, s.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, name=f"udp-sink-{self.port}", daemon=True)
        self._thread.start()
        return self

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data, peer = self._sock.recvfrom(65536)
            except socket.timeout:
                continue
            except OSError:
                break
            self._record(data, peer)


def dns_qnames(datagrams: List[bytes]) -> List[str]:
    """Decode the question name of each DNS query datagram (ignores anything unparsable)."""
    names = []
    for d in datagrams:
        try:
            i, labels = 12, []
            while d[i]:
                n = d[i]
                labels.append(d[i + 1:i + 1 + n].decode("ascii"))
                i += 1 + n
            names.append(".".join(labels))
        except (IndexError, UnicodeDecodeError):
            continue
    return names


class BuildHost:
    """A loopback HTTP server serving ``directory`` (with ``crate.txt`` = :attr:`CONTENT`
    planted), as a crate or Go module host a build may be allowed to reach: ``.port``."""

    CONTENT = b"crate-bytes"

    def __init__(self, directory) -> None:
        import functools
        import http.server
        import os

        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "crate.txt"), "wb") as fh:
            fh.write(self.CONTENT)
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
        handler.log_message = lambda *a, **k: None
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.port = self._server.server_address[1]

    def start(self) -> "BuildHost":
        # the poll interval bounds how long stop() waits (serve_forever's 0.5 s default: per test)
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
