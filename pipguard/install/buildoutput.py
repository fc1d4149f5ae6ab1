"""A hook call's output on its way to pip, through the escape-sequence filter; and
the one other thing of a call that pip prints as it is, its result's name.

pip gives each hook call a pipe and prints what comes out of it when the call
fails, or as it comes with ``-v``: a package's build decides those bytes, and
raw they reach the user's terminal, a CI log viewer that renders ANSI, a
``| tee``, a ``less -R``. So the sandboxed call writes into a pipe of
pipguard's, and one thread per hook call copies what it reads into pip's
pipe through :class:`pipguard.report.render.safe.BuildOutputFilter` (colour kept,
every other control sequence escaped visibly). Always, not only when
pipguard's stdout is a terminal or ``CI`` is set: whether the bytes end on a
terminal is decided after pip (a pipe into ``tee``, a log file shown later),
where pipguard cannot see it.

Cost: a pipe, a thread started and joined per hook call (~0.2 ms measured) and a
pass over the output (C for plain lines); nothing per syscall of the build.

The name ``build_wheel`` returns is printed by pip (``Created wheel for X:
filename=…``) before pip or the gate looks at the wheel: a name with a control
character in it is refused (:func:`unprintable_result`), and pip never reads it.
"""

from __future__ import annotations

import os
import select
import threading
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

from pipguard.report.render.safe import BuildOutputFilter, printable

if TYPE_CHECKING:
    from pipguard.install.hookcall import HookCall, Problem

#: how long the end of a call waits for its output to be copied, after the call's
#: processes are gone (they held the only writers): a writer that survived the run
#: would otherwise hold the install; its output then goes on in the background
DRAIN_TIMEOUT = 10.0
_CHUNK = 65536


class Relay:
    """The filtered copy of one hook call's stdout and stderr into pip's.

    :meth:`start` returns the descriptors the call writes to (stdout, stderr:
    one pipe when pip gave the same pipe for both, as it does, so the order
    of the two stays); the caller makes them the call's 1 and 2 and closes
    them (:meth:`writers_given`); :meth:`finish` waits until the call's
    writers are all closed and the copy is complete."""

    def __init__(self, stdout_fd: int, stderr_fd: int) -> None:
        self._targets = (stdout_fd, stderr_fd)
        self._pairs: List[Tuple[int, int]] = []  # (our read end, our copy of pip's fd)
        self.writers: Tuple[int, int] = (-1, -1)
        self._thread: Optional[threading.Thread] = None

    def start(self) -> Tuple[int, int]:
        from pipguard import threads

        out, err = self._targets
        same = _same_file(out, err)
        writers = []
        try:
            for target in (out,) if same else (out, err):
                read_end, write_end = os.pipe2(os.O_CLOEXEC)
                self._pairs.append((read_end, os.dup(target)))
                writers.append(write_end)
        except OSError:
            self._close_pairs()
            for fd in writers:
                os.close(fd)
            raise
        self.writers = (writers[0], writers[0] if same else writers[1])
        self._thread = threads.start(_copy, name="pipguard-build-output", args=(tuple(self._pairs),))
        return self.writers

    def writers_given(self) -> None:
        """Our own write ends are no longer needed (the call holds its copies)."""
        for fd in dict.fromkeys(self.writers):
            if fd >= 0:
                os.close(fd)
        self.writers = (-1, -1)

    def finish(self) -> None:
        """Wait for the copy: it ends when every writer (the call's processes) is gone."""
        self.writers_given()
        if self._thread is not None:
            self._thread.join(DRAIN_TIMEOUT)
            self._thread = None

    def _close_pairs(self) -> None:
        for pair in self._pairs:
            for fd in pair:
                os.close(fd)
        self._pairs = []


def _same_file(a: int, b: int) -> bool:
    try:
        first, second = os.fstat(a), os.fstat(b)
    except OSError:
        return False
    return (first.st_dev, first.st_ino) == (second.st_dev, second.st_ino)


def _copy(pairs: Sequence[Tuple[int, int]]) -> None:
    """Copy each read end to its target, filtered, until end of file on all;
    closes them. A target that stopped taking data (pip gone) is dropped but its
    pipe still read, so that the call is never blocked on a full pipe."""
    filters = {read_end: BuildOutputFilter() for read_end, _target in pairs}
    targets = dict(pairs)
    poller = select.poll()
    for read_end in targets:
        poller.register(read_end, select.POLLIN)
    open_ends = set(targets)
    try:
        while open_ends:
            ready = [fd for fd, _events in poller.poll()] if len(open_ends) > 1 else list(open_ends)
            for fd in ready:
                try:
                    data = os.read(fd, _CHUNK)
                except InterruptedError:
                    continue
                out = filters[fd].feed(data) if data else filters[fd].close()
                if out and targets[fd] >= 0:
                    targets[fd] = _write_all(targets[fd], out)
                if not data:
                    poller.unregister(fd)
                    open_ends.discard(fd)
    finally:
        for read_end, _target in pairs:
            os.close(read_end)
            if targets[read_end] >= 0:
                os.close(targets[read_end])


def _write_all(fd: int, data: bytes) -> int:
    """``fd``, or -1 (closed) if it no longer takes data."""
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        os.close(fd)
        return -1
    return fd


def unprintable_result(call: "HookCall") -> Tuple["Problem", ...]:
    """A problem if the name the hook returned (the wheel, sdist or metadata
    directory it made) holds a character ``str.isprintable()`` refuses: pip
    prints that name raw. Nothing for any other result (the result's own
    checks are :func:`pipguard.install.hookcall.check_result`'s)."""
    import json

    from pipguard.gate import treefiles
    from pipguard.install.hookcall import OUTPUT_KEY, Problem

    if call.hook not in OUTPUT_KEY:
        return ()
    # the build wrote it: read as check_result does (no link followed, no FIFO waited on)
    data = treefiles.read_regular(os.path.join(call.control_dir, "output.json"))
    try:
        value = json.loads(data).get("return_val") if data is not None else None
    except (ValueError, AttributeError):
        return ()  # no readable result: check_result and pip say so
    if not isinstance(value, str) or value.isprintable():
        return ()
    return (Problem("hook-output", f"{call.hook} returned a name with control characters, which pip "
                    f"would print as they are: {printable(value)[:300]}"),)
