"""``pipguard pkgbuild``: its click command and its body (:func:`_pkgbuild`): one PKGBUILD
reviewed with the real makepkg in the sandbox (:mod:`pipguard.pkgbuild`), the result
rendered.

Imports only the report's renderers and the CLI's own helpers at module level (the click
application imports every command to build itself): the review, the policy and the report
model where the command runs.
"""

from __future__ import annotations

import sys
from typing import Any

from pipguard.cli.options import _positive_float
from pipguard.cli.output import _DATA_FORMATS, _color, _echo
from pipguard.cli.process import _resume_gc, _sigterm_like_ctrl_c
from pipguard.report import render
from pipguard.report.render import safe


def click_command(click, group) -> Any:
    """``pipguard pkgbuild``, as a click command of ``group``."""
    _FORMAT = click.Choice(render.FORMATS)

    @group.command()
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

    return pkgbuild


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
