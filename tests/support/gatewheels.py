"""Released wheels the static gate is tested against, downloaded ONCE into the test cache.

A separate cache set from the build wheelhouse (``wheelhouse.py``): these wheels are read by the
gate (and setuptools ones are used to build editable wheels), never installed. The directory is
``~/.cache/pipguard-tests/gate`` (``PIPGUARD_TEST_CACHE=DIR`` moves it to ``DIR/gate``);
``PIPGUARD_OFFLINE=1`` never downloads. pip runs with this machine's ``PIP_*`` variables and
config neutralised (``env.clean_env``), ``--no-deps --only-binary :all:``.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, Iterable, Optional, Tuple

from .env import clean_env

INDEX_URL = os.environ.get("PIPGUARD_TEST_INDEX_URL", "https://pypi.org/simple")
#: Binary projects are fetched for this interpreter and platform unless a pin says otherwise:
#: the gate only reads them.
DEFAULT_TARGET = ("3.11", "cp311")
#: Pins whose release has no wheel for the default target.
TARGETS: Dict[str, Tuple[str, str]] = {"zope.interface==5.5.2": ("3.10", "cp310")}


class GateWheelsUnavailable(Exception):
    pass


def cache_dir() -> Path:
    root = os.environ.get("PIPGUARD_TEST_CACHE")
    base = Path(root) if root else Path(os.path.expanduser("~")) / ".cache" / "pipguard-tests"
    return base / "gate"


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # parallel sessions download each wheel once
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _wheel_for(directory: Path, pin: str) -> Optional[Path]:
    name, version = pin.split("==")
    # Wheel file names use the normalised name with "_" (PEP 427/491); older ones kept dots.
    stems = {name.lower().replace("-", "_"), name.lower().replace("-", "_").replace(".", "_")}
    for p in directory.glob("*.whl"):
        lower = p.name.lower()
        if any(lower.startswith(f"{stem}-{version}-") for stem in stems):
            return p
    return None


def _argv(pin: str, dest: Path) -> list:
    python, abi = TARGETS.get(pin, DEFAULT_TARGET)
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
            "--platform", "manylinux2014_x86_64", "--platform", "any",
            "--python-version", python, "--implementation", "cp",
            "--abi", abi, "--abi", "abi3", "--abi", "none",
            "--index-url", INDEX_URL, "-d", str(dest), pin]


def fetch(pins: Iterable[str]) -> Dict[str, Path]:
    """``{pin: wheel}`` for ``name==version`` pins, downloading the missing ones (under a lock).

    Raises ``GateWheelsUnavailable`` offline or when the index does not answer.
    """
    pins = tuple(pins)
    directory = cache_dir()
    with _locked(directory.parent / "gate.lock"):
        directory.mkdir(parents=True, exist_ok=True)
        missing = [p for p in pins if _wheel_for(directory, p) is None]
        if missing:
            if os.environ.get("PIPGUARD_OFFLINE") == "1":
                raise GateWheelsUnavailable(f"{missing} not cached in {directory} and PIPGUARD_OFFLINE=1")
            env = clean_env(os.path.expanduser("~"))
            for keep in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY",
                         "no_proxy", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT"):
                if keep in os.environ:
                    env[keep] = os.environ[keep]
            tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=directory.parent))
            try:
                # One pin per call: several versions of one project cannot share a resolve.
                for pin in missing:
                    proc = subprocess.run(_argv(pin, tmp), env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, universal_newlines=True,
                                          timeout=600)
                    if proc.returncode != 0:
                        tail = "\n".join(proc.stdout.splitlines()[-5:])
                        raise GateWheelsUnavailable(f"cannot download {pin} (offline?): {tail}")
                for wheel in tmp.glob("*.whl"):
                    os.replace(wheel, directory / wheel.name)  # appears complete or not at all
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        out = {p: _wheel_for(directory, p) for p in pins}
    absent = [p for p, w in out.items() if w is None]
    if absent:
        raise GateWheelsUnavailable(f"{absent} missing from {directory} after download")
    return out  # type: ignore[return-value]
