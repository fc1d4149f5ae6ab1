"""Landlock: filesystem rules, TCP port rules and IPC scoping.

The ``landlock`` package (its :mod:`landlock.plumbing`) supplies the syscall
numbers and the filesystem flags; it knows nothing of ``handled_access_net``
(ABI 4) or ``scoped`` (ABI 6), so the ruleset is built here with the raw
syscalls and the extended ``struct landlock_ruleset_attr``.
See Documentation/userspace-api/landlock.rst in the kernel tree.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat
from dataclasses import dataclass
from typing import Iterable, List, Tuple

from pipguard.errors import KernelError

try:  # the flags and syscall numbers come from the landlock package
    from landlock.plumbing import (
        CREATE_RULESET_VERSION,
        SYSCALL_ADD_RULE,
        SYSCALL_CREATE_RULESET,
        SYSCALL_RESTRICT_SELF,
        FSAccess,
    )

    _FS = {f.name: int(f.value) for f in FSAccess}
except Exception:  # pragma: no cover - keep host probing alive without it
    CREATE_RULESET_VERSION, SYSCALL_CREATE_RULESET, SYSCALL_ADD_RULE, SYSCALL_RESTRICT_SELF = 1, 444, 445, 446
    _FS = {}


def _fs(name: str, bit: int) -> int:
    value = _FS.get(name, 1 << bit)
    assert value == 1 << bit, f"FSAccess.{name} changed"  # uapi values never change
    return value


EXECUTE = _fs("EXECUTE", 0)
WRITE_FILE = _fs("WRITE_FILE", 1)
READ_FILE = _fs("READ_FILE", 2)
READ_DIR = _fs("READ_DIR", 3)
REMOVE_DIR = _fs("REMOVE_DIR", 4)
REMOVE_FILE = _fs("REMOVE_FILE", 5)
MAKE_CHAR = _fs("MAKE_CHAR", 6)
MAKE_DIR = _fs("MAKE_DIR", 7)
MAKE_REG = _fs("MAKE_REG", 8)
MAKE_SOCK = _fs("MAKE_SOCK", 9)
MAKE_FIFO = _fs("MAKE_FIFO", 10)
MAKE_BLOCK = _fs("MAKE_BLOCK", 11)
MAKE_SYM = _fs("MAKE_SYM", 12)
REFER = _fs("REFER", 13)  # ABI 2
TRUNCATE = _fs("TRUNCATE", 14)  # ABI 3
IOCTL_DEV = _fs("IOCTL_DEV", 15)  # ABI 5

ACCESS_FS_V1 = (1 << 13) - 1
#: rights that a rule on a non-directory may carry (others: EINVAL)
ACCESS_FILE = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV

ACCESS_NET_BIND_TCP = 1 << 0  # ABI 4
ACCESS_NET_CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1

RULE_PATH_BENEATH = 1
RULE_NET_PORT = 2

#: what a read path grants: read and execute files, list directories
READ_RIGHTS = READ_FILE | EXECUTE | READ_DIR
#: what a write path grants: everything but device creation. IOCTL_DEV is
#: left out too: it only matters for device files, which belong in device paths.
WRITE_RIGHTS = (
    READ_RIGHTS
    | WRITE_FILE
    | REMOVE_DIR
    | REMOVE_FILE
    | MAKE_DIR
    | MAKE_REG
    | MAKE_SOCK
    | MAKE_FIFO
    | MAKE_SYM
    | REFER
    | TRUNCATE
)
#: what a device path grants. TRUNCATE because a shell's ``> /dev/null`` opens
#: with O_TRUNC, which Landlock checks as a truncation (ABI 3).
DEVICE_RIGHTS = READ_FILE | WRITE_FILE | TRUNCATE | IOCTL_DEV


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # __attribute__((packed)) in the uapi header: 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPortAttr(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


def _syscall():
    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.syscall
    fn.restype = ctypes.c_long
    return fn


def handled_fs(abi: int) -> int:
    """Every filesystem right the given ABI knows (all are handled = denied by default)."""
    if abi < 1:
        return 0
    rights = ACCESS_FS_V1
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    if abi >= 5:
        rights |= IOCTL_DEV
    return rights


def ruleset_attr_size(abi: int) -> int:
    """sizeof(struct landlock_ruleset_attr) as the given ABI defines it."""
    if abi >= 6:
        return 24
    if abi >= 4:
        return 16
    return 8


def abi_version() -> Tuple[int, str]:
    """(ABI version, reason it is 0). Never raises."""
    if platform.system() != "Linux":
        return 0, f"Landlock is Linux-only (this is {platform.system()})"
    try:
        syscall = _syscall()
    except (OSError, AttributeError) as exc:  # pragma: no cover
        return 0, f"cannot load libc: {exc}"
    ctypes.set_errno(0)
    res = syscall(ctypes.c_long(SYSCALL_CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    if res >= 0:
        return int(res), ""
    err = ctypes.get_errno()
    if err == errno.ENOSYS:
        return 0, f"kernel {platform.release()} has no Landlock syscalls (needs Linux 5.13 with CONFIG_SECURITY_LANDLOCK)"
    if err == errno.EOPNOTSUPP:
        return 0, "Landlock is built in but disabled at boot (add 'landlock' to the lsm= kernel parameter)"
    return 0, f"landlock_create_ruleset(VERSION) failed: {os.strerror(err)}"


@dataclass(frozen=True)
class LandlockPlan:
    """What one ruleset will handle; built by :func:`plan`."""

    abi: int
    handled_fs: int
    handled_net: int
    scoped: int


def plan(abi: int, *, confine_net: bool, scope: bool) -> LandlockPlan:
    return LandlockPlan(
        abi=abi,
        handled_fs=handled_fs(abi),
        handled_net=(ACCESS_NET_BIND_TCP | ACCESS_NET_CONNECT_TCP) if (confine_net and abi >= 4) else 0,
        scoped=(SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if (scope and abi >= 6) else 0,
    )


def _check(res: int, name: str, hint: str = "") -> int:
    if res < 0:
        err = ctypes.get_errno()
        raise KernelError(name, err, os.strerror(err), hint or None)
    return res


def restrict_self(
    p: LandlockPlan,
    *,
    read_paths: Iterable[str] = (),
    write_paths: Iterable[str] = (),
    device_paths: Iterable[str] = (),
    tcp_connect_ports: Iterable[int] = (),
) -> List[str]:
    """Build the ruleset and enforce it on the calling thread.

    Paths that do not exist (or cannot be opened) are skipped silently: the
    caller passes candidates, and a skipped path is simply denied. Needs
    no_new_privs (or CAP_SYS_ADMIN). Returns the paths that got a rule.
    """
    syscall = _syscall()
    attr = _RulesetAttr(p.handled_fs, p.handled_net, p.scoped)
    ctypes.set_errno(0)
    ruleset_fd = _check(
        syscall(
            ctypes.c_long(SYSCALL_CREATE_RULESET),
            ctypes.byref(attr),
            ctypes.c_size_t(ruleset_attr_size(p.abi)),
            ctypes.c_uint32(0),
        ),
        "landlock_create_ruleset",
    )
    ruled: List[str] = []
    try:
        groups = ((read_paths, READ_RIGHTS), (write_paths, WRITE_RIGHTS), (device_paths, DEVICE_RIGHTS))
        for paths, rights in groups:
            for path in paths:
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    continue
                try:
                    allowed = rights & p.handled_fs
                    if not stat.S_ISDIR(os.fstat(fd).st_mode):
                        allowed &= ACCESS_FILE
                    if not allowed:
                        continue
                    rule = _PathBeneathAttr(allowed, fd)
                    ctypes.set_errno(0)
                    _check(
                        syscall(
                            ctypes.c_long(SYSCALL_ADD_RULE),
                            ctypes.c_int(ruleset_fd),
                            ctypes.c_int(RULE_PATH_BENEATH),
                            ctypes.byref(rule),
                            ctypes.c_uint32(0),
                        ),
                        f"landlock_add_rule({path})",
                    )
                    ruled.append(path)
                finally:
                    os.close(fd)
        if p.handled_net & ACCESS_NET_CONNECT_TCP:
            for port in sorted(set(int(x) for x in tcp_connect_ports)):
                rule_net = _NetPortAttr(ACCESS_NET_CONNECT_TCP, port)
                ctypes.set_errno(0)
                _check(
                    syscall(
                        ctypes.c_long(SYSCALL_ADD_RULE),
                        ctypes.c_int(ruleset_fd),
                        ctypes.c_int(RULE_NET_PORT),
                        ctypes.byref(rule_net),
                        ctypes.c_uint32(0),
                    ),
                    f"landlock_add_rule(tcp port {port})",
                )
        ctypes.set_errno(0)
        _check(
            syscall(ctypes.c_long(SYSCALL_RESTRICT_SELF), ctypes.c_int(ruleset_fd), ctypes.c_uint32(0)),
            "landlock_restrict_self",
            "no_new_privs must be set first",
        )
    finally:
        os.close(ruleset_fd)
    return ruled
