"""A loopback PEP 503 package index with HTTP basic auth, as a private index has.

``LoopbackIndex(dirs).start()`` serves every wheel and sdist found in ``dirs`` on
``127.0.0.1:<ephemeral>``: ``/simple/`` lists projects, ``/simple/<name>/`` lists
files with ``#sha256=`` fragments, ``/files/<file>`` serves them. Every request
must carry the credentials in ``.url`` (``http://USER:TOKEN@127.0.0.1:PORT/simple/``);
the token is random per server, so a test can search for it anywhere it must
not appear (the sandbox's argv, environ, files, the installed tree).
"""
from __future__ import annotations

import base64
import hashlib
import html
import http.server
import os
import secrets
import threading
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename


def _project_of(filename: str) -> Optional[str]:
    try:
        if filename.endswith(".whl"):
            return canonicalize_name(parse_wheel_filename(filename)[0])
        if filename.endswith((".tar.gz", ".zip")):
            return canonicalize_name(parse_sdist_filename(filename)[0])
    except Exception:  # not a distribution file
        return None
    return None


class LoopbackIndex:
    """A PEP 503 simple index on loopback; ``requests`` lists (method, path, authorized)."""

    def __init__(self, dirs: Iterable[os.PathLike], user: str = "ci-bot") -> None:
        self.dirs = [Path(d) for d in dirs]
        self.user = user
        self.token = "pgtok-" + secrets.token_hex(12)
        self.requests: List[Tuple[str, str, bool]] = []
        self._server: Optional[http.server.ThreadingHTTPServer] = None

    # -- content --------------------------------------------------------------------------------
    def files(self) -> Dict[str, Dict[str, Path]]:
        """project -> {filename: path}, read anew per request (tests add files while serving)."""
        out: Dict[str, Dict[str, Path]] = {}
        for d in self.dirs:
            for path in sorted(d.iterdir()):
                project = _project_of(path.name)
                if project and path.is_file():
                    out.setdefault(project, {})[path.name] = path
        return out

    # -- server ---------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        """The index URL with credentials, for ``PIP_INDEX_URL`` or ``--index-url``."""
        return f"http://{self.user}:{self.token}@127.0.0.1:{self.port}/simple/"

    @property
    def bare_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/simple/"

    def start(self) -> "LoopbackIndex":
        index = self
        expected = "Basic " + base64.b64encode(f"{self.user}:{self.token}".encode()).decode()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet test output
                pass

            def do_GET(self):
                authorized = self.headers.get("Authorization") == expected
                index.requests.append(("GET", self.path, authorized))
                if not authorized:
                    self._send(401, b"unauthorized", "text/plain",
                               {"WWW-Authenticate": 'Basic realm="pipguard-test"'})
                    return
                path = self.path.split("?", 1)[0]
                files = index.files()
                if path in ("/simple", "/simple/"):
                    body = "".join(f'<a href="/simple/{p}/">{p}</a>\n' for p in sorted(files))
                    self._page(body)
                elif path.startswith("/simple/"):
                    project = canonicalize_name(path[len("/simple/"):].strip("/"))
                    if project not in files:
                        self._send(404, b"not found", "text/plain")
                        return
                    links = []
                    for name, file in sorted(files[project].items()):
                        digest = hashlib.sha256(file.read_bytes()).hexdigest()
                        links.append(f'<a href="/files/{html.escape(name)}#sha256={digest}">'
                                     f"{html.escape(name)}</a>\n")
                    self._page("".join(links))
                elif path.startswith("/files/"):
                    name = path[len("/files/"):]
                    for project_files in files.values():
                        if name in project_files:
                            self._send(200, project_files[name].read_bytes(), "application/octet-stream")
                            return
                    self._send(404, b"not found", "text/plain")
                else:
                    self._send(404, b"not found", "text/plain")

            def _page(self, body: str) -> None:
                text = f"<!DOCTYPE html><html><body>\n{body}</body></html>\n"
                self._send(200, text.encode(), "text/html")

            def _send(self, code, body, ctype, headers=None):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        # the poll interval bounds how long stop() waits (serve_forever's 0.5 s default: per test)
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "LoopbackIndex":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
