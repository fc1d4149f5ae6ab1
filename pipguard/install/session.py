"""One install's options and state, shared by the answers to pip's requests: what pipguard
takes from the command line (:class:`InstallOptions`), what it learnt of a source tree
(:class:`Source`), and :class:`InstallSession`, the state the handlers of
:mod:`~pipguard.install.hooks`, :mod:`~pipguard.install.gating`,
:mod:`~pipguard.install.importprobe` and the :class:`~pipguard.install.installer.Installer`
read and write (the phases run, the gated packages, the refusals, what pip's seam said), with
the steps they share (a refusal recorded, a sandboxed run recorded with its approvals), and
the small helpers they share (a wheel's fingerprint, a blocked attempt as the messages show
it, the command line redacted).

Imported after pip started (with the installer): imports the policy file's ``ProjectPolicy`` at
module level, everything else where it is used.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, FrozenSet, List, NamedTuple, Optional, Sequence, Set, Tuple

from pipguard.install.policyfile import ProjectPolicy

if TYPE_CHECKING:
    from pipguard.gate import projecttree, scan as gate  # imported where it scans: tarfile, zipfile, lzma... (~15 ms a start)
    from pipguard.install.approvals import Approval, Origin
    from pipguard.gate.coremeta import CoreMetadata
    from pipguard.install.hookcall import HookResult
    from pipguard.install.result import PackageResult, Phase, Refusal
    from pipguard.sandbox.policy import HostPort
    from pipguard.report.model import Event, Report

Progress = Callable[[str], None]


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


class InstallSession:
    """The state of one install (:class:`~pipguard.install.installer.Installer` is one)."""

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
        self.first_trees: Dict[str, "projecttree.Tree"] = {}
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
        #: sha256 of a wheel built here -> the declared requirements by URL it names (remembered
        #: once the gate passed it: pipguard.install.builtwheels)
        self.declared_urls: Dict[str, Set[Tuple[str, str]]] = {}
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

    def _counting_events(self, package: str) -> Tuple[Event, ...]:
        from pipguard.install.result import _counting

        return tuple(e for p in self.phases if p.package == package and p.name != "probe"
                     for e in _counting(p))

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


def _redacted(args: Sequence[str]) -> List[str]:
    """The command line for the report: a URL's credentials never reach it (CI uploads reports)."""
    from pipguard.install._seam.credentials import redact_credentials

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
