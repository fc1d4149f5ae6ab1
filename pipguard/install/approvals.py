"""Approvals: a reviewed "yes" to one gate finding or one blocked attempt of
one artifact, pinned to that artifact's sha256.

"The artifact" is what pip got from the index (or a ``--find-links`` folder,
or a URL) for a package: the wheel it downloaded, or the sdist it built a
wheel from. For a runtime attempt in a build, that is the sdist (pip hashed
it, or checked the index's hash, before any of its hooks ran; the seam sends
the hash with the source tree). For a wheel built from an sdist, gate
findings are pinned to the sdist too: the wheel is derived from it, and a
rebuilt wheel is never byte-identical. A local directory or a VCS checkout
has no artifact hash: nothing of it can be approved.

An approval *accepts*, it never *grants*: a blocked attempt stays blocked
(the build got EACCES, as without the approval); the approval only says that
this attempt by this artifact does not refuse the install. What a build may
reach is granted elsewhere (``allow-read``, ``allow-write``, ``build-hosts``).
An approved gate finding, on the other hand, lets that wheel be installed
with what the gate found in it (e.g. a ``.pth`` that runs code at start-up).

Matching: the sha256 must be equal; the rule must be equal; the target (an
attempt's target, a finding's wheel member) is matched as a glob (``*``,
``?``, ``[...]``; fnmatch, case-sensitive). ``package`` (``name==version``)
and ``reason`` are for the people who review the file, never matched.
"""

from __future__ import annotations

import fnmatch
import re
import tempfile
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, Tuple

KINDS = ("gate", "attempt")
SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Origin:
    """The artifact pip got for a package: file name (None when pip did not
    say) and sha256."""

    filename: Optional[str]
    sha256: str

    def to_json(self) -> dict:
        return {"filename": self.filename, "sha256": self.sha256}

    @classmethod
    def from_json(cls, data) -> Optional["Origin"]:
        """None unless ``data`` carries a well-formed sha256 (the seam's input
        is pip's; still, only a real hash may ever match an approval)."""
        if not isinstance(data, dict):
            return None
        digest, filename = data.get("sha256"), data.get("filename")
        if not isinstance(digest, str) or not SHA256.fullmatch(digest.lower()):
            return None
        return cls(filename if isinstance(filename, str) else None, digest.lower())


@dataclass(frozen=True)
class Approval:
    """One entry of the policy's ``approve`` list.

    - ``kind``: ``gate`` (a finding of the wheel gate) or ``attempt`` (a
      blocked runtime attempt: a build hook call, or an import probe).
    - ``rule``: the finding's or the event's rule (``pth-exec``, ``home-read``…).
    - ``target``: glob over the wheel member (gate) or the event's target
      (attempt), see :func:`normalize_target`.
    - ``phase``: an attempt only in this hook call (``build_wheel``…) or
      ``probe``; None: any phase.
    """

    sha256: str
    package: str
    kind: str
    rule: str
    target: str
    phase: Optional[str] = None
    reason: str = ""

    def covers(self, sha256: str, kind: str, rule: str, target: str, phase: Optional[str] = None) -> bool:
        return (self.sha256 == sha256 and self.kind == kind and self.rule == rule
                and (self.phase is None or self.phase == phase)
                and fnmatch.fnmatchcase(target, self.target))


@dataclass(frozen=True)
class Approvals:
    """The approvals of one policy; empty: nothing is approved."""

    entries: Tuple[Approval, ...] = ()

    def finding(self, origin: Optional[Origin], rule: str, member: str) -> Optional[Approval]:
        """The approval that accepts a gate finding, or None."""
        if origin is None:
            return None
        return next((a for a in self.entries if a.covers(origin.sha256, "gate", rule, member)), None)

    def attempt(self, origin: Optional[Origin], rule: str, target: str,
                phase: Optional[str]) -> Optional[Approval]:
        """The approval that accepts a blocked runtime attempt, or None."""
        if origin is None:
            return None
        shown = normalize_target(target)
        return next((a for a in self.entries if a.covers(origin.sha256, "attempt", rule, shown, phase)),
                    None)


