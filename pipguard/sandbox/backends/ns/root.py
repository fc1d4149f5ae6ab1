"""The new root of the namespace backend, built from the spec: the idmapped trees made as
root before the uid switch (and the ones the launcher makes once per process:
:func:`premade_idmaps`), the two ``pivot_root`` of bubblewrap's order, each mount step
(:func:`_place`), and the decoy homes planted, watched and made read-only
(:func:`_watch_decoys`).

Runs in the forked first process and its pid 1 (all but :func:`premade_idmaps`, which runs
in the launching root process): imports nothing after the fork (the caller may have had
other threads) and writes only with ``os.write``. Imports the spec, the decoys and the
kernel calls of this package and the standard library.
"""

from __future__ import annotations

import os
import stat
import threading
from typing import Dict, Mapping, Optional, Tuple

from pipguard.sandbox.backends.ns.decoys import (DECOY_DIRECTORIES, HOME_DECOYS, IN_ACCESS, IN_CLOEXEC,
                                                 IN_NONBLOCK, IN_ONLYDIR, IN_OPEN, _dir_on, _ensure_dir,
                                                 plant_decoys)
from pipguard.sandbox.backends.ns.kernel import (AT_EMPTY_PATH, AT_FDCWD, AT_RECURSIVE, MNT_DETACH,
                                                 MOUNT_ATTR_IDMAP, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOSUID,
                                                 MOUNT_ATTR_RDONLY, MOVE_MOUNT_F_EMPTY_PATH, MS_BIND,
                                                 MS_NODEV, MS_NOSUID, MS_PRIVATE, MS_RDONLY, MS_REC,
                                                 MS_SLAVE, OPEN_TREE_CLOEXEC, OPEN_TREE_CLONE,
                                                 SYS_MOVE_MOUNT, SYS_OPEN_TREE, SYS_PIVOT_ROOT,
                                                 NamespaceError, _b, _check, _libc, _mount, _setattr,
                                                 _userns_fd)
from pipguard.sandbox.backends.ns.spec import BASE, DEV_LINKS, EMPTY_FILE, PRIVATE_TMPFS, Mount, NamespaceSpec

#: (map_uid, map_gid, host_uid, host_gid) -> a user namespace fd of this
#: (root) pipguard process, made once (:func:`premade_idmaps`)
_idmaps: Dict[Tuple[int, int, int, int], int] = {}
_idmaps_lock = threading.Lock()


def premade_idmaps(spec: NamespaceSpec) -> Dict[str, str]:
    """In the launching (root) process: the idmap user namespaces a run's
    write roots need, made once per pipguard process (each costs a throw-away
    child, ~5 ms of every hook call's launch when the first process made its
    own), as paths the first process opens while it is still root
    (``/proc/PID/fd/N`` of this process): ``{"uid:gid": path}``. Whatever
    cannot be made here is left to the first process, which says why."""
    found: Dict[str, str] = {}
    with _idmaps_lock:
        for mount in spec.mounts:
            if mount.kind not in ("rw", "ro-owner"):
                continue
            try:
                st = os.stat(mount.source)
                key = (st.st_uid, st.st_gid, spec.host_uid, spec.host_gid)
                if key not in _idmaps:
                    _idmaps[key] = _userns_fd(*key)
            except (OSError, NamespaceError):
                continue
            found[f"{st.st_uid}:{st.st_gid}"] = f"/proc/{os.getpid()}/fd/{_idmaps[key]}"
    return found


def _premade(premade: Optional[Mapping[str, str]], key: Tuple[int, int]) -> int:
    """The launcher's idmap user namespace for owner ``key``, opened; 0 if none."""
    path = (premade or {}).get("%d:%d" % key)
    if not path:
        return 0
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return 0  # then we make our own


