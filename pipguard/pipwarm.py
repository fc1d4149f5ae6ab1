"""A pip of the target interpreter that starts while the sandboxed build runs.

The last phase of ``pipguard install`` installs the verified wheels outside the
sandbox (installing a wheel runs no package code): with pip's ``install_wheel``
or, where that is not plainly equivalent, an ordinary ``pip install``.
About 0.3 s of that pip is importing itself (pip 23: ``pip._internal`` and its
install command), which costs the same for one package or fifty. ``WarmPip``
starts that interpreter at the beginning of the install, lets it import pip
while the build runs (on another CPU, mostly), and only then tells it what to
run, or to exit without doing anything. Nothing it runs is decided before the
gate has passed: until it reads a command line it only imports pip.
"""

from __future__ import annotations

import json
import subprocess
from typing import Dict, List, Sequence, Tuple

# Runs in the target interpreter. Only pip's own modules are imported before
# the command arrives; an empty line (or EOF) means "install nothing". The
# command is JSON: {"args": pip's argv, "wheels": [[name, version, path], ...]}.
#
# "wheels" asks for the direct route: when the target is a virtual environment
# and none of the packages is installed yet, each verified wheel goes through
# pip's own ``install_wheel`` (the function ``pip install`` ends in: same
# scheme, scripts, RECORD, INSTALLER, REQUESTED, byte-compilation), skipping
# what a second full pip run would repeat (session set-up, finder, resolver:
# ~0.18 s a command). Anything else (an upgrade, a system interpreter, a pip
# whose internals differ) runs the full ``pip install`` with "args".
_WARM_SCRIPT = """\
import os
import sys
try:
    import pip  # noqa: F401
except ImportError:
    sys.exit(3)  # no pip here: the caller runs `python -m pip`, for pip's own message
try:
    from pip._internal.commands import create_command
    create_command("install")
    from pip._internal.utils.compatibility_tags import get_supported
    TAGS = get_supported()  # this interpreter's wheel tags: the same before and after the build
except Exception:
    TAGS = None  # an unusual pip: main() imports what it needs later
line = sys.stdin.readline()
if not line.strip():
    sys.exit(0)
import json
command = json.loads(line)


def direct(wheels):
    \"\"\"Install with pip's install_wheel, or None if this case is not plain.\"\"\"
    if sys.prefix == getattr(sys, "base_prefix", sys.prefix) or TAGS is None:
        return None  # not a venv (externally-managed and --user are pip's decisions), or odd pip
    try:
        import zipfile
        from pip._internal.locations import get_scheme
        from pip._internal.metadata import get_default_environment
        from pip._internal.models.wheel import Wheel
        from pip._internal.operations.install.wheel import install_wheel
    except Exception:
        return None
    code = install_wheel.__code__
    wanted = {"name", "wheel_path", "scheme", "req_description", "pycompile",
              "warn_script_location", "direct_url", "requested"}
    if not wanted <= set(code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]):
        return None
    try:
        installed = get_default_environment()
        for name, version, path in wheels:
            if installed.get_distribution(name) is not None:
                return None  # pip decides: already satisfied, upgrade, reinstall
            if not Wheel(os.path.basename(path)).supported(TAGS):
                return None
            # read the archive now, as pip's resolver would have: its names may
            # need a codec (cp437) that must be imported before the guard below
            with zipfile.ZipFile(path) as archive:
                archive.namelist()
    except Exception:
        return None
    guard = import_guard()
    if guard is None:
        return None
    print("pipguard: direct install", flush=True)
    with guard:
        install_all(wheels, get_scheme, install_wheel)
    return 0


def import_guard():
    \"\"\"What pip's install command does before it installs (pip >= 26.3): import
    what the install needs now, then refuse later imports, so that nothing is
    picked up from a distribution being installed. None: this pip has the
    guard in a form we do not know, so pip itself must run.\"\"\"
    import contextlib
    from pip._internal.commands import install as command
    if not hasattr(command, "_prevent_further_imports"):
        return contextlib.nullcontext()  # an older pip has no such guard
    try:
        names = (*command._INTERNAL_EAGER_IMPORTS, *getattr(pip, "_EAGER_IMPORTS", ()))
        command._eagerly_import_modules(names)
        command._reify_lazy_imports(names)
        return command._prevent_further_imports(until_process_exit=True)
    except Exception:
        return None


def install_all(wheels, get_scheme, install_wheel):
    for name, version, path in wheels:
        # what pip's InstallRequirement.install passes for a NAME==VERSION
        # requirement given on the command line and found by --find-links
        install_wheel(name, path, scheme=get_scheme(name, user=False, home=None, root=None,
                                                    isolated=False, prefix=None),
                      req_description=name + "==" + version, pycompile=True,
                      warn_script_location=True, direct_url=None, requested=True)


if command.get("wheels"):
    try:
        status = direct(command["wheels"])
    except Exception as error:
        print("ERROR: " + (str(error) or type(error).__name__), flush=True)
        sys.exit(1)
    if status is not None:
        # Done: skip the interpreter's teardown of all of pip (~20 ms); every
        # file install_wheel wrote is closed already.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
from pip._internal.cli.main import main
sys.exit(main(command["args"]))
"""

_DIRECT_MARK = "pipguard: direct install\n"


class WarmPip:
    """``python -m pip ARGS`` with the import done ahead of time.

    ``run`` gives (exit status, combined output) like ``subprocess.run`` would;
    if the warm process died before its command (no pip, a broken
    environment), the command runs in a fresh ``python -m pip`` instead, so the
    error the user sees is pip's own. ``close`` ends an unused warm process.
    """

    def __init__(self, python: str, env: Dict[str, str]) -> None:
        self._python = python
        self._env = env
        self.direct = False  # whether the last run took the direct route
        self._proc = subprocess.Popen([python, "-c", _WARM_SCRIPT], env=env, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def run(self, args: Sequence[str],
            wheels: Sequence[Tuple[str, str, str]] = ()) -> Tuple[int, str]:
        """Run ``pip ARGS``; ``wheels`` ((name, version, path) of exactly what ARGS
        installs) allows the direct route described above."""
        self.direct = False
        if self._proc.poll() is None:
            command = {"args": list(args), "wheels": [list(w) for w in wheels]}
            try:
                out, _ = self._proc.communicate(json.dumps(command) + "\n")
                if out.startswith(_DIRECT_MARK):
                    self.direct, out = True, out[len(_DIRECT_MARK):]
                return self._proc.returncode, out
            except BrokenPipeError:  # it died between poll() and our write
                self._proc.wait()
        cold: List[str] = [self._python, "-m", "pip", *args]
        proc = subprocess.run(cold, env=self._env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        return proc.returncode, proc.stdout

    def close(self) -> str:
        """End a warm process that got no command; returns what it printed."""
        if self._proc.returncode is not None:
            return ""
        try:
            return self._proc.communicate("\n", timeout=30)[0]
        except (BrokenPipeError, subprocess.TimeoutExpired):
            self._proc.kill()
            self._proc.wait()
            return ""
