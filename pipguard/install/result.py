"""What ``pipguard install`` / ``pipguard sandbox`` found: the result models.

An install is a list of :class:`Phase` (one sandboxed run each: a hook call
or an import probe), a :class:`PackageResult` per package (the gate's
findings, its phases, the approvals that accepted attempts), the
:class:`Refusal` that decided it, if any, and the :class:`InstallResult` that
carries all of it to the renderers (and to ``--report`` as JSON).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Tuple

from pipguard.install.approvals import Approval, Origin
from pipguard.report.model import Event, Report, combined

if TYPE_CHECKING:
    from pipguard.gate import scan as gate

#: gate severities that refuse an install
REFUSING_SEVERITIES = ("critical", "high")


@dataclass(frozen=True)
class Phase:
    """One sandboxed run: a hook call or an import probe. ``accepted`` maps
    the ``seq`` of each blocked attempt an approval accepted to that approval."""

    name: str
    package: Optional[str]
    report: Report
    accepted: Tuple[Tuple[int, Approval], ...] = ()

    @property
    def verdict(self) -> str:
        if self.report.verdict == "blocked" and not _counting(self):
            return "approved"
        return self.report.verdict


def _counting(phase: Phase) -> Tuple[Event, ...]:
    """The phase's blocked attempts that count (no approval accepted them)."""
    accepted = {seq for seq, _ in phase.accepted}
    return tuple(e for e in phase.report.blocked_events if e.seq not in accepted)


@dataclass(frozen=True)
class Refusal:
    """Why one package refused the install, for the messages.

    ``kind``: ``attempt`` (a blocked runtime attempt, in a hook call or an
    import probe: ``phase`` says which), ``gate`` (a finding of the wheel
    gate), ``output`` (a hook call left a result pip must not use; never
    approvable), ``build`` (a hook call without ``--sandbox``). ``seen``: one line per thing seen. ``hosts``: destinations a
    build was denied (for the "allow a host" hint)."""

    package: str
    version: str
    kind: str
    phase: str
    seen: Tuple[str, ...]
    origin: Optional[Origin] = None
    hosts: Tuple[str, ...] = ()

    @property
    def who(self) -> str:
        return f"{self.package} {self.version}".strip()

    def text(self) -> str:
        seen = "; ".join(self.seen[:5]) + (f"; and {len(self.seen) - 5} more" if len(self.seen) > 5 else "")
        if self.kind == "gate":
            return f"{self.who}: the gate found in its wheel: {seen}"
        if self.kind == "build":
            return (f"{self.who} needs its build backend to run ({self.phase}); without --sandbox no "
                    "package code runs: use 'pipguard install --sandbox'")
        if self.kind == "output":
            return f"{self.who}: its {self.phase} hook left a result pip must not use: {seen}"
        if self.phase == "probe":
            return f"{self.who}: importing it (--probe-imports) attempted what an import may not: {seen}"
        return f"{self.who}: its {self.phase} hook attempted what a build may not: {seen}"


@dataclass(frozen=True)
class PackageResult:
    name: str
    version: str
    artifact: str
    sha256: str
    from_sdist: bool
    verdict: str
    findings: Tuple[gate.Finding, ...] = ()
    events: Tuple[Event, ...] = ()
    #: the artifact pip got (sdist or wheel); None: a local directory or checkout
    origin: Optional[Origin] = None
    #: findings and attempts an approval accepted (not in ``findings``/``events``)
    accepted_findings: Tuple[Tuple[gate.Finding, Approval], ...] = ()
    accepted_events: Tuple[Tuple[Event, Approval], ...] = ()


