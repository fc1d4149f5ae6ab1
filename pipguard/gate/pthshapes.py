"""The executable ``.pth`` lines the static gate recognises, each by its exact syntax tree.

A site-level ``.pth`` line that starts with ``import`` is executed by ``site.py`` at every
interpreter start (docs/gate.md). Some real packages ship such lines for a known, narrow purpose:
setuptools' distutils shim, the ``-nspkg.pth`` namespace loaders that setuptools wrote for
``namespace_packages`` projects, coverage's and pytest-cov's subprocess start-up hooks, the
editable-install finders of setuptools (PEP 660) and of the ``editables`` library.
(virtualenv's ``_virtualenv.pth`` is written by virtualenv into an environment it creates and is
never shipped in a wheel, so a wheel that carries one is not recognised.) This module knows each of them as a template of Python syntax
and says whether a line *is* one of them.

Matching is on the parsed ``ast``, never on text or file names: a line is recognised only when its
tree equals a template's tree node for node, where the template's ``SLOT_*`` names stand for the
parts that legitimately vary (a package name, a module name) and every slot that occurs twice
binds the same value. Each shape's ``check`` then validates the slot values (e.g. an nspkg line's
package name must be the dotted join of its path parts). An extra statement, another module, an
``exec`` of a different string, a different argument: no match, and the gate keeps the line
critical. Whether a recognised line is *acceptable* (which distribution may ship it, which
companion module it needs) is the gate's decision (``pipguard.gate.scan``), not this module's.

Companion modules that a recognised line imports from the same wheel (setuptools' editable finder,
``editables``' bootstrap) are checked here too: :func:`match_setuptools_finder`
compares the module's normalised tree with the digests of every ``_FINDER_TEMPLATE`` setuptools
released; :func:`match_editables_bootstrap` parses the bootstrap's few statements.

Stdlib only, and nothing parsed here is ever executed.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Tuple

__all__ = [
    "DISTUTILS_PRECEDENCE_LINES", "EditableMapping", "LineMatch", "SHAPES", "Shape", "match_editables_bootstrap", "match_line",
    "match_setuptools_finder", "normalised_digest",
]

#: Names (and identifier strings) in a template that start with this are slots.
_SLOT = "SLOT_"
#: Fields that carry no meaning for what code does (``kind`` is the ``u`` prefix of a string).
_IGNORED_FIELDS = ("ctx", "kind", "type_comment")


# --- normalised trees -----------------------------------------------------------------------------

def _canon(node: object) -> str:
    """A text form of a tree that is the same on every Python 3.9+.

    ``ast.dump`` changed between versions (3.13 leaves out empty fields; 3.12 added
    ``type_params``), so the digests below are taken over this form instead: node type and its
    non-empty fields, positions left out.
    """
    if isinstance(node, ast.AST):
        parts = []
        for name, value in ast.iter_fields(node):
            if name in _IGNORED_FIELDS or value is None or value == []:
                continue
            parts.append(f"{name}={_canon(value)}")
        return f"{type(node).__name__}({','.join(parts)})"
    if isinstance(node, list):
        return "[" + ",".join(_canon(v) for v in node) + "]"
    return f"{type(node).__name__}:{node!r}"


def normalised_digest(tree: ast.AST) -> str:
    """sha256 (hex) of :func:`_canon` of ``tree``."""
    return hashlib.sha256(_canon(tree).encode("utf-8")).hexdigest()


def _unify(tmpl: object, node: object, binds: Dict[str, object]) -> bool:
    """Does ``node`` have ``tmpl``'s shape? Binds each slot to what stands in its place.

    A slot ``Name`` matches any expression (bound to the identifier when the expression is a
    plain name, else to the node); a slot identifier string (an ``import SLOT_X`` alias, an
    attribute name) matches any identifier. A slot seen again must bind an equal value.
    """
    if isinstance(tmpl, ast.Name) and tmpl.id.startswith(_SLOT):
        if isinstance(node, ast.Name):
            return _bind(binds, tmpl.id, node.id)
        return isinstance(node, ast.expr) and _bind(binds, tmpl.id, node)
    if isinstance(tmpl, str) and tmpl.startswith(_SLOT):
        return isinstance(node, str) and node.isidentifier() and _bind(binds, tmpl, node)
    if isinstance(tmpl, ast.AST):
        if type(tmpl) is not type(node):
            return False
        for name, value in ast.iter_fields(tmpl):
            if name in _IGNORED_FIELDS:
                continue
            if not _unify(value, getattr(node, name, None), binds):
                return False
        return True
    if isinstance(tmpl, list):
        return (isinstance(node, list) and len(tmpl) == len(node)
                and all(_unify(t, n, binds) for t, n in zip(tmpl, node)))
    # Leaf values: 1 and True compare equal in Python, not here.
    return type(tmpl) is type(node) and tmpl == node


def _bind(binds: Dict[str, object], slot: str, value: object) -> bool:
    if slot not in binds:
        binds[slot] = value
        return True
    old = binds[slot]
    if isinstance(old, ast.AST) and isinstance(value, ast.AST):
        return _canon(old) == _canon(value)
    return type(old) is type(value) and old == value


def _parse(source: str) -> Optional[ast.Module]:
    try:
        return ast.parse(source, mode="exec")
    except (SyntaxError, ValueError):  # ValueError: NUL bytes
        return None


def _literal(binds: Mapping[str, object], slot: str) -> object:
    """The literal value bound to ``slot`` (``ast.literal_eval``; never runs code)."""
    value = binds.get(slot)
    if not isinstance(value, ast.AST):
        raise ValueError(slot)
    return ast.literal_eval(value)


def _string(binds: Mapping[str, object], slot: str) -> str:
    value = _literal(binds, slot)
    if not isinstance(value, str):
        raise ValueError(slot)
    return value


# --- the shapes -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shape:
    """One kind of recognised executable ``.pth`` line.

    ``templates``: source texts whose trees a line must equal (``SLOT_*`` are the varying parts);
    ``check``: validates the bound slots and returns the details the gate reports, raising
    ``ValueError`` when they are not what the producer writes; ``owners``: canonical names of the
    distributions that may ship it (empty: any); ``companion``: the slot naming a module the line
    imports that must come in the same wheel and match this shape's companion check (or ``""``);
    ``editable``: an editable-install hook, acceptable only in a wheel built editable from the
    project the user gave.
    """

    key: str
    does: str
    templates: Tuple[str, ...]
    check: Callable[[Mapping[str, object]], Dict[str, str]]
    owners: Tuple[str, ...] = ()
    companion: str = ""
    editable: bool = False


@dataclass(frozen=True)
class LineMatch:
    shape: Shape
    details: Dict[str, str]


def _no_details(binds: Mapping[str, object]) -> Dict[str, str]:
    if binds:
        raise ValueError("unexpected slots")
    return {}


# setuptools' distutils-precedence.pth (SETUPTOOLS_PTH_LINES in pipguard.gate.scan are the same texts).
DISTUTILS_PRECEDENCE_LINES: Tuple[str, ...] = (
    # setuptools 49.3 - 49.6
    "import os; enabled = os.environ.get('SETUPTOOLS_USE_DISTUTILS') == 'local'; "
    "enabled and __import__('_distutils_hack').add_shim();",
    # setuptools 50 - 59
    "import os; var = 'SETUPTOOLS_USE_DISTUTILS'; enabled = os.environ.get(var, 'stdlib') == 'local'; "
    "enabled and __import__('_distutils_hack').add_shim();",
    # setuptools 60 - 84 (at least)
    "import os; var = 'SETUPTOOLS_USE_DISTUTILS'; enabled = os.environ.get(var, 'local') == 'local'; "
    "enabled and __import__('_distutils_hack').add_shim();",
)


# setuptools' namespace loaders: `_nspkg_tmpl` (+ `_nspkg_tmpl_multi` for a nested package) in
# setuptools/namespaces.py (install_egg_info.py before 31), joined with ";", as `install_egg_info`
# writes them (root `sys._getframe(1).f_locals['sitedir']`). Taken from every release tag since
# 20.6 (2016); `%(pth)r` is SLOT_PARTS, `%(pkg)r` SLOT_PKG.
_NSPKG_ROOT = "sys._getframe(1).f_locals['sitedir']"
_NSPKG_BODIES = (
    # 20.6 - 28.1
    ("import sys, types, os",
     f"p = os.path.join({_NSPKG_ROOT}, *SLOT_PARTS)",
     "ie = os.path.exists(os.path.join(p,'__init__.py'))",
     "m = not ie and sys.modules.setdefault(SLOT_PKG, types.ModuleType(SLOT_PKG))",
     "mp = (m or []) and m.__dict__.setdefault('__path__',[])",
     "(p not in mp) and mp.append(p)"),
    # 28.3 - 30.4
    ("import sys, types, os",
     "pep420 = sys.version_info > (3, 3)",
     f"p = os.path.join({_NSPKG_ROOT}, *SLOT_PARTS)",
     "ie = os.path.exists(os.path.join(p,'__init__.py'))",
     "m = not ie and not pep420 and sys.modules.setdefault(SLOT_PKG, types.ModuleType(SLOT_PKG))",
     "mp = (m or []) and m.__dict__.setdefault('__path__',[])",
     "(p not in mp) and mp.append(p)"),
    # 31.0 - 34.2
    ("import sys, types, os",
     "has_mfs = sys.version_info > (3, 5)",
     f"p = os.path.join({_NSPKG_ROOT}, *SLOT_PARTS)",
     "importlib = has_mfs and __import__('importlib.util')",
     "has_mfs and __import__('importlib.machinery')",
     "m = has_mfs and sys.modules.setdefault(SLOT_PKG, importlib.util.module_from_spec("
     "importlib.machinery.PathFinder.find_spec(SLOT_PKG, [os.path.dirname(p)])))",
     "m = m or not has_mfs and sys.modules.setdefault(SLOT_PKG, types.ModuleType(SLOT_PKG))",
     "mp = (m or []) and m.__dict__.setdefault('__path__',[])",
     "(p not in mp) and mp.append(p)"),
    # 34.3 - 69.0 (zope.interface 5.5, matplotlib 3.6, protobuf 3.20, googleapis-common-protos)
    ("import sys, types, os",
     "has_mfs = sys.version_info > (3, 5)",
     f"p = os.path.join({_NSPKG_ROOT}, *SLOT_PARTS)",
     "importlib = has_mfs and __import__('importlib.util')",
     "has_mfs and __import__('importlib.machinery')",
     "m = has_mfs and sys.modules.setdefault(SLOT_PKG, importlib.util.module_from_spec("
     "importlib.machinery.PathFinder.find_spec(SLOT_PKG, [os.path.dirname(p)])))",
     "m = m or sys.modules.setdefault(SLOT_PKG, types.ModuleType(SLOT_PKG))",
     "mp = (m or []) and m.__dict__.setdefault('__path__',[])",
     "(p not in mp) and mp.append(p)"),
    # 69.1 - 84
    ("import sys, types, os",
     f"p = os.path.join({_NSPKG_ROOT}, *SLOT_PARTS)",
     "importlib = __import__('importlib.util')",
     "__import__('importlib.machinery')",
     "m = sys.modules.setdefault(SLOT_PKG, importlib.util.module_from_spec("
     "importlib.machinery.PathFinder.find_spec(SLOT_PKG, [os.path.dirname(p)])))",
     "m = m or sys.modules.setdefault(SLOT_PKG, types.ModuleType(SLOT_PKG))",
     "mp = (m or []) and m.__dict__.setdefault('__path__',[])",
     "(p not in mp) and mp.append(p)"),
)
_NSPKG_MULTI = "m and setattr(sys.modules[SLOT_PARENT], SLOT_CHILD, m)"
_NSPKG = tuple(";".join(body) for body in _NSPKG_BODIES) + tuple(
    ";".join(body + (_NSPKG_MULTI,)) for body in _NSPKG_BODIES)


def _check_nspkg(binds: Mapping[str, object]) -> Dict[str, str]:
    parts = _literal(binds, "SLOT_PARTS")
    pkg = _string(binds, "SLOT_PKG")
    if (not isinstance(parts, tuple) or not parts
            or not all(isinstance(p, str) and p.isidentifier() for p in parts)
            or pkg != ".".join(parts)):
        raise ValueError("namespace path and name disagree")
    if "SLOT_PARENT" in binds:
        if len(parts) < 2 or (_string(binds, "SLOT_PARENT"), _string(binds, "SLOT_CHILD")) != (
                ".".join(parts[:-1]), parts[-1]):
            raise ValueError("parent namespace disagrees")
    elif len(parts) != 1:
        # setuptools always adds the setattr on the parent for a nested namespace.
        raise ValueError("nested namespace without its parent line")
    return {"namespace": pkg}


# coverage's a1_coverage.pth (coverage 7.13 and later ship it in the wheel, for subprocess
# measurement; it does nothing unless COVERAGE_PROCESS_START or COVERAGE_PROCESS_CONFIG is set).
# The line is `import sys; exec(CODE)`; CODE must parse to this tree.
_COVERAGE_BODY = (
    'import os\n\nif os.getenv("COVERAGE_PROCESS_START") or os.getenv("COVERAGE_PROCESS_CONFIG"):\n'
    ' try:\n  import coverage\n except:\n  pass\n else:\n  coverage.process_startup(slug="pth")'
)
_COVERAGE = ("import sys; exec(SLOT_CODE)",)

# pytest-cov.pth (pytest-cov 2.x - 6.x; 7.0 dropped it for coverage's own hook): starts coverage in
# a subprocess only when pytest-cov's COV_CORE_SOURCE variable is set. `import os, sys;exec(CODE)`.
_PYTEST_COV_BODY = (
    "if 'COV_CORE_SOURCE' in os.environ:\n try:\n  from pytest_cov.embed import init\n  init()\n"
    " except Exception as exc:\n  sys.stderr.write(\n   \"pytest-cov: Failed to setup subprocess coverage. \"\n"
    "   \"Environ: {0!r} \"\n   \"Exception: {1!r}\\n\".format(\n"
    "    dict((k, v) for k, v in os.environ.items() if k.startswith('COV_CORE')),\n    exc\n   )\n  )\n"
)
_PYTEST_COV = ("import os, sys;exec(SLOT_CODE)",)


def _exec_of(body: str) -> Callable[[Mapping[str, object]], Dict[str, str]]:
    """A check that the string given to ``exec`` parses to ``body``'s tree (the text may differ
    in blank lines or quoting between releases, as coverage 7.13's leading newlines do)."""
    expected = _parse(body)
    assert expected is not None

    def check(binds: Mapping[str, object]) -> Dict[str, str]:
        if set(binds) != {"SLOT_CODE"}:
            raise ValueError("unexpected slots")
        tree = _parse(_string(binds, "SLOT_CODE"))
        if tree is None or _canon(tree) != _canon(expected):
            raise ValueError("exec of other code")
        return {}
    return check

