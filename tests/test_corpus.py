"""The corpus is real and hostile, and the test support works: the control group.

Every hostile package is built here WITHOUT any sandbox, safely (fake HOME, loopback sinks the
test starts, offline wheelhouse), and the attack must SUCCEED. A sandbox test that sees a block is
only meaningful because this file shows the same build leaks when nothing stops it.
"""
from __future__ import annotations

import binascii
import errno
import json
import os
import socket
import stat
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import support
from support import HOSTILE, LEGIT, PACKAGES, PERSIST_MARK, attempts, pip_wheel


def build(name, fake_home, wheelhouse, tmp_path, extra_env=None, python=sys.executable, **kw):
    """Build corpus project ``name`` from a fresh sdist with plain pip; return (proc, wheels)."""
    sdist = support.build_sdist(support.project(name), tmp_path / "sdist")
    out = tmp_path / "wheels"
    proc = pip_wheel(sdist, out, wheelhouse, fake_home.env(extra_env), python=python, **kw)
    wheels = sorted(out.glob("*.whl")) if out.exists() else []
    return proc, wheels


def assert_built(proc, wheels):
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert len(wheels) == 1, proc.stdout[-2000:]


def hex_names_leak(names, needle):
    """True if a DNS name made of hex labels decodes to bytes containing ``needle``."""
    for name in names:
        labels = name.split(".")
        hexpart = "".join(lbl for lbl in labels if all(c in "0123456789abcdef" for c in lbl))
        try:
            if needle.encode() in binascii.unhexlify(hexpart[: len(hexpart) // 2 * 2]):
                return True
        except (binascii.Error, ValueError):
            continue
    return False


# --- corpus shape -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", support.all_projects())
def test_project_is_a_real_setuptools_project(name, tmp_path):
    src = support.project(name)
    pyproject = (src / "pyproject.toml").read_text()
    assert "[build-system]" in pyproject and '"setuptools"' in pyproject
    assert "build-backend" in pyproject
    assert (src / "README.md").read_text().startswith(name + ":")
    sdist = support.build_sdist(src, tmp_path)
    assert sdist.name == f"{name}-0.1.0.tar.gz"
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    assert f"{name}-0.1.0/PKG-INFO" in names
    assert f"{name}-0.1.0/setup.py" in names
    assert all(n.startswith(f"{name}-0.1.0/") for n in names)
    assert not any("__pycache__" in n for n in names)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_sdists_carry_the_shared_attack_library(name, tmp_path):
    """One copy in the tree; every hostile sdist gets it at build time, byte for byte."""
    sdist = support.build_sdist(support.project(name), tmp_path)
    with tarfile.open(sdist) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/pgattack.py"))
        assert tar.extractfile(member).read() == support.corpus.SHARED_ATTACK.read_bytes()
    assert not (PACKAGES / name / "pgattack.py").exists()


def test_corpus_lists_match_directories():
    dirs = {p.name for p in PACKAGES.iterdir() if p.is_dir() and not p.name.startswith("_")}
    assert dirs == set(HOSTILE) | set(LEGIT)


# --- control group: unsandboxed, the attacks succeed ------------------------------------------------

def test_steal_at_build_leaks(fake_home, loopback_tcp, wheelhouse, tmp_path):
    proc, wheels = build("steal_at_build", fake_home, wheelhouse, tmp_path,
                         {"PIPGUARD_TEST_SINK": loopback_tcp.address})
    assert_built(proc, wheels)
    assert loopback_tcp.wait(count=3)
    data = loopback_tcp.data()
    assert fake_home.markers["id_rsa"].encode() in data
    # Both phases: metadata (egg_info via prepare_metadata) and the wheel build (bdist_wheel, build_py).
    assert b"steal_at_build:setup.py egg_info:" in data
    assert b"steal_at_build:setup.py bdist_wheel:" in data
    assert b"steal_at_build:build_py:" in data
    assert fake_home.markers["id_rsa"].encode() in fake_home.stolen()["stolen-steal_at_build"]
    assert any(a.startswith("attempt exfil") and ": ok" in a for a in attempts(proc.stdout))


def test_steal_at_metadata_leaks_from_backend_hooks(fake_home, loopback_tcp, wheelhouse, tmp_path):
    proc, wheels = build("steal_at_metadata", fake_home, wheelhouse, tmp_path,
                         {"PIPGUARD_TEST_SINK": loopback_tcp.address})
    assert_built(proc, wheels)
    assert loopback_tcp.wait(count=2)
    data = loopback_tcp.data()
    assert b"steal_at_metadata:get_requires_for_build_wheel:" in data
    assert b"steal_at_metadata:prepare_metadata_for_build_wheel:" in data
    assert fake_home.markers["pypirc"].encode() in data
    assert "stolen-steal_at_metadata" in fake_home.stolen()


@support.requires_gcc()
def test_native_helper_leaks_from_compiled_code(fake_home, loopback_tcp, wheelhouse, tmp_path):
    proc, wheels = build("native_helper", fake_home, wheelhouse, tmp_path,
                         {"PIPGUARD_TEST_SINK": loopback_tcp.address})
    assert_built(proc, wheels)
    assert loopback_tcp.wait()
    assert b"native_helper:native:" + b"-----BEGIN OPENSSH" in loopback_tcp.data()
    assert fake_home.markers["id_rsa"].encode() in loopback_tcp.data()
    assert fake_home.markers["id_rsa"].encode() in fake_home.stolen()["stolen-native_helper"]
    assert any(a.startswith("attempt native connect+send") for a in attempts(proc.stdout))


def test_env_grandchild_leaks_with_empty_environment(fake_home, loopback_tcp, wheelhouse, tmp_path):
    proc, wheels = build("env_grandchild", fake_home, wheelhouse, tmp_path,
                         {"PIPGUARD_TEST_SINK": loopback_tcp.address})
    assert_built(proc, wheels)
    assert loopback_tcp.wait()
    assert b"env_grandchild:grandchild:" in loopback_tcp.data()
    assert fake_home.markers["aws"].encode() in loopback_tcp.data()
    assert "stolen-env_grandchild" in fake_home.stolen()
    lines = attempts(proc.stdout)
    env_line = [a for a in lines if a.startswith("attempt grandchild environment")]
    assert env_line, lines
    # Empty env, except what CPython itself may add (PEP 538 sets LC_CTYPE when coercing the C locale).
    assert int(env_line[0].rsplit(": ", 1)[1].split()[0]) <= 1


def test_pth_dropper_wheel_ships_top_level_pth(fake_home, wheelhouse, tmp_path):
    proc, wheels = build("pth_dropper", fake_home, wheelhouse, tmp_path)
    assert_built(proc, wheels)
    with zipfile.ZipFile(wheels[0]) as zf:
        assert "evil.pth" in zf.namelist()
        assert zf.read("evil.pth").startswith(b"import os; os.system(")
        record = zf.read("pth_dropper-0.1.0.dist-info/RECORD").decode()
    assert "evil.pth," in record


def test_bashrc_persist_modifies_home(fake_home, wheelhouse, tmp_path):
    proc, wheels = build("bashrc_persist", fake_home, wheelhouse, tmp_path)
    assert_built(proc, wheels)
    bashrc = fake_home.bashrc.read_text()
    assert bashrc.startswith(fake_home.bashrc_original)
    assert PERSIST_MARK in bashrc
    desktop = fake_home.path / ".config" / "autostart" / "evil.desktop"
    assert PERSIST_MARK in desktop.read_text()


def test_dns_exfil_leaks_to_loopback_resolver(fake_home, loopback_udp, wheelhouse, tmp_path):
    proc, wheels = build("dns_exfil", fake_home, wheelhouse, tmp_path,
                         {"PIPGUARD_TEST_DNS": loopback_udp.address})
    assert_built(proc, wheels)
    assert loopback_udp.wait()
    names = support.dns_qnames(loopback_udp.received)
    assert names and all(n.endswith(".exfil.invalid") for n in names)
    assert hex_names_leak(names, fake_home.markers["id_rsa"])


@support.requires_netns()
def test_dns_exfil_calls_getaddrinfo(fake_home, wheelhouse, tmp_path):
    """The getaddrinfo path goes to the system resolver, so it runs in a fresh network namespace
    (only a down ``lo``): the query can leave nowhere, and the attempt shows in the log."""
    proc, wheels = build("dns_exfil", fake_home, wheelhouse, tmp_path,
                         preexec_fn=support.netns_preexec())
    assert_built(proc, wheels)
    names = [a.split(" ", 2)[2].split(":", 1)[0] for a in attempts(proc.stdout)
             if a.startswith("attempt getaddrinfo ")]
    assert names, attempts(proc.stdout)
    assert hex_names_leak(names, fake_home.markers["id_rsa"])
    assert fake_home.stolen()["stolen-dns_exfil"].decode() in names


def test_hostile_code_does_not_raise_without_sink(fake_home, wheelhouse, tmp_path):
    """Nothing listens at the default sink 127.0.0.1:9: the attempt fails, the build goes on."""
    proc, wheels = build("steal_at_build", fake_home, wheelhouse, tmp_path,
                         {"PIPGUARD_TEST_SINK": None})
    assert_built(proc, wheels)
    assert any("tcp 127.0.0.1:9: error ECONNREFUSED" in a for a in attempts(proc.stdout))


# --- legit packages build and work, and do nothing hostile --------------------------------------------

def install_wheel(wheel, target, wheelhouse, env, python=sys.executable):
    proc = subprocess.run([python, "-m", "pip", "install", "--no-deps", "--no-index", "--find-links",
                           str(wheelhouse), "--target", str(target), str(wheel)],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]


def test_legit_pure_builds_clean(fake_home, loopback_tcp, wheelhouse, tmp_path):
    proc, wheels = build("legit_pure", fake_home, wheelhouse, tmp_path,
                         {"PIPGUARD_TEST_SINK": loopback_tcp.address})
    assert_built(proc, wheels)
    assert attempts(proc.stdout) == []
    assert not loopback_tcp.wait(timeout=0.2) and fake_home.stolen() == {}
    with zipfile.ZipFile(wheels[0]) as zf:
        eps = zf.read("legit_pure-0.1.0.dist-info/entry_points.txt").decode()
    assert "legit-pure = legit_pure:main" in eps


@support.requires_gcc()
def test_legit_cext_builds_and_imports(fake_home, wheelhouse, tmp_path):
    proc, wheels = build("legit_cext", fake_home, wheelhouse, tmp_path)
    assert_built(proc, wheels)
    assert attempts(proc.stdout) == []
    assert "-cp3" in wheels[0].name
    target = tmp_path / "target"
    install_wheel(wheels[0], target, wheelhouse, fake_home.env())
    out = subprocess.run([sys.executable, "-c", "import legit_cext; print(legit_cext.add(2, 3))"],
                         env=fake_home.env({"PYTHONPATH": str(target)}), stdout=subprocess.PIPE,
                         universal_newlines=True, timeout=60, cwd=str(tmp_path))
    assert out.stdout.strip() == "5"


@pytest.mark.parametrize("version", ["3.9", "3.13"])
@pytest.mark.parametrize("name", ["legit_pure", "steal_at_build"])
def test_corpus_builds_on_other_pythons(version, name, fake_home, loopback_tcp, wheelhouse, tmp_path):
    python = support.python_versions().get(version)
    if python is None:
        pytest.skip(f"no Python {version} interpreter on this machine")
    proc, wheels = build(name, fake_home, wheelhouse, tmp_path,
                         {"PIPGUARD_TEST_SINK": loopback_tcp.address}, python=python)
    assert_built(proc, wheels)
    if name in HOSTILE:
        assert loopback_tcp.wait()
        assert fake_home.markers["id_rsa"].encode() in loopback_tcp.data()


# --- fixtures themselves ------------------------------------------------------------------------------

def test_fake_home_layout(fake_home):
    assert set(fake_home.markers) == set(fake_home.secrets)
    assert len(set(fake_home.markers.values())) == len(fake_home.markers)
    for name, path in fake_home.secrets.items():
        assert path.is_relative_to(fake_home.path) if hasattr(path, "is_relative_to") else True
        assert fake_home.markers[name] == "PIPGUARD-FAKE-SECRET-" + name
        assert fake_home.markers[name] in path.read_text()
    rel = {n: p.relative_to(fake_home.path).as_posix() for n, p in fake_home.secrets.items()}
    assert rel["id_rsa"] == ".ssh/id_rsa" and rel["firefox"] == ".mozilla/firefox/x.default/logins.json"
    assert fake_home.bashrc.read_text() == fake_home.bashrc_original
    assert stat.S_IMODE(os.stat(fake_home.path).st_mode) == 0o755
    assert stat.S_IMODE(os.stat(fake_home.path / ".ssh").st_mode) == 0o755
    real_home = os.path.expanduser("~")
    env = fake_home.env(fake_tokens=True)
    assert env["HOME"] == str(fake_home.path) != real_home
    assert env["PIP_CONFIG_FILE"] == os.devnull and env["PIP_NO_INPUT"] == "1"
    assert not any(k.startswith("PIP_") and k not in support.PIP_NEUTRAL for k in env)
    assert env["GITHUB_TOKEN"] == "PIPGUARD-FAKE-SECRET-env-GITHUB_TOKEN"


@support.requires_root()
def test_run_as_nobody_and_fake_home_permissions(fake_home_factory, try_one_bin):
    root_home = fake_home_factory()
    r = support.parse_try_one(support.run_as_nobody(
        [str(try_one_bin), "read", str(root_home.secrets["id_rsa"])], stdout=subprocess.PIPE,
        universal_newlines=True, cwd="/").stdout)
    assert r["errname"] == "EACCES"  # 0600 root-owned: DAC already stops nobody
    own = fake_home_factory(owner_uid=support.NOBODY)
    proc = support.run_as_nobody([str(try_one_bin), "read", str(own.secrets["id_rsa"])],
                                 stdout=subprocess.PIPE, universal_newlines=True, cwd="/")
    assert support.parse_try_one(proc.stdout)["ok"] is True
    proc = support.run_as_nobody(["id", "-u"], stdout=subprocess.PIPE, universal_newlines=True, cwd="/")
    assert proc.stdout.strip() == str(support.NOBODY)


def test_loopback_listeners(loopback_tcp, loopback_udp):
    with socket.create_connection(("127.0.0.1", loopback_tcp.port), timeout=5) as s:
        s.sendall(b"hello")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
        u.sendto(b"dgram", ("127.0.0.1", loopback_udp.port))
    assert loopback_tcp.wait() and loopback_tcp.received == [b"hello"]
    assert loopback_udp.wait() and loopback_udp.received == [b"dgram"]
    assert loopback_tcp.address == f"127.0.0.1:{loopback_tcp.port}"


def test_loopback_ipv6(loopback_tcp6, loopback_udp6):
    with socket.create_connection(("::1", loopback_tcp6.port), timeout=5) as s:
        s.sendall(b"six")
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as u:
        u.sendto(b"six", ("::1", loopback_udp6.port))
    assert loopback_tcp6.wait() and loopback_tcp6.received == [b"six"]
    assert loopback_udp6.wait() and loopback_udp6.received == [b"six"]
    assert loopback_tcp6.address == f"[::1]:{loopback_tcp6.port}"


def test_wheelhouse_has_pins(wheelhouse):
    assert support.wheelhouse.missing(wheelhouse) == []
    assert json.loads((wheelhouse / "pins.json").read_text()) == support.PINS


def test_capabilities_probed():
    caps = support.capabilities()
    assert {"landlock", "seccomp", "seccomp_user_notif", "root", "userns", "netns"} <= set(caps)
    ll = caps["landlock"]
    assert (ll.level >= 1) == ll.ok
    assert support.check("landlock", abi=10_000) is not None
    with pytest.raises(ValueError):
        support.requires("no-such-capability")


def test_require_all_layers_turns_skip_into_failure(tmp_path):
    """Run a tiny pytest session twice: a missing capability skips, and fails when strict."""
    (tmp_path / "conftest.py").write_text(
        "import importlib.util\n"
        "spec = importlib.util.spec_from_file_location('pipguard_tests_conftest', %r)\n"
        "mod = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(mod)\n"
        "pytest_configure, pytest_runtest_setup = mod.pytest_configure, mod.pytest_runtest_setup\n"
        % str(Path(__file__).resolve().parent / "conftest.py"))
    (tmp_path / "test_gate.py").write_text(
        "import support\n@support.requires_landlock(abi=10000)\ndef test_x():\n    pass\n")
    base = support.clean_env(extra={"PYTHONDONTWRITEBYTECODE": "1"})
    for strict, expect in (("0", "1 skipped"), ("1", "1 error")):
        env = dict(base, PIPGUARD_REQUIRE_ALL_LAYERS=strict)
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              str(tmp_path)], cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, universal_newlines=True, timeout=120).stdout
        assert expect in out, out


