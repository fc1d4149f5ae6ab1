"""Resolve a :class:`~pipguard.sandbox.policy.Policy` against this host into a
:class:`Plan`: the concrete paths, environment, hook configuration and OS-layer
spec of one run. Pure apart from reading the host (``/etc``, ``pwd``, PATH)
and creating the run's private directory.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import sys
import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple

from pipguard.errors import CommandNotFound, UsageError
from pipguard.sandbox.oslayer import OsLayerSpec
from pipguard.sandbox.policy import Policy
from pipguard.sandbox import limits
from pipguard.sandbox.rundir import cleanup, run_dir_parts, stop_idle_work_if_reachable, take_run_dir
from pipguard import protections, rules

if TYPE_CHECKING:
    from pipguard.protections import ProtectionState
    from pipguard.sandbox.backends.ns.spec import NamespaceSpec

HOOK_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_hook")
# pipguard's own package, readable by every sandboxed interpreter (the hook is inside it)
PACKAGE_DIR = os.path.dirname(os.path.dirname(HOOK_DIR))
HOOK_FILES = ("sitecustomize.py", "_pipguard_hook.py", "_pipguard_boot.py")


def precompile_hook(python: Optional[str] = None) -> None:
    """Write the hook's bytecode for this interpreter (or for ``python``, a
    target interpreter that may be another version) where it is missing or
    stale. Sandboxed Pythons import the hook from HOOK_DIR, which they may not
    write: without this, each would compile it again (~6 ms) and try (and
    fail, with a refused write in the report) to cache it. pip compiles it at
    install time; editable installs, fresh checkouts and other versions have none."""
    if python is not None and os.path.realpath(python) != os.path.realpath(sys.executable):
        import subprocess

        script = "import py_compile, sys\nfor f in sys.argv[1:]:\n    py_compile.compile(f)"
        subprocess.run([python, "-I", "-S", "-c", script, *(os.path.join(HOOK_DIR, n) for n in HOOK_FILES)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        return
    import importlib.util

    for name in HOOK_FILES:
        source = os.path.join(HOOK_DIR, name)
        try:
            cached = os.stat(importlib.util.cache_from_source(source)).st_mtime
            if cached >= os.stat(source).st_mtime:
                continue
        except OSError:
            pass
        import py_compile  # only now: it imports traceback and more (~1.5 ms a run)

        try:
            py_compile.compile(source, doraise=True)
        except (OSError, py_compile.PyCompileError):
            pass  # a read-only install: sandboxed Pythons compile it in memory

# Variables a build needs and that carry no credentials. Everything else is
# removed (names listed in the report) unless --keep-env names it.
ENV_ALLOW = frozenset(
    """PATH LANG LANGUAGE TERM TZ COLUMNS LINES NO_COLOR FORCE_COLOR CLICOLOR
    SOURCE_DATE_EPOCH USER LOGNAME SHELL
    CC CXX CPP LD AR AS NM RANLIB STRIP OBJCOPY OBJDUMP READELF CFLAGS CXXFLAGS
    CPPFLAGS LDFLAGS LDSHARED LIBS FFLAGS FC F77 F90 MAKEFLAGS MAKELEVEL MFLAGS
    PKG_CONFIG PKG_CONFIG_PATH PKG_CONFIG_LIBDIR CMAKE_GENERATOR CMAKE_BUILD_PARALLEL_LEVEL
    NPY_NUM_BUILD_JOBS MAX_JOBS SETUPTOOLS_USE_DISTUTILS SETUPTOOLS_SCM_PRETEND_VERSION
    VIRTUAL_ENV CONDA_PREFIX PYTHONHASHSEED PYTHONIOENCODING PYTHONUTF8
    PYTHONDONTWRITEBYTECODE PYTHONWARNINGS PYTHONFAULTHANDLER
    PIP_CONFIG_FILE PIP_NO_INDEX PIP_FIND_LINKS PIP_NO_INPUT PIP_DISABLE_PIP_VERSION_CHECK
    PIP_NO_BUILD_ISOLATION PIP_NO_CACHE_DIR PIP_ONLY_BINARY PIP_NO_BINARY PIP_PREFER_BINARY
    PIP_PROGRESS_BAR PIP_NO_COLOR PIP_DEFAULT_TIMEOUT PIP_CERT
    SSL_CERT_FILE SSL_CERT_DIR REQUESTS_CA_BUNDLE CURL_CA_BUNDLE NODE_EXTRA_CA_CERTS
    PYTHONUNBUFFERED DEBIAN_FRONTEND PWD SHLVL
    """.split()
)
ENV_ALLOW_PREFIXES = ("LC_",)

# /etc is granted entry by entry around the rule table's system secrets
# (rules.ETC_SECRETS: password hashes, host keys, private TLS keys, pip's
# site-wide config...): see grants_excluding().
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")
# Directories that must never become the writable build dir.
UNSAFE_CWD = ("/", "/tmp", "/var/tmp", "/home", "/root", "/usr", "/etc", "/var", "/dev", "/proc")


@dataclass(frozen=True)
class RunSettings:
    """What bounds and describes one run, resolved from the policy when the
    plan is made: nothing after the plan reads the Policy (the launcher, the
    supervisor and the report take these)."""

    isolation: str  # the level asked for: audit, os, ns, auto
    network: str  # none, hosts (through the proxy) or all
    timeout: Optional[float]
    max_events: int
    memory: int  # bytes; the host default already applied
    processes: int
    cpu: float
    write: int
    #: the user's extra read roots (granted recursively to a leased uid)
    user_read: Tuple[str, ...] = ()
    #: the policy as the report echoes it
    policy_json: Dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """Everything the launcher needs; derived, never edited."""

    argv: Tuple[str, ...]
    executable: str
    cwd: str
    run_dir: str
    fifo: str
    tmp_dir: str
    home_dir: str
    env: Dict[str, str]
    env_removed: Tuple[str, ...]
    homes: Tuple[str, ...]
    read_roots: Tuple[str, ...]
    write_roots: Tuple[str, ...]
    os_spec: Optional[OsLayerSpec]
    os_required: bool
    settings: RunSettings
    #: each protection of the level, as this host will have it (pipguard.protections)
    protections: Tuple["ProtectionState", ...]
    unavailable: Dict[str, str] = field(default_factory=dict)
    proxy_port: Optional[int] = None
    # PATH directories inside a home made readable (see toolchain_roots); also in read_roots
    toolchain_roots: Tuple[str, ...] = ()
    # their prefixes, not granted; a lookup there is informational (see toolchain_prefixes)
    toolchain_prefixes: Tuple[str, ...] = ()
    # reads below these outside the grants are findings (Policy.private_roots)
    private_roots: Tuple[str, ...] = ()
    #: the ns backend's new root (pipguard.sandbox.backends.ns.spec); None: the plain backend
    namespace: Optional["NamespaceSpec"] = None
    #: write roots private to the sandbox (ns: its own /tmp and /dev/shm
    #: tmpfs): writable inside, never the host's directories of that name
    namespace_tmpfs: Tuple[str, ...] = ()


def home_directories(env: Optional[Mapping[str, str]] = None) -> Tuple[str, ...]:
    """Every home directory on this host: the caller's ($HOME and passwd),
    /root, /home, and passwd homes under them."""
    homes = {"/root", "/home"}
    env = os.environ if env is None else env
    for value in (env.get("HOME"), os.environ.get("HOME"), os.path.expanduser("~")):
        if value and value != "/":
            homes.add(os.path.realpath(value))
    try:
        for entry in pwd.getpwall():
            d = entry.pw_dir
            if d and d.startswith(("/home/", "/root", "/Users/")):
                homes.add(os.path.realpath(d))
    except Exception:  # pwd can fail in odd containers; the defaults stand
        pass
    return tuple(sorted(homes))


def grants_excluding(root: str, excluded: Sequence[str],
                     listed: Optional[List[Tuple[str, int]]] = None) -> List[str]:
    """``root`` as Landlock grants: itself if nothing in ``excluded`` lies
    inside it, nothing if it is excluded, else its entries, each split the
    same way (Landlock cannot subtract a subtree from a grant). Entries that
    appear later in a split directory are not granted. ``listed`` collects
    (directory, mtime_ns) of every directory whose listing the answer used,
    taken before it was read."""
    root = root.rstrip("/") or "/"
    if any(root == e or root.startswith(e.rstrip("/") + "/") for e in excluded):
        return []
    inner = [e for e in excluded if e.startswith(root.rstrip("/") + "/")]
    if not inner:
        return [root]
    try:
        if listed is not None:
            listed.append((root, os.stat(root).st_mtime_ns))
        names = sorted(os.listdir(root))
    except OSError:
        return []
    out: List[str] = []
    for name in names:
        path = root.rstrip("/") + "/" + name
        if os.path.isdir(path) and not os.path.islink(path):
            out.extend(grants_excluding(path, inner, listed))
        elif path not in inner:
            out.append(path)
    return out


#: (root, excluded) -> the listings a split was made from, and the split
_splits: Dict[Tuple[str, Tuple[str, ...]], Tuple[Tuple[Tuple[str, int], ...], Tuple[str, ...]]] = {}


def split_unless_changed(root: str, excluded: Sequence[str]) -> List[str]:
    """:func:`grants_excluding`, made again only when a directory it was
    listed from changed since (a few stats instead of listing and testing
    each entry: /etc, ~200 of them, cost 3-8 ms a plan)."""
    key = (root, tuple(excluded))
    known = _splits.get(key)
    if known is not None:
        try:
            if all(os.stat(d).st_mtime_ns == m for d, m in known[0]):
                return list(known[1])
        except OSError:
            pass
    listed: List[Tuple[str, int]] = []
    entries = grants_excluding(root, excluded, listed)
    _splits[key] = (tuple(listed), tuple(entries))
    return entries


def etc_entries() -> List[str]:
    return split_unless_changed("/etc", rules.ETC_SECRETS)


# Known layouts of toolchains installed in a home, by the PATH entry's tail:
# what the tool needs beside its bin directory (pyenv's shims run libexec/pyenv,
# which reads versions/; rustup's proxies in ~/.cargo/bin read ~/.rustup).
_TOOLCHAIN_LAYOUTS = (
    ("/.pyenv/shims", ("..",)), ("/.pyenv/bin", ("..",)),
    ("/.pyenv/plugins/pyenv-virtualenv/shims", ("../../..",)),
    ("/.cargo/bin", (".", "../../.rustup")),
)


def toolchain_roots(path_var: Optional[str], homes: Sequence[str]) -> Tuple[str, ...]:
    """Directories on ``path_var`` (PATH) that lie inside a home, with what
    their known layout needs (the pyenv root, ~/.rustup; for nvm a node
    version's bin/lib/include/share, not its etc/npmrc). Readable and
    executable in the sandbox, the rest of the home not; the rule table's
    credential entries stay refused inside them. Never a home itself or a
    credential or startup location."""
    found: List[str] = []
    for entry in (path_var or "").split(os.pathsep):
        if not entry.startswith("/") or not os.path.isdir(entry):
            continue
        real = os.path.realpath(entry)
        home = next((h for h in homes if real.startswith(h.rstrip("/") + "/")), None)
        if home is None:
            continue
        extra: Tuple[str, ...] = (".",)
        for tail, more in _TOOLCHAIN_LAYOUTS:
            if real.endswith(tail):
                extra = more
        if "/.nvm/versions/node/" in real and real.endswith("/bin"):
            extra = (".", "../lib", "../include", "../share")
        for rel in extra:
            root = os.path.normpath(os.path.join(real, rel))
            if not os.path.isdir(root) or any(root == h or h.startswith(root + "/") for h in homes):
                continue
            # not at, below or above a credential or startup entry: Landlock cannot
            # subtract it from the grant (~/.config would bring ~/.config/gh)
            home_of_root = next(h for h in homes if root.startswith(h.rstrip("/") + "/"))
            sensitive = [home_of_root.rstrip("/") + "/" + n
                         for n in rules.CREDENTIAL_PATHS + rules.PERSISTENCE_PATHS]
            if any(root == p or root.startswith(p + "/") or p.startswith(root + "/") for p in sensitive):
                continue
            found.append(root)
    return tuple(dict.fromkeys(found))


def toolchain_prefixes(path_var: Optional[str], homes: Sequence[str],
                       granted: Sequence[str]) -> Tuple[str, ...]:
    """The prefix (the directory above ``bin``/``sbin``) of each PATH entry inside a
    home that is not itself granted: ``~/.cargo`` for ``~/.cargo/bin``. CMake's and
    meson's dependency searches derive a prefix from every PATH entry and list it
    (meson: ``_cached_listdir``); it is not granted (``~/.cargo`` holds
    ``credentials.toml``), so the lookup is refused, and it is no theft: rule
    ``toolchain-prefix``, informational. Only the directory itself."""
    found: List[str] = []
    for entry in (path_var or "").split(os.pathsep):
        if not entry.startswith("/") or os.path.basename(entry.rstrip("/")) not in ("bin", "sbin"):
            continue
        prefix = os.path.dirname(os.path.realpath(entry))
        if any(prefix == h or prefix.startswith(h.rstrip("/") + "/") for h in homes) and not any(
                prefix == g or prefix.startswith(g.rstrip("/") + "/") for g in granted):
            found.append(prefix)
    return tuple(dict.fromkeys(found))


def _interpreter_roots(executable: str) -> List[str]:
    roots = [sys.prefix, sys.base_prefix, sys.exec_prefix, PACKAGE_DIR]
    # The command's own install tree (e.g. /root/.pyenv/versions/3.9/bin/python -> that version).
    for path in (executable, os.path.realpath(executable)):
        bindir = os.path.dirname(path)
        roots.append(bindir)
        if os.path.basename(bindir) == "bin":
            roots.append(os.path.dirname(bindir))
    # Modules pipguard's hook needs are in the standard library of the target;
    # pipguard itself and its dependencies are read by the launcher before confinement.
    return roots


def _tty_devices() -> List[str]:
    out = []
    for fd in (0, 1, 2):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/pts/") or target.startswith("/dev/tty"):
            out.append(target)
    return out


def scrub_env(source: Mapping[str, str], keep: Sequence[str]) -> Tuple[Dict[str, str], Tuple[str, ...]]:
    """Keep the allow-list plus ``keep``; return (kept, removed names)."""
    kept, removed = {}, []
    keep_set = set(keep)
    for name, value in source.items():
        if name in ENV_ALLOW or name.startswith(ENV_ALLOW_PREFIXES) or name in keep_set:
            kept[name] = value
        else:
            removed.append(name)
    return kept, tuple(sorted(removed))


def resolve_command(argv: Sequence[str], path_var: Optional[str], cwd: str) -> str:
    if not argv:
        raise UsageError("no command given", hint="put the command after '--': pipguard run -- CMD ARGS")
    name = argv[0]
    if "/" in name:
        full = name if os.path.isabs(name) else os.path.join(cwd, name)
        if not os.path.exists(full):
            raise CommandNotFound(f"command not found: {name}")
        if os.path.isdir(full) or not os.access(full, os.X_OK):
            raise CommandNotFound(f"command is not executable: {name}", hint="chmod +x it, or run it through its interpreter")
        return os.path.abspath(full)
    found = shutil.which(name, path=path_var or os.defpath)
    if not found:
        raise CommandNotFound(f"command not found: {name}", hint="check the name and PATH")
    return found


def make_plan(argv: Sequence[str], policy: Policy, *, cwd: Optional[str] = None,
              env: Optional[Mapping[str, str]] = None, supervisor_pid: Optional[int] = None,
              os_available: bool = True, os_reason: str = "",
              proxy_port: Optional[int] = None, facts: Optional[Any] = None) -> Plan:
    """Resolve ``policy`` for running ``argv``. Creates the private run
    directory (temp dir, sandbox HOME, event FIFO); the caller removes it.
    The steps, in order: the directory and the command, the network mode, the backend, the
    run directory, the roots, the environment with the audit hook's configuration, the OS
    layer (and the namespace's new root), the settings."""
    source_env = dict(os.environ if env is None else env)
    cwd = os.path.realpath(cwd or os.getcwd())
    if not os.path.isdir(cwd):
        raise UsageError(f"working directory {cwd} does not exist")
    executable = resolve_command(argv, source_env.get("PATH"), cwd)  # a missing command is said first
    homes = home_directories(source_env)
    _refuse_unsafe_cwd(cwd, policy, homes)

    network = _network_mode(policy, proxy_port)
    if facts is None:
        facts = _host_facts(policy)
    in_ns = uses_namespaces(policy, facts, os_available)
    run_dir, decoy_token = take_run_dir(in_ns)
    try:
        return _planned(argv, policy, cwd, executable, source_env, homes, network, facts, in_ns, run_dir,
                        decoy_token, supervisor_pid, os_available, os_reason, proxy_port)
    except BaseException:
        cleanup(run_dir)  # a plan refused half way leaves no run directory behind
        raise


def _planned(argv: Sequence[str], policy: Policy, cwd: str, executable: str, source_env: Mapping[str, str],
             homes: Tuple[str, ...], network: str, facts: Any, in_ns: bool, run_dir: str,
             decoy_token: Optional[str], supervisor_pid: Optional[int], os_available: bool, os_reason: str,
             proxy_port: Optional[int]) -> Plan:
    tmp_dir, home_dir, fifo = run_dir_parts(run_dir)
    roots = _roots(policy, cwd, executable, source_env.get("PATH"), homes, tmp_dir, home_dir, in_ns)
    kept, removed = _sandbox_env(source_env, policy, roots, tmp_dir, home_dir, network, proxy_port)
    kept["PIPGUARD_HOOK"] = _hook_config(policy, roots, homes, home_dir, fifo, network, proxy_port, supervisor_pid)

    states = protections.planned(policy.isolation, facts, network=network, as_root=os.geteuid() == 0,
                                 os_reason="" if os_available else os_reason)
    if not policy.prefer_ns:  # auto on the host's filesystem by request: ns is not wanted, not missing
        states = tuple(s for s in states if s.name != "ns")
    unavailable: Dict[str, str] = {}
    os_spec, namespace = None, None
    if policy.isolation != "audit":
        if os_available:
            os_spec, namespace = _os_layer(policy, facts, roots, homes, home_dir, fifo, network, proxy_port,
                                           decoy_token if in_ns else None, in_ns)
        elif policy.isolation in ("os", "ns"):
            from pipguard.errors import LayerUnavailable

            raise LayerUnavailable(f"the OS layer is unavailable: {os_reason}",
                                   hint="use --isolation auto or audit on this host")
        else:
            unavailable["os"] = os_reason
    # (not the namespace's own tmpfs /tmp and /dev/shm: they are not the host's)
    stop_idle_work_if_reachable([*roots.read, *roots.host_write, cwd])
    return Plan(
        argv=tuple(argv), executable=executable, cwd=cwd, run_dir=run_dir, fifo=fifo,
        tmp_dir=tmp_dir, home_dir=home_dir, env=kept, env_removed=removed, homes=homes,
        read_roots=roots.read, write_roots=roots.write, os_spec=os_spec,
        os_required=policy.isolation in ("os", "ns"), protections=states, unavailable=unavailable,
        proxy_port=proxy_port,
        toolchain_roots=roots.toolchains, toolchain_prefixes=roots.prefixes,
        private_roots=tuple(policy.private_roots),
        namespace=namespace, namespace_tmpfs=roots.namespace_tmpfs,
        settings=RunSettings(
            isolation=policy.isolation, network=network, timeout=policy.timeout,
            max_events=policy.max_events, memory=policy.limit_memory or limits.default_memory(),
            processes=policy.limit_processes, cpu=policy.limit_cpu, write=policy.limit_write,
            user_read=(*policy.allow_read, *policy.read_only_by_landlock), policy_json=policy.to_json()),
    )


def _refuse_unsafe_cwd(cwd: str, policy: Policy, homes: Sequence[str]) -> None:
    """Making the working directory writable must not open system or home directories."""
    if policy.writable_cwd and (cwd in UNSAFE_CWD or any(h == cwd or h.startswith(cwd + "/") for h in homes)):
        raise UsageError(
            f"refusing to make {cwd} writable for the sandbox: it is or contains system or home directories",
            hint="run from the project's own directory",
        )


@dataclass(frozen=True)
class _Roots:
    """What a run may read and write, resolved (:func:`_roots`)."""

    read: Tuple[str, ...]
    write: Tuple[str, ...]
    #: ns: the sandbox's own tmpfs /tmp and /dev/shm, writable inside (not the host's); also in write
    namespace_tmpfs: Tuple[str, ...]
    #: PATH directories inside a home made readable (also in read)
    toolchains: Tuple[str, ...]
    #: their prefixes, not granted (a lookup there is informational)
    prefixes: Tuple[str, ...]

    @property
    def host_write(self) -> Tuple[str, ...]:
        """The write roots that are the host's directories (not the namespace's own tmpfs)."""
        return tuple(r for r in self.write if r not in self.namespace_tmpfs)


def _roots(policy: Policy, cwd: str, executable: str, path_var: Optional[str], homes: Sequence[str],
           tmp_dir: str, home_dir: str, in_ns: bool) -> _Roots:
    write = [tmp_dir, home_dir, *policy.allow_write]
    if policy.writable_cwd:
        write.insert(0, cwd)
    # ns: the sandbox's own tmpfs /tmp and /dev/shm are writable (they are not
    # the host's); its homes are decoy tmpfs, readable (a read is evidence)
    namespace_tmpfs: Tuple[str, ...] = ()
    if in_ns:
        from pipguard.sandbox.backends.ns.spec import PRIVATE_TMPFS

        namespace_tmpfs = PRIVATE_TMPFS
    write += namespace_tmpfs
    # Derived roots must never widen into a home: `/bin/sh` would otherwise
    # make "/" (the parent of /bin) readable.
    derived = [r for r in _interpreter_roots(executable)
               if r not in ("/", "") and not any(h == r or h.startswith(r.rstrip("/") + "/") for h in homes)]
    toolchains = toolchain_roots(path_var, homes)
    read = [*derived, *toolchains, *policy.allow_read, *policy.read_only_by_landlock]
    prefixes = toolchain_prefixes(path_var, homes, read)
    return _Roots(tuple(read), tuple(write), namespace_tmpfs, toolchains, prefixes)


def _network_mode(policy: Policy, proxy_port: Optional[int]) -> str:
    """``all``, ``hosts`` (through pipguard's index proxy) or ``none``."""
    if policy.allow_network:
        return "all"
    if policy.allow_hosts:
        if proxy_port is None:
            raise UsageError("allow_hosts needs pipguard's index proxy (use pipguard.sandbox.run)")
        return "hosts"
    return "none"


def _sandbox_env(source_env: Mapping[str, str], policy: Policy, roots: _Roots, tmp_dir: str, home_dir: str,
                 network: str, proxy_port: Optional[int]) -> Tuple[Dict[str, str], Tuple[str, ...]]:
    """The command's environment (the allow-list, HOME and the temp dirs the run's own, the
    audit hook on PYTHONPATH) and the names of what was removed."""
    kept, removed = scrub_env(source_env, policy.keep_env)
    user_pythonpath = kept.pop("PYTHONPATH", None)
    kept.update(
        HOME=home_dir, TMPDIR=tmp_dir, TEMP=tmp_dir, TMP=tmp_dir,
        XDG_CACHE_HOME=os.path.join(home_dir, ".cache"),
        XDG_CONFIG_HOME=os.path.join(home_dir, ".config"),
        XDG_DATA_HOME=os.path.join(home_dir, ".local", "share"),
        PYTHONPATH=HOOK_DIR + (":" + user_pythonpath if user_pythonpath else ""),
    )
    kept.setdefault("PATH", os.defpath)
    # rustup's proxies (~/.cargo/bin/cargo) find their toolchains in $RUSTUP_HOME,
    # by default in $HOME, which is now the decoy: point them at the real one.
    rustup = next((r for r in roots.toolchains if r.endswith("/.rustup")), None)
    if rustup and "RUSTUP_HOME" not in kept:
        kept["RUSTUP_HOME"] = rustup
    if network == "hosts":
        proxy = f"http://127.0.0.1:{proxy_port}"
        for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
            kept[name] = proxy
    return kept, removed


def _hook_config(policy: Policy, roots: _Roots, homes: Sequence[str], home_dir: str, fifo: str, network: str,
                 proxy_port: Optional[int], supervisor_pid: Optional[int]) -> str:
    """The audit hook's configuration (``PIPGUARD_HOOK``): the same grants and rules as the
    supervisor's, as data."""
    return json.dumps({
        "homes": list(homes),
        "sandbox_home": home_dir,
        "read": list(roots.read),
        # not the namespace's own /tmp and /dev/shm: for the hook's rules they are no grant (a
        # Python look into pip's temp area, where the other builds live, stays a foreign-read)
        "write": list(roots.host_write),
        # ...but writable: a Python write there is no more than a native one (found measuring
        # the write limit, issue 33: a build's write to its own /tmp was write-outside-roots)
        "own_tmpfs": list(roots.namespace_tmpfs),
        "write_files": [fifo],
        "private": list(policy.private_roots),
        "prefixes": list(roots.prefixes),
        "network": network,
        # the sandbox itself reaches only the proxy; the proxy enforces the hosts
        "hosts": [f"127.0.0.1:{proxy_port}"] if network == "hosts" else [],
        "subprocess": policy.allow_subprocess,
        "supervisor_pid": supervisor_pid or os.getpid(),
        "fifo": fifo,
        "hook_dir": HOOK_DIR,
        "rules": rules.hook_table(),
    }, separators=(",", ":"))


def _os_layer(policy: Policy, facts: Any, roots: _Roots, homes: Sequence[str], home_dir: str, fifo: str,
              network: str, proxy_port: Optional[int], decoy_token: Optional[str],
              in_ns: bool) -> Tuple[OsLayerSpec, Optional["NamespaceSpec"]]:
    """The OS layer's spec and, under ns, the namespace's new root (its decoy homes planted
    in the run's HOME unless the run directory made ahead has them)."""
    # System dirs never widen into a home (HOME=/opt/ci under /opt).
    system = [g for root in rules.SYSTEM_READ for g in grants_excluding(root, homes)]
    readable = [*system, *etc_entries(), *roots.read]
    namespace = None
    if in_ns:
        from pipguard.sandbox.backends.ns.decoys import HOME_DECOYS, plant_decoys
        from pipguard.sandbox.backends.ns.spec import spec_for

        namespace = spec_for(readable, [*roots.host_write, fifo],
                             [*DEVICES, *_tty_devices()], homes, network == "all",
                             sandbox_home=home_dir,
                             # without Landlock a writable mount would be no barrier at all
                             # (ABI 3: truncate(2) is Landlock's from there on)
                             landlock_read_only=policy.read_only_by_landlock
                             if facts is not None and facts.landlock_abi >= 3 else (),
                             token=decoy_token)
        readable += namespace.decoy_homes
        # in the run's own $HOME before anything runs: they are not the build's writes
        # (a run directory made ahead while pipguard was idle has them already)
        if decoy_token is None:
            plant_decoys(home_dir, namespace.token, HOME_DECOYS)
    os_spec = OsLayerSpec(
        read_paths=tuple(dict.fromkeys(p for p in readable if p)),
        write_paths=tuple(dict.fromkeys([*roots.write, fifo])),
        device_paths=tuple(dict.fromkeys([*DEVICES, *_tty_devices()])),
        network="all" if network == "all" else ("ports" if network == "hosts" else "none"),
        tcp_connect_ports=(proxy_port,) if network == "hosts" and proxy_port else (),
        allow_subprocess=policy.allow_subprocess,
        notify=True,
        observe_reads=policy.observe_reads if policy.observe_reads is not None else not in_ns,
    )
    return os_spec, namespace


def _host_facts(policy: Policy):
    """The host's facts (probed once per process) when the level uses the OS
    layer; the audit level needs none. For ``auto`` (which picks its backend
    from them) whether the namespace backend works here is probed for real
    (a throw-away child, once per process: a few ms); the other levels take
    it as present (``ns`` confirms it when it starts, and fails with the reason)."""
    if policy.isolation == "audit":
        return None
    from pipguard.sandbox import host

    facts = host.planning_facts()
    if policy.isolation == "auto" and policy.prefer_ns:
        from pipguard.sandbox import backends

        probe = backends.load("ns").probe()  # through the backend interface, as the first process enters it
        facts = dataclasses.replace(facts, user_namespaces=probe.available,
                                    user_namespaces_reason=probe.reason)
    return facts


def uses_namespaces(policy: Policy, facts: Any, os_available: bool = True) -> bool:
    """Whether the run goes in the namespace backend: always under ``ns``;
    under ``auto`` where the OS layer and every part of the ns backend work
    here (``facts``, from :func:`_host_facts`) and the policy prefers it."""
    if policy.isolation == "ns":
        return True
    return (policy.isolation == "auto" and policy.prefer_ns and os_available and facts is not None
            and bool(getattr(facts, "user_namespaces", False)))
