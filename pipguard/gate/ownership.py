"""Which files an install would overwrite, and whether their owner agrees.

pip writes a wheel's files over whatever is there: a wheel that carries ``othpkg/__init__.py``
replaces another distribution's code, a console script named ``pip`` or a ``.data/scripts/python``
replaces the environment's own commands. :func:`check_ownership` maps every file of every wheel
about to be installed to its destination in the target (all five schemes, and the scripts pip
generates from ``console_scripts``/``gui_scripts``) and refuses (critical ``overwrites-other``)
each destination that an installed distribution other than the wheel's own lists in its RECORD,
that exists without any RECORD listing it (the interpreter, a file someone put there), or that
another wheel of the same install also claims. Upgrading or reinstalling the same distribution
(canonical name, ``packaging.utils.canonicalize_name``) is fine.

Pure apart from reading the target's ``*.dist-info/RECORD`` files and ``lstat``: no code runs.
:func:`target_layout` asks the target interpreter for its scheme directories (``python -I``,
stdlib only).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import zipfile
from dataclasses import dataclass
from email.parser import HeaderParser
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

from packaging.utils import canonicalize_name

from pipguard.errors import PipError, UsageError
from pipguard.gate.wheelpaths import ROOT, SCHEME_KEYS, place, script_entries, script_names

__all__ = ["TargetLayout", "WheelToInstall", "check_ownership", "installed_owners", "target_layout"]

#: What the scheme keys of a wheel's ``<name>.data/<key>/`` mean (pip's SCHEME_KEYS).
SCHEMES = SCHEME_KEYS

#: Top-level import names that distributions share by design (canonical names): pytest (7.2 and
#: later) ships ``py.py``, a shim for the retired ``py`` library, which gives way to that
#: library's ``py/`` package when both are installed (pytest's own comment in it). Between
#: these, neither order of install is ``shadows-other``; anyone else is judged as usual.
DESIGNED_SHARING: Dict[str, FrozenSet[str]] = {"py": frozenset({"pytest", "py"})}


@dataclass(frozen=True)
class TargetLayout:
    """The directories pip installs a wheel's schemes into.

    ``headers`` is the directory pip puts a distribution's headers under: pip appends the
    project name to it (``include/site/pythonX.Y/<name>`` in a venv).
    """

    purelib: str
    platlib: str
    scripts: str
    data: str
    headers: str

    def scheme(self, key: str) -> str:
        return str(getattr(self, key))

    @classmethod
    def for_target_dir(cls, directory: str) -> "TargetLayout":
        """``pip install --target DIR``: pip installs into a temporary home scheme and moves its
        ``lib`` contents, ``bin`` and the rest into DIR."""
        d = os.path.abspath(directory)
        return cls(d, d, os.path.join(d, "bin"), d, os.path.join(d, "include"))


# Run by the target interpreter with -I: its scheme paths as pip computes them for a plain,
# --user, --prefix or --root install (pip applies --root by re-rooting every path).
_LAYOUT_CODE = r"""
import json, os, sys, sysconfig
user, prefix, root = sys.argv[1] == "1", sys.argv[2], sys.argv[3]
if user:
    paths = sysconfig.get_paths(scheme=sysconfig.get_preferred_scheme("user")
                                if hasattr(sysconfig, "get_preferred_scheme")
                                else os.name + "_user")
elif prefix:
    paths = sysconfig.get_paths(vars={"base": prefix, "platbase": prefix})
else:
    paths = sysconfig.get_paths()
ver = "%d.%d" % sys.version_info[:2]
if not user and not prefix and sys.prefix != getattr(sys, "base_prefix", sys.prefix):
    headers = os.path.join(sys.prefix, "include", "site", "python" + ver)
else:
    headers = paths["include"]
out = {"purelib": paths["purelib"], "platlib": paths["platlib"], "scripts": paths["scripts"],
       "data": paths["data"], "headers": headers}
if root:
    out = {k: os.path.join(root, os.path.splitdrive(v)[1].lstrip(os.sep)) for k, v in out.items()}
