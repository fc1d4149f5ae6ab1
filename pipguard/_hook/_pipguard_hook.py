"""pipguard's PEP 578 audit hook, installed in every Python process of a run.

This file is imported by ``sitecustomize.py`` (via PYTHONPATH) or by
``_pipguard_boot.py`` (argv rewrite) inside the sandboxed interpreter. It must
run on any CPython >= 3.9 with the standard library only: the sandboxed
interpreter need not have pipguard installed.

The hook is a *sensor* that also vetoes: it raises ``PermissionError`` before
a denied action and reports a structured event on the run's event FIFO. It is
not a boundary on its own (CPython's docs say so; ctypes and native code walk
past it) — the OS layer is. What it adds is attribution to Python code.

Tamper resistance, and its limits:
- all state lives in an immutable tuple bound as a *default argument* of the
  hook (a frame's ``f_locals`` cannot rebind it; there are no closure cells);
- no module globals are read at event time; the standard-library functions it
  needs (``os.lstat``, ``os.readlink``...) are captured when it is installed,
  so monkeypatching ``os``/``posixpath`` later changes nothing;
- this module removes itself from ``sys.modules``;
- replacing the code or defaults of its functions, and the ``gc``
  introspection that would find them, are vetoed and reported.
Residual: code that walks a traceback into the hook's frame can disturb the
*reporting* state (the FIFO descriptor), not the policy; ctypes can do
anything in-process. Both are contained by the OS layer.
"""

import os
import sys

ENV_CONFIG = "PIPGUARD_HOOK"
_PIPE_BUF = 4000  # keep each event line below PIPE_BUF so writes are atomic

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

# Credential locations relative to any home directory (real or sandbox).
_CREDENTIAL_PATHS = (
    ".ssh", ".aws", ".azure", ".config/gcloud", ".kube", ".docker/config.json",
    ".pypirc", ".npmrc", ".yarnrc", ".netrc", ".git-credentials", ".config/gh",
    ".config/hub", ".gnupg", ".password-store", ".vault-token", ".terraform.d",
    ".mozilla", ".config/google-chrome", ".config/chromium", ".config/BraveSoftware",
    ".bitcoin", ".ethereum", ".electrum", ".config/Exodus", ".local/share/keyrings",
    ".cargo/credentials", ".cargo/credentials.toml", ".gem/credentials", ".m2/settings.xml",
    ".config/pip", ".pip", ".bash_history", ".zsh_history", ".python_history",
)
# Startup files relative to any home: a write there is a persistence attempt,
# also in the sandbox's own (throw-away) HOME, where it reveals the intent.
_PERSISTENCE_PATHS = (
    ".bashrc", ".bash_profile", ".bash_login", ".profile", ".zshrc", ".zprofile", ".zshenv",
    ".zlogin", ".cshrc", ".tcshrc", ".config/fish", ".config/autostart", ".config/systemd",
    ".config/environment.d", ".local/share/systemd", ".xinitrc", ".xprofile", ".pam_environment",
    ".local/lib", ".ssh", ".pythonrc", ".pythonstartup", ".config/pip", ".pip", ".pypirc",
    ".gitconfig", ".config/git", ".npmrc", ".docker",
)
_SYSTEM_SECRETS = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-",
                   "/etc/sudoers", "/etc/ssh")
_PROC_PRIVATE = frozenset(("environ", "cmdline", "mem", "maps", "fd", "auxv", "stack",
                           "syscall", "smaps", "pagemap", "root", "cwd", "exe"))
_PYTHON_NAMES = ("python", "pypy")
# Python options that take a value; -c and -m end the option list.
_PY_OPT_WITH_VALUE = frozenset("WXQ")