# --- try_one helper -------------------------------------------------------------------------------

@pytest.fixture(params=["c", "py"])
def try_one(request):
    """argv prefix of either helper."""
    if request.param == "c":
        return [str(request.getfixturevalue("try_one_bin"))]
    return request.getfixturevalue("try_one_py")


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed on exit; nothing listens there now


def test_try_one_files(try_one, tmp_path):
    run = support.run_try_one
    assert run(try_one, "read", tmp_path / "missing") == {
        "action": "read", "ok": False, "errno": errno.ENOENT, "errname": "ENOENT", "_returncode": 0}
    target = tmp_path / "w"
    assert run(try_one, "write", target)["ok"] is True and target.read_bytes() == b"x"
    assert run(try_one, "read", target)["ok"] is True
    assert run(try_one, "read", tmp_path / "missing" / "x")["errname"] == "ENOENT"
    assert run(try_one, "write", tmp_path)["errname"] == "EISDIR"


def test_try_one_network(try_one, loopback_tcp, loopback_udp, tmp_path):
    run = support.run_try_one
    assert run(try_one, "connect-tcp", "127.0.0.1", loopback_tcp.port)["ok"] is True
    assert run(try_one, "sendto-udp", "127.0.0.1", loopback_udp.port)["ok"] is True
    assert loopback_tcp.wait() and loopback_tcp.received == [b"try_one"]
    assert loopback_udp.wait() and loopback_udp.received == [b"try_one"]
    r = run(try_one, "connect-tcp", "127.0.0.1", closed_port())
    assert (r["ok"], r["errname"]) == (False, "ECONNREFUSED")
    assert run(try_one, "socket-unix")["ok"] is True
    assert run(try_one, "unix-connect", tmp_path / "nope.sock")["errname"] == "ENOENT"
    path = str(tmp_path / "s.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:
        srv.bind(path)
        srv.listen(1)
        assert run(try_one, "unix-connect", path)["ok"] is True


def test_try_one_processes(try_one):
    run = support.run_try_one
    assert run(try_one, "fork")["ok"] is True
    assert run(try_one, "exec", "/bin/true")["ok"] is True
    assert run(try_one, "exec", "/nonexistent/prog")["errname"] == "ENOENT"
    assert run(try_one, "kill", os.getpid(), 0)["ok"] is True
    assert run(try_one, "kill", 2 ** 22 + 1, 0)["errname"] == "ESRCH"  # above any pid_max
    assert run(try_one, "ptrace-traceme")["ok"] is True
    r = run(try_one, "io-uring")  # may be disabled by sysctl kernel.io_uring_disabled
    assert r["ok"] or r["errname"] in ("ENOSYS", "EPERM", "EACCES")


def test_try_one_usage_errors(try_one):
    for argv in ([], ["bogus"], ["read"], ["kill", "x", "y"], ["connect-tcp", "localhost", "80"]):
        proc = subprocess.run(try_one + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=30)
        assert proc.returncode == 2 and proc.stdout == "" and "usage" in proc.stderr, argv


def test_try_one_dns_python_only(try_one_py, try_one_bin):
    # localhost comes from /etc/hosts: no packet leaves the machine.
    assert support.run_try_one(try_one_py, "dns", "localhost")["ok"] is True
    proc = subprocess.run([str(try_one_bin), "dns", "localhost"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=30)
    assert proc.returncode == 2


def test_try_one_c_and_python_agree(try_one_bin, try_one_py, tmp_path):
    cases = [("read", tmp_path / "missing"), ("read", "/etc/hostname"), ("socket-unix",),
             ("exec", "/nonexistent"), ("kill", 2 ** 22 + 1, 0)]
    for case in cases:
        c = support.run_try_one([str(try_one_bin)], *case)
        p = support.run_try_one(try_one_py, *case)
        assert c == p, case
