"""pip's hook requests answered (:class:`HookCalls`, the installer's ``hook`` handler): each
PEP 517 hook call pip makes is planned (:mod:`pipguard.install.hookcall`), run in a sandbox of
its own with pip's descriptors as its stdio (:class:`_stdio`, through
:mod:`pipguard.install.buildoutput`), checked, recorded, and answered with its exit status.

Imported after pip started (with the installer): the sandbox, the hook call's checks and the
result models are imported where they are used.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

from pipguard.install.session import InstallSession, Source, _fingerprint, _hosts, _seen

if TYPE_CHECKING:
    from pipguard.install import buildoutput
    from pipguard.install.hookcall import HookResult
    from pipguard.sandbox.policy import HostPort
    from pipguard.report.model import Report


class HookCalls(InstallSession):
    """The answer to pip's ``hook`` request: the call run sandboxed."""

    def _on_hook(self, request: dict, fds: List[int]) -> dict:
        from pipguard.install import hookcall
        from pipguard.install.result import Refusal, _counting

        cwd = os.path.realpath(str(request.get("cwd") or "/"))
        project = self.sources.get(cwd, Source()).project
        try:
            call = hookcall.plan_call(request.get("argv") or [], cwd, dict(request.get("env") or {}),
                                      project=project, first_tree=self.first_trees.get(cwd))
        except hookcall.HookCallRefused as exc:
            self.error = self.error or f"pipguard refused a hook call: {exc}"
            return {"exit": 1, "message": f"pipguard: {exc}"}
        self.hooked_trees.add(call.cwd)
        if call.tree is not None:
            self.first_trees.setdefault(call.cwd, call.tree)
        # the name pip resolved wins over what the tree says about itself
        pip_name, origin, declared_urls, _project = self.sources.get(call.cwd, Source())
        if pip_name and pip_name != call.package:
            call = dataclasses.replace(call, package=pip_name)
        if declared_urls:
            call = dataclasses.replace(call, declared_urls=declared_urls)
        if origin is not None:
            self.origins[call.package] = origin
        who = f"{call.package} {call.version}".strip()
        if self.options.binary_only:
            if not self.refusals:
                self._refuse(Refusal(call.package, call.version, "build", call.hook, (), origin))
            return {"exit": 1, "message": f"pipguard: refused: {self.refusal}"}
        if self.refusal:  # one refusal decides the install: run no more package code
            return {"exit": 1, "message": "pipguard: the install is already refused; not running "
                                          f"{call.hook} of {who}"}
        self.progress(f"{who}: {call.hook} (sandboxed)")
        result = self._run_call(call, fds, self._hosts(call.package, pip_name))
        self.hook_results.append(result)
        phase = self._phase(call.hook, call.package, result.report, origin)
        status = _shell_status(result.report)
        if result.report.error:  # the run itself failed (not the build): the install cannot go on
            self.error = self.error or f"{who}: {call.hook}: {result.report.error}"
            self.progress(f"{who}: {call.hook} failed: {result.report.error}")
            return {"exit": status or 1, "message": f"pipguard: {call.hook} of {who}: {result.report.error}"}
        counting = _counting(phase)
        if counting or result.refusals:
            if result.refusals:
                why = self._refuse(Refusal(call.package, call.version, "output", call.hook,
                                           tuple(f"{p.rule}: {p.message} {p.path}".strip()
                                                 for p in result.refusals), origin))
            else:
                why = self._refuse(Refusal(call.package, call.version, "attempt", call.hook,
                                           tuple(_seen(e) for e in counting), origin, _hosts(counting)))
            return {"exit": status or 1, "message": f"pipguard: refused: {why} — the install is "
                    "refused; see pipguard's summary below"}
        note = f", {len(phase.accepted)} attempt(s) accepted by approval" if phase.accepted else ""
        # the backend's own failure is pip's to report, but never "ok"
        outcome = ("timed out" if result.report.timed_out else f"failed (exit {status})") if status else "ok"
        self.progress(f"{who}: {call.hook} {outcome} ({result.report.duration:.1f} s{note})")
        message = None
        if result.report.timed_out:
            message = f"pipguard: {call.hook} of {who} exceeded --build-timeout"
        return {"exit": status, "message": message}

    def _hosts(self, package: str, pip_name: Optional[str]) -> Tuple[HostPort, ...]:
        """The command line's build hosts, and the policy's for this package:
        only when pip said which requirement the tree is (a tree's own
        metadata could claim any name)."""
        own = self.options.project.hosts_for(pip_name) if pip_name else ()
        return tuple(dict.fromkeys([*self.options.build_hosts, *own]))

    def _run_call(self, call, fds: Sequence[int], hosts: Tuple[HostPort, ...]) -> "HookResult":
        from pipguard.install import hookcall
        from pipguard.install.result import Phase
        from pipguard.sandbox.api import run

        policy = hookcall.sandbox_policy(
            call, isolation=self.options.isolation, build_hosts=hosts,
            timeout=self.options.build_timeout, keep_env=self.options.keep_env,
            observe_reads=self.options.observe_reads, extra_read=self.options.allow_read,
            extra_write=self.options.allow_write, limits=dict(self.options.limits))
        policy = dataclasses.replace(policy, vm_accel=self.options.vm_accel)
        if call.prepared_metadata is not None and call.prepared_metadata in self.prepared:
            # the wheel must say what pip resolved from (PEP 517: a backend given the prepared
            # metadata_directory builds a wheel with the same metadata)
            call = dataclasses.replace(call, expected_metadata=self.prepared[call.prepared_metadata])
        with _stdio(fds):
            report = run(list(call.argv), policy, cwd=call.cwd, env=call.env)
        if report.error and report.error.startswith("interrupted"):
            self.phases.append(Phase(call.hook, call.package, report))
            raise KeyboardInterrupt  # the sandbox is gone; stop pip too
        from pipguard.install.buildoutput import unprintable_result

        problems = hookcall.check_result(call, report.exit_code == 0)
        if report.exit_code == 0:
            problems += unprintable_result(call)
        result = hookcall.HookResult(call, report, problems)
        prepared = hookcall.prepared_metadata(call) if report.exit_code == 0 and not result.refusals else None
        if prepared is not None:
            self.prepared[prepared[0]] = prepared[1]
        built = hookcall.built_artifact(call)
        if built is not None and call.hook == "build_wheel":
            self.built_wheels.append(_fingerprint(built))
        return result