def _root_trees(spec: NamespaceSpec, premade: Optional[Mapping[str, str]] = None) -> Dict[str, int]:
    """As root, before the uid switch: a detached copy (open_tree) of every
    bind, attached in the new root by pid 1 — the unprivileged uid could not
    reach a source below a 0700 directory (/root/.pyenv/...). Write roots are
    idmapped (mount_setattr(MOUNT_ATTR_IDMAP)): their owner on disk appears
    as the sandbox's host uid, and what it creates belongs to that owner."""
    trees: Dict[str, int] = {}
    userns: Dict[Tuple[int, int], int] = {}
    try:
        for mount in spec.mounts:
            if mount.kind not in ("ro", "ro-owner", "ro-landlock", "rw"):
                continue
            tree = _check(_libc.syscall(SYS_OPEN_TREE, AT_FDCWD, _b(mount.source),
                                        OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE),
                          f"open_tree {mount.source}")
            trees[mount.path] = tree
            if mount.kind in ("rw", "ro-owner"):
                st = os.stat(mount.source)
                key = (st.st_uid, st.st_gid)
                if key not in userns:
                    userns[key] = _premade(premade, key) or _userns_fd(
                        st.st_uid, st.st_gid, spec.host_uid, spec.host_gid)
                _setattr("", MOUNT_ATTR_IDMAP, userns[key], fd=tree, flags=AT_EMPTY_PATH | AT_RECURSIVE)
    finally:
        for fd in userns.values():
            os.close(fd)
    return trees


def _newroot(path: str) -> str:
    return "/newroot" + path


def _oldroot(path: str) -> str:
    return "/oldroot" + path


def _ensure_file(path: str) -> None:
    if not os.path.lexists(path):
        _ensure_dir(os.path.dirname(path))
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o444))


