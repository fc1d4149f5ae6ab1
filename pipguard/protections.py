"""The one table of protections: each thing a sandbox does to hold a build in,
what it needs from the host, and what it is for.

Every part of pipguard that names a protection takes it from here:

- the plan (:mod:`pipguard.sandbox.plan`) states, per protection, whether this run
  will have it -- ``active``, ``degraded`` (there, with a gap the reason
  names) or ``unavailable`` (not there, and why) -- from the policy's
  isolation level and the host's facts, before anything starts;
- the OS layer (:mod:`pipguard.sandbox.oslayer`) reads the Landlock ABI each part
  needs from :data:`LANDLOCK_ABI`;
- ``doctor`` says what each host feature is needed for from :attr:`Protection.guards`;
- the report lists the plan's states, corrected by what the sandbox's first
  process actually applied (:func:`reconcile`): a protection the plan
  expected but the kernel refused is ``unavailable`` with the kernel's reason.

``strict`` protections are the ones ``--isolation os`` / ``ns`` refuse to run
without (exit 2); ``auto`` runs without them and records why. The model is
multikernel/sandlock's protection table: one list, resolved once per run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

ACTIVE, DEGRADED, UNAVAILABLE = "active", "degraded", "unavailable"
#: isolation levels that confine with the OS layer
OS_LEVELS = ("os", "ns", "auto")


@dataclass(frozen=True)
class Protection:
    name: str  # as reports, doctor and the oslayer name it
    layer: str  # audit, os, supervisor, backend
    needs: str  # what the host must offer
    guards: str  # what it is for
    strict: bool  # --isolation os/ns refuse to run without it
    levels: Tuple[str, ...]  # the isolation levels that use it


PROTECTIONS: Tuple[Protection, ...] = (
    Protection("audit", "audit", "CPython's audit hooks (PEP 578)",
               "attribution of events to Python code", True, ("audit", *OS_LEVELS)),
    Protection("user", "os", "as root: a free uid of pipguard's leased range",
               "root-only files out of the sandbox's reach (root only)", True, ("audit", *OS_LEVELS)),
    Protection("no_new_privs", "os", "prctl(PR_SET_NO_NEW_PRIVS) (Linux 3.5)",
               "no setuid/file-capability gains at exec", True, OS_LEVELS),
    Protection("capabilities", "os", "capset and PR_CAPBSET_DROP",
               "no root powers in the sandbox", True, OS_LEVELS),
    Protection("landlock.fs", "os", "Landlock ABI >= 1 (Linux 5.13)",
               "file read/write confinement", True, OS_LEVELS),
    Protection("landlock.net", "os", "Landlock ABI >= 4 (Linux 6.7)",
               "TCP bind/connect confined by port", True, OS_LEVELS),
    Protection("landlock.scope", "os", "Landlock ABI >= 6 (Linux 6.12)",
               "signals and abstract unix sockets scoped to the sandbox", True, OS_LEVELS),
    Protection("seccomp", "os", "seccomp filters through libseccomp",
               "dangerous syscalls and socket families blocked", True, OS_LEVELS),
    Protection("seccomp.notify", "supervisor", "seccomp user notification (Linux 5.0) and pidfd_getfd (5.6)",
               "syscall-level evidence for native code", True, OS_LEVELS),
    Protection("supervisor", "supervisor", "seccomp.notify",
               "decisions on exec, connect and opens with evidence", True, OS_LEVELS),
    Protection("ns", "backend", "unprivileged user, mount, pid and net namespaces",
               "a world of its own: no host processes, network or home", True, ("ns", "auto")),
    Protection("cgroup2", "limits", "a writable cgroup v2 subtree (root, or delegated)",
               "memory, process and CPU limits the kernel enforces (else rlimits)", False, OS_LEVELS),
)
BY_NAME: Dict[str, Protection] = {p.name: p for p in PROTECTIONS}
#: the Landlock ABI each Landlock protection needs, and the Linux release that brought it
LANDLOCK_ABI: Dict[str, int] = {"landlock.fs": 1, "landlock.net": 4, "landlock.scope": 6}
LANDLOCK_LINUX: Dict[str, str] = {"landlock.fs": "5.13", "landlock.net": "6.7", "landlock.scope": "6.12"}


def landlock_short(part: str, abi: int) -> str:
    """Why Landlock ABI ``abi`` lacks ``part`` ("" when it has it)."""
    need = LANDLOCK_ABI[part]
    return "" if abi >= need else f"Landlock ABI {abi} < {need} (needs Linux {LANDLOCK_LINUX[part]})"
#: what ``--isolation auto`` uses from the OS layer: one not active means auto degrades
AUTO_PARTS: Tuple[str, ...] = ("landlock.fs", "landlock.net", "landlock.scope", "seccomp", "seccomp.notify")


@dataclass(frozen=True)
class ProtectionState:
    name: str
    state: str  # active, degraded, unavailable
    reason: str = ""

    def to_json(self) -> Dict[str, Any]:
        return {"name": self.name, "state": self.state, "reason": self.reason}


def planned(isolation: str, facts: Any, *, network: str, as_root: bool,
            os_reason: str = "") -> Tuple[ProtectionState, ...]:
    """What a run at ``isolation`` will have on a host with ``facts``
    (:class:`pipguard.sandbox.host.HostFacts`): one state per protection the level
    uses. ``os_reason``: why the OS layer cannot run at all ("" if it can)."""
    states = []
    for p in PROTECTIONS:
        if isolation not in p.levels:
            continue
        if p.name == "user" and not as_root:
            continue  # not root: the sandbox has the caller's uid already
        if p.name == "landlock.net" and network == "all":
            continue  # nothing to confine
        if os_reason and p.layer not in ("audit", "limits"):
            states.append(ProtectionState(p.name, UNAVAILABLE, os_reason))
            continue
        reason = _missing(p.name, facts)
        if reason:
            states.append(ProtectionState(p.name, UNAVAILABLE, reason))
        else:
            gap = _gap(p.name, facts)
            states.append(ProtectionState(p.name, DEGRADED if gap else ACTIVE, gap))
    return tuple(states)


#: Landlock filesystem rights an older ABI cannot confine: (right, ABI that added it)
LANDLOCK_FS_LATER = (("REFER", 2), ("TRUNCATE", 3), ("IOCTL_DEV", 5))


def _gap(name: str, facts: Any) -> str:
    """What an available protection cannot do on this host ("" when nothing)."""
    if name == "landlock.fs":
        abi = getattr(facts, "landlock_abi", 0)
        lacking = [right for right, since in LANDLOCK_FS_LATER if abi < since]
        if lacking:
            return f"Landlock ABI {abi}: cannot confine {', '.join(lacking)}"
    return ""


def _missing(name: str, facts: Any) -> str:
    """Why the host lacks ``name`` ("" when it has it, or cannot tell before the run)."""
    abi = getattr(facts, "landlock_abi", 0)
    if name in LANDLOCK_ABI:
        if abi < 1:
            return getattr(facts, "landlock_reason", "") or "Landlock is absent"
        return landlock_short(name, abi)
    if name == "seccomp" and not getattr(facts, "seccomp", True):
        return getattr(facts, "seccomp_reason", "") or "seccomp is unavailable"
    if name in ("seccomp.notify", "supervisor") and not getattr(facts, "seccomp_notify", True):
        return getattr(facts, "seccomp_notify_reason", "") or "seccomp user notification is unavailable"
    if name == "ns" and not getattr(facts, "user_namespaces", True):
        return getattr(facts, "user_namespaces_reason", "") or "user namespaces are unavailable"
    return ""


def reconcile(planned_states: Sequence[ProtectionState], applied: Sequence[str],
              unavailable: Mapping[str, str]) -> Tuple[ProtectionState, ...]:
    """The plan's states corrected by what the run reports: a protection the
    sandbox names as unavailable is, with its reason; one the plan expected
    but nobody applied is ``unavailable`` ("not applied") -- the report never
    claims more than the kernel confirmed. A protection applied with a gap
    (landlock.fs on an old ABI) stays ``degraded``."""
    out = []
    for s in planned_states:
        if s.name in unavailable:
            out.append(ProtectionState(s.name, UNAVAILABLE, unavailable[s.name]))
        elif s.state == ACTIVE and s.name not in applied and s.name not in ("cgroup2",):
            out.append(ProtectionState(s.name, UNAVAILABLE, s.reason or "not applied in this run"))
        else:
            out.append(s)
    return tuple(out)


def guards(name: str, default: str = "") -> str:
    """What ``name`` is for (doctor's "needed for")."""
    p: Optional[Protection] = BY_NAME.get(name)
    return p.guards if p else default
