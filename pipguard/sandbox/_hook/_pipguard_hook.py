"""pipguard's PEP 578 audit hook, installed in every Python process of a run.

Why one file of ~1,300 lines: it is loaded by path into every Python process of a run,
before the program's own code. One file costs one lookup on ``sys.path`` and one read of
its ``.pyc`` (or one compile, where no ``.pyc`` matches the interpreter). Each module split
off would add its own lookup and read to every interpreter's start (~0.1 ms each here,
measured with ``-X importtime``), and one more ``sys.modules`` entry to remove. The whole
hook adds ~1.4 ms to one Python start (docs/performance.md: 9.6 → 11.0 ms, a bare start).

This file is imported by ``sitecustomize.py`` (via PYTHONPATH) or by
``_pipguard_boot.py`` (argv rewrite) inside the sandboxed interpreter. It must
run on any CPython >= 3.9 with the standard library only: the sandboxed
interpreter need not have pipguard installed.

The hook is a *sensor* that also vetoes: it raises ``PermissionError`` before
a denied action and reports a structured event on the run's event FIFO. It is
not a boundary on its own (CPython's docs say so; ctypes and native code walk
past it) — the OS layer is. What it adds is attribution to Python code.

Tamper resistance, and its limits:
- the hook and its file-event path keep their state in *default arguments*
  (a frame's ``f_locals`` cannot rebind them; reading ``__defaults__`` is
  vetoed); the hook deletes its locals before it raises, so the traceback of
  a denial leads to none of its helpers (whose closure cells are writable);
- no module globals are read at event time and builtins are a private copy;
  the standard-library functions it needs (``os.lstat``, ``os.readlink``...)
  are captured when it is installed, so monkeypatching ``os``/``posixpath``/
  ``builtins`` later changes nothing; str/bytes subclasses are copied to
  plain strings before any method of theirs runs;
- this module removes itself from ``sys.modules``;
- replacing the code or defaults of its functions, and the ``gc``
  introspection that would find them, are vetoed and reported.
Residual: code that runs *inside* the hook (an ``__fspath__``, a later audit
hook, ``sys.monitoring`` callbacks) can reach its live frames; ctypes can do
anything in-process. Both are contained by the OS layer.

Speed: resolving a path costs one ``lstat`` per component. Directories and
files already resolved are remembered by their string together with their
(st_dev, st_ino); a later use re-validates that identity with one
``stat``/``lstat``, so a path whose meaning changed (a symlink swapped in) is
resolved again. A directory keeps its inode while it lives, so the only way
to fool this is to move or recreate one at a different place; renames and
removals made through Python drop the caches.
"""

import os
import sys

# Private builtins: functions defined below look isinstance, len... up here.
globals()["__builtins__"] = dict(vars(sys.modules["builtins"]))

ENV_CONFIG = "PIPGUARD_HOOK"
_PIPE_BUF = 4000  # keep each event line below PIPE_BUF so writes are atomic
_CACHE_MAX = 4096  # entries per resolution cache; cleared when full

# Audit events this hook cares about; every other event returns at once.
_FILE_EVENTS = frozenset(
    (
        "open", "os.listdir", "os.scandir", "os.rename", "os.link", "os.symlink",
        "os.mkdir", "os.remove", "os.rmdir", "os.truncate", "os.chmod", "os.chown",
        "os.utime", "shutil.copyfile", "shutil.rmtree", "sqlite3.connect",
    )
)
_NET_EVENTS = frozenset(
    (
        "socket.connect", "socket.sendto", "socket.sendmsg", "socket.bind",
        "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr",
        "socket.getnameinfo",
    )
)
_PROC_EVENTS = frozenset(
    (
        "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
        "os.fork", "os.forkpty", "pty.spawn", "os.kill", "os.killpg",
    )
)
_TAMPER_EVENTS = frozenset(
    ("gc.get_objects", "gc.get_referrers", "gc.get_referents", "object.__setattr__",
     "object.__getattr__", "sys.settrace", "sys.setprofile")
)
_ALL_EVENTS = _FILE_EVENTS | _NET_EVENTS | _PROC_EVENTS | _TAMPER_EVENTS

# The rule table (credential, configuration and startup paths, system secrets,
# private /proc entries) is pipguard/rules.py, the one source for every
# enforcer; it arrives here as data in the config ("rules"), since this module
# runs in interpreters that need not have pipguard installed.
_PYTHON_NAMES = ("python", "pypy")
# Python options that take a value; -c and -m end the option list.
_PY_OPT_WITH_VALUE = frozenset("WXQ")


