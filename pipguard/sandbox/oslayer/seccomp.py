"""The seccomp filter: a deny-list (default ALLOW) plus user-notification observers.

A denied syscall returns an errno (EPERM; ENOSYS for clone3) so that a build
fails cleanly and is never killed. With ``notify`` the deny rules use
SCMP_ACT_NOTIFY instead: the supervisor holding the listener fd answers with
the errno of :data:`DENY_ERRNO` and records the attempt. Observation rules
(exec, connect, opens for writing, ...) are NOTIFY too; the supervisor answers
them with SECCOMP_USER_NOTIF_FLAG_CONTINUE. It must never CONTINUE a "deny":
CONTINUE after inspecting pointer arguments is a TOCTOU hole (seccomp_unotify(2)),
so nothing here lets the supervisor *allow* what the filter denies.

Foreign ABIs: the filter holds only the native architecture. libseccomp's
bad-arch action is set to ERRNO(ENOSYS), so ``int 0x80`` (i386) syscalls fail;
on x86_64 libseccomp also sends x32 numbers (>= 0x40000000) to that action.

If the listener fd is closed while the filter is live, every notified syscall
fails with ENOSYS (fail closed).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from pipguard import rules
from pipguard.errors import KernelError

if TYPE_CHECKING:  # pragma: no cover
    from pipguard.sandbox.oslayer import OsLayerSpec


def _fast_find_library():
    """pyseccomp resolves libc and libseccomp with ctypes.util.find_library,
    which runs ``ldconfig -p`` (twice: ~10-20 ms on every sandbox start).
    Try the sonames with dlopen first; fall back to the real lookup."""
    import ctypes
    import ctypes.util

    original = ctypes.util.find_library
    sonames = {"c": "libc.so.6", "seccomp": "libseccomp.so.2"}

    def find_library(name):
        soname = sonames.get(name)
        if soname:
            try:
                ctypes.CDLL(soname)
                return soname
            except OSError:
                pass
        return original(name)

    ctypes.util.find_library = find_library
    return original


try:
    _original_find_library = _fast_find_library()
    import pyseccomp as _sc

    _IMPORT_ERROR = ""
except Exception as exc:  # RuntimeError("Unable to find libseccomp"), OSError, ImportError
    _sc = None  # type: ignore[assignment]
    _IMPORT_ERROR = str(exc) or type(exc).__name__
finally:
    import ctypes.util

    ctypes.util.find_library = _original_find_library

# Constants the supervisor needs to talk to the listener (include/uapi/linux/seccomp.h).
SECCOMP_IOCTL_NOTIF_RECV = 0xC0502100
SECCOMP_IOCTL_NOTIF_SEND = 0xC0182101
SECCOMP_IOCTL_NOTIF_ID_VALID = 0x40082102
SECCOMP_USER_NOTIF_FLAG_CONTINUE = 1
SYS_PIDFD_GETFD = 438  # same number on every architecture

PR_GET_SECCOMP = 21
CLONE_THREAD = 0x00010000
TIOCSTI = 0x5412
TIOCLINUX = 0x541C
PER_LINUX = 0
PER_QUERY = 0xFFFFFFFF
SOCK_TYPE_MASK = 0xF
SOCK_RAW = 3
SOCK_PACKET = 10
AF_NETLINK = 16
NETLINK_ROUTE = 0
AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10

#: denied outright (ERRNO EPERM, or NOTIFY + supervisor answers EPERM)
DENY_ALWAYS: Tuple[str, ...] = (
    "ptrace", "process_vm_readv", "process_vm_writev",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "bpf", "perf_event_open", "userfaultfd",
    "add_key", "request_key", "keyctl",
    "mount", "umount2", "pivot_root", "fsopen", "fsconfig", "fsmount", "fspick",
    "move_mount", "open_tree", "mount_setattr",
    "unshare", "setns",
    "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module",
    "open_by_handle_at", "name_to_handle_at",
    "acct", "swapon", "swapoff", "reboot",
    "settimeofday", "clock_settime", "adjtimex", "clock_adjtime",
    "syslog", "quotactl", "quotactl_fd", "lookup_dcookie", "vhangup", "pidfd_getfd",
    "uselib", "_sysctl", "nfsservctl", "iopl", "ioperm",
)
#: denied only for some arguments (see :func:`build_filter`)
DENY_CONDITIONAL: Tuple[str, ...] = ("personality", "ioctl", "socket", "socketpair",
                                     "chmod", "fchmod", "fchmodat", "fchmodat2", "mknod", "mknodat")
#: where the mode is among each mode-setting syscall's arguments
MODE_ARG: Dict[str, int] = {"chmod": 1, "fchmod": 1, "fchmodat": 2, "fchmodat2": 2, "mknod": 1, "mknodat": 2}
#: setuid and setgid, one rule each (pipguard.rules.PRIVILEGED_MODES)
PRIVILEGED_MODE_BITS = tuple(1 << i for i in range(12) if rules.PRIVILEGED_MODES >> i & 1)
PROCESS_CREATION: Tuple[str, ...] = ("fork", "vfork", "clone")
#: clone's flags that make new namespaces (NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID,
#: NEWNET): refused as unshare is (DENY_ALWAYS)
CLONE_NAMESPACES: Tuple[int, ...] = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000,
                                     0x20000000, 0x40000000)
#: notified for observation (answered CONTINUE)
OBSERVE: Tuple[str, ...] = (
    "execve", "execveat", "connect", "bind", "sendto", "sendmsg", "sendmmsg", "exit_group",
    "open", "creat", "openat", "openat2",
)
#: signal senders, notified so a signal aimed out of the sandbox is *reported*: Landlock's
#: signal scope (ABI 6) refuses it silently. The supervisor answers EPERM (register args only,
#: no pointer, no TOCTOU) when the target is outside, CONTINUE otherwise -- Landlock enforces.
SIGNALS: Tuple[str, ...] = (
    "kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_send_signal",
)

#: errno the supervisor answers for each syscall the filter denies
DENY_ERRNO: Dict[str, int] = {name: errno.EPERM for name in DENY_ALWAYS + DENY_CONDITIONAL + PROCESS_CREATION}
DENY_ERRNO["clone3"] = errno.ENOSYS  # never notified: plain ERRNO so glibc falls back to clone

_WRITE_OPEN_BITS = (os.O_WRONLY, os.O_RDWR, os.O_CREAT, os.O_TRUNC)


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.prctl.restype = ctypes.c_int
    return libc


def available() -> Tuple[bool, str]:
    """Can this process load a seccomp filter through libseccomp? (ok, reason if not)."""
    if platform.system() != "Linux":
        return False, f"seccomp is Linux-only (this is {platform.system()})"
    if _sc is None:
        return False, f"libseccomp cannot be loaded: {_IMPORT_ERROR} (install libseccomp2)"
    ctypes.set_errno(0)
    if _libc().prctl(PR_GET_SECCOMP, 0, 0, 0, 0) < 0:
        err = ctypes.get_errno()
        return False, f"kernel has no seccomp (CONFIG_SECCOMP): {os.strerror(err)}"
    try:
        api = _sc.get_api()
    except NotImplementedError:
        return True, ""
    if api < 1:
        return False, "libseccomp reports no usable seccomp API on this kernel"
    return True, ""


def notify_available() -> Tuple[bool, str]:
    """Does the kernel + libseccomp support SECCOMP_RET_USER_NOTIF with a listener fd?"""
    ok, why = available()
    if not ok:
        return False, why
    if not hasattr(_sc._libseccomp, "seccomp_notify_fd"):
        return False, "libseccomp < 2.5 has no user notification support"
    try:
        api = _sc.get_api()
    except NotImplementedError:
        return False, "libseccomp too old to report its API level"
    if api < 5:
        return False, f"seccomp API level {api} < 5: user notification needs Linux 5.0 and libseccomp 2.5"
    return True, ""


def _nr(name: str) -> int:
    """Native syscall number of ``name``; negative when this architecture lacks it."""
    assert _sc is not None
    return int(_sc.resolve_syscall(_sc.Arch.NATIVE, name))


def _name(nr: int) -> str:
    assert _sc is not None
    try:
        return _sc.resolve_syscall(_sc.Arch.NATIVE, nr).decode()
    except ValueError:
        return f"syscall_{nr}"


#: nr -> name of every syscall a loaded filter sends to the supervisor; the
#: child hands it over so the supervisor need not load libseccomp itself.
NOTIFIED: Dict[int, str] = {}


def _add(f, action: int, name: str, *args) -> None:
    nr = _nr(name)
    if action == _sc.NOTIFY and nr >= 0:
        NOTIFIED[nr] = name
    if nr == -1:  # __NR_SCMP_ERROR: libseccomp has never heard of it
        return
    try:
        f.add_rule(action, nr, *args)
    except OSError as exc:
        raise KernelError(f"seccomp_rule_add({name})", exc.errno or errno.EINVAL, exc.strerror or str(exc)) from exc


def _deny_socket_domains(f, deny: int, allowed: List[int]) -> None:
    """Deny socket() for every domain not in ``allowed``.

    One comparison per rule (libseccomp refuses two on the same argument), and
    plain 64-bit compares: ``domain`` is an int, so a value with high bits set
    (which the kernel would truncate) lands in the final GT rule and is denied.
    """
    A = _sc.Arg
    allowed = sorted(allowed)
    _add(f, deny, "socket", A(0, _sc.LT, allowed[0]))
    for lo, hi in zip(allowed, allowed[1:]):
        for dom in range(lo + 1, hi):
            _add(f, deny, "socket", A(0, _sc.EQ, dom))
    _add(f, deny, "socket", A(0, _sc.GT, allowed[-1]))


def build_filter(spec: "OsLayerSpec", *, notify: bool):
    """The libseccomp filter for ``spec`` (not loaded). ``notify``: use NOTIFY actions."""
    assert _sc is not None
    A = _sc.Arg
    f = _sc.SyscallFilter(_sc.ALLOW)
    # Syscalls of a foreign ABI (int 0x80, x32) fail with ENOSYS; with a
    # supervisor they go to it first so that each attempt is reported.
    f.set_attr(_sc.Attr.ACT_BADARCH, _sc.NOTIFY if notify else _sc.ERRNO(errno.ENOSYS))
    f.set_attr(_sc.Attr.CTL_NNP, 0)  # no_new_privs is set explicitly, earlier

    def deny(name: str) -> int:
        return _sc.NOTIFY if notify else _sc.ERRNO(DENY_ERRNO[name])

    for name in DENY_ALWAYS:
        _add(f, deny(name), name)
    _add(f, _sc.ERRNO(errno.ENOSYS), "clone3")  # flags live in a struct BPF cannot read

    # personality(2) takes an unsigned int: allow exactly PER_LINUX and the
    # 0xffffffff query. Denied: anything above 32 bits, and any 32-bit value
    # whose bits are not all equal (some adjacent pair differs).
    _add(f, deny("personality"), "personality", A(0, _sc.GT, PER_QUERY))
    for bit in range(31):
        pair = 3 << bit
        _add(f, deny("personality"), "personality", A(0, _sc.MASKED_EQ, pair, 1 << bit))
        _add(f, deny("personality"), "personality", A(0, _sc.MASKED_EQ, pair, 2 << bit))

    # ioctl's request is an unsigned int: compare the low 32 bits only, or a
    # request with junk in the high bits slips past (the old TIOCSTI bypass).
    for request in (TIOCSTI, TIOCLINUX):
        _add(f, deny("ioctl"), "ioctl", A(1, _sc.MASKED_EQ, 0xFFFFFFFF, request))

    # No setuid/setgid bit from chmod/mknod (a register argument: no TOCTOU).
    for name, arg in MODE_ARG.items():
        for bit in PRIVILEGED_MODE_BITS:
            _add(f, deny(name), name, A(arg, _sc.MASKED_EQ, bit, bit))

    # socketpair: AF_UNIX only, in every mode.
    _add(f, deny("socketpair"), "socketpair", A(0, _sc.LT, AF_UNIX))
    _add(f, deny("socketpair"), "socketpair", A(0, _sc.GT, AF_UNIX))
    # socket: AF_UNIX is denied in every mode (Landlock <= ABI 7 cannot confine
    # connect() to pathname sockets such as docker.sock or ssh-agent).
    d = deny("socket")
    if spec.network == "none" and not notify:
        _add(f, d, "socket")
    elif spec.network in ("none", "ports"):
        # With a supervisor, "none" also lets TCP sockets be created so that
        # connect() reaches it and the destination is recorded; Landlock
        # (no TCP port granted) and the supervisor both refuse the connect.
        # UDP and everything else stay denied here, in the kernel.
        _deny_socket_domains(f, d, [AF_INET, AF_INET6])
        for dom in (AF_INET, AF_INET6):
            # anything but SOCK_STREAM (type & 0xf != 1) is denied: low nibble 0,
            # or bit 1, 2 or 3 set. SOCK_NONBLOCK/SOCK_CLOEXEC bits are ignored.
            _add(f, d, "socket", A(0, _sc.EQ, dom), A(1, _sc.MASKED_EQ, SOCK_TYPE_MASK, 0))
            for bit in (0x2, 0x4, 0x8):
                _add(f, d, "socket", A(0, _sc.EQ, dom), A(1, _sc.MASKED_EQ, bit, bit))
    elif spec.network == "all":
        _deny_socket_domains(f, d, [AF_INET, AF_INET6, AF_NETLINK])
        for dom in (AF_INET, AF_INET6):
            for kind in (SOCK_RAW, SOCK_PACKET):
                _add(f, d, "socket", A(0, _sc.EQ, dom), A(1, _sc.MASKED_EQ, SOCK_TYPE_MASK, kind))
        # netlink: NETLINK_ROUTE only (glibc's getaddrinfo uses it, with SOCK_RAW).
        _add(f, d, "socket", A(0, _sc.EQ, AF_NETLINK), A(2, _sc.GT, NETLINK_ROUTE))
    else:
        raise ValueError(f"network must be 'none', 'ports' or 'all', not {spec.network!r}")

    no_thread = A(0, _sc.MASKED_EQ, CLONE_THREAD, 0)
    if not spec.allow_subprocess:
        _add(f, deny("fork"), "fork")
        _add(f, deny("vfork"), "vfork")
        _add(f, deny("clone"), "clone", no_thread)
    elif notify:
        # every clone that is no thread, namespace flags included: the supervisor
        # refuses those (handlers: as unshare is), and counts the rest
        _add(f, _sc.NOTIFY, "fork")
        _add(f, _sc.NOTIFY, "vfork")
        _add(f, _sc.NOTIFY, "clone", no_thread)
    else:
        # no supervisor: clone with a namespace flag fails as unshare does (a user namespace
        # of its own gave a build chroot, and with it paths the supervisor resolved wrongly)
        for flag in CLONE_NAMESPACES:
            _add(f, _sc.ERRNO(errno.EPERM), "clone", A(0, _sc.MASKED_EQ, flag, flag))

    if notify:
        for name in ("execve", "execveat", "connect", "bind", "sendmsg", "sendmmsg", "exit_group", "creat", "openat2"):
            _add(f, _sc.NOTIFY, name)
        for name in SIGNALS:
            _add(f, _sc.NOTIFY, name)
        _add(f, _sc.NOTIFY, "sendto", A(4, _sc.NE, 0))  # only with a destination address
        if spec.observe_reads:
            _add(f, _sc.NOTIFY, "open")
            _add(f, _sc.NOTIFY, "openat")
        else:
            for bit in _WRITE_OPEN_BITS:
                _add(f, _sc.NOTIFY, "open", A(1, _sc.MASKED_EQ, bit, bit))
                _add(f, _sc.NOTIFY, "openat", A(2, _sc.MASKED_EQ, bit, bit))
    return f


#: programs compiled before a fork, by what they depend on (see prebuild)
_BUILT: Dict[Tuple[str, bool, bool, bool], bytes] = {}

SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV = 1 << 5  # Linux 5.19
#: why the listener could not make a pending syscall wait out signals, where it could not
NO_WAIT_KILLABLE = ("the kernel has no SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV (Linux 5.19): a signal "
                    "that reaches a process while the supervisor answers one of its syscalls makes "
                    "that syscall fail with EINTR (fork, open, execve, which programs do not retry)")


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _key(spec: "OsLayerSpec", notify: bool) -> Tuple[str, bool, bool, bool]:
    """Everything :func:`build_filter` reads."""
    return (spec.network, spec.allow_subprocess, spec.observe_reads, notify)


#: the kernel's limit on one filter program (BPF_MAXINSNS)
BPF_MAXINSNS = 4096


def export_program(f: Any) -> bytes:
    """The BPF program (struct sock_filter[]) that libseccomp generates for the
    filter ``f`` (a ``pyseccomp.SyscallFilter``), as it would load it.

    Checked before anyone loads it: a program that is empty, not whole 8-byte
    instructions or longer than the kernel takes is an error here, with its size,
    rather than an EINVAL from seccomp(2) in a sandbox's first process."""
    fd = os.memfd_create("pipguard-seccomp-bpf", os.MFD_CLOEXEC)
    try:
        rc = _sc._libseccomp.seccomp_export_bpf(f._filter, fd)
        if rc < 0:
            raise KernelError("seccomp_export_bpf", -rc, os.strerror(-rc))
        program = os.pread(fd, os.lseek(fd, 0, os.SEEK_END), 0)
    finally:
        os.close(fd)
    if not program or len(program) % 8 or len(program) // 8 > BPF_MAXINSNS:
        raise KernelError("seccomp_export_bpf", errno.EINVAL,
                          f"libseccomp produced a program of {len(program)} bytes "
                          f"(must be 1 to {BPF_MAXINSNS} instructions of 8 bytes)")
    return program


