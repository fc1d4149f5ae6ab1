"""A build's tree read as pipguard reads it: never through a link, never blocking on a FIFO,
never more than a limit (:func:`read_regular`), and one entry of it recorded as it is
(:class:`Entry`, :func:`entry_at`) and removed without following links (:func:`remove_entry`).
The source-tree guard (:mod:`srcguard`) and the project-tree check (:mod:`projecttree`) both
record and compare these entries; they run unsandboxed, after the build, on what it left.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Optional, Tuple

#: entries of the source tree's root whose contents run commands
VCS_ROOTS = (".git", ".hg")
#: a file larger than this is not copied whole (a hooks directory of that size is not git's)
MAX_FILE = 1024 * 1024
#: the rule a change to a version-control entry breaks
VCS_RULE = "vcs-tamper"


@dataclass(frozen=True)
class Entry:
    """One protected path, relative to the source tree: ``kind`` is ``file``, ``dir``,
    ``link``, ``other`` or ``absent``; ``content`` the bytes of a file (or a link's target)."""

    rel: str
    kind: str
    mode: int = 0
    content: bytes = b""
    vcs: bool = True
    #: the rule a change to it breaks (:data:`VCS_RULE`, or a project-tree rule)
    rule: str = VCS_RULE
    #: for an entry kept by its stat only (no copy): what the project-tree check's stat saw; compared instead of
    #: ``content``, and never put back (a changed one is reported and left as it is)
    stamp: Tuple[int, ...] = ()


def read_regular(path: str, limit: int = MAX_FILE) -> Optional[bytes]:
    """The bytes of ``path`` if it is a regular file (not through a symlink, never
    blocking on a FIFO), at most ``limit`` bytes; None otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, size = [], 0
        while size < limit:
            chunk = os.read(fd, min(65536, limit - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def entry_at(root: str, rel: str, vcs: bool) -> Entry:
    path = os.path.join(root, rel)
    try:
        st = os.lstat(path)
    except OSError:
        return Entry(rel, "absent", vcs=vcs)
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        try:
            return Entry(rel, "link", mode, os.fsencode(os.readlink(path)), vcs)
        except OSError:
            return Entry(rel, "other", mode, vcs=vcs)
    if stat.S_ISDIR(st.st_mode):
        return Entry(rel, "dir", mode, vcs=vcs)
    if stat.S_ISREG(st.st_mode):
        data = read_regular(path) if vcs else None
        return Entry(rel, "file", mode, data or b"", vcs)
    return Entry(rel, "other", mode, vcs=vcs)


def remove_entry(path: str) -> None:
    try:
        st = os.lstat(path)
    except OSError:
        return
    if stat.S_ISDIR(st.st_mode):
        from pipguard.sandbox.files import remove_tree

        remove_tree(path)  # does not follow links inside; any depth (a build made this tree)
    else:
        try:
            os.unlink(path)
        except OSError:
            pass
