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
from pipguard.gate.namespaces import FileReader, entries, nspkg_namespaces, regular_module
from pipguard.gate.wheelpaths import ROOT, SCHEME_KEYS, import_name, place, script_entries, script_names, site_rel

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
    #: ``--target``: pip installs into a temporary home (``lib/python``, ``bin``, ...) and moves
    #: its entries into the directory (:meth:`for_target_dir`)
    moved_home: bool = False
    #: the interpreter's import path beyond the site directories (a base Python's site-packages
    #: under a venv with system site packages, the user's site, PYTHONPATH): where an nspkg line
    #: can take over a package from
    import_paths: Tuple[str, ...] = ()

    def scheme(self, key: str) -> str:
        return str(getattr(self, key))

    @classmethod
    def for_target_dir(cls, directory: str) -> "TargetLayout":
        """``pip install --target DIR``: pip installs into a temporary home scheme and moves its
        ``lib`` contents, ``bin`` and the rest into DIR."""
        d = os.path.abspath(directory)
        return cls(d, d, os.path.join(d, "bin"), d, os.path.join(d, "include"), moved_home=True)


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
# the import path a start of this interpreter has (-I left out the user's site, which a
# Python outside a venv adds)
import site
out["import_paths"] = [p for p in sys.path if p and os.path.isdir(p)]
if sys.prefix == getattr(sys, "base_prefix", sys.prefix) and site.ENABLE_USER_SITE is not False:
    out["import_paths"].append(site.getusersitepackages())
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
    return TargetLayout(**{k: paths[k] for k in SCHEMES},
                        import_paths=tuple(str(p) for p in paths.get("import_paths", ())))


@dataclass(frozen=True)
class WheelToInstall:
    """A wheel file about to be installed (its project name is read from the wheel)."""

    path: str


def _norm(directory: str, rel: str) -> str:
    return os.path.normpath(os.path.join(directory, rel))


def _real_dirs(layout: TargetLayout) -> Dict[str, str]:
    # Resolve each scheme directory once (lib64 -> lib, a symlinked venv), not every file.
    return {k: os.path.realpath(layout.scheme(k)) for k in SCHEMES}


class Owners(Dict[str, str]):
    """``{absolute path: canonical project name}``: the first distribution (by its
    ``.dist-info`` name) whose RECORD lists the path; :meth:`of` gives all of them. A file two
    RECORDs list is shared: neither distribution may change it as its own (a wheel let in with
    the same bytes as another's file would otherwise own it, and change it in its next version)."""

    def __init__(self) -> None:
        super().__init__()
        self.shared: Dict[str, FrozenSet[str]] = {}

    def add(self, path: str, name: str) -> None:
        first = self.setdefault(path, name)
        if first != name:
            self.shared[path] = self.shared.get(path, frozenset({first})) | {name}

    def of(self, path: str) -> FrozenSet[str]:
        """Every distribution whose RECORD lists ``path``."""
        if path in self.shared:
            return self.shared[path]
        return frozenset({self[path]}) if path in self else frozenset()


def installed_owners(layout: TargetLayout) -> Owners:
    """``{absolute path: canonical project name}`` from every ``*.dist-info/RECORD`` in the
    target's purelib and platlib (RECORD paths are relative to that directory); :class:`Owners`."""
    dirs = _real_dirs(layout)
    owners = Owners()
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
                    owners.add(_norm(_record_base(layout, site, row[0]), row[0]), name)
    return owners


#: where pip's ``--target`` home keeps the libraries (its home scheme's purelib and platlib)
_HOME_LIB = os.path.join("lib", "python")


def _record_base(layout: TargetLayout, site: str, row: str) -> str:
    """What a RECORD row is relative to: the site directory; in a ``--target`` directory,
    a row that leaves it (``../../bin/tool``) was written relative to the temporary home's
    ``lib/python``, whose ``bin``, ``include``... pip moved into the directory."""
    return os.path.join(site, _HOME_LIB) if layout.moved_home and row.startswith("..") else site


