"""Renderers for ``pipguard pkgbuild`` results: pure functions to str.

``get(format_name)`` returns ``render(result, *, color=False) -> str`` for
each name in :data:`FORMATS`. A new format (Markdown) adds one function and
one entry in ``_RENDERERS``; until then asking for it is a usage error.
Strings from the PKGBUILD (paths, argv, host names, link targets) are
untrusted and escaped before a human sees them.
"""

from __future__ import annotations

import json as _json
from typing import Callable, Dict, List

from pipguard.errors import UsageError
from pipguard.report.render import load_tabulate
from pipguard.report.render import printable as _clean
from pipguard.report.render import sarif as sarif_mod
from pipguard.report.render.table import MAX_ROWS, blocked_table
from pipguard.report.model import dumps

tabulate = load_tabulate()

_RED, _GREEN, _RESET = "\033[31m", "\033[32m", "\033[0m"


def table(result, *, color: bool = False) -> str:
    """Headline, the phases, blocked attempts per phase, files written outside
    each phase's own directories, network destinations, the package's contents."""
    status = result.status.upper()
    if color:
        status = (_GREEN if result.status == "clean" else _RED) + status + _RESET
    what = f"{result.pkgbase} {result.version}".strip() or result.directory
    lines = [f"pipguard: {status} — {_clean(what)}: {_clean(result.message)}"]
    if result.status == "clean":
        lines.append("observed clean in this execution is evidence, not proof")
    if result.phases:
        rows = [(p.title, p.report.verdict, _exit(p.report.exit_code), len(p.report.blocked_events),
                 len(p.written_outside), f"{p.report.duration:.1f}s") for p in result.phases]
        lines += ["", tabulate(rows, headers=("phase", "verdict", "exit", "blocked", "written outside",
                                              "time"), disable_numparse=True)]
    if result.allowed_hosts or result.hosts_needing_allow:
        lines += ["", "Source hosts: allowed " + (", ".join(_clean(h) for h in result.allowed_hosts) or "none")]
        if result.hosts_needing_allow:
            lines.append("  named but not allowed (use --allow-host): "
                         + ", ".join(_clean(h) for h in result.hosts_needing_allow))
    for m in result.checksum_mismatches:
        lines.append(f"checksum mismatch: {_clean(m['filename'])} ({m['algorithm']}: expected "
                     f"{_clean(m['expected'])}, got {_clean(m['actual'])})")
    for phase in result.phases:
        sections = [blocked_table(phase.report.events, phase.report.processes, color=color)]
        network = [n for n in phase.report.network if n.host or n.port]
        if network:
            sections.append("Network:\n" + tabulate(
                [(_clean(n.action), _clean(n.protocol), _clean(f"{n.host or n.address}:{n.port}"))
                 for n in network[:MAX_ROWS]], headers=("action", "proto", "destination"),
                disable_numparse=True))
        outside = phase.written_outside
        if outside:
            sections.append(f"Written outside the build dir ({len(outside)}):\n" + tabulate(
                [(_clean(f.path), f.size, f.sha256[:12]) for f in outside[:MAX_ROWS]],
                headers=("path", "size", "sha256"), disable_numparse=True))
        sections = [s.rstrip("\n") for s in sections if s]
        if sections:
            lines += ["", f"[{_clean(phase.title)}]", *sections]
    if result.contents:
        contents = [(_clean(f.package), _clean(f.path) + (f" -> {_clean(f.target)}" if f.target else ""),
                     f.kind, f.mode, _clean(f.owner), f.size, f.sha256[:12]) for f in result.contents[:MAX_ROWS]]
        lines += ["", f"Package contents ({len(result.contents)}):",
                  tabulate(contents, headers=("package", "path", "kind", "mode", "owner", "size", "sha256"),
                           disable_numparse=True)]
        if len(result.contents) > MAX_ROWS:
            lines.append(f"… and {len(result.contents) - MAX_ROWS} more (see --report)")
    unavailable: Dict[str, str] = {}
    for phase in result.phases:
        unavailable.update(phase.report.isolation.unavailable)
    if unavailable:
        lines += ["", "degraded layers: " + ", ".join(f"{k} ({v})" for k, v in unavailable.items())]
    return "\n".join(lines) + "\n"


def json(result, *, color: bool = False) -> str:
    """The same text ``--report FILE`` writes."""
    del color
    return dumps(result.to_json())


def sarif(result, *, color: bool = False) -> str:
    """One SARIF run over every phase's blocked attempts (tagged with the phase)."""
    del color
    data = sarif_mod.to_sarif(result.combined())
    data["runs"][0]["properties"].update(status=result.status, pkgbase=result.pkgbase,
                                         version=result.version)
    return _json.dumps(data, indent=2, ensure_ascii=False) + "\n"


_RENDERERS: Dict[str, Callable[..., str]] = {"table": table, "json": json, "sarif": sarif}
FORMATS = tuple(_RENDERERS)


def get(format_name: str) -> Callable[..., str]:
    if format_name not in _RENDERERS:
        raise UsageError(f"pkgbuild has no {format_name!r} output yet",
                         hint="choose one of: " + ", ".join(FORMATS))
    return _RENDERERS[format_name]


def _exit(code) -> str:
    return "-" if code is None else str(code)


__all__: List[str] = ["FORMATS", "get", "json", "sarif", "table"]
