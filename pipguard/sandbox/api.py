"""The public sandbox API.

``run(argv, policy)`` runs a command under the sandbox and returns the full
:class:`~pipguard.report.model.Report`; ``run_sandboxed(argv, ...)`` is the seed
design's call and returns the shell-style exit status.

Data flows one way: policy -> plan -> launcher -> supervisor -> report.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Callable, List, Mapping, Optional, Sequence

import pipguard
from pipguard import exitcodes, protections
from pipguard.sandbox import filemodes, files, limits, sandbox_user, uidlease
from pipguard.errors import PipguardError
from pipguard.sandbox.host import summary as host_summary
from pipguard.sandbox.plan import Plan, make_plan, precompile_hook
from pipguard.sandbox.rundir import cleanup, defer_kernel_wait, on_idle

HOOK_CONFIG = "PIPGUARD_HOOK"
from pipguard.sandbox.policy import Policy
from pipguard.report.model import Event, FileWritten, LayerStatus, ProcessRecord, Report

__all__ = ["Policy", "Report", "run", "run_async", "run_sandboxed"]


def _os_layer_possible() -> "tuple[bool, str]":
    if sys.platform != "linux":
        return False, f"the OS layer needs Linux (this is {sys.platform})"
    import importlib.util

    for name in ("landlock", "pyseccomp"):  # found, not imported: the child imports them
        if importlib.util.find_spec(name) is None:
            return False, f"missing Python package: {name}"
    return True, ""


def run(argv: Sequence[str], policy: Optional[Policy] = None, *, cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None, record_build_dir: bool = False,
        progress: Optional[Callable[[str], None]] = None,
        meanwhile: Optional[Callable[[], None]] = None) -> Report:
    """Run ``argv`` in the sandbox described by ``policy`` (default: the safe
    defaults of :class:`Policy`) and return the evidence report.

    ``env`` is the environment to start from (default: ``os.environ``); it is
    scrubbed to the allow-list either way. ``record_build_dir`` also hashes
    files written in the working directory (off: only other writable roots).
    ``meanwhile`` is called once while the sandbox's first process confines
    itself, before the command starts (pipguard only waits then): the place
    for work the caller needs afterwards, such as imports.
    Raises :class:`~pipguard.errors.PipguardError` for bad input or a missing
    required layer — before anything ran.

    Safe from any thread, any number at once; it waits for, reaps and signals
    only the processes of this run (their keeper is its own child) and leaves
    the caller's process attributes as they were. Ctrl-C (KeyboardInterrupt
    in the thread running it, i.e. the main thread): the sandbox is killed and
    the report returned with ``error`` "interrupted..." (not re-raised, so
    the evidence survives; :func:`run_sandboxed` re-raises).
    """
    policy = policy or Policy()
    # grants of runs whose pipguard was killed: undone before anything, whichever backend
    # this run takes (once per process; root only)
    uidlease.replay_stale()
    if policy.isolation == "vm":  # a backend of its own until the launcher carries backends
        from pipguard.sandbox.vm import runner as vm

        return vm.run(argv, policy, cwd=cwd, env=env, record_build_dir=record_build_dir, progress=progress)
    notify = progress or (lambda message: None)
    argv = [os.fspath(a) for a in argv]
    possible, reason = _os_layer_possible()
    proxy = None
    if policy.allow_hosts:
        from pipguard.sandbox.proxy import Destination, IndexProxy

        # bound now (its port goes into the plan), serving only after the
        # launcher's fork: the fork happens while pipguard is single-threaded
        proxy = IndexProxy(tuple(Destination(h.host, h.port) for h in policy.allow_hosts))
    try:
        plan = make_plan(argv, policy, cwd=cwd, env=env, os_available=possible, os_reason=reason,
                         proxy_port=proxy.port if proxy else None)
    except BaseException:
        if proxy:
            proxy.__exit__(None, None, None)
        raise
    started_at = time.time()
    precompile_hook()
    prepared = None
    started = None
    lease = None
    decoys = None
    try:
        # before the sandbox user's grants (they are that lease's to undo, not the user's ACLs)
        kept_modes = filemodes.snapshot(_mode_roots(plan))
        if sandbox_user.needed() and plan.namespace is None:
            # as root, the sandbox runs as a leased unprivileged uid (docs/sandbox.md, "Running as
            # root"); the namespace backend maps its own uid and needs no grants (idmapped mounts)
            lease = uidlease.prepare(plan, plan.settings.user_read)
            plan.env[HOOK_CONFIG] = sandbox_user.hook_config(plan.env[HOOK_CONFIG], lease.user)
        roots = [r for r in plan.write_roots if (record_build_dir or r != plan.cwd)
                 and r not in plan.namespace_tmpfs]
        before = files.snapshot(roots)
        from pipguard.sandbox import launcher

        bounds = plan.settings
        prepared = limits.prepare(bounds.memory, bounds.processes, bounds.cpu, bounds.write)
        notify(f"starting {' '.join(argv)[:80]}")
        run_as = (lease.user.uid, lease.user.gid) if lease else None
        # the command's move into its cgroup comes at the launch's end: wait for the kernel meanwhile
        fast = None
        try:
            fast = prepared.cgroup.move_kept_fast() if prepared.cgroup else None
            started = launcher.start(plan, meanwhile=lambda: _while_confining(meanwhile),
                                     rlimits=prepared.rlimits,
                                     before_exec=prepared.cgroup.add if prepared.cgroup else None,
                                     run_as=run_as)
        finally:
            if fast is not None:
                fast.stop()
        from pipguard.sandbox.supervisor import Supervisor

        if proxy is not None:
            proxy.__enter__()
        decoys = _watch_decoys(started)
        # the quiet moments of this run do the idle work of pipguard install (the last call's
        # clean-up, the next one's run directory): none is left for the gap between two calls
        supervisor = Supervisor(plan, started, cgroup=prepared.cgroup, readers=[decoys] if decoys else (),
                                idle=on_idle)
        evidence = supervisor.run()
        if proxy is not None:
            _proxy_evidence(proxy, supervisor)
        if decoys is not None:
            _decoy_evidence(decoys, supervisor)
        missed: List[str] = []
        written: List[FileWritten] = []
        if lease is not None:
            # the release removes the run's temp dir and HOME (the sandbox user's): what the run
            # wrote there is listed first, or a file that hit the write limit there goes unseen
            private = [r for r in roots if r in (plan.tmp_dir, plan.home_dir)]
            written = files.changed(before, files.snapshot(private, missed))
            roots = [r for r in roots if r not in private]
            # before the snapshot: files the sandbox left are given back first
            lease.release(nothing_left=prepared.cgroup is not None and prepared.cgroup.members() == set())
        _restore_modes(plan, supervisor, kept_modes, started_at)
        written += files.changed(before, files.snapshot(roots, missed)) + _left_in_namespace(plan, started, supervisor)
        unlisted = [r for r in plan.write_roots if r not in roots and r not in plan.namespace_tmpfs
                    and r not in (plan.tmp_dir, plan.home_dir)]
        _write_limit_evidence(plan, supervisor, written, unlisted, started.process.usage)
        if missed:
            # a directory of a write root the walk could not list: what the run wrote there
            # is not in the report, so the run counts as hiding it
            supervisor.collector.add_event("file-write", "blocked", "supervisor", supervisor.started.command_pid,
                                           missed[0].split(":")[0], "unlisted-files",
                                           {"count": len(missed), "first": missed[:8]}, always=True)
        return _report(plan, started, evidence, written, started_at, prepared,
                       lease.user if lease else None)
    finally:
        if decoys is not None:
            defer_kernel_wait(decoys.close)  # an SRCU grace period (5-20 ms): where nobody waits, if possible
        if started is not None:
            started.process.release()
            for key, fd in (started.entered.evidence_fds.items() if started.entered else ()):
                if key.startswith("tmpfs:"):
                    os.close(fd)
        if prepared is not None and prepared.cgroup is not None:
            prepared.cgroup.remove()
        if proxy is not None:
            proxy.__exit__(None, None, None)
        if lease is not None:
            lease.release()
        cleanup(plan.run_dir)


def _while_confining(meanwhile: Optional[Callable[[], None]]) -> None:
    """What the parent does while the forked child confines itself (a few
    ms, on another CPU): import what it needs next."""
    from pipguard.sandbox import supervisor  # noqa: F401

    if meanwhile is not None:
        meanwhile()


def _watch_decoys(started):
    """The ns backend's decoy watch, read by the supervisor's loop while the run lasts."""
    entered = started.entered
    if entered is None or "decoys" not in entered.evidence_fds:
        return None
    from pipguard.sandbox.backends.ns.decoys import DecoyWatch

    return DecoyWatch(entered.evidence_fds["decoys"], entered.evidence_info.get("decoys", {}))


def _decoy_evidence(watch, supervisor) -> None:
    """Every decoy credential a process of the sandbox opened is a finding
    (the real one was never there: "blocked"). inotify carries no pid: the
    command's process stands for the sandbox."""
    for when, path, how in watch.stop(close=False):
        supervisor.collector.add_event("file-read", "blocked", "ns", supervisor.started.command_pid, path,
                                       "decoy-read", {"decoy": True, "seen": f"inotify {how}"}, when=when)


