"""The package layout's two rules, read from the source with ``ast`` (issue 32):

- no import circle among pipguard's modules;
- the layers only import downward (``LAYERS`` below, lowest first).

Every import counts: at module level, inside functions, under ``if TYPE_CHECKING:``, and
``importlib.import_module("pipguard.…")`` with a literal name. ``from pipguard import x`` is an
import of the module ``pipguard.x`` when there is one, and importing ``pipguard.a.b`` runs
``pipguard/a/__init__.py`` first, so it counts as an import of ``pipguard.a`` too.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pipguard"

# Lowest first. A module belongs to the layer of the longest prefix naming it (a prefix is a
# module or a package: "pipguard.sandbox" holds pipguard.sandbox and everything below it).
# A module may import its own layer and the layers before it, never one after it.
LAYERS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("base", ("pipguard", "pipguard.errors", "pipguard.exitcodes", "pipguard.cachedir", "pipguard.threads")),
    ("rules", ("pipguard.rules", "pipguard.protections")),
    ("report", ("pipguard.report",)),
    ("oslayer", ("pipguard.sandbox.oslayer",)),
    ("backends", ("pipguard.sandbox.backends",)),
    ("sandbox", ("pipguard.sandbox",)),  # and the VM backend, which runs this whole pipeline in a guest
    ("gate", ("pipguard.gate",)),
    ("install", ("pipguard.install", "pipguard.pkgbuild")),
    ("cli", ("pipguard.cli", "pipguard.__main__")),
)


class Import(NamedTuple):
    source: str  # the importing module
    target: str  # the imported module
    line: int

    def where(self) -> str:
        return f"{self.source} -> {self.target} (line {self.line})"


def modules() -> Dict[str, Path]:
    """Every module of the package by its dotted name (a package by its ``__init__``)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _resolve(name: str, known: Dict[str, Path]) -> Optional[str]:
    """The module an import of ``name`` loads last: ``name`` or its longest known prefix."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _ancestors(name: str) -> List[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _named_targets(node: ast.AST, module: str, is_package: bool, known: Dict[str, Path]) -> List[str]:
    if isinstance(node, ast.Import):
        return [t for t in (_resolve(alias.name, known) for alias in node.names) if t]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[:len(base) - (node.level - 1)]
            origin = ".".join(base + ([node.module] if node.module else []))
        else:
            origin = node.module or ""
        targets = []
        for alias in node.names:
            submodule = f"{origin}.{alias.name}"
            target = submodule if submodule in known else _resolve(origin, known)
            if target:
                targets.append(target)
        return targets
    if (isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        target = _resolve(node.args[0].value, known)
        return [target] if target else []
    return []


def imports() -> List[Import]:
    """Every import from one pipguard module of another (each package on the way counted)."""
    known = modules()
    found = []
    for module, path in known.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            for target in _named_targets(node, module, path.name == "__init__.py", known):
                own = set(_ancestors(module)) | {module}
                for name in _ancestors(target) + [target]:
                    if name not in own and name.startswith("pipguard"):
                        found.append(Import(module, name, getattr(node, "lineno", 0)))
    return found


def cycles(edges: List[Import]) -> List[List[Import]]:
    """One circle of imports per strongly connected group of modules (Tarjan, iteratively)."""
    graph: Dict[str, Dict[str, Import]] = {}
    for edge in edges:
        graph.setdefault(edge.source, {}).setdefault(edge.target, edge)
        graph.setdefault(edge.target, {})
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack = set()
    groups = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(group)
    return [_circle_in(group, graph) for group in groups]


def _circle_in(group: set, graph: Dict[str, Dict[str, Import]]) -> List[Import]:
    """A shortest circle through the group's first module (breadth first, inside the group)."""
    start = min(group)
    paths: Dict[str, List[Import]] = {start: []}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child, edge in sorted(graph[node].items()):
                if child == start:
                    return paths[node] + [edge]
                if child in group and child not in paths:
                    paths[child] = paths[node] + [edge]
                    following.append(child)
        frontier = following
    raise AssertionError(f"no circle found in {sorted(group)}")


def layer_of(module: str) -> Optional[int]:
    best: Optional[Tuple[int, int]] = None  # (prefix length, layer)
    for number, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), number)
    return best[1] if best else None


def test_no_import_circle():
    circles = cycles(imports())
    assert not circles, "import circles:\n" + "\n".join(
        "  " + " -> ".join([circle[0].source] + [f"{edge.target} (line {edge.line})" for edge in circle])
        for circle in circles)


def test_every_module_has_a_layer():
    assert not [m for m in modules() if layer_of(m) is None], "modules missing from LAYERS"


def test_layers_only_import_downward():
    upward = []
    for edge in imports():
        source, target = layer_of(edge.source), layer_of(edge.target)
        if source is not None and target is not None and target > source:
            upward.append(f"  {edge.where()}: layer {LAYERS[source][0]} imports the higher layer "
                          f"{LAYERS[target][0]}")
    assert not upward, "imports that run up the layers:\n" + "\n".join(sorted(set(upward)))


