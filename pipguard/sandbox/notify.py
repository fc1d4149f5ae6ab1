"""seccomp user notification, supervisor side: receive, decode, respond.

pyseccomp only speaks notification through the filter object of the process
that loaded it; the supervisor is another process, so this module talks the
kernel's ioctl interface on the listener fd directly (linux/seccomp.h).

Safety rule (seccomp_unotify(2)): after inspecting pointer arguments the
supervisor may *deny* or *observe*; it never lets a syscall through *because*
of what it read (the memory can change between our read and the kernel's).
Enforcement stays in Landlock and the seccomp filter itself.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import select
import socket
import struct
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

# struct seccomp_notif { u64 id; u32 pid; u32 flags; struct seccomp_data data; }
# struct seccomp_data  { int nr; u32 arch; u64 instruction_pointer; u64 args[6]; }
_NOTIF = struct.Struct("=QIIiIQ6Q")
# struct seccomp_notif_resp { u64 id; s64 val; s32 error; u32 flags; }
_RESP = struct.Struct("=QqiI")
IOCTL_RECV = 0xC0502100
IOCTL_SEND = 0xC0182101
IOCTL_ID_VALID = 0x40082102
# struct seccomp_notif_addfd { u64 id; u32 flags; u32 srcfd; u32 newfd; u32 newfd_flags; }
_ADDFD = struct.Struct("=QIIII")
IOCTL_ADDFD = 0x40182103
ADDFD_FLAG_SETFD = 1
IOCTL_SET_FLAGS = 0x40082104
FD_SYNC_WAKE_UP = 1


def id_valid(listener: int, notification_id: int) -> bool:
    """Is the notification still pending (its thread alive, its syscall not
    interrupted)? SECCOMP_IOCTL_NOTIF_ID_VALID."""
    try:
        fcntl.ioctl(listener, IOCTL_ID_VALID, struct.pack("=Q", notification_id))
        return True
    except OSError:
        return False


def sync_wake_up(listener: int) -> bool:
    """Ask the kernel to switch directly between the notifying thread and
    the supervisor (SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP, Linux >= 6.6): one
    notification round trip then costs far less. False where unsupported.

    The flags travel by value in the ioctl argument, not behind a pointer
    (kernel/seccomp.c: ``seccomp_notify_set_flags(filter, arg)``); passing a
    buffer makes the kernel see its address as flags and refuse (EINVAL)."""
    try:
        fcntl.ioctl(listener, IOCTL_SET_FLAGS, FD_SYNC_WAKE_UP)
        return True
    except OSError:
        return False
FLAG_CONTINUE = 1

_SYS_pidfd_open = 434
_SYS_pidfd_getfd = 438
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class Notification:
    id: int
    pid: int
    nr: int
    arch: int
    args: Tuple[int, ...]


def receive(listener: int) -> Optional[Notification]:
    """One pending notification, or None when the target died meanwhile or
    none is pending.

    Asks poll first: on Linux 6.1 (Debian 12; the VM backend's guest kernel)
    a listener whose tasks have all exited polls as POLLHUP without POLLIN,
    and SECCOMP_IOCTL_NOTIF_RECV on it then blocks for ever; newer kernels
    return ENOENT. Found when the supervisor, once the native responder had
    ended, hung in RECV after the command exited."""
    ready = select.poll()
    ready.register(listener, select.POLLIN)
    if not any(events & select.POLLIN for _fd, events in ready.poll(0)):
        return None
    buf = bytearray(_NOTIF.size)
    try:
        fcntl.ioctl(listener, IOCTL_RECV, buf, True)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.EINTR, errno.EAGAIN):
            return None
        raise
    return decode(bytes(buf))


def hung_up(listener: int) -> bool:
    """Whether no task uses the listener's filter any more (POLLHUP, nothing
    pending): then none ever will -- a filter passes only to the children of
    a task that has it -- and no notification can come. Until the run's exit
    is reported, such a listener polls readable at once, again and again:
    the supervisor's loop spun on it ~650 times per hook call (measured)."""
    ready = select.poll()
    ready.register(listener, select.POLLIN)
    return any(events & select.POLLHUP and not events & select.POLLIN for _fd, events in ready.poll(0))


NOTIF_SIZE = _NOTIF.size


def decode(raw: bytes) -> Notification:
    """A Notification from a raw struct seccomp_notif (as the kernel or the
    native responder hands it over)."""
    nid, pid, _flags, nr, arch, _ip, *args = _NOTIF.unpack(raw)
    return Notification(nid, pid, nr, arch, tuple(args))


def respond_continue(listener: int, nid: int) -> None:
    _send(listener, _RESP.pack(nid, 0, 0, FLAG_CONTINUE))


def respond_error(listener: int, nid: int, err: int) -> None:
    _send(listener, _RESP.pack(nid, 0, -abs(err), 0))


def _send(listener: int, packed: bytes) -> None:
    try:
        fcntl.ioctl(listener, IOCTL_SEND, packed)
    except OSError as exc:
        if exc.errno != errno.ENOENT:  # target died or was interrupted: nothing to answer
            raise


