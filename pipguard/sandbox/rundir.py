"""A run's private directory (its temp dir, sandbox HOME with the ns decoys,
and event FIFO) and the idle work around it: the clean-up of a finished run
that waits for the caller's idle moments, and the next run's directory made
ahead (:func:`idle_work`). The plan takes a directory from here; the API, the
VM runner and ``pipguard install`` hand the clean-up back.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple


def run_dir_parts(run_dir: str) -> Tuple[str, str, str]:
    """A run directory's temp dir, sandbox HOME and event FIFO."""
    return os.path.join(run_dir, "tmp"), os.path.join(run_dir, "home"), os.path.join(run_dir, "events.fifo")


def _new_run_dir(decoys: bool) -> Tuple[str, Optional[str]]:
    """Make a run's private directory: (path, the token of the decoys planted
    in its HOME, or None where none were). Private to this uid (the sandbox
    runs as the same uid): no other local user can reach the event FIFO and
    forge evidence. Owned by this process's lock (:mod:`pipguard.sandbox.tempdirs`): if
    pipguard is killed, a later one removes it."""
    from pipguard.sandbox import tempdirs

    run_dir = tempdirs.make("pipguard-")
    try:
        tmp_dir, home_dir, fifo = run_dir_parts(run_dir)
        os.mkdir(tmp_dir, 0o700)
        os.mkdir(home_dir, 0o700)
        os.mkfifo(fifo, 0o600)
        if not decoys:
            return run_dir, None
        from pipguard.sandbox.backends.ns.decoys import HOME_DECOYS, plant_decoys
        from pipguard.sandbox.backends.ns.spec import new_token

        token = new_token()
        plant_decoys(home_dir, token, HOME_DECOYS)
        return run_dir, token
    except BaseException:
        _remove(run_dir)
        raise


def stop_idle_work_if_reachable(grants: Sequence[str]) -> None:
    """Where a run's grants cover the directory the run directories are made
    in (a ``TMPDIR`` inside the build tree, ``--allow-read /tmp``), the run
    could read or change the directories of the runs before and after it,
    which idle work keeps around while it runs: then the idle work stops for
    good, and what it kept is done now, before this run starts."""
    work = _IDLE.get()
    if work is None or work.stopped:
        return
    parent = os.path.realpath(tempfile.gettempdir())
    if not any(parent == g or parent.startswith(g.rstrip("/") + "/")
               for g in (os.path.realpath(g) for g in grants if g)):
        return
    _stop(work)


def _stop(work: "_IdleWork") -> None:
    """No more idle work in this block: what it kept is done now."""
    work.stopped = True
    if work.ready is not None:
        ready, work.ready = work.ready[0], None
        work.deferred.append(lambda: _remove(ready))
    _run_deferred(work)


@dataclass
class _IdleWork:
    """What a caller's idle moments do for its next run (:func:`idle_work`)."""

    #: clean-up that waits: run directories to remove, descriptors to close
    deferred: List[Callable[[], None]] = field(default_factory=list)
    #: a run directory made ahead: (path, decoy token or None)
    ready: Optional[Tuple[str, Optional[str]]] = None
    #: whether the last run was in namespaces (its successor likely is too: decoys planted ahead)
    decoys: bool = False
    #: set for good once a run could reach the run directories, or an idle step failed
    stopped: bool = False
    #: the caller's own step for its next run, first in every idle moment (:func:`idle_work`)
    ahead: Optional[Callable[[], bool]] = None
    #: no run follows (:func:`no_more_runs`): nothing more is made ahead
    closing: bool = False
    #: clean-up running on threads of its own (:func:`defer_kernel_wait`)
    threads: List[Any] = field(default_factory=list)


_IDLE: "contextvars.ContextVar[Optional[_IdleWork]]" = contextvars.ContextVar("pipguard_idle_work", default=None)


def take_run_dir(decoys: bool) -> Tuple[str, Optional[str]]:
    """The run directory made ahead if it fits (its HOME has decoys exactly
    when the run is in namespaces), else a new one."""
    work = _IDLE.get()
    if work is None or work.stopped:
        return _new_run_dir(decoys)
    work.decoys = decoys
    ready, work.ready = work.ready, None
    if ready is not None:
        if (ready[1] is not None) == decoys:
            return ready
        defer(lambda: _remove(ready[0]))
    return _new_run_dir(decoys)


def _remove(path: str) -> None:
    from pipguard.sandbox import tempdirs
    from pipguard.sandbox.files import remove_tree

    remove_tree(path)
    tempdirs.release(path)


