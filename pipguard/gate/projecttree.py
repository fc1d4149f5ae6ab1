"""The user's project tree: what a hook call may not leave in a tree pip builds in place and keeps.

For a tree pip builds in place and keeps (a local directory: ``pip install ./proj``, ``-e .``, a
path in ``-r``; an editable VCS checkout), every file of it is looked at, by its stat: what a
hook call created or changed there outlives the install. Three kinds of entries:

- files another program runs later, outside any sandbox (:data:`RUN_LATER`), start-up files
  (``sitecustomize``/``usercustomize``, ``.pth``: judged by the gate's own rules) and whatever
  lies in an environment inside the project (a directory holding ``pyvenv.cfg``): protected
  entries like version-control state — a change refuses the install and is undone;
- the backend's own outputs (:data:`BUILD_OUTPUTS`): not looked at;
- everything else: by its stat only; a new file is reported (informational: Cython's ``.c``,
  an extension built in place), a change to a file the user had is reported (medium) and not
  refused — setuptools-scm and hatch-vcs rewrite their version file, Cython regenerates a
  tracked ``.c``, and a stat cannot tell that from an edit.

:func:`snapshot_tree` records it before each hook call, :func:`tree_problems` compares after it;
:func:`pipguard.gate.srcguard.check_and_restore` reports and undoes what they find.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from dataclasses import dataclass
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

from pipguard.gate.declared import declared_name
from pipguard.gate.treefiles import MAX_FILE, VCS_ROOTS, Entry, entry_at, read_regular

#: files and directories of a project tree that another program runs or loads later, outside any
#: sandbox: (name, ``file`` for a file of that name at any depth or ``dir`` for any file below a
#: directory of that name, ``top-file``/``top-dir`` the same at the project's root only,
#: why). A build that creates or changes one refuses the install.
#: Not in it, on purpose: ``pyproject.toml`` and ``setup.cfg`` (the backend's configuration,
#: which builds rewrite and restore — poetry-dynamic-versioning; read again only by the next build,
#: which is sandboxed: a change is reported), ``.gitattributes`` (names filter and diff drivers,
#: which only git configuration defines: the repositories' configuration is protected).
RUN_LATER: Tuple[Tuple[str, str, str], ...] = (
    ("conftest.py", "file", "pytest imports it when it collects the directory"),
    ("noxfile.py", "file", "nox imports it"),
    ("Makefile", "file", "make runs its recipes"),
    ("makefile", "file", "make runs its recipes"),
    ("GNUmakefile", "file", "make runs its recipes"),
    ("justfile", "file", "just runs its recipes"),
    ("Justfile", "file", "just runs its recipes"),
    ("tox.ini", "file", "tox runs its commands; pytest reads its addopts (-p loads a module)"),
    ("pytest.ini", "file", "pytest reads its addopts (-p loads a module)"),
    (".pytest.ini", "file", "pytest reads its addopts (-p loads a module)"),
    (".envrc", "file", "direnv sources it when a shell enters the directory"),
    (".env", "file", "VS Code, python-dotenv and docker compose load its variables (LD_PRELOAD, PYTHONPATH)"),
    (".pdbrc", "file", "pdb runs its commands when the debugger starts in the directory"),
    (".pre-commit-config.yaml", "file", "pre-commit runs the hooks it names at the next commit"),
    (".gitlab-ci.yml", "file", "CI runs it, with the project's secrets, once it is pushed"),
    (".vscode", "dir", "VS Code runs tasks and launch configurations, and runs the executables settings name"),
    (".idea", "dir", "PyCharm runs its run configurations and startup tasks"),
    (".devcontainer", "dir", "dev containers run its postCreateCommand"),
    (".github", "dir", "CI runs its workflows, with the project's secrets, once they are pushed"),
    ("__pycache__", "dir", "Python imports a cached .pyc instead of its source when the header matches"),
    (".git", "dir", "a repository in a subdirectory: git runs its hooks and configuration there"),
    # a `gitdir:` file makes the subdirectory a repository whose git directory is elsewhere (in
    # build/, not looked at): its core.fsmonitor runs at the next `git status` there (VS Code's
    # scan of nested repositories runs one when the project is opened)
    (".git", "file", "a gitdir: file makes its directory a repository: git runs that repository's "
     "configuration there"),
    (".hg", "dir", "a repository in a subdirectory: hg runs its hgrc there"),
    # git hooks kept in the tree, named by core.hooksPath (husky sets it to .husky/_)
    (".husky", "dir", "husky's git hooks: git runs them at the next commit (core.hooksPath)"),
    (".githooks", "dir", "git hooks kept in the project: git runs them at the next commit (core.hooksPath)"),
    (".pylintrc", "file", "pylint runs its init-hook (Python) and loads its load-plugins, also from "
     "an editor's linting"),
    ("pylintrc", "file", "pylint runs its init-hook (Python) and loads its load-plugins"),
    ("mypy.ini", "file", "mypy imports the plugins it names (a path to a .py file too)"),
    (".mypy.ini", "file", "mypy imports the plugins it names (a path to a .py file too)"),
    ("ipython_config.py", "file", "IPython runs it when started in the directory"),
    ("jupyter_notebook_config.py", "file", "Jupyter runs it when started in the directory"),
    ("jupyter_server_config.py", "file", "Jupyter runs it when started in the directory"),
    ("jupyter_lab_config.py", "file", "Jupyter runs it when started in the directory"),
    (".circleci", "top-dir", "CI runs its jobs, with the project's secrets, once they are pushed"),
    (".travis.yml", "top-file", "CI runs it, with the project's secrets, once it is pushed"),
    ("azure-pipelines.yml", "top-file", "CI runs it, with the project's secrets, once it is pushed"),
    ("bitbucket-pipelines.yml", "top-file", "CI runs it, with the project's secrets, once it is pushed"),
    ("Jenkinsfile", "top-file", "CI runs it, with the project's secrets, once it is pushed"),
    (".readthedocs.yaml", "top-file", "Read the Docs runs its build commands, with the project's tokens"),
    (".readthedocs.yml", "top-file", "Read the Docs runs its build commands, with the project's tokens"),
)
_RUN_LATER_FILES = {name: why for name, kind, why in RUN_LATER if kind == "file"}
_RUN_LATER_DIRS = {name: why for name, kind, why in RUN_LATER if kind == "dir"}
#: ... at the project's root only (``top-file``, ``top-dir``: CI reads its files from the
#: repository's root; the same names deeper, in a vendored package or a build's
#: ``node_modules``, run nowhere)
_RUN_LATER_TOP_FILES = {**_RUN_LATER_FILES, **{name: why for name, kind, why in RUN_LATER if kind == "top-file"}}
_RUN_LATER_TOP_DIRS = {**_RUN_LATER_DIRS, **{name: why for name, kind, why in RUN_LATER if kind == "top-dir"}}
#: directories below which a file is kept by its stat only (too many, or binary, to copy)
_STAMPED_DIRS = ("__pycache__", ".idea", ".git", ".hg")

#: what backends write in the tree they build in, at its top: not looked at (their content is
#: build output; pytest does not collect ``build``/``dist`` and ``.*`` directories either).
#: ``*.egg-info`` (setuptools, next to the packages: any depth) is looked into for run-later and
#: start-up files (setuptools writes a fixed set of metadata files there, nothing else belongs),
#: and so are setuptools' editable link trees (``build/__editable__.*``: on sys.path).
BUILD_OUTPUTS = (
    "build",        # setuptools, scikit-build-core (build-dir), meson-python editable (build/cp3XY)
    "dist",         # setuptools' sdist/bdist commands (the user's own release files: RELEASE_DIR)
    ".eggs",        # setuptools' setup_requires
    ".pdm-build",   # pdm-backend
)
#: name prefixes of build outputs: meson-python's temporary build directory
BUILD_OUTPUT_PREFIXES = (".mesonpy-",)
#: build outputs that pytest walks into from the project's root (not in its default
#: ``norecursedirs``): only a ``conftest.py`` and start-up files are looked for there (a
#: ``Makefile`` CMake or a crate's configure writes there runs only if you go there and run make)
COLLECTED_OUTPUTS = ("_skbuild",)   # scikit-build (classic)
#: ... and ``target/`` when the project is a Rust one (maturin runs cargo)
CARGO_OUTPUT = "target"
#: what pytest loads from any directory it collects, without being asked
_COLLECTED_NAMES = ("conftest.py",)
#: a distribution's metadata directory: importlib.metadata finds one on any import path (an
#: editable's ``src/`` or project root, the current directory of ``python -m pytest``) and tools
#: load its entry points without being asked (pytest's ``pytest11`` plugins, at every run). No
#: backend leaves a ``.dist-info`` in the tree it builds; setuptools writes the project's own
#: ``.egg-info`` — one named otherwise is another distribution, planted.
METADATA_SUFFIXES = (".dist-info", ".egg-info")
_METADATA_WHY = ("importlib.metadata finds another distribution's metadata on an import path: tools load "
                 "its entry points (pytest11 plugins at every pytest run)")
#: entries whose files are stat'ed in a project tree, at most; past it only the protected names
#: are looked for (no stat of the other files: reported as not checked) ...
MAX_TREE = 100_000
#: ... and past this many entries nothing more is looked at (reported)
MAX_WALK = 1_000_000
#: at most this many created/changed files are listed per hook call (the rest are counted)
MAX_LISTED = 20

#: where the user's own release files are (``python -m build``, ``twine upload dist/*``): no
#: build pip runs writes there (its outputs go to pip's directories), but one that rewrites a
#: wheel the user built is published with the next upload — a file the user had there that the
#: build changed or removed refuses the install (by its stat: a wheel is not copied, so it is
#: left as the build made it, and reported); a new file there is not reported
RELEASE_DIR = "dist"
RELEASE_RULE = "project-release-changed"
RUN_LATER_RULE = "project-run-later"
STARTUP_RULE = "project-startup-file"
ENV_RULE = "project-env-tamper"
CREATED_RULE = "project-file-created"
CHANGED_RULE = "project-file-changed"
UNCHECKED_RULE = "project-tree-unchecked"
_STARTUP_STEMS = ("sitecustomize", "usercustomize")


@dataclass(frozen=True)
class Tree:
    """A project tree's ordinary files by their stat (:func:`_stamp`), and ``baseline``: the paths
    that were there before the install's first hook call (the user's files, not the build's)."""

    stamps: Dict[str, Tuple[int, ...]]
    baseline: FrozenSet[str]
    complete: bool = True
    #: whether the install's first snapshot saw the whole tree (the user's tree was not too big)
    baseline_complete: bool = True
    #: the project's name as its tree declared it before the first hook call (pyproject.toml's
    #: ``[project]``, an sdist's PKG-INFO), normalised; None: not declared (a setup.py's)
    project_name: Optional[str] = None
    #: whether every directory was looked into for protected names (False past MAX_WALK)
    walked: bool = True
    #: the directories of the tree that the repository's ``core.hooksPath`` names (relative)
    hooks_dirs: Tuple[str, ...] = ()


