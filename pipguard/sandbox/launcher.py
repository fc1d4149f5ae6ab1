"""Start the sandboxed command: a forked keeper (:mod:`pipguard.sandbox.keeper`)
forks the sandbox's first process, which runs :mod:`pipguard.sandbox.first_process`,
confines itself and execs the command; we collect its layer status and take
its seccomp listener fd.

A caller that runs many sandboxes one after another with idle time between
them (``pipguard install``: pip works between two hook calls) can fork the
next run's keeper and first process ahead, while it is idle
(:func:`fork_spare`): the two forks of a large process (8-13 ms measured,
docs/performance.md) are then off the path from a hook call to its command.
That first process waits, unconfined and running only pipguard's code, for
its config and the run's stdin/stdout/stderr over its control socket, and
then does exactly what a freshly forked one does (rlimits, the confinement
order of :mod:`pipguard.sandbox.first_process`, the exec)."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import struct
import threading
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Sequence, Tuple

from pipguard.sandbox import notify
from pipguard.sandbox.backends import Entered
from pipguard.errors import KernelError, LayerUnavailable, PipguardError
from pipguard.sandbox.limits import ChildUsage
from pipguard.sandbox.plan import Plan


class ChildProcess:
    """The sandbox's first process, seen through its keeper (the parent that
    waits for it, :mod:`pipguard.sandbox.keeper`). Signals go through a pidfd, the
    status comes from the keeper: nothing here waits for or signals a process
    by a pid that could have been reused, or one pipguard did not start."""

    def __init__(self, keeper_pid: int, keeper_sock: socket.socket) -> None:
        self.keeper_pid = keeper_pid
        self.keeper_sock = keeper_sock
        self.keeper_pidfd = _pidfd_open(keeper_pid)  # our child, not yet reaped: race free
        self.pid = 0
        self.pidfd: Optional[int] = None
        self.returncode: Optional[int] = None
        self.wait_status: Optional[int] = None
        #: pid -> raw wait status of every sandbox process the keeper reaped
        self.reaped: Dict[int, int] = {}
        #: the keeper's last rusage of what it reaped (pipguard.sandbox.limits.ChildUsage), or None
        self.usage: Optional[ChildUsage] = None
        self._buf = b""
        self._released = False

    def receive_root(self) -> None:
        """The keeper's first line: the first process's pid and a pidfd of it."""
        message, fds, _flags, _addr = socket.recv_fds(self.keeper_sock, 256, 1)
        if not message.startswith(b"root "):
            for fd in fds:
                os.close(fd)
            raise PipguardError("the sandbox keeper exited early")
        self.pid = int(message.split()[1])
        self.pidfd = fds[0] if fds else None

    def read_reports(self, block: bool) -> bool:
        """Take in what the keeper sent (``exit PID STATUS`` lines). False at end of file."""
        self.keeper_sock.setblocking(block)
        try:
            data = self.keeper_sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            data = b""
        finally:
            self.keeper_sock.setblocking(True)
        if not data:
            return False
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            parts = line.split()
            if len(parts) == 5 and parts[0] == ChildUsage.PREFIX:
                self.usage = ChildUsage.from_fields(parts[1:]) or self.usage
            if len(parts) == 3 and parts[0] == b"exit":
                pid, status = int(parts[1]), int(parts[2])
                self.reaped[pid] = status
                if pid == self.pid:
                    self.wait_status = status
                    self.returncode = os.waitstatus_to_exitcode(status)
        return True

    def keeper_alive(self) -> bool:
        """Whether the keeper still runs (it is our child: not reaped, so its pid is ours)."""
        if self.keeper_pidfd is None:
            return True  # no pidfd (an old kernel): the handoff's own errors tell
        try:
            return os.waitid(os.P_PIDFD, self.keeper_pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
        except ChildProcessError:
            return False

    def poll(self) -> Optional[int]:
        if self.returncode is None and not self._released:
            self.read_reports(block=False)
        return self.returncode

    def wait(self) -> Optional[int]:
        while self.returncode is None and not self._released:
            if not self.read_reports(block=True):
                break  # the keeper is gone: the status is lost
        return self.returncode

    def kill(self) -> None:
        if self.pidfd is not None and self.returncode is None:
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def release(self) -> None:
        """Tell the keeper to finish (it kills what is left of the sandbox,
        reaps it and exits), wait for the keeper itself, close everything.
        Idempotent."""
        if self._released:
            return
        self._released = True
        try:
            self.keeper_sock.sendall(b"end\n")
        except OSError:
            pass
        while self.read_reports(block=True):
            pass  # end of file: the keeper has exited
        self.keeper_sock.close()
        try:
            if self.keeper_pidfd is not None:
                os.waitid(os.P_PIDFD, self.keeper_pidfd, os.WEXITED)
            else:
                os.waitpid(self.keeper_pid, 0)
        except ChildProcessError:
            pass  # the caller ignores SIGCHLD: the kernel reaped it
        for fd in (self.pidfd, self.keeper_pidfd):
            if fd is not None:
                os.close(fd)
        self.pidfd = self.keeper_pidfd = None


def _pidfd_open(pid: int) -> Optional[int]:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


@dataclass
class Started:
    """The running sandbox root and what its confinement applied."""

    process: ChildProcess
    listener: Optional[int]
    applied: Tuple[str, ...]
    unavailable: Dict[str, str] = field(default_factory=dict)
    landlock_abi: int = 0
    #: nr -> name of the syscalls the child's filter notifies
    syscalls: Dict[int, str] = field(default_factory=dict)
    #: what a backend other than plain set up (pipguard.sandbox.backends.Entered)
    entered: Optional[Entered] = None

    @property
    def command_pid(self) -> int:
        """Host pid of the process that execs the command: the first process,
        or (ns) the one it made inside the namespaces."""
        return self.entered.command_pid if self.entered is not None else self.process.pid

    @property
    def command_ppid(self) -> int:
        """Its parent: the keeper, or (ns) the namespace's pid 1."""
        if self.entered is not None and self.entered.helpers:
            return self.entered.helpers[0]
        return self.process.keeper_pid


