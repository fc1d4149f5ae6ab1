"""The options of ``pipguard run``, ``install`` and ``sandbox``, declared once
(:data:`RUN_OPTIONS`, :data:`INSTALL_OPTIONS`, :data:`SANDBOX_OPTION`), and the two parsers
built from them: click's (:func:`_click_options`) and the fast path's
(:func:`_fast_run_params`, :func:`_fast_install_params`), which reads well-formed command
lines without importing click (10-25 ms: click imports inspect, uuid, datetime, gettext).
The fast path only ever accepts what click would accept, with the same values, and leaves
everything else to click (tests/test_cli_fastpath.py checks pairings of options, among pip's
arguments for install, against click). Also what two options mean together
(:func:`_observe_reads`).

Imports the base layer and :mod:`pipguard.report.render` (its format names) only; click is
passed in by whoever builds the click commands, so the fast path never imports it.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from pipguard.errors import UsageError
from pipguard.report import render


_ISOLATION_CHOICES = ("auto", "audit", "os", "ns")
#: ``run``, ``install``/``sandbox`` and ``pkgbuild`` also offer the VM backend
_RUN_ISOLATION_CHOICES = (*_ISOLATION_CHOICES, "vm")


def _positive_float(ctx, param, value):
    if value is None:
        return None
    if not value > 0:
        import click

        raise click.BadParameter("must be a positive number of seconds")
    return value


def _observe_reads(on: bool, off: bool) -> Optional[bool]:
    """``--observe-reads`` / ``--no-observe-reads``; None (neither): the backend's default
    (on, and off under ns, where the decoys report credential reads)."""
    if on and off:
        raise UsageError("--observe-reads and --no-observe-reads contradict each other",
                         hint="give one of them (neither: on, and off under --isolation ns)")
    return True if on else (False if off else None)


class _Option:
    """One option of ``pipguard run``, ``install`` or ``sandbox``: the click commands are
    built from these, and the fast path below reads the same ones (so they cannot drift apart).
    ``kind``: "flag", "value" or "multiple"; ``choices``: the values the fast
    path accepts itself (click accepts ``click_choices``, default the same)."""

    __slots__ = ("name", "dest", "kind", "help", "metavar", "default", "choices", "click_choices", "fast")

    def __init__(self, name, dest, kind, help, *, metavar=None, default=None, choices=None,
                 click_choices=None, fast=True):
        self.name, self.dest, self.kind, self.help, self.metavar = name, dest, kind, help, metavar
        self.default = default if default is not None else (False if kind == "flag" else
                                                             () if kind == "multiple" else None)
        self.choices = tuple(choices) if choices is not None else None
        self.click_choices = tuple(click_choices) if click_choices is not None else self.choices
        self.fast = fast  # False: the fast path leaves a command line with it to click


RUN_OPTIONS = (
    _Option("--isolation", "isolation", "value", default="auto", choices=_ISOLATION_CHOICES,
            click_choices=_RUN_ISOLATION_CHOICES,
            help="auto: every layer this kernel has (gaps recorded), inside namespaces of "
                 "its own where user namespaces work (else on the host's filesystem, the "
                 "reason recorded); os: on the host's filesystem, fail unless the whole OS "
                 "layer applies; ns: insist on the namespaces (a new root from the grants, "
                 "decoy credentials at the homes, loopback only; read observation off by "
                 "default); audit: Python audit hooks only; vm: in a QEMU guest running "
                 "those layers (needs working KVM, or --vm-accel tcg)."),
    _Option("--vm-accel", "vm_accel", "value", default="kvm", choices=("kvm", "tcg"), fast=False,
            help="Under --isolation vm: kvm (exit 2 if KVM does not work here) or tcg "
                 "(software emulation: slow, for review)."),
    _Option("--allow-network", "allow_network", "flag",
            help="Lift the network ban (destinations are still recorded)."),
    _Option("--allow-host", "allow_hosts", "multiple", metavar="HOST[:PORT]",
            help="Allow only this destination (repeatable)."),
    _Option("--allow-write", "allow_write", "multiple", metavar="PATH",
            help="Extra writable directory (repeatable); the working directory is writable."),
    _Option("--allow-read", "allow_read", "multiple", metavar="PATH",
            help="Extra readable path, e.g. inside a home directory (repeatable)."),
    _Option("--deny-subprocess", "deny_subprocess", "flag", help="Veto every process creation."),
    _Option("--keep-env", "keep_env", "multiple", metavar="NAME",
            help="Pass this environment variable through unchanged (repeatable)."),
    _Option("--no-observe-reads", "no_observe_reads", "flag",
            help="Do not observe native file reads (cheaper; Landlock still blocks them, "
                 "but native attempts are then not reported)."),
    _Option("--observe-reads", "observe_reads", "flag",
            help="Observe native file reads also under the namespace backend (where the decoys "
                 "report credential reads and observation is off by default)."),
    _Option("--timeout", "timeout", "value", metavar="SECONDS",
            help="Kill the whole sandbox after this many seconds (exit 124)."),
    _Option("--report", "report_path", "value", metavar="FILE",
            help="Write the report here (atomically), in --format's format (JSON for table); "
                 "the summary then goes to stderr."),
    _Option("--format", "fmt", "value", default="table", choices=render.FORMATS,
            help="table: summary on stderr; json/sarif/markdown: the report on stdout, and the "
                 "command's stdout goes to stderr (with --report: the file's format)."),
    _Option("--record-build-dir", "record_build_dir", "flag", help="Also hash files written in the working directory."),
    _Option("--limit-memory", "limit_memory", "value", metavar="SIZE",
            help="Memory of the whole run (e.g. 4G; default: 3/4 of RAM)."),
    _Option("--limit-processes", "limit_processes", "value", metavar="N", help="Live processes at once (default 2048)."),
    _Option("--limit-cpu", "limit_cpu", "value", metavar="SECONDS", help="CPU time (default 14400)."),
    _Option("--limit-write", "limit_write", "value", metavar="SIZE",
            help="Largest file the run may write (default 16G)."),
)


#: options whose value is a positive number of seconds
_SECONDS = ("timeout", "build_timeout")

INSTALL_OPTIONS = (
    _Option("--python", "python", "value", metavar="PATH",
            help="Install into this interpreter's environment, with its own pip "
                 "(default: pipguard's interpreter). Any CPython >= 3.9."),
    _Option("--isolation", "isolation", "value", default="auto", choices=_RUN_ISOLATION_CHOICES,
            help="as for run, per hook call: auto (namespaces of its own where they "
                 "work), os, ns, audit; vm: each hook call in a QEMU guest of its own "
                 "(needs working KVM, or --vm-accel tcg)."),
    _Option("--vm-accel", "vm_accel", "value", default="kvm", choices=("kvm", "tcg"),
            help="Under --isolation vm: kvm (exit 2 if KVM does not work here) or tcg "
                 "(software emulation: slow, for review)."),
    _Option("--allow-build-host", "allow_build_hosts", "multiple", metavar="HOST[:PORT]",
            help="Let build hooks reach this host through pipguard's filtering proxy "
                 "(Rust/Go sdists fetching crates or modules); every destination is "
                 "recorded. Default: hook calls have no network (repeatable)."),
    _Option("--allow-read", "allow_read", "multiple", metavar="PATH",
            help="Extra read-only root for every hook call (repeatable)."),
    _Option("--allow-write", "allow_write", "multiple", metavar="PATH",
            help="Extra writable root for every hook call (repeatable)."),
    _Option("--build-timeout", "build_timeout", "value", metavar="SECONDS",
            help="Time limit for each sandboxed hook call."),
    _Option("--limit-memory", "limit_memory", "value", metavar="SIZE",
            help="Memory of each hook call (e.g. 4G; default: 3/4 of RAM)."),
    _Option("--limit-processes", "limit_processes", "value", metavar="N",
            help="Live processes of each hook call (default 2048)."),
    _Option("--limit-cpu", "limit_cpu", "value", metavar="SECONDS", help="CPU time of each hook call (default 14400)."),
    _Option("--limit-write", "limit_write", "value", metavar="SIZE",
            help="Largest file a hook call may write (default 16G)."),
    _Option("--keep-env", "keep_env", "multiple", metavar="NAME",
            help="Pass this environment variable into hook calls (repeatable)."),
    _Option("--no-observe-reads", "no_observe_reads", "flag",
            help="Do not observe native file reads (faster builds; Landlock still blocks "
                 "them, but native read attempts are then not reported)."),
    _Option("--observe-reads", "observe_reads", "flag",
            help="Observe native file reads also under --isolation ns (off there by "
                 "default: the decoys report credential reads)."),
    _Option("--probe-imports", "probe_imports", "flag",
            help="Also import each new top-level module in the sandbox before committing."),
    _Option("--report", "report_path", "value", metavar="FILE",
            help="Write pipguard's JSON report here (pip's own --report: --pip-report)."),
    _Option("--pip-report", "pip_report", "value", metavar="FILE",
            help="Passed to pip as its --report (pip's installation report)."),
    _Option("--format", "fmt", "value", default="table", choices=render.FORMATS,
            help="table: summary on stderr; json/sarif/markdown: the report on stdout (pip's "
                 "own output then goes to stderr)."),
    _Option("--policy", "policy", "value", metavar="PATH",
            help="The project's policy: a pipguard.toml, a pyproject.toml with "
                 "[tool.pipguard], or a directory holding one (default: the working "
                 "directory's, if any). Never read from a package."),
)
#: ``install`` only (``sandbox`` always sandboxes)
SANDBOX_OPTION = _Option("--sandbox", "sandbox", "flag",
                         help="Run every build hook (setup.py, PEP 517 backends) in a sandbox. Without it "
                              "no package code runs at all: wheels only.")


def _click_options(click, table: Sequence["_Option"], f=None):
    """The click options of ``table``, applied to ``f`` (or a decorator that applies them)."""

    def apply(f):
        for opt in reversed(table):
            kw: Dict[str, Any] = {"help": opt.help}
            if opt.kind == "flag":
                kw["is_flag"] = True
            elif opt.kind == "multiple":
                kw.update(multiple=True, metavar=opt.metavar)
            else:
                if opt.metavar:
                    kw["metavar"] = opt.metavar
                if opt.click_choices is not None:
                    kw["type"] = click.Choice(list(opt.click_choices))
                if opt.default is not None:
                    kw.update(default=opt.default, show_default=True)
                if opt.dest in _SECONDS:
                    kw.update(type=float, callback=_positive_float)
            f = click.option(opt.name, opt.dest, **kw)(f)
        return f

    return apply if f is None else apply(f)


# -- the fast path ------------------------------------------------------------

_FAST = {o.name: o for o in RUN_OPTIONS if o.fast}


def _fast_run_params(args: List[str]) -> Optional[Dict[str, Any]]:
    """The arguments click would call ``run`` with for ``args``, when they
    are ``run``, known options with plain values, ``--`` and a command; None
    for anything else (click parses it then, and reports any error)."""
    if len(args) < 3 or args[0] != "run" or "--" not in args:
        return None
    params: Dict[str, Any] = {o.dest: o.default for o in RUN_OPTIONS}
    given: Set[str] = set()
    i = 1
    while args[i] != "--":  # a "--" is ahead: never past the end
        name, eq, value = args[i].partition("=")
        i += 1
        opt = _FAST.get(name)
        if opt is None:
            return None  # -h, a short or unknown option, an argument before "--"...
        if opt.kind == "flag":
            if eq:
                return None
            params[opt.dest] = True
            continue
        if not eq:
            value = args[i]
            i += 1
        if not _take_value(opt, value, params, given):
            return None
    command = tuple(args[i + 1:])
    if not command:
        return None
    params["command"] = command
    return params


def _take_value(opt: _Option, value: str, params: Dict[str, Any], given: Set[str]) -> bool:
    """Store an option's value in ``params`` as click would; False where the
    fast path must leave the command line to click (an empty value or one
    like an option, a repeated single option, a bad choice or number)."""
    if not value or value.startswith("-"):
        return False  # click's reading of these is click's business
    key = opt.dest
    if opt.kind == "multiple":
        params[key] = params[key] + (value,)
        return True
    if key in given or (opt.choices is not None and value not in opt.choices):
        return False
    given.add(key)
    if key in _SECONDS:
        try:
            seconds = float(value)
        except ValueError:
            return False
        if not seconds > 0:
            return False
        params[key] = seconds
        return True
    params[key] = value
    return True


_FAST_INSTALL = {o.name: o for o in INSTALL_OPTIONS}


def _fast_install_params(args: List[str]) -> Optional[Tuple[str, Dict[str, Any]]]:
    """(command, the arguments click would call it with) for ``install`` and
    ``sandbox`` command lines whose pipguard options are plain; None for
    anything else (click parses it then). click's reading, which this repeats:
    every argument that is not one of pipguard's options is pip's, in order
    and as written (``--index-url=URL``, ``-qq``, ``-e``, ``.``); a short
    option cluster holding ``h`` is click's help; ``--`` is consumed."""
    if not args or args[0] not in ("install", "sandbox"):
        return None
    table = dict(_FAST_INSTALL, **({SANDBOX_OPTION.name: SANDBOX_OPTION} if args[0] == "install" else {}))
    params: Dict[str, Any] = {o.dest: o.default for o in table.values()}
    given: Set[str] = set()
    pip_args: List[str] = []
    i = 1
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            return None
        if not arg.startswith("-") or arg == "-":
            pip_args.append(arg)
            continue
        if not arg.startswith("--"):
            if "h" in arg:
                return None  # -h, or a cluster click reads as holding it
            pip_args.append(arg)
            continue
        name, eq, value = arg.partition("=")
        opt = table.get(name)
        if opt is None:
            if name == "--help":
                return None
            pip_args.append(arg)  # pip's option (its value, if apart, follows as an argument)
            continue
        if opt.kind == "flag":
            if eq:
                return None
            params[opt.dest] = True
            continue
        if not eq:
            if i >= len(args):
                return None
            value = args[i]
            i += 1
        if not _take_value(opt, value, params, given):
            return None
    params["pip_args"] = tuple(pip_args)
    return args[0], params
