"""Namespace packages as an install leaves them: which ``.pth`` lines are setuptools' nspkg
loader and for which namespace (:func:`nspkg_namespaces`), which ``__init__.py`` only makes its
package a namespace (:func:`namespace_shim`), and whether a name is a regular package or module
on an import root (:func:`regular_module`). Read as pipguard (never run, never through more
than a bounded read: :class:`FileReader`); the ownership check (:mod:`ownership`) judges with it.
"""

from __future__ import annotations

import os
import zipfile
from typing import Dict, List, Optional, Tuple

from pipguard.gate.wheelpaths import import_name


def nspkg_namespaces(data: bytes) -> List[str]:
    """The namespaces a ``.pth`` file's setuptools nspkg lines register (:mod:`pthshapes`), its
    lines read as every ``site.py`` may read them (a UTF-8 BOM, the other line breaks)."""
    from pipguard.gate import pthshapes
    from pipguard.gate.startup import decode_lines

    found = []
    for _number, line in decode_lines(data):
        if line.startswith(("import ", "import\t")):
            shape = pthshapes.match_line(line)
            if shape is not None and shape.shape.key == "nspkg":
                found.append(str(shape.details["namespace"]))
    return list(dict.fromkeys(found))


def entries(directory: str, files: Dict[str, str]) -> List[str]:
    """The names in ``directory``, on disk and among ``files`` (an install's destinations)."""
    try:
        names = os.listdir(directory)
    except OSError:
        names = []
    return sorted(set(names) | {os.path.basename(d) for d in files if os.path.dirname(d) == directory})


class FileReader:
    """Small files of the target and of an install's wheels, read as pipguard (never run)."""

    LIMIT = 64 * 1024

    def __init__(self, members: Dict[str, Tuple[str, str]]) -> None:
        self._members = members  # destination -> (wheel, member)

    def _read(self, path: str, member: Optional[Tuple[str, str]]) -> Optional[bytes]:
        try:
            if member is None:
                with open(path, "rb") as fh:
                    return fh.read(self.LIMIT + 1)
            with zipfile.ZipFile(member[0]) as zf, zf.open(member[1]) as fh:
                return fh.read(self.LIMIT + 1)
        except (OSError, KeyError, zipfile.BadZipFile):
            return None

    def same(self, path: str, member: Tuple[str, str], other: Optional[Tuple[str, str]] = None) -> bool:
        """Would ``member`` (wheel, member name) write exactly the bytes ``path`` holds (or the
        ``other`` wheel's member would)? Compared up to :data:`LIMIT` bytes, else never."""
        mine = self._read(path, member)
        theirs = self._read(path, other)
        return mine is not None and mine == theirs and len(mine) <= self.LIMIT

    def shim(self, path: str, member: Optional[Tuple[str, str]] = None, on_disk: bool = False) -> bool:
        """Is this ``__init__.py`` an old-style namespace package's (:func:`namespace_shim`)?
        ``member`` (wheel, member name): that wheel's; ``on_disk``: what the target holds now;
        else what lands there (an install's wheel's, or the target's)."""
        if member is None and not on_disk:
            member = self._members.get(path)
        data = self._read(path, member)
        return data is not None and len(data) <= self.LIMIT and namespace_shim(data)


def namespace_shim(source: bytes) -> bool:
    """An ``__init__.py`` that only makes its package a namespace (pkgutil's ``extend_path``,
    pkg_resources' ``declare_namespace``, each with the other as its fallback), read with
    ``ast``: distributions of one namespace each ship it (backports, jaraco, sphinxcontrib, old
    zope and google), and an nspkg line beside it imports as designed."""
    import ast

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return False

    modules = ("pkgutil", "pkg_resources")

    def name(node: ast.AST, wanted: str) -> bool:
        return isinstance(node, ast.Name) and node.id == wanted

    def module(node: ast.AST) -> bool:
        """``pkgutil``, ``pkg_resources`` or ``__import__('pkgutil')``: nothing else runs."""
        if isinstance(node, ast.Name):
            return node.id in modules
        return isinstance(node, ast.Call) and name(node.func, "__import__") and not node.keywords \
            and len(node.args) == 1 and isinstance(node.args[0], ast.Constant) and node.args[0].value in modules

    def exactly(call: ast.AST, function: str, *args: str) -> bool:
        """``[module.]function(args...)`` with exactly these names as its arguments."""
        if not isinstance(call, ast.Call) or call.keywords or len(call.args) != len(args) \
                or not all(name(a, wanted) for a, wanted in zip(call.args, args)):
            return False
        target = call.func
        return name(target, function) or (isinstance(target, ast.Attribute) and target.attr == function
                                          and module(target.value))

    def allowed(statement: ast.stmt) -> bool:
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            return isinstance(statement.value.value, str)  # a docstring
        if isinstance(statement, ast.Import):  # import pkgutil / pkg_resources, by their names
            return all(alias.name in modules and alias.asname is None for alias in statement.names)
        if isinstance(statement, ast.ImportFrom):  # from pkgutil import extend_path, by its name
            wanted = {"pkgutil": "extend_path", "pkg_resources": "declare_namespace"}.get(statement.module or "")
            return wanted is not None and not statement.level and all(
                alias.name == wanted and alias.asname is None for alias in statement.names)
        if isinstance(statement, ast.Try):  # the other way as the fallback; handlers by plain names
            return all(h.type is None or all(isinstance(t, ast.Name) and t.id in (
                "ImportError", "ModuleNotFoundError", "AttributeError", "Exception")
                for t in (h.type.elts if isinstance(h.type, ast.Tuple) else [h.type])) for h in statement.handlers) \
                and all(h.name is None for h in statement.handlers) \
                and all(allowed(s) for s in [*statement.body, *statement.orelse, *statement.finalbody,
                                             *(s for h in statement.handlers for s in h.body)])
        if isinstance(statement, ast.Pass):
            return True
        if isinstance(statement, ast.Assign):
            return len(statement.targets) == 1 and name(statement.targets[0], "__path__") \
                and exactly(statement.value, "extend_path", "__path__", "__name__")
        return isinstance(statement, ast.Expr) and exactly(statement.value, "declare_namespace", "__name__")

    return bool(tree.body) and all(allowed(statement) for statement in tree.body)


def regular_module(root: str, namespace: str, files: Dict[str, str], read: Optional[FileReader] = None
                    ) -> Optional[str]:
    """The path of a regular package or module named ``namespace`` below the import root
    ``root`` (its ``__init__``, compiled ones included, or the module file), on disk or among
    ``files``, else None. A namespace shim ``__init__.py`` (``read``) makes no regular package."""
    parts = namespace.split(".")
    parent = os.path.join(root, *parts[:-1])
    package = os.path.join(parent, parts[-1])
    for entry in entries(package, files):
        if import_name(entry) == "__init__":
            found = os.path.join(package, entry)
            if entry == "__init__.py" and read is not None and read.shim(found):
                continue
            return found
    for entry in entries(parent, files):
        full = os.path.join(parent, entry)
        if import_name(entry) == parts[-1] and not os.path.isdir(full):
            return full
    return None