def start(plan: Plan, meanwhile: Optional[Callable[[], None]] = None,
          rlimits: Sequence[Tuple[int, int, int]] = (),
          before_exec: Optional[Callable[[int], None]] = None,
          run_as: Optional[Tuple[int, int]] = None) -> Started:
    """Launch the child and complete the handshake. Raises LayerUnavailable
    when a required layer is missing; the child is then already gone.

    ``run_as`` (uid, gid): the child becomes that user before it confines
    itself (pipguard as root, :mod:`pipguard.sandbox.sandbox_user`); None: it keeps ours.

    ``meanwhile`` runs right after the fork, while the child confines itself
    (its status is waited for afterwards); if it raises, the child is killed.
    ``rlimits`` are (resource, soft, hard) set in the first process before it
    confines itself; ``before_exec(pid)`` runs with the command's pid before
    the command is exec'd (the place to move it into a cgroup): with the plain
    backend as soon as that pid is known, while the process confines itself
    -- a cgroup move waits for an RCU grace period (8-25 ms measured here,
    once per hierarchy), which then overlaps the confinement; under ns the
    command's process is known only from its status line. On any error the
    keeper is released before raising.

    A spare forked by this thread (:func:`fork_spare`) is used if there is
    one (either backend: the first process enters the namespaces itself): it
    gets the config and this process's stdin, stdout and stderr, and the rest
    is the same."""

    from pipguard.sandbox.oslayer import seccomp

    _reopenable_stdio()
    config = {
        "cwd": plan.cwd,
        "executable": plan.executable,
        "argv": list(plan.argv),
        "env": plan.env,
        "os_spec": plan.os_spec.to_json() if plan.os_spec else None,
        "os_required": plan.os_required,
        "rlimits": list(rlimits),
        # the backend that builds the world before the OS layer (pipguard.sandbox.backends)
        "backend": "ns" if plan.namespace is not None else "plain",
        "backend_spec": _backend_spec(plan),
        "run_as": list(run_as) if run_as else None,
    }
    spare = _take_spare()
    if spare is not None and not _hand_over(spare, config):
        spare = None  # it died while it waited (nothing ran): a fresh fork does the run
    if spare is not None:
        process, parent_sock = spare
        if plan.os_spec is not None:
            # for the next spare (a fork of this process), while this first process confines itself
            seccomp.prebuild(plan.os_spec, notify=plan.os_spec.notify)
    else:
        if plan.os_spec is not None:  # built here once; the first process only loads it
            seccomp.prebuild(plan.os_spec, notify=plan.os_spec.notify)
        process, parent_sock = _fork(config)
    listener: Optional[int] = None
    entered: Optional[Entered] = None
    try:
        if spare is None:
            process.receive_root()
        moved = False
        if before_exec is not None and plan.namespace is None:
            before_exec(process.pid)  # the first process is the command's
            moved = True
        if meanwhile is not None:
            try:
                meanwhile()
            except BaseException:
                process.kill()
                process.wait()
                raise
        line, sender = _read_line(parent_sock)
        if not line:
            process.wait()
            raise PipguardError(f"the sandbox launcher exited early (status {process.returncode})")
        status = json.loads(line)
        if "error" in status:
            process.wait()
            raise LayerUnavailable(status["error"], hint=status.get("hint"))
        unavailable = dict(status.get("unavailable", {}))
        applied = tuple(status.get("applied", ()))
        entered = _entered(status.get("backend"), sender)
        command_pid = entered.command_pid if entered is not None else process.pid
        if status.get("listener_fd") is not None:
            try:
                listener = notify.take_fd(command_pid, int(status["listener_fd"]))
            except OSError as exc:
                if plan.os_required:
                    process.kill()
                    process.wait()
                    raise KernelError("pidfd_getfd", exc.errno or 0, exc.strerror or str(exc),
                                      hint="the supervisor needs Linux >= 5.6") from exc
                # Without a supervisor, notified syscalls fail with ENOSYS once
                # the child closes its copy: fail closed, and say so.
                unavailable["supervisor"] = f"cannot take the listener fd: {exc}"
        if listener is None and plan.proxy_port is not None and plan.os_spec is not None:
            # Landlock grants the proxy's port to every address; only the
            # supervisor (connecting on the sandbox's behalf) pins the address.
            process.kill()
            process.wait()
            raise LayerUnavailable("index-only network needs the seccomp supervisor, which is unavailable",
                                   hint="use a kernel with seccomp user notification, or --no-index with local files")
        if before_exec is not None and not moved:
            before_exec(command_pid)
        from pipguard.sandbox.first_process import GO

        parent_sock.sendall(GO)
        syscalls = {int(nr): str(name) for nr, name in (status.get("syscalls") or {}).items()}
        return Started(process, listener, applied, unavailable, int(status.get("landlock_abi", 0)),
                       syscalls, entered)
    except BaseException:
        process.kill()
        process.release()
        # what was taken for the run that now does not start (fds of ours)
        for fd in ([listener] if listener is not None else []) + \
                  (list(entered.evidence_fds.values()) if entered is not None else []):
            try:
                os.close(fd)
            except OSError:
                pass  # the others still get closed, and the first error is what goes up
        raise
    finally:
        parent_sock.close()


