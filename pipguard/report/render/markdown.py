"""The report as GitHub-flavoured Markdown, for CI job summaries
(``$GITHUB_STEP_SUMMARY``, merge-request notes) and for people reading a report.

Rendered from the report's JSON form (``Report.to_json()`` for ``run``,
``InstallResult.to_json()`` for ``install``/``sandbox``), not from the live
objects: the text is the same whether pipguard prints it at the end of a run
or a later CI step renders a saved ``--report FILE`` (:func:`from_json`), and
it depends only on the documented report contract (docs/report.md): keys it
does not know are ignored, optional ones it misses are skipped.

Layout, in order: the verdict line; the message; a per-package table
(install/sandbox); gate findings; blocked attempts with their evidence (kind,
target, process, layer, rule); what to do next; then the rest of the
evidence folded in a ``<details>`` block. Tables are bounded
(:data:`MAX_ROWS`); the full evidence is in the JSON report.

Everything that came from a package or the sandboxed program (names,
versions, paths, argv, hostnames, gate evidence, messages quoting them) is
untrusted. Such values are shown as code spans (no Markdown, HTML or
autolink is interpreted inside one) with a fence longer than any run of
backticks in the value, ``|`` escaped inside tables, and control and
invisible characters (newlines, ANSI, bidi overrides) escaped by
:func:`pipguard.report.render.printable` so a value cannot end a table row, start
a block, or hide text. Free text (messages) is additionally
backslash-escaped character by character.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence

from pipguard.report.render import DISCARDED, printable
from pipguard.report.model import INFORMATIONAL_RULES

if TYPE_CHECKING:  # pragma: no cover
    from pipguard.report.model import Report

#: Rows shown per table; the rest are counted, not shown.
MAX_ROWS = 50
#: Cells longer than this are shortened with an ellipsis (GitHub caps a step
#: summary at 1 MiB: 50 rows of a few bounded cells stay far below).
MAX_CELL = 120
ELLIPSIS = "…"

_ICON = {"installed": "✅", "clean": "✅", "blocked": "❌", "refused": "❌", "gate": "❌"}
_WARN = "⚠️"

#: What the hosts a build tried to reach can be allowed with, per command.
_ALLOW_HOST_FLAG = {"run": "--allow-host", "install": "--allow-build-host", "sandbox": "--allow-build-host"}


def render(report: "Report", *, color: bool = False) -> str:
    """The Markdown summary of a ``run`` report. ``color`` is accepted for a
    uniform signature and ignored: Markdown has no colour."""
    del color
    return from_json(report.to_json())


def render_result(result: Any) -> str:
    """The Markdown summary of an ``install``/``sandbox`` result (anything with
    ``to_json()`` in the install report shape)."""
    return from_json(result.to_json())


def from_json(data: Mapping[str, Any]) -> str:
    """The Markdown summary of a report in its JSON form (a parsed ``--report``
    file), ending in a newline."""
    view = _View(data)
    sections: List[str] = [view.headline()]
    for section in (view.message(), view.isolation(), view.packages_table(), view.findings_table(),
                    view.blocked_table(), view.next_steps(), view.details(), view.footer()):
        if section:
            sections.append(section)
    return "\n\n".join(sections) + "\n"


# -- escaping ---------------------------------------------------------------

_PUNCTUATION = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
_BACKTICKS = re.compile(r"`+")


def text(value: object, limit: Optional[int] = None) -> str:
    """``value`` as inert Markdown text: control characters escaped, then every
    ASCII punctuation character backslash-escaped (CommonMark allows that for
    all of them), so no emphasis, link, autolink, HTML, heading or table
    delimiter can form. Safe in a table cell."""
    raw = _shorten(printable(str(value)), limit)
    return "".join("\\" + ch if ch in _PUNCTUATION else ch for ch in raw)


def code(value: object, limit: Optional[int] = MAX_CELL, *, cell: bool = True) -> str:
    """``value`` as a code span. ``cell=True`` (a table cell) escapes ``|``:
    GFM splits table rows on it even inside code spans, and undoes the escape
    there. Outside a table, a backslash in a code span is literal, so
    ``cell=False`` keeps ``|`` as it is. An empty value is an em dash."""
    raw = _shorten(printable(str(value)), limit)
    if not raw:
        return "—"
    if cell:
        raw = raw.replace("|", "\\|")
    longest = max((len(m) for m in _BACKTICKS.findall(raw)), default=0)
    fence = "`" * (longest + 1)
    # A leading or trailing backtick would merge with the fence; CommonMark
    # strips exactly one space from each side when both are there.
    pad = " " if raw[0] in "` " or raw[-1] in "` " else ""
    return f"{fence}{pad}{raw}{pad}{fence}"


def _shorten(raw: str, limit: Optional[int]) -> str:
    if limit is None or len(raw) <= limit:
        return raw
    return raw[: limit - 1] + ELLIPSIS


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GFM table; ``headers`` are pipguard's own words, cells already escaped."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _more(total: int, shown: int) -> str:
    return f"\n\n{ELLIPSIS} and {total - shown} more (see the JSON report)" if total > shown else ""


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


# -- the report, read defensively -------------------------------------------


def _list(value: Any) -> List[Any]:
    return list(value) if isinstance(value, (list, tuple)) else []


def _dict(value: Any) -> Dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def is_finding(event: Mapping[str, Any]) -> bool:
    """A blocked event that counts toward the verdict. Newer reports say so
    per event (``severity``); older ones by the informational rule list."""
    if event.get("action") != "blocked":
        return False
    severity = event.get("severity")
    if severity is not None:
        return severity == "finding"
    return event.get("rule") not in INFORMATIONAL_RULES


class _View:
    """The sections of one report's summary."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self.data = data
        self.packages = [_dict(p) for p in _list(data.get("packages"))]
        self.is_install = "packages" in data or "status" in data
        self.events = [_dict(e) for e in _list(data.get("events"))]
        self.blocked = sorted((e for e in self.events if is_finding(e)), key=lambda e: e.get("seq") or 0)
        self.processes = [_dict(p) for p in _list(data.get("processes"))]
        self.findings = [_dict(f) for p in self.packages for f in _list(p.get("findings"))] or [
            _dict(f) for f in _list(data.get("findings"))]
        command = [str(a) for a in _list(data.get("command"))]
        self.subcommand = command[1] if len(command) > 1 and command[0] == "pipguard" else "run"

    # -- headline and message

    def status(self) -> str:
        status = self.data.get("status")
        return str(status) if status else str(self.data.get("verdict") or "error")

    def headline(self) -> str:
        status = self.status()
        icon = _ICON.get(status, _WARN)
        what = {"installed": "installed", "clean": "observed clean", "refused": "REFUSED",
                "blocked": "BLOCKED", "error": "ERROR", "interrupted": "INTERRUPTED"}.get(status, text(status).upper())
        parts = []
        if self.blocked:
            parts.append(_plural(len(self.blocked), "blocked attempt"))
        refusing = [f for f in self.findings if f.get("severity") in ("critical", "high")]
        if refusing:
            parts.append(_plural(len(refusing), "gate finding"))
        if self.is_install and self.packages:
            parts.append(_plural(len(self.packages), "package"))
        if not self.is_install:
            parts.append(self._ending())
        if status in ("refused", "error", "interrupted") and self.is_install:
            parts.append("nothing was installed" if status != "error" else "environment unchanged")
        tail = f" — {', '.join(parts)}" if parts else ""
        return f"### {icon} pipguard {text(self.subcommand)}: {what}{tail}"

    def _ending(self) -> str:
        code_ = self.data.get("exit_code")
        if code_ is None:
            return "never started"
        if self.data.get("timed_out"):
            return "timed out"
        if isinstance(code_, int) and code_ < 0:
            return f"killed by signal {-code_}"
        return f"exit {text(code_)}"

    def message(self) -> str:
        message = self.data.get("message") or self.data.get("error")
        return f"> {text(message, 1000)}" if message else ""

    def isolation(self) -> str:
        iso = _dict(self.data.get("isolation"))
        applied = ", ".join(code(a, cell=False) for a in _list(iso.get("applied"))) or "none"
        line = f"**Isolation:** {applied} (requested {code(iso.get('requested') or '?', cell=False)})"
        unavailable = _dict(iso.get("unavailable"))
        if unavailable:
            missing = "; ".join(f"{code(k, cell=False)}: {text(v, 200)}" for k, v in sorted(unavailable.items()))
            line += f"  \n**Unavailable:** {missing}"
        return line

    # -- tables

    def packages_table(self) -> str:
        if not self.packages:
            return ""
        rows = []
        for p in self.packages[:MAX_ROWS]:
            verdict = str(p.get("verdict") or "?")
            blocked = sum(1 for e in _list(p.get("events")) if is_finding(_dict(e)))
            rows.append([
                code(p.get("name", "?"), 60), code(p.get("version", "?"), 40),
                "sdist" if p.get("from_sdist") else "wheel",
                f"{_ICON.get(verdict, _WARN)} {text(verdict)}",
                str(len(_list(p.get("findings")))), str(blocked),
                # the artifact pip got (an sdist it built, or a wheel): an approval is pinned to
                # it; a package refused in its build has no wheel of its own
                code(str(_dict(p.get("origin")).get("sha256") or p.get("sha256") or "")[:12], 12),
            ])
        return (f"#### Packages ({len(self.packages)})\n\n"
                + _table(["package", "version", "from", "verdict", "gate findings", "blocked", "sha256"], rows)
                + _more(len(self.packages), MAX_ROWS))

    def findings_table(self) -> str:
        if not self.findings:
            return ""
        rows = []
        for f in self.findings[:MAX_ROWS]:
            member = str(f.get("member") or "")
            if f.get("line"):
                member += f":{f['line']}"
            rows.append([code(f.get("package", "?"), 60), text(f.get("severity", "?")), code(f.get("rule", "?"), 40),
                         code(member), text(f.get("message", ""), MAX_CELL), code(f.get("evidence", ""))])
        return (f"#### Gate findings ({len(self.findings)})\n\n"
                + _table(["package", "severity", "rule", "member", "message", "evidence"], rows)
                + _more(len(self.findings), MAX_ROWS))

    def blocked_table(self) -> str:
        if not self.blocked:
            return ""
        names = self._process_names()
        with_python = any(_dict(e.get("detail")).get("python") for e in self.blocked)
        with_where = any(_dict(e.get("detail")).get("phase") for e in self.blocked)
        headers = ["kind", "target", "process", "layer", "rule"]
        headers += ["python"] if with_python else []
        headers += ["phase"] if with_where else []
        rows = []
        for e in self.blocked[:MAX_ROWS]:
            detail = _dict(e.get("detail"))
            seen_by = detail.get("seen_by")
            layer = ",".join(map(str, seen_by)) if isinstance(seen_by, list) and seen_by else e.get("layer", "")
            pid = e.get("pid")
            name = names.get(pid) if isinstance(pid, int) else None
            row = [text(e.get("kind", "?")), code(e.get("target", "")),
                   f"{text(pid)} ({code(name, 40)})" if name else text(pid),
                   code(layer, 40), code(e.get("rule", ""), 40)]
            if with_python:
                row.append(code(detail.get("python") or ""))
            if with_where:
                where = str(detail.get("phase") or "")
                if detail.get("package"):
                    where += f" of {detail['package']}"
                row.append(code(where, 80))
            rows.append(row)
        return (f"#### Blocked attempts ({len(self.blocked)})\n\n" + _table(headers, rows)
                + _more(len(self.blocked), MAX_ROWS))

    def _process_names(self) -> Dict[int, str]:
        names: Dict[int, str] = {}
        for p in self.processes:
            argv = [str(a) for a in _list(p.get("argv"))]
            pid = p.get("pid")
            if isinstance(pid, int) and pid not in names and argv:
                names[pid] = posixpath.basename(argv[0]) or argv[0]
        return names

    # -- what next

    def next_steps(self) -> str:
        status = self.status()
        steps: List[str] = []
        if self.blocked:
            blamed = sorted({str(_dict(e.get("detail")).get("package")) for e in self.blocked
                             if _dict(e.get("detail")).get("package")}
                            | {str(p.get("name")) for p in self.packages if p.get("verdict") == "blocked"})
            who = ", ".join(code(b, 60, cell=False) for b in blamed) if blamed else "the code that ran"
            steps.append(f"**Review** the blocked attempts above: treat {who} as suspicious until you know "
                         "why it did this. No flag overrides a blocked attempt to read credentials or to "
                         "write outside the build.")
            hosts = self._blocked_hosts()
            if hosts:
                flag = _ALLOW_HOST_FLAG.get(self.subcommand, "--allow-host")
                shown = " ".join(code(f"{flag} {h}", 200, cell=False) for h in hosts[:10])
                steps.append(f"**Allow a host** only if the build legitimately needs it (a Rust or Go sdist "
                             f"fetching its dependencies): {shown}. Every destination is still recorded.")
        refusing = [f for f in self.findings if f.get("severity") in ("critical", "high")]
        approvable = sorted({str(r.get("package")) for r in map(_dict, _list(self.data.get("refusals")))
                             if r.get("kind") in ("attempt", "gate") and _dict(r.get("origin")).get("sha256")})
        if approvable:
            who = ", ".join(code(a, 60, cell=False) for a in approvable)
            steps.append(f"**Approve** what {who} did only after reading it (the member a gate finding names, "
                         "the target of a blocked attempt): with this run's JSON report, "
                         "`pipguard approve --from-report REPORT.json --write`, then review and commit the "
                         "policy file it writes (`pipguard.toml`; the action's `policy` input). An approval is "
                         "pinned to the artifact's sha256 (see the packages table): a changed file needs a new "
                         "review.")
        elif refusing:
            steps.append("**Approve** a gate finding only after reading the member it names: an approval is "
                         "pinned to the artifact's sha256 (see the packages table), so a changed file needs "
                         "a new review.")
        if self.blocked or refusing:
            steps.append("**Drop** the package, or pin a version you have reviewed, and run again.")
        if status == "error":
            steps.append("pipguard could not finish: read the message above and pip's output in the job log. "
                         "The target environment was not changed.")
            if _dict(_dict(self.data.get("isolation")).get("unavailable")):
                steps.append("A layer is unavailable on this runner: run `pipguard doctor` there to see which "
                             "and why.")
        if status == "interrupted":
            steps.append("The run was stopped (SIGINT/SIGTERM) before it finished: run it again.")
        if not steps:
            return ""
        return "#### What to do next\n\n" + "\n".join(f"- {s}" for s in steps)

    def _blocked_hosts(self) -> List[str]:
        """Destinations of the blocked network attempts that count (``host:port``
        as the events name them), first seen first."""
        hosts: List[str] = []
        for e in self.blocked:
            target = str(e.get("target") or "")
            if e.get("kind") == "network" and target and target not in hosts:
                hosts.append(target)
        return hosts

    # -- the rest, folded

    def details(self) -> str:
        parts = []
        if self.processes:
            rows = [[text(p.get("pid", "?")), text(p.get("ppid", "?")), text(_exit(p.get("exit_code"))),
                     code(" ".join(shlex.quote(str(a)) for a in _list(p.get("argv"))))]
                    for p in self.processes[:MAX_ROWS]]
            parts.append(f"**Processes ({len(self.processes)})**\n\n"
                         + _table(["pid", "ppid", "exit", "argv"], rows) + _more(len(self.processes), MAX_ROWS))
        network = [_dict(n) for n in _list(self.data.get("network"))]
        if network:
            rows = [[text(n.get("action", "?")), code(n.get("protocol") or n.get("family") or "?", 20),
                     code(_destination(n)), text(n.get("pid", "?"))] for n in network[:MAX_ROWS]]
            parts.append(f"**Network ({len(network)})**\n\n"
                         + _table(["action", "proto", "destination", "pid"], rows) + _more(len(network), MAX_ROWS))
        files = [_dict(f) for f in _list(self.data.get("files_written"))]
        if files:
            kept = any(f.get("discarded") for f in files)
            rows = [[code(f.get("path", "?")), text(f.get("size", "?")), code(str(f.get("sha256") or "")[:12], 12)]
                    + ([text(DISCARDED if f.get("discarded") else "yes")] if kept else [])
                    for f in files[:MAX_ROWS]]
            parts.append(f"**Files written ({len(files)})**\n\n"
                         + _table(["path", "size", "sha256"] + (["kept"] if kept else []), rows)
                         + _more(len(files), MAX_ROWS))
        env = [str(n) for n in _list(self.data.get("env_removed"))]
        if env:
            shown = ", ".join(code(n, 60, cell=False) for n in env[:MAX_ROWS])
            if len(env) > MAX_ROWS:
                shown += f", {ELLIPSIS} and {len(env) - MAX_ROWS} more"
            parts.append(f"**Environment variables removed ({len(env)}):** {shown}")
        dropped = self.data.get("events_dropped")
        if isinstance(dropped, int) and dropped > 0:
            parts.append(f"{_WARN} {_plural(dropped, 'further event')} dropped (not recorded in this report).")
        if not parts:
            return ""
        summary = ", ".join(p for p in (
            f"{len(self.processes)} process{'' if len(self.processes) == 1 else 'es'}" if self.processes else "",
            f"{len(network)} network" if network else "", f"{len(files)} files written" if files else "",
        ) if p) or "environment"
        # Blank lines around the Markdown inside <details>: GitHub renders it only then.
        return f"<details><summary>Evidence: {summary}</summary>\n\n" + "\n\n".join(parts) + "\n\n</details>"

    def footer(self) -> str:
        version = self.data.get("tool_version")
        schema = self.data.get("schema")
        bits = ["Observed clean in this run is evidence, not proof." if self.status() in ("clean", "installed")
                else "The full evidence is in the JSON report (`--report FILE`)."]
        if version:
            bits.append(f"pipguard {text(version, 40)}")
        if schema:
            bits.append(f"schema {text(schema, 40)}")
        return "<sub>" + " · ".join(bits) + "</sub>"


def _exit(value: Any) -> str:
    if value is None:
        return "?"
    if isinstance(value, int) and value < 0:
        return f"signal {-value}"
    return str(value)


def _destination(n: Mapping[str, Any]) -> str:
    address = str(n.get("address") or "")
    host = n.get("host")
    port = n.get("port")
    addr = f"[{address}]" if ":" in address and port is not None else address
    dest = f"{host}/{addr}" if host and host != address else addr
    return dest if port is None else f"{dest}:{port}"

