"""The report as SARIF 2.1.0, for code-scanning dashboards.

One run; one result per *blocked* event (allowed events are evidence, not
findings, and stay in the JSON report); one rule per distinct ``rule``
string among those events. The mapping is documented in ``docs/report.md``.
Output is deterministic: rules sorted by id, results in ``seq`` order.
"""

from __future__ import annotations

import json
import posixpath
import shlex
import signal
from datetime import datetime, timezone
from pathlib import PurePosixPath
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import quote

from pipguard import exitcodes
from pipguard.report.render import printable
from pipguard.report.model import Event, Report, unicode_data

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
SARIF_VERSION = "2.1.0"
TOOL_NAME = "pipguard"
INFORMATION_URI = "https://pypi.org/project/pipguard/"
#: ruleId for a blocked event whose ``rule`` is empty (SARIF ids must not be).
UNNAMED_RULE = "pipguard-unnamed-rule"
#: uriBaseId of relative paths (audit ``open`` events can carry them).
CWD_BASE = "CWD"


def render(report: Report, *, color: bool = False) -> str:
    """``color`` is accepted for a uniform signature and ignored."""
    del color
    return json.dumps(unicode_data(to_sarif(report)), indent=2, ensure_ascii=False) + "\n"


def to_sarif(report: Report) -> Dict[str, Any]:
    """The SARIF log as plain data (what :func:`render` serialises)."""
    blocked = sorted(report.blocked_events, key=lambda e: e.seq)
    argv0 = _argv0_by_pid(report)
    rule_ids = sorted({_rule_id(e) for e in blocked})
    index = {rule_id: i for i, rule_id in enumerate(rule_ids)}
    kinds: Dict[str, set] = {r: set() for r in rule_ids}
    for e in blocked:
        kinds[_rule_id(e)].add(e.kind)

    uses_cwd = False
    results = []
    for e in blocked:
        result, relative = _result(e, argv0.get(e.pid), index)
        uses_cwd = uses_cwd or relative
        results.append(result)

    driver: Dict[str, Any] = {"name": TOOL_NAME, "informationUri": INFORMATION_URI}
    if report.tool_version:
        driver["version"] = report.tool_version
    driver["rules"] = [_rule(r, sorted(kinds[r])) for r in rule_ids]

    run: Dict[str, Any] = {"tool": {"driver": driver}}
    if uses_cwd and report.cwd.startswith("/"):
        run["originalUriBaseIds"] = {CWD_BASE: {"uri": _dir_uri(report.cwd)}}
    run["invocations"] = [_invocation(report)]
    run["results"] = results
    run["properties"] = {
        "schema": report.schema,
        "verdict": report.verdict,
        "isolation": {
            "requested": report.isolation.requested,
            "applied": list(report.isolation.applied),
            "unavailable": dict(sorted(report.isolation.unavailable.items())),
        },
        "eventsDropped": report.events_dropped,
    }
    return {"$schema": SARIF_SCHEMA, "version": SARIF_VERSION, "runs": [run]}


def _rule_id(event: Event) -> str:
    return event.rule or UNNAMED_RULE


def _rule(rule_id: str, kinds: List[str]) -> Dict[str, Any]:
    return {
        "id": rule_id,
        "name": rule_id,
        "shortDescription": {"text": f"pipguard blocked an attempt under rule {rule_id}"},
        "fullDescription": {
            "text": (
                f"A sandboxed process tried something policy rule {rule_id} forbids "
                f"({', '.join(kinds)}); pipguard blocked it."
            )
        },
        "help": {
            "text": (
                "Code run while building or installing a package attempted an action the "
                "sandbox policy forbids. Treat the package as suspicious until you know why "
                "it did this. If the action is legitimate, allow it explicitly "
                "(--allow-host, --allow-write, --allow-read, --allow-network, --keep-env) "
                "and run again."
            )
        },
        "defaultConfiguration": {"level": "error"},
        "properties": {"tags": ["security", "supply-chain"]},
    }