def _fork(config: Optional[dict]) -> Tuple[ChildProcess, socket.socket]:
    """Fork the keeper, which forks the first process; with ``config`` None
    that process waits for its config (:func:`_send_config`). Returns the
    keeper and our end of the first process's control socket."""
    from pipguard.sandbox import keeper as _keeper  # imported before fork: the keeper must import nothing

    parent_sock, child_sock = socket.socketpair()
    keeper_sock, keeper_end = socket.socketpair()
    # A spare's stdin, stdout and stderr are /dev/null until its run sends the run's: forked
    # in a run's quiet moment, it would otherwise hold that run's (pip's pipes of the hook
    # call) open, and pip would wait for their end of file until the spare is gone.
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC) if config is None else -1
    config = dict(config or {"await_config": True}, control_fd=child_sock.fileno())
    # The kernel tells us who sent the status line, in our pid namespace:
    # under ns that is the command's process, whose pid nobody inside knows.
    parent_sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    # fork, not a second interpreter: the keeper is a copy of this process with
    # every module loaded (about 40 ms less per sandbox start, see
    # docs/performance.md). Other threads of the caller may run meanwhile:
    # the keeper and the first process import nothing and take no lock
    # (pipguard/sandbox/keeper.py), and close every descriptor they did not bring.
    try:
        pid = os.fork()
    except BaseException:  # EAGAIN, ENOMEM: nothing was started
        if devnull >= 0:
            os.close(devnull)
        for sock in (parent_sock, child_sock, keeper_sock, keeper_end):
            sock.close()
        raise
    if pid == 0:  # the keeper: never returns
        try:
            parent_sock.close()
            keeper_sock.close()
            if devnull >= 0:
                for target in (0, 1, 2):
                    os.dup2(devnull, target)  # dup2 clears close-on-exec on the copies
            _keeper.keep(keeper_end.fileno(), child_sock.fileno(), config)
        finally:
            os._exit(127)
    if devnull >= 0:
        os.close(devnull)
    child_sock.close()
    keeper_end.close()
    return ChildProcess(pid, keeper_sock), parent_sock


