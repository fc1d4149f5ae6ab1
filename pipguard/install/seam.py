"""The pipguard end of the install seam: a private channel that the pip
processes of one install use to hand hook calls and gate decisions to pipguard.

The target side is :mod:`pipguard.install._seam.target` (stdlib only, runs in the
target interpreter). One request per connection: a JSON line; one JSON line
answers it -- except a hook request (``"reply": "pipe"``), which carries the
call's stdin/stdout/stderr and the write end of a pipe (SCM_RIGHTS): pip's
process sends it and goes on to start a placeholder that waits on the pipe,
so the answer is the call's message on its stderr and its exit status, one
line, on the pipe.

Who can reach the channel: it is a unix socket in a 0700 directory of
pipguard's uid, and every request carries a random token that only pip's
environment holds. Sandboxed processes cannot create unix sockets (seccomp
denies AF_UNIX in every mode) and their environment is built from an
allow-list, so neither the socket nor the token reaches them.
"""

from __future__ import annotations

import array
import json
import os
import select
import shutil
import socket
import subprocess
import tempfile
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from pipguard.errors import PipguardError, UsageError
from pipguard.report.render.safe import printable

#: what the target interpreter runs: the directory of :mod:`pipguard.install._seam.target`, whose
#: ``__main__.py`` imports it (its cached bytecode: a script would be compiled every start)
TARGET_ENTRY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_seam")
SEAM_VARIABLE = "PIPGUARD_SEAM"
#: the target's descriptor for its first words (:func:`pipguard.install._seam.target.say_hello`)
HELLO_VARIABLE = "PIPGUARD_SEAM_HELLO"
#: what pipguard runs pip under (``--python``): the target's own checks say the same
SUPPORTED = ("cpython", (3, 9))
#: a request larger than this is not from our client
MAX_REQUEST = 16 * 1024 * 1024

Handler = Callable[[dict, List[int]], dict]


def target_python(python: Optional[str]) -> str:
    """The interpreter whose pip runs (``--python``; None: pipguard's own), checked."""
    import sys

    resolved = os.path.abspath(python) if python else sys.executable
    if not (os.path.isfile(resolved) and os.access(resolved, os.X_OK)):
        raise UsageError(f"--python {python}: not an executable interpreter")
    return resolved


def pip_arguments(pip_args: Sequence[str], binary_only: bool) -> List[str]:
    """What pip gets after ``pip install``: the user's arguments, and without
    ``--sandbox`` (no package code may run at all) ``--only-binary :all:``."""
    return [*pip_args, *(("--only-binary", ":all:") if binary_only else ())]


