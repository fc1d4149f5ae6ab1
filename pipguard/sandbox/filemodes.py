"""What a run may not leave on the files of its write roots: the ACLs and
special mode bits of :data:`pipguard.rules.KEPT_MODE_RULES` /
:data:`~pipguard.rules.ACL_RULES`, whatever uid an ACL entry names.

Why: a build can ``setfacl -m u:1234:rwx`` a file of the user's checkout, or
put a default ACL (``d:o::rwx``) on one of its directories that every file
created there later inherits, or make a directory sticky or setgid, from
Python or from native code (``setxattr("system.posix_acl_access")``). The
sandbox user's own grants are removed by :mod:`pipguard.sandbox.sandbox_user`; this
module covers everything else, under every backend, as root or not.

Before the run (:func:`snapshot`): every entry below the roots is known by
its inode (so a rename keeps its state), and the few that have an ACL xattr
or a special bit keep what they had (one ``lstat`` and one ``listxattr`` an
entry). After it (:func:`restore`): only entries whose ctime is not older
than the run's start are looked at (any ACL or mode change moves it), each
compared with what it may have:

- an entry that existed: what it had before (its named ACL entries, its
  default ACL, its special bits); its owner/group/other permissions are the
  build's to change, as ``chmod +x`` is;
- an entry the run created: what the kernel gave it from its directory *as
  that was before the run* (the directory's default ACL, setgid of a
  directory), else nothing.

What differs is put back; each added ACL and special bit is returned as a
:class:`Stripped` (the run's evidence makes a finding of each). A bit or an
entry the build *removed* from the user's file is put back silently.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from typing import Dict, Iterable, Iterator, List, Optional, Set, Tuple

from pipguard.sandbox import acl, files
from pipguard import rules

ACCESS, DEFAULT = "system.posix_acl_access", "system.posix_acl_default"
_NAMED = (acl.USER, acl.GROUP)
Inode = Tuple[int, int]
#: the mode bits an entry's snapshot keeps: the special ones, and world-write (put back
#: by ``clear_world_write``)
_KEPT_BITS = rules.SPECIAL_MODES | 0o002


@dataclass(frozen=True)
class Kept:
    """What one entry may keep: its special and world-write bits, its access
    ACL's named entries (and mask), its default ACL (None: none)."""

    special: int = 0
    access: Optional[Tuple[acl.Entry, ...]] = None
    default: Optional[Tuple[acl.Entry, ...]] = None


NOTHING = Kept()


@dataclass(frozen=True)
class Before:
    """The roots as they were: every inode, and what the special ones had."""

    known: frozenset
    kept: Dict[Inode, Kept]
    #: every named ACL entry the roots had, (tag, id) -> the widest perm: what the user granted
    granted: Dict[Tuple[int, int], int] = field(default_factory=dict)


@dataclass(frozen=True)
class Stripped:
    """One thing the run added and :func:`restore` took away: ``rule`` (from
    the rule table), the path, what it was and what it is now."""

    rule: str
    path: str
    found: str
    now: str


def _entries(roots: Iterable[str]) -> Iterator[Tuple[str, os.stat_result]]:
    for root in roots:
        yield from files.entries(root)


def _acl(path: str, name: str) -> Optional[Tuple[acl.Entry, ...]]:
    try:
        return acl.decode(os.getxattr(path, name, follow_symlinks=False))
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.EOPNOTSUPP, errno.ENOTSUP):
            return None
        raise
    except ValueError:
        return None


def _state(path: str, st: os.stat_result, names: Optional[List[str]] = None) -> Kept:
    if names is None:
        names = [n for n in (ACCESS, DEFAULT) if _acl(path, n) is not None]
    return Kept(stat.S_IMODE(st.st_mode) & _KEPT_BITS,
                _acl(path, ACCESS) if ACCESS in names else None,
                _acl(path, DEFAULT) if DEFAULT in names and stat.S_ISDIR(st.st_mode) else None)


