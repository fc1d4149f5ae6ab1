"""pipguard: run the code that package installs execute inside a sandbox,
block what an install should never do, and report everything it saw.

``from pipguard import run_sandboxed, run, Policy`` is the library API (see
:mod:`pipguard.sandbox`); those names load on first use, so the CLI's start-up
does not pay for them."""

__version__ = "0.1.0"

_LAZY = {"run_sandboxed": "pipguard.sandbox.api", "run": "pipguard.sandbox.api", "Policy": "pipguard.sandbox.policy"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pipguard' has no attribute {name!r}")
