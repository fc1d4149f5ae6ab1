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
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import (TYPE_CHECKING, Any, Callable, Dict, FrozenSet, List, Mapping, NamedTuple, Optional, Sequence,
                    Set, Tuple)

from pipguard.install.policyfile import ProjectPolicy

# Start-up order: the CLI imports this module and starts pip at once
# (Installer.run); pip then takes half a second or more to reach its first
# hook call. So only what starting pip needs is imported here, and the result
# models, the report and the gate come while pip starts (_warm_up) or where
# they are used (~20 ms that were before pip started; docs/performance.md).
if TYPE_CHECKING:
    from pipguard.install import buildoutput
    from pipguard.gate import scan as gate, srcguard  # imported where it scans: tarfile, zipfile, lzma... (~15 ms a start)
    from pipguard.install.approvals import Approval, Origin
    from pipguard.gate.coremeta import CoreMetadata
    from pipguard.install.hookcall import HookResult
    from pipguard.install.result import InstallResult, PackageResult, Phase, Refusal
    from pipguard.sandbox.policy import HostPort
    from pipguard.report.model import Event, Report
    from pipguard.install.seam import PipProcess

Progress = Callable[[str], None]

#: re-exported (``from pipguard.install.installer import InstallResult``): the result models live in
#: :mod:`pipguard.install.result`, imported on first use
_RESULT_NAMES = ("REFUSING_SEVERITIES", "InstallResult", "PackageResult", "Phase", "Refusal", "_counting")