class PipProcess:
    """The target interpreter's pip running ``pip install ARGS`` with the seam
    (:mod:`pipguard.install._seam.target`), and the server its requests come to.

    The CLI starts it before it loads the rest of pipguard and checks its own
    options: pip takes half a second to its first request, which waits for
    pipguard on the socket, and the 20-30 ms of pipguard's imports and option
    checks went before pip's start on every install (docs/performance.md).
    Nothing of pip's can happen before pipguard answers: a hook call, a
    source tree's facts and the wheels' gate are all requests. If pipguard's
    own options then fail, :meth:`abandon` ends pip before it did anything."""

    def __init__(self, python: str, pip_args: Sequence[str], env: Mapping[str, str],
                 stdout: Optional[int] = None) -> None:
        from pipguard.install._seam.credentials import isolated, move_credentials

        args = list(pip_args)
        # credentials in -i/--extra-index-url/-f URLs: into pip's environment, not its argv
        moved, moved_env = move_credentials(args, dict(env))
        if moved != args and isolated(args):
            raise UsageError("--isolated with credentials in an index, find-links or proxy URL: pipguard "
                             "keeps those off pip's command line (any process may read it) by passing them "
                             "in PIP_* variables, which --isolated makes pip ignore (it would use another "
                             "index)", hint="drop --isolated, or give the credentials in a netrc or "
                             "keyring instead of the URL")
        self.python = python
        self._said: Optional[Tuple[str, Tuple[int, int]]] = None
        self.server = SeamServer()
        # who answers: the target's first words (target.say_hello); nothing from a program
        # that is not a Python running pipguard's seam
        self._hello_read, hello_write = os.pipe()
        try:
            self.proc = subprocess.Popen([python, TARGET_ENTRY, "pip", "install", *moved],
                                         env={**moved_env, SEAM_VARIABLE: self.server.env_value,
                                              HELLO_VARIABLE: str(hello_write)},
                                         stdout=stdout, pass_fds=(hello_write,))
        except BaseException:
            self.server.close()
            os.close(self._hello_read)
            raise
        finally:
            os.close(hello_write)

    def interpreter(self) -> Optional[Tuple[str, Tuple[int, int]]]:
        """(implementation, (major, minor)) of the interpreter that ran pip, once pip has
        exited; None when it never ran pipguard's seam (not a Python: ``/bin/true``)."""
        if self._hello_read < 0:
            return self._said
        try:
            os.set_blocking(self._hello_read, False)
            words = os.read(self._hello_read, 200).decode("ascii", "replace").split()
        except OSError:  # nothing written (EAGAIN: something still holds the pipe)
            words = []
        finally:
            os.close(self._hello_read)
            self._hello_read = -1
        self._said = None
        if len(words) == 2 and words[1].count(".") == 1 and words[1].replace(".", "").isdigit():
            major, minor = words[1].split(".")
            self._said = (words[0], (int(major), int(minor)))
        return self._said

    def abandon(self) -> None:
        """End pip (pipguard will not serve it) and the server. Idempotent."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.server.close()
        if self._hello_read >= 0:
            os.close(self._hello_read)
            self._hello_read = -1


#: seconds without a request after which :meth:`SeamServer.serve` does a step of idle work
QUIET = 0.01


class SeamServer:
    """Listens on the private socket; :meth:`serve` answers requests until the
    pip process ends. Single-threaded: sandboxes fork from this thread."""

    def __init__(self) -> None:
        from pipguard.sandbox import tempdirs

        # owned by this process's lock: if pipguard is killed, a later one removes it
        self.directory = tempdirs.make("pipguard-seam-", _socket_parent())
        self.path = os.path.join(self.directory, "seam.sock")
        # os.urandom is what secrets.token_hex reads; the secrets module would
        # import hmac and OpenSSL (~15 ms) before pip can start
        self.token = os.urandom(24).hex()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        os.chmod(self.path, 0o600)
        self._listener.listen(8)
        self._listener.set_inheritable(False)

    @property
    def env_value(self) -> str:
        return f"{self.path} {self.token}"

    def serve(self, pid: int, handlers: Dict[str, Handler],
              idle: Optional[Callable[[], bool]] = None) -> None:
        """Answer requests until process ``pid`` (pip) exits. Returns without
        reaping it (the caller waits for its status). ``idle`` is called once
        no request came for :data:`QUIET` seconds (after an answer went out:
        the place for work the next request can use), again and again while it
        returns True (one step of work each) and still no request waits: a
        request that arrives meanwhile waits for one step only. Why the quiet
        time first: pip's next request usually follows an answer within ~5 ms
        (measured), and a step of clean-up (a run directory's removal, 3-10 ms)
        done then would delay it."""
        pidfd = _pidfd(pid)
        try:
            while True:
                watched = [self._listener] + ([pidfd] if pidfd is not None else [])
                ready = select.select(watched, [], [], QUIET)[0] if idle is not None else []
                while not ready and idle is not None and idle():
                    ready = select.select(watched, [], [], 0)[0]
                if not ready:
                    ready, _, _ = select.select(watched, [], [], None if pidfd is not None else 0.2)
                if self._listener in ready:
                    self._one(handlers)
                    continue
                if pidfd is not None and pidfd in ready:
                    return
                if pidfd is None and _exited(pid):
                    return
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def _one(self, handlers: Dict[str, Handler]) -> None:
        conn, _ = self._listener.accept()
        fds: List[int] = []
        try:
            conn.settimeout(30)
            request, fds = _receive(conn)
            from hmac import compare_digest  # after pip started: off the critical path

            if not compare_digest(str(request.get("token", "")).encode("utf-8", "surrogateescape"),
                                  self.token.encode()):
                answer = {"error": "bad token"}
            else:
                handler = handlers.get(str(request.get("type")))
                answer = handler(request, fds) if handler else {"error": "unknown request"}
            if isinstance(answer.get("message"), str):
                # pip prints it as it is (a failed call's output, an InstallationError), and
                # it can quote a package's name, version, paths: one line, escaped
                answer = dict(answer, message=printable(answer["message"]))
            if request.get("reply") == "pipe" and len(fds) == 4:
                _answer_by_pipe(answer, fds[2], fds[3])
            else:
                conn.sendall((json.dumps(answer) + "\n").encode())
        except (OSError, ValueError):
            pass  # the requester went away; its pip reports the failed call
        finally:
            for fd in fds:
                os.close(fd)
            conn.close()

    def close(self) -> None:
        """Stop listening and remove the socket's directory. Idempotent."""
        from pipguard.sandbox import tempdirs

        self._listener.close()
        shutil.rmtree(self.directory, ignore_errors=True)
        tempdirs.release(self.directory)
        tempdirs.sweep(os.path.dirname(self.directory))  # seams and runs of killed pipguards


#: sun_path holds 108 bytes with its NUL; the directory's random part and "/seam.sock" follow
_SOCKET_PARENT_MAX = 107 - len("/pipguard-seam-XXXXXXXX/seam.sock")


def _socket_parent() -> Optional[str]:
    """The temp directory, unless a socket below it would not fit in a unix
    socket address (a long TMPDIR): then /tmp, as ssh-agent and tmux do."""
    parent = tempfile.gettempdir()
    if len(os.fsencode(parent)) <= _SOCKET_PARENT_MAX:
        return None
    return "/tmp"


def _receive(conn: socket.socket) -> Tuple[dict, List[int]]:
    fds: List[int] = []
    data = b""
    first = True
    while not data.endswith(b"\n"):
        if first:
            chunk, ancdata, _flags, _addr = conn.recvmsg(65536, socket.CMSG_SPACE(4 * 4))
            for level, kind, payload in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    got = array.array("i")
                    got.frombytes(payload[: len(payload) - (len(payload) % got.itemsize)])
                    fds.extend(got)
            first = False
        else:
            chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_REQUEST:
            raise ValueError("request too large")
    try:
        return json.loads(data), fds
    except ValueError:
        for fd in fds:
            os.close(fd)
        raise


def _answer_by_pipe(answer: dict, stderr_fd: int, pipe_fd: int) -> None:
    """A hook call's answer to its placeholder: the message on the call's
    stderr (where pip shows the call's output), then the exit status on the pipe."""
    message = answer.get("message") or answer.get("error")
    if message:
        _write_all(stderr_fd, (str(message).rstrip("\n") + "\n").encode("utf-8", "replace"))
    try:
        status = int(answer.get("exit", 1))
    except (TypeError, ValueError):
        status = 1
    if not 0 <= status <= 255:
        status = 1  # never a success by accident
    _write_all(pipe_fd, f"{status}\n".encode())


def _write_all(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        pass  # pip stopped reading (Ctrl-C): the placeholder's own end decides


def _pidfd(pid: int) -> Optional[int]:
    try:
        return os.pidfd_open(pid)  # Linux >= 5.3, Python >= 3.9
    except (AttributeError, OSError):
        return None


def _exited(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


class ChannelError(PipguardError):
    """The seam could not be set up."""
