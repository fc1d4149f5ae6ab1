"""``pipguard install --sandbox`` / ``pipguard sandbox``: the real pip, with
every PEP 517 hook call it makes in a sandbox of its own.

pip is trusted code; package code is not. pipguard runs the target
interpreter's own pip with the user's arguments (so resolution, options,
config files, ``PIP_*`` variables, hash checking, build isolation, editable
installs and install locations are pip's), and sits at the seam where pip
runs package code (:mod:`pipguard.install._seam.target` inside pip, :mod:`pipguard.install.seam`
here):

  1. every hook call (``get_requires_for_build_*``, ``prepare_metadata_*``,
     ``build_wheel``, ``build_editable``, ``build_sdist``) — in pip and in the
     pip subprocesses that fill build environments — runs in its own sandbox
     (:mod:`pipguard.install.hookcall`): its own tree and output only, no network;
     a blocked attempt or a bad result fails that call, and the install;
  2. pip builds every wheel before it installs any; there pip asks pipguard,
     which gates every wheel (:mod:`pipguard.gate.scan`), optionally probes their
     imports in a sandbox, and answers install, stop (``sandbox``) or refuse;
  3. pip installs (installing a wheel runs no package code).

Nothing is installed unless every hook call was clean and every wheel passed.

This module starts pip (:func:`start_pip`), serves its requests (:meth:`Installer.run`) and
builds the result; the :class:`Installer` is made of, lowest first:
:mod:`~pipguard.install.session` (the options and the state its parts share),
:mod:`~pipguard.install.importprobe` (``--probe-imports``), :mod:`~pipguard.install.gating`
(the ``gate`` request, pip's wheel cache after it) and :mod:`~pipguard.install.hooks` (the
``hook`` request).
"""

from __future__ import annotations

import os
import subprocess
from typing import TYPE_CHECKING, Any, List, Mapping, Optional

from pipguard.install.gating import WheelGate
from pipguard.install.hooks import HookCalls
from pipguard.install.session import InstallOptions, Source, _problem_findings

# Start-up order: the CLI imports this module and starts pip at once
# (Installer.run); pip then takes half a second or more to reach its first
# hook call. So only what starting pip needs is imported here and in the
# modules the installer is made of (session, hooks, gating, importprobe), and the result
# models, the report and the gate come while pip starts (_warm_up) or where
# they are used (~20 ms that were before pip started; docs/performance.md).
if TYPE_CHECKING:
    from pipguard.install.result import InstallResult
    from pipguard.install.seam import PipProcess

#: re-exported (``from pipguard.install.installer import InstallResult``): the result models live in
#: :mod:`pipguard.install.result`, imported on first use
_RESULT_NAMES = ("REFUSING_SEVERITIES", "InstallResult", "PackageResult", "Phase", "Refusal", "_counting")


