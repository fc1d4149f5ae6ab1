"""The human summary of a report, written to stderr by the CLI.

Layout: one headline, then tables in a fixed order, each only when it has
rows: blocked attempts (what the user must look at first), processes,
network, files written, environment variables removed, dropped events.

Everything shown is bounded (:data:`MAX_ROWS` rows per table, long cells
shortened); the full evidence is in ``--report FILE``. Strings that came
from the sandboxed program (paths, argv, hostnames) are untrusted: control
and invisible characters are escaped so a package cannot repaint the
terminal or hide text (ANSI escapes, ``\\r``, bidi overrides).
"""

from __future__ import annotations

import posixpath
import shlex
import signal
import textwrap
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

from pipguard.report.render import DISCARDED, load_tabulate
from pipguard.report.render import printable as _clean
from pipguard import rules
from pipguard.report.model import Event, ProcessRecord, Report

#: Rows shown per table; the rest are counted, not shown.
MAX_ROWS = 50
#: Cells longer than this are shortened with an ellipsis.
MAX_CELL = 80
ELLIPSIS = "…"

_RED = "\x1b[31m"
_GREEN = "\x1b[32m"
_YELLOW = "\x1b[33m"
_BOLD = "\x1b[1m"
_RESET = "\x1b[0m"

_TABLEFMT = "simple"

tabulate = load_tabulate()


def render(report: Report, *, color: bool = False) -> str:
    """The headline and the non-empty tables, ending in a newline.

    ``color=True`` adds ANSI colour (red for blocked, green for clean,
    yellow for error); with ``False`` the text is plain.
    """
    sections: List[str] = [headline(report, color=color)]
    for events_section in (blocked_table(report.events, report.processes, color=color),
                           info_table(report.events, report.processes, color=color)):
        if events_section:
            sections.append(events_section)
    for section in (
        processes_table(report.processes),
        network_table(report, color=color),
        files_table(report),
        env_section(report.env_removed),
    ):
        if section:
            sections.append(section)
    if report.events_dropped > 0:
        n = report.events_dropped
        sections.append(
            f"{n} further event{'s' if n != 1 else ''} dropped "
            "(not recorded in this report)"
        )
    return "\n\n".join(sections) + "\n"


# -- headline ---------------------------------------------------------------


def headline(report: Report, *, color: bool = False) -> str:
    """One line: verdict, how the command ended, which isolation applied."""
    verdict = report.verdict
    word = verdict.upper()
    if verdict == "blocked":
        n = len(report.blocked_events)
        word += f" ({n} attempt{'s' if n != 1 else ''})"
    if color:
        tint = {"blocked": _RED, "clean": _GREEN}.get(verdict, _YELLOW)
        word = f"{_BOLD}{tint}{word}{_RESET}"

    parts = [f"pipguard: {word}", _ending(report), _isolation(report)]
    if verdict == "clean":
        parts.append("observed clean in this run is evidence, not proof")
    return " | ".join(p for p in parts if p)


def _ending(report: Report) -> str:
    code = report.exit_code
    if code is None:
        why = _clean(report.error) if report.error else "command never started"
        return f"not run: {why}"
    text = f"killed by {_signal_name(-code)}" if code < 0 else f"exit {code}"
    if report.timed_out:
        text = f"timed out after {report.duration:.1f}s, {text}"
    if report.error:
        text += f"; error: {_clean(report.error)}"
    return text


def _isolation(report: Report) -> str:
    iso = report.isolation
    applied = ", ".join(_clean(a) for a in iso.applied) or "none"
    text = f"isolation: {applied} (requested {_clean(iso.requested)})"
    if iso.unavailable:
        missing = "; ".join(
            f"{_clean(layer)}: {_clean(reason)}"
            for layer, reason in sorted(iso.unavailable.items())
        )
        text += f", unavailable: {missing}"
    return text


def _signal_name(signum: int) -> str:
    try:
        return f"signal {signum} ({signal.Signals(signum).name})"
    except ValueError:
        return f"signal {signum}"


# -- tables -----------------------------------------------------------------


def blocked_table(
    events: Iterable[Event],
    processes: Iterable[ProcessRecord],
    *,
    color: bool = False,
    max_rows: int = MAX_ROWS,
) -> str:
    """The blocked attempts among ``events`` in ``seq`` order, titled; ``""``
    when nothing was blocked.

    The process column is ``pid (argv0)`` looked up in ``processes`` (just the
    pid when the process is unknown). A ``python`` column (file:line of the
    Python frame, from audit-layer events) appears when any row has one.
    Shared by ``run`` and, per package, ``install``.
    """
    # Findings only (severity "finding"); informational events (urllib3's
    # loopback IPv6 probe, configuration lookups in the decoy home) have their
    # own table, info_table().
    blocked = sorted((e for e in events if e.finding), key=lambda e: e.seq)
    return _events_section(blocked, processes, f"Blocked ({len(blocked)})", _RED, color, max_rows)


def info_table(
    events: Iterable[Event],
    processes: Iterable[ProcessRecord],
    *,
    color: bool = False,
    max_rows: int = MAX_ROWS,
) -> str:
    """Events under an informational rule (pipguard.rules.INFO_RULES), titled
    as not counting toward the verdict; ``""`` when there are none."""
    info = sorted((e for e in events if not e.finding and e.rule in rules.INFO_RULES),
                  key=lambda e: e.seq)
    return _events_section(info, processes, f"Informational, not counted ({len(info)})", _YELLOW,
                           color, max_rows)


