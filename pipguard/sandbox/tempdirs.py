"""pipguard's directories in the temp dir (a run's ``pipguard-XXXX``, the seam's
``pipguard-seam-XXXX``), each owned for its life by a lock, and the sweep of those whose
owner is gone.

A pipguard that is killed (SIGKILL, the OOM killer, a CI runner's timeout) cannot remove
what it made: each run left its directory (the event FIFO, the decoy home, the sandbox's
temp dir) and each install the seam's. Ownership is an ``flock`` on a file in the
directory (:data:`LOCK_NAME`), taken when the directory is made and held on a descriptor
of the process that made it until the directory is removed: the kernel drops it when that
process dies, whatever killed it. The descriptor is close-on-exec, and the processes
pipguard forks (the keeper, the sandbox's first process) close every descriptor they did
not bring, so no other process keeps a dead run's lock.

The sweep (:func:`sweep`, once per process) removes a directory only when all of these
hold: its name is one of pipguard's, it is a directory of this uid (not a link), its lock
file exists and the lock can be taken (its owner is gone), and it was last changed more
than :data:`SETTLED` seconds ago (the moment between the directory's creation and its
lock is never mistaken for a dead owner). A live run's directory is never removed: its
lock is held. A directory without a lock file (made by an older pipguard) is left alone.
The lock is held while the sweep removes the tree, so two sweeps never race on one.
"""

from __future__ import annotations

import fcntl
import os
import stat
import tempfile
import time
from typing import Dict, List, Optional, Set

#: the file whose lock the owner of a directory holds
LOCK_NAME = ".pipguard-owner.lock"
#: the names of the directories this module makes and sweeps
PREFIXES = ("pipguard-seam-", "pipguard-")
#: seconds a directory must be unchanged for before the sweep may remove it
SETTLED = 60.0

#: directory -> the descriptor holding its lock, for the directories this process owns
_held: Dict[str, int] = {}
#: parents swept already by this process
_swept: Set[str] = set()


def make(prefix: str, parent: Optional[str] = None) -> str:
    """A new private (0700) directory named ``prefix`` + random in ``parent`` (default: the
    temp dir), owned by this process's lock until :func:`release`."""
    path = tempfile.mkdtemp(prefix=prefix, dir=parent)
    try:
        os.chmod(path, 0o700)
        fd = os.open(os.path.join(path, LOCK_NAME),
                     os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException:
            os.close(fd)
            raise
    except BaseException:
        from pipguard.sandbox.files import remove_tree

        remove_tree(path)
        raise
    _held[path] = fd
    return path


def release(path: str) -> None:
    """The directory is gone (or no longer ours to keep): drop its lock. Idempotent."""
    fd = _held.pop(path, None)
    if fd is not None:
        os.close(fd)


def owned() -> List[str]:
    """The directories this process holds (tests and ``doctor`` read it)."""
    return list(_held)


def sweep(parent: Optional[str] = None) -> List[str]:
    """Remove the directories of dead owners below ``parent`` (default: the temp dir);
    once per process and parent. Returns what it removed. Never raises."""
    parent = parent or tempfile.gettempdir()
    if parent in _swept:
        return []
    _swept.add(parent)
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    removed = []
    for name in names:
        if name.startswith(PREFIXES):
            path = os.path.join(parent, name)
            if path not in _held and _remove_if_abandoned(path):
                removed.append(path)
    return removed


def _remove_if_abandoned(path: str) -> bool:
    try:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mtime > time.time() - SETTLED:
            return False
        fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # gone, not ours to read, or no lock file: not a directory we may judge
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # held: its owner lives
        from pipguard.sandbox.files import remove_tree

        remove_tree(path)  # with the lock held: no other sweep takes it meanwhile
        return not os.path.lexists(path)
    finally:
        os.close(fd)
