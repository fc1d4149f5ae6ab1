"""pipguard's piece inside the target interpreter's pip (stdlib only, Python 3.9+).

pip is trusted code; package code is not. pip runs package code only in child
Python processes: the PEP 517 hook calls (pyproject-hooks' ``_in_process.py
HOOK CONTROL_DIR``), and, in pips that still have them, legacy ``setup.py``
runs. This file is started by the pipguard process in place of ``python -m
pip`` (as ``python …/pipguard/_seam``: ``__main__.py`` imports it from its
cached bytecode) and puts pipguard at that seam:

``target.py pip ARGS``
    runs the real pip with ARGS after installing the seam below.
``target.py runner PIP_RUNNER ARGS``
    the same for a pip subprocess that pip starts itself (to install build
    requirements into a build environment).
``target.py refuse REASON``
    prints why pipguard refused to start a process, exits 1.

The seam (every pip process it runs in):
  * ``subprocess.Popen`` (every process pip starts goes through its
    ``_execute_child``): a hook call is handed to the pipguard process right
    there -- its argv, cwd, environment and the stdin/stdout/stderr pip gave
    it, with the write end of a pipe -- and pip starts a placeholder instead,
    ``/bin/sh`` reading that pipe, which exits with the status pipguard
    writes once the call ran in a sandbox of its own (see
    :func:`_hand_off`); a pip subprocess becomes ``target.py runner ...``;
    any other start of a Python interpreter (legacy ``setup.py`` paths)
    becomes ``target.py refuse``.
    Programs that are not Python (git, hg, svn, keyring) start as pip starts
    them: they are trusted tools, as pip treats them.
  * an audit hook (PEP 578) refuses every other way of starting a Python
    interpreter (``os.system``, ``os.exec*``, ``os.posix_spawn``): a pip whose
    internals changed fails closed instead of running package code here.
  * pip's ``install_given_reqs`` first asks pipguard to gate the wheels it is
    about to install; pipguard answers install, stop (``pipguard sandbox``:
    nothing is installed) or refuse. Both callers are wrapped: the install
    command's and the package's (which pip's in-process build-env installer
    uses: build requirements installed without a pip subprocess).
  * pip's ``_get_prepared_distribution`` (after pip downloaded and unpacked a
    requirement, before any of its hooks runs) tells pipguard which
    requirement a source tree is and the sha256 of the artifact pip got for it
    (the sdist): a hook call's working directory then names its package and
    artifact, which approvals are pinned to. Without that function pipguard
    learns nothing (approvals of runtime attempts then never match: fail closed).

The channel is a unix socket in a directory private to pipguard's uid, named
by ``PIPGUARD_SEAM`` (``PATH TOKEN``); sandboxed processes cannot create unix
sockets at all (seccomp) and never see the variable (their environment is
built by pipguard from an allow-list).
"""

import array
import json
import os
import socket
import subprocess
import sys

if __package__:  # pipguard's own import: pipguard.install._seam.target
    from .credentials import move_credentials
else:
    # in pip's process (through __main__.py, or this file run as a script, also under -I/-P):
    # loaded from beside this file by path, under a name of its own -- never whatever module
    # called "credentials" is on sys.path or already imported there (its cached bytecode is used)
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "_pipguard_seam_credentials", os.path.join(os.path.dirname(os.path.abspath(__file__)), "credentials.py"))
    assert _spec is not None and _spec.loader is not None  # a .py path always has a source loader
    _credentials = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = _credentials
    _spec.loader.exec_module(_credentials)
    move_credentials = _credentials.move_credentials

