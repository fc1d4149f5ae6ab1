"""Run the real ``pipguard`` CLI in a subprocess and load its JSON report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

import pytest


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


def run_api(argv: Sequence[str], work: os.PathLike, home, *, record_build_dir: bool = False, **policy):
    """``pipguard.sandbox.run(ARGV, Policy(**policy))`` in ``work`` with the fake home's
    environment: the library's API, in this process (its Report)."""
    from pipguard import sandbox
    from pipguard.sandbox.policy import Policy

    return sandbox.run(list(argv), Policy(**policy), cwd=str(work), env=home.env(),
                       record_build_dir=record_build_dir)


# --- the launch backends, for the suites that run under each -----------------------------------

@dataclass(frozen=True)
class Backend:
    """One launch backend a suite runs under (the ``backend`` fixture, tests/conftest.py):
    ``plain`` (``--isolation os``: the host's filesystem, process table and network behind the
    OS layer) or ``ns`` (``--isolation ns``: the namespace backend, same layers inside)."""

    name: str

    @property
    def ns(self) -> bool:
        return self.name == "ns"

    @property
    def isolation(self) -> str:
        """The ``--isolation`` value that insists on this backend (exit 2 when it cannot)."""
        return "ns" if self.ns else "os"

    @property
    def install_args(self) -> List[str]:
        """Options for ``pipguard install --sandbox`` that insist on this backend (the default,
        ``auto``, chooses ns where it works: the plain parametrization names ``os``)."""
        return ["--isolation", self.isolation]


PLAIN = Backend("plain")
NS = Backend("ns")


def backend_param(name: str, *values, id: Optional[str] = None):
    """A ``pytest.param`` for the ``backend`` fixture (``indirect``), optionally together with
    other arguments: ``ns`` needs user namespaces (skipped without them, failed under
    PIPGUARD_REQUIRE_ALL_LAYERS=1). Use it to run only the representative case of a
    parametrized test under ns."""
    from support import requires

    marks = [requires("userns")] if name == "ns" else []
    return pytest.param(*values, name, marks=marks, id=id or "-".join([*map(str, values), name]))


#: the ``backend`` fixture's parameters: every backend the launcher starts
BACKEND_PARAMS = [backend_param("plain"), backend_param("ns")]


def cli(args, *, cwd, env, pass_fds=(), runner=subprocess.run, timeout=180) -> Result:
    """Like ``pg.pipguard`` with extra options for the subprocess (``pass_fds``, a runner)."""
    report_path = Path(cwd) / ".pipguard-test-report.json"
    args = ["run", "--report", str(report_path)] + list(args[1:])
    if report_path.exists():
        report_path.unlink()
    proc = runner([sys.executable, "-m", "pipguard", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                  stderr=subprocess.PIPE, universal_newlines=True, timeout=timeout,
                  stdin=subprocess.DEVNULL, pass_fds=pass_fds)
    data = json.loads(report_path.read_text()) if report_path.exists() else None
    return Result(proc.returncode, proc.stdout, proc.stderr, data)


def live_processes():
    """(pid, argv) of every live (non-zombie) process on the machine."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
            if stat[stat.rfind(b")") + 2:].split()[0] == b"Z":
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                out.append((int(entry), [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]))
        except OSError:
            continue
    return out


def live_argvs():
    """argv of every live (non-zombie) process on the machine."""
    return [argv for _pid, argv in live_processes()]


def run_os(argv: Sequence[object], work: os.PathLike, home, *extra: str, env_extra: Optional[dict] = None,
           fake_tokens: bool = False, timeout: float = 180, complete: bool = False,
           backend: Backend = PLAIN) -> Result:
    """``pipguard run --isolation os|ns [EXTRA] -- ARGV`` (the ``backend``'s) in ``work`` with
    the fake home's environment. ``complete``: also assert that a report came back with every
    OS-layer part applied (the evidence tests need all of them)."""
    r = pipguard(["run", "--isolation", backend.isolation, *extra, "--", *map(str, argv)],
                 cwd=work, env=home.env(env_extra, fake_tokens=fake_tokens), timeout=timeout)
    if complete:
        assert r.report is not None, r.stderr
        isolation = r.report["isolation"]
        assert isolation["requested"] == backend.isolation and not isolation["unavailable"], isolation
        assert ("ns" in isolation["applied"]) == backend.ns, isolation
    return r


def assert_decoy_read(r: Result, home, key: str, target, printed: bool = True) -> None:
    """Under ns a credential read *succeeds* on a decoy (the real home is not in the
    namespace): never the fake home's marker (``printed``: the command printed what it read,
    the decoy), and reported as ``decoy-read`` by the ns layer."""
    assert home.markers[key] not in r.stdout + r.stderr
    assert not printed or "pipguard-decoy-" in r.stdout, (r.stdout, r.stderr)
    found = r.blocked(kind="file-read", rule="decoy-read")
    assert str(target) in [e["target"] for e in found], r.report["events"]
    assert all(e["layer"] == "ns" for e in found) and r.report["verdict"] == "blocked"
