"""Build the optional native responder (pipguard/sandbox/_responder.c).

Everything else is declared in pyproject.toml. The extension is optional:
where it cannot be compiled (no C compiler, not Linux) pipguard installs
without it and its supervisor answers every notification from Python, which
is slower but observes and decides the same (``pipguard doctor`` says which).
"""

import sys

from setuptools import Extension, setup

ext_modules = []
if sys.platform.startswith("linux"):
    ext_modules.append(Extension("pipguard.sandbox._responder", ["pipguard/sandbox/_responder.c"],
                                 extra_compile_args=["-O2", "-Wall"], optional=True))

setup(ext_modules=ext_modules)
