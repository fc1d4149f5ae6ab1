"""Where a path a sandboxed process names leads, seen from pipguard.

A notification carries the path as the process wrote it: relative to its
working directory or a descriptor, through ``/proc/self``, ``/dev/fd``, links.
:meth:`PathView.resolve` gives the host's view (``realpath`` from the
process's own directories); :meth:`PathView.in_namespace` the view from inside
the namespace backend, whose ``/tmp`` and ``/proc`` are not the host's
(a write aimed at a host path there, a link the run made in its own ``/tmp``,
a pid numbered in its own pid namespace). The file handlers
(:mod:`pipguard.sandbox.handlers`) decide on what these return.
"""

from __future__ import annotations

import collections
import os
import stat
from typing import List, Optional, Sequence, Tuple

from pipguard import rules
from pipguard.sandbox.lifetime import Lifetime

AT_FDCWD = -100
_DEV_STDIO = {"/dev/stdin": "0", "/dev/stdout": "1", "/dev/stderr": "2"}


class PathView:
    """The paths of one run's processes. ``namespace_own``: the roots that are
    the namespace's own (its ``/tmp``, ``/dev/shm``; empty outside ns);
    ``lifetime``: who belongs to the run (a pid numbered in its namespace is
    looked up among them)."""

    def __init__(self, namespace_own: Sequence[str], lifetime: Lifetime) -> None:
        self._namespace_own = tuple(namespace_own)
        self._lifetime = lifetime

    def resolve(self, pid: int, dirfd: int, path: str) -> Optional[str]:
        """The path as pipguard sees it, links resolved; None when its base directory's
        name cannot be read (longer than PATH_MAX: it used to become "/")."""
        absolute = self._absolute(pid, dirfd, path)
        if absolute is None:
            return None
        try:
            return os.path.realpath(absolute)
        except OSError:
            return None

    def _absolute(self, pid: int, dirfd: int, path: str) -> Optional[str]:
        if path.startswith("/proc/self/") or path == "/proc/self":
            path = f"/proc/{pid}" + path[len("/proc/self"):]
        elif path.startswith("/proc/thread-self"):
            path = f"/proc/{pid}" + path[len("/proc/thread-self"):]
        elif path.startswith("/dev/fd/") or path in _DEV_STDIO:
            # /dev/fd is a link to /proc/self/fd: resolved here it would be
            # pipguard's own fds (bash's process substitution opens /dev/fd/63)
            path = f"/proc/{pid}/fd/" + (path[len("/dev/fd/"):] if path.startswith("/dev/fd/")
                                         else _DEV_STDIO[path])
        if not path.startswith("/"):
            if dirfd == AT_FDCWD:
                base_link = f"/proc/{pid}/cwd"
            else:
                base_link = f"/proc/{pid}/fd/{dirfd}"
            try:
                base = os.readlink(base_link)
            except OSError:
                return None  # (ENAMETOOLONG: "/" here made a write below it look like one below /)
            path = base.rstrip("/") + "/" + path
        return path

    def in_namespace(self, pid: int, dirfd: int, raw: str) -> Optional[Tuple[str, str]]:
        """Under ns, a write's target as the sandbox sees it: (path, "found" | "missing" |
        "denied", see :func:`_resolve_in_root`); None where the host's view is the
        sandbox's or nothing better is known (not under ns; /dev; a path below a removed
        directory with ``..`` in it). Its private /tmp is not the host's /tmp: resolved
        on the host, a write aimed at a host path there (a sibling project's tree) looked
        like one into its own /tmp and failed with ENOENT unreported, and a link it made
        there was not followed. Its /proc entries are its pid namespace's: a number there
        is mapped to pipguard's before anything is read (review rounds 2-4)."""
        if not self._namespace_own:
            return None
        raw = _collapsed(raw)
        if raw.startswith("/dev/fd/"):  # its descriptors by their other names
            raw = "/proc/self/fd/" + raw[len("/dev/fd/"):]
        elif raw in _DEV_STDIO:
            raw = "/proc/self/fd/" + _DEV_STDIO[raw]
        root_pid, base_link, rest = pid, None, raw
        if raw.startswith("/proc/"):
            parts = raw.split("/")  # "", "proc", WHO, ...
            who = parts[2]
            if who in ("self", "thread-self") or who.isdigit():
                if who in ("self", "thread-self"):
                    host = pid
                elif self._lifetime.own_pid_namespace:
                    found = self._host_pid(who, pid)
                    if found is None:
                        return raw, "denied"  # a number its namespace has, pipguard cannot place
                    host = found
                else:
                    host = int(who)
                at = 3
                if len(parts) > at + 1 and parts[at] == "task" and parts[at + 1].isdigit():
                    at += 2  # a thread's entry: its process's root, cwd and descriptors
                head = parts[at] if len(parts) > at else ""
                if head == "root":
                    root_pid, base_link, rest = host, "", "/" + "/".join(parts[at + 1:])
                elif head == "cwd":
                    base_link, rest = f"/proc/{host}/cwd", "/".join(parts[at + 1:])
                elif head == "fd" and len(parts) > at + 1 and parts[at + 1].isdigit():
                    base_link, rest = f"/proc/{host}/fd/{parts[at + 1]}", "/".join(parts[at + 2:])
                else:  # another of its /proc files, by pipguard's number for it
                    return f"/proc/{host}/" + "/".join(parts[3:]), "found"
            else:
                return None
        elif raw.startswith("/dev/") and not rules.under(raw, self._namespace_own):
            return None
        elif not raw.startswith("/"):
            base_link = f"/proc/{pid}/cwd" if dirfd == AT_FDCWD else f"/proc/{pid}/fd/{dirfd}"
        absolute = rest
        if base_link:
            try:
                removed = os.stat(base_link).st_nlink == 0
                base = os.readlink(base_link)
            except OSError:
                return raw, "denied"  # its name longer than PATH_MAX, say: unknown
            if not base.startswith("/"):
                return base, "found"  # a pipe, a socket: written as such
            if removed:
                if ".." in rest.split("/"):
                    return None  # the host's lexical view, as realpath: the kernel goes up too
                # nothing can be made in a removed directory: the kernel says ENOENT
                return base[:-len(" (deleted)")] if base.endswith(" (deleted)") else base, "missing"
            absolute = base.rstrip("/") + "/" + rest
        return _resolve_in_root(f"/proc/{root_pid}/root", absolute)

    def _host_pid(self, number: str, asking: int) -> Optional[int]:
        """pipguard's pid of the sandbox process numbered ``number`` in its own pid
        namespace (the last field of ``NSpid``), among the asker and the run's processes."""
        for candidate in (asking, *sorted(self._lifetime.descendants())):
            if _ns_pid(candidate) == number:
                return candidate
        return None


