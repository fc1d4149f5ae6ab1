"""The evidence of one run: frozen report models, JSON form, atomic writing.

Schema ``pipguard.report/1`` is a contract (DESIGN.md "Report contract",
documented field by field in ``docs/report.md``). Add fields freely; never
rename or drop one without bumping the schema.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from pipguard import rules
from pipguard.errors import ReportWriteError

SCHEMA = "pipguard.report/1"

#: Event kinds (DESIGN.md).
KINDS = ("file-read", "file-write", "network", "process", "signal", "syscall", "env")
BLOCKED = "blocked"
ALLOWED = "allowed"
#: Blocked, reported, but not a finding (see pipguard.rules.INFO_RULES).
INFORMATIONAL_RULES = rules.INFO_RULES


@dataclass(frozen=True)
class Event:
    """One thing a layer saw. ``layer`` is the first layer that reported it;
    ``detail["seen_by"]`` lists every layer when several saw the same attempt."""

    seq: int
    time: float
    kind: str
    action: str
    layer: str
    pid: int
    target: str
    rule: str
    detail: Dict[str, Any] = field(default_factory=dict)
    #: ``finding`` (counts toward the verdict) or ``info``; decided by the rule
    #: table from action and rule (pipguard.rules.severity), never given
    severity: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "severity", rules.severity(self.action, self.rule))

    @property
    def blocked(self) -> bool:
        return self.action == BLOCKED

    @property
    def finding(self) -> bool:
        return self.severity == rules.FINDING


@dataclass(frozen=True)
class ProcessRecord:
    """One process of the sandbox: its command line and how it ended."""

    pid: int
    ppid: int
    argv: Tuple[str, ...]
    exit_code: Optional[int] = None  # negative: killed by that signal; None: unknown
    killed_by_pipguard: bool = False


@dataclass(frozen=True)
class NetworkAttempt:
    """One network destination the sandbox tried to reach, and what became of it."""

    family: str  # inet, inet6, unix, netlink, packet, ...
    protocol: str  # tcp, udp, dns, raw, ...
    address: str
    port: Optional[int]
    host: Optional[str]
    action: str
    pid: int
    layer: str = ""


@dataclass(frozen=True)
class FileWritten:
    """A file the command created or changed, hashed after it ended.
    ``discarded``: it was in the namespace backend's own ``/tmp`` or
    ``/dev/shm`` (``path`` as the sandbox saw it), gone with the namespace:
    evidence of what the run staged, never on the host."""

    path: str
    sha256: str
    size: int
    discarded: bool = False


@dataclass(frozen=True)
class LayerStatus:
    """What was asked, what the kernel applied, and what was missing (and why)."""

    requested: str
    applied: Tuple[str, ...] = ()
    unavailable: Dict[str, str] = field(default_factory=dict)
    #: per protection of the run's level (pipguard.protections): {"state":
    #: active|degraded|unavailable, "reason"}: the plan's states, corrected by
    #: what the kernel applied
    protections: Dict[str, Dict[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Report:
    """The evidence of one run (schema ``pipguard.report/1``, see docs/report.md)."""

    command: Tuple[str, ...]
    exit_code: Optional[int]
    timed_out: bool
    isolation: LayerStatus
    events: Tuple[Event, ...] = ()
    processes: Tuple[ProcessRecord, ...] = ()
    network: Tuple[NetworkAttempt, ...] = ()
    files_written: Tuple[FileWritten, ...] = ()
    env_removed: Tuple[str, ...] = ()
    events_dropped: int = 0
    policy: Dict[str, Any] = field(default_factory=dict)
    host: Dict[str, Any] = field(default_factory=dict)
    cwd: str = ""
    started_at: float = 0.0
    duration: float = 0.0
    error: Optional[str] = None
    tool_version: str = ""
    schema: str = SCHEMA
    # how the supervisor answered seccomp notifications: responder ("native"
    # thread or "python"), sync_wake_up, answered_natively, answered_by_python;
    # empty when no supervisor ran
    supervision: Dict[str, Any] = field(default_factory=dict)
    #: limit name (memory, processes, cpu, write) -> {"value", "by", "scope",
    #: "used"}: what was applied and by which mechanism, and what the run used
    #: of it ({"value", "how", "scope"}, value None when not measured; see
    #: pipguard.sandbox.limits.measure); mechanisms that could not be used are in
    #: isolation.unavailable ("cgroup2"...)
    limits: Dict[str, Any] = field(default_factory=dict)
    #: the limit that ended the run or one of its processes, or None
    limit_hit: Optional[str] = None
    #: under ``--isolation vm``: how the guest ran (accel, machine, kernel,
    #: shares, qemu_exit, guest_report, console_tail); empty otherwise
    vm: Dict[str, Any] = field(default_factory=dict)

    @property
    def blocked_events(self) -> Tuple[Event, ...]:
        """Blocked attempts that count as findings (``severity == "finding"``)."""
        return tuple(e for e in self.events if e.finding)

    @property
    def info_events(self) -> Tuple[Event, ...]:
        """Events worth a look that do not count: informational refusals and
        configuration lookups (``severity == "info"`` under an informational rule)."""
        return tuple(e for e in self.events if not e.finding and e.rule in rules.INFO_RULES)

    @property
    def verdict(self) -> str:
        """``error`` if the command never ran, ``blocked`` if anything was
        blocked, else ``clean`` — observed clean in this run, not proven safe."""
        if self.error is not None or self.exit_code is None:
            return "error"
        if self.blocked_events:
            return "blocked"
        return "clean"

    def to_json(self) -> Dict[str, Any]:
        data = _plain(self)
        data["verdict"] = self.verdict
        return data


def combined(parts: Sequence[Tuple["Report", Dict[str, str]]], *, command: Tuple[str, ...], exit_code: int,
             isolation: str, cwd: str, error: Optional[str], dedupe_network: bool = False) -> "Report":
    """One run-style report over several sandboxed runs (an install's hook
    calls, a PKGBUILD's phases), for what takes a :class:`Report` (SARIF, the
    top level of the JSON): events renumbered in order, each run's ``tags``
    added to its events' detail; processes, files and layers of all runs;
    host, policy and start of the first. ``dedupe_network``: a destination,
    action and process that another layer already listed is listed once.
    ``limits``: each limit with the largest ``used`` of any run, tagged with
    that run's tags (which hook call or phase came closest to it)."""
    events: List[Event] = []
    processes: List[ProcessRecord] = []
    network: List[NetworkAttempt] = []
    written: List[FileWritten] = []
    applied: List[str] = []
    unavailable: Dict[str, str] = {}
    dropped, timed_out = 0, False
    limits: Dict[str, Any] = {}  # each limit as the run that used the most of it saw it
    limit_hit: Optional[str] = None
    for run, tags in parts:
        for name, limit in run.limits.items():
            used = (limit.get("used") or {}).get("value") if isinstance(limit, dict) else None
            known = (limits.get(name) or {}).get("used") or {}
            if name not in limits or (used is not None and used > (known.get("value") or -1)):
                limits[name] = dict(limit, used=dict(limit["used"], **tags)) if used is not None else dict(limit)
        limit_hit = limit_hit or run.limit_hit
        for e in run.events:
            events.append(dataclasses.replace(e, seq=len(events) + 1, detail=dict(e.detail, **tags)))
        processes += run.processes
        network += [n for n in run.network if not (dedupe_network and _seen_already(n, network))]
        written += run.files_written
        applied += [a for a in run.isolation.applied if a not in applied]
        unavailable.update(run.isolation.unavailable)
        dropped += run.events_dropped
        timed_out = timed_out or run.timed_out
    first = parts[0][0] if parts else None
    return Report(
        command=command, exit_code=exit_code, timed_out=timed_out,
        isolation=LayerStatus(isolation, tuple(applied), unavailable),
        events=tuple(events), processes=tuple(processes), network=tuple(network),
        files_written=tuple(written), env_removed=first.env_removed if first else (),
        events_dropped=dropped, policy=first.policy if first else {},
        host=first.host if first else {}, cwd=cwd,
        started_at=first.started_at if first else 0.0,
        duration=round(sum(run.duration for run, _ in parts), 4),
        error=error, tool_version=first.tool_version if first else "", limits=limits, limit_hit=limit_hit,
    )


