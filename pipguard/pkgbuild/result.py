"""The outcome of ``pipguard pkgbuild``: phases (each with its own sandbox
report), the package's contents, and one JSON form (``pipguard.report/1``
plus the fields documented in docs/pkgbuild.md)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple

from pipguard import exitcodes
from pipguard.report import model as report_mod
from pipguard.report.model import Event, FileWritten, Report

#: status -> exit code (as for ``pipguard sandbox``)
EXIT_CODES = {"clean": exitcodes.OK, "blocked": exitcodes.REFUSED, "error": exitcodes.ERROR,
              "interrupted": exitcodes.INTERRUPTED}


@dataclass(frozen=True)
class PackageFile:
    """One entry of a package, as pacman would install it.

    ``path`` is absolute as installed (``/usr/bin/hello``); ``kind`` is
    ``file``, ``symlink``, ``hardlink`` or ``other`` (fifo, device...);
    ``mode`` the octal permission bits including setuid/setgid/sticky
    (``"4755"``); ``sha256`` is empty for anything but a regular file;
    ``target`` is a link's text (a hard link's: the path it links to);
    ``owner`` is ``user:group`` as the package archive records them (empty
    when the contents come from ``$pkgdir``, where fakeroot's view is lost)."""

    package: str
    path: str
    kind: str
    mode: str
    size: int
    sha256: str = ""
    target: str = ""
    owner: str = ""


@dataclass(frozen=True)
class Phase:
    """One sandboxed run. ``step`` names the scriptlet function for the
    install-scripts phase; ``own_dirs`` are the directories the phase is
    there to write (its output), so everything it wrote elsewhere is listed
    in :attr:`written_outside`."""

    name: str
    report: Report
    step: str = ""
    package: str = ""
    own_dirs: Tuple[str, ...] = ()

    @property
    def written_outside(self) -> Tuple[FileWritten, ...]:
        """Files the phase wrote outside its own directories (that were
        allowed: the sandbox's private temp dir and HOME). Refused writes
        are blocked ``file-write`` events, see :attr:`blocked_writes`.
        A file in the namespace's own ``/tmp`` never reached the host."""
        return tuple(f for f in self.report.files_written if not f.discarded
                     and not any(f.path == d or f.path.startswith(d + "/") for d in self.own_dirs))

    @property
    def blocked_writes(self) -> Tuple[Event, ...]:
        return tuple(e for e in self.report.blocked_events if e.kind == "file-write")

    @property
    def title(self) -> str:
        parts = [self.name] + [p for p in (self.package, self.step) if p]
        return " ".join(parts[:1]) + (f" ({', '.join(parts[1:])})" if parts[1:] else "")

    def to_json(self) -> Dict[str, Any]:
        return {"name": self.name, "step": self.step, "package": self.package,
                "verdict": self.report.verdict, "exit_code": self.report.exit_code,
                "duration": self.report.duration, "own_dirs": list(self.own_dirs),
                "written_outside": [dataclasses.asdict(f) for f in self.written_outside],
                "blocked_writes": [e.target for e in self.blocked_writes],
                "report": self.report.to_json()}


@dataclass(frozen=True)
class PkgbuildResult:
    """``status``: ``clean`` (every phase ran, nothing blocked), ``blocked``
    (something was blocked in any phase), ``error`` (a phase failed or the
    sources did not match their checksums, nothing blocked), or
    ``interrupted``. Clean is what was observed in this execution, not proof."""

    directory: str
    command: Tuple[str, ...]
    status: str
    message: str
    phases: Tuple[Phase, ...] = ()
    pkgbase: str = ""
    version: str = ""
    pkgnames: Tuple[str, ...] = ()
    sources: Tuple[Dict[str, Any], ...] = ()
    allowed_hosts: Tuple[str, ...] = ()
    hosts_needing_allow: Tuple[str, ...] = ()
    checksum_mismatches: Tuple[Dict[str, str], ...] = ()
    contents: Tuple[PackageFile, ...] = ()
    build_user: Dict[str, Any] = field(default_factory=dict)
    isolation: str = "auto"

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.status, exitcodes.ERROR)

    def combined(self) -> Report:
        """One run-style report over every phase (events tagged with ``phase``),
        for renderers that take a :class:`Report` (SARIF)."""
        parts = [(p.report, {"phase": p.name, **({"step": p.step} if p.step else {})}) for p in self.phases]
        return report_mod.combined(parts, command=self.command, exit_code=self.exit_code,
                                   isolation=self.isolation, cwd=self.directory,
                                   error=self.message if self.status in ("error", "interrupted") else None)

    def to_json(self) -> Dict[str, Any]:
        data = self.combined().to_json()
        data["verdict"] = {"clean": "clean", "blocked": "blocked"}.get(self.status, "error")
        data.update(
            status=self.status, message=self.message, directory=self.directory,
            pkgbuild={"pkgbase": self.pkgbase, "version": self.version, "pkgnames": list(self.pkgnames),
                      "sources": [dict(s) for s in self.sources],
                      "allowed_hosts": list(self.allowed_hosts),
                      "hosts_needing_allow": list(self.hosts_needing_allow),
                      "checksum_mismatches": [dict(m) for m in self.checksum_mismatches],
                      "build_user": dict(self.build_user)},
            phases=[p.to_json() for p in self.phases],
            contents=[dataclasses.asdict(f) for f in self.contents],
        )
        return data

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "PkgbuildResult":
        """Inverse of :meth:`to_json` (the review's worker process hands its
        result over as JSON: plain data, never code)."""
        info = data.get("pkgbuild") or {}
        phases = tuple(Phase(p["name"], report_mod.from_json(p["report"]), p.get("step", ""),
                             p.get("package", ""), tuple(p.get("own_dirs") or ()))
                       for p in data.get("phases") or ())
        names = {f.name for f in dataclasses.fields(PackageFile)}
        return cls(
            directory=data.get("directory", ""), command=tuple(data.get("command") or ()),
            status=data.get("status", "error"), message=data.get("message", ""), phases=phases,
            pkgbase=info.get("pkgbase", ""), version=info.get("version", ""),
            pkgnames=tuple(info.get("pkgnames") or ()), sources=tuple(info.get("sources") or ()),
            allowed_hosts=tuple(info.get("allowed_hosts") or ()),
            hosts_needing_allow=tuple(info.get("hosts_needing_allow") or ()),
            checksum_mismatches=tuple(info.get("checksum_mismatches") or ()),
            contents=tuple(PackageFile(**{k: v for k, v in f.items() if k in names})
                           for f in data.get("contents") or ()),
            build_user=dict(info.get("build_user") or {}),
            isolation=(data.get("isolation") or {}).get("requested", "auto"),
        )