def snapshot(roots: Iterable[str]) -> Before:
    """The roots before the run (see the module's docstring)."""
    known: Set[Inode] = set()
    kept: Dict[Inode, Kept] = {}
    for path, st in _entries(roots):
        key = (st.st_dev, st.st_ino)
        known.add(key)
        if stat.S_ISLNK(st.st_mode):
            continue
        try:
            names = [n for n in os.listxattr(path, follow_symlinks=False) if n in rules.ACL_RULES]
        except OSError:
            names = []
        if names or st.st_mode & _KEPT_BITS:
            try:
                kept[key] = _state(path, st, names)
            except OSError:
                continue
    granted: Dict[Tuple[int, int], int] = {}
    for state in kept.values():
        for e in _named(state.access) + _named(state.default):
            granted[(e.tag, e.id)] = granted.get((e.tag, e.id), 0) | e.perm
    return Before(frozenset(known), kept, granted)


def _named(entries: Optional[Tuple[acl.Entry, ...]]) -> Tuple[acl.Entry, ...]:
    return tuple(sorted((e for e in entries or () if e.tag in _NAMED), key=lambda e: (e.tag, e.id)))


def _mask(entries: Optional[Tuple[acl.Entry, ...]]) -> int:
    return next((e.perm for e in entries or () if e.tag == acl.MASK), 7)


def _grants(entries: Optional[Tuple[acl.Entry, ...]]) -> tuple:
    """What an access ACL gives beyond the mode: its named entries and, with
    them, its mask (owner/group/other are the mode, the build's to chmod)."""
    named = _named(entries)
    return (named, _mask(entries)) if named else ()


def _widened(now: Optional[Tuple[acl.Entry, ...]], want: Optional[Tuple[acl.Entry, ...]]) -> bool:
    """Whether ``now`` names someone ``want`` does not, or gives more."""
    had = {(e.tag, e.id): e.perm for e in _named(want)}
    return bool(_named(now)) and (any(e.perm & ~had.get((e.tag, e.id), 0) for e in _named(now))
                                  or bool(_mask(now) & ~_mask(want) and had))


def _inherited(entries: Optional[Tuple[acl.Entry, ...]], default: Optional[Tuple[acl.Entry, ...]]) -> bool:
    """Whether an access ACL is one the kernel derives from ``default`` for a
    new file: the same named entries, none with more rights (the create mode
    masks them)."""
    if default is None:
        return not _named(entries)
    want = {(e.tag, e.id): e.perm for e in _named(default)}
    got = {(e.tag, e.id): e.perm for e in _named(entries)}
    return got.keys() == want.keys() and all(perm & ~want[k] == 0 for k, perm in got.items())


def _text(entries: Optional[Tuple[acl.Entry, ...]]) -> str:
    """``getfacl``'s short form (``u::rwx,u:1234:rwx,m::rwx,o::r-x``), or "none"."""
    if not entries:
        return "none"
    tags = {acl.USER_OBJ: "u", acl.USER: "u", acl.GROUP_OBJ: "g", acl.GROUP: "g", acl.MASK: "m", acl.OTHER: "o"}
    out = []
    for e in sorted(entries, key=lambda e: (e.tag, e.id)):
        who = str(e.id) if e.tag in _NAMED else ""
        perm = "".join(c if e.perm & bit else "-" for c, bit in (("r", 4), ("w", 2), ("x", 1)))
        out.append(f"{tags.get(e.tag, '?')}:{who}:{perm}")
    return ",".join(out)


