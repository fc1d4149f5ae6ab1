"""``pipguard.sandbox.rundir.idle_work``: a run's clean-up waits for the caller's idle moments, and the
next run's private directory is made ahead (what ``pipguard install`` does between hook calls).
Real plans on this host; no sandbox runs here (the install tests run them)."""

from __future__ import annotations

import os

import pytest

from pipguard.sandbox import plan as plan_mod
from pipguard.sandbox import rundir
from pipguard.sandbox.backends import ns
from pipguard.sandbox.backends.ns.decoys import HOME_DECOYS
from pipguard.sandbox.policy import Policy


def _plan(work, isolation):
    return plan_mod.make_plan(["/bin/true"], Policy(isolation=isolation), cwd=str(work))


def _decoys(plan):
    return sorted(p for p in HOME_DECOYS if os.path.exists(os.path.join(plan.home_dir, p)))


def test_outside_the_block_a_run_cleans_up_at_once(work):
    plan = _plan(work, "audit")
    assert os.path.isdir(plan.run_dir)
    rundir.cleanup(plan.run_dir)
    assert not os.path.exists(plan.run_dir)
    assert rundir.on_idle() is False  # nothing to do outside the block


def test_clean_up_waits_and_the_next_directory_is_made_ahead(work):
    with rundir.idle_work():
        first = _plan(work, "audit")
        rundir.cleanup(first.run_dir)
        assert os.path.isdir(first.run_dir)  # waits for the idle moment
        assert rundir.on_idle() is True  # step 1: the next run's directory
        assert os.path.isdir(first.run_dir)
        assert rundir.on_idle() is True  # step 2: the clean-up
        assert not os.path.exists(first.run_dir)
        assert rundir.on_idle() is False
        second = _plan(work, "audit")
        assert second.run_dir != first.run_dir and os.path.isdir(second.run_dir)
        assert os.path.exists(second.fifo) and os.stat(second.run_dir).st_mode & 0o777 == 0o700
        ahead = rundir._IDLE.get()
        assert ahead.ready is None  # taken by the second plan
        rundir.on_idle()  # a directory for a third run that never comes
        leftover = ahead.ready[0]
        rundir.cleanup(second.run_dir)
        assert os.path.isdir(second.run_dir) and os.path.isdir(leftover)
    # the block's end did what was left: the clean-up, and removed what was made ahead
    assert not os.path.exists(second.run_dir) and not os.path.exists(leftover)


def test_a_directory_made_ahead_has_the_decoys_only_for_a_run_in_namespaces(work):
    if not ns.probe().available:
        pytest.skip(f"no namespace backend here: {ns.probe().reason}")
    with rundir.idle_work():
        first = _plan(work, "ns")  # made on the spot: its decoys planted by the plan
        assert _decoys(first) == sorted(HOME_DECOYS)
        rundir.cleanup(first.run_dir)
        while rundir.on_idle():
            pass
        ready = rundir._IDLE.get().ready[0]
        second = _plan(work, "ns")  # made ahead, decoys included, with the plan's own token
        assert second.run_dir == ready and _decoys(second) == sorted(HOME_DECOYS)
        assert not rundir._IDLE.get().stopped  # the namespace's own /tmp is no host grant
        token = second.namespace.token
        with open(os.path.join(second.home_dir, ".ssh/id_rsa")) as fh:
            assert token in fh.read()
        rundir.cleanup(second.run_dir)
        while rundir.on_idle():
            pass
        third = _plan(work, "audit")  # the one made ahead had decoys: not this run's, replaced
        assert _decoys(third) == [] and third.namespace is None
        rundir.cleanup(third.run_dir)
        runs = [first.run_dir, second.run_dir, third.run_dir]
    assert not any(os.path.exists(r) for r in runs)


def test_a_run_that_can_reach_the_temp_dir_stops_the_idle_work(work):
    """Review 2026-12-02: with TMPDIR inside the build tree, a call wrote into the next call's
    $HOME (made ahead) and read its decoy token. A plan whose grants cover the temp dir ends the
    idle work before its run starts: the directory made ahead and the last run's are gone."""
    import tempfile

    with rundir.idle_work():
        first = _plan(work, "audit")
        rundir.cleanup(first.run_dir)
        rundir.on_idle()  # the next run's directory, made ahead
        ahead = rundir._IDLE.get().ready[0]
        assert os.path.isdir(first.run_dir) and os.path.isdir(ahead)
        exposed = plan_mod.make_plan(["/bin/true"], Policy(isolation="audit",
                                                           allow_read=(tempfile.gettempdir(),)), cwd=str(work))
        # the directory made ahead (while no run could reach it) is its own; the last run's is gone
        assert exposed.run_dir == ahead and not os.path.exists(first.run_dir)
        assert rundir.on_idle() is False  # nothing is made ahead while this run could reach it
        assert rundir._IDLE.get().ready is None
        rundir.cleanup(exposed.run_dir)  # at once from now on
        assert not os.path.exists(exposed.run_dir)
        later = _plan(work, "audit")
        assert rundir.on_idle() is False and rundir._IDLE.get().ready is None
        rundir.cleanup(later.run_dir)
        assert not os.path.exists(later.run_dir)


