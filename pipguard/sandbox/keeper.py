"""The keeper: one small process per run between the caller and the sandbox.

Why it exists (docs/sandbox.md, "Python API"): only a process's parent can
wait for it, and only a child subreaper gets the orphans of its subtree. If
the caller itself were both, it would have to ``waitpid(-1)`` — taking the
statuses of children that are not ours (pip, when ``pipguard install`` calls
us while its pip child waits) — and stay a subreaper for life. The keeper is
the sandbox's parent and subreaper instead, so the caller keeps its own
children, statuses and process attributes, and any number of runs can go on
at once from threads (each has its own keeper).

The keeper is forked from the caller (no second interpreter: it costs a fork,
not ~40 ms of start-up). It imports nothing after the fork and takes no lock
another thread of the caller could hold: it only makes syscalls and writes
with ``os.write``. Its life:

  1. close every descriptor but stdio and its two sockets; block the
     terminal's signals (Ctrl-C is the caller's to handle; the sandbox gets
     the caller's signal mask back before it execs)
  2. become a child subreaper, fork the sandbox's first process (which runs
     :func:`pipguard.sandbox.first_process.confine_and_exec`), send its pid and a pidfd of it
     to the caller (the pidfd is opened before anyone could reap the pid: race
     free) and close its copy of the sandbox's control socket
  3. reap every process of the sandbox as it ends; send the first process's
     wait status when it is reaped
  4. when the caller says "end" or goes away (end of file on the socket, even
     if the caller was SIGKILLed): kill whatever is left, reap it — every
     child, the dead ones too (ns pid 1 ends after the first process and
     holds what the command used) — exit.

Protocol on the caller's socket, one ASCII line each way:
``root PID`` (with the pidfd as SCM_RIGHTS), ``exit PID STATUS`` (raw wait
status), ``usage UTIME_US STIME_US MAXRSS_KIB OUBLOCK`` (its
``getrusage(RUSAGE_CHILDREN)`` after each reap, before ``exit``); from the
caller only ``end`` or end of file.
"""

from __future__ import annotations

import ctypes
import os
import resource
import select
import signal
import socket
from typing import Dict, List, Set

from pipguard.sandbox import first_process as _child

_PR_SET_CHILD_SUBREAPER = 36
_libc = ctypes.CDLL(None, use_errno=True)  # loaded before any fork
#: Signals a terminal or a job control shell sends to a whole process group.
TERMINAL_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
                    signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU}


def process_tree(root: int) -> Set[int]:
    """The live (not zombie) processes below ``root``, from /proc: children,
    their children, and so on. ``root`` itself is not included."""
    children: Dict[int, List[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return set()
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2:].split()
        if fields[0] == b"Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    found: Set[int] = set()
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def _send(fd: int, text: str) -> None:
    data = text.encode() + b"\n"
    while data:
        try:
            data = data[os.write(fd, data):]
        except BrokenPipeError:
            return  # the caller is gone; step 4 follows


def _usage() -> str:
    """What every process the keeper reaped (and what they waited for) used:
    pipguard.sandbox.limits.ChildUsage reads it. A syscall, no import, no lock."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (f"usage {int(ru.ru_utime * 1e6)} {int(ru.ru_stime * 1e6)} {ru.ru_maxrss} "
            f"{ru.ru_oublock}")


def _reap_remaining(caller_fd: int) -> bool:
    """Reap every child that can be reaped now, each followed by a usage line;
    True when no child is left. Called once a scan found nothing of the run
    alive; never blocks (a scan of /proc is not atomic: a process forked
    during it may have been missed, and is killed by the next round)."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG | 0x40000000)  # __WALL
        except InterruptedError:
            continue
        except ChildProcessError:
            return True
        if pid == 0:
            return False
        _send(caller_fd, _usage())


def keep(caller_fd: int, control_fd: int, config: dict) -> None:
    """The keeper's whole life (never returns: it ends in ``os._exit``)."""
    keep_fds = sorted({0, 1, 2, caller_fd, control_fd})
    low = 3
    for fd in keep_fds:  # step 1
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    os.closerange(low, 65536)
    caller_mask = signal.pthread_sigmask(signal.SIG_BLOCK, TERMINAL_SIGNALS | {signal.SIGCHLD})
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    # A handler that does nothing: SIGCHLD only has to wake the select below
    # (set before the fork, or a quick first process could be missed).
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_w)
    _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # step 2

    root = os.fork()
    if root == 0:
        try:
            os.close(caller_fd)
            os.close(wake_r)
            os.close(wake_w)
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, caller_mask)
            for resource_id, soft, hard in config.get("rlimits", ()):
                resource.setrlimit(resource_id, (soft, hard))  # inherited by the whole tree
            _child.confine_and_exec(config)
        finally:
            os._exit(127)
    os.close(control_fd)
    try:
        pidfd = os.pidfd_open(root)
    except (AttributeError, OSError):
        pidfd = None
    caller = socket.socket(fileno=caller_fd)  # kept (and the fd open) until _exit
    try:
        socket.send_fds(caller, [f"root {root}\n".encode()], [pidfd] if pidfd is not None else [])
    except OSError:
        pass
    if pidfd is not None:
        os.close(pidfd)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})

    ending = False  # steps 3 and 4
    while True:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG | 0x40000000)  # __WALL
            except ChildProcessError:
                pid = 0
            if pid == 0:
                break
            if pid == root:  # what the run used so far first: the caller stops reading soon after
                _send(caller_fd, _usage())
                _send(caller_fd, f"exit {root} {status}")
            else:
                _send(caller_fd, _usage())  # an orphan: its time and peak count too
        if ending:
            left = process_tree(os.getpid())
            if not left:
                # nothing alive is left, but a child may have died since the reap above
                # (process_tree skips zombies): reap those too, or what they and theirs
                # used would be lost (ns pid 1 holds the command's written bytes)
                if _reap_remaining(caller_fd):
                    os._exit(0)
                # a child is dying but not reapable yet, or appeared after the scan:
                # kill and look again in 50 ms (below)
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        try:
            ready, _, _ = select.select([caller_fd, wake_r], [], [], 0.05 if ending else None)
        except InterruptedError:
            continue
        if wake_r in ready:
            try:
                os.read(wake_r, 4096)
            except BlockingIOError:
                pass
        if caller_fd in ready and not ending:
            try:
                data = os.read(caller_fd, 64)
            except OSError:
                data = b""
            if not data or b"end" in data:
                ending = True
