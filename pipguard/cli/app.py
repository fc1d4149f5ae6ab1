"""The ``pipguard`` command's entry point (:func:`main`, the console script
``pipguard.cli:main``): the click application assembled from the commands' modules
(:func:`_click_app`), the fast dispatch of the commonest command lines without click
(:func:`_fast`), and errors mapped to one line and an exit code (:func:`_guarded`,
:func:`_with_errors`). Nothing here decides security.

Start-up cost matters (``pipguard run -- true`` is benchmarked against
``true``, ``pipguard install`` against ``pip install``), so this module imports
almost nothing itself: each subcommand imports what it needs, and the
commonest invocations -- ``pipguard run [OPTIONS] -- CMD...`` and ``pipguard
install|sandbox [OPTIONS] PIP-ARGS...`` with well-formed options, and
``pipguard --version`` -- are parsed without importing click (10-25 ms:
click imports inspect, uuid, datetime, gettext) by the parsers of
:mod:`pipguard.cli.options`, and run by :mod:`pipguard.cli.run` or
:mod:`pipguard.cli.install`, the only command modules that path loads. Anything else,
including every malformed command line and every ``--help``, goes to the click
application, which parses it and reports errors as always; the fast path only ever
accepts what click would accept, with the same values. After the command, the
console entry point ends the process without the interpreter's teardown
(:func:`~pipguard.cli.process._exit_now`).
The click objects (``cli``, ``run``, ``install``, ``sandbox``, ``pkgbuild``, ``doctor``,
``approve``) are built on first access.

Imports the base layer and the CLI's helpers (options, output, process) at module level;
a command's module where the fast path runs it, click and every command's module where it
builds the click application.
"""

from __future__ import annotations

import os
import sys
from typing import Any, List, Optional, Sequence

import pipguard
from pipguard.cli.options import _fast_install_params, _fast_run_params
from pipguard.cli.output import _echo, _fail
from pipguard.cli.process import _end_gc_pause, _exit_now, _pause_gc, _stopped_status
from pipguard.errors import PipguardError

# -- the click application ----------------------------------------------------

_CLICK_NAMES = ("cli", "run", "install", "sandbox", "pkgbuild", "doctor", "approve")


def _click_app():
    """Build the click command group (once) from the commands' modules and publish its
    objects as this module's attributes."""
    app = globals().get("cli")
    if app is not None:
        return app
    import click

    from pipguard.cli import approve, doctor, install, pkgbuild, run

    @click.group(context_settings={"help_option_names": ["-h", "--help"]})
    @click.version_option(pipguard.__version__, prog_name="pipguard")
    def cli() -> None:
        """Run the code that package installs execute inside a sandbox, block
        what an install should never do, and report everything it saw.

        Observed clean is evidence from one execution, not proof of safety.
        """

    commands = {"run": run.click_command(click, cli), **install.click_commands(click, cli),
                "pkgbuild": pkgbuild.click_command(click, cli), "approve": approve.click_command(click, cli),
                "doctor": doctor.click_command(click, cli)}
    globals().update(cli=cli, **commands)
    return cli


def __getattr__(name: str) -> Any:
    if name in _CLICK_NAMES:
        _click_app()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- the fast path ------------------------------------------------------------


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
        from pipguard.cli.run import _run

        _guarded(lambda: _run(**params))
    install = _fast_install_params(args)
    if install is not None:
        from pipguard.cli.install import _install

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


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Console entry point: one line per error, no tracebacks, exit codes
    from :mod:`pipguard.exitcodes`."""
    if argv is not None:  # called from Python: leave the collector alone
        _main(list(argv), list(argv))
        return
    paused = _pause_gc()  # until the long part starts (the command resumes it)
    try:
        _main(sys.argv[1:], None)
    except SystemExit as done:
        _exit_now(done)
        raise
    finally:
        _end_gc_pause(paused)


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
