"""What a project's tree declares itself to be (an sdist's ``PKG-INFO``, else ``pyproject.toml``'s
``[project]``), read as pipguard: only regular files, never through a link (a previous hook call
could have written them). The hook calls name the package in the report by it, and the
project-tree check tells the project's own ``.egg-info`` from another distribution's.
"""

from __future__ import annotations

import email.parser
import os
from typing import Optional, Tuple

from pipguard.gate.treefiles import read_regular


def declared_identity(source_dir: str) -> Optional[Tuple[str, str]]:
    """(canonical name, version) the project in ``source_dir`` declares: PKG-INFO of an
    sdist, else pyproject.toml's ``[project]``; None when neither names it."""
    from packaging.utils import canonicalize_name

    # The previous hook call could write these (its own tree): read them as pipguard, not
    # sandboxed, only if each is a regular file — never through a symlink, a FIFO or a device.
    data = read_regular(os.path.join(source_dir, "PKG-INFO"))
    if data is not None:
        meta = email.parser.BytesParser().parsebytes(data, headersonly=True)
        if meta.get("Name"):
            return canonicalize_name(str(meta["Name"])), str(meta.get("Version") or "")
    try:
        project = load_toml(os.path.join(source_dir, "pyproject.toml")).get("project", {})
        if isinstance(project, dict) and isinstance(project.get("name"), str):
            version = project.get("version")
            return canonicalize_name(project["name"]), version if isinstance(version, str) else ""
    except (OSError, ValueError):
        pass
    return None


def load_toml(path: str) -> dict:
    """``path`` as TOML, read as pipguard: a regular file only (OSError otherwise)."""
    try:
        import tomllib  # Python >= 3.11
    except ImportError:  # pragma: no cover - depends on the interpreter
        import tomli as tomllib  # type: ignore[no-redef]
    data = read_regular(path)
    if data is None:
        raise OSError(f"{path}: not a regular file")
    return tomllib.loads(data.decode("utf-8"))


def declared_name(source_dir: str) -> Optional[str]:
    """The project's normalised name as its tree declares it (an sdist's PKG-INFO, else
    pyproject.toml's ``[project]``), or None: read as pipguard (never through a link)."""
    declared = declared_identity(source_dir)
    return declared[0] if declared is not None else None
