"""One PEP 517 hook call pip makes, run in a sandbox of its own.

pip (through pyproject-hooks) runs ``PYTHON _in_process.py HOOK CONTROL_DIR``
in the project's source tree, after writing ``CONTROL_DIR/input.json`` (the
hook's keyword arguments: output directories, config settings). From that
trusted input pipguard derives what this call may touch:

- read and write: the call's own source tree (its working directory), its
  control directory, and the output directory pip gave it (``wheel_directory``,
  ``metadata_directory`` of a prepare-metadata call, ``sdist_directory``);
- read: its build environment (pip's ``pip-build-env-*`` prefix), the
  metadata pip prepared earlier for it, pip's hook runner, and the system;
- nothing else: no other package's tree or output, no home, no network
  unless a build host is allowed (``--allow-build-host``).

After the call, what the hook returned is checked before pip acts on it: the
result must name a regular file or directory inside the output directory
(not a path elsewhere, not a symlink), and nothing else may have appeared
there (a second wheel dropped next to its own is refused).
"""

from __future__ import annotations

import email.parser
import json
import os
import stat
import tempfile
from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Tuple

from pipguard.gate import declared, projecttree, srcguard, treefiles
from pipguard.gate.coremeta import MAX_METADATA_BYTES, CoreMetadata, read_headers, wheel_metadata
from pipguard.sandbox.files import walk
from pipguard.sandbox.policy import HostPort, Policy
from pipguard.report.model import Report

#: hook -> the input.json keyword that names its output directory
OUTPUT_KEY = {
    "build_wheel": "wheel_directory",
    "build_editable": "wheel_directory",
    "build_sdist": "sdist_directory",
    "prepare_metadata_for_build_wheel": "metadata_directory",
    "prepare_metadata_for_build_editable": "metadata_directory",
}
#: hooks whose result is a list of requirement strings
REQUIRES_HOOKS = ("get_requires_for_build_wheel", "get_requires_for_build_sdist",
                  "get_requires_for_build_editable")
KNOWN_HOOKS = (*OUTPUT_KEY, *REQUIRES_HOOKS, "_supported_features")
#: variables of a hook call that carry no credentials and the call needs:
#: pyproject-hooks' backend selection, in each spelling the vendored pyproject-hooks of a
#: supported pip uses (1.0 in pip 23.2: PEP517_*; 1.1-1.2: _PYPROJECT_HOOKS_*; 1.3 in pip 26.3:
#: the backend path as JSON, without which an in-tree backend (``backend-path``) cannot be
#: imported), and the build environment pip set up
HOOK_ENV = ("PEP517_BUILD_BACKEND", "PEP517_BACKEND_PATH", "_PYPROJECT_HOOKS_BUILD_BACKEND",
            "_PYPROJECT_HOOKS_BACKEND_PATH", "_PYPROJECT_HOOKS_BACKEND_PATH_JSON",
            "PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONNOUSERBASE")


class HookCallRefused(Exception):
    """The request does not look like a hook call pip makes."""


@dataclass(frozen=True)
class HookCall:
    """What one hook call is and may touch (derived from pip's trusted input)."""

    hook: str
    package: str            # canonical name, for the report
    version: str            # "" when the source tree does not say
    argv: Tuple[str, ...]
    cwd: str
    env: Dict[str, str]
    control_dir: str
    output_dir: Optional[str]
    reads: Tuple[str, ...]
    writes: Tuple[str, ...]
    #: the source tree's protected entries before the call (:mod:`pipguard.gate.srcguard`)
    protected: Tuple["treefiles.Entry", ...] = ()
    #: (name, URL) requirements the project declares as data, read before any hook ran
    #: (:func:`declared_url_requirements`): the only requirements by URL a result may name
    declared_urls: FrozenSet[Tuple[str, str]] = frozenset()
    #: build_wheel/build_editable: the ``.dist-info`` directory an earlier prepare-metadata call
    #: left and pip resolved from (pip passes it as ``metadata_directory``); None: none given
    prepared_metadata: Optional[str] = None
    #: what that prepared metadata said, read when its call ended (the installer fills it in):
    #: the wheel built must say the same (:mod:`pipguard.gate.coremeta`); None: not checked
    expected_metadata: Optional[CoreMetadata] = None
    #: the user's project tree (a local directory pip builds in place) by its files' stat,
    #: before the call; None: pip's own unpacked tree, thrown away after the install
    tree: Optional["projecttree.Tree"] = None


