""".SRCINFO, read as text: what a PKGBUILD declares, without running it.

The ``.SRCINFO`` is written by ``makepkg --printsrcinfo`` inside the sandbox
(that sources the PKGBUILD); here it is only parsed, line by line, as the
untrusted text it is. Nothing in this module runs a shell.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import stat
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple
from urllib.parse import urlsplit

from pipguard.sandbox.policy import HostPort

#: makepkg's checksum arrays and the hashlib name of each; ``ck`` (POSIX
#: cksum CRC) is verified by makepkg only.
SUM_KEYS = {"md5sums": "md5", "sha1sums": "sha1", "sha224sums": "sha224", "sha256sums": "sha256",
            "sha384sums": "sha384", "sha512sums": "sha512", "b2sums": "blake2b", "cksums": None}
#: the install scriptlet functions, in the order pacman runs them over an
#: install, an upgrade and a removal (libalpm ``_alpm_runscriptlet``)
SCRIPTLET_FUNCTIONS = ("pre_install", "post_install", "pre_upgrade", "post_upgrade",
                       "pre_remove", "post_remove")
DEFAULT_PORTS = {"http": 80, "https": 443, "ftp": 21, "git": 9418, "ssh": 22, "rsync": 873}
_MAX_SRCINFO = 1 << 20


@dataclass(frozen=True)
class Source:
    """One ``source=()`` entry: ``[name::]url``.

    ``scheme`` is ``local`` for a file next to the PKGBUILD; ``vcs`` names
    the version-control tool of a ``git+https://`` style URL (else empty).
    ``sums`` maps each declared algorithm to its value (``SKIP`` included).
    """

    entry: str
    filename: str
    scheme: str
    url: str = ""
    host: Optional[str] = None
    port: Optional[int] = None
    vcs: str = ""
    sums: Dict[str, str] = field(default_factory=dict)

    @property
    def local(self) -> bool:
        return self.scheme == "local"

    def to_json(self) -> dict:
        return {"entry": self.entry, "filename": self.filename, "scheme": self.scheme,
                "url": self.url, "host": self.host, "port": self.port, "vcs": self.vcs,
                "sums": dict(self.sums)}


@dataclass(frozen=True)
class SrcInfo:
    """The parts of a ``.SRCINFO`` pipguard uses. ``install`` maps each
    package name to its ``.install`` file (the pkgbase value applies to
    packages that set none)."""

    pkgbase: str
    pkgver: str
    pkgrel: str
    epoch: str = ""
    pkgnames: Tuple[str, ...] = ()
    sources: Tuple[Source, ...] = ()
    install: Dict[str, str] = field(default_factory=dict)

    @property
    def version(self) -> str:
        """``[epoch:]pkgver-pkgrel``, what pacman passes to the scriptlets."""
        return (f"{self.epoch}:" if self.epoch else "") + f"{self.pkgver}-{self.pkgrel}"


class SrcInfoError(ValueError):
    """The .SRCINFO cannot be used (missing pkgbase, unbalanced checksums...)."""


def parse(text: str, arch: str) -> SrcInfo:
    """Parse ``.SRCINFO`` text; ``arch`` selects ``source_<arch>`` entries
    (and their checksums) besides the generic ones, as makepkg does for
    its ``CARCH``."""
    if len(text) > _MAX_SRCINFO:
        raise SrcInfoError("the .SRCINFO is larger than 1 MiB")
    base: Dict[str, List[str]] = {}
    packages: Dict[str, Dict[str, List[str]]] = {}
    current = base
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or " = " not in line:
            continue
        key, _, value = line.partition(" = ")
        if key == "pkgname":
            current = packages.setdefault(value, {})
            continue
        if key == "pkgbase" and current is base:
            base.setdefault("pkgbase", []).append(value)
            continue
        current.setdefault(key, []).append(value)
    if not base.get("pkgbase"):
        raise SrcInfoError("no pkgbase in the .SRCINFO")
    pkgbase = base["pkgbase"][0]

    def one(key: str) -> str:
        values = base.get(key) or [""]
        return values[0]

    sources: List[Source] = []
    for suffix in ("", "_" + arch):
        entries = base.get("source" + suffix, [])
        arrays = {key: base.get(key + suffix, []) for key in SUM_KEYS}
        for key, values in arrays.items():
            if values and len(values) != len(entries):
                raise SrcInfoError(f"{key}{suffix} has {len(values)} entries for {len(entries)} sources")
        for i, entry in enumerate(entries):
            sources.append(parse_source(entry, {k: v[i] for k, v in arrays.items() if v}))
    install = {}
    default_install = one("install")
    for name in packages or {pkgbase: {}}:
        value = (packages.get(name, {}).get("install") or [default_install])[0]
        if value:
            install[name] = value
    return SrcInfo(pkgbase=pkgbase, pkgver=one("pkgver"), pkgrel=one("pkgrel"), epoch=one("epoch"),
                   pkgnames=tuple(packages) or (pkgbase,), sources=tuple(sources), install=install)


def parse_source(entry: str, sums: Optional[Dict[str, str]] = None) -> Source:
    """One source entry as makepkg reads it (``get_protocol``, ``get_filename``)."""
    name, sep, url = entry.partition("::")
    if not sep:
        name, url = "", entry
    if "://" not in url:
        return Source(entry, name or url.rsplit("/", 1)[-1], "local", sums=dict(sums or {}))
    scheme = url.split("://", 1)[0].lower()
    vcs = ""
    if "+" in scheme:
        vcs, scheme = scheme.split("+", 1)
    elif scheme in ("git", "svn", "hg", "bzr", "fossil"):
        vcs = scheme
    fetch_url = url.split("://", 1)[1]
    parts = urlsplit(f"{scheme}://{fetch_url}")
    if not name:
        if vcs:
            name = url.split("#", 1)[0].split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
            if vcs == "git" and ".git" in name:
                name = name[:name.index(".git")]
        else:
            name = url.rsplit("/", 1)[-1]
    try:
        port = parts.port
    except ValueError:
        port = None
    return Source(entry, name, scheme, url=f"{scheme}://{fetch_url}", host=parts.hostname,
                  port=port or DEFAULT_PORTS.get(scheme), vcs=vcs, sums=dict(sums or {}))


def needs_explicit_allow(host: str) -> bool:
    """Loopback, private, link-local and other non-public addresses (and
    ``localhost``) are never allowed just because a PKGBUILD names them: a
    source like ``http://169.254.169.254/...`` would fetch cloud credentials
    into the package. They need ``--allow-host``."""
    name = host.lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False  # a name: the proxy resolves it (see docs/pkgbuild.md, limits)
    return not address.is_global


def source_destinations(sources: Tuple[Source, ...]) -> Tuple[Tuple[HostPort, ...], Tuple[str, ...]]:
    """(destinations the sources phase may reach, hosts that were named but
    need ``--allow-host``). Only http(s) can pass the filtering proxy; other
    schemes' hosts are listed so the report shows them, and their fetch is
    blocked."""
    allowed: List[HostPort] = []
    refused: List[str] = []
    for source in sources:
        if source.local or not source.host:
            continue
        if source.scheme not in ("http", "https") or needs_explicit_allow(source.host):
            refused.append(f"{source.host}:{source.port}" if source.port else source.host)
            continue
        allowed.append(HostPort(source.host, source.port))
    return tuple(dict.fromkeys(allowed)), tuple(dict.fromkeys(refused))


@dataclass(frozen=True)
class Mismatch:
    filename: str
    algorithm: str
    expected: str
    actual: str


def verify(sources: Tuple[Source, ...], startdir: str, srcdest: str) -> Tuple[Mismatch, ...]:
    """Check every fetched or local source file against its declared sums,
    independently of makepkg (whose checks run in the same shell as the
    PKGBUILD, which may redefine them). ``SKIP``, ``cksums`` and VCS
    checkouts are left to makepkg. A missing file, or one that is not a
    regular file, is a mismatch with ``actual`` ``"missing"``."""
    out: List[Mismatch] = []
    for source in sources:
        checks: Dict[str, Tuple[str, str]] = {}  # sums key -> (hashlib name, expected)
        for key, value in source.sums.items():
            algorithm = SUM_KEYS.get(key)
            if algorithm and value.upper() != "SKIP":
                checks[key] = (algorithm, value.lower())
        if not checks or source.vcs:
            continue
        path = os.path.join(startdir if source.local else srcdest, source.filename)
        digests = _digests(path, [algorithm for algorithm, _ in checks.values()]) or {}
        for key, (algorithm, expected) in checks.items():
            actual = digests.get(algorithm, "missing")
            if actual != expected:
                out.append(Mismatch(source.filename, key, expected, actual))
    return tuple(out)


def _digests(path: str, algorithms: List[str]) -> Optional[Dict[str, str]]:
    try:  # never follow a link: the sandbox could have planted one
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return None
        hashers = {a: hashlib.new(a) for a in algorithms}
        for block in iter(lambda: fh.read(1 << 20), b""):
            for h in hashers.values():
                h.update(block)
    return {a: h.hexdigest() for a, h in hashers.items()}


def scriptlet_functions(text: str) -> Tuple[str, ...]:
    """The scriptlet functions an ``.install`` file has, found as pacman finds
    them: by searching its text for the name (libalpm's ``grep``), never by
    running it."""
    return tuple(name for name in SCRIPTLET_FUNCTIONS if name in text)