def compile_filter(spec: "OsLayerSpec", *, notify: bool) -> bytes:
    """The BPF program of :func:`build_filter`, as libseccomp generates it for
    loading. pipguard loads it itself (:func:`load_program`): libseccomp 2.5
    cannot ask for SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV."""
    return export_program(build_filter(spec, notify=notify))


def prebuild(spec: "OsLayerSpec", *, notify: bool) -> None:
    """Compile the filter for ``spec`` in this process, once, so that each
    sandbox's first process (a fork of it) only loads it: building takes
    5-9 ms of rule calls through ctypes, every run, on the path to the
    command. Never raises: the first process then builds its own."""
    if _sc is None or _key(spec, notify) in _BUILT:
        return
    try:
        _BUILT[_key(spec, notify)] = compile_filter(spec, notify=notify)
    except Exception:  # the child will try and report it
        pass


def load_program(program: bytes, *, listener: bool) -> Tuple[Optional[int], str]:
    """Load a compiled filter on the calling thread: (listener fd or None, degradation).

    With ``listener`` the filter gets a listener fd (O_CLOEXEC) and, where the
    kernel has it (5.19), WAIT_KILLABLE_RECV: once the supervisor has read a
    notification, the process waits for the answer through any signal but a
    fatal one. Without it, a signal handler that runs meanwhile (SIGCHLD in a
    shell or make) turns the pending fork/open/execve into EINTR, which no
    program expects from those calls: the build fails at random (seen: dash's
    "Cannot fork" in fakeroot). The degradation is "" or :data:`NO_WAIT_KILLABLE`.
    no_new_privs must already be set (the caller does it explicitly).
    """
    buf = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.addressof(buf))
    libc = _libc()
    nr = _nr("seccomp")
    attempts = ([SECCOMP_FILTER_FLAG_NEW_LISTENER | SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV,
                 SECCOMP_FILTER_FLAG_NEW_LISTENER] if listener else [0])
    for flags in attempts:
        ctypes.set_errno(0)
        rc = libc.syscall(ctypes.c_long(nr), ctypes.c_uint(SECCOMP_SET_MODE_FILTER), ctypes.c_uint(flags),
                          ctypes.byref(prog))
        if rc >= 0:
            degraded = NO_WAIT_KILLABLE if listener and not flags & SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV else ""
            return (int(rc) if listener else None), degraded
        err = ctypes.get_errno()
        if not (err == errno.EINVAL and flags & SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV):
            raise KernelError("seccomp(SECCOMP_SET_MODE_FILTER)", err, os.strerror(err))
    raise AssertionError("unreachable")  # pragma: no cover