print(json.dumps(out))
"""


def target_layout(python: str, *, user: bool = False, prefix: Optional[str] = None,
                  root: Optional[str] = None, timeout: float = 60) -> TargetLayout:
    """The scheme directories of interpreter ``python`` (a venv's too), asking it.

    ``user``/``prefix``/``root`` mirror ``pip install --user/--prefix/--root``; for ``--target``
    use :meth:`TargetLayout.for_target_dir`. Raises ``UsageError`` when ``python`` cannot be run.
    """
    argv = [python, "-I", "-c", _LAYOUT_CODE, "1" if user else "0", prefix or "", root or ""]
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=timeout, env={"PATH": os.defpath})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"cannot ask {python} for its install scheme: {exc}") from None
    if proc.returncode != 0:
        raise UsageError(f"cannot ask {python} for its install scheme: {proc.stderr.strip()[-300:]}")
    paths = json.loads(proc.stdout)
    return TargetLayout(**{k: paths[k] for k in SCHEMES})


@dataclass(frozen=True)
class WheelToInstall:
    """A wheel file about to be installed (its project name is read from the wheel)."""

    path: str


def _norm(directory: str, rel: str) -> str:
    return os.path.normpath(os.path.join(directory, rel))


def _real_dirs(layout: TargetLayout) -> Dict[str, str]:
    # Resolve each scheme directory once (lib64 -> lib, a symlinked venv), not every file.
    return {k: os.path.realpath(layout.scheme(k)) for k in SCHEMES}


def installed_owners(layout: TargetLayout) -> Dict[str, str]:
    """``{absolute path: canonical project name}`` from every ``*.dist-info/RECORD`` in the
    target's purelib and platlib (RECORD paths are relative to that directory)."""
    dirs = _real_dirs(layout)
    owners: Dict[str, str] = {}
    for site in dict.fromkeys((dirs["purelib"], dirs["platlib"])):
        try:
            entries = sorted(os.listdir(site))
        except FileNotFoundError:
            continue
        for entry in entries:
            if not entry.endswith(".dist-info"):
                continue
            info = os.path.join(site, entry)
            name = _installed_name(info, entry)
            try:
                with open(os.path.join(info, "RECORD"), newline="", encoding="utf-8") as fh:
                    rows = list(csv.reader(fh))
            except (OSError, UnicodeDecodeError, csv.Error):
                continue  # no readable RECORD: pip cannot uninstall it either
            for row in rows:
                if row and row[0]:
                    owners.setdefault(_norm(site, row[0]), name)
    return owners


def _installed_name(info: str, entry: str) -> str:
    try:
        with open(os.path.join(info, "METADATA"), encoding="utf-8") as fh:
            name = HeaderParser().parse(fh).get("Name")
    except (OSError, UnicodeDecodeError):
        name = None
    return canonicalize_name(name or entry[:-len(".dist-info")].rsplit("-", 1)[0])


def import_name(site_path: str) -> Optional[str]:
    """The top-level name ``import`` finds for a path below a site directory (``pkg/x.py`` and
    ``mod.py``, ``mod.cpython-312-x86_64-linux-gnu.so``: ``pkg``, ``mod``); None for what no
    import finds there (``x.dist-info/``, ``x.pth``, ``__pycache__``)."""
    first, _, rest = site_path.partition("/")
    if rest:
        return first if first.isidentifier() and first != "__pycache__" else None
    stem, dot, suffix = first.partition(".")
    importable = suffix in ("py", "pyc", "pyw") or suffix.endswith((".so", ".pyd")) or suffix in ("so", "pyd")
    return stem if dot and importable and stem.isidentifier() else None


def _roots_present(dirs: Dict[str, str], installed: Dict[str, str]) -> Dict[str, Dict[str, Tuple[str, bool]]]:
    """import name -> {top-level entry of a site directory: (its owner, is a directory)} for
    what the target holds now (owner: the distribution whose RECORD lists a file of it, else
    ``""``: the environment)."""
    owner_of_root: Dict[str, str] = {}
    for path, owner in installed.items():
        for site in (dirs["purelib"], dirs["platlib"]):
            if path.startswith(site.rstrip(os.sep) + os.sep):
                owner_of_root.setdefault(os.path.join(site, os.path.relpath(path, site).split(os.sep)[0]), owner)
    out: Dict[str, Dict[str, Tuple[str, bool]]] = {}
    for site in dict.fromkeys((dirs["purelib"], dirs["platlib"])):
        try:
            entries = os.listdir(site)
        except OSError:
            continue
        for entry in entries:
            root = os.path.join(site, entry)
            is_dir = os.path.isdir(root) and not os.path.islink(root)
            name = import_name(entry + ("/x" if is_dir else ""))
            if name is not None:
                out.setdefault(name, {})[root] = (owner_of_root.get(root, ""), is_dir)
    return out


def _wheel_files(path: str, dirs: Dict[str, str]) -> Tuple[str, List[Tuple[str, str]], List[Tuple[str, str]]]:
    """The wheel's project, ``[(destination, what puts it there)]`` and the namespaces its
    site-level ``.pth`` files register with setuptools' nspkg loader ``[(member, namespace)]``."""
    try:
        zf = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise PipError(f"{os.path.basename(path)}: corrupt archive ({exc})") from None
    with zf:
        names = zf.namelist()
        infos = sorted({n.split("/", 1)[0] for n in names
                        if "/" in n and n.split("/", 1)[0].endswith(".dist-info")})
        if not infos:
            raise PipError(f"{os.path.basename(path)}: no .dist-info directory")
        info = infos[0]
        meta = HeaderParser().parsestr(zf.read(f"{info}/METADATA").decode("utf-8", "replace")) \
            if f"{info}/METADATA" in names else None
        name = canonicalize_name((meta.get("Name") if meta else None)
                                 or info[:-len(".dist-info")].rsplit("-", 1)[0])
        wheel_meta = HeaderParser().parsestr(zf.read(f"{info}/WHEEL").decode("utf-8", "replace")) \
            if f"{info}/WHEEL" in names else None
        purelib = (wheel_meta.get("Root-Is-Purelib", "true") if wheel_meta else "true").strip().lower() == "true"
        root = dirs["purelib"] if purelib else dirs["platlib"]
        out: List[Tuple[str, str]] = []
        namespaces: List[Tuple[str, str]] = []
        for member in names:
            placed = place(member)
            if placed is None or placed.error is not None:
                continue  # a directory; or a member pip refuses (the gate reports it)
            site_path = placed.site_path
            if site_path is not None and "/" not in site_path and site_path.lower().endswith(".pth"):
                namespaces += [(member, ns) for ns in _nspkg_namespaces(zf.read(member)[:1 << 20])]
            if placed.scheme == ROOT:
                out.append((_norm(root, placed.path), member))
            else:
                base = dirs[placed.scheme]
                if placed.scheme == "headers":
                    base = os.path.join(base, name)
                out.append((_norm(base, placed.path), member))
        ep = f"{info}/entry_points.txt"
        if ep in names:
            for entry in script_entries(zf.read(ep).decode("utf-8", "replace")):  # as each pip reads it
                for written in script_names(entry.name, entry.value):  # what each supported pip writes
                    out.append((_norm(dirs["scripts"], written), f"[{entry.section}] {entry.name} ({ep})"))
    return name, out, namespaces


def _nspkg_namespaces(data: bytes) -> List[str]:
    """The namespaces a ``.pth`` file's setuptools nspkg lines register (:mod:`pthshapes`)."""
    from pipguard.gate import pthshapes

    found = []
    for line in data.decode("utf-8", "replace").splitlines():
        if line.startswith(("import ", "import\t")):
            shape = pthshapes.match_line(line)
            if shape is not None and shape.shape.key == "nspkg":
                found.append(str(shape.details["namespace"]))
    return found


def check_ownership(wheels: Sequence[WheelToInstall], target: TargetLayout, *,
                    replaces_entries: bool = False) -> list:
    """Findings (``pipguard.gate.scan.Finding``, critical ``overwrites-other``) for each file an install
    of ``wheels`` into ``target`` would write over something another distribution owns.

    Owned: listed in an installed distribution's RECORD (purelib/platlib ``*.dist-info``), or
    present without any RECORD listing it (owner "the environment"), or claimed by another
    wheel in ``wheels``. A path the wheel's own distribution already owns (upgrade, reinstall) is
    fine. An empty ``wheels`` gives no finding.

    ``replaces_entries``: ``pip install --target DIR --upgrade``, which installs into a temporary
    directory and then removes each top-level entry of DIR that it is about to move in, whole
    (pip's ``_handle_target_dir``), so a wheel that ships one file below another distribution's
    package deletes that package (:func:`_replacing`).
    """
    from pipguard.gate.findings import CRITICAL, Finding

    dirs = _real_dirs(target)
    installed = installed_owners(target)
    present = _roots_present(dirs, installed)
    claimed: Dict[str, Tuple[str, str]] = {}  # destination -> (project, wheel file name)
    findings: List[Finding] = []
    parsed = [(os.path.basename(wheel.path), *_wheel_files(wheel.path, dirs)) for wheel in wheels]
    installing = frozenset(name for _, name, _, _ in parsed)  # what pip moves in again, whatever it removed
    everyone = {dest: name for _, name, files, _ in parsed for dest, _ in files}
    for artifact, name, files, namespaces in parsed:
        findings += _shadowing(name, artifact, files, dirs, present)
        findings += _nspkg_takeovers(name, artifact, namespaces, dirs, installed, everyone)
        if replaces_entries:
            findings += _replacing(name, artifact, files, dirs["purelib"], installed, installing)
        for dest, source in files:
            owner = installed.get(dest)
            other: Optional[str] = None
            if owner is not None and owner != name:
                other = f"installed distribution {owner} (its RECORD lists it)"
            elif owner is None and os.path.lexists(dest):
                other = "the environment (a file no installed distribution's RECORD lists)"
            previous = claimed.get(dest)
            if previous is not None and previous[0] != name:
                other = f"{previous[0]} ({previous[1]}, in the same install)"
            claimed.setdefault(dest, (name, artifact))
            if other:
                findings.append(Finding(
                    name, artifact, CRITICAL, "overwrites-other", source, None,
                    f"{name} would overwrite {dest}, owned by {other}", dest))
    return findings


#: what makes a directory a regular package (not a namespace) for Python's path finder
_INIT_SUFFIXES = (".py", ".pyc", ".pyw")


def _regular_module(site: str, namespace: str, files: Dict[str, str]) -> Optional[str]:
    """The path of a regular package or module named ``namespace`` below ``site`` (its
    ``__init__`` or the module file), on disk or among ``files`` (an install's destinations),
    else None."""
    parts = namespace.split(".")
    parent = os.path.join(site, *parts[:-1])
    leaf = parts[-1]
    for suffix in _INIT_SUFFIXES:
        candidate = os.path.join(parent, leaf, "__init__" + suffix)
        if candidate in files or os.path.isfile(candidate):
            return candidate
    try:
        names = os.listdir(parent)
    except OSError:
        names = []
    names += [os.path.basename(d) for d in files if os.path.dirname(d) == parent]
    for entry in sorted(set(names)):
        full = os.path.join(parent, entry)
        if import_name(entry) == leaf and not os.path.isdir(full):
            return full
    return None


def _nspkg_takeovers(name: str, artifact: str, namespaces: List[Tuple[str, str]], dirs: Dict[str, str],
                     installed: Dict[str, str], everyone: Dict[str, str]) -> list:
    """Critical ``shadows-other`` for each namespace a wheel's nspkg ``.pth`` line registers
    that is another distribution's *regular* package or module: at every start the line puts
    in ``sys.modules`` a module made from that package's spec and never runs it, so
    ``import NAME`` gives an empty module and the package's own code never runs, while the
    line adds the wheel's directory to its ``__path__`` (its submodules take the package's
    names). setuptools writes the line only for namespaces, which have no ``__init__``."""
    from pipguard.gate.findings import CRITICAL, Finding

    out = []
    for member, namespace in namespaces:
        for site in dict.fromkeys((dirs["purelib"], dirs["platlib"])):
            regular = _regular_module(site, namespace, everyone)
            if regular is None:
                continue
            if regular in everyone:
                owner, who = everyone[regular], f"{everyone[regular]} (in the same install)"
            elif regular in installed:
                owner, who = installed[regular], f"installed distribution {installed[regular]}"
            else:
                owner, who = "", "the environment (no RECORD lists it)"
            if owner == name:
                continue  # its own: not a namespace it takes from anyone
            out.append(Finding(name, artifact, CRITICAL, "shadows-other", member, None,
                               f"{name}'s nspkg start-up hook registers {namespace!r} at every interpreter start, "
                               f"but {namespace} is a regular package of {who} ({regular}): its code would never "
                               f"run and `import {namespace}` would give an empty module", regular))
            break
    return out


def _replacing(name: str, artifact: str, files: List[Tuple[str, str]], target_dir: str,
               installed: Dict[str, str], installing: FrozenSet[str]) -> list:
    """Critical ``overwrites-other`` for each importable top-level entry of a ``--target``
    directory (a package, a module) that ``pip install --target --upgrade`` would remove whole
    because the wheel ships something of that name, while files of another distribution are
    in it (its RECORD lists them; or none lists it: the environment's). A distribution of the
    same install is no other (pip moves its files in again); a link pip leaves alone."""
    from pipguard.gate.findings import CRITICAL, Finding

    entries: Dict[str, str] = {}  # top-level entry -> the member that puts something there
    for dest, source in files:
        rel = os.path.relpath(dest, target_dir)
        if rel != os.pardir and not rel.startswith(os.pardir + os.sep):
            entries.setdefault(rel.split(os.sep)[0], source)
    out = []
    for entry, source in sorted(entries.items()):
        if import_name(entry + "/x") is None and import_name(entry) is None:
            continue  # bin/, include/, *.dist-info: pip replaces them too, but no import takes them
        path = os.path.join(target_dir, entry)
        if not os.path.lexists(path) or os.path.islink(path):
            continue
        owners = {owner for held, owner in installed.items() if held == path or held.startswith(path + os.sep)}
        others = sorted(owners - installing - {name})
        if not owners:
            others = ["the environment (no RECORD lists it)"]
        if others:
            out.append(Finding(name, artifact, CRITICAL, "overwrites-other", source, None,
                               f"{name} would make pip delete {path} (pip install --target --upgrade removes "
                               f"an existing entry of that name whole before it moves the new one in): "
                               f"it holds files of {', '.join(others)}", path))
    return out


def _shadowing(name: str, artifact: str, files: List[Tuple[str, str]], dirs: Dict[str, str],
               present: Dict[str, Dict[str, Tuple[str, bool]]]) -> list:
    """Critical ``shadows-other`` for each top-level entry the wheel would put beside another
    distribution's entry of the same import name (``othpkg/`` beside ``othpkg.py``: Python's
    finder takes the package directory, then extension modules, then ``.py``, so the new one
    can take over every ``import othpkg`` without overwriting a file). Two directories of one
    name are a namespace shared as designed (and their files meet the overwrite check); an entry
    of the wheel's own distribution (an upgrade) is fine. ``present`` gains the wheel's roots, so
    a second wheel of the same install is judged against the first."""
    from pipguard.gate.findings import CRITICAL, Finding

    out = []
    sites = dict.fromkeys((dirs["purelib"], dirs["platlib"]))
    mine: Dict[str, Tuple[str, bool, str]] = {}  # root -> (import name, is a directory, member)
    for dest, source in files:
        for site in sites:
            if dest.startswith(site.rstrip(os.sep) + os.sep):
                rel = os.path.relpath(dest, site)
                top = import_name(rel)
                if top is not None:
                    mine.setdefault(os.path.join(site, rel.split(os.sep)[0]), (top, os.sep in rel, source))
    for root, (top, is_dir, source) in sorted(mine.items()):
        for other, (owner, other_is_dir) in sorted(present.get(top, {}).items()):
            if other == root or owner == name or (is_dir and other_is_dir):
                continue
            if {name, owner} <= DESIGNED_SHARING.get(top, frozenset()):
                continue
            who = f"installed distribution {owner}" if owner else "the environment (no RECORD lists it)"
            out.append(Finding(name, artifact, CRITICAL, "shadows-other", source, None,
                               f"{name} would install {os.path.basename(root)}{'/' if is_dir else ''} beside "
                               f"{os.path.basename(other)} of {who}: it takes over `import {top}` without "
                               "overwriting a file", root))
    for root, (top, is_dir, _source) in mine.items():
        present.setdefault(top, {}).setdefault(root, (name, is_dir))
    return out
