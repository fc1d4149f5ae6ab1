"""``pipguard install --sandbox`` and ``pipguard sandbox``: the real pip, every hook call in
its own sandbox. Real pip (the venv's bundled 23.2 and 26.3), real sdists built in the test, a
fresh target venv per test, and both routes users run: a loopback package index with
credentials in ``PIP_INDEX_URL`` (a private index), and ``--no-index --find-links``. Every
refusal is checked against a byte-for-byte listing of the target environment."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tarfile
import textwrap

import pytest

from pg import backend_param
from support import build_sdist
from support.corpus import project
from support.pipinstall import PY, listing, pg_install, site_import


def test_legit_pure_installs(tmp_path, fake_home, route, target):
    proc, report = pg_install(["legit_pure"], home=fake_home, target=target, route=route,
                              cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert site_import(target, "legit_pure").returncode == 0
    (pkg,) = report["packages"]
    assert pkg["name"] == "legit-pure" and pkg["from_sdist"] and pkg["verdict"] == "clean"
    assert report["status"] == "installed" and report["verdict"] == "clean"
    # the headline says something beyond its status word (it said "INSTALLED — installed")
    assert "INSTALLED — 1 package(s) gated, then installed by pip" in proc.stderr, proc.stderr[-2000:]
    # one sandbox per hook call pip made, each attributed to the package
    hooks = [p["name"] for p in report["phases"] if p["package"] == "legit-pure"]
    assert "build_wheel" in hooks and "prepare_metadata_for_build_wheel" in hooks, report["phases"]
    # installed by name, as pip would: no temporary wheel path recorded as the origin
    freeze = subprocess.run([str(target / "bin" / "python"), "-m", "pip", "freeze"],
                            capture_output=True, text=True, check=True).stdout
    assert "legit-pure==" in freeze.lower().replace("_", "-") and "@ file:" not in freeze, freeze
    assert not list(target.glob("lib/python*/site-packages/legit_pure-*.dist-info/direct_url.json"))


def test_legit_c_extension_builds_and_imports(tmp_path, fake_home, route, target):
    proc, report = pg_install(["legit_cext"], home=fake_home, target=target, route=route,
                              cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check = subprocess.run([str(target / "bin" / "python"), "-c",
                            "from legit_cext._fast import add; print(add(2, 3))"],
                           capture_output=True, text=True)
    assert check.stdout.strip() == "5", check.stderr
    gcc = [p for p in report["processes"] if p["argv"] and os.path.basename(p["argv"][0]).startswith(("gcc", "x86_64-linux-gnu-gcc", "cc"))]
    assert gcc, "the compiler ran inside the sandbox and was recorded"


HOSTILE = [
    ("steal_at_build", "get_requires_for_build_wheel", "file-read"),
    ("steal_at_metadata", "get_requires_for_build_wheel", "file-read"),  # setup.py runs per hook
    ("env_grandchild", "get_requires_for_build_wheel", "file-read"),
    ("bashrc_persist", "get_requires_for_build_wheel", "file-write"),
]
#: under ns, the representative of each class (a read, a persistence write) on one route
HOSTILE_NS = ("steal_at_build", "bashrc_persist")


@pytest.mark.parametrize("name, phase, kind, route, backend", [
    *(backend_param("plain", *case, route, id=f"{case[0]}-{route}") for case in HOSTILE
      for route in ("index", "find-links")),
    *(backend_param("ns", *case, "find-links", id=f"{case[0]}-find-links-ns") for case in HOSTILE
      if case[0] in HOSTILE_NS)], indirect=["route", "backend"])
def test_hostile_sdist_refused_nothing_installed(tmp_path, fake_home, route, target,
                                                 loopback_tcp, name, phase, kind, backend):
    before = listing(target)
    proc, report = pg_install([*backend.install_args, "--keep-env", "PIPGUARD_TEST_SINK", name], home=fake_home,
                              target=target, route=route, cwd=tmp_path,
                              extra_env={"PIPGUARD_TEST_SINK": f"127.0.0.1:{loopback_tcp.port}"})
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert listing(target) == before
    assert loopback_tcp.received == []
    assert fake_home.bashrc.read_text() == fake_home.bashrc_original
    assert report["status"] == "refused" and report["verdict"] == "blocked"
    blocked = [e for e in report["events"] if e["action"] == "blocked" and e["rule"] != "loopback-bind"]
    assert any(e["kind"] == kind and e["detail"]["phase"] == phase for e in blocked), blocked
    assert "refused" in proc.stderr.lower()
    # attributed to the package that made them: its own entry is blocked and holds the event
    (pkg,) = [p for p in report["packages"] if p["name"].replace("-", "_") == name]
    assert pkg["verdict"] == "blocked", pkg
    assert any(e["kind"] == kind and e["action"] == "blocked" for e in pkg["events"]), pkg


@pytest.mark.parametrize("route, backend", [backend_param("plain", "index"), backend_param("plain", "find-links"),
                                            backend_param("ns", "find-links")], indirect=True)
def test_native_helper_refused_by_os_layer(tmp_path, fake_home, route, target, loopback_tcp, backend):
    """A compiled helper never touches Python: Landlock/seccomp stop it, the supervisor reports it.
    Under ns (read observation off) its read gets a decoy, reported by the ns layer; its connect
    to the sink then is refused (only ``lo`` inside) and reported by the supervisor."""
    before = listing(target)
    proc, report = pg_install(["--isolation", backend.isolation, "--keep-env", "PIPGUARD_TEST_SINK", "native_helper"],
                              home=fake_home, target=target, route=route,
                              cwd=tmp_path,
                              extra_env={"PIPGUARD_TEST_SINK": f"127.0.0.1:{loopback_tcp.port}"})
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert listing(target) == before and loopback_tcp.received == []
    native = [e for e in report["events"] if e["action"] == "blocked" and e["layer"] in ("supervisor", "seccomp")]
    if backend.ns:
        reads = [e for e in report["events"] if e["rule"] == "decoy-read"]
        assert reads and all(e["layer"] == "ns" and e["action"] == "blocked" for e in reads), report["events"]
        assert any(e["target"].endswith(".ssh/id_rsa") for e in reads), reads
        assert any(e["kind"] == "network" for e in native), native
        assert not fake_home.stolen()
        return
    assert any(e["kind"] == "file-read" and e["target"].endswith(".ssh/id_rsa") for e in native), native
    # (the helper gives up before connecting when the read fails: connect
    # evidence for native code is covered in test_evidence/test_os_layer_e2e)


def test_pth_dropper_refused_by_gate(tmp_path, fake_home, route, target):
    before = listing(target)
    proc, report = pg_install(["pth_dropper"], home=fake_home, target=target, route=route,
                              cwd=tmp_path)
    assert proc.returncode == 1
    assert listing(target) == before
    (pkg,) = report["packages"]
    assert pkg["verdict"] == "gate"
    assert [f["rule"] for f in pkg["findings"]] == ["pth-exec"]


def test_sandbox_command_installs_nothing(tmp_path, fake_home, route, target):
    before = listing(target)
    proc, report = pg_install(["legit_pure"], home=fake_home, target=target, route=route,
                              cwd=tmp_path, command="sandbox")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert listing(target) == before
    assert report["status"] == "clean"


def test_install_without_sandbox_refuses_sdists(tmp_path, fake_home, route, target):
    before = listing(target)
    proc, _ = pg_install(["--no-sandbox", "legit_pure"], home=fake_home, target=target,
                         route=route, cwd=tmp_path)
    assert proc.returncode == 2
    assert "--sandbox" in proc.stderr
    assert listing(target) == before


def _write_sdist(tmp_path, name, setup_py):
    src = tmp_path / "src" / name
    src.mkdir(parents=True)
    (src / "setup.py").write_text(textwrap.dedent(setup_py))
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n')
    return build_sdist(src, tmp_path / "extra", name=name, version="1.0")


@pytest.mark.parametrize("case", ["build_error", "hang", "corrupt", "traversal", "unknown", "bad_req"])
def test_failures_leave_environment_unchanged(tmp_path, fake_home, links, target, case):
    route = links  # one route is enough: the behaviour is not about where pip finds files
    extra = route.add(tmp_path / "extra")
    args = []
    if case == "build_error":
        _write_sdist(tmp_path, "broken", "raise SystemExit('this package does not build')\n")
        args = ["broken"]
    elif case == "hang":
        _write_sdist(tmp_path, "hangs", "import time\ntime.sleep(600)\n")
        args = ["--build-timeout", "3", "hangs"]  # killed in setuptools' import or in the sleep: both a hang
    elif case == "corrupt":
        good = build_sdist(project("legit_pure"), tmp_path / "tmpsd")
        data = good.read_bytes()
        (extra / "corrupt-1.0.tar.gz").write_bytes(data[: len(data) // 2])
        args = ["corrupt"]
    elif case == "traversal":
        path = extra / "evil-1.0.tar.gz"
        with tarfile.open(path, "w:gz") as tar:
            for member, content in (("evil-1.0/setup.py", b"from setuptools import setup; setup(name='evil', version='1.0')\n"),
                                    ("evil-1.0/../../escaped.txt", b"x")):
                info = tarfile.TarInfo(member)
                info.size = len(content)
                import io
                tar.addfile(info, io.BytesIO(content))
        args = ["evil"]
    elif case == "unknown":
        args = ["no-such-package-pipguard-test"]
    elif case == "bad_req":
        req = tmp_path / "req.txt"
        req.write_text("legit_pure\nthis is not ][ a requirement\n")
        args = ["-r", str(req)]
    before = listing(target)
    proc, report = pg_install(args, home=fake_home, target=target, route=route,
                              cwd=tmp_path)
    assert proc.returncode in (1, 2), proc.stderr[-2000:]
    if case in ("build_error", "hang", "corrupt", "unknown", "bad_req"):
        assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr.split("pipguard:")[-1]
    assert listing(target) == before
    assert not (tmp_path / "escaped.txt").exists()
    # a hook call whose backend failed is never "ok" in pipguard's progress lines
    said = [line for line in proc.stderr.splitlines() if line.startswith(("pipguard: broken", "pipguard: hangs"))
            and "(sandboxed)" not in line]
    if case == "build_error":
        assert said and all("failed (exit 1)" in line for line in said), said
    if case == "hang":
        assert said and all(" ok (" not in line for line in said), said


def test_probe_imports_catches_first_import_payload(tmp_path, fake_home, links, target):
    route = links  # one route is enough: the behaviour is not about where pip finds files
    src = tmp_path / "src" / "importbomb"
    (src / "importbomb").mkdir(parents=True)
    (src / "importbomb" / "__init__.py").write_text(
        "import os\ntry:\n    open(os.path.expanduser('~/.ssh/id_rsa')).read()\nexcept OSError:\n    pass\n")
    (src / "setup.py").write_text("from setuptools import setup\nsetup(name='importbomb', version='1.0', packages=['importbomb'])\n")
    (src / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n')
    build_sdist(src, route.add(tmp_path / "extra"))
    before = listing(target)
    proc, report = pg_install(["--probe-imports", "importbomb"],
                              home=fake_home, target=target, route=route,
                              cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert listing(target) == before
    assert any(e["detail"].get("phase") == "probe" and e["kind"] == "file-read"
               for e in report["events"] if e["action"] == "blocked")


@pytest.fixture
def tiny_tmp(tmp_path):
    """A 3 MiB tmpfs: the disk fills up during the build (root only: mount)."""
    from support import need

    need("root")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip("cannot mount a tmpfs here: " + proc.stderr.strip())
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)])


def test_full_disk_leaves_environment_unchanged(tmp_path, fake_home, links, target, tiny_tmp):
    route = links  # one route is enough: the behaviour is not about where pip finds files
    before = listing(target)
    proc, _report = pg_install(["legit_cext"], home=fake_home, target=target, route=route,
                               cwd=tmp_path, extra_env={"TMPDIR": str(tiny_tmp)})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr.split("pipguard:")[-1]
    assert listing(target) == before


def test_no_observe_reads_still_blocks_native_reads(tmp_path, fake_home, links, target,
                                                     loopback_tcp):
    route = links  # one route is enough: the behaviour is not about where pip finds files
    """The documented trade-off of --no-observe-reads on the plain backend: the native helper's
    read of the key is still refused (Landlock), but nobody reports it — the build looks clean and
    is installed. (Under ns the read gets a decoy and is reported: test_install_ns.py.)"""
    proc, report = pg_install(["--isolation", "os", "--no-observe-reads", "--keep-env", "PIPGUARD_TEST_SINK", "native_helper"],
                              home=fake_home, target=target, route=route,
                              cwd=tmp_path,
                              extra_env={"PIPGUARD_TEST_SINK": f"127.0.0.1:{loopback_tcp.port}"})
    assert "PIPGUARD-FAKE-SECRET" not in proc.stdout + proc.stderr
    assert loopback_tcp.received == [] and not fake_home.stolen()
    assert report["policy"]["observe_reads"] is False
    assert not [e for e in report["events"] if e["action"] == "blocked" and e["kind"] == "file-read"]
    assert proc.returncode == 0  # observed clean: evidence, not proof


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_during_build_leaves_environment_unchanged(tmp_path, fake_home, links, target, sig):
    marker = f"pipguard-hang-{os.getpid()}-{int(sig)}"
    _write_sdist(tmp_path, "hangs", f"import time\nprint({marker!r}, flush=True)\ntime.sleep(600)\n")
    before = listing(target)
    report = tmp_path / "r.json"
    proc = subprocess.Popen(
        [PY, "-m", "pipguard", "install", "--sandbox", "--python", str(target / "bin" / "python"),
         *links.args(), "-f", str(tmp_path / "extra"), "--report", str(report),
         "-v", "hangs"],
        cwd=tmp_path, env=fake_home.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = ""
    for line in proc.stdout:  # readiness: the hanging setup.py is running in the sandbox
        seen += line
        if marker in line:
            break
    proc.send_signal(sig)
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, seen + rest  # 130 for SIGINT, 143 for SIGTERM
    assert listing(target) == before
    data = json.loads(report.read_text())
    assert data["status"] == "interrupted" and data["verdict"] == "error"
    sandboxed = [p["pid"] for p in data["processes"]]
    assert sandboxed and any(p["killed_by_pipguard"] for p in data["processes"])
    assert [pid for pid in sandboxed if os.path.exists(f"/proc/{pid}")] == []
