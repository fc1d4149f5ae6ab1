"""Stopping pipguard itself (Ctrl-C, SIGTERM) stops the whole sandbox and
still writes the report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import pg


def _alive_with(marker: str) -> list:
    return [argv for argv in pg.live_argvs() if any(marker in a for a in argv)]


def _shells_with(marker: str) -> list:
    # pipguard's own processes (the run's keeper, the first process before its
    # exec) carry the marker in their argv too: count only the command's shells
    return [argv for argv in _alive_with(marker) if argv[0] == "sh"]


_STARTED: list = []  # (pipguard process, marker) of the running test


@pytest.fixture(autouse=True)
def _no_tree_outlives_its_test():
    """A failing test (pipguard not stopping) must not leave a busy loop running
    for the rest of the session: kill what the test started, whatever happened."""
    yield
    while _STARTED:
        proc, marker = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid, argv in pg.live_processes():
            if any(marker in a for a in argv):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def _start(work, fake_home, script: str, marker: str, ready: int) -> subprocess.Popen:
    """``pipguard run -- sh -c SCRIPT``, returned once ``ready`` shells carry
    ``marker`` (a readiness poll, no timing assertion)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipguard", "run", "--report", str(work / "r.json"), "--", "sh",
         "-c", script],
        cwd=work, env=fake_home.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _STARTED.append((proc, marker))
    for _ in range(100):
        if len(_shells_with(marker)) >= ready:
            break
        time.sleep(0.1)
    return proc


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 128 + 15)])
def test_signal_to_pipguard_kills_tree_and_writes_report(tmp_path, fake_home, sig, status):
    work = tmp_path / "work"
    work.mkdir()
    report = work / "r.json"
    marker = f"pipguard-lifetime-{os.getpid()}-{sig}"
    # ready: the two shells
    proc = _start(work, fake_home, f"(setsid sh -c 'sleep 300; true' {marker} &) ; "
                  f"sh -c 'sleep 300; true' {marker}", marker, 2)
    assert len(_shells_with(marker)) >= 2
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == status, err
    data = json.loads(report.read_text())
    assert data["error"] and data["verdict"] == "error"
    assert any(p["killed_by_pipguard"] for p in data["processes"])
    assert _alive_with(marker) == []


@pytest.mark.parametrize("attempt", range(4))
def test_signal_while_the_supervisor_is_busy_still_kills_the_tree(tmp_path, fake_home, attempt):
    """A build that starts processes without pause keeps the supervisor busy
    answering (fork, exec, exit): the signal then lands outside its wait, and the
    kill and the report must still follow (once they did not, and the tree lived on)."""
    work = tmp_path / "work"
    work.mkdir()
    report = work / "r.json"
    marker = f"pipguard-busy-{os.getpid()}-{attempt}"
    proc = _start(work, fake_home, f"while :; do /bin/true; done; : {marker}", marker, 1)
    time.sleep(0.2 + 0.1 * attempt)  # let the loop run a while; vary where the signal lands
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    data = json.loads(report.read_text())
    assert data["error"] and data["verdict"] == "error"
    assert _alive_with(marker) == []
