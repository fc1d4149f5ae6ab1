"""Run a subprocess as the unprivileged ``nobody`` user (uid/gid 65534)."""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import uuid
from pathlib import Path

from .gates import need

NOBODY = 65534


def run_as_nobody(argv, **kw) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, **kw)`` with uid/gid 65534 and no supplementary groups.

    Needs root (skips, or fails under PIPGUARD_REQUIRE_ALL_LAYERS=1, otherwise). A caller's own
    ``preexec_fn`` runs after the switch. ``env`` should be given explicitly (e.g. ``FakeHome.env()``
    of a home made with ``make_fake_home(owner_uid=65534)``); ``cwd`` must be traversable by nobody.
    """
    need("root")
    user_pre = kw.pop("preexec_fn", None)

    def _drop():
        # Order matters: groups and gid first, while we still have CAP_SETGID.
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        if user_pre is not None:
            user_pre()

    kw.setdefault("check", False)
    return subprocess.run(argv, preexec_fn=_drop, **kw)


@contextlib.contextmanager
def traversable_by(path: str, uid: int = NOBODY):
    """Let ``uid`` traverse ``path`` (``x``) for the duration, by an ACL entry naming it.

    Not ``chmod o+x``: that opens ``path`` to every local user, and a ``chmod`` also resets the
    ACL mask, taking away the entries that concurrent pipguard runs (as root, their sandbox users)
    hold on the same directory (``/root`` for a pyenv interpreter). Holds pipguard's ACL lock while
    it changes the ACL, as pipguard does.

    ``nobody`` is one uid for every holder (pytest-xdist workers, concurrent sessions), unlike a
    leased sandbox uid: each holder leaves a lease file (named by its pid) in pipguard's state dir,
    the first one in grants, and the last one out revokes, restoring what was there before the
    first grant. A holder that died without leaving is not counted (its pid is gone).
    """
    from pipguard.sandbox import acl, sandbox_user, uidlease

    mode = os.stat(path).st_mode
    if mode & 0o001:
        yield
        return
    key = hashlib.sha256(f"{uid}:{os.path.realpath(path)}".encode()).hexdigest()[:16]
    holders = Path(sandbox_user.state_dir()) / "tests-traversable" / key
    mine = holders / f"{os.getpid()}-{uuid.uuid4().hex}"
    with uidlease.acl_lock():
        holders.mkdir(parents=True, exist_ok=True)
        if not _live_holders(holders):
            (holders / "had-acl").write_text(str(int(acl.grant_user(path, uid, uidlease.X))))
        mine.touch()
    try:
        yield
    finally:
        with uidlease.acl_lock():
            mine.unlink()
            if not _live_holders(holders):
                had = (holders / "had-acl").read_text() == "1"
                acl.revoke_user(path, uid, had)
                shutil.rmtree(holders, ignore_errors=True)


def _live_holders(holders: Path) -> list:
    """The lease files in ``holders`` whose process is alive; those of dead ones are removed."""
    live = []
    for lease in holders.iterdir():
        pid = lease.name.split("-", 1)[0]
        if not pid.isdigit():
            continue  # had-acl
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            lease.unlink(missing_ok=True)
            continue
        except PermissionError:
            pass
        live.append(lease)
    return live
