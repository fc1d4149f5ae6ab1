#!/usr/bin/env python3
"""What real sdist builds use of pipguard's resource limits, per hook call.

Each package is installed from its sdist with ``pipguard install --sandbox
--report R --python VENV`` into a fresh venv, offline (``--no-index
--find-links`` the cache folders; fetch them first, see docs/sandbox.md,
"Resource limits"), with this machine's pip configuration neutralised (as
benchmarks/bench.py: every PIP_*/PYTHON* variable dropped,
PIP_CONFIG_FILE=/dev/null, HOME a temporary directory). The report's
``phases`` carry each hook call's ``limits``: value, mechanism, and ``used``
(the run's cgroup peaks, or the keeper's rusage). Printed: a Markdown table
per hook call (wall time, memory peak, process peak, CPU seconds, bytes
written, largest file written) and the defaults beside them; ``--json FILE``
keeps every phase's ``limits`` and the machine.

A measuring tool, not a test: nothing here is asserted, except that each
install exits 0 and its module imports afterwards (else the row says FAILED).

    python benchmarks/limits_usage.py --packages msgpack==1.1.0,numpy==2.0.2 \\
        --find-links ~/.cache/pipguard-bench/dist --find-links ~/.cache/pipguard-limits/dist
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import clean_env, log, timed  # noqa: E402  (the same neutralised pip environment)

#: module to import afterwards, by distribution name
MODULES = {"msgpack": "msgpack._cmsgpack", "numpy": "numpy._core._multiarray_umath"}
MIB = 1 << 20


def _mib(value) -> str:
    return "—" if value is None else f"{value / MIB:,.1f}"


def install(spec: str, args, root: str) -> dict:
    name = spec.split("==")[0]
    base = tempfile.mkdtemp(prefix=name + "-", dir=root)
    venv, home, report = os.path.join(base, "venv"), os.path.join(base, "home"), os.path.join(base, "r.json")
    os.mkdir(home)
    env = dict(clean_env(write_bytecode=False), HOME=home)
    subprocess.run([args.python, "-m", "venv", venv], check=True, env=env)
    links = [x for d in args.find_links for x in ("--find-links", os.path.expanduser(d))]
    cmd = [*args.pipguard, "install", "--sandbox", "--report", report, "--python",
           os.path.join(venv, "bin", "python"), "--no-index", *links, "--no-cache-dir",
           "--no-binary", name, "--no-deps", spec]
    log(f"$ {' '.join(cmd)}")
    rc, seconds = timed(cmd, base, os.path.join(base, "log.txt"), env, timeout=args.timeout)
    result = {"spec": spec, "exit": rc, "seconds": round(seconds, 1), "log": os.path.join(base, "log.txt"),
              "command": cmd}
    if rc == 0:
        check = subprocess.run([os.path.join(venv, "bin", "python"), "-c", f"import {MODULES.get(name, name)}"],
                               env=env, cwd=base, capture_output=True, text=True)
        result["imports"] = check.returncode == 0
    if os.path.exists(report):
        with open(report) as fh:
            data = json.load(fh)
        result["verdict"] = data.get("verdict")
        result["phases"] = [{k: p.get(k) for k in ("name", "package", "exit_code", "duration", "limits",
                                                    "limit_hit")} for p in data.get("phases") or ()]
    return result


def table(results: List[dict]) -> str:
    rows = ["| package | hook call | wall s | memory peak MiB | processes peak | CPU s | written MiB "
            "| largest file MiB |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        if r["exit"] != 0 or not r.get("imports"):
            rows.append(f"| {r['spec']} | FAILED (exit {r['exit']}, log {r['log']}) |||||||")
            continue
        for p in r.get("phases") or ():
            used = {k: (v.get("used") or {}) for k, v in (p.get("limits") or {}).items()}
            cpu = used.get("cpu", {}).get("value")
            rows.append(
                f"| {r['spec']} | {p['name']} | {p['duration']:.1f} | {_mib(used.get('memory', {}).get('value'))} "
                f"| {used.get('processes', {}).get('value') or '—'} | {'—' if cpu is None else f'{cpu:.1f}'} "
                f"| {_mib(used.get('write', {}).get('value'))} | {_mib(used.get('write', {}).get('largest_file'))} |")
    return "\n".join(rows)


def how(results: List[dict]) -> Dict[str, str]:
    """limit -> mechanism that measured it (from the first phase)."""
    for r in results:
        for p in r.get("phases") or ():
            return {k: f"{v['by']} limit; used: {v['used']['how']}" for k, v in (p.get("limits") or {}).items()}
    return {}


def defaults() -> Dict[str, float]:
    from pipguard.sandbox import limits
    from pipguard.sandbox.policy import Policy

    policy = Policy()
    return {"memory": policy.limit_memory or limits.default_memory(), "processes": policy.limit_processes,
            "cpu": policy.limit_cpu, "write": policy.limit_write}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--packages", default="msgpack==1.1.0,numpy==2.0.2")
    p.add_argument("--find-links", action="append", default=[],
                   help="offline package folders (repeatable): the sdists and their build requirements")
    p.add_argument("--python", default=sys.executable, help="interpreter of the target venvs")
    p.add_argument("--pipguard", default=f"{sys.executable} -m pipguard")
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--workdir", default=None)
    p.add_argument("--keep", action="store_true", help="keep the venvs and logs")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    args.pipguard = args.pipguard.split()
    root = tempfile.mkdtemp(prefix="pipguard-limits-", dir=args.workdir)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    try:
        results = [install(spec, args, root) for spec in args.packages.split(",")]
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    machine = {"date": started, "kernel": platform.release(), "cpus": os.cpu_count(),
               "ram_mib": os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // MIB,
               "python": platform.python_version(), "euid": os.geteuid(),
               "loadavg_after": os.getloadavg()}
    print(f"# Resource use of real builds under pipguard install --sandbox\n\n{machine}\n")
    print(table(results))
    d = defaults()
    print(f"\nDefaults: memory {_mib(d['memory'])} MiB, processes {d['processes']}, "
          f"CPU {d['cpu']:.0f} s, largest file {_mib(d['write'])} MiB")
    for name, text in how(results).items():
        print(f"- {name}: {text}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"machine": machine, "defaults": d, "results": results}, fh, indent=2)
    return 0 if all(r["exit"] == 0 and r.get("imports") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
