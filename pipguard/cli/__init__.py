"""The command line: parses options, calls one library function, picks a renderer, maps
errors to exit codes; never decides security. May import everything below it.

``pipguard.cli:main`` is the console script's entry point.
"""

from pipguard.cli.app import main

__all__ = ["main"]
