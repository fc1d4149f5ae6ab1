"""The unprivileged user a sandbox runs as when pipguard itself runs as root.

Why: with every capability dropped, uid 0 is still the *owner* of root's
files, so a mode-0600 root-owned file in a directory the sandbox may read
(a ``*.conf`` in ``/etc``, a token under ``/opt``) stays readable. Running
the sandbox as another uid makes the kernel's own permission checks keep
every root-only file out of reach — no list of names to keep complete.

Which uid: one per run, leased from :data:`UIDS` (a range outside the usual
system, user, ``nobody``, systemd DynamicUser 61184–65519 and subordinate-uid
ranges; every candidate is also checked against passwd, group,
``/etc/subuid``/``subgid`` and this process's uid/gid map). Not ``nobody``:
it is shared with NFS squashing and daemons, and a sandbox running as
``nobody`` could signal or ptrace their processes and read or change their
files if anything let it. One uid per run, like systemd's DynamicUser:
concurrent runs cannot reach each other's files even without Landlock
(``--isolation audit``), and whatever that uid owns or runs after the run
is this run's to clean up. The gid is the same number; no supplementary
groups.

The grants a run needs, made through this uid's lease, and their undoing: :mod:`pipguard.sandbox.uidlease`.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import signal
import stat
import sys
import time
from dataclasses import dataclass
from typing import List, Tuple

from pipguard.errors import PipguardError, SandboxUserError

#: sandbox uids (and gids): 1000 concurrent runs
UIDS = range(1_860_000, 1_861_000)
#: where leases live: root-only, never in a world-writable dir
STATE_DIRS = ("/run/pipguard", "/var/lib/pipguard")


@dataclass(frozen=True)
class SandboxUser:
    """The uid/gid a run's sandbox runs as (no supplementary groups)."""

    uid: int
    gid: int


#: set by the VM backend's guest: its root is the disposable guest's, and the shares it
#: writes are 9p mounts whose permissions the host keeps (mapped-xattr), not ACLs
IN_VM_GUEST = False


def needed() -> bool:
    """True when the sandbox must switch user: pipguard is root on Linux (not in a VM guest)."""
    return sys.platform.startswith("linux") and os.geteuid() == 0 and not IN_VM_GUEST


def state_dir() -> str:
    for d in STATE_DIRS:
        parent = os.path.dirname(d)
        if not os.path.isdir(parent):
            continue
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        except OSError:
            continue
        if not os.access(d, os.W_OK | os.X_OK):
            continue  # a read-only mount there (the VM guest shares its config at /run/pipguard)
        st = os.lstat(d)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o077:
            raise SandboxUserError(f"{d} is not a root-owned 0700 directory; pipguard will not keep leases there",
                                   hint=f"remove {d} and run again")
        return d
    raise SandboxUserError("no place for pipguard's sandbox-user leases (" + ", ".join(STATE_DIRS) + ")")


def _id_map(path: str) -> List[Tuple[int, int]]:
    try:
        with open(path) as f:
            return [(int(a), int(a) + int(n)) for a, _b, n in (line.split() for line in f)]
    except OSError:
        return [(0, 1 << 32)]


def _subordinate(path: str) -> List[Tuple[int, int]]:
    out = []
    try:
        with open(path) as f:
            for line in f:
                parts = line.strip().split(":")
                if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
                    out.append((int(parts[1]), int(parts[1]) + int(parts[2])))
    except OSError:
        pass
    return out


_UNNAMED: set = set()  # ids found in neither passwd nor group (NSS lookups cost ms; cached)


def usable(n: int, maps) -> bool:
    uid_map, gid_map, sub_u, sub_g = maps
    if not any(a <= n < b for a, b in uid_map) or not any(a <= n < b for a, b in gid_map):
        return False
    if any(a <= n < b for a, b in sub_u + sub_g):
        return False
    if n in _UNNAMED:
        return True
    try:
        pwd.getpwuid(n)
        return False
    except KeyError:
        pass
    try:
        grp.getgrgid(n)
        return False
    except KeyError:
        _UNNAMED.add(n)
        return True


def processes_of(uid: int) -> List[int]:
    """Live (not zombie) pids whose real, effective, saved or filesystem uid
    is ``uid``. From /proc/PID/status, not the owner of /proc/PID: a process
    that made itself non-dumpable shows root there."""
    out = []
    want = str(uid).encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fd = os.open(f"/proc/{name}/status", os.O_RDONLY | os.O_CLOEXEC)
            try:
                data = os.read(fd, 4096)
            finally:
                os.close(fd)
        except OSError:
            continue
        state = data.find(b"\nState:\t")
        if state >= 0 and data[state + 8:state + 9] in (b"Z", b"X"):
            continue
        at = data.find(b"\nUid:\t")
        if at >= 0 and want in data[at + 6:data.find(b"\n", at + 6)].split():
            out.append(int(name))
    return out


def kill_all(uid: int) -> List[int]:
    """SIGKILL every process running as ``uid`` (only sandboxes run as a
    leased uid); returns the pids that were found."""
    killed: List[int] = []
    for _ in range(50):
        pids = processes_of(uid)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.01)
    return sorted(set(killed))


def maps():
    return (_id_map("/proc/self/uid_map"), _id_map("/proc/self/gid_map"),
            _subordinate("/etc/subuid"), _subordinate("/etc/subgid"))


def usable_count() -> int:
    """How many uids of :data:`UIDS` this host could lease (for ``doctor``)."""
    found = maps()
    return sum(1 for n in UIDS if usable(n, found))


def hook_config(text: str, user: SandboxUser) -> str:
    """The audit hook's configuration with the sandbox user added: the hook
    then reports reads the kernel refuses that user (root-only files)."""
    config = json.loads(text)
    config["sandbox_user"] = [user.uid, user.gid]
    return json.dumps(config, separators=(",", ":"))


__all__ = ["SandboxUser", "UIDS", "hook_config", "kill_all", "needed", "processes_of", "state_dir", "switch_to"]


def switch_to(uid: int, gid: int) -> None:
    """Switch this root process to ``uid``/``gid`` for good (no supplementary
    groups) and keep it able to take its own children's seccomp listeners.
    The pkgbuild build user and the VM guest's pipguard both switch with it."""
    # groups and gid first, while CAP_SETGID is still there
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise PipguardError(f"could not switch to uid {uid}")
    # A uid change clears the dumpable flag (and a forked child inherits it);
    # the supervisor needs it set to take its own child's seccomp listener
    # (pidfd_getfd checks ptrace access: without it EPERM, no supervisor, and
    # every notified syscall, exec first, then fails with ENOSYS). Sandboxed
    # processes still cannot ptrace this process: Landlock forbids tracing
    # outside their domain.
    PR_SET_DUMPABLE = 4
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0:
        raise PipguardError("could not make the process traceable by itself (prctl PR_SET_DUMPABLE)")
