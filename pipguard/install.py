"""``pipguard install --sandbox`` / ``pipguard sandbox``: the real pip, with
every PEP 517 hook call it makes in a sandbox of its own.

pip is trusted code; package code is not. pipguard runs the target
interpreter's own pip with the user's arguments (so resolution, options,
config files, ``PIP_*`` variables, hash checking, build isolation, editable
installs and install locations are pip's), and sits at the seam where pip
runs package code (:mod:`pipguard._seam.target` inside pip, :mod:`pipguard.seam`
here):

  1. every hook call (``get_requires_for_build_*``, ``prepare_metadata_*``,
     ``build_wheel``, ``build_editable``, ``build_sdist``) — in pip and in the
     pip subprocesses that fill build environments — runs in its own sandbox
     (:mod:`pipguard.hookcall`): its own tree and output only, no network;
     a blocked attempt or a bad result fails that call, and the install;
  2. pip builds every wheel before it installs any; there pip asks pipguard,
     which gates every wheel (:mod:`pipguard.gate`), optionally probes their
     imports in a sandbox, and answers install, stop (``sandbox``) or refuse;
  3. pip installs (installing a wheel runs no package code).

Nothing is installed unless every hook call was clean and every wheel passed.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple

from pipguard.errors import UsageError
from pipguard.files import sha256
from pipguard.policy import HostPort
from pipguard.report import Event, FileWritten, LayerStatus, NetworkAttempt, ProcessRecord, Report

if TYPE_CHECKING:  # imported where it scans: tarfile, zipfile, lzma... (~15 ms a start)
    from pipguard import gate
    from pipguard.hookcall import HookResult

Progress = Callable[[str], None]

#: gate severities that refuse an install
REFUSING_SEVERITIES = ("critical", "high")


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
    - ``allow_read``/``allow_write``: extra roots for every hook call.
    """

    pip_args: Tuple[str, ...]
    python: Optional[str] = None
    isolation: str = "auto"
    sandbox_only: bool = False
    binary_only: bool = False
    probe_imports: bool = False
    build_hosts: Tuple[HostPort, ...] = ()
    build_timeout: Optional[float] = None
    keep_env: Tuple[str, ...] = ()
    observe_reads: bool = True
    allow_read: Tuple[str, ...] = ()
    allow_write: Tuple[str, ...] = ()
    #: resource limits of each hook call, as Policy settings (``limit_memory``...); empty: defaults
    limits: Tuple[Tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Phase:
    name: str
    package: Optional[str]
    report: Report


@dataclass(frozen=True)
class PackageResult:
    name: str
    version: str
    artifact: str
    sha256: str
    from_sdist: bool
    verdict: str
    findings: Tuple[gate.Finding, ...] = ()
    events: Tuple[Event, ...] = ()


@dataclass(frozen=True)
class InstallResult:
    """Outcome of ``install``/``sandbox``: ``status`` is ``installed``,
    ``clean`` (sandbox mode, nothing installed), ``refused``, ``error`` or
    ``interrupted`` (SIGINT/SIGTERM: the running phase was stopped, nothing installed)."""

    command: Tuple[str, ...]
    status: str
    phases: Tuple[Phase, ...]
    packages: Tuple[PackageResult, ...]
    findings: Tuple[gate.Finding, ...]
    message: str = ""
    isolation: str = "auto"

    @property
    def exit_code(self) -> int:
        from pipguard import exitcodes

        return {"installed": exitcodes.OK, "clean": exitcodes.OK, "refused": exitcodes.REFUSED,
                "interrupted": exitcodes.INTERRUPTED}.get(self.status, exitcodes.ERROR)

    def combined(self) -> Report:
        """One run-style report over every phase (top-level events of all phases)."""
        events: List[Event] = []
        processes: List[ProcessRecord] = []
        network: List[NetworkAttempt] = []
        files: List[FileWritten] = []
        applied: List[str] = []
        unavailable: Dict[str, str] = {}
        dropped, timed_out = 0, False
        for phase in self.phases:
            r = phase.report
            for e in r.events:
                detail = dict(e.detail, phase=phase.name)
                if phase.package:
                    detail["package"] = phase.package
                events.append(dataclasses.replace(e, seq=len(events) + 1, detail=detail))
            processes += r.processes
            network += r.network
            files += r.files_written
            applied += [a for a in r.isolation.applied if a not in applied]
            unavailable.update(r.isolation.unavailable)
            dropped += r.events_dropped
            timed_out = timed_out or r.timed_out
        exit_code = {"installed": 0, "clean": 0, "refused": 1, "interrupted": 130}.get(self.status, 2)
        first = self.phases[0].report if self.phases else None
        return Report(
            command=self.command, exit_code=exit_code, timed_out=timed_out,
            isolation=LayerStatus(self.isolation, tuple(applied), unavailable),
            events=tuple(events), processes=tuple(processes), network=tuple(network),
            files_written=tuple(files), env_removed=first.env_removed if first else (),
            events_dropped=dropped, policy=first.policy if first else {},
            host=first.host if first else {}, cwd=first.cwd if first else os.getcwd(),
            started_at=first.started_at if first else 0.0,
            duration=round(sum(p.report.duration for p in self.phases), 4),
            error=self.message if self.status == "error" else None,
            tool_version=first.tool_version if first else "",
        )

    def to_json(self) -> dict:
        data = self.combined().to_json()
        data["verdict"] = {"installed": "clean", "clean": "clean", "refused": "blocked"}.get(
            self.status, "error")
        data["status"] = self.status
        data["message"] = self.message
        data["phases"] = [{"name": p.name, "package": p.package, "verdict": p.report.verdict,
                           "exit_code": p.report.exit_code, "duration": p.report.duration}
                          for p in self.phases]
        data["packages"] = [
            {"name": p.name, "version": p.version, "artifact": p.artifact, "sha256": p.sha256,
             "from_sdist": p.from_sdist, "verdict": p.verdict,
             "findings": [dataclasses.asdict(f) for f in p.findings],
             "events": [dataclasses.asdict(e) for e in p.events]}
            for p in self.packages]
        data["findings"] = [dataclasses.asdict(f) for f in self.findings]
        return data


class Installer:
    """Runs pip with the seam; ``options.sandbox_only`` installs nothing."""

    def __init__(self, options: InstallOptions, *, progress: Optional[Progress] = None,
                 env: Optional[Dict[str, str]] = None, pip_stdout: Optional[int] = None) -> None:
        """``pip_stdout``: a file descriptor for pip's standard output (None:
        this process's); the CLI sends it to stderr when stdout carries a report."""
        self.options = options
        python = options.python
        self.python = os.path.abspath(python) if python else sys.executable
        if not (os.path.isfile(self.python) and os.access(self.python, os.X_OK)):
            raise UsageError(f"--python {python}: not an executable interpreter")
        self.progress = progress or (lambda message: None)
        self.env = dict(os.environ if env is None else env)
        self.pip_stdout = pip_stdout
        self.phases: List[Phase] = []
        self.hook_results: List[HookResult] = []
        self.gated: Dict[str, PackageResult] = {}
        self.refusal: Optional[str] = None   # why pipguard refused (findings): exit 1
        self.error: Optional[str] = None     # why pipguard could not go on: exit 2
        self.gate_answered = False
        mode = "sandbox" if options.sandbox_only else "install"
        self.command = ("pipguard", mode, *(("--sandbox",) if mode == "install" and not options.binary_only
                                            else ()), *_redacted(options.pip_args))

    # ------------------------------------------------------------------ run
    def run(self) -> InstallResult:
        from pipguard.plan import precompile_hook
        from pipguard.seam import TARGET_SCRIPT, SeamServer

        precompile_hook(self.python)  # the hook calls' Pythons are the target's version
        pip_args = list(self.options.pip_args)
        if self.options.binary_only:
            pip_args += ["--only-binary", ":all:"]
        if self.options.sandbox_only and not any(a in ("-q", "--quiet") for a in pip_args):
            pass
        from pipguard._seam.target import move_credentials

        # credentials in -i/--extra-index-url/-f URLs: into pip's environment, not its argv
        pip_args, env = move_credentials(pip_args, self.env)
        server = SeamServer()
        env = dict(env, PIPGUARD_SEAM=server.env_value)
        proc = None
        try:
            proc = subprocess.Popen([self.python, TARGET_SCRIPT, "pip", "install", *pip_args], env=env,
                                    stdout=self.pip_stdout)
            server.serve(proc.pid, {"hook": self._on_hook, "gate": self._on_gate,
                                    "refuse": self._on_refuse})
            returncode = proc.wait()
        except KeyboardInterrupt:
            if proc is not None:
                _stop(proc)
            return self._result("interrupted", "interrupted; pip was stopped (nothing is installed "
                                "unless pip had already started installing the gated wheels)")
        finally:
            server.close()
        return self._finish(returncode)

    def _finish(self, returncode: int) -> InstallResult:
        if self.refusal:
            return self._result("refused", f"refused: {self.refusal}. Nothing was installed.")
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
        return self._result("installed", "installed")

    def _result(self, status: str, message: str) -> InstallResult:
        packages = dict(self.gated)
        for name in dict.fromkeys(r.call.package for r in self.hook_results):
            if name in packages:
                continue  # gated: its verdict includes its hook calls
            # a package that never reached the gate: its hook calls decide
            calls = [r for r in self.hook_results if r.call.package == name]
            packages[name] = PackageResult(
                name, calls[-1].call.version, "", "", True,
                "blocked" if any(r.refusing for r in calls) else "clean",
                tuple(f for r in calls for f in _problem_findings(r)),
                tuple(e for r in calls for e in r.report.blocked_events))
        all_findings = tuple(f for p in packages.values() for f in p.findings)
        return InstallResult(self.command, status, tuple(self.phases), tuple(packages.values()),
                             all_findings, message, self.options.isolation)

    # ------------------------------------------------------------ handlers
    def _on_refuse(self, request: dict, fds: List[int]) -> dict:
        reason = str(request.get("reason", "refused"))[:2000]
        self.error = self.error or f"pipguard cannot do this install safely: {reason}"
        return {}

    def _on_hook(self, request: dict, fds: List[int]) -> dict:
        from pipguard import hookcall

        try:
            call = hookcall.plan_call(request.get("argv") or [], str(request.get("cwd") or "/"),
                                      dict(request.get("env") or {}))
        except hookcall.HookCallRefused as exc:
            self.error = self.error or f"pipguard refused a hook call: {exc}"
            return {"exit": 1, "message": f"pipguard: {exc}"}
        who = f"{call.package} {call.version}".strip()
        if self.options.binary_only:
            self.refusal = self.refusal or (f"{who} needs its build backend to run ({call.hook}); "
                                            "without --sandbox no package code runs: use "
                                            "'pipguard install --sandbox'")
            return {"exit": 1, "message": f"pipguard: {self.refusal}"}
        if self.refusal:  # one refusal decides the install: run no more package code
            return {"exit": 1, "message": "pipguard: the install is already refused; not running "
                                          f"{call.hook} of {who}"}
        self.progress(f"{who}: {call.hook} (sandboxed)")
        result = self._run_call(call, fds)
        self.hook_results.append(result)
        self.phases.append(Phase(call.hook, call.package, result.report))
        status = _shell_status(result.report)
        if result.refusing:
            what = [f"{e.kind} {e.target} ({e.rule})" for e in result.report.blocked_events[:5]]
            what += [f"{p.rule}: {p.message} {p.path}".strip() for p in result.problems[:5]]
            self.refusal = f"{who}: {call.hook} attempted what a build may not ({'; '.join(what)})"
            self.progress(f"{who}: {call.hook} BLOCKED")
            return {"exit": status or 1, "message": "pipguard: " + self.refusal + " — the install "
                    "is refused; see pipguard's report"}
        self.progress(f"{who}: {call.hook} ok ({result.report.duration:.1f} s)")
        message = None
        if result.report.timed_out:
            message = f"pipguard: {call.hook} of {who} exceeded --build-timeout"
        return {"exit": status, "message": message}

    def _run_call(self, call, fds: Sequence[int]) -> "HookResult":
        from pipguard import hookcall
        from pipguard.sandbox import run

        policy = hookcall.sandbox_policy(
            call, isolation=self.options.isolation, build_hosts=self.options.build_hosts,
            timeout=self.options.build_timeout, keep_env=self.options.keep_env,
            observe_reads=self.options.observe_reads, extra_read=self.options.allow_read,
            extra_write=self.options.allow_write, limits=dict(self.options.limits))
        with _stdio(fds):
            report = run(list(call.argv), policy, cwd=call.cwd, env=call.env)
        if report.error and report.error.startswith("interrupted"):
            self.phases.append(Phase(call.hook, call.package, report))
            raise KeyboardInterrupt  # the sandbox is gone; stop pip too
        return hookcall.HookResult(call, report, hookcall.check_result(call, report.exit_code == 0))

    def _on_gate(self, request: dict, fds: List[int]) -> dict:
        from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

        from pipguard import gate

        self.gate_answered = True
        role = request.get("role")
        if self.refusal:
            return {"decision": "refuse", "message": f"pipguard: refused: {self.refusal}"}
        wheels = request.get("wheels") or []
        results: List[PackageResult] = []
        owned = self._ownership(request) if role == "top" else {}
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
                findings = tuple(gate.scan_wheel(path, editable_project=project if isinstance(project, str)
                                                 else None))
            except Exception as exc:  # a corrupt archive is a finding of its own kind: refuse
                self.error = f"{name}: the wheel cannot be read: {exc}"
                return {"decision": "refuse", "message": "pipguard: " + self.error}
            findings += tuple(owned.get(name, ()))
            events = tuple(e for r in calls for e in r.report.blocked_events)
            refusing = [f for f in findings if f.severity in REFUSING_SEVERITIES]
            verdict = "blocked" if events else ("gate" if refusing else "clean")
            results.append(PackageResult(name, str(version), os.path.basename(path), sha256(path),
                                         any(r.call.hook.startswith("build_") for r in calls), verdict,
                                         findings, events))
        if role == "top":
            for result in results:
                self.gated[result.name] = result
        refused = [r for r in results if r.verdict != "clean"]
        if refused:
            where = " (a build requirement)" if role != "top" else ""
            self.refusal = "; ".join(f"{r.name} {r.version}{where}: {_why(r)}" for r in refused)
            return {"decision": "refuse", "message": f"pipguard: refused: {self.refusal}"}
        if role != "top":
            return {"decision": "install"}  # a build environment: gated, and needed by the build
        for result in results:
            self.progress(f"{result.name} {result.version}: gate passed")
        if self.options.probe_imports and wheels:
            why = self._probe([w["path"] for w in wheels])
            if why:
                self.refusal = why
                return {"decision": "refuse", "message": f"pipguard: refused: {why}"}
        if self.options.sandbox_only:
            return {"decision": "stop"}
        return {"decision": "install"}

    def _ownership(self, request: dict) -> Dict[str, List["gate.Finding"]]:
        """Findings of wheels that would overwrite files they do not own, by
        package. The layout is pip's own scheme (sent by the seam), or the
        ``--target`` directory the files end up in."""
        from pipguard import gate

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

    def _probe(self, wheels: Sequence[str]) -> Optional[str]:
        """Import each new top-level module in the sandbox, from a staged copy."""
        from pipguard.sandbox import run

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
                return "staging wheels for the import probe failed: " + proc.stdout.strip()[-300:]
            work = os.path.join(stage, "work")
            os.mkdir(work)
            for module in _top_level_modules(target):
                self.progress(f"probing import {module}")
                from pipguard.policy import Policy

                policy = Policy(isolation=self.options.isolation, allow_read=(target,),
                                keep_env=self.options.keep_env, observe_reads=self.options.observe_reads,
                                timeout=self.options.build_timeout)
                code = f"import sys; sys.path.insert(0, {target!r}); import {module}"
                # the stage is read-only to the probe (and thrown away): without this,
                # Python's import system tries to cache bytecode there, a refused write
                probe_env = dict(env, PYTHONDONTWRITEBYTECODE="1")
                report = run([self.python, "-c", code], policy, cwd=work, env=probe_env)
                self.phases.append(Phase("probe", module, report))
                if report.verdict == "blocked":
                    return f"importing {module} attempted something blocked"
            return None
        finally:
            shutil.rmtree(stage, ignore_errors=True)


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


def _redacted(args: Sequence[str]) -> List[str]:
    """The command line for the report: a URL's credentials never reach it (CI uploads reports)."""
    from pipguard._seam.target import redact_credentials

    return redact_credentials(args)


def _why(result: PackageResult) -> str:
    if result.events:
        return f"{len(result.events)} blocked attempt(s) in its build"
    refusing = [f for f in result.findings if f.severity in REFUSING_SEVERITIES]
    return "gate: " + ", ".join(sorted({f.rule for f in refusing}))


def _problem_findings(result: "HookResult") -> Tuple["gate.Finding", ...]:
    from pipguard import gate

    return tuple(gate.Finding(result.call.package, "", "critical", p.rule, p.path, None,
                              f"{result.call.hook}: {p.message}", p.path)
                 for p in result.problems)


def _shell_status(report: Report) -> int:
    from pipguard import exitcodes

    return exitcodes.from_wait_status(report.exit_code, report.timed_out)


class _stdio:
    """Make ``fds`` (the hook client's stdin, stdout, stderr) this process's
    0, 1, 2 while the sandbox starts, so the sandboxed call writes into the
    pipe pip reads (pip shows a failed build's output, as without pipguard)."""

    def __init__(self, fds: Sequence[int]) -> None:
        self.fds = list(fds)[:3]
        self.saved: List[int] = []

    def __enter__(self) -> None:
        if len(self.fds) != 3:
            return
        sys.stdout.flush()
        sys.stderr.flush()
        self.saved = [os.dup(n) for n in (0, 1, 2)]
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)  # a hook reads nothing: pip gives it no input either
        os.close(devnull)
        os.dup2(self.fds[1], 1)
        os.dup2(self.fds[2], 2)

    def __exit__(self, *exc) -> None:
        if not self.saved:
            return
        sys.stdout.flush()
        sys.stderr.flush()
        for n, fd in enumerate(self.saved):
            os.dup2(fd, n)
            os.close(fd)


def _stop(proc: subprocess.Popen) -> None:
    """Ctrl-C reached pip too (same process group); give it a moment to roll back."""
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
