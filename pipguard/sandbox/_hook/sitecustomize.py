"""pipguard's injection point: PYTHONPATH puts this directory first, so every
Python process of a sandboxed run imports this module at start-up.

It installs the audit hook, then runs the ``sitecustomize`` that this one
shadows (pip's build environment has its own), so nothing changes for the
program except the hook.
"""


def _pipguard_start():
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    import _pipguard_hook

    _pipguard_hook.install()

    # Execute the next ``sitecustomize`` on sys.path, as Python would have.
    # The import system's own modules are loaded already; importlib.util
    # would import contextlib, functools, collections... in every process.
    try:
        from _frozen_importlib import module_from_spec
        from _frozen_importlib_external import PathFinder
    except ImportError:
        from importlib.machinery import PathFinder
        from importlib.util import module_from_spec
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_pipguard_start()
del _pipguard_start
