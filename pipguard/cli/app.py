"""The ``pipguard`` command: parse options, build a Policy, call the library,
render, map errors to exit codes. Nothing here decides security.

Start-up cost matters (``pipguard run -- true`` is benchmarked against
``true``, ``pipguard install`` against ``pip install``), so this module imports
almost nothing itself: each subcommand imports what it needs, and the
commonest invocations -- ``pipguard run [OPTIONS] -- CMD...`` and ``pipguard
install|sandbox [OPTIONS] PIP-ARGS...`` with well-formed options, and
``pipguard --version`` -- are parsed here without importing click (10-25 ms:
click imports inspect, uuid, datetime, gettext). Anything else, including every
malformed command line and every ``--help``, goes to the click application
below, which parses it and reports errors as always; the fast path only ever
accepts what click would accept, with the same values. The options are
declared once (:data:`RUN_OPTIONS`, :data:`INSTALL_OPTIONS`): the click
commands are built from those tables and the fast paths read them, so they
cannot drift apart (tests/test_cli_fastpath.py checks pairings of options,
among pip's arguments for install, against click). After the command, the
console entry point ends the process without the interpreter's teardown
(:func:`_exit_now`).
The click objects (``cli``, ``run``, ``install``, ``sandbox``, ``doctor``) are
built on first access.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import pipguard
from pipguard import exitcodes
from pipguard.report import render
from pipguard.errors import PipguardError, UsageError
from pipguard.report.render import safe

_ISOLATION_CHOICES = ("auto", "audit", "os", "ns")
#: ``run``, ``install``/``sandbox`` and ``pkgbuild`` also offer the VM backend
_RUN_ISOLATION_CHOICES = (*_ISOLATION_CHOICES, "vm")


def _color(stream) -> bool:
    return stream.isatty() and "NO_COLOR" not in os.environ


def _positive_float(ctx, param, value):
    if value is None:
        return None
    if not value > 0:
        import click

        raise click.BadParameter("must be a positive number of seconds")
    return value


# -- output ------------------------------------------------------------------

_ANSI = None
#: the ``--format`` values that are data for machines (JSON text), not text for a human
_DATA_FORMATS = ("json", "sarif")


def _plain_text_stream(stream) -> bool:
    """A stream click.echo would write to as it is: a text file with a
    non-ASCII encoding (click re-wraps ASCII-configured streams as UTF-8)."""
    import io

    if type(stream) is not io.TextIOWrapper or not stream.encoding or not stream.errors:
        return False
    import codecs

    try:
        return codecs.lookup(stream.encoding).name != "ascii"
    except LookupError:
        return True


def _echo(text: str, *, err: bool = False, data: bool = False) -> None:
    """Where pipguard's text leaves for a terminal (or a log, a pipe into
    ``less -R``...): made safe first (:mod:`pipguard.report.render.safe`): for a
    human, every control character and escape sequence but pipguard's own
    colours is escaped visibly (:func:`~pipguard.report.render.safe.terminal_text`);
    ``data`` (JSON, SARIF): the same characters as JSON ``\\u`` escapes, the
    same data (:func:`~pipguard.report.render.safe.json_text`). Then exactly
    ``click.echo(text, err=err, nl=False)``: for a plain text stream click
    writes the text (ANSI codes stripped when the stream is not a terminal)
    and flushes; anything unusual is left to click itself."""
    global _ANSI
    stream = sys.stderr if err else sys.stdout
    if stream is None:
        return
    text = safe.json_text(text) if data else safe.terminal_text(text)
    if not _plain_text_stream(stream):
        import click

        click.echo(text, err=err, nl=False)
        return
    if text and "\x1b" in text:
        try:
            tty = stream.isatty()
        except Exception:
            tty = False
        if not tty:
            if _ANSI is None:
                import re

                _ANSI = re.compile(r"\033\[[;?0-9]*[a-zA-Z]")  # click's strip_ansi
            text = _ANSI.sub("", text)
    if text:
        stream.write(text)
    stream.flush()


def _fail(message: str, hint: Optional[str] = None, code: int = exitcodes.ERROR) -> None:
    """One line on stderr: the problem, then what to do."""
    # one line: a message can quote a package's name, a path, an argv
    line = f"pipguard: error: {safe.printable(message)}"
    if hint:
        line += f" (hint: {safe.printable(hint)})"
    _echo(line + "\n", err=True)
    raise SystemExit(code)


# -- the commands' bodies -----------------------------------------------------


def _observe_reads(on: bool, off: bool) -> Optional[bool]:
    """``--observe-reads`` / ``--no-observe-reads``; None (neither): the backend's default
    (on, and off under ns, where the decoys report credential reads)."""
    if on and off:
        raise UsageError("--observe-reads and --no-observe-reads contradict each other",
                         hint="give one of them (neither: on, and off under --isolation ns)")
    return True if on else (False if off else None)


def _run(isolation, allow_network, allow_hosts, allow_write, allow_read, deny_subprocess,
         keep_env, no_observe_reads, timeout, report_path, fmt, record_build_dir, command,
         limit_memory=None, limit_processes=None, limit_cpu=None, limit_write=None,
         vm_accel="kvm", observe_reads=False) -> None:
    """The body of ``pipguard run`` (called by click, or by the fast path)."""
    from pipguard.sandbox import limits
    from pipguard.sandbox.policy import HostPort, Policy
    from pipguard.report.model import check_writable, write_atomic
    from pipguard.sandbox.api import run as run_sandbox

    if report_path:
        report_path = check_writable(report_path)
    policy = Policy(
        allow_network=allow_network,
        allow_hosts=tuple(HostPort.parse(h) for h in allow_hosts),
        allow_subprocess=not deny_subprocess,
        allow_write=allow_write, allow_read=allow_read, keep_env=keep_env,
        isolation=isolation, timeout=timeout, observe_reads=_observe_reads(observe_reads, no_observe_reads),
        vm_accel=vm_accel,
        **limits.policy_settings(limit_memory, limit_processes, limit_cpu, limit_write),
    )
    # --report FILE gets the chosen format (the default, table, is for a human: the file gets
    # JSON then) and the terminal the table; without it a machine format is the report on
    # stdout, and stdout is then the report's alone: the command's goes to stderr, as pip's
    # does under install
    file_fmt = ("json" if fmt == "table" else fmt) if report_path else None
    shown_fmt = "table" if report_path else fmt
    _sigterm_like_ctrl_c()
    _resume_gc()
    saved = _command_stdout_on_stderr() if shown_fmt != "table" else None
    try:
        report = run_sandbox(list(command), policy, record_build_dir=record_build_dir,
                             meanwhile=lambda: _import_renderers(shown_fmt, file_fmt))
    finally:
        _stdout_back(saved)
    if report_path and file_fmt:
        text = render.get(file_fmt)(report)
        write_atomic(report_path, safe.json_text(text) if file_fmt in _DATA_FORMATS else text)
    if shown_fmt == "table":
        _echo(render.get("table")(report, color=_color(sys.stderr)), err=True)
    else:
        _echo(render.get(shown_fmt)(report), data=shown_fmt in _DATA_FORMATS)
    if report.error:
        # interrupted, or (vm) the guest stopped without a report: could not run it
        raise SystemExit(exitcodes.INTERRUPTED if report.error.startswith("interrupted") else exitcodes.ERROR)
    raise SystemExit(exitcodes.from_wait_status(report.exit_code, report.timed_out))


def _import_renderers(fmt: str, file_fmt: Optional[str]) -> None:
    """Import the renderers the run will use while its sandbox is being set
    up (the table renderer imports tabulate: ~4 ms that would come after)."""
    for name in (fmt, file_fmt) if file_fmt else (fmt,):
        try:
            render.get(name)
        except Exception:  # raised again where the renderer is used, as always
            pass


def _command_stdout_on_stderr() -> Optional[int]:
    """Until :func:`_stdout_back`, the sandbox's stdout (this process's descriptor 1, which
    the sandbox inherits) is stderr: pipguard's report then has stdout to itself, where a
    reader parses it. Returns the real stdout's copy (None: there is no stdout)."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)  # not inheritable: the sandbox never holds the real stdout
    except OSError:
        return None
    os.dup2(2, 1)
    return saved