def _make_hook(config, dumps=None):
    """Build the hook and its immutable state from the decoded config."""
    import _thread
    from time import time as now

    # Everything the hook uses at event time is bound here, once: later
    # changes to this module's globals or to os/posixpath change nothing.
    lstat, stat, readlink, getcwd, fspath = os.lstat, os.stat, os.readlink, os.getcwd, os.fspath
    O_WRONLY, O_RDWR, O_CREAT, O_TRUNC, O_APPEND, O_CLOEXEC = (
        os.O_WRONLY, os.O_RDWR, os.O_CREAT, os.O_TRUNC, os.O_APPEND, os.O_CLOEXEC)
    table = config["rules"]  # no table, no hook: install() fails loudly rather than judge by nothing
    CREDENTIAL_PATHS, SYSTEM_SECRETS = tuple(table["credentials"]), tuple(table["etc_secrets"])
    PERSISTENCE_PATHS, CONFIG_LOOKUPS = tuple(table["persistence"]), tuple(table["config"])
    PROC_PRIVATE, MESSAGES = frozenset(table["proc_private"]), dict(table["messages"])
    PIPE_BUF, CACHE_MAX = _PIPE_BUF, _CACHE_MAX
    PYTHON_NAMES, PY_OPT_WITH_VALUE = _PYTHON_NAMES, _PY_OPT_WITH_VALUE
    CONFIG_NAME, is_numeric, Denied = ENV_CONFIG, _is_numeric, PermissionError
    os_write, os_open, getpid, getppid = os.write, os.open, os.getpid, os.getppid
    fs_encoding, fs_errors = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()
    getframe = sys._getframe
    allocate_lock = _thread.allocate_lock
    if dumps is None:
        dumps = _json_codec()[1]

    # os.fsdecode/fsencode look os.fspath up at call time: these do not.
    def fsdecode(value, _fspath=fspath, _decode=bytes.decode, _enc=fs_encoding, _err=fs_errors):
        value = _fspath(value)
        return _decode(value, _enc, _err) if isinstance(value, bytes) else value

    def fsencode(value, _fspath=fspath, _encode=str.encode, _enc=fs_encoding, _err=fs_errors):
        value = _fspath(value)
        return _encode(value, _enc, _err) if isinstance(value, str) else value

    def plain(value, _join="".join):
        """A str subclass copied to a str (its methods are the program's)."""
        if type(value) is str:
            return value
        return _join((value,)) if isinstance(value, str) else str(value)

    def norm_roots(paths):
        return tuple(sorted({p.rstrip("/") or "/" for p in paths}))

    homes = norm_roots(config.get("homes", ()))
    sandbox_home = config.get("sandbox_home", "").rstrip("/")
    read_roots = norm_roots(config.get("read", ()))
    write_roots = norm_roots(config.get("write", ()))
    write_files = frozenset(config.get("write_files", ()))
    # ns: the namespace's own /tmp and /dev/shm, writable (a tmpfs that goes with the run) but
    # no grant for the read rules (pip's temp area below them stays a foreign-read)
    own_tmpfs = norm_roots(config.get("own_tmpfs", ()))
    private_roots = norm_roots(config.get("private", ()))
    prefix_set = frozenset(norm_roots(config.get("prefixes", ())))
    network = config.get("network", "none")
    allow_hosts = frozenset(config.get("hosts", ()))
    subprocess_ok = bool(config.get("subprocess", True))
    supervisor_pid = int(config.get("supervisor_pid", 0))
    fifo_path = config.get("fifo", "")
    hook_dir = config.get("hook_dir", "")
    config_text = config.get("_text", "")
    boot_script = os.path.join(hook_dir, "_pipguard_boot.py") if hook_dir else ""
    stdlib_dirs = tuple(
        d for d in {os.path.dirname(os.__file__)} if d
    )
    own_files = (__file__.rstrip("c"), os.path.join(hook_dir, "sitecustomize.py"),
                 boot_script)
    # Mutable reporting state (not policy): the lazily opened FIFO fd.
    channel = [None]
    lock = allocate_lock()

    # The policy's path sets, precomputed so that a check is a few set
    # lookups and str.startswith(tuple) calls. "under(path, roots)" is
    # ``path in exact or path.startswith(prefixes) or everything``.
    def roots_sets(roots):
        return frozenset(roots), tuple(r + "/" for r in roots), "/" in roots

    cred_names, pers_names = frozenset(CREDENTIAL_PATHS), frozenset(PERSISTENCE_PATHS)
    config_names = frozenset(CONFIG_LOOKUPS)
    secret_set, secret_under = frozenset(SYSTEM_SECRETS), tuple(s + "/" for s in SYSTEM_SECRETS)
    home_set, home_under, home_all = roots_sets(homes)
    private_set, private_under, _private_all = roots_sets(private_roots)
    rw_set, rw_under, rw_all = roots_sets(read_roots + write_roots)
    w_set, w_under, w_all = roots_sets(write_roots)
    own_set, own_under, _own_all = roots_sets(own_tmpfs)

    all_names = CREDENTIAL_PATHS + PERSISTENCE_PATHS + CONFIG_LOOKUPS

    def in_homes(path, names, _homes=tuple(h + "/" for h in homes + ((sandbox_home,) if sandbox_home else ())),
                 _heads=frozenset(n.split("/")[0] for n in all_names if "/" in n),
                 _depth=max(n.count("/") for n in all_names)):
        """Is path one of ``names`` (or below one) relative to a home?"""
        if not path.startswith(_homes):
            return False
        for home in _homes:
            if path.startswith(home):
                rel = path[len(home):]
                end = rel.find("/")
                if end < 0:
                    if rel in names:
                        return True
                    continue
                head = rel[:end]
                if head in names:
                    return True
                if head not in _heads:  # the first component of a longer name?
                    continue
                for _ in range(_depth):
                    end = rel.find("/", end + 1)
                    head = rel if end < 0 else rel[:end]
                    if head in names:
                        return True
                    if end < 0:
                        break
        return False

    def under(path, roots):
        for root in roots:
            if path == root or path.startswith(root + "/") or root == "/":
                return True
        return False

    def as_text(path, _fspath=fspath, _decode=bytes.decode, _join="".join, _enc=fs_encoding,
                _err=fs_errors):
        """``path`` as a plain str: bytes decoded as os.fsdecode does, a str
        subclass copied so that none of its methods runs in the checks."""
        kind = type(path)
        if kind is str:
            return path
        if kind is not bytes:
            path = _fspath(path)
            kind = type(path)
            if kind is str:
                return path
            if issubclass(kind, str):
                return _join((path,))
        return _decode(path, _enc, _err)

    def resolve(path, cwd=None, follow_last=True, _lstat=lstat, _readlink=readlink,
                _getcwd=getcwd, _text=as_text):
        """Physical absolute path, resolved with captured primitives only."""
        if type(path) is not str:
            path = _text(path)
        if not path.startswith("/"):
            path = (cwd or _getcwd()) + "/" + path
        parts = path.split("/")
        done = ""
        hops = 0
        todo = [p for p in parts if p]
        todo.reverse()
        while todo:
            name = todo.pop()
            if name == ".":
                continue
            if name == "..":
                done = done[: done.rfind("/")]
                continue
            candidate = done + "/" + name
            if not todo and not follow_last:
                done = candidate
                break
            try:
                st = _lstat(candidate)
            except OSError:
                done = candidate
                rest = [p for p in todo if p]
                rest.reverse()
                for p in rest:
                    if p == "..":
                        done = done[: done.rfind("/")]
                    elif p != ".":
                        done = done + "/" + p
                break
            if st.st_mode & 0o170000 == 0o120000:  # S_ISLNK
                hops += 1
                if hops > 40:
                    return candidate
                try:
                    target = _readlink(candidate)
                except OSError:
                    done = candidate
                    continue
                if not target.startswith("/"):
                    if target.startswith(("pipe:", "socket:", "anon_inode:")):
                        return target
                    # relative: resolved against the link's directory (done)
                else:
                    done = ""
                more = [p for p in target.split("/") if p]
                more.reverse()
                todo.extend(more)
                continue
            done = candidate
        return done or "/"

    # Resolution caches: path string as the program gave it (absolute or
    # relative to the cwd) -> (st_ino, st_dev, physical path). A hit counts
    # only if the path still leads to that inode (stat for directories,
    # lstat and one link for files); see the module docstring.
    files, dirs = {}, {}

    def same_dir(path, hit, stat_fn):
        """Does ``path`` still lead to the directory cached as ``hit``?"""
        try:
            st = stat_fn(path)
        except OSError:
            return False
        return st.st_ino == hit[0] and st.st_dev == hit[1]

    def locate_dir(path, _dirs=dirs, _stat=stat, _lstat=lstat, _getcwd=getcwd,
                   _resolve=resolve, _max=CACHE_MAX, _same=same_dir):
        """Physical path of the directory ``path``, or None (caller falls back
        to resolve()): the deepest cached ancestor still valid, then one
        lstat per component below it."""
        pending = []
        while True:
            hit = _dirs.get(path)
            if hit is not None:
                if _same(path, hit, _stat):
                    base = hit[2]
                    break
                _dirs.pop(path, None)
            if path == "/":
                base = "/"
                break
            if path == ".":
                try:
                    base = _getcwd()
                    st = _lstat(base)
                except OSError:
                    return None
                if not base.startswith("/") or st.st_mode & 0o170000 != 0o040000:
                    return None
                if len(_dirs) >= _max:
                    _dirs.clear()
                _dirs["."] = (st.st_ino, st.st_dev, base)
                break
            cut = path.rfind("/")
            if cut > 0:
                parent, name = path[:cut], path[cut + 1:]
            elif cut == 0:
                parent, name = "/", path[1:]
            else:
                parent, name = ".", path
            if not name or name == "." or name == ".." or len(pending) > 64:
                return None
            pending.append((path, name))
            path = parent
        while pending:
            path, name = pending.pop()
            target = base + "/" + name if base != "/" else "/" + name
            try:
                st = _lstat(target)
            except OSError:
                return None
            if st.st_mode & 0o170000 == 0o120000:
                target = _resolve(path)  # a symlinked directory (/proc/self, lib64): once
                try:
                    st = _lstat(target)
                except OSError:
                    return None
            if st.st_mode & 0o170000 != 0o040000:
                return None
            if len(_dirs) >= _max:
                _dirs.clear()
            _dirs[path] = (st.st_ino, st.st_dev, target)
            base = target
        return base

    def locate(path, follow=True, _files=files, _dirs=dirs, _stat=stat, _lstat=lstat,
               _dir=locate_dir, _resolve=resolve, _max=CACHE_MAX, _same=same_dir):
        """``resolve(path, follow_last=follow)`` for a str, in one or two
        system calls when the caches know the path or its directory."""
        if follow:
            hit = _files.get(path)
            if hit is not None:
                try:
                    st = _lstat(path)
                except OSError:
                    st = None
                # one link only: a second name elsewhere could lead here too
                if (st is not None and st.st_ino == hit[0] and st.st_dev == hit[1]
                        and st.st_nlink == 1 and st.st_mode & 0o170000 == 0o100000):
                    return hit[2]
                _files.pop(path, None)
            hit = _dirs.get(path)
            if hit is not None:
                if _same(path, hit, _stat):
                    return hit[2]
                _dirs.pop(path, None)
        cut = path.rfind("/")
        if cut > 0:
            parent, name = path[:cut], path[cut + 1:]
        elif cut == 0:
            parent, name = "/", path[1:]
        else:
            parent, name = ".", path
        if not name or name == "." or name == "..":
            return _resolve(path, None, follow)
        base = None
        hit = _dirs.get(parent)  # the common case of locate_dir(), inline
        if hit is not None:
            if _same(parent, hit, _stat):
                base = hit[2]
            else:
                _dirs.pop(parent, None)
        if base is None:
            base = _dir(parent)
        if base is None:
            return _resolve(path, None, follow)
        full = base + "/" + name if base != "/" else "/" + name
        if not follow:
            return full
        try:
            st = _lstat(full)
        except OSError:
            return full  # as resolve(): a missing last component is kept as is
        kind = st.st_mode & 0o170000
        if kind == 0o120000:
            return _resolve(path)
        if kind == 0o100000:
            if st.st_nlink == 1 and not full.startswith("/proc/"):
                if len(_files) >= _max:
                    _files.clear()
                _files[path] = (st.st_ino, st.st_dev, full)
        elif kind == 0o040000:
            if len(_dirs) >= _max:
                _dirs.clear()
            _dirs[path] = (st.st_ino, st.st_dev, full)
        return full

    def python_frame():
        try:
            frame = getframe(2)
        except ValueError:
            return ""
        first = ""
        depth = 0
        while frame is not None and depth < 64:
            code = frame.f_code
            name = code.co_filename
            if name not in own_files:
                where = "%s:%d" % (name, frame.f_lineno)
                if not first:
                    first = where
                if not name.startswith(stdlib_dirs) and not name.startswith("<frozen"):
                    return where
            frame = frame.f_back
            depth += 1
        return first

    def emit(kind, action, target, rule, detail=None):
        record = {
            "kind": kind, "action": action, "target": target, "rule": rule,
            "pid": getpid(), "ppid": getppid(), "time": now(), "layer": "audit",
            "python": python_frame(), "detail": detail or {},
        }
        line = dumps(record)
        if len(line) > PIPE_BUF:
            record["target"] = target[:512]
            record["detail"] = {"truncated": True}
            line = dumps(record)[:PIPE_BUF]
        data = (line + "\n").encode("utf-8", "replace")
        with lock:
            if channel[0] is None:
                if not fifo_path:
                    return
                try:
                    channel[0] = os_open(fifo_path, O_WRONLY | O_CLOEXEC)
                except OSError:
                    channel[0] = -1
            if channel[0] >= 0:
                try:
                    os_write(channel[0], data)
                except OSError:
                    pass

    def deny(kind, target, rule, why, detail=None):
        emit(kind, "blocked", target, rule, detail)
        return "pipguard blocked %s of %s (rule %s): %s" % (kind, target, rule, why)

    def proc_other(path, _getpid=getpid, _private=PROC_PRIVATE):
        parts = path.split("/")
        if len(parts) < 4 or not parts[2].isdigit():
            return False
        if int(parts[2]) == _getpid():
            return False
        if parts[3] == "task" and len(parts) > 5:
            return parts[5] in _private
        return parts[3] in _private

    # the strict ancestors of the granted roots: listing one (the walk up from the build
    # tree that SCM discovery, git and setuptools do) is no foreign read (rules.ancestor_of)
    granted_above = frozenset(
        root[:cut] or "/" for root in read_roots + write_roots
        for cut in range(len(root)) if root[cut] == "/")

    def read_rule(path, _proc_other=proc_other, _in_homes=in_homes, _cred=cred_names,
                  _secret=secret_set, _secret_under=secret_under, _home=home_set,
                  _home_under=home_under, _home_all=home_all, _rw=rw_set, _rw_under=rw_under,
                  _rw_all=rw_all, _config=config_names, _private=private_set,
                  _private_under=private_under, _prefixes=prefix_set,
                  _granted_above=granted_above,
                  _decoy=sandbox_home + "/" if sandbox_home else "\0"):
        """The rule a read of this physical path breaks, "config-lookup"
        (allowed, reported as information), or None (see rules.read_rule)."""
        if path.startswith("/proc/") and _proc_other(path):
            return "proc-other-process"
        if path.startswith(_decoy) and _in_homes(path, _config):
            # the decoy is the only home in_homes can match for a path under it
            return "config-lookup"
        if _in_homes(path, _cred):
            return "secret-read"
        secret = path in _secret or path.startswith(_secret_under)
        if path in _prefixes and not (_rw_all or path in _rw or path.startswith(_rw_under)):
            return "toolchain-prefix"
        if (secret or _home_all or path in _home or path.startswith(_home_under)) and not (
                _rw_all or path in _rw or path.startswith(_rw_under)):
            return "secret-read" if secret else "home-read"
        if (path in _private or path.startswith(_private_under)) and not (
                _rw_all or path in _rw or path.startswith(_rw_under) or path in _granted_above):
            return "foreign-read"
        return None

    def write_rule(path, _in_homes=in_homes, _pers=pers_names, _write_files=write_files,
                   _w=w_set, _w_under=w_under, _w_all=w_all, _cred=cred_names,
                   _secret=secret_set, _secret_under=secret_under, _rw=rw_set,
                   _rw_under=rw_under, _rw_all=rw_all, _own_home=sandbox_home + "/",
                   _own=own_set, _own_under=own_under,
                   _special=("pipe:", "socket:", "anon_inode:", "/dev/pts/"), _proc_other=proc_other,
                   _devices=frozenset(("/dev/null", "/dev/tty", "/dev/zero", "/dev/full",
                                       "/dev/stdout", "/dev/stderr"))):
        """The rule a write to this physical path breaks, or None."""
        if path.startswith("/proc/") and _proc_other(path):
            return "proc-other-process"
        if _in_homes(path, _pers):
            return "persistence"
        if path in _write_files or _w_all or path in _w or path.startswith(_w_under):
            credential = _in_homes(path, _cred) or (
                (path in _secret or path.startswith(_secret_under))
                and not (_rw_all or path in _rw or path.startswith(_rw_under)))
            if credential and not path.startswith(_own_home):
                return "secret-write"
            return None
        if path.startswith(_special) or path in _devices or path in _own or path.startswith(_own_under):
            return None
        return "write-outside-roots"

    # Every rule compares a path with a fixed set of paths (equal, or below).
    # A directory that is no strict ancestor of any of them gives all its
    # entries the same verdict: it can be remembered per directory.
    def strict_ancestors(path):
        cut = path.find("/", 1)
        while cut > 0:
            yield path[:cut]
            cut = path.find("/", cut + 1)

    ancestors = {"/"}
    for p in homes + private_roots + read_roots + write_roots + own_tmpfs + SYSTEM_SECRETS + tuple(write_files) + tuple(
            prefix_set) + (
            "/proc", "/dev/pts", "/dev/null", "/dev/tty", "/dev/zero", "/dev/full", "/dev/stdout",
            "/dev/stderr"):
        ancestors.update(strict_ancestors(p))
    heads = {head for name in all_names for head in strict_ancestors("/" + name)}
    for home in homes + ((sandbox_home,) if sandbox_home else ()):  # home + "/" + a name
        ancestors.update(strict_ancestors(home))
        ancestors.add(home)
        ancestors.update(home + head for head in heads)
    ancestors = frozenset(ancestors)
    readable, read_dirs, write_dirs = set(), set(), set()  # allowed physical paths/directories

    def remember(path, paths, dirs, _ancestors=ancestors, _max=CACHE_MAX):
        if path.startswith("/proc"):  # those depend on getpid()
            return
        if len(paths) >= _max:
            paths.clear()
        paths.add(path)
        cut = path.rfind("/")
        if cut > 0 and path[:cut] not in _ancestors:
            if len(dirs) >= _max:
                dirs.clear()
            dirs.add(path[:cut])

    messages = MESSAGES

    def make_check(kind, paths, dirs, rule_of):
        # one checker per access kind; its state is bound as defaults (hot path)
        def check(path, _paths=paths, _dirs=dirs, _rule=rule_of, _kind=kind, _remember=remember,
                  _deny=deny, _messages=messages, _emit=emit):
            cut = path.rfind("/")
            if path in _paths or cut > 0 and path[:cut] in _dirs:
                return None
            rule = _rule(path)
            if rule is None:
                _remember(path, _paths, _dirs)
                return None
            if rule == "config-lookup":  # allowed: the decoy home holds nothing of the user
                _emit(_kind, "allowed", path, rule)
                return None
            return _deny(_kind, path, rule, _messages[rule])
        check.__name__ = check.__qualname__ = "check_" + kind[len("file-"):]
        return check

    check_read = make_check("file-read", readable, read_dirs, read_rule)
    check_write = make_check("file-write", set(), write_dirs, write_rule)

    def fd_path(fd, _readlink=readlink):
        try:
            return _readlink("/proc/self/fd/%d" % fd)
        except OSError:
            return "<fd %d>" % fd

    def unreadable(path, _access=os.access, _R_OK=os.R_OK, _lstat=lstat, _deny=deny):
        """As root, the sandbox runs as its own uid: an existing file the
        kernel will not let it read (root-only, mode 0600...) is refused
        here too, so that the attempt is reported (access(2) checks the real
        uid's permissions, which is the sandbox user's; Landlock plays no
        part in it)."""
        if _access(path, _R_OK):
            return None
        try:
            _lstat(path)
        except OSError:
            return None  # absent, or not even reachable: nothing was there to read
        return _deny("file-read", path, "sandbox-user-denied",
                     "the sandbox user may not read this file")

    def on_open(args, _text=as_text, _locate=locate, _read=check_read, _write=check_write,
                _write_flags=O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND,
                _dac=bool(config.get("sandbox_user")), _unreadable=unreadable):
        path, mode, flags = args[0], args[1], args[2]
        if type(path) is not str:
            if path is None or issubclass(type(path), int):  # not isinstance: __class__ can lie
                return None  # os.fdopen/open(fd): the fd was checked when opened
            try:
                path = _text(path)
            except TypeError:
                return None
        if mode is not None:
            writing = mode != "r" and mode != "rb" and (
                "w" in mode or "a" in mode or "x" in mode or "+" in mode)
        else:
            writing = flags is not None and flags >= 0 and flags & _write_flags != 0
        if writing:
            return _write(_locate(path))
        path = _locate(path)
        return _read(path) or (_unreadable(path) if _dac else None)

    def at(path, dir_fd, follow=True, _text=as_text, _locate=locate, _fd_path=fd_path):
        """The path an *at() call acts on; dir_fd counts for relative paths only."""
        if not issubclass(type(dir_fd), int) or dir_fd < 0:
            dir_fd = None  # audit events pass -1 for "no dir_fd"
        if issubclass(type(path), int):
            return _fd_path(path)
        path = _text(path)
        if dir_fd is not None and not path.startswith("/"):
            path = "/proc/self/fd/%d/%s" % (dir_fd, path)
        return _locate(path, follow)

    def on_file(event, args, _text=as_text, _locate=locate, _at=at, _read=check_read,
                _write=check_write, _files=files, _dirs=dirs):
        if event == "os.listdir" or event == "os.scandir":
            path = args[0]
            if path is None or issubclass(type(path), int):
                return None
            return _read(_locate(_text(path)))
        if event == "os.rename":
            problem = _write(_at(args[0], args[2], False)) or _write(_at(args[1], args[3], False))
            # A moved file or directory keeps its inode: forget what was cached.
            _files.clear()
            _dirs.clear()
            return problem
        if event == "os.link":
            return _read(_at(args[0], args[2])) or _write(_at(args[1], args[3], False))
        if event == "os.symlink":
            return _write(_at(args[1], args[2], False))
        if event == "os.mkdir":
            return _write(_at(args[0], args[2], False))
        if event == "os.remove" or event == "os.rmdir":
            problem = _write(_at(args[0], args[1], False))
            # A freed inode number can come back elsewhere: forget it.
            _files.clear()
            if event == "os.rmdir":
                _dirs.clear()
            return problem
        if event == "os.chmod" or event == "os.chown" or event == "os.utime":
            return _write(_at(args[0], args[-1]))
        if event == "os.truncate":
            return _write(_at(args[0], None))
        if event == "sqlite3.connect":
            try:
                path = _text(args[0])
            except TypeError:
                return None
            if path and path != ":memory:":
                return _read(_locate(path))
            return None
        if event == "shutil.copyfile":
            return _read(_locate(_text(args[0]))) or _write(_locate(_text(args[1])))
        if event == "shutil.rmtree":
            path = args[0]
            if issubclass(type(path), int):
                return None
            return _write(_at(path, args[1] if len(args) > 1 else None, False))
        return None

    def describe_address(address, _items=tuple.__getitem__, _all=slice(None)):
        if isinstance(address, tuple):
            address = _items(address, _all)  # a plain copy of a tuple subclass
            if len(address) >= 2:
                return plain(address[0]), address[1]
        if isinstance(address, (str, bytes)):
            text = fsdecode(address) if isinstance(address, bytes) else plain(address)
            return ("@" + text[1:] if text.startswith("\0") else text), None
        return str(address), None

    def host_allowed(host, port):
        return host in allow_hosts or ("%s:%s" % (host, port)) in allow_hosts

    def on_net(event, args, _items=tuple.__getitem__):
        if event in ("socket.connect", "socket.sendto", "socket.sendmsg", "socket.bind"):
            sock, address = args[0], args[1]
            if event == "socket.sendmsg" and address is None:
                return None  # connected socket: its connect was checked
            family = getattr(sock, "family", 0)
            host, port = describe_address(address)
            proto = "unix" if family == 1 else ("udp" if getattr(sock, "type", 0) & 0xF == 2 else "tcp")
            verb = event.split(".")[1]
            detail = {"family": {1: "unix", 2: "inet", 10: "inet6"}.get(int(family), str(family)),
                      "protocol": proto, "address": host, "port": port, "op": verb}
            target = "%s:%s" % (host, port) if port is not None else host
            if family == 1:
                path = host if host.startswith("@") else resolve(host)
                if host.startswith("@") or verb == "bind" and under(path, write_roots):
                    emit("network", "allowed", target, "unix-local", detail)
                    return None
                if under(path, write_roots):
                    emit("network", "allowed", target, "unix-local", detail)
                    return None
                return deny("network", target, "unix-socket",
                            "unix sockets outside the sandbox (agents, docker) are off", detail)
            if network == "all" or (network == "hosts" and host_allowed(host, port)):
                emit("network", "allowed", target, "network-allowed", detail)
                return None
            if verb == "bind" and host in ("127.0.0.1", "::1", "localhost", "0.0.0.0", "::"):
                # pip/urllib3 probe IPv6 support by binding ::1 port 0: refused,
                # reported, but informational (does not make the verdict).
                return deny("network", target, "loopback-bind", "no listening sockets in this sandbox", detail)
            return deny("network", target, "network-denied", "no network in this sandbox", detail)
        # Name lookups: DNS is an exfiltration channel of its own.
        name = args[0]
        if isinstance(name, bytes):
            name = fsdecode(name)
        if isinstance(name, tuple):
            name = _items(name, 0)
        name = plain(name)
        detail = {"protocol": "dns", "address": name, "op": event.split(".")[1]}
        if name in ("localhost", "", "None") or is_numeric(name):
            return None
        if network == "all" or (network == "hosts" and host_allowed(name, args[1] if len(args) > 1 else None)):
            emit("network", "allowed", name, "dns-allowed", detail)
            return None
        return deny("network", name, "dns-lookup", "DNS lookups can exfiltrate data", detail)

    def is_python(executable):
        base = executable.rsplit("/", 1)[-1]
        if not base.startswith(PYTHON_NAMES):
            return False
        tail = base[6:] if base.startswith("python") else base[4:]
        return all(c.isdigit() or c in ".dmut" for c in tail)

    def needs_boot(argv):
        """Index where the program part starts, if the interpreter's options
        would keep our sitecustomize out (-I, -E, -S); else None."""
        i = 1
        strip_env = False
        while i < len(argv):
            arg = argv[i]
            if type(arg) is not str:
                arg = plain(fsdecode(arg))
            if arg == "--" or not arg.startswith("-") or arg == "-":
                break
            if arg.startswith("--"):
                if arg in ("--check-hash-based-pycs",):
                    i += 1
                i += 1
                continue
            j = 1
            stop = False
            while j < len(arg):
                c = arg[j]
                if c in "IES":
                    strip_env = True
                if c in "cm":
                    stop = True
                    break
                if c in PY_OPT_WITH_VALUE:
                    if j == len(arg) - 1:
                        i += 1
                    break
                j += 1
            if stop:
                # split "-Im" into "-I" + "-m": the boot script goes between.
                return (i, j if j > 1 else 0) if strip_env else None
            i += 1
        if i < len(argv) and argv[i] in (boot_script, fsencode(boot_script)):
            return None  # already rewritten (Popen's audit event, then fork_exec)
        return (i, 0) if strip_env else None

    def prepare_child(argv, env, executable=None):
        """Inject the hook into a child's environment and, for a Python child
        that would skip sitecustomize, rewrite argv to start via the boot
        script. Returns an error message when the child cannot be hooked."""
        if env is not None:
            try:
                inject_env(env)
            except TypeError:
                return deny("process", str(executable or argv[0]), "unhookable-child",
                            "cannot add the audit hook to this environment")
        if not argv:
            return None
        exe = executable if executable is not None else argv[0]
        try:
            exe = plain(fsdecode(exe))
        except TypeError:
            exe = str(exe)
        if not is_python(exe):
            return None
        where = needs_boot(argv)
        if where is None:
            return None
        index, split = where
        if not isinstance(argv, list):
            return deny("process", " ".join(map(str, argv))[:200], "unhookable-python",
                        "a Python child started with -I/-E/-S would run without the audit hook")
        if split:
            arg = plain(fsdecode(argv[index]))
            flags, rest = arg[:split], "-" + arg[split:]
            argv[index:index + 1] = [flags, boot_script, rest]
        else:
            argv.insert(index, boot_script)
        return None

    def inject_env(env):
        if isinstance(env, dict) and env and isinstance(next(iter(env)), bytes):
            key, value, sep = b"PYTHONPATH", fsencode(hook_dir), b":"
            cfg_key, cfg_value = fsencode(CONFIG_NAME), fsencode(config_text)
        else:
            key, value, sep = "PYTHONPATH", hook_dir, ":"
            cfg_key, cfg_value = CONFIG_NAME, config_text
        current = env.get(key)
        parts = [p for p in (current or value[:0]).split(sep) if p and p != value]
        env[key] = sep.join([value] + parts)
        env[cfg_key] = cfg_value

    def env_hooked(env, _get=dict.get, _bytes=bytes, _str=str):
        """Whether a child started with ``env`` (an exact dict: a mapping of
        another type could answer us differently than the C code that reads
        it) would install this hook: the config variable is ours and
        PYTHONPATH starts with the hook dir."""
        if type(env) is not dict:
            return False
        cfg, path = _get(env, CONFIG_NAME), _get(env, "PYTHONPATH")
        if cfg is None and path is None:
            cfg, path = _get(env, fsencode(CONFIG_NAME)), _get(env, b"PYTHONPATH")
            want_cfg, want_dir, sep = fsencode(config_text), fsencode(hook_dir), b":"
            kind = _bytes
        else:
            want_cfg, want_dir, sep, kind = config_text, hook_dir, ":", _str
        if type(cfg) is not kind or type(path) is not kind:
            return False
        return cfg == want_cfg and path.split(sep)[0] == want_dir

    def exec_name(path, _readlink=readlink):
        """The program an exec starts, as text; for fexecve (an fd), the file it is."""
        if issubclass(type(path), int):
            try:
                return _readlink("/proc/self/fd/%d" % path)
            except OSError:
                return ""
        try:
            return plain(fsdecode(path))
        except TypeError:
            return str(path)

    def exec_unhooked(executable, argv, env):
        """Why an os.exec*/os.posix_spawn* call would start its program
        without this hook, or None. CPython converts argv and env to C
        arrays *before* these audit events, so the hook cannot rewrite them
        there (it can for Popen, through fork_exec): the wrappers installed
        over posix.exec*/posix_spawn* rewrite copies first and always pass
        an explicit environment; whatever reaches the event unrewritten —
        including env None, whose C ``environ`` os.environ may not mirror
        (``posix.unsetenv``) — is refused."""
        if env is None or not env_hooked(env):
            return "the child's environment lacks the audit hook"
        if type(argv) is not list and type(argv) is not tuple:
            return "argv of an unexpected type"
        exe = exec_name(executable if executable is not None else (argv[0] if argv else ""))
        if argv and is_python(exe) and needs_boot(list(argv)) is not None:
            return "a Python child started with -I/-E/-S would run without the audit hook"
        return None

    def on_proc(event, args):
        if event in ("os.kill", "os.killpg"):
            pid, sig = args[0], args[1]
            if pid in (supervisor_pid, 1, -1, 0) and sig != 0 or pid == supervisor_pid:
                return deny("signal", "pid %s" % pid, "signal-outside",
                            "signals may not leave the sandbox", {"signal": sig})
            return None
        if event == "subprocess.Popen":
            executable, argv, cwd, env = args
            shown = [fsdecode(a) if isinstance(a, bytes) else str(a) for a in argv]
        elif event == "os.exec" or event == "os.posix_spawn":
            executable, argv, env = args
            shown = [fsdecode(a) if isinstance(a, bytes) else str(a) for a in argv]
        elif event == "os.spawn":
            executable, argv, env = args[1], args[2], args[3]
            shown = [str(a) for a in argv]
        elif event == "os.system":
            executable, argv, env = "/bin/sh", None, None
            shown = ["/bin/sh", "-c", fsdecode(args[0]) if isinstance(args[0], bytes) else str(args[0])]
        elif event == "pty.spawn":
            executable, argv, env = None, None, None
            shown = [str(a) for a in args[0]] if isinstance(args[0], (list, tuple)) else [str(args[0])]
        else:  # os.fork, os.forkpty
            executable, argv, env = None, None, None
            shown = ["<fork>"]
        target = " ".join(shown)[:1000]
        detail = {"argv": shown[:64], "event": event}
        if not subprocess_ok:
            return deny("process", target, "subprocess-denied",
                        "this sandbox does not allow starting processes", detail)
        if event == "os.exec" or event == "os.posix_spawn":
            why = exec_unhooked(executable, argv, env)
            if why:
                return deny("process", target, "unhookable-child", why, detail)
        elif argv is not None or env is not None:
            problem = prepare_child(argv if argv is not None else [], env, executable)
            if problem:
                return problem
        if event != "os.fork":
            emit("process", "allowed", target, "subprocess-allowed", detail)
        return None

    def on_tamper(event, args):
        if event in ("object.__setattr__", "object.__getattr__"):
            obj, name = args[0], args[1]
            if name not in ("__code__", "__defaults__", "__kwdefaults__"):
                return None
            if getattr(obj, "__module__", None) != "_pipguard_hook":
                return None
            return deny("syscall", "%s of the audit hook" % name, "hook-tamper",
                        "the audit hook may not be inspected or replaced")
        if event.startswith("gc."):
            return deny("syscall", event, "hook-tamper",
                        "object-graph introspection could reach the audit hook")
        return deny("syscall", event, "hook-tamper", "tracing could subvert the audit hook")

    def fork_exec_wrapper(original):
        return _fork_exec_factory(original, subprocess_ok, deny, fsdecode, fsencode,
                                  inject_env, prepare_child, CONFIG_NAME, Denied)

    set_context, set_cause = _exception_setters()

    def hook(event, args, _handled=_ALL_EVENTS, _on_open=on_open, _on_file=on_file,
             _file=_FILE_EVENTS, _net=_NET_EVENTS, _proc=_PROC_EVENTS, _on_net=on_net,
             _on_proc=on_proc, _on_tamper=on_tamper, _Denied=Denied,
             _detach=BaseException.with_traceback, _set_context=set_context,
             _set_cause=set_cause):
        # No free variables and no globals: this frame appears in tracebacks,
        # and rebinding its locals affects nothing after it returns.
        if event not in _handled:
            return
        try:
            if event == "open":
                problem = _on_open(args)
            elif event in _file:
                problem = _on_file(event, args)
            elif event in _net:
                problem = _on_net(event, args)
            elif event in _proc:
                problem = _on_proc(event, args)
            else:
                problem = _on_tamper(event, args)
        except BaseException as error:
            failure = _detach(error, None)  # keep the type and message only
            _set_context(failure, None)
            _set_cause(failure, None)
        else:
            if not problem:
                return
            failure = _Denied(13, problem)
        # What is raised keeps this frame in its traceback: nothing left on it
        # may lead to the helpers (their closure cells and caches are writable).
        del _handled, _on_open, _on_file, _on_net, _on_proc, _on_tamper, _Denied
        del _detach, _set_context, _set_cause, args
        raise failure

    class OpenAt(object):
        """``os.open`` that turns openat-style calls into /proc/self/fd/N/PATH:
        the "open" audit event carries no dir_fd, so this makes it show where
        the path really leads. An instance, not a function, so that it does
        not bind as a method where the stdlib stores ``os.open`` in a class
        (pathlib's accessor on Python 3.9)."""

        __slots__ = ("_original",)
        __module__ = "_pipguard_hook"

        def __init__(self, original):
            self._original = original

        def __call__(self, path, flags, mode=0o777, *, dir_fd=None):
            if dir_fd is not None and not isinstance(path, int):
                raw = fspath(path)
                if not (raw.startswith(b"/") if isinstance(raw, bytes) else raw.startswith("/")):
                    path = "/proc/self/fd/%d/%s" % (dir_fd, fsdecode(raw))
                    dir_fd = None
            if dir_fd is None:
                return self._original(path, flags, mode)
            return self._original(path, flags, mode, dir_fd=dir_fd)

    def os_open_wrapper(original):
        return OpenAt(original)

    class Resolver(object):
        """``_socket.getaddrinfo``/``gethostbyname`` that report their answers,
        so the supervisor can name the host behind an address a process
        connects to later ("host name where a DNS lookup preceded it")."""

        __slots__ = ("_original",)
        __module__ = "_pipguard_hook"

        def __init__(self, original):
            self._original = original

        def __call__(self, *args, **kwargs):
            result = self._original(*args, **kwargs)
            try:
                name = args[0] if args else kwargs.get("host")
                if isinstance(name, bytes):
                    name = fsdecode(name)
                if isinstance(result, str):
                    addresses = [result]
                else:
                    addresses = sorted({str(entry[4][0]) for entry in result})
                if name and addresses and not is_numeric(plain(name)):
                    emit("network", "hint", plain(name), "dns-result", {"addresses": addresses[:32]})
            except Exception:
                pass  # evidence must never break the program
            return result

    def resolver_wrapper(original):
        return Resolver(original)

    class Exec(object):
        """``posix.execv``/``execve``/``posix_spawn``/``posix_spawnp`` that
        start the program hooked: the environment (``os.environ`` for
        execv) gets the hook's variables, a Python argv with -I/-E/-S the
        boot script. Reaching the original directly changes nothing: the
        audit event refuses what was not rewritten."""

        __slots__ = ("_original", "_spawn")
        __module__ = "_pipguard_hook"

        def __init__(self, original, spawn):
            self._original = original
            self._spawn = spawn

        def __call__(self, path, argv, env=None, *rest, _environ=os.environ, _dict=dict,
                     _list=list, **kwargs):
            if self._spawn == "execv":
                env = _environ
            new_env = _dict(env) if env is not None else None
            new_argv = _list(argv) if isinstance(argv, (list, tuple)) else argv
            if new_env is not None:
                inject_env(new_env)
            if type(new_argv) is _list:
                prepare_child(new_argv, None, exec_name(path))
            if self._spawn == "execv":
                return self._original(path, new_argv, new_env)
            return self._original(path, new_argv, new_env, *rest, **kwargs)

    def exec_wrapper(original, kind):
        return Exec(original, kind)

    return hook, fork_exec_wrapper, inject_env, os_open_wrapper, resolver_wrapper, exec_wrapper


