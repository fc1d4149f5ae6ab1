"""Renderers: a finished :class:`~pipguard.report.Report` in, text out.

Every renderer is a pure function ``render(report, *, color=False) -> str``:
no printing, no I/O, no clock. The CLI picks one with :func:`get`, decides
whether colour is wanted (a TTY and no ``NO_COLOR``), and writes the text.
``color`` is a request, not a guarantee: formats meant for machines (json,
sarif) ignore it.
"""

from __future__ import annotations

import importlib
from typing import Callable

from pipguard.errors import UsageError
from pipguard.report import Report

#: The names ``--format`` accepts, in the order ``--help`` shows them.
FORMATS = ("table", "json", "sarif")

#: ``render(report, *, color=False) -> str``
Renderer = Callable[..., str]


def get(format_name: str) -> Renderer:
    """Return the ``render`` function of ``format_name`` (one of :data:`FORMATS`).

    Raises :class:`~pipguard.errors.UsageError` for any other name.
    """
    if format_name not in FORMATS:
        raise UsageError(
            f"unknown report format {format_name!r}",
            hint="choose one of: " + ", ".join(FORMATS),
        )
    # Imported on demand: `--format json` need not import tabulate.
    module = importlib.import_module(f"{__name__}.{format_name}")
    return module.render  # type: ignore[no-any-return]


def printable(text: str) -> str:
    """``text`` with every non-printable character escaped (``\\x1b``,
    ``\\u202e``): controls, ANSI sequences, bidi overrides and other format
    characters. Strings from the sandboxed program (paths, argv, hostnames)
    pass through this before a human sees them, so a package cannot repaint
    the terminal or hide text."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        code = ord(ch)
        if ch.isprintable():
            out.append(ch)
        elif code <= 0xFF:
            out.append(f"\\x{code:02x}")
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return "".join(out)


def render(report: Report, format_name: str, *, color: bool = False) -> str:
    """Shorthand for ``get(format_name)(report, color=color)``."""
    return get(format_name)(report, color=color)


__all__ = ["FORMATS", "Renderer", "get", "printable", "render"]
