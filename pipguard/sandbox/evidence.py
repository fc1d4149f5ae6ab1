"""What a run collected: events, processes, network attempts, and how it ended.

One :class:`Collector` per run takes events from every source that sees the
sandbox -- the supervisor (seccomp notifications, the audit FIFO, lifetime),
the index proxy (each request) and the ns backend's decoy watch -- and keeps
the rules that make evidence trustworthy in one place: identical events merge
(with every layer that saw them), and a flood cannot push a finding out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from pipguard import rules
from pipguard.report.model import Event, NetworkAttempt, ProcessRecord


@dataclass
class Evidence:
    """What the supervisor collected (mutable while the run lasts)."""

    events: List[Event] = field(default_factory=list)
    processes: Dict[int, ProcessRecord] = field(default_factory=dict)
    process_order: List[int] = field(default_factory=list)
    network: List[NetworkAttempt] = field(default_factory=list)
    dropped: int = 0
    exit_code: Optional[int] = None
    timed_out: bool = False
    interrupted: Optional[str] = None
    killed: List[int] = field(default_factory=list)
    #: the limit that ended the run ("cpu", "memory"...), when one did
    limit_hit: Optional[str] = None
    # how the notifications were answered (report "supervision"); empty without a listener
    supervision: Dict[str, object] = field(default_factory=dict)


class Collector:
    """The event store of one run; ``max_events`` bounds it (findings get a
    second allowance: see :meth:`add_event`)."""

    def __init__(self, max_events: int) -> None:
        self.max_events = max_events
        self.evidence = Evidence()
        #: address -> host name, from the lookups seen in the run
        self.dns: Dict[str, str] = {}
        self._seq = 0
        self._seen: Dict[Tuple, int] = {}
        self._findings_past_cap = 0

    def add_event(self, kind: str, action: str, layer: str, pid: int, target: str, rule: str,
                  detail: Optional[dict] = None, when: Optional[float] = None,
                  always: bool = False) -> None:
        """Record an event (merged with an identical one). ``always``: past
        ``max_events`` too — for the few that say how the run ended (a limit,
        a process left behind), which a flood must not push out."""
        key = (pid, kind, target, action)
        index = self._seen.get(key)
        if index is not None:
            old = self.evidence.events[index]
            seen_by = list(old.detail.get("seen_by", [old.layer]))
            if rules.severity(action, rule) == rules.FINDING and old.severity != rules.FINDING:
                # An informational event first (perhaps forged on the FIFO by the
                # sandbox, which can write it) must not absorb a finding.
                self.evidence.events[index] = Event(
                    old.seq, old.time, old.kind, old.action, layer, old.pid, old.target, rule,
                    dict(old.detail, **(detail or {}), seen_by=seen_by + [layer] * (layer not in seen_by)))
                return
            if layer not in seen_by:
                seen_by.append(layer)
                merged = dict(old.detail, seen_by=seen_by, **{k: v for k, v in (detail or {}).items()
                                                              if k not in old.detail})
                self.evidence.events[index] = Event(old.seq, old.time, old.kind, old.action,
                                                    old.layer, old.pid, old.target, old.rule, merged)
            return
        if len(self.evidence.events) >= self.max_events and not always:
            # A refusal is never pushed out by what came before it: the sandbox can write
            # the audit FIFO, so a flood of forged harmless events would otherwise drop a
            # real finding and turn the verdict clean. Findings get a second allowance of
            # max_events (memory stays bounded); past it, enough findings are kept already.
            finding = rules.severity(action, rule) == rules.FINDING
            if not finding or self._findings_past_cap >= self.max_events:
                self.evidence.dropped += 1
                return
            self._findings_past_cap += 1
        self._seq += 1
        detail = dict(detail or {})
        detail.setdefault("seen_by", [layer])
        self.evidence.events.append(Event(self._seq, when or time.time(), kind, action, layer,
                                          pid, target, rule, detail))
        self._seen[key] = len(self.evidence.events) - 1

    def add_network(self, family: str, protocol: str, address: str, port: Optional[int],
                     host: Optional[str], action: str, pid: int, layer: str) -> None:
        if len(self.evidence.network) >= self.max_events:
            self.evidence.dropped += 1
            return
        attempt = NetworkAttempt(family, protocol, address, port, host or self.dns.get(address),
                                 action, pid, layer)
        if attempt not in self.evidence.network:
            self.evidence.network.append(attempt)
