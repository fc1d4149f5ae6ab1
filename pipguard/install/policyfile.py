"""The project's policy file: ``pipguard.toml``, or ``[tool.pipguard]`` in
``pyproject.toml``, parsed with tomllib (tomli before Python 3.11).

Where it comes from (never from a package): ``--policy PATH`` (a file, or a
project directory looked up as below), else the working directory: its
``pipguard.toml``, else its ``pyproject.toml`` if that has a
``[tool.pipguard]`` table. Both in one directory is an error (which one would
count is a guess). Nothing else is read: not a parent directory, not the
projects or sdists pip installs.

Keys (unknown keys are errors; every path must exist; relative paths are
relative to the policy file's directory)::

    allow-read = ["~/.rustup"]          # extra read-only roots, every hook call
    allow-write = []                    # extra writable roots, every hook call
    keep-env = ["CARGO_NET_OFFLINE"]    # variables passed into hook calls
    [build-hosts]                       # per package (the name pip resolved)
    cryptography = ["index.crates.io", "static.crates.io:443"]
    [[approve]]                         # see pipguard.install.approvals
    package = "coverage==7.6.1"
    sha256 = "..."
    gate = "pth-exec"
    member = "a1_coverage.pth"

The file only feeds the command's options (:class:`ProjectPolicy` ->
``InstallOptions``); nothing after the plan reads it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Tuple

from pipguard.install.approvals import Approvals, entries
from pipguard.errors import PolicyError
from pipguard.sandbox.policy import HostPort

POLICY_FILE = "pipguard.toml"
PYPROJECT = "pyproject.toml"
KEYS = ("allow-read", "allow-write", "keep-env", "build-hosts", "approve")


@dataclass(frozen=True)
class ProjectPolicy:
    """What a policy file asks for; the empty default: nothing (no file)."""

    path: Optional[str] = None
    #: "" for pipguard.toml, "tool.pipguard" inside pyproject.toml
    table: str = ""
    allow_read: Tuple[str, ...] = ()
    allow_write: Tuple[str, ...] = ()
    keep_env: Tuple[str, ...] = ()
    #: (canonical package name, hosts) pairs
    build_hosts: Tuple[Tuple[str, Tuple[HostPort, ...]], ...] = ()
    approvals: Approvals = Approvals()

    def hosts_for(self, package: str) -> Tuple[HostPort, ...]:
        return next((hosts for name, hosts in self.build_hosts if name == package), ())

    def to_json(self) -> dict:
        return {"path": self.path, "allow_read": list(self.allow_read),
                "allow_write": list(self.allow_write), "keep_env": list(self.keep_env),
                "build_hosts": {name: [str(h) for h in hosts] for name, hosts in self.build_hosts},
                "approvals": [{"package": a.package, "sha256": a.sha256, a.kind: a.rule,
                               "member" if a.kind == "gate" else "target": a.target,
                               **({"phase": a.phase} if a.phase else {}), "reason": a.reason}
                              for a in self.approvals.entries]}


def locate(explicit: Optional[str], cwd: str) -> Optional[Tuple[str, str]]:
    """(path, table) of the policy to use, or None when there is none."""
    if explicit is not None:
        path = os.path.abspath(os.path.expanduser(explicit))
        if os.path.isdir(path):
            found = _in_directory(path)
            if found is None:
                raise PolicyError(f"--policy {explicit}: no {POLICY_FILE} and no [tool.pipguard] in "
                                  f"{PYPROJECT} there")
            return found
        if not os.path.isfile(path):
            raise PolicyError(f"--policy {explicit}: no such file or directory")
        return path, ("tool.pipguard" if os.path.basename(path) == PYPROJECT else "")
    return _in_directory(cwd)


def _in_directory(directory: str) -> Optional[Tuple[str, str]]:
    own = os.path.join(directory, POLICY_FILE)
    pyproject = os.path.join(directory, PYPROJECT)
    has_table = os.path.isfile(pyproject) and "pipguard" in (_parse(pyproject).get("tool") or {})
    if os.path.isfile(own):
        if has_table:
            raise PolicyError(f"two policies in {directory}: {POLICY_FILE} and [tool.pipguard] in "
                              f"{PYPROJECT}", hint="keep one of them")
        return own, ""
    return (pyproject, "tool.pipguard") if has_table else None


def load(explicit: Optional[str] = None, cwd: Optional[str] = None) -> ProjectPolicy:
    """The project's policy (the empty one when there is none); PolicyError
    (one line, exit 2) when it is malformed."""
    found = locate(explicit, cwd or os.getcwd())
    if found is None:
        return ProjectPolicy()
    return _read(*found)


def _read(path: str, table: str, shown: Optional[str] = None) -> ProjectPolicy:
    """The policy in ``path`` (errors name the file as ``shown``, default ``path``)."""
    shown = shown or path
    data = _parse(path, shown)
    section = (data.get("tool") or {}).get("pipguard") if table else data
    if not isinstance(section, dict):
        raise PolicyError(f"{shown}: [tool.pipguard] must be a table")
    try:
        return _policy(section, path, table)
    except PolicyError as exc:
        raise PolicyError(f"{shown}: {exc.message}", exc.hint) from None


def _parse(path: str, shown: Optional[str] = None) -> dict:
    try:
        import tomllib  # Python >= 3.11
    except ImportError:  # pragma: no cover - depends on the interpreter
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{shown or path}: not valid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(f"{shown or path}: cannot be read: {exc}") from None


def _policy(data: dict, path: str, table: str) -> ProjectPolicy:
    from packaging.utils import canonicalize_name

    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise PolicyError(f"unknown key(s) {', '.join(unknown)}", hint=f"known: {', '.join(KEYS)}")
    base = os.path.dirname(path)
    hosts = data.get("build-hosts", {})
    if not isinstance(hosts, dict):
        raise PolicyError("build-hosts must be a table: PACKAGE = [\"HOST[:PORT]\", ...]")
    build_hosts = []
    for name, values in hosts.items():
        listed = _strings(values, f"build-hosts.{name}")
        build_hosts.append((canonicalize_name(name), tuple(_host(h, f"build-hosts.{name}") for h in listed)))
    approve = data.get("approve", [])
    if not isinstance(approve, list):
        raise PolicyError("approve must be an array of tables ([[approve]])")
    keep_env = _strings(data.get("keep-env", []), "keep-env")
    for name in keep_env:
        if not name or "=" in name:
            raise PolicyError(f"keep-env: {name!r} is not a variable name")
    return ProjectPolicy(
        path=path, table=table,
        allow_read=_roots(data.get("allow-read", []), "allow-read", base),
        allow_write=_roots(data.get("allow-write", []), "allow-write", base),
        keep_env=keep_env, build_hosts=tuple(build_hosts), approvals=Approvals(entries(approve)))


def _strings(value, key: str) -> Tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PolicyError(f"{key} must be a list of strings")
    return tuple(value)


def _roots(value, key: str, base: str) -> Tuple[str, ...]:
    out = []
    for path in _strings(value, key):
        full = os.path.realpath(os.path.join(base, os.path.expanduser(path)))
        if not os.path.exists(full):
            raise PolicyError(f"{key}: {path}: no such file or directory")
        out.append(full)
    return tuple(dict.fromkeys(out))


def _host(text: str, key: str) -> HostPort:
    from pipguard.errors import UsageError

    try:
        return HostPort.parse(text)
    except UsageError as exc:
        raise PolicyError(f"{key}: {exc.message.replace('--allow-host ', '')}") from None


def append(path: str, table: str, text: str) -> None:
    """Append ``text`` (TOML entries) to the policy file at ``path`` (created
    when missing), atomically, and only if the result is still a valid policy."""
    from pipguard.report.model import write_atomic

    try:
        with open(path, encoding="utf-8") as handle:
            old = handle.read()
    except FileNotFoundError:
        old = ""
    new = old + ("\n" if old and not old.endswith("\n") else "") + ("\n" if old else "") + text
    write_atomic(path + ".pipguard-new", new)
    try:
        _read(path + ".pipguard-new", table, shown=path)
        os.replace(path + ".pipguard-new", path)
    finally:
        if os.path.exists(path + ".pipguard-new"):
            os.unlink(path + ".pipguard-new")