# setuptools' PEP 660 editable wheel (64 - 84): `import {finder}; {finder}.install()` where
# {finder} is `__editable___<name>_finder`, shipped next to it as `{finder}.py`.
_SETUPTOOLS_EDITABLE = ("import SLOT_FINDER; SLOT_FINDER.install()",)


def _check_setuptools_editable(binds: Mapping[str, object]) -> Dict[str, str]:
    finder = binds["SLOT_FINDER"]
    if not (isinstance(finder, str) and finder.startswith("__editable___") and finder.endswith("_finder")):
        raise ValueError("not setuptools' finder module name")
    return {"module": finder}


# `editables` (hatchling's dev-mode-exact, pdm-backend): `import _editable_impl_<name>`.
_EDITABLES = ("import SLOT_BOOTSTRAP",)


def _check_editables(binds: Mapping[str, object]) -> Dict[str, str]:
    module = binds["SLOT_BOOTSTRAP"]
    if not (isinstance(module, str) and module.startswith("_editable_impl_")):
        raise ValueError("not an editables bootstrap")
    return {"module": module}


SHAPES: Tuple[Shape, ...] = (
    Shape("distutils-precedence", "setuptools' distutils shim: when SETUPTOOLS_USE_DISTUTILS is "
          "'local' (the default), makes `import distutils` load setuptools' copy",
          DISTUTILS_PRECEDENCE_LINES, _no_details, owners=("setuptools",)),
    Shape("nspkg", "setuptools' legacy namespace-package loader (-nspkg.pth): registers the "
          "namespace package {namespace} at start-up, imports only the standard library",
          _NSPKG, _check_nspkg),
    Shape("coverage-subprocess", "coverage's subprocess hook: starts measuring only when "
          "COVERAGE_PROCESS_START or COVERAGE_PROCESS_CONFIG is set", _COVERAGE, _exec_of(_COVERAGE_BODY),
          owners=("coverage",)),
    Shape("pytest-cov-subprocess", "pytest-cov's subprocess hook: starts coverage only when "
          "COV_CORE_SOURCE is set", _PYTEST_COV, _exec_of(_PYTEST_COV_BODY),
          owners=("pytest-cov",)),
    Shape("setuptools-editable-finder", "editable install (setuptools): {module} maps the "
          "project's packages to its source directory at start-up",
          _SETUPTOOLS_EDITABLE, _check_setuptools_editable, companion="SLOT_FINDER", editable=True),
    Shape("editables-bootstrap", "editable install (editables): {module} redirects the "
          "project's packages to its source directory at start-up",
          _EDITABLES, _check_editables, companion="SLOT_BOOTSTRAP", editable=True),
)


