"""Start the sandboxed command: a fresh interpreter runs :mod:`pipguard._child`,
which confines itself and execs the command; we collect its layer status and
take its seccomp listener fd."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import pipguard
from pipguard import notify
from pipguard.errors import KernelError, LayerUnavailable, PipguardError
from pipguard.plan import Plan

_PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(pipguard.__file__)))


def _dependency_paths() -> Tuple[str, ...]:
    """sys.path entries the child needs (pipguard, landlock, pyseccomp) while
    it runs with -I -S (no site-packages, no environment)."""
    paths = [_PKG_PARENT]
    for name in ("landlock", "pyseccomp"):
        try:
            module = __import__(name)
        except ImportError:
            continue
        file = getattr(module, "__file__", "") or ""
        base = os.path.dirname(file)
        if os.path.basename(file) == "__init__.py":
            base = os.path.dirname(base)
        paths.append(base)
    return tuple(dict.fromkeys(paths))


_BOOT = "import sys; sys.path[:0] = {paths!r}; from pipguard._child import main; main(sys.argv[1])"


@dataclass
class Started:
    process: subprocess.Popen
    listener: Optional[int]
    applied: Tuple[str, ...]
    unavailable: Dict[str, str] = field(default_factory=dict)
    landlock_abi: int = 0
    #: nr -> name of the syscalls the child's filter notifies
    syscalls: Dict[int, str] = field(default_factory=dict)


def start(plan: Plan) -> Started:
    """Launch the child and complete the handshake. Raises LayerUnavailable
    when a required layer is missing; the child is then already gone."""
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
    boot = _BOOT.format(paths=list(_dependency_paths()))
    try:
        process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", boot, json.dumps(config)],
            pass_fds=(child_sock.fileno(),), close_fds=True, cwd=plan.cwd,
            env={"PATH": os.defpath}, start_new_session=True,
        )
    finally:
        child_sock.close()
    try:
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
                notify.sync_wake_up(listener)
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