def _left_in_namespace(plan: Plan, started, supervisor) -> List[FileWritten]:
    """What the run left in the namespace's own ``/tmp`` and ``/dev/shm``
    (the launcher holds a handle on each): files written, ``discarded`` —
    they never reach the host, but they are what the run staged, and a native
    write there is reported by nothing else."""
    entered = started.entered
    if entered is None or plan.namespace is None:
        return []
    mounted = [m.path for m in plan.namespace.mounts]
    out: List[FileWritten] = []
    for key, fd in sorted(entered.evidence_fds.items()):
        if key.startswith("tmpfs:"):
            found, missed = files.left_in(fd, key[len("tmpfs:"):], skip=mounted)
            out += found
            if missed:
                # what the walk could not see may be what the run wanted unseen (a tree
                # deeper than it goes, a directory made unreadable): a finding, never a gap
                supervisor.collector.add_event(
                    "file-write", "blocked", "ns", supervisor.started.command_pid, key[len("tmpfs:"):],
                    "unlisted-files", {"count": len(missed), "first": missed[:8]}, always=True)
    return out


def _write_limit_evidence(plan: Plan, supervisor, written: List[FileWritten], unlisted: List[str],
                          usage) -> None:
    """A file the run left at the write limit's size hit it: ``RLIMIT_FSIZE`` stops every write
    past the limit there (the writer gets ``EFBIG``, or dies of ``SIGXFSZ``). Seen from the file,
    not the signal: Python ignores ``SIGXFSZ`` (a build's ``write`` fails with ``EFBIG`` and no
    process dies), and a writer that dies of it is reaped by its own parent inside the run (a
    shell, make, a build backend), never by the keeper that :meth:`Lifetime.limit_events` asks.
    ``unlisted``: write roots not in ``written`` (the build's own tree), looked through only when
    the run wrote that much to block storage (``usage``, dirtied bytes: known at once) or it is
    not known."""
    limit = plan.settings.write
    full = sorted({f.path for f in written if f.size >= limit})
    if unlisted and (usage is None or usage.written >= limit):
        full = sorted(set(full) | {path for path, _size in files.at_least(unlisted, limit)})
    if not full:
        return
    evidence = supervisor.collector.evidence
    evidence.limit_hit = evidence.limit_hit or "write"
    supervisor.collector.add_event(
        "process", "blocked", "supervisor", supervisor.started.command_pid, "write", "limit-disk",
        {"limit": limit, "how": f"{len(full)} file(s) reached the limit; writes past it failed",
         "files": full[:8]}, always=True)


