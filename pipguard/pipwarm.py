"""A pip of the target interpreter that starts while the sandboxed build runs.

The last phase of ``pipguard install`` is an ordinary ``pip install`` of the
verified wheels, outside the sandbox (installing a wheel runs no package code).
About 0.3 s of that pip is importing itself (pip 23: ``pip._internal`` and its
install command), which costs the same for one package or fifty. ``WarmPip``
starts that interpreter at the beginning of the install, lets it import pip
while the build runs (on another CPU, mostly), and only then tells it what to
run, or to exit without doing anything. Nothing it runs is decided before the
gate has passed: until it reads a command line it only imports pip.
"""

from __future__ import annotations

import json
import subprocess
from typing import Dict, List, Sequence, Tuple

# Runs in the target interpreter. Only pip's own modules are imported before
# the command arrives; an empty line (or EOF) means "install nothing".
_WARM_SCRIPT = """\
import sys
try:
    import pip  # noqa: F401
except ImportError:
    sys.exit(3)  # no pip here: the caller runs `python -m pip`, for pip's own message
try:
    from pip._internal.commands import create_command
    create_command("install")
except Exception:
    pass  # an unusual pip: main() imports what it needs later
line = sys.stdin.readline()
if not line.strip():
    sys.exit(0)
import json
from pip._internal.cli.main import main
sys.exit(main(json.loads(line)))
"""


class WarmPip:
    """``python -m pip ARGS`` with the import done ahead of time.

    ``run`` gives (exit status, combined output) like ``subprocess.run`` would;
    if the warm process died before its command (no pip, a broken
    environment), the command runs in a fresh ``python -m pip`` instead, so the
    error the user sees is pip's own. ``close`` ends an unused warm process.
    """

    def __init__(self, python: str, env: Dict[str, str]) -> None:
        self._python = python
        self._env = env
        self._proc = subprocess.Popen([python, "-c", _WARM_SCRIPT], env=env, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def run(self, args: Sequence[str]) -> Tuple[int, str]:
        if self._proc.poll() is None:
            try:
                out, _ = self._proc.communicate(json.dumps(list(args)) + "\n")
                return self._proc.returncode, out
            except BrokenPipeError:  # it died between poll() and our write
                self._proc.wait()
        cold: List[str] = [self._python, "-m", "pip", *args]
        proc = subprocess.run(cold, env=self._env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        return proc.returncode, proc.stdout

    def close(self) -> str:
        """End a warm process that got no command; returns what it printed."""
        if self._proc.returncode is not None:
            return ""
        try:
            return self._proc.communicate("\n", timeout=30)[0]
        except (BrokenPipeError, subprocess.TimeoutExpired):
            self._proc.kill()
            self._proc.wait()
            return ""