def _fork_exec_factory(original, subprocess_ok, deny, fsdecode, fsencode, inject_env,
                       prepare_child, config_name, Denied):
    """``_posixsubprocess.fork_exec`` with the hook's policy; state is bound as
    keyword defaults so the wrapper's frame exposes no closure cells."""

    def fork_exec(*args, _original=original, _ok=subprocess_ok, _deny=deny, _fsdecode=fsdecode,
                  _fsencode=fsencode, _inject=inject_env, _prepare=prepare_child,
                  _cfg=config_name, _Denied=Denied, _detach=BaseException.with_traceback,
                  _set_context=_exception_setters()[0]):
        try:
            args = list(args)
            failure = None
            if not _ok:
                shown = [_fsdecode(a) if isinstance(a, bytes) else str(a) for a in (args[0] or [])]
                failure = _Denied(13, _deny(
                    "process", " ".join(shown)[:1000], "subprocess-denied",
                    "this sandbox does not allow starting processes",
                    {"argv": shown[:64], "event": "_posixsubprocess.fork_exec"}))
            else:
                if args[5] is not None:
                    prefix = _fsencode(_cfg) + b"="
                    env = {}
                    for entry in args[5]:
                        if entry.startswith(b"PYTHONPATH="):
                            env[b"PYTHONPATH"] = entry[len(b"PYTHONPATH="):]
                    _inject(env)
                    args[5] = [e for e in args[5]
                               if not (e.startswith(b"PYTHONPATH=") or e.startswith(prefix))]
                    args[5] += [k + b"=" + v for k, v in env.items()]
                if args[0] is not None:
                    argv = list(args[0])
                    problem = _prepare(argv, None, None)
                    if problem:
                        failure = _Denied(13, problem)
                    else:
                        args[0] = [_fsencode(a) if isinstance(a, str) else a for a in argv]
            if failure is None:
                return _original(*args)
        except BaseException as error:
            failure = _detach(error, None)
            _set_context(failure, None)
        # as in the hook: the traceback must not lead to _original or the helpers
        del _original, _deny, _fsdecode, _fsencode, _inject, _prepare, _Denied, args
        raise failure

    fork_exec.__module__ = "_pipguard_hook"
    return fork_exec