#: the package archive's extension for the build phase: uncompressed, since it is only read back
PKGEXT = ".pkg.tar"
#: what an archive may hold before pipguard stops listing it (a hostile build controls it)
MAX_MEMBERS = 200_000


def archive_contents(archive: str) -> Tuple[str, Tuple[PackageFile, ...]]:
    """(pkgname, entries) of a package archive makepkg built (under fakeroot,
    as pacman will see it): its modes and owners are fakeroot's, which the
    tree on disk does not keep — a ``chown`` in ``package()`` is not applied
    there, and makepkg's ``strip`` rewrites an ELF file, which clears a
    setuid bit on disk but not in the archive. Directories and the archive's
    own metadata (``.PKGINFO``, ``.BUILDINFO``, ``.MTREE``, ``.INSTALL``…)
    are left out. Raises OSError or tarfile.TarError for what is not a tar."""
    import hashlib
    import tarfile

    pkgname = ""
    out: List[PackageFile] = []
    with tarfile.open(archive, "r:") as tar:
        for count, member in enumerate(tar):
            if count >= MAX_MEMBERS:
                raise OSError(f"{archive}: more than {MAX_MEMBERS} entries")
            name = member.name.lstrip("/")
            while name.startswith("./"):
                name = name[2:]
            if name == ".PKGINFO" and member.isreg():
                fh = tar.extractfile(member)
                text = fh.read(1 << 20).decode("utf-8", "replace") if fh else ""
                pkgname = next((line.split("=", 1)[1].strip() for line in text.splitlines()
                                if line.startswith("pkgname")), "")
            if not name or "/" not in name and name.startswith(".") or member.isdir():
                continue
            owner = f"{member.uname or member.uid}:{member.gname or member.gid}"
            mode = format(member.mode & 0o7777, "04o")
            if member.isreg():
                digest = hashlib.sha256()
                fh = tar.extractfile(member)
                while fh is not None:
                    chunk = fh.read(1 << 20)
                    if not chunk:
                        break
                    digest.update(chunk)
                out.append(PackageFile("", "/" + name, "file", mode, member.size, digest.hexdigest(), owner=owner))
            elif member.issym():
                out.append(PackageFile("", "/" + name, "symlink", mode, 0, target=member.linkname, owner=owner))
            elif member.islnk():
                out.append(PackageFile("", "/" + name, "hardlink", mode, 0,
                                       target="/" + member.linkname.lstrip("/"), owner=owner))
            else:
                out.append(PackageFile("", "/" + name, "other", mode, 0, owner=owner))
    entries = tuple(sorted((dataclasses.replace(f, package=pkgname) for f in out), key=lambda f: f.path))
    return pkgname, entries


def package_contents(package: str, pkgdir: str) -> Tuple[PackageFile, ...]:
    """Every entry below ``pkgdir`` except directories, sorted by path. Links
    are recorded, never followed."""
    from pipguard.sandbox.files import sha256, walk

    out: List[PackageFile] = []
    for dirpath, dirnames, filenames in walk(pkgdir):
        for name in sorted(dirnames + filenames):
            full = os.path.join(dirpath, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            if os.path.isdir(full) and not os.path.islink(full):
                continue
            rel = "/" + os.path.relpath(full, pkgdir)
            mode = format(st.st_mode & 0o7777, "04o")
            if os.path.islink(full):
                out.append(PackageFile(package, rel, "symlink", mode, st.st_size,
                                       target=os.readlink(full)))
            elif os.path.isfile(full):
                out.append(PackageFile(package, rel, "file", mode, st.st_size, sha256=_hash(full, sha256)))
            else:
                out.append(PackageFile(package, rel, "other", mode, 0))
    return tuple(sorted(out, key=lambda f: (f.package, f.path)))


def _hash(path: str, sha256) -> str:
    try:
        return sha256(path)
    except OSError:
        return ""
