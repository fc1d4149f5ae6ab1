"""The hand-off of one hook call (pipguard/install/_seam/target.py ``_hand_off``, pipguard/install/seam.py).

pip's process sends the call -- argv, cwd, environment, the stdin/stdout/stderr pip gave it and
a pipe's write end -- to pipguard, then starts a ``/bin/sh`` placeholder that exits with the
status pipguard writes to that pipe. End to end every install test goes through it; these pin
its edges, in the target interpreter itself (the oldest and newest the seam supports): pip's
own way of starting a hook (stdin/stdout pipes, stderr into stdout), descriptors above 9 (the
shell's redirections stop at 9), odd bytes in the environment, no descriptor left behind, and
what happens when pipguard is not there or goes away."""

import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from pipguard.install._seam import target
from pipguard.install.seam import SeamServer

PYTHONS = [p for p in (sys.executable, os.path.expanduser("~/.pyenv/versions/3.9.18/bin/python"),
                       os.path.expanduser("~/.pyenv/versions/3.13.0/bin/python")) if os.path.exists(p)]

# Runs in the target interpreter: the seam installed as in pip's process, then one hook call
# started the way pip's call_subprocess starts it. Prints what pip would see, as JSON.
PIP_SIDE = r"""
import json, os, subprocess, sys
sys.path.insert(0, sys.argv[1])
import target
import pip
target.install_seam("top")
hook = os.path.join(os.path.dirname(pip.__file__), "_vendor", "pyproject_hooks", "_in_process", "_in_process.py")
held = [os.open(os.devnull, os.O_RDONLY) for _ in range(12)]   # push new descriptors above 9
before = sorted(os.listdir("/proc/self/fd"))
proc = subprocess.Popen([sys.executable, hook, "build_wheel", "/control dir"], stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=sys.argv[2])
proc.stdin.close()
output = proc.stdout.read().decode()
proc.wait()
proc.stdout.close()
print(json.dumps({"exit": proc.returncode, "output": output,
                  "leaked": sorted(set(os.listdir("/proc/self/fd")) - set(before))}))
"""


def _pip_side(python, tmp_path, env, timeout=120):
    seam_dir = os.path.dirname(target.__file__)
    return subprocess.Popen([python, "-c", PIP_SIDE, seam_dir, str(tmp_path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc, timeout=120):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _served(python, tmp_path, handlers, env=None):
    """Run the pip side against a real SeamServer answering with ``handlers``."""
    server = SeamServer()
    proc = _pip_side(python, tmp_path, {"PATH": "/usr/bin:/bin", "PIPGUARD_SEAM": server.env_value, **(env or {})})
    thread = threading.Thread(target=server.serve, args=(proc.pid, handlers))
    thread.start()
    try:
        return _result(proc)
    finally:
        thread.join(30)
        server.close()


@pytest.mark.parametrize("python", PYTHONS)
def test_a_hook_call_reaches_pipguard_and_pip_gets_its_status_and_output(python, tmp_path):
    got = {}

    def on_hook(request, fds):
        got["request"], got["fds"] = request, len(fds)
        os.write(fds[1], b"the sandboxed call's output\n")
        return {"exit": 7, "message": 'pipguard: ref\u00fcsed "x"'}

    result = _served(python, tmp_path, {"hook": on_hook}, {"ODD": "a\\b\"c\n\u00e9"})
    assert result["exit"] == 7
    assert "the sandboxed call's output" in result["output"]
    assert 'pipguard: ref\u00fcsed "x"' in result["output"]  # stderr is stdout here, as pip asks
    assert result["leaked"] == []
    request = got["request"]
    assert request["type"] == "hook" and request["reply"] == "pipe"
    assert request["argv"][1:] == [request["argv"][1], "build_wheel", "/control dir"]
    assert request["argv"][1].endswith("_in_process.py")
    assert request["cwd"] == os.path.realpath(str(tmp_path))
    assert request["env"]["ODD"] == "a\\b\"c\n\u00e9"
    assert got["fds"] == 4  # stdin, stdout, stderr, the placeholder's pipe


@pytest.mark.parametrize("status", [0, 1, 124, 255])
def test_the_placeholder_exits_with_the_status_pipguard_wrote(status, tmp_path):
    result = _served(sys.executable, tmp_path, {"hook": lambda r, f: {"exit": status}})
    assert result["exit"] == status and result["output"] == ""


def test_pipguard_going_away_without_an_answer_fails_the_call(tmp_path):
    """The listener takes the request and closes everything (pipguard killed): the pipe ends
    without a status, and the placeholder fails instead of passing."""
    path = str(tmp_path / "s.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def vanish():
        conn, _ = listener.accept()
        _msg, ancillary, _f, _a = conn.recvmsg(65536, socket.CMSG_SPACE(4 * 4))
        for _level, _kind, payload in ancillary:
            for i in range(0, len(payload) - 3, 4):
                os.close(int.from_bytes(payload[i:i + 4], sys.byteorder))
        conn.close()

    thread = threading.Thread(target=vanish)
    thread.start()
    proc = _pip_side(sys.executable, tmp_path, {"PATH": "/usr/bin:/bin", "PIPGUARD_SEAM": f"{path} tok"})
    result = _result(proc)
    thread.join(30)
    listener.close()
    assert result["exit"] == 1


@pytest.mark.parametrize("seam", [None, "/nonexistent/seam.sock token"])
def test_no_channel_fails_the_call_with_a_message(seam, tmp_path):
    env = {"PATH": "/usr/bin:/bin", **({"PIPGUARD_SEAM": seam} if seam else {})}
    result = _result(_pip_side(sys.executable, tmp_path, env))
    assert result["exit"] == 1
    assert "could not be handed to the sandbox" in result["output"]
    assert result["leaked"] == []


def test_only_the_exact_rewritten_commands_count_as_the_seams_own(tmp_path, monkeypatch):
    """``classify`` passes a command through unchanged ("ours") only when it names the seam by
    the absolute path ``rewrite`` writes. A relative name was resolved against pip's cwd, where
    a build of a local project can write: a link ``./-u`` to the seam turned ``python -u -c …``
    (a legacy path, refused) into "ours" (review of the ``_seam`` entry)."""
    python = sys.executable
    legacy = [python, "-u", "-c", "exec(compile(open('setup.py').read(), 'setup.py', 'exec'))", "egg_info"]
    monkeypatch.chdir(tmp_path)
    assert target.classify(legacy)[0] == "refuse"
    (tmp_path / "-u").symlink_to(target.ENTRY)
    assert target.classify(legacy)[0] == "refuse"
    (tmp_path / "-u").unlink()
    (tmp_path / "-u").symlink_to(target.HERE)
    assert target.classify(legacy)[0] == "refuse"
    assert target.classify([python, target.ENTRY, "runner", "/x/__pip-runner__.py", "install"])[0] == "ours"
    assert target.classify([python, "-I", "-S", target.ENTRY, "refuse", "why"])[0] == "ours"
    assert target.classify([python, target.HERE, "runner", "/x/__pip-runner__.py", "install"])[0] == "ours"
