"""``pipguard pkgbuild``: review a candidate PKGBUILD in the sandbox.

:func:`review` runs the real makepkg, never as root and never outside the
sandbox, in phases (see :mod:`pipguard.pkgbuild.review`) and returns a
:class:`~pipguard.pkgbuild.result.PkgbuildResult`: each phase's evidence,
the package's contents, and a status (``clean`` / ``blocked`` / ``error``).
At the install's layer: uses the sandbox (and its VM runner), never the CLI.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Callable, Mapping, Optional, Sequence

from pipguard.errors import PipguardError, UsageError
from pipguard.sandbox.files import remove_tree, walk
from pipguard.pkgbuild.result import PackageFile, Phase, PkgbuildResult
from pipguard.sandbox.policy import HostPort

__all__ = ["MakepkgNotFound", "PackageFile", "Phase", "PkgbuildResult", "review"]

INSTALL_HINT = ("install makepkg: on Arch it comes with pacman; on Debian/Ubuntu: "
                "apt-get install pacman-package-manager libarchive-tools fakeroot")


class MakepkgNotFound(PipguardError):
    """makepkg (or bash, which it is written in) is not installed."""

    blame = "host"


def review(directory: str, *, allow_hosts: Sequence[HostPort] = (), isolation: str = "auto",
           vm_accel: str = "kvm", timeout: Optional[float] = None, env: Optional[Mapping[str, str]] = None,
           progress: Optional[Callable[[str], None]] = None) -> PkgbuildResult:
    """Review the PKGBUILD in ``directory``.

    ``allow_hosts``: destinations the sources phase may reach besides the
    public hosts the source URLs name (empty: only those). ``isolation``:
    ``auto``, ``os`` or ``vm`` (each phase in a QEMU guest of its own, run
    as under ``pipguard run --isolation vm``; ``vm_accel`` as there);
    ``audit`` sees only Python processes and makepkg is bash: refused.
    ``timeout``: seconds per sandboxed run (None: no limit). ``env``: the
    environment to start from (default ``os.environ``; the sandbox scrubs
    it). Raises :class:`~pipguard.errors.PipguardError` for bad input, a
    missing makepkg or (vm) a VM that cannot boot here, before anything ran.
    """
    from pipguard.pkgbuild import builduser
    from pipguard.pkgbuild.review import Layout, Reviewer

    env = dict(os.environ if env is None else env)
    directory = os.path.abspath(directory)
    if isolation == "audit":
        raise UsageError("--isolation audit cannot review a PKGBUILD",
                         hint="the audit layer sees only Python processes and makepkg is bash; use auto, os or vm")
    if not os.path.isfile(os.path.join(directory, "PKGBUILD")):
        raise UsageError(f"no PKGBUILD in {directory}", hint="name the directory that holds the PKGBUILD")
    for tool in ("makepkg", "bash"):
        if shutil.which(tool, path=env.get("PATH") or os.defpath) is None:
            raise MakepkgNotFound(f"{tool} is not installed", hint=INSTALL_HINT)
    if isolation == "vm":
        from pipguard.sandbox.vm import runner as vm

        vm.preflight(vm_accel)  # no qemu, kernel or working KVM: exit 2 with the reason
    user = builduser.choose()
    base = tempfile.mkdtemp(prefix="pipguard-pkgbuild-", dir=_layout_parent())
    try:
        layout = Layout(base)
        _stage(directory, layout, user)
        reviewer = Reviewer(directory, layout, allow_hosts=allow_hosts, isolation=isolation,
                            vm_accel=vm_accel, timeout=timeout, env=env, progress=progress, build_user=user.to_json())
        data = builduser.run_as_build_user(user, reviewer.run, preload=_preload)
        return PkgbuildResult.from_json(data)
    finally:
        remove_tree(base)


def _layout_parent() -> str:
    """Where the review's directories go: the temp dir, unless that is below ``/tmp`` or
    ``/dev/shm`` — then ``/var/tmp``. In the namespace backend those two are the sandbox's own
    tmpfs, which Landlock grants whole: the settings dirs makepkg must see as writable but not
    write (``Policy.read_only_by_landlock``) could be protected there only by a read-only mount,
    which makepkg refuses. Where ``/var/tmp`` is missing the default stays, and ``auto`` runs
    the review on the host's filesystem (``review.Reviewer``)."""
    from pipguard.sandbox.backends.ns.spec import in_private_tmpfs

    default = tempfile.gettempdir()
    if not in_private_tmpfs(default):
        return default
    fallback = "/var/tmp"
    if os.path.isdir(fallback) and os.access(fallback, os.W_OK | os.X_OK):
        return fallback
    return default


def _stage(directory: str, layout, user) -> None:
    """Copy the user's directory to ``layout.input`` (readable by the build
    user, writable by nobody but pipguard), and make the build user's dirs."""
    os.chmod(layout.base, 0o755)  # the build user must traverse it
    shutil.copytree(directory, layout.input, symlinks=True)
    for root, dirs, files in walk(layout.input):
        for name in dirs + [""]:
            # os.walk lists a link to a directory among dirs: chmod would follow it and open
            # up whatever the PKGBUILD's link names (/root...), as root (review of 2026-12-01)
            if name and os.path.islink(os.path.join(root, name)):
                continue
            os.chmod(os.path.join(root, name), 0o755)
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, 0o755 if os.stat(path).st_mode & 0o111 else 0o644)
    from pipguard.pkgbuild.builduser import chown_for

    for path in layout.build_owned():
        os.mkdir(path, 0o700)
        chown_for(user, path)


def _preload() -> None:
    """Everything the worker imports, imported before it drops root (it may
    not be able to read pipguard's or Python's files afterwards)."""
    import ctypes.util  # noqa: F401
    import encodings.idna  # noqa: F401 (socket.create_connection and getaddrinfo of a str host)
    import hashlib  # noqa: F401
    import select  # noqa: F401
    import struct  # noqa: F401
    import threading  # noqa: F401

    import pipguard.sandbox.first_process  # noqa: F401
    import pipguard.sandbox.vm.relay  # noqa: F401 (--isolation vm: the worker runs QEMU)
    import pipguard.sandbox.backends.ns  # noqa: F401 (auto and ns: the namespace backend)
    import pipguard.sandbox.vm.runner  # noqa: F401
    import pipguard.sandbox.files  # noqa: F401
    import pipguard.sandbox.launcher  # noqa: F401
    import pipguard.sandbox.notify  # noqa: F401
    import pipguard.sandbox.proxy  # noqa: F401
    import pipguard.sandbox.api  # noqa: F401
    import pipguard.sandbox.supervisor  # noqa: F401
    from pipguard.sandbox.plan import precompile_hook

    try:
        from pipguard.sandbox import _responder  # noqa: F401
    except ImportError:
        pass
    try:
        import pyseccomp  # noqa: F401
    except ImportError:
        pass
    precompile_hook()  # as root, before the drop: the build user cannot write it