def _compile(shapes: Tuple[Shape, ...]) -> Tuple[Tuple[Shape, ast.Module], ...]:
    out = []
    for shape in shapes:
        for text in shape.templates:
            tree = _parse(text)
            assert tree is not None, (shape.key, text)
            out.append((shape, tree))
    return tuple(out)


_TEMPLATES = _compile(SHAPES)


def match_line(line: str) -> Optional[LineMatch]:
    """The recognised shape of one executable ``.pth`` line, or ``None``.

    ``line`` is the text ``site.py`` would ``exec``; surrounding whitespace and a trailing ``;``
    do not change its tree.
    """
    tree = _parse(line)
    if tree is None:
        return None
    for shape, template in _TEMPLATES:
        binds: Dict[str, object] = {}
        if _unify(template, tree, binds):
            try:
                details = shape.check(binds)
            except (ValueError, TypeError, SyntaxError, KeyError):
                continue  # literal_eval raises those for non-literals
            if shape.companion:
                details.setdefault("module", str(binds[shape.companion]))
            return LineMatch(shape, details)
    return None


# --- companion modules ----------------------------------------------------------------------------

@dataclass(frozen=True)
class EditableMapping:
    """What a recognised editable hook puts on the import path: absolute source paths."""

    paths: Tuple[str, ...]