def _installed_name(info: str, entry: str) -> str:
    try:
        with open(os.path.join(info, "METADATA"), encoding="utf-8") as fh:
            name = HeaderParser().parse(fh).get("Name")
    except (OSError, UnicodeDecodeError):
        name = None
    return canonicalize_name(name or entry[:-len(".dist-info")].rsplit("-", 1)[0])


def _roots_present(dirs: Dict[str, str], installed: Owners) -> Dict[str, Dict[str, Tuple[FrozenSet[str], bool]]]:
    """import name -> {top-level entry of a site directory: (its owners, is a directory)} for
    what the target holds now (owners: the distributions whose RECORDs list a file of it; none:
    the environment's)."""
    owners_of_root: Dict[str, FrozenSet[str]] = {}
    for path in installed:
        for site in (dirs["purelib"], dirs["platlib"]):
            if path.startswith(site.rstrip(os.sep) + os.sep):
                root = os.path.join(site, os.path.relpath(path, site).split(os.sep)[0])
                owners_of_root[root] = owners_of_root.get(root, frozenset()) | installed.of(path)
    out: Dict[str, Dict[str, Tuple[FrozenSet[str], bool]]] = {}
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
                out.setdefault(name, {})[root] = (owners_of_root.get(root, frozenset()), is_dir)
    return out


def _wheel_files(path: str, dirs: Dict[str, str], moved_home: bool = False
                 ) -> Tuple[str, List[Tuple[str, str]], List[Tuple[str, str]]]:
    """The wheel's project, ``[(destination, what puts it there)]`` and the namespaces its
    site-level ``.pth`` files register with setuptools' nspkg loader ``[(member, namespace)]``.
    ``moved_home`` (``--target``): a data file below the home's ``lib/python/`` is moved into
    the directory with the libraries; one elsewhere below ``lib/`` is never moved."""
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
            site_path = site_rel(placed)  # the data scheme's site-packages too
            if site_path is not None and "/" not in site_path and site_path.lower().endswith(".pth"):
                namespaces += [(member, ns) for ns in nspkg_namespaces(zf.read(member)[:1 << 20])]
            if placed.scheme == ROOT:
                out.append((_norm(root, placed.path), member))
            elif moved_home and placed.scheme == "data" and placed.path.split("/")[0] == "lib":
                if placed.path.startswith(_HOME_LIB + "/"):
                    out.append((_norm(root, placed.path[len(_HOME_LIB) + 1:]), member))
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
    package deletes that package (:func:`_target_replacements`).
    """
    from pipguard.gate.findings import CRITICAL, Finding

    dirs = _real_dirs(target)
    installed = installed_owners(target)
    present = _roots_present(dirs, installed)
    claimed: Dict[str, Tuple[str, str, str, str]] = {}  # destination -> (project, wheel file name, wheel, member)
    findings: List[Finding] = []
    parsed = [(os.path.basename(wheel.path), *_wheel_files(wheel.path, dirs, target.moved_home)) for wheel in wheels]
    everyone = {dest: name for _, name, files, _ in parsed for dest, _ in files}
    read = FileReader({dest: (wheel.path, source) for wheel, (_, _, files, _) in zip(wheels, parsed)
                    for dest, source in files})
    paths = {artifact: wheel.path for wheel, (artifact, _, _, _) in zip(wheels, parsed)}
    if replaces_entries:
        findings += _target_replacements(parsed, dirs["purelib"], installed)
    # nspkg lines run from a site directory only: a --target directory is put on PYTHONPATH,
    # where site.py reads no .pth file
    roots = [] if target.moved_home else list(dict.fromkeys((dirs["purelib"], dirs["platlib"],
                                                             *target.import_paths)))
    lines = [] if target.moved_home else installed_nspkg_lines(dirs, installed)
    for artifact, name, files, namespaces in parsed:
        findings += _shadowing(name, artifact, files, dirs, present)
        findings += _shadowing_inside(name, artifact, files, dirs, installed, everyone)
        if roots:
            findings += _nspkg_takeovers(name, artifact, namespaces, roots, installed, everyone, read)
            findings += _under_an_installed_nspkg(name, artifact, files, dirs, lines, read)
        for dest, source in files:
            mine = (paths[artifact], source)

            def lossless(theirs: Optional[Tuple[str, str]] = None) -> bool:
                """No loss: a namespace's shared pkgutil/pkg_resources __init__.py replaced by
                another, or a file replaced by the very same bytes (a family ships some alike).
                Read only for a clash: an upgrade's own files are never opened."""
                if os.path.basename(dest) == "__init__.py" and read.shim(dest, mine) \
                        and read.shim(dest, theirs, on_disk=theirs is None):
                    return True
                return read.same(dest, mine, theirs)

            others = sorted(installed.of(dest) - {name})
            other: Optional[str] = None
            if (others or dest not in installed) and os.path.lexists(dest) and not lossless():
                other = (f"installed distribution {', '.join(others)} (its RECORD lists it)" if others
                         else "the environment (a file no installed distribution's RECORD lists)")
            previous = claimed.get(dest)
            if previous is not None and previous[0] != name and not lossless((previous[2], previous[3])):
                other = f"{previous[0]} ({previous[1]}, in the same install)"
            claimed.setdefault(dest, (name, artifact, paths[artifact], source))
            if other:
                findings.append(Finding(
                    name, artifact, CRITICAL, "overwrites-other", source, None,
                    f"{name} would overwrite {dest}, owned by {other}", dest))
    return findings


