"""Run the real ``pipguard`` CLI in a subprocess and load its JSON report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    report: Optional[dict]

    def blocked(self, kind: Optional[str] = None, rule: Optional[str] = None,
                layer: Optional[str] = None) -> List[dict]:
        events = (self.report or {}).get("events", [])
        return [e for e in events if e["action"] == "blocked"
                and (kind is None or e["kind"] == kind)
                and (rule is None or e["rule"] == rule)
                and (layer is None or layer in e["detail"].get("seen_by", [e["layer"]]))]

    def targets(self, **kw) -> List[str]:
        return [e["target"] for e in self.blocked(**kw)]


def pipguard(args: Sequence[str], *, cwd: os.PathLike, env: dict, timeout: float = 180,
             report: bool = True, stdin=subprocess.DEVNULL) -> Result:
    """``pipguard <args>`` with ``--report`` inserted after the subcommand."""
    args = list(args)
    report_path = Path(cwd) / ".pipguard-test-report.json"
    if report and args and args[0] == "run":
        args = ["run", "--report", str(report_path)] + args[1:]
    if report_path.exists():
        report_path.unlink()
    proc = subprocess.run([sys.executable, "-m", "pipguard", *args], cwd=cwd, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout, stdin=stdin)
    data = json.loads(report_path.read_text()) if report_path.exists() else None
    return Result(proc.returncode, proc.stdout, proc.stderr, data)


def run_os(argv: Sequence[object], work: os.PathLike, home, *extra: str, env_extra: Optional[dict] = None,
           fake_tokens: bool = False, timeout: float = 180, complete: bool = False) -> Result:
    """``pipguard run --isolation os [EXTRA] -- ARGV`` in ``work`` with the fake home's
    environment. ``complete``: also assert that a report came back with every OS-layer part
    applied (the evidence tests need all of them)."""
    r = pipguard(["run", "--isolation", "os", *extra, "--", *map(str, argv)],
                 cwd=work, env=home.env(env_extra, fake_tokens=fake_tokens), timeout=timeout)
    if complete:
        assert r.report is not None, r.stderr
        assert r.report["isolation"]["requested"] == "os" and not r.report["isolation"]["unavailable"]
    return r