SEAM_VARIABLE = "PIPGUARD_SEAM"
HERE = os.path.abspath(__file__)
#: what starts this file's ``main``: its directory (run by ``__main__.py``, which
#: imports this file from its cached bytecode; pipguard starts pip that way)
ENTRY = os.path.dirname(HERE)
#: What pip starts and waits for in place of a hook call: it exits with the
#: status pipguard writes (one line) to the pipe whose fd is its ``$1``, or 1
#: if pipguard closes the pipe without one. A shell, not a Python client: it
#: starts in ~1 ms where ``python -I -S`` takes ~20 ms, once per hook call.
#: (dash redirects only fds 0-9 by number; /proc/self/fd/N reaches any, and
#: pipguard needs /proc anyway.)
PLACEHOLDER = ("/bin/sh", "-c", 'read -r status < "/proc/self/fd/$1"; exit "${status:-1}"', "pipguard-hook")
#: ``_execute_child``'s positional parameters after (args, executable), the
#: same on CPython 3.9-3.14: where the hand-off finds what pip gave the call
_PASS_FDS, _CWD, _ENV, _P2CREAD, _C2PWRITE, _ERRWRITE = 2, 3, 4, 8, 11, 13
#: pips that still have legacy ``setup.py`` paths take this option, which
#: routes every project through PEP 517 (pip >= 25.3 has no legacy path left)
USE_PEP517 = "--use-pep517"
#: exit status of ``target.py pip`` when the interpreter has no pip
NO_PIP = 3
#: exit status of ``target.py pip`` under an interpreter pipguard does not support
UNSUPPORTED = 4
#: the descriptor (number) the top-level ``target.py pip`` writes who it is to, once
HELLO_VARIABLE = "PIPGUARD_SEAM_HELLO"


class SeamError(Exception):
    pass


# --------------------------------------------------------------------------- channel
def _channel():
    value = os.environ.get(SEAM_VARIABLE, "")
    path, _, token = value.partition(" ")
    if not path or not token:
        raise SeamError("pipguard's channel is not set (this file is started by pipguard only)")
    return path, token