def _other_owner(path: str, name: str, installed: Owners, everyone: Dict[str, str]) -> Optional[str]:
    """Who besides ``name`` a file belongs to, said for a finding; None when only to ``name``
    (a file another distribution's RECORD lists too is also that one's)."""
    if path in everyone:
        return None if everyone[path] == name else f"{everyone[path]} (in the same install)"
    if path in installed:
        others = sorted(installed.of(path) - {name})
        return f"installed distribution {', '.join(others)}" if others else None
    return "the environment (no RECORD lists it)"


def _nspkg_takeovers(name: str, artifact: str, namespaces: List[Tuple[str, str]], roots: Sequence[str],
                     installed: Owners, everyone: Dict[str, str], read: FileReader) -> list:
    """Critical ``shadows-other`` for each namespace a wheel's nspkg ``.pth`` line registers
    that is another distribution's *regular* package or module anywhere on the interpreter's
    import path (``roots``): at every start the line puts in ``sys.modules`` a module made from
    the spec it finds in its own site directory (the package's, never run; or the wheel's
    namespace portion, in front of a package further down the path), so the package's own
    code never runs and the wheel's files are found as its submodules. setuptools writes the
    line only for namespaces, which have no ``__init__``."""
    from pipguard.gate.findings import CRITICAL, Finding

    out = []
    for member, namespace in namespaces:
        for root in roots:
            regular = regular_module(root, namespace, everyone, read)
            if regular is None:
                continue
            who = _other_owner(regular, name, installed, everyone)
            if who is None:
                continue  # its own: not a namespace it takes from anyone
            out.append(Finding(name, artifact, CRITICAL, "shadows-other", member, None,
                               f"{name}'s nspkg start-up hook registers {namespace!r} at every interpreter start, "
                               f"but {namespace} is a regular package of {who} ({regular}): its code would never "
                               f"run and `import {namespace}` would give another module", regular))
            break
    return out


def installed_nspkg_lines(dirs: Dict[str, str], installed: Owners) -> List[Tuple[str, str, str]]:
    """``[(namespace, the .pth file, its distribution)]`` of the nspkg lines already in the
    target's site directories (a few small files: read at most 1 MiB each)."""
    found = []
    for site in dict.fromkeys((dirs["purelib"], dirs["platlib"])):
        try:
            names = sorted(n for n in os.listdir(site) if n.lower().endswith(".pth"))
        except OSError:
            continue
        for entry in names:
            path = os.path.join(site, entry)
            try:
                with open(path, "rb") as fh:
                    data = fh.read(1 << 20)
            except OSError:
                continue
            found += [(namespace, path, installed.get(path, "")) for namespace in nspkg_namespaces(data)]
    return found