def _shell_status(report: Report) -> int:
    from pipguard import exitcodes

    return exitcodes.from_wait_status(report.exit_code, report.timed_out)


class _stdio:
    """Give the hook call (``fds``: its stdin, stdout, stderr, as pip gave them) this
    process's 0, 1, 2 while the sandbox starts: stdin /dev/null, stdout and stderr
    the pipe of a :class:`pipguard.install.buildoutput.Relay`, which copies what the call
    writes into the pipe pip reads (pip shows a failed build's output, as without
    pipguard) with its escape sequences neutralised (:mod:`pipguard.report.render.safe`)."""

    def __init__(self, fds: Sequence[int]) -> None:
        self.fds = list(fds)[:3]
        self.saved: List[int] = []
        self.relay: Optional["buildoutput.Relay"] = None

    def __enter__(self) -> None:
        if len(self.fds) != 3:
            return
        from pipguard.install import buildoutput

        sys.stdout.flush()
        sys.stderr.flush()
        relay = buildoutput.Relay(self.fds[1], self.fds[2])
        out, err = relay.start()
        self.relay = relay
        try:
            self.saved = [os.dup(n) for n in (0, 1, 2)]
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)  # a hook reads nothing: pip gives it no input either
            os.close(devnull)
            os.dup2(out, 1)
            os.dup2(err, 2)
        except BaseException:
            self.__exit__()
            raise
        finally:
            relay.writers_given()

    def __exit__(self, *exc) -> None:
        if self.saved:
            sys.stdout.flush()
            sys.stderr.flush()
            for n, fd in enumerate(self.saved):
                os.dup2(fd, n)
                os.close(fd)
            self.saved = []
        if self.relay is not None:
            self.relay.finish()  # the call's output is in pip's pipe before pip gets its status
            self.relay = None