def _exception_setters():
    """Setters of __context__/__cause__ that an exception subclass cannot override."""
    try:
        return (BaseException.__dict__["__context__"].__set__,
                BaseException.__dict__["__cause__"].__set__)
    except (KeyError, AttributeError):  # not CPython
        def set_context(error, value):
            error.__context__ = value

        def set_cause(error, value):
            error.__cause__ = value

        return set_context, set_cause


def _ipv4(text):
    parts = text.split(".")
    if len(parts) != 4:
        return False
    for p in parts:
        if not 0 < len(p) <= 3 or p.strip("0123456789") or (p[0] == "0" and p != "0") or int(p) > 255:
            return False
    return True


def _is_numeric(name, _ipv4=_ipv4):
    """True exactly when ipaddress.ip_address(name) accepts the str ``name``
    (an IP literal: getaddrinfo answers it without DNS). No import at event
    time: sys.modules is the program's to rewrite."""
    addr, sep, scope = name.partition("%")
    if not sep and _ipv4(name):
        return True
    if sep and (not scope or "%" in scope):
        return False
    parts = addr.split(":")
    if len(parts) < 3:
        return False
    if "." in parts[-1]:
        if not _ipv4(parts[-1]):
            return False
        parts[-1:] = ["0", "0"]
    if len(parts) > 9:
        return False
    skip = None
    for i in range(1, len(parts) - 1):
        if not parts[i]:
            if skip is not None:
                return False
            skip = i
    if skip is not None:
        hi, lo = skip, len(parts) - skip - 1
        if not parts[0]:
            hi -= 1
            if hi:
                return False
        if not parts[-1]:
            lo -= 1
            if lo:
                return False
        if 8 - (hi + lo) < 1:
            return False
        groups = parts[:hi] + (parts[len(parts) - lo:] if lo else [])
    else:
        if len(parts) != 8 or not parts[0] or not parts[-1]:
            return False
        groups = parts
    for g in groups:
        if not 0 < len(g) <= 4 or g.strip("0123456789abcdefABCDEF"):
            return False
    return True


