"""Start a Python program with pipguard's audit hook when the interpreter's own
options (-I, -E, -S) would skip ``sitecustomize``.

The hook in the parent rewrites ``python -I -m mod ...`` into
``python -I <this file> -m mod ...``; this script installs the hook and then
runs the program the way the interpreter would have (runpy for -m and scripts,
exec for -c).
"""

import os
import sys


def _main():
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import _pipguard_hook

    _pipguard_hook.install()
    del sys.path[0]
    import runpy

    args = sys.argv[1:]
    if not args:
        sys.stderr.write("pipguard: interactive Python is not supported in the sandbox\n")
        raise SystemExit(2)
    first = args[0]
    if first == "-m" or (first.startswith("-m") and len(first) > 2):
        module = args[1] if first == "-m" else first[2:]
        rest = args[2:] if first == "-m" else args[1:]
        sys.argv = [module] + rest
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    elif first == "-c" or (first.startswith("-c") and len(first) > 2):
        code = args[1] if first == "-c" else first[2:]
        sys.argv = ["-c"] + (args[2:] if first == "-c" else args[1:])
        main = sys.modules["__main__"]
        main.__dict__.pop("_main", None)
        exec(compile(code, "<string>", "exec"), main.__dict__)
    else:
        sys.argv = args
        if os.path.dirname(first) and sys.flags.isolated == 0:
            sys.path.insert(0, os.path.dirname(os.path.abspath(first)))
        runpy.run_path(first, run_name="__main__")


_main()
