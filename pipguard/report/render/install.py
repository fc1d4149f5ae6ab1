"""Renderers for ``install``/``sandbox`` results: pure functions to str."""

from __future__ import annotations

import json
import os
import shlex
from typing import List, Optional

from pipguard.report.render import load_tabulate
from pipguard.report.render.safe import printable as _clean
from pipguard.report.render import sarif as sarif_mod
from pipguard.report.render.table import blocked_table, info_table

tabulate = load_tabulate()

_RED, _GREEN, _RESET = "\033[31m", "\033[32m", "\033[0m"


def table(result, *, color: bool = False, report_path: Optional[str] = None) -> str:
    """The human summary. ``report_path``: where the JSON report was written
    (the "approve" hint names it; None: the hint says to write one)."""
    status = result.status.upper()
    if color:
        status = (_GREEN if result.status in ("installed", "clean") else _RED) + status + _RESET
    lines = [f"pipguard: {status} — {_clean(result.message)}"]
    if result.status in ("installed", "clean"):
        lines.append("observed clean in this run is evidence, not proof")
    accepted = [(p, what, a) for p in result.packages
                for what, a in [*((_clean(f"gate: {f.rule} in {f.member}"), a) for f, a in p.accepted_findings),
                                *((_clean(f"{e.kind} {e.target} ({e.rule})"), a) for e, a in p.accepted_events)]]
    if accepted:
        lines += ["", f"Accepted by approvals in {result.policy_file} ({len(accepted)}; pinned to "
                      "each artifact's sha256; blocked attempts stayed blocked):"]
        lines += [f"  {_clean(p.name)} {_clean(p.version)}: {what}" for p, what, _a in accepted[:20]]
    if result.packages:
        rows = [(_clean(p.name), _clean(p.version), "built" if p.from_sdist else "wheel", p.verdict,
                 len(p.findings), len(p.events)) for p in result.packages]
        lines += ["", tabulate(rows, headers=("package", "version", "from", "verdict",
                                              "findings", "blocked"),
                                     disable_numparse=True)]  # "3.10" is a version, not 3.1
    findings = [f for p in result.packages for f in p.findings] or list(result.findings)
    if findings:
        finding_rows = [(_clean(f.package), f.severity, _clean(f.rule), _clean(f.member), _clean(f.message[:80]))
                        for f in findings[:50]]
        lines += ["", f"Gate findings ({len(findings)}):",
                  tabulate(finding_rows, headers=("package", "severity", "rule", "member", "message"),
                           disable_numparse=True)]
    for phase in result.phases:
        taken = {seq for seq, _approval in phase.accepted}  # listed above, under the approvals
        text = "\n\n".join(t for t in (
            blocked_table([e for e in phase.report.events if e.seq not in taken], phase.report.processes,
                          color=color),
            info_table(phase.report.events, phase.report.processes, color=color)) if t)
        if text:
            where = _clean(f"{phase.name} of {phase.package}" if phase.package else phase.name)
            lines += ["", f"[{where}]", text.rstrip("\n")]
    unavailable = {}
    for phase in result.phases:
        unavailable.update(phase.report.isolation.unavailable)
    if unavailable:
        lines += ["", "degraded layers: " + ", ".join(f"{k} ({v})" for k, v in unavailable.items())]
    if result.refusals:
        lines += ["", *next_steps(result, report_path)]
    return "\n".join(lines) + "\n"


def next_steps(result, report_path: Optional[str]) -> List[str]:
    """What was seen, and what the user can do about each refusal."""
    lines = ["Refused because:"]
    for refusal in result.refusals:
        lines.append(f"  - {_clean(refusal.text())}")
        if refusal.origin is not None:
            lines.append(_clean(f"    artifact: {refusal.origin.filename or '?'} sha256 {refusal.origin.sha256}"))
    lines.append("What you can do:")
    approvable = [r for r in result.refusals if r.kind in ("attempt", "gate") and r.origin is not None]
    local = [r for r in result.refusals if r.kind in ("attempt", "gate") and r.origin is None]
    hosts = [(r, h) for r in result.refusals if r.kind == "attempt" and r.phase != "probe" for h in r.hosts]
    if any(r.kind == "build" for r in result.refusals):
        lines.append("  - run it with 'pipguard install --sandbox' (builds run in a sandbox)")
    if approvable:
        names = _clean(", ".join(dict.fromkeys(r.who for r in approvable)))
        if report_path:
            how = f"pipguard approve --from-report {shlex.quote(report_path)} --write"
        else:
            how = ("run again with --report r.json, then: pipguard approve --from-report r.json "
                   "--write")
        lines.append(f"  - if you reviewed {names} and accept what it did, approve exactly this "
                     f"artifact (a changed one needs a new approval): {how}; then review and commit "
                     f"{os.path.relpath(result.policy_file) if result.policy_file else 'pipguard.toml'}")
    for refusal, host in hosts:
        lines.append(_clean(f"  - if the build of {refusal.package} needs {host}: --allow-build-host {host} "
                     f"(or in the policy: [build-hosts] {refusal.package} = [\"{host}\"]); it is then "
                     "reached through pipguard's proxy (HTTPS_PROXY), every request recorded"))
    for refusal in local:
        lines.append(f"  - {_clean(refusal.who)} is a local directory or checkout: it has no artifact hash to "
                     "approve; fix it, or grant what its build needs (--allow-read/--allow-write, or "
                     "allow-read/allow-write in the policy)")
    if any(r.kind == "output" for r in result.refusals):
        lines.append("  - a hook result pip must not use is never approvable: report it to the "
                     "package's authors")
    names = _clean(", ".join(dict.fromkeys(r.package for r in result.refusals if r.kind != "build")))
    if names:
        lines.append(f"  - or drop {names}: pin another version, or remove what requires it")
    return lines


def sarif(result) -> str:
    data = sarif_mod.to_sarif(result.combined())
    run = data["runs"][0]
    rules = run["tool"]["driver"].setdefault("rules", [])
    known = {r["id"] for r in rules}
    for p in result.packages:
        for f in p.findings:
            rule_id = "gate/" + f.rule
            if rule_id not in known:
                known.add(rule_id)
                rules.append({"id": rule_id, "shortDescription": {"text": f.rule},
                              "defaultConfiguration": {"level": "error"}})
            run["results"].append({
                "ruleId": rule_id, "level": "error" if f.severity in ("critical", "high") else "warning",
                "message": {"text": _clean(f"{p.name} {p.version}: {f.message}")},
                "locations": [{"physicalLocation": {"artifactLocation": {"uri": f"{p.artifact}/{f.member}"},
                                                    **({"region": {"startLine": f.line}} if f.line else {})}}],
                "properties": {"severity": f.severity, "package": p.name, "evidence": f.evidence},
            })
    return json.dumps(data, indent=2) + "\n"
