"""Kernel capabilities, probed once per session with small direct checks (not via pipguard).

Tests are gated with markers built here: ``@requires_landlock(abi=4)``, ``@requires_seccomp()``,
``@requires_root()`` ... The ``pytest_runtest_setup`` hook in ``tests/conftest.py`` turns a missing
capability into a skip, or into a failure when ``PIPGUARD_REQUIRE_ALL_LAYERS=1`` (CI), so a layer
can never go silently untested. Inside fixtures use ``need("landlock", abi=4)``.
"""
from __future__ import annotations

import ctypes
import errno
import functools
import os
import platform
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from typing import Optional, Tuple

import pytest

STRICT_ENV = "PIPGUARD_REQUIRE_ALL_LAYERS"

# Syscall numbers. landlock_create_ruleset is 444 on every architecture (new-style numbering).
SYS_LANDLOCK_CREATE_RULESET = 444
LANDLOCK_CREATE_RULESET_VERSION = 1
SYS_SECCOMP = {"x86_64": 317, "aarch64": 277}.get(platform.machine())
PR_GET_SECCOMP = 21
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_GET_ACTION_AVAIL = 2
SECCOMP_RET_USER_NOTIF = 0x7FC00000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000


def strict() -> bool:
    """True when missing capabilities must fail tests instead of skipping them."""
    return os.environ.get(STRICT_ENV, "") == "1"


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.prctl.restype = ctypes.c_int
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return libc


def _errname(err: int) -> str:
    return errno.errorcode.get(err, str(err))


@dataclass(frozen=True)
class Probe:
    """One probed capability: ``ok``, a level (e.g. the Landlock ABI, 0 = none) and why."""

    ok: bool
    level: int
    reason: str


def probe_landlock() -> Probe:
    """landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION) returns the ABI version."""
    if sys.platform != "linux":
        return Probe(False, 0, "not Linux")
    libc = _libc()
    ctypes.set_errno(0)
    abi = libc.syscall(ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET), ctypes.c_void_p(None),
                       ctypes.c_size_t(0), ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    if abi < 0:
        err = ctypes.get_errno()
        why = {errno.ENOSYS: "kernel built without Landlock",
               errno.EOPNOTSUPP: "Landlock disabled at boot (lsm=)"}.get(err, "")
        return Probe(False, 0, f"landlock_create_ruleset: {_errname(err)} {why}".strip())
    return Probe(True, int(abi), f"Landlock ABI {abi}")


def probe_seccomp() -> Tuple[Probe, Probe]:
    """(filter mode, user notification). Probes without installing any filter.

    PR_SET_SECCOMP(SECCOMP_MODE_FILTER, NULL) fails with EFAULT when filters are supported: the
    kernel copies the (NULL) program before it checks no_new_privs, so nothing is installed.
    """
    if sys.platform != "linux":
        no = Probe(False, 0, "not Linux")
        return no, no
    libc = _libc()
    ctypes.set_errno(0)
    mode = libc.prctl(PR_GET_SECCOMP, 0, 0, 0, 0)
    if mode < 0:
        err = ctypes.get_errno()
        no = Probe(False, 0, f"prctl(PR_GET_SECCOMP): {_errname(err)} (kernel without CONFIG_SECCOMP)")
        return no, no
    ctypes.set_errno(0)
    rc = libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, 0, 0, 0)
    err = ctypes.get_errno()
    if rc == 0 or err != errno.EFAULT:
        no = Probe(False, 0, f"prctl(PR_SET_SECCOMP, FILTER, NULL): {_errname(err)}, expected EFAULT")
        return no, no
    filt = Probe(True, mode, f"seccomp filter supported (current mode {mode})")
    if SYS_SECCOMP is None:
        return filt, Probe(False, 0, f"seccomp syscall number unknown on {platform.machine()}")
    action = ctypes.c_uint32(SECCOMP_RET_USER_NOTIF)
    ctypes.set_errno(0)
    rc = libc.syscall(ctypes.c_long(SYS_SECCOMP), ctypes.c_uint(SECCOMP_GET_ACTION_AVAIL),
                      ctypes.c_uint(0), ctypes.byref(action))
    if rc != 0:
        return filt, Probe(False, 0, f"SECCOMP_GET_ACTION_AVAIL(USER_NOTIF): {_errname(ctypes.get_errno())}")
    return filt, Probe(True, 1, "SECCOMP_RET_USER_NOTIF available")


