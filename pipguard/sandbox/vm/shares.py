"""The host's directories in the guest, and what the guest leaves in them: the shares of a
run (:class:`Share`, :func:`shares_of`: one per root, shallowest first), the copy of the granted
``/etc`` entries the guest gets instead of the host's (:func:`stage_etc`), the host's system
directories and top-level symlinks (:func:`system_layout`), and the read-write shares' files
left as the host's own after the run (:func:`settle_mapped`: QEMU's mapped-xattr attributes).

Starts no process. Imports the one walk of a tree (:mod:`pipguard.sandbox.files`), the path
rules' ``SYSTEM_READ`` (when called) and the standard library.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

from pipguard.sandbox.files import walk


@dataclass(frozen=True)
class Share:
    """One host directory in the guest, at the same path."""

    path: str
    writable: bool


def shares_of(read: Sequence[str], write: Sequence[str]) -> List[Share]:
    """One share per root, shallowest first; a root inside a share of the
    same kind is left out (the guest sees it through the outer one)."""
    wanted: Dict[str, bool] = {}
    for path in read:
        if os.path.isdir(path) and not os.path.islink(path):
            wanted.setdefault(os.path.realpath(path), False)
    for path in write:
        wanted[os.path.realpath(path)] = True
    out: List[Share] = []
    for path in sorted(wanted, key=lambda p: (p.count("/"), p)):
        parents = [s for s in out if path.startswith(s.path.rstrip("/") + "/")]
        nearest = max(parents, key=lambda s: len(s.path), default=None)
        if nearest is not None and nearest.writable == wanted[path]:
            continue
        out.append(Share(path, wanted[path]))
    return out


def stage_etc(dest: str, entries: Sequence[str]) -> None:
    """Copy the granted entries of /etc (symlinks as symlinks); unreadable
    ones are left out."""
    os.makedirs(dest, exist_ok=True)
    for src in entries:
        target = os.path.join(dest, os.path.relpath(src, "/etc"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        try:
            if os.path.islink(src):
                os.symlink(os.readlink(src), target)
            elif os.path.isdir(src):
                shutil.copytree(src, target, symlinks=True, ignore_dangling_symlinks=True)
            elif os.path.isfile(src):
                shutil.copy2(src, target)
        except (OSError, shutil.Error):
            continue


def system_layout() -> Tuple[List[str], List[Tuple[str, str]]]:
    """The host's top-level system directories to share, and its top-level
    symlinks (``/bin -> usr/bin`` on merged-/usr systems) to recreate."""
    from pipguard.rules import SYSTEM_READ

    dirs, links = [], []
    for path in SYSTEM_READ:
        if path in ("/proc", "/sys"):
            continue  # the guest has its own
        if os.path.islink(path) and path.count("/") == 1:
            links.append((path, os.readlink(path)))
        elif os.path.isdir(path):
            dirs.append(path)
    return dirs, links


#: the attributes QEMU's mapped-xattr model keeps a guest's owner, mode and file type in
MAPPED_PREFIX = "user.virtfs."


MAPPED_MODE = MAPPED_PREFIX + "mode"


def settle_mapped(root: str) -> None:
    """Leave what the guest made under ``root`` as the host's own files,
    then remove QEMU's mapped attributes (without following symlinks): the
    next VM must see the files as the host does.

    A regular file or directory gets the guest's permission bits (a built
    binary stays executable), as the plain backend would leave them: when
    pipguard runs as root (QEMU's files are root's) without setuid, setgid
    and world-write, so that a guest root cannot plant a setuid-root file. A
    symlink, device node, fifo or socket stays the regular file QEMU made (a
    symlink's holds its target): never turned into the real thing on the host."""
    strip_bits = 0o6002 if os.geteuid() == 0 else 0

    def settle(path: str) -> None:
        try:
            names = [n for n in os.listxattr(path, follow_symlinks=False) if n.startswith(MAPPED_PREFIX)]
            if MAPPED_MODE in names:
                raw = os.getxattr(path, MAPPED_MODE, follow_symlinks=False)
                mode = int.from_bytes(raw[:4], "little")  # QEMU stores it as le32
                kind = os.lstat(path).st_mode
                if len(raw) >= 4 and stat.S_IFMT(mode) == stat.S_IFMT(kind) and \
                        (stat.S_ISREG(kind) or stat.S_ISDIR(kind)):
                    # a regular file or directory by lstat, and QEMU is gone: no guest swaps it now
                    os.chmod(path, stat.S_IMODE(mode) & ~strip_bits)
            for name in names:
                os.removexattr(path, name, follow_symlinks=False)
        except OSError:
            pass  # gone, or a filesystem without xattrs (then QEMU kept none either)

    # bottom-up: a directory the guest made 0500 is walked before it gets that mode
    for top, dirs, names in reversed(list(walk(root))):  # children before their parent
        for name in (*dirs, *names):
            settle(os.path.join(top, name))
    settle(root)