def test_only_the_callers_above_import_the_public_api():
    """The public API (pipguard.sandbox.api) is for the layers above the sandbox, the two lazy
    entry points (``pipguard``, ``pipguard.sandbox``) and the VM guest's program (``python -m
    pipguard.sandbox.vm.guest`` in the guest: its command line, as the CLI is the host's); the
    pipeline below it and the VM backend's host side (which took the API's host summary once:
    an import circle) never import it."""
    api = "pipguard.sandbox.api"
    allowed_layers = {layer_of("pipguard.install"), layer_of("pipguard.cli")}
    entry_points = ("pipguard", "pipguard.sandbox", "pipguard.sandbox.vm.guest")
    importers = sorted({edge.source for edge in imports() if edge.target == api})
    below = [m for m in importers if m not in entry_points and layer_of(m) not in allowed_layers]
    assert not below, below
    assert "pipguard.sandbox" in importers  # the test reads what it should


def test_the_graph_sees_a_circle_and_an_upward_import():
    """The checks above can fail: a planted circle (module level one way, in a function the
    other, through ``from pipguard import x``) is found, and so is an import to a higher layer."""
    known = {"pipguard": Path("__init__.py"), "pipguard.a": Path("a.py"), "pipguard.b": Path("b.py")}
    edges = []
    for module, source in (("pipguard.a", "from pipguard import b\n"),
                           ("pipguard.b", "def f():\n    from pipguard.a import thing\n")):
        for node in ast.walk(ast.parse(source)):
            edges += [Import(module, t, 1) for t in _named_targets(node, module, False, known)]
    assert [(e.source, e.target) for e in cycles(edges)[0]] == [("pipguard.a", "pipguard.b"),
                                                              ("pipguard.b", "pipguard.a")]
    assert layer_of("pipguard.cli.app") > layer_of("pipguard.errors")


def test_loaded_by_path_imports_no_pipguard():
    """The audit hook runs inside sandboxed Pythons from its own directory, and the seam's target
    inside pip's process: neither may import pipguard (nor its dependencies)."""
    for module, path in modules().items():
        if module.startswith(("pipguard.sandbox._hook", "pipguard.install._seam")):
            tree = ast.parse(path.read_text(), filename=str(path))
            named = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
            named += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and not node.level]
            assert not [n for n in named if n.split(".")[0] == "pipguard"], (module, named)


def test_the_plan_takes_the_namespace_spec_and_decoys_from_below_the_kernel_calls():
    """The plan takes the ns backend's spec and decoy tables from the two modules of
    ``backends/ns/`` that make no kernel call (no ctypes, no other module of the package), never
    from those that do (kernel, root, forked, probing); its probe goes through ``backends.load``."""
    ns = "pipguard.sandbox.backends.ns"
    pure = {f"{ns}.spec", f"{ns}.decoys"}
    for module in sorted(pure):
        tree = ast.parse(modules()[module].read_text())
        named = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
        named += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
        assert "ctypes" not in named and not [n for n in named if n.startswith("pipguard.sandbox")], (module, named)
    from_plan = {edge.target for edge in imports()
                 if edge.source == "pipguard.sandbox.plan" and edge.target.startswith(ns + ".")}
    assert from_plan == pure, from_plan


def _dotted_name_resolves(name: str) -> bool:
    """``pipguard.a.b.c``: its longest module prefix imports and the rest are attributes of it."""
    import importlib

    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _names_used_outside_the_package() -> List[Tuple[str, str]]:
    """(where, dotted name) for each pipguard name the CI action, the benchmarks, the tests and the
    docs use: an import there is not in the graph above, and a move must not leave it behind."""
    import re

    used = []
    for folder in ("ci", "benchmarks", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "pipguard":
                    used += [(f"{path.relative_to(ROOT)}:{node.lineno}", f"{node.module}.{a.name}")
                             for a in node.names if a.name != "*"]
                elif isinstance(node, ast.Import):
                    used += [(f"{path.relative_to(ROOT)}:{node.lineno}", a.name)
                             for a in node.names if a.name.split(".")[0] == "pipguard"]
    # Prose names modules too (the changelog keeps the names each release had). Not names:
    # `tool.pipguard.approve`, `steps.pipguard.outputs`, the file `pipguard.toml`, a Firefox profile
    # `pipguard.default-release`.
    dotted = re.compile(r"(?<![\w.])pipguard(?:\.[A-Za-z_]\w*)+(?![\w-])")
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            used += [(f"{path.relative_to(ROOT)}:{number}", m) for m in dotted.findall(line)
                     if not m.endswith(".toml")]
    return used


def test_names_outside_the_package_still_resolve():
    """The CI action imported ``pipguard.render`` after the renderers moved to ``pipguard.report``:
    only the job that ran the action found it. Every such name is checked here, in the unit tier."""
    missing = [(where, name) for where, name in _names_used_outside_the_package()
               if not _dotted_name_resolves(name)]
    assert not missing, missing
    assert not _dotted_name_resolves("pipguard.render.markdown.from_json")