_UNSHARE_CHILD = r"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
rc = libc.unshare(ctypes.c_int(int(sys.argv[1])))
sys.exit(0 if rc == 0 else min(ctypes.get_errno(), 125) or 125)
"""


def _probe_unshare(flags: int, what: str) -> Probe:
    """unshare(flags) in a throw-away child so the test process itself never changes namespace."""
    if sys.platform != "linux":
        return Probe(False, 0, "not Linux")
    try:
        proc = subprocess.run([sys.executable, "-I", "-c", _UNSHARE_CHILD, str(flags)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return Probe(False, 0, f"{what}: probe child failed: {exc}")
    if proc.returncode == 0:
        return Probe(True, 1, f"{what}: unshare works")
    return Probe(False, 0, f"{what}: unshare: {_errname(proc.returncode)}")


def _probe_ipv6_loopback() -> Probe:
    if not socket.has_ipv6:
        return Probe(False, 0, "Python built without IPv6")
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError as exc:
        return Probe(False, 0, f"bind ::1: {exc}")
    return Probe(True, 1, "::1 usable")


@functools.lru_cache(maxsize=None)
def capabilities() -> dict:
    """Probe everything once per process; name -> Probe."""
    landlock = probe_landlock()
    seccomp, notif = probe_seccomp()
    root = os.geteuid() == 0
    gcc = shutil.which("gcc")
    strace = shutil.which("strace")
    caps = {
        "landlock": landlock,
        "seccomp": seccomp,
        "seccomp_user_notif": notif,
        "root": Probe(root, int(root), "running as root" if root else f"euid {os.geteuid()}, not root"),
        "userns": _probe_unshare(CLONE_NEWUSER, "user namespace"),
        "netns": _probe_unshare(CLONE_NEWNET if root else CLONE_NEWUSER | CLONE_NEWNET, "network namespace"),
        "ipv6_loopback": _probe_ipv6_loopback(),
        "gcc": Probe(bool(gcc), int(bool(gcc)), gcc or "gcc not on PATH"),
        "strace": Probe(bool(strace), int(bool(strace)), strace or "strace not on PATH"),
        "linux": Probe(sys.platform == "linux", 1, sys.platform),
    }
    return caps


def check(cap: str, **kw) -> Optional[str]:
    """None when ``cap`` is present (with ``abi=N``: Landlock ABI >= N), else the reason it is not."""
    caps = capabilities()
    if cap not in caps:
        raise ValueError(f"unknown capability {cap!r}; known: {sorted(caps)}")
    unknown = set(kw) - {"abi"}
    if unknown:
        raise ValueError(f"unknown requirement options {sorted(unknown)}")
    probe = caps[cap]
    if not probe.ok:
        return f"needs {cap}: {probe.reason}"
    want = kw.get("abi")
    if want is not None and probe.level < want:
        return f"needs {cap} ABI >= {want}: have {probe.level}"
    return None


def need(cap: str, **kw) -> None:
    """Skip the running test when ``cap`` is missing, or fail it under PIPGUARD_REQUIRE_ALL_LAYERS=1."""
    reason = check(cap, **kw)
    if reason is None:
        return
    if strict():
        pytest.fail(f"{reason} ({STRICT_ENV}=1 turns this skip into a failure)", pytrace=False)
    pytest.skip(reason)


def requires(cap: str, **kw):
    """Marker: the test needs ``cap``; decided in ``pytest_runtest_setup`` via ``need``."""
    if cap not in capabilities():  # a typo fails at collection, not as a silent skip
        raise ValueError(f"unknown capability {cap!r}; known: {sorted(capabilities())}")
    return pytest.mark.requires(cap, **kw)


def requires_landlock(abi: int = 1):
    """Landlock with at least ABI ``abi`` (1: fs, 4: TCP bind/connect, 6: scoping signals/abstract unix)."""
    return requires("landlock", abi=abi)


def requires_seccomp(user_notif: bool = False):
    """seccomp filters; with ``user_notif=True`` also SECCOMP_RET_USER_NOTIF."""
    return requires("seccomp_user_notif" if user_notif else "seccomp")


def requires_root():
    return requires("root")


def requires_userns():
    return requires("userns")


def requires_netns():
    return requires("netns")


def requires_gcc():
    return requires("gcc")


def describe() -> str:
    """One line per capability, for the pytest header."""
    return "\n".join(f"  {name:20} {'yes' if p.ok else 'no ':3}  {p.reason}"
                     for name, p in sorted(capabilities().items()))


def netns_preexec():
    """preexec_fn: move the child into a fresh network namespace (only a down ``lo``): nothing it
    sends can leave the machine, not even to loopback listeners of the test. Gate with ``need("netns")``."""
    flags = CLONE_NEWNET if os.geteuid() == 0 else CLONE_NEWUSER | CLONE_NEWNET

    def _pre():
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(ctypes.c_int(flags)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"unshare(network namespace): {os.strerror(err)}")

    return _pre