@dataclass(frozen=True)
class Problem:
    """Something about a hook call's result: refuses the install at a refusing
    ``severity`` (the gate's), and is only reported below it (a file the build
    created in the user's project)."""

    rule: str
    message: str
    path: str = ""
    severity: str = "critical"

    @property
    def refuses(self) -> bool:
        return self.severity in ("critical", "high")


@dataclass(frozen=True)
class HookResult:
    call: HookCall
    report: Report
    problems: Tuple[Problem, ...] = ()

    @property
    def clean(self) -> bool:
        return self.report.verdict == "clean" and not self.refusals and self.report.exit_code == 0

    @property
    def refusals(self) -> Tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.refuses)

    @property
    def refusing(self) -> bool:
        """Blocked attempts or a bad result: refuses the whole install."""
        return self.report.verdict == "blocked" or bool(self.refusals)


def plan_call(argv: Sequence[str], cwd: str, env: Dict[str, str], *, project: bool = False,
              first_tree: Optional["projecttree.Tree"] = None) -> HookCall:
    """Derive a :class:`HookCall` from what pip's seam sent for one call. ``project``: its tree
    is the user's (pip builds a local directory in place, and keeps it), so every file of it is
    snapshot (:func:`pipguard.gate.projecttree.snapshot_tree`); ``first_tree``: that tree's snapshot
    before the install's first hook call in it (None: this is the first): the user's files."""
    if len(argv) != 4:
        raise HookCallRefused(f"unexpected hook command: {list(argv)[:6]}")
    python, script, hook, control_dir = (str(a) for a in argv)
    if hook not in KNOWN_HOOKS:
        raise HookCallRefused(f"unknown PEP 517 hook {hook!r}")
    control_dir = os.path.realpath(control_dir)
    kwargs = _read_input(control_dir)
    cwd = os.path.realpath(cwd)
    output_dir = None
    reads: List[str] = [os.path.dirname(os.path.realpath(script))]
    writes: List[str] = [control_dir]
    if hook in OUTPUT_KEY:
        output = kwargs.get(OUTPUT_KEY[hook])
        if not isinstance(output, str) or not os.path.isdir(output):
            raise HookCallRefused(f"{hook}: pip gave no output directory")
        output_dir = os.path.realpath(output)
        writes.append(output_dir)
    prepared = kwargs.get("metadata_directory") if hook in ("build_wheel", "build_editable") else None
    prepared_dir = None
    if isinstance(prepared, str) and os.path.isdir(prepared):
        prepared_dir = os.path.realpath(prepared)
        reads.append(prepared_dir)
        reads += _prebuilt_wheel_dir(prepared_dir)
    reads += _build_env_roots(env, python)
    name, version = source_identity(cwd)
    # pip's settings (index credentials among them) and the seam's channel never reach a
    # hook; everything else goes through the sandbox's allow-list (--keep-env adds names)
    clean_env = {k: v for k, v in env.items() if not k.startswith("PIP_") and k != "PIPGUARD_SEAM"}
    # pip <= 25 writes its build environment's site/sitecustomize.py without bytecode;
    # the call may read that directory but not write it, so Python's import system
    # would try (and be refused, a write-outside-roots finding) to cache it. Whatever a
    # hook call could cache lies in pip's throw-away directories: nothing is lost.
    clean_env["PYTHONDONTWRITEBYTECODE"] = "1"
    protected, tree = srcguard.snapshot(cwd), None
    if project:
        more, tree = projecttree.snapshot_tree(cwd, first_tree)
        protected += more
    return HookCall(hook, name, version, (python, script, hook, control_dir), cwd, clean_env,
                    control_dir, output_dir, tuple(dict.fromkeys(r for r in reads if r != cwd)),
                    tuple(dict.fromkeys(writes)), protected, prepared_metadata=prepared_dir, tree=tree)


