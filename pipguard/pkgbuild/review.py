"""The phases of a PKGBUILD review, each one sandboxed run of the real makepkg
(or of one install scriptlet), each with its own evidence.

  0. srcinfo          ``makepkg --printsrcinfo`` (sources the PKGBUILD: its
                      top-level code runs here), offline, writes one file
  1. sources          ``makepkg --verifysource``: fetch and verify, network
                      only to the hosts the source URLs name (plus
                      ``--allow-host``), through the recording proxy; then
                      pipguard re-checks every checksum itself
  2. build            ``makepkg``: prepare/build/check/package and the
                      package archive (uncompressed, in ``$PKGDEST``: the
                      contents are read from it, with fakeroot's modes and
                      owners), offline, writable only ``$BUILDDIR`` (srcdir,
                      pkgdir), ``$PKGDEST`` and the sandbox's private temp dir and HOME
  3. install-scripts  each scriptlet function of each package's ``.install``
                      file, as pacman calls it, against a scratch root

The PKGBUILD is never sourced outside the sandbox: pipguard reads only the
``.SRCINFO`` text the first phase wrote, and the ``.install`` file's text.
"""

from __future__ import annotations

import os
import platform
import shutil
import stat
import tarfile
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from pipguard.sandbox.backends.ns.spec import in_private_tmpfs
from pipguard.errors import UsageError
from pipguard.pkgbuild import srcinfo as srcinfo_mod
from pipguard.pkgbuild.result import PKGEXT, Phase, PkgbuildResult, archive_contents, package_contents
from pipguard.sandbox.policy import HostPort, Policy
from pipguard.report.model import Report

Progress = Callable[[str], None]

#: what the review sets for makepkg (its directory settings, the archive's extension) and for
#: fakeroot (FAKEROOTDONTTRYCHOWN: keep a chown in package() fakeroot's alone — in the namespace
#: backend only the sandbox's own id is mapped, so the real chown fails EINVAL, which fakeroot
#: does not forgive as it does EPERM, and package() failed); passed through the env scrub
MAKEPKG_ENV = ("BUILDDIR", "SRCDEST", "PKGDEST", "SRCPKGDEST", "LOGDEST", "PKGEXT", "FAKEROOTDONTTRYCHOWN")
_COMMON = ("--nodeps", "--nocolor", "--noconfirm", "--skippgpcheck")
#: pacman runs each scriptlet as ``. INSTALL; FUNCTION ARGS`` in a new shell
_SCRIPTLET = '. "$1" && "$2" "${@:3}"'
_MAX_TEXT = 1 << 20