def _mode_roots(plan: Plan) -> List[str]:
    """The write roots whose files outlive the run (not its private temp dir and HOME, nor
    the namespace's own tmpfs): where :mod:`pipguard.sandbox.filemodes` puts ACLs and modes back."""
    private = {plan.tmp_dir, plan.home_dir, *plan.namespace_tmpfs}
    return [r for r in plan.write_roots if r not in private]


def _restore_modes(plan: Plan, supervisor, before, started_at: float) -> None:
    """No file of the write roots keeps an ACL or a special mode bit the run added
    (:mod:`pipguard.sandbox.filemodes`); each one it had is a finding. As root under ns what the
    sandbox wrote is root's on the host: world-write goes too (silently, as the plain
    backend's uid release does)."""
    idmapped = plan.namespace is not None and plan.namespace.idmap_writes
    by_path: dict = {}
    for item in filemodes.restore(_mode_roots(plan), before, started_at - 1, clear_world_write=idmapped):
        by_path.setdefault(item.path, []).append(item)
    for path, items in by_path.items():
        # one event a path (the collector merges a path's events): the first rule names it
        supervisor.collector.add_event(
            "file-write", "blocked", "supervisor", supervisor.started.command_pid, path, items[0].rule,
            {"stripped": [{"rule": i.rule, "found": i.found, "now": i.now} for i in items]})


def _proxy_evidence(proxy, supervisor) -> None:
    """Every request the index proxy saw becomes a network event (with host name)."""
    for when, action, host, port, how, client_port in list(proxy.records):
        pid = supervisor.proxy_clients.get(client_port, 0)
        rule = "index-allowed" if action == "allowed" else "not-an-index"
        protocol = "https" if how == "CONNECT" else "http"
        supervisor.collector.add_event("network", action, "proxy", pid, f"{host}:{port}", rule,
                                       {"protocol": protocol, "method": how, "host": host, "port": port},
                                       when=when)
        supervisor.collector.add_network("inet", protocol, host, port, host, action, pid, "proxy")


