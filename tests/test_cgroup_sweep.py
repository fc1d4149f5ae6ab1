"""Run cgroups a killed pipguard left behind (pipguard/limits.py ``_sweep_once``): the next
pipguard removes the empty ones of processes that are gone, and nothing else."""

import os
import subprocess
import time

import pytest

from pipguard import limits
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
