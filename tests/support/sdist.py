"""Build real sdists from corpus project directories with the stdlib only (no network, no backend)."""
from __future__ import annotations

import io
import os
import re
import tarfile
from pathlib import Path
from typing import Optional, Tuple

#: Fixed mtime for reproducible archives; must be after 1980 (zip, hence wheels, cannot go earlier).
MTIME = 1_700_000_000
SKIP_DIRS = {"__pycache__", "build", "dist", ".eggs", ".git"}
ATTACK_MODULE = "pgattack.py"
SHARED_ATTACK = Path(__file__).resolve().parent.parent / "packages" / "_shared" / ATTACK_MODULE


def project_name_version(src: Path) -> Tuple[str, str]:
    """Read the ``name=``/``version=`` keywords of the last ``setup(`` call in ``setup.py`` (corpus
    convention), else ``name =``/``version =`` in ``pyproject.toml``."""
    for fname in ("setup.py", "pyproject.toml"):
        p = src / fname
        if not p.exists():
            continue
        text = p.read_text()
        if fname == "setup.py" and "setup(" in text:
            text = text[text.rindex("setup("):]  # the call's keywords, not other `name = ...` lines
        name = re.search(r"""\bname\s*=\s*["']([A-Za-z0-9_.-]+)["']""", text)
        version = re.search(r"""\bversion\s*=\s*["']([A-Za-z0-9_.+!-]+)["']""", text)
        if name and version:
            return name.group(1), version.group(1)
    raise ValueError(f"{src}: no name=/version= found in setup.py or pyproject.toml")


def build_sdist(src_dir: os.PathLike, out_dir: os.PathLike, name: Optional[str] = None,
                version: Optional[str] = None) -> Path:
    """Write ``out_dir/<name>-<version>.tar.gz`` with top directory ``<name>-<version>/``: every
    file of ``src_dir`` (minus build output and caches) plus a ``PKG-INFO``. Returns its path.

    ``name``/``version`` default to what ``project_name_version`` finds; the name is normalised
    the PEP 625 way (runs of ``-_.`` become ``_``).
    """
    src = Path(src_dir)
    found = project_name_version(src) if name is None or version is None else (name, version)
    name = name or found[0]
    version = version or found[1]
    dist = re.sub(r"[-_.]+", "_", name)
    top = f"{dist}-{version}"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"{top}.tar.gz"
    pkg_info = (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                f"Summary: pipguard test corpus project {name}\n").encode()

    def add_bytes(tar: tarfile.TarFile, arcname: str, data: bytes, mode: int = 0o644) -> None:
        info = tarfile.TarInfo(arcname)
        info.size, info.mtime, info.mode = len(data), MTIME, mode
        info.uname = info.gname = "root"
        tar.addfile(info, io.BytesIO(data))

    with tarfile.open(target, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        files = []
        for root, dirs, names in os.walk(src):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info"))
            files += [Path(root) / n for n in names if not n.endswith((".pyc", ".o", ".so"))]
        for path in sorted(files):
            rel = path.relative_to(src).as_posix()
            mode = 0o755 if os.access(path, os.X_OK) else 0o644
            add_bytes(tar, f"{top}/{rel}", path.read_bytes(), mode)
        if not (src / "PKG-INFO").exists():
            add_bytes(tar, f"{top}/PKG-INFO", pkg_info)
        if not (src / ATTACK_MODULE).exists() and any(
                path.suffix == ".py" and b"pgattack" in path.read_bytes() for path in files):
            # the corpus's shared attack primitives: one file in the tree, added to each
            # hostile sdist when it is built (an sdist must be self-contained)
            add_bytes(tar, f"{top}/{ATTACK_MODULE}", SHARED_ATTACK.read_bytes())
    return target