def load(spec: "OsLayerSpec", *, notify: bool) -> Tuple[Optional[int], str]:
    """Build and load the filter on the calling thread: (listener fd with notify, degradation).

    The listener fd is O_CLOEXEC (the kernel creates it so). Once this returns,
    every notified syscall of this thread blocks until someone answers on
    that fd: hand it over with syscalls the filter never notifies (write to a
    pipe, then let the parent take it with :func:`take_listener`) -- a
    ``sendmsg`` with SCM_RIGHTS from this thread would wait for itself forever.
    """
    program = _BUILT.get(_key(spec, notify)) or compile_filter(spec, notify=notify)
    fd, degraded = load_program(program, listener=notify)
    if fd is not None:
        os.set_inheritable(fd, False)
    return fd, degraded


def classify(nr: int, spec: Optional["OsLayerSpec"] = None) -> Tuple[str, str]:
    """(syscall name, role) of a notified native syscall; role is "deny" or "observe".

    How the supervisor decides: "deny" -> answer ``-DENY_ERRNO[name]`` and
    record a blocked event; "observe" -> answer CONTINUE and record it.
    ``socket``, ``socketpair``, ``ioctl`` and ``personality`` are "deny": the
    filter only notifies their denied argument combinations. fork/vfork/clone
    depend on ``spec.allow_subprocess``; without a spec they are "deny" (fail
    closed: pass the spec to let subprocesses run). Unknown numbers are "deny"
    (the filter never notifies them, so something is off).
    """
    name = _name(nr) if _sc is not None else f"syscall_{nr}"
    if name in PROCESS_CREATION:
        return name, ("observe" if spec is not None and spec.allow_subprocess else "deny")
    if name in OBSERVE or name in SIGNALS:
        return name, "observe"
    return name, "deny"


