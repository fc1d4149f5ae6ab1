"""Start the sandboxed command: a forked child runs :mod:`pipguard._child`,
which confines itself and execs the command; we collect its layer status and
take its seccomp listener fd."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Tuple

from pipguard import notify
from pipguard.errors import KernelError, LayerUnavailable, PipguardError
from pipguard.plan import Plan


class ChildProcess:
    """The forked sandbox root: the little of ``subprocess.Popen`` we use."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> Optional[int]:
        if self.returncode is None:
            try:
                _pid, status = os.waitpid(self.pid, 0)
                self.returncode = os.waitstatus_to_exitcode(status)
            except ChildProcessError:
                pass  # reaped by the supervisor (it is a subreaper and reaps everything)
        return self.returncode

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


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


def start(plan: Plan, meanwhile: Optional[Callable[[], None]] = None) -> Started:
    """Launch the child and complete the handshake. Raises LayerUnavailable
    when a required layer is missing; the child is then already gone.

    ``meanwhile`` runs right after the fork, while the child confines itself
    (its status is waited for afterwards); if it raises, the child is killed."""
    from pipguard import _child  # imported before fork: the child must import nothing

    parent_sock, child_sock = socket.socketpair()
    config = {
        "control_fd": child_sock.fileno(),
        "cwd": plan.cwd,
        "executable": plan.executable,
        "argv": list(plan.argv),
        "env": plan.env,
        "os_spec": plan.os_spec.to_json() if plan.os_spec else None,
        "os_required": plan.os_required,
    }
    sys.stdout.flush()
    sys.stderr.flush()
    # fork, not a second interpreter: the child is a copy of this process with
    # every module loaded (about 40 ms less per sandbox start, see
    # docs/performance.md). pipguard is single-threaded here.
    pid = os.fork()
    if pid == 0:  # child: confine and exec, never return
        try:
            parent_sock.close()
            _child.confine_and_exec(config)
        finally:
            os._exit(127)
    child_sock.close()
    process = ChildProcess(pid)
    try:
        if meanwhile is not None:
            try:
                meanwhile()
            except BaseException:
                process.kill()
                process.wait()
                raise
        line = _read_line(parent_sock)
        if not line:
            process.wait()
            raise PipguardError(f"the sandbox launcher exited early (status {process.returncode})")
        status = json.loads(line)
        if "error" in status:
            process.wait()
            raise LayerUnavailable(status["error"], hint=status.get("hint"))
        listener = None
        unavailable = dict(status.get("unavailable", {}))
        applied = tuple(status.get("applied", ()))
        if status.get("listener_fd") is not None:
            try:
                listener = notify.take_fd(process.pid, int(status["listener_fd"]))
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
        parent_sock.sendall(b"k")
        syscalls = {int(nr): str(name) for nr, name in (status.get("syscalls") or {}).items()}
        return Started(process, listener, applied, unavailable, int(status.get("landlock_abi", 0)),
                       syscalls)
    finally:
        parent_sock.close()


def _read_line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data.strip()
