"""Projects the install tests write and build: a setuptools project with a ``setup.py``
(:func:`write_project`), and the ``pyproject.toml`` of a project for any PEP 517 backend
(:func:`pyproject`)."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

BACKEND = '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'


def write_project(root: Path, name: str, version: str = "1.0", *, setup_extra: str = "",
                  pyproject: str = BACKEND, module_code: str = "VALUE = 1\n") -> Path:
    """A setuptools project ``root/name`` with package ``name.replace('-', '_')``."""
    pkg = name.replace("-", "_")
    src = root / name
    (src / pkg).mkdir(parents=True)
    (src / pkg / "__init__.py").write_text(module_code)
    (src / "pyproject.toml").write_text(pyproject)
    (src / "setup.py").write_text(textwrap.dedent(f"""\
        from setuptools import setup
        setup(name={name!r}, version={version!r}, packages=[{pkg!r}]{setup_extra})
        """))
    return src


def pyproject(name: str, requires: str, build_backend: str, *, version: str = "1.0",
              description: str = "", tail: str = "") -> str:
    """A ``pyproject.toml`` with its build system (one requirement) and ``[project]`` table;
    ``tail``: more TOML after it (a ``[tool.*]`` table)."""
    lines = ["[build-system]", f"requires = [{json.dumps(requires)}]",
             f"build-backend = {json.dumps(build_backend)}", "", "[project]",
             f"name = {json.dumps(name)}", f"version = {json.dumps(version)}"]
    if description:
        lines.append(f"description = {json.dumps(description)}")
    return "\n".join(lines) + "\n" + tail
