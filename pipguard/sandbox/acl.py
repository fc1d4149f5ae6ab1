"""POSIX access ACLs in the kernel's own xattr format (``system.posix_acl_access``).

Only what :mod:`pipguard.sandbox.sandbox_user` needs: read an inode's ACL (or the
three entries its mode implies), add or remove one named-user entry, write
it back. No ``setfacl``/``libacl`` dependency: the format is a version
word and fixed-size entries (include/uapi/linux/posix_acl_xattr.h).

The mask is always recomputed as the union of the group-class entries, as
``setfacl`` does by default, so adding an entry changes nobody else's
effective rights: an ACL whose mask *narrows* an existing entry is refused
(:class:`AclError`), since raising its mask would widen that entry.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
from dataclasses import dataclass
from typing import Tuple

XATTR = "system.posix_acl_access"
VERSION = 2
UNDEFINED_ID = 0xFFFFFFFF
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_HEADER = struct.Struct("<I")
_ENTRY = struct.Struct("<HHI")


class AclError(OSError):
    """An ACL cannot be changed safely (unsupported filesystem, narrowing mask)."""


@dataclass(frozen=True)
class Entry:
    tag: int
    perm: int
    id: int = UNDEFINED_ID


def decode(raw: bytes) -> Tuple[Entry, ...]:
    (version,) = _HEADER.unpack_from(raw)
    if version != VERSION or (len(raw) - _HEADER.size) % _ENTRY.size:
        raise AclError(errno.EINVAL, "unknown ACL xattr format")
    return tuple(Entry(*_ENTRY.unpack_from(raw, off))
                 for off in range(_HEADER.size, len(raw), _ENTRY.size))


def encode(entries) -> bytes:
    # The kernel requires entries sorted by tag, named ones by id (posix_acl_valid).
    ordered = sorted(entries, key=lambda e: (e.tag, e.id if e.tag in (USER, GROUP) else 0))
    return _HEADER.pack(VERSION) + b"".join(_ENTRY.pack(e.tag, e.perm, e.id) for e in ordered)


def from_mode(mode: int) -> Tuple[Entry, ...]:
    return (Entry(USER_OBJ, mode >> 6 & 7), Entry(GROUP_OBJ, mode >> 3 & 7), Entry(OTHER, mode & 7))


def read(path: str) -> Tuple[Tuple[Entry, ...], bool]:
    """(entries, whether an ACL xattr exists) for ``path`` (never follows a symlink)."""
    try:
        return decode(os.getxattr(path, XATTR, follow_symlinks=False)), True
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.EOPNOTSUPP):
            return from_mode(os.lstat(path).st_mode), False
        raise


def _named(entries) -> Tuple[Entry, ...]:
    return tuple(e for e in entries if e.tag in (USER, GROUP))


def _with_mask(entries) -> Tuple[Entry, ...]:
    rest = [e for e in entries if e.tag != MASK]
    if not _named(rest):
        return tuple(rest)
    union = 0
    for e in rest:
        if e.tag in (GROUP_OBJ, USER, GROUP):
            union |= e.perm
    return tuple(rest) + (Entry(MASK, union),)


def grant_user(path: str, uid: int, perm: int) -> bool:
    """Add (or widen) the entry ``user:uid:perm`` on ``path``. Returns
    whether an ACL existed before (with entries of its own)."""
    entries, existed = read(path)
    mask = next((e.perm for e in entries if e.tag == MASK), None)
    if mask is not None:
        for e in entries:
            if e.tag in (GROUP_OBJ, USER, GROUP) and e.perm & ~mask and not (e.tag == USER and e.id == uid):
                raise AclError(errno.EPERM, f"{path} has an ACL whose mask narrows an entry; "
                                            "adding the sandbox user would widen it")
    old = next((e.perm for e in entries if e.tag == USER and e.id == uid), 0)
    kept = [e for e in entries if not (e.tag == USER and e.id == uid)]
    new = _with_mask(kept + [Entry(USER, perm | old, uid)])
    try:
        os.setxattr(path, XATTR, encode(new), follow_symlinks=False)
    except OSError as exc:
        if exc.errno == errno.EOPNOTSUPP:
            raise AclError(exc.errno, f"the filesystem of {path} has no POSIX ACLs") from exc
        raise
    return existed and bool(_named(kept))


def revoke_user(path: str, uid: int, had_acl: bool) -> None:
    """Remove ``user:uid`` from ``path``'s ACL. When nothing named is left and
    there was no ACL before the grant, remove the xattr and put the mode's
    group bits back (the kernel showed the mask there)."""
    entries, existed = read(path)
    if not existed:
        return
    kept = [e for e in entries if not (e.tag == USER and e.id == uid)]
    if not _named(kept) and not had_acl:
        gobj = next(e.perm for e in kept if e.tag == GROUP_OBJ)
        os.removexattr(path, XATTR, follow_symlinks=False)
        mode = stat.S_IMODE(os.lstat(path).st_mode)
        os.chmod(path, mode & ~0o070 | gobj << 3)
        return
    os.setxattr(path, XATTR, encode(_with_mask(kept)), follow_symlinks=False)


def names_user(path: str, uids: range, *, default: bool = False) -> bool:
    """Whether the access (or default) ACL of ``path`` has an entry for a uid in ``uids``."""
    try:
        raw = os.getxattr(path, "system.posix_acl_default" if default else XATTR, follow_symlinks=False)
    except OSError:
        return False
    return any(e.tag == USER and e.id in uids for e in decode(raw))


def effective_other(mode: int, want: int) -> bool:
    """Whether "other" already has every bit of ``want`` (no entry needed)."""
    return mode & 7 & want == want


def owner_perm(mode: int) -> int:
    return mode >> 6 & 7


__all__ = ["AclError", "Entry", "grant_user", "revoke_user", "read", "names_user", "decode", "encode"]