def _build_root(spec: NamespaceSpec, trees: Dict[str, int]) -> Dict[str, int]:
    """Build the new root; returns an O_PATH handle on each of our own tmpfs
    (:data:`PRIVATE_TMPFS`) and each decoy home's, taken right after its
    mount: whatever the plan binds on top of it (a ``--allow-read /tmp``, a
    grant inside a home) is not what the launcher lists afterwards, nor where
    decoys are planted."""
    handles: Dict[str, int] = {}
    # bubblewrap's order: nothing we mount may propagate back to the host
    _mount(None, "/", None, MS_SLAVE | MS_REC)
    _mount("tmpfs", BASE, "tmpfs", MS_NODEV | MS_NOSUID, "mode=0755")
    os.chdir(BASE)
    os.mkdir("newroot", 0o755)
    _mount("tmpfs", "newroot", "tmpfs", MS_NODEV | MS_NOSUID, "mode=0755")
    os.mkdir("oldroot", 0o755)
    _check(_libc.syscall(SYS_PIVOT_ROOT, _b(BASE), _b("oldroot")), "pivot_root")
    os.chdir("/")
    os.close(os.open(EMPTY_FILE, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o444))
    for mount in spec.mounts:
        _place(mount, trees)
        if (mount.kind == "tmpfs" and mount.path in PRIVATE_TMPFS or mount.kind == "decoys") \
                and mount.path not in handles:
            handles[mount.path] = os.open(_newroot(mount.path), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    for mount in spec.mounts:
        if mount.kind == "mask" and os.path.isdir(_newroot(mount.path)):
            _setattr(_newroot(mount.path), MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, flags=0)
    _mount("oldroot", "/oldroot", None, MS_REC | MS_PRIVATE)
    _check(_libc.umount2(b"/oldroot", MNT_DETACH), "umount /oldroot")
    old = os.open("/", os.O_DIRECTORY | os.O_RDONLY)
    try:
        os.chdir("/newroot")
        _check(_libc.syscall(SYS_PIVOT_ROOT, b".", b"."), "pivot_root(/newroot)")
        os.fchdir(old)
        _check(_libc.umount2(b".", MNT_DETACH), "umount the base")
    finally:
        os.close(old)
    os.chdir("/")
    for fd in trees.values():
        os.close(fd)
    # the root itself read-only: nothing but the write roots, /tmp, /dev/shm
    # and the decoy homes can be written, whatever Landlock would allow
    _setattr("/", MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, flags=0)
    return handles


def _place(mount: Mount, trees: Dict[str, int]) -> None:
    target = _newroot(mount.path)
    kind = mount.kind
    if kind == "symlink":
        if not os.path.lexists(target):
            _ensure_dir(os.path.dirname(target))
            os.symlink(mount.source, target)
        return
    if kind in ("tmpfs", "decoys"):
        _ensure_dir(target)
        _mount("tmpfs", target, "tmpfs", MS_NODEV | MS_NOSUID, "mode=0755" if kind == "tmpfs" else "mode=0700")
        if mount.path == "/tmp":
            os.chmod(target, 0o1777)
        return
    if kind == "proc":
        _ensure_dir(target)
        _mount("proc", target, "proc", MS_NOSUID | MS_NODEV | 8)  # MS_NOEXEC
        return
    if kind == "sysfs":
        _ensure_dir(target)
        try:
            # allowed to the owner of the net namespace (us) while a full sysfs is visible
            # (the old root's, as for /proc); refused where the host's /sys is partly
            # covered (a container's masks): then the read-only bind below
            _mount("sysfs", target, "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | 8)  # MS_NOEXEC
            return
        except OSError:
            pass
    if kind == "mask":  # over an entry of a directory bound whole: empty, read-only
        if os.path.isdir(target):
            _mount("tmpfs", target, "tmpfs", MS_NODEV | MS_NOSUID, "mode=0755,size=64k")
            # read-only once what is granted below it is bound (_build_root)
        else:
            _mount(EMPTY_FILE, target, None, MS_BIND)
            _setattr(target, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, flags=0)
        return
    if kind == "dev":
        _ensure_dir(target)
        _mount("tmpfs", target, "tmpfs", MS_NOSUID, "mode=0755")
        for name_, text in DEV_LINKS.items():
            os.symlink(text, os.path.join(target, name_))
        os.mkdir(os.path.join(target, "pts"), 0o755)
        return
    source = _oldroot(mount.source)
    # an idmapped tree says itself what it is (its source may be out of our
    # reach now: a root-owned 0700 run directory)
    tree = trees.get(mount.path)
    if os.path.isdir(source) if tree is None else stat.S_ISDIR(os.fstat(tree).st_mode):
        _ensure_dir(target)
    else:
        _ensure_file(target)
    if tree is not None:
        _check(_libc.syscall(SYS_MOVE_MOUNT, tree, b"", AT_FDCWD, _b(target),
                             MOVE_MOUNT_F_EMPTY_PATH), f"move_mount {mount.path}")
    else:
        _mount(source, target, None, MS_BIND | MS_REC)
    if kind in ("ro", "ro-owner", "sysfs"):
        _setattr(target, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)
    elif kind in ("rw", "ro-landlock"):
        _setattr(target, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)
    else:  # device: read-write device nodes, nothing else
        _setattr(target, MOUNT_ATTR_NOSUID)


def _watch_decoys(spec: NamespaceSpec, handles: Mapping[str, int]) -> Tuple[int, Dict[int, str]]:
    """Plant the decoys in each home's tmpfs and watch them (inotify: works
    unprivileged, on a tmpfs, for every process; it carries no pid — the
    audit hook attributes Python reads, the decoy says that *something* of
    the sandbox opened it). The fd stays in pid 1; the launcher takes it.

    The run's own ``$HOME`` has them too (a native ``cat ~/.ssh/id_rsa``
    would otherwise fail with ENOENT, unreported with read observation off),
    planted by the plan (:func:`plant_decoys`, before the files snapshot: they
    are not the build's writes) and watched here for reads only
    (``IN_ACCESS``): that home is the build's to write, and a tool writing
    ``~/.docker/config.json`` there opens it without reading anything."""
    fd = _check(_libc.inotify_init1(IN_CLOEXEC | IN_NONBLOCK), "inotify_init1")
    watched: Dict[int, str] = {}

    def watch(path: str, mask: int) -> None:
        wd = _check(_libc.inotify_add_watch(fd, _b(path), mask), f"inotify_add_watch {path}")
        watched.setdefault(wd, path)

    for home in spec.decoy_homes:
        if home == "/home":  # it holds the homes
            continue
        device = os.fstat(handles[home]).st_dev
        for rel in plant_decoys(home, spec.token, device=device):
            watch(home + "/" + rel, IN_OPEN | IN_ACCESS)
        for rel in DECOY_DIRECTORIES:  # a listing; a directory's own events carry no name
            if _dir_on(home, rel, device):
                watch(home + "/" + rel, IN_OPEN | IN_ONLYDIR)
    # then read-only (this mount only: grants bound below it stay as they are): a
    # home's path holds decoys and nothing else, and the sandbox cannot stash what
    # it read in a tmpfs nobody lists afterwards (review of the eleventh session)
    for home in spec.decoy_homes:  # the tmpfs itself, by its handle: not what is bound on top
        _setattr("", MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, fd=handles[home],
                 flags=AT_EMPTY_PATH)
    if spec.sandbox_home:
        for rel in HOME_DECOYS:
            watch(spec.sandbox_home + "/" + rel, IN_ACCESS)
    return fd, watched
