"""Run a subprocess as the unprivileged ``nobody`` user (uid/gid 65534)."""
from __future__ import annotations

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