# pipguard's per-run directories (plan.py: TMPDIR/pipguard-XXXXXXXX/{home,tmp})
_RUN_DIR = re.compile(r"^" + re.escape(tempfile.gettempdir().rstrip("/")) + r"/pipguard-[^/]+/(home|tmp)(?=/|$)")


def normalize_target(target: str) -> str:
    """An event's target as approvals name it: the sandbox's decoy home as
    ``~`` and its private temp dir as ``$TMPDIR`` (both have a new random
    name in every run); anything else unchanged (a real home stays the
    absolute path it is)."""
    return _RUN_DIR.sub(lambda m: "~" if m.group(1) == "home" else "$TMPDIR", target, count=1)


def suggested_target(kind: str, target: str) -> str:
    """The target ``approve --from-report`` writes: exact, except names the
    kernel or libc make up per run (a POSIX semaphore's ``/dev/shm/sem.*``)."""
    target = normalize_target(target) if kind == "attempt" else target
    if target.startswith("/dev/shm/sem."):
        return "/dev/shm/sem.*"
    return target


@dataclass(frozen=True)
class Candidate:
    """What ``pipguard approve --from-report`` proposes: an approval, or a
    note about something that cannot be approved."""

    approval: Optional[Approval]
    note: str = ""
    what: str = ""   # what was seen, one line, for the comment above the entry


def from_report(data: dict, known: Approvals = Approvals()) -> List[Candidate]:
    """Approvals for everything that refused in an install/sandbox report
    (``--report FILE``): refusing gate findings and blocked attempts of each
    package with an artifact hash; notes for the rest. Entries ``known``
    already covers, and duplicates, are left out."""
    from pipguard.errors import UsageError

    packages = data.get("packages") if isinstance(data, dict) else None
    if data.get("schema") != "pipguard.report/1" or not isinstance(packages, list):
        raise UsageError("not a pipguard install/sandbox report (no 'packages')",
                         hint="write one with 'pipguard install --sandbox --report FILE ...'")
    out: List[Candidate] = []
    seen = set()
    for package in packages:
        if not isinstance(package, dict):
            continue
        name, version = str(package.get("name") or "?"), str(package.get("version") or "")
        who = f"{name}=={version}" if version else name
        origin = Origin.from_json(package.get("origin"))
        wanted = _refusing(package)
        if not wanted:
            continue
        if origin is None:
            out.append(Candidate(None, f"{who}: no artifact hash (a local directory, a VCS checkout, "
                                       "or a pip that did not say): nothing of it can be approved; fix "
                                       "the project or grant what it needs (allow-read, allow-write, "
                                       "build-hosts)"))
            continue
        for kind, rule, target, phase, what in wanted:
            if kind == "gate" and known.finding(origin, rule, target):
                continue
            if kind == "attempt" and known.attempt(origin, rule, target, phase):
                continue
            approval = Approval(origin.sha256, who, kind, rule, suggested_target(kind, target))
            if approval in seen:
                continue
            seen.add(approval)
            out.append(Candidate(approval, what=what))
    return out


def _refusing(package: dict) -> List[Tuple[str, str, str, Optional[str], str]]:
    """(kind, rule, target, phase, what) of what refused this package."""
    found: List[Tuple[str, str, str, Optional[str], str]] = []
    for finding in package.get("findings") or ():
        if not isinstance(finding, dict) or not finding.get("counts", finding.get("severity")
                                                                in ("critical", "high")):
            continue
        if finding.get("approvable") is False:
            continue
        rule, member = str(finding.get("rule") or ""), str(finding.get("member") or "")
        found.append(("gate", rule, member, None, f"gate: {rule} in {member}: {finding.get('message', '')}"))
    for event in package.get("events") or ():
        if not isinstance(event, dict) or event.get("severity") == "info" or event.get("action") != "blocked":
            continue
        rule, target = str(event.get("rule") or ""), str(event.get("target") or "")
        phase = (event.get("detail") or {}).get("phase")
        found.append(("attempt", rule, target, phase if isinstance(phase, str) else None,
                      f"{phase or 'runtime'}: {event.get('kind', '')} {normalize_target(target)} "
                      f"({rule}, blocked)"))
    return found


