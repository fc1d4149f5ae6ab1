"""Where pip writes each member of a wheel, and which commands it makes: pip's own reading.

A wheel member's name is not where it lands. pip (``operations/install/wheel.py``, the same code
from 23.2, the oldest pip pipguard supports, through 26.3) splits members by their *raw* first
component (``<name>.data/`` or not), then writes ``os.path.normpath(member)`` below the scheme's
directory: ``./x.pth``, ``a//b`` and ``<name>.data/purelib//x.pth`` all land as their plain
spelling (``x.pth`` at the top of site-packages: a start-up hook). Every rule that asks "where
does this land" (the gate's ``.pth``, ``sitecustomize``, script shadowing and data-scheme rules,
the ownership check) asks :func:`place`, once per member, so no spelling skips a rule.

Console scripts differ between pips: pip <= 25 (distlib 0.3.x) finds the name with
``ENTRY_RE.search`` — the trailing run of ``[\\w.+-]`` before `` =``, so ``sub/../git`` makes
``git``; newer distlib takes the whole name and pip 26 refuses one that leaves the scripts
directory (after writing the wheel's files). :func:`script_names` gives every name any supported
pip may write, for every entry :func:`script_entries` finds the way any supported pip reads
``entry_points.txt``.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Iterator, List, Optional, Tuple

__all__ = ["SCHEME_KEYS", "Placement", "ScriptEntry", "place", "script_entries", "script_names"]

#: The scheme keys of ``<name>.data/<key>/`` (pip's ``SCHEME_KEYS``).
SCHEME_KEYS = ("purelib", "platlib", "scripts", "data", "headers")
#: The wheel's root: pip writes it to purelib or platlib (``Root-Is-Purelib``), a site directory
#: either way.
ROOT = "root"
#: Schemes whose directory is a site-packages directory.
SITE_SCHEMES = (ROOT, "purelib", "platlib")

# distlib 0.3.6-0.3.9 (pip 23.2-25.x): ENTRY_RE.search(f"{name} = {value}")
_OLD_DISTLIB_NAME = re.compile(r"(?P<name>(\w|[-.+])+)\s*=\s*(?P<callable>(\w+)([:\.]\w+)*)")


@dataclass(frozen=True)
class Placement:
    """Where pip writes one file member of a wheel.

    ``scheme``: :data:`ROOT` or one of :data:`SCHEME_KEYS`; ``path``: the normalised POSIX path
    below that scheme's directory (what pip joins to it); ``script``: a ``.data/scripts/`` member,
    which pip writes as a script (its ``#!python`` line rewritten); ``error``: why pip refuses the
    member (it raises mid-install: the members written before it stay), ``None`` when it writes it.
    """

    member: str
    scheme: str
    path: str
    script: bool = False
    error: Optional[str] = None

    @property
    def site_path(self) -> Optional[str]:
        """The path below a site-packages directory, or ``None`` when it lands elsewhere."""
        return self.path if self.scheme in SITE_SCHEMES and self.error is None else None


#: a path under pip's data prefix that is a site-packages directory (posix, Debian, lib64)
DATA_SITE = re.compile(r"^(?:local/)?(?:lib|lib64)/(?:python[^/]*/)?(?:site|dist)-packages/", re.IGNORECASE)


def site_rel(placed: Placement) -> Optional[str]:
    """Where ``placed`` lands below a site directory (the root, ``.data/purelib|platlib`` and
    ``.data/data/lib/pythonX.Y/site-packages/``), or ``None``."""
    if placed.scheme == "data" and placed.error is None:
        found = DATA_SITE.match(placed.path)
        return placed.path[found.end():] if found else None
    return placed.site_path


def place(member: str) -> Optional[Placement]:
    """Where pip writes wheel member ``member``; ``None`` for a directory entry (pip skips
    names ending in ``/``)."""
    if member.endswith("/"):
        return None
    normed = posixpath.normpath(member)
    if not member.split("/", 1)[0].endswith(".data"):
        return Placement(member, ROOT, normed, error=_escapes(normed))
    parts = normed.split("/", 2)
    if len(parts) != 3:
        return Placement(member, "data", normed,
                         error="a .data member must be named '<name>.data/<scheme>/<path>'")
    _, scheme, sub = parts
    if scheme not in SCHEME_KEYS:
        return Placement(member, scheme, sub, error=f"unknown scheme {scheme!r} (pip knows "
                                                    f"{', '.join(SCHEME_KEYS)})")
    raw = member.split("/", 2)
    script = len(raw) > 2 and raw[1] == "scripts"  # pip decides this on the raw name too
    return Placement(member, scheme, sub, script=script, error=_escapes(sub))


def _escapes(path: str) -> Optional[str]:
    if path.startswith("/"):
        return "absolute path"
    if path == ".." or path.startswith("../"):
        return "'..' leaves the scheme directory"
    if path == ".":
        return "names the scheme directory itself"
    return None


def script_names(name: str, value: str) -> Tuple[str, ...]:
    """The file names (below the scripts directory, normalised) that the supported pips may write
    for the console or GUI script ``name = value``: the whole name (pip >= 26) and distlib's older
    search for a name (pip <= 25). Empty when neither writes one."""
    out = []
    whole = posixpath.normpath(name)
    if whole not in (".", "..") and not whole.startswith(("/", "../")):
        out.append(whole)
    found = _OLD_DISTLIB_NAME.search(f"{name} = {value}")
    if found is not None:
        out.append(found.group("name"))
    return tuple(dict.fromkeys(out))


#: The ``entry_points.txt`` sections pip makes commands from.
SCRIPT_SECTIONS = ("console_scripts", "gui_scripts")


@dataclass(frozen=True)
class ScriptEntry:
    """One console or GUI script entry as a pip reads it: ``name = value`` in ``section``, on
    1-based line ``line`` (``raw``: that line as written)."""

    section: str
    name: str
    value: str
    line: int
    raw: str


def script_entries(text: str) -> Iterator[ScriptEntry]:
    """Every ``console_scripts``/``gui_scripts`` entry any supported pip reads from
    ``entry_points.txt`` ``text``.

    pip on Python >= 3.11 reads it with ``importlib.metadata`` (``Sectioned``): lines stripped,
    only ``#`` starts a comment (``;git = m:f`` is an entry named ``;git``, which distlib <= 0.3.9
    writes as ``git``), and a section header is a line starting with ``[`` and ending with ``]``,
    named by the line stripped of *every* ``[`` and ``]`` at its ends (``[[console_scripts]]`` is
    ``console_scripts``). pip on older Pythons reads it with ``pkg_resources`` (the header's
    inner text, stripped). An entry counts when either reading puts it in a script section; the
    name and value are the text around the first ``=``, stripped (both readings).
    """
    sections: Tuple[str, ...] = ()
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            sections = tuple(dict.fromkeys((line.strip("[]"), line[1:-1].strip())))
            continue
        section = next((s for s in sections if s in SCRIPT_SECTIONS), None)
        if section is None or "=" not in line:
            continue
        name, value = (part.strip() for part in line.split("=", 1))
        yield ScriptEntry(section, name, value, n, raw)


def _split_parts(name: str) -> List[str]:
    # Backslashes are separators on Windows (zipfile converts them there), so treat them as such.
    return [p for p in re.split(r"[\\/]+", name) if p not in ("", ".")]


def unsafe_path(name: str) -> Optional[str]:
    """Why the archive member ``name`` would not stay inside its destination (absolute, a NUL,
    a ``..`` component, with ``\\`` a separator too), or ``None``: for wheels and sdists alike."""
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        return "absolute path"
    if "\x00" in name:
        return "NUL byte in name"
    if ".." in _split_parts(name):
        return "'..' component"
    return None


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
