"""``pipguard doctor``'s checks: turn :class:`~pipguard.sandbox.host.HostFacts` into checks.

Pure functions; the command (:mod:`pipguard.cli.doctor`) renders the result. Apart from the
command, because this module imports the host probe and the protections table (4-7 ms) and
the click application imports every command to build itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Sequence

from pipguard import protections
from pipguard.sandbox.host import HostFacts
from pipguard.protections import guards

STATUSES = ("ok", "degraded", "missing")
#: the parts ``--isolation auto`` uses; any of them not "ok" means auto degrades
DEFAULT_ISOLATION_PARTS = protections.AUTO_PARTS


@dataclass(frozen=True)
class Check:
    """One line of ``pipguard doctor``. ``status`` is "ok", "degraded" or "missing"."""

    name: str
    status: str
    detail: str
    needed_for: str

    def to_json(self) -> Dict[str, Any]:
        return {"name": self.name, "status": self.status, "detail": self.detail, "needed_for": self.needed_for}


def checks(facts: HostFacts) -> List[Check]:
    out: List[Check] = []
    where = f"{facts.system} {facts.release} {facts.machine}".strip()
    if facts.platform_supported:
        out.append(Check("platform", "ok", where, "the OS layer"))
    elif facts.system == "Linux":
        out.append(Check("platform", "degraded", f"{where}: {facts.platform_reason}", "the OS layer"))
    else:
        out.append(Check("platform", "missing", f"{where}: {facts.platform_reason}", "the OS layer (audit layer only)"))

    abi = facts.landlock_abi
    if abi < 1:
        out.append(Check("landlock.fs", "missing", facts.landlock_reason or "Landlock is absent", guards("landlock.fs")))
    else:
        lacking = [r for r, v in protections.LANDLOCK_FS_LATER if abi < v]
        if lacking:
            out.append(Check("landlock.fs", "degraded", f"ABI {abi}: cannot confine {', '.join(lacking)}", guards("landlock.fs")))
        else:
            out.append(Check("landlock.fs", "ok", f"ABI {abi}: {len(facts.landlock_fs_rights)} filesystem rights", guards("landlock.fs")))
    if facts.landlock_net:
        out.append(Check("landlock.net", "ok", f"ABI {abi}: TCP bind/connect by port", guards("landlock.net")))
    else:
        why = facts.landlock_reason if abi < 1 else protections.landlock_short("landlock.net", abi)
        out.append(Check("landlock.net", "missing", why, guards("landlock.net")))
    if facts.landlock_scope:
        out.append(Check("landlock.scope", "ok", f"ABI {abi}: signals and abstract unix sockets scoped", guards("landlock.scope")))
    else:
        why = facts.landlock_reason if abi < 1 else protections.landlock_short("landlock.scope", abi)
        out.append(Check("landlock.scope", "missing", why, guards("landlock.scope")))

    if facts.seccomp:
        out.append(Check("seccomp", "ok", "libseccomp filter loads", guards("seccomp")))
    else:
        out.append(Check("seccomp", "missing", facts.seccomp_reason, guards("seccomp")))
    if facts.seccomp_notify:
        out.append(Check("seccomp.notify", "ok", "user notification listener works", guards("seccomp.notify")))
    else:
        out.append(Check("seccomp.notify", "missing", facts.seccomp_notify_reason, guards("seccomp.notify")))
    if facts.seccomp_notify and facts.seccomp_wait_killable:
        out.append(Check("seccomp.wait_killable", "ok", "a syscall the supervisor is answering waits out "
                         "signals (SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV)", "builds see no EINTR the kernel would not give"))
    elif facts.seccomp_notify:
        out.append(Check("seccomp.wait_killable", "degraded", facts.seccomp_wait_killable_reason,
                         "builds see no EINTR the kernel would not give"))

    if facts.euid == 0:
        bnd = facts.capabilities.get("CapBnd", 0)
        out.append(Check("capabilities", "ok", f"running as root (CapEff {facts.capabilities.get('CapEff', 0):#x}, CapBnd {bnd:#x}); the sandbox drops all of them and locks securebits", guards("capabilities")))
    elif facts.system == "Linux":
        eff = facts.capabilities.get("CapEff", 0)
        detail = "unprivileged; no capabilities to drop" if not eff else f"unprivileged with CapEff {eff:#x}; the sandbox drops them"
        out.append(Check("capabilities", "ok", detail, guards("capabilities")))
    else:
        out.append(Check("capabilities", "missing", facts.platform_reason, guards("capabilities")))

    if facts.system == "Linux":
        out.append(_sandbox_user_check(facts.euid))

    if facts.native_responder:
        out.append(Check("supervisor.responder", "ok", "native thread answers allowed opens (~4 µs each)",
                         "cheap observation of native file opens"))
    elif facts.seccomp_notify:
        out.append(Check("supervisor.responder", "degraded",
                         f"{facts.native_responder_reason}: Python answers every notification "
                         "(slower, same evidence)", "cheap observation of native file opens"))
    if facts.user_namespaces:
        out.append(Check("user_namespaces", "ok", "unprivileged user namespaces allowed", "the namespace backend (auto uses it where it works)"))
    else:
        out.append(Check("user_namespaces", "missing", facts.user_namespaces_reason,
                         "the namespace backend (auto uses it where it works; else the plain one)"))
    out.extend(ns_checks())
    return out


def ns_checks() -> List[Check]:
    """One line per part of the ns backend (``--isolation ns``, and ``auto``
    where every part works: a missing part does not degrade ``auto``, which
    then runs the plain backend), tried for real in a throw-away child."""
    from pipguard.sandbox.backends import ns

    return [Check(f"ns.{part.name}", "ok" if part.ok else "missing", part.reason or "works",
                  "the namespace backend (auto: where every part works)") for part in ns.probe().parts]


#: what each part of the VM backend's probe is needed for
_VM_PARTS = {"qemu": "--isolation vm (QEMU)", "kernel": "--isolation vm (the guest kernel and its modules)",
             "busybox": "--isolation vm (the guest's init)", "kvm": "--isolation vm at native speed"}


def vm_checks(probe) -> List[Check]:
    """Lines for the VM backend (``pipguard.sandbox.vm.qemu.probe()``). Optional:
    ``auto`` never uses it, so none of them makes the default isolation degraded.
    Without ``kvm`` the backend still runs with ``--vm-accel tcg``."""
    out = []
    for part in probe.parts:
        if part.ok:
            detail = "works (a probe guest booted)" if part.name == "kvm" else "found"
            out.append(Check(f"vm.{part.name}", "ok", detail, _VM_PARTS.get(part.name, "--isolation vm")))
        else:
            status = "degraded" if part.name == "kvm" and probe.parts and \
                all(p.ok for p in probe.parts if p.name != "kvm") else "missing"
            detail = part.reason + ("; --vm-accel tcg still works (slow)" if status == "degraded" else "")
            out.append(Check(f"vm.{part.name}", status, detail, _VM_PARTS.get(part.name, "--isolation vm")))
    return out


#: how a limit is enforced, said for a person (limits.AppliedLimit ``by`` / ``scope``)
_LIMIT_WORDS = {("cgroup2", "run"): "the run's cgroup (all its processes together)",
                ("cgroup1", "run"): "the run's cgroup v1 (all its processes together)",
                ("rlimit", "process"): "an rlimit, per process",
                ("rlimit", "file"): "an rlimit, per file",
                ("supervisor", "run"): "the supervisor counting forks"}
#: the rlimit or count each limit falls back to without a delegated cgroup
_FALLBACK = {"memory": "RLIMIT_AS", "cpu": "RLIMIT_CPU", "processes": "the supervisor's fork count"}


def limits_check() -> Check:
    """The resource limits as a run here would apply them: a run cgroup is made and removed
    (as a run does), and each limit says what enforces it. Without a cgroup of its own
    (an ordinary user, no delegated subtree) memory and CPU fall back to rlimits, per
    process (a build of 8 compilers may use 8 times the memory), and processes to the
    supervisor's fork count: "degraded", said here rather than found in a report. Not part
    of the default isolation (it confines nothing)."""
    from pipguard.sandbox import limits

    try:
        prepared = limits.prepare(limits.default_memory(), 2048, 14400.0, 16 << 30)
    except OSError as exc:
        return Check("limits", "missing", f"could not prepare a run's limits: {exc}", "resource limits")
    if prepared.cgroup is not None:
        prepared.cgroup.remove()
    applied = prepared.applied
    fallen = sorted(name for name, fallback in _FALLBACK.items()
                    if name in applied and applied[name].by not in ("cgroup2", "cgroup1"))
    how = "; ".join(f"{name}: {_LIMIT_WORDS.get((a.by, a.scope), a.by)}" for name, a in sorted(applied.items()))
    if not fallen:
        return Check("limits", "ok", how, "resource limits (--limit-*)")
    why = "; ".join(f"{k}: {v}" for k, v in sorted(prepared.unavailable.items())) or "no cgroup controller delegated"
    falls = ", ".join(f"{name} to {_FALLBACK[name]}" for name in fallen)
    return Check("limits", "degraded", f"no cgroup of its own ({why}): {falls}. {how}",
                 "resource limits (--limit-*)")


def stale_grants_check(restored: Sequence[Any], leasing: bool) -> Check:
    """What :func:`pipguard.sandbox.uidlease.replay_stale` undid just now (the grants of runs
    whose pipguard was killed: ACL entries naming a sandbox uid, files and processes it
    left). ``leasing``: runs here lease sandbox uids (root); unprivileged, there is none to
    undo."""
    if not leasing:
        return Check("stale_grants", "ok", "unprivileged: runs lease no sandbox uid and grant nothing "
                     "(root's pipguard replays what its killed runs left)", "clean-up after a killed run")
    if not restored:
        return Check("stale_grants", "ok", "none: no run killed mid-way left grants", "clean-up after a killed run")
    said = "; ".join(f"uid {r.uid}: " + (f"rwx on {', '.join(r.writable)} and " if r.writable else "")
                     + f"{len(r.paths) - len(r.writable)} more paths (their files, ancestors, its run dir)"
                     for r in restored)
    return Check("stale_grants", "ok", f"restored what killed runs left: {said}", "clean-up after a killed run")


def _sandbox_user_check(euid: int) -> Check:
    why = guards("user")
    if euid != 0:
        return Check("sandbox_user", "ok", f"unprivileged: the sandbox runs as your uid {euid}", why)
    from pipguard.sandbox import sandbox_user

    free = sandbox_user.usable_count()
    span = f"{sandbox_user.UIDS.start}-{sandbox_user.UIDS.stop - 1}"
    if not free:
        return Check("sandbox_user", "missing", f"running as root, but no uid of {span} is usable "
                     "(unmapped in this user namespace, or in passwd/group/subuid)", why)
    return Check("sandbox_user", "ok", f"running as root: each sandbox runs as a leased uid of {span} "
                 f"(gid the same, no supplementary groups; {free} usable), granted its paths by ACL", why)


def default_isolation_degraded(checks: Sequence[Check]) -> bool:
    """True when ``--isolation auto`` would run without some part of the OS layer."""
    by_name = {c.name: c for c in checks}
    return any(by_name.get(part) is None or by_name[part].status != "ok" for part in DEFAULT_ISOLATION_PARTS)
