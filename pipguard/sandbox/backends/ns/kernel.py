"""The kernel calls of the namespace backend: constants, the ctypes prototypes (``os.unshare``
is Python >= 3.12 only), ``mount``/``mount_setattr``, the uid switch, the idmap user
namespace, why an unprivileged user namespace is refused, and bringing up ``lo``.

Everything here that runs after the fork imports nothing (the caller may have had other
threads) and writes only with ``os.write``; libc is loaded at import, before any fork.
Imports only the standard library.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import struct
from typing import Optional, Tuple

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MS_SLAVE = 1 << 19
MNT_DETACH = 2

AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
MOVE_MOUNT_F_EMPTY_PATH = 4
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_IDMAP = 0x100000

# The newer syscalls have one number on every architecture (>= 403);
# pivot_root does not.
SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
SYS_MOUNT_SETATTR = 442
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}.get(os.uname().machine, 155)

PR_SET_PDEATHSIG = 1
PR_GET_DUMPABLE = 3
PR_SET_DUMPABLE = 4
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


class NamespaceError(Exception):
    """A namespace step failed (raised in the forked process, sent to the launcher)."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint


_libc = ctypes.CDLL(None, use_errno=True)  # loaded before any fork
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.syscall.restype = ctypes.c_long
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_libc.sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _b(path: Optional[str]) -> Optional[bytes]:
    return None if path is None else os.fsencode(path)


def _mount(source: Optional[str], target: str, fstype: Optional[str], flags: int,
           data: Optional[str] = None) -> None:
    _check(_libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data)), f"mount {target}")


def _setattr(path: str, set_bits: int, userns_fd: int = 0, fd: int = AT_FDCWD,
             flags: int = AT_RECURSIVE) -> None:
    """mount_setattr(2): change only the named attributes (the kernel keeps
    the flags it locked for an unprivileged mount namespace)."""
    attr = ctypes.create_string_buffer(struct.pack("=QQQQ", set_bits, 0, 0, userns_fd), 32)
    _check(_libc.syscall(SYS_MOUNT_SETATTR, fd, _b(path), flags, attr, 32), f"mount_setattr {path or fd}")


def why_denied(err: int) -> Tuple[str, str]:
    """(reason, hint) for a failed unprivileged ``unshare(CLONE_NEWUSER)``:
    reads the knobs that deny it (no imports: runs after the fork)."""

    def knob(path: str) -> str:
        try:
            with open(path, "rb") as fh:
                return fh.read().decode().strip()
        except OSError:
            return ""

    if knob("/proc/sys/user/max_user_namespaces") == "0":
        return ("user namespaces are disabled (sysctl user.max_user_namespaces=0)",
                "raise user.max_user_namespaces, or use --isolation os")
    if knob("/proc/sys/kernel/unprivileged_userns_clone") == "0":
        return ("unprivileged user namespaces are disabled (sysctl kernel.unprivileged_userns_clone=0)",
                "enable kernel.unprivileged_userns_clone, or use --isolation os")
    if knob("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
        return ("AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1, "
                "Ubuntu >= 23.10)", "allow it with an AppArmor profile for pipguard's interpreter, or use --isolation os")
    if err == errno.ENOSPC:
        return "the user namespace limit is reached (user.max_user_namespaces)", "use --isolation os"
    if err == errno.EPERM:
        seccomp = ""
        for line in knob("/proc/self/status").splitlines():
            if line.startswith("Seccomp:"):
                seccomp = line.split()[-1]
        if seccomp and seccomp != "0":
            return ("unshare(CLONE_NEWUSER) is refused by a seccomp filter around pipguard "
                    "(e.g. a container runtime's default profile)", "run the container with a profile that allows "
                    "unshare, or use --isolation os")
        return "unshare(CLONE_NEWUSER) is not permitted here", "use --isolation os"
    if err == errno.EINVAL:
        return "the kernel has no user namespaces", "use --isolation os"
    return f"unshare(CLONE_NEWUSER) failed: {os.strerror(err)}", "use --isolation os"


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _become(uid: int, gid: int) -> None:
    """Root to ``uid``/``gid`` for good (supplementary groups dropped). The
    uid change makes us non-dumpable: set it back, or our /proc files (the
    uid and gid maps) stay root's (bwrap does the same)."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)


def _userns_fd(map_uid: int, map_gid: int, host_uid: int, host_gid: int) -> int:
    """As root: a user namespace fd mapping ``map_uid`` -> ``host_uid`` (and
    gids): the idmapping that makes files owned by ``map_uid`` on disk appear
    as ``host_uid``'s through a mount. A throw-away child holds it while we
    write its maps (root may write any map for a child namespace)."""
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            os.close(done_w)
            err = 0 if _libc.unshare(CLONE_NEWUSER) == 0 else ctypes.get_errno()
            os.write(ready_w, b"%d\n" % err)
            os.read(done_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(done_r)
    try:
        err = int(os.read(ready_r, 16).strip() or errno.EPERM)
        if err:
            reason, hint = why_denied(err)
            raise NamespaceError(f"the namespace backend is unavailable: {reason}", hint)
        _write(f"/proc/{pid}/uid_map", f"{map_uid} {host_uid} 1\n")
        _write(f"/proc/{pid}/gid_map", f"{map_gid} {host_gid} 1\n")
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(done_w)
        os.close(ready_r)
        os.waitpid(pid, 0)


def _loopback_up() -> None:
    """Bring ``lo`` up (the kernel then gives it 127.0.0.1/8 and ::1)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        req = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))
    finally:
        sock.close()
