"""Start-up files: what makes installed code run at every interpreter start without being
imported, judged as CPython's ``site.py`` reads it. A site-level ``.pth`` file's lines
(:func:`check_pth`: an ``import`` line is executed, any other line is a path put on
``sys.path``), and a top-level ``sitecustomize``/``usercustomize`` module or package
(:func:`check_startup_module`). The wheel rules (:mod:`scan`) apply them to what a wheel puts
in a site directory; the project-tree check (:mod:`projecttree`) to what a build left in the
user's project. Known tools' hooks are recognised by their syntax tree (:mod:`pthshapes`).
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from typing import Callable, FrozenSet, List, Optional, Tuple

from pipguard.gate import pthshapes
from pipguard.gate.findings import CRITICAL, HIGH, INFO, FindingCollector
from pipguard.gate.wheelpaths import unsafe_path

#: A site-level ``.pth`` larger than this is not read; it is reported unread (fail closed).
MAX_PTH_BYTES = 10 * 1024 * 1024
_STARTUP_MODULES = ("sitecustomize", "usercustomize")
_IMPORTABLE_SUFFIXES = ("py", "pyc", "pyo", "pyw", "so", "pyd")


def decode_lines(data: bytes) -> List[Tuple[int, str]]:
    """The lines CPython's ``site.addpackage`` may see, numbered from 1.

    Python <= 3.12 reads the file in the locale encoding with universal newlines; 3.13+ decodes
    ``utf-8-sig`` (locale fallback) and uses ``str.splitlines``, which also splits at ``\\x0c``,
    ``\\x1c``-``\\x1e``, ``\\x85``, U+2028/9. Splitting with ``str.splitlines`` finds every line any
    of them executes (each executed line starts a finer line); decoding both as UTF-8 and as
    Latin-1 covers a non-UTF-8 locale.
    """
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    texts = [data.decode("utf-8", "surrogateescape")]
    if not data.isascii():
        texts.append(data.decode("latin-1"))
    out: List[Tuple[int, str]] = []
    seen = set()
    for text in texts:
        for n, line in enumerate(text.splitlines(), 1):
            if (n, line) not in seen:
                seen.add((n, line))
                out.append((n, line))
    return out


def normalise_pth_line(line: str) -> str:
    return " ".join(line.split()).rstrip(";").rstrip()


@dataclass(frozen=True)
class PthContext:
    """What a ``.pth`` line is judged against: who ships it, and what came with it.

    ``owner``: the wheel's canonical project name when its file name, ``.dist-info`` directory and
    METADATA agree (else ``""``: no shape restricted to an owner is accepted); ``editable_project``:
    the project directory the wheel was built editable from, ``None`` for any other wheel;
    ``root_module``: the source of a top-level module shipped in the same wheel, or ``None``.
    """

    owner: str
    editable_project: Optional[str]
    root_module: Callable[[str], Optional[bytes]]
    #: the site-level directories the wheel ships files in (``a``, ``a/b``...): an nspkg loader
    #: may only register a namespace the wheel itself fills
    package_dirs: FrozenSet[str] = frozenset()
    #: every file the wheel puts below a site directory (its path there): what a relative path
    #: entry puts on ``sys.path``
    site_files: FrozenSet[str] = frozenset()


def _inside(path: str, root: str) -> bool:
    """Is absolute ``path`` ``root`` or below it (after resolving symlinks, as the builder did)?"""
    if not os.path.isabs(path):
        return False
    real, base = os.path.realpath(path), os.path.realpath(root)
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


def _judge_exec_line(ctx: PthContext, line: str) -> Tuple[str, str]:
    """``(severity, message)`` for one line ``site.py`` would execute."""
    found = pthshapes.match_line(line)
    if found is None:
        return CRITICAL, ".pth line starting with 'import' is executed by site.py at every interpreter start"
    shape = found.shape
    does = shape.does.format(**found.details)
    if shape.owners and ctx.owner not in shape.owners:
        return CRITICAL, (f"the {shape.key} hook of {'/'.join(shape.owners)} in a wheel that is not "
                          f"{'/'.join(shape.owners)}: it runs at every interpreter start")
    if shape.key == "nspkg":
        namespace = found.details["namespace"]
        if namespace.split(".")[0] in stdlib_modules():
            return CRITICAL, (f"nspkg hook registering the standard library's {namespace!r} at every "
                              "interpreter start: it takes over that module's imports")
        if namespace.replace(".", "/") not in ctx.package_dirs:
            return CRITICAL, (f"nspkg hook for the namespace {namespace!r}, which this wheel ships no "
                              "files in: it takes over another package's imports")
    if shape.editable and ctx.editable_project is None:
        return CRITICAL, (f"{shape.key} hook in a wheel that was not built editable from a project you "
                          "gave: it runs at every interpreter start")
    if shape.companion:
        module = found.details["module"]
        source = ctx.root_module(module)
        if source is None:
            return CRITICAL, f"{shape.key} hook whose module {module}.py is not in this wheel"
        text = source.decode("utf-8", "surrogateescape")
        if shape.key == "setuptools-editable-finder":
            mapped = pthshapes.match_setuptools_finder(text, module)
        elif shape.key == "editables-bootstrap":
            mapped = pthshapes.match_editables_bootstrap(text)
        else:
            mapped = None
        if mapped is None:
            return CRITICAL, f"{shape.key} hook whose module {module}.py is not the one its tool writes"
        assert ctx.editable_project is not None  # companions are editable hooks only
        outside = [p for p in mapped.paths if not _inside(p, ctx.editable_project)]
        if outside:
            return CRITICAL, (f"{shape.key} hook maps packages outside the project "
                              f"{ctx.editable_project}: {outside[0]}")
    return INFO, f"recognised start-up hook ({shape.key}): {does}"


def stdlib_modules() -> FrozenSet[str]:
    """Top-level module names of the standard library (``sys.stdlib_module_names``; on Python
    3.9, the names in the stdlib directories and the built-in modules)."""
    global _STDLIB
    if _STDLIB is None:
        import sys

        names = getattr(sys, "stdlib_module_names", None)
        if names is None:  # pragma: no cover - Python 3.9
            import sysconfig

            found = set(sys.builtin_module_names)
            for key in ("stdlib", "platstdlib"):
                directory = sysconfig.get_paths()[key]
                for sub in (directory, os.path.join(directory, "lib-dynload")):
                    try:
                        found.update(n.split(".", 1)[0] for n in os.listdir(sub))
                    except OSError:
                        pass
            found.discard("site-packages")
            names = found
        _STDLIB = frozenset(names)
    return _STDLIB


_STDLIB: Optional[FrozenSet[str]] = None


def check_pth(col: FindingCollector, member: str, data: bytes, ctx: PthContext) -> None:
    """Apply CPython's ``site.addpackage`` reading of a site-level ``.pth`` file."""
    for n, line in decode_lines(data):
        if line.startswith("#") or line.strip() == "":
            continue
        # site.py: `if line.startswith(("import ", "import\t")): exec(line)`.
        if line.startswith(("import ", "import\t")):
            severity, message = _judge_exec_line(ctx, line)
            col.add(severity, "pth-exec" if severity == CRITICAL else "pth-known-hook", member,
                    message, line, n)
            continue
        path = line.rstrip()
        why = unsafe_path(path)
        if why is None:
            _check_path_entry(col, member, n, path, ctx)
            continue
        if (why == "absolute path" and ctx.editable_project is not None
                and _inside(path, ctx.editable_project)):
            col.add(INFO, "pth-editable-path", member,
                    f"editable install: adds {path} (in the project {ctx.editable_project}) to "
                    "sys.path at every interpreter start", path, n)
        else:
            col.add(HIGH, "pth-path-escape", member,
                    f".pth path entry outside site-packages ({why}): it is appended to sys.path at "
                    "every interpreter start", path, n)