#: pyproject-hooks' marker (its name before and since 1.0): a prepare-metadata call for a
#: backend without that hook built the whole wheel next to the metadata (_in_process.py)
WHEEL_BUILT_MARKERS = ("PEP517_ALREADY_BUILT_WHEEL", "PYPROJECT_HOOKS_ALREADY_BUILT_WHEEL")


def _prebuilt_wheel_dir(metadata_dir: str) -> List[str]:
    """The directory holding ``metadata_dir`` when the same package's prepare-metadata
    call left a built wheel there: pyproject-hooks' build_wheel then copies that wheel
    instead of building again (it lists the directory and reads the wheel). That
    directory was the earlier call's own output directory (check_result allowed only
    a name inside it), so it holds nothing of anyone else; a shared parent (``/tmp``,
    a home) is never granted."""
    parent = os.path.dirname(metadata_dir)
    if not any(os.path.isfile(os.path.join(parent, m)) for m in WHEEL_BUILT_MARKERS):
        return []
    from pipguard.sandbox.plan import UNSAFE_CWD, home_directories

    if parent in UNSAFE_CWD or parent == os.path.realpath(tempfile.gettempdir()) or any(
            h == parent or h.startswith(parent + "/") for h in home_directories()):
        return []
    return [parent]


def _read_input(control_dir: str) -> dict:
    try:
        with open(os.path.join(control_dir, "input.json"), encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError) as exc:
        raise HookCallRefused(f"cannot read the hook's input.json: {exc}") from None
    kwargs = data.get("kwargs") if isinstance(data, dict) else None
    if not isinstance(kwargs, dict):
        raise HookCallRefused("the hook's input.json has no kwargs")
    return kwargs


def _build_env_roots(env: Dict[str, str], python: str) -> List[str]:
    """pip's build environment: the ``pip-build-env-*`` directories named by
    PYTHONPATH and PATH (pip <= 25 prefixes) or holding the hook's python
    (pip >= 26 venvs)."""
    roots: List[str] = []
    candidates = [*env.get("PYTHONPATH", "").split(os.pathsep), *env.get("PATH", "").split(os.pathsep),
                  os.path.dirname(python)]
    for entry in candidates:
        if not entry or not os.path.isabs(entry):
            continue
        path = os.path.realpath(entry) if os.path.exists(entry) else os.path.abspath(entry)
        while path not in ("/", ""):
            if os.path.basename(path).startswith("pip-build-env-"):
                if os.path.isdir(path):
                    roots.append(path)
                break
            path = os.path.dirname(path)
    return roots


def source_identity(source_dir: str) -> Tuple[str, str]:
    """(canonical name, version) of the project in ``source_dir``, for the
    report only: what it declares (:func:`pipguard.gate.declared.declared_identity`), else pip's
    directory name (``NAME_HASH``) or the directory's name."""
    from packaging.utils import canonicalize_name

    identity = declared.declared_identity(source_dir)
    if identity is not None:
        return identity
    base = os.path.basename(source_dir.rstrip("/"))
    head, sep, tail = base.rpartition("_")
    if sep and len(tail) >= 8 and tail.isalnum():
        base = head  # pip's NAME_HASH unpack directory
    return canonicalize_name(base), ""