def __getattr__(name: str) -> Any:
    if name in _RESULT_NAMES:
        from pipguard.install import result as install_result

        return getattr(install_result, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class InstallOptions:
    """What pipguard itself takes from an ``install``/``sandbox`` command line;
    ``pip_args`` are everything else, passed to ``pip install`` unchanged.

    - ``python``: the target interpreter (its own pip runs); None: pipguard's.
    - ``binary_only``: no package code may run at all (``install`` without
      ``--sandbox``): pip gets ``--only-binary :all:`` and any hook call is refused.
    - ``build_hosts``: destinations hook calls may reach through pipguard's
      filtering proxy (``--allow-build-host``); empty: no network.
    - ``build_timeout``: seconds per hook call; None: no limit.
    - ``vm_accel``: under ``isolation="vm"``, how each hook call's guest runs
      (``kvm``/``tcg``: a VM per hook call, docs/sandbox.md "VM backend").
    - ``allow_read``/``allow_write``: extra roots for every hook call.
    - ``project``: the project's policy file (:mod:`pipguard.install.policyfile`): its
      approvals and per-package build hosts (its roots and variables are
      already in the fields above); the empty default: none.
    """

    pip_args: Tuple[str, ...]
    python: Optional[str] = None
    isolation: str = "auto"
    vm_accel: str = "kvm"
    sandbox_only: bool = False
    binary_only: bool = False
    probe_imports: bool = False
    build_hosts: Tuple[HostPort, ...] = ()
    build_timeout: Optional[float] = None
    keep_env: Tuple[str, ...] = ()
    #: observe every native open (seccomp notification); None: the backend's default,
    #: on, and off under ``ns`` (a credential read there opens a decoy, which is reported)
    observe_reads: Optional[bool] = None
    allow_read: Tuple[str, ...] = ()
    allow_write: Tuple[str, ...] = ()
    #: resource limits of each hook call, as Policy settings (``limit_memory``...); empty: defaults
    limits: Tuple[Tuple[str, float], ...] = ()
    project: ProjectPolicy = ProjectPolicy()


class Source(NamedTuple):
    """What pipguard learnt of a source tree when pip had prepared it, before any hook ran."""

    name: Optional[str] = None  # the requirement's canonical name, as pip resolved it
    origin: Optional[Origin] = None
    declared_urls: FrozenSet[Tuple[str, str]] = frozenset()  # hookcall.declared_url_requirements
    #: the user's own tree, which outlives the install (a local directory pip builds in place, an
    #: editable checkout), not pip's unpacked copy in its temporary directory
    project: bool = False


class Installer:
    """Runs pip with the seam; ``options.sandbox_only`` installs nothing."""

    def __init__(self, options: InstallOptions, *, progress: Optional[Progress] = None,
                 env: Optional[Dict[str, str]] = None, pip_stdout: Optional[int] = None,
                 prepare_result: Optional[Callable[[], None]] = None) -> None:
        """``pip_stdout``: a file descriptor for pip's standard output (None:
        this process's); the CLI sends it to stderr when stdout carries a report.
        ``prepare_result``: called once in a quiet moment after the wheels were
        gated (while pip installs them), for what the caller needs to show the
        result: the CLI imports its renderer there (10-20 ms after pip's exit
        otherwise)."""
        from pipguard.install.seam import target_python

        self.options = options
        self.python = target_python(options.python)
        self.progress = progress or (lambda message: None)
        self.env = dict(os.environ if env is None else env)
        self.pip_stdout = pip_stdout
        self.phases: List[Phase] = []
        self.hook_results: List[HookResult] = []
        self.gated: Dict[str, PackageResult] = {}
        #: source tree -> (the name pip resolved, the artifact), sent by the seam
        self.sources: Dict[str, Source] = {}
        #: every source tree a hook call ran in (its cwd): what it holds is no longer the author's
        self.hooked_trees: Set[str] = set()
        #: project tree -> its snapshot before its first hook call (the user's files)
        self.first_trees: Dict[str, "srcguard.Tree"] = {}
        #: package -> its artifact, as learnt from the seam
        self.origins: Dict[str, Origin] = {}
        #: package -> its blocked attempts an approval accepted, with the approval
        self.accepted: Dict[str, List[Tuple[Event, Approval]]] = {}
        self.refusals: List[Refusal] = []
        #: (implementation, (major, minor)) of what ran pip, once it exited (None: not a Python)
        self.interpreter: Optional[Tuple[str, Tuple[int, int]]] = None
        self.error: Optional[str] = None     # why pipguard could not go on: exit 2
        self.gate_answered = False
        #: prepared .dist-info directory -> its metadata, as pip read it (hookcall.prepared_metadata)
        self.prepared: Dict[str, "CoreMetadata"] = {}
        #: the fingerprint of each wheel a build_wheel call returned (pip moves it into its
        #: wheel cache after the call), and of each wheel the gate passed: only those may stay
        #: in pip's cache; pip's cache directories, as the seam reported them
        self.built_wheels: List[Tuple[str, int, int]] = []
        self.passed: Set[Tuple[str, int, int]] = set()
        self.cache_dirs: Set[str] = set()
        self.prepare_result = prepare_result
        self._closing_done = False  # _ahead's last step, once
        mode = "sandbox" if options.sandbox_only else "install"
        self.command = ("pipguard", mode, *(("--sandbox",) if mode == "install" and not options.binary_only
                                            else ()), *_redacted(options.pip_args))

    @property
    def refusal(self) -> Optional[str]:
        """Why pipguard refused (findings: exit 1), one line; None: not refused."""
        return "; ".join(r.text() for r in self.refusals) or None

    def _refuse(self, refusal: Refusal) -> str:
        self.refusals.append(refusal)
        self.progress(f"{refusal.who}: REFUSED ({refusal.kind}: {refusal.phase})")
        return refusal.text()

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
            from pipguard.sandbox.plan import idle_work, on_idle

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

    def _evict_ungated(self) -> None:
        """Remove from pip's wheel cache every wheel a build of this run put there that the
        gate did not pass: a refused wheel (or one pip never got to gate because the install
        stopped) would otherwise be installed by a later plain ``pip install`` without a build
        or a gate. pip moves a built wheel from the hook's output directory into its cache
        (``<cache>/wheels/…``) after the call: it is found there by name and sha256. What the
        gate passed stays, as pip left it (docs/sandbox.md)."""
        doubtful = {built for built in self.built_wheels if built not in self.passed}
        if not doubtful or not self.cache_dirs:
            return
        from pipguard.sandbox.files import walk

        names = {name for name, _, _ in doubtful}
        for cache in sorted(self.cache_dirs):
            for root, _dirs, files in walk(os.path.join(cache, "wheels")):
                for name in names.intersection(files):
                    path = os.path.join(root, name)
                    if os.path.islink(path) or not os.path.isfile(path) or _fingerprint(path) not in doubtful:
                        continue
                    try:
                        os.unlink(path)
                    except OSError as exc:
                        self.progress(f"could not remove {name} from pip's wheel cache: {exc}")
                        continue
                    self.progress(f"{name}: removed from pip's wheel cache (built here, not passed by the gate)")
                    try:  # pip's origin.json beside it describes the wheel: gone with the last one
                        if not any(n.endswith(".whl") for n in os.listdir(root)):
                            os.unlink(os.path.join(root, "origin.json"))
                    except OSError:
                        pass

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

    def _counting_events(self, package: str) -> Tuple[Event, ...]:
        from pipguard.install.result import _counting

        return tuple(e for p in self.phases if p.package == package and p.name != "probe"
                     for e in _counting(p))

    # ------------------------------------------------------------ handlers
    def _ahead(self) -> bool:
        """pipguard's own step in each quiet moment (:func:`pipguard.sandbox.plan.idle_work`:
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
            from pipguard.sandbox import plan

            plan.no_more_runs()
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

    def _phase(self, name: str, package: str, report: Report, origin: Optional[Origin]) -> Phase:
        """Record a sandboxed run, with the blocked attempts an approval of
        ``origin`` accepts."""
        from pipguard.install.result import Phase

        approvals = self.options.project.approvals
        accepted = []
        for event in report.blocked_events:
            approval = approvals.attempt(origin, event.rule, event.target, name)
            if approval is not None:
                accepted.append((event.seq, approval))
                self.accepted.setdefault(package, []).append((event, approval))
        phase = Phase(name, package, report, tuple(accepted))
        self.phases.append(phase)
        return phase

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

    def _on_gate(self, request: dict, fds: List[int]) -> dict:
        from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

        from pipguard.gate import cache as gatecache
        from pipguard.install.approvals import Origin
        from pipguard.sandbox.files import sha256
        from pipguard.install.result import REFUSING_SEVERITIES, PackageResult, Refusal

        self.gate_answered = True
        role = request.get("role")
        if self.refusal:
            return {"decision": "refuse", "message": f"pipguard: refused: {self.refusal}"}
        wheels = request.get("wheels") or []
        results: List[PackageResult] = []
        owned = self._ownership(request) if role == "top" else {}
        approvals = self.options.project.approvals
        for wheel in wheels:
            path = wheel.get("path") if isinstance(wheel, dict) else None
            if not isinstance(path, str) or not path.endswith(".whl") or not os.path.isfile(path) \
                    or os.path.islink(path):
                name = wheel.get("name") if isinstance(wheel, dict) else None
                self.error = (f"pip is about to install {name or 'a requirement'} from something that "
                              "is not a wheel file (a legacy install path); pipguard installs wheels only")
                return {"decision": "refuse", "message": "pipguard: " + self.error}
            try:
                dist, version, _build, _tags = parse_wheel_filename(os.path.basename(path))
            except InvalidWheelFilename as exc:
                self.error = f"not a valid wheel file name: {exc}"
                return {"decision": "refuse", "message": "pipguard: " + self.error}
            name = canonicalize_name(dist)
            calls = [r for r in self.hook_results if r.call.package == name]
            # setuptools' editable finder is the expected result of `-e DIR`, and only
            # for the project the user named: pip says which wheel that is
            project = wheel.get("source_dir") if wheel.get("editable") and wheel.get("user_supplied") else None
            try:
                digest = sha256(path)
                findings = gatecache.scan_wheel(path, digest, editable_project=project if isinstance(project, str)
                                                else None, remember=not calls)
            except Exception as exc:  # a corrupt archive is a finding of its own kind: refuse
                self.error = f"{name}: the wheel cannot be read: {exc}"
                return {"decision": "refuse", "message": "pipguard: " + self.error}
            findings += tuple(owned.get(name, ()))
            findings += self._url_findings(name, path, wheel, calls)
            # what its hook calls left that is only reported (files created in the user's project)
            findings += tuple(f for r in calls for f in _problem_findings(r))
            origin = Origin.from_json(wheel.get("origin")) or self.origins.get(name)
            if origin is not None:
                self.origins[name] = origin
            kept, accepted = [], []
            for finding in findings:
                approval = (approvals.finding(origin, finding.rule, finding.member)
                            if finding.severity in REFUSING_SEVERITIES else None)
                if approval is None:
                    kept.append(finding)
                else:
                    accepted.append((finding, approval))
            events = self._counting_events(name)
            refusing = [f for f in kept if f.severity in REFUSING_SEVERITIES]
            verdict = "blocked" if events else ("gate" if refusing else
                                                ("approved" if accepted or self.accepted.get(name)
                                                 else "clean"))
            results.append(PackageResult(name, str(version), os.path.basename(path), digest,
                                         any(r.call.hook.startswith("build_") for r in calls), verdict,
                                         tuple(kept), events, origin, tuple(accepted),
                                         tuple(self.accepted.get(name, ()))))
            if refusing:
                self._refuse(Refusal(name, str(version), "gate", "gate" if role == "top"
                                     else "gate (a build requirement)",
                                     tuple(f"{f.rule} in {f.member or 'the wheel'}: {f.message}"
                                           for f in refusing), origin))
        if role == "top":
            for result in results:
                self.gated[result.name] = result
        if self.refusal:
            return {"decision": "refuse", "message": f"pipguard: refused: {self.refusal}"}
        if role != "top":
            self.passed.update(_fingerprint(w["path"]) for w in wheels if isinstance(w, dict))
            return {"decision": "install"}  # a build environment: gated, and needed by the build
        for result in results:
            note = " (with approved findings)" if result.accepted_findings else ""
            self.progress(f"{result.name} {result.version}: gate passed{note}")
        if self.options.probe_imports and wheels:
            if self._probe([w["path"] for w in wheels]):
                return {"decision": "refuse", "message": f"pipguard: refused: {self.refusal}"}
        self.passed.update(_fingerprint(w["path"]) for w in wheels if isinstance(w, dict))
        if self.options.sandbox_only:
            return {"decision": "stop"}
        return {"decision": "install"}

    def _url_findings(self, name: str, path: str, wheel: dict, calls: list) -> Tuple["gate.Finding", ...]:
        """Requirements by URL in a wheel's own METADATA, which pip fetches unsandboxed (the
        next run, from its cache, for a wheel pip already holds). A wheel built in this run may
        name only the URLs its project declared (:func:`pipguard.install.hookcall.declared_url_requirements`);
        one from pip's wheel cache was built by a run pipguard cannot vouch for (high); one
        downloaded is what its author published, fetched as plain pip would (medium: reported)."""
        from pipguard.gate import scan as gate
        from pipguard.gate.coremeta import direct_references, wheel_metadata

        metadata = wheel_metadata(path)
        if metadata is None:
            return ()
        # what its tree declared, read before any hook ran: found through the hook calls that
        # built it (pip names a `-e .` project only once its metadata exists), or pip's name
        built_here = bool(calls)
        declared = set()
        for result in calls:
            declared |= set(result.call.declared_urls)
        for source in self.sources.values():
            if source.name == name:
                declared |= set(source.declared_urls)
        cached = bool(wheel.get("cached"))
        out = []
        if metadata.unread:  # what pip would fetch cannot be told: refused, never skipped
            out.append(gate.Finding(name, os.path.basename(path), gate.HIGH, "direct-reference", "METADATA",
                                    None, f"{metadata.unread}: requirements by URL cannot be ruled out", ""))
        for dep, url in direct_references(metadata.requires_dist):
            if (dep, url) in declared and not cached:
                continue
            if built_here or cached:
                severity, how = gate.HIGH, ("from pip's wheel cache, built by an earlier run" if cached
                                            else "built here, and its project did not declare it")
            else:
                severity, how = gate.MEDIUM, "as published by its author; pip fetches it as it would without pipguard"
            out.append(gate.Finding(name, os.path.basename(path), severity, "direct-reference", "METADATA",
                                    None, f"Requires-Dist names a URL that pip fetches outside the sandbox ({how})",
                                    f"{dep} @ {url}" if dep else url))
        return tuple(out)

    def _ownership(self, request: dict) -> Dict[str, List["gate.Finding"]]:
        """Findings of wheels that would overwrite files they do not own, by
        package. The layout is pip's own scheme (sent by the seam), or the
        ``--target`` directory the files end up in."""
        from pipguard.gate import scan as gate

        paths = [w["path"] for w in request.get("wheels") or [] if isinstance(w, dict)
                 and isinstance(w.get("path"), str) and os.path.isfile(w["path"])]
        if not paths:
            return {}
        layout = None
        if isinstance(request.get("target_dir"), str):
            layout = gate.TargetLayout.for_target_dir(request["target_dir"])
        else:
            schemes = request.get("schemes") or {}
            scheme = next(iter(schemes.values()), None) if isinstance(schemes, dict) else None
            if isinstance(scheme, dict) and all(isinstance(scheme.get(k), str) for k in
                                                ("purelib", "platlib", "scripts", "data", "headers")):
                layout = gate.TargetLayout(scheme["purelib"], scheme["platlib"], scheme["scripts"],
                                           scheme["data"], os.path.dirname(scheme["headers"]))
        if layout is None:
            layout = gate.target_layout(self.python)
        out: Dict[str, List[gate.Finding]] = {}
        from packaging.utils import canonicalize_name

        for finding in gate.check_ownership([gate.WheelToInstall(p) for p in paths], layout):
            out.setdefault(canonicalize_name(finding.package), []).append(finding)
        return out

    def _probe(self, wheels: Sequence[str]) -> bool:
        """Import each new top-level module in the sandbox, from a staged
        copy; True when an import refused the install. A module's attempts
        are its distribution's (approvals of that wheel's artifact apply)."""
        import shutil
        import tempfile

        from pipguard.install.result import Refusal, _counting
        from pipguard.sandbox.api import run

        stage = tempfile.mkdtemp(prefix="pipguard-probe-")
        try:
            target = os.path.join(stage, "site")
            env = {k: v for k, v in self.env.items() if not k.startswith(("PIP_", "PIPGUARD_"))}
            env["PIP_CONFIG_FILE"] = os.devnull
            proc = subprocess.run([self.python, "-m", "pip", "install", "--no-deps", "--no-index",
                                   "--disable-pip-version-check", "--no-compile", "--target", target,
                                   "-q", *wheels], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
            if proc.returncode != 0:
                self.error = "staging wheels for the import probe failed: " + proc.stdout.strip()[-300:]
                return True
            work = os.path.join(stage, "work")
            os.mkdir(work)
            owners = _module_owners(target)
            for module in _top_level_modules(target):
                from pipguard.sandbox.policy import Policy

                owner = owners.get(module, module)
                policy = Policy(isolation=self.options.isolation, allow_read=(target,),
                                keep_env=self.options.keep_env, observe_reads=self.options.observe_reads,
                                timeout=self.options.build_timeout, vm_accel=self.options.vm_accel)
                code = f"import sys; sys.path.insert(0, {target!r}); import {module}"
                # the stage is read-only to the probe (and thrown away): without this,
                # Python's import system tries to cache bytecode there, a refused write
                probe_env = dict(env, PYTHONDONTWRITEBYTECODE="1")
                report = run([self.python, "-c", code], policy, cwd=work, env=probe_env)
                phase = self._phase("probe", owner, report, self.origins.get(owner))
                counting = _counting(phase)
                gated = self.gated.get(owner)
                version = gated.version if gated else ""
                if counting:
                    self._refuse(Refusal(owner, version, "attempt", "probe",
                                         tuple(f"import {module}: {_seen(e)}" for e in counting),
                                         self.origins.get(owner), _hosts(counting)))
                    if gated:
                        self.gated[owner] = dataclasses.replace(gated, verdict="blocked",
                                                                events=gated.events + counting)
                    return True
                self.progress(f"{owner}: import {module} ok (probe)")
                if phase.accepted and gated:
                    self.gated[owner] = dataclasses.replace(
                        gated, verdict="approved" if gated.verdict == "clean" else gated.verdict,
                        accepted_events=tuple(self.accepted[owner]))
            return False
        finally:
            shutil.rmtree(stage, ignore_errors=True)


def _module_owners(target: str) -> Dict[str, str]:
    """Top-level module -> the (canonical) distribution that ships it, from
    each ``.dist-info/RECORD`` in the staging directory."""
    from packaging.utils import canonicalize_name

    owners: Dict[str, str] = {}
    for entry in os.listdir(target):
        if not entry.endswith(".dist-info"):
            continue
        dist = canonicalize_name(entry[:-len(".dist-info")].rsplit("-", 1)[0])
        try:
            with open(os.path.join(target, entry, "RECORD"), encoding="utf-8") as handle:
                for line in handle:
                    top = line.split(",", 1)[0].split("/", 1)[0]
                    if top.endswith(".py"):
                        top = top[:-3]
                    owners.setdefault(top, dist)
        except OSError:
            continue
    return owners


def _top_level_modules(target: str) -> List[str]:
    out = set()
    for name in os.listdir(target):
        if name.endswith((".dist-info", ".data")) or name == "bin" or name.startswith(("_", ".")):
            continue
        if name.endswith(".py"):
            out.add(name[:-3])
        elif os.path.isdir(os.path.join(target, name)) and name.isidentifier():
            out.add(name)
    return sorted(out)


def start_pip(options: InstallOptions, env: Mapping[str, str], stdout: Optional[int] = None) -> "PipProcess":
    """Start the target's pip for ``options`` (:class:`pipguard.install.seam.PipProcess`)."""
    from pipguard.install.seam import PipProcess, pip_arguments, target_python

    return PipProcess(target_python(options.python), pip_arguments(options.pip_args, options.binary_only),
                      env, stdout)


