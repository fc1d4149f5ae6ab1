"""``pipguard install --sandbox`` / ``pipguard sandbox``: pip install where no
package code runs outside the sandbox and the target environment changes only
if everything passed.

Phases (each sandboxed run has its own evidence):
  1. resolve + download  (``pip download`` in the sandbox: resolving runs sdist
     metadata hooks; network only when an index is used)
  2. static gate         (every downloaded artifact, no code runs)
  3. build               (one sandboxed, offline ``pip wheel`` per sdist)
  4. gate on evidence    (any blocked attempt or finding: refuse)
  5. probe imports       (optional: import new modules, sandboxed, from a staged copy)
  6. install             (``pip install`` of the wheels only: installing a wheel runs no package code)
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple

from pipguard.files import sha256
from pipguard.pipwarm import WarmPip
from pipguard.plan import precompile_hook
from pipguard.errors import PipError, UsageError
from pipguard.policy import Policy
from pipguard.report import Event, FileWritten, LayerStatus, NetworkAttempt, ProcessRecord, Report

if TYPE_CHECKING:  # imported where it scans: tarfile, zipfile, lzma... (~15 ms a start)
    from pipguard import gate

Progress = Callable[[str], None]


def _import_gate() -> None:
    from pipguard import gate  # noqa: F401


#: gate severities that refuse an install
REFUSING_SEVERITIES = ("critical", "high")


@dataclass(frozen=True)
class PipOptions:
    """The pip install options pipguard passes through. Empty means pip's default."""

    requirements: Tuple[str, ...] = ()      # PKG specifiers
    requirement_files: Tuple[str, ...] = () # -r
    constraint_files: Tuple[str, ...] = ()  # -c
    index_url: Optional[str] = None
    extra_index_urls: Tuple[str, ...] = ()
    find_links: Tuple[str, ...] = ()
    no_index: bool = False
    no_binary: Tuple[str, ...] = ()
    only_binary: Tuple[str, ...] = ()
    pre: bool = False
    upgrade: bool = False
    no_deps: bool = False
    require_hashes: bool = False
    no_cache_dir: bool = False
    quiet: int = 0
    verbose: int = 0

    def __post_init__(self) -> None:
        if not self.requirements and not self.requirement_files:
            raise UsageError("nothing to install", hint="name packages, or use -r FILE")
        for path in self.requirement_files + self.constraint_files:
            if not os.path.isfile(path):
                raise UsageError(f"requirements file not found: {path}")
        for req in self.requirements:
            if not req.strip() or req.startswith("-"):
                raise UsageError(f"not a requirement: {req!r}")

    def resolve_args(self) -> List[str]:
        """Options shared by download and install (selection and sources)."""
        args: List[str] = []
        for path in self.requirement_files:
            args += ["-r", os.path.abspath(path)]
        for path in self.constraint_files:
            args += ["-c", os.path.abspath(path)]
        args += self.source_args()
        for value in self.no_binary:
            args += ["--no-binary", value]
        for value in self.only_binary:
            args += ["--only-binary", value]
        if self.pre:
            args.append("--pre")
        if self.no_deps:
            args.append("--no-deps")
        if self.require_hashes:
            args.append("--require-hashes")
        args += ["-q"] * self.quiet + ["-v"] * self.verbose
        return args + list(self.requirements)

    def source_args(self) -> List[str]:
        args: List[str] = []
        if self.index_url:
            args += ["--index-url", self.index_url]
        for url in self.extra_index_urls:
            args += ["--extra-index-url", url]
        for link in self.find_links:
            args += ["--find-links", _abs_if_path(link)]
        if self.no_index:
            args.append("--no-index")
        return args

    def local_paths(self) -> List[str]:
        """Local files and dirs the sandbox must be able to read."""
        paths = [os.path.abspath(p) for p in self.requirement_files + self.constraint_files]
        paths += [_abs_if_path(link) for link in self.find_links if not _is_url(link)]
        paths += [os.path.abspath(r) for r in self.requirements if os.path.exists(r)]
        return [p for p in paths if os.path.exists(p)]

    def uses_network(self) -> bool:
        return not self.no_index or any(_is_url(link) for link in self.find_links)