def declared_url_requirements(source_dir: str) -> FrozenSet[Tuple[str, str]]:
    """(canonical name, URL) of each requirement by URL that ``source_dir``'s
    pyproject.toml declares statically: ``[project] dependencies`` and
    ``optional-dependencies`` that ``dynamic`` does not hand to the backend.

    Read when pip has prepared the tree and before any of its hooks ran, so
    what it holds is what the project's author wrote, not what a build read
    or computed: naming such a URL is no channel out of the sandbox, and pip
    fetches it as it would without pipguard. Anything unreadable: none."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    try:
        project = declared.load_toml(os.path.join(source_dir, "pyproject.toml")).get("project")
    except (OSError, ValueError):
        return frozenset()
    if not isinstance(project, dict):
        return frozenset()
    declared_dynamic = project.get("dynamic")
    dynamic: List[object] = declared_dynamic if isinstance(declared_dynamic, list) else []
    texts: List[object] = []
    if "dependencies" not in dynamic and isinstance(project.get("dependencies"), list):
        texts += project["dependencies"]
    optional = project.get("optional-dependencies")
    if "optional-dependencies" not in dynamic and isinstance(optional, dict):
        for group in optional.values():
            texts += group if isinstance(group, list) else []
    out = set()
    for text in texts:
        try:
            requirement = Requirement(text) if isinstance(text, str) else None
        except InvalidRequirement:
            continue
        if requirement is not None and requirement.url:
            out.add((canonicalize_name(requirement.name), requirement.url))
    return frozenset(out)


def sandbox_policy(call: HookCall, *, isolation: str, build_hosts: Sequence[HostPort],
                   timeout: Optional[float], keep_env: Sequence[str], observe_reads: Optional[bool],
                   extra_read: Sequence[str] = (), extra_write: Sequence[str] = (),
                   limits: Optional[Dict[str, Any]] = None) -> Policy:
    return Policy(
        **(limits or {}),
        isolation=isolation, allow_hosts=tuple(build_hosts),
        allow_read=tuple(dict.fromkeys([*call.reads, *extra_read])),
        allow_write=tuple(dict.fromkeys([*call.writes, *extra_write])),
        timeout=timeout, keep_env=tuple(dict.fromkeys([*HOOK_ENV, *keep_env])),
        observe_reads=observe_reads,
        # pip's temporary area (where the control dir is): every other build of
        # this install lives there; looking into it is reported, not only refused
        private_roots=(os.path.dirname(call.control_dir),),
    )


def check_result(call: HookCall, succeeded: bool = True) -> Tuple[Problem, ...]:
    """What is wrong with what the hook left for pip (empty: nothing). A
    call that failed (``succeeded`` False) owes no result: pip reports it."""
    problems: List[Problem] = [Problem(rule, message, path, severity) for severity, rule, message, path
                               in srcguard.check_and_restore(call.cwd, call.protected, call.tree)]
    expected_control = {"input.json", "output.json"}
    try:
        entries = set(os.listdir(call.control_dir))
    except OSError as exc:
        return (Problem("hook-output", f"the control directory is gone: {exc}"),)
    for extra in sorted(entries - expected_control):
        problems.append(Problem("hook-output", "unexpected file in the hook's control directory",
                                os.path.join(call.control_dir, extra)))
    output_json = os.path.join(call.control_dir, "output.json")
    if not succeeded and not os.path.lexists(output_json):
        return tuple(problems)
    if not _regular(output_json):
        problems.append(Problem("hook-output", "output.json is missing or not a regular file", output_json))
        return tuple(problems)
    try:
        with open(output_json, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return tuple(problems)  # pip reports an unreadable result itself; nothing to trust or install
    if not isinstance(data, dict) or "return_val" not in data:
        return tuple(problems)  # unsupported/missing hook: pip handles those answers
    value = data["return_val"]
    if call.hook in REQUIRES_HOOKS:
        if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            problems.append(Problem("hook-output", f"{call.hook} returned something other than "
                                    "a list of requirement strings"))
        else:
            problems += _direct_references(call, value, output_json)
    elif call.hook in OUTPUT_KEY and call.output_dir is not None:
        problems += _check_output(call, value)
    return tuple(problems)


def _check_output(call: HookCall, value) -> List[Problem]:
    assert call.output_dir is not None
    problems: List[Problem] = []
    if not isinstance(value, str) or not value or value != os.path.basename(value) or value in (".", ".."):
        return [Problem("hook-output", f"{call.hook} returned {str(value)[:200]!r}, not a name inside "
                        "its output directory")]
    result = os.path.join(call.output_dir, value)
    wants_dir = call.hook.startswith("prepare_metadata")
    try:
        mode = os.lstat(result).st_mode
    except OSError:
        return [Problem("hook-output", f"{call.hook} returned {value!r}, which does not exist", result)]
    if wants_dir:
        if not stat.S_ISDIR(mode):
            problems.append(Problem("hook-output", "prepared metadata is not a directory", result))
        else:
            for root, dirs, files in walk(result):
                for name in dirs + files:
                    path = os.path.join(root, name)
                    if os.path.islink(path) or not (os.path.isdir(path) or _regular(path)):
                        problems.append(Problem("hook-output", "link or special file in prepared metadata",
                                                path))
    elif not stat.S_ISREG(mode):
        problems.append(Problem("hook-output", f"{call.hook}'s result is not a regular file", result))
    if wants_dir:
        if not problems:
            metadata = treefiles.read_regular(os.path.join(result, "METADATA"))
            if metadata is not None:
                requires = email.parser.BytesParser().parsebytes(metadata, headersonly=True)
                problems += _direct_references(call, [str(r) for r in requires.get_all("Requires-Dist") or ()],
                                               os.path.join(result, "METADATA"))
        return problems  # pip reads only the returned directory (setuptools leaves its egg-info too)
    for extra in sorted(set(os.listdir(call.output_dir)) - {value}):
        problems.append(Problem("unexpected-output", f"{call.hook} left something besides its result "
                                "in its output directory (only the returned artifact is used)",
                                os.path.join(call.output_dir, extra)))
    if call.expected_metadata is not None and not problems and call.hook != "build_sdist":
        built = wheel_metadata(result)
        if built is not None:  # no readable metadata: pip refuses the wheel itself
            for difference in call.expected_metadata.differences(built):
                problems.append(Problem("metadata-mismatch", f"{call.hook}: the wheel's METADATA is not "
                                        f"what pip resolved from: {difference}", result))
    return problems


def built_artifact(call: HookCall) -> Optional[str]:
    """The artifact a build call returned, in its output directory (a regular file, or None)."""
    if call.hook not in ("build_wheel", "build_editable", "build_sdist") or call.output_dir is None:
        return None
    value = _returned(call)
    path = None if value is None else os.path.join(call.output_dir, value)
    return path if path is not None and _regular(path) else None


def _returned(call: HookCall) -> Optional[str]:
    """The plain name a hook call returned in its output.json (read as pipguard), or None."""
    data = treefiles.read_regular(os.path.join(call.control_dir, "output.json"))
    try:
        value = json.loads(data or b"null")
    except ValueError:
        return None
    value = value.get("return_val") if isinstance(value, dict) else None
    if not isinstance(value, str) or not value or value != os.path.basename(value) or value in (".", ".."):
        return None
    return value


def prepared_metadata(call: HookCall) -> Optional[Tuple[str, CoreMetadata]]:
    """``(the .dist-info directory, its metadata)`` a prepare-metadata call returned, read as
    pipguard (never through a link) right after the call, before pip reads it; None for other
    hooks and for a call that left none."""
    if not call.hook.startswith("prepare_metadata") or call.output_dir is None:
        return None
    value = _returned(call)
    if value is None:
        return None
    directory = os.path.join(call.output_dir, value)
    metadata = treefiles.read_regular(os.path.join(directory, "METADATA"), MAX_METADATA_BYTES + 1)
    return None if metadata is None else (os.path.realpath(directory), read_headers(metadata))


def _direct_references(call: HookCall, requirements: Sequence[str], where: str) -> List[Problem]:
    """A requirement by URL (``name @ https://...``, ``git+...``, ``file:...``) in what a hook
    computed: pip resolves it itself, unsandboxed and with the network, so a build with no
    network could make pip connect anywhere and carry data in the URL. Names go to the index
    only (docs/sandbox.md, honest limits); URLs only where the project declared them as
    data (``call.declared_urls``)."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    out: List[Problem] = []
    for text in requirements:
        try:
            requirement = Requirement(text)
            url = requirement.url
            if url and (canonicalize_name(requirement.name), url) in call.declared_urls:
                continue
        except InvalidRequirement:
            url = text if "://" in text or text.lstrip().startswith(("file:", "/", ".")) else None
        if url:
            out.append(Problem("direct-reference", f"{call.hook}: a requirement by URL, which pip would "
                               f"fetch outside the sandbox: {text[:300]!r}", where))
    return out


def _regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False
