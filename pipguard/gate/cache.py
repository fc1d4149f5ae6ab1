"""The gate's findings of a wheel, remembered by content.

pip installs the same build requirements (setuptools, wheel, Cython...) into
the build environment of every sdist, and pipguard gates each of them before
pip installs it: the RECORD check alone reads and hashes every member, 40 ms
for setuptools and 120 ms for Cython on the development machine, once per
sdist. The findings depend only on the wheel's bytes, its file name (findings
name the artifact), the editable project it was built from, and the code that
decides them. So they are kept in the private cache directory
(:mod:`pipguard.cachedir`) under:

    gate/<hash of the gate package's modules>/<sha256 of the wheel>-<hash of name and project>.json

Any change to the deciding code starts a new directory (old ones are removed);
an entry that cannot be read is scanned again; only a scan that completed is
remembered. Who can change an entry could change pipguard itself: the
directory is this user's alone (0700, checked), and no sandbox can write it.
Without a usable cache directory every wheel is simply scanned.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from typing import List, Optional, Tuple

from pipguard.gate import scan as gate
from pipguard.cachedir import CacheDirError, private_dir, write_json

_SCHEMA = "1"
_code_key: Optional[str] = None


#: entries kept per code version; beyond it the oldest half goes (a bound, not a policy:
#: what is remembered is downloaded wheels, a few per project a user installs)
MAX_ENTRIES = 4096


def scan_wheel(path: str, digest: str, *, editable_project: Optional[str] = None,
               remember: bool = True) -> Tuple[gate.Finding, ...]:
    """:func:`pipguard.gate.scan.scan_wheel`, answered from the cache when this
    content (``digest``: its sha256) was scanned before under this name.
    ``remember=False`` for a wheel built in this run: its bytes are new every
    build (timestamps), so an entry would never be read again."""
    entry = _entry(path, digest, editable_project)
    if entry is not None:
        cached = _read(entry)
        if cached is not None:
            return cached
    findings = tuple(gate.scan_wheel(path, editable_project=editable_project))
    if entry is not None and remember:
        _write(entry, findings)
    return findings


def deciding_files() -> List[str]:
    """Every module of the gate package: the rules and each module they take a decision from
    (where a member lands, how a ``.pth`` line is judged, the known hooks' shapes). One more
    than needed costs a scan again after an upgrade; one missing would answer with the
    findings of older rules (wheelpaths.py and the start-up rules were missing once)."""
    here = os.path.dirname(os.path.abspath(gate.__file__ or ""))
    return sorted(os.path.join(here, name) for name in os.listdir(here) if name.endswith(".py"))


def _deciding_code() -> str:
    global _code_key
    if _code_key is None:
        digest = hashlib.sha256(_SCHEMA.encode())
        for path in deciding_files():
            with open(path, "rb") as fh:
                digest.update(fh.read())
        _code_key = digest.hexdigest()[:24]
    return _code_key


def _entry(path: str, digest: str, editable_project: Optional[str]) -> Optional[str]:
    try:
        code = _deciding_code()
        root = private_dir("gate")
        directory = os.path.join(root, code)
        if not os.path.isdir(directory):
            for stale in os.listdir(root):  # findings of code that is gone
                shutil.rmtree(os.path.join(root, stale), ignore_errors=True)
            directory = private_dir("gate", code)
    except (OSError, CacheDirError):
        return None
    name = hashlib.sha256(f"{os.path.basename(path)}\0{editable_project or ''}".encode(
        "utf-8", "surrogateescape")).hexdigest()[:16]
    return os.path.join(directory, f"{digest}-{name}.json")


def _read(entry: str) -> Optional[Tuple[gate.Finding, ...]]:
    try:
        with open(entry, encoding="utf-8") as fh:
            data = json.load(fh)
        return tuple(gate.Finding(**item) for item in data["findings"])
    except (OSError, ValueError, TypeError, KeyError):
        return None  # absent or unreadable: scan again


def _write(entry: str, findings: Tuple[gate.Finding, ...]) -> None:
    bound(os.path.dirname(entry))
    write_json(entry, {"findings": [f.to_dict() for f in findings]})


def bound(directory: str, limit: Optional[int] = None) -> None:
    """At most ``limit`` (default :data:`MAX_ENTRIES`) entries in ``directory``: beyond it the
    oldest half goes."""
    try:
        names = os.listdir(directory)
        if len(names) < (MAX_ENTRIES if limit is None else limit):
            return
        paths = sorted((os.path.join(directory, n) for n in names), key=os.path.getmtime)
        for path in paths[:len(paths) // 2]:
            os.unlink(path)
    except OSError:
        pass  # another run pruned it first