def _make_hook(config):
    """Build the hook and its immutable state from the decoded config."""
    import json as _json
    import stat as _stat
    import time as _time
    import _thread

    # Everything the hook uses at event time is bound here, once: later
    # changes to this module's globals or to os/posixpath change nothing.
    lstat, readlink, getcwd, fspath = os.lstat, os.readlink, os.getcwd, os.fspath
    fsencode = os.fsencode
    O_WRONLY, O_RDWR, O_CREAT, O_TRUNC, O_APPEND, O_CLOEXEC = (
        os.O_WRONLY, os.O_RDWR, os.O_CREAT, os.O_TRUNC, os.O_APPEND, os.O_CLOEXEC)
    PIPE_BUF, CREDENTIAL_PATHS, SYSTEM_SECRETS = _PIPE_BUF, _CREDENTIAL_PATHS, _SYSTEM_SECRETS
    PERSISTENCE_PATHS = _PERSISTENCE_PATHS
    PROC_PRIVATE, PYTHON_NAMES, PY_OPT_WITH_VALUE = _PROC_PRIVATE, _PYTHON_NAMES, _PY_OPT_WITH_VALUE
    CONFIG_NAME, is_numeric, Denied = ENV_CONFIG, _is_numeric, PermissionError
    os_write, os_open, getpid, getppid = os.write, os.open, os.getpid, os.getppid
    fsdecode, s_islnk, now = os.fsdecode, _stat.S_ISLNK, _time.time
    getframe, dumps = sys._getframe, _json.dumps
    allocate_lock = _thread.allocate_lock

    def norm_roots(paths):
        return tuple(sorted({p.rstrip("/") or "/" for p in paths}))

    homes = norm_roots(config.get("homes", ()))
    sandbox_home = config.get("sandbox_home", "")
    read_roots = norm_roots(config.get("read", ()))
    write_roots = norm_roots(config.get("write", ()))
    write_files = frozenset(config.get("write_files", ()))
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

    def under(path, roots):
        for root in roots:
            if path == root or path.startswith(root + "/") or root == "/":
                return True
        return False

    def resolve(path, cwd=None, follow_last=True):
        """Physical absolute path, resolved with captured primitives only."""
        if isinstance(path, bytes):
            path = fsdecode(path)
        if not path.startswith("/"):
            path = (cwd or getcwd()) + "/" + path
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
                st = lstat(candidate)
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
            if s_islnk(st.st_mode):
                hops += 1
                if hops > 40:
                    return candidate
                try:
                    target = readlink(candidate)
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
        line = dumps(record, default=str)
        if len(line) > PIPE_BUF:
            record["target"] = target[:512]
            record["detail"] = {"truncated": True}
            line = dumps(record, default=str)[:PIPE_BUF]
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

    def in_homes(path, names):
        for home in homes + ((sandbox_home,) if sandbox_home else ()):
            if path.startswith(home + "/"):
                rel = path[len(home) + 1:]
                for name in names:
                    if rel == name or rel.startswith(name + "/"):
                        return True
        return False

    def credential(path):
        if in_homes(path, CREDENTIAL_PATHS):
            return True
        for secret in SYSTEM_SECRETS:
            if path == secret or path.startswith(secret + "/"):
                return not under(path, read_roots + write_roots)
        return False

    def proc_other(path):
        if not path.startswith("/proc/"):
            return False
        parts = path.split("/")
        if len(parts) < 4 or not parts[2].isdigit():
            return False
        if int(parts[2]) == getpid():
            return False
        if parts[3] == "task" and len(parts) > 5:
            return parts[5] in PROC_PRIVATE
        return parts[3] in PROC_PRIVATE

    def check_read(path):
        if proc_other(path):
            return deny("file-read", path, "proc-other-process",
                        "reading another process's private /proc files")
        if credential(path):
            return deny("file-read", path, "secret-read", "this is a credential location")
        if under(path, homes) and not under(path, read_roots + write_roots):
            return deny("file-read", path, "home-read",
                        "home directories are not readable in the sandbox")
        return None

    def persistence(path):
        return in_homes(path, PERSISTENCE_PATHS)

    def check_write(path):
        if persistence(path):
            return deny("file-write", path, "persistence",
                        "startup and configuration files of a home directory are off limits")
        if path in write_files or under(path, write_roots):
            if credential(path) and not path.startswith(sandbox_home + "/"):
                return deny("file-write", path, "secret-write", "this is a credential location")
            return None
        if path.startswith(("pipe:", "socket:", "anon_inode:", "/dev/pts/")) or path in (
            "/dev/null", "/dev/tty", "/dev/zero", "/dev/full", "/dev/stdout", "/dev/stderr"
        ):
            return None
        return deny("file-write", path, "write-outside-roots",
                    "writes are allowed only in the build dir and the sandbox temp dir")

    def fd_path(fd):
        try:
            return readlink("/proc/self/fd/%d" % fd)
        except OSError:
            return "<fd %d>" % fd

    def on_open(args):
        path, mode, flags = args[0], args[1], args[2]
        if path is None:
            return None
        if isinstance(path, int):
            return None  # os.fdopen/open(fd): the fd was checked when opened
        try:
            path = fspath(path)
        except TypeError:
            return None
        writing = False
        if mode is not None:
            writing = any(c in mode for c in "wax+")
        elif flags is not None and flags >= 0:
            writing = bool(flags & (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND))
        full = resolve(path)
        if writing:
            return check_write(full)
        return check_read(full)

    def two_paths(src, dst, src_fd, dst_fd, follow_src=False):
        src_fd = None if src_fd is None or src_fd < 0 else src_fd
        dst_fd = None if dst_fd is None or dst_fd < 0 else dst_fd
        a = resolve(fspath(src) if src_fd is None else "/proc/self/fd/%d/%s" % (src_fd, fsdecode(fspath(src))), follow_last=follow_src)
        b = resolve(fspath(dst) if dst_fd is None else "/proc/self/fd/%d/%s" % (dst_fd, fsdecode(fspath(dst))), follow_last=False)
        return a, b

    def at(path, dir_fd, follow=True):
        if not isinstance(dir_fd, int) or dir_fd < 0:
            dir_fd = None  # audit events pass -1 for "no dir_fd"
        if isinstance(path, int):
            return fd_path(path)
        path = fspath(path)
        if dir_fd is not None and not (path.startswith(b"/" if isinstance(path, bytes) else "/")):
            path = "/proc/self/fd/%d/%s" % (dir_fd, fsdecode(path))
        return resolve(path, follow_last=follow)

    def on_file(event, args):
        if event == "open":
            return on_open(args)
        if event in ("os.listdir", "os.scandir"):
            path = args[0]
            if path is None or isinstance(path, int):
                return None
            return check_read(resolve(fspath(path)))
        if event == "os.rename":
            src, dst = two_paths(args[0], args[1], args[2], args[3])
            return check_write(src) or check_write(dst)
        if event == "os.link":
            src, dst = two_paths(args[0], args[1], args[2], args[3], follow_src=True)
            return check_read(src) or check_write(dst)
        if event == "os.symlink":
            return check_write(at(args[1], args[2], follow=False))
        if event in ("os.mkdir", "os.rmdir", "os.remove"):
            dir_fd = args[2] if event == "os.mkdir" else args[1]
            return check_write(at(args[0], dir_fd, follow=False))
        if event in ("os.chmod", "os.chown", "os.utime"):
            return check_write(at(args[0], args[-1] if event != "os.utime" else args[-1]))
        if event == "os.truncate":
            return check_write(at(args[0], None))
        if event == "sqlite3.connect":
            path = args[0]
            if isinstance(path, (str, bytes)) and path not in (":memory:", b":memory:", "", b""):
                return check_read(resolve(fspath(path)))
            return None
        if event == "shutil.copyfile":
            return check_read(resolve(fspath(args[0]))) or check_write(resolve(fspath(args[1])))
        if event == "shutil.rmtree":
            path = args[0]
            if isinstance(path, int):
                return None
            return check_write(at(path, args[1] if len(args) > 1 else None, follow=False))
        return None

    def describe_address(address):
        if isinstance(address, tuple) and len(address) >= 2:
            return str(address[0]), address[1]
        if isinstance(address, (str, bytes)):
            text = fsdecode(address) if isinstance(address, bytes) else address
            return ("@" + text[1:] if text.startswith("\0") else text), None
        return str(address), None

    def host_allowed(host, port):
        return host in allow_hosts or ("%s:%s" % (host, port)) in allow_hosts

    def on_net(event, args):
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
            name = name[0]
        name = str(name)
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
            if isinstance(arg, bytes):
                arg = fsdecode(arg)
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
        if isinstance(exe, bytes):
            exe = fsdecode(exe)
        if not is_python(str(exe)):
            return None
        where = needs_boot(argv)
        if where is None:
            return None
        index, split = where
        if not isinstance(argv, list):
            return deny("process", " ".join(map(str, argv))[:200], "unhookable-python",
                        "a Python child started with -I/-E/-S would run without the audit hook")
        if split:
            arg = argv[index]
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
        if argv is not None or env is not None:
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

    def hook(event, args, _handled=_ALL_EVENTS, _file=_FILE_EVENTS, _net=_NET_EVENTS,
             _proc=_PROC_EVENTS, _on_file=on_file, _on_net=on_net, _on_proc=on_proc,
             _on_tamper=on_tamper, _Denied=Denied):
        # No free variables and no globals: this frame appears in tracebacks,
        # and rebinding its locals affects nothing after it returns.
        if event not in _handled:
            return
        if event in _file:
            problem = _on_file(event, args)
        elif event in _net:
            problem = _on_net(event, args)
        elif event in _proc:
            problem = _on_proc(event, args)
        else:
            problem = _on_tamper(event, args)
        if problem:
            raise _Denied(13, problem)

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
                if name and addresses and not is_numeric(str(name)):
                    emit("network", "hint", str(name), "dns-result", {"addresses": addresses[:32]})
            except Exception:
                pass  # evidence must never break the program
            return result

    def resolver_wrapper(original):
        return Resolver(original)

    return hook, fork_exec_wrapper, inject_env, os_open_wrapper, resolver_wrapper