def _stdout_back(saved: Optional[int]) -> None:
    if saved is not None:
        os.dup2(saved, 1)
        os.close(saved)


#: the signal that stopped pipguard, once one did through :func:`_sigterm_like_ctrl_c`
_STOPPED_BY: Optional[int] = None


def _sigterm_like_ctrl_c() -> None:
    """SIGTERM stops the sandbox like Ctrl-C does: the supervisor kills the
    whole tree and the report is still written. The exit status then says which
    it was, as a shell's does: 130 (128+SIGINT) or 143 (128+SIGTERM)."""
    import signal

    def terminated(signum, frame):
        global _STOPPED_BY
        _STOPPED_BY = signum
        raise KeyboardInterrupt  # the path Ctrl-C takes

    signal.signal(signal.SIGTERM, terminated)


def _stopped_status(done: SystemExit) -> SystemExit:
    """``done``, with an interrupted exit (130) said as the signal that stopped pipguard."""
    if done.code == exitcodes.INTERRUPTED and _STOPPED_BY is not None:
        return SystemExit(128 + _STOPPED_BY)
    return done


def _quiet_level(pip_args: Sequence[str]) -> int:
    """pip's -q count in ``pip_args`` (pipguard is as quiet as pip is asked to be)."""
    level = 0
    for arg in pip_args:
        if arg == "--":
            break
        if arg == "--quiet":
            level += 1
        elif arg.startswith("-") and not arg.startswith("--") and set(arg[1:]) == {"q"}:
            level += len(arg) - 1
    return level


