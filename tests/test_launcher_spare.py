"""A spare (pipguard.sandbox.launcher.fork_spare): the next run's keeper and first process, forked
while pipguard is idle. The run that takes it must be the run a fresh fork would have been:
the stdin/stdout/stderr of the moment the run starts (``pipguard install`` swaps them to the
hook call's pipes after the spare was forked), the run's rlimits, every layer applied; a spare
nobody takes leaves no process behind, and only the thread that forked it takes it."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from pipguard.sandbox import launcher
from pipguard.sandbox.policy import Policy
from pipguard.sandbox import run

#: prints its pid and its RLIMIT_FSIZE (the run's --limit-write)
_SAY = "import os, resource; print(os.getpid(), resource.getrlimit(resource.RLIMIT_FSIZE)[0])"
LIMIT = 7 << 20


def _run_with_stdout(tmp_path, name: str, isolation: str) -> tuple:
    """Run _SAY with this process's stdout swapped to a file after any spare was forked."""
    out = tmp_path / name
    saved = os.dup(1)
    try:
        with open(out, "w") as handle:
            sys.stdout.flush()
            os.dup2(handle.fileno(), 1)
            report = run([sys.executable, "-c", _SAY], Policy(isolation=isolation, limit_write=LIMIT),
                         cwd=str(tmp_path))
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    pid, fsize = out.read_text().split()
    return report, int(pid), int(fsize)


def _spare_pids() -> tuple:
    """(keeper, first process) of the waiting spare; the first process is the keeper's only
    child (the spare reads its pid from the keeper only when it is taken)."""
    keeper = launcher._spare[0].keeper_pid
    while True:  # a readiness poll: the keeper forks its child right after its own start
        with open(f"/proc/{keeper}/task/{keeper}/children") as children:
            pids = children.read().split()
        if pids:
            (first,) = pids
            return keeper, int(first)
        time.sleep(0.01)


@pytest.fixture
def no_spare():
    launcher.discard_spare()
    yield
    launcher.discard_spare()


