"""Running ``pipguard install`` the way users do, for the install tests: target venvs with a
given pip, the two routes (a loopback index with credentials in PIP_INDEX_URL, and
--no-index --find-links), the byte-for-byte listing of an environment."""
from __future__ import annotations

import atexit
import base64
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import venv
from pathlib import Path
from typing import Optional

from .index import LoopbackIndex

PY = sys.executable
#: the pips tested: the venv's bundled one (23.2 on 3.11) and the newest (26.3, Python >= 3.10)
PIPS = ["bundled", "26.3"]
#: corpus projects every install test can name
CORPUS = ("legit_pure", "legit_cext", "steal_at_build", "steal_at_metadata", "native_helper",
          "pth_dropper", "bashrc_persist", "env_grandchild")


def make_venv(path: Path, pip: str, wheelhouse: Path) -> Path:
    """A venv at ``path`` with its bundled pip, or ``pip`` (a version) from the wheelhouse.

    Installing pip is most of a venv's cost (seconds; most install tests make one), so pip is
    installed once per process into a template venv; each venv is made by ``venv`` for its own
    path without pip and gets a copy of the template's site-packages (timestamps kept: the
    bytecode stays valid) and pip's scripts, their shebang and RECORD lines written as pip writes
    them for this path: the venv ``python -m venv`` (+ ``pip install``) makes, byte for byte
    (tests/test_tiers.py). A path pip would write another shebang form for is made the slow way."""
    new_bin = f"{path}/bin/"
    if len(new_bin) > 100 or any(c.isspace() for c in new_bin):  # distlib: a /bin/sh 'exec' wrapper
        return _make_venv_with_pip(path, pip, wheelhouse)
    template = _venv_template(pip, wheelhouse)
    # what `python -m venv --without-pip PATH` does, in this process (PY is sys.executable)
    venv.EnvBuilder(with_pip=False, symlinks=os.name != "nt").create(str(path))
    cfg = path / "pyvenv.cfg"  # its "command" line, as `python -m venv PATH` writes it
    cfg.write_text(cfg.read_text().replace(" -m venv --without-pip ", " -m venv ", 1))
    site = Path("lib") / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    shutil.copytree(template / site, path / site, symlinks=True, dirs_exist_ok=True)
    old = f"#!{template}/bin/".encode()
    rewritten = {}
    for script in (template / "bin").iterdir():
        if script.is_symlink() or not script.is_file() or not script.read_bytes().startswith(old):
            continue  # python and its links, the activate scripts: venv wrote this venv's own
        target = path / "bin" / script.name
        target.write_bytes(new_bin.encode().join([b"#!", script.read_bytes()[len(old):]]))
        shutil.copystat(script, target)
        rewritten[f"../../../bin/{script.name}"] = target
    for record in (path / site).glob("*.dist-info/RECORD"):
        lines = record.read_bytes().split(b"\n")
        for i, line in enumerate(lines):
            name = line.split(b",", 1)[0].decode()
            if name in rewritten:
                data = rewritten[name].read_bytes()
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                lines[i] = f"{name},sha256={digest},{len(data)}".encode() + line[len(line.rstrip(b"\r")):]
        record.write_bytes(b"\n".join(lines))
    return path


