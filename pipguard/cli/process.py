"""This pipguard process's own life around a command: the cyclic garbage collector paused
during start-up (:func:`_pause_gc`, :func:`_resume_gc`, :func:`_end_gc_pause`), SIGTERM taken
as Ctrl-C and the exit status then said as that signal (:func:`_sigterm_like_ctrl_c`,
:func:`_stopped_status`), and the end without the interpreter's teardown (:func:`_exit_now`).

The commands resume the collector and take SIGTERM, the entry point (:mod:`pipguard.cli.app`)
pauses and ends; both import this module, so it holds the state. Imports the base layer and
the standard library (lazily) only.
"""

from __future__ import annotations

import os
import sys
from typing import Optional

from pipguard import exitcodes

#: the signal that stopped pipguard, once one did through :func:`_sigterm_like_ctrl_c`
_STOPPED_BY: Optional[int] = None


def _sigterm_like_ctrl_c() -> None:
    """SIGTERM stops the sandbox like Ctrl-C does: the supervisor kills the
    whole tree and the report is still written. The exit status then says which
    it was, as a shell's does: 130 (128+SIGINT) or 143 (128+SIGTERM)."""
    import signal

    def terminated(signum, frame):
        global _STOPPED_BY
        _STOPPED_BY = signum
        raise KeyboardInterrupt  # the path Ctrl-C takes

    signal.signal(signal.SIGTERM, terminated)


def _stopped_status(done: SystemExit) -> SystemExit:
    """``done``, with an interrupted exit (130) said as the signal that stopped pipguard."""
    if done.code == exitcodes.INTERRUPTED and _STOPPED_BY is not None:
        return SystemExit(128 + _STOPPED_BY)
    return done


_GC_PAUSED = False


def _pause_gc() -> bool:
    """Pause the cyclic collector for start-up; whether it was running (then
    :func:`_end_gc_pause` is due when the command ends).

    The cyclic garbage collector only costs time in a short pipguard run:
    importing ~150 modules triggers ~40 collections that find nothing, and
    the collections at interpreter exit walk every object again (~10 ms
    together). Paused until the long part starts (:func:`_resume_gc`), and
    everything is frozen before exit."""
    global _GC_PAUSED
    import gc

    paused = _GC_PAUSED = gc.isenabled()
    gc.disable()
    return paused


def _resume_gc() -> None:
    """Start-up is over: what it allocated lives until exit, so freeze it
    (later collections skip it), and let the collector run again."""
    global _GC_PAUSED
    if _GC_PAUSED:
        import gc

        _GC_PAUSED = False
        gc.freeze()
        gc.enable()


def _end_gc_pause(paused: bool) -> None:
    """The command is over: if :func:`_pause_gc` paused the collector, freeze everything
    and let it run again (whether or not the command resumed it already)."""
    global _GC_PAUSED
    if paused:
        _GC_PAUSED = True  # resumed already or not: what is left is frozen, the collector runs
        _resume_gc()


def _exit_now(done: SystemExit) -> None:
    """End the process at once with ``done``'s status, as the interpreter
    would after its clean-up: flush stdout and stderr, then ``os._exit``.
    Why: the command's work is over (reports written, sandboxes reaped, pip
    waited for), and tearing down the ~300 modules an install loads takes
    the interpreter 20-30 ms more per command. Returns (the caller then
    exits normally) when the status is not a plain code, when a thread of
    ours still runs, when a profiler or tracer is on, or when a flush fails
    (the interpreter reports that)."""
    code = done.code
    if code is None:
        code = 0
    threading = sys.modules.get("threading")  # not imported: no thread was started
    if not isinstance(code, int) or (threading is not None and threading.active_count() > 1):
        return
    if sys.getprofile() is not None or sys.gettrace() is not None:
        return  # a profiler or coverage writes its data at the interpreter's exit
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        return
    os._exit(code & 0xFF)
