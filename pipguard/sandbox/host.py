"""Facts about the host that decide what the OS layer can do.

:func:`probe` never raises: on a non-Linux host or an old kernel every
missing feature is reported with a reason ("missing: why"). The result is
cached per process (a forked child probes again).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import select
import signal
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

from pipguard.errors import KernelError

if TYPE_CHECKING:
    from pipguard.sandbox.sandbox_user import SandboxUser

SUPPORTED_MACHINES = ("x86_64", "aarch64")
CLONE_NEWUSER = 0x10000000


@dataclass(frozen=True)
class HostFacts:
    """What this host offers. ``*_reason`` is "" when the feature is present."""

    system: str
    release: str
    machine: str
    platform_supported: bool
    platform_reason: str
    euid: int
    landlock_abi: int
    landlock_reason: str
    landlock_fs_rights: Tuple[str, ...]
    landlock_net: bool
    landlock_scope: bool
    seccomp: bool
    seccomp_reason: str
    seccomp_notify: bool
    seccomp_notify_reason: str
    capabilities: Dict[str, int] = field(default_factory=dict)
    user_namespaces: bool = False
    user_namespaces_reason: str = ""
    native_responder: bool = False  # pipguard.sandbox._responder (optional C extension) imports
    native_responder_reason: str = ""
    #: a pending notified syscall waits out non-fatal signals (Linux 5.19); else they make it EINTR
    seccomp_wait_killable: bool = False
    seccomp_wait_killable_reason: str = ""

    def to_json(self) -> Dict[str, Any]:
        data = asdict(self)
        data["landlock_fs_rights"] = list(self.landlock_fs_rights)
        data["capabilities"] = {k: f"{v:016x}" for k, v in self.capabilities.items()}
        return data


_CACHE: Dict[int, HostFacts] = {}


def probe(*, refresh: bool = False) -> HostFacts:
    """Probe the host once per process (``refresh`` forces a new probe)."""
    pid = os.getpid()
    if refresh or pid not in _CACHE:
        _CACHE.clear()
        _CACHE[pid] = _probe()
    return _CACHE[pid]


_PLANNING: Dict[int, HostFacts] = {}


def planning_facts() -> HostFacts:
    """The facts a plan needs, cheaply (cached per process): the Landlock ABI
    and whether a seccomp filter loads. The probes that fork a child (user
    notification, user namespaces: ~100 ms) are left out and taken as present;
    each run confirms them itself (the report's protections are corrected by
    what the kernel applied, :func:`pipguard.protections.reconcile`)."""
    pid = os.getpid()
    if pid in _CACHE:
        return _CACHE[pid]
    if pid not in _PLANNING:
        _PLANNING.clear()
        _PLANNING[pid] = _probe(quick=True)
    return _PLANNING[pid]


def _probe(quick: bool = False) -> HostFacts:
    system, release, machine = platform.system(), platform.release(), platform.machine()
    linux = system == "Linux"
    if not linux:
        plat_ok, plat_why = False, f"the OS layer needs Linux; this is {system}"
    elif machine not in SUPPORTED_MACHINES:
        plat_ok, plat_why = False, f"untested architecture {machine} (supported: {', '.join(SUPPORTED_MACHINES)})"
    else:
        plat_ok, plat_why = True, ""
    euid = os.geteuid() if hasattr(os, "geteuid") else -1

    abi, ll_why = 0, ""
    fs_rights: Tuple[str, ...] = ()
    sc_ok, sc_why, nt_ok, nt_why = False, "", False, ""
    wk_ok, wk_why = False, ""
    caps: Dict[str, int] = {}
    userns, userns_why = False, ""
    if linux:
        abi, ll_why, fs_rights = _landlock()
        sc_ok, sc_why = _guard(_seccomp, "seccomp")
        if quick:
            nt_ok, nt_why = sc_ok, sc_why
            wk_ok, wk_why = sc_ok, sc_why
            userns, userns_why = True, ""
        else:
            nt_ok, nt_why = _guard(_notify, "seccomp user notification") if sc_ok else (False, sc_why)
            wk_ok, wk_why = nt_ok and not nt_why, nt_why
            nt_why = "" if nt_ok else nt_why
            userns, userns_why = _guard(_userns, "user namespaces")
        try:
            from pipguard.sandbox.oslayer import caps as _caps

            caps = _caps.capability_sets("/proc/self/status")
        except Exception:  # pragma: no cover
            caps = {}
    else:
        reason = plat_why
        ll_why = sc_why = nt_why = wk_why = userns_why = reason
    responder_ok, responder_why = _native_responder() if linux and not quick else (False, plat_why)
    return HostFacts(
        system=system,
        release=release,
        machine=machine,
        platform_supported=plat_ok,
        platform_reason=plat_why,
        euid=euid,
        landlock_abi=abi,
        landlock_reason=ll_why,
        landlock_fs_rights=fs_rights,
        landlock_net=abi >= 4,
        landlock_scope=abi >= 6,
        seccomp=sc_ok,
        seccomp_reason=sc_why,
        seccomp_notify=nt_ok,
        seccomp_notify_reason=nt_why,
        seccomp_wait_killable=wk_ok,
        seccomp_wait_killable_reason=wk_why,
        capabilities=caps,
        user_namespaces=userns,
        user_namespaces_reason=userns_why,
        native_responder=responder_ok,
        native_responder_reason=responder_why,
    )


def _native_responder() -> Tuple[bool, str]:
    try:
        from pipguard.sandbox import _responder  # type: ignore[attr-defined]  # noqa: F401
    except ImportError as exc:
        return False, f"not built ({exc}); pip builds it where a C compiler is available"
    return True, ""


def _guard(fn, what: str) -> Tuple[bool, str]:
    try:
        return fn()
    except Exception as exc:  # a probe must never crash the caller
        return False, f"probing {what} failed: {type(exc).__name__}: {exc}"


def _landlock() -> Tuple[int, str, Tuple[str, ...]]:
    try:
        from pipguard.sandbox.oslayer import landlock
    except Exception as exc:  # pragma: no cover
        return 0, f"cannot load the Landlock module: {exc}", ()
    abi, why = landlock.abi_version()
    names = []
    rights = landlock.handled_fs(abi)
    for name in (
        "EXECUTE", "WRITE_FILE", "READ_FILE", "READ_DIR", "REMOVE_DIR", "REMOVE_FILE", "MAKE_CHAR", "MAKE_DIR",
        "MAKE_REG", "MAKE_SOCK", "MAKE_FIFO", "MAKE_BLOCK", "MAKE_SYM", "REFER", "TRUNCATE", "IOCTL_DEV",
    ):
        if rights & getattr(landlock, name):
            names.append(name)
    return abi, why, tuple(names)


def _seccomp() -> Tuple[bool, str]:
    from pipguard.sandbox.oslayer import seccomp

    return seccomp.available()


def _in_child(body, timeout: float = 10.0) -> Tuple[bool, str]:
    """Run ``body()`` -> (ok, reason) in a forked child; the answer comes back over a pipe.

    The child only runs ctypes/os calls and leaves with ``os._exit``, so
    forking from a threaded parent (pytest, the supervisor) stays safe enough.
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            os.close(r)
            ok, why = body()
            os.write(w, (("1" if ok else "0") + why).encode()[:4000])
            code = 0
        except BaseException as exc:  # noqa: BLE001 - report anything
            try:
                os.write(w, f"0{type(exc).__name__}: {exc}".encode()[:4000])
            except BaseException:
                pass
        finally:
            os._exit(code)
    os.close(w)
    data = b""
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                return False, f"probe child did not answer within {timeout:.0f}s"
            ready, _, _ = select.select([r], [], [], left)
            if not ready:
                continue
            chunk = os.read(r, 4096)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(r)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:  # pragma: no cover
            pass
    if not data:
        return False, "probe child died without an answer"
    text = data.decode(errors="replace")
    return text[0] == "1", text[1:]