def _put_access(path: str, now: Tuple[acl.Entry, ...], want: Optional[Tuple[acl.Entry, ...]]) -> None:
    """Give ``path`` the named entries (and mask) of ``want``, keeping its
    owner/group/other permissions as they are now; none: no ACL, the group
    bits never wider than the mask made them."""
    base = {e.tag: e for e in now if e.tag in (acl.USER_OBJ, acl.GROUP_OBJ, acl.OTHER)}
    if not _named(want):
        os.removexattr(path, ACCESS, follow_symlinks=False)
        group = base[acl.GROUP_OBJ].perm & _mask(now) if acl.GROUP_OBJ in base else 0
        mode = stat.S_IMODE(os.lstat(path).st_mode)
        os.chmod(path, mode & ~0o070 | group << 3, follow_symlinks=False)
        return
    masks = [e for e in want or () if e.tag == acl.MASK]
    os.setxattr(path, ACCESS, acl.encode(list(base.values()) + list(_named(want)) + masks),
                follow_symlinks=False)


def restore(roots: Iterable[str], before: Before, since: float, *,
            clear_world_write: bool = False) -> List[Stripped]:
    """Put back what the run changed since ``since`` (a time.time() taken
    before it could run) below ``roots`` (see the module's docstring).
    ``clear_world_write``: also clear world-write on entries that did not
    have it before (ns as root: what the sandbox wrote is root's on the
    host), silently. Never raises."""
    out: List[Stripped] = []
    since_ns = int(since * 1e9)
    want_of: Dict[str, Kept] = {}  # directories, for their new children
    for path, st in _entries(roots):
        key = (st.st_dev, st.st_ino)
        if stat.S_ISLNK(st.st_mode):
            continue
        existed = key in before.known
        if existed:
            want = before.kept.get(key, NOTHING)
        else:
            parent = want_of.get(os.path.dirname(path), NOTHING)
            is_dir = stat.S_ISDIR(st.st_mode)
            want = Kept(parent.special & stat.S_ISGID if is_dir else 0, None,
                        parent.default if is_dir else None)
        if stat.S_ISDIR(st.st_mode):
            want_of[path] = want
        if st.st_ctime_ns < since_ns:
            continue
        try:
            out += _put_back(path, st, want, existed, want_of.get(os.path.dirname(path), NOTHING),
                             clear_world_write, before.granted)
        except OSError:
            continue
    return out


def _put_back(path: str, st: os.stat_result, want: Kept, existed: bool, parent: Kept,
              clear_world_write: bool, granted: Dict[Tuple[int, int], int]) -> List[Stripped]:
    out: List[Stripped] = []
    now = _state(path, st)
    access = now.access
    # a new file may also carry entries the user's own files had (a build's shutil.copy2 copies
    # the source's ACL): no one the user did not grant, no more than granted
    inherited = not existed and (_inherited(access, parent.default) or all(
        e.perm & ~granted.get((e.tag, e.id), 0) == 0 for e in _named(access)))
    if _grants(access) != _grants(want.access) and not inherited:
        _put_access(path, access or acl.from_mode(st.st_mode), want.access)
        if _widened(access, want.access):
            out.append(Stripped(rules.ACL_RULES[ACCESS], path, _text(access), _text(want.access)))
    if stat.S_ISDIR(st.st_mode) and now.default != want.default \
            and set(now.default or ()) != set(want.default or ()):
        if want.default is None:
            os.removexattr(path, DEFAULT, follow_symlinks=False)
        else:
            os.setxattr(path, DEFAULT, acl.encode(want.default), follow_symlinks=False)
        if now.default is not None:
            out.append(Stripped(rules.ACL_RULES[DEFAULT], path, _text(now.default), _text(want.default)))
    mode = stat.S_IMODE(os.lstat(path).st_mode)
    added = mode & rules.SPECIAL_MODES & ~want.special
    world = mode & 0o002 & ~want.special if clear_world_write else 0
    if added or world:
        os.chmod(path, mode & ~added & ~world, follow_symlinks=False)
        for rule in dict.fromkeys(rule for bit, rule in sorted(rules.KEPT_MODE_RULES.items(), reverse=True)
                                  if added & bit):
            out.append(Stripped(rule, path, f"{mode:o}", f"{mode & ~added & ~world:o}"))
    return out


__all__ = ["Before", "Kept", "Stripped", "snapshot", "restore"]