def _report(plan: Plan, started, evidence, written, started_at: float,
            prepared, user: Optional[sandbox_user.SandboxUser] = None) -> Report:
    applied = ["audit", *started.applied]
    if started.listener is not None:
        applied.append("supervisor")
    unavailable = {**plan.unavailable, **started.unavailable, **prepared.unavailable}
    if plan.settings.isolation != "audit" and started.listener is None and "supervisor" not in unavailable \
            and plan.os_spec is not None:
        unavailable["supervisor"] = "seccomp user notification is unavailable"
    processes = []
    for key in evidence.process_order:
        record = evidence.processes[key]
        if key == started.command_pid:
            record = ProcessRecord(record.pid, record.ppid, record.argv, evidence.exit_code,
                                   bool(evidence.timed_out or evidence.interrupted))
        elif record.pid in evidence.killed:
            record = ProcessRecord(record.pid, record.ppid, record.argv, -9, True)
        processes.append(record)
    known = {p.pid for p in processes}
    for pid in evidence.killed:
        if pid not in known:
            processes.append(ProcessRecord(pid, 0, (), -9, True))
    error = None
    if evidence.interrupted:
        error = "interrupted: the sandbox was stopped by a signal to pipguard"
    elif evidence.exit_code is None:
        # the keeper (pipguard's child that waits for the sandbox) went away before it
        # reported the command's status: something outside killed it; the outcome is unknown
        error = "the sandbox's keeper ended before the command's exit status: the run's outcome is unknown"
    ordered = sorted(evidence.events, key=lambda e: (e.time, e.seq))
    events = tuple(Event(i + 1, e.time, e.kind, e.action, e.layer, e.pid, e.target, e.rule, e.detail)
                   for i, e in enumerate(ordered))
    return Report(
        command=tuple(plan.argv), exit_code=evidence.exit_code, timed_out=evidence.timed_out,
        isolation=LayerStatus(plan.settings.isolation, tuple(applied), unavailable, {
            s.name: {"state": s.state, "reason": s.reason}
            for s in protections.reconcile(plan.protections, applied, unavailable)}),
        events=events, processes=tuple(processes), network=tuple(evidence.network),
        files_written=tuple(written), env_removed=plan.env_removed,
        events_dropped=evidence.dropped, policy=plan.settings.policy_json, host=host_summary(user),
        cwd=plan.cwd, started_at=started_at, duration=round(time.time() - started_at, 4),
        error=error, tool_version=pipguard.__version__, supervision=dict(evidence.supervision),
        limits=limits.recorded(prepared, started.process.usage, max((f.size for f in written), default=None)),
        limit_hit=evidence.limit_hit,
    )


def run_sandboxed(argv: Sequence[str], *, allow_network: bool = False,
                  allow_subprocess: bool = True, cwd: Optional[str] = None,
                  timeout: Optional[float] = None, env: Optional[Mapping[str, str]] = None,
                  **policy_settings) -> int:
    """Run ``argv`` sandboxed and return its exit status, shell-style
    (128+N when killed by signal N, 124 on timeout).

    Extra keyword arguments are :class:`Policy` settings (``allow_write``,
    ``allow_read``, ``keep_env``, ``isolation``...); unknown ones raise
    :class:`~pipguard.errors.PolicyError`. For the evidence, use :func:`run`.
    """
    policy = Policy.from_mapping(dict(policy_settings, allow_network=allow_network,
                                      allow_subprocess=allow_subprocess, timeout=timeout))
    report = run(argv, policy, cwd=cwd, env=env)
    if report.error and report.error.startswith("interrupted"):
        # the sandbox is gone by now; the caller's Ctrl-C must still stop the caller
        raise KeyboardInterrupt
    return exitcodes.from_wait_status(report.exit_code, report.timed_out)


async def run_async(argv: Sequence[str], policy: Optional[Policy] = None, **kwargs) -> Report:
    """:func:`run` for asyncio: the run happens in a worker thread (runs are
    independent of each other and of the caller: see docs/sandbox.md, "Python
    API"), the event loop stays free. Cancelling the awaiting task does not
    stop the run: it ends as :func:`run` would (use ``policy.timeout``)."""
    import asyncio
    import functools

    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, functools.partial(run, argv, policy, **kwargs))


__all__ += ["PipguardError"]
