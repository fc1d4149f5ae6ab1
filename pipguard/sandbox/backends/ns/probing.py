"""Whether the namespace backend works here, part by part (:func:`probe`): for ``pipguard
doctor`` and for ``auto``'s plan (through ``backends.load("ns").probe()``).

Each part is tried in a throw-away forked child, which imports nothing after the fork (the
temp dir's name aside, as root) and writes only with ``os.write``. Imports the backend
interface's ``Part``/``Probe``, the spec's constants, the kernel calls of this package and the
standard library.
"""

from __future__ import annotations

import ctypes
import os
from typing import Dict, List

from pipguard.sandbox.backends import Part, Probe
from pipguard.sandbox.backends.ns.kernel import (AT_EMPTY_PATH, AT_FDCWD, CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWNS,
                                                 CLONE_NEWPID, CLONE_NEWUSER, CLONE_NEWUTS, MOUNT_ATTR_IDMAP,
                                                 MS_NODEV, MS_NOSUID, MS_REC, MS_SLAVE, OPEN_TREE_CLOEXEC,
                                                 OPEN_TREE_CLONE, SYS_OPEN_TREE, NamespaceError, _b, _become,
                                                 _libc, _mount, _setattr, _userns_fd, _write, why_denied)
from pipguard.sandbox.backends.ns.spec import BASE, OVERFLOW_ID, name

_PROBE: Dict[int, Probe] = {}


def probe(*, refresh: bool = False) -> Probe:
    """Whether the ns backend works here, part by part (user namespace, uid
    mapping, mount, pid, net, ipc, uts, idmapped mounts as root). Tries each
    in a throw-away child (as root: after switching to the overflow uid, as a
    run does); cached per process, never raises."""
    key = os.getpid()
    if refresh or key not in _PROBE:
        _PROBE.clear()
        _PROBE[key] = _probe()
    return _PROBE[key]


_PARTS = ("user", "uid_map", "mount", "pid", "net", "ipc", "uts", "idmap")


def _probe() -> Probe:
    if not hasattr(os, "fork") or os.uname().sysname != "Linux":
        return Probe(name, tuple(Part(p, "namespaces are Linux-only") for p in _PARTS))
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_fd)
            os.write(write_fd, _probe_child().encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    data = b""
    while True:
        chunk = os.read(read_fd, 4096)
        if not chunk:
            break
        data += chunk
    os.close(read_fd)
    os.waitpid(pid, 0)
    reasons: Dict[str, str] = {}
    for line in data.decode(errors="replace").splitlines():
        part, _, reason = line.partition("=")
        reasons[part] = reason
    first_missing = next((reasons[p] for p in _PARTS if reasons.get(p)), "")
    parts = []
    for part in _PARTS:
        if part in reasons:
            parts.append(Part(part, reasons[part]))
        else:  # not reached: an earlier part failed
            parts.append(Part(part, f"not tried ({first_missing or 'the probe failed'})"))
    return Probe(name, tuple(parts))


def _idmap_probe() -> str:
    """As root, the ns backend shows its write roots through idmapped mounts
    (:func:`pipguard.sandbox.backends.ns.root._root_trees`); "" when one of
    the temp dir (where pip's build dirs and every run's own dirs live) can be
    made here, else why not (the filesystem, or a kernel before 5.12)."""
    if os.geteuid() != 0:
        return ""
    import tempfile

    where = tempfile.gettempdir()
    tree = _libc.syscall(SYS_OPEN_TREE, AT_FDCWD, _b(where), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)
    if tree < 0:
        return f"open_tree {where}: {os.strerror(ctypes.get_errno())}"
    try:
        userns = _userns_fd(0, 0, OVERFLOW_ID, OVERFLOW_ID)
        try:
            _setattr("", MOUNT_ATTR_IDMAP, userns, fd=tree, flags=AT_EMPTY_PATH)
        finally:
            os.close(userns)
    except (OSError, NamespaceError) as exc:
        return f"an idmapped mount of {where} failed: {exc}"
    finally:
        os.close(tree)
    return ""


def _probe_child() -> str:
    out: List[str] = []
    try:
        idmap = _idmap_probe()
        if os.geteuid() == 0:
            _become(OVERFLOW_ID, OVERFLOW_ID)
        uid, gid = os.geteuid(), os.getegid()
        if _libc.unshare(CLONE_NEWUSER) != 0:
            out.append("user=" + why_denied(ctypes.get_errno())[0])
            return "\n".join(out)
        out.append("user=")
        try:
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
            _write("/proc/self/gid_map", f"{gid} {gid} 1\n")
            out.append("uid_map=")
        except OSError as exc:
            out.append(f"uid_map=writing the uid map failed: {exc.strerror}")
            return "\n".join(out)
        for part, flag in (("mount", CLONE_NEWNS), ("pid", CLONE_NEWPID), ("net", CLONE_NEWNET),
                           ("ipc", CLONE_NEWIPC), ("uts", CLONE_NEWUTS)):
            ok = _libc.unshare(flag) == 0
            out.append(f"{part}=" + ("" if ok else f"unshare: {os.strerror(ctypes.get_errno())}"))
        try:  # AppArmor's restriction lets unshare pass and denies what follows
            _mount(None, "/", None, MS_SLAVE | MS_REC)
            _mount("tmpfs", BASE, "tmpfs", MS_NODEV | MS_NOSUID)
        except OSError as exc:
            out = [o for o in out if not o.startswith("mount=")] + [f"mount=mounting a tmpfs failed: {exc.strerror}"]
        out.append("idmap=" + idmap)
    except Exception as exc:  # a probe never raises
        out.append(f"user=the probe failed: {exc}")
    return "\n".join(out)
