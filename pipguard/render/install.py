"""Renderers for ``install``/``sandbox`` results: pure functions to str."""

from __future__ import annotations

import json

from pipguard.render import load_tabulate
from pipguard.render import sarif as sarif_mod
from pipguard.render.table import blocked_table, info_table

tabulate = load_tabulate()

_RED, _GREEN, _RESET = "\033[31m", "\033[32m", "\033[0m"


def table(result, *, color: bool = False) -> str:
    status = result.status.upper()
    if color:
        status = (_GREEN if result.status in ("installed", "clean") else _RED) + status + _RESET
    lines = [f"pipguard: {status} — {result.message}"]
    if result.status in ("installed", "clean"):
        lines.append("observed clean in this run is evidence, not proof")
    if result.packages:
        rows = [(p.name, p.version, "built" if p.from_sdist else "wheel", p.verdict,
                 len(p.findings), len(p.events)) for p in result.packages]
        lines += ["", tabulate(rows, headers=("package", "version", "from", "verdict",
                                              "findings", "blocked"),
                                     disable_numparse=True)]  # "3.10" is a version, not 3.1
    findings = [f for p in result.packages for f in p.findings] or list(result.findings)
    if findings:
        finding_rows = [(f.package, f.severity, f.rule, f.member, f.message[:80]) for f in findings[:50]]
        lines += ["", f"Gate findings ({len(findings)}):",
                  tabulate(finding_rows, headers=("package", "severity", "rule", "member", "message"),
                           disable_numparse=True)]
    for phase in result.phases:
        text = "\n\n".join(t for t in (
            blocked_table(phase.report.events, phase.report.processes, color=color),
            info_table(phase.report.events, phase.report.processes, color=color)) if t)
        if text:
            where = f"{phase.name} of {phase.package}" if phase.package else phase.name
            lines += ["", f"[{where}]", text.rstrip("\n")]
    unavailable = {}
    for phase in result.phases:
        unavailable.update(phase.report.isolation.unavailable)
    if unavailable:
        lines += ["", "degraded layers: " + ", ".join(f"{k} ({v})" for k, v in unavailable.items())]
    return "\n".join(lines) + "\n"


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
                "message": {"text": f"{p.name} {p.version}: {f.message}"},
                "locations": [{"physicalLocation": {"artifactLocation": {"uri": f"{p.artifact}/{f.member}"},
                                                    **({"region": {"startLine": f.line}} if f.line else {})}}],
                "properties": {"severity": f.severity, "package": p.name, "evidence": f.evidence},
            })
    return json.dumps(data, indent=2) + "\n"