def _install(sandbox_only: bool, kw: dict) -> None:
    pip_args = tuple(kw["pip_args"])
    if kw.get("pip_report"):
        pip_args += ("--report", kw["pip_report"])
    if not pip_args:
        raise UsageError("nothing to install", hint="name packages, or use -r FILE, or -e DIR "
                         "(any 'pip install' argument)")
    if kw["isolation"] == "vm" and (sandbox_only or kw.get("sandbox")):
        from pipguard.sandbox.vm import runner as vm

        vm.preflight(kw["vm_accel"])  # no KVM: exit 2 with the reason before pip starts
    # pip first: it takes half a second to its first request, and pipguard's own imports
    # and checks (20-30 ms) happen meanwhile. Nothing of pip's happens before pipguard
    # answers it; if a check below fails, pip is ended before it did anything.
    from pipguard.install.seam import PipProcess, pip_arguments, target_python

    binary_only = not sandbox_only and not kw.get("sandbox")
    _sigterm_like_ctrl_c()  # from here on SIGTERM ends pip too (KeyboardInterrupt)
    # stdout carries the report in the machine formats: pip's own output goes to stderr then
    pip = PipProcess(target_python(kw["python"]), pip_arguments(pip_args, binary_only), os.environ,
                     None if kw["fmt"] == "table" else sys.stderr.fileno())
    try:
        result = _install_with(pip, sandbox_only, binary_only, pip_args, kw)
    except BaseException:
        pip.abandon()
        raise
    raise SystemExit(result.exit_code)


def _install_with(pip, sandbox_only: bool, binary_only: bool, pip_args: tuple, kw: dict):
    """The rest of ``_install``, with ``pip`` started: options, the install, the result shown."""
    from pipguard.sandbox import limits
    from pipguard.install.installer import Installer, InstallOptions
    from pipguard.sandbox.policy import HostPort

    _no_misspelt_options(pip_args, sandbox_only)
    report_path = None
    if kw.get("report_path"):
        from pipguard.report.model import check_writable

        report_path = check_writable(kw["report_path"])
    from pipguard.install import policyfile

    # the project's policy file feeds the options, as the flags do; nothing
    # after this reads it
    project = policyfile.load(kw.get("policy"))
    options = InstallOptions(
        pip_args=pip_args, python=pip.python, isolation=kw["isolation"], vm_accel=kw["vm_accel"],
        sandbox_only=sandbox_only, binary_only=binary_only,
        probe_imports=kw["probe_imports"],
        build_hosts=tuple(HostPort.parse(h, "--allow-build-host") for h in kw["allow_build_hosts"]),
        build_timeout=kw["build_timeout"],
        keep_env=tuple(dict.fromkeys([*kw["keep_env"], *project.keep_env])),
        # None: the backend's default (on; off under ns, where decoys report credential reads)
        observe_reads=_observe_reads(kw["observe_reads"], kw["no_observe_reads"]),
        allow_read=tuple(dict.fromkeys([*_existing(kw["allow_read"], "--allow-read"), *project.allow_read])),
        allow_write=tuple(dict.fromkeys([*_existing(kw["allow_write"], "--allow-write"),
                                         *project.allow_write])),
        project=project,
        limits=tuple(sorted(limits.policy_settings(kw["limit_memory"], kw["limit_processes"],
                                                   kw["limit_cpu"], kw["limit_write"]).items())),
    )
    quiet = _quiet_level(pip_args)
    # One plain line per hook call and package, on a terminal and in CI logs alike.
    # (a line names the package and version its metadata claims: one line, escaped)
    progress = (lambda m: _echo(f"pipguard: {safe.printable(m)}\n", err=True)) if quiet == 0 else None
    _resume_gc()
    result = Installer(options, progress=progress, prepare_result=_load_renderer).run(pip)
    from pipguard.report.render import install as render_install

    if report_path:
        from pipguard.report.model import dumps, write_atomic

        write_atomic(report_path, dumps(result.to_json()))
    if kw["fmt"] == "table":
        if quiet < 2 or result.status not in ("installed", "clean"):
            _echo(render_install.table(result, color=_color(sys.stderr), report_path=report_path), err=True)
    elif kw["fmt"] == "json":
        from pipguard.report.model import dumps

        _echo(dumps(result.to_json()), data=True)
    elif kw["fmt"] == "markdown":
        from pipguard.report.render import markdown

        _echo(markdown.render_result(result))
    else:
        _echo(render_install.sarif(result), data=True)
    return result