#: Digests (normalised_digest) of setuptools' `_FINDER_TEMPLATE` with MAPPING, NAMESPACES and the
#: name in PATH_PLACEHOLDER replaced by SLOT_MAPPING, SLOT_NAMESPACES, SLOT_NAME, per the release
#: tags whose template has that tree (every tag from 64.0.0 to 84.0.0).
SETUPTOOLS_FINDER_DIGESTS: Dict[str, str] = {
    "58b77553f4874527660fe848f9272269682b4dabe9ad59febf5adf9f1f530312": "64.0.0 - 65.1.0",
    "9fc249839a394273c98be50f421dcda16de7fa888c19f8861d7d28a3886e3369": "65.1.1 - 65.2.0",
    "8beb3365568be21c60dc465b0429633265cc93ce84987e485cb3ed84d6dcc7c4": "65.3.0 - 68.0.0",
    "a6be184cccabdfddc11e28ade2856666a6e32ee11cf89231620f13eda7e63ff0": "68.1.0",
    "0e7972cf2fec3c80c637b032cf1621ee8d145005aeac736da62c9b8178fb1e11": "68.1.1 - 68.1.2",
    "faaf19bbf24e55737eda0c7f79b3b06256f8322b73e5f212bfb7ae8d52878e52": "68.2.0 - 69.5.1",
    "f12a28570e2a23b49a48885119e3baf660852d7f7f2943b5834d6063f0f0586d": "70.0.0 - 70.3.0",
    "3236e387e6a56126b0e5100f2167f2a32cf955328dced3fd330798021e8e83cd": "71.0.0 - 84.0.0",
}