def _json_codec():
    """(loads, dumps) on the C accelerator alone: importing the json package
    (and with it re, enum...) costs milliseconds in every Python process."""
    try:
        from _json import encode_basestring_ascii, make_encoder, make_scanner

        class Context(object):
            __slots__ = ("strict", "object_hook", "object_pairs_hook", "parse_float",
                         "parse_int", "parse_constant", "memo")

        context = Context()
        context.strict, context.object_hook, context.object_pairs_hook = True, None, None
        context.parse_float, context.parse_int, context.parse_constant = float, int, float
        context.memo = {}
        scan = make_scanner(context)
        encode = make_encoder(None, str, encode_basestring_ascii, None, ": ", ", ",
                              False, False, True)

        def loads(text, _scan=scan):
            text = text.strip()
            value, end = _scan(text, 0)
            if end != len(text):
                raise ValueError("extra data in JSON")
            return value

        def dumps(value, _encode=encode, _join="".join):
            return _join(_encode(value, 0))

        if loads('{"a":[1,"\\u00e9",null]}') == {"a": [1, "\u00e9", None]} and \
                dumps({"a": [1, "\u00e9", None, 0.5]}) == '{"a": [1, "\\u00e9", null, 0.5]}':
            return loads, dumps
    except Exception:
        pass
    import json

    return json.loads, lambda value: json.dumps(value, default=str)


