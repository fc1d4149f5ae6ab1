"""The package corpus under ``tests/packages/`` and a plain (unsandboxed) pip build helper."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from .sdist import SHARED_ATTACK  # noqa: F401 (defined where sdists get it)

PACKAGES = Path(__file__).resolve().parent.parent / "packages"

#: name -> (fake secret it goes for, or None; one line on what it does)
HOSTILE: Dict[str, tuple] = {
    "steal_at_build": ("id_rsa", "setup.py reads ~/.ssh/id_rsa and sends it to the sink on every "
                       "setup.py run (metadata and wheel) and again from build_py"),
    "steal_at_metadata": ("pypirc", "in-tree PEP 517 backend steals ~/.pypirc in "
                          "get_requires_for_build_wheel / prepare_metadata_for_build_wheel"),
    "native_helper": ("id_rsa", "setup.py compiles and runs a C program that open(2)s ~/.ssh/id_rsa "
                      "and connect(2)s to the sink"),
    "env_grandchild": ("aws", "setup.py runs a Python grandchild with env={} that reads "
                       "~/.aws/credentials by absolute path and sends it"),
    "pth_dropper": (None, "wheel ships evil.pth at its top level: import os; os.system('echo pwned')"),
    "bashrc_persist": (None, "setup.py appends to ~/.bashrc and writes ~/.config/autostart/evil.desktop"),
    "dns_exfil": ("id_rsa", "setup.py hex-encodes ~/.ssh/id_rsa into <hex>.exfil.invalid and resolves "
                  "it (getaddrinfo; or a raw query to PIPGUARD_TEST_DNS)"),
}
LEGIT: Dict[str, str] = {
    "legit_pure": "clean pure-Python package: one module, one console script (legit-pure)",
    "legit_cext": "clean package with a C extension legit_cext._fast.add(a, b)",
}
#: Line a persistence package adds to ~/.bashrc.
PERSIST_MARK = "PIPGUARD-PERSIST"


def project(name: str) -> Path:
    p = PACKAGES / name
    if not (p / "setup.py").exists():
        raise FileNotFoundError(f"no corpus project {name!r} in {PACKAGES}")
    return p


def copy_project(name: str, dest: os.PathLike) -> Path:
    """A working copy of corpus project ``name`` at ``dest``, as its sdist unpacks (with the
    shared attack library its sdist gets): for tests that run a project's files directly."""
    import shutil

    target = Path(dest)
    shutil.copytree(project(name), target)
    if name in HOSTILE:
        shutil.copy(SHARED_ATTACK, target / SHARED_ATTACK.name)
    return target


def all_projects() -> List[str]:
    return sorted(list(HOSTILE) + list(LEGIT))


def pip_wheel(sdist: os.PathLike, out_dir: os.PathLike, wheelhouse: os.PathLike, env: dict,
              python: str = sys.executable, extra: Sequence[str] = (), timeout: float = 600,
              preexec_fn=None, cwd: Optional[os.PathLike] = None) -> subprocess.CompletedProcess:
    """``python -m pip wheel --no-deps --no-index --find-links WH -w OUT -v SDIST`` (no sandbox).

    ``-v`` makes pip show the build backend's stderr, where corpus packages print their
    ``attempt <what>: <result>`` lines. stdout and stderr are merged into ``.stdout``.
    """
    argv = [python, "-m", "pip", "wheel", "--no-deps", "--no-index", "--no-cache-dir",
            "--find-links", str(wheelhouse), "-w", str(out_dir), "-v", *extra, str(sdist)]
    return subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=timeout, preexec_fn=preexec_fn, cwd=cwd)


def attempts(output: str) -> List[str]:
    """The ``attempt <what>: <result>`` lines in a build log (pip may prefix them; stripped)."""
    out = []
    for line in output.splitlines():
        i = line.find("attempt ")
        if i != -1 and ": " in line[i:]:
            out.append(line[i:].strip())
    return out