def _seen_already(attempt: NetworkAttempt, listed: Sequence[NetworkAttempt]) -> bool:
    """The same destination, action and process seen by another layer (the
    audit hook and the supervisor both see a Python connect)."""
    return any(dataclasses.replace(attempt, layer=n.layer) == n for n in listed)


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    return obj


def dumps(data: Dict[str, Any]) -> str:
    return json.dumps(unicode_data(data), indent=2, sort_keys=False, default=str) + "\n"


def unicode_data(value: Any) -> Any:
    """``value`` with every string made of Unicode characters only: a path or argument
    that is not UTF-8 reaches Python as lone surrogates (``surrogateescape``), which a
    strict JSON reader refuses (and ``\\udcff`` names no character); each such byte is
    written as its ``\\xff`` escape instead, visibly. Lists and dicts are walked; an
    all-Unicode value is returned as it is."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return _escaped_bytes(value)
    if isinstance(value, dict):
        return {unicode_data(k): unicode_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [unicode_data(v) for v in value]
    return value


def _escaped_bytes(text: str) -> str:
    try:  # the bytes the text came from: the undecodable ones escaped as \xNN
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate no byte decodes to: its code point, escaped
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def check_writable(path: str) -> str:
    """Fail early (before running anything) if ``path`` cannot be written."""
    full = os.path.abspath(os.path.expanduser(path))
    parent = os.path.dirname(full) or "."
    if os.path.isdir(full):
        raise ReportWriteError(f"--report {path}: is a directory", hint="name a file")
    if not os.path.isdir(parent):
        raise ReportWriteError(f"--report {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ReportWriteError(f"--report {path}: directory {parent} is not writable")
    return full


def write_atomic(path: str, text: str) -> None:
    """Write via a temp file in the same directory and ``os.replace``: a
    reader never sees half a report."""
    full = os.path.abspath(path)
    fd, tmp = tempfile.mkstemp(prefix=".pipguard-report-", dir=os.path.dirname(full))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, full)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise ReportWriteError(f"cannot write report {path}: {exc.strerror}") from exc


def from_json(data: Dict[str, Any]) -> Report:
    """The :class:`Report` that ``to_json`` gave ``data`` (unknown keys are
    ignored, as consumers of the schema must; ``verdict`` is recomputed)."""
    isolation = data.get("isolation") or {}
    return Report(
        command=tuple(data.get("command") or ()), exit_code=data.get("exit_code"),
        timed_out=bool(data.get("timed_out")),
        isolation=LayerStatus(isolation.get("requested", ""), tuple(isolation.get("applied") or ()),
                              dict(isolation.get("unavailable") or {}),
                              {str(k): dict(v) for k, v in (isolation.get("protections") or {}).items()}),
        events=tuple(Event(**_known(Event, e)) for e in data.get("events") or ()),
        processes=tuple(ProcessRecord(**dict(_known(ProcessRecord, p), argv=tuple(p.get("argv") or ())))
                        for p in data.get("processes") or ()),
        network=tuple(NetworkAttempt(**_known(NetworkAttempt, n)) for n in data.get("network") or ()),
        files_written=tuple(FileWritten(**_known(FileWritten, f)) for f in data.get("files_written") or ()),
        env_removed=tuple(data.get("env_removed") or ()), events_dropped=int(data.get("events_dropped") or 0),
        policy=dict(data.get("policy") or {}), host=dict(data.get("host") or {}), cwd=data.get("cwd", ""),
        started_at=float(data.get("started_at") or 0.0), duration=float(data.get("duration") or 0.0),
        error=data.get("error"), tool_version=data.get("tool_version", ""),
        supervision=dict(data.get("supervision") or {}), vm=dict(data.get("vm") or {}),
        limits=dict(data.get("limits") or {}), limit_hit=data.get("limit_hit"),
    )


def _known(cls, values: Dict[str, Any]) -> Dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in values.items() if k in names}
