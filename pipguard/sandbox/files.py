"""Files written: which files a run created or changed in its writable roots,
with sha256 and size. A snapshot/diff of metadata (cheap: one ``lstat`` per
file) before and after; only new or changed files are hashed."""

from __future__ import annotations

import os
import stat
from typing import Dict, Iterable, Iterator, List, Optional, Set, Tuple

from pipguard.report.model import FileWritten

Snapshot = Dict[str, Tuple[int, int, int]]
_MAX_FILES = 200_000


def walk(top: str, missed: Optional[List[str]] = None) -> Iterator[Tuple[str, List[str], List[str]]]:
    """``os.walk(top)`` (top-down, links to directories listed among the
    directories but not followed, unreadable directories skipped; prune by
    editing the list) without recursion: before Python 3.12 ``os.walk``
    recurses, and a build that left a tree ~1000 directories deep ended
    pipguard with ``RecursionError`` and lost the run's evidence (review of
    the eleventh session). ``missed``: where given, each directory that could
    not be listed (a path longer than ``PATH_MAX`` that a build made by
    renaming, one it made unreadable) is appended to it — except a directory
    of ours that a run left unreadable to its owner (makepkg's ``pkg/``, mode
    0111, after a failed build): that one is made listable (``u+rx``) and
    listed, the run being over (``missed`` is the after-run walk's)."""
    stack = [top]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as entries:
                listed = list(entries)
        except FileNotFoundError:
            continue
        except OSError as exc:
            repaired = _listed_after_repair(directory) if missed is not None and isinstance(
                exc, PermissionError) else None
            if repaired is None:
                if missed is not None and directory != top:
                    missed.append(f"{directory[:200]}: {exc.strerror}")
                continue
            listed = repaired
        dirnames: List[str] = []
        filenames: List[str] = []
        real_dirs: Set[str] = set()
        for entry in listed:
            try:
                is_dir = entry.is_dir()
                if is_dir and not entry.is_symlink():
                    real_dirs.add(entry.name)
            except OSError:
                is_dir = False
            (dirnames if is_dir else filenames).append(entry.name)
        yield directory, dirnames, filenames
        stack.extend(os.path.join(directory, name) for name in reversed(dirnames) if name in real_dirs)


def _listed_after_repair(directory: str) -> Optional[List["os.DirEntry[str]"]]:
    """The entries of ``directory`` once its owner's read and search bits are
    back, if it is a real directory (no link: opened ``O_NOFOLLOW``) owned by
    this process's user and lacking them; else None."""
    try:
        fd = os.open(directory, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o500 == 0o500:
            return None
        os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(st.st_mode) | 0o500)  # fchmod refuses O_PATH
        with os.scandir(directory) as entries:
            return list(entries)
    except OSError:
        return None
    finally:
        os.close(fd)


def snapshot(roots: Iterable[str], missed: Optional[List[str]] = None) -> Snapshot:
    """(size, mtime_ns, inode) of every regular file under ``roots``
    (``missed``: see :func:`walk`)."""
    out: Snapshot = {}
    for root in roots:
        for dirpath, dirnames, filenames in walk(root, missed):
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


def entries(top: str) -> Iterator[Tuple[str, os.stat_result]]:
    """``top`` and everything below it on the same filesystem, never
    following a symlink (a mount inside a build dir is not part of it).

    Parents before their entries. One ``lstat`` per entry (``DirEntry.stat``)
    and nothing else: the sandbox user's grants and :mod:`pipguard.sandbox.filemodes`
    walk each hook call's trees with it, so its cost is paid per call
    (os.walk's extra stat per directory and path joins were a third more)."""
    try:
        st = os.lstat(top)
    except OSError:
        return
    yield top, st
    if not stat.S_ISDIR(st.st_mode):
        return
    device = st.st_dev
    pending = [top]
    while pending:
        try:
            listing = os.scandir(pending.pop())
        except OSError:
            continue
        with listing:
            for entry in listing:
                try:
                    entry_st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if entry_st.st_dev != device:
                    continue
                if stat.S_ISDIR(entry_st.st_mode):
                    pending.append(entry.path)
                yield entry.path, entry_st


def at_least(roots: Iterable[str], size: int) -> List[Tuple[str, int]]:
    """(path, size) of every regular file under ``roots`` of ``size`` bytes or more: what
    reached the write limit in a root that :func:`snapshot` does not list (a build's own tree);
    one ``lstat`` a file, nothing hashed."""
    out: List[Tuple[str, int]] = []
    for root in roots:
        for dirpath, _dirnames, filenames in walk(root):
            for name in filenames:
                path = os.path.join(dirpath, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode) and st.st_size >= size:
                    out.append((path, st.st_size))
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


#: how deep :func:`left_in` goes, and how many bytes it hashes in all (a run that
#: leaves more, or what it cannot read, has its files "not listed": a finding)
MAX_DEPTH = 128
HASH_BUDGET = 4 << 30
_O_WALK = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)