DEFAULT_INDEX = "https://pypi.org/simple"
PYPI_FILES = "https://files.pythonhosted.org"


def pip_config(python: str, env: Dict[str, str]) -> Dict[str, str]:
    """The user's pip configuration as pip reads it (global, user, site, then
    PIP_CONFIG_FILE; ``os.devnull`` there means none at all), as keys like
    ``global.index-url``. Parsed here rather than by running ``pip config``:
    cheaper, and no code of the target environment runs."""
    import configparser

    forced = env.get("PIP_CONFIG_FILE")
    if forced == os.devnull:
        return {}
    home = env.get("HOME") or os.path.expanduser("~")
    xdg_dirs = (env.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":")
    xdg_home = env.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    prefix = os.path.dirname(os.path.dirname(os.path.abspath(python)))
    files = [os.path.join(d, "pip", "pip.conf") for d in reversed(xdg_dirs)] + ["/etc/pip.conf"]
    files += [os.path.join(home, ".pip", "pip.conf"), os.path.join(xdg_home, "pip", "pip.conf"),
              os.path.join(prefix, "pip.conf")]
    if forced:
        files.append(forced)
    out: Dict[str, str] = {}
    for path in files:
        parser = configparser.RawConfigParser()
        try:
            parser.read(path)
        except (configparser.Error, OSError, UnicodeDecodeError):
            continue
        for section in parser.sections():
            for key, value in parser.items(section):
                out[f"{section}.{key.replace('_', '-')}"] = " ".join(value.split())
    return out


def _pip_setting(name: str, env: Dict[str, str], config: Dict[str, str]) -> Optional[str]:
    """One pip option as pip would take it: PIP_NAME, else the config files."""
    env_name = "PIP_" + name.upper().replace("-", "_")
    if env.get(env_name):
        return env[env_name]
    for section in ("install", "download", "global"):
        if f"{section}.{name}" in config:
            return config[f"{section}.{name}"]
    return None


def final_pip_env(env: Dict[str, str], config: Dict[str, str]) -> Dict[str, str]:
    """The environment of the unsandboxed pip that installs the verified wheels.

    No ``PIP_*`` variable and no config file reaches it: either could add a
    source (``find-links``: pip would pick a more specific wheel of the same
    version from there, unverified), a requirement or an editable project
    (package code running outside the sandbox), or another install location.
    Only ``break-system-packages`` is carried over: without it an externally
    managed interpreter (a distribution's Python in a CI image) refuses."""
    out = {k: v for k, v in env.items() if not k.startswith("PIP_")}
    out["PIP_CONFIG_FILE"] = os.devnull
    value = _pip_setting("break-system-packages", env, config)
    if value is not None and value.lower() in ("1", "true", "yes", "on"):
        out["PIP_BREAK_SYSTEM_PACKAGES"] = "1"
    return out


def effective_sources(options: "PipOptions", env: Dict[str, str], config: Dict[str, str]) -> "PipOptions":
    """Fold pip's environment variables and config files into explicit options,
    so the sandboxed pip (which reads no config) sees the same sources, and so
    pipguard knows which hosts the index proxy must allow."""

    def setting(name: str) -> Optional[str]:
        return _pip_setting(name, env, config)

    def many(name: str) -> Tuple[str, ...]:
        value = setting(name)
        return tuple(value.split()) if value else ()

    no_index = options.no_index or (setting("no-index") or "").lower() in ("1", "true", "yes", "on")
    return dataclasses.replace(
        options,
        index_url=options.index_url or setting("index-url"),
        extra_index_urls=options.extra_index_urls or many("extra-index-url"),
        find_links=options.find_links or many("find-links"),
        no_index=no_index,
    )


