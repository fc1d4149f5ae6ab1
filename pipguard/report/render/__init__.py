"""Renderers: a finished :class:`~pipguard.report.model.Report` in, text out.

Every renderer is a pure function ``render(report, *, color=False) -> str``:
no printing, no I/O, no clock. The CLI picks one with :func:`get`, decides
whether colour is wanted (a TTY and no ``NO_COLOR``), and writes the text.
``color`` is a request, not a guarantee: formats meant for machines (json,
sarif) and markdown ignore it. Imports the report model, ``rules`` and the base only.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Callable

from pipguard.errors import UsageError
from pipguard.report.render.safe import printable

if TYPE_CHECKING:  # pragma: no cover
    from pipguard.report.model import Report

#: The names ``--format`` accepts, in the order ``--help`` shows them.
FORMATS = ("table", "json", "sarif", "markdown")
#: the "kept" column of a file the run left in the namespace's own /tmp or /dev/shm
#: (gone with it); a column of its own, so that no file name can look like it
DISCARDED = "no: namespace tmpfs"

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


def render(report: Report, format_name: str, *, color: bool = False) -> str:
    """Shorthand for ``get(format_name)(report, color=color)``."""
    return get(format_name)(report, color=color)


#: what the stand-in ``importlib.metadata.version`` answers while tabulate imports
_VERSION_PENDING = "".join(("pending", "-version"))  # a unique object: compared by identity


def load_tabulate() -> Callable[..., str]:
    """``tabulate.tabulate``, imported the cheap way when possible.

    tabulate >= 0.10 sets ``__version__`` at import time from
    ``importlib.metadata.version("tabulate")``: importing importlib.metadata
    (email, zipfile, pathlib, csv...) and scanning ``sys.path`` for the
    distribution costs ~12 ms, about as much as the whole sandbox run it
    reports on. Nothing here needs that version, so while tabulate imports a
    stand-in module answers the lookup, and ``tabulate.__version__`` is looked
    up with the real importlib.metadata on first access (a module
    ``__getattr__``). The tables are the same either way. When
    importlib.metadata is already loaded, other threads run (they could
    import the stand-in), or the stand-in does not fit the installed
    tabulate, this is a plain import.
    """
    module = sys.modules.get("tabulate")
    if module is None:
        module = _import_tabulate()
    return module.tabulate  # type: ignore[no-any-return]


def _import_tabulate():
    threading = sys.modules.get("threading")
    if "importlib.metadata" in sys.modules or (threading is not None and threading.active_count() > 1):
        import tabulate  # already paid for; or other threads could import the stand-in meanwhile

        return tabulate
    import types

    class PackageNotFoundError(ModuleNotFoundError):
        pass

    def version(distribution_name: str) -> str:
        if importing:
            return _VERSION_PENDING
        from importlib.metadata import version as real_version

        return real_version(distribution_name)

    importing = True
    stand_in = types.ModuleType("importlib.metadata")
    stand_in.version = version  # type: ignore[attr-defined]
    stand_in.PackageNotFoundError = PackageNotFoundError  # type: ignore[attr-defined]
    sys.modules["importlib.metadata"] = stand_in
    try:
        import tabulate
    except Exception:  # a tabulate that wants more of importlib.metadata (or parses its version): the normal way
        sys.modules.pop("tabulate", None)
        sys.modules.pop("importlib.metadata", None)
        import tabulate
    finally:
        importing = False
        if sys.modules.get("importlib.metadata") is stand_in:
            del sys.modules["importlib.metadata"]
    if getattr(tabulate, "__version__", None) is _VERSION_PENDING:
        _defer_version(tabulate)
    return tabulate


def _defer_version(module) -> None:
    """Make ``module.__version__`` resolve (and stay) on first access."""
    del module.__version__
    previous = module.__dict__.get("__getattr__")

    def __getattr__(name: str):
        if name == "__version__":
            from importlib.metadata import PackageNotFoundError, version

            try:
                value = version(module.__name__)
            except PackageNotFoundError:
                value = "unknown"
            module.__version__ = value
            return value
        if previous is not None:
            return previous(name)
        raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")

    module.__getattr__ = __getattr__


__all__ = ["FORMATS", "Renderer", "get", "load_tabulate", "printable", "render"]