def test_a_failing_idle_step_stops_the_idle_work_quietly(work, monkeypatch):
    """An idle step runs inside another run's supervision: a full disk there must not end that run
    (its evidence would be lost); the idle work stops instead."""
    def full(decoys):
        raise OSError(28, "No space left on device")

    with rundir.idle_work():
        first = _plan(work, "audit")
        rundir.cleanup(first.run_dir)
        monkeypatch.setattr(rundir, "_new_run_dir", full)
        assert rundir.on_idle() is False  # no exception
        assert not os.path.exists(first.run_dir)  # what it kept was done when it stopped
        monkeypatch.undo()
        second = _plan(work, "audit")
        rundir.cleanup(second.run_dir)
        assert not os.path.exists(second.run_dir)


def test_the_callers_own_step_comes_first_and_goes_on_after_a_stop(work):
    """``ahead`` (pipguard install: the next hook call's spare) is the first step of every idle
    moment while it has work, and it goes on once the run directories' work stopped (it makes
    no files); an exception ends it for the block, never the caller's run."""
    import tempfile

    calls = []

    def ahead():
        calls.append(len(calls))
        return len(calls) <= 2  # work twice, then nothing left

    with rundir.idle_work(ahead=ahead):
        assert rundir.on_idle() is True and calls == [0]
        assert rundir._IDLE.get().ready is None  # the caller's step came first
        assert rundir.on_idle() is True and calls == [0, 1]
        assert rundir.on_idle() is True and calls == [0, 1, 2]  # nothing from it: the directory
        assert rundir._IDLE.get().ready is not None
        exposed = plan_mod.make_plan(["/bin/true"], Policy(isolation="audit",
                                                           allow_read=(tempfile.gettempdir(),)), cwd=str(work))
        assert rundir._IDLE.get().stopped
        calls.clear()
        assert rundir.on_idle() is True and calls == [0]  # still asked after the stop
        rundir.cleanup(exposed.run_dir)

    def broken():
        raise OSError("fork failed")

    with rundir.idle_work(ahead=broken):
        assert rundir.on_idle() is True  # the directory, as if there were no such step
        assert rundir._IDLE.get().ahead is None


def test_no_more_runs_makes_nothing_ahead(work):
    with rundir.idle_work():
        first = _plan(work, "audit")
        rundir.cleanup(first.run_dir)
        assert rundir.on_idle() is True  # the next run's directory
        ready = rundir._IDLE.get().ready[0]
        rundir.no_more_runs()  # pip installs the gated wheels: no hook call follows
        while rundir.on_idle():
            pass
        # gone in the idle steps, not at the block's end after the caller's work; none made again
        assert not os.path.exists(ready) and not os.path.exists(first.run_dir)
        assert rundir._IDLE.get().ready is None
        late = _plan(work, "audit")  # a run that comes anyway gets a directory of its own
        rundir.cleanup(late.run_dir)
    assert not os.path.exists(late.run_dir)


def test_a_kernel_wait_runs_on_a_thread_the_blocks_end_joins():
    """Closing a decoy watch waits in the kernel (an SRCU grace period): inside the block on a
    thread of its own, so pip's next request does not wait for it; the block's end joins it
    (pipguard's fast exit needs no thread left)."""
    import threading

    seen = []
    release = threading.Event()

    def slow_close():
        seen.append(threading.current_thread().name)
        release.wait(5)

    rundir.defer_kernel_wait(lambda: seen.append(threading.current_thread().name))
    assert seen == ["MainThread"]  # outside the block: at once
    seen.clear()
    with rundir.idle_work():
        rundir.defer_kernel_wait(slow_close)
        threads = list(rundir._IDLE.get().threads)
        assert len(threads) == 1 and threads[0].is_alive()  # we went on while it waits
        # and it leaves the caller's signals to the main thread (pipguard.threads; review)
        from pipguard.threads import CALLER_SIGNALS

        with open(f"/proc/self/task/{threads[0].native_id}/status") as fh:
            mask = next(int(line.split()[1], 16) for line in fh if line.startswith("SigBlk:"))
        assert {s for s in CALLER_SIGNALS if not mask & (1 << (s - 1))} == set()
        release.set()
    assert seen == ["pipguard-clean-up"] and not threads[0].is_alive()


def test_a_plan_refused_half_way_leaves_no_run_directory(work, tmp_path, monkeypatch):
    """The run directory is made before the OS layer is resolved: a plan that fails there
    (``--isolation os`` where the OS layer is missing) removes it, or every refused run
    left one behind until the process ended."""
    import tempfile

    from pipguard.errors import LayerUnavailable

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    with pytest.raises(LayerUnavailable):
        plan_mod.make_plan(["/bin/true"], Policy(isolation="os"), cwd=str(work), os_available=False,
                           os_reason="no Landlock here")
    assert list(temp.iterdir()) == []
    plan = _plan(work, "audit")  # the same place otherwise holds the run's directory
    assert os.path.dirname(plan.run_dir) == str(temp)
    rundir.cleanup(plan.run_dir)