def _backend_spec(plan: Plan) -> Optional[dict]:
    """The backend's spec for the first process: the plan's, and under ns as
    root the idmap user namespaces this process made once for all runs."""
    if plan.namespace is None:
        return None
    spec = plan.namespace.to_json()
    if plan.namespace.idmap_writes and os.geteuid() == 0:
        from pipguard.sandbox.backends.ns.root import premade_idmaps

        spec["idmap_userns"] = premade_idmaps(plan.namespace)
    return spec


def _reopenable_stdio() -> None:
    """Let the sandbox reopen its stdin, stdout and stderr where they are pipes of
    ours: ``/dev/stdout`` is ``/proc/self/fd/1``, reopened with the pipe's own
    permissions, and a pipe made by pipguard or pip is its owner's only, mode 0600
    — so a build running as another uid (the sandbox user, ns's ``nobody``) got
    ``EACCES`` from ``tee /dev/stderr`` or ``open('/dev/stdout', 'w')``, where
    plain pip's build writes. A pipe has no path: only processes that may ptrace
    one holding it can reopen it, whatever its mode. Terminals and files keep
    theirs (a terminal's mode lets others write to it; a file, a named FIFO
    included, is the user's)."""
    for fd in (0, 1, 2):
        try:
            st = os.fstat(fd)
            if not stat.S_ISFIFO(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o666 == 0o666:
                continue
            if os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):  # not a named FIFO on disk
                os.fchmod(fd, 0o666)
        except OSError:
            pass


def _send_config(sock: socket.socket, config: dict) -> None:
    """A waiting first process's config, one JSON line, with this process's
    stdin, stdout and stderr (what a freshly forked one would have inherited
    now: ``pipguard install`` makes them the hook call's)."""
    data = (json.dumps(config) + "\n").encode()
    sent = socket.send_fds(sock, [data], [0, 1, 2])
    if sent < len(data):
        sock.sendall(data[sent:])


# -- the spare: the next run's keeper and first process, forked ahead ---------

_spare: Optional[Tuple[ChildProcess, socket.socket, int]] = None
#: seconds a spare has to answer its config (it is blocked in recv: microseconds, unless stopped)
SPARE_ANSWER_TIMEOUT = 5.0
_spare_lock = threading.Lock()


