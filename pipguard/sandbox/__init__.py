"""The sandbox: run one command confined and watched, and return what it saw (a Report).

Lowest first: ``oslayer/`` (Landlock, seccomp, capabilities) and ``backends/`` (plain, ns:
the world the first process enters) import nothing else of the sandbox; the pipeline above
them (policy → plan (with rundir) → launcher, keeper, first_process → supervisor, handlers
(with pathview), lifetime → the report) and ``vm/`` (the same pipeline in a guest) import those and pipguard's base,
``rules``, ``protections`` and ``report``, never ``gate``, ``install``, ``pkgbuild`` or
``cli``. ``_hook/`` is loaded by path inside sandboxed Pythons and imports no pipguard.

The public API is ``run``, ``run_sandboxed`` and ``run_async`` (:mod:`pipguard.sandbox.api`),
loaded on first use: importing a module below (the first process, the OS layer) does not
load the whole pipeline.
"""

import importlib

_API = ("run", "run_sandboxed", "run_async")
__all__ = list(_API)


def __getattr__(name: str):
    if name in _API:
        return getattr(importlib.import_module("pipguard.sandbox.api"), name)
    raise AttributeError(f"module 'pipguard.sandbox' has no attribute {name!r}")
