"""The parts of a distribution's core metadata that pip acts on, read with ``packaging``.

pip resolves from the metadata a ``prepare_metadata_for_build_*`` hook call wrote, then installs
the wheel ``build_wheel`` returned. PEP 517 asks a backend given that ``metadata_directory`` to
build a wheel whose metadata matches; a build that does not can slip a dependency past the
resolution (pip installs the wheel's ``Requires-Dist`` on the next run, from its cache) or a
requirement by URL that pip fetches unsandboxed. :meth:`CoreMetadata.differences` is the check;
:func:`direct_references` finds requirements by URL in any wheel's metadata.
"""

from __future__ import annotations

import email.parser
import re
import zipfile
from dataclasses import dataclass
from typing import FrozenSet, List, Optional, Tuple

__all__ = ["CoreMetadata", "direct_references", "wheel_metadata"]

#: Header block of METADATA read at most (a real one is a few kB). The body after it (the README,
#: which may be large) is never read: pip acts on headers only. A header block that runs past
#: this is *unread* and judged as a difference, never skipped.
MAX_METADATA_BYTES = 16 * 1024 * 1024
# The blank line that ends the headers, as ``email``'s parser splits lines (``\r\n``, ``\r``, ``\n``).
_HEADERS_END = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)")


def _requirement(text: str) -> str:
    """``text`` as packaging writes it (spacing, marker quoting); unparseable text as written."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        return str(Requirement(text))
    except InvalidRequirement:
        return " ".join(text.split())


@dataclass(frozen=True)
class CoreMetadata:
    """Name (canonical), version (canonical), ``Requires-Dist`` and ``Provides-Extra`` (canonical).

    ``unread``: why the headers were not all read (a header block over
    :data:`MAX_METADATA_BYTES`), ``""`` when they were: what pip reads there is unknown.
    """

    name: str
    version: str
    requires_dist: FrozenSet[str]
    provides_extra: FrozenSet[str]
    unread: str = ""

    @classmethod
    def parse(cls, data: bytes) -> "CoreMetadata":
        from packaging.utils import canonicalize_name, canonicalize_version

        headers = email.parser.BytesParser().parsebytes(data, headersonly=True)
        return cls(canonicalize_name(str(headers.get("Name") or "")),
                   canonicalize_version(str(headers.get("Version") or "")),
                   frozenset(_requirement(str(r)) for r in headers.get_all("Requires-Dist") or ()),
                   frozenset(canonicalize_name(str(e)) for e in headers.get_all("Provides-Extra") or ()))

    def differences(self, built: "CoreMetadata") -> Tuple[str, ...]:
        """What ``built`` (the wheel's) says that this (the prepared) did not, one line each;
        empty: they agree."""
        out: List[str] = [m.unread for m in (self, built) if m.unread]
        if built.name != self.name:
            out.append(f"Name {built.name!r}, prepared {self.name!r}")
        if built.version != self.version:
            out.append(f"Version {built.version!r}, prepared {self.version!r}")
        for added in sorted(built.requires_dist - self.requires_dist):
            out.append(f"Requires-Dist {added!r} was not in the prepared metadata")
        for dropped in sorted(self.requires_dist - built.requires_dist):
            out.append(f"Requires-Dist {dropped!r} of the prepared metadata is missing")
        for extra in sorted(built.provides_extra ^ self.provides_extra):
            out.append(f"Provides-Extra {extra!r} differs")
        return tuple(out)


def direct_references(requirements: FrozenSet[str]) -> Tuple[Tuple[str, str], ...]:
    """``(canonical name, URL)`` of each requirement by URL (``name @ URL``), sorted; a line
    packaging cannot parse but that names a URL counts, with name ``""``."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    out = set()
    for text in requirements:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            if "://" in text or "@" in text or text.lstrip().startswith(("file:", "/", ".")):
                out.add(("", text))
            continue
        if requirement.url:
            out.add((canonicalize_name(requirement.name), requirement.url))
    return tuple(sorted(out))


def read_headers(head: bytes) -> CoreMetadata:
    """The metadata in ``head``, the first ``MAX_METADATA_BYTES + 1`` bytes (or all) of a METADATA
    file: only its header block is parsed; one that does not end within the limit is ``unread``."""
    if len(head) <= MAX_METADATA_BYTES:
        return CoreMetadata.parse(head)
    end = _HEADERS_END.search(head, 0, MAX_METADATA_BYTES)
    if end is None:
        return CoreMetadata("", "", frozenset(), frozenset(),
                            unread=f"METADATA headers run past {MAX_METADATA_BYTES} bytes and were not read")
    return CoreMetadata.parse(head[:end.end()])


def wheel_metadata(path: str) -> Optional[CoreMetadata]:
    """The metadata of wheel ``path`` as pip reads it (the ``METADATA`` of its one top-level
    ``.dist-info`` directory); ``None`` when there is none or it cannot be read (pip refuses such a
    wheel itself)."""
    try:
        with zipfile.ZipFile(path) as zf:
            infos = {n.split("/", 1)[0] for n in zf.namelist() if n.split("/", 1)[0].endswith(".dist-info")}
            if len(infos) != 1:
                return None
            with zf.open(f"{infos.pop()}/METADATA") as fh:
                return read_headers(fh.read(MAX_METADATA_BYTES + 1))
    except (OSError, KeyError, zipfile.BadZipFile, RuntimeError, EOFError, ValueError):
        return None