def _under_an_installed_nspkg(name: str, artifact: str, files: List[Tuple[str, str]], dirs: Dict[str, str],
                              lines: List[Tuple[str, str, str]], read: FileReader) -> list:
    """Critical ``shadows-other`` for a wheel that would make a regular package or module of a
    namespace an installed nspkg line of another distribution registers: the line, installed
    first, takes over the package installed after it (never run, or replaced by that
    distribution's namespace portion)."""
    from pipguard.gate.findings import CRITICAL, Finding

    mine = {dest: name for dest, _ in files}
    out = []
    for namespace, pth, owner in lines:
        if owner == name:
            continue
        for site in dict.fromkeys((dirs["purelib"], dirs["platlib"])):
            regular = regular_module(site, namespace, mine, read)
            if regular is not None and regular in mine:
                who = f"installed distribution {owner}" if owner else "the environment (no RECORD lists it)"
                out.append(Finding(name, artifact, CRITICAL, "shadows-other", os.path.relpath(regular, site), None,
                                   f"{namespace} would be a regular package of {name}, but {pth} of {who} registers "
                                   f"{namespace!r} at every interpreter start (setuptools' nspkg loader): "
                                   f"{name}'s code would never run; that start-up hook takes it over", pth))
                break
    return out


def _target_replacements(parsed: list, target_dir: str, installed: Owners) -> list:
    """``pip install --target DIR --upgrade`` (pip's ``_handle_target_dir``): pip installs every
    wheel into a temporary home, then moves each top-level entry of its ``lib/python`` and then
    each of the home itself (the data scheme's files, ``bin``, ``include``) into DIR, removing
    whatever of that name DIR holds, whole -- the entry it moved a moment before included.
    Critical ``overwrites-other`` for each wheel whose entry would so delete files of another
    distribution: one DIR already holds (its RECORD lists them, or none does: the
    environment's), or one of the same install whose entry of that name the data move replaces.
    The distributions whose own entry ends in DIR are no victims (their files come back); a link
    in DIR pip leaves alone."""
    from pipguard.gate.findings import CRITICAL, Finding

    # entry -> {"lib" | "home": {distribution: (its wheel file, the member that puts it there)}}
    moved: Dict[str, Dict[str, Dict[str, Tuple[str, str]]]] = {}
    for artifact, name, files, _namespaces in parsed:
        for dest, source in files:
            rel = os.path.relpath(dest, target_dir)
            if rel == os.pardir or rel.startswith(os.pardir + os.sep):
                continue
            placed = None if source.startswith("[") else place(source)
            from_home = placed is None or (placed.scheme in ("data", "scripts", "headers")
                                           and not (placed.scheme == "data"
                                                    and placed.path.startswith(_HOME_LIB + "/")))
            group = moved.setdefault(rel.split(os.sep)[0], {}).setdefault("home" if from_home else "lib", {})
            group.setdefault(name, (artifact, source))
    out = []
    for entry, groups in sorted(moved.items()):
        lib, home = groups.get("lib", {}), groups.get("home", {})
        last = home or lib  # what DIR holds in the end: the home's move comes last
        victims: Dict[str, str] = {}  # distribution -> where its files were
        path = os.path.join(target_dir, entry)
        if os.path.lexists(path) and not os.path.islink(path):
            # what its RECORD lists and is still there: an earlier --upgrade may have taken the
            # rest (a distribution's RECORD outlives the files pip replaced under it)
            owners = {owner for held in installed if (held == path or held.startswith(path + os.sep))
                      and os.path.lexists(held) for owner in installed.of(held)}
            for owner in owners or {""}:
                victims[owner] = path
        if home:
            for owner in lib:
                victims.setdefault(owner, f"{entry} of the same install, moved in first")
        lost = [f"installed distribution {owner}" if owner and where == path else
                f"{owner} ({where})" if owner else "the environment (no RECORD lists them)"
                for owner, where in sorted(victims.items()) if owner not in last]  # its own comes back
        if not lost:
            continue
        for supplier, (artifact, source) in sorted(last.items()):
            out.append(Finding(supplier, artifact, CRITICAL, "overwrites-other", source, None,
                               f"{supplier} would make pip delete {path} (pip install --target --upgrade "
                               f"removes an entry of that name whole before it moves the new one in): it "
                               f"holds files of {', '.join(lost)}", path))
    return out


