"""The command line: parses options, calls one library function, picks a renderer, maps
errors to exit codes; never decides security. May import everything below it.

``pipguard.cli:main`` is the console script's entry point (:mod:`pipguard.cli.app`). A
module per command (``run``, ``install`` for ``install`` and ``sandbox``, ``approve``,
``pkgbuild``, ``doctor``), beside them the one option table and its two parsers
(``options``), where text leaves (``output``) and pipguard's own process around a command
(``process``).
"""

from pipguard.cli.app import main

__all__ = ["main"]