def defer(action: Callable[[], None]) -> None:
    """Clean-up that may wait: inside :func:`idle_work` it runs when the caller
    is next idle (or when the block ends); elsewhere at once."""
    work = _IDLE.get()
    if work is None or work.stopped:
        action()
    else:
        work.deferred.append(action)


def defer_kernel_wait(action: Callable[[], None]) -> None:
    """Clean-up whose time goes to a wait in the kernel, not to Python (closing
    the last descriptor of an inotify instance waits for an SRCU grace period:
    5-20 ms measured): inside :func:`idle_work` it starts at once on a thread
    of its own -- the thread holds the GIL only around the system call, and no
    request of the caller waits for it, as one did for an idle step this long
    -- and the block's end waits for it; elsewhere it runs at once. For actions
    that take no lock and import nothing (this process forks meanwhile)."""
    work = _IDLE.get()
    if work is None or work.stopped:
        action()
        return
    from pipguard import threads

    work.threads.append(threads.start(action, name="pipguard-clean-up"))  # the caller's signals stay the main thread's


def cleanup(run_dir: str) -> None:
    """Remove a run's private directory (``Plan.run_dir``) (see :func:`defer`), and, once per process, the
    directories of runs whose pipguard was killed (:func:`pipguard.sandbox.tempdirs.sweep`)."""
    from pipguard.sandbox import tempdirs

    def clean_up() -> None:
        _remove(run_dir)
        tempdirs.sweep()  # the first time only

    defer(clean_up)


@contextlib.contextmanager
def idle_work(ahead: Optional[Callable[[], bool]] = None) -> Iterator[None]:
    """Within this block (in this thread), runs leave their clean-up to
    :func:`on_idle` -- which the caller calls, one step at a time, when nothing
    waits for it, as ``pipguard install`` does while pip works between two hook
    calls, and the supervisor does in a run's quiet moments -- and there the
    next run's directory is made ahead. Whatever happens, the block
    ends with nothing left behind. Why: removing a run's tree (5-15 ms),
    closing the ns decoy watch (an SRCU grace period, ~10 ms) and creating the
    next tree with its decoys (~20 ms measured in an install: file creation on
    a busy disk) would otherwise lie between a hook call's end and pip's next
    step, or between pip's next hook call and its sandbox.

    ``ahead`` is the caller's own step, first in every idle moment (True: it
    did something, ask again; False: nothing to do now): ``pipguard install``
    forks the next hook call's keeper and first process there
    (:func:`pipguard.sandbox.launcher.fork_spare`). It goes on after the run
    directories' work stopped (:func:`stop_idle_work_if_reachable`: it makes
    no files), and an exception ends it for the block."""
    work = _IdleWork(ahead=ahead)
    token = _IDLE.set(work)
    try:
        yield
    finally:
        _IDLE.reset(token)
        if work.ready is not None:
            ready = work.ready[0]
            work.deferred.append(lambda: _remove(ready))
        _run_deferred(work)
        for thread in work.threads:
            thread.join()


def no_more_runs() -> None:
    """The caller expects no further run in this block (``pipguard install``
    once pip installs the gated wheels): nothing more is made ahead, and a
    directory made for a run that never comes goes with the next idle step
    rather than at the block's end, after the caller's work."""
    work = _IDLE.get()
    if work is None or work.closing:
        return
    work.closing = True
    if work.ready is not None:
        ready, work.ready = work.ready[0], None
        work.deferred.append(lambda: _remove(ready))


def on_idle() -> bool:
    """One step of the idle work: the caller's own step (``ahead``), then
    the next run's directory (what the next run waits for), else one
    clean-up that waited. False when nothing was left to do; the caller asks
    again while it stays idle."""
    work = _IDLE.get()
    if work is None:
        return False
    if work.ahead is not None:
        try:
            if work.ahead():
                return True
        except Exception:  # never the run's business: the caller's next run does without
            work.ahead = None
    if work.stopped:
        return False
    try:
        if work.ready is None and not work.closing:
            work.ready = _new_run_dir(work.decoys)
            return True
        if work.deferred:
            work.deferred[0]()
            del work.deferred[0]  # after it ran: an action a Ctrl-C cut short runs again at the block's end
            return True
    except Exception:  # a full disk, no descriptors left: never the run's business (its evidence)
        try:
            _stop(work)
        except Exception:
            pass
    return False


def _run_deferred(work: _IdleWork) -> None:
    while work.deferred:
        work.deferred[0]()  # each is idempotent (remove a tree, close a descriptor once)
        del work.deferred[0]