def left_in(handle: int, shown_as: str, skip: Iterable[str] = ()) -> Tuple[List[FileWritten], List[str]]:
    """The regular files in the filesystem that ``handle`` (an fd on its top
    directory) holds, named as below ``shown_as``, and what could not be
    listed: for the namespace backend's own ``/tmp`` and ``/dev/shm``, which
    start empty and are gone after the run (``discarded``), so every file
    there was written by it. Walked from directory descriptors, without
    recursion (no path is ever too long, no tree too deep to crash us), each
    entry opened with ``O_NOFOLLOW | O_NONBLOCK`` and checked to be the
    regular file ``lstat`` saw; stays on that filesystem (a bind mounted
    inside is a grant, snapshotted as such). Leaves out what pipguard
    mounted there once the namespace is gone: an *empty* entry at a path of
    ``skip``. Returns (files, [why each thing was not listed]); never raises."""
    skipped = {os.path.normpath(p) for p in skip}
    out: List[FileWritten] = []
    missed: List[str] = []
    budget = HASH_BUDGET
    try:
        top = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=handle)
    except OSError as exc:
        return out, [f"{shown_as}: {exc.strerror}"]
    device = os.fstat(top).st_dev
    # (directory fd, its path as shown, its depth, the names left to look at)
    stack: List[Tuple[int, str, int, List[str]]] = []
    try:
        try:
            stack.append((top, shown_as, 0, sorted(os.listdir(top), reverse=True)))
        except OSError as exc:
            os.close(top)
            return out, [f"{shown_as}: {exc.strerror}"]
        while stack:
            fd, shown_dir, depth, names = stack[-1]
            if not names:
                os.close(fd)
                stack.pop()
                continue
            name = names.pop()
            shown = shown_dir.rstrip("/") + "/" + name
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError as exc:
                missed.append(f"{shown}: {exc.strerror}")
                continue
            if st.st_dev != device or not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                continue  # a grant bound here, a symlink, a fifo: not a file the run left
            if shown in skipped and (st.st_size == 0 or stat.S_ISDIR(st.st_mode)):
                if not stat.S_ISDIR(st.st_mode) or not _has_entries(fd, name):
                    continue  # pipguard's own mount point
            try:
                child = os.open(name, _O_WALK | (os.O_DIRECTORY if stat.S_ISDIR(st.st_mode) else 0), dir_fd=fd)
            except OSError as exc:
                missed.append(f"{shown}: {exc.strerror}")
                continue
            opened = os.fstat(child)
            if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
                os.close(child)
                missed.append(f"{shown}: changed while it was listed")
                continue
            if stat.S_ISDIR(opened.st_mode):
                if depth + 1 > MAX_DEPTH:
                    os.close(child)
                    missed.append(f"{shown}: deeper than {MAX_DEPTH} directories")
                    continue
                try:
                    entries = sorted(os.listdir(child), reverse=True)
                except OSError as exc:
                    os.close(child)
                    missed.append(f"{shown}: {exc.strerror}")
                    continue
                stack.append((child, shown, depth + 1, entries))
                continue
            try:
                if opened.st_size > budget:
                    missed.append(f"{shown}: not hashed ({opened.st_size} bytes, over the run's budget)")
                    out.append(FileWritten(shown, "", opened.st_size, discarded=True))
                    continue
                budget -= opened.st_size
                out.append(FileWritten(shown, _sha256_fd(child), opened.st_size, discarded=True))
            except OSError as exc:
                missed.append(f"{shown}: {exc.strerror}")
            finally:
                os.close(child)
            if len(out) >= _MAX_FILES:
                missed.append(f"{shown_as}: more than {_MAX_FILES} files")
                break
    except Exception as exc:  # noqa: BLE001 - evidence, not a crash: say what stopped us
        missed.append(f"{shown_as}: the listing stopped: {type(exc).__name__}: {exc}")
    finally:
        for fd, *_rest in stack:
            os.close(fd)
    return out, missed


def _has_entries(dir_fd: int, name: str) -> bool:
    try:
        fd = os.open(name, _O_WALK | os.O_DIRECTORY, dir_fd=dir_fd)
    except OSError:
        return True
    try:
        return bool(os.listdir(fd))
    except OSError:
        return True
    finally:
        os.close(fd)


def _sha256_fd(fd: int) -> str:
    import hashlib

    digest = hashlib.sha256()
    while True:
        block = os.read(fd, 1 << 20)
        if not block:
            return digest.hexdigest()
        digest.update(block)


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
        try:
            shutil.rmtree(top, onerror=reopen)
        except RecursionError:
            break  # a tree deeper than the interpreter's recursion (rmtree recurses)
        except OSError:
            pass
    if os.path.lexists(top):
        # coreutils walks any depth with descriptors (fts), never following links
        import subprocess

        with open(os.devnull, "wb") as null:
            subprocess.run(["chmod", "-R", "u+rwX", "--", top], stdout=null, stderr=null, check=False)
            subprocess.run(["rm", "-rf", "--one-file-system", "--", top], stdout=null, stderr=null, check=False)
