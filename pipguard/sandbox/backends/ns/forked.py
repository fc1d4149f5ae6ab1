"""Entering the namespace backend: the forked side (:func:`enter`).

Fork structure (the pid namespace applies to the unsharing process's *children*)::

    keeper ── F (host pid = the run's first process: the keeper waits for it,
              │   the caller holds its pidfd; exits with the command's status)
              └── I (pid 1 inside: builds the root, reaps, keeps the decoy
                  │   inotify fd, exits when nothing is left)
                  └── C (pid 2 inside: back in pipguard.sandbox.first_process, confines itself
                         and execs the command; the launcher learns its host
                         pid from SCM_CREDENTIALS on the control socket)

Everything here runs after the fork: it imports nothing (the caller may have had other
threads) and writes only with ``os.write``. Every module it uses is imported at the top of
this one, and the package's ``__init__`` imports this one: the first process imports the
package before it forks. Imports the spec, the root and the kernel calls of this package and
the standard library.
"""

from __future__ import annotations

import ctypes
import os
import signal
from typing import Any, Dict, List, Mapping

from pipguard.sandbox.backends.ns.kernel import (CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWPID,
                                                 CLONE_NEWUSER, CLONE_NEWUTS, PR_GET_DUMPABLE, PR_SET_DUMPABLE,
                                                 NamespaceError,
                                                 _become, _check, _libc, _loopback_up, _write, why_denied)
from pipguard.sandbox.backends.ns.root import _build_root, _root_trees, _watch_decoys
from pipguard.sandbox.backends.ns.spec import PRIVATE_TMPFS, NamespaceSpec


def _send_error(control_fd: int, message: str, hint: str) -> None:
    text = '{"error": %s, "hint": %s}\n' % (_json_str(message), _json_str(hint))
    data = text.encode()
    try:
        while data:
            data = data[os.write(control_fd, data):]
    except OSError:
        pass


def _json_str(text: str) -> str:
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20:
            out.append("\\u%04x" % ord(ch))
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def enter(spec_json: Mapping[str, Any], control_fd: int) -> Dict[str, Any]:
    """In the sandbox's forked first process, before the OS layer: create
    the namespaces and the new root (see the package docstring). Returns only
    in the command's process (pid 2 inside), with what its status line must
    carry for the launcher (``{"decoy_fd": N, "decoys": {wd: path},
    "tmpfs_fds": {"/tmp": N, "/dev/shm": N}}``, fds of pid 1); the
    other processes end in ``os._exit``. On failure the reason goes to the
    launcher on ``control_fd`` and the process exits 125."""
    spec = NamespaceSpec.from_json(spec_json)
    try:
        trees = _root_trees(spec, spec_json.get("idmap_userns")) if spec.idmap_writes and os.geteuid() == 0 else {}
        if os.geteuid() == 0:
            _become(spec.host_uid, spec.host_gid)
        flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
        if spec.network:
            flags |= CLONE_NEWNET
        if _libc.unshare(CLONE_NEWUSER) != 0:
            reason, hint = why_denied(ctypes.get_errno())
            raise NamespaceError(f"the namespace backend is unavailable: {reason}", hint)
        # one id each way, written by ourselves (an unprivileged process may
        # map exactly its own ids; setgroups must be denied first)
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{spec.host_uid} {spec.host_uid} 1\n")
        _write("/proc/self/gid_map", f"{spec.host_gid} {spec.host_gid} 1\n")
        _check(_libc.unshare(flags & ~CLONE_NEWUSER), "unshare(mount, pid, net, ipc, uts)")
    except NamespaceError as exc:
        _send_error(control_fd, str(exc), exc.hint)
        os._exit(125)
    except OSError as exc:
        _send_error(control_fd, f"the namespace backend failed: {exc}", "use --isolation os")
        os._exit(125)
    status_r, status_w = os.pipe()
    init = os.fork()
    if init != 0:
        _first_process(init, status_r, status_w, control_fd, trees)
    os.close(status_r)
    return _init(spec, trees, status_w, control_fd)


