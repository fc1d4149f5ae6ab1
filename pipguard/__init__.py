"""pipguard: run the code that package installs execute inside a sandbox,
block what an install should never do, and report everything it saw."""

__version__ = "0.1.0"
