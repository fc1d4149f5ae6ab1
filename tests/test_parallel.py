"""The harness under pytest-xdist (docs/testing.md "Parallel runs"): what the session's workers
share is shared safely, and the tier summary still counts every worker's tests."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import conftest
import pytest
import support
from support import users

from pipguard.sandbox import acl

NOBODY_ONLY = range(support.NOBODY, support.NOBODY + 1)
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def closed_dir(tmp_path):
    support.need("root")
    path = tmp_path / "closed"
    path.mkdir(mode=0o700)
    os.chmod(path, 0o700)
    return str(path)


def test_nobody_keeps_traversal_until_the_last_holder_leaves(closed_dir):
    """Two holders of nobody's grant on one directory (two xdist workers' nobody_python on
    /root): the first to leave must not take it from the other; the last restores the mode."""
    with users.traversable_by(closed_dir):
        with users.traversable_by(closed_dir):
            assert acl.names_user(closed_dir, NOBODY_ONLY)
        assert acl.names_user(closed_dir, NOBODY_ONLY), "the first holder out revoked the other's grant"
    assert not acl.names_user(closed_dir, NOBODY_ONLY)
    assert acl.read(closed_dir)[1] is False  # no ACL left: as before the first grant
    assert os.stat(closed_dir).st_mode & 0o777 == 0o700


def test_a_holder_that_died_holding_does_not_keep_the_grant(closed_dir):
    pid = os.fork()
    if pid == 0:  # enters and dies without leaving (a worker killed mid-module)
        held = users.traversable_by(closed_dir)  # kept: collecting it would run its exit
        try:
            held.__enter__()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert acl.names_user(closed_dir, NOBODY_ONLY)
    with users.traversable_by(closed_dir):
        pass
    assert not acl.names_user(closed_dir, NOBODY_ONLY), "a dead holder's lease was counted"


def test_nobody_python_holds_its_own_grant_when_another_holder_made_it_runnable():
    """Found by a parallel run: a worker's nobody_python saw nobody already able to run the
    interpreter (the other worker's grant on /root), took no grant of its own, and its tests
    failed with EACCES once the other worker's module ended."""
    support.need("root")
    if os.stat("/root").st_mode & 0o001:
        pytest.skip("/root is searchable by everyone here: no grant is needed")
    other = users.traversable_by("/root")  # the other worker's module
    other.__enter__()
    try:
        with conftest.nobody_runs(sys.executable) as runs:
            assert runs
            other, leaving = None, other
            leaving.__exit__(None, None, None)
            assert conftest._nobody_can_run(sys.executable), "the other holder took nobody's access along"
    finally:
        if other is not None:
            other.__exit__(None, None, None)


def test_the_tier_summary_counts_every_workers_tests(tmp_path):
    pytest.importorskip("xdist")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-q",
                           "tests/test_tiers.py", "-m", "unit", "-k", "tier"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTEST_DEBUG_TEMPROOT=str(tmp_path)))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    summary = proc.stdout[proc.stdout.index("= tiers ="):]
    passed = int(summary.split("\nunit     ", 1)[1].split(" passed", 1)[0])
    assert f"{passed} passed" in summary.splitlines()[-1], summary
    assert passed >= 5 and "sandbox  not run" in summary and "; 2 workers (pytest-xdist)" in summary, summary