def install():
    """Install the hook in this process, once. Called at interpreter start."""
    if getattr(sys, "_pipguard_hooked", False):
        return
    text = os.environ.get(ENV_CONFIG)
    if not text:
        return
    loads, dumps = _json_codec()
    config = loads(text)
    config["_text"] = text
    hook, fork_exec_wrapper, inject_env, os_open_wrapper, resolver_wrapper, exec_wrapper = \
        _make_hook(config, dumps)
    if config.get("network") in ("all", "hosts"):  # lookups can succeed: report their answers
        import _socket

        for name in ("getaddrinfo", "gethostbyname"):
            setattr(_socket, name, resolver_wrapper(getattr(_socket, name)))
        sock = sys.modules.get("socket")
        if sock is not None:
            sock.gethostbyname = _socket.gethostbyname
    import posix

    wrapped = os_open_wrapper(posix.open)
    if posix.open in os.supports_dir_fd:  # shutil.rmtree picks its safe variant by this
        os.supports_dir_fd.add(wrapped)
    posix.open = os.open = wrapped
    # os.execv(e) and os.posix_spawn(p) parse argv/env before their audit
    # event: rewrite them here (os.execl*/spawn*/pty.spawn call these).
    # execv becomes execve with this process's environment, hooked.
    for name, kind, via in (("execv", "execv", "execve"), ("execve", "execve", "execve"),
                            ("posix_spawn", "spawn", "posix_spawn"),
                            ("posix_spawnp", "spawn", "posix_spawnp")):
        original = getattr(posix, via, None)
        if original is not None and hasattr(posix, name):
            replacement = exec_wrapper(original, kind)
            setattr(posix, name, replacement)
            setattr(os, name, replacement)
    # Keep the environment of this process hooked for children that inherit
    # it (os.system, multiprocessing, shells that start Python).
    inject_env(os.environ)
    try:
        import _posixsubprocess

        _posixsubprocess.fork_exec = fork_exec_wrapper(_posixsubprocess.fork_exec)
        sub = sys.modules.get("subprocess")
        if sub is not None and hasattr(sub, "_fork_exec"):
            sub._fork_exec = _posixsubprocess.fork_exec
    except ImportError:
        pass
    sys.addaudithook(hook)
    sys._pipguard_hooked = True
    sys.modules.pop(__name__, None)
