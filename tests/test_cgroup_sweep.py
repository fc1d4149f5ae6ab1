"""Run cgroups a killed pipguard left behind (pipguard/sandbox/limits.py ``_sweep_once``): the next
pipguard removes the empty ones of processes that are gone, and nothing else."""

import os
import subprocess
import time

import pytest

from pipguard.sandbox import limits
from support import requires

pytestmark = [requires("linux"), requires("root")]


def _v2_parent():
    v2_mount, _v1 = limits._mounts()
    own = limits._own_cgroups()
    if not v2_mount or "" not in own:
        pytest.skip("no cgroup2 hierarchy of our own here")
    return os.path.join(v2_mount, own[""].lstrip("/"))


def test_empty_cgroups_of_a_dead_pipguard_are_removed(monkeypatch):
    parent = _v2_parent()
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that no longer exists (not reused this fast)
    stale = os.path.join(parent, f"pipguard-{gone.pid}-7")
    alive = os.path.join(parent, f"pipguard-{os.getppid()}-7")  # a live pid: left alone
    other = os.path.join(parent, f"someone-else-{gone.pid}")     # not ours: left alone
    for d in (stale, alive, other):
        os.mkdir(d)
    old = time.time() - 120  # made two minutes ago: a fresh one could be another namespace's run
    for d in (stale, alive, other):
        os.utime(d, (old, old))
    fresh = os.path.join(parent, f"pipguard-{gone.pid}-8")
    os.mkdir(fresh)
    try:
        monkeypatch.setattr(limits, "_swept", set())
        prepared = limits.prepare(1 << 30, 64, 60.0, 1 << 30)
        if prepared.cgroup is not None:
            prepared.cgroup.remove()
        assert not os.path.exists(stale)
        assert os.path.isdir(alive) and os.path.isdir(other) and os.path.isdir(fresh)
    finally:
        for d in (stale, alive, other, fresh):
            if os.path.isdir(d):
                os.rmdir(d)


def test_the_move_kept_fast_moves_nothing_of_pipguard():
    """limits.FastMove (the command's move into its run cgroup without waiting for an RCU
    grace period): while it runs, pipguard stays in its own cgroups, the command lands in the
    run's, and when it stops its thread and descriptor are gone. Where pipguard may not write
    its own cgroup it is simply not used."""
    import threading

    _v2_parent()
    prepared = limits.prepare(1 << 30, 64, 60.0, 1 << 30)
    cgroup = prepared.cgroup
    assert cgroup is not None and cgroup.own_procs
    with open("/proc/self/cgroup") as fh:
        before = fh.read()
    child = subprocess.Popen(["sleep", "30"])
    try:
        fast = cgroup.move_kept_fast()
        assert fast is not None
        time.sleep(0.05)  # some rounds of the no-op move
        cgroup.add(child.pid)
        fast.stop()
        with open("/proc/self/cgroup") as fh:
            assert fh.read() == before
        assert child.pid in (cgroup.members() or set())
        assert not [t for t in threading.enumerate() if t.name == "pipguard-cgroup-warm"]
        with pytest.raises(OSError):
            os.fstat(fast._fd)
    finally:
        child.kill()
        child.wait()
        cgroup.remove()
    unwritable = limits.RunCgroup()
    unwritable.own_procs = "/proc/self/no-such-cgroup.procs"
    assert unwritable.move_kept_fast() is None
