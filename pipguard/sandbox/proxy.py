"""A filtering HTTP(S) proxy for index-only network access.

During ``install``'s resolve phase the sandbox may talk to the package index
and nothing else. The sandbox can reach exactly one TCP destination, this
proxy on loopback (the supervisor connects that socket on the sandbox's
behalf, so no sockaddr is trusted); the proxy lets ``CONNECT`` and plain
HTTP requests through to the allowed hosts only and records every request,
allowed or blocked, with its host name.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from dataclasses import dataclass
from typing import FrozenSet, List, Optional, Tuple
from urllib.parse import urlsplit

from pipguard import threads



@dataclass(frozen=True)
class Destination:
    host: str
    port: Optional[int]  # None: 80 and 443

    def allows(self, host: str, port: int) -> bool:
        if host.lower().rstrip(".") != self.host.lower().rstrip("."):
            return False
        return port in (80, 443) if self.port is None else port == self.port


def destinations_from_urls(urls) -> Tuple[Destination, ...]:
    out = []
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            continue
        out.append(Destination(parts.hostname, parts.port))
    return tuple(dict.fromkeys(out))


class IndexProxy:
    """Threaded proxy on 127.0.0.1:<ephemeral>. ``record`` is called for each
    request; it must be thread-safe (the supervisor's is: it appends)."""

    def __init__(self, allowed: Tuple[Destination, ...], timeout: float = 60.0) -> None:
        self.allowed = allowed
        self.records: List[Tuple[float, str, str, int, str, int]] = []
        self._timeout = timeout
        self._lock = threading.Lock()
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(64)
        self.port = self._server.getsockname()[1]
        self._stop = False
        self._thread = threads.start(self._serve, name="pipguard-proxy", begin=False)

    def __enter__(self) -> "IndexProxy":
        threads.begin_thread(self._thread)
        return self

    def __exit__(self, *exc) -> None:
        self._stop = True
        try:
            self._server.close()
        except OSError:
            pass

    def _note(self, action: str, host: str, port: int, how: str, client_port: int = 0) -> None:
        with self._lock:
            self.records.append((time.time(), action, host, port, how, client_port))

    def _allowed(self, host: str, port: int) -> bool:
        return any(d.allows(host, port) for d in self.allowed)

    def _serve(self) -> None:
        while not self._stop:
            try:
                client, _addr = self._server.accept()
            except OSError:
                return
            threads.start(self._handle, args=(client,), name="pipguard-proxy-client")

    def _handle(self, client: socket.socket) -> None:
        client.settimeout(self._timeout)
        try:
            peer = client.getpeername()[1]
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                chunk = client.recv(4096)
                if not chunk:
                    return
                head += chunk
            line, _, rest = head.partition(b"\r\n")
            method, target, _version = line.decode("latin-1").split(" ", 2)
            if method.upper() == "CONNECT":
                host, _, port_text = target.rpartition(":")
                host, port = host.strip("[]"), int(port_text or 443)
                if not self._allowed(host, port):
                    self._note("blocked", host, port, "CONNECT", peer)
                    client.sendall(_refusal(host, port))
                    return
                upstream = _connect(client, host, port, self._timeout)
                if upstream is None:
                    return
                self._note("allowed", host, port, "CONNECT", peer)
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                leftover = head.split(b"\r\n\r\n", 1)[1]
                if leftover:
                    upstream.sendall(leftover)
                self._relay(client, upstream)
                return
            parts = urlsplit(target)
            host, port = parts.hostname or "", parts.port or 80
            if parts.scheme != "http" or not self._allowed(host, port):
                self._note("blocked", host, port, method.upper(), peer)
                client.sendall(_refusal(host, port))
                return
            upstream = _connect(client, host, port, self._timeout)
            if upstream is None:
                return
            self._note("allowed", host, port, method.upper(), peer)
            path = parts.path or "/"
            if parts.query:
                path += "?" + parts.query
            headers = rest.split(b"\r\n\r\n", 1)
            kept = [h for h in headers[0].split(b"\r\n")
                    if h and not h.lower().startswith((b"proxy-", b"connection:"))]
            request = (f"{method} {path} HTTP/1.1\r\n").encode("latin-1") + b"\r\n".join(
                kept + [b"Connection: close"]) + b"\r\n\r\n" + (headers[1] if len(headers) > 1 else b"")
            upstream.sendall(request)
            self._relay(client, upstream)
        except (OSError, ValueError):
            return
        finally:
            try:
                client.close()
            except OSError:
                pass

    def _relay(self, a: socket.socket, b: socket.socket) -> None:
        try:
            sockets = [a, b]
            while True:
                ready, _, _ = select.select(sockets, [], [], self._timeout)
                if not ready:
                    return
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    (b if s is a else a).sendall(data)
        finally:
            b.close()

    @property
    def allowed_hosts(self) -> FrozenSet[str]:
        return frozenset(d.host for d in self.allowed)


def _refusal(host: str, port: int) -> bytes:
    """The answer to a destination that is not allowed: says whose refusal it
    is (pipguard's, not a proxy the user configured) and what allows it."""
    reason = f"pipguard: {host}:{port} is not an allowed build host (see --allow-build-host)"
    return (f"HTTP/1.1 403 Forbidden ({reason})\r\nContent-Type: text/plain\r\n"
            f"Content-Length: {len(reason) + 1}\r\nConnection: close\r\n\r\n{reason}\n").encode(
                "ascii", "replace")


def _connect(client: socket.socket, host: str, port: int, timeout: float) -> Optional[socket.socket]:
    """A connection to an allowed host, or None after telling the client
    that the host itself could not be reached (not that "the proxy" failed)."""
    try:
        return socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        reason = f"pipguard: cannot reach the build host {host}:{port}: {exc.strerror or exc}"
        client.sendall((f"HTTP/1.1 502 Bad Gateway ({reason})\r\nContent-Type: text/plain\r\n"
                        f"Content-Length: {len(reason) + 1}\r\nConnection: close\r\n\r\n{reason}\n")
                       .encode("ascii", "replace"))
        return None
