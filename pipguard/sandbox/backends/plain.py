"""The plain backend: the host's own filesystem, process table and network.

Nothing is built before the OS layer: the sandbox's first process confines
itself where it stands, and Landlock, seccomp and the supervisor are the walls.
It is the default and works wherever the OS layer does (its parts are the
protection table's, probed by :mod:`pipguard.sandbox.host`).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from pipguard.sandbox.backends import Probe

name = "plain"


def probe(*, refresh: bool = False) -> Probe:
    return Probe("plain", ())


def spec_for(plan: Any) -> Optional[Mapping[str, Any]]:
    return None


def enter(spec: Optional[Mapping[str, Any]], control_fd: int) -> None:
    """Nothing to build: the first process goes on to confine itself."""
    return None


def before_exec() -> None:
    """Nothing to settle before the command's execve."""
