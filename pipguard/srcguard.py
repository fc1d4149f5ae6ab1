"""What a hook call may not change in the source tree it is given to write.

A hook call runs in its project's source tree and may write it (builds put ``build/``,
``*.egg-info``, generated sources there). For a local project (``pip install .``, ``-e .``)
that tree is the user's checkout, and two kinds of entries in it matter beyond the build:

- **version-control state that runs commands**: ``.git/hooks/*``, ``.git/config``
  (``core.fsmonitor``, ``core.hooksPath``, aliases, filters), a ``.git`` file redirecting to
  another git directory, submodules' config and hooks, ``.hg/hgrc``. Whatever a build writes
  there runs at the user's (or CI's) next ``git``/``hg`` command — outside any sandbox. No
  build writes them (``git describe``/``status`` inside a build touch ``index`` and
  ``objects``, which are not protected).
- **the files pipguard reads itself** (``PKG-INFO``, ``pyproject.toml``, to name the package in
  the report): not sandboxed, so they must stay what they were, not become a FIFO (pipguard
  would block forever) or a symlink to a file the build may not read.

:func:`snapshot` records them before the call, :func:`check_and_restore` compares after it
(when every process of the sandbox is gone), reports each change and puts the
version-control entries back as they were. Landlock cannot take a subdirectory out of a
granted one, so this is detection and repair, not prevention: what was written existed until
the call ended (no sandboxed process runs git meanwhile with the user's hooks — they are
the user's own).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import List, Optional, Tuple

#: entries of the source tree's root whose contents run commands
VCS_ROOTS = (".git", ".hg")
#: inside a git directory (and each ``modules/<name>`` of it): what git executes or configures
GIT_PROTECTED = ("config", "config.worktree", "commondir", "hooks")
#: files pipguard itself reads from the source tree (their type must not change)
READ_BY_PIPGUARD = ("PKG-INFO", "pyproject.toml")
#: a snapshot larger than this is not taken whole (a hooks directory of that size is not git's)
MAX_FILE = 1024 * 1024
MAX_ENTRIES = 2000
#: rules of the problems reported
VCS_RULE = "vcs-tamper"
SOURCE_RULE = "source-tamper"


@dataclass(frozen=True)
class Entry:
    """One protected path, relative to the source tree: ``kind`` is ``file``, ``dir``,
    ``link``, ``other`` or ``absent``; ``content`` the bytes of a file (or a link's target)."""

    rel: str
    kind: str
    mode: int = 0
    content: bytes = b""
    vcs: bool = True


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


def _entry(root: str, rel: str, vcs: bool) -> Entry:
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


def _walk(root: str, rel: str, out: List[Entry]) -> None:
    """``rel`` and, if it is a real directory, everything below it (never through a link)."""
    entry = _entry(root, rel, True)
    out.append(entry)
    if entry.kind != "dir":
        return
    try:
        names = sorted(os.listdir(os.path.join(root, rel)))
    except OSError:
        return
    for name in names:
        if len(out) >= MAX_ENTRIES:
            return
        _walk(root, os.path.join(rel, name), out)


def snapshot(source_dir: str) -> Tuple[Entry, ...]:
    """The protected entries of ``source_dir`` as they are now."""
    out: List[Entry] = []
    for name in READ_BY_PIPGUARD:
        out.append(_entry(source_dir, name, False))
    for root in VCS_ROOTS:
        top = _entry(source_dir, root, True)
        out.append(top)
        if top.kind != "dir":
            continue  # absent, or a `gitdir:` file (its content is compared)
        if root == ".hg":
            out.append(_entry(source_dir, os.path.join(root, "hgrc"), True))
            continue
        gitdirs = [root]
        try:
            modules = os.path.join(source_dir, root, "modules")
            if os.path.isdir(modules) and not os.path.islink(modules):
                gitdirs += [os.path.join(root, "modules", m) for m in sorted(os.listdir(modules))]
        except OSError:
            pass
        for gitdir in gitdirs:
            for name in GIT_PROTECTED:
                _walk(source_dir, os.path.join(gitdir, name), out)
    return tuple(out)


def check_and_restore(source_dir: str, before: Tuple[Entry, ...]) -> List[Tuple[str, str, str]]:
    """(rule, message, path) for each protected entry the call changed; version-control
    entries are put back as they were in ``before``."""
    if not before:
        return []
    after = {e.rel: e for e in snapshot(source_dir)}
    old = {e.rel: e for e in before}
    problems: List[Tuple[str, str, str]] = []
    changed: List[str] = []
    for rel in sorted(set(old) | set(after)):
        was = old.get(rel) or Entry(rel, "absent", vcs=after[rel].vcs)
        now = after.get(rel) or Entry(rel, "absent", vcs=was.vcs)
        if not was.vcs:
            if now.kind != was.kind and now.kind not in ("file", "absent"):
                problems.append((SOURCE_RULE, f"the build replaced {rel} (pipguard reads it, not "
                                 f"sandboxed) by a {'symlink' if now.kind == 'link' else 'FIFO, socket or device'}", os.path.join(source_dir, rel)))
            continue
        if (was.kind, was.content, was.mode if was.kind == "file" else 0) != \
                (now.kind, now.content, now.mode if now.kind == "file" else 0):
            changed.append(rel)
            problems.append((VCS_RULE, "the build changed version-control state that runs commands "
                             f"({rel}: {was.kind} -> {now.kind}); put back", os.path.join(source_dir, rel)))
    if changed:
        _restore(source_dir, before, changed)
    return problems


def _restore(source_dir: str, before: Tuple[Entry, ...], changed: List[str]) -> None:
    """Remove what the call changed, then recreate ``before``'s entries, parents first —
    never writing through a link (every parent is an entry recreated as a real directory)."""
    real_root = os.path.realpath(source_dir)

    def inside(rel: str) -> bool:  # every parent a real directory where it should be
        return os.path.realpath(os.path.dirname(os.path.join(real_root, rel))) == \
            os.path.dirname(os.path.join(real_root, rel))

    # shallowest first: a directory the build replaced by a link goes before anything
    # below it is looked at, so nothing is ever removed or written through that link
    for rel in sorted(changed, key=lambda r: r.count(os.sep)):
        if inside(rel):
            _remove(os.path.join(real_root, rel))
    for entry in sorted(before, key=lambda e: e.rel.count(os.sep)):
        if not entry.vcs or entry.kind in ("absent", "other"):
            continue
        if not any(entry.rel == c or entry.rel.startswith(c + os.sep) for c in changed):
            continue
        path = os.path.join(real_root, entry.rel)
        if not inside(entry.rel):
            continue
        try:
            if entry.kind == "dir":
                if not os.path.lexists(path):
                    os.mkdir(path, entry.mode or 0o755)
            elif entry.kind == "link":
                os.symlink(os.fsdecode(entry.content), path)
            else:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                             entry.mode or 0o644)
                try:
                    os.write(fd, entry.content)
                    os.fchmod(fd, entry.mode or 0o644)
                finally:
                    os.close(fd)
        except OSError:
            pass  # reported already; the refusal stands either way


def _remove(path: str) -> None:
    try:
        st = os.lstat(path)
    except OSError:
        return
    if stat.S_ISDIR(st.st_mode):
        from pipguard.files import remove_tree

        remove_tree(path)  # does not follow links inside; any depth (a build made this tree)
    else:
        try:
            os.unlink(path)
        except OSError:
            pass
