"""Who runs makepkg: never root.

makepkg refuses uid 0 (and rightly: a PKGBUILD running as root can do
anything capabilities do not cover, and owns every root-owned file). When
pipguard runs as root, the whole review — pipguard's supervisor and the
sandboxed makepkg under it — runs in a forked worker that has switched to a
dedicated unprivileged uid; otherwise it runs as the caller.

This is the bridge until the sandbox itself drops root for every command
(issue 12): then :func:`run_as_build_user` shrinks to calling ``work()``.

Why a dedicated uid and not ``nobody``: other services run as ``nobody``;
an id no account and no process has means the build can read nothing
anyone owns except what pipguard prepared for it, and nothing else on the
host runs with its identity.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict

from pipguard.errors import PipguardError
from pipguard.sandbox.sandbox_user import switch_to

#: Just below systemd's dynamic-user range (61184-65519), which systemd hands
#: out at run time; the first of these that no account, group or process uses.
CANDIDATE_IDS = tuple(range(61183, 61183 - 32, -1))


@dataclass(frozen=True)
class BuildUser:
    uid: int
    gid: int
    dropped: bool  # True: pipguard ran as root and switched to this uid

    def to_json(self) -> Dict[str, object]:
        return {"uid": self.uid, "gid": self.gid, "dropped_from_root": self.dropped}


def choose() -> BuildUser:
    """The caller itself when not root; else the first free dedicated id."""
    if os.geteuid() != 0:
        return BuildUser(os.geteuid(), os.getegid(), False)
    used = _ids_in_use()
    for candidate in CANDIDATE_IDS:
        if candidate not in used:
            return BuildUser(candidate, candidate, True)
    raise PipguardError("no free uid for the build user",
                        hint=f"uids {CANDIDATE_IDS[-1]}-{CANDIDATE_IDS[0]} are all in use; run pipguard as a normal user")


def _ids_in_use() -> set:
    used = {e.pw_uid for e in pwd.getpwall()} | {e.pw_gid for e in pwd.getpwall()}
    used |= {e.gr_gid for e in grp.getgrall()}
    try:
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    used.add(os.stat(f"/proc/{name}").st_uid)
                except OSError:
                    pass
    except OSError:
        pass
    return used


def chown_for(user: BuildUser, *paths: str) -> None:
    """Give ``paths`` (directories pipguard made for the build) to the build user."""
    if user.dropped:
        for path in paths:
            os.chown(path, user.uid, user.gid)


def run_as_build_user(user: BuildUser, work: Callable[[], Dict[str, Any]],
                      preload: Callable[[], None]) -> Dict[str, Any]:
    """Run ``work()`` (returns JSON-able data) as ``user`` and return its data.

    Not dropped: a plain call. Dropped: in a forked worker. The worker cannot
    import anything the build user may not read (pipguard may live under
    ``/root``), so ``preload()`` imports every module the review needs before
    the fork. The result comes back as JSON over a pipe: plain data, never
    code, so even a compromised worker can only lie, not run code as root.
    Exceptions in the worker come back as :class:`PipguardError` with their message.
    """
    if not user.dropped:
        return work()
    preload()
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the worker: drop, work, write, exit — never return
        code = 0
        try:
            os.close(read_fd)
            payload: Dict[str, Any]
            try:
                _drop(user)
                payload = {"ok": work()}
            except PipguardError as exc:
                payload = {"error": exc.message, "hint": exc.hint, "exit_code": exc.exit_code}
            except KeyboardInterrupt:
                payload = {"error": "interrupted", "hint": None, "exit_code": 130}
            except BaseException as exc:  # noqa: BLE001 - reported to the parent, which decides
                payload = {"error": f"the review failed: {type(exc).__name__}: {exc}",
                           "hint": "this is probably a bug in pipguard: please report it", "exit_code": 2}
            data = json.dumps(payload, default=str).encode()
            view = memoryview(data)
            while view:
                view = view[os.write(write_fd, view):]
        except BaseException:  # noqa: BLE001
            code = 70
        finally:
            os._exit(code)
    os.close(write_fd)
    chunks = []
    with os.fdopen(read_fd, "rb") as fh:
        while True:
            chunk = fh.read(1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    try:
        received: Any = json.loads(b"".join(chunks) or b"null")
    except ValueError:
        received = None
    if not isinstance(received, dict):
        raise PipguardError(f"the review's worker (uid {user.uid}) ended without a result "
                            f"(status {os.waitstatus_to_exitcode(status)})")
    if "error" in received:
        hint = received.get("hint")
        error = PipguardError(str(received["error"]), str(hint) if hint else None)
        error.exit_code = int(received.get("exit_code") or 2)
        raise error
    return dict(received["ok"])


def _drop(user: BuildUser) -> None:
    switch_to(user.uid, user.gid)