def _notify() -> Tuple[bool, str]:
    """Load a tiny filter with a listener in a child, as the sandbox loads its own:
    (True, "") with WAIT_KILLABLE_RECV, (True, why not) without it, (False, why) when
    no listener fd comes back."""
    from pipguard.sandbox.oslayer import seccomp

    ok, why = seccomp.notify_available()
    if not ok:
        return ok, why

    def body() -> Tuple[bool, str]:
        import pyseccomp

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
            return False, "prctl(PR_SET_NO_NEW_PRIVS) failed"
        f = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
        f.add_rule(pyseccomp.NOTIFY, "uselib")  # never called by anyone
        try:
            listener, degraded = seccomp.load_program(seccomp.export_program(f), listener=True)
        except KernelError as exc:  # what export and load raise for a refusal
            return False, f"loading a SECCOMP_FILTER_FLAG_NEW_LISTENER filter failed: {exc.message}"
        if listener is None:
            return False, "no listener fd after load"
        os.fstat(listener)
        return True, degraded

    return _in_child(body)


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _userns() -> Tuple[bool, str]:
    """Can an *unprivileged* user create a user namespace? (as root: probe as nobody)."""
    if _read("/proc/sys/kernel/unprivileged_userns_clone") == "0":
        return False, "kernel.unprivileged_userns_clone = 0"
    if _read("/proc/sys/user/max_user_namespaces") == "0":
        return False, "user.max_user_namespaces = 0"

    def body() -> Tuple[bool, str]:
        libc = ctypes.CDLL(None, use_errno=True)
        if os.geteuid() == 0:
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
        if libc.unshare(CLONE_NEWUSER) != 0:
            err = ctypes.get_errno()
            why = f"unshare(CLONE_NEWUSER) failed: {os.strerror(err)}"
            if err in (errno.EPERM, errno.EACCES) and _read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
                why += " (AppArmor: kernel.apparmor_restrict_unprivileged_userns = 1)"
            return False, why
        return True, ""

    return _in_child(body)


def summary(user: Optional["SandboxUser"] = None) -> dict:
    """The report's ``host``: this system, and the uid/gid the sandboxed command ran as."""
    euid = os.geteuid() if hasattr(os, "geteuid") else None
    return {"system": platform.system(), "release": platform.release(),
            "machine": platform.machine(), "python": platform.python_version(),
            "euid": euid,
            # the uid/gid the sandboxed command ran as: a leased one as root, ours otherwise
            "sandbox_uid": user.uid if user else euid,
            "sandbox_gid": user.gid if user else (os.getegid() if hasattr(os, "getegid") else None)}
