"""``pipguard approve``: its click command and its body (:func:`_approve`): approvals for
what refused a run, read from its report, checked against the project's policy file, printed
or appended to it.

Imports only the CLI's own helpers at module level (the click application imports every
command to build itself): the approvals and the policy file where the command runs.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from pipguard import exitcodes
from pipguard.cli.output import _echo
from pipguard.errors import UsageError


def click_command(click, group) -> Any:
    """``pipguard approve``, as a click command of ``group``."""

    @group.command()
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

    return approve


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