def fork_spare() -> bool:
    """Fork the next run's keeper and first process now, if there is none
    waiting (True: forked now): the next :func:`start` in this thread uses
    them. For a caller that is idle now -- between two runs, or in a run's
    quiet moment (the supervisor's idle step): the keeper and the first
    process import nothing and take no lock, so the native responder's
    thread running meanwhile is no hazard, and they close every descriptor
    of the running sandbox they inherit (:mod:`pipguard.sandbox.keeper`). Call
    :func:`discard_spare` when no run follows. Returns once the keeper is
    forked: its ``root`` message (the first process's pid) is read when the
    spare is taken, so that a request arriving meanwhile waits only for
    this process's own fork."""
    global _spare
    with _spare_lock:
        if _spare is not None:
            return False
        process, sock = _fork(None)
        _spare = (process, sock, threading.get_ident())
        return True


def discard_spare() -> None:
    """End the spare, if any (its keeper kills the waiting first process,
    reaps it and exits; we reap the keeper). Idempotent."""
    global _spare
    with _spare_lock:
        spare, _spare = _spare, None
    if spare is not None:
        process, sock, _thread = spare
        sock.close()  # end of file: the waiting first process exits
        process.release()


def _hand_over(spare: Tuple[ChildProcess, socket.socket], config: dict) -> bool:
    """Give a waiting spare its run's config; False (the spare ended) if its keeper or
    first process is gone: nothing of the run has started, so a fresh fork may do it. A
    spare now waits through whole hook calls, where an OOM kill or a stray ``kill`` can
    reach it (review: a run whose keeper was gone went on without one, and was reported
    clean)."""
    from pipguard.sandbox.first_process import SPARE_READY

    process, parent_sock = spare
    try:
        process.receive_root()
        if not process.keeper_alive():
            raise OSError("the spare's keeper is gone")
        _send_config(parent_sock, config)
        # A spare SIGKILLed just before this takes the config into its socket all the same, and
        # the run then failed with "connection reset" (seen in CI): only its answer says that it
        # read the config. It waits in recv, so it answers at once; the timeout is for a stopped one.
        parent_sock.settimeout(SPARE_ANSWER_TIMEOUT)
        try:
            if parent_sock.recv(1) != SPARE_READY:
                raise OSError("the spare ended before it read its config")
        finally:
            parent_sock.settimeout(None)
        return True
    except (OSError, PipguardError):
        process.kill()
        process.release()
        parent_sock.close()
        return False
    except BaseException:
        process.kill()
        process.release()
        parent_sock.close()
        raise


def _take_spare() -> Optional[Tuple[ChildProcess, socket.socket]]:
    global _spare
    with _spare_lock:
        if _spare is None or _spare[2] != threading.get_ident():
            return None
        (process, sock, _thread), _spare = _spare, None
    return process, sock


def _read_line(sock: socket.socket) -> Tuple[bytes, int]:
    """One line, and the host pid of the process that sent its last part
    (SCM_CREDENTIALS; 0 if the kernel gave none)."""
    data, sender = b"", 0
    while not data.endswith(b"\n"):
        chunk, ancillary, _flags, _addr = sock.recvmsg(65536, socket.CMSG_SPACE(12))
        if not chunk:
            break
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(payload) >= 12:
                sender = struct.unpack("iII", payload[:12])[0]
        data += chunk
    return data.strip(), sender


def _entered(info: Optional[dict], sender: int) -> Optional[Entered]:
    """What the ns backend's command process reported: its host pid is the
    sender of the status line, pid 1 (pipguard's init, its parent) holds the
    decoy watch, whose fd we take now."""
    if not info:
        return None
    if sender <= 0:
        raise PipguardError("the namespace backend's status came without the sender's credentials")
    init_pid, _comm = notify.proc_stat(sender)
    fds: Dict[str, int] = {}
    try:
        if info.get("decoy_fd") is not None:
            fds["decoys"] = notify.take_fd(init_pid, int(info["decoy_fd"]))
        for path, fd in (info.get("tmpfs_fds") or {}).items():
            fds["tmpfs:" + str(path)] = notify.take_fd(init_pid, int(fd))
    except BaseException:
        for taken in fds.values():
            os.close(taken)
        raise
    return Entered(sender, (init_pid,), fds, True,
                   {"decoys": {int(k): str(v) for k, v in (info.get("decoys") or {}).items()}})