def _check_path_entry(col: FindingCollector, member: str, n: int, path: str, ctx: PthContext) -> None:
    """A relative path entry of a site-level ``.pth``: ``site.py`` appends ``<site>/<path>`` to
    ``sys.path`` before it imports ``sitecustomize`` and ``usercustomize`` from anywhere on it,
    so a start-up module in that directory runs at every start like one at the top; a file
    there (a zip archive) is imported from by ``zipimport``, and the gate does not read inside."""
    entry = posixpath.normpath(path)
    if entry in (".", ""):
        return  # the site directory itself: its top level is judged member by member
    if entry in ctx.site_files:
        col.add(HIGH, "pth-path-archive", member,
                f".pth path entry names the wheel's file {entry}: an archive put on sys.path at every "
                "interpreter start, whose sitecustomize would run then (its contents are not checked)",
                path, n)
        return
    for rel in sorted(ctx.site_files):
        if rel.startswith(entry + "/"):
            mod = startup_module(rel[len(entry) + 1:])
            if mod is not None:
                col.add(CRITICAL, mod, member,
                        f"this .pth puts {entry}/ on sys.path, where the wheel ships '{mod}': site.py "
                        "imports it at every interpreter start", rel, n)


def startup_module(rel: str) -> Optional[str]:
    """The start-up module (``sitecustomize``/``usercustomize``) that ``rel``, a path relative to
    a directory on ``sys.path``, is part of; ``None`` for anything else."""
    parts = rel.split("/")
    head = parts[0].lower()
    for mod in _STARTUP_MODULES:
        if len(parts) > 1 and head == mod:
            return mod
        pieces = head.split(".")
        if len(parts) == 1 and pieces[0] == mod and len(pieces) > 1 and pieces[-1] in _IMPORTABLE_SUFFIXES:
            return mod
    return None


def check_startup_module(col: FindingCollector, member: str, rel: str) -> None:
    """``rel``: the member's path relative to a site-packages directory."""
    mod = startup_module(rel)
    if mod is not None:
        kind = "package" if "/" in rel else "module"
        col.add(CRITICAL, mod, member,
                f"top-level {kind} '{mod}' is imported by site.py at every interpreter start", rel)
