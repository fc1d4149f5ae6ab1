"""The namespace backend's spec as plain data: what the new root of one run holds.

:func:`spec_for` turns a plan's grants into a frozen, JSON-able :class:`NamespaceSpec` (a
list of :class:`Mount` steps, the ids mapped, the network mode, the decoy token), reading
only the host (lstat, readlink, one listing per heavily split directory) and changing
nothing; the path constants of the namespace's layout live here too. The plan takes the spec
from here; the forked side builds it (:mod:`pipguard.sandbox.backends.ns.root`).

Imports only the standard library and ``rules``: no kernel call (no ``ctypes``), so the plan
and the pkgbuild review can use it without the syscall modules of the package.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from pipguard import rules

#: the backend's name (the plan's and the launcher's config name it; ``backends.load``)
name = "ns"

#: the base every mount is made under (bubblewrap's choice: sure to exist,
#: not a symlink, and the sandbox gets its own tmpfs there anyway)
BASE = "/tmp"
#: the namespace's own tmpfs, writable whole (the plan grants them to Landlock as well)
PRIVATE_TMPFS = ("/tmp", "/dev/shm")
#: in the base tmpfs (``/`` between the two pivots): what a masked file shows
EMPTY_FILE = "/empty"
HOSTNAME = "pipguard"
#: the uid/gid the sandbox is on the host when pipguard runs as root
OVERFLOW_ID = 65534
#: the minimal /dev's symlinks (bubblewrap's)
DEV_LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
             "stderr": "/proc/self/fd/2", "ptmx": "pts/ptmx"}


@dataclass(frozen=True)
class Mount:
    """One step of the new root. ``kind``: "ro"/"rw" (bind ``source`` at
    ``path``), "ro-owner" (as root: a read-only bind, idmapped like "rw" so
    that its owner's rights are the sandbox's: see :func:`_owner_only`),
    "ro-landlock" (a bind left writable as a mount: Landlock alone refuses
    writes, so ``access(W_OK)`` answers from the mode, not ``EROFS``; see
    ``Policy.read_only_by_landlock``), "sysfs" (a sysfs of the run's net
    namespace at ``/sys``, or where the kernel refuses it a read-only bind of
    ``source``), "tmpfs", "dev" (the minimal /dev), "device" (bind a device
    node), "proc", "symlink" (``source`` is the link's text), "decoys" (a
    tmpfs with decoy credentials at a home's path)."""

    kind: str
    path: str
    source: str = ""


@dataclass(frozen=True)
class NamespaceSpec:
    """What the ns backend builds for one run (from :func:`spec_for`).

    - ``mounts``: in order (parents before what is mounted below them);
    - ``host_uid``/``host_gid``: what the sandbox is on the host; the only
      ids mapped. Never 0 (as root it is :data:`OVERFLOW_ID`);
    - ``idmap_writes``: the "rw" binds are idmapped mounts made before the
      uid switch (pipguard runs as root);
    - ``network``: own net namespace with only ``lo``; False only when the
      plan allows all network (then the host's network namespace stays);
    - ``token``: the per-run marker inside every decoy;
    - ``sandbox_home``: the run's own ``$HOME`` (a write root, bound read-write), where
      decoys are planted too: ``~/.ssh/id_rsa`` is where an attacker looks first."""

    mounts: Tuple[Mount, ...]
    host_uid: int
    host_gid: int
    idmap_writes: bool
    network: bool
    token: str
    hostname: str = HOSTNAME
    sandbox_home: str = ""

    def to_json(self) -> Dict[str, Any]:
        return {"mounts": [[m.kind, m.path, m.source] for m in self.mounts], "host_uid": self.host_uid,
                "host_gid": self.host_gid, "idmap_writes": self.idmap_writes, "network": self.network,
                "token": self.token, "hostname": self.hostname, "sandbox_home": self.sandbox_home}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "NamespaceSpec":
        return cls(tuple(Mount(str(k), str(p), str(s)) for k, p, s in data["mounts"]),
                   int(data["host_uid"]), int(data["host_gid"]), bool(data["idmap_writes"]),
                   bool(data["network"]), str(data["token"]), str(data.get("hostname", HOSTNAME)),
                   str(data.get("sandbox_home", "")))

    @property
    def decoy_homes(self) -> Tuple[str, ...]:
        return tuple(m.path for m in self.mounts if m.kind == "decoys")


def _covered(path: str, roots: Set[str], masks: Set[str]) -> bool:
    """Whether a bind of a proper ancestor of ``path`` (in ``roots``) brings
    it along: the nearest such ancestor is below every masked one (a mask
    hides what lies under it, so a grant there needs a bind of its own)."""
    parent = os.path.dirname(path)
    while parent and parent != path:
        if parent in masks:
            return False
        if parent in roots:
            return True
        path, parent = parent, os.path.dirname(parent)
    return False


def _under(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def in_private_tmpfs(path: str) -> bool:
    """Whether ``path`` (resolved) lies in what the namespace has as its own tmpfs."""
    return _under(os.path.realpath(path), PRIVATE_TMPFS)


def _symlinked_parts(path: str) -> List[Tuple[str, str]]:
    """(component, link text) for every symlink on the way to ``path``."""
    out, sofar = [], ""
    for part in path.strip("/").split("/"):
        sofar += "/" + part
        if os.path.islink(sofar):
            out.append((sofar, os.readlink(sofar)))
            sofar = os.path.realpath(sofar)
    return out


def spec_for(read_paths: Sequence[str], write_paths: Sequence[str], device_paths: Sequence[str],
             homes: Sequence[str], network_all: bool, *, euid: Optional[int] = None,
             egid: Optional[int] = None, sandbox_home: str = "",
             landlock_read_only: Sequence[str] = (), token: Optional[str] = None) -> NamespaceSpec:
    """The new root for a plan's grants: ``read_paths``/``write_paths``/
    ``device_paths`` are the OS layer's (they exist or are skipped), ``homes``
    every home directory (each becomes a decoy tmpfs; none is ever bound),
    ``sandbox_home`` the run's own ``$HOME`` (one of the write paths: decoys
    are planted in it as well), ``landlock_read_only`` read paths bound
    without the mount's read-only flag (the caller checked that Landlock
    enforces them). Reads only the host (lstat, readlink), changes nothing."""
    euid = os.geteuid() if euid is None else euid
    egid = os.getegid() if egid is None else egid
    homes = tuple(sorted({os.path.realpath(h) for h in homes if h and h != "/"}))
    mounts: List[Mount] = [Mount("tmpfs", "/tmp"), Mount("dev", "/dev"), Mount("tmpfs", "/dev/shm"),
                           Mount("proc", "/proc")]
    links: Dict[str, str] = {}
    writes: List[str] = []
    for path in write_paths:
        if not os.path.lexists(path):
            continue
        for link, text in _symlinked_parts(path):
            links.setdefault(link, text)
        real = os.path.realpath(path)
        if real not in writes and not _under(real, ["/proc", "/dev"]):
            writes.append(real)
    # No decoys where the plan shows the real directory (a write root at or above a home:
    # planting there wrote decoys over the real ~/.ssh/id_rsa, review of the eleventh
    # session), nor over the namespace's own /tmp or /dev/shm (HOME=/tmp: a read-only decoy
    # tmpfs there took the build's /tmp away): nothing real is there to stand in for.
    homes = tuple(h for h in homes if not _under(h, writes) and h not in PRIVATE_TMPFS
                  and not any(_under(t, [h]) for t in PRIVATE_TMPFS))
    mounts += [Mount("decoys", home) for home in homes]
    read_paths, masks = _collapse_splits([os.path.normpath(p) for p in read_paths if p], homes)
    reads: List[str] = []
    for path in read_paths:
        if not os.path.lexists(path):
            continue
        for link, text in _symlinked_parts(path):
            links.setdefault(link, text)
        real = os.path.realpath(path)
        # /proc is the namespace's own, /dev the minimal one; a home is never
        # bound (only paths granted inside it); what a write root covers is
        # writable already (Landlock's union of rights, kept).
        if _under(real, ["/proc", "/dev"]) or real in homes or _under(real, writes):
            continue
        reads.append(real)
    # one bind per tree: a path below another read path comes with it (each path's
    # ancestors looked up in a set: the pairwise test was ~250,000 comparisons, 100 ms a plan)
    roots = set(reads)
    reads = [r for r in dict.fromkeys(reads) if not _covered(r, roots, set(masks))]
    # each its own bind, on top of a read-only one that covers it. Never below the
    # namespace's own /tmp or /dev/shm: Landlock grants those whole (a rule covers what is
    # mounted below it), so there the read-only mount is the only barrier and stays
    by_landlock = [r for r in dict.fromkeys(os.path.realpath(p) for p in landlock_read_only
                                            if os.path.lexists(p))
                   if not _under(r, writes) and not _under(r, PRIVATE_TMPFS)]
    reads = [r for r in reads if r not in by_landlock]
    for link, text in links.items():
        if not _under(link, ["/proc", "/dev"]):
            mounts.append(Mount("symlink", link, text))
    owner_only = euid == 0 and _owner_only
    mounts += [Mount("ro-owner" if owner_only and owner_only(r) else "ro", r, r) for r in reads
               if not (r == "/sys" and not network_all)]
    if "/sys" in reads and not network_all:
        # a sysfs of our own net namespace (only lo under /sys/class/net, none of the host's
        # submounts: cgroup, debugfs, tracefs, bpf), where the kernel allows it; else the bind
        mounts.append(Mount("sysfs", "/sys", "/sys"))
    mounts += [Mount("ro-landlock", r, r) for r in by_landlock]
    mounts += [Mount("mask", m) for m in masks]
    mounts += [Mount("rw", w, w) for w in writes]
    for dev in device_paths:
        real = os.path.realpath(dev)
        if dev.startswith("/dev/") and os.path.exists(real) and dev != "/dev/shm":
            mounts.append(Mount("device", dev, real))
    # parents first: a tmpfs or a bind before anything mounted below it
    kinds = {"tmpfs": 0, "dev": 0, "proc": 0, "decoys": 0, "symlink": 1, "ro": 2, "ro-owner": 2, "sysfs": 2,
             "ro-landlock": 2, "rw": 2, "mask": 2, "device": 3}
    mounts.sort(key=lambda m: (m.path.rstrip("/").count("/"), kinds[m.kind], m.path))
    if euid == 0:
        uid, gid = OVERFLOW_ID, OVERFLOW_ID
    else:
        uid, gid = euid, egid
    return NamespaceSpec(tuple(mounts), uid, gid, euid == 0, not network_all, token or new_token(),
                         sandbox_home=os.path.realpath(sandbox_home) if sandbox_home else "")


def new_token() -> str:
    """A run's decoy marker."""
    return os.urandom(8).hex()


#: A directory granted entry by entry (the plan's split of /etc around its
#: secrets: ~150 entries here) cost a bind mount per entry, ~50 ms a run
#: (measured at load 5: 151 binds 72 ms, none 20 ms). From this many granted
#: entries on, the directory is bound whole and each entry the split left out
#: is masked (an empty read-only file or tmpfs; entries granted below a masked
#: directory are bound on top of it), so the namespace still does not contain
#: what the plan did not grant. Landlock's grants stay the split either way.
COLLAPSE_AT = 32


def _collapse_splits(paths: List[str], homes: Sequence[str] = ()) -> Tuple[List[str], List[str]]:
    """(paths, masks): the granted ``paths`` (as the plan names them) with
    each heavily split directory granted whole instead of its entries — a
    granted entry that is a symlink stays too (its target is bound, as any
    symlink's) — and that directory's entries to mask: those not granted. A
    directory reached through a symlink, or whose left-out entries include a
    symlink or anything but files and directories, stays split (a mount
    cannot cover a symlink). Never below the namespace's own /tmp or
    /dev/shm (Landlock grants those whole, so a mask there would be the only
    barrier, and a rename on the host detaches it), nor a directory that is or
    holds a home (its decoy tmpfs is planted below). Before the paths are
    resolved, so the ~150 entries of /etc cost one listing, not ~150 resolutions."""
    by_parent: Dict[str, List[str]] = {}
    for p in paths:
        by_parent.setdefault(os.path.dirname(p), []).append(p)
    masks: List[str] = []
    out = list(paths)
    for parent, kids in by_parent.items():
        if len(kids) < COLLAPSE_AT or parent in ("", "/") or os.path.realpath(parent) != parent \
                or _under(parent, PRIVATE_TMPFS) or any(_under(h, [parent]) for h in homes):
            continue
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        granted = set(kids)
        rest = [parent + "/" + n for n in names if parent + "/" + n not in granted]
        if any(os.path.islink(p) or not (os.path.isdir(p) or os.path.isfile(p)) for p in rest):
            continue
        out = [p for p in out if p not in granted or os.path.islink(p)] + [parent]
        masks += rest
    return out, masks


def _owner_only(path: str) -> bool:
    """A granted tree outside the system dirs that only its owner may enter
    or read: pip's build environment and prepared metadata (``mkdtemp``:
    0700, root's when pipguard runs as root), a 0700 ``--allow-read`` dir.
    As root the sandbox is uid 65534, which could not open them; the plain
    backend grants its leased uid read by ACL entries, ns shows the tree
    read-only with its owner mapped to the sandbox's uid (nothing on the host
    changes). System dirs and ``/etc`` never: a root-only file there stays
    unreadable, as does one inside a tree open to others (its own mode bits
    apply, unmapped)."""
    if _under(path, [*rules.SYSTEM_READ, "/etc"]):
        return False
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    need = 0o005 if stat.S_ISDIR(mode) else 0o004
    return mode & need != need