#: the long options of ``pip install`` (pip 23.2's parser, and those later pips added): an
#: argument that is one, or an abbreviation optparse would take for one, is pip's
#: (tests/test_cli.py checks this against the installed pip's own parser)
PIP_INSTALL_OPTIONS = frozenset((
    "--abi", "--break-system-packages", "--cache-dir", "--cert", "--check-build-dependencies",
    "--client-cert", "--compile", "--config-settings", "--constraint", "--debug", "--default-timeout",
    "--disable-pip-version-check", "--dry-run", "--editable", "--exists-action", "--extra-index-url",
    "--find-links", "--force-reinstall", "--global-option", "--help", "--ignore-installed",
    "--ignore-requires-python", "--implementation", "--index-url", "--isolated", "--keyring-provider",
    "--local-log", "--log", "--log-file", "--no-binary", "--no-build-isolation", "--no-cache-dir",
    "--no-clean", "--no-color", "--no-compile", "--no-dependencies", "--no-deps", "--no-index",
    "--no-input", "--no-python-version-warning", "--no-use-pep517", "--no-user", "--no-warn-conflicts",
    "--no-warn-script-location", "--only-binary", "--platform", "--pre", "--prefer-binary", "--prefix",
    "--progress-bar", "--proxy", "--pypi-url", "--python", "--python-version", "--quiet", "--report",
    "--require-hashes", "--require-venv", "--require-virtualenv", "--requirement", "--retries", "--root",
    "--root-user-action", "--source", "--source-dir", "--source-directory", "--src", "--target",
    "--timeout", "--trusted-host", "--upgrade", "--upgrade-strategy", "--use-deprecated",
    "--use-feature", "--use-pep517", "--user", "--verbose", "--version",
    # later pips
    "--group", "--resume-retries", "--build-constraint", "--all-releases", "--only-final",
    "--uploaded-prior-to", "--install-option",
))


def _no_misspelt_options(pip_args: Sequence[str], sandbox_only: bool) -> None:
    """A UsageError for an argument that looks like one of pipguard's own options misspelt
    (``--sandbx``, ``--isolaton``) and is no option of pip's: pip would print its usage
    and pipguard a hint beside the point. Checked while pip starts, so without asking
    pip's parser (importing it takes longer than pip's own start): the table above, with
    optparse's abbreviations (``--isol`` is pip's ``--isolated``)."""
    names = [o.name for o in INSTALL_OPTIONS] + ([] if sandbox_only else [SANDBOX_OPTION.name])
    for arg in pip_args:
        if arg == "--":
            break
        if not arg.startswith("--") or arg in names:
            continue
        import difflib

        name = arg.partition("=")[0]
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
        if close and not _pip_option(name):
            raise UsageError(f"no such option: {name}", hint=f"did you mean {close[0]}?")


def _pip_option(name: str) -> bool:
    """Whether pip's install command could read ``name`` as one of its options: exactly, or
    as an abbreviation (pip decides whether an ambiguous one is an error)."""
    return name in PIP_INSTALL_OPTIONS or any(option.startswith(name) for option in PIP_INSTALL_OPTIONS)


def _load_renderer() -> None:
    """What showing an install's result imports (tabulate among it: 10-20 ms),
    loaded while pip installs the gated wheels rather than after pip's exit."""
    from pipguard.report.render import install, load_tabulate  # noqa: F401 (install: imported for later)

    load_tabulate()


