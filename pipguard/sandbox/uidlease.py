"""A sandbox uid held for one run (:class:`Lease`), and the grants made through it.

Grants, for paths the run needs: POSIX ACL entries naming that uid
(:mod:`pipguard.sandbox.acl`) — traverse-only (``x``) on ancestors the uid could
not traverse, read on inputs others cannot read, owner-like rights on the
write roots; pipguard's private temp dir and decoy HOME are chowned to it.
Not chmod: ``o+x`` on ``/root`` or on pip's 0700 temp dirs would open them
to every local user. Not chown of inputs: it would hand the tree to the
sandbox (which could then chmod it or add ACLs of its own) and lose the
original owners. An ACL entry names only the sandbox uid, and the mask is
the union of the group-class entries, so no other user's effective rights
change (an ACL whose mask narrows an entry is refused).

After the run (:meth:`Lease.release`): processes still running as the uid
are killed; files it created in the write roots are given to the write
root's owner, lose setuid/setgid/world-write bits and any ACL naming a
sandbox uid; the entries pipguard added are removed (the mode's group bits
put back); entries it left in ``/tmp``, ``/var/tmp`` and ``/dev/shm`` are
removed. If pipguard is killed mid-run: every change is journaled in the
lease file *before* it is made, and the next run that leases the uid undoes
it first (lowest free uid first, so that is usually the next run). Until
then the stale entries name a uid that no account has.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import stat
from dataclasses import dataclass
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple

from pipguard import rules
from pipguard.errors import SandboxUserError
from pipguard.sandbox import acl, files
from pipguard.sandbox.sandbox_user import STATE_DIRS, UIDS, SandboxUser, kill_all, maps, needed, state_dir, usable

#: world-writable dirs a sandbox could leave files in without Landlock
SHARED_TMP = ("/tmp", "/var/tmp", "/dev/shm")
#: the ACL permission bits
R, W, X = 4, 2, 1


#: ``top`` and everything below it on the same filesystem (pipguard.sandbox.files.entries): this walks
#: each hook call's build environment, ~1,000-5,000 entries, so its cost is paid per call
_walk = files.entries


def _read_perm(st: os.stat_result) -> int:
    """What reading an entry like its owner takes: the owner's bits minus
    write, and traversal for a directory."""
    return acl.owner_perm(st.st_mode) & ~W | (X if stat.S_ISDIR(st.st_mode) else 0)


def _needs_grant(st: os.stat_result) -> bool:
    perm = _read_perm(st)
    return bool(perm) and not stat.S_ISLNK(st.st_mode) and not acl.effective_other(st.st_mode, perm)


#: Directories anybody may traverse, as seen once (/, /tmp, /usr...: the ancestors of every
#: grant, ~20 paths a call, each an lstat). Not checked again: if one stops being
#: traversable, its grant is left out and the sandbox's access fails closed -- never more.
_traversable: Set[str] = set()

#: tree -> (every directory's (path, mtime_ns) as listed, the entries that needed a read grant)
_read_walks: Dict[str, Tuple[Tuple[Tuple[str, int], ...], Tuple[str, ...]]] = {}


def _read_walk(top: str) -> Iterator[Tuple[str, os.stat_result]]:
    """The entries of the tree ``top`` that a read grant has to touch.

    Each hook call of an install reads the same build environment (~800-5,000
    entries, written by pip, not writable by any sandbox): walking it costs
    one ``lstat`` per entry, 6-40 ms a call. So the walk is remembered, and
    reused while no directory of the tree changed (every added, removed or
    renamed entry changes its directory's mtime): then only the directories
    are stat'ed, and the entries that needed a grant. What this cannot see --
    a file's mode changed in place by chmod -- can only leave a grant out,
    which fails closed (the read is refused and reported), never grant more."""
    known = _read_walks.get(top)
    if known is not None:
        try:
            unchanged = all(os.lstat(d).st_mtime_ns == m for d, m in known[0])
        except OSError:
            unchanged = False
        if unchanged:
            for path in known[1]:
                try:
                    yield path, os.lstat(path)
                except OSError:
                    continue
            return
    directories: List[Tuple[str, int]] = []
    needed: List[str] = []
    for path, st in _walk(top):
        if stat.S_ISDIR(st.st_mode):
            directories.append((path, st.st_mtime_ns))  # taken before the directory is listed
        if _needs_grant(st):
            needed.append(path)
            yield path, st
    if len(_read_walks) >= 64:  # a bound for long-lived callers of run(): drop the oldest
        del _read_walks[next(iter(_read_walks))]
    _read_walks[top] = (tuple(directories), tuple(needed))


def _shared_inode(st: os.stat_result) -> bool:
    """A file with more than one name: granting it would grant its other
    names too, wherever they are (a hard link to /etc/shadow in a source
    tree). Never granted; the sandbox may still replace it in a writable dir."""
    return not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1


def _ancestors(path: str) -> List[str]:
    out = []
    path = os.path.dirname(path)
    while True:
        out.append(path)
        if path == "/":
            break
        path = os.path.dirname(path)
    return out[::-1]


class Lease:
    """One sandbox uid held for one run (a ``flock`` on its lease file, so a
    killed pipguard frees it). Grants made through it are journaled in the
    lease file and undone by :meth:`release`, or by the next holder."""

    def __init__(self, user: SandboxUser, fd: int, state_dir: str) -> None:
        self.user = user
        self._fd = fd
        self._state_dir = state_dir
        self._granted: set = set()
        self.cleanup_notes: List[str] = []
        #: the shared temp dirs' mtimes before the sandbox could run (see undo)
        self._shared_tmp = _mtimes(SHARED_TMP)

    # -- journal -----------------------------------------------------------------------------
    def _log(self, **entry) -> None:
        data = (json.dumps(entry) + "\n").encode()
        while data:
            data = data[os.write(self._fd, data):]


    # -- grants ------------------------------------------------------------------------------
    def _grant(self, path: str, st: os.stat_result, perm: int) -> None:
        if stat.S_ISLNK(st.st_mode) or acl.effective_other(st.st_mode, perm) or not perm:
            return
        if _shared_inode(st):
            self.cleanup_notes.append(f"not granted (hard-linked): {path}")
            return
        key = (st.st_dev, st.st_ino)
        self._log(op="acl", path=path, dev=st.st_dev, ino=st.st_ino, had=None)  # before the change
        try:
            had = acl.grant_user(path, self.user.uid, perm)
        except acl.AclError as exc:
            raise SandboxUserError(f"cannot let the sandbox user reach {path}: {exc.strerror}",
                                   hint="build in a directory on a filesystem with POSIX ACLs, "
                                        "or run pipguard as an unprivileged user") from exc
        except OSError as exc:
            raise SandboxUserError(f"cannot let the sandbox user reach {path}: {exc.strerror}") from exc
        if key not in self._granted:
            self._granted.add(key)
            self._log(op="acl", path=path, dev=st.st_dev, ino=st.st_ino, had=had)

    def traverse(self, path: str) -> None:
        """Let the uid reach ``path`` by name: ``x`` on every ancestor (of its
        spelling and of its real path) that it could not traverse."""
        for spelling in dict.fromkeys((os.path.abspath(path), os.path.realpath(path))):
            for d in _ancestors(spelling):
                if d in _traversable:
                    continue
                try:
                    st = os.lstat(d)
                except OSError:
                    break
                if stat.S_ISDIR(st.st_mode):
                    if acl.effective_other(st.st_mode, X):
                        _traversable.add(d)
                    else:
                        self._grant(d, st, X)

    def readable(self, path: str, *, recursive: bool) -> None:
        """Reach ``path`` and read it (and, ``recursive``, everything below)
        like its owner can, minus writing."""
        self.traverse(path)
        target = os.path.realpath(path)
        entries = _read_walk(target) if recursive else _walk_one(target)
        for p, st in entries:
            self._grant(p, st, _read_perm(st))

    def writable(self, path: str) -> None:
        """Owner-like rights on the tree ``path``; files the sandbox creates
        there are given to the owner of ``path`` after the run."""
        target = os.path.realpath(path)
        try:
            st = os.lstat(target)
        except OSError:
            return
        self.traverse(target)
        self._log(op="own", path=target, uid=st.st_uid, gid=st.st_gid)
        for p, st in _walk(target):
            perm = acl.owner_perm(st.st_mode) | (R | W | X if p == target and stat.S_ISDIR(st.st_mode) else 0)
            self._grant(p, st, perm)

    def file(self, path: str, perm: int) -> None:
        """Reach one file with ``perm`` (the event FIFO: write only)."""
        self.traverse(path)
        self._grant(path, os.lstat(path), perm)

    def give(self, path: str) -> None:
        """chown a private directory of the run to the uid (it is removed with the run)."""
        self.traverse(path)
        self._log(op="private", path=path)
        os.chown(path, self.user.uid, self.user.gid)

    # -- undo --------------------------------------------------------------------------------
    def release(self, nothing_left: bool = False) -> None:
        """Undo every grant, normalise what the uid left, free the uid. Call
        after the sandbox ended (it kills what still runs as the uid).
        ``nothing_left``: the caller knows no process of the run is alive (its
        cgroup is empty; no process of the uid can leave it), so the scan of
        every process on the host for the uid (~100-300 /proc reads) is skipped."""
        if self._fd < 0:
            return
        try:
            undo(self.user, _journal(self._fd), self.cleanup_notes, self._shared_tmp, kill=not nothing_left)
            os.ftruncate(self._fd, 0)
        finally:
            os.close(self._fd)
            self._fd = -1


@contextlib.contextmanager
def acl_lock() -> Iterator[None]:
    """Hold pipguard's host-wide ACL lock: read-modify-writes of ACLs on a
    shared ancestor (/root, a shared temp dir) by different runs — or by
    anything else that grants with :mod:`pipguard.sandbox.acl` — must not interleave."""
    fd = os.open(os.path.join(state_dir(), "acl.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _walk_one(path: str) -> Iterator[Tuple[str, os.stat_result]]:
    try:
        yield path, os.lstat(path)
    except OSError:
        return


def _journal(fd: int) -> List[dict]:
    os.lseek(fd, 0, os.SEEK_SET)
    data = b""
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        data += chunk
    os.lseek(fd, 0, os.SEEK_END)
    out = []
    decoder = json.JSONDecoder()
    # decoded once (json.loads of bytes detects the encoding again for every line)
    for line in data.decode("utf-8", "surrogateescape").splitlines():
        try:
            out.append(decoder.decode(line))
        except ValueError:
            continue  # a line cut by a kill
    return out


def _normalise_owned(root: str, uid: int, owner: Tuple[int, int], notes: List[str]) -> None:
    for path, st in _walk(root):
        if st.st_uid != uid and st.st_gid != uid:
            continue
        try:
            os.chown(path, owner[0], owner[1], follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                continue
            for default in (False, True):
                if acl.names_user(path, UIDS, default=default):
                    os.removexattr(path, "system.posix_acl_default" if default else acl.XATTR,
                                   follow_symlinks=False)
            mode = stat.S_IMODE(st.st_mode)
            clean = mode & ~rules.CLEARED_MODES
            if stat.S_ISDIR(st.st_mode) and mode & stat.S_ISGID and _setgid_dir(os.path.dirname(path)):
                clean |= stat.S_ISGID  # inherited from a setgid directory, as the kernel does (a shared dir)
            os.chmod(path, clean)
            if clean != mode:
                notes.append(f"{path}: mode {mode:o} -> {clean:o}")
        except OSError:
            continue


def _setgid_dir(path: str) -> bool:
    try:
        return bool(os.lstat(path).st_mode & stat.S_ISGID)
    except OSError:
        return False


def _mtimes(directories: Sequence[str]) -> Dict[str, int]:
    out = {}
    for d in directories:
        try:
            out[d] = os.stat(d).st_mtime_ns
        except OSError:
            pass
    return out


def undo(user: SandboxUser, journal: Sequence[dict], notes: Optional[List[str]] = None,
         shared_tmp_before: Optional[Dict[str, int]] = None, kill: bool = True) -> None:
    """Undo a journal (of this run, or of a run that was killed).

    ``shared_tmp_before``: the mtimes of :data:`SHARED_TMP` taken when the
    lease was made, before the sandbox could run. A directory whose mtime is
    the same has had no entry added, removed or renamed since, so the sandbox
    left nothing at its top level and it is not scanned (/tmp of a busy host
    holds hundreds of entries: a stat each, every hook call). A killed run's
    journal has none: every directory is scanned."""
    notes = [] if notes is None else notes
    if kill:
        kill_all(user.uid)
    with acl_lock():
        for entry in journal:
            if entry.get("op") == "own":
                _normalise_owned(entry["path"], user.uid, (entry["uid"], entry["gid"]), notes)
        done = set()
        final = {}  # path -> the "had" answer recorded after the grant, if any
        for entry in journal:
            if entry.get("op") == "acl" and entry.get("had") is not None:
                final[(entry["path"], entry["dev"], entry["ino"])] = entry["had"]
        for entry in reversed(journal):
            op = entry.get("op")
            if op == "acl":
                key = (entry["path"], entry["dev"], entry["ino"])
                if key in done:
                    continue
                done.add(key)
                try:
                    st = os.lstat(entry["path"])
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) != (entry["dev"], entry["ino"]) or stat.S_ISLNK(st.st_mode):
                    continue
                # a grant cut short by a kill: whether an ACL existed before is
                # unknown; keep one only if it names anybody else
                try:
                    acl.revoke_user(entry["path"], user.uid, bool(final.get(key, False)))
                except OSError:
                    continue
            elif op == "private":
                path = entry["path"]
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if stat.S_ISDIR(st.st_mode) and st.st_uid == user.uid:
                    shutil.rmtree(path, ignore_errors=True)
        after = _mtimes(SHARED_TMP)
        for d in SHARED_TMP:
            if shared_tmp_before is None or d not in after or shared_tmp_before.get(d) != after[d]:
                _remove_owned_entries(d, user.uid, notes)


def _remove_owned_entries(directory: str, uid: int, notes: List[str]) -> None:
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if st.st_uid != uid:
            continue
        notes.append(f"removed {entry.path} (left by the sandbox user)")
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            try:
                os.unlink(entry.path)
            except OSError:
                pass


def lease(candidates: Iterable[int] = UIDS) -> Lease:
    """Lease the lowest free sandbox uid. Undoes a previous holder's journal
    first (a pipguard killed mid-run)."""
    state = state_dir()
    found = maps()
    for n in candidates:
        if not usable(n, found):
            continue
        path = os.path.join(state, f"uid-{n}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                continue
            raise
        user = SandboxUser(n, n)
        # A pipguard killed mid-run leaves its journal (written before the
        # sandbox starts), and maybe processes: undo both before reuse.
        stale = _journal(fd)
        if stale:
            undo(user, stale)
            os.ftruncate(fd, 0)
        return Lease(user, fd, state)
    raise SandboxUserError(f"no free sandbox uid in {UIDS.start}-{UIDS.stop - 1} (mapped, not in passwd/group/subuid)",
                           hint="run pipguard as an unprivileged user, or in a user namespace that maps that range")


@dataclass(frozen=True)
class Restored:
    """What :func:`replay_stale` undid of one killed run: its uid, the trees it had made
    writable for the sandbox (the project, the build dir), and every path of its grants
    (those trees' files, the ancestors it could traverse, its run dir)."""

    uid: int
    writable: Tuple[str, ...]
    paths: Tuple[str, ...]


#: replay_stale ran in this process (a killed run's journal predates this process)
_replayed = False


def replay_stale(*, again: bool = False) -> List[Restored]:
    """Undo the journal of every lease whose pipguard was killed (its lock is free, its
    journal not empty): the ACL entries it granted, the files its uid left, its processes.
    The next lease of that same uid did this, but only under a backend that leases (root,
    ``--isolation os|audit``): a default (ns) run or ``doctor`` left the grants, rwx on the
    project, x on ``/root``, in place for good. Now every run (any backend, once per
    process: ``again`` for ``doctor``, which asks each time) replays them first. A live
    run's lease is locked and left alone. Root only (the leases are root's); never raises
    for one lease (the next is tried)."""
    global _replayed
    if _replayed and not again:
        return []
    _replayed = True
    if not needed():
        return []
    restored: List[Restored] = []
    for state in STATE_DIRS:
        try:
            st = os.lstat(state)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o077:
                continue  # not a state dir of ours: lease() says so when a run needs it
            names = os.listdir(state)
        except OSError:
            continue
        for name in sorted(names):
            number = name[len("uid-"):] if name.startswith("uid-") else ""
            if number.isdigit() and int(number) in UIDS:
                done = _replay_one(os.path.join(state, name), int(number))
                if done is not None:
                    restored.append(done)
    return restored


def _replay_one(path: str, uid: int) -> Optional[Restored]:
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return None  # a live run holds it
        stale = _journal(fd)
        if not stale:
            return None
        undo(SandboxUser(uid, uid), stale)
        os.ftruncate(fd, 0)
        return Restored(uid, tuple(dict.fromkeys(str(e["path"]) for e in stale if e.get("op") == "own")),
                        tuple(dict.fromkeys(str(e["path"]) for e in stale if "path" in e)))
    except (OSError, KeyError, TypeError, ValueError, SandboxUserError):
        return None  # a journal it cannot undo now is left for the next pipguard
    finally:
        os.close(fd)


def prepare(plan, allow_read: Sequence[str] = ()) -> Lease:
    """Lease a uid and grant it what ``plan`` needs: its private temp dir and
    HOME (chowned), the event FIFO (write), the write roots (owner-like),
    the command, interpreter and read roots (``allow_read`` recursively).
    Raises :class:`SandboxUserError`; on failure nothing stays granted."""
    held = lease()
    try:
        private = {plan.tmp_dir, plan.home_dir}
        with acl_lock():
            for d in (plan.tmp_dir, plan.home_dir):
                held.give(d)
            held.file(plan.fifo, W)
            for root in plan.write_roots:
                if root not in private:
                    held.writable(root)
            if plan.cwd not in plan.write_roots:
                held.readable(plan.cwd, recursive=True)
            recursive = {os.path.realpath(p) for p in allow_read}
            for root in plan.read_roots:
                held.readable(root, recursive=os.path.realpath(root) in recursive)
            for exe in dict.fromkeys((plan.executable, os.path.realpath(plan.executable))):
                held.readable(exe, recursive=False)
    except BaseException:
        held.release()
        raise
    return held
