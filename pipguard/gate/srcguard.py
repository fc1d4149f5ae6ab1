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

import dataclasses
import os
from typing import List, Optional, Tuple

from pipguard.gate import projecttree
from pipguard.gate.projecttree import ENV_RULE, RUN_LATER_RULE, STARTUP_RULE, Tree
from pipguard.gate.treefiles import VCS_ROOTS, VCS_RULE, Entry, entry_at, remove_entry

#: inside a git directory (and each ``modules/<name>`` of it): what git executes or configures
GIT_PROTECTED = ("config", "config.worktree", "commondir", "hooks")
#: files pipguard itself reads from the source tree (their type must not change)
READ_BY_PIPGUARD = ("PKG-INFO", "pyproject.toml")
#: at most this many entries of the version-control state are recorded
MAX_ENTRIES = 2000
#: the rule of a file pipguard reads that the build replaced
SOURCE_RULE = "source-tamper"


def _walk(root: str, rel: str, out: List[Entry]) -> None:
    """``rel`` and, if it is a real directory, everything below it (never through a link), in
    order, at most :data:`MAX_ENTRIES` in all. A loop, not a recursion: a build that nests
    directories 1,100 deep in ``.git/hooks`` made the recursion raise, and the check with it."""
    stack = [rel]
    while stack and len(out) < MAX_ENTRIES:
        entry = entry_at(root, stack.pop(), True)
        out.append(entry)
        if entry.kind != "dir":
            continue
        try:
            names = sorted(os.listdir(os.path.join(root, entry.rel)))
        except OSError:
            continue
        stack += [os.path.join(entry.rel, name) for name in reversed(names)]


def snapshot(source_dir: str) -> Tuple[Entry, ...]:
    """The protected entries of ``source_dir`` as they are now."""
    out: List[Entry] = []
    for name in READ_BY_PIPGUARD:
        out.append(entry_at(source_dir, name, False))
    for root in VCS_ROOTS:
        top = entry_at(source_dir, root, True)
        out.append(top)
        if top.kind != "dir":
            continue  # absent, or a `gitdir:` file (its content is compared)
        if root == ".hg":
            out.append(entry_at(source_dir, os.path.join(root, "hgrc"), True))
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


def check_and_restore(source_dir: str, before: Tuple[Entry, ...], tree: Optional[Tree] = None
                      ) -> List[Tuple[str, str, str, str]]:
    """(severity, rule, message, path) for each protected entry the call changed (critical,
    refusing) and, with ``tree`` (a project tree's :func:`projecttree.snapshot_tree`), each ordinary file it
    created or changed (reported only); protected entries are put back as they were in
    ``before`` (a created one removed)."""
    if not before and tree is None:
        return []
    now_entries = snapshot(source_dir)
    after_tree: Optional[Tree] = None
    if tree is not None:
        more, after_tree = projecttree.snapshot_tree(source_dir, tree)
        now_entries += more
    after = {e.rel: e for e in now_entries}
    old = {e.rel: e for e in before}
    problems: List[Tuple[str, str, str, str]] = []
    changed: List[str] = []
    for rel in sorted(set(old) | set(after)):
        was = old.get(rel) or dataclasses.replace(after[rel], kind="absent", content=b"", stamp=())
        now = after.get(rel) or Entry(rel, "absent", vcs=was.vcs, rule=was.rule)
        path = os.path.join(source_dir, rel)
        if not was.vcs:
            if now.kind != was.kind and now.kind not in ("file", "absent"):
                problems.append(("critical", SOURCE_RULE, f"the build replaced {rel} (pipguard reads it, not "
                                 f"sandboxed) by a {'symlink' if now.kind == 'link' else 'FIFO, socket or device'}", path))
            continue
        if (was.kind, was.content, was.mode if was.kind == "file" else 0, was.stamp) == \
                (now.kind, now.content, now.mode if now.kind == "file" else 0, now.stamp):
            continue
        # an entry kept by its stat only is never rewritten: what the build created goes,
        # what it changed of the user's stays as the build left it (reported)
        undo = was.kind == "absent" or not was.stamp
        if undo:
            changed.append(rel)
        done = ("removed" if was.kind == "absent" else "put back") if undo else "left as the build made it"
        if now.rule == VCS_RULE and was.rule == VCS_RULE:
            problems.append(("critical", VCS_RULE, "the build changed version-control state that runs "
                             f"commands ({rel}: {was.kind} -> {now.kind}); {done}", path))
        elif STARTUP_RULE in (was.rule, now.rule) and now.kind != "absent":
            for severity, rule, message in projecttree.judge_startup(rel, now.content):
                problems.append((severity, rule, f"{message} (the build wrote {rel} into your project; "
                                 f"{done})", path))
        elif ENV_RULE in (was.rule, now.rule):
            problems.append(("critical", ENV_RULE, f"the build changed {rel}, in an environment inside your "
                             f"project (its files are imported and run); {done}", path))
        else:
            what = "created" if was.kind == "absent" else "removed" if now.kind == "absent" else "changed"
            problems.append(("critical", now.rule, f"the build {what} {rel}, which runs later outside any "
                             f"sandbox ({projecttree.why_run_later(rel) or 'git hooks, or another file a program runs'}); {done}", path))
    if changed:
        _restore(source_dir, before, changed)
    if tree is not None and after_tree is not None:
        found = projecttree.tree_problems(source_dir, tree, after_tree)
        for severity, rule, _message, path in found:
            if rule == RUN_LATER_RULE and os.path.islink(path):
                os.unlink(path)  # the link only, never what it leads to
        problems += found
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
            remove_entry(os.path.join(real_root, rel))
    for entry in sorted(before, key=lambda e: e.rel.count(os.sep)):
        if not entry.vcs or entry.stamp or entry.kind in ("absent", "other"):
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