def _ns_pid(pid: int) -> str:
    """``pid``'s number in its own pid namespace (the last of ``NSpid``), or "" when unknown."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("NSpid:"):
                    return line.split()[-1]
    except OSError:
        pass
    return ""


def _collapsed(path: str) -> str:
    """``path`` with its empty and ``.`` components dropped (``/proc//self/./root`` is
    ``/proc/self/root``), ``..`` kept: only links may give it a meaning."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    joined = "/".join(parts)
    return ("/" + joined if path.startswith("/") else joined) or ("/" if path.startswith("/") else ".")


def _resolve_in_root(root: str, path: str) -> Optional[Tuple[str, str]]:
    """``os.path.realpath(path)`` as a process whose root directory is ``root``
    (``/proc/PID/root``: its mount namespace) sees it: (the path, "found") where
    every directory on the way exists there, (the path, "missing") where one does
    not, (the path so far, "denied") where pipguard may not search one; None where
    it cannot be known (a loop of links, a component that is no directory), for
    the caller to fall back on the host's view.

    Walked one component at a time from descriptors (``O_PATH | O_NOFOLLOW``),
    as the kernel walks it: no length limit on the whole path, links followed
    inside the root (an absolute target starts again at it), ``..`` within it.
    Where a component is missing, the rest is normalised as ``realpath`` would
    (``missing/../../etc/x`` is ``/etc/x``, never a text starting with a grant)."""
    try:
        root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    opened: List[Tuple[str, int]] = []  # the resolved components, each with its descriptor
    pending = collections.deque(p for p in path.split("/") if p)
    links = 0
    try:
        while pending:
            name = pending.popleft()
            if name == ".":
                continue
            if name == "..":
                if opened:
                    os.close(opened.pop()[1])
                continue
            at = opened[-1][1] if opened else root_fd
            try:
                st = os.stat(name, dir_fd=at, follow_symlinks=False)
            except FileNotFoundError:
                rest = os.path.normpath("/" + "/".join([*(n for n, _ in opened), name, *pending]))
                return rest, "found" if not pending else "missing"
            except PermissionError:
                return "/" + "/".join([*(n for n, _ in opened), name]), "denied"
            except OSError:
                return None
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > 40:  # the kernel's limit (ELOOP)
                    return None
                target = os.readlink(name, dir_fd=at)
                if target.startswith("/"):
                    while opened:
                        os.close(opened.pop()[1])
                pending.extendleft(reversed([p for p in target.split("/") if p]))
                continue
            if pending and not stat.S_ISDIR(st.st_mode):
                return None  # ENOTDIR: the kernel's answer, nothing to resolve
            opened.append((name, os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=at)))
        return "/" + "/".join(n for n, _ in opened), "found"
    except PermissionError:
        return "/" + "/".join(n for n, _ in opened), "denied"
    except OSError:
        return None
    finally:
        for _, fd in opened:
            os.close(fd)
        os.close(root_fd)