_FINDER_SLOTS = {"MAPPING": "SLOT_MAPPING", "NAMESPACES": "SLOT_NAMESPACES"}


def _finder_slots(tree: ast.Module) -> Optional[Tuple[ast.Module, Dict[str, ast.expr]]]:
    """``tree`` with the three varying values replaced by slot names, and those values."""
    values: Dict[str, ast.expr] = {}
    body: List[ast.stmt] = []
    for stmt in tree.body:
        target = (stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                  else stmt.target if isinstance(stmt, ast.AnnAssign) else None)
        name = target.id if isinstance(target, ast.Name) else ""
        value = getattr(stmt, "value", None)
        if name in values:
            return None  # assigned twice: not the template
        if name in _FINDER_SLOTS and value is not None:
            values[name] = value
            stmt = _replace_value(stmt, ast.Name(id=_FINDER_SLOTS[name], ctx=ast.Load()))
        elif name == "PATH_PLACEHOLDER":
            if not (isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add)):
                return None
            values[name] = value.left
            stmt = _replace_value(stmt, ast.BinOp(left=ast.Name(id="SLOT_NAME", ctx=ast.Load()),
                                                  op=ast.Add(), right=value.right))
        body.append(stmt)
    if set(values) != {"MAPPING", "NAMESPACES", "PATH_PLACEHOLDER"}:
        return None
    return ast.Module(body=body, type_ignores=[]), values


