"""Files written: which files a run created or changed in its writable roots,
with sha256 and size. A snapshot/diff of metadata (cheap: one ``lstat`` per
file) before and after; only new or changed files are hashed."""

from __future__ import annotations

import os
import stat
from typing import Dict, Iterable, List, Tuple

from pipguard.report import FileWritten

Snapshot = Dict[str, Tuple[int, int, int]]
_MAX_FILES = 200_000


def snapshot(roots: Iterable[str]) -> Snapshot:
    """(size, mtime_ns, inode) of every regular file under ``roots``."""
    out: Snapshot = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in filenames:
                path = os.path.join(dirpath, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    out[path] = (st.st_size, st.st_mtime_ns, st.st_ino)
                if len(out) >= _MAX_FILES:
                    return out
    return out


def sha256(path: str) -> str:
    import hashlib  # not at start-up: loading OpenSSL costs ~2 ms, most runs write nothing

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def changed(before: Snapshot, after: Snapshot) -> List[FileWritten]:
    out = []
    for path, meta in sorted(after.items()):
        if before.get(path) == meta:
            continue
        try:
            out.append(FileWritten(path, sha256(path), meta[0]))
        except OSError:
            continue
    return out


def left_in(handle: int, shown_as: str, skip: Iterable[str] = ()) -> List[FileWritten]:
    """The regular files in the filesystem that ``handle`` (an fd on its top
    directory) holds, named as below ``shown_as``: for the namespace backend's
    own ``/tmp`` and ``/dev/shm``, which start empty and are gone after the
    run (``discarded``), so every file there was written by it. Stays on that
    filesystem (a bind mounted inside is a grant, snapshotted as such) and
    leaves out ``skip``, the paths (as shown) where pipguard mounted something:
    once the namespace is gone, the mount points it made there show. Never raises."""
    top = f"/proc/self/fd/{handle}"
    skipped = {os.path.normpath(p) for p in skip}
    try:
        device = os.stat(top).st_dev
    except OSError:
        return []
    out: List[FileWritten] = []
    for dirpath, dirnames, filenames in os.walk(top):
        shown_dir = shown_as + dirpath[len(top):]
        for name in list(dirnames):
            path = os.path.join(dirpath, name)
            try:
                other = os.lstat(path).st_dev != device
            except OSError:
                other = True
            if other or os.path.join(shown_dir, name) in skipped:
                dirnames.remove(name)
        for name in filenames:
            path = os.path.join(dirpath, name)
            shown = os.path.join(shown_dir, name)
            try:
                st = os.lstat(path)
                if not stat.S_ISREG(st.st_mode) or st.st_dev != device or shown in skipped:
                    continue
                out.append(FileWritten(shown, sha256(path), st.st_size, discarded=True))
            except OSError:
                continue
            if len(out) >= _MAX_FILES:
                return out
    return out


def remove_tree(top: str) -> None:
    """Remove ``top`` (never following links) even where the sandbox left a
    directory its owner cannot list or enter (``chmod 0111``: without root's
    override a plain ``rmtree`` skips it silently and leaves all below it —
    a setuid program once, review of 2026-12-01). Each pass makes what it
    could not enter the owner's again; a few passes reach any depth seen in
    practice. Never raises."""
    import shutil

    def reopen(func, path, _exc) -> None:
        for entry in (os.path.dirname(path), path):
            try:
                if not os.path.islink(entry) and os.path.isdir(entry):
                    os.chmod(entry, stat.S_IRWXU)
            except OSError:
                pass

    for _ in range(16):
        if not os.path.lexists(top):
            return
        shutil.rmtree(top, onerror=reopen)