def _fork_exec_factory(original, subprocess_ok, deny, fsdecode, fsencode, inject_env,
                       prepare_child, config_name, Denied):
    """``_posixsubprocess.fork_exec`` with the hook's policy; state is bound as
    keyword defaults so the wrapper's frame exposes no closure cells."""

    def fork_exec(*args, _original=original, _ok=subprocess_ok, _deny=deny, _fsdecode=fsdecode,
                  _fsencode=fsencode, _inject=inject_env, _prepare=prepare_child,
                  _cfg=config_name, _Denied=Denied):
        args = list(args)
        if not _ok:
            shown = [_fsdecode(a) if isinstance(a, bytes) else str(a) for a in (args[0] or [])]
            raise _Denied(13, _deny("process", " ".join(shown)[:1000], "subprocess-denied",
                                    "this sandbox does not allow starting processes",
                                    {"argv": shown[:64], "event": "_posixsubprocess.fork_exec"}))
        if args[5] is not None:
            prefix = _fsencode(_cfg) + b"="
            env = {}
            for entry in args[5]:
                if entry.startswith(b"PYTHONPATH="):
                    env[b"PYTHONPATH"] = entry[len(b"PYTHONPATH="):]
            _inject(env)
            args[5] = [e for e in args[5] if not (e.startswith(b"PYTHONPATH=") or e.startswith(prefix))]
            args[5] += [k + b"=" + v for k, v in env.items()]
        if args[0] is not None:
            argv = list(args[0])
            problem = _prepare(argv, None, None)
            if problem:
                raise _Denied(13, problem)
            args[0] = [_fsencode(a) if isinstance(a, str) else a for a in argv]
        return _original(*args)

    fork_exec.__module__ = "_pipguard_hook"
    return fork_exec


def _is_numeric(name):
    import ipaddress

    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def install():
    """Install the hook in this process, once. Called at interpreter start."""
    if getattr(sys, "_pipguard_hooked", False):
        return
    text = os.environ.get(ENV_CONFIG)
    if not text:
        return
    import json

    config = json.loads(text)
    config["_text"] = text
    hook, fork_exec_wrapper, inject_env, os_open_wrapper, resolver_wrapper = _make_hook(config)
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