def _result(event: Event, argv0: Optional[str], index: Dict[str, int]) -> Tuple[Dict[str, Any], bool]:
    rule_id = _rule_id(event)
    name = argv0 or "?"
    # Escaped for the humans reading dashboards; properties keep the raw target.
    text = printable(
        f"Blocked {event.kind} of {event.target} by pid {event.pid} ({name}) [{event.layer}]"
    )
    location, relative = _location(event, name)
    properties: Dict[str, Any] = {
        "seq": event.seq,
        "pid": event.pid,
        "layer": event.layer,
        "kind": event.kind,
        "target": event.target,
    }
    for key in ("python", "seen_by", "syscall", "errno"):
        if key in event.detail:
            properties[key] = event.detail[key]
    result = {
        "ruleId": rule_id,
        "ruleIndex": index[rule_id],
        "level": "error",
        "message": {"text": text},
        "locations": [location],
        "properties": properties,
    }
    return result, relative


def _location(event: Event, argv0: str) -> Tuple[Dict[str, Any], bool]:
    """A source location when an audit event names a real Python file
    (``detail["python"] == "/path/setup.py:12"``), else the process."""
    python = event.detail.get("python")
    if isinstance(python, str) and python:
        path, line = _split_file_line(python)
        # "<string>", "<frozen importlib._bootstrap>": no file to point at.
        if path and not path.startswith("<"):
            artifact: Dict[str, Any]
            relative = not path.startswith("/")
            if relative:
                artifact = {"uri": quote(path), "uriBaseId": CWD_BASE}
            else:
                artifact = {"uri": PurePosixPath(path).as_uri()}
            physical: Dict[str, Any] = {"artifactLocation": artifact}
            if line is not None:
                physical["region"] = {"startLine": line}
            return {"physicalLocation": physical}, relative
    return {
        "logicalLocations": [
            {
                "name": argv0,
                "fullyQualifiedName": f"pid {event.pid} ({argv0})",
                "kind": "process",
            }
        ]
    }, False


def _split_file_line(value: str) -> Tuple[str, Optional[int]]:
    path, sep, line = value.rpartition(":")
    if sep and line.isdigit() and int(line) >= 1:
        return path, int(line)
    return value, None


def _dir_uri(path: str) -> str:
    uri = PurePosixPath(path).as_uri()
    return uri if uri.endswith("/") else uri + "/"


def _argv0_by_pid(report: Report) -> Dict[int, str]:
    names: Dict[int, str] = {}
    for p in report.processes:
        if p.pid not in names and p.argv:
            names[p.pid] = posixpath.basename(p.argv[0]) or p.argv[0]
    return names


def _invocation(report: Report) -> Dict[str, Any]:
    """``exitCode`` is the status ``pipguard run`` returns (128+N for signal
    N, 124 on timeout); absent when the command never started."""
    inv: Dict[str, Any] = {
        "executionSuccessful": report.verdict != "error",
        "commandLine": " ".join(shlex.quote(a) for a in report.command),
    }
    code = report.exit_code
    if code is not None:
        inv["exitCode"] = exitcodes.from_wait_status(code, report.timed_out)
        if code < 0:
            inv["exitSignalNumber"] = -code
            try:
                inv["exitSignalName"] = signal.Signals(-code).name
            except ValueError:
                pass
        if report.timed_out:
            inv["exitCodeDescription"] = "timed out"
    if report.started_at > 0:
        inv["startTimeUtc"] = _utc(report.started_at)
        inv["endTimeUtc"] = _utc(report.started_at + max(report.duration, 0.0))
    if report.error:
        inv["toolExecutionNotifications"] = [
            {"level": "error", "message": {"text": report.error}}
        ]
    inv["properties"] = {"timedOut": report.timed_out, "rawExitCode": code}
    return inv


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