def _replace_value(stmt: ast.stmt, value: ast.expr) -> ast.stmt:
    if isinstance(stmt, ast.AnnAssign):
        return ast.AnnAssign(target=stmt.target, annotation=stmt.annotation, value=value,
                             simple=stmt.simple)
    assert isinstance(stmt, ast.Assign)
    return ast.Assign(targets=stmt.targets, value=value)


def finder_template_digest(source: str) -> Optional[str]:
    """The digest :data:`SETUPTOOLS_FINDER_DIGESTS` keys on, for a finder module's source."""
    tree = _parse(source)
    sliced = _finder_slots(tree) if tree is not None else None
    return normalised_digest(sliced[0]) if sliced else None


def match_setuptools_finder(source: str, module: str) -> Optional[EditableMapping]:
    """Is ``source`` a finder module setuptools generated? Its mapped paths, or None.

    The tree must be one of setuptools' released templates; MAPPING must be a literal
    ``{package: path}`` of strings, NAMESPACES ``{package: [path, ...]}``, and the placeholder name
    of the form setuptools writes. ``module`` is the finder's module name (for messages).
    """
    tree = _parse(source)
    sliced = _finder_slots(tree) if tree is not None else None
    if sliced is None or normalised_digest(sliced[0]) not in SETUPTOOLS_FINDER_DIGESTS:
        return None
    values = sliced[1]
    try:
        mapping = ast.literal_eval(values["MAPPING"])
        namespaces = ast.literal_eval(values["NAMESPACES"])
        name = ast.literal_eval(values["PATH_PLACEHOLDER"])
    except (ValueError, TypeError, SyntaxError):
        return None
    # setuptools names the placeholder `__editable__.<name>-<version>.finder`: a string only
    # ever compared against sys.path entries.
    if (not isinstance(name, str) or not name.startswith("__editable__.") or not name.endswith(".finder")
            or not isinstance(mapping, dict) or not isinstance(namespaces, dict)):
        return None
    paths: List[str] = []
    for pkg, path in mapping.items():
        if not (isinstance(pkg, str) and isinstance(path, str)):
            return None
        paths.append(path)
    for pkg, entries in namespaces.items():
        if not (isinstance(pkg, str) and isinstance(entries, list)
                and all(isinstance(p, str) for p in entries)):
            return None
        paths.extend(entries)
    return EditableMapping(tuple(paths))


_EDITABLES_HEAD = _parse("from editables.redirector import RedirectingFinder as F\nF.install()")
_EDITABLES_MAP = _parse("F.map_module(SLOT_NAME, SLOT_PATH)")


def match_editables_bootstrap(source: str) -> Optional[EditableMapping]:
    """Is ``source`` the bootstrap ``editables.EditableProject.bootstrap_file`` writes?

    Two fixed statements, then one ``F.map_module('name', '/abs/path')`` per redirected package.
    """
    tree = _parse(source)
    assert _EDITABLES_HEAD is not None and _EDITABLES_MAP is not None
    if tree is None or len(tree.body) < 2:
        return None
    if not _unify(ast.Module(body=_EDITABLES_HEAD.body, type_ignores=[]),
                  ast.Module(body=tree.body[:2], type_ignores=[]), {}):
        return None
    paths: List[str] = []
    for stmt in tree.body[2:]:
        binds: Dict[str, object] = {}
        if not _unify(_EDITABLES_MAP.body[0], stmt, binds):
            return None
        try:
            name, path = _string(binds, "SLOT_NAME"), _string(binds, "SLOT_PATH")
        except (ValueError, TypeError, SyntaxError):
            return None
        if not name.isidentifier():
            return None
        paths.append(path)
    return EditableMapping(tuple(paths))


