"""The Linux OS layer: no_new_privs, capability drop, Landlock and seccomp.

:func:`apply` runs inside a freshly started, single-threaded child right
before it execs the sandboxed command (env and fds are scrubbed and setsid is
done before; exec comes after). Everything it installs is inherited by every
descendant and cannot be undone.

The lowest layer of the sandbox: imports only pipguard's base, ``rules`` and ``protections``.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from pipguard.errors import LayerUnavailable

NETWORK_MODES = ("none", "ports", "all")


@dataclass(frozen=True)
class OsLayerSpec:
    """What the OS layer enforces. Empty path tuples grant nothing (fail closed).

    - ``read_paths``: files or dirs that may be read and executed (dirs also listed).
    - ``write_paths``: dirs or files with every right except creating devices.
    - ``device_paths``: device files that may be read, written and ioctl'ed.
    - ``network``: "none" (no sockets at all), "ports" (TCP connect to
      ``tcp_connect_ports`` only; an empty tuple then allows no port), "all"
      (IPv4/IPv6 without raw sockets; unix sockets stay denied).
    - ``allow_subprocess``: False denies fork/vfork/clone-without-CLONE_THREAD.
    - ``notify``: route denials and observations to a seccomp listener fd.
    - ``observe_reads``: with notify, also notify opens for reading.
    - ``drop_capabilities``: empty every capability set (as root: also lock securebits).
    Paths that do not exist are skipped.
    """

    read_paths: Tuple[str, ...]
    write_paths: Tuple[str, ...]
    device_paths: Tuple[str, ...]
    network: str
    tcp_connect_ports: Tuple[int, ...] = ()
    allow_subprocess: bool = True
    notify: bool = True
    observe_reads: bool = False
    drop_capabilities: bool = True

    def __post_init__(self) -> None:
        if self.network not in NETWORK_MODES:
            raise ValueError(f"network must be one of {NETWORK_MODES}, not {self.network!r}")
        for name in ("read_paths", "write_paths", "device_paths", "tcp_connect_ports"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        for port in self.tcp_connect_ports:
            if not isinstance(port, int) or not 0 < port < 65536:
                raise ValueError(f"tcp_connect_ports: {port!r} is not a TCP port")

    def to_json(self) -> Dict[str, Any]:
        return {
            "read_paths": list(self.read_paths),
            "write_paths": list(self.write_paths),
            "device_paths": list(self.device_paths),
            "network": self.network,
            "tcp_connect_ports": list(self.tcp_connect_ports),
            "allow_subprocess": self.allow_subprocess,
            "notify": self.notify,
            "observe_reads": self.observe_reads,
            "drop_capabilities": self.drop_capabilities,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "OsLayerSpec":
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"OsLayerSpec: unknown keys {sorted(unknown)}")
        return cls(
            read_paths=tuple(str(p) for p in data["read_paths"]),
            write_paths=tuple(str(p) for p in data["write_paths"]),
            device_paths=tuple(str(p) for p in data["device_paths"]),
            network=str(data["network"]),
            tcp_connect_ports=tuple(int(p) for p in data.get("tcp_connect_ports", ())),
            allow_subprocess=bool(data.get("allow_subprocess", True)),
            notify=bool(data.get("notify", True)),
            observe_reads=bool(data.get("observe_reads", False)),
            drop_capabilities=bool(data.get("drop_capabilities", True)),
        )


@dataclass(frozen=True)
class AppliedStatus:
    """What the kernel actually enforces after :func:`apply`."""

    applied: Tuple[str, ...]
    unavailable: Dict[str, str] = field(default_factory=dict)
    landlock_abi: int = 0
    listener_fd: Optional[int] = None

    def to_json(self) -> Dict[str, Any]:
        return {
            "applied": list(self.applied),
            "unavailable": dict(self.unavailable),
            "landlock_abi": self.landlock_abi,
            "listener_fd": self.listener_fd,
        }


def _missing_parts(spec: OsLayerSpec) -> Tuple[int, Dict[str, str], bool]:
    """(Landlock ABI, {part: reason} for parts the spec needs but the host lacks, notify ok)."""
    from pipguard.sandbox.oslayer import landlock, seccomp

    missing: Dict[str, str] = {}
    if platform.system() != "Linux":
        reason = f"the OS layer is Linux-only (this is {platform.system()})"
        for part in ("no_new_privs", "landlock.fs", "landlock.scope", "seccomp"):
            missing[part] = reason
        return 0, missing, False
    abi, why = landlock.abi_version()
    if abi < 1:
        missing["landlock.fs"] = why
        if spec.network != "all":
            missing["landlock.net"] = why
        missing["landlock.scope"] = why
    else:
        from pipguard.protections import LANDLOCK_ABI

        for part in ("landlock.net", "landlock.scope"):
            if abi < LANDLOCK_ABI[part] and (part != "landlock.net" or spec.network != "all"):
                missing[part] = f"Landlock ABI {abi} < {LANDLOCK_ABI[part]} (needs Linux "                                 f"{'6.7' if part == 'landlock.net' else '6.12'})"
    ok, why = seccomp.available()
    notify_ok = False
    if not ok:
        missing["seccomp"] = why
        if spec.notify:
            missing["seccomp.notify"] = why
    elif spec.notify:
        notify_ok, why = seccomp.notify_available()
        if not notify_ok:
            missing["seccomp.notify"] = why
    return abi, missing, notify_ok


def apply(spec: OsLayerSpec, *, required: bool) -> AppliedStatus:
    """Confine the calling (single-threaded) process for ``spec``; irreversible.

    ``required=True``: if any part the spec needs is missing on this host,
    raise :class:`~pipguard.errors.LayerUnavailable` *before* changing
    anything. ``required=False``: skip missing parts and name them with the
    reason in ``AppliedStatus.unavailable``. A syscall failing unexpectedly
    raises :class:`~pipguard.errors.KernelError` (the process is then
    half-confined and must not exec).

    With ``spec.notify`` the returned ``listener_fd`` must reach a responder
    before this process makes any notified syscall (execve, a write-open,
    sendmsg...), or it blocks forever: hand the fd number over with
    ``write`` to a pipe and let the parent copy it with
    :func:`pipguard.sandbox.oslayer.seccomp.take_listener` (pidfd_getfd); sending it
    with ``sendmsg``/SCM_RIGHTS from this process deadlocks.
    """
    from pipguard.sandbox.oslayer import caps, landlock, seccomp

    abi, missing, notify_ok = _missing_parts(spec)
    if required and missing:
        part, reason = next(iter(missing.items()))
        more = f" (and {len(missing) - 1} more: {', '.join(list(missing)[1:])})" if len(missing) > 1 else ""
        raise LayerUnavailable(
            f"required OS layer part {part} is unavailable: {reason}{more}",
            hint="run `pipguard doctor`; use --isolation auto to run with what this host has",
        )
    if "no_new_privs" in missing:
        return AppliedStatus(applied=(), unavailable=missing, landlock_abi=0, listener_fd=None)

    applied: List[str] = []
    # THE CONFINEMENT ORDER IS AN INVARIANT (each step needs the one before,
    # or would be undone by doing it later):
    # 1. no_new_privs: exec can never grant privileges again; Landlock and
    #    unprivileged seccomp require it.
    caps.set_no_new_privs()
    applied.append("no_new_privs")
    # 2. securebits (root only: NOROOT|NO_SETUID_FIXUP|KEEP_CAPS off, all
    #    locked) -- needs CAP_SETPCAP, so before the drop.
    # 3. drop every capability: bounding set (PR_CAPBSET_DROP, also needs
    #    CAP_SETPCAP), ambient clear, then capset eff/perm/inh = 0.
    if spec.drop_capabilities:
        caps.lock_securebits()
        caps.drop_all()
        applied.append("capabilities")
    # 4. Landlock: filesystem, TCP ports, IPC scopes. Before seccomp, whose
    #    filter would otherwise have to allow the Landlock syscalls.
    if abi >= 1:
        plan = landlock.plan(abi, confine_net=spec.network != "all", scope=True)
        landlock.restrict_self(
            plan,
            read_paths=spec.read_paths,
            write_paths=spec.write_paths,
            device_paths=spec.device_paths,
            tcp_connect_ports=spec.tcp_connect_ports if spec.network == "ports" else (),
        )
        applied.append("landlock.fs")
        if plan.handled_net:
            applied.append("landlock.net")
        if plan.scoped:
            applied.append("landlock.scope")
    # 5. seccomp LAST: after it, any syscall the steps above need could be
    #    denied or block on the listener; only the exec handoff follows.
    listener_fd: Optional[int] = None
    if "seccomp" not in missing:
        listener_fd, degraded = seccomp.load(spec, notify=spec.notify and notify_ok)
        applied.append("seccomp")
        if listener_fd is not None:
            applied.append("seccomp.notify")
        if degraded:
            missing = dict(missing, **{"seccomp.wait_killable": degraded})
    return AppliedStatus(applied=tuple(applied), unavailable=missing, landlock_abi=abi, listener_fd=listener_fd)


__all__ = ["AppliedStatus", "OsLayerSpec", "apply", "NETWORK_MODES"]
