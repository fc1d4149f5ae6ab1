#!/usr/bin/env python3
"""Where the time of one ``pipguard install --sandbox`` goes, against plain pip, from the kernel's
own record of every process's exec and exit (tracefs ``sched_process_exec``/``_exit``).

Needs root and tracefs (mounted here at /sys/kernel/tracing if it is not). Runs plain pip and
``pipguard install --sandbox`` alternately, ``--rounds`` times each, installing PKG from its sdist
in the benchmark's cache (``benchmarks/bench.py --fetch-only`` fills it) into a fresh venv, offline
(``--no-index --find-links CACHE --no-binary PKG --no-deps --no-cache-dir``, this machine's pip
configuration neutralised as in bench.py), and prints the medians of each phase in ms:

  pipstart        pipguard's exec to pip's exec (plain: 0)
  buildenv_start  pip's exec to the exec of the pip subprocess that fills the build environment
  buildenv_dur    that subprocess's life
  gap0            its exit to the first hook call (plain: the hook's exec; pipguard: the
                  placeholder ``/bin/sh`` pip starts instead, see pipguard/install/_seam/target.py)
  launch          pipguard only: the placeholder's exec to the hook's exec (the sandbox's start)
  hook            the hook process's life (exec to exit), per call
  exit            pipguard only: the hook's exit to the placeholder's exit (pipguard's answer)
  gap             between two calls (pip's own work)
  tail            the last call's end to pip's exit (the gate, pip installing the wheel)
  after_pip       pip's exit to pipguard's exit
  total           the whole command

Nothing is asserted: a measuring tool. Usage::

    python benchmarks/trace_calls.py idna==3.10 --rounds 5 --pipguard /tmp/pgb/bin/pipguard
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List, Tuple

TRACEFS = "/sys/kernel/tracing"
EVENTS = ("sched_process_exec", "sched_process_exit")
PHASES = ("pipstart", "buildenv_start", "buildenv_dur", "gap0", "launch", "hook", "exit", "gap", "tail",
          "after_pip", "total")
_LINE = re.compile(r"\s([\d.]+): (sched_process_\w+): (.*)")


def _write(name: str, value: str) -> None:
    with open(os.path.join(TRACEFS, name), "w") as handle:
        handle.write(value)


def traced(cmd: List[str], env: Dict[str, str]) -> List[Tuple[float, float, str]]:
    """Run ``cmd``; (exec time, exit time, program) of every process that exec'd and exited meanwhile."""
    _write("tracing_on", "0")
    _write("trace", "")
    _write("buffer_size_kb", "8192")
    _write("trace_clock", "mono")
    for event in EVENTS:
        _write(f"events/sched/{event}/enable", "1")
    _write("tracing_on", "1")
    try:
        subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    finally:
        _write("tracing_on", "0")
        for event in EVENTS:
            _write(f"events/sched/{event}/enable", "0")
    with open(os.path.join(TRACEFS, "trace")) as handle:
        text = handle.read()
    execs: Dict[int, Tuple[float, str]] = {}
    lives = []
    for line in text.splitlines():
        match = _LINE.search(line)
        if not match:
            continue
        when, event, rest = float(match.group(1)), match.group(2), match.group(3)
        pid = re.search(r"\bpid=(\d+)", rest)
        if pid is None:
            continue
        if event == "sched_process_exec":
            program = re.search(r"filename=(\S+)", rest)
            execs[int(pid.group(1))] = (when, program.group(1) if program else "?")
        elif int(pid.group(1)) in execs:
            start, program = execs.pop(int(pid.group(1)))
            lives.append((start, when, program))
    return sorted(lives)


def phases(lives: List[Tuple[float, float, str]], python: str, pipguard: bool) -> Dict[str, List[float]]:
    """The phases (module docstring) of one traced install, in seconds."""
    out: Dict[str, List[float]] = {name: [] for name in PHASES}
    pythons = [life for life in lives if life[2] == python]
    pip = max(pythons, key=lambda life: life[1] - life[0])  # the longest-lived: pip itself
    top = next((life for life in lives if life[2].endswith("/pipguard")), pip) if pipguard else pip
    others = sorted(life for life in pythons if life is not pip)
    if not others:
        raise RuntimeError("no build-environment pip and no hook ran: the install failed or was cached")
    buildenv, hooks = others[0], others[1:]
    out["pipstart"].append(pip[0] - top[0])
    out["buildenv_start"].append(buildenv[0] - pip[0])
    out["buildenv_dur"].append(buildenv[1] - buildenv[0])
    if pipguard:
        calls = sorted(life for life in lives if life[2] == "/bin/sh" and life[0] > buildenv[1])
        out["gap0"].append(calls[0][0] - buildenv[1])
        for placeholder, hook in zip(calls, hooks):
            out["launch"].append(hook[0] - placeholder[0])
            out["hook"].append(hook[1] - hook[0])
            out["exit"].append(placeholder[1] - hook[1])
    else:
        calls = hooks
        out["gap0"].append(hooks[0][0] - buildenv[1])
        out["hook"].extend(hook[1] - hook[0] for hook in hooks)
    out["gap"].extend(b[0] - a[1] for a, b in zip(calls, calls[1:]))
    out["tail"].append(pip[1] - calls[-1][1])
    out["after_pip"].append(top[1] - pip[1])
    out["total"].append(top[1] - top[0])
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("package", help="NAME==VERSION of a sdist in the cache")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--cache", default=os.path.expanduser("~/.cache/pipguard-bench"))
    p.add_argument("--pipguard", default=shutil.which("pipguard") or "pipguard")
    p.add_argument("--python", default=sys.executable, help="the interpreter of the venvs")
    args = p.parse_args()
    if os.geteuid() != 0:
        p.error("needs root (tracefs)")
    if not os.path.isdir(os.path.join(TRACEFS, "events")):
        subprocess.run(["mount", "-t", "tracefs", "nodev", TRACEFS], check=True)
    name = args.package.split("==")[0]
    dist = os.path.join(args.cache, "dist")
    pip_args = ["install", "-q", "--no-index", "--find-links", dist, "--no-cache-dir", "--no-binary", name,
                "--no-deps", args.package]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE="/dev/null", PYTHONDONTWRITEBYTECODE="1")
    sums: Dict[str, Dict[str, List[float]]] = {"plain": {n: [] for n in PHASES},
                                               "pipguard": {n: [] for n in PHASES}}
    with tempfile.TemporaryDirectory(prefix="pg-trace-") as work:
        venv = os.path.join(work, "venv")
        python = os.path.join(venv, "bin", "python")
        for _ in range(args.rounds):
            for variant in ("plain", "pipguard"):
                shutil.rmtree(venv, ignore_errors=True)
                subprocess.run([args.python, "-m", "venv", venv], check=True)
                cmd = ([python, "-m", "pip", *pip_args] if variant == "plain" else
                       [args.pipguard, "install", "--sandbox", "--python", python, *pip_args[1:]])
                for key, values in phases(traced(cmd, env), python, variant == "pipguard").items():
                    sums[variant][key].extend(values)
    print(f"{args.package}, {args.rounds} rounds, medians in ms (pipguard: {args.pipguard})")
    print(f"{'phase':15} {'plain':>8} {'pipguard':>9} {'diff':>8}")
    for key in PHASES:
        plain = statistics.median(sums["plain"][key]) * 1000 if sums["plain"][key] else float("nan")
        guarded = statistics.median(sums["pipguard"][key]) * 1000 if sums["pipguard"][key] else float("nan")
        print(f"{key:15} {plain:8.1f} {guarded:9.1f} {guarded - plain:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