def __getattr__(name: str) -> Any:
    if name in _RESULT_NAMES:
        from pipguard.install import result as install_result

        return getattr(install_result, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Installer(HookCalls, WheelGate):
    """Runs pip with the seam; ``options.sandbox_only`` installs nothing. Its state is an
    :class:`~pipguard.install.session.InstallSession`'s; it answers pip's hook requests as
    :class:`~pipguard.install.hooks.HookCalls` and its gate requests as
    :class:`~pipguard.install.gating.WheelGate`."""

    # ------------------------------------------------------------------ run
    def run(self, pip: Optional["PipProcess"] = None) -> InstallResult:
        """Run the install: with ``pip`` started already for these options (the CLI
        starts it first thing: :class:`pipguard.install.seam.PipProcess`), or start it now."""
        if pip is None:
            pip = start_pip(self.options, self.env, self.pip_stdout)
        proc, server = pip.proc, pip.server
        try:
            # pip takes half a second or more to reach its first hook call: prepare
            # meanwhile what every call needs (its requests queue on the socket);
            # nothing is imported before pip starts that pip's start does not need
            from pipguard.sandbox.plan import precompile_hook

            precompile_hook(self.python)  # the hook calls' Pythons are the target's version
            _warm_up(self.options.isolation)
            from pipguard.sandbox.rundir import idle_work, on_idle

            # while pip works, and in each hook call's quiet moments: the next call's spare
            # (_ahead), its run directory, the last call's clean-up
            with idle_work(ahead=self._ahead):
                server.serve(proc.pid, {"hook": self._on_hook, "gate": self._on_gate,
                                        "refuse": self._on_refuse, "source": self._on_source},
                             idle=on_idle)
            returncode = proc.wait()
            self.interpreter = pip.interpreter()
        except KeyboardInterrupt:
            _stop(proc)
            return self._result("interrupted", "interrupted; pip was stopped (nothing is installed "
                                "unless pip had already started installing the gated wheels)")
        finally:
            server.close()
            from pipguard.sandbox import launcher

            launcher.discard_spare()
            self._evict_ungated()
        return self._finish(returncode)

    def _finish(self, returncode: int) -> InstallResult:
        from pipguard.install.seam import SUPPORTED

        implementation, oldest = SUPPORTED
        if self.interpreter is None or self.interpreter[0] != implementation or self.interpreter[1] < oldest:
            # whatever its exit status: pip never ran (an exit 0 from /bin/true is no install)
            said = (f"it is {self.interpreter[0]} {'.'.join(map(str, self.interpreter[1]))}"
                    if self.interpreter else f"it never ran pipguard's pip, exit {returncode}")
            return self._result("error", f"--python {self.python}: not a CPython >= 3.9 with pip: {said}")
        if self.refusals:
            names = ", ".join(dict.fromkeys(r.who for r in self.refusals))
            return self._result("refused", f"{names} refused the install (below: what was seen, "
                                "what you can do); nothing was installed")
        if self.error:
            return self._result("error", self.error)
        if returncode == 3 and not self.gate_answered and not self.phases:
            return self._result("error", f"{self.python} has no pip; install pip there first")
        if returncode != 0:
            message = f"pip failed (exit {returncode}); see pip's output above"
            if self.options.binary_only:
                message += ("; without --sandbox only wheels are allowed: a package available only "
                            "as an sdist (or a local project) needs 'pipguard install --sandbox'")
            return self._result("error", message)
        if self.options.sandbox_only:
            return self._result("clean", "observed clean; nothing installed")
        if not self.gated:
            return self._result("installed", "pip installed nothing (requirements already satisfied, or --dry-run)")
        return self._result("installed", f"{len(self.gated)} package(s) gated, then installed by pip")

    def _result(self, status: str, message: str) -> InstallResult:
        from pipguard.install.result import InstallResult, PackageResult

        packages = dict(self.gated)
        for name in dict.fromkeys(r.call.package for r in self.hook_results):
            if name in packages:
                continue  # gated: its verdict includes its hook calls
            # a package that never reached the gate: its hook calls decide
            calls = [r for r in self.hook_results if r.call.package == name]
            events = self._counting_events(name)
            packages[name] = PackageResult(
                name, calls[-1].call.version, "", "", True,
                "blocked" if events or any(r.refusals for r in calls) else
                ("approved" if self.accepted.get(name) else "clean"),
                tuple(f for r in calls for f in _problem_findings(r)), events,
                self.origins.get(name), (), tuple(self.accepted.get(name, ())))
        all_findings = tuple(f for p in packages.values() for f in p.findings)
        return InstallResult(self.command, status, tuple(self.phases), tuple(packages.values()),
                             all_findings, message, self.options.isolation, tuple(self.refusals),
                             self.options.project.path)

    # ------------------------------------------------------------ handlers
    def _ahead(self) -> bool:
        """pipguard's own step in each quiet moment (:func:`pipguard.sandbox.rundir.idle_work`:
        between two requests of pip, and in a hook call's quiet moments). While
        another hook call may follow, that call's keeper and first process are
        forked ahead (:func:`pipguard.sandbox.launcher.fork_spare`; not under the VM backend,
        which launches its own): forked once a call ended, they were often not
        ready when pip's next call came ~5 ms later (the spare's handoff took 1-8 ms
        of each call, measured). Once pip installs the gated wheels no call
        follows: the spare ends, nothing more is made ahead, and what the caller
        needs for the result is prepared (``prepare_result``) -- all while pip
        installs, not after it. True when it did something."""
        from pipguard.sandbox import launcher

        if self.gated or self.refusal or self.error:
            if self._closing_done:
                return False
            self._closing_done = True
            launcher.discard_spare()
            from pipguard.sandbox import rundir

            rundir.no_more_runs()
            if self.prepare_result is not None:
                self.prepare_result()
            return True
        if self.options.binary_only or self.options.isolation == "vm":
            return False
        try:
            return launcher.fork_spare()  # False: the spare is there
        except OSError:
            return False  # no spare (fork failed: EAGAIN, ENOMEM): the call forks afresh, and reports it if that fails too

    def _on_refuse(self, request: dict, fds: List[int]) -> dict:
        reason = str(request.get("reason", "refused"))[:2000]
        self.error = self.error or f"pipguard cannot do this install safely: {reason}"
        return {}

    def _on_source(self, request: dict, fds: List[int]) -> dict:
        """pip prepared a requirement (downloaded, unpacked; no hook has run):
        remember what its source tree is."""
        from packaging.utils import canonicalize_name

        from pipguard.install.approvals import Origin

        from pipguard.install.hookcall import declared_url_requirements

        directory, name = request.get("dir"), request.get("name")
        cache_dir = request.get("cache_dir")
        if isinstance(cache_dir, str) and os.path.isabs(cache_dir):
            self.cache_dirs.add(cache_dir)
        if isinstance(directory, str):
            directory = os.path.realpath(directory)
            # What the project declares is read once, before any hook of the tree ran: pip
            # prepares a tree again when it is named twice (`./a "a @ file:..."`), and by then
            # a build could have written its pyproject.toml (second review)
            # — nor by then a build of a tree that holds it (`./a ./a/sub`: a's hooks may write
            # all of a, sub's pyproject.toml included; third review)
            earlier = self.sources.get(directory)
            written = any(directory == tree or directory.startswith(tree.rstrip("/") + "/")
                          for tree in self.hooked_trees)
            declared = (earlier.declared_urls if earlier is not None else
                        frozenset() if written else declared_url_requirements(directory))
            self.sources[directory] = Source(
                canonicalize_name(name) if isinstance(name, str) and name else None,
                Origin.from_json(request.get("origin")), declared,
                bool(earlier.project if earlier is not None else request.get("project") is True))
        return {}


def start_pip(options: InstallOptions, env: Mapping[str, str], stdout: Optional[int] = None) -> "PipProcess":
    """Start the target's pip for ``options`` (:class:`pipguard.install.seam.PipProcess`)."""
    from pipguard.install.seam import PipProcess, pip_arguments, target_python

    return PipProcess(target_python(options.python), pip_arguments(options.pip_args, options.binary_only),
                      env, stdout)


def _warm_up(isolation: str) -> None:
    """Import what the first hook call and the gate need, and probe the host's
    planning facts, while pip starts: off the critical path of the first call.
    Synchronous (no thread): the sandboxes fork from this process."""
    from pipguard.sandbox import uidlease

    # a killed run's grants, undone while pip starts (every run does it too; this is an
    # install that may run no hook call at all)
    uidlease.replay_stale()
    import packaging.requirements  # noqa: F401 (a hook call's answer is checked with it: ~20 ms)
    import packaging.utils  # noqa: F401

    from pipguard.sandbox import first_process as _child, host, launcher, api as sandbox, supervisor  # noqa: F401
    from pipguard.install import approvals, buildoutput, hookcall, result as install_result  # noqa: F401
    from pipguard.gate import cache as gatecache  # noqa: F401

    try:  # a source tree's declared requirements are read with it (pip's first request)
        import tomllib  # noqa: F401
    except ImportError:  # Python < 3.11
        import tomli  # noqa: F401
    host.planning_facts()
    if isolation == "auto":
        from pipguard.sandbox.backends.ns.probing import probe

        probe()  # what auto's plan asks first (a throw-away child: ~6 ms of the first call)


def _stop(proc: subprocess.Popen) -> None:
    """Ctrl-C reached pip too (same process group); give it a moment to roll back."""
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


__all__ = ["InstallOptions", "Installer", "start_pip"]
