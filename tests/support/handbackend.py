"""A project with an in-tree PEP 517 backend that writes its wheel by hand: the members, the
prepared metadata and the wheel's metadata are the test's to choose (a build that says one thing
to pip's resolver and ships another; member names no real backend writes)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Optional, Sequence

BACKEND_SOURCE = r'''
import base64, hashlib, json, os, zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
CFG = json.load(open(os.path.join(HERE, "hand.json")))
INFO = "%s-%s.dist-info" % (CFG["name"], CFG["version"])


def _metadata(requires, body=0):
    lines = ["Metadata-Version: 2.1", "Name: " + CFG["name"], "Version: " + CFG["version"]]
    lines += ["Requires-Dist: " + r for r in requires]
    return ("\n".join(lines) + "\n\n").encode() + b"." * body


WHEEL = b"Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    d = os.path.join(metadata_directory, INFO)
    os.makedirs(d)
    with open(os.path.join(d, "METADATA"), "wb") as f:
        f.write(_metadata(CFG["prepared_requires"]))
    with open(os.path.join(d, "WHEEL"), "wb") as f:
        f.write(WHEEL)
    return INFO


def _b64(data):
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = "%s-%s-py3-none-any.whl" % (CFG["name"], CFG["version"])
    members = {k: v.encode() for k, v in CFG["members"].items()}
    members[INFO + "/METADATA"] = _metadata(CFG["built_requires"], CFG.get("built_body", 0))
    members[INFO + "/WHEEL"] = WHEEL
    rows = ["%s,sha256=%s,%d" % (p, _b64(d), len(d)) for p, d in members.items()]
    rows.append(INFO + "/RECORD,,")
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as zf:
        for p, d in members.items():
            zf.writestr(p, d)
        zf.writestr(INFO + "/RECORD", "\n".join(rows) + "\n")
    return name
'''


def write_hand_project(root: Path, name: str, *, members: Dict[str, str],
                       prepared_requires: Sequence[str] = (), built_requires: Optional[Sequence[str]] = None,
                       version: str = "1.0", built_body: int = 0) -> Path:
    """``root/name``: a project whose backend (``hand_backend.py``, in the tree) prepares
    metadata with ``prepared_requires`` and builds a wheel of ``members`` whose METADATA says
    ``built_requires`` (default: the same), followed by a body of ``built_body`` bytes."""
    src = root / name
    src.mkdir(parents=True)
    (src / "hand_backend.py").write_text(BACKEND_SOURCE)
    (src / "hand.json").write_text(json.dumps({
        "name": name, "version": version, "members": members,
        "prepared_requires": list(prepared_requires), "built_body": built_body,
        "built_requires": list(prepared_requires if built_requires is None else built_requires)}))
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "hand_backend"\nbackend-path = ["."]\n\n'
        f'[project]\nname = "{name}"\nversion = "{version}"\n')
    return src
