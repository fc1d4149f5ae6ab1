"""Who belongs to a sandboxed run, and how it ends: every process of the
run is found (the keeper's tree, or the run's cgroup), what is still alive
when the first process ended is recorded and killed, and a limit that ended
the run (CPU, memory, processes, disk) becomes an event.

The supervisor's loop (pipguard/sandbox/supervisor.py) calls it; the handlers ask it
who is inside (signals, the process limit). It reads the plan and its
settings, never the user's request.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Callable, Set

from pipguard.sandbox import notify
from pipguard.sandbox.keeper import process_tree
from pipguard.sandbox.evidence import Collector
from pipguard.sandbox.launcher import Started
from pipguard.sandbox.plan import Plan
from pipguard.report.model import BLOCKED, ProcessRecord


class Lifetime:
    """The processes of one run, from its first one to the last one killed."""

    def __init__(self, plan: Plan, started: Started, collector: Collector, cgroup=None) -> None:
        self.settings = plan.settings
        self.process = started.process
        #: the first process, whose end is the run's end (ns: it waits for the command's status)
        self.root_pid = started.process.pid
        #: the command's process: the first record of the run (ns: not the first process)
        self.command_pid = started.command_pid
        self.collector = collector
        self.evidence = collector.evidence
        #: the run's cgroup (pipguard.sandbox.limits.RunCgroup) or None
        self.cgroup = cgroup
        entered = started.entered
        #: pipguard's own processes inside the sandbox (ns: its pid 1): not the command's
        self._helpers = set(entered.helpers) if entered is not None else set()
        #: the run has a pid namespace of its own: its pids are not ours to compare
        self.own_pid_namespace = entered is not None and entered.pid_namespace
        self._root_ended = 0.0
        self.evidence.processes[self.command_pid] = ProcessRecord(
            self.command_pid, started.command_ppid, tuple(plan.argv))
        self.evidence.process_order.append(self.command_pid)

    def descendants(self) -> Set[int]:
        """Every live process of the sandbox: the tree under its keeper, the
        subreaper every orphan of the sandbox comes back to (a setsid daemon
        too), or the run's cgroup where there is one (cheaper to read)."""
        if self.cgroup is not None:
            members = self.cgroup.members()
            if members is not None:
                return members - self._helpers
        if not os.path.isdir("/proc"):  # no procfs (not Linux): the first process is all we can track
            return {self.root_pid} if self.process.poll() is None else set()
        return process_tree(self.process.keeper_pid) - self._helpers

    def note_before_kill(self, pid: int) -> None:
        """Record a process we never saw exec (a fork of a shell, a daemon
        killed before its exec) from /proc, so the report names what was
        killed instead of a bare pid."""
        if pid in self.evidence.processes or len(self.evidence.processes) > self.settings.max_events:
            return
        ppid, _comm = notify.proc_stat(pid)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = tuple(os.fsdecode(a) for a in fh.read().split(b"\0")[:-1])
        except OSError:
            argv = ()
        self.evidence.processes[pid] = ProcessRecord(pid, ppid, argv[:64])
        self.evidence.process_order.append(pid)

    def cpu_exceeded(self) -> bool:
        """The run's cgroup used more CPU time than the limit (then it is the
        limit that ends the run)."""
        if self.cgroup is None or not self.cgroup.cpu_exceeded():
            return False
        self.evidence.limit_hit = "cpu"
        return True

    def _lingering(self, alive: Set[int]) -> None:
        """Processes still alive when the first one ended by itself: a build
        has no business leaving anything behind (a daemon that waits to act
        later). Recorded as findings, then killed with the rest."""
        when = time.time()
        for pid in sorted(alive):
            self.note_before_kill(pid)
            record = self.evidence.processes.get(pid)
            argv = list(record.argv) if record else []
            self.collector.add_event("process", BLOCKED, "supervisor", pid,
                                     " ".join(argv)[:200] or f"pid {pid}", "lingering-process",
                                     {"argv": argv[:64], "ppid": record.ppid if record else 0,
                                      "when": when, "after_exit": round(when - self._root_ended, 3)},
                                     when=when, always=len(alive) <= 64)

    def kill_all(self, meanwhile: Callable[[], None]) -> None:
        """Kill every process of the run. The first process is gone (or time
        is up, or a limit was hit, or we were interrupted): nothing of the
        sandbox may outlive it. ``meanwhile`` runs between rounds and keeps
        answering notifications, so no process hangs in a notified syscall."""
        process = self.process
        self._root_ended = time.time()
        ended_itself = not (self.evidence.timed_out or self.evidence.interrupted
                            or self.evidence.limit_hit)
        for attempt in range(200):
            alive = self.descendants() - {self.root_pid} if ended_itself else self.descendants()
            if not alive:
                break
            if attempt == 0 and ended_itself:
                self._lingering(alive)
            for pid in alive:
                self.note_before_kill(pid)
            if self.cgroup is not None and self.cgroup.kill():
                pass  # one write kills every member at once: no pid can be reused under us
            else:
                # Freeze first, then kill: a parent must not get to run (and
                # act on a child's death) between two SIGKILLs.
                for pid in alive:
                    try:
                        os.kill(pid, signal.SIGSTOP)
                    except ProcessLookupError:
                        pass
                for pid in alive:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        continue
            if not ended_itself:
                process.kill()
            for pid in alive:
                if pid != self.root_pid and pid not in self.evidence.killed:
                    self.evidence.killed.append(pid)
            meanwhile()

    def limit_events(self) -> None:
        """What hit a limit, from the cgroup's counters and how processes died."""
        from pipguard.sandbox.limits import RLIMIT_SIGNALS

        detail_of = {"memory": self.settings.memory, "processes": self.settings.processes,
                     "cpu": self.settings.cpu, "write": self.settings.write}
        rules = {"memory": "limit-memory", "processes": "limit-processes", "cpu": "limit-cpu",
                 "write": "limit-disk"}

        def hit(name: str, pid: int, how: str) -> None:
            self.evidence.limit_hit = self.evidence.limit_hit or name
            self.collector.add_event("process", BLOCKED, "supervisor", pid, name, rules[name],
                                     {"limit": detail_of[name], "how": how}, always=True)

        if self.evidence.limit_hit == "cpu":
            hit("cpu", self.command_pid, "cgroup cpu.stat passed the limit; the run was killed")
        if self.cgroup is not None:
            if self.cgroup.memory_events():
                hit("memory", self.command_pid, "the kernel's OOM killer ended a process of the run")
            if self.cgroup.pids_events():
                hit("processes", self.command_pid, "forks failed: the run had pids.max tasks")
        for pid, status in sorted(self.process.reaped.items()):
            if os.WIFSIGNALED(status) and os.WTERMSIG(status) in RLIMIT_SIGNALS:
                name = RLIMIT_SIGNALS[os.WTERMSIG(status)]
                hit(name, pid, f"killed by {signal.Signals(os.WTERMSIG(status)).name}")
