"""``pipguard install`` and ``pipguard sandbox``: their click commands (built from
:data:`~pipguard.cli.options.INSTALL_OPTIONS`; every other argument is pip's) and their body
(:func:`_install`, which the fast path calls too): the real pip started first, pipguard's
own checks while it starts (the options, the project's policy file, pipguard's options
misspelt among pip's: :data:`PIP_INSTALL_OPTIONS`), the install, the result rendered.

Imports only the base layer, the report's renderers and the CLI's own helpers at module
level (the fast path loads it before pip starts): the installer, the seam, the limits and
the policy file where the command runs, click only from whoever builds the click commands.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, Sequence

from pipguard.cli.options import INSTALL_OPTIONS, SANDBOX_OPTION, _click_options, _observe_reads
from pipguard.cli.output import _color, _echo
from pipguard.cli.process import _resume_gc, _sigterm_like_ctrl_c
from pipguard.errors import UsageError
from pipguard.report.render import safe


def click_commands(click, group) -> Dict[str, Any]:
    """``pipguard install`` and ``pipguard sandbox``, as click commands of ``group``."""

    def _install_options(f):
        """pipguard's own options of install and sandbox (:data:`INSTALL_OPTIONS`); every
        other argument is pip's."""
        f = click.argument("pip_args", nargs=-1, type=click.UNPROCESSED)(f)
        return _click_options(click, INSTALL_OPTIONS, f)

    _PIP_CONTEXT = {"ignore_unknown_options": True, "allow_interspersed_args": True,
                    "help_option_names": ["-h", "--help"]}

    @group.command(context_settings=_PIP_CONTEXT)
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

    @group.command(context_settings=_PIP_CONTEXT)
    @_install_options
    def sandbox(**kw) -> None:
        """pip install ARGS with every hook call sandboxed, stopping before
        anything is installed: resolve, build, gate (and, with
        --probe-imports, import); print the evidence.

        Exit status: 0 observed clean, 1 something was blocked, 2 error, 130
        interrupted (143: by SIGTERM).
        """
        _install(True, kw)

    return {"install": install, "sandbox": sandbox}


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


def _existing(paths: Sequence[str], flag: str) -> tuple:
    out = []
    for path in paths:
        full = os.path.realpath(os.path.expanduser(path))
        if not os.path.exists(full):
            raise UsageError(f"{flag} {path}: no such file or directory")
        out.append(full)
    return tuple(out)


