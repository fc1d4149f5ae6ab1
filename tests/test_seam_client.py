"""The hook client (pipguard/_seam/client.py) starts once per hook call: it must stay small.

End-to-end, every install test goes through it; these pin what makes it cheap and its own
error paths, on the oldest and newest interpreters the seam supports."""

import os
import socket
import subprocess
import sys
import threading

import pytest

from pipguard._seam import client

CLIENT = client.__file__
PYTHONS = [p for p in (sys.executable, os.path.expanduser("~/.pyenv/versions/3.9.18/bin/python"),
                       os.path.expanduser("~/.pyenv/versions/3.13.0/bin/python")) if os.path.exists(p)]
# modules whose import costs milliseconds a start (re, enum, the json and socket packages)
HEAVY = ("re", "enum", "json", "socket", "subprocess", "selectors")


@pytest.mark.parametrize("python", PYTHONS)
def test_client_imports_no_heavy_module(python):
    """What the interpreter imports to run the client (-X importtime lists every import)."""
    out = subprocess.run([python, "-I", "-S", "-X", "importtime", CLIENT, "py", "x", "build_wheel", "/c"],
                         env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    loaded = {line.rsplit("|", 1)[1].strip() for line in out.stderr.splitlines()
              if line.startswith("import time:") and "|" in line}
    assert "_json" in loaded and "_socket" in loaded, loaded  # the probe sees the client's imports
    assert not loaded & set(HEAVY), loaded


@pytest.mark.parametrize("python", PYTHONS)
def test_client_round_trip_matches_the_servers_json(python, tmp_path):
    """The client's hand-built request is what json.loads reads back (odd bytes included), and
    it exits with the status and prints the message of pipguard's answer."""
    import json

    path = str(tmp_path / "s.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    got = {}

    def serve():
        conn, _ = listener.accept()
        msg, anc, _f, _a = conn.recvmsg(65536, socket.CMSG_SPACE(3 * 4))
        data = msg
        while not data.endswith(b"\n"):
            data += conn.recv(65536)
        got["request"] = json.loads(data)
        received = [int.from_bytes(payload[i:i + 4], sys.byteorder)
                    for _l, _k, payload in anc for i in range(0, len(payload) - 3, 4)]
        got["fds"] = len(received)
        for fd in received:  # the client's stdio: held open, they would keep its pipes open
            os.close(fd)
        conn.sendall((json.dumps({"exit": 7, "message": "pipguard: ref\u00fcsed \"x\""}) + "\n").encode())
        conn.close()

    thread = threading.Thread(target=serve)
    thread.start()
    env = {"PIPGUARD_SEAM": f"{path} tok\"en", "ODD": "a\\b\"c\n\u00e9", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([python, "-I", "-S", CLIENT, "py", "_in_process.py", "build_wheel", "/x y"],
                          env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
    thread.join(10)
    listener.close()
    assert proc.returncode == 7
    assert 'pipguard: ref\u00fcsed "x"' in proc.stderr
    request = got["request"]
    assert request["type"] == "hook" and request["token"] == 'tok"en'
    assert request["argv"] == ["py", "_in_process.py", "build_wheel", "/x y"]
    assert request["env"]["ODD"] == "a\\b\"c\n\u00e9" and request["cwd"] == str(tmp_path)
    assert got["fds"] == 3


def test_client_without_channel_fails_with_a_message(tmp_path):
    proc = subprocess.run([sys.executable, "-I", "-S", CLIENT, "py", "x", "build_wheel", "/c"],
                          env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert proc.returncode == 1 and "channel is not set" in proc.stderr


def test_client_when_pipguard_is_gone(tmp_path):
    env = {"PIPGUARD_SEAM": f"{tmp_path / 'none.sock'} token", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-I", "-S", CLIENT, "py", "x", "build_wheel", "/c"],
                          env=env, capture_output=True, text=True)
    assert proc.returncode == 1 and "could not be handed to the sandbox" in proc.stderr
