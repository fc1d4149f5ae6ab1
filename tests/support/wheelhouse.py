"""The offline wheelhouse: build requirements downloaded from the index ONCE, then reused.

The package index is used only here. Every sandboxed or control build runs with
``--no-index --find-links <wheelhouse>``. The directory defaults to
``~/.cache/pipguard-tests/wheelhouse`` (the real home, for the cache only);
``PIPGUARD_TEST_CACHE=DIR`` moves it to ``DIR/wheelhouse``. ``PIPGUARD_OFFLINE=1`` never downloads.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

from .env import clean_env

#: Pinned pure-Python wheels that work on Python 3.9 - 3.13.
#: setuptools 75.8.0: requires-python >= 3.9, ships bdist_wheel itself (no `wheel` needed at build).
#: wheel 0.45.1: for backends/old setuptools that still ask for it.
#: Cython 3.0.11: the universal py2.py3-none-any wheel (pure-Python compiler, slower but portable).
#: pip 26.3 (needs Python >= 3.10): a newer pip than the venvs' bundled one, with the import guard
#: its install command enters before installing (tests/test_pipwarm.py).
#: flit_core 4.1.0 (the buildtools pin too): the light backend of support.projects.write_flit_project.
PINS: Dict[str, str] = {
    "setuptools": "75.8.0",
    "wheel": "0.45.1",
    "Cython": "3.0.11",
    "pip": "26.3",
    "flit_core": "4.1.0",
}
#: Pins that need a newer Python than 3.9 to be downloaded for.
PIN_PYTHON: Dict[str, str] = {"pip": "3.10"}
#: Glob each pin must match in the wheelhouse.
EXPECTED: Dict[str, str] = {
    "setuptools": "setuptools-75.8.0-py3-none-any.whl",
    "wheel": "wheel-0.45.1-py3-none-any.whl",
    "Cython": "[Cc]ython-3.0.11-py2.py3-none-any.whl",
    "pip": "pip-26.3-py3-none-any.whl",
    "flit_core": "flit_core-4.1.0-py3-none-any.whl",
}
INDEX_URL = os.environ.get("PIPGUARD_TEST_INDEX_URL", "https://pypi.org/simple")


class WheelhouseUnavailable(Exception):
    pass


def wheelhouse_dir() -> Path:
    root = os.environ.get("PIPGUARD_TEST_CACHE")
    base = Path(root) if root else Path(os.path.expanduser("~")) / ".cache" / "pipguard-tests"
    return base / "wheelhouse"


def missing(directory: Path) -> List[str]:
    """Pins whose wheel is not in ``directory``."""
    return [name for name, pattern in EXPECTED.items() if not list(directory.glob(pattern))]


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # serialises parallel sessions (xdist workers, CI jobs)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _download(dest: Path) -> None:
    env = clean_env(os.path.expanduser("~"))
    for keep in ("PIP_CERT", "PIP_DEFAULT_TIMEOUT", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY",
                 "http_proxy", "NO_PROXY", "no_proxy", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
        if keep in os.environ:
            env[keep] = os.environ[keep]
    # Pure wheels for the oldest supported Python, so the same files serve 3.9 - 3.13.
    for version in sorted({PIN_PYTHON.get(n, "3.9") for n in PINS}):
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                "--platform", "any", "--implementation", "py", "--abi", "none",
                "--python-version", version, "--index-url", INDEX_URL, "-d", str(dest)]
        argv += [f"{n}=={v}" for n, v in PINS.items() if PIN_PYTHON.get(n, "3.9") == version]
        proc = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, timeout=600)
        if proc.returncode != 0:
            tail = "\n".join(proc.stdout.splitlines()[-8:])
            raise WheelhouseUnavailable(f"pip download from {INDEX_URL} failed ({proc.returncode}):\n{tail}")


def ensure_wheelhouse(directory: Optional[Path] = None) -> Path:
    """Return a wheelhouse holding every pin, downloading what is missing (once, under a lock)."""
    directory = directory or wheelhouse_dir()
    with _locked(directory.parent / (directory.name + ".lock")):
        if not missing(directory):
            return directory
        if os.environ.get("PIPGUARD_OFFLINE") == "1":
            raise WheelhouseUnavailable(f"{directory} lacks {missing(directory)} and PIPGUARD_OFFLINE=1")
        directory.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=directory.parent))
        try:
            _download(tmp)
            for wheel in tmp.iterdir():
                os.replace(wheel, directory / wheel.name)  # each file appears complete or not at all
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        still = missing(directory)
        if still:
            raise WheelhouseUnavailable(f"{directory} still lacks {still} after download")
        (directory / "pins.json").write_text(json.dumps(PINS, indent=1, sort_keys=True) + "\n")
        return directory