def _stamp(st: os.stat_result) -> Tuple[int, ...]:
    # ctime too: a change of content that puts back size and mtime still moves it
    return (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def _startup_parts(parts: Sequence[str]) -> Optional[int]:
    """Index of the part that makes ``parts`` a start-up file if its directory is an import
    root (``sitecustomize.py``, ``usercustomize/__init__.py``, ``x.pth``), else None."""
    for i, part in enumerate(parts):
        if part.split(".", 1)[0].lower() in _STARTUP_STEMS:
            return i
    if parts and parts[-1].lower().endswith(".pth"):
        return len(parts) - 1
    return None


#: how a directory of the project tree is looked at
_WHOLE, _NAMED, _COLLECTED = 0, 1, 2   # every file; run-later and start-up files; conftest and start-up


def _output_view(name: str, cargo: bool) -> Optional[int]:
    """How a top-level directory that a backend writes is looked at: -1 not at all, else a view."""
    if name in BUILD_OUTPUTS or name.startswith(BUILD_OUTPUT_PREFIXES):
        return -1
    if name in COLLECTED_OUTPUTS or (cargo and name == CARGO_OUTPUT):
        return _COLLECTED
    return None


def snapshot_tree(source_dir: str, first: Optional[Tree] = None) -> Tuple[Tuple[Entry, ...], Tree]:
    """The protected entries of a project tree (run-later, start-up and environment files,
    repositories in subdirectories, metadata of other distributions) and the stat of every other
    file; ``first``: the install's first snapshot of this tree (None: this is the first), whose
    paths are the user's files. Links are never followed; the root's ``.git``/``.hg`` are
    :func:`pipguard.gate.srcguard.snapshot`'s. Past :data:`MAX_TREE` entries the other files are no longer stat'ed, but
    every directory is still looked into for protected names (a big ``node_modules`` or venv in
    the project must not hide a ``conftest.py`` planted after it), up to :data:`MAX_WALK`."""
    protected: List[Entry] = []
    stamps: Dict[str, Tuple[int, ...]] = {}
    cargo = os.path.isfile(os.path.join(source_dir, "Cargo.toml"))
    project_name = first.project_name if first is not None else declared_name(source_dir)
    hooks_dirs = first.hooks_dirs if first is not None else hooks_paths(source_dir)
    # (directory relative to the root, why its files are protected or "", its view, in a venv:
    # its files are protected)
    stack: List[Tuple[str, str, int, bool]] = [("", "", _WHOLE, False)]
    seen = 0
    complete = walked = True
    while stack:
        rel_dir, why_dir, view, env = stack.pop()
        entries = _scandir(os.path.join(source_dir, rel_dir) if rel_dir else source_dir)
        seen += len(entries)
        if seen > MAX_WALK:
            complete = walked = False
            break
        complete = complete and seen <= MAX_TREE
        env = env or any(e.name == "pyvenv.cfg" for e in entries)
        for item in entries:
            name = item.name
            if not rel_dir and name in VCS_ROOTS:
                continue  # srcguard.snapshot()'s (its hooks and configuration, with their bytes)
            rel = f"{rel_dir}/{name}" if rel_dir else name
            try:
                is_dir = item.is_dir(follow_symlinks=False)
            except OSError:
                continue
            output = _output_view(name, cargo) if not rel_dir and is_dir else None
            if name == RELEASE_DIR and not rel_dir and is_dir:
                stack.append((rel, "", _WHOLE, False))  # by stat: only a change is reported
                continue
            if output == -1:
                if name == "build":  # setuptools' editable link trees are on sys.path
                    stack += [(f"build/{e.name}", "", _NAMED, False) for e in _scandir(os.path.join(source_dir, rel))
                              if e.name.startswith("__editable__") and e.is_dir(follow_symlinks=False)]
                continue
            dirs, files = (_RUN_LATER_TOP_DIRS, _RUN_LATER_TOP_FILES) if not rel_dir else \
                (_RUN_LATER_DIRS, _RUN_LATER_FILES)
            why = why_dir or (dirs.get(name, "") if is_dir else files.get(name, ""))
            if is_dir and rel in hooks_dirs:
                why = why or _HOOKS_WHY
            if is_dir:
                sub = output if output is not None else \
                    max(view, _NAMED if name.endswith(".egg-info") else _WHOLE)
                if not why and _foreign_metadata(name, project_name):
                    # the directory itself too: a created one is removed whole
                    protected.append(dataclasses.replace(entry_at(source_dir, rel, True), rule=RUN_LATER_RULE))
                    why, sub = _METADATA_WHY, _WHOLE
                stack.append((rel, why, sub, env))
                continue
            parts = rel.split("/")
            if _startup_parts(parts) is not None:
                rule, copy = STARTUP_RULE, True
            elif view == _COLLECTED:
                if name not in _COLLECTED_NAMES:
                    continue
                rule, copy = RUN_LATER_RULE, True
            elif env:
                rule, copy = ENV_RULE, False
            elif why:
                rule, copy = RUN_LATER_RULE, not any(p in _STAMPED_DIRS for p in parts[:-1])
            elif view == _WHOLE and complete:
                rule, copy = "", False
            else:
                continue
            try:
                st = item.stat(follow_symlinks=False)
            except OSError:
                continue
            if rule:
                protected.append(_tree_entry(source_dir, rel, st, rule, copy=copy))
            else:
                stamps[rel] = _stamp(st)
    if first is None:
        return tuple(protected), Tree(stamps, frozenset(stamps), complete, complete, project_name, walked,
                                      hooks_dirs)
    return tuple(protected), Tree(stamps, first.baseline, complete, first.baseline_complete, project_name, walked,
                                  hooks_dirs)


_HOOKS_WHY = "git runs the hooks of the directory core.hooksPath names at the next commit or checkout"


def hooks_paths(source_dir: str) -> Tuple[str, ...]:
    """The directories inside ``source_dir`` that its repository's configuration (``.git/config``,
    read before the install's first hook call) names as ``core.hooksPath``, relative to it."""
    data = read_regular(os.path.join(source_dir, ".git", "config"))
    if data is None:
        return ()
    found, section = [], ""
    for raw in data.decode("utf-8", "replace").splitlines():
        line = raw.strip()
        if line.startswith("["):
            section = line[1:line.find("]")].strip().lower() if "]" in line else ""
            continue
        key, sep, value = line.partition("=")
        if section == "core" and sep and key.strip().lower() == "hookspath":
            path = os.path.normpath(os.path.join(source_dir, value.strip().strip('"')))
            rel = os.path.relpath(path, source_dir)
            if rel != "." and not rel.startswith(".."):
                found.append(rel.replace(os.sep, "/"))
    return tuple(found)


def _foreign_metadata(name: str, project_name: Optional[str]) -> bool:
    """Whether a directory called ``name`` is a distribution's metadata that is not the project's
    own (every ``.dist-info``; an ``.egg-info`` named for another project)."""
    if name.endswith(".dist-info"):
        return True
    if not name.endswith(".egg-info") or project_name is None:
        return False  # a setup.py's name is known only once it ran: not judged (docs/sandbox.md)
    from packaging.utils import canonicalize_name

    stem = name[:-len(".egg-info")].split("-", 1)[0]  # NAME or NAME-VERSION(-pyX.Y)
    return canonicalize_name(stem) != project_name


def _scandir(path: str) -> List[os.DirEntry]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except OSError:
        return []


def _tree_entry(root: str, rel: str, st: os.stat_result, rule: str, *, copy: bool) -> Entry:
    """A protected file of the project tree: with a copy of its bytes (put back when changed),
    or by its stat only (``copy`` False: many, or binary; never put back, only removed when the
    build created it)."""
    if copy:
        return dataclasses.replace(entry_at(root, rel, True), rule=rule,
                                   stamp=_stamp(st) if st.st_size > MAX_FILE else ())
    kind = "link" if stat.S_ISLNK(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
    return Entry(rel, kind, stat.S_IMODE(st.st_mode), vcs=True, rule=rule, stamp=_stamp(st))


def why_run_later(rel: str) -> str:
    parts = rel.split("/")
    for i, part in enumerate(parts[:-1]):
        why = (_RUN_LATER_TOP_DIRS if i == 0 else _RUN_LATER_DIRS).get(part)
        if why:
            return why
    if any(part.endswith(METADATA_SUFFIXES) for part in parts):
        return _METADATA_WHY
    return (_RUN_LATER_TOP_FILES if len(parts) == 1 else _RUN_LATER_FILES).get(parts[-1], "")


def judge_startup(rel: str, content: bytes) -> List[Tuple[str, str, str]]:
    """(severity, rule, message) of a start-up file the build wrote in the project, by the
    gate's own rules for ``sitecustomize``/``usercustomize`` and ``.pth`` as if its directory
    were site-packages (any directory of a project can be an import root: ``src/``, an
    editable install's mapping, PYTHONPATH); a ``.pth`` the gate would let through is refused
    all the same: no backend writes one into the project it builds."""
    from pipguard.gate import startup  # the gate's rules: imported where a start-up file is judged
    from pipguard.gate.findings import BLOCKING_SEVERITIES, CRITICAL, FindingCollector

    parts = rel.split("/")
    start = _startup_parts(parts)
    col = FindingCollector("", "")
    if start is not None:
        startup.check_startup_module(col, rel, "/".join(parts[start:]))
    if parts[-1].lower().endswith(".pth"):
        startup.check_pth(col, rel, content, startup.PthContext("", None, lambda module: None))
    found = [(f.severity, f.rule, f.message) for f in col.result() if f.severity in BLOCKING_SEVERITIES]
    return found or [(CRITICAL, STARTUP_RULE, "a .pth file the build wrote into the project: site.py "
                      "processes it at every interpreter start once its directory is a site directory")]


def tree_problems(source_dir: str, before: Tree, after: Tree) -> List[Tuple[str, str, str, str]]:
    """(severity, rule, message, path) for the ordinary files a call created, changed or
    removed; informational for what it created, medium for what the user had."""
    def released(rel: str) -> bool:
        return rel.startswith(RELEASE_DIR + "/")

    created = sorted(rel for rel in set(after.stamps) - set(before.stamps) if not released(rel))
    changed = sorted(rel for rel, stamp in after.stamps.items()
                     if rel in before.stamps and before.stamps[rel] != stamp and rel in before.baseline)
    removed = sorted(rel for rel in set(before.stamps) - set(after.stamps) if rel in before.baseline)
    out: List[Tuple[str, str, str, str]] = []
    for rel in [r for r in changed + removed if released(r)][:MAX_LISTED]:
        out.append(("high", RELEASE_RULE, f"the build {'removed' if rel in removed else 'changed'} {rel}, a "
                    "release file you built (the next upload of dist/ publishes what the build made of it); "
                    "left as the build made it", rel))
    changed = [r for r in changed if not released(r)]
    removed = [r for r in removed if not released(r)]
    for rel in created[:MAX_LISTED]:
        out.append(("info", CREATED_RULE, f"the build created {rel} in your project", rel))
    for rel in changed[:MAX_LISTED]:
        out.append(("medium", CHANGED_RULE, f"the build changed {rel}, a file of your project", rel))
    for rel in removed[:MAX_LISTED]:
        out.append(("medium", CHANGED_RULE, f"the build removed {rel}, a file of your project", rel))
    for what, rels, severity, rule in (("created", created, "info", CREATED_RULE),
                                       ("changed or removed", changed + removed, "medium", CHANGED_RULE)):
        if len(rels) > MAX_LISTED:
            out.append((severity, rule, f"and {len(rels) - MAX_LISTED} more files {what} in your project", ""))
    real_root = os.path.realpath(source_dir)
    for rel in created + changed:
        if not stat.S_ISLNK(after.stamps[rel][0]):
            continue
        path = os.path.join(source_dir, rel)
        target = os.path.realpath(path)
        if os.path.isdir(path):
            out.append(("critical", RUN_LATER_RULE, f"the build created {rel}, a link to a directory: tools "
                        "walk into it (pytest collects it), and what it leads to was not checked; removed", rel))
        elif target != real_root and not target.startswith(real_root + "/"):
            # the next unsandboxed `python -m build` packs what it leads to (~/.ssh/id_rsa as
            # package data) and the upload publishes it
            out.append(("critical", RUN_LATER_RULE, f"the build made {rel} a link out of your project "
                        f"({target}): tools that follow it (setuptools' package data, an archive, an editor) "
                        "take what it leads to; removed", rel))
    if before.baseline_complete and not after.complete:
        out.append(("high", UNCHECKED_RULE, f"the build grew your project past {MAX_TREE} entries: "
                    "what it wrote there was not checked", ""))
    elif not after.complete:
        out.append(("medium", UNCHECKED_RULE, f"your project has more than {MAX_TREE} entries: only the "
                    "protected ones and the first entries were checked", ""))
    return [(s, r, m, os.path.join(source_dir, p) if p else source_dir) for s, r, m, p in out]