def _shadowing_inside(name: str, artifact: str, files: List[Tuple[str, str]], dirs: Dict[str, str],
                      installed: Owners, everyone: Dict[str, str]) -> list:
    """Critical ``shadows-other`` for each module the wheel would put inside a package directory
    beside another distribution's module of the same name: Python's finder takes one of them by
    kind (a package with an ``__init__``, then an extension module, then source, then bytecode),
    so ``victim/api.<extension suffix>`` beside ``victim/api.py``, or
    ``victim/__init__.<extension suffix>`` beside ``victim/__init__.py``, takes over the import
    without overwriting a file (the top level is :func:`_shadowing`'s)."""
    from pipguard.gate.findings import CRITICAL, Finding

    sites = tuple(dict.fromkeys((dirs["purelib"], dirs["platlib"])))
    out, said = [], set()
    listed: Dict[str, List[str]] = {}  # a wheel puts many files in one directory: listed once
    for dest, source in files:
        directory, base = os.path.split(dest)
        if directory in sites or not any(directory.startswith(site + os.sep) for site in sites):
            continue
        module = import_name(base)
        if module is None:
            continue
        checks = [(directory, module)]  # the module beside the modules of its name
        if module == "__init__" and os.path.dirname(directory) not in sites:
            checks.append((os.path.dirname(directory), os.path.basename(directory)))  # a package beside a module
        for where, wanted in checks:
            if where not in listed:
                listed[where] = entries(where, everyone)
            for entry in listed[where]:
                other = os.path.join(where, entry)
                if other == dest or os.path.isdir(other) or import_name(entry) != wanted:
                    continue
                who = _other_owner(other, name, installed, everyone)
                if who is None or (other, dest) in said:
                    continue
                said.add((other, dest))
                out.append(Finding(name, artifact, CRITICAL, "shadows-other", source, None,
                                   f"{name} would install {os.path.relpath(dest, os.path.dirname(where))} beside "
                                   f"{os.path.relpath(other, os.path.dirname(where))} of {who}: Python's finder "
                                   f"takes one of them by kind, so it can take over that import without "
                                   f"overwriting a file", other))
    return out


def _shadowing(name: str, artifact: str, files: List[Tuple[str, str]], dirs: Dict[str, str],
               present: Dict[str, Dict[str, Tuple[FrozenSet[str], bool]]]) -> list:
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
        for other, (owners, other_is_dir) in sorted(present.get(top, {}).items()):
            if other == root or owners == {name} or (is_dir and other_is_dir):
                continue
            if owners | {name} <= DESIGNED_SHARING.get(top, frozenset()) and owners:
                continue
            others = sorted(owners - {name})
            who = f"installed distribution {', '.join(others)}" if others else "the environment (no RECORD lists it)"
            out.append(Finding(name, artifact, CRITICAL, "shadows-other", source, None,
                               f"{name} would install {os.path.basename(root)}{'/' if is_dir else ''} beside "
                               f"{os.path.basename(other)} of {who}: it takes over `import {top}` without "
                               "overwriting a file", root))
    for root, (top, is_dir, _source) in mine.items():
        present.setdefault(top, {}).setdefault(root, (frozenset({name}), is_dir))
    return out