def index_destinations(options: "PipOptions") -> Tuple[str, ...]:
    """URLs of every index and find-links page the resolve phase may fetch."""
    urls: List[str] = []
    if not options.no_index:
        index = options.index_url or DEFAULT_INDEX
        urls.append(index)
        if "pypi.org" in index:
            urls.append(PYPI_FILES)  # PyPI serves files from here
        urls += list(options.extra_index_urls)
    urls += [link for link in options.find_links if _is_url(link)]
    return tuple(urls)


def _is_url(text: str) -> bool:
    return bool(re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", text)) and not text.startswith("file:")


def _abs_if_path(link: str) -> str:
    if _is_url(link):
        return link
    if link.startswith("file://"):
        return link[len("file://"):]
    return os.path.abspath(link)


@dataclass(frozen=True)
class Artifact:
    path: str
    name: str
    version: str
    sha256: str
    from_sdist: bool = False
    built_from: Optional[str] = None  # for wheels built here: the sdist's file name


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


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_artifact(path: str) -> Tuple[str, str, bool]:
    """(name, version, is_sdist) from a wheel or sdist file name."""
    base = os.path.basename(path)
    if base.endswith(".whl"):
        parts = base[:-4].split("-")
        if len(parts) < 5:
            raise PipError(f"not a valid wheel file name: {base}")
        return _canonical(parts[0]), parts[1], False
    for ext in (".tar.gz", ".zip", ".tar.bz2", ".tgz", ".tar"):
        if base.endswith(ext):
            stem = base[: -len(ext)]
            name, _, version = stem.rpartition("-")
            if not name:
                raise PipError(f"cannot tell name and version of {base}")
            return _canonical(name), version, True
    raise PipError(f"unknown artifact type: {base}")


class Installer:
    """Runs the phases. ``sandbox_only`` stops before installing."""

    def __init__(self, options: PipOptions, *, python: Optional[str] = None,
                 isolation: str = "auto", build_timeout: Optional[float] = None,
                 probe_imports: bool = False, sandbox_only: bool = False,
                 progress: Optional[Progress] = None, env: Optional[Dict[str, str]] = None,
                 keep_env: Sequence[str] = (), observe_reads: bool = True) -> None:
        self.options = options
        self.python = os.path.abspath(python) if python else sys.executable
        if not (os.path.isfile(self.python) and os.access(self.python, os.X_OK)):
            raise UsageError(f"--python {python}: not an executable interpreter")
        self.isolation = isolation
        self.build_timeout = build_timeout
        self.probe_imports = probe_imports
        self.sandbox_only = sandbox_only
        self.progress = progress or (lambda message: None)
        self.env = dict(os.environ if env is None else env)
        self.observe_reads = observe_reads
        self.keep_env = tuple(keep_env) + ("PIP_CONFIG_FILE",)
        config = pip_config(self.python, self.env)
        self.options = effective_sources(options, self.env, config)
        self.final_env = final_pip_env(self.env, config)
        self.phases: List[Phase] = []
        self._warm: Optional[WarmPip] = None
        self.command = ("pipguard", "sandbox" if sandbox_only else "install", "--sandbox",
                        *options.resolve_args())

    # ------------------------------------------------------------------ runs
    def _sandboxed(self, name: str, package: Optional[str], argv: Sequence[str], cwd: str,
                   *, hosts: Sequence[str] = (), read: Sequence[str] = (), write: Sequence[str] = ()) -> Report:
        from pipguard.policy import HostPort
        from pipguard.proxy import destinations_from_urls
        from pipguard.sandbox import run

        allow = tuple(HostPort(d.host, d.port) for d in destinations_from_urls(hosts))
        policy = Policy(
            isolation=self.isolation, allow_hosts=allow,
            allow_read=tuple(dict.fromkeys(read)), allow_write=tuple(dict.fromkeys(write)),
            timeout=self.build_timeout, keep_env=self.keep_env, observe_reads=self.observe_reads,
        )
        # The sandboxed pip reads no config file: its sources are explicit.
        # While its first process confines itself, import the gate (used next).
        report = run(list(argv), policy, cwd=cwd, env=dict(self.env, PIP_CONFIG_FILE=os.devnull),
                     meanwhile=_import_gate)
        self.phases.append(Phase(name, package, report))
        if report.error and report.error.startswith("interrupted"):
            raise KeyboardInterrupt  # the sandbox is already gone; stop before the next phase
        return report

    def _pip(self, *args: str) -> List[str]:
        quiet = [] if self.options.verbose else ["-q"]
        return [self.python, "-m", "pip", "--disable-pip-version-check", "--no-input",
                "--no-cache-dir", *quiet, *args]

    # ---------------------------------------------------------------- phases
    def run(self) -> InstallResult:
        stage = tempfile.mkdtemp(prefix="pipguard-install-")
        # the build's Pythons are the target's version: give them the hook's bytecode
        precompile_hook(self.python)
        # The final, unsandboxed pip imports itself while the sandbox builds.
        self._warm = None if self.sandbox_only else WarmPip(self.python, self.final_env)
        try:
            return self._run(stage)
        except KeyboardInterrupt:  # between phases; inside one, the supervisor reports it
            return self._result("interrupted", message="interrupted; nothing was installed")
        finally:
            if self._warm is not None:
                self._warm.close()
            shutil.rmtree(stage, ignore_errors=True)

    def _result(self, status: str, packages=(), findings=(), message="") -> InstallResult:
        return InstallResult(self.command, status, tuple(self.phases), tuple(packages),
                             tuple(findings), message, self.isolation)

    def _run(self, stage: str) -> InstallResult:
        download = os.path.join(stage, "download")
        wheels = os.path.join(stage, "wheels")
        work = os.path.join(stage, "work")
        for d in (download, wheels, work):
            os.mkdir(d)
        local = self.options.local_paths()

        if not self.options.uses_network():
            return self._run_local(stage, work, wheels, local)

        # 1. resolve + download, sandboxed: resolution runs sdist metadata hooks.
        self.progress("resolving and downloading")
        report = self._sandboxed(
            "download", None,
            self._pip("download", "--dest", download, *self.options.resolve_args()),
            work, hosts=index_destinations(self.options), read=local, write=[download])
        if report.verdict == "blocked":
            return self._refuse("package code misbehaved while pip resolved dependencies")
        if report.exit_code != 0:
            return self._result("error", message=self._resolve_failure("pip download", report))
        artifacts = self._artifacts(download)
        if not artifacts:
            return self._result("error", message="pip downloaded nothing")

        # 1b. the build phase is offline: fetch every sdist's static build
        # requirements (as wheels) now, while the index is reachable.
        sdists = [a for a in artifacts if a.from_sdist]
        build_reqs = sorted({r for a in sdists for r in build_requirements(a.path)})
        if build_reqs and self.options.uses_network():
            self.progress("downloading build requirements")
            report = self._sandboxed(
                "build-requirements", None,
                self._pip("download", "--only-binary", ":all:", "--dest", download,
                          *self.options.source_args(), *build_reqs),
                work, hosts=index_destinations(self.options), read=local, write=[download])
            if report.verdict == "blocked":
                return self._refuse("something was blocked while downloading build requirements")
            if report.exit_code != 0:
                return self._result("error", message=_pip_failure("downloading build requirements", report))
            known = {a.path for a in artifacts}
            self.build_only = [a for a in self._artifacts(download) if a.path not in known]
        else:
            self.build_only = []

        # 2. static gate on everything downloaded.
        findings: Dict[str, List[gate.Finding]] = {}
        for art in artifacts:
            self.progress(f"{art.name} {art.version}: scanning")
            findings[art.path] = list(self._scan(art))
        for art in self.build_only:
            # build requirements are not installed, but run in the build: gate them too
            findings[art.path] = list(self._scan(art))

        # 3. build every sdist, one offline sandbox each.
        built: Dict[str, Artifact] = {}
        for art in artifacts:
            if not art.from_sdist:
                continue
            self.progress(f"{art.name} {art.version}: building")
            out = os.path.join(wheels, art.name)
            os.mkdir(out)
            build_dir = os.path.join(work, "build-" + art.name)
            os.mkdir(build_dir)
            report = self._sandboxed(
                "build", art.name,
                self._pip("wheel", "--no-deps", "--no-index", "--find-links", download,
                          *[a for link in self.options.find_links if not _is_url(link)
                            for a in ("--find-links", _abs_if_path(link))],
                          "--wheel-dir", out, art.path),
                build_dir, read=[download, *local], write=[out])
            if report.verdict == "blocked":
                self.progress(f"{art.name} {art.version}: BLOCKED")
                continue
            if report.exit_code != 0:
                return self._result("error", message=_pip_failure(f"building {art.name}", report))
            produced = [os.path.join(out, f) for f in os.listdir(out) if f.endswith(".whl")]
            if len(produced) != 1:
                return self._result("error", message=f"building {art.name} produced {len(produced)} wheels")
            wheel = produced[0]
            built[art.path] = Artifact(wheel, art.name, art.version, sha256(wheel), True,
                                       os.path.basename(art.path))
            findings[wheel] = list(self._scan(built[art.path]))

        packages = self._package_results(artifacts, built, findings)
        all_findings = [f for fs in findings.values() for f in fs]
        tooling = [f for a in self.build_only for f in findings.get(a.path, [])
                   if f.severity in REFUSING_SEVERITIES]
        if tooling and all(p.verdict == "clean" for p in packages):
            return self._refuse("a build requirement failed the gate: "
                                + ", ".join(sorted({f.package for f in tooling})), packages, all_findings)
        installables = [built[a.path].path if a.from_sdist else a.path for a in artifacts]
        return self._finish(stage, packages, all_findings, installables)

    def _run_local(self, stage: str, work: str, wheels: str, local: List[str]) -> InstallResult:
        """Every source is local: resolve and build in ONE sandboxed ``pip wheel``
        run with no network at all (one build environment per sdist instead of
        two; see docs/performance.md). Evidence is attributed to packages by
        the build directories pip names after them."""
        self.progress("resolving and building (offline)")
        report = self._sandboxed(
            "build", None, self._pip("wheel", "--wheel-dir", wheels, *self.options.resolve_args()),
            work, read=local, write=[wheels])
        produced = sorted(os.path.join(wheels, f) for f in os.listdir(wheels) if f.endswith(".whl"))
        shipped = {f for d in self.options.find_links if not _is_url(d) and os.path.isdir(_abs_if_path(d))
                   for f in os.listdir(_abs_if_path(d))}
        artifacts = []
        for path in produced:
            name, version, _ = parse_artifact(path)
            artifacts.append(Artifact(path, name, version, sha256(path),
                                      os.path.basename(path) not in shipped))
        if report.verdict == "blocked":
            packages = [PackageResult(a.name, a.version, os.path.basename(a.path), a.sha256,
                                      a.from_sdist, "blocked" if events else "clean", (), events)
                        for a in artifacts for events in [_attributed(report.blocked_events, a.name)]]
            blamed = [p.name for p in packages if p.verdict == "blocked"] or ["(unattributed)"]
            return self._refuse("blocked attempts while building " + ", ".join(blamed), packages)
        if report.exit_code != 0:
            return self._result("error", message=self._resolve_failure("pip wheel", report))
        findings = {a.path: list(self._scan(a)) for a in artifacts}
        packages = [PackageResult(a.name, a.version, os.path.basename(a.path), a.sha256, a.from_sdist,
                                  "gate" if any(f.severity in REFUSING_SEVERITIES for f in findings[a.path])
                                  else "clean", tuple(findings[a.path]), ())
                    for a in artifacts]
        return self._finish(stage, packages, [f for fs in findings.values() for f in fs],
                            [a.path for a in artifacts])

    def _finish(self, stage: str, packages: List[PackageResult], all_findings: List[gate.Finding],
                installables: List[str]) -> InstallResult:
        refused = [p for p in packages if p.verdict != "clean"]
        if refused:
            return self._refuse("; ".join(f"{p.name}: {p.verdict}" for p in refused), packages,
                                all_findings)
        if self.probe_imports:
            verdict = self._probe(stage, installables)
            if verdict is not None:
                return self._refuse(verdict, packages, all_findings)
        if self.sandbox_only:
            for p in packages:
                self.progress(f"{p.name} {p.version}: ok")
            return self._result("clean", packages, all_findings, "observed clean; nothing installed")
        self.progress("installing")
        # By name from a folder of exactly the verified artifacts, not by path:
        # a path would be recorded as the origin (direct_url.json), and
        # ``pip freeze`` would then print "NAME @ file:///tmp/...whl".
        folder = os.path.join(stage, "verified")
        by_name, wheels = self._by_name(installables, folder)
        args = self._pip("install", "--no-deps", "--no-index", "--no-build-isolation",
                         *(["--upgrade"] if self.options.upgrade else []), *by_name)[3:]
        try:
            assert self._warm is not None
            returncode, output = self._warm.run(args, wheels)
        except KeyboardInterrupt:
            return self._result("interrupted", packages, all_findings,
                                "interrupted during the final pip install of verified wheels: pip "
                                "rolls back what it can; check the environment")
        if returncode != 0:
            tail = output.strip().splitlines()[-1:] or [""]
            return self._result("error", packages, all_findings,
                                "pip install of the verified wheels failed: " + tail[0])
        for p in packages:
            self.progress(f"{p.name} {p.version}: installed")
        return self._result("installed", packages, all_findings, "installed")

    @staticmethod
    def _by_name(installables: Sequence[str], folder: str
                 ) -> Tuple[List[str], List[Tuple[str, str, str]]]:
        """pip arguments installing exactly ``installables`` by NAME==VERSION
        from ``folder``, which gets hard links (or copies) of them and nothing
        else; and the same as (name, version, path in folder) for WarmPip."""
        os.makedirs(folder, exist_ok=True)
        args = ["--find-links", os.path.abspath(folder)]
        wheels = []
        for path in installables:
            target = os.path.join(folder, os.path.basename(path))
            try:
                os.link(path, target)
            except OSError:
                shutil.copy2(path, target)
            name, version, _sdist = parse_artifact(path)
            args.append(f"{name}=={version}")
            wheels.append((name, version, os.path.abspath(target)))
        return args, wheels

    def _resolve_failure(self, what: str, report: Report) -> str:
        message = _pip_failure(what, report)
        if ":all:" in self.options.only_binary:
            message += ("; without --sandbox only wheels are allowed: a package available only "
                        "as an sdist needs 'pipguard install --sandbox'")
        return message

    def _refuse(self, why: str, packages=(), findings=()) -> InstallResult:
        return self._result("refused", packages, findings,
                            f"refused: {why}. Nothing was installed. No flag overrides a blocked "
                            "runtime attempt: review the evidence, then fix or drop the package.")

    def _artifacts(self, download: str) -> List[Artifact]:
        out = []
        for name in sorted(os.listdir(download)):
            path = os.path.join(download, name)
            pkg, version, is_sdist = parse_artifact(path)
            out.append(Artifact(path, pkg, version, sha256(path), is_sdist))
        return out

    def _scan(self, art: Artifact) -> Sequence[gate.Finding]:
        from pipguard import gate

        if art.path.endswith(".whl"):
            return gate.scan_wheel(art.path)
        return gate.scan_sdist(art.path)

    def _package_results(self, artifacts, built, findings) -> List[PackageResult]:
        results = []
        for art in artifacts:
            events: Tuple[Event, ...] = ()
            verdict = "clean"
            if art.from_sdist:
                phase = next((p for p in self.phases if p.name == "build" and p.package == art.name), None)
                if phase is not None:
                    events = phase.report.blocked_events
                    if phase.report.verdict == "blocked":
                        verdict = "blocked"
            own = list(findings.get(art.path, []))
            if art.path in built:
                own += findings.get(built[art.path].path, [])
            if verdict == "clean" and any(f.severity in REFUSING_SEVERITIES for f in own):
                verdict = "gate"
            results.append(PackageResult(art.name, art.version, os.path.basename(art.path), art.sha256,
                                         art.from_sdist, verdict, tuple(own), events))
        return results

    def _probe(self, stage: str, wheels: Sequence[str]) -> Optional[str]:
        target = os.path.join(stage, "probe")
        proc = subprocess.run(self._pip("install", "--no-deps", "--no-index", "--target", target,
                                        "-q", *wheels), env=self.final_env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            raise PipError("staging wheels for the import probe failed: " + proc.stdout.strip()[-300:])
        modules = sorted({n[:-3] if n.endswith(".py") else n for n in os.listdir(target)
                          if not n.endswith((".dist-info", ".data")) and n != "bin"
                          and not n.startswith(("_", ".")) and (n.endswith(".py") or os.path.isdir(os.path.join(target, n)))})
        for module in modules:
            self.progress(f"probing import {module}")
            code = f"import sys; sys.path.insert(0, {target!r}); import {module}"
            report = self._sandboxed("probe", module, [self.python, "-c", code],
                                     os.path.join(stage, "work"), read=[target])
            if report.verdict == "blocked":
                return f"importing {module} attempted something blocked"
        return None


_REQUIRES_RE = re.compile(r"^\s*requires\s*=\s*\[(.*?)\]", re.S | re.M)
_BACKEND_RE = re.compile(r"^\s*build-backend\s*=\s*[\"']([^\"']+)[\"']", re.M)


def build_requirements(sdist: str) -> List[str]:
    """The static ``[build-system] requires`` of an sdist (read, never run).
    PEP 517's default when absent: setuptools and wheel."""
    import tarfile
    import zipfile

    text = None
    try:
        if sdist.endswith(".zip"):
            with zipfile.ZipFile(sdist) as zf:
                names = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith("/pyproject.toml")]
                text = zf.read(names[0]).decode("utf-8", "replace") if names else None
        else:
            with tarfile.open(sdist) as tf:
                for member in tf:
                    if member.isfile() and member.name.count("/") == 1 and member.name.endswith("/pyproject.toml"):
                        handle = tf.extractfile(member)
                        text = handle.read().decode("utf-8", "replace") if handle else None
                        break
    except (OSError, tarfile.TarError, zipfile.BadZipFile):
        return []
    if not text or "[build-system]" not in text:
        return ["setuptools>=40.8.0", "wheel"]
    section = text.split("[build-system]", 1)[1].split("\n[", 1)[0]
    found = _REQUIRES_RE.search(section)
    reqs = re.findall(r"[\"']([^\"']+)[\"']", found.group(1)) if found else []
    backend = _BACKEND_RE.search(section)
    if backend and backend.group(1).startswith("setuptools.build_meta") and not any(
            _canonical(re.split(r"[<>=!~;\[ ]", r, 1)[0]) == "wheel" for r in reqs):
        reqs.append("wheel")  # setuptools < 70.1 asks for it from get_requires_for_build_wheel
    return reqs


def _attributed(events: Sequence[Event], package: str) -> Tuple[Event, ...]:
    """Events that name ``package``: pip builds each sdist in a directory
    named after it (``pip-install-*/<name>_<hash>``, ``pip-req-build-*``)."""
    forms = {package, package.replace("-", "_"), package.replace("-", ".")}
    out = []
    for e in events:
        text = " ".join((e.target, str(e.detail.get("python", "")), " ".join(map(str, e.detail.get("argv", [])))))
        lowered = text.lower()
        if any(f"/{f}_" in lowered or f"/{f}-" in lowered or f"/{f}/" in lowered for f in forms):
            out.append(e)
    return tuple(out)


def _pip_failure(what: str, report: Report) -> str:
    if report.timed_out:
        return f"{what} timed out"
    return f"{what} failed (exit {report.exit_code}); see pip's output above"