class Layout:
    """The review's directories under one private temp dir.

    ``input`` is a copy of the user's directory that no phase may write;
    the others belong to the build user."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.input = os.path.join(base, "input")
        self.meta = os.path.join(base, "meta")
        self.sources = os.path.join(base, "sources")
        self.build = os.path.join(base, "build")
        self.out = os.path.join(base, "out")
        self.roots = os.path.join(base, "roots")

    def build_owned(self) -> Tuple[str, ...]:
        return (self.meta, self.sources, self.build, self.out, self.roots)

    def root(self, pkgname: str) -> str:
        """The scratch root the install scriptlets of ``pkgname`` run against."""
        return os.path.join(self.roots, pkgname)

    def makepkg_env(self, builddir: str) -> Dict[str, str]:
        return {"BUILDDIR": builddir, "SRCDEST": self.sources, "PKGDEST": self.out,
                "SRCPKGDEST": self.out, "LOGDEST": self.out, "PKGEXT": PKGEXT, "FAKEROOTDONTTRYCHOWN": "1"}


class Reviewer:
    """Runs the phases in the build user's process; :meth:`run` returns the
    result's JSON form (it may have to cross a process boundary)."""

    def __init__(self, directory: str, layout: Layout, *, allow_hosts: Sequence[HostPort] = (),
                 isolation: str = "auto", vm_accel: str = "kvm", timeout: Optional[float] = None,
                 env: Optional[Mapping[str, str]] = None, progress: Optional[Progress] = None,
                 build_user: Optional[dict] = None, arch: Optional[str] = None) -> None:
        self.directory = directory
        self.layout = layout
        self.allow_hosts = tuple(allow_hosts)
        self.isolation = isolation
        self.vm_accel = vm_accel
        self.timeout = timeout
        self.env = dict(os.environ if env is None else env)
        self.progress = progress or (lambda message: None)
        self.build_user = dict(build_user or {})
        self.arch = arch or platform.machine()
        self.phases: List[Phase] = []
        self.command = ("pipguard", "pkgbuild", directory,
                        *(f"--allow-host={h}" for h in self.allow_hosts))
        self.info: Optional[srcinfo_mod.SrcInfo] = None
        self.allowed: Tuple[HostPort, ...] = ()
        self.needing_allow: Tuple[str, ...] = ()
        self.mismatches: Tuple[srcinfo_mod.Mismatch, ...] = ()
        self.contents: tuple = ()

    # ------------------------------------------------------------------ runs
    def _sandboxed(self, name: str, argv: Sequence[str], cwd: str, *, read: Sequence[str] = (),
                   write: Sequence[str] = (), hosts: Sequence[HostPort] = (), step: str = "",
                   package: str = "", writable_cwd: bool = False,
                   builddir: Optional[str] = None) -> Report:
        """One sandboxed run; ``builddir`` is makepkg's ``BUILDDIR`` (default:
        the build phase's)."""
        from pipguard.sandbox.api import run

        # makepkg first checks that each of its settings directories exists and that its
        # mode lets this user write it (mkdir -p, [[ -w ]]): each phase sees them all, read-only
        # unless it writes them (on the host they exist anyway; in a VM only what is shared does)
        # (a read-only mount would answer EROFS: under ns they are read-only by Landlock alone)
        settings = [d for d in (self.layout.sources, self.layout.out) if d not in write]
        policy = Policy(isolation=self.isolation, vm_accel=self.vm_accel, allow_hosts=tuple(hosts),
                        timeout=self.timeout, read_only_by_landlock=tuple(settings),
                        # below the namespace's own tmpfs those dirs could only be read-only
                        # mounts, which makepkg refuses (pkgbuild._layout_parent)
                        prefer_ns=not in_private_tmpfs(self.layout.base),
                        allow_read=tuple(dict.fromkeys(read)), allow_write=tuple(dict.fromkeys(write)),
                        keep_env=MAKEPKG_ENV, writable_cwd=writable_cwd)
        env = dict(self.env, **self.layout.makepkg_env(builddir or self.layout.build))
        report = run(list(argv), policy, cwd=cwd, env=env, record_build_dir=writable_cwd)
        own = tuple(write) + ((cwd,) if writable_cwd else ())
        self.phases.append(Phase(name, report, step, package, own))
        if report.error and report.error.startswith("interrupted"):
            raise KeyboardInterrupt  # the sandbox is already gone; stop before the next phase
        return report

    # ---------------------------------------------------------------- phases
    def run(self) -> dict:
        try:
            status, message = self._phases()
        except KeyboardInterrupt:
            status, message = "interrupted", "interrupted; the review stopped"
        return self._result(status, message).to_json()

    def _phases(self) -> Tuple[str, str]:
        lay = self.layout
        self.progress("reading the PKGBUILD (makepkg --printsrcinfo, sandboxed)")
        out = os.path.join(lay.meta, ".SRCINFO")
        report = self._sandboxed("srcinfo", ["bash", "-c", 'exec makepkg --printsrcinfo >"$1"',
                                             "pipguard-srcinfo", out],
                                 lay.input, read=[lay.input], write=[lay.meta], builddir=lay.meta)
        if report.exit_code != 0:
            return self._failed(f"makepkg --printsrcinfo failed (exit {report.exit_code}): "
                                "the PKGBUILD does not parse")
        try:
            self.info = srcinfo_mod.parse(_read_text(out), self.arch)
        except (OSError, UnicodeDecodeError, srcinfo_mod.SrcInfoError) as exc:
            return self._failed(f"cannot read the .SRCINFO makepkg wrote: {exc}")

        auto, needing = srcinfo_mod.source_destinations(self.info.sources)
        self.needing_allow = tuple(h for h in needing if not any(_covers(a, h) for a in self.allow_hosts))
        self.allowed = tuple(dict.fromkeys(auto + self.allow_hosts))
        self.progress("fetching and verifying the sources (makepkg --verifysource, sandboxed)")
        # --verifysource makes $srcdir before it fetches: a scratch BUILDDIR,
        # so the build phase starts from an empty one
        report = self._sandboxed("sources", ["makepkg", "--verifysource", *_COMMON], lay.input,
                                 read=[lay.input], write=[lay.sources, lay.meta], hosts=self.allowed,
                                 builddir=lay.meta)
        self.mismatches = srcinfo_mod.verify(self.info.sources, lay.input, lay.sources)
        if self.mismatches:
            first = self.mismatches[0]
            return self._failed(
                f"checksum mismatch: {first.filename} ({first.algorithm}: expected {first.expected}, "
                f"got {first.actual})" + (f" and {len(self.mismatches) - 1} more" if len(self.mismatches) > 1 else "")
                + "; nothing was built")
        if report.exit_code != 0:
            return self._failed(f"makepkg could not fetch or verify the sources (exit {report.exit_code}); "
                                "nothing was built")

        self.progress("building (makepkg, sandboxed, offline)")
        report = self._sandboxed("build", ["makepkg", "--holdver", "--check", *_COMMON],
                                 lay.input, read=[lay.input, lay.sources], write=[lay.build, lay.out])
        pkgdirs = {n: os.path.join(lay.build, self.info.pkgbase, "pkg", n) for n in self.info.pkgnames}
        self.contents = self._contents(pkgdirs)
        if report.exit_code != 0:
            return self._failed(f"the build failed (makepkg exit {report.exit_code})")

        for pkgname, install in sorted(self.info.install.items()):
            try:
                self._install_scripts(pkgname, install, pkgdirs[pkgname])
            except (UsageError, OSError, UnicodeDecodeError) as exc:
                return self._failed(f"cannot run the install scripts of {pkgname}: {exc}")
        return self._verdict()

    def _contents(self, pkgdirs: Mapping[str, str]) -> tuple:
        """Each package's entries from its archive (what pacman installs: fakeroot's modes
        and owners); a package without one (the build failed before makepkg archived it)
        from its ``$pkgdir`` as far as it got."""
        from_archives: Dict[str, tuple] = {}
        for name in sorted(os.listdir(self.layout.out)):
            path = os.path.join(self.layout.out, name)
            if name.endswith(PKGEXT) and os.path.isfile(path) and not os.path.islink(path):
                try:
                    pkgname, entries = archive_contents(path)
                except (OSError, tarfile.TarError):
                    continue
                if pkgname in pkgdirs:
                    from_archives[pkgname] = entries
        return tuple(f for n, d in pkgdirs.items()
                     for f in (from_archives[n] if n in from_archives
                               else package_contents(n, d) if os.path.isdir(d) else ()))

    def _install_scripts(self, pkgname: str, install: str, pkgdir: str) -> None:
        script = _inside(self.layout.input, install)
        functions = srcinfo_mod.scriptlet_functions(_read_text(script))
        root = self.layout.root(pkgname)
        os.mkdir(root, 0o755)
        version = self.info.version if self.info else ""
        extracted = False
        for function in functions:
            if function != "pre_install" and not extracted:
                # the package's files are in place after pre_install, as pacman extracts them
                shutil.copytree(pkgdir, root, symlinks=True, dirs_exist_ok=True)
                extracted = True
            args = [version, version] if function.endswith("_upgrade") else [version]
            self.progress(f"running {function} of {pkgname} (sandboxed, scratch root)")
            self._sandboxed("install-scripts", ["bash", "-c", _SCRIPTLET, "pipguard-scriptlet",
                                                script, function, *args],
                            root, read=[self.layout.input], step=function, package=pkgname,
                            writable_cwd=True)

    # ---------------------------------------------------------------- verdict
    def _blocked_phases(self) -> List[str]:
        return list(dict.fromkeys(p.name for p in self.phases if p.report.verdict == "blocked"))

    def _failed(self, message: str) -> Tuple[str, str]:
        blocked = self._blocked_phases()
        if blocked:
            return "blocked", f"blocked in {', '.join(blocked)}; then {message}"
        return "error", message

    def _verdict(self) -> Tuple[str, str]:
        blocked = self._blocked_phases()
        count = sum(len(p.report.blocked_events) for p in self.phases)
        if blocked:
            return "blocked", f"{count} blocked attempt(s) in {', '.join(blocked)}"
        timed_out = [p.name for p in self.phases if p.report.timed_out]
        if timed_out:
            return "error", f"timed out in {', '.join(timed_out)}"
        return "clean", (f"observed clean: {len(self.phases)} sandboxed runs, "
                         f"{len(self.contents)} files in the package")

    def _result(self, status: str, message: str) -> PkgbuildResult:
        info = self.info
        return PkgbuildResult(
            directory=self.directory, command=self.command, status=status, message=message,
            phases=tuple(self.phases), pkgbase=info.pkgbase if info else "",
            version=info.version if info else "", pkgnames=info.pkgnames if info else (),
            sources=tuple(s.to_json() for s in info.sources) if info else (),
            allowed_hosts=tuple(str(h) for h in self.allowed),
            hosts_needing_allow=self.needing_allow,
            checksum_mismatches=tuple(m.__dict__ for m in self.mismatches),
            contents=self.contents, build_user=self.build_user, isolation=self.isolation)


def _covers(allowed: HostPort, named: str) -> bool:
    """Does ``--allow-host`` ``allowed`` cover ``named`` (``host[:port]``)?"""
    parsed = HostPort.parse(named)
    return allowed.host.lower() == parsed.host.lower() and allowed.port in (None, parsed.port)


def _read_text(path: str) -> str:
    """A small text file the sandbox may have written: never through a link."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise OSError(f"{path} is not a regular file")
        data = fh.read(_MAX_TEXT + 1)
    if len(data) > _MAX_TEXT:
        raise OSError(f"{path} is larger than 1 MiB")
    return data.decode("utf-8")


def _inside(directory: str, name: str) -> str:
    """``name`` (a PKGBUILD's ``install=`` value) as a regular file in ``directory``."""
    full = os.path.realpath(os.path.join(directory, name))
    if not full.startswith(os.path.realpath(directory) + "/") or not os.path.isfile(full):
        raise UsageError(f"install={name}: not a file next to the PKGBUILD")
    return full
