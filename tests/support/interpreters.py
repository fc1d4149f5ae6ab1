"""Other Python interpreters on this machine, for cross-version tests (pipguard supports 3.9+)."""
from __future__ import annotations

import glob
import os
import subprocess
from typing import Dict, Optional

#: Interpreters we look for first (pyenv layout); any other pyenv 3.9+ is added too.
KNOWN = ("/root/.pyenv/versions/3.9.18/bin/python", "/root/.pyenv/versions/3.13.0/bin/python")
PYENV_GLOB = os.path.expanduser("~root/.pyenv/versions/3.*/bin/python")


def _version(python: str) -> Optional[str]:
    try:
        out = subprocess.run([python, "-I", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             universal_newlines=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def python_versions(minimum=(3, 9)) -> Dict[str, str]:
    """``"3.9" -> "/root/.pyenv/versions/3.9.18/bin/python"`` for every working interpreter
    >= ``minimum`` found; empty when none (callers skip)."""
    found: Dict[str, str] = {}
    for python in list(KNOWN) + sorted(glob.glob(PYENV_GLOB)):
        if not os.access(python, os.X_OK):
            continue
        v = _version(python)
        if v and tuple(int(x) for x in v.split(".")) >= tuple(minimum) and v not in found:
            found[v] = python
    return dict(sorted(found.items(), key=lambda kv: tuple(int(x) for x in kv[0].split("."))))
