"""Wheels pipguard built in a sandbox and let pip install, remembered by content with the
requirements by URL their project declared.

pip keeps a wheel it built in its wheel cache and installs it from there the next time,
without building. Such a cached wheel's requirements by URL are judged as built by an earlier
run pipguard cannot vouch for (``direct-reference``, high: plain pip may have built it) --
unless that run was pipguard's own, which this record says: a wheel pipguard built, whose URLs
its project declared before any hook ran, and which passed the gate. Without it every second
install of a project that declares a dependency by URL was refused (a false alarm that only
private indexes show: PyPI refuses uploads that name URLs).

Kept in pipguard's private cache directory (:mod:`pipguard.cachedir`: 0700, this user's alone;
no sandbox can write it), one file per wheel's sha256; without a usable directory nothing is
remembered (the cached wheel is judged as before).
"""

from __future__ import annotations

import json
import os
from typing import FrozenSet, Iterable, Optional, Tuple

from pipguard.cachedir import CacheDirError, private_dir, write_json

#: entries kept; beyond it the oldest half goes (gate.cache's bound)
MAX_ENTRIES = 4096


def _entry(digest: str) -> Optional[str]:
    if not digest or not all(c in "0123456789abcdef" for c in digest):
        return None
    try:
        return os.path.join(private_dir("built"), digest + ".json")
    except (OSError, CacheDirError):
        return None


def remember(digest: str, urls: Iterable[Tuple[str, str]]) -> None:
    """A wheel (``digest``: its sha256) pipguard built and passed, with the ``(name, URL)``
    requirements its project declared."""
    from pipguard.gate.cache import bound

    entry = _entry(digest)
    if entry is None:
        return
    bound(os.path.dirname(entry), MAX_ENTRIES)
    write_json(entry, {"urls": sorted([dep, url] for dep, url in urls)})


def declared(digest: str) -> Optional[FrozenSet[Tuple[str, str]]]:
    """The declared requirements by URL of a wheel pipguard built and passed, or None when it
    did not (or the record cannot be read)."""
    entry = _entry(digest)
    if entry is None:
        return None
    try:
        with open(entry, encoding="utf-8") as fh:
            data = json.load(fh)
        return frozenset((str(dep), str(url)) for dep, url in data["urls"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
