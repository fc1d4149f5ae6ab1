"""Run a subprocess as the unprivileged ``nobody`` user (uid/gid 65534)."""
from __future__ import annotations

import contextlib
import os
import subprocess

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
    """
    from pipguard import acl, sandbox_user

    mode = os.stat(path).st_mode
    if mode & 0o001:
        yield
        return
    with sandbox_user.acl_lock():
        had = acl.grant_user(path, uid, sandbox_user.X)
    try:
        yield
    finally:
        with sandbox_user.acl_lock():
            acl.revoke_user(path, uid, had)
