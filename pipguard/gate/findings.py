"""A finding of the static gate, and its severities: what the gate's rules and the ownership
check (what an install would overwrite) both report, so both take it from here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Set, Tuple

CRITICAL = "critical"
HIGH = "high"
MEDIUM = "medium"
#: Something the gate recognised as what a known tool writes (a coverage hook, an editable
#: finder): reported so a reader sees it, never suspicious.
INFO = "info"
SEVERITIES = (CRITICAL, HIGH, MEDIUM, INFO)
SEVERITY_RANK = {CRITICAL: 0, HIGH: 1, MEDIUM: 2, INFO: 3}
#: Severities that refuse an install by default; medium and info findings are informational.
BLOCKING_SEVERITIES = (CRITICAL, HIGH)

#: Evidence is truncated to this many characters.
MAX_EVIDENCE = 200
#: At most this many findings per artifact; the last slot then says how many were dropped.
MAX_FINDINGS = 100


@dataclass(frozen=True)
class Finding:
    """One thing the gate saw in one artifact.

    ``member`` is the path inside the archive (``""`` for the archive as a whole); ``line`` is the
    1-based line in that member, ``None`` when the finding is about the member itself; ``evidence``
    is the offending text, at most ``MAX_EVIDENCE`` characters.
    """

    package: str
    artifact: str
    severity: str
    rule: str
    member: str
    line: Optional[int]
    message: str
    evidence: str

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")
        if len(self.evidence) > MAX_EVIDENCE:
            object.__setattr__(self, "evidence", self.evidence[:MAX_EVIDENCE - 1] + "\u2026")

    def to_dict(self) -> dict:
        return {"package": self.package, "artifact": self.artifact, "severity": self.severity,
                "rule": self.rule, "member": self.member, "line": self.line,
                "message": self.message, "evidence": self.evidence}


class FindingCollector:
    """Keeps the ``MAX_FINDINGS - 1`` most severe findings and counts the rest."""

    def __init__(self, package: str, artifact: str) -> None:
        self.package = package
        self.artifact = artifact
        self.items: List[Finding] = []
        self.dropped = 0
        self._seen: Set[tuple] = set()

    def add(self, severity: str, rule: str, member: str, message: str, evidence: str = "",
            line: Optional[int] = None) -> None:
        key = (rule, member, line, evidence, message)
        if key in self._seen:
            return
        self._seen.add(key)
        f = Finding(self.package, self.artifact, severity, rule, member, line, message, evidence)
        self.items.append(f)
        if len(self.items) > MAX_FINDINGS - 1:
            # Drop the least severe (latest among equals) so a flood of mediums cannot hide a critical.
            worst = max(range(len(self.items)), key=lambda i: (SEVERITY_RANK[self.items[i].severity], i))
            del self.items[worst]
            self.dropped += 1

    def result(self) -> Tuple[Finding, ...]:
        out = sorted(self.items, key=lambda f: (SEVERITY_RANK[f.severity], f.member, f.line or 0))
        if self.dropped:
            out.append(Finding(self.package, self.artifact, MEDIUM, "findings-truncated", "", None,
                               f"{self.dropped} more finding(s) not shown (cap {MAX_FINDINGS})", ""))
        return tuple(out)
