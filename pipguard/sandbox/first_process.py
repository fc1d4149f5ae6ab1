"""The sandbox's first process: confine itself, then exec the command.

Runs in a child forked by the run's keeper (:mod:`pipguard.sandbox.keeper`), itself
forked from a caller that may have other threads; every module it needs is
imported before the fork, so the child imports nothing and takes no lock
another thread could hold. It always ends in ``execve`` or ``_exit``.

Talks to the parent over one unix socket: it writes the applied-layer status
(one JSON line, with the number of the seccomp listener fd, which the parent
takes with ``pidfd_getfd``) and waits for one byte of acknowledgement. Only
plain ``write``/``read`` are used after seccomp is loaded: ``sendmsg`` is a
notified syscall and nobody would be listening yet.

A first process forked ahead of its run (:func:`pipguard.sandbox.launcher.fork_spare`)
first waits for its config: one JSON line on the control socket, with the
run's stdin, stdout and stderr (SCM_RIGHTS), which become its 0, 1, 2; then it
sets the run's rlimits (what the keeper does for a freshly forked one) and
goes on as one does. Nothing below runs before that config arrived.

Confinement order (an invariant; each step relies on the previous one):
  1. new session (no controlling terminal: no TIOCSTI into the caller's tty)
  2. close every inherited descriptor except stdio and the control socket
  2b. ``--isolation ns``: pipguard.sandbox.backends.ns.forked.enter() makes the namespaces
     and the new root; it returns only in the command's process (pid 2 of
     the new pid namespace), which goes on with step 3 in the new root
  3. chdir to the build dir (before Landlock: the walk needs no grant)
  4. as root: become the run's sandbox user (:mod:`pipguard.sandbox.sandbox_user`),
     also with ``--isolation audit`` — see :func:`become`
  5. oslayer.apply(): no_new_privs -> drop capabilities -> Landlock -> seccomp
  6. hand the listener fd to the supervisor, close the control socket
  6b. the backend's ``before_exec()`` (ns: wait until pid 1, whose fds the launcher
     took at step 6, is not dumpable: the command never sees it dumpable)
  7. execve with the scrubbed environment — the last thing before the command

Running as another uid changes what pipguard may do to us: from step 4 to
the execve we are not dumpable (a uid change sets that), so our /proc files
belong to root and only a process with CAP_SYS_PTRACE may take our listener
fd (``pidfd_getfd`` is a ptrace-attach check) — pipguard, root, has it; the
keeper reaps and kills us as root. The execve makes us dumpable again (all
our uids are equal), so the supervisor's /proc/PID/mem reads keep working,
and /proc/self belongs to the sandbox user as it should.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket

from pipguard.sandbox import backends
from pipguard.sandbox.backends import ns, plain  # noqa: F401 (before fork: backends.load; ns loads all its modules)
from pipguard.errors import PipguardError
from pipguard.sandbox.oslayer import OsLayerSpec, apply, caps, landlock, seccomp  # noqa: F401 (imported before fork)
from pipguard.sandbox.oslayer.seccomp import NOTIFIED


def _send(fd: int, payload: dict) -> None:
    data = (json.dumps(payload) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def become(uid: int, gid: int) -> None:
    """Switch this (root, single-threaded) process to ``uid``/``gid`` with no
    supplementary groups, for good. Order:

    - no_new_privs first: without the OS layer (``--isolation audit``) a
      setuid-root binary would otherwise make us uid 0 again;
    - securebits locked (NOROOT, NO_SETUID_FIXUP, KEEP_CAPS off): needs
      CAP_SETPCAP, so before the switch; NO_SETUID_FIXUP keeps our
      capabilities across setresuid, which we need for the next step;
    - setgroups([]) and setresgid while CAP_SETGID is still there, then
      setresuid (real, effective and saved: no way back);
    - drop every capability, the bounding set included (CAP_SETPCAP is
      still effective thanks to NO_SETUID_FIXUP), and check all of it.
    """
    caps.set_no_new_privs()
    caps.lock_securebits()
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    caps.drop_all()
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid) or os.getgroups():
        raise PipguardError(f"the sandbox user switch to {uid}:{gid} did not stick")


#: a spare's one-byte answer to its config (the launcher reads it before anything else)
SPARE_READY = b"c"
#: the launcher's go, once it holds the listener and the backend's fds
GO = b"k"


def _await_config(control_fd: int) -> dict:
    """A spare's wait for its run (see the module's docstring); exits when
    pipguard goes away first."""
    sock = socket.socket(fileno=control_fd)
    try:
        data, fds, _flags, _addr = socket.recv_fds(sock, 1 << 16, 3)
        while data and not data.endswith(b"\n"):
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            data += chunk
    finally:
        sock.detach()  # the descriptor stays ours: it is the control socket from here on
    if not data.endswith(b"\n") or len(fds) != 3:
        os._exit(0)  # discarded (end of file) or not what the launcher sends: run nothing
    for target, fd in enumerate(fds):
        if fd != target:
            os.dup2(fd, target)
            os.close(fd)
    config = dict(json.loads(data), control_fd=control_fd)
    # The launcher waits for this byte before the run goes on with us: a spare killed while it
    # waited would otherwise take the config into its dying socket, and the run would fail
    # instead of starting on a fresh fork (launcher._hand_over).
    os.write(control_fd, SPARE_READY)
    for resource_id, soft, hard in config.get("rlimits", ()):
        resource.setrlimit(resource_id, (soft, hard))  # inherited by the whole tree
    return config


def confine_and_exec(config: dict) -> None:
    control_fd = int(config["control_fd"])
    if config.get("await_config"):
        config = _await_config(control_fd)
    # Python ignores SIGPIPE and SIGXFSZ; the command must get the defaults
    # (as subprocess's restore_signals does). Caught signals reset on exec.
    for name in ("SIGPIPE", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    try:
        os.setsid()
    except OSError:
        pass  # already a session leader (start_new_session)
    os.closerange(3, control_fd)
    os.closerange(control_fd + 1, 65536)
    was_root = os.geteuid() == 0
    backend = backends.load(config["backend"])
    entered = backend.enter(config["backend_spec"], control_fd)
    os.chdir(config["cwd"])

    status: dict = {"applied": [], "unavailable": {}, "landlock_abi": 0}
    if config.get("run_as"):
        uid, gid = config["run_as"]
        try:
            become(int(uid), int(gid))
        except Exception as exc:  # never run the command as root when a switch was planned
            _send(control_fd, {"error": f"cannot switch to the sandbox user {uid}:{gid}: {exc}"})
            os._exit(125)
    listener = None
    if config.get("os_spec") is not None:
        spec = OsLayerSpec.from_json(config["os_spec"])
        try:
            applied = apply(spec, required=bool(config.get("os_required")))
        except PipguardError as exc:
            _send(control_fd, {"error": str(exc), "hint": exc.hint})
            os._exit(125)
        except Exception as exc:  # a bug or an unexpected kernel answer: never run unconfined
            _send(control_fd, {"error": f"OS layer failed: {exc!r}"})
            os._exit(125)
        status = {"applied": list(applied.applied), "unavailable": dict(applied.unavailable),
                  "landlock_abi": applied.landlock_abi, "syscalls": NOTIFIED}
        listener = applied.listener_fd
    # as root the sandbox is another uid: the leased one, or the namespace backend's own
    if config.get("run_as") or (was_root and os.geteuid() != 0):
        status["applied"] = ["user", *status["applied"]]
    status["listener_fd"] = listener
    if entered is not None:
        status["backend"] = entered
        status["applied"] = [config["backend"], *status["applied"]]  # type: ignore[misc]
    _send(control_fd, status)
    # Wait until the supervisor holds the listener: our own execve below is a
    # notified syscall and would otherwise block on nobody. Anything but the
    # launcher's go (its socket closed: it died) ends us: never run unsupervised.
    if os.read(control_fd, 1) != GO:
        os._exit(125)
    if listener is not None:
        os.close(listener)
    os.close(control_fd)
    backend.before_exec()
    try:
        os.execve(config["executable"], config["argv"], config["env"])
    except OSError as exc:
        # os.write, not sys.stderr: another thread of the caller may have held
        # its lock when we were forked
        os.write(2, f"pipguard: cannot execute {config['executable']}: {exc.strerror}\n".encode())
        os._exit(126 if exc.errno in (13, 8) else 127)

