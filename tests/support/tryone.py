"""The try-one-action helper (tests/helpers/try_one.{c,py}): build it and parse its JSON line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import List, Sequence

HELPERS = Path(__file__).resolve().parent.parent / "helpers"
TRY_ONE_C = HELPERS / "try_one.c"
TRY_ONE_PY = HELPERS / "try_one.py"


def compile_try_one(out_dir: os.PathLike, cc: str = "gcc") -> Path:
    """Compile ``try_one.c`` to ``out_dir/try_one`` (0o755, so ``nobody`` can run it too)."""
    out = Path(out_dir) / "try_one"
    subprocess.run([cc, "-O1", "-Wall", "-Werror", "-o", str(out), str(TRY_ONE_C)], check=True,
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    os.chmod(out, 0o755)
    return out


def try_one_py_argv(python: str = sys.executable) -> List[str]:
    return [python, "-I", str(TRY_ONE_PY)]


def parse(stdout: str) -> dict:
    """The result object from the helper's (last) output line."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise ValueError(f"no JSON line in try_one output: {stdout!r}")
    return json.loads(lines[-1])


def run_try_one(prefix: Sequence[str], action: str, *args, **kw) -> dict:
    """Run ``prefix + [action, *args]`` (prefix: ``[try_one_bin]`` or ``try_one_py_argv()``, possibly
    behind a sandbox launcher) and return its parsed result. ``kw`` goes to ``subprocess.run``."""
    kw.setdefault("timeout", 60)
    proc = subprocess.run(list(prefix) + [action] + [str(a) for a in args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, **kw)
    result = parse(proc.stdout)
    result["_returncode"] = proc.returncode
    return result