def _make_venv_with_pip(path: Path, pip: str, wheelhouse: Path) -> Path:
    subprocess.run([PY, "-m", "venv", str(path)], check=True)
    if pip != "bundled":
        subprocess.run([str(path / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index",
                        "-f", str(wheelhouse), f"pip=={pip}"], check=True,
                       env={"PATH": os.environ["PATH"], "PIP_CONFIG_FILE": os.devnull})
    return path


_TEMPLATES: dict = {}
#: set by tests/conftest.py in a pytest-xdist worker: a directory the session's workers share
#: (their basetemps' parent), so the templates are made once per session, not once per worker
SHARED_TEMPLATES: Optional[Path] = None


def _venv_template(pip: str, wheelhouse: Path) -> Path:
    """``python -m venv`` (+ ``pip install pip==<pip>``), made once per process and kept until it
    ends; in a pytest-xdist worker, once per session in SHARED_TEMPLATES, under a lock there (the
    first worker makes it, the others wait and copy from it; removed with the session's temp dir)."""
    if pip not in _TEMPLATES:
        if SHARED_TEMPLATES is None:
            base = Path(tempfile.mkdtemp(prefix="venv-template-"))
            atexit.register(shutil.rmtree, base, True)
            _TEMPLATES[pip] = _make_venv_with_pip(base / "venv", pip, wheelhouse)
        else:
            _TEMPLATES[pip] = _shared_template(SHARED_TEMPLATES, pip, wheelhouse)
    return _TEMPLATES[pip]


def _shared_template(shared: Path, pip: str, wheelhouse: Path) -> Path:
    venv, complete = shared / pip / "venv", shared / pip / "complete"
    shared.mkdir(parents=True, exist_ok=True)
    with open(shared / f"{pip}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not complete.exists():
            # made at its final path (its scripts name it): a worker that died half way left a
            # partial one without the mark, made again
            shutil.rmtree(venv.parent, ignore_errors=True)
            _make_venv_with_pip(venv, pip, wheelhouse)
            complete.touch()
    return venv


def other_python_venv(python: str, path: Path) -> Path:
    """A venv of another interpreter (``python -m venv``, its own bundled pip) at ``path``:
    made once per process and copied (3-4 s each with ensurepip). The copy runs as the venv
    ``python -m venv PATH`` makes (``pyvenv.cfg`` names the base interpreter, not the venv's
    path), except that pip's own console scripts keep the template's shebang: the tests run
    ``python -m pip``, as pipguard does."""
    key = ("other", python)
    if key not in _TEMPLATES:
        base = Path(tempfile.mkdtemp(prefix="venv-template-"))
        atexit.register(shutil.rmtree, base, True)
        subprocess.run([python, "-m", "venv", str(base / "venv")], check=True)
        _TEMPLATES[key] = base / "venv"
    shutil.copytree(_TEMPLATES[key], path, symlinks=True)
    return path


class Route:
    """How pip finds packages: ``index`` (a loopback PEP 503 index with credentials in
    PIP_INDEX_URL, as a private index has) or ``find-links`` (--no-index -f DIR)."""

    def __init__(self, kind, dirs):
        self.kind = kind
        self.dirs = list(dirs)
        self.index = LoopbackIndex(self.dirs).start() if kind == "index" else None

    def add(self, directory):
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.dirs.append(directory)
        if self.index:
            self.index.dirs.append(directory)
        return directory

    def args(self):
        if self.index:
            return []
        return ["--no-index", *[a for d in self.dirs for a in ("-f", str(d))]]

    def env(self):
        return {"PIP_INDEX_URL": self.index.url} if self.index else {}

    def stop(self):
        if self.index:
            self.index.stop()


def listing(venv: Path) -> dict:
    """path -> sha256 of every file in the environment (the 'unchanged' check)."""
    out = {}
    for root, _dirs, files in os.walk(venv):
        for name in files:
            path = Path(root, name)
            if path.is_symlink():
                out[str(path)] = "link:" + os.readlink(path)
            else:
                out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def pg_install(args, *, home, target, route, cwd, extra_env=None, command="install", timeout=600, raw=False):
    """``raw``: stdout and stderr as bytes, exactly (text mode reads ``\\r`` as a newline)."""
    report = Path(cwd) / "install-report.json"
    argv = [PY, "-m", "pipguard", command, *(["--sandbox"] if command == "install" else []),
            "--python", str(target / "bin" / "python"), *route.args(), "--report", str(report), *args]
    if command == "install" and "--no-sandbox" in args:
        argv.remove("--sandbox")
        argv.remove("--no-sandbox")
    env = home.env(dict(route.env(), **(extra_env or {})))
    proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=not raw, timeout=timeout)
    data = json.loads(report.read_text()) if report.exists() else None
    return proc, data


def pip_list(target: Path) -> dict:
    """name -> version of every distribution in the target venv (normalised names): what
    ``pip list --format=freeze`` prints, read from the venv's ``*.dist-info``/``*.egg-info`` here
    (``importlib.metadata``, the view pip's own metadata backend takes on CPython 3.11+) instead
    of starting pip in the venv: 0.6-1 s per call, and the install tests call it often."""
    import importlib.metadata

    (site,) = (target / "lib").glob("python*/site-packages")
    found = {}
    for dist in importlib.metadata.distributions(path=[str(site)]):
        name = dist.metadata["Name"]
        if name:  # pip skips a distribution whose metadata has no name, as this does
            found.setdefault(name.lower().replace("_", "-"), dist.version)
    return found


def site_import(target: Path, module: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(target / "bin" / "python"), "-c", f"import {module}"],
                          capture_output=True, text=True)