def _first_process(init: int, status_r: int, status_w: int, control_fd: int, trees: Dict[str, int]) -> None:
    """F: wait for the command's status from pid 1 and end with it (the
    keeper reports our status as the command's). Never returns."""
    # F is a fork of pipguard too (as root: its memory under the sandbox's uid,
    # which _become made dumpable for the maps): nothing needs its /proc files
    # from here on, so nobody gets them (defence in depth: no pid inside names it)
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    os.close(status_w)
    os.close(control_fd)
    for fd in trees.values():
        os.close(fd)
    data = b""
    while True:
        try:
            chunk = os.read(status_r, 64)
        except InterruptedError:
            continue
        if not chunk:
            break
        data += chunk
    if data.strip().isdigit():
        status = int(data.strip())
    else:  # pid 1 ended before the command did (its setup failed, or it was killed)
        _pid, status = os.waitpid(init, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # SIGKILL and SIGSTOP have no handler to reset (it raised, and skipped the kill)
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
            os.kill(os.getpid(), sig)
        except (OSError, ValueError):
            pass
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def _init(spec: NamespaceSpec, trees: Dict[str, int], status_w: int, control_fd: int) -> Dict[str, Any]:
    """I, pid 1 of the new pid namespace: build the root, fork the command's
    process (which returns), then reap until nothing is left."""
    try:
        # what lands in our own /tmp and /dev/shm is gone with the namespace: the
        # launcher takes a handle on each (it keeps the tmpfs alive) and lists
        # what the run left there, as files written (discarded ones)
        handles = _build_root(spec, trees)
        tmpfs_fds = {path: fd for path, fd in handles.items() if path in PRIVATE_TMPFS}
        if spec.network:
            _loopback_up()
        name_b = spec.hostname.encode()
        _check(_libc.sethostname(name_b, len(name_b)), "sethostname")
        decoy_fd, decoys = _watch_decoys(spec, handles)
        for path, fd in handles.items():
            if path not in tmpfs_fds:
                os.close(fd)
        _blank_own_strings()
    except (OSError, NamespaceError) as exc:
        _send_error(control_fd, f"the namespace backend could not build the sandbox's root: {exc}",
                    getattr(exc, "hint", "") or "use --isolation os")
        os._exit(125)
    # pid 1 holds pipguard's memory (index credentials among it): once the
    # launcher has taken the decoy watch (pidfd_getfd, a ptrace check that a
    # non-root launcher passes only while we are dumpable), nobody may read it.
    # The command's process holds the write end of ``handed`` until the
    # launcher's acknowledgement (it closes it in before_exec; O_CLOEXEC, and
    # its death, close it too) and then waits on ``sealed`` until we are not
    # dumpable: its command's first instruction comes after that, so there is
    # no moment in which the command runs and /proc/1/mem is the sandbox's.
    handed_r, handed_w = os.pipe2(os.O_CLOEXEC)
    sealed_r, sealed_w = os.pipe2(os.O_CLOEXEC)
    command = os.fork()
    if command == 0:
        os.close(status_w)
        os.close(handed_r)
        os.close(sealed_w)
        os.close(decoy_fd)  # pid 1 keeps it; the launcher takes it from there
        for fd in tmpfs_fds.values():
            os.close(fd)  # the same
        os.setsid()  # a session of its own inside: its pgid is visible to it
        _BEFORE_EXEC[:] = [handed_w, sealed_r]
        return {"decoy_fd": decoy_fd, "decoys": decoys, "tmpfs_fds": tmpfs_fds}
    os.close(control_fd)
    os.close(handed_w)
    os.close(sealed_r)
    # pid 1 of a pid namespace gets from inside only the signals it has a handler
    # for, and pipguard's (SIGINT's, SIGTERM's) came with the fork: without this
    # the command could end the namespace (and the record of what lingers) at will
    for sig in signal.valid_signals():
        if sig not in (signal.SIGKILL, signal.SIGSTOP) and callable(signal.getsignal(sig)):
            signal.signal(sig, signal.SIG_DFL)
    _read_to_end(handed_r)
    # not dumpable: /proc/1/mem and /proc/1/environ become root's (of the host), so even
    # where Landlock's ptrace scope is missing the sandbox's uid cannot open them. Checked:
    # if it did not hold, pid 1 ends, and with it the namespace, before the command execs.
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    if _libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0:
        os._exit(125)
    os.close(sealed_w)  # the command's process may exec now
    # pid 1: reap everything; the command's status goes out at once, so the
    # run ends when the command does while the rest is still here to be
    # recorded as lingering (then it is killed, and we exit with nothing left)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            os._exit(0)
        if pid == command:
            try:
                os.write(status_w, b"%d\n" % status)
            except OSError:
                pass
            os.close(status_w)


#: in the command's process: [handed_w, sealed_r] (see _init), for before_exec
_BEFORE_EXEC: List[int] = []


def before_exec() -> None:
    """In the command's process, after the launcher's acknowledgement and right
    before its execve: tell pid 1 the launcher is done with it, and wait until
    pid 1 is no longer dumpable (it closes its end of ``sealed`` then)."""
    if not _BEFORE_EXEC:
        return
    handed_w, sealed_r = _BEFORE_EXEC
    del _BEFORE_EXEC[:]
    os.close(handed_w)
    _read_to_end(sealed_r)


def _read_to_end(fd: int) -> None:
    """Block until every write end of the pipe ``fd`` is closed; close it."""
    while True:
        try:
            if not os.read(fd, 1):
                break
        except InterruptedError:
            continue
    os.close(fd)


def _blank_own_strings() -> None:
    """pid 1 is a fork of pipguard: its command line and environment, which
    the sandbox can read at ``/proc/1/cmdline`` (any process may) and
    ``/proc/1/environ``, are pipguard's own — an index URL with credentials
    given as ``-i``, ``PIP_INDEX_URL``. Zero both areas in our own memory
    (the kernel reads them from there; nothing here uses them again), before
    the command's process is forked."""
    fd = os.open("/proc/self/stat", os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    # fields 48-51 (arg_start, arg_end, env_start, env_end); the name, field 2,
    # may hold spaces and parentheses: count from its last ")"
    fields = data[data.rindex(b")") + 2:].split()
    arg_start, arg_end, env_start, env_end = (int(f) for f in fields[45:49])
    for start, end in ((arg_start, arg_end), (env_start, env_end)):
        if 0 < start < end:
            ctypes.memset(start, 0, end - start)