def _gone(pid: int) -> bool:
    """Not running: no such process, or a zombie (the keeper exits once nothing of the
    run is alive; an orphaned zombie is then init's to reap)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_spare_runs_as_a_fresh_fork_would(tmp_path, no_spare, backend):
    fresh, fresh_pid, fresh_fsize = _run_with_stdout(tmp_path, "fresh", backend.isolation)
    launcher.fork_spare()
    _keeper, spare_pid = _spare_pids()
    spared, pid, fsize = _run_with_stdout(tmp_path, "spared", backend.isolation)
    assert launcher._spare is None  # taken
    if backend.ns:  # the command is pid 2 of its own pid namespace, below the spare's first process
        assert pid == fresh_pid == 2 and "ns" in spared.isolation.applied
    else:
        assert pid == spare_pid != fresh_pid  # the command ran in the spare's first process
    assert spared.exit_code == fresh.exit_code == 0, (spared.error, spared.events)
    assert fsize == fresh_fsize == LIMIT  # the run's rlimits, set before it confined itself
    assert spared.isolation.applied == fresh.isolation.applied
    assert "landlock.fs" in spared.isolation.applied or spared.isolation.unavailable
    assert spared.verdict == fresh.verdict == "clean"


def test_an_unused_spare_leaves_nothing(no_spare):
    launcher.fork_spare()
    keeper, first = _spare_pids()
    assert not _gone(keeper) and not _gone(first)
    launcher.discard_spare()
    assert _gone(first)
    assert not os.path.exists(f"/proc/{keeper}")  # our child, and reaped
    with pytest.raises(ChildProcessError):
        os.waitpid(keeper, os.WNOHANG)


def test_only_the_thread_that_forked_a_spare_takes_it(tmp_path, no_spare):
    launcher.fork_spare()
    _keeper, spare_pid = _spare_pids()
    seen = {}

    def other():
        seen["report"] = run([sys.executable, "-c", "import os; os.write(2, b'%d' % os.getpid())"],
                             Policy(), cwd=str(tmp_path))

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen["report"].exit_code == 0
    assert launcher._spare is not None and _spare_pids()[1] == spare_pid
    assert not _gone(spare_pid)


@pytest.mark.parametrize("killed", ["first process", "keeper"])
def test_a_spare_killed_from_outside_is_replaced_by_a_fresh_fork(tmp_path, no_spare, killed):
    """A spare now waits through whole hook calls (forked in a call's quiet moments), where an OOM
    kill or a stray ``kill`` can reach it. Nothing of the run has started then: the run takes a
    fresh fork instead, and runs once, with a keeper (review: with the keeper killed, the run went
    on without one and was reported clean; with the first process killed, the install failed)."""
    launcher.fork_spare()
    keeper, first = _spare_pids()
    os.kill(first if killed == "first process" else keeper, signal.SIGKILL)
    if killed == "keeper":
        deadline = time.monotonic() + 5
        while not _gone(keeper) and time.monotonic() < deadline:
            time.sleep(0.01)
    marker = tmp_path / "ran"
    report = run([sys.executable, "-c", f"open({str(marker)!r}, 'a').write('x')"], Policy(), cwd=str(tmp_path))
    assert report.exit_code == 0 and report.error is None and report.verdict == "clean", \
        (report.error, report.events)
    assert marker.read_text() == "x"  # once
    assert launcher._spare is None and _gone(first)


def test_a_spare_that_cannot_answer_its_config_is_replaced(tmp_path, no_spare, monkeypatch):
    """A spare SIGKILLed just before its run took the config into its socket all the same (the
    kill lands when the dying process is next scheduled: on a loaded CI machine, later), and the
    run failed with "connection reset". The launcher now waits for the spare's answer to its
    config; a stopped spare (it cannot answer: what a not-yet-dead one looks like, made
    deterministic) is replaced by a fresh fork after the answer's timeout, and killed."""
    monkeypatch.setattr(launcher, "SPARE_ANSWER_TIMEOUT", 0.5, raising=False)
    launcher.fork_spare()
    keeper, first = _spare_pids()
    os.kill(first, signal.SIGSTOP)
    marker = tmp_path / "ran"
    report = run([sys.executable, "-c", f"open({str(marker)!r}, 'a').write('x')"], Policy(), cwd=str(tmp_path))
    assert report.exit_code == 0 and report.error is None and report.verdict == "clean", \
        (report.error, report.events)
    assert marker.read_text() == "x"  # once, by the fresh fork
    deadline = time.monotonic() + 5
    while not _gone(first) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _gone(first)


def test_a_run_whose_keeper_vanished_is_an_error_not_clean(tmp_path, no_spare):
    """The keeper is what reports the command's status: a run whose keeper was killed before it
    did has no known outcome, and its report says so (verdict error), never clean."""
    killed = {}
    real_start = launcher.start

    def start_then_kill_keeper(*args, **kwargs):
        started = real_start(*args, **kwargs)

        def kill_keeper():
            os.kill(started.process.keeper_pid, signal.SIGKILL)
            killed["keeper"] = True

        threading.Timer(0.3, kill_keeper).start()
        return started

    launcher.start = start_then_kill_keeper
    try:
        report = run([sys.executable, "-c", "import time; time.sleep(3)"], Policy(), cwd=str(tmp_path))
    finally:
        launcher.start = real_start
    assert killed.get("keeper")
    assert report.verdict == "error" and "keeper" in (report.error or ""), (report.error, report.exit_code)


def test_a_spare_forked_in_a_runs_quiet_moment_holds_none_of_its_pipes(tmp_path, no_spare, backend):
    """``pipguard install`` forks the next hook call's spare while a call runs (the
    supervisor's idle step), when this process's stdout and stderr are that call's pipes, which
    pip reads to their end of file: a spare holding them kept pip waiting as long as the spare
    lived. Its stdio is /dev/null until its own run sends the run's."""
    import select

    from pipguard.sandbox import rundir

    read_end, write_end = os.pipe()
    saved = os.dup(1)
    try:
        with rundir.idle_work(ahead=launcher.fork_spare):
            sys.stdout.flush()
            os.dup2(write_end, 1)
            os.close(write_end)
            report = run([sys.executable, "-c", "import time; time.sleep(0.4); print('done', flush=True)"],
                         Policy(isolation=backend.isolation), cwd=str(tmp_path))
            os.dup2(saved, 1)  # our copy of the write end is gone: only a holder elsewhere keeps it open
            assert report.exit_code == 0, (report.error, report.events)
            assert launcher._spare is not None  # forked while the run was quiet
            _keeper, first = _spare_pids()
            assert not _gone(first)
            data = b""
            while True:
                ready = select.select([read_end], [], [], 10)[0]
                assert ready, f"no end of file on the run's stdout while the spare waits: {data!r}"
                chunk = os.read(read_end, 4096)
                if not chunk:
                    break
                data += chunk
            assert data == b"done\n"
            # and the spare then runs the next run as a fresh fork would
            nxt, _pid, fsize = _run_with_stdout(tmp_path, "next", backend.isolation)
            assert nxt.exit_code == 0 and fsize == LIMIT
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(read_end)


_PROBE_SPARE = r"""
import json, os, subprocess, sys, time
try_one, pipguard_pid = sys.argv[1], int(sys.argv[2])
time.sleep(0.5)  # quiet: the supervisor forks the next run's spare meanwhile
def ppid(pid):
    try:
        with open(f"/proc/{pid}/status") as fh:
            return int(next(l.split()[1] for l in fh if l.startswith("PPid:")))
    except (OSError, StopIteration, ValueError):
        return None
mine, p = set(), os.getpid()
while p and p not in mine:
    mine.add(p)
    p = ppid(p)
pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
keepers = {p for p in pids if ppid(p) == pipguard_pid}
found = sorted((keepers | {p for p in pids if ppid(p) in keepers}) - mine)
tries = {}
for pid in found:
    for args in (["kill", str(pid), "0"], ["kill", str(pid), "9"], ["read", f"/proc/{pid}/environ"]):
        out = subprocess.run([try_one, *args], capture_output=True, text=True).stdout
        tries[" ".join(args)] = json.loads(out.strip().splitlines()[-1])
print(json.dumps({"found": found, "tries": tries}))
"""


def test_the_spare_is_out_of_a_running_sandboxs_reach(tmp_path, no_spare, backend, try_one_bin):
    """The next run's spare (keeper and first process: forks of pipguard, unconfined, with its
    memory and environment) now waits while a sandbox runs. From inside that sandbox, natively:
    under the plain backend it is visible, and signalling it or reading its environ fails, the
    signals reported; under ns it is not in the sandbox's world at all. Afterwards it is alive
    (review of 2026-12-04, made a test)."""
    import json

    from pipguard.sandbox import rundir

    out_file = tmp_path / "probe.json"
    saved = os.dup(1)
    try:
        with rundir.idle_work(ahead=launcher.fork_spare):
            with open(out_file, "w") as handle:
                sys.stdout.flush()
                os.dup2(handle.fileno(), 1)
                report = run([sys.executable, "-c", _PROBE_SPARE, str(try_one_bin), str(os.getpid())],
                             Policy(isolation=backend.isolation, allow_read=(str(try_one_bin.parent),)),
                             cwd=str(tmp_path))
            os.dup2(saved, 1)
            assert report.exit_code == 0, (report.error, report.events)
            spare_keeper, spare_first = _spare_pids()  # forked during the run, still waiting
            out = json.loads(out_file.read_text().strip().splitlines()[-1])
            if backend.ns:
                assert out["found"] == [], out  # pipguard's children are not in its pid namespace
                return
            assert {spare_keeper, spare_first} <= set(out["found"]), out
            for what, result in out["tries"].items():
                assert not result["ok"], (what, result)
            assert not _gone(spare_keeper) and not _gone(spare_first)
            signalled = {e.target for e in report.blocked_events if e.rule == "signal-outside"}
            assert {f"pid {spare_keeper}", f"pid {spare_first}"} <= signalled, report.events
    finally:
        os.dup2(saved, 1)
        os.close(saved)
