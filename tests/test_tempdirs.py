"""What a killed pipguard leaves in the temp dir (a run's ``pipguard-XXXX``, the seam's
``pipguard-seam-XXXX``) is removed by the next pipguard (pipguard/sandbox/tempdirs.py), and
nothing else: never a live run's directory, another uid's, or one without an owner's lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from support import requires

pytestmark = [requires("linux")]

PY = sys.executable


def _env(tmp: Path) -> dict:
    # a temp dir of the test's own: the machine's /tmp holds other runs' directories
    return dict(os.environ, TMPDIR=str(tmp))


def _ours(tmp: Path) -> set:
    return {p.name for p in tmp.iterdir() if p.name.startswith("pipguard-") and p.is_dir()}


def _wait_for(condition, what: str) -> None:
    for _ in range(300):
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _age(path: Path) -> None:
    """Made two minutes ago: past the moment between a directory's creation and its lock."""
    old = time.time() - 120
    os.utime(path, (old, old))


def _killed_run(tmp: Path, work: Path) -> Path:
    """``pipguard run -- sleep`` killed with SIGKILL while the command runs: its run directory."""
    before = _ours(tmp)
    proc = subprocess.Popen([PY, "-m", "pipguard", "run", "--", "sleep", "300"], cwd=work, env=_env(tmp),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for(lambda: any((tmp / n / "tmp").is_dir() for n in _ours(tmp) - before), "the run's directory")
    time.sleep(0.5)  # the command runs
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    (name,) = _ours(tmp) - before
    return tmp / name


@pytest.fixture
def tmp():
    """A temp dir short enough for the seam's socket (a longer one puts it in /tmp)."""
    d = Path(tempfile.mkdtemp(prefix="pgt-", dir="/tmp"))
    yield d
    from pipguard.sandbox.files import remove_tree

    remove_tree(str(d))


@pytest.fixture
def work(tmp_path):
    d = tmp_path / "work"
    d.mkdir()
    return d


def test_a_killed_runs_directory_is_removed_by_the_next_run_and_nothing_else(tmp, work):
    stale = _killed_run(tmp, work)
    assert stale.is_dir() and (stale / "home").is_dir()  # what the kill left
    _age(stale)
    # a live run's directory, as old: its lock is held, it stays
    live = subprocess.Popen([PY, "-m", "pipguard", "run", "--", "sleep", "300"], cwd=work, env=_env(tmp),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: any((tmp / n / "tmp").is_dir() for n in _ours(tmp) - {stale.name}), "the live run")
        (live_dir,) = [tmp / n for n in _ours(tmp) - {stale.name}]
        _age(live_dir)
        legacy = tmp / "pipguard-legacy0"  # no owner's lock (an older pipguard's): not ours to judge
        legacy.mkdir()
        _age(legacy)
        fresh = _killed_run(tmp, work)  # dead, but changed a moment ago: left for a later sweep
        r = subprocess.run([PY, "-m", "pipguard", "run", "--", "true"], cwd=work, env=_env(tmp),
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert not stale.exists()
        assert live_dir.is_dir() and legacy.is_dir() and fresh.is_dir()
        assert live.poll() is None
    finally:
        live.kill()
        live.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make another uid's directory")
def test_another_uids_directory_is_left_alone(tmp, work):
    stale = _killed_run(tmp, work)
    _age(stale)
    foreign = tmp / "pipguard-foreign0"
    foreign.mkdir()
    (foreign / ".pipguard-owner.lock").touch()
    os.chown(foreign / ".pipguard-owner.lock", 65534, 65534)
    os.chown(foreign, 65534, 65534)
    _age(foreign)
    subprocess.run([PY, "-m", "pipguard", "run", "--", "true"], cwd=work, env=_env(tmp),
                   capture_output=True, timeout=120, check=True)
    assert not stale.exists() and foreign.is_dir()


def test_a_killed_installs_seam_directory_is_removed(tmp, work):
    """``pipguard install`` killed while pip runs: the seam's directory (its socket) stays
    behind; the next pipguard removes it."""
    pidfile = work / "pip.pid"
    python = work / "python"  # a "pip" that only waits: pipguard serves it meanwhile
    python.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 300\n")
    python.chmod(0o755)
    proc = subprocess.Popen([PY, "-m", "pipguard", "install", "--python", str(python), "six"], cwd=work,
                            env=_env(tmp), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), "the fake pip")
        (seam,) = [tmp / n for n in _ours(tmp) if n.startswith("pipguard-seam-")]
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if pidfile.exists() and pidfile.read_text().strip():
            try:
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert seam.is_dir()
    _age(seam)
    subprocess.run([PY, "-m", "pipguard", "run", "--", "true"], cwd=work, env=_env(tmp),
                   capture_output=True, timeout=120, check=True)
    assert not seam.exists()
