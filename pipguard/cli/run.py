"""``pipguard run``: its click command (built from
:data:`~pipguard.cli.options.RUN_OPTIONS`) and its body (:func:`_run`, which the fast path
calls too): a Policy from the options, one sandboxed run, the report rendered.

Imports only the base layer, the report's renderers and the CLI's own helpers at module
level (the fast path loads it): the sandbox, the policy and the report model where the
command runs, click only from whoever builds the click command.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

from pipguard import exitcodes
from pipguard.cli.options import RUN_OPTIONS, _click_options, _observe_reads
from pipguard.cli.output import _DATA_FORMATS, _color, _echo
from pipguard.cli.process import _resume_gc, _sigterm_like_ctrl_c
from pipguard.report import render
from pipguard.report.render import safe


def click_command(click, group) -> Any:
    """``pipguard run``, as a click command of ``group`` built from :data:`RUN_OPTIONS`."""

    def run(command, **params) -> None:
        """Run COMMAND in the sandbox: pipguard run [OPTIONS] -- CMD [ARG...]

        Exits with the command's status (128+N if killed by signal N, 124 on
        timeout); 2 if pipguard could not run it. Stdio passes through untouched.
        """
        _run(command=command, **params)

    decorated = click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)(run)
    decorated = _click_options(click, RUN_OPTIONS, decorated)
    return group.command(name="run", context_settings={"ignore_unknown_options": False})(decorated)


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