def _events_section(blocked: List[Event], processes: Iterable[ProcessRecord], title: str, tint: str,
                    color: bool, max_rows: int) -> str:
    if not blocked:
        return ""
    names = _process_names(processes)
    with_python = any(e.detail.get("python") for e in blocked)
    headers = ["kind", "target", "process", "layer", "rule"]
    if with_python:
        headers.append("python")
    rows = []
    for e in blocked[:max_rows]:
        kind = _clean(e.kind)
        if color:
            kind = f"{tint}{kind}{_RESET}"
        seen_by = e.detail.get("seen_by")
        layer = ",".join(map(str, seen_by)) if isinstance(seen_by, list) and seen_by else e.layer
        row = [
            kind,
            _cell(e.target),
            _process_cell(e.pid, names),
            _clean(layer),
            _clean(e.rule),
        ]
        if with_python:
            row.append(_cell(e.detail.get("python") or ""))
        rows.append(row)
    if color:
        title = f"{_BOLD}{tint}{title}{_RESET}"
    return _section(title, headers, rows, len(blocked), max_rows)


def processes_table(processes: Sequence[ProcessRecord], *, max_rows: int = MAX_ROWS) -> str:
    """Every process seen, in the order the report lists them."""
    if not processes:
        return ""
    rows = [
        [str(p.pid), str(p.ppid), _exit_cell(p), _cell(_join_argv(p.argv))]
        for p in processes[:max_rows]
    ]
    return _section(
        f"Processes ({len(processes)})",
        ["pid", "ppid", "exit", "argv"],
        rows,
        len(processes),
        max_rows,
    )


def network_table(report: Report, *, color: bool = False, max_rows: int = MAX_ROWS) -> str:
    """Network attempts, allowed and blocked, in report order."""
    attempts = report.network
    if not attempts:
        return ""
    rows = []
    for n in attempts[:max_rows]:
        action = _clean(n.action)
        if color and n.action == "blocked":
            action = f"{_RED}{action}{_RESET}"
        proto = _clean(n.protocol or n.family)
        rows.append([action, proto, _cell(_destination(n.host, n.address, n.port)), str(n.pid)])
    return _section(
        f"Network ({len(attempts)})",
        ["action", "proto", "destination", "pid"],
        rows,
        len(attempts),
        max_rows,
    )


def files_table(report: Report, *, max_rows: int = MAX_ROWS) -> str:
    """Files the command wrote (and pipguard hashed afterwards)."""
    files = report.files_written
    if not files:
        return ""
    kept = any(f.discarded for f in files)
    rows = [[_cell(f.path), str(f.size), _clean(f.sha256[:12])] + ([DISCARDED if f.discarded else "yes"]
                                                                     if kept else [])
            for f in files[:max_rows]]
    return _section(
        f"Files written ({len(files)})",
        ["path", "size", "sha256"] + (["kept"] if kept else []),
        rows,
        len(files),
        max_rows,
    )


def env_section(names: Sequence[str], *, max_names: int = MAX_ROWS, width: int = 100) -> str:
    """Names (never values) of the environment variables scrubbed before exec."""
    if not names:
        return ""
    shown = ", ".join(_clean(n) for n in names[:max_names])
    if len(names) > max_names:
        shown += f", {ELLIPSIS} and {len(names) - max_names} more (see --report)"
    body = textwrap.fill(
        shown,
        width=width,
        initial_indent="  ",
        subsequent_indent="  ",
        break_long_words=False,
        break_on_hyphens=False,
    )
    return f"Environment variables removed ({len(names)}):\n{body}"


# -- helpers ----------------------------------------------------------------


def _section(title: str, headers: List[str], rows: List[List[str]], total: int, max_rows: int) -> str:
    # disable_numparse: keep "0012ab…" hashes and pids as written, left-aligned.
    text = f"{title}:\n" + tabulate(rows, headers=headers, tablefmt=_TABLEFMT, disable_numparse=True)
    if total > max_rows:
        text += f"\n{ELLIPSIS} and {total - max_rows} more (see --report)"
    return text


def _process_names(processes: Iterable[ProcessRecord]) -> Dict[int, str]:
    names: Dict[int, str] = {}
    for p in processes:
        # First record wins: a reused pid keeps the name it had first.
        if p.pid not in names and p.argv:
            names[p.pid] = posixpath.basename(p.argv[0]) or p.argv[0]
    return names


def _process_cell(pid: int, names: Mapping[int, str]) -> str:
    name = names.get(pid)
    return f"{pid} ({_cell(name, 30)})" if name else str(pid)


def _exit_cell(p: ProcessRecord) -> str:
    if p.exit_code is None:
        text = "?"
    elif p.exit_code < 0:
        text = _signal_name(-p.exit_code)
    else:
        text = str(p.exit_code)
    if p.killed_by_pipguard:
        text += ", killed by pipguard"
    return text


def _join_argv(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def _destination(host: Optional[str], address: str, port: Optional[int]) -> str:
    addr = f"[{address}]" if ":" in address and port is not None else address
    dest = f"{host}/{addr}" if host and host != address else addr
    return dest if port is None else f"{dest}:{port}"


def _cell(value: object, limit: int = MAX_CELL) -> str:
    return _shorten(_clean(str(value)), limit)


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + ELLIPSIS