def take_listener(pid: int, remote_fd: int) -> int:
    """Parent side: copy the child's listener fd ``remote_fd`` into this process.

    Uses pidfd_open + pidfd_getfd (Linux 5.6); the new fd is O_CLOEXEC. The
    child only has to ``write`` the number to a pipe and wait (``read``) until
    the parent has it -- neither syscall is notified.
    """
    pidfd = os.pidfd_open(pid)
    try:
        ctypes.set_errno(0)
        fd = _libc().syscall(ctypes.c_long(SYS_PIDFD_GETFD), ctypes.c_int(pidfd), ctypes.c_int(remote_fd), ctypes.c_uint(0))
        if fd < 0:
            err = ctypes.get_errno()
            raise KernelError("pidfd_getfd", err, os.strerror(err), "needs Linux 5.6 and ptrace access to the child")
        return int(fd)
    finally:
        os.close(pidfd)


# Responder helpers: the supervisor's side of the protocol, small enough to share with tests.
class SeccompData(ctypes.Structure):
    _fields_ = [("nr", ctypes.c_int32), ("arch", ctypes.c_uint32), ("ip", ctypes.c_uint64), ("args", ctypes.c_uint64 * 6)]


class Notif(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("pid", ctypes.c_uint32), ("flags", ctypes.c_uint32), ("data", SeccompData)]


class NotifResp(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("val", ctypes.c_int64), ("error", ctypes.c_int32), ("flags", ctypes.c_uint32)]


assert ctypes.sizeof(Notif) == 80 and ctypes.sizeof(NotifResp) == 24