def _warm_up(isolation: str) -> None:
    """Import what the first hook call and the gate need, and probe the host's
    planning facts, while pip starts: off the critical path of the first call.
    Synchronous (no thread): the sandboxes fork from this process."""
    from pipguard.sandbox import sandbox_user

    # a killed run's grants, undone while pip starts (every run does it too; this is an
    # install that may run no hook call at all)
    sandbox_user.replay_stale()
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


def _redacted(args: Sequence[str]) -> List[str]:
    """The command line for the report: a URL's credentials never reach it (CI uploads reports)."""
    from pipguard.install._seam.target import redact_credentials

    return redact_credentials(args)



def _fingerprint(path: str) -> Tuple[str, int, int]:
    """A wheel file as pip moves it (a rename, or a copy that keeps the times): name, size and
    modification time -- cheap, where hashing every built wheel would cost each build."""
    st = os.stat(path)
    return os.path.basename(path), st.st_size, st.st_mtime_ns


def _seen(event: Event) -> str:
    """One blocked attempt, as the messages show it."""
    from pipguard.install.approvals import normalize_target

    return f"{event.kind} {normalize_target(event.target)} ({event.rule})"


def _hosts(events: Sequence[Event]) -> Tuple[str, ...]:
    """Destinations of denied network attempts (names when pipguard knows them)."""
    out = []
    for e in events:
        if e.kind == "network":
            host, port = e.detail.get("host"), e.detail.get("port")
            out.append(f"{host}:{port}" if isinstance(host, str) and port else e.target)
    return tuple(dict.fromkeys(out))


def _problem_findings(result: "HookResult") -> Tuple["gate.Finding", ...]:
    from pipguard.gate import scan as gate

    return tuple(gate.Finding(result.call.package, "", p.severity, p.rule, p.path, None,
                              f"{result.call.hook}: {p.message}", p.path)
                 for p in result.problems)


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


def _stop(proc: subprocess.Popen) -> None:
    """Ctrl-C reached pip too (same process group); give it a moment to roll back."""
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