def ask(message, fds=(), answer=True):
    """Send one request (a JSON object) and return pipguard's JSON answer
    (``answer=False``: return once it is sent; pipguard answers elsewhere)."""
    path, token = _channel()
    message = dict(message, token=token)
    data = (json.dumps(message) + "\n").encode()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        if fds:
            sock.sendmsg([data[:1]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            data = data[1:]
        sock.sendall(data)
        if not answer:
            return None
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    finally:
        sock.close()
    if not reply:
        raise SeamError("pipguard closed the channel without an answer")
    return json.loads(reply)


# --------------------------------------------------------------------------- classification
def _is_python(program):
    """Whether ``program`` starts a Python interpreter (pip starts them by the
    interpreter's path: sys.executable, or a build environment's venv python)."""
    name = os.path.basename(program)
    if name.startswith(("python", "pypy")):
        return True
    try:
        real = os.path.realpath(program)
    except (TypeError, ValueError):
        return False
    for known in (sys.executable, getattr(sys, "_base_executable", "")):
        if known and real == os.path.realpath(known):
            return True
    return os.path.basename(real).startswith(("python", "pypy"))


def _pip_dir():
    pip = sys.modules.get("pip")
    location = getattr(pip, "__file__", None)
    return os.path.realpath(os.path.dirname(location)) if location else None


def classify(argv):
    """("hook"|"runner"|"refuse"|"pass", detail) for a command pip starts."""
    argv = [os.fsdecode(a) if isinstance(a, bytes) else str(a) for a in argv]
    if not argv or not _is_python(argv[0]):
        return "pass", ""
    script = next((a for a in argv[1:] if a not in ("-I", "-S")), "")
    if len(argv) >= 3 and script in (HERE, ENTRY):
        # already rewritten (a runner): by the exact absolute path rewrite() writes, never a
        # name resolved against pip's cwd, where a build of a local project can plant a link
        # to this file (review: `./-u` linked here turned a refusal into "ours")
        return "ours", ""
    pip_dir = _pip_dir()
    if pip_dir and len(argv) == 4:
        script = os.path.realpath(argv[1])
        hooks_dir = os.path.join(pip_dir, "_vendor", "pyproject_hooks") + os.sep
        if script.startswith(hooks_dir) and os.path.basename(script) == "_in_process.py":
            return "hook", ""
    if pip_dir and len(argv) >= 2:
        runner = os.path.realpath(argv[1])
        if runner in (os.path.join(pip_dir, "__pip-runner__.py"), pip_dir):
            return "runner", ""
    return "refuse", " ".join(argv[:6])


def rewrite(argv):
    """The command to start instead of ``argv`` (None: start it unchanged)."""
    kind, detail = classify(argv)
    if kind in ("pass", "ours"):
        return None
    if kind == "hook":
        raise ValueError("a hook call is handed off (_hand_off), never rewritten")
    python = sys.executable
    if kind == "runner":
        return [argv[0], ENTRY, "runner", *argv[1:]]
    return [python, "-I", "-S", ENTRY, "refuse",
            "pip tried to run package code outside a PEP 517 hook (a legacy setup.py path?): " + detail]


# --------------------------------------------------------------------------- pip side
def _hand_off(argv, rest):
    """Hand one hook call to pipguard; returns (placeholder argv, its
    ``rest`` of ``_execute_child``, the fd to close once it started)."""
    fds = [fd if fd != -1 else std for fd, std in
           ((rest[_P2CREAD], 0), (rest[_C2PWRITE], 1), (rest[_ERRWRITE], 2))]
    cwd = rest[_CWD]
    cwd = os.path.realpath(os.fsdecode(cwd)) if cwd is not None else os.getcwd()
    env = os.environ if rest[_ENV] is None else rest[_ENV]
    read_end, write_end = os.pipe()
    try:
        ask({"type": "hook", "reply": "pipe", "cwd": cwd,
             "argv": [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in argv],
             "env": {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()}},
            [*fds, write_end], answer=False)
    except (OSError, SeamError, ValueError) as exc:
        os.close(read_end)
        why = f"pipguard: the hook call could not be handed to the sandbox: {exc}"
        return ["/bin/sh", "-c", 'printf "%s\\n" "$1" >&2; exit 1', "pipguard-hook", why], rest, None
    finally:
        os.close(write_end)  # pipguard holds its copy: the pipe ends when pipguard answers or dies
    rest = list(rest)
    rest[_PASS_FDS] = (*rest[_PASS_FDS], read_end)  # kept open in the placeholder only
    return [*PLACEHOLDER, str(read_end)], tuple(rest), read_end


def install_seam(role):
    original = subprocess.Popen._execute_child

    def _execute_child(self, args, executable, *rest, **kwargs):
        argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
        if classify(argv)[0] == "hook":
            if len(rest) <= _ERRWRITE or kwargs:  # a Popen this seam was not written for
                args = [sys.executable, "-I", "-S", ENTRY, "refuse",
                        "this Python's subprocess module is not the one pipguard knows; no hook ran"]
                return original(self, args, None, *rest, **kwargs)
            args, rest, placeholder_fd = _hand_off(argv, rest)
            try:
                return original(self, args, None, *rest, **kwargs)
            finally:
                if placeholder_fd is not None:
                    os.close(placeholder_fd)
        replacement = rewrite(argv)
        if replacement is not None:
            args, executable = replacement, None
            if replacement[2:3] == ["runner"] and len(rest) > 4:
                # a pip subprocess gets the index URLs on its command line: keep any
                # credentials in them out of /proc/PID/cmdline (rest[4] is env, 3.9-3.13)
                env = os.environ if rest[4] is None else rest[4]
                args, env = move_credentials(args, env)
                rest = rest[:4] + (env,) + rest[5:]
        return original(self, args, executable, *rest, **kwargs)

    subprocess.Popen._execute_child = _execute_child
    sys.addaudithook(_audit)
    patches = {
        "pip._internal.commands.install": lambda module: _patch_install(module, role),
        "pip._internal.operations.prepare": _patch_prepare,
        "pip._internal.cli.cmdoptions": _add_use_pep517,
    }
    for name in [n for n in patches if n in sys.modules]:  # loaded already (not by pip's own start)
        patches.pop(name)(sys.modules[name])
    sys.meta_path.insert(0, _PatchFinder(patches))


#: the audit events of starting a program other than through subprocess.Popen
_STARTS = frozenset(("os.system", "os.spawn", "os.exec", "os.posix_spawn"))


def _audit(event, args, _starts=_STARTS):
    # Backstop: every way to start a program other than subprocess.Popen. Called for
    # every audit event of pip's (thousands: each import, open, exec): one set lookup.
    if event not in _starts:
        return
    if event in ("os.system", "os.spawn"):
        raise PermissionError(f"pipguard: pip may not start processes through {event}")
    if event in ("os.exec", "os.posix_spawn"):
        path, argv = args[0], args[1]
        program = os.fsdecode(path) if isinstance(path, (bytes, str, os.PathLike)) else ""
        if _is_python(program) and classify(list(argv) or [program])[0] not in ("ours", "pass"):
            raise PermissionError(f"pipguard: refusing {event} of a Python interpreter outside the seam")


class _PatchFinder:
    """Patches pip's modules as they load: ``patches`` maps a module name to a
    function that gets the executed module."""

    def __init__(self, patches):
        self.patches = patches

    def find_spec(self, name, path=None, target=None):
        patch = self.patches.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, patch)
                return spec
        return None


class _PatchingLoader:
    def __init__(self, loader, patch):
        self.loader = loader
        self.patch = patch

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.patch(module)


def _patch_install(module, role):
    """Wrap ``install_given_reqs`` (the gate) and record ``--target``."""
    original = getattr(module, "install_given_reqs", None)
    command = getattr(module, "InstallCommand", None)
    if original is None or command is None:
        _refuse_command(command, "this pip's install command has no install_given_reqs")
        return
    module.install_given_reqs = _gated(original, role)
    package = sys.modules.get("pip._internal.req")
    if package is not None and getattr(package, "install_given_reqs", None) is original:
        # pip's other caller: the in-process build-env installer (pip >= 25.2,
        # --use-feature inprocess-build-deps) imports it from the package at call
        # time and installs build requirements from this very process
        package.install_given_reqs = _gated(original, "build-env")
    run = command.run

    def run_recording_target(self, options, args):
        # where a --target install ends up (pip installs into a temporary home first)
        _STATE["target_dir"] = getattr(options, "target_dir", None)
        # with --upgrade pip removes each top-level entry of the target it moves in, whole
        _STATE["target_upgrade"] = bool(getattr(options, "upgrade", False))
        # where pip keeps the wheels it builds: pipguard evicts those the gate did not pass
        cache_dir = getattr(options, "cache_dir", None)
        _STATE["cache_dir"] = os.path.realpath(cache_dir) if isinstance(cache_dir, str) and cache_dir else None
        return run(self, options, args)

    command.run = run_recording_target


def _patch_prepare(module):
    """Tell pipguard what each source tree is before pip runs its hooks."""
    original = getattr(module, "_get_prepared_distribution", None)
    if original is None:
        return  # no facts: approvals of runtime attempts never match (fail closed)

    def _get_prepared_distribution(req, *args, **kwargs):
        source_dir = getattr(req, "source_dir", None)
        if isinstance(source_dir, str) and not getattr(req, "is_wheel", False):
            ask({"type": "source", "dir": os.path.realpath(source_dir),
                 "name": getattr(req, "name", None), "origin": _origin(req),
                 "cache_dir": _STATE.get("cache_dir"), "project": _kept(req)})
        return original(req, *args, **kwargs)

    _get_prepared_distribution.__wrapped__ = original
    module._get_prepared_distribution = _get_prepared_distribution


_STATE = {"target_dir": None, "target_upgrade": False, "cache_dir": None}


def _kept(req):
    """Is ``req``'s source tree the user's own, which outlives the install: a local directory pip
    builds in place (``pip install ./proj``, ``-e .``, a path in ``-r``) or an editable checkout
    pip keeps (``-e git+...`` in ``src/``)? Not pip's unpacked sdist or clone in its temporary
    directory. Unknown (pip changed): kept, so the tree is checked (fail closed)."""
    if getattr(req, "editable", False):
        return True
    link = getattr(req, "link", None)
    try:
        return bool(link.is_existing_dir())
    except Exception:
        return True


def _refuse_command(command, why):
    def run(self, options, args):
        from pip._internal.exceptions import CommandError

        raise CommandError(f"pipguard does not support this pip ({why}); nothing was installed")

    if command is not None:
        command.run = run


def _describe(requirement):
    path = getattr(requirement, "local_file_path", None)
    return {
        "name": getattr(requirement, "name", None),
        "path": path,
        "editable": bool(getattr(requirement, "editable", False)),
        "is_wheel": bool(getattr(requirement, "is_wheel", False)),
        # a wheel from pip's wheel cache (built by an earlier run: pipguard's gate applies anew)
        "cached": getattr(requirement, "cached_wheel_source_link", None) is not None,
        "user_supplied": bool(getattr(requirement, "user_supplied", False)),
        "reinstall": bool(getattr(requirement, "should_reinstall", False)),
        # the project an editable wheel was built from (its finder may point only there)
        "source_dir": _source_dir(requirement) if getattr(requirement, "editable", False) else None,
        "origin": _origin(requirement),
    }


def _origin(requirement):
    """The artifact pip got for ``requirement`` (the sdist a wheel was built
    from, or the wheel it downloaded): its file name and sha256, from pip's
    ``download_info`` (which pip fills from the index's hash or by hashing the
    file; for a wheel from pip's cache, the artifact it was built from), else
    by hashing the downloaded file. None for a local directory or a VCS
    checkout: those have no artifact hash."""
    info = getattr(getattr(requirement, "download_info", None), "info", None)
    hashes = getattr(info, "hashes", None)
    link = getattr(requirement, "original_link", None) or getattr(requirement, "link", None)
    filename = getattr(link, "filename", None)
    if type(info).__name__ in ("DirInfo", "VcsInfo"):
        return None
    digest = hashes.get("sha256") if isinstance(hashes, dict) else None
    if not isinstance(digest, str):
        path = getattr(requirement, "local_file_path", None)
        if not (isinstance(path, str) and os.path.isfile(path)):
            return None
        digest, filename = _sha256(path), os.path.basename(path)
    return {"filename": filename if isinstance(filename, str) else None, "sha256": digest.lower()}


def _sha256(path):
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _source_dir(requirement):
    try:
        return requirement.unpacked_source_directory
    except Exception:
        return getattr(requirement, "source_dir", None)


def _scheme(original, args, kwargs, names):
    """Where pip will install each distribution (pip's own get_scheme)."""
    try:
        import inspect

        from pip._internal.locations import get_scheme

        bound = inspect.signature(original).bind(*args, **kwargs).arguments
        out = {}
        for name in names:
            scheme = get_scheme(name, user=bool(bound.get("use_user_site")), home=bound.get("home"),
                                root=bound.get("root"), isolated=False, prefix=bound.get("prefix"))
            out[name] = {key: getattr(scheme, key) for key in ("purelib", "platlib", "scripts",
                                                               "data", "headers")}
        return out
    except Exception:
        return None


def _gated(original, role):
    def install_given_reqs(requirements, *args, **kwargs):
        from pip._internal.exceptions import InstallationError

        wheels = [_describe(r) for r in requirements]
        answer = ask({"type": "gate", "role": role, "wheels": wheels, "target_dir": _STATE["target_dir"],
                      "target_upgrade": _STATE["target_upgrade"],
                      # where the installed code is imported from (an nspkg line can take over a
                      # package anywhere on it): this interpreter's path, without the seam's
                      "import_paths": [p for p in sys.path if p and os.path.isdir(p) and p != ENTRY],
                      "schemes": _scheme(original, (requirements, *args), kwargs,
                                         [w["name"] for w in wheels if w["name"]])})
        decision = answer.get("decision")
        if decision == "install":
            return original(requirements, *args, **kwargs)
        if decision == "stop":
            return []
        raise InstallationError(answer.get("message") or "pipguard refused the install")

    install_given_reqs.__wrapped__ = original
    return install_given_reqs


def _add_use_pep517(cmdoptions):
    """Once pip's ``cmdoptions`` is loaded (pip imports it before its ``main``
    reads ``sys.argv``): ``--use-pep517`` into ``sys.argv``, where pip has the
    option. Not by importing cmdoptions ahead of pip: that cost ~7 ms of every
    pip start (measured), the same modules in another order."""
    sys.argv[1:] = _with_pep517(sys.argv[1:], cmdoptions)


def _with_pep517(args, cmdoptions):
    """pip's arguments with ``--use-pep517`` where pip has legacy paths."""
    if "install" not in args or USE_PEP517 in args:
        return list(args)
    if not hasattr(cmdoptions, "use_pep517"):
        return list(args)  # a pip without the option has no legacy path either
    args = list(args)
    if "--no-use-pep517" in args[:args.index("--") if "--" in args else len(args)]:
        # pip would run setup.py outside any hook; the last option wins, so ours below does
        sys.stderr.write("pipguard: --no-use-pep517 is overridden by --use-pep517: the legacy "
                         "setup.py paths run package code outside a PEP 517 hook, which pipguard "
                         "cannot sandbox\n")
    if "--" in args:
        at = args.index("--")
        return args[:at] + [USE_PEP517] + args[at:]
    return args + [USE_PEP517]


def say_hello():
    """Tell pipguard which interpreter this is (``cpython 3.11``): a program that is not a
    Python running this file (``--python /bin/true``) says nothing, and pipguard then knows
    that pip never ran, whatever its exit status. The descriptor is closed after: pip's
    own subprocesses never get it."""
    fd = os.environ.pop(HELLO_VARIABLE, "")
    if not fd.isdigit():
        return
    try:
        os.write(int(fd), f"{sys.implementation.name} {sys.version_info[0]}.{sys.version_info[1]}\n".encode())
    except OSError:
        pass
    finally:
        try:
            os.close(int(fd))
        except OSError:
            pass


def run_pip(args):
    """The top-level pip: as ``python -m pip ARGS``, with the seam."""
    say_hello()
    if sys.implementation.name != "cpython" or sys.version_info < (3, 9):
        sys.stderr.write(f"pipguard: {sys.executable} is not a CPython >= 3.9\n")
        sys.exit(UNSUPPORTED)
    del sys.path[0]  # this file's directory; ``-m`` would have put the cwd, which pip removes
    try:
        import pip  # noqa: F401
    except ImportError:
        sys.stderr.write(f"pipguard: {sys.executable} has no pip\n")
        sys.exit(NO_PIP)
    sys.argv = ["pip", *args]  # (--use-pep517 joins them when pip loads its options: _add_use_pep517)
    install_seam("top")
    import runpy

    runpy.run_module("pip", run_name="__main__", alter_sys=True)


def run_runner(runner, args):
    """A pip subprocess pip started itself (build requirements): its runner, with the seam."""
    del sys.path[0]
    sys.argv = [runner, *args]
    install_seam("build-env")
    import runpy

    runpy.run_path(runner, run_name="__main__")


def main(argv):
    if not argv:
        sys.stderr.write("usage: target.py pip|runner|refuse ...\n")
        return 2
    mode, rest = argv[0], argv[1:]
    if mode == "pip":
        run_pip(rest)
        return 0
    if mode == "runner":
        run_runner(rest[0], rest[1:])
        return 0
    if mode == "refuse":
        reason = rest[0] if rest else "refused"
        try:
            ask({"type": "refuse", "reason": reason})
        except (OSError, SeamError, ValueError):
            pass
        sys.stderr.write(f"pipguard: {reason}\n")
        return 1
    sys.stderr.write(f"target.py: unknown mode {mode!r}\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
