"""``pipguard doctor``: its click command and its body (:func:`_doctor`): the host probed,
its checks (:mod:`pipguard.cli.doctor_checks`) shown as a table or JSON, exit 1 when the
default isolation would be degraded.

Imports only the report's renderers and the CLI's own helpers at module level (the click
application imports every command to build itself): the checks, the host probe, the
sandbox user and the VM probe where the command runs.
"""

from __future__ import annotations

from typing import Any

from pipguard import exitcodes
from pipguard.report import render
from pipguard.report.render import safe


def click_command(click, group) -> Any:
    """``pipguard doctor``, as a click command of ``group``."""

    @group.command()
    @click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
    def doctor(fmt) -> None:
        """Show which sandbox layers this host supports.

        Exits 1 when the default isolation (auto) would be degraded, so CI can gate on it.
        """
        _doctor(fmt)

    return doctor


def _doctor(fmt) -> None:
    import json

    import click

    from pipguard.cli import doctor_checks
    from pipguard.sandbox import host, sandbox_user, uidlease
    from pipguard.sandbox.vm import qemu

    # first: what runs killed mid-way left (every run does the same before it starts)
    restored = uidlease.replay_stale(again=True)
    facts = host.probe()
    checks = (doctor_checks.checks(facts)
              + [doctor_checks.limits_check(), doctor_checks.stale_grants_check(restored, sandbox_user.needed())]
              + doctor_checks.vm_checks(qemu.probe()))
    degraded = doctor_checks.default_isolation_degraded(checks)
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