def _approve(report_path: str, policy: Optional[str], write: bool) -> None:
    import json

    import click

    from pipguard.install import approvals, policyfile

    try:
        with open(report_path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as exc:
        raise UsageError(f"--from-report {report_path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"--from-report {report_path}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise UsageError(f"--from-report {report_path}: not a pipguard report")
    project = policyfile.load(policy)
    candidates = approvals.from_report(data, project.approvals)
    target = project.path or os.path.abspath(policyfile.POLICY_FILE)
    table = project.table
    entries = [c for c in candidates if c.approval is not None]
    text = approvals.to_toml(candidates, table)
    if not candidates:
        click.echo(f"pipguard: nothing to approve in {report_path} (nothing refused, or "
                   f"{os.path.relpath(target)} already approves it)", err=True)
        raise SystemExit(exitcodes.OK)
    if not write:
        _echo(text)
        click.echo(f"pipguard: {len(entries)} approval(s) above; review them, then add them to "
                   f"{os.path.relpath(target)} (or run again with --write)", err=True)
        raise SystemExit(exitcodes.OK)
    if not entries:
        _echo(text)
        raise SystemExit(exitcodes.REFUSED)
    policyfile.append(target, table, text)
    click.echo(f"pipguard: wrote {len(entries)} approval(s) to {os.path.relpath(target)}: review "
               "each one (what was seen is in its comment; fill in the reason), then commit the file",
               err=True)
    raise SystemExit(exitcodes.OK)


def _existing(paths: Sequence[str], flag: str) -> tuple:
    out = []
    for path in paths:
        full = os.path.realpath(os.path.expanduser(path))
        if not os.path.exists(full):
            raise UsageError(f"{flag} {path}: no such file or directory")
        out.append(full)
    return tuple(out)


def _pkgbuild(directory, allow_hosts, isolation, vm_accel, timeout, report_path, fmt) -> None:
    from pipguard.pkgbuild import review
    from pipguard.sandbox.policy import HostPort
    from pipguard.report.render import pkgbuild as render_pkgbuild
    from pipguard.report.model import check_writable, write_atomic

    renderer = render_pkgbuild.get(fmt)
    report_path = check_writable(report_path) if report_path else None
    hosts = tuple(HostPort.parse(h) for h in allow_hosts)
    show = sys.stderr.isatty()
    progress = (lambda m: _echo(f"pipguard: {safe.printable(m)}\n", err=True)) if show else None
    _sigterm_like_ctrl_c()
    _resume_gc()
    result = review(directory, allow_hosts=hosts, isolation=isolation, vm_accel=vm_accel, timeout=timeout,
                    progress=progress)
    if report_path:
        write_atomic(report_path, render_pkgbuild.json(result))
    if fmt == "table":
        _echo(renderer(result, color=_color(sys.stderr)), err=True)
    else:
        _echo(renderer(result), data=fmt in _DATA_FORMATS)
    raise SystemExit(result.exit_code)


def _doctor(fmt) -> None:
    import json

    import click

    from pipguard.cli import doctor as doctor_mod
    from pipguard.sandbox import host, sandbox_user

    from pipguard.sandbox.vm import runner as vm

    # first: what runs killed mid-way left (every run does the same before it starts)
    restored = sandbox_user.replay_stale(again=True)
    facts = host.probe()
    checks = (doctor_mod.checks(facts)
              + [doctor_mod.limits_check(), doctor_mod.stale_grants_check(restored, sandbox_user.needed())]
              + doctor_mod.vm_checks(vm.probe()))
    degraded = doctor_mod.default_isolation_degraded(checks)
    limits_row = next(c for c in checks if c.name == "limits")
    if fmt == "json":
        click.echo(json.dumps({"host": facts.to_json(),
                               "checks": [c.__dict__ if not hasattr(c, "to_json") else c.to_json()
                                          for c in checks],
                               "default_isolation_degraded": degraded,
                               "limits_degraded": limits_row.status != "ok",
                               "restored": [{"uid": r.uid, "writable": list(r.writable), "paths": list(r.paths)}
                                            for r in restored]},
                              indent=2, default=str))
    else:
        tabulate = render.load_tabulate()
        rows = [(c.name, c.status, safe.printable(c.detail)) for c in checks]
        click.echo(tabulate(rows, headers=("layer", "status", "detail"), disable_numparse=True))
        click.echo("\ndefault isolation: " + ("DEGRADED" if degraded else "complete"))
        click.echo("resource limits: " + ("complete (the run's cgroup)" if limits_row.status == "ok" else
                                          "DEGRADED (rlimits per process: see the limits row)"))
    raise SystemExit(exitcodes.REFUSED if degraded else exitcodes.OK)


# -- the click application ----------------------------------------------------

_CLICK_NAMES = ("cli", "run", "install", "sandbox", "pkgbuild", "doctor", "approve", "_pip_options", "_FORMAT", "_ISOLATION")


def _click_app():
    """Build the click command group (once) and publish its objects as this
    module's attributes."""
    app = globals().get("cli")
    if app is not None:
        return app
    import click

    _FORMAT = click.Choice(render.FORMATS)
    _ISOLATION = click.Choice(list(_ISOLATION_CHOICES))

    @click.group(context_settings={"help_option_names": ["-h", "--help"]})
    @click.version_option(pipguard.__version__, prog_name="pipguard")
    def cli() -> None:
        """Run the code that package installs execute inside a sandbox, block
        what an install should never do, and report everything it saw.

        Observed clean is evidence from one execution, not proof of safety.
        """

    run = _run_command(click, cli)

    def _install_options(f):
        """pipguard's own options of install and sandbox (:data:`INSTALL_OPTIONS`); every
        other argument is pip's."""
        f = click.argument("pip_args", nargs=-1, type=click.UNPROCESSED)(f)
        return _click_options(click, INSTALL_OPTIONS, f)

    _PIP_CONTEXT = {"ignore_unknown_options": True, "allow_interspersed_args": True,
                    "help_option_names": ["-h", "--help"]}

    @cli.command(context_settings=_PIP_CONTEXT)
    @_click_options(click, (SANDBOX_OPTION,))
    @_install_options
    def install(sandbox, **kw) -> None:
        """pip install, where no package code runs outside a sandbox.

        Every argument pipguard does not know is pip's: `pipguard install
        --sandbox ARGS` runs the real pip as `pip install ARGS` (options, -e,
        extras, -r, --target, --prefix, --user, config files, PIP_* variables),
        and each PEP 517 hook call pip makes (get_requires, prepare_metadata,
        build_wheel, build_editable) runs in its own sandbox. pip builds every
        wheel before it installs any; there pipguard gates every wheel and lets
        pip install only if every hook call was clean and every wheel passed.

        Exit status: 0 installed, 1 refused (something was blocked or a gate
        fired: nothing installed), 2 error (pip failed or bad input: the
        environment is as pip left it, which for a failure before installing
        means unchanged), 130 interrupted (143: by SIGTERM).
        """
        _install(False, dict(kw, sandbox=sandbox))

    @cli.command(context_settings=_PIP_CONTEXT)
    @_install_options
    def sandbox(**kw) -> None:
        """pip install ARGS with every hook call sandboxed, stopping before
        anything is installed: resolve, build, gate (and, with
        --probe-imports, import); print the evidence.

        Exit status: 0 observed clean, 1 something was blocked, 2 error, 130
        interrupted (143: by SIGTERM).
        """
        _install(True, kw)

    @cli.command()
    @click.argument("directory", default=".", type=click.Path(file_okay=False))
    @click.option("--allow-host", "allow_hosts", multiple=True, metavar="HOST[:PORT]",
                  help="Let the sources phase reach this destination too (repeatable); public "
                       "hosts the source URLs name are allowed already, loopback and private ones "
                       "only with this.")
    @click.option("--isolation", type=click.Choice(["auto", "os", "ns", "vm"]), default="auto",
                  show_default=True,
                  help="auto: each phase in namespaces of its own where they work here, else the "
                       "layers on the host's filesystem (the report says why); os: the host's "
                       "filesystem; ns: namespaces or exit 2; vm: each phase's makepkg in a QEMU "
                       "guest of its own (needs working KVM, or --vm-accel tcg).")
    @click.option("--vm-accel", type=click.Choice(["kvm", "tcg"]), default="kvm", show_default=True,
                  help="Under --isolation vm: kvm (exit 2 if KVM does not work here) or tcg "
                       "(software emulation: slow, for review).")
    @click.option("--timeout", type=float, callback=_positive_float, metavar="SECONDS",
                  help="Time limit for each sandboxed run.")
    @click.option("--report", "report_path", metavar="FILE", help="Write the JSON report here.")
    @click.option("--format", "fmt", type=_FORMAT, default="table", show_default=True)
    def pkgbuild(directory, allow_hosts, isolation, vm_accel, timeout, report_path, fmt) -> None:
        """Review the PKGBUILD in DIRECTORY (default: .) with the real makepkg in
        the sandbox, never as root: read it, fetch and verify the sources (network
        only to their hosts), build offline, run the .install scriptlets against a
        scratch root; report each phase's evidence and the package's contents.

        Exit status: 0 observed clean, 1 something was blocked, 2 error (also:
        makepkg missing, checksum mismatch), 130 interrupted (143: by SIGTERM).
        """
        _pkgbuild(directory, allow_hosts, isolation, vm_accel, timeout, report_path, fmt)

    @cli.command()
    @click.option("--from-report", "report_path", required=True, metavar="FILE",
                  help="An install/sandbox report (--report FILE) of a refused run.")
    @click.option("--policy", "policy", metavar="PATH",
                  help="The policy to check against and write to (default: the working directory's "
                       "pipguard.toml or pyproject.toml [tool.pipguard]; pipguard.toml when none).")
    @click.option("--write", is_flag=True,
                  help="Append the entries to the policy file instead of printing them.")
    def approve(report_path, policy, write) -> None:
        """Write approvals for what refused a run, pinned to each artifact's
        sha256, for a human to review and commit.

        One [[approve]] entry per refusing gate finding or blocked attempt of
        a package pip got as an artifact (an sdist or a wheel), with a comment
        saying what was seen. Approving accepts; it grants nothing: a blocked
        attempt stays blocked, it just no longer refuses the install of that
        exact artifact. A changed artifact needs a new approval.

        Exit status: 0 written or printed (or nothing to approve), 1 nothing
        in the report can be approved, 2 error.
        """
        _approve(report_path, policy, write)

    @cli.command()
    @click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
    def doctor(fmt) -> None:
        """Show which sandbox layers this host supports.

        Exits 1 when the default isolation (auto) would be degraded, so CI can gate on it.
        """
        _doctor(fmt)

    globals().update(cli=cli, run=run, install=install, sandbox=sandbox, pkgbuild=pkgbuild, doctor=doctor,
                     approve=approve,
                     _pip_options=_install_options, _FORMAT=_FORMAT, _ISOLATION=_ISOLATION)
    return cli


def __getattr__(name: str) -> Any:
    if name in _CLICK_NAMES:
        _click_app()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- pipguard run's options, once ---------------------------------------------

class _Option:
    """One option of ``pipguard run``: the click command is built from these,
    and the fast path below reads the same ones (so they cannot drift apart).
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


def _run_command(click, cli) -> Any:
    """``pipguard run``, as a click command built from :data:`RUN_OPTIONS`."""

    def run(command, **params) -> None:
        """Run COMMAND in the sandbox: pipguard run [OPTIONS] -- CMD [ARG...]

        Exits with the command's status (128+N if killed by signal N, 124 on
        timeout); 2 if pipguard could not run it. Stdio passes through untouched.
        """
        _run(command=command, **params)

    decorated = click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)(run)
    decorated = _click_options(click, RUN_OPTIONS, decorated)
    return cli.command(name="run", context_settings={"ignore_unknown_options": False})(decorated)


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


def _fast_version() -> None:
    """``pipguard --version``, as click's version_option prints it."""
    from gettext import gettext as _  # click's message goes through gettext too

    message = _("%(prog)s, version %(version)s")
    _echo(message % {"prog": "pipguard", "package": "pipguard", "version": pipguard.__version__} + "\n")


def _fast(args: List[str]) -> None:
    """Handle ``args`` without click if they are in the fast path's subset
    (then raise SystemExit); return when click must parse them."""
    if "_PIPGUARD_COMPLETE" in os.environ:  # shell completion: click's job
        return
    if args == ["--version"]:
        _guarded(_fast_version)
    params = _fast_run_params(args)
    if params is not None:
        _guarded(lambda: _run(**params))
    install = _fast_install_params(args)
    if install is not None:
        command, kw = install
        if command == "install":
            sandbox = kw.pop("sandbox")
            _guarded(lambda: _install(False, dict(kw, sandbox=sandbox)))
        _guarded(lambda: _install(True, kw))


def _guarded(action) -> None:
    """Run ``action`` with the error handling ``cli.main`` (click, then
    :func:`_main`) would give it; raises SystemExit."""

    def as_click_would():
        try:
            action()
        except (EOFError, KeyboardInterrupt):
            import click

            click.echo(file=sys.stderr)  # as click does: end the line, then abort
            _fail("aborted", code=130)
        except OSError as exc:
            import errno

            if exc.errno != errno.EPIPE:
                raise
            # as click does on a closed pipe: exit 1, and no complaint from the final flush
            from click import utils

            pacify = getattr(utils, "_PacifyFlushWrapper", None) or getattr(utils, "PacifyFlushWrapper")
            sys.stdout = pacify(sys.stdout)
            sys.stderr = pacify(sys.stderr)
            raise SystemExit(1)

    _with_errors(as_click_would)


def _with_errors(invoke) -> None:
    """Errors to one line and an exit code (no tracebacks); raises SystemExit."""
    try:
        invoke()
    except PipguardError as exc:
        _fail(exc.message, exc.hint, exc.exit_code)
    except KeyboardInterrupt:
        _fail("interrupted", code=130)
    except SystemExit:
        raise
    except OSError as exc:
        _fail(f"{exc.strerror or exc} ({exc.filename or 'no file'})",
              "this is probably a bug in pipguard: please report it")
    except Exception as exc:  # a bug: one line for the user, the traceback in a file for the report
        _fail(f"internal error: {type(exc).__name__}: {str(exc)[:300]}",
              f"this is a bug in pipguard: please report it with {_save_traceback()}")
    raise SystemExit(0)


def _save_traceback() -> str:
    """The current exception's traceback in a new file of the temp dir: its path (or where it
    could not go)."""
    import tempfile
    import traceback

    try:
        fd, path = tempfile.mkstemp(prefix="pipguard-crash-", suffix=".txt")
        with os.fdopen(fd, "w") as handle:
            handle.write(traceback.format_exc())
        return path
    except OSError:
        return "the output of the same command"


# -- entry point --------------------------------------------------------------

_GC_PAUSED = False


def _resume_gc() -> None:
    """Start-up is over: what it allocated lives until exit, so freeze it
    (later collections skip it), and let the collector run again."""
    global _GC_PAUSED
    if _GC_PAUSED:
        import gc

        _GC_PAUSED = False
        gc.freeze()
        gc.enable()


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Console entry point: one line per error, no tracebacks, exit codes
    from :mod:`pipguard.exitcodes`."""
    if argv is not None:  # called from Python: leave the collector alone
        _main(list(argv), list(argv))
        return
    global _GC_PAUSED
    import gc

    # The cyclic garbage collector only costs time in a short pipguard run:
    # importing ~150 modules triggers ~40 collections that find nothing, and
    # the collections at interpreter exit walk every object again (~10 ms
    # together). Paused until the long part starts (_resume_gc), and
    # everything is frozen before exit.
    paused = _GC_PAUSED = gc.isenabled()
    gc.disable()
    try:
        _main(sys.argv[1:], None)
    except SystemExit as done:
        _exit_now(done)
        raise
    finally:
        if paused:
            _GC_PAUSED = False
            gc.freeze()
            gc.enable()


def _exit_now(done: SystemExit) -> None:
    """End the process at once with ``done``'s status, as the interpreter
    would after its clean-up: flush stdout and stderr, then ``os._exit``.
    Why: the command's work is over (reports written, sandboxes reaped, pip
    waited for), and tearing down the ~300 modules an install loads takes
    the interpreter 20-30 ms more per command. Returns (the caller then
    exits normally) when the status is not a plain code, when a thread of
    ours still runs, when a profiler or tracer is on, or when a flush fails
    (the interpreter reports that)."""
    code = done.code
    if code is None:
        code = 0
    threading = sys.modules.get("threading")  # not imported: no thread was started
    if not isinstance(code, int) or (threading is not None and threading.active_count() > 1):
        return
    if sys.getprofile() is not None or sys.gettrace() is not None:
        return  # a profiler or coverage writes its data at the interpreter's exit
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        return
    os._exit(code & 0xFF)


def _main(args: List[str], click_args: Optional[List[str]]) -> None:
    try:
        _main_once(args, click_args)
    except SystemExit as done:
        raise _stopped_status(done) from None


def _main_once(args: List[str], click_args: Optional[List[str]]) -> None:
    _fast(args)
    import click

    cli = _click_app()

    def invoke():
        try:
            cli.main(args=click_args, prog_name="pipguard", standalone_mode=False)
        except click.exceptions.NoSuchOption as exc:
            _fail(exc.format_message(), "see 'pipguard --help'; put the command after '--'")
        except click.ClickException as exc:
            _fail(exc.format_message(), "see 'pipguard COMMAND --help'")
        except click.exceptions.Abort:
            _fail("aborted", code=130)

    _with_errors(invoke)


if __name__ == "__main__":
    main()
