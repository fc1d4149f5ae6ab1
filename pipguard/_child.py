"""The sandbox's first process: confine itself, then exec the command.

Runs in a fresh, single-threaded interpreter started by :mod:`pipguard.launcher`
(``python -I -S -c ...``), so nothing of the parent's threads or locks is
inherited. Talks to the parent over one unix socket: it writes the applied-layer status
(one JSON line, with the number of the seccomp listener fd, which the parent
takes with ``pidfd_getfd``) and waits for one byte of acknowledgement. Only
plain ``write``/``read`` are used after seccomp is loaded: ``sendmsg`` is a
notified syscall and nobody would be listening yet.

Confinement order (an invariant; each step relies on the previous one):
  1. new session (no controlling terminal: no TIOCSTI into the caller's tty)
  2. close every inherited descriptor except stdio and the control socket
  3. chdir to the build dir (before Landlock: the walk needs no grant)
  4. oslayer.apply(): no_new_privs -> drop capabilities -> Landlock -> seccomp
  5. hand the listener fd to the supervisor, close the control socket
  6. execve with the scrubbed environment — the last thing before the command
"""

from __future__ import annotations

import json
import os
import sys


def _send(fd: int, payload: dict) -> None:
    data = (json.dumps(payload) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def main(config_text: str) -> None:
    config = json.loads(config_text)
    control_fd = int(config["control_fd"])
    try:
        os.setsid()
    except OSError:
        pass  # already a session leader (start_new_session)
    os.closerange(3, control_fd)
    os.closerange(control_fd + 1, 65536)
    os.chdir(config["cwd"])

    status = {"applied": [], "unavailable": {}, "landlock_abi": 0}
    listener = None
    if config.get("os_spec") is not None:
        from pipguard.errors import PipguardError
        from pipguard.oslayer import OsLayerSpec, apply

        spec = OsLayerSpec.from_json(config["os_spec"])
        try:
            applied = apply(spec, required=bool(config.get("os_required")))
        except PipguardError as exc:
            _send(control_fd, {"error": str(exc), "hint": exc.hint})
            os._exit(125)
        except Exception as exc:  # a bug or an unexpected kernel answer: never run unconfined
            _send(control_fd, {"error": f"OS layer failed: {exc!r}"})
            os._exit(125)
        from pipguard.oslayer.seccomp import NOTIFIED

        status = {"applied": list(applied.applied), "unavailable": dict(applied.unavailable),
                  "landlock_abi": applied.landlock_abi, "syscalls": NOTIFIED}
        listener = applied.listener_fd
    status["listener_fd"] = listener
    _send(control_fd, status)
    # Wait until the supervisor holds the listener: our own execve below is a
    # notified syscall and would otherwise block on nobody.
    os.read(control_fd, 1)
    if listener is not None:
        os.close(listener)
    os.close(control_fd)
    try:
        os.execve(config["executable"], config["argv"], config["env"])
    except OSError as exc:
        sys.stderr.write(f"pipguard: cannot execute {config['executable']}: {exc.strerror}\n")
        os._exit(126 if exc.errno in (13, 8) else 127)


if __name__ == "__main__":
    main(sys.argv[1])
