"""The namespace backend (``--isolation ns``): each run in a world of its own.

Before the OS layer goes on (Landlock, seccomp, no_new_privs and the
capability drop all stay on inside), the sandbox's first process creates
user + mount + pid + net + ipc + uts namespaces with the kernel API (ctypes:
``os.unshare`` is Python >= 3.12 only) and builds a new root from the plan's
grants. What the sandbox then cannot reach is *absent*, not refused:

- a new root (a tmpfs, ``pivot_root``): read-only binds of the granted
  system dirs, interpreter prefixes and read roots; the build dir and the
  write roots read-write; a private tmpfs ``/tmp`` and ``/dev/shm``; a
  minimal ``/dev``; the new pid namespace's own ``/proc``; at each real
  home's path a tmpfs holding **decoy** credentials (the real homes are not
  in the namespace at all);
- one uid mapped: the sandbox is its host uid, never 0 on the host (host
  files of other owners show as the overflow uid). As root, pipguard first
  switches to the overflow uid (65534), and the write roots reach the
  sandbox through idmapped mounts (their owner on disk appears as that uid,
  files it creates belong to the owner on disk): nothing on the host is
  chowned or ACL'ed;
- a net namespace with only ``lo`` (up), unless the plan allows all network;
- pid 1 is pipguard's small init; when the command ends, its status goes out
  at once and everything left in the namespace dies with the namespace (the
  supervisor first records it as lingering, as under ``plain``).

Fork structure (the pid namespace applies to the unsharing process's
*children*)::

    keeper ── F (host pid = the run's first process: the keeper waits for it,
              │   the caller holds its pidfd; exits with the command's status)
              └── I (pid 1 inside: builds the root, reaps, keeps the decoy
                  │   inotify fd, exits when nothing is left)
                  └── C (pid 2 inside: back in pipguard.sandbox.first_process, confines itself
                         and execs the command; the launcher learns its host
                         pid from SCM_CREDENTIALS on the control socket)

Where this follows bubblewrap (containers/bubblewrap ``bubblewrap.c``, read
for this module) and where not:

- follows: the setup order (make ``/`` a slave, a tmpfs on ``/tmp`` as the
  base, ``newroot``/``oldroot`` inside it, ``pivot_root(base, oldroot)``,
  binds from ``/oldroot``, ``/proc`` mounted while the old root is still
  there (the kernel refuses a procfs in a user namespace without a fully
  visible one), ``oldroot`` made rprivate and detached, then the second
  ``pivot_root(".", ".")``); its minimal ``/dev`` (null zero full random
  urandom tty bound from the host, ``fd``/``stdin``... symlinks, ``shm``);
  ``setgroups`` denied before ``gid_map``; ``PR_SET_DUMPABLE`` after a uid
  switch (our /proc files must be ours to write the maps); its
  pid-1-reaper ``do_init`` that reports the initial process's status;
  read-only flags kept together with the ones the kernel locked (we use
  ``mount_setattr``, which changes only the bits named, where bwrap
  re-reads the flags and remounts);
- differs: no setuid mode and no privilege-separated helper — as root we
  create the idmapped mounts first and then become an unprivileged uid, so
  every namespace operation is an unprivileged one; loopback is brought up
  with ``SIOCSIFFLAGS`` (the kernel adds 127.0.0.1 to ``lo`` itself) where
  bwrap speaks rtnetlink; no devpts (so no root mapping needed, bwrap's
  reason for its second user namespace); bwrap's seccomp/caps options are
  pipguard's OS layer, applied after this in the command's process; TIOCSTI
  is handled by the OS layer's seccomp filter and the new session, as
  bwrap's ``--new-session`` does.

Everything here that runs after the fork imports nothing (the caller may
have had other threads) and writes only with ``os.write``.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import signal
import socket
import stat
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from pipguard import rules
from pipguard.sandbox.backends import Part, Probe

name = "ns"

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MS_SLAVE = 1 << 19
MNT_DETACH = 2

AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
MOVE_MOUNT_F_EMPTY_PATH = 4
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_IDMAP = 0x100000

# The newer syscalls have one number on every architecture (>= 403);
# pivot_root does not.
SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
SYS_MOUNT_SETATTR = 442
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}.get(os.uname().machine, 155)

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
IN_OPEN = 0x20
IN_ACCESS = 0x1
IN_ONLYDIR = 0x01000000
IN_CLOEXEC = os.O_CLOEXEC
IN_NONBLOCK = os.O_NONBLOCK

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

#: Decoy credentials. The run's own ``$HOME`` gets these: only files no build
#: tool reads by itself there (``~/.netrc``: meson and curl look it up;
#: ``~/.npmrc``: npm's config; ``~/.gnupg``: gpg verifying a signature), so
#: opening one is always a finding.
HOME_DECOYS: Dict[str, str] = {
    ".ssh/id_rsa": "-----BEGIN OPENSSH PRIVATE KEY-----\npipguard-decoy-{token}\n-----END OPENSSH PRIVATE KEY-----\n",
    ".ssh/id_ed25519": "-----BEGIN OPENSSH PRIVATE KEY-----\npipguard-decoy-{token}\n-----END OPENSSH PRIVATE KEY-----\n",
    ".aws/credentials": "[default]\naws_access_key_id = AKIAPIPGUARDDECOY\naws_secret_access_key = pipguard-decoy-{token}\n",
    ".config/gh/hosts.yml": "github.com:\n    oauth_token: pipguard-decoy-{token}\n",
    ".git-credentials": "https://user:pipguard-decoy-{token}@github.com\n",
    ".pypirc": "[pypi]\nusername = __token__\npassword = pipguard-decoy-{token}\n",
    ".docker/config.json": '{{"auths": {{"registry.example": {{"auth": "pipguard-decoy-{token}"}}}}}}\n',
    ".kube/config": "users:\n- name: decoy\n  user:\n    token: pipguard-decoy-{token}\n",
    ".config/gcloud/application_default_credentials.json": '{{"refresh_token": "pipguard-decoy-{token}"}}\n',
    ".azure/msal_token_cache.json": '{{"AccessToken": "pipguard-decoy-{token}"}}\n',
}
#: Formats a stealer parses before it goes on (Firefox's profiles.ini names the profile
#: directory it then reads; Chrome's Local State holds the key of its Login Data).
_FORMATTED = {
    ".mozilla/firefox/profiles.ini": "[Profile0]\nName=default-release\nIsRelative=1\n"
                                     f"Path={rules.FIREFOX_PROFILE}\nDefault=1\n\n"
                                     "[General]\nStartWithLastProfile=1\nVersion=2\n",
    ".thunderbird/profiles.ini": "[Profile0]\nName=default-release\nIsRelative=1\n"
                                 f"Path={rules.FIREFOX_PROFILE}\nDefault=1\n",
    "Local State": '{{"os_crypt": {{"encrypted_key": "pipguard-decoy-{token}"}}}}\n',
}
_GENERIC = "pipguard-decoy-{token}\n"


def _decoy(rel: str) -> str:
    return _FORMATTED.get(rel) or _FORMATTED.get(rel.rsplit("/", 1)[-1]) or _GENERIC


#: The real homes' tmpfs (nothing but a thief opens a file at a real home's path: ``$HOME``
#: is the run's own) get a decoy for every file of the rule table's credential locations
#: (:func:`pipguard.rules.credential_files`: a store's usual files, generated there); each
#: store directory is watched too (listing it is opening it), by its first file's directory.
DECOY_DIRECTORIES: Dict[str, str] = {store: files[0]
                                     for store, files in rules.CREDENTIAL_STORE_FILES.items()}
DECOYS: Dict[str, str] = dict(HOME_DECOYS)
# a name a stealer tries that is no credential by the table (a name not planted fails with
# ENOENT: with read observation off, that attempt is not reported)
DECOYS[".docker/.token_seed"] = _GENERIC
for _rel in rules.credential_files():
    DECOYS.setdefault(_rel, _decoy(_rel))
# The run's own $HOME also gets the stores no build tool opens (browsers, wallets, keyrings):
# a $HOME-relative ``cat ~/.mozilla/firefox/*/logins.json`` reads a decoy there and is reported
for _rel in rules.credential_files(rules.STEALER_ONLY_STORES):
    HOME_DECOYS.setdefault(_rel, _decoy(_rel))
del _rel
DEV_LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
             "stderr": "/proc/self/fd/2", "ptmx": "pts/ptmx"}


class NamespaceError(Exception):
    """A namespace step failed (raised in the forked process, sent to the launcher)."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint


# ------------------------------------------------------------------- the spec
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


# ------------------------------------------------------------- kernel calls
_libc = ctypes.CDLL(None, use_errno=True)  # loaded before any fork
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.syscall.restype = ctypes.c_long
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_libc.sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _b(path: Optional[str]) -> Optional[bytes]:
    return None if path is None else os.fsencode(path)


def _mount(source: Optional[str], target: str, fstype: Optional[str], flags: int,
           data: Optional[str] = None) -> None:
    _check(_libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data)), f"mount {target}")


def _setattr(path: str, set_bits: int, userns_fd: int = 0, fd: int = AT_FDCWD,
             flags: int = AT_RECURSIVE) -> None:
    """mount_setattr(2): change only the named attributes (the kernel keeps
    the flags it locked for an unprivileged mount namespace)."""
    attr = ctypes.create_string_buffer(struct.pack("=QQQQ", set_bits, 0, 0, userns_fd), 32)
    _check(_libc.syscall(SYS_MOUNT_SETATTR, fd, _b(path), flags, attr, 32), f"mount_setattr {path or fd}")


def why_denied(err: int) -> Tuple[str, str]:
    """(reason, hint) for a failed unprivileged ``unshare(CLONE_NEWUSER)``:
    reads the knobs that deny it (no imports: runs after the fork)."""

    def knob(path: str) -> str:
        try:
            with open(path, "rb") as fh:
                return fh.read().decode().strip()
        except OSError:
            return ""

    if knob("/proc/sys/user/max_user_namespaces") == "0":
        return ("user namespaces are disabled (sysctl user.max_user_namespaces=0)",
                "raise user.max_user_namespaces, or use --isolation os")
    if knob("/proc/sys/kernel/unprivileged_userns_clone") == "0":
        return ("unprivileged user namespaces are disabled (sysctl kernel.unprivileged_userns_clone=0)",
                "enable kernel.unprivileged_userns_clone, or use --isolation os")
    if knob("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
        return ("AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1, "
                "Ubuntu >= 23.10)", "allow it with an AppArmor profile for pipguard's interpreter, or use --isolation os")
    if err == errno.ENOSPC:
        return "the user namespace limit is reached (user.max_user_namespaces)", "use --isolation os"
    if err == errno.EPERM:
        seccomp = ""
        for line in knob("/proc/self/status").splitlines():
            if line.startswith("Seccomp:"):
                seccomp = line.split()[-1]
        if seccomp and seccomp != "0":
            return ("unshare(CLONE_NEWUSER) is refused by a seccomp filter around pipguard "
                    "(e.g. a container runtime's default profile)", "run the container with a profile that allows "
                    "unshare, or use --isolation os")
        return "unshare(CLONE_NEWUSER) is not permitted here", "use --isolation os"
    if err == errno.EINVAL:
        return "the kernel has no user namespaces", "use --isolation os"
    return f"unshare(CLONE_NEWUSER) failed: {os.strerror(err)}", "use --isolation os"


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _become(uid: int, gid: int) -> None:
    """Root to ``uid``/``gid`` for good (supplementary groups dropped). The
    uid change makes us non-dumpable: set it back, or our /proc files (the
    uid and gid maps) stay root's (bwrap does the same)."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)


def _userns_fd(map_uid: int, map_gid: int, host_uid: int, host_gid: int) -> int:
    """As root: a user namespace fd mapping ``map_uid`` -> ``host_uid`` (and
    gids): the idmapping that makes files owned by ``map_uid`` on disk appear
    as ``host_uid``'s through a mount. A throw-away child holds it while we
    write its maps (root may write any map for a child namespace)."""
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            os.close(done_w)
            err = 0 if _libc.unshare(CLONE_NEWUSER) == 0 else ctypes.get_errno()
            os.write(ready_w, b"%d\n" % err)
            os.read(done_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(done_r)
    try:
        err = int(os.read(ready_r, 16).strip() or errno.EPERM)
        if err:
            reason, hint = why_denied(err)
            raise NamespaceError(f"the namespace backend is unavailable: {reason}", hint)
        _write(f"/proc/{pid}/uid_map", f"{map_uid} {host_uid} 1\n")
        _write(f"/proc/{pid}/gid_map", f"{map_gid} {host_gid} 1\n")
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(done_w)
        os.close(ready_r)
        os.waitpid(pid, 0)


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


# ---------------------------------------------------------- the forked side
def _send_error(control_fd: int, message: str, hint: str) -> None:
    text = '{"error": %s, "hint": %s}\n' % (_json_str(message), _json_str(hint))
    data = text.encode()
    try:
        while data:
            data = data[os.write(control_fd, data):]
    except OSError:
        pass


def _json_str(text: str) -> str:
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20:
            out.append("\\u%04x" % ord(ch))
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def enter(spec_json: Mapping[str, Any], control_fd: int) -> Dict[str, Any]:
    """In the sandbox's forked first process, before the OS layer: create
    the namespaces and the new root (see the module docstring). Returns only
    in the command's process (pid 2 inside), with what its status line must
    carry for the launcher (``{"decoy_fd": N, "decoys": {wd: path},
    "tmpfs_fds": {"/tmp": N, "/dev/shm": N}}``, fds of pid 1); the
    other processes end in ``os._exit``. On failure the reason goes to the
    launcher on ``control_fd`` and the process exits 125."""
    spec = NamespaceSpec.from_json(spec_json)
    try:
        trees = _root_trees(spec, spec_json.get("idmap_userns")) if spec.idmap_writes and os.geteuid() == 0 else {}
        if os.geteuid() == 0:
            _become(spec.host_uid, spec.host_gid)
        flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
        if spec.network:
            flags |= CLONE_NEWNET
        if _libc.unshare(CLONE_NEWUSER) != 0:
            reason, hint = why_denied(ctypes.get_errno())
            raise NamespaceError(f"the namespace backend is unavailable: {reason}", hint)
        # one id each way, written by ourselves (an unprivileged process may
        # map exactly its own ids; setgroups must be denied first)
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{spec.host_uid} {spec.host_uid} 1\n")
        _write("/proc/self/gid_map", f"{spec.host_gid} {spec.host_gid} 1\n")
        _check(_libc.unshare(flags & ~CLONE_NEWUSER), "unshare(mount, pid, net, ipc, uts)")
    except NamespaceError as exc:
        _send_error(control_fd, str(exc), exc.hint)
        os._exit(125)
    except OSError as exc:
        _send_error(control_fd, f"the namespace backend failed: {exc}", "use --isolation os")
        os._exit(125)
    status_r, status_w = os.pipe()
    init = os.fork()
    if init != 0:
        _first_process(init, status_r, status_w, control_fd, trees)
    os.close(status_r)
    return _init(spec, trees, status_w, control_fd)


def _first_process(init: int, status_r: int, status_w: int, control_fd: int, trees: Dict[str, int]) -> None:
    """F: wait for the command's status from pid 1 and end with it (the
    keeper reports our status as the command's). Never returns."""
    os.close(status_w)
    os.close(control_fd)
    for fd in trees.values():
        os.close(fd)
    data = b""
    while True:
        try:
            chunk = os.read(status_r, 64)
        except InterruptedError:
            continue
        if not chunk:
            break
        data += chunk
    if data.strip().isdigit():
        status = int(data.strip())
    else:  # pid 1 ended before the command did (its setup failed, or it was killed)
        _pid, status = os.waitpid(init, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # SIGKILL and SIGSTOP have no handler to reset (it raised, and skipped the kill)
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
            os.kill(os.getpid(), sig)
        except (OSError, ValueError):
            pass
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def _init(spec: NamespaceSpec, trees: Dict[str, int], status_w: int, control_fd: int) -> Dict[str, Any]:
    """I, pid 1 of the new pid namespace: build the root, fork the command's
    process (which returns), then reap until nothing is left."""
    try:
        # what lands in our own /tmp and /dev/shm is gone with the namespace: the
        # launcher takes a handle on each (it keeps the tmpfs alive) and lists
        # what the run left there, as files written (discarded ones)
        handles = _build_root(spec, trees)
        tmpfs_fds = {path: fd for path, fd in handles.items() if path in PRIVATE_TMPFS}
        if spec.network:
            _loopback_up()
        name_b = spec.hostname.encode()
        _check(_libc.sethostname(name_b, len(name_b)), "sethostname")
        decoy_fd, decoys = _watch_decoys(spec, handles)
        for path, fd in handles.items():
            if path not in tmpfs_fds:
                os.close(fd)
        _blank_own_strings()
    except (OSError, NamespaceError) as exc:
        _send_error(control_fd, f"the namespace backend could not build the sandbox's root: {exc}",
                    getattr(exc, "hint", "") or "use --isolation os")
        os._exit(125)
    # pid 1 holds pipguard's memory (index credentials among it): once the
    # launcher has taken the decoy watch (pidfd_getfd, a ptrace check that a
    # non-root launcher passes only while we are dumpable), nobody may read it.
    # The command's process holds the write end until its execve (O_CLOEXEC),
    # which comes after the launcher's acknowledgement; it dies with it too.
    handed_r, handed_w = os.pipe2(os.O_CLOEXEC)
    command = os.fork()
    if command == 0:
        os.close(status_w)
        os.close(handed_r)
        os.close(decoy_fd)  # pid 1 keeps it; the launcher takes it from there
        for fd in tmpfs_fds.values():
            os.close(fd)  # the same
        os.setsid()  # a session of its own inside: its pgid is visible to it
        return {"decoy_fd": decoy_fd, "decoys": decoys, "tmpfs_fds": tmpfs_fds}
    os.close(control_fd)
    os.close(handed_w)
    while True:
        try:
            if not os.read(handed_r, 1):
                break
        except InterruptedError:
            continue
    os.close(handed_r)
    # not dumpable: /proc/1/mem and /proc/1/environ become root's (of the host), so even
    # where Landlock's ptrace scope is missing the sandbox's uid cannot open them
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    # pid 1: reap everything; the command's status goes out at once, so the
    # run ends when the command does while the rest is still here to be
    # recorded as lingering (then it is killed, and we exit with nothing left)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            os._exit(0)
        if pid == command:
            try:
                os.write(status_w, b"%d\n" % status)
            except OSError:
                pass
            os.close(status_w)


def _blank_own_strings() -> None:
    """pid 1 is a fork of pipguard: its command line and environment, which
    the sandbox can read at ``/proc/1/cmdline`` (any process may) and
    ``/proc/1/environ``, are pipguard's own — an index URL with credentials
    given as ``-i``, ``PIP_INDEX_URL``. Zero both areas in our own memory
    (the kernel reads them from there; nothing here uses them again), before
    the command's process is forked."""
    fd = os.open("/proc/self/stat", os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    # fields 48-51 (arg_start, arg_end, env_start, env_end); the name, field 2,
    # may hold spaces and parentheses: count from its last ")"
    fields = data[data.rindex(b")") + 2:].split()
    arg_start, arg_end, env_start, env_end = (int(f) for f in fields[45:49])
    for start, end in ((arg_start, arg_end), (env_start, env_end)):
        if 0 < start < end:
            ctypes.memset(start, 0, end - start)


def _newroot(path: str) -> str:
    return "/newroot" + path


def _oldroot(path: str) -> str:
    return "/oldroot" + path


def _ensure_dir(path: str) -> None:
    if not os.path.isdir(path):
        os.makedirs(path, 0o755, exist_ok=True)


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


def _loopback_up() -> None:
    """Bring ``lo`` up (the kernel then gives it 127.0.0.1/8 and ::1)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        req = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))
    finally:
        sock.close()


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


def plant_decoys(home: str, token: str, decoys: Optional[Mapping[str, str]] = None,
                 device: Optional[int] = None) -> List[str]:
    """Write each decoy credential (default: :data:`DECOYS`) below ``home``
    (mode 0600), marked with ``token``; returns those planted. With
    ``device`` (a decoy home's tmpfs), only where the directory is on that
    filesystem: never through a grant bound inside the home
    (``--allow-write ~/.ssh``) onto a real file."""
    planted: List[str] = []
    for rel, template in (DECOYS if decoys is None else decoys).items():
        path = home + "/" + rel
        if device is None:
            _ensure_dir(os.path.dirname(path))
        elif not _dir_on(home, os.path.dirname(rel), device):
            continue
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            os.write(out, template.format(token=token).encode())
        finally:
            os.close(out)
        planted.append(rel)
    return planted


def _dir_on(home: str, rel: str, device: int) -> bool:
    """Make ``home/rel`` a directory, each step checked to be a directory on
    ``device`` (the decoy tmpfs) before anything is made in it: False where a
    step is something else (a grant bound there, a symlink)."""
    path = home
    for part in [p for p in rel.split("/") if p]:
        try:
            st = os.lstat(path)
        except OSError:
            return False
        if st.st_dev != device or not stat.S_ISDIR(st.st_mode):
            return False
        path = path + "/" + part
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            pass
        except OSError:
            return False
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return st.st_dev == device and stat.S_ISDIR(st.st_mode)


# -------------------------------------------------------------- after the run
# What the sandbox wrote may not keep (setuid, setgid, world-write: on the host it is root's)
# is put back after the run by pipguard.sandbox.filemodes, for every backend.


# ------------------------------------------------------------ the launcher side
class DecoyWatch:
    """The decoy inotify fd (taken from pid 1), read by the supervisor's loop
    while the run lasts (:meth:`read` when it is readable: no thread of its
    own): each decoy opened is one record (time, path)."""

    def __init__(self, fd: int, decoys: Mapping[int, str]) -> None:
        self.fd = fd
        self.decoys = {int(k): str(v) for k, v in decoys.items()}
        self.records: List[Tuple[float, str, str]] = []  # (time, path, "open"/"read")

    def fileno(self) -> int:
        return self.fd

    def read(self, chunks: int = 8) -> None:
        """Take in the events queued, at most ``chunks`` reads of 64 KiB (the
        fd is non-blocking; the supervisor's loop comes back while more wait,
        and its other work is not starved by a flood of reads)."""
        for _ in range(chunks):
            try:
                data = os.read(self.fd, 65536)
            except (BlockingIOError, OSError):
                return
            if not data:
                return
            now = time.time()
            offset = 0
            while offset + 16 <= len(data):
                wd, mask, _cookie, size = struct.unpack_from("iIII", data, offset)
                offset += 16 + size
                path = self.decoys.get(wd)
                # a watched directory also reports its entries (with a name): those decoys have their own watch
                if path is not None and mask & (IN_OPEN | IN_ACCESS) and not size:
                    self.records.append((now, path, "open" if mask & IN_OPEN else "read"))

    def stop(self, close: bool = True) -> List[Tuple[float, str, str]]:
        """Read what is left (and close the fd, unless ``close`` is False:
        then :meth:`close` later); the records."""
        self.read(chunks=1 << 16)  # every process is gone: the queue is finite
        if close:
            self.close()
        return self.records

    def close(self) -> None:
        """Close the fd (its last holder: the kernel destroys the inotify
        instance and waits for an SRCU grace period, ~10 ms)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


# ------------------------------------------------------------------ the probe
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
    (:func:`_root_trees`); "" when one of the temp dir (where pip's build
    dirs and every run's own dirs live) can be made here, else why not (the
    filesystem, or a kernel before 5.12)."""
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