@dataclass(frozen=True)
class InstallResult:
    """Outcome of ``install``/``sandbox``: ``status`` is ``installed``,
    ``clean`` (sandbox mode, nothing installed), ``refused``, ``error`` or
    ``interrupted`` (SIGINT/SIGTERM: the running phase was stopped, nothing installed)."""

    command: Tuple[str, ...]
    status: str
    phases: Tuple[Phase, ...]
    packages: Tuple[PackageResult, ...]
    findings: Tuple[gate.Finding, ...]
    message: str = ""
    isolation: str = "auto"
    refusals: Tuple[Refusal, ...] = ()
    policy_file: Optional[str] = None

    @property
    def exit_code(self) -> int:
        from pipguard import exitcodes

        return {"installed": exitcodes.OK, "clean": exitcodes.OK, "refused": exitcodes.REFUSED,
                "interrupted": exitcodes.INTERRUPTED}.get(self.status, exitcodes.ERROR)

    def combined(self) -> Report:
        """One run-style report over every phase (top-level events of all phases)."""
        exit_code = {"installed": 0, "clean": 0, "refused": 1, "interrupted": 130}.get(self.status, 2)
        parts = [(p.report, {"phase": p.name, **({"package": p.package} if p.package else {})})
                 for p in self.phases]
        return combined(parts, command=self.command, exit_code=exit_code, isolation=self.isolation,
                        cwd=self.phases[0].report.cwd if self.phases else os.getcwd(),
                        error=self.message if self.status == "error" else None, dedupe_network=True)

    def to_json(self) -> dict:
        data = self.combined().to_json()
        data["verdict"] = {"installed": "clean", "clean": "clean", "refused": "blocked"}.get(
            self.status, "error")
        data["status"] = self.status
        data["message"] = self.message
        accepted = [dict(p.accepted).get(e.seq) for p in self.phases for e in p.report.events]
        for event, approval in zip(data["events"], accepted):
            if approval is not None:
                _mark_accepted(event, approval)
        data["phases"] = [{"name": p.name, "package": p.package, "verdict": p.verdict,
                           "exit_code": p.report.exit_code, "duration": p.report.duration,
                           "limits": p.report.limits, "limit_hit": p.report.limit_hit}
                          for p in self.phases]
        data["packages"] = [
            {"name": p.name, "version": p.version, "artifact": p.artifact, "sha256": p.sha256,
             "origin": p.origin.to_json() if p.origin else None,
             "from_sdist": p.from_sdist, "verdict": p.verdict,
             # its own sandboxed hook calls, in order (the top-level "phases" holds every one)
             "hook_calls": [{key: phase[key] for key in ("name", "verdict", "exit_code", "duration")}
                            for phase in data["phases"] if phase["package"] == p.name],
             "findings": [_finding_json(f, None) for f in p.findings]
             + [_finding_json(f, a) for f, a in p.accepted_findings],
             "events": [dataclasses.asdict(e) for e in p.events]
             + [_mark_accepted(dataclasses.asdict(e), a) for e, a in p.accepted_events]}
            for p in self.packages]
        data["findings"] = [_finding_json(f, None) for f in self.findings]
        data["refusals"] = [{"package": r.package, "version": r.version, "kind": r.kind, "phase": r.phase,
                             "seen": list(r.seen), "origin": r.origin.to_json() if r.origin else None,
                             "hosts": list(r.hosts), "message": r.text()} for r in self.refusals]
        data["policy_file"] = self.policy_file
        return data


def _finding_json(finding: "gate.Finding", approval: Optional[Approval]) -> dict:
    data = dataclasses.asdict(finding)
    data["counts"] = approval is None and finding.severity in REFUSING_SEVERITIES
    data["approved"] = _approval_json(approval)
    return data


def _mark_accepted(event: dict, approval: Approval) -> dict:
    """An accepted attempt: blocked, and still listed, but it does not count."""
    event["severity"] = "info"
    event["detail"] = dict(event.get("detail") or {}, approved=_approval_json(approval))
    return event


def _approval_json(approval: Optional[Approval]) -> Optional[dict]:
    if approval is None:
        return None
    return {"package": approval.package, "sha256": approval.sha256, "kind": approval.kind,
            "rule": approval.rule, "target": approval.target, "reason": approval.reason}