def install_fd(listener: int, nid: int, ours: int, their_fd: int, cloexec: bool) -> None:
    """Replace descriptor ``their_fd`` of the notifying process with a copy of
    ``ours`` (SECCOMP_IOCTL_NOTIF_ADDFD with SETFD, Linux >= 5.14)."""
    flags = os.O_CLOEXEC if cloexec else 0
    fcntl.ioctl(listener, IOCTL_ADDFD, _ADDFD.pack(nid, ADDFD_FLAG_SETFD, ours, their_fd, flags))


def respond_value(listener: int, nid: int, value: int) -> None:
    """Complete the syscall ourselves with return ``value`` (no CONTINUE)."""
    _send(listener, _RESP.pack(nid, value, 0, 0))


def fd_flags(pid: int, fd: int) -> int:
    """The open-file flags of ``fd`` in ``pid`` (from /proc/<pid>/fdinfo)."""
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}") as fh:
            for line in fh:
                if line.startswith("flags:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0


def take_fd(pid: int, fd: int) -> int:
    """Duplicate ``fd`` of process ``pid`` into this process (pidfd_getfd)."""
    pidfd = _libc.syscall(_SYS_pidfd_open, pid, 0)
    if pidfd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"pidfd_open: {os.strerror(err)}")
    try:
        got = _libc.syscall(_SYS_pidfd_getfd, pidfd, fd, 0)
        if got < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"pidfd_getfd: {os.strerror(err)}")
        os.set_inheritable(got, False)
        return got
    finally:
        os.close(pidfd)


class Memory:
    """Reads of a target's memory through /proc/<pid>/mem, one fd per pid."""

    def __init__(self) -> None:
        self._fds: Dict[int, int] = {}

    def _fd(self, pid: int) -> int:
        fd = self._fds.get(pid)
        if fd is None:
            fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
            self._fds[pid] = fd
        return fd

    def forget(self, pid: int) -> None:
        fd = self._fds.pop(pid, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        for pid in list(self._fds):
            self.forget(pid)

    def closed(self, pid: int) -> bool:
        """Is ``pid``'s memory closed to this process (``EACCES``/``EPERM``: it made itself
        non-dumpable and we lack CAP_SYS_PTRACE over it), rather than gone or unmapped?"""
        self.forget(pid)
        try:
            self._fd(pid)
        except PermissionError:
            return True
        except OSError:
            return False
        return False

    def read(self, pid: int, addr: int, size: int) -> bytes:
        if not addr:
            return b""
        try:
            return os.pread(self._fd(pid), size, addr)
        except OSError:
            self.forget(pid)  # exec replaced the mm, or the process is gone
            try:
                return os.pread(self._fd(pid), size, addr)
            except OSError:
                return b""

    def string(self, pid: int, addr: int, limit: int = 4096) -> str:
        out = b""
        while len(out) < limit:
            # Stay inside one page per read: the next page may be unmapped.
            chunk = min(256, 4096 - ((addr + len(out)) % 4096))
            data = self.read(pid, addr + len(out), chunk)
            if not data:
                break
            end = data.find(b"\0")
            if end >= 0:
                out += data[:end]
                break
            out += data
        return os.fsdecode(out[:limit])

    def string_array(self, pid: int, addr: int, limit: int = 256) -> List[str]:
        out = []
        for i in range(limit):
            raw = self.read(pid, addr + 8 * i, 8)
            if len(raw) < 8:
                break
            ptr = struct.unpack("=Q", raw)[0]
            if not ptr:
                break
            out.append(self.string(pid, ptr, 2048))
        return out


def decode_sockaddr(raw: bytes) -> Tuple[str, str, Optional[int]]:
    """(family, address, port) from a struct sockaddr's bytes."""
    if len(raw) < 2:
        return ("unknown", "", None)
    family = struct.unpack("=H", raw[:2])[0]
    if family == socket.AF_INET and len(raw) >= 8:
        port = struct.unpack("!H", raw[2:4])[0]
        return ("inet", socket.inet_ntop(socket.AF_INET, raw[4:8]), port)
    if family == socket.AF_INET6 and len(raw) >= 24:
        port = struct.unpack("!H", raw[2:4])[0]
        return ("inet6", socket.inet_ntop(socket.AF_INET6, raw[8:24]), port)
    if family == socket.AF_UNIX:
        path = raw[2:]
        if path[:1] == b"\0":
            return ("unix", "@" + os.fsdecode(path[1:].rstrip(b"\0")), None)
        return ("unix", os.fsdecode(path.split(b"\0", 1)[0]), None)
    names = {16: "netlink", 17: "packet"}
    return (names.get(family, f"af{family}"), "", None)


def proc_stat(pid: int) -> Tuple[int, str]:
    """(ppid, comm) of ``pid`` from /proc, or (0, "") when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return 0, ""
    close = data.rfind(b")")
    comm = os.fsdecode(data[data.find(b"(") + 1: close])
    fields = data[close + 2:].split()
    return int(fields[1]), comm