# ---------------------------------------------------------------------------- TOML
def to_toml(candidates: Sequence[Candidate], table: str = "") -> str:
    """The candidates as TOML for a human to review: an ``[[approve]]`` entry
    each (``[[tool.pipguard.approve]]`` with ``table="tool.pipguard"``), with
    a comment saying what was seen; notes as comments."""
    header = f"[[{table + '.' if table else ''}approve]]"
    lines: List[str] = []
    for candidate in candidates:
        if candidate.approval is None:
            lines += [f"# not approvable: {_comment(candidate.note)}", ""]
            continue
        a = candidate.approval
        if candidate.what:
            lines.append(f"# seen: {_comment(candidate.what)}")
        lines += [header, f"package = {toml_string(a.package)}", f"sha256 = {toml_string(a.sha256)}",
                  f"{a.kind} = {toml_string(a.rule)}",
                  f"{'member' if a.kind == 'gate' else 'target'} = {toml_string(a.target)}"]
        if a.phase:
            lines.append(f"phase = {toml_string(a.phase)}")
        lines += ['reason = ""  # say why this is fine, or delete the entry', ""]
    return "\n".join(lines)


def _comment(text: str) -> str:
    return "".join(c if c.isprintable() else " " for c in text)[:300]


def toml_string(text: str) -> str:
    """A TOML basic string: quotes, backslashes and every control character
    (TOML forbids U+0000-U+001F and U+007F raw) escaped."""
    out = ['"']
    for char in text:
        code = ord(char)
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def entries(values: Iterable) -> Tuple[Approval, ...]:
    """Validated :class:`Approval` entries from the policy's ``approve`` list
    (raises PolicyError naming the entry)."""
    from pipguard.errors import PolicyError

    out = []
    for number, value in enumerate(values, 1):
        where = f"approve entry {number}"
        if not isinstance(value, dict):
            raise PolicyError(f"{where}: expected a table ([[approve]]), got {type(value).__name__}")
        unknown = sorted(set(value) - {"package", "sha256", "gate", "attempt", "member", "target",
                                       "phase", "reason"})
        if unknown:
            raise PolicyError(f"{where}: unknown key(s) {', '.join(unknown)}",
                              hint="known: package, sha256, gate or attempt, member or target, phase, reason")
        for key in value:
            if not isinstance(value[key], str):
                raise PolicyError(f"{where}: {key} must be a string")
        digest = value.get("sha256", "")
        if not SHA256.fullmatch(digest):
            raise PolicyError(f"{where}: sha256 must be 64 lowercase hex digits, got {digest!r}")
        package = value.get("package", "")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==\S+", package):
            raise PolicyError(f"{where}: package must be NAME==VERSION (for people), got {package!r}")
        kinds = [k for k in KINDS if k in value]
        if len(kinds) != 1:
            raise PolicyError(f"{where}: give exactly one of gate = RULE (a gate finding) or "
                              "attempt = RULE (a blocked runtime attempt)")
        kind = kinds[0]
        place = "member" if kind == "gate" else "target"
        other = "target" if kind == "gate" else "member"
        if other in value:
            raise PolicyError(f"{where}: {kind} entries name a {place}, not a {other}")
        if not value.get(place):
            raise PolicyError(f"{where}: {place} is required (a glob; '*' for any)")
        if not value[kind]:
            raise PolicyError(f"{where}: {kind} needs the rule name")
        if kind == "gate" and "phase" in value:
            raise PolicyError(f"{where}: phase applies to attempts only")
        out.append(Approval(digest, package, kind, value[kind], value[place], value.get("phase") or None,
                            value.get("reason", "")))
    return tuple(out)
