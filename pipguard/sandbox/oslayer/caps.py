"""no_new_privs, securebits and the capability drop (prctl(2), capset(2)).

Everything here acts on the calling *thread*; :func:`pipguard.sandbox.oslayer.apply`
runs in a single-threaded child right before exec, so thread and process are
the same.
"""

from __future__ import annotations

import ctypes
import errno
import os
from typing import Dict, Optional

from pipguard.errors import KernelError

PR_CAPBSET_READ = 23
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_GET_SECUREBITS = 27
PR_SET_NO_NEW_PRIVS = 38
PR_GET_NO_NEW_PRIVS = 39
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4

CAP_SETPCAP = 8

# include/uapi/linux/securebits.h
SECBIT_NOROOT = 1 << 0
SECBIT_NOROOT_LOCKED = 1 << 1
SECBIT_NO_SETUID_FIXUP = 1 << 2
SECBIT_NO_SETUID_FIXUP_LOCKED = 1 << 3
SECBIT_KEEP_CAPS = 1 << 4
SECBIT_KEEP_CAPS_LOCKED = 1 << 5
SECBIT_NO_CAP_AMBIENT_RAISE = 1 << 6
SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED = 1 << 7
#: root gets no capabilities from exec or setuid, KEEP_CAPS stays off; all locked.
LOCKED_SECUREBITS = (
    SECBIT_NOROOT
    | SECBIT_NOROOT_LOCKED
    | SECBIT_NO_SETUID_FIXUP
    | SECBIT_NO_SETUID_FIXUP_LOCKED
    | SECBIT_KEEP_CAPS_LOCKED
    | SECBIT_NO_CAP_AMBIENT_RAISE
    | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED
)

_LINUX_CAPABILITY_VERSION_3 = 0x20080522

CAP_FIELDS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


_libc: Optional[ctypes.CDLL] = None


def libc() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        _libc.prctl.restype = ctypes.c_int
        _libc.syscall.restype = ctypes.c_long
    return _libc


def prctl(option: int, a2: int = 0, a3: int = 0, a4: int = 0, a5: int = 0, *, name: str = "prctl") -> int:
    """prctl(2); raises :class:`KernelError` on failure."""
    ctypes.set_errno(0)
    res = libc().prctl(option, a2, a3, a4, a5)
    if res < 0:
        err = ctypes.get_errno()
        raise KernelError(name, err, os.strerror(err))
    return res


def capability_sets(status_path: str = "/proc/thread-self/status") -> Dict[str, int]:
    """The capability masks of the calling thread, from ``/proc``; {} if unreadable."""
    out: Dict[str, int] = {}
    for path in (status_path, "/proc/self/status"):
        try:
            with open(path) as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key in CAP_FIELDS:
                        out[key] = int(value.strip(), 16)
            return out
        except OSError:
            continue
    return out


def last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        # Kernels before 3.2 lack the file; probe the bounding set instead.
        cap = 0
        while cap < 64:
            ctypes.set_errno(0)
            if libc().prctl(PR_CAPBSET_READ, cap + 1, 0, 0, 0) < 0:
                break
            cap += 1
        return cap


def set_no_new_privs() -> None:
    """PR_SET_NO_NEW_PRIVS: exec can never grant privileges (setuid, file caps).

    Landlock and unprivileged seccomp both require it.
    """
    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0, name="prctl(PR_SET_NO_NEW_PRIVS)")
    if prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1:
        raise KernelError("prctl(PR_SET_NO_NEW_PRIVS)", errno.EPERM, "no_new_privs did not stick")


def capget() -> Dict[str, int]:
    """Effective, permitted and inheritable sets of the calling thread via capget(2).

    Used instead of /proc so that a missing /proc can never make a drop look done.
    """
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    ctypes.set_errno(0)
    if libc().capget(ctypes.byref(header), ctypes.byref(data)) < 0:
        err = ctypes.get_errno()
        raise KernelError("capget", err, os.strerror(err))
    return {
        "CapEff": data[0].effective | data[1].effective << 32,
        "CapPrm": data[0].permitted | data[1].permitted << 32,
        "CapInh": data[0].inheritable | data[1].inheritable << 32,
    }


def bounding_set() -> int:
    """The bounding set, read with PR_CAPBSET_READ one capability at a time."""
    mask = 0
    for cap in range(last_cap() + 1):
        ctypes.set_errno(0)
        if libc().prctl(PR_CAPBSET_READ, cap, 0, 0, 0) > 0:
            mask |= 1 << cap
    return mask


def _has_cap(cap: int) -> bool:
    return bool(capget()["CapEff"] >> cap & 1)


def lock_securebits() -> bool:
    """Set and lock :data:`LOCKED_SECUREBITS`; needs CAP_SETPCAP, so it runs first.

    Returns False (and does nothing) without CAP_SETPCAP: an unprivileged
    process has no root semantics to switch off.
    """
    if not _has_cap(CAP_SETPCAP):
        return False
    prctl(PR_SET_SECUREBITS, LOCKED_SECUREBITS, 0, 0, 0, name="prctl(PR_SET_SECUREBITS)")
    return True


def drop_all() -> Dict[str, int]:
    """Empty the bounding, ambient, effective, permitted and inheritable sets.

    Order matters: the bounding set can only be shrunk while CAP_SETPCAP is
    still effective, so capset(2) comes last. Without CAP_SETPCAP (an
    unprivileged user) the bounding set is left alone: no_new_privs already
    makes it unreachable. Returns the sets read back (capget, PR_CAPBSET_READ,
    and CapAmb from /proc when readable).
    """
    had_setpcap = _has_cap(CAP_SETPCAP)
    if had_setpcap:
        for cap in range(last_cap() + 1):
            try:
                prctl(PR_CAPBSET_DROP, cap, 0, 0, 0, name="prctl(PR_CAPBSET_DROP)")
            except KernelError as exc:
                # EINVAL: the running kernel does not know this capability.
                if exc.errno != errno.EINVAL:
                    raise
    try:
        prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0, name="prctl(PR_CAP_AMBIENT_CLEAR_ALL)")
    except KernelError as exc:
        if exc.errno != errno.EINVAL:  # EINVAL: kernel < 4.3 has no ambient set
            raise
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    ctypes.set_errno(0)
    if libc().capset(ctypes.byref(header), ctypes.byref(data)) < 0:
        err = ctypes.get_errno()
        raise KernelError("capset", err, os.strerror(err))
    sets = capget()
    sets["CapBnd"] = bounding_set()
    sets["CapAmb"] = capability_sets().get("CapAmb", 0)
    for key in ("CapEff", "CapPrm", "CapInh", "CapAmb"):
        if sets.get(key, 0):
            raise KernelError("capset", errno.EPERM, f"{key} is {sets[key]:#x} after the drop, expected 0")
    if had_setpcap and sets.get("CapBnd", 0):
        raise KernelError("prctl(PR_CAPBSET_DROP)", errno.EPERM, f"CapBnd is {sets['CapBnd']:#x} after the drop, expected 0")
    return sets
